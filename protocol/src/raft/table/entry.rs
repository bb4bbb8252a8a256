//! One lock of the table: its holders and its queue, and the outcomes that name them.

use std::collections::VecDeque;

use conclave_lock_api::wire::{TableHolder, TableLock, TableWaiter};
use conclave_lock_api::{FencingToken, LockLostReason, LockMode, LockName, MemberId, OwnerId};
use serde::{Deserialize, Serialize};

use crate::raft::command::{Applied, LockKey};

/// A granted request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Hold {
    /// The incarnation that asked.
    pub(super) member: MemberId,
    /// Its request number.
    pub(super) request: u64,
    /// The owner on that member.
    pub(super) owner: u64,
    /// The mode held.
    pub(super) mode: LockMode,
    /// The token of the grant (a new one when the hold is adopted).
    pub(super) token: FencingToken,
    /// The hold's own lease as granted or last extended.
    pub(super) lease_ms: Option<u64>,
    /// A newer incarnation of the member joined since: a recovered hold, which that one may
    /// adopt or drop.
    pub(super) recovered: bool,
}

/// A queued request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Wait {
    /// The incarnation that asked.
    pub(super) member: MemberId,
    /// Its request number.
    pub(super) request: u64,
    /// The owner on that member.
    pub(super) owner: u64,
    /// The mode asked for.
    pub(super) mode: LockMode,
    /// The lease the hold gets when granted.
    pub(super) lease_ms: Option<u64>,
}

/// One lock's holders and queue (a lock with neither is not kept).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct LockEntry {
    /// One exclusive holder, or any number of shared ones, in grant order.
    pub(super) holders: Vec<Hold>,
    /// The waiters, first in line first.
    pub(super) queue: VecDeque<Wait>,
}

impl LockEntry {
    /// Whether a request in `mode` may hold together with the holders (the queue aside).
    pub(super) fn compatible(&self, mode: LockMode) -> bool {
        match mode {
            LockMode::Exclusive => self.holders.is_empty(),
            LockMode::Shared => self.holders.iter().all(|h| h.mode == LockMode::Shared),
        }
    }

    /// Whether nothing holds or waits.
    pub(super) fn is_unused(&self) -> bool {
        self.holders.is_empty() && self.queue.is_empty()
    }

    /// Whether the head of the queue may be granted now.
    pub(super) fn head_grantable(&self) -> bool {
        self.queue.front().is_some_and(|w| self.compatible(w.mode))
    }

    /// Grants the head of the queue with `token`; the new hold.
    pub(super) fn grant_head(&mut self, token: FencingToken) -> Option<&Hold> {
        let wait = self.queue.pop_front()?;
        self.holders.push(wait.into_hold(token));
        self.holders.last()
    }

    /// The hold of `(member, request)`.
    pub(super) fn hold_mut(&mut self, member: &MemberId, request: u64) -> Option<&mut Hold> {
        self.holders
            .iter_mut()
            .find(|h| h.request == request && h.member == *member)
    }

    /// Removes and returns the hold of `(member, request)`.
    pub(super) fn remove_hold(&mut self, member: &MemberId, request: u64) -> Option<Hold> {
        let at = self
            .holders
            .iter()
            .position(|h| h.request == request && h.member == *member)?;
        Some(self.holders.remove(at))
    }

    /// Removes and returns the wait of `(member, request)`.
    pub(super) fn remove_wait(&mut self, member: &MemberId, request: u64) -> Option<Wait> {
        let at = self
            .queue
            .iter()
            .position(|w| w.request == request && w.member == *member)?;
        self.queue.remove(at)
    }

    /// Removes and returns the holds `pred` selects, in grant order.
    pub(super) fn take_holds(&mut self, pred: impl Fn(&Hold) -> bool) -> Vec<Hold> {
        let (taken, kept) = std::mem::take(&mut self.holders)
            .into_iter()
            .partition(|h| pred(h));
        self.holders = kept;
        taken
    }

    /// Removes and returns the waits `pred` selects, in queue order.
    pub(super) fn take_waits(&mut self, pred: impl Fn(&Wait) -> bool) -> Vec<Wait> {
        let (taken, kept): (Vec<Wait>, Vec<Wait>) = self.queue.drain(..).partition(|w| pred(w));
        self.queue = kept.into();
        taken
    }

    /// The lock as the grantor-table wire type.
    pub(super) fn to_table_lock(&self, name: &LockName) -> TableLock {
        TableLock {
            name: name.clone(),
            holders: self
                .holders
                .iter()
                .map(|h| TableHolder {
                    owner: h.owner_id(),
                    mode: h.mode,
                    token: h.token,
                    lease_ms: h.lease_ms,
                })
                .collect(),
            waiters: self
                .queue
                .iter()
                .map(|w| TableWaiter {
                    owner: w.owner_id(),
                    mode: w.mode,
                })
                .collect(),
        }
    }
}

impl Hold {
    /// The owner as the API names it.
    pub(super) fn owner_id(&self) -> OwnerId {
        OwnerId {
            member: self.member.clone(),
            local: self.owner,
        }
    }

    /// [`Applied::Granted`] for this hold.
    pub(super) fn granted(&self, key: &LockKey, adopted: bool) -> Applied {
        Applied::Granted {
            member: self.member.clone(),
            request: self.request,
            key: key.clone(),
            owner: self.owner_id(),
            mode: self.mode,
            token: self.token,
            lease_ms: self.lease_ms,
            adopted,
        }
    }

    /// [`Applied::Released`] for this hold.
    pub(super) fn released(&self, key: &LockKey) -> Applied {
        Applied::Released {
            member: self.member.clone(),
            request: self.request,
            key: key.clone(),
            owner: self.owner_id(),
            token: self.token,
        }
    }

    /// [`Applied::Lost`] for this hold.
    pub(super) fn lost(&self, key: &LockKey, reason: LockLostReason) -> Applied {
        Applied::Lost {
            member: self.member.clone(),
            request: self.request,
            key: key.clone(),
            owner: self.owner_id(),
            token: Some(self.token),
            reason,
        }
    }
}

impl Wait {
    /// The owner as the API names it.
    pub(super) fn owner_id(&self) -> OwnerId {
        OwnerId {
            member: self.member.clone(),
            local: self.owner,
        }
    }

    /// The hold this wait becomes when granted with `token`.
    pub(super) fn into_hold(self, token: FencingToken) -> Hold {
        Hold {
            member: self.member,
            request: self.request,
            owner: self.owner,
            mode: self.mode,
            token,
            lease_ms: self.lease_ms,
            recovered: false,
        }
    }

    /// [`Applied::Queued`] for this wait at `position` (from 1).
    pub(super) fn queued(&self, key: &LockKey, position: u32) -> Applied {
        Applied::Queued {
            member: self.member.clone(),
            request: self.request,
            key: key.clone(),
            owner: self.owner_id(),
            mode: self.mode,
            position,
        }
    }

    /// [`Applied::Withdrawn`] for this wait.
    pub(super) fn withdrawn(&self, key: &LockKey) -> Applied {
        Applied::Withdrawn {
            member: self.member.clone(),
            request: self.request,
            key: key.clone(),
            owner: self.owner_id(),
        }
    }

    /// [`Applied::Lost`] for this wait (no token).
    pub(super) fn lost(&self, key: &LockKey, reason: LockLostReason) -> Applied {
        Applied::Lost {
            member: self.member.clone(),
            request: self.request,
            key: key.clone(),
            owner: self.owner_id(),
            token: None,
            reason,
        }
    }

    /// [`Applied::Busy`] for this request.
    pub(super) fn busy(&self, key: &LockKey) -> Applied {
        Applied::Busy {
            member: self.member.clone(),
            request: self.request,
            key: key.clone(),
        }
    }
}
