//! placeholder: the helper writes the real store
#![allow(dead_code, unused_variables, missing_docs)]
use std::path::Path;

use conclave_protocol::raft::persist::{PersistBatch, Recovered, SnapshotRecord};

#[derive(Debug, thiserror::Error)]
pub(crate) enum DiskError {
    #[error("io: {0}")]
    Io(#[from] std::io::Error),
}

pub(crate) struct RaftDisk;
impl RaftDisk {
    pub(crate) fn open(
        dir: &Path,
        cluster: &str,
        member: &str,
        sync: bool,
    ) -> Result<(RaftDisk, Recovered), DiskError> {
        Ok((RaftDisk, Recovered::default()))
    }
    pub(crate) fn write(&mut self, batch: &PersistBatch) -> Result<(), DiskError> {
        Ok(())
    }
    pub(crate) fn compact(&mut self, snapshot: &SnapshotRecord) -> Result<(), DiskError> {
        Ok(())
    }
}
