//! The blocking receive's side of the state (Unix): which sockets a thread blocked in
//! `poll(2)` watches, the ones it found ready, and when it must be woken because the state
//! moved on without it.
//!
//! A thread that blocks takes a snapshot of the watch list ([`Sleepers::sleep`]), releases the
//! lock and polls. Whatever then changes the state under the lock (a send, a `try_recv` on
//! another thread, an async drive, `close`) checks the snapshot at its end
//! ([`Sleepers::alert`]) and rings the doorbell's pipe if the sleeper's poll no longer
//! covers everything that can make progress: a socket added, removed or waiting for something
//! else, a frame already buffered or sent to ourselves, an earlier deadline, the mesh closing.
//! One ring per sleep: the sleeper takes a new snapshot when it wakes.

use std::collections::BTreeMap;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use async_io::Async;
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fd::{AsFd, BorrowedFd};

use crate::conn::Conn;
use crate::wake::{Token, LISTENER};

/// A socket a blocked thread polls. It keeps the socket open while polled, so its descriptor
/// cannot be closed and reused under the poll if the mesh drops the connection meanwhile.
#[derive(Debug)]
pub(crate) enum Handle {
    Listener(Arc<Async<TcpListener>>),
    Stream(Arc<Async<TcpStream>>),
}

impl AsFd for Handle {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Self::Listener(listener) => listener.as_fd(),
            Self::Stream(stream) => stream.as_fd(),
        }
    }
}

/// A watched socket, borrowed from the state.
#[derive(Clone, Copy)]
pub(super) enum Watched<'a> {
    Listener(&'a Arc<Async<TcpListener>>),
    Stream(&'a Arc<Async<TcpStream>>),
}

impl<'a> Watched<'a> {
    fn fd(self) -> BorrowedFd<'a> {
        match self {
            Self::Listener(listener) => listener.as_fd(),
            Self::Stream(stream) => stream.as_fd(),
        }
    }

    fn handle(self) -> Handle {
        match self {
            Self::Listener(listener) => Handle::Listener(Arc::clone(listener)),
            Self::Stream(stream) => Handle::Stream(Arc::clone(stream)),
        }
    }
}

/// The threads blocked in `poll(2)` on the mesh's sockets.
#[derive(Debug, Default)]
pub(crate) struct Sleepers {
    /// How many there are (the node has one, the driver).
    count: usize,
    /// What the last one to block watches, in token order.
    watched: Vec<(Token, PollFlags)>,
    /// When it wakes by itself (`None`: never).
    wake_at: Option<Instant>,
    /// The pipe was rung since it blocked.
    alerted: bool,
}

/// The sockets whose readiness lets a drive make progress, and for what: the `listener`
/// (`None` while accepts are paused: a deadline resumes them), and every connection as
/// [`Conn::waits_for`] says. Connections waiting for nothing are left out, lest a hang-up
/// they cannot act on wake the poll again and again.
pub(super) fn watch_list<'a>(
    listener: Option<&'a Arc<Async<TcpListener>>>,
    conns: &'a BTreeMap<Token, Conn>,
) -> impl Iterator<Item = (Token, PollFlags, Watched<'a>)> + 'a {
    let listener = listener.map(|listener| (LISTENER, PollFlags::IN, Watched::Listener(listener)));
    let conns = conns.iter().filter_map(|(token, conn)| {
        let flags = match conn.waits_for() {
            (false, false) => return None,
            (true, false) => PollFlags::IN,
            (false, true) => PollFlags::OUT,
            (true, true) => PollFlags::IN | PollFlags::OUT,
        };
        Some((*token, flags, Watched::Stream(conn.socket())))
    });
    listener.into_iter().chain(conns)
}

/// Polls every socket of `watched` without waiting. Returns the ready ones.
///
/// # Errors
/// Any error of `poll` but an interrupted call.
pub(super) fn poll_ready<'a>(
    watched: impl Iterator<Item = (Token, PollFlags, Watched<'a>)>,
) -> io::Result<Vec<Token>> {
    let (tokens, mut fds): (Vec<Token>, Vec<PollFd<'_>>) = watched
        .map(|(token, flags, socket)| (token, PollFd::from_borrowed_fd(socket.fd(), flags)))
        .unzip();
    if fds.is_empty() {
        return Ok(Vec::new());
    }
    match rustix::event::poll(&mut fds, Some(&Timespec::default())) {
        Ok(0) | Err(rustix::io::Errno::INTR) => return Ok(Vec::new()),
        Ok(_) => {}
        Err(errno) => return Err(errno.into()),
    }
    Ok(tokens
        .into_iter()
        .zip(&fds)
        .filter(|(_, fd)| !fd.revents().is_empty())
        .map(|(token, _)| token)
        .collect())
}

impl Sleepers {
    /// For a thread about to block in `poll` until `wake_at` (`None`: no limit), watching
    /// `watched`: the sockets to poll, appended to `out`. The thread counts as a sleeper until
    /// [`Sleepers::woke`].
    pub(super) fn sleep<'a>(
        &mut self,
        watched: impl Iterator<Item = (Token, PollFlags, Watched<'a>)>,
        wake_at: Option<Instant>,
        out: &mut Vec<(Token, Handle, PollFlags)>,
    ) {
        let mut list = std::mem::take(&mut self.watched);
        list.clear();
        for (token, flags, socket) in watched {
            list.push((token, flags));
            out.push((token, socket.handle(), flags));
        }
        *self = Sleepers {
            count: self.count + 1,
            watched: list,
            wake_at,
            alerted: false,
        };
    }

    /// A thread is back from `poll`: it no longer sleeps.
    pub(super) fn woke(&mut self) {
        self.count = self.count.saturating_sub(1);
    }

    /// Whether the pipe must be rung so that a thread blocked in `poll` wakes to keep the
    /// mesh moving (see the module docs): the mesh is `busy` (closing, or a frame or socket
    /// waits to be served), its `next_deadline` comes before the sleeper wakes, or the sleeper
    /// does not watch what `watched` lists. Once per sleep: it counts as rung.
    pub(super) fn alert<'a>(
        &mut self,
        busy: bool,
        next_deadline: Option<Instant>,
        mut watched: impl Iterator<Item = (Token, PollFlags, Watched<'a>)>,
    ) -> bool {
        if self.count == 0 || self.alerted {
            return false;
        }
        let stale = self.count > 1
            || busy
            || next_deadline.is_some_and(|at| self.wake_at.is_none_or(|wake| at < wake))
            || !watched
                .by_ref()
                .map(|(token, flags, _)| (token, flags))
                .eq(self.watched.iter().copied());
        if stale {
            self.alerted = true;
        }
        stale
    }
}
