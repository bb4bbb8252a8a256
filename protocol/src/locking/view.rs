//! A new view installed at this member: who grants now, and what its holds become.

use std::collections::BTreeMap;

use conclave_lock_api::wire::LockMessage;
use conclave_lock_api::{LockLostReason, MemberId, View};
use tracing::debug;

use super::types::ViewKey;
use super::LockMachine;
use crate::gms::ViewOrigin;
use crate::time::Instant;

impl LockMachine {
    /// A new view was installed at this member.
    pub fn handle_view(&mut self, now: Instant, view: &View, origin: ViewOrigin) {
        self.enter(now);
        self.grantor.lazy_acks.keep_members_of(view);
        self.transfer.view_changed();
        let previous_grantor = self.client.grantor().cloned();
        // A view handed to this member by its coordinator on leaving: that coordinator's
        // table may follow it (`LockMachine::leave`).
        self.transfer.handover_from = self
            .view
            .as_ref()
            .map(|previous| previous.coordinator())
            .filter(|previous| {
                origin == ViewOrigin::Received
                    && view.coordinator() == &self.local
                    && !view.contains(previous)
            })
            .map(|previous| (ViewKey::of(view), previous.clone()));
        // Under `Available`, a member that comes into the view may hold locks of another
        // lineage: one admitted as a joiner may have led a partition of its own and granted
        // there (a join request of its, sent long before and delivered after the partition
        // healed, does that), and what a join request says of its sender is only true when it
        // was sent. So the coordinator
        // reconciles every view that admits members, as after a merge: the admitted member's
        // holds meet the others' in a view of their own, through the duplicate rule. (Under
        // `Majority` a member outside every majority holds nothing, and `gained_majority`
        // covers the rest.)
        let admits_members = !self.config.policy.is_majority()
            && self
                .view
                .as_ref()
                .is_some_and(|previous| view.members().iter().any(|m| !previous.contains(m)));
        let could_grant = self
            .view
            .as_ref()
            .is_some_and(|v| self.config.policy.allows(v.len()));
        let mut heard = BTreeMap::new();
        for member in view.members() {
            heard.insert(
                member.clone(),
                self.last_heard.get(member).copied().unwrap_or(now),
            );
        }
        self.last_heard = heard;
        self.view = Some(std::sync::Arc::new(view.clone()));
        self.client.on_view(now, view, &mut self.outbox);
        let announced = self
            .announcement
            .as_ref()
            .is_some_and(|(by, epoch)| by == view.coordinator() && *epoch >= view.epoch());
        let still_serving = self.serving_grantor.as_ref() == Some(view.coordinator());
        self.drop_stale_queries();
        if self.config.policy.allows(view.len()) && (announced || still_serving) {
            self.set_serving_grantor(Some(view.coordinator().clone()));
        } else {
            self.set_serving_grantor(None);
        }
        if previous_grantor.as_ref() != Some(view.coordinator()) {
            self.majority.support.forget_echo();
        }
        if self.config.policy.allows(view.len()) {
            self.majority.minority_since = None;
        } else if self.config.policy.is_majority() {
            self.majority.minority_since.get_or_insert(now);
        }
        if !self.config.policy.allows(view.len()) && self.client.has_held() {
            debug!(member = %self.local, view = %view, "minority view: locks lost");
            self.client.lose_all(
                LockLostReason::Minority,
                &mut self.outbox,
                &mut self.notices,
            );
        }
        let coordinator = view.coordinator() == &self.local;
        // Gaining a majority is like becoming grantor: members that just joined may hold
        // locks of another lineage, and their leases must run out first.
        let gained_majority = self.config.policy.is_majority()
            && !could_grant
            && self.config.policy.allows(view.len());
        let became = previous_grantor.as_ref() != Some(&self.local)
            || !self.grantor.is_active()
            || gained_majority
            || (self.borrows()
                && self.majority.borrowed.and_then(|a| a.term) != self.majority.started_term);
        // A grantor whose tokens ran out starts again at the new view's epoch (`Available`).
        let exhausted = self.grantor.exhausted();
        if coordinator && (became || origin == ViewOrigin::Merged || admits_members || exhausted) {
            self.begin_term(now, view);
        } else if coordinator {
            self.keep_term(now, view);
        } else {
            self.grantor.stop();
            self.majority.term = None;
            self.majority.started_term = None;
        }
        for (key, generation, grantor) in self.transfer.take_early(ViewKey::of(view)) {
            let announce = LockMessage::Transferred {
                epoch: key.epoch,
                coordinator: key.coordinator,
                generation,
            };
            self.on_transfer(now, &grantor, announce);
        }
        self.pump(now);
    }

    /// False for a grant made in another view than ours, under `Available`: our grantor moved
    /// to another lineage of views and granted there, to the member it lists there (seed
    /// 6004172 of the transfer band: two holders in our view). Such a grant is not ours to
    /// keep: the client gives it back; the request, if pending, goes to our view's grantor.
    pub(super) fn of_our_view(&self, message: &LockMessage) -> bool {
        let LockMessage::Granted {
            view: Some(granted_in),
            ..
        } = message
        else {
            return true;
        };
        self.config.policy.is_majority()
            || self
                .view
                .as_deref()
                .is_some_and(|v| super::grantor::grant_view(v) == *granted_in)
    }

    /// Whether `member` is this member's grantor (the coordinator of its view, or the member
    /// the role was transferred to).
    pub(super) fn grantor_is(&self, member: &MemberId) -> bool {
        self.client.grantor() == Some(member)
    }
}
