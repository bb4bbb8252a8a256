//! The blocking receive (Unix): the driver's thread waits in `poll(2)` on the mesh's sockets.

use std::io;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use conclave_lock_api::{BlockingRecv, Datagram};
use rustix::event::{PollFd, PollFlags, Timespec};

use super::TcpMesh;
use crate::state::{closed, Handle, Mode, Step};
use crate::wake::Token;

/// The driver's thread waits in `poll(2)` on the listener, every connection that can make
/// progress and the doorbell's pipe, so the kernel wakes it directly when bytes arrive, with
/// no reactor thread on the way. Each wake-up runs the drive step of [`Transport::recv`]
/// (accepts, connects, flushes, reads, timeouts) without registering anything with the
/// reactor.
///
/// [`Transport::recv`]: conclave_lock_api::Transport::recv
impl BlockingRecv for TcpMesh {
    /// Drives the mesh until a frame arrives, `timeout` passes, [`BlockingRecv::interrupt`] is
    /// called or a signal interrupts the wait (`Ok(None)` for those). Work left by sends on
    /// other threads wakes it through the doorbell's pipe, without returning; so do the
    /// mesh's own deadlines (connect, handshake, idle and wind-down timeouts, paused accepts).
    ///
    /// # Errors
    /// `NotConnected` once the mesh is closed; an error of `poll` (out of memory, ...).
    fn recv_blocking(&self, timeout: Option<Duration>) -> io::Result<Option<Datagram>> {
        // A timeout too long to add to an instant waits without limit; callers loop anyway.
        let until = timeout.and_then(|t| Instant::now().checked_add(t));
        let mut handles: Vec<(Token, Handle, PollFlags)> = Vec::new();
        let mut polled = false;
        loop {
            let now = Instant::now();
            let mut state = self.lock();
            let deadline = match state.drive(now, Mode::Blocking) {
                Step::Datagram(datagram) => return Ok(Some(datagram)),
                Step::Closed => return Err(closed()),
                Step::Idle(deadline) => deadline,
            };
            if polled && until.is_some_and(|until| until <= now) {
                return Ok(None);
            }
            let wake_at = match (deadline, until) {
                (Some(deadline), Some(until)) => Some(deadline.min(until)),
                (deadline, until) => deadline.or(until),
            };
            state.sleep(wake_at, &mut handles);
            drop(state);

            // Too long for a timespec: no limit.
            let timeout = wake_at.and_then(|at| {
                Timespec::try_from(at.saturating_duration_since(Instant::now())).ok()
            });
            let mut fds: Vec<PollFd<'_>> = handles
                .iter()
                .map(|(_, socket, flags)| PollFd::new(socket, *flags))
                .collect();
            fds.push(PollFd::from_borrowed_fd(
                self.bell.pipe().read_end(),
                PollFlags::IN,
            ));
            let result = rustix::event::poll(&mut fds, timeout.as_ref());
            let rung = fds.last().is_some_and(|fd| !fd.revents().is_empty());
            self.lock().woke(
                handles
                    .iter()
                    .zip(&fds)
                    .filter(|(_, fd)| !fd.revents().is_empty())
                    .map(|((token, _, _), _)| *token),
            );
            drop(fds);
            // Outside the lock: the last handle of a connection dropped meanwhile closes it.
            handles.clear();
            match result {
                Ok(_) => {}
                Err(rustix::io::Errno::INTR) => return Ok(None),
                Err(errno) => return Err(errno.into()),
            }
            if rung {
                self.bell.pipe().answer();
                if self.interrupted.swap(false, Ordering::SeqCst) {
                    return Ok(None);
                }
            }
            polled = true;
        }
    }

    /// Runs the drive step and returns the first whole frame; if it finds none, polls the
    /// mesh's sockets without waiting and, if any is ready, runs the drive step once more.
    /// Safe from any thread, next to a `recv_blocking` on another (which it wakes if it leaves
    /// work that thread's poll would not notice) and to sends.
    ///
    /// # Errors
    /// As [`BlockingRecv::recv_blocking`].
    fn try_recv(&self) -> io::Result<Option<Datagram>> {
        let mut state = self.lock();
        let step = match state.drive(Instant::now(), Mode::Blocking) {
            Step::Idle(_) if state.poll_now()? => state.drive(Instant::now(), Mode::Blocking),
            step => step,
        };
        received(step)
    }

    /// Runs the drive step and returns the first whole frame: one already read, or one on a
    /// connection the last `poll` found ready (or that a send left work on). Unlike
    /// [`BlockingRecv::try_recv`] it does not poll every socket, which costs a system call
    /// over all of them: the driver drains a wake-up with it, however many connections the
    /// mesh has.
    ///
    /// # Errors
    /// As [`BlockingRecv::recv_blocking`].
    fn try_recv_ready(&self) -> io::Result<Option<Datagram>> {
        received(self.lock().drive(Instant::now(), Mode::Blocking))
    }

    /// Rings the doorbell's pipe: the `recv_blocking` in progress, or the next one, returns
    /// `Ok(None)` once it has seen the ring (at once, unless it finds a frame first).
    fn interrupt(&self) {
        self.interrupted.store(true, Ordering::SeqCst);
        self.bell.wake_blocked();
    }
}

/// What a receive that does not wait returns for a drive step.
fn received(step: Step) -> io::Result<Option<Datagram>> {
    match step {
        Step::Datagram(datagram) => Ok(Some(datagram)),
        Step::Idle(_) => Ok(None),
        Step::Closed => Err(closed()),
    }
}
