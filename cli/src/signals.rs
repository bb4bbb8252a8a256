//! The termination signals `conclave` reacts to, as a stream, and sending signals to a child.

use async_signal::{Signal, Signals};
use rustix::process::{kill_process, Pid};

/// The signals that end `serve` and `watch` and that `run` forwards to its command.
pub(crate) const TERMINATING: [Signal; 3] = [Signal::Int, Signal::Term, Signal::Hup];

/// Starts catching [`TERMINATING`]: from now on they arrive on the stream instead of ending
/// the process.
///
/// # Errors
/// The handlers could not be installed.
pub(crate) fn catch() -> std::io::Result<Signals> {
    Signals::new(TERMINATING)
}

/// Sends `signal` to the process `pid`. A process that has exited already is not an error.
pub(crate) fn send(pid: u32, signal: Signal) {
    let signal = match signal {
        Signal::Int => rustix::process::Signal::INT,
        Signal::Hup => rustix::process::Signal::HUP,
        Signal::Kill => rustix::process::Signal::KILL,
        _ => rustix::process::Signal::TERM,
    };
    if let Some(pid) = i32::try_from(pid).ok().and_then(Pid::from_raw) {
        // ESRCH: the process is gone, which is what the signal was for.
        let _ = kill_process(pid, signal);
    }
}
