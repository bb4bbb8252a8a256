//! Snapshot files: `snap/<index>-<term>.snap`, one record of kind `SNAPSHOT` each, written
//! atomically; the newest two are kept.

use std::fs;
use std::path::{Path, PathBuf};

use conclave_protocol::raft::persist::SnapshotRecord;
use tracing::warn;

use super::error::{io_at, DiskError};
use super::record::{self, SNAPSHOT};

/// How many snapshot files are kept.
const KEEP: usize = 2;

/// The snapshot directory and the newest snapshot in it.
#[derive(Debug)]
pub(super) struct Snapshots {
    /// `snap/`.
    dir: PathBuf,
    /// Whether writes are synced.
    sync: bool,
    /// The newest snapshot's index and term.
    newest: Option<(u64, u64)>,
}

impl Snapshots {
    /// Opens `dir` (which exists) and loads the newest snapshot whose record checks. Newer files
    /// that do not check are renamed to `<name>.corrupt` (kept for inspection, never read
    /// again); an older snapshot is then used, and the caller checks that the log joins it.
    pub(super) fn recover(
        dir: PathBuf,
        sync: bool,
    ) -> Result<(Self, Option<SnapshotRecord>), DiskError> {
        record::remove_temporaries(&dir)?;
        let mut found = None;
        for (index, term) in list(&dir)?.into_iter().rev() {
            let path = dir.join(file_name(index, term));
            match load(&path, index, term) {
                Ok(snapshot) => {
                    found = Some(snapshot);
                    break;
                }
                Err(DiskError::Corrupt(why)) => {
                    warn!(%why, "skipping a corrupt raft snapshot");
                    let aside = dir.join(format!("{}.corrupt", file_name(index, term)));
                    fs::rename(&path, &aside).map_err(io_at("renaming", &path))?;
                }
                Err(e) => return Err(e),
            }
        }
        let snapshots = Snapshots {
            dir,
            sync,
            newest: found.as_ref().map(|s: &SnapshotRecord| (s.index, s.term)),
        };
        Ok((snapshots, found))
    }

    /// The newest snapshot's index (0 without one).
    pub(super) fn index(&self) -> u64 {
        self.newest.map_or(0, |(index, _)| index)
    }

    /// Whether `snapshot` is newer than the newest one saved.
    pub(super) fn is_newer(&self, snapshot: &SnapshotRecord) -> bool {
        self.newest.is_none_or(|(index, _)| snapshot.index > index)
    }

    /// Saves `snapshot` durably, then removes all but the newest [`KEEP`] files.
    pub(super) fn save(&mut self, snapshot: &SnapshotRecord) -> Result<(), DiskError> {
        let body = cbor4ii::serde::to_vec(Vec::new(), snapshot).map_err(record::encode_failed)?;
        let name = file_name(snapshot.index, snapshot.term);
        record::write_single(&self.dir, &name, SNAPSHOT, &body, self.sync)?;
        self.newest = Some((snapshot.index, snapshot.term));
        let files = list(&self.dir)?;
        for (index, term) in files.iter().rev().skip(KEEP) {
            let path = self.dir.join(file_name(*index, *term));
            // An old snapshot left behind costs only space; the new one is already durable.
            if let Err(e) = fs::remove_file(&path) {
                warn!(path = %path.display(), error = %e, "could not remove an old raft snapshot");
            }
        }
        Ok(())
    }
}

/// A snapshot's file name.
fn file_name(index: u64, term: u64) -> String {
    format!("{index:020}-{term:020}.snap")
}

/// The `(index, term)` of every snapshot file in `dir`, ascending.
fn list(dir: &Path) -> Result<Vec<(u64, u64)>, DiskError> {
    let mut found = Vec::new();
    for entry in fs::read_dir(dir).map_err(io_at("listing", dir))? {
        let name = entry.map_err(io_at("listing", dir))?.file_name();
        let parsed = name
            .to_str()
            .and_then(|n| n.strip_suffix(".snap"))
            .and_then(|n| n.split_once('-'))
            .and_then(|(i, t)| Some((i.parse().ok()?, t.parse().ok()?)));
        found.extend(parsed);
    }
    found.sort_unstable();
    Ok(found)
}

/// Reads the snapshot file `path`, which must hold the snapshot its name says.
fn load(path: &Path, index: u64, term: u64) -> Result<SnapshotRecord, DiskError> {
    let body = record::read_single(path, SNAPSHOT)?
        .ok_or_else(|| DiskError::Corrupt(format!("{}: vanished", path.display())))?;
    let snapshot: SnapshotRecord =
        cbor4ii::serde::from_slice(&body).map_err(|e| record::undecodable(path, "snapshot", e))?;
    if (snapshot.index, snapshot.term) != (index, term) {
        return Err(DiskError::Corrupt(format!(
            "{}: holds the snapshot at index {} term {}",
            path.display(),
            snapshot.index,
            snapshot.term
        )));
    }
    Ok(snapshot)
}
