//! The blocking receive's side of the state (Unix): which sockets a thread blocked in the
//! wait watches, the ones it found ready, and when it must be woken because the state moved on
//! without it.
//!
//! On Linux and Android the mesh keeps one epoll instance whose interest list follows the
//! watch list ([`State::sleep`] and every step that changes the state bring it up to date,
//! [`Interest::sync`]): a wait costs the same with 3 connections or 300, and a socket whose
//! interest changes while a thread waits is watched at once, without waking it. Elsewhere the
//! thread that blocks takes a snapshot of the watch list, releases the lock and `poll(2)`s it.
//!
//! Whatever changes the state under the lock (a send, a `try_recv` on another thread, an async
//! drive, `close`) checks at its end ([`State::alert_sleepers`]) whether the sleeper's wait
//! still covers everything that can make progress, and rings the doorbell's pipe if not: a
//! frame already buffered or sent to ourselves, an earlier deadline, the mesh closing, and
//! (with `poll(2)`) a socket added, removed or waiting for something else. One ring per sleep:
//! the sleeper looks again when it wakes.

use std::collections::BTreeMap;
use std::io;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Instant;

use async_io::Async;
use rustix::event::PollFlags;
use rustix::fd::{AsFd, BorrowedFd};

use super::State;
use crate::conn::Conn;
use crate::wake::{Token, LISTENER};

#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) use self::epoll::{Interest, Ready};

/// A socket a blocked thread waits on. It keeps the socket open while watched, so its
/// descriptor cannot be closed and reused under the wait if the mesh drops the connection
/// meanwhile.
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
pub(crate) enum Watched<'a> {
    Listener(&'a Arc<Async<TcpListener>>),
    Stream(&'a Arc<Async<TcpStream>>),
}

impl<'a> Watched<'a> {
    pub(crate) fn fd(self) -> BorrowedFd<'a> {
        match self {
            Self::Listener(listener) => listener.as_fd(),
            Self::Stream(stream) => stream.as_fd(),
        }
    }

    pub(crate) fn handle(self) -> Handle {
        match self {
            Self::Listener(listener) => Handle::Listener(Arc::clone(listener)),
            Self::Stream(stream) => Handle::Stream(Arc::clone(stream)),
        }
    }
}

/// The threads blocked in the wait on the mesh's sockets.
#[derive(Debug, Default)]
pub(crate) struct Sleepers {
    /// How many there are (the node has one, the driver).
    count: usize,
    /// What the last one to block watches, in token order (`poll(2)` only: an epoll
    /// instance follows the watch list instead).
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    watched: Vec<(Token, PollFlags)>,
    /// When it wakes by itself (`None`: never).
    wake_at: Option<Instant>,
    /// The pipe was rung since it blocked.
    alerted: bool,
    /// The mesh's epoll instance, made by the first wait.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    interest: Option<Interest>,
}

/// The sockets whose readiness lets a drive make progress, and for what: the listener
/// (unless accepts are paused: a deadline resumes them), and every connection as
/// [`Conn::waits_for`] says. Connections waiting for nothing are left out, lest a hang-up they
/// cannot act on wake the wait again and again. In token order.
fn watch_list<'a>(
    listener: Option<&'a Arc<Async<TcpListener>>>,
    accept_paused: bool,
    conns: &'a BTreeMap<Token, Conn>,
) -> impl Iterator<Item = (Token, PollFlags, Watched<'a>)> + 'a {
    let listener = listener
        .filter(|_| !accept_paused)
        .map(|listener| (LISTENER, PollFlags::IN, Watched::Listener(listener)));
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

impl State {
    /// This state's watch list (see [`watch_list`]).
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    fn watch_list(&self) -> impl Iterator<Item = (Token, PollFlags, Watched<'_>)> + '_ {
        watch_list(
            self.listener.as_ref(),
            self.accept_paused_until.is_some(),
            &self.conns,
        )
    }

    /// For a thread about to block until `wake_at` (`None`: no limit): the sockets to
    /// `poll`, appended to `out`. The thread counts as a sleeper until [`State::woke`].
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
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

    /// For a thread about to block until `wake_at` (`None`: no limit): the epoll instance to
    /// wait on, its interest list brought up to date. The thread counts as a sleeper until
    /// [`State::woke`].
    ///
    /// # Errors
    /// The epoll instance could not be made or changed (out of memory or descriptors).
    #[cfg(any(target_os = "linux", target_os = "android"))]
    pub(crate) fn sleep(&mut self, wake_at: Option<Instant>) -> io::Result<Ready> {
        let ready = self.sync_interest()?;
        self.sleepers.count += 1;
        self.sleepers.wake_at = wake_at;
        self.sleepers.alerted = false;
        Ok(ready)
    }

    /// Brings the epoll instance's interest list up to the watch list (making the instance
    /// first if need be), and returns it.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    fn sync_interest(&mut self) -> io::Result<Ready> {
        let Self {
            listener,
            accept_paused_until,
            conns,
            sleepers,
            bell,
            ..
        } = self;
        let interest = match &mut sleepers.interest {
            Some(interest) => interest,
            slot => slot.insert(Interest::new(bell.pipe().read_end())?),
        };
        let paused = accept_paused_until.is_some();
        interest.sync(watch_list(listener.as_ref(), paused, conns))?;
        interest.add_missing(watch_list(listener.as_ref(), paused, conns))?;
        Ok(interest.ready())
    }

    /// For a thread back from its wait: it no longer sleeps; the sockets it found `ready` are
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
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    pub(crate) fn poll_now(&mut self) -> io::Result<bool> {
        use rustix::event::{PollFd, Timespec};

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

    /// Asks the epoll instance, without waiting, which watched sockets are ready, and
    /// schedules them (for `try_recv`, which does not block). Returns whether any was ready.
    ///
    /// # Errors
    /// Any error of `epoll_wait` but an interrupted call.
    #[cfg(any(target_os = "linux", target_os = "android"))]
    pub(crate) fn poll_now(&mut self) -> io::Result<bool> {
        let ready = self.sync_interest()?;
        let mut tokens = Vec::new();
        match ready.wait(Some(std::time::Duration::ZERO), &mut tokens) {
            Ok(_) => {}
            Err(error) if error.kind() == io::ErrorKind::Interrupted => return Ok(false),
            Err(error) => return Err(error),
        }
        let any = !tokens.is_empty();
        for token in tokens {
            self.schedule(token);
        }
        Ok(any)
    }

    /// Rings the doorbell's pipe if a thread blocked in its wait must wake to keep the mesh
    /// moving (see the module docs); with epoll, first brings the interest list up to date.
    /// Called at the end of every step that changes the state.
    pub(super) fn alert_sleepers(&mut self) {
        #[cfg(any(target_os = "linux", target_os = "android"))]
        if self.sleepers.interest.is_some() {
            // Also drops the registrations (and sockets) of connections gone meanwhile.
            if let Err(error) = self.sync_interest() {
                tracing::debug!(%error, "epoll interest not updated; waking the receiver");
                self.sleepers.alerted = true;
                self.bell.wake_blocked();
                return;
            }
        }
        let sleepers = &self.sleepers;
        if sleepers.count == 0 || sleepers.alerted {
            return;
        }
        #[cfg(not(any(target_os = "linux", target_os = "android")))]
        let watch_changed = !self
            .watch_list()
            .map(|(token, flags, _)| (token, flags))
            .eq(sleepers.watched.iter().copied());
        #[cfg(any(target_os = "linux", target_os = "android"))]
        let watch_changed = false;
        let stale = sleepers.count > 1
            || self.closing
            || !self.to_self.is_empty()
            || !self.work.is_empty()
            || self
                .next_deadline
                .is_some_and(|at| sleepers.wake_at.is_none_or(|wake| at < wake))
            || watch_changed;
        if stale {
            self.sleepers.alerted = true;
            self.bell.wake_blocked();
        }
    }
}

/// The wait on Linux and Android: one epoll instance per mesh.
#[cfg(any(target_os = "linux", target_os = "android"))]
mod epoll {
    use std::collections::BTreeMap;
    use std::io;
    use std::os::fd::{AsRawFd, OwnedFd};
    use std::sync::Arc;
    use std::time::Duration;

    use rustix::event::epoll::{self, CreateFlags, Event, EventData, EventFlags};
    use rustix::event::{PollFlags, Timespec};
    use rustix::fd::{AsFd, BorrowedFd};
    use rustix::io::Errno;

    use super::{Handle, Watched};
    use crate::wake::Token;

    /// The key of the doorbell's pipe in the epoll instance (no socket has it).
    const PIPE: u64 = u64::MAX;
    /// The most events one wait takes; the rest stay ready for the next (level-triggered).
    const EVENTS: usize = 64;

    /// The epoll instance and what it watches.
    #[derive(Debug)]
    pub(crate) struct Interest {
        epoll: Arc<OwnedFd>,
        /// Each watched socket by token, kept open while registered (so its descriptor is not
        /// reused while the instance still watches it), and what for.
        registered: BTreeMap<Token, (Handle, PollFlags)>,
    }

    /// The epoll instance, to wait on without the mesh's lock.
    #[derive(Clone, Debug)]
    pub(crate) struct Ready(Arc<OwnedFd>);

    fn event_flags(flags: PollFlags) -> EventFlags {
        let mut events = EventFlags::empty();
        if flags.contains(PollFlags::IN) {
            events |= EventFlags::IN;
        }
        if flags.contains(PollFlags::OUT) {
            events |= EventFlags::OUT;
        }
        events
    }

    impl Interest {
        /// A new epoll instance watching the doorbell's `pipe`.
        pub(crate) fn new(pipe: BorrowedFd<'_>) -> io::Result<Self> {
            let epoll = epoll::create(CreateFlags::CLOEXEC)?;
            epoll::add(&epoll, pipe, EventData::new_u64(PIPE), EventFlags::IN)?;
            Ok(Self {
                epoll: Arc::new(epoll),
                registered: BTreeMap::new(),
            })
        }

        pub(crate) fn ready(&self) -> Ready {
            Ready(Arc::clone(&self.epoll))
        }

        /// Makes the instance watch exactly `want` (in token order): registers new sockets,
        /// changes what changed, and drops the registrations of the rest. No system call when
        /// nothing changed.
        pub(crate) fn sync<'a>(
            &mut self,
            want: impl Iterator<Item = (Token, PollFlags, Watched<'a>)>,
        ) -> io::Result<()> {
            let mut stale: Vec<Token> = Vec::new();
            let mut registered = self.registered.iter_mut().peekable();
            for (token, flags, socket) in want {
                // Registrations before this token are no longer wanted.
                while let Some((old, _)) = registered.next_if(|(old, _)| **old < token) {
                    stale.push(*old);
                }
                let same = |handle: &Handle| handle.as_fd().as_raw_fd() == socket.fd().as_raw_fd();
                match registered.next_if(|(old, _)| **old == token) {
                    Some((_, (handle, old_flags))) if same(handle) && *old_flags != flags => {
                        let data = EventData::new_u64(token);
                        epoll::modify(&*self.epoll, socket.fd(), data, event_flags(flags))?;
                        *old_flags = flags;
                    }
                    Some((_, (handle, _))) if same(handle) => {}
                    // Another socket under the same token: drop the old one's registration.
                    Some((old, _)) => stale.push(*old),
                    None => {}
                }
            }
            stale.extend(registered.map(|(old, _)| *old));
            for token in stale {
                if let Some((handle, _)) = self.registered.remove(&token) {
                    match epoll::delete(&*self.epoll, &handle) {
                        Ok(()) | Err(Errno::NOENT) => {}
                        Err(errno) => return Err(errno.into()),
                    }
                }
            }
            Ok(())
        }

        /// Registers what `sync` found missing: called with the same list right after it.
        pub(crate) fn add_missing<'a>(
            &mut self,
            want: impl Iterator<Item = (Token, PollFlags, Watched<'a>)>,
        ) -> io::Result<()> {
            for (token, flags, socket) in want {
                if self.registered.contains_key(&token) {
                    continue;
                }
                let data = EventData::new_u64(token);
                match epoll::add(&*self.epoll, socket.fd(), data, event_flags(flags)) {
                    Ok(()) => {}
                    Err(Errno::EXIST) => {
                        epoll::modify(&*self.epoll, socket.fd(), data, event_flags(flags))?;
                    }
                    Err(errno) => return Err(errno.into()),
                }
                self.registered.insert(token, (socket.handle(), flags));
            }
            Ok(())
        }
    }

    impl Ready {
        /// Waits up to `timeout` (`None`: no limit) for a watched socket or the pipe; appends
        /// the ready sockets' tokens to `ready` and returns whether the pipe was rung.
        ///
        /// # Errors
        /// `Interrupted` when a signal interrupted the wait; any other error of `epoll_wait`.
        pub(crate) fn wait(
            &self,
            timeout: Option<Duration>,
            ready: &mut Vec<Token>,
        ) -> io::Result<bool> {
            // Too long for a timespec: no limit.
            let timeout = timeout.and_then(|t| Timespec::try_from(t).ok());
            let mut events: Vec<Event> = Vec::with_capacity(EVENTS);
            match epoll::wait(
                &*self.0,
                rustix::buffer::spare_capacity(&mut events),
                timeout.as_ref(),
            ) {
                Ok(_) => {}
                Err(Errno::INTR) => return Err(io::ErrorKind::Interrupted.into()),
                Err(errno) => return Err(errno.into()),
            }
            let mut rung = false;
            for event in &events {
                match event.data.u64() {
                    PIPE => rung = true,
                    token => ready.push(token),
                }
            }
            Ok(rung)
        }
    }
}
