//! Records and small files: the framing every file of the store uses (log segments, `meta`,
//! `generation`, snapshots), and the atomic replacement of a file.

use std::fmt::Display;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::Path;

use super::crc::crc32c;
use super::error::{io_at, DiskError};

/// Bytes before a record's kind: its length and its checksum.
pub(super) const HEADER: usize = 8;

/// Log record: a CBOR array of `LogEntry`, contiguous and ascending; each replaces any entry
/// at its index or above.
pub(super) const ENTRIES: u8 = 1;
/// Log record: a CBOR `HardState`; the last one read is the hard state.
pub(super) const HARD_STATE: u8 = 2;
/// Log record: a CBOR unsigned `from`; every entry at `from` or above is dropped.
pub(super) const TRUNCATE: u8 = 3;
/// The `meta` file's record: a CBOR array `[format, cluster, member]`.
pub(super) const META: u8 = 16;
/// The `generation` file's record: a CBOR unsigned.
pub(super) const GENERATION: u8 = 17;
/// A snapshot file's record: a CBOR `SnapshotRecord`.
pub(super) const SNAPSHOT: u8 = 18;

/// Appends one record, `[len u32 LE][crc32c u32 LE][kind u8][body]`, to `out`; `len` counts
/// the kind and the body, and the checksum covers the same bytes.
pub(super) fn encode(kind: u8, body: &[u8], out: &mut Vec<u8>) -> Result<(), DiskError> {
    let len = u32::try_from(body.len() + 1)
        .map_err(|_| DiskError::invalid(format!("a record of {} bytes", body.len())))?;
    let start = out.len();
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.push(kind);
    out.extend_from_slice(body);
    let crc = crc32c(&out[start + HEADER..]);
    out[start + 4..start + HEADER].copy_from_slice(&crc.to_le_bytes());
    Ok(())
}

/// The first record of `bytes`.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Decoded<'a> {
    /// A whole record whose checksum holds.
    Record {
        /// Its kind.
        kind: u8,
        /// Its body.
        body: &'a [u8],
        /// Its size with the header.
        size: usize,
    },
    /// No bytes left.
    End,
    /// A record cut short or damaged (why): a torn write, or a corrupt one.
    Bad(&'static str),
}

/// Reads the first record of `bytes`.
pub(super) fn decode(bytes: &[u8]) -> Decoded<'_> {
    if bytes.is_empty() {
        return Decoded::End;
    }
    let Some((header, rest)) = bytes.split_first_chunk::<HEADER>() else {
        return Decoded::Bad("a header cut short");
    };
    let [l0, l1, l2, l3, c0, c1, c2, c3] = *header;
    let len = u32::from_le_bytes([l0, l1, l2, l3]) as usize;
    let crc = u32::from_le_bytes([c0, c1, c2, c3]);
    if len == 0 {
        // Also what a tail of zeros, left by a crash after the file grew, looks like.
        return Decoded::Bad("a zero length");
    }
    let Some(framed) = rest.get(..len) else {
        return Decoded::Bad("a record running past the end of the file");
    };
    if crc32c(framed) != crc {
        return Decoded::Bad("a checksum mismatch");
    }
    Decoded::Record {
        kind: framed[0],
        body: &framed[1..],
        size: HEADER + len,
    }
}

/// The body of the file at `path`, which must hold exactly one record of `kind`; `None` if
/// there is no such file.
pub(super) fn read_single(path: &Path, kind: u8) -> Result<Option<Vec<u8>>, DiskError> {
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_at("reading", path)(e)),
    };
    match decode(&bytes) {
        Decoded::Record {
            kind: found,
            body,
            size,
        } if found == kind && size == bytes.len() => Ok(Some(body.to_vec())),
        Decoded::Record { .. } => Err(DiskError::Corrupt(format!(
            "{}: not a single record of kind {kind}",
            path.display()
        ))),
        Decoded::End => Err(DiskError::Corrupt(format!("{}: empty", path.display()))),
        Decoded::Bad(why) => Err(DiskError::Corrupt(format!("{}: {why}", path.display()))),
    }
}

/// Replaces `dir/name` with a file holding one record: written to `name.tmp`, synced, renamed
/// over `name`, and the directory synced (no syncs when `sync` is false). A crash leaves the
/// old file or the new one, never a mix; a leftover `.tmp` is ignored and removed at the next
/// open.
pub(super) fn write_single(
    dir: &Path,
    name: &str,
    kind: u8,
    body: &[u8],
    sync: bool,
) -> Result<(), DiskError> {
    let mut bytes = Vec::with_capacity(HEADER + 1 + body.len());
    encode(kind, body, &mut bytes)?;
    let temporary = dir.join(format!("{name}.tmp"));
    let mut file = File::create(&temporary).map_err(io_at("creating", &temporary))?;
    file.write_all(&bytes)
        .map_err(io_at("writing", &temporary))?;
    if sync {
        file.sync_all().map_err(io_at("syncing", &temporary))?;
    }
    drop(file);
    let path = dir.join(name);
    fs::rename(&temporary, &path).map_err(io_at("renaming onto", &path))?;
    if sync {
        sync_dir(dir)?;
    }
    Ok(())
}

/// Makes the entries of `dir` (created, renamed, removed files) durable.
pub(super) fn sync_dir(dir: &Path) -> Result<(), DiskError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_at("syncing the directory", dir))
}

/// Removes the `.tmp` files a crash may have left in `dir`.
pub(super) fn remove_temporaries(dir: &Path) -> Result<(), DiskError> {
    for entry in fs::read_dir(dir).map_err(io_at("listing", dir))? {
        let path = entry.map_err(io_at("listing", dir))?.path();
        if path.extension().is_some_and(|e| e == "tmp") {
            fs::remove_file(&path).map_err(io_at("removing", &path))?;
        }
    }
    Ok(())
}

/// CBOR encoding into a `Vec` fails only when memory runs out; reported as an I/O error.
pub(super) fn encode_failed(e: impl Display) -> DiskError {
    DiskError::Io(io::Error::other(format!("encoding a record: {e}")))
}

/// A record whose checksum holds but whose body does not decode: not a torn write.
pub(super) fn undecodable(path: &Path, what: &str, e: impl Display) -> DiskError {
    DiskError::Corrupt(format!(
        "{}: a {what} record with a valid checksum does not decode ({e})",
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_damage_is_detected() {
        let mut bytes = Vec::new();
        encode(ENTRIES, b"first", &mut bytes).expect("encode");
        encode(HARD_STATE, b"", &mut bytes).expect("encode");
        let Decoded::Record { kind, body, size } = decode(&bytes) else {
            panic!("a whole record");
        };
        assert_eq!((kind, body, size), (ENTRIES, &b"first"[..], HEADER + 6));
        assert_eq!(
            decode(&bytes[size..]),
            Decoded::Record {
                kind: HARD_STATE,
                body: b"",
                size: HEADER + 1
            }
        );
        assert_eq!(decode(&bytes[size + HEADER + 1..]), Decoded::End);
        assert!(matches!(decode(&bytes[..size - 1]), Decoded::Bad(_)));
        assert!(matches!(decode(&bytes[..3]), Decoded::Bad(_)));
        assert!(matches!(decode(&[0; 32]), Decoded::Bad(_)));
        let mut flipped = bytes.clone();
        flipped[HEADER + 2] ^= 1;
        assert!(matches!(decode(&flipped), Decoded::Bad(_)));
    }
}
