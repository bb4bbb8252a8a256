//! The blocking receive's side of the state (Unix): which sockets a thread blocked in
//! `poll(2)` watches, the ones it found ready, and when it must be woken because the state
//! moved on without it.
//!
//! A thread that blocks takes a snapshot of the watch list ([`State::sleep`]), releases the
//! lock and polls. Whatever then changes the state under the lock (a send, a `try_recv` on
//! another thread, an async drive, `close`) checks the snapshot at its end
//! ([`State::alert_sleepers`]) and rings the doorbell's pipe if the sleeper's poll no longer
//! covers everything that can make progress: a socket added, removed or waiting for something
//! else, a frame already buffered or sent to ourselves, an earlier deadline, the mesh closing.
//! One ring per sleep: the sleeper takes a new snapshot when it wakes.

use std::io;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use async_io::Async;
use rustix::event::{PollFd, PollFlags, Timespec};
use rustix::fd::{AsFd, BorrowedFd};

use super::State;
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
enum Watched<'a> {
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

impl State {
    /// The sockets whose readiness lets a drive make progress, and for what: the listener
    /// (unless accepts are paused: a deadline resumes them), and every connection as
    /// [`Conn::waits_for`](crate::conn::Conn::waits_for) says. Connections waiting for
    /// nothing are left out, lest a hang-up they cannot act on wake the poll again and again.
    fn watch_list(&self) -> impl Iterator<Item = (Token, PollFlags, Watched<'_>)> + '_ {
        let listener = self
            .listener
            .as_ref()
            .filter(|_| self.accept_paused_until.is_none())
            .map(|listener| (LISTENER, PollFlags::IN, Watched::Listener(listener)));
        let conns = self.conns.iter().filter_map(|(token, conn)| {
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

    /// For a thread about to block in `poll` until `wake_at` (`None`: no limit): the sockets
    /// to poll, appended to `out`. The thread counts as a sleeper until [`State::woke`].
    pub(crate) fn sleep(
        &mut self,
        wake_at: Option<Instant>,
        out: &mut Vec<(Token, Handle, PollFlags)>,
    ) {
        let mut watched = std::mem::take(&mut self.sleepers.watched);
        watched.clear();
        for (token, flags, socket) in self.watch_list() {
            watched.push((token, flags));
            out.push((token, socket.handle(), flags));
        }
        self.sleepers = Sleepers {
            count: self.sleepers.count + 1,
            watched,
            wake_at,
            alerted: false,
        };
    }

    /// For a thread back from `poll`: it no longer sleeps; the sockets it found `ready` are
    /// served by the next drive.
    pub(crate) fn woke(&mut self, ready: impl IntoIterator<Item = Token>) {
        self.sleepers.count = self.sleepers.count.saturating_sub(1);
        for token in ready {
            self.schedule(token);
        }
    }

    /// Polls every watched socket without waiting and schedules the ready ones (for
    /// `try_recv`, which does not block). Returns whether any was ready.
    ///
    /// # Errors
    /// Any error of `poll` but an interrupted call.
    pub(crate) fn poll_now(&mut self) -> io::Result<bool> {
        let (tokens, mut fds): (Vec<Token>, Vec<PollFd<'_>>) = self
            .watch_list()
            .map(|(token, flags, socket)| (token, PollFd::from_borrowed_fd(socket.fd(), flags)))
            .unzip();
        if fds.is_empty() {
            return Ok(false);
        }
        match rustix::event::poll(&mut fds, Some(&Timespec::default())) {
            Ok(0) | Err(rustix::io::Errno::INTR) => return Ok(false),
            Ok(_) => {}
            Err(errno) => return Err(errno.into()),
        }
        let ready: Vec<Token> = tokens
            .into_iter()
            .zip(&fds)
            .filter(|(_, fd)| !fd.revents().is_empty())
            .map(|(token, _)| token)
            .collect();
        drop(fds);
        for token in &ready {
            self.schedule(*token);
        }
        Ok(!ready.is_empty())
    }

    /// Rings the doorbell's pipe if a thread blocked in `poll` must wake to keep the mesh
    /// moving (see the module docs). Called at the end of every step that changes the state.
    pub(super) fn alert_sleepers(&mut self) {
        let sleepers = &self.sleepers;
        if sleepers.count == 0 || sleepers.alerted {
            return;
        }
        let stale = sleepers.count > 1
            || self.closing
            || !self.to_self.is_empty()
            || !self.work.is_empty()
            || self
                .next_deadline
                .is_some_and(|at| sleepers.wake_at.is_none_or(|wake| at < wake))
            || !self
                .watch_list()
                .map(|(token, flags, _)| (token, flags))
                .eq(sleepers.watched.iter().copied());
        if stale {
            self.sleepers.alerted = true;
            self.bell.wake_blocked();
        }
    }
}
