//! The simulated lock users of a Raft run: actors that lock (exclusive or shared, waiting or
//! trying, with or without a lease, some with a timeout the harness enforces by cancelling),
//! hold for a while (extending their lease now and then), unlock, and read the table.

use std::time::Duration;

use conclave_lock_api::LockMode;

use crate::sim::rng::SimRng;
use crate::time::Instant;

/// What the simulated lock users of a Raft run do.
#[derive(Clone, Debug, PartialEq)]
pub struct RaftWorkload {
    /// Lock users per node. Default 3.
    pub actors_per_node: usize,
    /// Distinct lock names (few, so requests contend). Default 3.
    pub locks: usize,
    /// Share of requests in shared mode. Default 0.25.
    pub shared: f64,
    /// Share of try-locks (never queued). Default 0.15.
    pub try_lock: f64,
    /// Share of waiting requests with a timeout (20 ms to 1.5 s), which the harness enforces
    /// by calling `cancel`. Default 0.3.
    pub timeout: f64,
    /// Share of requests with a lease of their own (100 to 500 ms). Default 0.3.
    pub leased: f64,
    /// Share of leased holds that extend their lease once, midway. Default 0.4.
    pub extend: f64,
    /// Chance that an idle actor asks for a linearizable table read instead of a lock.
    /// Default 0.05.
    pub reads: f64,
    /// Longest pause between two requests of one actor. Default 300 ms.
    pub max_think: Duration,
    /// Longest hold (a leased hold may outlive its lease: it is lost then). Default 600 ms.
    pub max_hold: Duration,
    /// Share of holds that last long (2 to 6 s: longer than a session timeout, so that only
    /// session renewals keep them), besides those of `max_hold`. Default 0.1.
    pub long_hold: f64,
}

impl Default for RaftWorkload {
    fn default() -> Self {
        RaftWorkload {
            actors_per_node: 3,
            locks: 3,
            shared: 0.25,
            try_lock: 0.15,
            timeout: 0.3,
            leased: 0.3,
            extend: 0.4,
            reads: 0.05,
            max_think: Duration::from_millis(300),
            max_hold: Duration::from_millis(600),
            long_hold: 0.1,
        }
    }
}

/// One lock user.
#[derive(Clone, Debug)]
pub(super) enum Actor {
    /// Thinking until `next`.
    Idle { next: Instant },
    /// Waiting for `request`, giving up (cancelling) at `cancel_at`.
    Waiting {
        request: u64,
        cancel_at: Option<Instant>,
    },
    /// Holding `request` until `until`; extends its lease at `extend_at`.
    Holding {
        request: u64,
        until: Instant,
        extend_at: Option<Instant>,
    },
}

/// What an actor asks of its node.
#[derive(Clone, Debug)]
pub(super) enum Action {
    /// A lock request on lock number `lock`.
    Lock {
        lock: usize,
        mode: LockMode,
        wait: bool,
        lease: Option<Duration>,
        timeout: Option<Duration>,
    },
    /// Gives up a wait (its timeout).
    Cancel(u64),
    /// Releases a hold.
    Unlock(u64),
    /// A new lease for a hold.
    Extend(u64, Duration),
    /// A linearizable table read.
    Read,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn lease(rng: &mut SimRng) -> Duration {
    Duration::from_millis(rng.between(100, 500))
}

impl Actor {
    pub(super) fn new(rng: &mut SimRng, now: Instant, w: &RaftWorkload) -> Self {
        Actor::idle(rng, now, w)
    }

    fn idle(rng: &mut SimRng, now: Instant, w: &RaftWorkload) -> Actor {
        Actor::Idle {
            next: now + Duration::from_nanos(rng.below(nanos(w.max_think).max(1))),
        }
    }

    /// When it next acts (in true time).
    pub(super) fn next_timer(&self) -> Option<Instant> {
        match self {
            Actor::Idle { next } => Some(*next),
            Actor::Waiting { cancel_at, .. } => *cancel_at,
            Actor::Holding {
                until, extend_at, ..
            } => Some(extend_at.map_or(*until, |at| at.min(*until))),
        }
    }

    pub(super) fn is_idle(&self) -> bool {
        matches!(self, Actor::Idle { .. })
    }

    /// The request it waits for or holds.
    pub(super) fn request(&self) -> Option<u64> {
        match self {
            Actor::Idle { .. } => None,
            Actor::Waiting { request, .. } | Actor::Holding { request, .. } => Some(*request),
        }
    }

    /// Acts if its timer is due. `issue` is false in the calm phase: no new requests then.
    pub(super) fn tick(
        &mut self,
        rng: &mut SimRng,
        now: Instant,
        w: &RaftWorkload,
        issue: bool,
    ) -> Option<Action> {
        match self.clone() {
            Actor::Idle { next } if next <= now && issue => {
                *self = Actor::idle(rng, now, w);
                if rng.chance(w.reads) {
                    return Some(Action::Read);
                }
                let lock = rng.below(w.locks.max(1) as u64) as usize;
                let mode = if rng.chance(w.shared) {
                    LockMode::Shared
                } else {
                    LockMode::Exclusive
                };
                let wait = !rng.chance(w.try_lock);
                let timeout = (wait && rng.chance(w.timeout))
                    .then(|| Duration::from_millis(rng.between(20, 1_500)));
                let lease = rng.chance(w.leased).then(|| lease(rng));
                Some(Action::Lock {
                    lock,
                    mode,
                    wait,
                    lease,
                    timeout,
                })
            }
            Actor::Waiting {
                request,
                cancel_at: Some(at),
            } if at <= now => {
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
                Some(Action::Extend(request, lease(rng)))
            }
            Actor::Holding { request, until, .. } if until <= now => {
                *self = Actor::idle(rng, now, w);
                Some(Action::Unlock(request))
            }
            _ => None,
        }
    }

    /// The node took the request: wait for its answer, giving up after `timeout`.
    pub(super) fn waiting(&mut self, now: Instant, request: u64, timeout: Option<Duration>) {
        *self = Actor::Waiting {
            request,
            cancel_at: timeout.map(|t| now + t),
        };
    }

    /// Its request was granted: hold it (a leased hold may extend its lease midway; no long
    /// hold once `calm`: liveness has a bound).
    pub(super) fn granted(
        &mut self,
        rng: &mut SimRng,
        now: Instant,
        w: &RaftWorkload,
        leased: bool,
        calm: bool,
    ) {
        let Actor::Waiting { request, .. } = *self else {
            return;
        };
        let hold = if !calm && rng.chance(w.long_hold) {
            Duration::from_millis(rng.between(2_000, 6_000))
        } else {
            Duration::from_nanos(rng.between(1_000_000, nanos(w.max_hold).max(1_000_000)))
        };
        let extend_at = (leased && rng.chance(w.extend))
            .then(|| now + Duration::from_nanos(rng.below(nanos(hold).max(1))));
        *self = Actor::Holding {
            request,
            until: now + hold,
            extend_at,
        };
    }

    /// Its request ended without it (refused, lost, withdrawn): think again.
    pub(super) fn ended(&mut self, rng: &mut SimRng, now: Instant, w: &RaftWorkload) {
        *self = Actor::idle(rng, now, w);
    }
}
