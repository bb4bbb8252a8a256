//! What membership costs as the cluster grows, counted in the deterministic simulator (no
//! wall-clock time): startup installs a handful of views, and heartbeats per member do not
//! grow with the cluster.
//!
//! `cargo test -p conclave-protocol --features sim --release --test scale -- --nocapture`
//! prints the table recorded in `docs/benchmarks.md`; `CONCLAVE_SCALE_SIZES=8,16,32,64`
//! chooses the sizes of `table`.

use conclave_protocol::sim::scale::{self, ScaleConfig, ScaleFigures};

fn measure(members: usize) -> ScaleFigures {
    match scale::measure(&ScaleConfig::new(members)) {
        Ok(figures) => figures,
        Err(e) => panic!("{members} members: {e}"),
    }
}

fn row(f: &ScaleFigures) -> String {
    format!(
        "| {} | {} ({} distinct) | {:.0} KB | {:.0} | {:.0} | {:.0} | {} | {} ({:.1} KB) | {} ms | {} ({:.1} KB) |",
        f.members,
        f.startup_installs,
        f.startup_views_distinct,
        f.startup_bytes as f64 / 1000.0,
        f.heartbeats_per_sec,
        f.max_other_heartbeats_per_sec,
        f.max_member_heartbeats_per_sec,
        f.lock_grant_datagrams,
        f.crash_datagrams,
        f.crash_bytes as f64 / 1000.0,
        f.crash_agreed_after.as_millis(),
        f.leave_datagrams,
        f.leave_bytes as f64 / 1000.0,
    )
}

#[test]
fn table() {
    let sizes: Vec<usize> = std::env::var("CONCLAVE_SCALE_SIZES")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![8, 16, 32, 64]);
    println!("| members | views installed at startup (sum) | startup bytes | heartbeats/s (cluster) | heartbeats/s (member other than the coordinator, max) | heartbeats/s (coordinator) | lock + unlock datagrams | datagrams (bytes) per coordinator crash | crash to new view | datagrams (bytes) per leave |");
    println!("|---|---|---|---|---|---|---|---|---|---|");
    for n in sizes {
        println!("{}", row(&measure(n)));
    }
}

/// 64 members starting 2 ms apart install a handful of views, not one per joiner; the
/// heartbeats a member sends per second do not grow with the cluster (only the coordinator's
/// do, linearly); a lock costs the same datagrams at 8 and at 64 members.
#[test]
fn startup_views_and_heartbeats_stay_small_at_64_members() {
    let small = measure(8);
    let large = measure(64);
    println!("{}\n{}", row(&small), row(&large));
    assert!(
        large.startup_views_distinct <= 5,
        "64 members installed {} distinct views at startup",
        large.startup_views_distinct
    );
    assert!(
        large.startup_installs <= 5 * 64,
        "64 members installed {} views at startup",
        large.startup_installs
    );
    // Heartbeats per member other than the coordinator: the same at 8 and 64.
    assert!(
        large.max_other_heartbeats_per_sec <= small.max_other_heartbeats_per_sec,
        "{} vs {}",
        large.max_other_heartbeats_per_sec,
        small.max_other_heartbeats_per_sec
    );
    // On average over the members: at most four per heartbeat interval (50 ms) whatever the
    // size: one to the coordinator, two to ring successors, and the coordinator's one each.
    for f in [&small, &large] {
        let per_member = f.heartbeats_per_sec / f.members as f64;
        assert!(per_member <= 80.0, "{} members: {per_member}/s", f.members);
    }
    // The coordinator's own heartbeats grow linearly: one per member per interval.
    assert!(large.max_member_heartbeats_per_sec <= 63.0 * 20.0 + 1.0);
    assert_eq!(large.lock_grant_datagrams, small.lock_grant_datagrams);
}

/// One view change costs bytes linear in the cluster size (issue 16): the coordinator sends
/// the members that stay a delta of the change, not the whole view each. Doubling the cluster
/// from 32 to 64 members about doubles the bytes of a takeover (a coordinator crash) and of a
/// graceful leave; full views to every member quadrupled them (314.6 KB vs 80.3 KB for the
/// crash, 293.6 KB vs 71.5 KB for the leave, before the change).
#[test]
fn bytes_per_view_change_grow_linearly() {
    let small = measure(16);
    let mid = measure(32);
    let large = measure(64);
    println!("{}\n{}\n{}", row(&small), row(&mid), row(&large));
    for (what, s, m, l) in [
        (
            "crash",
            small.crash_bytes,
            mid.crash_bytes,
            large.crash_bytes,
        ),
        (
            "leave",
            small.leave_bytes,
            mid.leave_bytes,
            large.leave_bytes,
        ),
    ] {
        assert!(
            l * 10 <= m * 25 && m * 10 <= s * 25,
            "bytes per {what} grow faster than linearly: {s} at 16, {m} at 32, {l} at 64 members"
        );
    }
}
