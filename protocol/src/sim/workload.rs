//! Simulated lock users: actors that lock, try-lock, time out, cancel, hold and unlock.

use std::time::Duration;

use conclave_lock_api::{LockMode, LockName, RequestId};

use super::rng::SimRng;
use crate::locking::{LockNotice, LockRequest};
use crate::time::Instant;

/// What the simulated lock users do.
#[derive(Clone, Debug)]
pub struct Workload {
    /// Independent lock users per node. Default 2.
    pub actors_per_node: usize,
    /// Distinct lock names (few names, so requests contend). Default 3.
    pub locks: usize,
    /// Share of requests in shared mode. Default 0.2.
    pub shared: f64,
    /// Share of try-locks. Default 0.2.
    pub try_lock: f64,
    /// Share of waiting requests with a timeout. Default 0.3.
    pub timeout: f64,
    /// Share of waiting requests whose caller gives up (drops the future) after a while.
    /// Default 0.1.
    pub cancel: f64,
    /// Longest pause between two requests of one actor. Default 200 ms.
    pub max_think: Duration,
    /// Longest hold. Default 100 ms.
    pub max_hold: Duration,
    /// Share of waiting requests that ask for a lease of their own (`lock_with_lease`),
    /// between 20 ms and `max_hold`, so some holds outlive their lease. Default 0 (no random
    /// draw is made then, so seeds of runs without leases replay as before).
    pub leased: f64,
    /// Chance that an idle actor asks for the grantor role for its node instead of a lock
    /// (`become_grantor`). Default 0 (no random draw then).
    pub transfer: f64,
    /// Named lock services besides the default one: actor `a` of each node uses service
    /// `a % (services + 1)` (0: the default service, `k`: the service `svc-k`), so the same
    /// lock names live in several independent namespaces, each with its own grantor.
    /// Default 0 (no random draw is made for it in any case).
    pub services: usize,
    /// Share of waiting requests that ask the grantor not to say they were queued
    /// (`lock_quiet`). Default 0 (no random draw then).
    pub quiet: f64,
    /// Share of holds that end as a dropped guard does: by `unlock_lazy` (a lazy release,
    /// whose acknowledgement the grantor may hold back), not `unlock`. Default 0 (no random
    /// draw then).
    pub dropped: f64,
}

impl Workload {
    /// The named service actor `actor` of a node uses (`None`: the default service).
    pub fn service_of(&self, actor: usize) -> Option<conclave_lock_api::ServiceName> {
        let k = actor % (self.services + 1);
        (k > 0).then(|| {
            conclave_lock_api::ServiceName::new(format!("svc-{k}"))
                .unwrap_or_else(|e| unreachable!("simulator service names are valid: {e}"))
        })
    }
}

impl Default for Workload {
    fn default() -> Self {
        Self {
            actors_per_node: 2,
            locks: 3,
            shared: 0.2,
            try_lock: 0.2,
            timeout: 0.3,
            cancel: 0.1,
            max_think: Duration::from_millis(200),
            max_hold: Duration::from_millis(100),
            leased: 0.0,
            transfer: 0.0,
            services: 0,
            quiet: 0.0,
            dropped: 0.0,
        }
    }
}

/// Counters of the workload.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WorkloadStats {
    /// Requests issued.
    pub requests: u64,
    /// Grants received.
    pub granted: u64,
    /// Try-locks refused.
    pub would_block: u64,
    /// Requests that timed out.
    pub timeouts: u64,
    /// Requests cancelled by their caller.
    pub cancelled: u64,
    /// Locks released by their holder.
    pub released: u64,
    /// Locks lost (duplicate, minority, lease).
    pub lost: u64,
    /// Requests refused because the member was in a minority (`Majority`).
    pub no_quorum: u64,
    /// Try-locks refused because the grantor could not grant anything at that moment.
    pub unavailable: u64,
    /// Availability in the chaos phase: the longest stretch in which some request waited and
    /// no request anywhere was granted (from the later of the previous grant and the oldest
    /// wait's start to the next grant).
    pub longest_grant_gap: Duration,
    /// The part of such stretches beyond their first second, summed: time in which nothing
    /// was granted for over a second while something was asked for.
    pub grant_gaps_over_1s: Duration,
}

#[derive(Clone, Debug)]
pub(crate) enum Actor {
    Idle {
        next: Instant,
    },
    Waiting {
        request: RequestId,
        cancel_at: Option<Instant>,
        /// When the request was made.
        since: Instant,
    },
    Holding {
        request: RequestId,
        until: Instant,
        /// A leased hold re-locks (reentrantly, with a lease) then.
        extend_at: Option<Instant>,
    },
}

/// What an actor wants done to its node.
pub(crate) enum Action {
    /// A request, and whether it asks not to be told it was queued.
    Lock(LockRequest, bool),
    Cancel(RequestId),
    Unlock(RequestId),
    /// A release nobody waits for (a guard dropped): `unlock_lazy`.
    Drop(RequestId),
    /// A reentrant re-lock with a lease: the hold's lease becomes `max(remaining, lease)`.
    Extend(RequestId, Duration),
    /// Ask for the grantor role for the actor's node.
    BecomeGrantor,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Actor {
    pub(crate) fn new(rng: &mut SimRng, now: Instant, w: &Workload) -> Self {
        Actor::Idle {
            next: now + Duration::from_nanos(rng.below(nanos(w.max_think).max(1))),
        }
    }

    pub(crate) fn next_timer(&self) -> Option<Instant> {
        match self {
            Actor::Idle { next } => Some(*next),
            Actor::Waiting { cancel_at, .. } => *cancel_at,
            Actor::Holding {
                until, extend_at, ..
            } => Some(extend_at.map_or(*until, |at| at.min(*until))),
        }
    }

    /// Acts if its timer is due. `issue` is false in the calm phase: no new requests then.
    pub(crate) fn tick(
        &mut self,
        rng: &mut SimRng,
        now: Instant,
        w: &Workload,
        owner: u64,
        issue: bool,
        stats: &mut WorkloadStats,
    ) -> Option<Action> {
        match self.clone() {
            Actor::Idle { next }
                if next <= now && issue && w.transfer > 0.0 && rng.chance(w.transfer) =>
            {
                *self = Actor::idle(rng, now, w);
                Some(Action::BecomeGrantor)
            }
            Actor::Idle { next } if next <= now && issue => {
                let name = LockName::new(format!("lock-{}", rng.below(w.locks.max(1) as u64)))
                    .unwrap_or_else(|e| unreachable!("simulator lock names are valid: {e}"));
                let mode = if rng.chance(w.shared) {
                    LockMode::Shared
                } else {
                    LockMode::Exclusive
                };
                let wait = !rng.chance(w.try_lock);
                let timeout = (wait && rng.chance(w.timeout))
                    .then(|| Duration::from_millis(rng.between(20, 1_500)));
                let lease = (wait && w.leased > 0.0 && rng.chance(w.leased)).then(|| {
                    let longest = w.max_hold.as_millis().max(21) as u64;
                    Duration::from_millis(rng.between(20, longest))
                });
                let quiet = wait && w.quiet > 0.0 && rng.chance(w.quiet);
                stats.requests += 1;
                Some(Action::Lock(
                    LockRequest {
                        owner,
                        name,
                        mode,
                        wait,
                        timeout,
                        lease,
                    },
                    quiet,
                ))
            }
            Actor::Waiting {
                request,
                cancel_at: Some(at),
                ..
            } if at <= now => {
                stats.cancelled += 1;
                *self = Actor::idle(rng, now, w);
                Some(Action::Cancel(request))
            }
            Actor::Holding {
                request,
                until,
                extend_at: Some(at),
            } if at <= now && until > now => {
                *self = Actor::Holding {
                    request,
                    until,
                    extend_at: None,
                };
                let longest = w.max_hold.as_millis().max(21) as u64;
                Some(Action::Extend(
                    request,
                    Duration::from_millis(rng.between(20, longest)),
                ))
            }
            Actor::Holding { request, until, .. } if until <= now => {
                stats.released += 1;
                *self = Actor::idle(rng, now, w);
                if w.dropped > 0.0 && rng.chance(w.dropped) {
                    Some(Action::Drop(request))
                } else {
                    Some(Action::Unlock(request))
                }
            }
            _ => None,
        }
    }

    /// The node accepted the request: wait for its answer (maybe giving up later).
    pub(crate) fn waiting(
        &mut self,
        rng: &mut SimRng,
        now: Instant,
        w: &Workload,
        request: RequestId,
    ) {
        let cancel_at = rng
            .chance(w.cancel)
            .then(|| now + Duration::from_millis(rng.between(1, 800)));
        *self = Actor::Waiting {
            request,
            cancel_at,
            since: now,
        };
    }

    fn idle(rng: &mut SimRng, now: Instant, w: &Workload) -> Actor {
        Actor::Idle {
            next: now + Duration::from_nanos(rng.below(nanos(w.max_think).max(1))),
        }
    }

    /// When the request it waits for was made, if it waits.
    pub(crate) fn waiting_since(&self) -> Option<Instant> {
        match self {
            Actor::Waiting { since, .. } => Some(*since),
            _ => None,
        }
    }

    pub(crate) fn is_idle(&self) -> bool {
        matches!(self, Actor::Idle { .. })
    }

    /// Reacts to a notice about its own request.
    pub(crate) fn on_notice(
        &mut self,
        rng: &mut SimRng,
        now: Instant,
        w: &Workload,
        notice: &LockNotice,
        stats: &mut WorkloadStats,
    ) {
        match (self.clone(), notice) {
            (Actor::Waiting { request, .. }, LockNotice::Granted { request: r, .. })
                if request == *r =>
            {
                stats.granted += 1;
                let hold =
                    Duration::from_nanos(rng.between(1_000_000, nanos(w.max_hold).max(1_000_000)));
                // Leased holds sometimes extend their lease midway (only in runs with
                // leases: no random draw otherwise, so other seeds replay as before).
                let extend_at = (w.leased > 0.0 && rng.chance(0.3))
                    .then(|| now + Duration::from_nanos(rng.below(nanos(hold).max(1))));
                *self = Actor::Holding {
                    request,
                    until: now + hold,
                    extend_at,
                };
            }
            (
                Actor::Waiting { request, .. },
                LockNotice::Refused {
                    request: r, reason, ..
                },
            ) if request == *r => {
                match reason {
                    crate::locking::Refusal::WouldBlock => stats.would_block += 1,
                    crate::locking::Refusal::Timeout => stats.timeouts += 1,
                    crate::locking::Refusal::Shutdown | crate::locking::Refusal::Destroyed => {}
                    crate::locking::Refusal::NoQuorum => stats.no_quorum += 1,
                    crate::locking::Refusal::Unavailable => stats.unavailable += 1,
                }
                *self = Actor::idle(rng, now, w);
            }
            (Actor::Holding { request, .. }, LockNotice::Lost { request: r, .. })
                if request == *r =>
            {
                stats.lost += 1;
                *self = Actor::idle(rng, now, w);
            }
            _ => {}
        }
    }
}
