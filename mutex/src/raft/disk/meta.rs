//! The `meta` file (whose store this is) and the `generation` file (how many times it was
//! opened).

use std::fs;
use std::path::Path;

use super::error::DiskError;
use super::record::{self, GENERATION, META};

/// The on-disk format this code writes and reads.
const FORMAT: u32 = 1;

/// The name of the file naming the store's cluster and member.
const META_FILE: &str = "meta";

/// The name of the file holding the generation.
const GENERATION_FILE: &str = "generation";

/// Checks that the store in `dir` belongs to `cluster` and `member`, or makes it theirs if it
/// is new.
///
/// # Errors
/// [`DiskError::Mismatch`] if `meta` names another cluster, member or format;
/// [`DiskError::Corrupt`] if it is unreadable, or missing while a log or snapshot exists.
pub(super) fn claim(dir: &Path, cluster: &str, member: &str, sync: bool) -> Result<(), DiskError> {
    let path = dir.join(META_FILE);
    let Some(body) = record::read_single(&path, META)? else {
        for sub in ["wal", "snap"] {
            if fs::read_dir(dir.join(sub)).is_ok_and(|mut d| d.next().is_some()) {
                return Err(DiskError::Corrupt(format!(
                    "{}: missing, but {sub}/ holds files",
                    path.display()
                )));
            }
        }
        let body = cbor4ii::serde::to_vec(Vec::new(), &(FORMAT, cluster, member))
            .map_err(record::encode_failed)?;
        return record::write_single(dir, META_FILE, META, &body, sync);
    };
    let (format, found_cluster, found_member): (u32, String, String) =
        cbor4ii::serde::from_slice(&body).map_err(|e| record::undecodable(&path, "meta", e))?;
    if format != FORMAT {
        return Err(DiskError::Mismatch(format!(
            "{}: format {format}; this build reads format {FORMAT}",
            path.display()
        )));
    }
    if found_cluster != cluster || found_member != member {
        return Err(DiskError::Mismatch(format!(
            "{}: cluster {found_cluster:?} member {found_member:?}, not cluster {cluster:?} member {member:?}",
            path.display()
        )));
    }
    Ok(())
}

/// Reads the generation in `dir` (0 if none), and writes back one more, durably; returns the
/// new one.
///
/// # Errors
/// [`DiskError::Corrupt`] if the file is unreadable; [`DiskError::Io`] if it cannot be
/// written.
pub(super) fn next_generation(dir: &Path, sync: bool) -> Result<u64, DiskError> {
    let path = dir.join(GENERATION_FILE);
    let previous: u64 = match record::read_single(&path, GENERATION)? {
        Some(body) => cbor4ii::serde::from_slice(&body)
            .map_err(|e| record::undecodable(&path, "generation", e))?,
        None => 0,
    };
    let next = previous
        .checked_add(1)
        .ok_or_else(|| DiskError::Corrupt(format!("{}: exhausted", path.display())))?;
    let body = cbor4ii::serde::to_vec(Vec::new(), &next).map_err(record::encode_failed)?;
    record::write_single(dir, GENERATION_FILE, GENERATION, &body, sync)?;
    Ok(next)
}
