//! Incarnation ids: what tells two runs of a member at one address apart.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// A new incarnation id: 64 random bits (from std's randomly keyed hasher, no extra dependency)
/// above the incarnation's *generation*, the wall-clock time of the start in nanoseconds since
/// the Unix epoch, made strictly increasing within the process. A restarted process therefore
/// carries a higher generation than every earlier incarnation at its address, so late datagrams
/// of its past can never be taken for its successor ([`MemberId::generation`]). It assumes only
/// that the wall clock does not step back across a restart by more than the restart took.
pub(crate) fn incarnation() -> u128 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    static LAST_GENERATION: AtomicU64 = AtomicU64::new(0);
    let count = COUNTER.fetch_add(1, Ordering::Relaxed);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    let previous = LAST_GENERATION
        .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |last| {
            Some(nanos.max(last.saturating_add(1)))
        })
        .unwrap_or(0);
    let generation = nanos.max(previous.saturating_add(1));
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(count);
    hasher.write_u32(std::process::id());
    hasher.write_u64(nanos);
    (u128::from(hasher.finish()) << 64) | u128::from(generation)
}
