//! The member's data directory: the one thing a member keeps across restarts.
//!
//! Under the `Majority` policy a member writes there the highest grantor term it has promised
//! to support (see `docs/protocol.md`, "Tokens across restarts"), before it sends anything that
//! follows the promise; a restarted member reads it back, never supports that term or a lower
//! one again, and so every fencing token issued after any restart — of any subset of members,
//! the whole cluster included — exceeds every token issued before.
//!
//! The file is `<data dir>/promised-term`: the term in decimal. It is replaced atomically: the
//! new value goes to a temporary file, which is synced, renamed over the old one, and the
//! directory synced.

use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The file name of the promised term in the data directory.
const TERM_FILE: &str = "promised-term";

/// The promised-term file of one member.
#[derive(Debug)]
pub(crate) struct TermFile {
    dir: PathBuf,
    /// The value on disk.
    saved: u64,
}

impl TermFile {
    /// Opens (creating the directory if needed) and reads the term stored in `dir` (0 if none).
    pub(crate) fn open(dir: &Path) -> io::Result<Self> {
        fs::create_dir_all(dir)?;
        let saved = match fs::read_to_string(dir.join(TERM_FILE)) {
            Ok(text) => text.trim().parse::<u64>().map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{}: not a term: {e}", dir.join(TERM_FILE).display()),
                )
            })?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => 0,
            Err(e) => return Err(e),
        };
        Ok(Self {
            dir: dir.to_owned(),
            saved,
        })
    }

    /// The term on disk.
    pub(crate) fn saved(&self) -> u64 {
        self.saved
    }

    /// Writes `term` durably, unless the disk already has it or a higher one.
    pub(crate) fn store(&mut self, term: u64) -> io::Result<()> {
        if term <= self.saved {
            return Ok(());
        }
        let temporary = self.dir.join(format!("{TERM_FILE}.tmp"));
        let mut file = File::create(&temporary)?;
        writeln!(file, "{term}")?;
        file.sync_all()?;
        drop(file);
        fs::rename(&temporary, self.dir.join(TERM_FILE))?;
        File::open(&self.dir)?.sync_all()?;
        self.saved = term;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_term_is_read_back_and_never_lowered() {
        let dir = std::env::temp_dir().join(format!("conclave-durable-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let mut file = TermFile::open(&dir).expect("open");
        assert_eq!(file.saved(), 0);
        file.store(7).expect("store");
        file.store(3).expect("a lower term is a no-op");
        assert_eq!(TermFile::open(&dir).expect("reopen").saved(), 7);
        fs::write(dir.join(TERM_FILE), "garbage").expect("write");
        assert!(
            TermFile::open(&dir).is_err(),
            "a corrupt file is an error, not 0"
        );
        let _ = fs::remove_dir_all(&dir);
    }
}
