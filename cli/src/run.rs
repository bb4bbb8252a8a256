//! `conclave run`: hold a lock while a command runs.

use std::ffi::OsString;
use std::future::Future;
use std::io;
use std::os::unix::process::ExitStatusExt;
use std::pin::pin;
use std::process::ExitStatus;
use std::time::Duration;

use async_signal::Signal;
use conclave::futures::{Lock, Read};
use conclave::{FencingToken, LockError, LockLostReason, MutexGuard, Node, RwLockGuard};
use futures::StreamExt;
use smol::process::Command;

use crate::args::RunArgs;
use crate::duration::HumanDuration;
use crate::exit::{self, CliError};
use crate::signals;

/// The environment variable that carries the fencing token to the command.
pub(crate) const TOKEN_VAR: &str = "CONCLAVE_FENCING_TOKEN";
/// The environment variable that carries the lock's name to the command.
pub(crate) const LOCK_VAR: &str = "CONCLAVE_LOCK";

/// Acquires the lock, runs the command, releases the lock, and returns the command's exit
/// status (or `128 + N` if a signal N ended it).
///
/// # Errors
/// [`CliError::LockTimeout`] if the lock was not acquired in time, [`CliError::LockLost`] if
/// it was lost while the command ran (the command was killed), [`CliError::Command`] if the
/// command could not be started, [`CliError::Unavailable`] if the cluster did not answer.
pub(crate) async fn run(node: &Node, args: &RunArgs) -> Result<u8, CliError> {
    // Caught from before the wait for the lock, so a signal then ends the wait cleanly
    // (the request is withdrawn) instead of killing the process.
    let mut signals = signals::catch()?;
    let guard = {
        let acquire = pin!(acquire(node, args));
        match futures::future::select(acquire, signals.next()).await {
            futures::future::Either::Left((guard, _)) => guard?,
            futures::future::Either::Right((signal, _)) => {
                let number = signal.and_then(Result::ok).map_or(15, |s| s as i32);
                return Err(CliError::Interrupted(number));
            }
        }
    };
    let token = guard.fencing_token();
    let mut child = spawn(&args.command, &args.lock, token)?;
    let pid = child.id();
    let mut exited = pin!(child.status());
    let outcome = {
        let mut lost = pin!(guard.lost());
        loop {
            let next = smol::future::or(
                async { Step::Exited((&mut exited).await) },
                smol::future::or(async { Step::Lost((&mut lost).await) }, async {
                    Step::Signal(signals.next().await)
                }),
            )
            .await;
            match next {
                Step::Signal(Some(Ok(signal))) => signals::send(pid, signal),
                Step::Signal(Some(Err(e))) => return Err(e.into()),
                // The stream does not end while it is held; should it, the command decides.
                Step::Signal(None) => {}
                ended => break ended,
            }
        }
    };
    match outcome {
        Step::Lost(reason) => {
            eprintln!(
                "conclave: lock {} lost ({reason}); stopping the command",
                args.lock
            );
            signals::send(pid, Signal::Term);
            let grace = smol::Timer::after(args.kill_grace.0);
            let stopped = smol::future::or(async { (&mut exited).await.ok() }, async {
                grace.await;
                None
            })
            .await;
            if stopped.is_none() {
                signals::send(pid, Signal::Kill);
                let _ = (&mut exited).await;
            }
            Err(lost_error(&args.lock, reason))
        }
        Step::Exited(status) => {
            let status = status?;
            guard.release().await;
            Ok(status_code(status))
        }
        Step::Signal(_) => Err(CliError::Internal("the signal loop ended early".into())),
    }
}

/// What happened next while the command runs.
enum Step {
    Exited(io::Result<ExitStatus>),
    Lost(LockLostReason),
    Signal(Option<io::Result<Signal>>),
}

/// The lock held for the command: exclusive, or shared.
enum HeldGuard {
    Exclusive(MutexGuard),
    Shared(RwLockGuard),
}

impl HeldGuard {
    fn fencing_token(&self) -> FencingToken {
        match self {
            HeldGuard::Exclusive(g) => g.fencing_token(),
            HeldGuard::Shared(g) => g.fencing_token(),
        }
    }

    async fn lost(&self) -> LockLostReason {
        match self {
            HeldGuard::Exclusive(g) => g.lost().await,
            HeldGuard::Shared(g) => g.lost().await,
        }
    }

    /// Releases the lock and waits for the grantor; a release it could not confirm is
    /// reported, and the command's status is returned all the same (the lock is released
    /// here, and the grantor frees it when it learns so).
    async fn release(self) {
        let result = match self {
            HeldGuard::Exclusive(g) => g.unlock().await,
            HeldGuard::Shared(g) => g.unlock().await,
        };
        if let Err(e) = result {
            eprintln!("conclave: releasing the lock: {e}");
        }
    }
}

async fn acquire(node: &Node, args: &RunArgs) -> Result<HeldGuard, CliError> {
    let invalid = |e: conclave::LockNameError| CliError::Config(e.to_string());
    let service = match &args.service {
        Some(name) => Some(
            node.lock_service(name.as_str())
                .map_err(|e| CliError::Config(e.to_string()))?,
        ),
        None => None,
    };
    let name = args.lock.as_str();
    let timeout = args.timeout.map(|t| t.0);
    let result = if args.shared {
        let rw = match &service {
            Some(s) => s.rw_lock(name),
            None => node.rw_lock(name),
        }
        .map_err(invalid)?;
        let read = match timeout {
            Some(Duration::ZERO) => rw.try_read(),
            Some(t) => rw.read_timeout(t),
            None => rw.read(),
        };
        leased(read, args.lease, Read::lease)
            .await
            .map(HeldGuard::Shared)
    } else {
        let mutex = match &service {
            Some(s) => s.mutex(name),
            None => node.mutex(name),
        }
        .map_err(invalid)?;
        let lock = match timeout {
            Some(Duration::ZERO) => mutex.try_lock(),
            Some(t) => mutex.lock_timeout(t),
            None => mutex.lock(),
        };
        leased(lock, args.lease, Lock::lease)
            .await
            .map(HeldGuard::Exclusive)
    };
    result.map_err(|e| match e {
        LockError::WouldBlock => {
            CliError::LockTimeout(format!("lock {} is held by another owner", args.lock))
        }
        LockError::Timeout => CliError::LockTimeout(format!(
            "lock {} is held by another owner: not acquired within {}",
            args.lock,
            args.timeout.map_or_else(String::new, |t| t.to_string())
        )),
        other => CliError::Unavailable(format!("acquiring lock {}: {other}", args.lock)),
    })
}

/// Awaits a lock future, with `--lease` set on it through `set_lease` if given.
async fn leased<F: Future>(
    future: F,
    lease: Option<HumanDuration>,
    set_lease: fn(F, Duration) -> F,
) -> F::Output {
    match lease {
        Some(lease) => set_lease(future, lease.0).await,
        None => future.await,
    }
}

fn spawn(
    command: &[OsString],
    lock: &str,
    token: FencingToken,
) -> Result<smol::process::Child, CliError> {
    let (program, rest) = command.split_first().ok_or_else(|| CliError::Command {
        message: "no command given".into(),
        not_found: true,
    })?;
    Command::new(program)
        .args(rest)
        .env(TOKEN_VAR, token.0.to_string())
        .env(LOCK_VAR, lock)
        .spawn()
        .map_err(|e| CliError::Command {
            message: format!("cannot run {}: {e}", program.to_string_lossy()),
            not_found: e.kind() == io::ErrorKind::NotFound,
        })
}

fn lost_error(lock: &str, reason: LockLostReason) -> CliError {
    CliError::LockLost(format!(
        "lock {lock} was lost ({reason}); the command was stopped (exit {})",
        exit::LOCK_LOST
    ))
}

/// The command's exit status as `conclave`'s: its code, or `128 + N` for signal N (as
/// shells report it).
fn status_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(exit::INTERNAL),
        (None, Some(signal)) => u8::try_from(128 + signal).unwrap_or(exit::INTERNAL),
        (None, None) => exit::INTERNAL,
    }
}
