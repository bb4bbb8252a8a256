//! The simulated network: datagrams in flight with delay, loss, duplication and partitions.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::rng::SimRng;
use crate::time::Instant;

/// A datagram held back at least this long counts as a long hold-back.
const LONG_HOLD_BACK: Duration = Duration::from_secs(1);

/// A datagram in flight to a node slot.
#[derive(Debug)]
pub(crate) struct InFlight {
    pub(crate) from: usize,
    pub(crate) to: usize,
    pub(crate) bytes: Vec<u8>,
}

/// Link conditions, changed by the fault schedule.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Conditions {
    pub(crate) loss: f64,
    pub(crate) duplicate: f64,
    pub(crate) min_delay: Duration,
    pub(crate) max_delay: Duration,
    /// Share of datagrams held back far beyond `max_delay` (later ones overtake them).
    pub(crate) reorder: f64,
    /// Longest extra delay of a held-back datagram.
    pub(crate) max_reorder_delay: Duration,
}

/// Counters of what the network did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NetworkStats {
    /// Datagrams handed to the network.
    pub sent: u64,
    /// Datagrams delivered to a live node.
    pub delivered: u64,
    /// Datagrams lost at random.
    pub lost: u64,
    /// Extra copies injected.
    pub duplicated: u64,
    /// Datagrams dropped by a partition.
    pub partitioned: u64,
    /// Datagrams that arrived at a crashed node.
    pub to_dead: u64,
    /// Datagrams dropped by a cut link (one way or both).
    pub cut: u64,
    /// Datagrams held back far beyond the delay spread (reordered).
    pub reordered: u64,
}

/// Datagrams in flight, ordered by delivery time, then by send order (for determinism).
#[derive(Debug)]
pub(crate) struct Network {
    in_flight: BTreeMap<(Instant, u64), InFlight>,
    next_id: u64,
    /// Which side of the current partition each slot is on (all 0 when healed).
    side: Vec<u8>,
    /// Whether the partition drops only what side 0 sends to side 1 (side 1 still reaches
    /// side 0: one side hears the other but is not heard).
    one_way: bool,
    /// The longest delay of a held-back datagram, and how many were held back a second or more.
    longest_hold_back: Duration,
    long_hold_backs: u64,
    /// Directed links that drop everything (`(from, to)`).
    blocked: BTreeSet<(usize, usize)>,
    pub(crate) conditions: Conditions,
    pub(crate) stats: NetworkStats,
}

impl Network {
    pub(crate) fn new(nodes: usize, conditions: Conditions) -> Self {
        Self {
            in_flight: BTreeMap::new(),
            next_id: 0,
            side: vec![0; nodes],
            one_way: false,
            longest_hold_back: Duration::ZERO,
            long_hold_backs: 0,
            blocked: BTreeSet::new(),
            conditions,
            stats: NetworkStats::default(),
        }
    }

    /// Whether a datagram from `a` reaches `b`.
    pub(crate) fn connected(&self, a: usize, b: usize) -> bool {
        let across = self.side[a] != self.side[b] && !(self.one_way && self.side[a] == 1);
        !across && !self.blocked.contains(&(a, b))
    }

    /// Cuts the link from `a` to `b` (one way).
    pub(crate) fn cut(&mut self, a: usize, b: usize) {
        self.blocked.insert((a, b));
    }

    /// The directed links cut now.
    pub(crate) fn cuts(&self) -> Vec<(usize, usize)> {
        self.blocked.iter().copied().collect()
    }

    /// Restores the link from `a` to `b`.
    pub(crate) fn restore(&mut self, a: usize, b: usize) {
        self.blocked.remove(&(a, b));
    }

    /// Restores every cut link.
    pub(crate) fn restore_all(&mut self) {
        self.blocked.clear();
    }

    pub(crate) fn is_partitioned(&self) -> bool {
        self.side.iter().any(|s| *s != 0)
    }

    /// Splits the slots into `side_one` and the rest; `one_way` drops only what the rest
    /// sends to `side_one`.
    pub(crate) fn partition(&mut self, side_one: &[usize], one_way: bool) {
        for (i, s) in self.side.iter_mut().enumerate() {
            *s = u8::from(side_one.contains(&i));
        }
        self.one_way = one_way;
    }

    pub(crate) fn heal(&mut self) {
        self.side.fill(0);
        self.one_way = false;
    }

    /// The longest delay of a held-back datagram, and how many were held back a second or more.
    pub(crate) fn hold_backs(&self) -> (Duration, u64) {
        (self.longest_hold_back, self.long_hold_backs)
    }

    /// Queues `bytes` from `from` to `to`, applying loss, duplication, delay and partitions.
    pub(crate) fn send(
        &mut self,
        rng: &mut SimRng,
        now: Instant,
        from: usize,
        to: usize,
        bytes: Vec<u8>,
    ) {
        self.stats.sent += 1;
        if self.blocked.contains(&(from, to)) {
            self.stats.cut += 1;
            return;
        }
        if !self.connected(from, to) {
            self.stats.partitioned += 1;
            return;
        }
        if rng.chance(self.conditions.loss) {
            self.stats.lost += 1;
            return;
        }
        if rng.chance(self.conditions.duplicate) {
            self.stats.duplicated += 1;
            let at = now + self.delay(rng);
            self.push(
                at,
                InFlight {
                    from,
                    to,
                    bytes: bytes.clone(),
                },
            );
        }
        let at = now + self.delay(rng);
        self.push(at, InFlight { from, to, bytes });
    }

    fn delay(&mut self, rng: &mut SimRng) -> Duration {
        let lo = u64::try_from(self.conditions.min_delay.as_nanos()).unwrap_or(u64::MAX);
        let hi = u64::try_from(self.conditions.max_delay.as_nanos()).unwrap_or(u64::MAX);
        let delay = Duration::from_nanos(rng.between(lo, hi.max(lo)));
        // Only the harsh profile sets `reorder`: the gentle one draws no extra number.
        if self.conditions.reorder > 0.0 && rng.chance(self.conditions.reorder) {
            self.stats.reordered += 1;
            let extra =
                u64::try_from(self.conditions.max_reorder_delay.as_nanos()).unwrap_or(u64::MAX);
            let held = delay + Duration::from_nanos(rng.between(hi, extra.max(hi)));
            self.longest_hold_back = self.longest_hold_back.max(held);
            self.long_hold_backs += u64::from(held >= LONG_HOLD_BACK);
            return held;
        }
        delay
    }

    fn push(&mut self, at: Instant, datagram: InFlight) {
        self.in_flight.insert((at, self.next_id), datagram);
        self.next_id += 1;
    }

    pub(crate) fn next_delivery(&self) -> Option<Instant> {
        self.in_flight.keys().next().map(|(at, _)| *at)
    }

    /// Takes the next datagram due at or before `now`; a partition that began while it was in
    /// flight drops it.
    pub(crate) fn pop_due(&mut self, now: Instant) -> Option<InFlight> {
        loop {
            let (&(at, id), _) = self.in_flight.iter().next()?;
            if at > now {
                return None;
            }
            let datagram = self.in_flight.remove(&(at, id))?;
            if self.connected(datagram.from, datagram.to) {
                return Some(datagram);
            }
            self.stats.partitioned += 1;
        }
    }

    /// Takes the next datagram for node `to` due at or before `now`, if any (the simulated
    /// nodes take every datagram waiting before they answer: one of the schedules a driver
    /// can produce, which answers the first of a wake-up alone and the rest together).
    pub(crate) fn pop_due_to(&mut self, now: Instant, to: usize) -> Option<InFlight> {
        let key = self
            .in_flight
            .iter()
            .take_while(|((at, _), _)| *at <= now)
            .find(|(_, datagram)| datagram.to == to)
            .map(|(key, _)| *key)?;
        let datagram = self.in_flight.remove(&key)?;
        if self.connected(datagram.from, datagram.to) {
            Some(datagram)
        } else {
            self.stats.partitioned += 1;
            None
        }
    }
}
