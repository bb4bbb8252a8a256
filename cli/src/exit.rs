//! The exit statuses of `conclave` and the error that carries one.
//!
//! `conclave run` returns its command's status; its own failures use codes a command rarely
//! does, following `sysexits.h` and the shells' `126`/`127` (as `env`, `nice` and `timeout`
//! do for a command they cannot start). Bad command-line syntax, or a flag or environment
//! value that does not parse, exits with clap's status 2.

use std::process::ExitCode;

use thiserror::Error;

/// The member could not join the cluster, or the cluster stopped answering
/// (`EX_UNAVAILABLE`).
pub(crate) const UNAVAILABLE: u8 = 69;
/// Something that should not happen did (`EX_SOFTWARE`).
pub(crate) const INTERNAL: u8 = 70;
/// The lock was not acquired within `--timeout` (`EX_TEMPFAIL`: try again later).
pub(crate) const LOCK_TIMEOUT: u8 = 75;
/// The configuration is wrong: the file, a setting's value, the key file (`EX_CONFIG`).
pub(crate) const CONFIG: u8 = 78;
/// The lock was lost while the command ran; the command was killed.
pub(crate) const LOCK_LOST: u8 = 79;
/// The command exists but could not be run (the shells' code).
pub(crate) const CANNOT_EXECUTE: u8 = 126;
/// The command was not found (the shells' code).
pub(crate) const NOT_FOUND: u8 = 127;

/// Why `conclave` stopped before its work was done, with the status it exits with.
#[derive(Debug, Error)]
pub(crate) enum CliError {
    /// The configuration is wrong.
    #[error("configuration: {0}")]
    Config(String),
    /// The cluster could not be joined, or stopped answering.
    #[error("{0}")]
    Unavailable(String),
    /// The lock was not acquired in time.
    #[error("{0}")]
    LockTimeout(String),
    /// The lock was lost while the command ran.
    #[error("{0}")]
    LockLost(String),
    /// The command could not be started.
    #[error("{message}")]
    Command {
        /// What went wrong.
        message: String,
        /// Whether the command does not exist (else it exists but could not be run).
        not_found: bool,
    },
    /// A signal (its number) ended the wait for the lock; the request was withdrawn.
    #[error("interrupted by signal {0} while waiting for the lock")]
    Interrupted(i32),
    /// Reading signals, writing output or another local operation failed.
    #[error("{0}")]
    Internal(String),
}

impl CliError {
    /// The status `conclave` exits with for this error.
    pub(crate) fn code(&self) -> u8 {
        match self {
            CliError::Config(_) => CONFIG,
            CliError::Unavailable(_) => UNAVAILABLE,
            CliError::LockTimeout(_) => LOCK_TIMEOUT,
            CliError::LockLost(_) => LOCK_LOST,
            CliError::Command {
                not_found: true, ..
            } => NOT_FOUND,
            CliError::Command { .. } => CANNOT_EXECUTE,
            CliError::Interrupted(signal) => u8::try_from(128 + signal).unwrap_or(INTERNAL),
            CliError::Internal(_) => INTERNAL,
        }
    }

    /// Prints the error and gives the exit code.
    pub(crate) fn report(&self) -> ExitCode {
        eprintln!("conclave: {self}");
        ExitCode::from(self.code())
    }
}

impl From<std::io::Error> for CliError {
    fn from(error: std::io::Error) -> Self {
        CliError::Internal(error.to_string())
    }
}
