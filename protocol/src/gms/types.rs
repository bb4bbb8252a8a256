//! What the membership state machine emits and reports: outputs, events, states, counters.

use std::net::SocketAddr;

use conclave_lock_api::wire::{Discovery, GmsMessage};
use conclave_lock_api::{MemberId, View};

/// Something the membership layer asks the caller to send.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum GmsOutput {
    /// Send `message` reliably to `to`.
    Send {
        /// The receiver.
        to: MemberId,
        /// The message.
        message: GmsMessage,
    },
    /// Send an unreliable heartbeat to `to`.
    Heartbeat {
        /// The receiver.
        to: MemberId,
        /// The highest view epoch we have heard of.
        epoch: u64,
        /// Epoch of our current view.
        view_epoch: u64,
        /// Incarnation of our current view's coordinator.
        coordinator: u128,
    },
    /// Send to the discovery channel (multicast group or seed list).
    Discover(Discovery),
    /// Send an unreliable discovery reply to an address.
    DiscoveryReply {
        /// The address of the pinging member.
        to: SocketAddr,
        /// The reply.
        discovery: Discovery,
    },
    /// `member` was excluded as failed: its reliable-delivery state can be dropped.
    Forget(MemberId),
}

/// How a view came to be, from the point of view of the member that installed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ViewOrigin {
    /// This member founded a new cluster (a view of one).
    Founded,
    /// This member, as coordinator, added or removed members.
    Changed,
    /// This member took over from a failed coordinator.
    TookOver,
    /// This member, as coordinator, merged other views into its own.
    Merged,
    /// The view was installed by another member (the coordinator) and received.
    Received,
}

/// Something that happened to this member's membership.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum GmsEvent {
    /// A new view was installed.
    ViewInstalled {
        /// The view.
        view: View,
        /// How it came to be.
        origin: ViewOrigin,
    },
    /// This member has left the cluster (graceful leave done, or timed out waiting for it).
    Left,
    /// This joiner cannot join (yet): see [`JoinProblem`]. It keeps looking; the caller
    /// decides whether to wait or give up.
    JoinProblem(JoinProblem),
}

/// Why a joiner has not joined, as [`GmsEvent::JoinProblem`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum JoinProblem {
    /// For the discovery timeout it heard of no cluster and no other joiner, and its
    /// [`Founding`](super::Founding) rule forbids founding alone.
    NobodyAnswered,
    /// A coordinator refused it: a setting every member must share differs.
    SettingMismatch {
        /// The coordinator that refused.
        coordinator: MemberId,
        /// The setting's name.
        setting: String,
        /// The coordinator's value.
        coordinator_value: String,
        /// This joiner's value.
        joiner_value: String,
    },
}

impl std::fmt::Display for JoinProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JoinProblem::NobodyAnswered => {
                f.write_str("no member of the cluster and no other joiner answered")
            }
            JoinProblem::SettingMismatch {
                coordinator,
                setting,
                coordinator_value,
                joiner_value,
            } => write!(
                f,
                "coordinator {coordinator} refused the join: {setting} is {coordinator_value} \
                 there and {joiner_value} here"
            ),
        }
    }
}

/// Where a member is in its life cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum MembershipState {
    /// Created, [`Gms::join`](super::Gms::join) not yet called.
    Idle,
    /// Looking for a coordinator or waiting for it to admit us.
    Joining,
    /// In a view.
    Member,
    /// Asked to leave, waiting for the coordinator's confirmation.
    Leaving,
    /// Gone; the state machine does nothing more.
    Left,
}

/// Counters of what the membership layer did, for reports and tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GmsStats {
    /// Views installed at this member (all origins).
    pub views_installed: u64,
    /// Clusters founded by this member.
    pub founded: u64,
    /// Joiners admitted by this member as coordinator.
    pub joins_accepted: u64,
    /// Members excluded as failed by this member as coordinator.
    pub members_excluded: u64,
    /// Graceful leaves accepted by this member as coordinator.
    pub leaves_accepted: u64,
    /// Takeovers of a failed coordinator by this member.
    pub takeovers: u64,
    /// Merge views installed by this member as merge leader.
    pub merges_led: u64,
    /// View deltas this member could not rebuild (no base, or a mismatch), so that it asked
    /// the sender for the full view.
    pub view_requests: u64,
    /// View deltas dropped for absurd sizes.
    pub view_deltas_dropped: u64,
    /// Joiners refused by this member as coordinator because a shared setting differs.
    pub joins_refused: u64,
    /// Merges not made by this member as coordinator because a shared setting differs.
    pub merges_refused: u64,
}

/// Test-only ways to break the protocol on purpose, proving the simulator's checkers can fail.
#[cfg(feature = "sim")]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Sabotage {
    /// Drop the view-id discipline: members apply received views whatever their epoch, and a
    /// merge view reuses the highest merged epoch instead of exceeding it.
    pub skip_view_epoch_check: bool,
    /// Never exclude suspected members as coordinator.
    pub never_exclude: bool,
    /// Count every heartbeat, and every reliable-layer frame, as a sign of life, whichever
    /// coordinator its sender follows (the bug that left members orphaned in views nobody
    /// coordinates after link cuts).
    pub ignore_lineage: bool,
}

#[cfg(feature = "sim")]
impl Sabotage {
    /// Whether received views are applied whatever their epoch.
    pub(crate) fn skips_epoch_check(&self) -> bool {
        self.skip_view_epoch_check
    }

    /// Whether suspected members are never excluded.
    pub(crate) fn never_excludes(&self) -> bool {
        self.never_exclude
    }

    /// Whether every heartbeat and frame is a sign of life.
    pub(crate) fn ignores_lineage(&self) -> bool {
        self.ignore_lineage
    }
}

/// Outside the simulator nothing is sabotaged: every rule holds.
#[cfg(not(feature = "sim"))]
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Sabotage {}

#[cfg(not(feature = "sim"))]
impl Sabotage {
    /// Never.
    pub(crate) fn skips_epoch_check(&self) -> bool {
        false
    }

    /// Never.
    pub(crate) fn never_excludes(&self) -> bool {
        false
    }

    /// Never.
    pub(crate) fn ignores_lineage(&self) -> bool {
        false
    }
}

/// Upper bound on the joiners, merge candidates, announcers and stray members remembered, so
/// discovery traffic from many (or forged) members costs bounded memory.
pub(super) const MAX_REMEMBERED: usize = 256;
