//! What can go wrong with a member's Raft storage.

use std::io;
use std::path::{Path, PathBuf};

/// An error of [`super::RaftDisk`].
#[derive(Debug, thiserror::Error)]
pub(crate) enum DiskError {
    /// A file operation failed; the message names the operation and the file. After a failed
    /// [`write`](super::RaftDisk::write) or [`compact`](super::RaftDisk::compact) the store
    /// refuses further writes (what reached the disk is unknown): drop it and open it again,
    /// which recovers what is durable. A batch the store rejects as malformed (kind
    /// `InvalidInput`) changed nothing and does not have this effect.
    #[error("raft storage: {0}")]
    Io(#[from] io::Error),
    /// A file is unreadable in a way a crash cannot explain: `meta`, `generation`, every
    /// snapshot, a log record followed by later segments, a record whose checksum holds but
    /// whose contents do not decode, or a log that does not join its snapshot. Nothing was
    /// changed; the member must not run on this directory as it is.
    #[error("raft storage is corrupt: {0}")]
    Corrupt(String),
    /// The directory's `meta` names another cluster or member (or another format). Nothing was
    /// changed.
    #[error("raft storage belongs to someone else: {0}")]
    Mismatch(String),
    /// Another live process, or another open store in this process, holds the directory.
    /// Nothing was changed.
    #[error("raft storage {} is in use by another process", .0.display())]
    Locked(PathBuf),
}

impl DiskError {
    /// A malformed request: refused before anything was written.
    pub(super) fn invalid(message: String) -> Self {
        DiskError::Io(io::Error::new(io::ErrorKind::InvalidInput, message))
    }
}

/// Wraps an I/O error with what was being done to which file.
pub(super) fn io_at<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(io::Error) -> DiskError + 'a {
    move |e| {
        DiskError::Io(io::Error::new(
            e.kind(),
            format!("{what} {}: {e}", path.display()),
        ))
    }
}
