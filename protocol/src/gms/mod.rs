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

mod admission;
mod announce;
mod config;
mod delta;
mod joining;
mod liveness;
mod merge;
mod types;
mod views;

use std::collections::VecDeque;

use conclave_lock_api::wire::{Discovery, GmsMessage, SharedSetting};
use conclave_lock_api::{MemberId, View};
use tracing::{debug, info, trace, warn};

use crate::time::Instant;

use admission::{Admission, Changes};
use announce::Announcer;
use delta::DeltaError;
use joining::{JoinDecision, Joining};
use liveness::{Heartbeat, Liveness};
use merge::Merging;
use views::Views;

pub use config::{Founding, GmsConfig, GmsConfigError};
#[cfg(feature = "sim")]
pub use types::Sabotage;
#[cfg(not(feature = "sim"))]
use types::Sabotage;
pub use types::{GmsEvent, GmsOutput, GmsStats, JoinProblem, MembershipState, ViewOrigin};

pub use liveness::WATCHERS;

#[derive(Debug)]
enum Phase {
    Idle,
    Joining(Joining),
    Member,
    Leaving { deadline: Instant },
    Left,
}

/// The group membership state machine of one member.
#[derive(Debug)]
pub struct Gms {
    local: MemberId,
    config: GmsConfig,
    phase: Phase,
    /// The current view and the epochs heard of.
    views: Views,
    /// The failure detector: what was heard from the members of the view.
    liveness: Liveness,
    next_heartbeat: Option<Instant>,
    /// What this member says on the discovery channel, and when.
    announcer: Announcer,
    /// As coordinator: the joins and leaves to install.
    admission: Admission,
    /// The view this member handed to the next member when it left as coordinator, unless
    /// it keeps a member last heard following another coordinator.
    handover: Option<View>,
    /// As coordinator: the other coordinators heard announcing, and their views.
    merging: Merging,
    /// When this member may found a cluster.
    founding: Founding,
    outputs: VecDeque<GmsOutput>,
    events: VecDeque<GmsEvent>,
    stats: GmsStats,
    sabotage: Sabotage,
}

impl Gms {
    /// A member that has not joined yet. Call [`Gms::join`] to start.
    pub fn new(local: MemberId, config: GmsConfig) -> Self {
        let announcer = Announcer::new(&local);
        Self {
            local,
            config,
            phase: Phase::Idle,
            views: Views::default(),
            liveness: Liveness::default(),
            next_heartbeat: None,
            announcer,
            admission: Admission::default(),
            handover: None,
            merging: Merging::default(),
            founding: Founding::default(),
            outputs: VecDeque::new(),
            events: VecDeque::new(),
            stats: GmsStats::default(),
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
        self.announcer.set_settings(settings);
    }

    /// The settings set by [`Gms::set_shared_settings`].
    pub fn shared_settings(&self) -> &[SharedSetting] {
        self.announcer.settings()
    }

    /// The highest view epoch this member has heard of (its own view's, or any seen in a
    /// heartbeat, announcement or view).
    pub fn max_epoch_seen(&self) -> u64 {
        self.views.max_epoch_seen()
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
        self.views.current()
    }

    /// Whether this member coordinates its current view.
    pub fn is_coordinator(&self) -> bool {
        matches!(self.phase, Phase::Member)
            && self
                .views
                .current()
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
        self.phase = Phase::Joining(Joining::new(now));
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
                let Some(view) = self.views.current().cloned() else {
                    return self.set_left();
                };
                if view.coordinator() == &self.local {
                    if let Some(next) = self.views.handover(&self.local) {
                        info!(member = %self.local, view = %next, "coordinator leaving, handing over");
                        // In full: a member that could not rebuild a delta would ask a
                        // coordinator that is gone.
                        self.send_view_to_members(&next, None);
                        if !self.merges_another_lineage(&next) {
                            self.handover = Some(next);
                        }
                    }
                    self.set_left();
                } else {
                    self.send(view.coordinator().clone(), GmsMessage::LeaveRequest);
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
        self.liveness.note_alive(now, from);
    }

    /// Handles a heartbeat from `from`, who has heard of views up to `epoch` and is in the
    /// view `view_epoch` coordinated by the member with incarnation `coordinator`.
    ///
    /// The heartbeat is a sign of life only if the sender follows our coordinator, or is in a
    /// newer view of another coordinator while it is not our coordinator (we are probably
    /// about to receive that view). A sender in another lineage of views is suspected after
    /// the suspect timeout even though it keeps talking to us, so that two members cannot
    /// keep each other in stale views forever (one takes over and the views merge).
    pub fn handle_heartbeat(
        &mut self,
        now: Instant,
        from: &MemberId,
        epoch: u64,
        view_epoch: u64,
        coordinator: u128,
    ) {
        if !self.liveness.knows(from) {
            return;
        }
        self.views.saw_epoch(epoch);
        let beat = Heartbeat {
            view_epoch,
            coordinator,
        };
        let coordinates = self.is_coordinator();
        let ignore = self.ignore_lineage();
        self.liveness
            .heartbeat(now, from, beat, self.views.current(), coordinates, ignore);
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
            } => self.handle_join_refused(from, setting, coordinator_value, joiner_value),
            GmsMessage::NotCoordinator => {
                if let Phase::Joining(joining) = &mut self.phase {
                    joining.not_coordinator(from);
                }
            }
            GmsMessage::LeaveRequest => self.handle_leave_request(now, from),
            GmsMessage::InstallView { view } => {
                self.views.received(&view);
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
                let base = (base_epoch, base_digest);
                match self.views.rebuild(epoch, base, &left, &joined, digest) {
                    Ok(view) => self.handle_view(now, from, view),
                    Err(error) => {
                        self.handle_unusable_delta(
                            now,
                            from,
                            epoch,
                            error,
                            (left.len(), joined.len()),
                        );
                    }
                }
            }
            GmsMessage::ViewRequest { .. } => self.handle_view_request(from),
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
            Phase::Joining(joining) => Some(joining.deadline(&self.config, self.founding)),
            Phase::Member => [
                self.next_heartbeat,
                self.announcer.deadline(),
                self.admission.deadline(),
            ]
            .into_iter()
            .flatten()
            .min(),
            Phase::Leaving { deadline } => Some(*deadline),
        }
    }

    /// As a joiner: the coordinator asked refused us for a setting.
    fn handle_join_refused(
        &mut self,
        from: &MemberId,
        setting: String,
        coordinator_value: String,
        joiner_value: String,
    ) {
        let Phase::Joining(joining) = &mut self.phase else {
            return;
        };
        if !joining.refused_by(from) {
            return;
        }
        warn!(member = %self.local, coordinator = %from, %setting, %coordinator_value, %joiner_value, "join refused: a setting every member must share differs");
        self.events
            .push_back(GmsEvent::JoinProblem(JoinProblem::SettingMismatch {
                coordinator: from.clone(),
                setting,
                coordinator_value,
                joiner_value,
            }));
    }

    /// A view delta from `from` that this member cannot rebuild a view of epoch `epoch` from;
    /// `left` and `joined` are its counts of members that left and joined.
    fn handle_unusable_delta(
        &mut self,
        now: Instant,
        from: &MemberId,
        epoch: u64,
        error: DeltaError,
        (left, joined): (usize, usize),
    ) {
        if let DeltaError::Absurd = error {
            self.stats.view_deltas_dropped += 1;
            if self.views.drop_log_due(now) {
                debug!(%from, epoch, left, joined, "oversized view delta; dropped");
            }
            return;
        }
        // Never a guessed view: ask the sender for the whole of it.
        self.stats.view_requests += 1;
        trace!(%from, epoch, ?error, "view delta not applicable; asking for the full view");
        self.send(from.clone(), GmsMessage::ViewRequest { epoch });
    }

    /// `from` asked for the full view.
    fn handle_view_request(&mut self, from: &MemberId) {
        // Only the coordinator's view is installed from it; a member that no longer
        // coordinates has nothing to give (the new coordinator sends its own view).
        if let Some(view) = self.views.current().filter(|v| v.contains(from)) {
            if self.is_coordinator() {
                self.send(from.clone(), GmsMessage::InstallView { view: view.clone() });
            }
        }
    }

    fn handle_ping(&mut self, from: &MemberId) {
        match &mut self.phase {
            Phase::Joining(joining) => joining.heard_ping(from),
            Phase::Member => {
                // The coordinator answers, and so do the members next in line to take over: a
                // joiner that hears of an existing cluster (and its epoch) does not found a
                // new one while the cluster replaces a dead coordinator. The others keep
                // quiet, so a ping costs a few answers, not one per member.
                let in_line = |v: &&View| v.rank(&self.local).is_some_and(|rank| rank <= WATCHERS);
                if let Some(view) = self.views.current().filter(in_line) {
                    let discovery = self.announcer.reply(view);
                    let to = from.addr();
                    self.outputs
                        .push_back(GmsOutput::DiscoveryReply { to, discovery });
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
        self.views.saw_epoch(view.epoch());
        let is_coordinator = self.is_coordinator();
        match &mut self.phase {
            Phase::Joining(joining) => {
                if !joining.heard_announce(now, view.coordinator()) {
                    return;
                }
                let coordinator = view.coordinator().clone();
                debug!(member = %self.local, %coordinator, "asking to join");
                let settings = self.announcer.settings().to_vec();
                self.send(coordinator, GmsMessage::Join { settings });
            }
            Phase::Member if is_coordinator && view.coordinator() == from => {
                self.merging.heard_announcer(from.incarnation(), now);
                if let Some(m) = self.announcer.mismatch(now, settings) {
                    self.stats.merges_refused += 1;
                    if m.log {
                        warn!(member = %self.local, coordinator = %from, setting = %m.setting, ours = %m.ours, theirs = %m.theirs, "not merging with a view whose settings differ");
                    }
                    return;
                }
                let differs = self.views.current().is_some_and(|v| v.id() != view.id());
                if differs {
                    let hears_us = heard.contains(&self.local.incarnation());
                    self.merging.heard_view(from, view, now, hears_us);
                }
            }
            _ => {}
        }
    }

    fn handle_join_request(&mut self, now: Instant, from: &MemberId, settings: &[SharedSetting]) {
        if !self.is_coordinator() {
            self.send(from.clone(), GmsMessage::NotCoordinator);
            return;
        }
        if let Some(m) = self.announcer.mismatch(now, settings) {
            self.stats.joins_refused += 1;
            if m.log {
                warn!(member = %self.local, joiner = %from, setting = %m.setting, ours = %m.ours, theirs = %m.theirs, "join refused: a setting every member must share differs");
            }
            let refusal = GmsMessage::JoinRefused {
                setting: m.setting,
                coordinator_value: m.ours,
                joiner_value: m.theirs,
            };
            self.send(from.clone(), refusal);
            return;
        }
        let Some(view) = self.views.current() else {
            return;
        };
        if view.contains(from) {
            // Our view reached it already or is on its way; send it again to be sure.
            self.send(from.clone(), GmsMessage::InstallView { view: view.clone() });
            return;
        }
        if self.admission.join(from, now, self.config.join_batch) {
            self.apply_changes(now);
        }
    }

    fn handle_leave_request(&mut self, now: Instant, from: &MemberId) {
        if !self.is_coordinator() {
            return;
        }
        let Some(view) = self.views.current() else {
            return;
        };
        if view.contains(from) {
            self.admission.leave(from);
            self.apply_changes(now);
        } else {
            let epoch = view.epoch();
            self.send(from.clone(), GmsMessage::LeaveAccepted { epoch });
        }
    }

    fn handle_view(&mut self, now: Instant, from: &MemberId, view: View) {
        self.views.saw_epoch(view.epoch());
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
        if self
            .views
            .accepts(from, &view, &self.local, self.sabotage.skips_epoch_check())
        {
            self.install(now, view, ViewOrigin::Received);
        }
    }

    fn joining_tick(&mut self, now: Instant) {
        let Phase::Joining(joining) = &mut self.phase else {
            return;
        };
        let decision = joining.tick(
            now,
            &self.local,
            &self.config,
            self.founding,
            &mut self.outputs,
        );
        match decision {
            Some(JoinDecision::Found) => self.found(now),
            Some(JoinDecision::NobodyAnswered) => self
                .events
                .push_back(GmsEvent::JoinProblem(JoinProblem::NobodyAnswered)),
            None => {}
        }
    }

    fn found(&mut self, now: Instant) {
        let epoch = self.views.next_epoch();
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
        if self.admission.due(now) {
            if self.is_coordinator() {
                self.apply_changes(now);
            } else {
                // A batch timer that outlived our coordination: nothing to admit (and a timer
                // left in the past would spin the driver).
                self.admission.disarm();
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
        if self.is_coordinator() && self.announcer.due(now) {
            let interval = self.config.announce_interval;
            let heard = self.merging.announcers(now, interval * 3);
            if let Some(view) = self.views.current() {
                let announcement = self.announcer.announce(now, interval, view, heard);
                self.outputs.push_back(GmsOutput::Discover(announcement));
            }
            self.maybe_merge(now);
        }
    }

    fn send_heartbeats(&mut self) {
        let Some(view) = self.views.current() else {
            return;
        };
        // The highest epoch we know of, not just our view's: knowledge of epochs spreads to
        // every member, so the next view (and its fencing tokens) exceeds them all.
        let epoch = self.views.max_epoch_seen();
        let beats = liveness::heartbeats(view, &self.local, epoch);
        self.outputs.extend(beats);
    }

    fn is_suspected(&self, now: Instant, member: &MemberId) -> bool {
        let timeout = self.config.suspect_timeout;
        self.liveness.silent_for(&self.local, now, member, timeout)
    }

    /// As coordinator: install a view with the pending joins, leaves and exclusions, if any.
    fn apply_changes(&mut self, now: Instant) {
        self.admission.disarm();
        let Some(view) = self.views.current().cloned() else {
            return;
        };
        let suspects: Vec<MemberId> = if self.sabotage.never_excludes() {
            Vec::new()
        } else {
            let timeout = self.config.suspect_timeout;
            self.liveness.suspects(&self.local, &view, now, timeout)
        };
        let changes = self.admission.take(&view);
        if suspects.is_empty() && changes.is_empty() {
            return;
        }
        let members = changes.members_after(&view, &suspects);
        let Changes { leavers, joiners } = changes;
        // A view that admits members is above every epoch heard (a joiner may have led a view
        // of its own); one that only removes members is above its own side's views.
        let epoch = if joiners.is_empty() {
            self.next_epoch_within(&members)
        } else {
            self.views.next_epoch()
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
            self.send(leaver, GmsMessage::LeaveAccepted { epoch });
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
        next.members()
            .iter()
            .any(|m| *m != self.local && self.liveness.follows_another(m, ours))
    }

    /// As a member: if the coordinator and everyone ranked before us are suspected, take over.
    fn maybe_take_over(&mut self, now: Instant) {
        let Some(view) = self.views.current().cloned() else {
            return;
        };
        let timeout = self.config.suspect_timeout;
        let Some(suspects) = self.liveness.takeover(&self.local, &view, now, timeout) else {
            return;
        };
        let Some(next) = self.next_view_within(view.members(), &suspects, 0) else {
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
        if !self.merging.leads_merge(&self.local, now, horizon) {
            return;
        }
        let Some(view) = self.views.current().cloned() else {
            return;
        };
        let mut members: Vec<MemberId> = view
            .members()
            .iter()
            .filter(|m| !self.is_suspected(now, m))
            .cloned()
            .collect();
        let (epoch, merged) = self.merging.take_into(
            &mut members,
            self.views.next_epoch(),
            &view,
            self.sabotage.skips_epoch_check(),
        );
        let Ok(merged_view) = View::new(epoch, members) else {
            return;
        };
        info!(coordinator = %self.local, view = %merged_view, merged, "installing merge view");
        self.stats.merges_led += 1;
        self.install(now, merged_view.clone(), ViewOrigin::Merged);
        self.send_view_to_members(&merged_view, Some(&view));
    }

    /// Sends `view` to its other members: as a delta from `base` (the view this member was in)
    /// to the members of `base`, which received it or installed it before, and in full to the
    /// others (joiners, merged members) and when there is no delta.
    fn send_view_to_members(&mut self, view: &View, base: Option<&View>) {
        for (to, message) in delta::view_messages(view, base, &self.local) {
            self.send(to, message);
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
        let Some(view) = self.views.current().cloned() else {
            return;
        };
        let Some(next) = self.next_view_within(view.members(), &[], at_least) else {
            return;
        };
        info!(coordinator = %self.local, view = %next, "renewing the view (fencing tokens ran out)");
        self.install(now, next.clone(), ViewOrigin::Changed);
        self.send_view_to_members(&next, Some(&view));
    }

    fn install(&mut self, now: Instant, view: View, origin: ViewOrigin) {
        let was_coordinator = self.is_coordinator();
        self.liveness.follow(now, &view, &self.local);
        self.phase = Phase::Member;
        self.views.install(&view);
        self.stats.views_installed += 1;
        if self.next_heartbeat.is_none() {
            self.next_heartbeat = Some(now + self.config.heartbeat_interval);
        }
        if self.is_coordinator() {
            if !was_coordinator {
                self.announcer.start(now);
            }
        } else {
            self.announcer.stop();
            self.admission.clear();
            self.merging.clear();
        }
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

    /// The epoch of a view of `members` that admits nobody (see [`Views::next_epoch_within`]).
    fn next_epoch_within(&self, members: &[MemberId]) -> u64 {
        let heard = self.liveness.highest_epoch_of(members);
        self.views.next_epoch_within(members, heard)
    }

    /// A view of `members` without `excluded`, that admits nobody, numbered at least
    /// `at_least`.
    fn next_view_within(
        &self,
        members: &[MemberId],
        excluded: &[MemberId],
        at_least: u64,
    ) -> Option<View> {
        let members: Vec<MemberId> = members
            .iter()
            .filter(|m| !excluded.contains(m))
            .cloned()
            .collect();
        let epoch = self.next_epoch_within(&members).max(at_least);
        View::new(epoch, members).ok()
    }

    /// Sabotage: the old liveness rules (any heartbeat, and any reliable-layer frame, is a
    /// sign of life).
    pub(crate) fn ignore_lineage(&self) -> bool {
        self.sabotage.ignores_lineage()
    }

    /// Queues `message` for reliable delivery to `to`.
    fn send(&mut self, to: MemberId, message: GmsMessage) {
        self.outputs.push_back(GmsOutput::Send { to, message });
    }
}

#[cfg(test)]
mod tests;
