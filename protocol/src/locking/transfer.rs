//! Grantor transfer (`become_grantor`, `Available`) and the handover of a leaving
//! coordinator's table (see `docs/protocol.md`, "Grantor transfer").

use std::cmp::Reverse;

use conclave_lock_api::wire::LockMessage;
use conclave_lock_api::{MemberId, View};
use tracing::debug;

use super::types::{transfer_view, TransferRefused, ViewKey};
use super::LockMachine;
use crate::time::Instant;

/// How many transfer announcements of views not installed yet a member keeps.
const EARLY_TRANSFERS_MAX: usize = 8;

/// The state of grantor transfer, on both sides: the member that asks for the role and the
/// grantor that hands it over.
#[derive(Debug, Default)]
pub(super) struct Transfer {
    /// `become_grantor` was called: ask every new grantor of later views for the role too,
    /// until another member takes it over (the last asker wins).
    pub(super) wants_grantor: bool,
    /// The grantor last asked for the role, in which view (asked once per grantor and view).
    pub(super) asked: Option<(MemberId, ViewKey)>,
    /// This member handed its table over to that member in that view.
    pub(super) transferred: Option<(ViewKey, MemberId)>,
    /// The member that asked this grantor for the role last (the last asker wins); handed
    /// the table once this member serves.
    pub(super) pending: Option<MemberId>,
    /// The turn, in this view, of the grantor this member follows or waits for (0: the
    /// coordinator's); announcements of earlier turns are stale.
    pub(super) generation: u64,
    /// The coordinator of the previous view, which handed this view to this member on
    /// leaving, with this view: its table handoff, if it comes, ends the reconciliation.
    pub(super) handover_from: Option<(ViewKey, MemberId)>,
    /// Transfer announcements for views not installed here yet, newest turn per view (at
    /// most [`EARLY_TRANSFERS_MAX`]): one of another coordinator's view that shares members
    /// must not displace the one of the view this member installs next.
    early: Vec<(ViewKey, u64, MemberId)>,
}

impl Transfer {
    /// A view change: a transfer lasts for its view, and falls back to the coordinator's
    /// reconciliation (a member that wants the role asks the new grantor again).
    pub(super) fn view_changed(&mut self) {
        self.transferred = None;
        self.pending = None;
        self.asked = None;
        self.generation = 0;
    }

    /// Keeps the announcement, by `grantor`, of turn `generation` of a view not installed yet.
    fn note_early(&mut self, key: ViewKey, generation: u64, grantor: &MemberId) {
        match self.early.iter_mut().find(|(k, _, _)| *k == key) {
            Some(known) if known.1 >= generation => {}
            Some(known) => *known = (key, generation, grantor.clone()),
            None => {
                self.early.push((key, generation, grantor.clone()));
                if self.early.len() > EARLY_TRANSFERS_MAX {
                    // The lowest epoch is the least likely to be installed next.
                    self.early.sort_by_key(|(k, _, _)| Reverse(k.epoch));
                    self.early.truncate(EARLY_TRANSFERS_MAX);
                }
            }
        }
    }

    /// The announcements kept for the view `key` just installed, in the order they were
    /// kept; those of earlier views are dropped, those of later ones kept.
    pub(super) fn take_early(&mut self, key: ViewKey) -> Vec<(ViewKey, u64, MemberId)> {
        let early = std::mem::take(&mut self.early);
        let (ours, later): (Vec<_>, Vec<_>) = early
            .into_iter()
            .filter(|(k, _, _)| *k == key || k.epoch > key.epoch)
            .partition(|(k, _, _)| *k == key);
        self.early = later;
        ours
    }
}

impl LockMachine {
    /// Asks for the grantor role of this member's view (Geode's `becomeLockGrantor`): the
    /// grantor hands its table over directly, with no reconciliation, and this member then
    /// grants its own owners' requests without a message. Requests that reach the former
    /// grantor meanwhile are answered "not grantor, ask X" and resent here. Of concurrent
    /// askers the last one wins. The wish outlives view changes: a view change falls back to
    /// the new coordinator's reconciliation, and this member asks the new grantor again, until
    /// another member takes the role by asking for it. Done once
    /// [`LockMachine::serving_grantor`] is this member ([`LockNotice::GrantorServing`](super::LockNotice::GrantorServing)).
    ///
    /// # Errors
    /// [`TransferRefused::Majority`] under `Majority`.
    pub fn become_grantor(&mut self, now: Instant) -> Result<(), TransferRefused> {
        if self.config.policy.is_majority() {
            return Err(TransferRefused::Majority);
        }
        self.enter(now);
        self.transfer.wants_grantor = true;
        self.transfer.asked = None;
        self.ask_for_grantor();
        self.pump(now);
        Ok(())
    }

    /// Whether `become_grantor` was asked and no other member took the role since.
    pub fn wants_grantor(&self) -> bool {
        self.transfer.wants_grantor
    }

    /// Sends the current grantor a transfer request if this member wants the role and has
    /// not asked that grantor in this view yet.
    pub(super) fn ask_for_grantor(&mut self) {
        if !self.transfer.wants_grantor {
            return;
        }
        let (Some(view), Some(grantor)) = (self.view.as_ref(), self.client.grantor()) else {
            return;
        };
        if *grantor == self.local {
            return;
        }
        let key = (grantor.clone(), ViewKey::of(view));
        if self.transfer.asked.as_ref() == Some(&key) {
            return;
        }
        let request = LockMessage::TransferRequest {
            epoch: view.epoch(),
            coordinator: view.coordinator().incarnation(),
        };
        self.transfer.asked = Some(key);
        self.outbox.push_back((grantor.clone(), request));
    }

    /// The grantor side of a transfer: hands the table to the last asker once serving.
    pub(super) fn try_transfer(&mut self, now: Instant) {
        let Some(to) = self.transfer.pending.clone() else {
            return;
        };
        let Some(view) = self.view.clone() else {
            return;
        };
        if !view.contains(&to) || to == self.local {
            self.transfer.pending = None;
            return;
        }
        if !self.grantor.is_serving() {
            return;
        }
        let ctx = self.ctx(now, &view);
        let Some(handoff) = self.grantor.hand_off(&ctx) else {
            return;
        };
        self.transfer.pending = None;
        self.transfer.wants_grantor = false;
        self.transfer.transferred = Some((ViewKey::of(&view), to.clone()));
        self.outbox.push_back((to, handoff));
        self.set_serving_grantor(None);
        // Follow the new grantor only once it announces itself: what it sent before that
        // (grants of an earlier turn of its, in this view) is stale, and only its own
        // announcement is ordered after all of it.
        self.client.unfollow();
        self.drop_stale_queries();
        let _ = now;
    }

    /// A transfer request, a handoff, an announcement of a transfer or a "not grantor".
    pub(super) fn on_transfer(&mut self, now: Instant, from: &MemberId, message: LockMessage) {
        if let LockMessage::Transferred {
            epoch,
            coordinator,
            generation,
        } = &message
        {
            let installed = self.view.as_deref().map(View::epoch);
            if installed.is_none_or(|installed| *epoch > installed) {
                // Before its view is installed here (the new grantor may even be new to the
                // view; this member may have no view yet, a joiner): applied when that very
                // view is.
                let key = ViewKey {
                    epoch: *epoch,
                    coordinator: *coordinator,
                };
                self.transfer.note_early(key, *generation, from);
                return;
            }
        }
        let Some(view) = self.view.clone() else {
            return;
        };
        if self.config.policy.is_majority() || !view.contains(from) || from == &self.local {
            return;
        }
        // Every transfer message names its view by epoch and coordinator: views of different
        // coordinators may share an epoch and members.
        let this_view = ViewKey::of(&view);
        if transfer_view(&message) != Some(this_view) {
            debug!(%from, "transfer message of another view dropped");
            return;
        }
        match message {
            LockMessage::TransferRequest { .. } => {
                self.on_transfer_request(now, from, this_view);
            }
            LockMessage::Handoff { generation, .. }
                if !self.grantor.is_active() && generation > self.transfer.generation =>
            {
                self.on_handoff(now, &view, this_view, message);
            }
            LockMessage::Handoff { .. } => {
                debug!(%from, "lock table handoff for another view or grantor; dropped (the next reconciliation rebuilds the table)");
            }
            LockMessage::Transferred {
                epoch, generation, ..
            } if generation > self.transfer.generation => {
                self.on_transferred(now, from, epoch, generation);
            }
            LockMessage::NotGrantor { generation, .. }
                if self.client.grantor() == Some(from) && generation > self.transfer.generation =>
            {
                self.on_not_grantor();
            }
            _ => {}
        }
    }

    /// A member of this view asks for the grantor role.
    fn on_transfer_request(&mut self, now: Instant, from: &MemberId, this_view: ViewKey) {
        let (epoch, coordinator) = (this_view.epoch, this_view.coordinator);
        match (&self.transfer.transferred, self.client.grantor()) {
            (Some((k, to)), _) if *k == this_view => {
                let reply = LockMessage::NotGrantor {
                    epoch,
                    coordinator,
                    grantor: to.clone(),
                    generation: self.grantor.generation + 1,
                };
                self.outbox.push_back((from.clone(), reply));
            }
            (_, Some(g)) if *g == self.local => {
                debug!(member = %self.local, asker = %from, "grantor role asked for");
                self.transfer.pending = Some(from.clone());
                self.try_transfer(now);
            }
            (_, Some(g)) => {
                let reply = LockMessage::NotGrantor {
                    epoch,
                    coordinator,
                    grantor: g.clone(),
                    generation: self.transfer.generation,
                };
                self.outbox.push_back((from.clone(), reply));
            }
            (_, None) => {}
        }
    }

    /// The table handed to this member, from the one member that served in this view
    /// (whoever this member follows now: an announcement may have overtaken the handoff).
    fn on_handoff(&mut self, now: Instant, view: &View, this_view: ViewKey, handoff: LockMessage) {
        let LockMessage::Handoff {
            epoch, generation, ..
        } = handoff
        else {
            return;
        };
        let coordinator = this_view.coordinator;
        let ctx = self.ctx(now, view);
        self.grantor.adopt(&ctx, handoff, &mut self.outbox);
        self.transfer.generation = generation;
        self.transfer.transferred = None;
        self.client
            .follow(now, self.local.clone(), &mut self.outbox);
        self.report_holds_to(now, self.local.clone(), epoch);
        for member in view.members().iter().filter(|m| **m != self.local) {
            let announce = LockMessage::Transferred {
                epoch,
                coordinator,
                generation,
            };
            self.outbox.push_back((member.clone(), announce));
        }
        self.set_serving_grantor(Some(self.local.clone()));
        self.drop_stale_queries();
    }

    /// `from` announces that it serves this view now, in turn `generation`.
    fn on_transferred(&mut self, now: Instant, from: &MemberId, epoch: u64, generation: u64) {
        self.transfer.generation = generation;
        if self.grantor.is_active() {
            // Handed over meanwhile (or never asked to): the announcement is stale for us,
            // our own handoff tells who serves.
            return;
        }
        // Also when already following it: what was sent before it served (after a "not
        // grantor" pointed here) was dropped, so everything is sent again.
        self.client.follow(now, from.clone(), &mut self.outbox);
        self.report_holds_to(now, from.clone(), epoch);
        if self.transfer.wants_grantor && self.transfer.transferred.is_some() {
            // We handed the role to someone else since asking: the last asker won.
            self.transfer.wants_grantor = false;
        }
        self.set_serving_grantor(Some(from.clone()));
        self.drop_stale_queries();
    }

    /// Our grantor handed the role over.
    fn on_not_grantor(&mut self) {
        // Wait for the new grantor's own announcement before following it (see
        // `try_transfer`): our requests go there then.
        self.client.unfollow();
        self.set_serving_grantor(None);
        self.drop_stale_queries();
    }

    /// The table of the coordinator that left and handed this member the view: served at
    /// once, ending the reconciliation (`Available` only; see [`LockMachine::leave`]).
    pub(super) fn on_handover(&mut self, now: Instant, handoff: LockMessage) {
        self.transfer.handover_from = None;
        let Some(view) = self.view.clone() else {
            return;
        };
        if self.config.policy.is_majority() {
            return;
        }
        let ctx = self.ctx(now, &view);
        if !self
            .grantor
            .take_over_on_leave(&ctx, handoff, &mut self.outbox)
        {
            debug!(member = %self.local, "lock table of the coordinator that left came after the reconciliation; dropped");
        }
    }

    /// Whether `message` is the table handoff of the coordinator that handed this member its
    /// current view on leaving (`from`), for that view and turn 0.
    pub(super) fn is_handover_from(&self, from: &MemberId, message: &LockMessage) -> bool {
        let Some((key, previous)) = &self.transfer.handover_from else {
            return false;
        };
        previous == from
            && transfer_view(message) == Some(*key)
            && matches!(message, LockMessage::Handoff { generation: 0, .. })
    }

    /// A request for the grantor this member handed its table over to: the sender must ask
    /// the new grantor (nothing is applied here, not even a release: the new grantor's table
    /// has the lock).
    pub(super) fn refer_to_new_grantor(&mut self, from: &MemberId) {
        if let (Some(view), Some((_, to))) =
            (self.view.as_ref(), self.transfer.transferred.as_ref())
        {
            let reply = LockMessage::NotGrantor {
                epoch: view.epoch(),
                coordinator: view.coordinator().incarnation(),
                grantor: to.clone(),
                generation: self.grantor.generation + 1,
            };
            self.outbox.push_back((from.clone(), reply));
        }
    }

    /// Whether this member handed the grantor role of its current view to another member.
    pub(super) fn handed_over(&self) -> bool {
        !self.grantor.is_active()
            && self
                .transfer
                .transferred
                .as_ref()
                .zip(self.view.as_ref())
                .is_some_and(|((key, _), view)| *key == ViewKey::of(view))
    }

    /// Tells a grantor the role was transferred to what this member holds, as a late report
    /// of the view `epoch`: the reconciliation of the view may have finished without this
    /// member's report (it timed out) and its report then reached a grantor that had handed
    /// the table over, which applies nothing. The new grantor merges what it does not know through the duplicate rule, like
    /// any late report; what it knows already is left as it is.
    pub(super) fn report_holds_to(&mut self, now: Instant, grantor: MemberId, epoch: u64) {
        if !self.client.has_held() {
            return;
        }
        let report = LockMessage::LockInfoResponse {
            epoch,
            held: self.client.held_locks(now),
            pending: Vec::new(),
            releases: Vec::new(),
        };
        self.outbox.push_back((grantor, report));
    }

    /// The member leaves its view (call it after [`LockMachine::shutdown`]): it grants nothing
    /// more, whatever reaches it. A coordinator that hands its view to the next member
    /// (`next`: [`crate::gms::Gms::handover`]) hands its lock table over with it under
    /// `Available`, to the coordinator of `next`, which then serves at once instead of waiting
    /// for every member's report. The endpoint sends the handoff after the view, on the same
    /// stream, so the successor has installed the view when it arrives. (Under `Majority` the
    /// successor begins a term of its own, with its reconciliation and grace period.)
    pub fn leave(&mut self, now: Instant, next: Option<&View>) {
        self.enter(now);
        let handing = self.view.clone().zip(next).filter(|(view, next)| {
            !self.config.policy.is_majority()
                && view.coordinator() == &self.local
                && self.grantor.is_serving()
                && !self.handed_over()
                && !next.contains(&self.local)
        });
        if let Some((view, next)) = handing {
            let ctx = self.ctx(now, &view);
            if let Some(handoff) = self.grantor.hand_off_in(&ctx, next, 0) {
                debug!(member = %self.local, successor = %next.coordinator(), "leaving: lock table handed to the successor");
                self.outbox.push_back((next.coordinator().clone(), handoff));
            }
        }
        self.grantor.stop();
        self.transfer.pending = None;
        self.transfer.wants_grantor = false;
        self.set_serving_grantor(None);
        self.pump(now);
    }
}
