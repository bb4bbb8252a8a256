//! The checker: reads the run folder's logs (the members' operation logs, the registers' logs,
//! the fault log) and nothing else, and checks what a user of the locks relies on.
//!
//! A hold is one grant to one member. Its *held until* is the last time its client read
//! `LockStatus::Held` from the guard (at the grant, before each write, before `unlock`).
//!
//! - **Exclusion** (`Majority`): no hold is seen `Held` after a later grant of its lock to
//!   another hold. A holder that was paused and woke to `Lost` never read `Held` again, so it
//!   is no violation; it is counted under `overlaps not seen held`.
//! - **Tokens** (`Majority`): a grant never carries a token at or below the token of a hold
//!   of its lock that ended (was last seen `Held`) before it; no token is granted twice.
//! - **Fencing**: each register accepted tokens in non-decreasing order (it refuses the
//!   others: `stale writes refused`).
//! - **Liveness**: after the faults stop, every lock is granted within the stated bound;
//!   (the harness adds: every member answers `stop`, so no request is left pending).
//! - **`Available`**: a hold seen `Held` after a later grant is a duplicate; it is allowed while
//!   faults run, and must be resolved (its holder told `Lost` or released); one starting later
//!   than the liveness bound after the heal is a violation (the members need that long to notice
//!   the heal and merge; `last duplicate after heal` says how long they took).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

/// One grant to one member, as its operation log tells it.
#[derive(Clone, Debug, Default)]
pub struct Hold {
    /// The member.
    pub node: String,
    /// The lock.
    pub lock: String,
    /// The fencing token.
    pub token: u64,
    /// When `lock_timeout` was called.
    pub asked: u64,
    /// When it returned the guard.
    pub granted: u64,
    /// The last time the guard said `Held` (`None`: never, e.g. granted already lost).
    pub held_until: Option<u64>,
    /// When the client called `unlock`, if it did.
    pub released: Option<u64>,
    /// How long `unlock` took, in µs.
    pub unlock_us: u64,
    /// When its member was told `Lost`, if it was.
    pub lost: Option<u64>,
    /// When its process was killed (or its log ended), if it never released.
    pub killed: Option<u64>,
}

impl Hold {
    /// When its client stopped acting as the holder: released, told lost or killed.
    pub fn end(&self) -> u64 {
        [self.released, self.lost, self.killed]
            .into_iter()
            .flatten()
            .min()
            .or(self.held_until)
            .unwrap_or(self.granted)
            .max(self.granted)
    }
}

/// One injected fault (or phase marker) from `faults.log`.
#[derive(Clone, Debug)]
pub struct Fault {
    /// When, µs.
    pub t: u64,
    /// `kill`, `restart`, `pause`, `resume`, `partition`, `loss`, `delay`, `garbage`, `heal-…`,
    /// `quiet`, `end`, `exit`.
    pub kind: String,
    /// The rest of the line.
    pub detail: String,
}

/// What the checker needs to know of the run besides the logs.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    /// `Majority` (strict exclusion) or `Available`.
    pub majority: bool,
    /// How soon after the quiet phase starts every lock must be granted, µs.
    pub liveness_us: u64,
}

/// Everything counted and found.
#[derive(Debug, Default)]
pub struct Report {
    /// Every hold, by lock then grant time.
    pub holds: BTreeMap<String, Vec<Hold>>,
    /// The fault log.
    pub faults: Vec<Fault>,
    /// Start and end of the fault phase, and the end of the run, µs.
    pub phase: (u64, u64, u64),
    /// Named counts, in print order.
    pub counts: Vec<(String, String)>,
    /// One line per violation.
    pub violations: Vec<String>,
    /// One line per overlap that is no violation (the earlier holder never read `Held` after
    /// the later grant, or `Available`'s duplicates): what happened to the earlier holder.
    pub overlaps: Vec<String>,
}

/// Reads the run folder and checks it.
pub fn check(dir: &Path, setting: Setting) -> Report {
    let mut report = Report {
        faults: read_faults(&dir.join("faults.log")),
        ..Report::default()
    };
    let first = |kind: &str| report.faults.iter().find(|f| f.kind == kind).map(|f| f.t);
    let start = first("start").unwrap_or(0);
    let quiet = first("quiet").unwrap_or(u64::MAX);
    let end = first("end").unwrap_or(u64::MAX);
    report.phase = (start, quiet, end);
    let mut bad_lines = 0;
    let mut lost_notices = 0;
    let mut failures = 0;
    let mut writes_refused_seen = 0;
    let (mut lost_on_grant, mut suspended_on_grant) = (0, 0);
    let mut holds = Vec::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    for path in &files {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let Some(node) = name
            .strip_prefix("ops-")
            .and_then(|n| n.strip_suffix(".log"))
        else {
            continue;
        };
        let kills: Vec<u64> = report
            .faults
            .iter()
            .filter(|f| matches!(f.kind.as_str(), "kill" | "exit") && f.detail == node)
            .map(|f| f.t)
            .collect();
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let mut mine: Vec<Hold> = Vec::new();
        let mut open = false;
        for line in text.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            let num = |i: usize| w.get(i).and_then(|s| s.parse::<u64>().ok());
            let (Some(kind), Some(t)) = (w.first(), num(1)) else {
                bad_lines += 1;
                continue;
            };
            match (*kind, w.len()) {
                ("START", _) => {
                    if open {
                        close_killed(&mut mine, &kills, t);
                    }
                    open = false;
                }
                ("GRANT", 7) => {
                    let (Some(token), Some(asked)) = (num(4), num(5)) else {
                        bad_lines += 1;
                        continue;
                    };
                    if open {
                        close_killed(&mut mine, &kills, t);
                    }
                    lost_on_grant += u64::from(w[6] == "lost");
                    suspended_on_grant += u64::from(w[6] == "suspended");
                    mine.push(Hold {
                        node: w[2].to_owned(),
                        lock: w[3].to_owned(),
                        token,
                        asked,
                        granted: t,
                        held_until: (w[6] == "held").then_some(t),
                        ..Hold::default()
                    });
                    open = true;
                }
                ("WRITE" | "RELEASE", 8) => {
                    let token = num(4);
                    let Some(hold) = mine
                        .last_mut()
                        .filter(|h| open && h.lock == w[3] && Some(h.token) == token)
                    else {
                        bad_lines += 1;
                        continue;
                    };
                    if w[5] == "held" {
                        hold.held_until = Some(hold.held_until.map_or(t, |h| h.max(t)));
                    }
                    if *kind == "WRITE" && w[6] == "refused" {
                        writes_refused_seen += 1;
                    }
                    if *kind == "RELEASE" {
                        hold.released = Some(t);
                        hold.unlock_us = num(7).unwrap_or(0);
                        open = false;
                    }
                }
                ("LOST", 5) => {
                    lost_notices += 1;
                    if let Some(hold) = mine
                        .iter_mut()
                        .rev()
                        .find(|h| h.lock == w[3] && h.granted <= t)
                    {
                        hold.lost.get_or_insert(t);
                    }
                }
                ("FAIL", _) => failures += 1,
                _ => bad_lines += 1,
            }
        }
        if open {
            close_killed(&mut mine, &kills, end);
        }
        holds.extend(mine);
    }
    holds.sort_by_key(|h| (h.granted, h.token));
    let acquisitions = holds.len();
    let longest_unlock = holds.iter().map(|h| h.unlock_us).max().unwrap_or(0);
    let pauses = pauses(&report.faults);
    let longest_unlock_awake = holds
        .iter()
        .filter_map(|h| {
            let start = h.released?;
            let end = start + h.unlock_us;
            let slept = pauses.get(h.node.as_str()).map_or(0, |spans| {
                spans
                    .iter()
                    .map(|&(a, b)| b.min(end).saturating_sub(a.max(start)))
                    .sum()
            });
            Some(h.unlock_us.saturating_sub(slept))
        })
        .max()
        .unwrap_or(0);
    for hold in holds {
        report
            .holds
            .entry(hold.lock.clone())
            .or_default()
            .push(hold);
    }
    let (refused, register_violations) = check_registers(dir, &mut report.violations);
    let mut overlaps_told = 0;
    let mut duplicates = 0;
    let mut inversions = 0;
    let mut late_duplicate = 0;
    for holds in report.holds.values() {
        let found = check_lock(
            holds,
            setting,
            quiet,
            &mut report.violations,
            &mut report.overlaps,
            &mut late_duplicate,
        );
        overlaps_told += found.0;
        duplicates += found.1;
        inversions += found.2;
    }
    let liveness = check_liveness(&report.holds, quiet, setting, &mut report.violations);
    let grants: Vec<u64> = report
        .holds
        .values()
        .flatten()
        .filter(|h| h.held_until.is_some())
        .map(|h| h.granted)
        .collect();
    let phase_end = quiet.min(end);
    let (share, gap) = unavailability(grants.clone(), start, phase_end);
    let members: Vec<String> = {
        let mut names: Vec<String> = report
            .holds
            .values()
            .flatten()
            .map(|h| h.node.clone())
            .collect();
        names.sort();
        names.dedup();
        names
    };
    let spans = super::quorum::majority_spans(&report.faults, &members, start, phase_end);
    let up: u64 = spans.iter().map(|(a, b)| b - a).sum();
    let dark_with_majority = super::quorum::overlap(&gaps(grants, start, phase_end), &spans);
    let count = |kind: &str| report.faults.iter().filter(|f| f.kind == kind).count();
    let c = &mut report.counts;
    let mut put = |name: &str, value: String| c.push((name.to_owned(), value));
    put("kills", count("kill").to_string());
    put("pauses", count("pause").to_string());
    put("partitions", count("partition").to_string());
    put(
        "netem changes",
        (count("loss") + count("delay")).to_string(),
    );
    put("garbage bursts", count("garbage").to_string());
    put("acquisitions", acquisitions.to_string());
    put("lost notices", lost_notices.to_string());
    put("stale writes refused", refused.to_string());
    put("unavailable share", format!("{:.1}%", share * 100.0));
    put("longest gap", format!("{:.2}s", secs(gap)));
    let percent = |part: u64, whole: u64| part as f64 * 100.0 / whole.max(1) as f64;
    put(
        "majority up",
        format!("{:.1}%", percent(up, phase_end.saturating_sub(start))),
    );
    put(
        "unavailable with a majority up",
        format!("{:.1}%", percent(dark_with_majority, up)),
    );
    put("exits", count("exit").to_string());
    put("lock failures", failures.to_string());
    put("granted already lost", lost_on_grant.to_string());
    put("granted suspended", suspended_on_grant.to_string());
    put("overlaps not seen held", overlaps_told.to_string());
    put("available duplicates", duplicates.to_string());
    put("token inversions", inversions.to_string());
    put(
        "last duplicate after heal",
        format!("{:.2}s", secs(late_duplicate)),
    );
    put("longest unlock", format!("{:.2}s", secs(longest_unlock)));
    put(
        "longest unlock awake",
        format!("{:.2}s", secs(longest_unlock_awake)),
    );
    put("regrant after heal", format!("{:.2}s", secs(liveness)));
    put("refusals in client logs", writes_refused_seen.to_string());
    put("bad log lines", bad_lines.to_string());
    let _ = register_violations;
    report
}

impl Report {
    /// The summary, one `name: value` line per count, `violations` last.
    pub fn summary(&self) -> String {
        let mut out = String::new();
        for (name, value) in &self.counts {
            let _ = writeln!(out, "{name}: {value}");
        }
        let _ = writeln!(out, "violations: {}", self.violations.len());
        out
    }
}

/// Each member's pauses (`SIGSTOP` to `SIGCONT`, or to the end of the log), µs.
fn pauses(faults: &[Fault]) -> BTreeMap<&str, Vec<(u64, u64)>> {
    let mut spans: BTreeMap<&str, Vec<(u64, u64)>> = BTreeMap::new();
    for fault in faults {
        let node = fault.detail.split_whitespace().next().unwrap_or("");
        match fault.kind.as_str() {
            "pause" => spans.entry(node).or_default().push((fault.t, u64::MAX)),
            "resume" => {
                if let Some(open) = spans
                    .get_mut(node)
                    .and_then(|s| s.last_mut())
                    .filter(|s| s.1 == u64::MAX)
                {
                    open.1 = fault.t;
                }
            }
            _ => {}
        }
    }
    spans
}

fn secs(us: u64) -> f64 {
    us as f64 / 1e6
}

/// A hold still open when its process restarted or its log ended: it ended at the kill.
fn close_killed(mine: &mut [Hold], kills: &[u64], before: u64) {
    if let Some(hold) = mine.last_mut() {
        let at = kills
            .iter()
            .copied()
            .find(|&k| k >= hold.granted && k <= before)
            .unwrap_or(before);
        hold.killed = Some(at);
    }
}

fn read_faults(path: &Path) -> Vec<Fault> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let mut words = line.splitn(3, ' ');
            let t = words.next()?.parse().ok()?;
            let kind = words.next()?.to_owned();
            let detail = words.next().unwrap_or("").to_owned();
            Some(Fault { t, kind, detail })
        })
        .collect()
}

/// Each register accepted tokens in non-decreasing order; returns (refusals, violations).
fn check_registers(dir: &Path, violations: &mut Vec<String>) -> (u64, u64) {
    let mut refused = 0;
    let mut found = 0;
    let Ok(entries) = std::fs::read_dir(dir.join("reg")) else {
        return (0, 0);
    };
    let mut paths: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    paths.sort();
    for path in paths {
        if path.extension().and_then(|e| e.to_str()) != Some("log") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let mut highest = 0_u64;
        for line in text.lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            let Some(token) = w.get(2).and_then(|s| s.parse::<u64>().ok()) else {
                continue;
            };
            match w.get(4).copied() {
                Some("refused") => refused += 1,
                Some("accepted") => {
                    if token < highest {
                        found += 1;
                        violations.push(format!(
                            "register {}: accepted stale token {token} after {highest} ({line})",
                            path.display()
                        ));
                    }
                    highest = highest.max(token);
                }
                _ => {}
            }
        }
    }
    (refused, found)
}

/// Exclusion, tokens and duplicates of one lock; returns (holds overlapping a later grant
/// without being seen held after it, holds duplicated under `Available`, token inversions).
fn check_lock(
    holds: &[Hold],
    setting: Setting,
    quiet: u64,
    violations: &mut Vec<String>,
    overlaps: &mut Vec<String>,
    late: &mut u64,
) -> (u64, u64, u64) {
    let (mut told, mut duplicates, mut inversions) = (0, 0, 0);
    // Each earlier hold is counted once, however many later grants it overlapped.
    let mut counted: BTreeSet<(&str, u64)> = BTreeSet::new();
    // Holds granted earlier whose bar still runs (by `end`), for the overlap sweep.
    let mut active: Vec<&Hold> = Vec::new();
    // Holds by the time they were last seen held, for the token sweep.
    let mut ended: Vec<&Hold> = holds.iter().filter(|h| h.held_until.is_some()).collect();
    ended.sort_by_key(|h| h.held_until);
    let mut next_ended = 0;
    let mut highest_ended: Option<&Hold> = None;
    let mut tokens: BTreeMap<u64, &Hold> = BTreeMap::new();
    for b in holds {
        if let Some(a) = tokens.insert(b.token, b) {
            inversions += 1;
            if setting.majority {
                violations.push(format!(
                    "{}: token {} granted twice: {} at {} and {} at {}",
                    b.lock, b.token, a.node, a.granted, b.node, b.granted
                ));
            }
        }
        while let Some(a) = ended
            .get(next_ended)
            .filter(|a| a.held_until < Some(b.granted))
        {
            if highest_ended.is_none_or(|h| a.token > h.token) {
                highest_ended = Some(a);
            }
            next_ended += 1;
        }
        if let Some(a) = highest_ended.filter(|a| a.token >= b.token && b.held_until.is_some()) {
            if a.token != b.token {
                inversions += 1;
                if setting.majority {
                    violations.push(format!(
                        "{}: token went back: {} got {} at {} after {} held {} until {}",
                        b.lock,
                        b.node,
                        b.token,
                        b.granted,
                        a.node,
                        a.token,
                        a.held_until.unwrap_or(0)
                    ));
                }
            }
        }
        active.retain(|a| a.end() > b.granted || a.held_until > Some(b.granted));
        for a in &active {
            if a.token == b.token {
                continue;
            }
            let held_after = a.held_until.is_some_and(|t| t > b.granted);
            let fate = format!(
                "{} (token {}, granted {}) last read Held at {:?}, released {:?}, told lost {:?}, \
                 killed {:?}; {} granted token {} at {}",
                a.node,
                a.token,
                a.granted,
                a.held_until,
                a.released,
                a.lost,
                a.killed,
                b.node,
                b.token,
                b.granted
            );
            let first = counted.insert((a.node.as_str(), a.token));
            if !held_after {
                told += u64::from(first);
                overlaps.push(format!("{}: not seen held: {fate}", b.lock));
                continue;
            }
            if setting.majority {
                violations.push(format!(
                    "{}: {} (token {}) read Held at {} after {} was granted it (token {}) at {}",
                    b.lock,
                    a.node,
                    a.token,
                    a.held_until.unwrap_or(0),
                    b.node,
                    b.token,
                    b.granted
                ));
            } else {
                duplicates += u64::from(first);
                overlaps.push(format!("{}: duplicate: {fate}", b.lock));
                let resolved = a.lost.is_some() || a.released.is_some() || a.killed.is_some();
                if !resolved {
                    violations.push(format!(
                        "{}: duplicate never resolved: {} (token {}) and {} (token {}) from {}",
                        b.lock, a.node, a.token, b.node, b.token, b.granted
                    ));
                }
                if b.granted > quiet {
                    *late = (*late).max(b.granted - quiet);
                }
                if b.granted > quiet.saturating_add(setting.liveness_us) {
                    violations.push(format!(
                        "{}: duplicate after the faults stopped: {} (token {}) held until {} \
                         and {} (token {}) granted at {}",
                        b.lock,
                        a.node,
                        a.token,
                        a.held_until.unwrap_or(0),
                        b.node,
                        b.token,
                        b.granted
                    ));
                }
            }
        }
        active.push(b);
    }
    (told, duplicates, inversions)
}

/// Every lock granted (and seen held) within the bound after the quiet phase began; returns
/// the slowest lock's wait.
fn check_liveness(
    holds: &BTreeMap<String, Vec<Hold>>,
    quiet: u64,
    setting: Setting,
    violations: &mut Vec<String>,
) -> u64 {
    if quiet == u64::MAX {
        violations.push("the run has no quiet phase (faults.log has no `quiet`)".to_owned());
        return 0;
    }
    let mut slowest = 0;
    for (lock, holds) in holds {
        let first = holds
            .iter()
            .filter(|h| h.granted >= quiet && h.held_until.is_some())
            .map(|h| h.granted)
            .min();
        match first {
            Some(t) if t - quiet <= setting.liveness_us => slowest = slowest.max(t - quiet),
            Some(t) => {
                slowest = slowest.max(t - quiet);
                violations.push(format!(
                    "{lock}: first grant after the heal took {:.2}s (bound {:.2}s)",
                    secs(t - quiet),
                    secs(setting.liveness_us)
                ));
            }
            None => violations.push(format!("{lock}: never granted after the heal")),
        }
    }
    slowest
}

/// The share of `[start, end)` inside gaps of over 1 s between grants, and the longest gap.
/// The gaps of over 1 s with no grant in `[start, end)`.
fn gaps(mut grants: Vec<u64>, start: u64, end: u64) -> Vec<(u64, u64)> {
    grants.retain(|&t| t >= start && t < end);
    grants.sort_unstable();
    let mut last = start;
    let mut gaps = Vec::new();
    for t in grants.into_iter().chain([end]) {
        if t.saturating_sub(last) > 1_000_000 {
            gaps.push((last, t));
        }
        last = t;
    }
    gaps
}

fn unavailability(mut grants: Vec<u64>, start: u64, end: u64) -> (f64, u64) {
    if end <= start {
        return (0.0, 0);
    }
    grants.retain(|&t| t >= start && t < end);
    grants.sort_unstable();
    let mut last = start;
    let (mut dark, mut longest) = (0, 0);
    for t in grants.into_iter().chain([end]) {
        let gap = t - last;
        if gap > 1_000_000 {
            dark += gap;
        }
        longest = longest.max(gap);
        last = t;
    }
    (dark as f64 / (end - start) as f64, longest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(node: &str, token: u64, granted: u64, held_until: u64) -> Hold {
        Hold {
            node: node.to_owned(),
            lock: "a".to_owned(),
            token,
            granted,
            held_until: Some(held_until),
            released: Some(held_until),
            ..Hold::default()
        }
    }

    const MAJORITY: Setting = Setting {
        majority: true,
        liveness_us: 1,
    };

    #[test]
    fn an_overlap_seen_held_is_a_violation() {
        let mut v = Vec::new();
        check_lock(
            &[hold("n1", 1, 0, 100), hold("n2", 2, 50, 150)],
            MAJORITY,
            u64::MAX,
            &mut v,
            &mut Vec::new(),
            &mut 0,
        );
        assert_eq!(v.len(), 1, "{v:?}");
    }

    #[test]
    fn a_token_that_goes_back_is_a_violation() {
        let mut v = Vec::new();
        check_lock(
            &[hold("n1", 5, 0, 100), hold("n2", 3, 150, 200)],
            MAJORITY,
            u64::MAX,
            &mut v,
            &mut Vec::new(),
            &mut 0,
        );
        assert_eq!(v.len(), 1, "{v:?}");
    }

    #[test]
    fn sequential_holds_pass() {
        let mut v = Vec::new();
        check_lock(
            &[hold("n1", 1, 0, 100), hold("n2", 2, 150, 200)],
            MAJORITY,
            u64::MAX,
            &mut v,
            &mut Vec::new(),
            &mut 0,
        );
        assert!(v.is_empty(), "{v:?}");
    }

    #[test]
    fn gaps_over_a_second_count() {
        let (share, longest) = unavailability(vec![500_000, 2_500_000], 0, 3_000_000);
        assert_eq!(longest, 2_000_000);
        assert!((share - 2.0 / 3.0).abs() < 1e-9);
    }
}
