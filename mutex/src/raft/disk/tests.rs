//! Round trips through the disk, torn tails, compaction, exclusion.

use std::fs::OpenOptions;
use std::io::{ErrorKind, Write};
use std::ops::RangeInclusive;
use std::path::PathBuf;

use super::*;

/// A directory under the system's temporary one, removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(test: &str) -> Self {
        let path =
            std::env::temp_dir().join(format!("conclave-raft-disk-{}-{test}", std::process::id()));
        let _ = fs::remove_dir_all(&path);
        TempDir(path)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

const CLUSTER: &str = "orders";
const MEMBER: &str = "worker-1";

fn open(dir: &Path) -> (RaftDisk, Recovered) {
    RaftDisk::open(dir, CLUSTER, MEMBER, true).expect("open")
}

/// Small segments, so a few entries span several.
fn open_small(dir: &Path, keep: u64) -> (RaftDisk, Recovered) {
    let options = Options {
        sync: true,
        segment_bytes: 256,
        keep,
    };
    RaftDisk::open_with(dir, CLUSTER, MEMBER, options).expect("open")
}

fn entries(indexes: RangeInclusive<u64>, term: u64) -> Vec<LogEntry> {
    indexes
        .map(|index| LogEntry {
            index,
            term,
            kind: 0,
            data: format!("entry {index} of term {term}").into_bytes(),
            context: vec![u8::try_from(index % 256).expect("a byte")],
        })
        .collect()
}

fn hard(term: u64, vote: u64, commit: u64) -> HardState {
    HardState { term, vote, commit }
}

fn batch(entries: Vec<LogEntry>, hard_state: Option<HardState>) -> PersistBatch {
    PersistBatch {
        seq: 0,
        snapshot: None,
        entries,
        hard_state,
    }
}

fn snapshot(index: u64, term: u64) -> SnapshotRecord {
    SnapshotRecord {
        index,
        term,
        voters: vec![1, 2, 3],
        learners: vec![4],
        data: format!("the table at {index}").into_bytes(),
    }
}

fn indexes(recovered: &Recovered) -> Vec<(u64, u64)> {
    recovered
        .entries
        .iter()
        .map(|e| (e.index, e.term))
        .collect()
}

fn files(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir(dir)
        .expect("list")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == extension))
        .collect();
    found.sort();
    found
}

fn last_segment(dir: &Path) -> PathBuf {
    files(&dir.join("wal"), "log").pop().expect("a segment")
}

#[test]
fn batches_come_back_after_reopen() {
    let dir = TempDir::new("round-trip");
    let (mut disk, recovered) = open(&dir.0);
    assert_eq!(recovered, Recovered::default(), "a new store is empty");
    disk.write(&batch(entries(1..=3, 1), Some(hard(1, 1, 0))))
        .expect("write");
    disk.write(&batch(entries(4..=5, 2), Some(hard(2, 2, 3))))
        .expect("write");
    disk.write(&batch(vec![], Some(hard(2, 2, 5))))
        .expect("write");
    disk.write(&PersistBatch::default())
        .expect("an empty batch");
    drop(disk);

    let (_disk, recovered) = open(&dir.0);
    let mut expected = entries(1..=3, 1);
    expected.extend(entries(4..=5, 2));
    assert_eq!(recovered.entries, expected);
    assert_eq!(recovered.hard_state, hard(2, 2, 5));
    assert_eq!(recovered.snapshot, None);
}

#[test]
fn a_received_snapshot_comes_back_and_replaces_a_conflicting_log() {
    let dir = TempDir::new("received-snapshot");
    let (mut disk, _) = open(&dir.0);
    disk.write(&batch(entries(1..=10, 1), Some(hard(1, 0, 4))))
        .expect("write");
    // The leader's snapshot at 8 is of term 2: our 8, and all above it, are of a dead history.
    disk.write(&PersistBatch {
        seq: 2,
        snapshot: Some(snapshot(8, 2)),
        entries: vec![],
        hard_state: Some(hard(2, 0, 8)),
    })
    .expect("write");
    drop(disk);
    let (mut disk, recovered) = open(&dir.0);
    assert_eq!(recovered.snapshot, Some(snapshot(8, 2)));
    assert_eq!(indexes(&recovered), [], "9 and 10 were of term 1");
    assert_eq!(recovered.hard_state, hard(2, 0, 8));
    disk.write(&batch(entries(9..=9, 2), None)).expect("write");
    drop(disk);
    let (mut disk, recovered) = open(&dir.0);
    assert_eq!(indexes(&recovered), [(9, 2)]);

    // A snapshot that matches the log keeps the entries above it.
    disk.write(&batch(entries(10..=12, 2), None))
        .expect("write");
    disk.write(&PersistBatch {
        seq: 4,
        snapshot: Some(snapshot(10, 2)),
        ..PersistBatch::default()
    })
    .expect("write");
    drop(disk);
    let (mut disk, recovered) = open(&dir.0);
    assert_eq!(recovered.snapshot, Some(snapshot(10, 2)));
    assert_eq!(indexes(&recovered), [(11, 2), (12, 2)]);

    // A snapshot beyond the log's end; the log resumes above it.
    disk.write(&PersistBatch {
        seq: 5,
        snapshot: Some(snapshot(50, 3)),
        entries: entries(51..=52, 3),
        hard_state: Some(hard(3, 0, 50)),
    })
    .expect("write");
    drop(disk);
    let (_disk, recovered) = open(&dir.0);
    assert_eq!(recovered.snapshot, Some(snapshot(50, 3)));
    assert_eq!(indexes(&recovered), [(51, 3), (52, 3)]);
    assert_eq!(
        files(&dir.0.join("snap"), "snap").len(),
        2,
        "the newest two"
    );
}

#[test]
fn a_conflicting_suffix_is_replaced_and_stays_replaced() {
    let dir = TempDir::new("conflict");
    let (mut disk, _) = open(&dir.0);
    disk.write(&batch(entries(1..=5, 1), Some(hard(1, 1, 2))))
        .expect("write");
    disk.write(&batch(entries(3..=4, 2), Some(hard(2, 3, 2))))
        .expect("write");
    drop(disk);
    let (mut disk, recovered) = open(&dir.0);
    assert_eq!(indexes(&recovered), [(1, 1), (2, 1), (3, 2), (4, 2)]);
    assert_eq!(recovered.hard_state, hard(2, 3, 2));

    disk.write(&batch(entries(5..=6, 2), None)).expect("write");
    disk.write(&batch(entries(2..=2, 3), None))
        .expect("a rewrite down to the second entry");
    drop(disk);
    let (_disk, recovered) = open(&dir.0);
    assert_eq!(indexes(&recovered), [(1, 1), (2, 3)]);
}

#[test]
fn a_torn_tail_is_cut_and_later_writes_work() {
    let dir = TempDir::new("torn");
    let (mut disk, _) = open(&dir.0);
    disk.write(&batch(entries(1..=3, 1), Some(hard(1, 1, 1))))
        .expect("write");
    disk.write(&batch(entries(4..=6, 1), None)).expect("write");
    drop(disk);
    let segment = last_segment(&dir.0);
    let size = fs::metadata(&segment).expect("size").len();
    OpenOptions::new()
        .write(true)
        .open(&segment)
        .and_then(|f| f.set_len(size - 7))
        .expect("tear the last record");

    let (mut disk, recovered) = open(&dir.0);
    assert_eq!(recovered.entries, entries(1..=3, 1));
    assert_eq!(recovered.hard_state, hard(1, 1, 1));
    disk.write(&batch(entries(4..=5, 2), Some(hard(2, 0, 3))))
        .expect("a write after the cut");
    drop(disk);
    let (_disk, recovered) = open(&dir.0);
    assert_eq!(
        indexes(&recovered),
        [(1, 1), (2, 1), (3, 1), (4, 2), (5, 2)]
    );
    assert_eq!(recovered.hard_state, hard(2, 0, 3));
}

#[test]
fn a_damaged_last_record_is_cut() {
    let dir = TempDir::new("flipped");
    let (mut disk, _) = open(&dir.0);
    disk.write(&batch(entries(1..=3, 1), None)).expect("write");
    disk.write(&batch(entries(4..=4, 1), Some(hard(1, 0, 4))))
        .expect("write");
    drop(disk);
    let segment = last_segment(&dir.0);
    let mut bytes = fs::read(&segment).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40; // inside the hard state record, the last one
    fs::write(&segment, &bytes).expect("write");

    let (mut disk, recovered) = open(&dir.0);
    assert_eq!(recovered.entries, entries(1..=4, 1));
    assert_eq!(recovered.hard_state, HardState::default());
    disk.write(&batch(vec![], Some(hard(1, 0, 4))))
        .expect("write");
    drop(disk);
    assert_eq!(open(&dir.0).1.hard_state, hard(1, 0, 4));
}

#[test]
fn a_zeroed_tail_is_cut() {
    let dir = TempDir::new("zeroes");
    let (mut disk, _) = open(&dir.0);
    disk.write(&batch(entries(1..=2, 1), None)).expect("write");
    drop(disk);
    let mut file = OpenOptions::new()
        .append(true)
        .open(last_segment(&dir.0))
        .expect("open");
    file.write_all(&[0; 100]).expect("grow");
    drop(file);
    let (_disk, recovered) = open(&dir.0);
    assert_eq!(recovered.entries, entries(1..=2, 1));
}

#[test]
fn damage_before_later_segments_is_refused() {
    let dir = TempDir::new("damaged-middle");
    let (mut disk, _) = open_small(&dir.0, 0);
    for index in 1..=20 {
        disk.write(&batch(entries(index..=index, 1), None))
            .expect("write");
    }
    drop(disk);
    let segments = files(&dir.0.join("wal"), "log");
    assert!(segments.len() > 2, "small segments roll");
    let mut bytes = fs::read(&segments[0]).expect("read");
    bytes[20] ^= 1;
    fs::write(&segments[0], &bytes).expect("write");
    let error = RaftDisk::open(&dir.0, CLUSTER, MEMBER, true).expect_err("damage, not a tear");
    assert!(matches!(error, DiskError::Corrupt(_)), "{error}");
}

#[test]
fn compaction_drops_entries_below_the_snapshot() {
    let dir = TempDir::new("compaction");
    let (mut disk, _) = open_small(&dir.0, 10);
    // The only hard state record is in the first segment, which compaction removes.
    disk.write(&batch(entries(1..=1, 1), Some(hard(1, 1, 1))))
        .expect("write");
    for index in 2..=100 {
        disk.write(&batch(entries(index..=index, 1), None))
            .expect("write");
    }
    let segments_before = files(&dir.0.join("wal"), "log").len();
    let bytes_before = disk.log_bytes();
    assert!(bytes_before > 0);

    disk.compact(&snapshot(80, 1)).expect("compact");
    assert!(disk.log_bytes() < bytes_before / 10, "{}", disk.log_bytes());
    let segments_after = files(&dir.0.join("wal"), "log").len();
    assert!(
        segments_after < segments_before,
        "{segments_after} < {segments_before}"
    );
    disk.compact(&snapshot(70, 1))
        .expect("an older snapshot is ignored");
    let error = disk
        .compact(&snapshot(90, 7))
        .expect_err("not a snapshot of this log");
    assert!(matches!(&error, DiskError::Io(e) if e.kind() == ErrorKind::InvalidInput));
    disk.write(&batch(entries(101..=101, 2), Some(hard(2, 0, 90))))
        .expect("the store is still usable");
    drop(disk);

    let (disk, recovered) = open_small(&dir.0, 10);
    assert!(disk.log_bytes() > 0, "entries above the snapshot count");
    assert_eq!(recovered.snapshot, Some(snapshot(80, 1)));
    let mut expected = entries(81..=100, 1);
    expected.extend(entries(101..=101, 2));
    assert_eq!(recovered.entries, expected);
    assert_eq!(recovered.hard_state, hard(2, 0, 90));
}

#[test]
fn the_hard_state_survives_the_removal_of_its_segment() {
    let dir = TempDir::new("hard-state-kept");
    let (mut disk, _) = open_small(&dir.0, 0);
    disk.write(&batch(entries(1..=1, 3), Some(hard(3, 2, 0))))
        .expect("write");
    for index in 2..=40 {
        disk.write(&batch(entries(index..=index, 3), None))
            .expect("write");
    }
    disk.compact(&snapshot(40, 3)).expect("compact");
    let left = files(&dir.0.join("wal"), "log").len();
    assert!(
        left <= 2,
        "the active segment, and one more if the rewrite rolled: {left}"
    );
    drop(disk);
    let (_disk, recovered) = open_small(&dir.0, 0);
    assert_eq!(
        recovered.hard_state,
        hard(3, 2, 40),
        "commit raised to the snapshot"
    );
    assert!(recovered.entries.is_empty());
}

#[test]
fn a_corrupt_newest_snapshot_falls_back_to_the_older_one() {
    let dir = TempDir::new("snapshot-fallback");
    let (mut disk, _) = open(&dir.0);
    disk.write(&batch(entries(1..=30, 1), Some(hard(1, 0, 30))))
        .expect("write");
    disk.compact(&snapshot(10, 1)).expect("compact");
    disk.compact(&snapshot(20, 1)).expect("compact");
    drop(disk);
    let snaps = files(&dir.0.join("snap"), "snap");
    assert_eq!(snaps.len(), 2);
    let mut bytes = fs::read(&snaps[1]).expect("read");
    bytes[12] ^= 1;
    fs::write(&snaps[1], &bytes).expect("write");

    let (_disk, recovered) = open(&dir.0);
    assert_eq!(recovered.snapshot, Some(snapshot(10, 1)));
    assert_eq!(recovered.entries, entries(11..=30, 1));
    assert_eq!(files(&dir.0.join("snap"), "corrupt").len(), 1);
}

#[test]
fn a_log_that_does_not_join_its_snapshot_is_refused() {
    let dir = TempDir::new("no-join");
    let (mut disk, _) = open_small(&dir.0, 0);
    for index in 1..=40 {
        disk.write(&batch(entries(index..=index, 1), None))
            .expect("write");
    }
    disk.write(&batch(entries(41..=41, 1), Some(hard(1, 0, 41))))
        .expect("write");
    disk.compact(&snapshot(30, 1)).expect("compact");
    drop(disk);
    for snap in files(&dir.0.join("snap"), "snap") {
        fs::remove_file(snap).expect("remove");
    }
    let error = RaftDisk::open(&dir.0, CLUSTER, MEMBER, true).expect_err("a gap");
    assert!(matches!(error, DiskError::Corrupt(_)), "{error}");
}

#[test]
fn a_batch_that_does_not_fit_is_refused_and_changes_nothing() {
    let dir = TempDir::new("misfit");
    let (mut disk, _) = open(&dir.0);
    disk.write(&batch(entries(1..=3, 1), None)).expect("write");
    for misfit in [
        entries(5..=6, 1),
        vec![entries(4..=4, 1).remove(0), entries(6..=6, 1).remove(0)],
        entries(0..=1, 1),
    ] {
        let error = disk
            .write(&batch(misfit, Some(hard(9, 9, 9))))
            .expect_err("refused");
        assert!(matches!(&error, DiskError::Io(e) if e.kind() == ErrorKind::InvalidInput));
    }
    disk.write(&batch(entries(4..=4, 1), None))
        .expect("still usable");
    drop(disk);
    let (_disk, recovered) = open(&dir.0);
    assert_eq!(recovered.entries, entries(1..=4, 1));
    assert_eq!(recovered.hard_state, HardState::default());
}

#[test]
fn another_cluster_or_member_is_refused() {
    let dir = TempDir::new("mismatch");
    drop(open(&dir.0));
    for (cluster, member) in [("billing", MEMBER), (CLUSTER, "worker-2")] {
        let error = RaftDisk::open(&dir.0, cluster, member, true).expect_err("someone else's");
        assert!(matches!(error, DiskError::Mismatch(_)), "{error}");
    }
    drop(open(&dir.0));
}

#[test]
fn a_log_without_its_meta_is_refused() {
    let dir = TempDir::new("no-meta");
    let (mut disk, _) = open(&dir.0);
    disk.write(&batch(entries(1..=1, 1), None)).expect("write");
    drop(disk);
    fs::remove_file(dir.0.join("meta")).expect("remove");
    let error = RaftDisk::open(&dir.0, CLUSTER, MEMBER, true).expect_err("whose log?");
    assert!(matches!(error, DiskError::Corrupt(_)), "{error}");
}

#[test]
fn a_second_open_is_refused_until_the_first_is_dropped() {
    let dir = TempDir::new("locked");
    let (disk, _) = open(&dir.0);
    let error = RaftDisk::open(&dir.0, CLUSTER, MEMBER, true).expect_err("held");
    assert!(matches!(error, DiskError::Locked(_)), "{error}");
    assert!(dir.0.join("LOCK").exists());
    drop(disk);
    assert!(!dir.0.join("LOCK").exists(), "removed on drop");
    drop(open(&dir.0));
}

#[test]
fn a_stale_lock_is_taken_over_and_a_live_one_refused() {
    if !Path::new("/proc/self/stat").exists() {
        return; // liveness needs /proc
    }
    let dir = TempDir::new("stale-lock");
    drop(open(&dir.0));
    let lock = dir.0.join("LOCK");
    let me = lock::Holder::current();
    let parent = std::os::unix::process::parent_id();
    let live = lock::Holder {
        pid: parent,
        start: lock::start_time(parent).expect("the parent runs"),
    };
    // Above any pid_max: no such process.
    let dead = lock::Holder {
        pid: 4_194_304,
        start: 1,
    };
    // This process's pid with another start time: a pid reused, as in a restarted container.
    let reused = lock::Holder {
        pid: me.pid,
        start: me.start + 1,
    };
    for stale in [dead.stamp(), reused.stamp(), "garbage".to_owned()] {
        fs::write(&lock, &stale).expect("plant");
        let (disk, _) = open(&dir.0);
        assert_eq!(
            fs::read_to_string(&lock).expect("ours"),
            me.stamp(),
            "{stale}"
        );
        drop(disk);
    }
    fs::write(&lock, live.stamp()).expect("plant");
    let error = RaftDisk::open(&dir.0, CLUSTER, MEMBER, true).expect_err("a live holder");
    assert!(matches!(error, DiskError::Locked(_)), "{error}");
    assert_eq!(fs::read_to_string(&lock).expect("left alone"), live.stamp());
}

#[test]
fn the_generation_increases_on_every_open() {
    let dir = TempDir::new("generation");
    let generations: Vec<u64> = (0..3).map(|_| open(&dir.0).0.generation()).collect();
    assert_eq!(generations, [1, 2, 3]);
}

#[test]
fn unsynced_storage_round_trips() {
    let dir = TempDir::new("unsynced");
    let (mut disk, _) = RaftDisk::open(&dir.0, CLUSTER, MEMBER, false).expect("open");
    disk.write(&batch(entries(1..=3, 1), Some(hard(1, 1, 2))))
        .expect("write");
    disk.compact(&snapshot(2, 1)).expect("compact");
    drop(disk);
    let (disk, recovered) = RaftDisk::open(&dir.0, CLUSTER, MEMBER, false).expect("reopen");
    assert_eq!(recovered.snapshot, Some(snapshot(2, 1)));
    assert_eq!(recovered.entries, entries(3..=3, 1));
    assert_eq!(recovered.hard_state, hard(1, 1, 2));
    assert_eq!(disk.generation(), 2);
}
