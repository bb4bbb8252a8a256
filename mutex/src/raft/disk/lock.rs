//! The exclusive hold of a data directory: two processes writing one Raft log would break
//! every promise the log makes (a vote cast twice, an entry acknowledged and then lost).
//!
//! A `LOCK` file names its holder as `<pid> <start time>`, the start time being field 22 of
//! `/proc/<pid>/stat` (clock ticks since boot). It is created whole, by hard-linking a fully
//! written `LOCK.<pid>.new` to `LOCK` (which fails if `LOCK` exists), and removed on drop. A
//! `LOCK` left behind by a killed process does not block a restart: the lock is refused only
//! while a process with that pid *and* that start time is alive, so a pid reused by another
//! process (the usual case in containers, where every run is pid 1) counts as dead. Within
//! one process a registry of held directories refuses a second open.
//!
//! Taking over a stale `LOCK` renames it aside first and checks that what was renamed is the
//! stale file that was judged, so two processes starting at once on a directory left by a
//! killed one cannot both win. Without `/proc` (not Linux) liveness cannot be told, and any
//! `LOCK` of another process is refused: remove it by hand once no process uses the directory.
//! flock(2) would need no liveness check, but the front crate does not depend on rustix and
//! std's `File::try_lock` needs Rust 1.89.

use std::collections::BTreeSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};

use tracing::{debug, warn};

use super::error::{io_at, DiskError};

/// The lock file's name in the data directory.
const LOCK_FILE: &str = "LOCK";

/// How often acquisition retries after losing a race with another process.
const ATTEMPTS: usize = 8;

/// The directories this process holds (canonical paths).
static HELD: Mutex<BTreeSet<PathBuf>> = Mutex::new(BTreeSet::new());

/// A held data directory; released on drop.
#[derive(Debug)]
pub(super) struct DirLock {
    /// The directory, canonical.
    dir: PathBuf,
    /// What this process wrote into `LOCK`.
    stamp: String,
}

/// A process, told apart from a later one with the same pid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Holder {
    /// Its pid.
    pub(super) pid: u32,
    /// Its start time in clock ticks since boot (0: unknown).
    pub(super) start: u64,
}

impl Holder {
    /// This process.
    pub(super) fn current() -> Self {
        let pid = std::process::id();
        Holder {
            pid,
            start: start_time(pid).unwrap_or(0),
        }
    }

    /// What the lock file holds.
    pub(super) fn stamp(self) -> String {
        format!("{} {}\n", self.pid, self.start)
    }

    /// Reads a stamp back.
    fn parse(text: &str) -> Option<Self> {
        let mut words = text.split_whitespace();
        let pid = words.next()?.parse().ok()?;
        let start = words.next()?.parse().ok()?;
        words.next().is_none().then_some(Holder { pid, start })
    }

    /// Whether this process still runs (`true` when that cannot be told).
    fn is_alive(self) -> bool {
        match start_time(self.pid) {
            Some(start) => self.start == 0 || start == self.start,
            None => !Path::new("/proc/self/stat").exists(),
        }
    }
}

impl DirLock {
    /// Takes `dir` (which exists) for this process.
    ///
    /// # Errors
    /// [`DiskError::Locked`] if a live process (this one included) holds it;
    /// [`DiskError::Io`] if the lock file cannot be written or read.
    pub(super) fn acquire(dir: &Path) -> Result<Self, DiskError> {
        let dir = dir.canonicalize().map_err(io_at("resolving", dir))?;
        let fresh = HELD
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(dir.clone());
        if !fresh {
            return Err(DiskError::Locked(dir));
        }
        let me = Holder::current();
        let lock = DirLock {
            stamp: me.stamp(),
            dir,
        };
        // On an error `lock` drops: it leaves the registry, and a LOCK not its own alone.
        for _ in 0..ATTEMPTS {
            if lock.try_link()? {
                return Ok(lock);
            }
            let path = lock.dir.join(LOCK_FILE);
            let text = match fs::read_to_string(&path) {
                Ok(text) => text,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_at("reading", &path)(e)),
            };
            match Holder::parse(&text) {
                Some(holder) if holder != me && holder.is_alive() => {
                    warn!(dir = %lock.dir.display(), pid = holder.pid, "raft storage held by a live process");
                    return Err(DiskError::Locked(lock.dir.clone()));
                }
                holder => {
                    if !lock.remove_stale(&text)? {
                        return Err(DiskError::Locked(lock.dir.clone()));
                    }
                    warn!(
                        dir = %lock.dir.display(),
                        pid = holder.map(|h| h.pid),
                        "took over the raft storage lock of a process that is gone"
                    );
                }
            }
        }
        Err(DiskError::Locked(lock.dir.clone()))
    }

    /// Creates `LOCK` whole with this process's stamp; `false` if it exists.
    fn try_link(&self) -> Result<bool, DiskError> {
        let temporary = self
            .dir
            .join(format!("{LOCK_FILE}.{}.new", std::process::id()));
        fs::write(&temporary, &self.stamp).map_err(io_at("writing", &temporary))?;
        let path = self.dir.join(LOCK_FILE);
        let linked = fs::hard_link(&temporary, &path);
        let _ = fs::remove_file(&temporary);
        match linked {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(io_at("creating", &path)(e)),
        }
    }

    /// Removes a `LOCK` judged stale whose contents were `judged`: `true` if it is gone (or
    /// someone else removed it), `false` if another process took the lock meanwhile.
    fn remove_stale(&self, judged: &str) -> Result<bool, DiskError> {
        let path = self.dir.join(LOCK_FILE);
        let aside = self
            .dir
            .join(format!("{LOCK_FILE}.{}.stale", std::process::id()));
        match fs::rename(&path, &aside) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(true),
            Err(e) => return Err(io_at("renaming", &path)(e)),
        }
        let moved = fs::read_to_string(&aside).map_err(io_at("reading", &aside))?;
        if moved == judged {
            fs::remove_file(&aside).map_err(io_at("removing", &aside))?;
            return Ok(true);
        }
        // A live process took the lock between the read and the rename: give it back.
        let restored = fs::hard_link(&aside, &path);
        let _ = fs::remove_file(&aside);
        if let Err(e) = restored {
            warn!(dir = %self.dir.display(), error = %e, "could not restore another process's raft storage lock");
        }
        Ok(false)
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        let path = self.dir.join(LOCK_FILE);
        if fs::read_to_string(&path).is_ok_and(|text| text == self.stamp) {
            if let Err(e) = fs::remove_file(&path) {
                debug!(path = %path.display(), error = %e, "could not remove the lock file");
            }
        }
        HELD.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.dir);
    }
}

/// The start time of process `pid` (field 22 of `/proc/<pid>/stat`), if it exists and `/proc`
/// tells.
pub(super) fn start_time(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 2, the command name, is in parentheses and may contain anything; fields from 3 on
    // follow the last ')'.
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(22 - 3)?.parse().ok()
}
