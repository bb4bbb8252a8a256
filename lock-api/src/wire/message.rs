//! Every message of the protocol, as serde types.

use serde::{Deserialize, Serialize};

use super::payload::Payload;
use crate::ids::{MemberId, OwnerId, RequestId};
use crate::lock::{FencingToken, LockMode, LockName, ServiceName};
use crate::view::View;

/// The most segments a [`Frame::Bundle`] carries; receivers drop larger bundles.
pub const MAX_BUNDLE: usize = 64;

/// What follows the fixed header of a datagram: who sent it and one frame.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Packet {
    /// The sending member (incarnation, name, address).
    pub sender: MemberId,
    /// The content.
    pub frame: Frame,
}

/// One unit of the protocol on the wire.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Frame {
    /// Unreliable discovery traffic (multicast or seed list).
    Discovery(Discovery),
    /// Unreliable liveness signal between view members.
    Heartbeat {
        /// The highest view epoch the sender has heard of (at least its current view's).
        epoch: u64,
        /// The epoch of the sender's current view (0 before it has one).
        #[serde(default)]
        view_epoch: u64,
        /// Incarnation of the coordinator of the sender's current view (0 before it has one).
        /// A receiver counts the heartbeat as a sign of life in its own view only if the
        /// sender follows the same coordinator (or is ahead of it); a member whose
        /// coordinator has moved on to another lineage stops hearing it and takes over.
        #[serde(default)]
        coordinator: u128,
        /// Lock-lease traffic riding on the heartbeat (`Majority` policy only).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lease: Option<LeaseBeat>,
    },
    /// Reliable layer: a fragment of a message.
    Data(Segment),
    /// Reliable layer: several segments of one stream in one datagram, in order (small
    /// messages queued for the same member at once: a release acknowledgement and a grant).
    /// At most [`MAX_BUNDLE`] segments.
    Bundle(Vec<Segment>),
    /// Reliable layer: cumulative acknowledgement.
    Ack(Ack),
}

/// Lease traffic of the `Majority` policy, carried by a heartbeat.
///
/// A grantor proves it may grant by probing the members of its view: it sends a probe in
/// every heartbeat round and counts a member as supporting it from the moment *it sent* a
/// probe that the member echoed. A member echoes only the coordinator of its view, promises
/// with the echo not to support any other grantor (or a lower term) for a while, and never
/// echoes a lower term than one it has echoed. See `docs/protocol.md`, "Leases".
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseBeat {
    /// The highest grantor term the sender has heard of.
    pub max_term: u64,
    /// From a grantor: a probe of its current term.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<Probe>,
    /// To a grantor: the latest probe of the receiver that the sender supports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub echo: Option<Probe>,
    /// To a grantor: the sender will never support the receiver's current term, having
    /// supported this term (equal or higher) of another grantor; the grantor must begin a
    /// higher term.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<u64>,
}

/// One probe of a grantor: its term and the number of the heartbeat round.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Probe {
    /// The grantor's term.
    pub term: u64,
    /// The round, increasing within the term.
    pub seq: u64,
}

/// Discovery traffic, sent to the discovery channel (multicast group or seed list) or in reply.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Discovery {
    /// A joining member looks for the cluster; every member answers with
    /// [`Discovery::Announce`] of its view.
    Ping,
    /// A coordinator advertises its current view periodically (coordinators that see each
    /// other's announcements merge their views); any member sends it in reply to a ping.
    Announce {
        /// The coordinator's current view.
        view: View,
        /// The incarnations of the other coordinators whose announcements the sender heard
        /// recently (at most 256): a coordinator merges another's view only once that one has
        /// heard it too, so a merge needs reachability both ways. Empty (and left out of the
        /// encoding) in an answer to a ping.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        heard: Vec<u128>,
        /// The settings every member of the sender's cluster shares (see [`SharedSetting`]):
        /// coordinators merge only views whose settings agree. Empty (left out of the
        /// encoding) from members that predate them.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        settings: Vec<SharedSetting>,
    },
}

/// The most [`SharedSetting`]s a message carries that a receiver looks at; the rest are ignored.
pub const SHARED_SETTINGS_MAX: usize = 32;

/// A setting every member of a cluster must share (the partition policy and cluster size, the
/// lease settings that mutual exclusion rests on, the protocol version), by name and value in
/// words. A joiner sends its settings in [`GmsMessage::Join`]; a coordinator whose value of a
/// setting both name differs refuses it ([`GmsMessage::JoinRefused`]). A setting only one side
/// names is not compared (a member of another version may name more or fewer).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedSetting {
    /// The setting's name, e.g. `partition_policy`.
    pub name: String,
    /// Its value, e.g. `Majority { cluster_size: 3 }`.
    pub value: String,
}

/// The first setting both lists name with different values: `(name, ours, theirs)`. Looks at
/// most at [`SHARED_SETTINGS_MAX`] entries of each.
pub fn first_setting_mismatch<'a>(
    ours: &'a [SharedSetting],
    theirs: &'a [SharedSetting],
) -> Option<(&'a str, &'a str, &'a str)> {
    let theirs = &theirs[..theirs.len().min(SHARED_SETTINGS_MAX)];
    ours.iter().take(SHARED_SETTINGS_MAX).find_map(|our| {
        theirs
            .iter()
            .find(|their| their.name == our.name && their.value != our.value)
            .map(|their| (our.name.as_str(), our.value.as_str(), their.value.as_str()))
    })
}

/// A fragment of an encoded [`Message`] on one reliable stream from the sender to `to`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Segment {
    /// Incarnation of the intended receiver; a restarted receiver drops segments of its past.
    pub to: u128,
    /// Stream number, increasing per sender whenever it starts a new stream to a receiver.
    pub stream: u64,
    /// Lowest sequence number the sender has not seen acknowledged on this stream.
    pub base: u64,
    /// Sequence number of this segment; consecutive fragments have consecutive numbers.
    pub seq: u64,
    /// Index of this fragment within its message, from 0.
    pub fragment: u32,
    /// Number of fragments of the message (at least 1).
    pub fragments: u32,
    /// The fragment's bytes.
    pub payload: Payload,
    /// An acknowledgement riding along: of the receiver's own stream to the sender. It saves
    /// the separate [`Frame::Ack`] datagram a request/response exchange would otherwise cost.
    /// Left out of the encoding when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ack: Option<StreamAck>,
}

/// A cumulative acknowledgement carried by a [`Segment`]. The stream acknowledged is the one
/// the segment's receiver sends to the segment's sender, so its incarnation is the segment's
/// `to` and needs no field of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StreamAck {
    /// The stream acknowledged.
    pub stream: u64,
    /// Every segment with a lower sequence number was received.
    pub next_expected: u64,
}

/// Cumulative acknowledgement of a reliable stream.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// Incarnation of the stream's sender (the receiver of this ack).
    pub to: u128,
    /// The stream acknowledged.
    pub stream: u64,
    /// Every segment with a lower sequence number was received.
    pub next_expected: u64,
}

/// A message carried reliably, in order, between two members.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Message {
    /// Group membership.
    Gms(GmsMessage),
    /// Locking, in the node's default lock service.
    Lock(LockMessage),
    /// Locking, in a named lock service: an independent namespace with its own grantor.
    Service {
        /// The service.
        service: ServiceName,
        /// The message, as in the default service.
        message: LockMessage,
    },
}

/// Group membership messages.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum GmsMessage {
    /// A joiner asks the coordinator to be added to the view (members that predate
    /// [`GmsMessage::Join`]; admitted without comparing settings).
    JoinRequest,
    /// The receiver is not a coordinator; the joiner should discover again.
    NotCoordinator,
    /// A member asks the coordinator to be removed from the view.
    LeaveRequest,
    /// The coordinator installs a view (also a merge view) at every member in it.
    InstallView {
        /// The view to install.
        view: View,
    },
    /// Sent by a coordinator to a member it removed at that member's request.
    LeaveAccepted {
        /// Epoch of the first view without the leaver.
        epoch: u64,
    },
    /// The coordinator installs a view at a member that has the view's base: the new view is
    /// the base's members without `left`, in the base's order, then `joined`, in this order.
    /// It costs bytes in proportion to the change, not to the view, so that one view change
    /// costs bytes linear in the cluster size. A receiver that has no view with digest
    /// `base_digest` (see [`View::digest`]), or whose rebuilt view's digest is not `digest`,
    /// installs nothing and answers [`GmsMessage::ViewRequest`].
    InstallViewDelta {
        /// The new view's epoch.
        epoch: u64,
        /// The base view's epoch.
        base_epoch: u64,
        /// The base view's digest.
        base_digest: u64,
        /// Incarnations of the base's members that are not in the new view.
        left: Vec<u128>,
        /// The members appended after the base's remaining members.
        joined: Vec<MemberId>,
        /// The new view's digest.
        digest: u64,
    },
    /// A member could not rebuild a view from an [`GmsMessage::InstallViewDelta`]: it asks the
    /// sender, if it still coordinates, for its current view in full
    /// ([`GmsMessage::InstallView`]).
    ViewRequest {
        /// The epoch of the delta that could not be applied.
        epoch: u64,
    },
    /// A joiner asks the coordinator to be added to the view, with the settings it must
    /// share with the cluster.
    Join {
        /// The joiner's shared settings.
        settings: Vec<SharedSetting>,
    },
    /// The coordinator refuses a joiner whose shared setting differs from its own.
    JoinRefused {
        /// The setting's name.
        setting: String,
        /// The coordinator's value.
        coordinator_value: String,
        /// The joiner's value, as the coordinator received it.
        joiner_value: String,
    },
}

/// The most locks a [`LockMessage::Table`] answer carries (the rest is cut, `truncated`).
pub const TABLE_LOCKS_MAX: usize = 4096;

/// One lock of the grantor's table, as [`LockMessage::Table`] carries it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableLock {
    /// The lock.
    pub name: LockName,
    /// Its holders (one exclusive, or any number of shared).
    pub holders: Vec<TableHolder>,
    /// Its waiters, in queue order (the first is granted next).
    pub waiters: Vec<TableWaiter>,
}

/// A holder in a [`TableLock`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableHolder {
    /// The owner.
    pub owner: OwnerId,
    /// The mode held.
    pub mode: LockMode,
    /// The fencing token of its grant.
    pub token: FencingToken,
    /// What remains of the hold's lease on the grantor's clock when the table was taken, in
    /// milliseconds (`None`: the hold has no lease of its own and lasts until released).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
}

/// A waiter in a [`TableLock`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TableWaiter {
    /// The owner.
    pub owner: OwnerId,
    /// The mode asked for.
    pub mode: LockMode,
}

/// A lock held by a member, reported during reconciliation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReportedHold {
    /// The request that acquired the lock; with the member it names the grant.
    pub request: RequestId,
    /// The lock.
    pub name: LockName,
    /// The holding owner.
    pub owner: OwnerId,
    /// The mode held.
    pub mode: LockMode,
    /// The fencing token of the grant.
    pub token: FencingToken,
    /// What remains of the hold's own lease on the holder's clock when the report was sent,
    /// in milliseconds (`None`: no lease of its own). A new grantor frees the lock once this
    /// much (scaled up by the clock-rate margin) has passed on its own clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
}

/// A reported hold by its earlier name (the contract's `HeldLock` is what a member lists of its
/// own holds; this is what it reports to a grantor).
#[deprecated(since = "0.1.0", note = "renamed `ReportedHold`")]
pub type HeldLock = ReportedHold;

/// A lock request still waiting for an answer, reported during reconciliation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingRequest {
    /// The request.
    pub request: RequestId,
    /// The lock.
    pub name: LockName,
    /// The requesting owner.
    pub owner: OwnerId,
    /// The mode asked for.
    pub mode: LockMode,
    /// Whether the request waits in the queue (`false` for a try-lock).
    pub wait: bool,
    /// The lease asked for the hold, in milliseconds (`None`: until released).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
}

/// A release not yet acknowledged by a grantor, reported during reconciliation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingRelease {
    /// The request that acquired the lock being released.
    pub request: RequestId,
    /// The lock.
    pub name: LockName,
    /// The releasing owner.
    pub owner: OwnerId,
    /// Token of the grant being released.
    pub token: FencingToken,
}

/// How many fencing tokens a node grant reserves for its node's local acquisitions: the
/// grantor's next token after a node grant of token `T` is at least `T + NODE_GRANT_TOKENS`.
pub const NODE_GRANT_TOKENS: u64 = 4096;

/// The local owner number of a member's node owner: the owner of node grants (a lock cached at
/// the node, handed to its local owners without messages). Never a user's owner.
pub const NODE_OWNER: u64 = u64::MAX;

/// The view a grant was made in ([`LockMessage::Granted`]): a view id as it travels, the epoch
/// and the coordinator's incarnation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GrantView {
    /// The view's epoch.
    pub epoch: u64,
    /// The incarnation of the view's coordinator.
    pub coordinator: u128,
}

/// A grant made in advance for the waiter next in line (one-hop handoff): carried by
/// [`LockMessage::Designate`] to the holder and by [`LockMessage::Passed`] to the successor.
/// Its fields are those of the [`LockMessage::Granted`] the grantor would send.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Successor {
    /// The successor's member.
    pub member: MemberId,
    /// The successor's request.
    pub request: RequestId,
    /// The fencing token of the grant.
    pub token: FencingToken,
    /// The latest send stamp the grantor had received from the successor when it made the
    /// grant (under `Majority` the hold's lease runs from that stamp's send time).
    #[serde(default)]
    pub stamp: u64,
    /// The hold's own lease in milliseconds, if it asked for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
    /// The view the grant was made in.
    pub view: GrantView,
}

/// Locking messages between clients and the grantor.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LockMessage {
    /// Client → grantor: acquire; `wait: false` is TRY_LOCK (never queued).
    Lock {
        /// The request.
        request: RequestId,
        /// The lock.
        name: LockName,
        /// The requesting owner.
        owner: OwnerId,
        /// Exclusive or shared.
        mode: LockMode,
        /// Whether to queue when the lock is busy.
        wait: bool,
        /// The client's send stamp of this copy (see [`LockMessage::Renew`]); 0 for none.
        #[serde(default)]
        stamp: u64,
        /// A lease for the hold, in milliseconds: the grantor frees the lock this long after
        /// it grants it unless it was released before (`None`: held until released).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lease_ms: Option<u64>,
        /// The client does not want [`LockMessage::Queued`] if the request has to wait: it
        /// learns nothing from it that it uses (no one listens for waits, and it knows the
        /// lock is contended), and each one costs the grantor a datagram. Absent means
        /// `false`, so members that predate it still get `Queued`.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        quiet: bool,
        /// The client takes a one-hop handoff: it knows [`LockMessage::Designate`] and
        /// [`LockMessage::Passed`]. A grantor designates a successor only when both the
        /// holder and the successor said so (an older member would drop those messages).
        /// Absent means `false`.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        passes: bool,
    },
    /// Client → grantor: extend the lease of a hold to at least `lease_ms` from now (a
    /// reentrant re-lock with a lease). Answered, if the grantor has the hold, by
    /// [`LockMessage::Renewed`] naming the stamp and the request.
    ExtendLease {
        /// The request that acquired the hold.
        request: RequestId,
        /// The lock.
        name: LockName,
        /// The new lease, in milliseconds from when the grantor receives this.
        lease_ms: u64,
        /// The client's send stamp; the client's own deadline runs from the stamp's send time.
        stamp: u64,
    },
    /// Client → grantor (`Majority` only): renew the leases of these holds. The client
    /// remembers when it sent each stamp; an answer naming the stamp extends the lease of
    /// every hold it confirms to that send time plus the lease.
    Renew {
        /// The client's send stamp.
        stamp: u64,
        /// The requests whose grants the client holds.
        held: Vec<RequestId>,
    },
    /// Grantor → client: these holds are in my table and my term's lease is valid.
    Renewed {
        /// Echo of the renewal's stamp.
        stamp: u64,
        /// The holds confirmed (a subset of those the renewal named).
        held: Vec<RequestId>,
    },
    /// Client → grantor: withdraw a request; if it was granted meanwhile, release it.
    /// Answered by [`LockMessage::Denied`].
    Cancel {
        /// The request to withdraw.
        request: RequestId,
        /// The lock it asked for.
        name: LockName,
    },
    /// Client → grantor: release a held lock. Idempotent: releasing a grant the grantor does
    /// not know is acknowledged too.
    Unlock {
        /// The request that acquired the lock; it names the grant being released and is echoed
        /// by [`LockMessage::UnlockAck`].
        request: RequestId,
        /// The lock.
        name: LockName,
        /// The holder.
        owner: OwnerId,
        /// Token of the grant released.
        token: FencingToken,
        /// Nobody waits for the [`LockMessage::UnlockAck`] (a guard dropped, not awaited):
        /// the grantor may hold it back a few milliseconds to send it with its next message
        /// to the client, instead of in a datagram of its own. Absent means `false`, so members
        /// that predate it are answered at once.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        lazy: bool,
        /// The holder passed the lock straight on to its designated successor (one-hop
        /// handoff, [`LockMessage::Passed`]): the successor's request and the token of the
        /// grant passed, as the grantor's [`LockMessage::Designate`] named them. The grantor
        /// completes the handoff if that very designation still stands; otherwise it takes
        /// this as a plain release. Absent: a plain release.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        passed_to: Option<(RequestId, FencingToken)>,
    },
    /// Grantor → client: the request is granted.
    Granted {
        /// The request.
        request: RequestId,
        /// The lock.
        name: LockName,
        /// The fencing token of the grant.
        token: FencingToken,
        /// The latest send stamp the grantor had received from the client when it granted:
        /// under `Majority` the holder's lease runs from the moment it sent that stamp.
        #[serde(default)]
        stamp: u64,
        /// A node grant (the request's owner is the member's node owner) that reserves the
        /// block of [`NODE_GRANT_TOKENS`] tokens from `token` for the node's local
        /// acquisitions, and is revoked with [`LockMessage::Revoke`] when another owner asks.
        /// Absent (false) from a grantor without node caching: the grant is then a plain one.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        cached: bool,
        /// What is left of the hold's own lease on the grantor's clock as it sends this, in
        /// milliseconds (the whole lease for a new grant; less for a grant sent again). The
        /// holder counts it from the send time of `stamp`. Absent for a hold without a lease.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        lease_ms: Option<u64>,
        /// The view the grant was made in: its epoch and its coordinator's incarnation. Under
        /// `Available` a member accepts a grant only for the view it is in (a grantor that
        /// moved to another lineage of views may grant there to a member it still serves
        /// here). Absent from members that predate it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        view: Option<GrantView>,
    },
    /// Grantor → member: another owner asks for a lock this member holds as a node grant;
    /// return it as soon as no local owner holds it.
    Revoke {
        /// The node grant's request.
        request: RequestId,
        /// The lock.
        name: LockName,
        /// The token of the grant in the grantor's table (a revoke of an older grant is
        /// stale).
        token: FencingToken,
    },
    /// Grantor → client: the request waits in the queue, behind `position − 1` other waiters
    /// (and at least one holder). Sent once, when the grantor queues it; never for a request
    /// granted at once.
    Queued {
        /// The request.
        request: RequestId,
        /// Its place in the queue when it was queued, from 1.
        position: u32,
    },
    /// Grantor → client: the request is refused (try-lock of a busy lock) or withdrawn (answer
    /// to [`LockMessage::Cancel`]).
    Denied {
        /// The request.
        request: RequestId,
        /// The lock.
        name: LockName,
        /// Not busy: the grantor cannot grant anything right now (a new grantor rebuilding its
        /// table or waiting out earlier leases, or one without a majority's support).
        #[serde(default)]
        unavailable: bool,
    },
    /// Grantor → client: a release was applied.
    UnlockAck {
        /// The request that acquired the released lock.
        request: RequestId,
    },
    /// New grantor → every member: report your locks (reconciliation).
    LockInfoRequest {
        /// Epoch of the view the grantor reconciles for.
        epoch: u64,
    },
    /// Member → new grantor: held locks, pending requests and pending releases.
    LockInfoResponse {
        /// Echo of the request's epoch.
        epoch: u64,
        /// Locks held by owners of this member.
        held: Vec<ReportedHold>,
        /// Requests waiting for an answer.
        pending: Vec<PendingRequest>,
        /// Releases not yet acknowledged.
        releases: Vec<PendingRelease>,
    },
    /// Grantor → every member of its view: it serves (reconciled, and under `Majority` its
    /// term is supported and past its grace period) for the view of `epoch`.
    Serving {
        /// Epoch of the grantor's view.
        epoch: u64,
    },
    /// Client → its new grantor, after its grantor changed: the requests it holds and waits
    /// for; the grantor forgets any other hold or wait of this member in its table (left
    /// over from before the member moved away and back).
    Holding {
        /// Requests this member holds.
        held: Vec<RequestId>,
        /// Requests this member waits for.
        pending: Vec<RequestId>,
        /// The newest request this member had made when it sent this: requests after it are
        /// not spoken for (a statement delivered late must not drop what was asked since).
        /// Absent from older members: then it speaks for every request.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        upto: Option<RequestId>,
    },
    /// Client → grantor: send me your lock table (inspection).
    TableRequest {
        /// The asker's number for the question, echoed in the answer.
        query: u64,
    },
    /// Grantor → client: its lock table (at most [`TABLE_LOCKS_MAX`] locks), or `unavailable`
    /// if it does not serve now.
    Table {
        /// Echo of the request's number.
        query: u64,
        /// Epoch of the grantor's view.
        epoch: u64,
        /// The grantor cannot answer now (not serving: reconciling, or not the grantor).
        unavailable: bool,
        /// More locks exist than were sent.
        truncated: bool,
        /// The locks with holders or waiters, by name.
        locks: Vec<TableLock>,
    },
    /// Member → its grantor: make me the grantor of this view (`become_grantor`). Answered by
    /// a [`LockMessage::Handoff`] to the asker, or by [`LockMessage::NotGrantor`].
    TransferRequest {
        /// Epoch of the asker's view.
        epoch: u64,
        /// The incarnation of the view's coordinator: with the epoch, the view's id (views of
        /// different coordinators may share an epoch and members; nothing is accepted on an
        /// epoch alone). Absent (0) from members that predate it, which then match no view.
        #[serde(default)]
        coordinator: u128,
    },
    /// Old grantor → new grantor: the whole lock table, handed over directly (no
    /// reconciliation). The old grantor grants nothing from the moment it sends this.
    Handoff {
        /// Epoch of the view the table belongs to.
        epoch: u64,
        /// The incarnation of the view's coordinator: with the epoch, the view's id (views of
        /// different coordinators may share an epoch and members; nothing is accepted on an
        /// epoch alone). Absent (0) from members that predate it, which then match no view.
        #[serde(default)]
        coordinator: u128,
        /// The high half of the old grantor's fencing tokens.
        token_epoch: u64,
        /// The highest token the old grantor issued or reserved: every later one exceeds it.
        last_token: FencingToken,
        /// Every hold (its lease as what is left of it on the old grantor's clock).
        held: Vec<ReportedHold>,
        /// Every waiter, lock by lock in queue order.
        waiting: Vec<PendingRequest>,
        /// The new grantor's turn in this view: one more than the old grantor's (the
        /// coordinator's reconciled table is turn 0).
        #[serde(default)]
        generation: u64,
    },
    /// New grantor → every member of its view: the grantor role of the view of `epoch` moved
    /// here; send your requests, releases and table queries to me.
    Transferred {
        /// Epoch of the view.
        epoch: u64,
        /// The incarnation of the view's coordinator: with the epoch, the view's id (views of
        /// different coordinators may share an epoch and members; nothing is accepted on an
        /// epoch alone). Absent (0) from members that predate it, which then match no view.
        #[serde(default)]
        coordinator: u128,
        /// The new grantor's turn in this view (see [`LockMessage::Handoff`]): members
        /// follow the highest they heard of, so a late announcement of an earlier turn is
        /// ignored.
        #[serde(default)]
        generation: u64,
    },
    /// Former grantor → member: I do not grant in the view of `epoch` any more; ask
    /// `grantor` (the answer to anything sent to a grantor after it handed its table over).
    NotGrantor {
        /// Epoch of the view.
        epoch: u64,
        /// The incarnation of the view's coordinator: with the epoch, the view's id (views of
        /// different coordinators may share an epoch and members; nothing is accepted on an
        /// epoch alone). Absent (0) from members that predate it, which then match no view.
        #[serde(default)]
        coordinator: u128,
        /// The member the table was handed to.
        grantor: MemberId,
        /// That member's turn as grantor in this view.
        #[serde(default)]
        generation: u64,
    },
    /// Grantor → client: another holder of this lock was kept; yours is lost.
    DuplicateLock {
        /// The lock.
        name: LockName,
        /// The owner that lost it.
        owner: OwnerId,
        /// Token of the lost grant.
        token: FencingToken,
    },
    // New variants go last: in the compact form (version 4) a variant is its index.
    /// Grantor → holder (one-hop handoff): when you release `request`, pass the lock straight
    /// to `next` (a grant the grantor has already made, to take effect at your release), and
    /// say so in your release; `None` withdraws an earlier designation. The grantor stays the
    /// authority: it records the grant, and sends it itself if the release comes without it.
    Designate {
        /// The holder's request (the hold this designation follows).
        request: RequestId,
        /// The lock.
        name: LockName,
        /// The successor's grant, or `None`: release to the grantor as usual.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<Successor>,
    },
    /// Holder → successor (one-hop handoff): the grantor's grant of the successor's request,
    /// delivered by the holder as it releases. The successor takes it exactly as a
    /// [`LockMessage::Granted`] from `grantor`: only while it still waits for that request,
    /// from its own grantor, for its own view.
    Passed {
        /// The grantor that made the grant.
        grantor: MemberId,
        /// The lock.
        name: LockName,
        /// The grant.
        grant: Successor,
    },
}
