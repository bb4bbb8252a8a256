//! Group membership: discovery, join, leave, failure detection, takeover and merge.
//!
//! [`Gms`] is a sans-IO state machine. It decides which view a member is in; it does not move
//! bytes. Its outputs name what to send and how: reliably to a member ([`GmsOutput::Send`],
//! through [`crate::reliable`]), as an unreliable heartbeat, or on the discovery channel. The
//! [`crate::Endpoint`] wires it to the reliable layer and the wire format.
//!
//! The rules, in short (`docs/protocol.md` has the full state machine):
//! - The coordinator is the first member of the view. Only a coordinator installs views, and a
//!   member applies a view only if its epoch is higher than the epoch of its current view.
//! - A joiner pings the discovery channel; every member answers with its view; the joiner asks
//!   the coordinator of the first view it hears of to join. With no answer for the discovery
//!   timeout, the lowest-id joiner founds a cluster of its own (any joiner does after twice
//!   that), at an epoch above every epoch it heard of.
//! - The coordinator admits the joins that arrive within [`GmsConfig::join_batch`] of each other
//!   in one view.
//! - The coordinator and every member heartbeat each other; each other member also heartbeats
//!   the next [`WATCHERS`] members of the view, so it *watches* the coordinator and the
//!   [`WATCHERS`] members ranked just before it. The coordinator excludes members it has not
//!   heard from for the suspect timeout; a member that suspects the coordinator and every member
//!   ranked before it takes over and installs a view without them (a member ranked before it
//!   that it does not watch counts as suspected once the coordinator has been suspected for a
//!   further suspect timeout: had it lived, it would have taken over by then).
//! - Coordinators announce their view on the discovery channel. A coordinator that hears
//!   another coordinator's announcement, and no coordinator with a lower id, installs a merge
//!   view: its members, then the other views' members, with an epoch above all of them.
//!
//! ```
//! use conclave_lock_api::MemberId;
//! use conclave_protocol::gms::{Gms, GmsConfig, GmsEvent, GmsOutput};
//! use conclave_protocol::Instant;
//!
//! let me = MemberId::new(1, "a", "127.0.0.1:7800".parse()?)?;
//! let mut gms = Gms::new(me.clone(), GmsConfig::local());
//! let mut now = Instant::ZERO;
//! gms.join(now);
//! // Nobody answers the pings: after the discovery timeout the member founds its own cluster.
//! while gms.view().is_none() {
//!     now = gms.poll_timeout().expect("a joiner always has a timer");
//!     gms.handle_timeout(now);
//!     while let Some(_output) = gms.poll_output() {} // a real driver sends these
//! }
//! assert!(matches!(gms.poll_event(), Some(GmsEvent::ViewInstalled { .. })));
//! assert_eq!(gms.view().map(|v| v.coordinator()), Some(&me));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod config;
mod delta;
mod types;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use conclave_lock_api::wire::{first_setting_mismatch, Discovery, GmsMessage, SharedSetting};
use conclave_lock_api::{MemberId, View};
use tracing::{debug, info, trace, warn};

use crate::time::Instant;

use delta::{Bases, DeltaError};

pub use config::{Founding, GmsConfig, GmsConfigError};
#[cfg(feature = "sim")]
pub use types::Sabotage;
pub use types::{GmsEvent, GmsOutput, GmsStats, JoinProblem, MembershipState, ViewOrigin};

/// Upper bound on the joiners and merge candidates remembered, so discovery traffic from many
/// (or forged) members costs bounded memory.
const MAX_REMEMBERED: usize = 256;

/// How often a refused join or merge is logged at most.
const MISMATCH_LOG_INTERVAL: std::time::Duration = std::time::Duration::from_secs(10);

/// How many ring successors a member other than the coordinator heartbeats (and so how many
/// ring predecessors it watches, besides the coordinator). A takeover needs the member to know
/// that everyone ranked before it is gone: with two, a crash of the coordinator together with
/// the next one or two members is taken over within the suspect timeout; larger crashes wait
/// one more suspect timeout.
pub const WATCHERS: usize = 2;

#[derive(Debug)]
enum Phase {
    Idle,
    Joining(Joining),
    Member,
    Leaving { deadline: Instant },
    Left,
}

#[derive(Debug)]
struct Joining {
    started: Instant,
    next_ping: Instant,
    /// The coordinator we asked to join, and when.
    target: Option<(MemberId, Instant)>,
    /// Other joiners heard pinging; the lowest id founds the cluster.
    joiners: BTreeSet<MemberId>,
    /// When a member of an existing cluster last answered: no founding soon after that.
    last_announce: Option<Instant>,
    /// Whether [`JoinProblem::NobodyAnswered`] was reported (once per join).
    reported_alone: bool,
    /// Whether a coordinator refused us for a setting: we never found a cluster then (it
    /// would be one of members that disagree with the cluster found).
    refused: bool,
}

/// What a member's heartbeats said of the view it is in.
#[derive(Clone, Copy, Debug, Default)]
struct HeardView {
    /// The highest `view_epoch` heard: a view that only removes members exceeds those of its
    /// members, not every epoch heard (so a member cut off alone does not climb above the side
    /// that kept the cluster).
    epoch: u64,
    /// The coordinator (incarnation) the last heartbeat named: a member that follows another
    /// coordinator is in another lineage of views.
    coordinator: u128,
}

/// The group membership state machine of one member.
#[derive(Debug)]
pub struct Gms {
    local: MemberId,
    config: GmsConfig,
    phase: Phase,
    view: Option<View>,
    /// Highest epoch seen anywhere; founding, join and merge views exceed it so that every
    /// member accepts them.
    max_epoch_seen: u64,
    /// What the heartbeats of each member of the view said of its own view.
    heard_views: BTreeMap<MemberId, HeardView>,
    /// When each member of the current view was last heard from.
    last_heard: BTreeMap<MemberId, Instant>,
    /// Members whose heartbeats show that they follow another coordinator than ours (another
    /// lineage of views), since when. Such a member is alive but not in our view in any sense
    /// that matters: after the suspect timeout it is suspected like a silent one.
    stray_since: BTreeMap<MemberId, Instant>,
    next_heartbeat: Option<Instant>,
    next_announce: Option<Instant>,
    /// As coordinator: when the join requests collected so far are admitted.
    admit_at: Option<Instant>,
    /// The members whose silence this member judges: everyone but itself as coordinator, else
    /// the coordinator and its [`WATCHERS`] ring predecessors.
    watched: BTreeSet<MemberId>,
    pending_joins: Vec<MemberId>,
    pending_leaves: BTreeSet<MemberId>,
    /// The view this member handed to the next member when it left as coordinator, unless
    /// it keeps a member last heard following another coordinator.
    handover: Option<View>,
    /// Other coordinators heard announcing, with their view, when, and whether that
    /// announcement said it had heard this member's (a merge needs both).
    merge_candidates: BTreeMap<MemberId, (View, Instant, bool)>,
    /// As coordinator: the other coordinators heard announcing (by incarnation), and when.
    announcers: BTreeMap<u128, Instant>,
    /// The recent views (installed or received) that view deltas can be rebuilt from.
    bases: Bases,
    /// When a dropped delta was last logged (such logs are rate-limited).
    delta_logged: Option<Instant>,
    /// When this member may found a cluster.
    founding: Founding,
    /// The settings every member of the cluster must share; joins and merges compare them.
    settings: Vec<SharedSetting>,
    /// When a refused join or merge was last logged (rate-limited).
    mismatch_logged: Option<Instant>,
    outputs: VecDeque<GmsOutput>,
    events: VecDeque<GmsEvent>,
    stats: GmsStats,
    rng: u64,
    #[cfg(feature = "sim")]
    sabotage: Sabotage,
}

impl Gms {
    /// A member that has not joined yet. Call [`Gms::join`] to start.
    pub fn new(local: MemberId, config: GmsConfig) -> Self {
        // Jitter only needs to differ between members: the random incarnation id seeds it.
        let rng = (local.incarnation() as u64) ^ ((local.incarnation() >> 64) as u64) | 1;
        Self {
            local,
            config,
            phase: Phase::Idle,
            view: None,
            max_epoch_seen: 0,
            heard_views: BTreeMap::new(),
            last_heard: BTreeMap::new(),
            stray_since: BTreeMap::new(),
            next_heartbeat: None,
            next_announce: None,
            admit_at: None,
            watched: BTreeSet::new(),
            pending_joins: Vec::new(),
            pending_leaves: BTreeSet::new(),
            handover: None,
            merge_candidates: BTreeMap::new(),
            announcers: BTreeMap::new(),
            bases: Bases::default(),
            delta_logged: None,
            founding: Founding::default(),
            settings: Vec::new(),
            mismatch_logged: None,
            outputs: VecDeque::new(),
            events: VecDeque::new(),
            stats: GmsStats::default(),
            rng,
            #[cfg(feature = "sim")]
            sabotage: Sabotage::default(),
        }
    }

    /// Breaks the protocol on purpose (simulator tests of the checkers only).
    #[cfg(feature = "sim")]
    pub fn set_sabotage(&mut self, sabotage: Sabotage) {
        self.sabotage = sabotage;
    }

    /// Sets when this member may found a cluster (default [`Founding::Alone`]). Call before
    /// [`Gms::join`].
    pub fn set_founding(&mut self, founding: Founding) {
        self.founding = founding;
    }

    /// Sets the settings every member of the cluster must share (default: none). A joiner
    /// sends them with its join request; as coordinator this member refuses joiners whose
    /// settings differ ([`GmsMessage::JoinRefused`]) and does not merge with views announced
    /// with other settings. At most [`SHARED_SETTINGS_MAX`](conclave_lock_api::wire::SHARED_SETTINGS_MAX)
    /// are compared.
    pub fn set_shared_settings(&mut self, settings: Vec<SharedSetting>) {
        self.settings = settings;
    }

    /// The settings set by [`Gms::set_shared_settings`].
    pub fn shared_settings(&self) -> &[SharedSetting] {
        &self.settings
    }

    /// The highest view epoch this member has heard of (its own view's, or any seen in a
    /// heartbeat, announcement or view).
    pub fn max_epoch_seen(&self) -> u64 {
        self.max_epoch_seen
            .max(self.view.as_ref().map_or(0, View::epoch))
    }

    /// This member's id.
    pub fn local(&self) -> &MemberId {
        &self.local
    }

    /// The configuration.
    pub fn config(&self) -> &GmsConfig {
        &self.config
    }

    /// The current view, once joined.
    pub fn view(&self) -> Option<&View> {
        self.view.as_ref()
    }

    /// Whether this member coordinates its current view.
    pub fn is_coordinator(&self) -> bool {
        matches!(self.phase, Phase::Member)
            && self
                .view
                .as_ref()
                .is_some_and(|v| v.coordinator() == &self.local)
    }

    /// Where this member is in its life cycle.
    pub fn state(&self) -> MembershipState {
        match self.phase {
            Phase::Idle => MembershipState::Idle,
            Phase::Joining(_) => MembershipState::Joining,
            Phase::Member => MembershipState::Member,
            Phase::Leaving { .. } => MembershipState::Leaving,
            Phase::Left => MembershipState::Left,
        }
    }

    /// Counters of what this member did.
    pub fn stats(&self) -> GmsStats {
        self.stats
    }

    /// Starts looking for the cluster. Does nothing unless [`MembershipState::Idle`].
    pub fn join(&mut self, now: Instant) {
        if !matches!(self.phase, Phase::Idle) {
            return;
        }
        debug!(member = %self.local, "joining");
        self.phase = Phase::Joining(Joining {
            started: now,
            next_ping: now,
            target: None,
            joiners: BTreeSet::new(),
            last_announce: None,
            reported_alone: false,
            refused: false,
        });
        self.handle_timeout(now);
    }

    /// Leaves the cluster gracefully.
    ///
    /// A coordinator hands the view to the next member and is gone at once (the caller should
    /// keep delivering until the reliable layer has flushed; [`Gms::handover`] is that view,
    /// for the lock layer's table to follow). Any other member asks the
    /// coordinator and leaves on its confirmation or after [`GmsConfig::leave_timeout`].
    pub fn leave(&mut self, now: Instant) {
        match self.phase {
            Phase::Idle | Phase::Joining(_) => self.set_left(),
            Phase::Member => {
                let Some(view) = self.view.clone() else {
                    return self.set_left();
                };
                if view.coordinator() == &self.local {
                    let rest: Vec<MemberId> = view
                        .members()
                        .iter()
                        .filter(|m| **m != self.local)
                        .cloned()
                        .collect();
                    if !rest.is_empty() {
                        let epoch = self.next_epoch();
                        if let Ok(next) = View::new(epoch, rest) {
                            info!(member = %self.local, view = %next, "coordinator leaving, handing over");
                            // In full: a member that could not rebuild a delta would ask a
                            // coordinator that is gone.
                            self.send_view_to_members(&next, None);
                            if !self.merges_another_lineage(&next) {
                                self.handover = Some(next);
                            }
                        }
                    }
                    self.set_left();
                } else {
                    self.outputs.push_back(GmsOutput::Send {
                        to: view.coordinator().clone(),
                        message: GmsMessage::LeaveRequest,
                    });
                    self.phase = Phase::Leaving {
                        deadline: now + self.config.leave_timeout,
                    };
                }
            }
            Phase::Leaving { .. } | Phase::Left => {}
        }
    }

    /// The view this member handed to the next member when it left as coordinator
    /// ([`Gms::leave`]), for its lock table to follow: `None` if it left otherwise, or if the
    /// view keeps a member last heard following another coordinator (that member may hold
    /// locks of another lineage, which the successor learns only by reconciling).
    pub fn handover(&self) -> Option<&View> {
        self.handover.as_ref()
    }

    /// Records that a heartbeat (or a membership message) arrived from `from`: it is alive.
    /// (Discovery traffic does not count; see [`Gms::handle_discovery`].)
    pub fn note_alive(&mut self, now: Instant, from: &MemberId) {
        if let Some(at) = self.last_heard.get_mut(from) {
            *at = (*at).max(now);
        }
    }

    /// Handles a heartbeat from `from`, who has heard of views up to `epoch` and is in the
    /// view `view_epoch` coordinated by the member with incarnation `coordinator`.
    ///
    /// The heartbeat is a sign of life only if the sender follows our coordinator, or is in a
    /// newer view of another coordinator while it is not our coordinator (we are probably
    /// about to receive that view). Otherwise the sender lives in another lineage of views:
    /// our coordinator that moved on to someone else's view, or a member left behind in a
    /// view we abandoned. Such a member is suspected after the suspect timeout even though it
    /// keeps talking to us, so that two members cannot keep each other in stale views forever
    /// (one takes over and the views merge).
    ///
    /// A fellow member that follows our coordinator in another view than ours (one of us has
    /// not installed the latest view yet) is alive, but stray from its first such heartbeat
    /// until one of us installs a view or it heartbeats from ours; this matters only once our
    /// coordinator is suspected. Two members left behind in different views of one coordinator
    /// that excluded them, each ranking the other before itself, would otherwise each wait for
    /// the other to take over for ever (found by the harsh `Majority` seed 257 with
    /// acknowledgements every fourth datagram). The coordinator's own heartbeats, and those a
    /// coordinator receives, are not judged by this: a view on its way is no sign of a stray
    /// member.
    pub fn handle_heartbeat(
        &mut self,
        now: Instant,
        from: &MemberId,
        epoch: u64,
        view_epoch: u64,
        coordinator: u128,
    ) {
        if !self.last_heard.contains_key(from) {
            return;
        }
        self.max_epoch_seen = self.max_epoch_seen.max(epoch);
        let heard = self.heard_views.entry(from.clone()).or_default();
        heard.epoch = heard.epoch.max(view_epoch);
        heard.coordinator = coordinator;
        let Some(view) = &self.view else { return };
        let ours = view.coordinator();
        let ignore = self.ignore_lineage();
        let follows = coordinator == ours.incarnation()
            || (view_epoch > view.epoch() && from != ours)
            || ignore;
        // A fellow member (not our coordinator, and we do not coordinate) in another view of
        // our coordinator: alive, but stray from now on until one of us installs a view. It
        // matters only once our coordinator is suspected (`maybe_take_over`).
        let left_behind = coordinator == ours.incarnation()
            && view_epoch != view.epoch()
            && from != ours
            && !self.is_coordinator();
        if ignore || (follows && !left_behind) {
            self.stray_since.remove(from);
        } else if self.stray_since.len() < MAX_REMEMBERED {
            self.stray_since.entry(from.clone()).or_insert(now);
        }
        if follows {
            self.note_alive(now, from);
        }
    }

    /// Handles discovery traffic from `from`.
    pub fn handle_discovery(&mut self, now: Instant, from: &MemberId, discovery: Discovery) {
        if from == &self.local {
            return;
        }
        // Discovery is not a sign of life: a coordinator that excluded us still announces to
        // us, and counting that would keep us from ever suspecting it.
        match discovery {
            Discovery::Ping => self.handle_ping(from),
            Discovery::Announce {
                view,
                heard,
                settings,
            } => self.handle_announce(now, from, view, &heard, &settings),
        }
    }

    /// Handles a membership message delivered reliably from `from`.
    pub fn handle_message(&mut self, now: Instant, from: &MemberId, message: GmsMessage) {
        self.note_alive(now, from);
        match message {
            GmsMessage::JoinRequest => self.handle_join_request(now, from, &[]),
            GmsMessage::Join { settings } => self.handle_join_request(now, from, &settings),
            GmsMessage::JoinRefused {
                setting,
                coordinator_value,
                joiner_value,
            } => {
                if let Phase::Joining(joining) = &mut self.phase {
                    if joining.target.as_ref().is_some_and(|(t, _)| t == from) {
                        joining.target = None;
                        joining.refused = true;
                        warn!(member = %self.local, coordinator = %from, %setting, %coordinator_value, %joiner_value, "join refused: a setting every member must share differs");
                        self.events.push_back(GmsEvent::JoinProblem(
                            JoinProblem::SettingMismatch {
                                coordinator: from.clone(),
                                setting,
                                coordinator_value,
                                joiner_value,
                            },
                        ));
                    }
                }
            }
            GmsMessage::NotCoordinator => {
                if let Phase::Joining(joining) = &mut self.phase {
                    if joining.target.as_ref().is_some_and(|(t, _)| t == from) {
                        joining.target = None;
                    }
                }
            }
            GmsMessage::LeaveRequest => self.handle_leave_request(now, from),
            GmsMessage::InstallView { view } => {
                self.bases.remember(&view);
                self.handle_view(now, from, view);
            }
            GmsMessage::InstallViewDelta {
                epoch,
                base_epoch,
                base_digest,
                left,
                joined,
                digest,
            } => {
                self.max_epoch_seen = self.max_epoch_seen.max(epoch);
                match self
                    .bases
                    .rebuild(epoch, base_epoch, base_digest, &left, &joined, digest)
                {
                    Ok(view) => {
                        self.bases.remember(&view);
                        self.handle_view(now, from, view);
                    }
                    Err(DeltaError::Absurd) => {
                        self.stats.view_deltas_dropped += 1;
                        if self.delta_logged.is_none_or(|at| {
                            now.saturating_duration_since(at) >= std::time::Duration::from_secs(1)
                        }) {
                            self.delta_logged = Some(now);
                            debug!(%from, epoch, left = left.len(), joined = joined.len(), "oversized view delta; dropped");
                        }
                    }
                    Err(error) => {
                        // Never a guessed view: ask the sender for the whole of it.
                        self.stats.view_requests += 1;
                        trace!(%from, epoch, ?error, "view delta not applicable; asking for the full view");
                        self.outputs.push_back(GmsOutput::Send {
                            to: from.clone(),
                            message: GmsMessage::ViewRequest { epoch },
                        });
                    }
                }
            }
            GmsMessage::ViewRequest { .. } => {
                // Only the coordinator's view is installed from it; a member that no longer
                // coordinates has nothing to give (the new coordinator sends its own view).
                if let Some(view) = self.view.as_ref().filter(|v| v.contains(from)) {
                    if self.is_coordinator() {
                        self.outputs.push_back(GmsOutput::Send {
                            to: from.clone(),
                            message: GmsMessage::InstallView { view: view.clone() },
                        });
                    }
                }
            }
            GmsMessage::LeaveAccepted { .. } => {
                if matches!(self.phase, Phase::Leaving { .. }) {
                    self.set_left();
                }
            }
        }
    }

    /// Advances timers: pings, heartbeats, suspicion, exclusion, takeover, announcements,
    /// merges. Calling it early or twice is harmless.
    pub fn handle_timeout(&mut self, now: Instant) {
        match &self.phase {
            Phase::Idle | Phase::Left => {}
            Phase::Joining(_) => self.joining_tick(now),
            Phase::Member => self.member_tick(now),
            Phase::Leaving { deadline } => {
                if now >= *deadline {
                    debug!(member = %self.local, "leave not confirmed in time; leaving anyway");
                    self.set_left();
                }
            }
        }
    }

    /// The next thing to send, if any.
    #[must_use]
    pub fn poll_output(&mut self) -> Option<GmsOutput> {
        self.outputs.pop_front()
    }

    /// The next membership event, if any.
    #[must_use]
    pub fn poll_event(&mut self) -> Option<GmsEvent> {
        self.events.pop_front()
    }

    /// When [`Gms::handle_timeout`] should next be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        match &self.phase {
            Phase::Idle | Phase::Left => None,
            Phase::Joining(j) => {
                let mut next = j.next_ping;
                if let Some((_, sent)) = &j.target {
                    next = next.min(*sent + self.config.join_timeout);
                } else if self.may_still_found_or_report(j) {
                    // The lowest joiner founds after one quiet discovery timeout, any joiner
                    // after two; the ping timer covers the first check. (A joiner that may
                    // not found has no such deadline once it reported: the ping timer checks
                    // for joiners heard since.)
                    let quiet_since = j.last_announce.map_or(j.started, |t| t.max(j.started));
                    next = next.min(quiet_since + self.config.discovery_timeout * 2);
                }
                Some(next)
            }
            Phase::Member => [self.next_heartbeat, self.next_announce, self.admit_at]
                .into_iter()
                .flatten()
                .min(),
            Phase::Leaving { deadline } => Some(*deadline),
        }
    }

    /// Whether a joiner's founding deadline can still lead to a founding or a report.
    fn may_still_found_or_report(&self, joining: &Joining) -> bool {
        if joining.refused {
            return false;
        }
        let alone = joining.joiners.is_empty();
        match self.founding {
            Founding::Alone => true,
            Founding::WithOthers => !alone || !joining.reported_alone,
            Founding::Never => alone && !joining.reported_alone,
        }
    }

    fn handle_ping(&mut self, from: &MemberId) {
        match &mut self.phase {
            Phase::Joining(joining) if joining.joiners.len() < MAX_REMEMBERED => {
                joining.joiners.insert(from.clone());
            }
            Phase::Member => {
                // The coordinator answers, and so do the members next in line to take over: a
                // joiner that hears of an existing cluster (and its epoch) does not found a
                // new one while the cluster replaces a dead coordinator. The others keep
                // quiet, so a ping costs a few answers, not one per member.
                let in_line = self
                    .view
                    .as_ref()
                    .and_then(|v| v.rank(&self.local))
                    .is_some_and(|rank| rank <= WATCHERS);
                if let Some(view) = self.view.as_ref().filter(|_| in_line) {
                    self.outputs.push_back(GmsOutput::DiscoveryReply {
                        to: from.addr(),
                        discovery: Discovery::Announce {
                            view: view.clone(),
                            heard: Vec::new(),
                            settings: self.settings.clone(),
                        },
                    });
                }
            }
            _ => {}
        }
    }

    fn handle_announce(
        &mut self,
        now: Instant,
        from: &MemberId,
        view: View,
        heard: &[u128],
        settings: &[SharedSetting],
    ) {
        self.max_epoch_seen = self.max_epoch_seen.max(view.epoch());
        let is_coordinator = self.is_coordinator();
        match &mut self.phase {
            Phase::Joining(joining) => {
                joining.last_announce = Some(now);
                if joining.target.is_none() {
                    let coordinator = view.coordinator().clone();
                    debug!(member = %self.local, %coordinator, "asking to join");
                    joining.target = Some((coordinator.clone(), now));
                    self.outputs.push_back(GmsOutput::Send {
                        to: coordinator,
                        message: GmsMessage::Join {
                            settings: self.settings.clone(),
                        },
                    });
                }
            }
            Phase::Member if is_coordinator && view.coordinator() == from => {
                if self.announcers.len() < MAX_REMEMBERED
                    || self.announcers.contains_key(&from.incarnation())
                {
                    self.announcers.insert(from.incarnation(), now);
                }
                if let Some((setting, ours, theirs)) =
                    first_setting_mismatch(&self.settings, settings)
                {
                    self.stats.merges_refused += 1;
                    if self
                        .mismatch_logged
                        .is_none_or(|at| now.saturating_duration_since(at) >= MISMATCH_LOG_INTERVAL)
                    {
                        self.mismatch_logged = Some(now);
                        warn!(member = %self.local, coordinator = %from, setting, ours, theirs, "not merging with a view whose settings differ");
                    }
                    return;
                }
                let differs = self.view.as_ref().is_some_and(|v| v.id() != view.id());
                let room = self.merge_candidates.len() < MAX_REMEMBERED
                    || self.merge_candidates.contains_key(from);
                if differs && room {
                    let hears_us = heard.contains(&self.local.incarnation());
                    self.merge_candidates
                        .insert(from.clone(), (view, now, hears_us));
                }
            }
            _ => {}
        }
    }

    fn handle_join_request(&mut self, now: Instant, from: &MemberId, settings: &[SharedSetting]) {
        if !self.is_coordinator() {
            self.outputs.push_back(GmsOutput::Send {
                to: from.clone(),
                message: GmsMessage::NotCoordinator,
            });
            return;
        }
        if let Some((setting, ours, theirs)) = first_setting_mismatch(&self.settings, settings) {
            self.stats.joins_refused += 1;
            if self
                .mismatch_logged
                .is_none_or(|at| now.saturating_duration_since(at) >= MISMATCH_LOG_INTERVAL)
            {
                self.mismatch_logged = Some(now);
                warn!(member = %self.local, joiner = %from, setting, ours, theirs, "join refused: a setting every member must share differs");
            }
            self.outputs.push_back(GmsOutput::Send {
                to: from.clone(),
                message: GmsMessage::JoinRefused {
                    setting: setting.to_owned(),
                    coordinator_value: ours.to_owned(),
                    joiner_value: theirs.to_owned(),
                },
            });
            return;
        }
        let Some(view) = &self.view else { return };
        if view.contains(from) {
            // Our view reached it already or is on its way; send it again to be sure.
            self.outputs.push_back(GmsOutput::Send {
                to: from.clone(),
                message: GmsMessage::InstallView { view: view.clone() },
            });
            return;
        }
        if !self.pending_joins.contains(from) && self.pending_joins.len() < MAX_REMEMBERED {
            self.pending_joins.push(from.clone());
        }
        // Joins that arrive together are admitted together: one view, not one per joiner.
        let admit_at = *self.admit_at.get_or_insert(now + self.config.join_batch);
        if now >= admit_at {
            self.apply_changes(now);
        }
    }

    fn handle_leave_request(&mut self, now: Instant, from: &MemberId) {
        if !self.is_coordinator() {
            return;
        }
        let Some(view) = &self.view else { return };
        if view.contains(from) {
            self.pending_leaves.insert(from.clone());
            self.apply_changes(now);
        } else {
            self.outputs.push_back(GmsOutput::Send {
                to: from.clone(),
                message: GmsMessage::LeaveAccepted {
                    epoch: view.epoch(),
                },
            });
        }
    }

    fn handle_view(&mut self, now: Instant, from: &MemberId, view: View) {
        self.max_epoch_seen = self.max_epoch_seen.max(view.epoch());
        match self.phase {
            Phase::Joining(_) | Phase::Member => {}
            Phase::Leaving { .. } => {
                if !view.contains(&self.local) {
                    self.set_left();
                }
                return;
            }
            Phase::Idle | Phase::Left => return,
        }
        let handover = self
            .view
            .as_ref()
            .is_some_and(|current| current.coordinator() == from && !view.contains(from));
        if view.coordinator() != from && !handover {
            trace!(%from, view = %view, "view not installed by its coordinator; dropped");
            return;
        }
        if !view.contains(&self.local) {
            trace!(%from, view = %view, "view without us; ignored");
            return;
        }
        let current_epoch = self.view.as_ref().map_or(0, View::epoch);
        if view.epoch() <= current_epoch && !self.skip_epoch_check() {
            trace!(%from, view = %view, current_epoch, "stale view; ignored");
            return;
        }
        self.install(now, view, ViewOrigin::Received);
    }

    fn joining_tick(&mut self, now: Instant) {
        let Phase::Joining(joining) = &mut self.phase else {
            return;
        };
        if let Some((target, sent)) = &joining.target {
            if now >= *sent + self.config.join_timeout {
                debug!(member = %self.local, coordinator = %target, "join not answered; discovering again");
                joining.target = None;
            }
        }
        if now >= joining.next_ping {
            joining.next_ping = now + self.config.discovery_interval;
            self.outputs.push_back(GmsOutput::Discover(Discovery::Ping));
        }
        if joining.target.is_none() {
            let quiet_since = joining
                .last_announce
                .map_or(joining.started, |t| t.max(joining.started));
            let waited = now.saturating_duration_since(quiet_since);
            let lowest = joining.joiners.iter().all(|j| *j > self.local);
            let alone = joining.joiners.is_empty();
            if waited >= self.config.discovery_timeout
                && (lowest || waited >= self.config.discovery_timeout * 2)
            {
                let may_found = !joining.refused
                    && match self.founding {
                        Founding::Alone => true,
                        Founding::WithOthers => !alone,
                        Founding::Never => false,
                    };
                if may_found {
                    self.found(now);
                } else if alone && !joining.reported_alone && !joining.refused {
                    joining.reported_alone = true;
                    warn!(member = %self.local, founding = ?self.founding, "no member of the cluster answered; not founding one");
                    self.events
                        .push_back(GmsEvent::JoinProblem(JoinProblem::NobodyAnswered));
                }
            }
        }
    }

    fn found(&mut self, now: Instant) {
        let epoch = self.next_epoch();
        match View::new(epoch, vec![self.local.clone()]) {
            Ok(view) => {
                info!(member = %self.local, "no coordinator found; founding the cluster");
                self.stats.founded += 1;
                self.install(now, view, ViewOrigin::Founded);
            }
            Err(e) => debug!(error = %e, "could not found a view"),
        }
    }

    fn member_tick(&mut self, now: Instant) {
        if self.admit_at.is_some_and(|t| now >= t) {
            if self.is_coordinator() {
                self.apply_changes(now);
            } else {
                // A batch timer that outlived our coordination: nothing to admit (and a timer
                // left in the past would spin the driver).
                self.admit_at = None;
            }
        }
        if self.next_heartbeat.is_some_and(|t| now >= t) {
            self.next_heartbeat = Some(now + self.config.heartbeat_interval);
            self.send_heartbeats();
            if self.is_coordinator() {
                self.apply_changes(now);
            } else {
                self.maybe_take_over(now);
            }
        }
        if self.is_coordinator() && self.next_announce.is_some_and(|t| now >= t) {
            let jitter = self.jitter(self.config.announce_interval / 4);
            self.next_announce = Some(now + self.config.announce_interval + jitter);
            let horizon = self.config.announce_interval * 3;
            self.announcers
                .retain(|_, seen| now.saturating_duration_since(*seen) <= horizon);
            if let Some(view) = &self.view {
                let heard = self.announcers.keys().copied().collect();
                self.outputs
                    .push_back(GmsOutput::Discover(Discovery::Announce {
                        view: view.clone(),
                        heard,
                        settings: self.settings.clone(),
                    }));
            }
            self.maybe_merge(now);
        }
    }

    fn send_heartbeats(&mut self) {
        let Some(view) = &self.view else { return };
        // The highest epoch we know of, not just our view's: knowledge of epochs spreads to
        // every member, so the next view (and its fencing tokens) exceeds them all.
        let epoch = self.max_epoch_seen.max(view.epoch());
        let (view_epoch, coordinator) = (view.epoch(), view.coordinator().incarnation());
        for member in heartbeat_targets(view, &self.local) {
            self.outputs.push_back(GmsOutput::Heartbeat {
                to: member.clone(),
                epoch,
                view_epoch,
                coordinator,
            });
        }
    }

    fn is_suspected(&self, now: Instant, member: &MemberId) -> bool {
        self.silent_for(now, member, self.config.suspect_timeout)
    }

    /// Whether `member` has been silent (or stray) for longer than `timeout`.
    fn silent_for(&self, now: Instant, member: &MemberId, timeout: std::time::Duration) -> bool {
        member != &self.local
            && (self
                .last_heard
                .get(member)
                .is_none_or(|heard| now.saturating_duration_since(*heard) > timeout)
                || self
                    .stray_since
                    .get(member)
                    .is_some_and(|since| now.saturating_duration_since(*since) > timeout))
    }

    /// As coordinator: install a view with the pending joins, leaves and exclusions, if any.
    fn apply_changes(&mut self, now: Instant) {
        self.admit_at = None;
        let Some(view) = self.view.clone() else {
            return;
        };
        let suspects: Vec<MemberId> = if self.never_exclude() {
            Vec::new()
        } else {
            view.members()
                .iter()
                .filter(|m| self.is_suspected(now, m))
                .cloned()
                .collect()
        };
        let leavers: Vec<MemberId> = view
            .members()
            .iter()
            .filter(|m| self.pending_leaves.contains(*m))
            .cloned()
            .collect();
        let joiners: Vec<MemberId> = std::mem::take(&mut self.pending_joins)
            .into_iter()
            .filter(|j| !view.contains(j))
            .collect();
        self.pending_leaves.clear();
        if suspects.is_empty() && leavers.is_empty() && joiners.is_empty() {
            return;
        }
        let mut members: Vec<MemberId> = view
            .members()
            .iter()
            .filter(|m| !suspects.contains(m) && !leavers.contains(m))
            .cloned()
            .collect();
        members.extend(joiners.iter().cloned());
        // A view that admits members is above every epoch heard (a joiner may have led a view
        // of its own); one that only removes members is above its own side's views.
        let epoch = if joiners.is_empty() {
            self.next_epoch_within(&members)
        } else {
            self.next_epoch()
        };
        let Ok(next) = View::new(epoch, members) else {
            return;
        };
        info!(
            coordinator = %self.local, view = %next,
            joined = joiners.len(), left = leavers.len(), excluded = suspects.len(),
            "installing view"
        );
        self.stats.joins_accepted += joiners.len() as u64;
        self.stats.leaves_accepted += leavers.len() as u64;
        self.stats.members_excluded += suspects.len() as u64;
        // A member last heard following another coordinator comes back from another lineage
        // of views, where it may hold locks this coordinator's table never had: the view
        // merges it (the lock layer reconciles), whatever its epoch let it accept.
        let origin = if self.merges_another_lineage(&next) {
            ViewOrigin::Merged
        } else {
            ViewOrigin::Changed
        };
        self.install(now, next.clone(), origin);
        self.send_view_to_members(&next, Some(&view));
        for leaver in leavers {
            self.outputs.push_back(GmsOutput::Send {
                to: leaver,
                message: GmsMessage::LeaveAccepted { epoch },
            });
        }
        for suspect in suspects {
            self.outputs.push_back(GmsOutput::Forget(suspect));
        }
    }

    /// Whether `next`, a view of this coordinator's, keeps a member last heard following
    /// another coordinator: one back from another lineage of views, which may hold locks this
    /// coordinator's lock table never had.
    fn merges_another_lineage(&self, next: &View) -> bool {
        let ours = self.local.incarnation();
        next.members().iter().any(|m| {
            *m != self.local
                && self
                    .heard_views
                    .get(m)
                    .is_some_and(|h| h.coordinator != ours)
        })
    }

    /// As a member: if the coordinator and everyone ranked before us are suspected, take over.
    fn maybe_take_over(&mut self, now: Instant) {
        let Some(view) = self.view.clone() else {
            return;
        };
        let Some(rank) = view.rank(&self.local) else {
            return;
        };
        if rank == 0 {
            return;
        }
        // A member ranked before us that we do not watch is presumed gone once the coordinator
        // has been suspected for a further suspect timeout: alive, it would have taken over.
        let coordinator_long_gone =
            self.silent_for(now, view.coordinator(), self.config.suspect_timeout * 2);
        let gone = |m: &MemberId| {
            if self.watched.contains(m) {
                self.is_suspected(now, m)
            } else {
                coordinator_long_gone
            }
        };
        if !view.members()[..rank].iter().all(gone) {
            return;
        }
        // Everyone ranked before us goes (we must come first); after us, only the members we
        // watch and suspect (the others are watched from now on, and excluded if silent).
        let suspects: Vec<MemberId> = view
            .members()
            .iter()
            .enumerate()
            .filter(|(i, m)| *i < rank || (self.watched.contains(*m) && self.is_suspected(now, m)))
            .map(|(_, m)| m.clone())
            .collect();
        let members: Vec<MemberId> = view
            .members()
            .iter()
            .filter(|m| !suspects.contains(m))
            .cloned()
            .collect();
        let epoch = self.next_epoch_within(&members);
        let Ok(next) = View::new(epoch, members) else {
            return;
        };
        info!(member = %self.local, view = %next, "coordinator suspected; taking over");
        self.stats.takeovers += 1;
        self.stats.members_excluded += suspects.len() as u64;
        self.install(now, next.clone(), ViewOrigin::TookOver);
        self.send_view_to_members(&next, Some(&view));
        for suspect in suspects {
            self.outputs.push_back(GmsOutput::Forget(suspect));
        }
    }

    /// As coordinator: merge the views of the coordinators heard announcing, unless a
    /// coordinator with a lower id was heard (it leads the merge).
    fn maybe_merge(&mut self, now: Instant) {
        let horizon = self.config.announce_interval * 3;
        self.merge_candidates
            .retain(|_, (_, seen, _)| now.saturating_duration_since(*seen) <= horizon);
        // Only coordinators that heard this one's announcements: a merge view sent over a
        // link that is cut our way would never arrive, and the views it leads to (the merged
        // members suspected, excluded, merged again) would climb epoch after epoch.
        let reachable = |(_, _, hears_us): &(View, Instant, bool)| *hears_us;
        if !self.merge_candidates.values().any(reachable) {
            return;
        }
        if self
            .merge_candidates
            .iter()
            .any(|(c, candidate)| reachable(candidate) && *c < self.local)
        {
            trace!(member = %self.local, "a lower coordinator will lead the merge");
            return;
        }
        let Some(view) = self.view.clone() else {
            return;
        };
        let mut members: Vec<MemberId> = view
            .members()
            .iter()
            .filter(|m| !self.is_suspected(now, m))
            .cloned()
            .collect();
        let mut epoch = self.next_epoch();
        let mut candidates = std::mem::take(&mut self.merge_candidates);
        candidates.retain(|_, candidate| reachable(candidate));
        for (other, _, _) in candidates.values() {
            epoch = epoch.max(other.epoch().saturating_add(1));
            for member in other.members() {
                if !members.contains(member) {
                    members.push(member.clone());
                }
            }
        }
        if self.skip_epoch_check() {
            epoch = candidates
                .values()
                .map(|(v, _, _)| v.epoch())
                .chain([view.epoch()])
                .max()
                .unwrap_or(epoch);
        }
        let Ok(merged) = View::new(epoch, members) else {
            return;
        };
        info!(coordinator = %self.local, view = %merged, merged = candidates.len(), "installing merge view");
        self.stats.merges_led += 1;
        self.install(now, merged.clone(), ViewOrigin::Merged);
        self.send_view_to_members(&merged, Some(&view));
    }

    /// Sends `view` to its other members: as a delta from `base` (the view this member was in)
    /// to the members of `base`, which received it or installed it before, and in full to the
    /// others (joiners, merged members) and when there is no delta.
    fn send_view_to_members(&mut self, view: &View, base: Option<&View>) {
        let delta = base.and_then(|base| delta::diff(base, view).map(|d| (base, d)));
        for member in view.members() {
            if *member == self.local {
                continue;
            }
            let message = match &delta {
                Some((base, delta)) if base.contains(member) => delta.clone(),
                _ => GmsMessage::InstallView { view: view.clone() },
            };
            self.outputs.push_back(GmsOutput::Send {
                to: member.clone(),
                message,
            });
        }
    }

    /// As coordinator: installs the same members again under a higher epoch, at least
    /// `at_least`. The lock layer asks for it under `Available` when a grantor's fencing tokens
    /// ran out for their epoch (a token never carries the next epoch: only a new view lets it
    /// grant again). Does nothing at a member that does not coordinate.
    pub fn renew_view(&mut self, now: Instant, at_least: u64) {
        if !matches!(self.phase, Phase::Member) || !self.is_coordinator() {
            return;
        }
        let Some(view) = self.view.clone() else {
            return;
        };
        let epoch = self.next_epoch_within(view.members()).max(at_least);
        let Ok(next) = View::new(epoch, view.members().to_vec()) else {
            return;
        };
        info!(coordinator = %self.local, view = %next, "renewing the view (fencing tokens ran out)");
        self.install(now, next.clone(), ViewOrigin::Changed);
        self.send_view_to_members(&next, Some(&view));
    }

    fn install(&mut self, now: Instant, view: View, origin: ViewOrigin) {
        let was_coordinator = self.is_coordinator();
        self.max_epoch_seen = self.max_epoch_seen.max(view.epoch());
        let watched = watched_members(&view, &self.local);
        let mut heard = BTreeMap::new();
        for member in view.members() {
            // A member new to our view, or newly watched by us, gets a full suspect timeout of
            // grace; the others keep their clocks, so frequent view changes cannot hide a dead
            // member.
            let at = match self.last_heard.get(member) {
                Some(at) if self.watched.contains(member) || !watched.contains(member) => *at,
                _ => now,
            };
            heard.insert(member.clone(), at);
        }
        self.last_heard = heard;
        self.watched = watched;
        // A new view starts every member's lineage check afresh: one that still follows
        // another coordinator shows it again with its next heartbeat.
        self.stray_since.clear();
        self.phase = Phase::Member;
        self.view = Some(view.clone());
        self.stats.views_installed += 1;
        self.bases.remember(&view);
        if self.next_heartbeat.is_none() {
            self.next_heartbeat = Some(now + self.config.heartbeat_interval);
        }
        if self.is_coordinator() {
            if !was_coordinator {
                self.next_announce = Some(now);
            }
        } else {
            self.next_announce = None;
            self.admit_at = None;
            self.pending_joins.clear();
            self.pending_leaves.clear();
            self.merge_candidates.clear();
            self.announcers.clear();
        }
        let members = self.view.as_ref().map(View::members).unwrap_or_default();
        self.heard_views.retain(|m, _| members.contains(m));
        debug!(member = %self.local, view = %view, ?origin, "view installed");
        self.events
            .push_back(GmsEvent::ViewInstalled { view, origin });
    }

    fn set_left(&mut self) {
        if matches!(self.phase, Phase::Left) {
            return;
        }
        debug!(member = %self.local, "left");
        self.phase = Phase::Left;
        self.events.push_back(GmsEvent::Left);
    }

    fn next_epoch(&self) -> u64 {
        self.max_epoch_seen
            .max(self.view.as_ref().map_or(0, View::epoch))
            .saturating_add(1)
    }

    /// The epoch of a view of `members` that admits nobody (a takeover, or a change that only
    /// removes members): above this member's view and the views its members were heard in,
    /// but not above every epoch heard anywhere, so epochs advance with the membership of the
    /// view's own side only. The step is 2 when the new view keeps a strict majority of this
    /// member's current view, 1 otherwise: when a view splits, the side that kept most of it
    /// numbers its views above the others', and under `Available` (whose fencing tokens carry
    /// the epoch) a fenced resource follows that side, not a member cut off alone.
    fn next_epoch_within(&self, members: &[MemberId]) -> u64 {
        let base = members
            .iter()
            .filter_map(|m| self.heard_views.get(m).map(|h| h.epoch))
            .chain(self.view.as_ref().map(View::epoch))
            .max()
            .unwrap_or(0);
        let current = self.view.as_ref().map_or(0, View::len);
        let step = if 2 * members.len() > current { 2 } else { 1 };
        base.saturating_add(step)
    }

    /// A pseudo-random duration in `[0, max)` (xorshift; determinism comes from the seed).
    fn jitter(&mut self, max: std::time::Duration) -> std::time::Duration {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX).max(1);
        std::time::Duration::from_nanos(self.rng % nanos)
    }

    #[cfg(feature = "sim")]
    fn skip_epoch_check(&self) -> bool {
        self.sabotage.skip_view_epoch_check
    }

    #[cfg(not(feature = "sim"))]
    fn skip_epoch_check(&self) -> bool {
        false
    }

    /// Sabotage: the old liveness rules (any heartbeat, and any reliable-layer frame, is a
    /// sign of life).
    #[cfg(feature = "sim")]
    pub(crate) fn ignore_lineage(&self) -> bool {
        self.sabotage.ignore_lineage
    }

    #[cfg(not(feature = "sim"))]
    pub(crate) fn ignore_lineage(&self) -> bool {
        false
    }

    #[cfg(feature = "sim")]
    fn never_exclude(&self) -> bool {
        self.sabotage.never_exclude
    }

    #[cfg(not(feature = "sim"))]
    fn never_exclude(&self) -> bool {
        false
    }
}

/// Whom a member of `view` heartbeats: the coordinator everyone; every other member the
/// coordinator and the next [`WATCHERS`] members after it (no wrap-around: the members ranked
/// first need no watchers to take over).
pub(crate) fn heartbeat_targets<'a>(
    view: &'a View,
    local: &'a MemberId,
) -> impl Iterator<Item = &'a MemberId> + 'a {
    let members = view.members();
    let rank = view.rank(local);
    let (coordinator, ring) = match rank {
        Some(0) => (None, &members[1..]),
        Some(r) => {
            let end = members.len().min(r + 1 + WATCHERS);
            (members.first(), &members[r + 1..end])
        }
        None => (None, &members[..0]),
    };
    coordinator.into_iter().chain(ring.iter())
}

/// Whom a member of `view` watches (judges silent): the heartbeat targets read backwards.
fn watched_members(view: &View, local: &MemberId) -> BTreeSet<MemberId> {
    let members = view.members();
    match view.rank(local) {
        Some(0) => members[1..].iter().cloned().collect(),
        Some(r) => {
            let start = r.saturating_sub(WATCHERS).max(1);
            members[..1]
                .iter()
                .chain(&members[start..r])
                .cloned()
                .collect()
        }
        None => BTreeSet::new(),
    }
}

#[cfg(test)]
mod tests;
