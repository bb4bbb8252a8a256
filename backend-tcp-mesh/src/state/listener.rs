//! The mesh's listening socket: accepting, and pausing accepts after an error.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use async_io::Async;
use tracing::warn;

use super::Mode;

/// How long accepting pauses after an error such as running out of file descriptors.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// What one accept came to.
#[derive(Debug)]
pub(super) enum Accepted {
    /// A connection.
    Stream(TcpStream, SocketAddr),
    /// Nothing, but another try may succeed at once.
    Again,
    /// Nothing more now: the listener would block (or is closed).
    Blocked,
    /// The listener failed: accepts pause until then.
    Paused(Instant),
}

/// The listening socket, and its place in the mesh's work queue.
#[derive(Debug)]
pub(super) struct Listener {
    socket: Option<Arc<Async<TcpListener>>>,
    waker: Waker,
    /// In the work queue already.
    scheduled: bool,
    paused_until: Option<Instant>,
}

impl Listener {
    /// Listens on `socket`, registering with the reactor under `waker`; scheduled at once, to
    /// accept whatever queued up before the first drive.
    pub(super) fn new(socket: Async<TcpListener>, waker: Waker) -> Self {
        Listener {
            socket: Some(Arc::new(socket)),
            waker,
            scheduled: true,
            paused_until: None,
        }
    }

    /// Stops listening (the socket closes once no poll holds it).
    pub(super) fn close(&mut self) {
        self.socket = None;
    }

    /// Puts the listener in the work queue unless it is there or closed. Returns whether it
    /// must be queued.
    pub(super) fn schedule(&mut self) -> bool {
        if self.scheduled || self.socket.is_none() {
            return false;
        }
        self.scheduled = true;
        true
    }

    /// Takes the listener out of the work queue, to serve it.
    pub(super) fn unschedule(&mut self) {
        self.scheduled = false;
    }

    /// The socket to poll for readiness: none while closed or paused (a deadline resumes
    /// accepts).
    #[cfg_attr(not(unix), allow(dead_code))]
    pub(super) fn polled(&self) -> Option<&Arc<Async<TcpListener>>> {
        self.socket.as_ref().filter(|_| self.paused_until.is_none())
    }

    /// When paused accepts resume.
    pub(super) fn paused_until(&self) -> Option<Instant> {
        self.paused_until
    }

    /// Whether paused accepts resume by `now`.
    pub(super) fn resumes_by(&self, now: Instant) -> bool {
        self.paused_until.is_some_and(|until| until <= now)
    }

    /// Whether accepts may run at `now` (a pause over is lifted).
    pub(super) fn may_accept(&mut self, now: Instant) -> bool {
        if self.paused_until.is_some_and(|until| now < until) {
            return false;
        }
        self.paused_until = None;
        true
    }

    /// Accepts one connection. In [`Mode::Async`], a listener that would block registers its
    /// waker.
    pub(super) fn accept(&mut self, now: Instant, mode: Mode) -> Accepted {
        let Some(socket) = &self.socket else {
            return Accepted::Blocked;
        };
        match socket.get_ref().accept() {
            Ok((stream, from)) => Accepted::Stream(stream, from),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                if mode == Mode::Blocking {
                    return Accepted::Blocked;
                }
                match socket.poll_readable(&mut Context::from_waker(&self.waker)) {
                    Poll::Ready(Ok(())) => Accepted::Again,
                    Poll::Ready(Err(error)) => {
                        warn!(%error, "listener failed; pausing accepts");
                        self.pause(now)
                    }
                    Poll::Pending => Accepted::Blocked,
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::ConnectionAborted | ErrorKind::Interrupted
                ) =>
            {
                Accepted::Again
            }
            Err(error) => {
                warn!(%error, "accept failed; pausing accepts");
                self.pause(now)
            }
        }
    }

    fn pause(&mut self, now: Instant) -> Accepted {
        let until = now + ACCEPT_PAUSE;
        self.paused_until = Some(until);
        Accepted::Paused(until)
    }
}
