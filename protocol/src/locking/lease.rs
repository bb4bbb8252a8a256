//! Leases of the `Majority` policy: a grantor's term and the support it has, and a member's
//! promise to support one grantor.
//!
//! A grantor may grant, and confirm holders' leases, only while a strict majority of the
//! cluster *supports* its current term. Support is measured from the grantor's own clock and
//! from send times only:
//!
//! - In every heartbeat round the grantor sends a [`Probe`] `{ term, seq }` to each member and
//!   remembers when it sent round `seq`.
//! - A member echoes a probe of the coordinator of its view on its next heartbeat to it. With
//!   the echo it *promises*, for `support_lease` on its own clock from the moment it sends the
//!   echo, not to echo any other grantor; and it never echoes a lower term than one it has
//!   echoed, nor the same term of another grantor. A new process echoes nothing for
//!   `support_lease × (lease + lease_margin) / lease` after it starts (it may have promised in
//!   a past life).
//! - The grantor counts a member as supporting it from the *send* time of the newest probe the
//!   member echoed, for a window of `support_lease × lease / (lease + lease_margin)`: shorter
//!   than the promise on any clock whose rate is within the documented bound of the member's.
//!
//! Hence the support windows of two terms never overlap in real time, and the windows of a
//! lower term all end before those of a higher term begin (a member in both majorities echoed
//! the lower one first, and only after that promise ran out). Terms number the grantors'
//! reigns: fencing tokens carry the term, so they increase across grantors.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use conclave_lock_api::wire::Probe;
use conclave_lock_api::{MemberId, View};

use crate::time::Instant;

/// Probe rounds remembered; older echoes no longer matter.
const MAX_ROUNDS: usize = 256;

/// `d × num / den`, in nanoseconds, rounded down.
pub(crate) fn scale(d: Duration, num: Duration, den: Duration) -> Duration {
    let den = den.as_nanos().max(1);
    let nanos = d.as_nanos().saturating_mul(num.as_nanos()) / den;
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// What a member has promised, and to whom: kept for the life of the process.
#[derive(Debug, Default)]
pub(crate) struct Support {
    /// When this process started (its first input).
    born: Option<Instant>,
    /// The highest term heard of from anyone.
    pub(crate) max_term: u64,
    /// The highest `(term, grantor)` echoed; never goes back.
    promised: Option<(u64, MemberId)>,
    /// The promise to `promised`'s grantor runs until then.
    promise_until: Option<Instant>,
    /// The newest probe of our grantor, to echo with the next heartbeat to it.
    /// (Only ever the coordinator of our view, but for the sabotage below.)
    to_echo: BTreeMap<MemberId, Probe>,
    /// Sabotage (simulator): echo every grantor that probes, at once, with no promise.
    pub(crate) promise_anyone: bool,
    /// The highest term promised in an earlier life of this member (restored from stable
    /// storage): never echoed again, so every later term exceeds it.
    floor: u64,
    /// The highest term promised in this life that stable storage has not been told of.
    unsaved: Option<u64>,
}

impl Support {
    pub(crate) fn touch(&mut self, now: Instant) {
        self.born.get_or_insert(now);
    }

    /// Restores the highest term this member promised before it restarted.
    pub(crate) fn restore(&mut self, floor: u64) {
        self.floor = self.floor.max(floor);
        self.observe_term(floor);
    }

    /// A term to write to stable storage before anything this member sends next (each
    /// promised term, once).
    pub(crate) fn take_unsaved(&mut self) -> Option<u64> {
        self.unsaved.take()
    }

    /// Records that `term` exists somewhere.
    pub(crate) fn observe_term(&mut self, term: u64) {
        self.max_term = self.max_term.max(term);
    }

    /// Whether this member may echo `grantor`'s `term` at `now` (and so promise it).
    pub(crate) fn may_promise(
        &self,
        now: Instant,
        grantor: &MemberId,
        term: u64,
        born_wait: Duration,
    ) -> bool {
        if self.promise_anyone {
            return true;
        }
        if term <= self.floor {
            return false;
        }
        if self.born.is_none_or(|born| now < born + born_wait) {
            return false;
        }
        let Some((promised_term, promised_to)) = &self.promised else {
            return true;
        };
        if term < *promised_term || (term == *promised_term && promised_to != grantor) {
            return false;
        }
        promised_to == grantor || self.promise_until.is_none_or(|until| now >= until)
    }

    /// Promises `grantor`'s `term` until `now + duration`.
    fn promise(&mut self, now: Instant, grantor: &MemberId, term: u64, duration: Duration) {
        if self.promised.as_ref().is_none_or(|(t, _)| *t < term) {
            self.unsaved = Some(term);
        }
        self.promised = Some((term, grantor.clone()));
        self.promise_until = Some(now + duration);
        self.observe_term(term);
    }

    /// A probe arrived from the coordinator of our view: echo it with the next heartbeat.
    pub(crate) fn probed(&mut self, grantor: &MemberId, probe: Probe) {
        self.observe_term(probe.term);
        if !self.promise_anyone {
            self.to_echo.clear();
        }
        self.to_echo.insert(grantor.clone(), probe);
    }

    /// The echo to put on a heartbeat to `to`, if we owe `to` one and may promise it; the
    /// promise starts now.
    pub(crate) fn echo_for(
        &mut self,
        now: Instant,
        to: &MemberId,
        born_wait: Duration,
        duration: Duration,
    ) -> Option<Probe> {
        let probe = *self.to_echo.get(to)?;
        if !self.may_promise(now, to, probe.term, born_wait) {
            return None;
        }
        self.to_echo.remove(to);
        self.promise(now, to, probe.term, duration);
        Some(probe)
    }

    /// Promises our own term (a grantor supports itself), if it may.
    pub(crate) fn promise_self(
        &mut self,
        now: Instant,
        local: &MemberId,
        term: u64,
        born_wait: Duration,
        duration: Duration,
    ) -> bool {
        if !self.may_promise(now, local, term, born_wait) {
            return false;
        }
        self.promise(now, local, term, duration);
        true
    }

    /// If `grantor`'s `term` can never be echoed by this member (it promised an equal or
    /// higher term to another grantor), the term it promised.
    pub(crate) fn refuses(&self, grantor: &MemberId, term: u64) -> Option<u64> {
        if self.promise_anyone {
            return None;
        }
        if term <= self.floor {
            // Promised in an earlier life, maybe to this very grantor: it must move on.
            let promised = self.promised.as_ref().map_or(0, |(t, _)| *t);
            return Some(self.floor.max(promised));
        }
        let (promised_term, promised_to) = self.promised.as_ref()?;
        // A stale probe of a term the grantor itself has left behind needs no answer.
        (promised_to != grantor && term <= *promised_term).then_some(*promised_term)
    }

    /// The term of the probe we owe `to` an echo for.
    pub(crate) fn owed_term(&self, to: &MemberId) -> Option<u64> {
        self.to_echo.get(to).map(|probe| probe.term)
    }

    /// Forgets a probe we owe an echo for (our grantor changed).
    pub(crate) fn forget_echo(&mut self) {
        self.to_echo.clear();
    }
}

/// A grantor's current term: its probe rounds and who supports it since when.
#[derive(Debug)]
pub(crate) struct Term {
    pub(crate) term: u64,
    next_seq: u64,
    /// Send time of each recent probe round.
    rounds: VecDeque<(u64, Instant)>,
    /// Per supporter, the send time of the newest probe it echoed.
    support: BTreeMap<MemberId, Instant>,
    /// When the support first reached a majority in this term.
    pub(crate) quorum_at: Option<Instant>,
    /// Once it has: when the majority's support runs out, unless renewed before.
    supported_until: Option<Instant>,
}

impl Term {
    pub(crate) fn new(term: u64) -> Self {
        Self {
            term,
            next_seq: 1,
            rounds: VecDeque::new(),
            support: BTreeMap::new(),
            quorum_at: None,
            supported_until: None,
        }
    }

    /// The probe of the round sent at `now` (one round per heartbeat tick).
    pub(crate) fn probe(&mut self, now: Instant) -> Probe {
        match self.rounds.back() {
            Some((seq, at)) if *at == now => Probe {
                term: self.term,
                seq: *seq,
            },
            _ => {
                let seq = self.next_seq;
                self.next_seq += 1;
                self.rounds.push_back((seq, now));
                while self.rounds.len() > MAX_ROUNDS {
                    self.rounds.pop_front();
                }
                Probe {
                    term: self.term,
                    seq,
                }
            }
        }
    }

    /// `member` supports us since `sent` (our clock).
    pub(crate) fn supported(&mut self, member: &MemberId, sent: Instant) {
        let at = self.support.entry(member.clone()).or_insert(sent);
        *at = (*at).max(sent);
    }

    /// `member` echoed `probe`: it supports us since that round's send time.
    pub(crate) fn echoed(&mut self, member: &MemberId, probe: Probe) {
        if probe.term != self.term {
            return;
        }
        if let Some((_, sent)) = self.rounds.iter().find(|(seq, _)| *seq == probe.seq) {
            let sent = *sent;
            self.supported(member, sent);
        }
    }

    /// Counts only the support of members of `view` from now on (a removed member's no
    /// longer): until when the majority lasts is recomputed, and is gone if the members left
    /// are no majority.
    pub(crate) fn keep_supporters(&mut self, view: &View, window: Duration, cluster_size: usize) {
        self.support.retain(|member, _| view.contains(member));
        if self.supported_until.is_some() {
            let until = self.quorum_until(window, cluster_size);
            self.supported_until = until.min(self.supported_until);
        }
    }

    /// Records the support as of `now` (after new echoes): when a majority first supports the
    /// term, and until when the current majority lasts. Returns whether the term is supported
    /// now.
    pub(crate) fn update(&mut self, now: Instant, window: Duration, cluster_size: usize) -> bool {
        if !self.has_quorum(now, window, cluster_size) {
            return false;
        }
        let mut ends: Vec<Instant> = self.support.values().map(|s| *s + window).collect();
        ends.sort_unstable_by(|a, b| b.cmp(a));
        // The majority-th latest end: after it, fewer than a majority remain.
        self.supported_until = ends.get(cluster_size / 2).copied();
        self.quorum_at.get_or_insert(now);
        true
    }

    /// Whether a majority supported this term once and that support has run out since (even
    /// if echoes that arrive now would restore it: meanwhile another term may have served).
    pub(crate) fn lapsed(&self, now: Instant) -> bool {
        self.quorum_at.is_some() && self.supported_until.is_none_or(|until| now >= until)
    }

    /// Until when the support recorded so far is a strict majority of `cluster_size`
    /// (`has_quorum(now)` holds exactly for `now` before it); `None` if it never is.
    pub(crate) fn quorum_until(&self, window: Duration, cluster_size: usize) -> Option<Instant> {
        let mut ends: Vec<Instant> = self.support.values().map(|s| *s + window).collect();
        ends.sort_unstable_by(|a, b| b.cmp(a));
        ends.get(cluster_size / 2).copied()
    }

    /// Whether a strict majority of `cluster_size` supports us at `now`.
    pub(crate) fn has_quorum(&self, now: Instant, window: Duration, cluster_size: usize) -> bool {
        let supporters = self
            .support
            .values()
            .filter(|since| now < **since + window)
            .count();
        supporters * 2 > cluster_size
    }
}
