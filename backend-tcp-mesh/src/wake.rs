//! Wake-ups: which sockets the reactor (or a sender) says have work, and who waits for them.
//!
//! Every socket is polled with a waker of its own that notes the socket's token in the
//! [`Doorbell`] and notifies its [`Event`]. Whoever drives the mesh ([`Transport::recv`] or
//! [`Transport::close`]) listens to the event, takes the noted tokens and serves those sockets
//! only. Since every socket always sees the same waker, a second concurrent receiver cannot
//! steal a wake-up from the first: the event reaches every listener.
//!
//! A thread blocked in `poll(2)` ([`BlockingRecv::recv_blocking`], Unix) hears neither: the
//! kernel wakes it for its sockets, and the doorbell's pipe (the shared
//! [`WakePipe`](conclave_lock_api::wake::WakePipe)) for everything else (a new socket to watch,
//! bytes queued, an interrupt).
//!
//! [`Transport::recv`]: conclave_lock_api::Transport::recv
//! [`Transport::close`]: conclave_lock_api::Transport::close
//! [`BlockingRecv::recv_blocking`]: conclave_lock_api::BlockingRecv::recv_blocking

use std::io;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Wake, Waker};

#[cfg(unix)]
use conclave_lock_api::wake::WakePipe;
use event_listener::{Event, EventListener};

/// Names a socket of the mesh: the listener or one connection.
pub(crate) type Token = u64;

/// The listener's token; connections count up from 1.
pub(crate) const LISTENER: Token = 0;

/// Tokens with work, and the event their arrival notifies; on Unix also the pipe that wakes a
/// thread blocked in `poll(2)`.
#[derive(Debug)]
pub(crate) struct Doorbell {
    rung: Mutex<Vec<Token>>,
    event: Event,
    #[cfg(unix)]
    pipe: WakePipe,
}

impl Doorbell {
    /// A doorbell nobody listens to yet.
    ///
    /// # Errors
    /// The pipe could not be made (out of file descriptors).
    pub(crate) fn new() -> io::Result<Self> {
        Ok(Self {
            rung: Mutex::default(),
            event: Event::new(),
            #[cfg(unix)]
            pipe: WakePipe::new()?,
        })
    }

    /// Notes that `token` has work and wakes every driver.
    pub(crate) fn ring(&self, token: Token) {
        self.rung
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(token);
        self.notify();
    }

    /// Wakes every driver without naming a socket (a frame to ourselves, the mesh closed).
    pub(crate) fn notify(&self) {
        self.event.notify(usize::MAX);
    }

    /// Starts listening; create the listener before looking for work, then await it.
    pub(crate) fn listen(&self) -> EventListener {
        self.event.listen()
    }

    /// Takes the tokens rung since the last call.
    pub(crate) fn take(&self) -> Vec<Token> {
        std::mem::take(&mut *self.rung.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// Wakes the thread blocked in `poll(2)` on [`Doorbell::pipe`] (or the next one to block
    /// there: a rung pipe stays readable until answered). One system call: ring only when
    /// such a thread must wake.
    #[cfg(unix)]
    pub(crate) fn wake_blocked(&self) {
        self.pipe.ring();
    }

    /// The pipe whose read end a blocked thread polls; [`WakePipe::answer`] empties it.
    #[cfg(unix)]
    pub(crate) fn pipe(&self) -> &WakePipe {
        &self.pipe
    }

    /// The waker that rings `token`.
    pub(crate) fn waker(self: &Arc<Self>, token: Token) -> Waker {
        Waker::from(Arc::new(SocketWaker {
            token,
            doorbell: Arc::clone(self),
        }))
    }
}

/// Rings one token of one doorbell.
#[derive(Debug)]
struct SocketWaker {
    token: Token,
    doorbell: Arc<Doorbell>,
}

impl Wake for SocketWaker {
    fn wake(self: Arc<Self>) {
        self.doorbell.ring(self.token);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.doorbell.ring(self.token);
    }
}

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;

    #[test]
    fn a_waker_rings_its_token_and_notifies_every_listener() {
        let bell = Arc::new(Doorbell::new().unwrap());
        let first = bell.listen();
        let second = bell.listen();
        let waker = bell.waker(3);
        assert!(waker.will_wake(&waker.clone()));
        waker.wake_by_ref();
        bell.waker(5).wake();
        assert_eq!(bell.take(), vec![3, 5]);
        assert!(bell.take().is_empty());
        assert!(first.now_or_never().is_some());
        assert!(second.now_or_never().is_some());
    }

    #[cfg(unix)]
    #[test]
    fn wake_blocked_rings_the_pipe_until_answered() {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};

        let bell = Doorbell::new().unwrap();
        let zero = Timespec::try_from(std::time::Duration::ZERO).unwrap();
        let readable = |bell: &Doorbell| {
            let mut fds = [PollFd::from_borrowed_fd(
                bell.pipe().read_end(),
                PollFlags::IN,
            )];
            poll(&mut fds, Some(&zero)).unwrap() == 1
        };
        assert!(!readable(&bell));
        bell.wake_blocked();
        assert!(readable(&bell));
        bell.pipe().answer();
        assert!(!readable(&bell));
    }
}
