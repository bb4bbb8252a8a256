//! Which grantor serves: the grantor's announcement to its view, and what a member knows of
//! it ([`LockNotice::GrantorServing`]).

use conclave_lock_api::wire::LockMessage;
use conclave_lock_api::MemberId;

use super::types::LockNotice;
use super::LockMachine;
use crate::time::Instant;

impl LockMachine {
    /// The grantor this member knows to be serving (see [`LockNotice::GrantorServing`]).
    pub fn serving_grantor(&self) -> Option<&MemberId> {
        self.serving_grantor.as_ref()
    }

    /// Grantor: announces to its view that it serves, once per view and term, as soon as it
    /// can grant.
    pub(super) fn announce_serving(&mut self, now: Instant) {
        let Some(view) = self.view.clone() else {
            return;
        };
        if view.coordinator() != &self.local || !self.grantor.is_serving() {
            return;
        }
        if !self.ctx(now, &view).policy_ok {
            return;
        }
        let key = (
            view.epoch(),
            self.majority
                .term
                .as_ref()
                .map(|t| t.term)
                .or(self.majority.started_term),
        );
        if self.announced == Some(key) {
            return;
        }
        self.announced = Some(key);
        for member in view.members().iter().filter(|m| **m != self.local) {
            self.outbox.push_back((
                member.clone(),
                LockMessage::Serving {
                    epoch: view.epoch(),
                },
            ));
        }
        self.set_serving_grantor(Some(self.local.clone()));
    }

    /// Records the grantor known to serve, telling the owner when it changes.
    pub(super) fn set_serving_grantor(&mut self, grantor: Option<MemberId>) {
        if self.serving_grantor != grantor {
            self.serving_grantor = grantor.clone();
            self.notices
                .push_back(LockNotice::GrantorServing { grantor });
        }
        if self.serving_grantor.is_some() {
            self.ask_for_grantor();
        }
    }

    /// A grantor announced that it serves the view `epoch`.
    pub(super) fn on_serving(&mut self, from: &MemberId, epoch: u64) {
        let newer = self.announcement.as_ref().is_none_or(|(_, e)| epoch >= *e);
        if newer {
            self.announcement = Some((from.clone(), epoch));
        }
        let from_coordinator = self
            .view
            .as_ref()
            .is_some_and(|v| v.coordinator() == from && epoch >= v.epoch());
        if from_coordinator {
            self.set_serving_grantor(Some(from.clone()));
        }
    }
}
