//! A wake-up pipe for backends whose blocking receive waits in `poll(2)` (Unix, feature
//! `wake`).
//!
//! [`BlockingRecv::interrupt`](crate::BlockingRecv::interrupt) must make a thread blocked in
//! the kernel return at once, from any thread and without blocking. Every backend with a
//! blocking receive does it the same way: a non-blocking pipe whose read end sits in the same
//! `poll` as the sockets; a byte written to it wakes the poll. [`WakePipe`] is that pipe,
//! written once for all of them.
//!
//! # Why here
//! The pipe serves the receive contract this crate defines ([`BlockingRecv`]), and every
//! backend already depends on this crate and on nothing else of Conclave's. A cargo feature,
//! off by default, keeps the system dependency (`rustix`) out of the crates that need no
//! sockets (the sans-IO protocol, the front end), and spares the project a separately
//! published and versioned crate for fifty lines.
//!
//! ```
//! use std::time::Duration;
//!
//! use conclave_lock_api::wake::WakePipe;
//! use rustix::event::{poll, PollFd, PollFlags, Timespec};
//!
//! let pipe = WakePipe::new()?;
//! pipe.ring(); // from any thread, e.g. in `interrupt`
//! let mut fds = [PollFd::from_borrowed_fd(pipe.read_end(), PollFlags::IN)];
//! let timeout = Timespec::try_from(Duration::from_secs(5)).expect("representable");
//! assert_eq!(poll(&mut fds, Some(&timeout))?, 1);
//! pipe.answer(); // the poller empties it before it looks at its sockets
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! [`BlockingRecv`]: crate::BlockingRecv

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::io::Errno;

/// A non-blocking, close-on-exec pipe: a byte written ([`WakePipe::ring`]) makes the read end
/// ([`WakePipe::read_end`]) readable, which wakes a `poll(2)` on it, until
/// [`WakePipe::answer`] empties it.
///
/// Rings never block and never fail: a full pipe is readable already, so a ring that does not
/// fit is not needed. Rings before the poll starts are not lost: the pipe stays readable.
#[derive(Debug)]
pub struct WakePipe {
    read: OwnedFd,
    write: OwnedFd,
}

impl WakePipe {
    /// A new, empty pipe.
    ///
    /// # Errors
    /// The pipe could not be made (out of file descriptors) or set non-blocking.
    pub fn new() -> io::Result<Self> {
        let (read, write) = rustix::pipe::pipe()?;
        for fd in [&read, &write] {
            rustix::io::ioctl_fionbio(fd, true)?;
            rustix::io::fcntl_setfd(fd, rustix::io::FdFlags::CLOEXEC)?;
        }
        Ok(Self { read, write })
    }

    /// The end to poll for readability, next to the sockets.
    pub fn read_end(&self) -> BorrowedFd<'_> {
        self.read.as_fd()
    }

    /// Makes the read end readable (one `write(2)`; never blocks). An unexpected error is
    /// logged at debug level: the wake-up is then lost, which the callers' timeouts bound.
    pub fn ring(&self) {
        match rustix::io::write(&self.write, &[1]) {
            // Full: already readable.
            Ok(_) | Err(Errno::AGAIN) => {}
            Err(errno) => tracing::debug!(%errno, "could not ring the wake-up pipe"),
        }
    }

    /// Empties the pipe, so the next poll blocks until the next ring. Never blocks.
    pub fn answer(&self) {
        let mut buf = [0u8; 64];
        while let Ok(n @ 1..) = rustix::io::read(&self.read, &mut buf) {
            if n < buf.len() {
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use rustix::event::{poll, PollFd, PollFlags, Timespec};

    use super::*;

    fn readable(pipe: &WakePipe) -> bool {
        let zero = Timespec::try_from(std::time::Duration::ZERO).expect("zero");
        let mut fds = [PollFd::from_borrowed_fd(pipe.read_end(), PollFlags::IN)];
        poll(&mut fds, Some(&zero)).expect("poll") == 1
    }

    #[test]
    fn the_pipe_wakes_a_poll_until_answered() {
        let pipe = WakePipe::new().unwrap();
        assert!(!readable(&pipe));
        // Rings beyond the pipe's capacity neither block nor fail.
        for _ in 0..100_000 {
            pipe.ring();
        }
        assert!(readable(&pipe));
        pipe.answer();
        assert!(!readable(&pipe));
        pipe.ring();
        assert!(readable(&pipe));
    }

    #[test]
    fn a_ring_from_another_thread_wakes_a_blocked_poll() {
        let pipe = std::sync::Arc::new(WakePipe::new().unwrap());
        let ringer = {
            let pipe = std::sync::Arc::clone(&pipe);
            std::thread::spawn(move || pipe.ring())
        };
        // Bounded: a lost wake-up fails the test instead of hanging it.
        let limit = Timespec::try_from(std::time::Duration::from_secs(10)).expect("limit");
        let mut fds = [PollFd::from_borrowed_fd(pipe.read_end(), PollFlags::IN)];
        assert_eq!(poll(&mut fds, Some(&limit)).unwrap(), 1);
        ringer.join().unwrap();
    }
}
