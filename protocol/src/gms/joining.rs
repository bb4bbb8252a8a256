//! A joiner looking for the cluster: pinging, asking the first coordinator it hears of, and
//! deciding when to found a cluster of its own.

use std::collections::{BTreeSet, VecDeque};

use conclave_lock_api::wire::Discovery;
use conclave_lock_api::MemberId;
use tracing::{debug, warn};

use crate::time::Instant;

use super::config::{Founding, GmsConfig};
use super::types::{GmsOutput, MAX_REMEMBERED};

/// The state of a member that is joining.
#[derive(Debug)]
pub(super) struct Joining {
    started: Instant,
    next_ping: Instant,
    /// The coordinator we asked to join, and when.
    target: Option<(MemberId, Instant)>,
    /// Other joiners heard pinging; the lowest id founds the cluster.
    joiners: BTreeSet<MemberId>,
    /// When a member of an existing cluster last answered: no founding soon after that.
    last_announce: Option<Instant>,
    /// Whether [`JoinProblem::NobodyAnswered`](super::JoinProblem::NobodyAnswered) was reported
    /// (once per join).
    reported_alone: bool,
    /// Whether a coordinator refused us for a setting: we never found a cluster then (it
    /// would be one of members that disagree with the cluster found).
    refused: bool,
}

/// What a joiner's timer decided, beyond the pings it sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum JoinDecision {
    /// Found a cluster of its own.
    Found,
    /// Report [`JoinProblem::NobodyAnswered`](super::JoinProblem::NobodyAnswered): it may not
    /// found a cluster alone.
    NobodyAnswered,
}

impl Joining {
    /// A join started at `now`: it pings at once.
    pub(super) fn new(now: Instant) -> Self {
        Joining {
            started: now,
            next_ping: now,
            target: None,
            joiners: BTreeSet::new(),
            last_announce: None,
            reported_alone: false,
            refused: false,
        }
    }

    /// When the joiner's timer must next run.
    pub(super) fn deadline(&self, config: &GmsConfig, founding: Founding) -> Instant {
        let mut next = self.next_ping;
        if let Some((_, sent)) = &self.target {
            next = next.min(*sent + config.join_timeout);
        } else if self.may_still_found_or_report(founding) {
            // The lowest joiner founds after one quiet discovery timeout, any joiner
            // after two; the ping timer covers the first check. (A joiner that may
            // not found has no such deadline once it reported: the ping timer checks
            // for joiners heard since.)
            next = next.min(self.quiet_since() + config.discovery_timeout * 2);
        }
        next
    }

    /// Runs the joiner's timer: forgets an unanswered join request, pings (into `outputs`) and
    /// decides whether to found a cluster or report that nobody answered.
    pub(super) fn tick(
        &mut self,
        now: Instant,
        local: &MemberId,
        config: &GmsConfig,
        founding: Founding,
        outputs: &mut VecDeque<GmsOutput>,
    ) -> Option<JoinDecision> {
        if let Some((target, sent)) = &self.target {
            if now >= *sent + config.join_timeout {
                debug!(member = %local, coordinator = %target, "join not answered; discovering again");
                self.target = None;
            }
        }
        if now >= self.next_ping {
            self.next_ping = now + config.discovery_interval;
            outputs.push_back(GmsOutput::Discover(Discovery::Ping));
        }
        if self.target.is_some() {
            return None;
        }
        let waited = now.saturating_duration_since(self.quiet_since());
        let lowest = self.joiners.iter().all(|j| j > local);
        let alone = self.joiners.is_empty();
        if waited < config.discovery_timeout || !(lowest || waited >= config.discovery_timeout * 2)
        {
            return None;
        }
        let may_found = !self.refused
            && match founding {
                Founding::Alone => true,
                Founding::WithOthers => !alone,
                Founding::Never => false,
            };
        if may_found {
            Some(JoinDecision::Found)
        } else if alone && !self.reported_alone && !self.refused {
            self.reported_alone = true;
            warn!(member = %local, ?founding, "no member of the cluster answered; not founding one");
            Some(JoinDecision::NobodyAnswered)
        } else {
            None
        }
    }

    /// Another joiner pinged.
    pub(super) fn heard_ping(&mut self, from: &MemberId) {
        if self.joiners.len() < MAX_REMEMBERED {
            self.joiners.insert(from.clone());
        }
    }

    /// A member of a cluster coordinated by `coordinator` announced its view at `now`. Returns
    /// whether to ask `coordinator` to join (no join request is outstanding).
    pub(super) fn heard_announce(&mut self, now: Instant, coordinator: &MemberId) -> bool {
        self.last_announce = Some(now);
        if self.target.is_some() {
            return false;
        }
        self.target = Some((coordinator.clone(), now));
        true
    }

    /// `from` refused the join for a setting. Returns whether it was the coordinator asked
    /// (the refusal counts only then).
    pub(super) fn refused_by(&mut self, from: &MemberId) -> bool {
        if !self.asked(from) {
            return false;
        }
        self.target = None;
        self.refused = true;
        true
    }

    /// `from` answered that it does not coordinate: if it was the one asked, ask again.
    pub(super) fn not_coordinator(&mut self, from: &MemberId) {
        if self.asked(from) {
            self.target = None;
        }
    }

    /// Whether the join request outstanding went to `member`.
    fn asked(&self, member: &MemberId) -> bool {
        self.target.as_ref().is_some_and(|(t, _)| t == member)
    }

    /// Since when no member of a cluster has answered.
    fn quiet_since(&self) -> Instant {
        self.last_announce
            .map_or(self.started, |t| t.max(self.started))
    }

    /// Whether the founding deadline can still lead to a founding or a report.
    fn may_still_found_or_report(&self, founding: Founding) -> bool {
        if self.refused {
            return false;
        }
        let alone = self.joiners.is_empty();
        match founding {
            Founding::Alone => true,
            Founding::WithOthers => !alone || !self.reported_alone,
            Founding::Never => alone && !self.reported_alone,
        }
    }
}
