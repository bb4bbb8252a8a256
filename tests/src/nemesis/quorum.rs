//! When the faults left a majority able to grant: a set of more than half the members, each
//! running (not killed, not paused) and every pair connected both ways (no partition cut
//! between them). Packet loss and delay are not counted against it. Under `Majority` a gap in
//! grants while no such set exists is the policy doing its job; a gap while one exists is the
//! protocol's own cost (a new term, a grace period).

use std::collections::BTreeSet;

use super::checker::Fault;

/// The spans within `[start, end)` in which a connected majority of `members` existed,
/// replayed from the fault log.
pub fn majority_spans(
    faults: &[Fault],
    members: &[String],
    start: u64,
    end: u64,
) -> Vec<(u64, u64)> {
    let mut down: BTreeSet<&str> = BTreeSet::new();
    let mut cuts: BTreeSet<(&str, &str)> = BTreeSet::new();
    let mut spans = Vec::new();
    let mut since = Some(start);
    for fault in faults {
        let mut words = fault.detail.split_whitespace();
        match fault.kind.as_str() {
            "kill" | "pause" | "exit" => {
                down.extend(words.next());
            }
            "restart" | "resume" => {
                if let Some(node) = words.next() {
                    down.remove(node);
                }
            }
            "partition" => cuts = partition_cuts(&fault.detail),
            "heal-partition" => cuts.clear(),
            _ => continue,
        }
        let t = fault.t.clamp(start, end);
        let up = has_majority(members, &down, &cuts);
        match (since, up) {
            (Some(from), false) => {
                if t > from {
                    spans.push((from, t));
                }
                since = None;
            }
            (None, true) => since = Some(t),
            _ => {}
        }
    }
    if let Some(from) = since {
        if end > from {
            spans.push((from, end));
        }
    }
    spans
}

/// The directed cuts of a `partition` line: `two-way A,B|C,D ...` or `one-way A,B->C,D ...`
/// (the first side's packets to the second are dropped).
fn partition_cuts(detail: &str) -> BTreeSet<(&str, &str)> {
    let mut words = detail.split_whitespace();
    let (Some(kind), Some(sides)) = (words.next(), words.next()) else {
        return BTreeSet::new();
    };
    let (from, to, both) = if kind == "one-way" {
        match sides.split_once("->") {
            Some((a, b)) => (a, b, false),
            None => return BTreeSet::new(),
        }
    } else {
        match sides.split_once('|') {
            Some((a, b)) => (a, b, true),
            None => return BTreeSet::new(),
        }
    };
    let mut cuts = BTreeSet::new();
    for a in from.split(',') {
        for b in to.split(',') {
            cuts.insert((a, b));
            if both {
                cuts.insert((b, a));
            }
        }
    }
    cuts
}

/// Whether some set of more than half of `members` is running and pairwise connected.
fn has_majority(members: &[String], down: &BTreeSet<&str>, cuts: &BTreeSet<(&str, &str)>) -> bool {
    let up: Vec<&str> = members
        .iter()
        .map(String::as_str)
        .filter(|m| !down.contains(m))
        .collect();
    let need = members.len() / 2 + 1;
    // Clusters here have a handful of members: trying every subset of the running ones is cheap.
    let n = up.len();
    (0u32..(1 << n)).any(|set| {
        let chosen: Vec<&str> = (0..n)
            .filter(|i| set & (1 << i) != 0)
            .map(|i| up[i])
            .collect();
        chosen.len() >= need
            && chosen
                .iter()
                .all(|a| chosen.iter().all(|b| a == b || !cuts.contains(&(*a, *b))))
    })
}

/// How much of `gaps` falls inside `spans` (both sorted lists of disjoint spans), µs.
pub fn overlap(gaps: &[(u64, u64)], spans: &[(u64, u64)]) -> u64 {
    let mut total = 0;
    for &(a, b) in gaps {
        for &(c, d) in spans {
            total += b.min(d).saturating_sub(a.max(c));
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fault(t: u64, kind: &str, detail: &str) -> Fault {
        Fault {
            t,
            kind: kind.to_owned(),
            detail: detail.to_owned(),
        }
    }

    fn members() -> Vec<String> {
        ["n1", "n2", "n3", "n4", "n5"].map(String::from).to_vec()
    }

    #[test]
    fn two_down_and_one_cut_off_leave_no_majority() {
        let faults = [
            fault(10, "kill", "n1"),
            fault(20, "pause", "n2 500ms member"),
            fault(30, "partition", "one-way n3->n4,n5 1000ms"),
            fault(40, "heal-partition", ""),
            fault(50, "resume", "n2"),
        ];
        let spans = majority_spans(&faults, &members(), 0, 100);
        assert_eq!(spans, vec![(0, 30), (40, 100)]);
        assert_eq!(overlap(&[(25, 45)], &spans), 10);
    }

    #[test]
    fn a_minority_cut_off_leaves_the_majority() {
        let faults = [fault(10, "partition", "two-way n1,n2|n3,n4,n5 1000ms")];
        assert_eq!(majority_spans(&faults, &members(), 0, 100), vec![(0, 100)]);
    }
}
