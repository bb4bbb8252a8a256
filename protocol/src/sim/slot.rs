//! The simulated nodes: a slot per node, running one incarnation at a time.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use conclave_lock_api::{MemberId, RequestId};

use crate::endpoint::Endpoint;
use crate::time::Instant;

use super::clock::NodeClock;
use super::workload::Actor;

/// Whether a node slot runs.
#[derive(Debug)]
pub(super) enum SlotState {
    /// Not running; restarts as a new incarnation at the instant.
    Down { restart_at: Instant },
    /// Running.
    Up,
    /// Leaving gracefully since the instant; removed once drained.
    Leaving { since: Instant },
}

/// One simulated node: its current incarnation, what survives its restarts, and what the
/// checkers remember of it.
#[derive(Debug)]
pub(super) struct Slot {
    pub(super) addr: SocketAddr,
    pub(super) endpoint: Option<Endpoint>,
    pub(super) state: SlotState,
    pub(super) last_epoch: u64,
    /// Size of the last view this incarnation reported installing (events in order).
    pub(super) last_view_len: usize,
    /// `Majority`: since when (on this node's clock) its views have had no majority.
    pub(super) minority_since: Option<Instant>,
    /// When (on this node's clock) it last ran its due timers.
    pub(super) timers_ran: Option<Instant>,
    /// Its due timers wait until then (`SimConfig::late_timers`).
    pub(super) timers_late_until: Option<Instant>,
    /// The node's disk: the highest term it wrote (survives restarts).
    pub(super) disk_term: u64,
    pub(super) actors: Vec<Actor>,
    pub(super) next_owner: u64,
    /// Requests of this incarnation that were granted (a second grant is a violation).
    pub(super) granted: BTreeSet<RequestId>,
    /// This incarnation's clock.
    pub(super) clock: NodeClock,
    /// Paused (harsh profile) until this global instant.
    pub(super) stalled_until: Option<Instant>,
    /// Datagrams that arrived while paused, in order.
    pub(super) buffer: Vec<Vec<u8>>,
}

/// A crash whose exclusion is checked: the member, when it crashed, and by when every live
/// member must have excluded it.
#[derive(Debug)]
pub(super) struct Crash {
    pub(super) member: MemberId,
    pub(super) at: Instant,
    pub(super) deadline: Instant,
}
