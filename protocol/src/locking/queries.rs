//! Table queries: asking the grantor for its lock table ([`LockNotice::Table`]), and
//! answering as grantor.

use std::collections::BTreeMap;

use conclave_lock_api::wire::{LockMessage, TABLE_LOCKS_MAX};
use conclave_lock_api::{GrantorTable, MemberId, View};

use super::types::LockNotice;
use super::LockMachine;
use crate::time::Instant;

/// The table queries of this member that wait for their answer.
#[derive(Debug)]
pub(super) struct Queries {
    /// Each query waiting for its answer, and the grantor asked.
    asked: BTreeMap<u64, MemberId>,
    /// The number of the next query.
    next: u64,
}

impl Default for Queries {
    fn default() -> Self {
        Self {
            asked: BTreeMap::new(),
            next: 1,
        }
    }
}

impl Queries {
    /// Queries of a named service are numbered from `first` (see [`super::SERVICE_SHIFT`]).
    pub(super) fn start_at(&mut self, first: u64) {
        self.next = first;
    }

    /// The number the next query will have.
    pub(super) fn peek(&self) -> u64 {
        self.next
    }

    /// Numbers a new query.
    fn open(&mut self) -> u64 {
        let query = self.next;
        self.next += 1;
        query
    }

    /// Waits for `grantor`'s answer to `query`.
    fn wait_for(&mut self, query: u64, grantor: MemberId) {
        self.asked.insert(query, grantor);
    }

    /// Whether `query` was waiting for its answer (it no longer does).
    fn answered(&mut self, query: u64) -> bool {
        self.asked.remove(&query).is_some()
    }

    /// Stops waiting for every answer of another grantor than `grantor`, and returns those
    /// queries, in order.
    fn take_stale(&mut self, grantor: Option<&MemberId>) -> Vec<u64> {
        let stale: Vec<u64> = self
            .asked
            .iter()
            .filter(|(_, asked)| Some(*asked) != grantor)
            .map(|(q, _)| *q)
            .collect();
        for query in &stale {
            self.asked.remove(query);
        }
        stale
    }
}

impl LockMachine {
    /// The number [`LockMachine::query_table`] will return next (so a caller can register
    /// for the answer before it asks: the answer may come within the call).
    pub fn next_query(&self) -> u64 {
        self.queries.peek()
    }

    /// Asks the grantor for its lock table; the answer comes as [`LockNotice::Table`] with
    /// the returned query number (at once if this member is the grantor, or if there is none).
    pub fn query_table(&mut self, now: Instant) -> u64 {
        self.enter(now);
        let query = self.queries.open();
        match self.view.as_ref().and(self.client.grantor().cloned()) {
            Some(grantor) if grantor == self.local => {
                let table = self.table_answer(query);
                self.on_table(&grantor, table);
            }
            Some(grantor) => {
                self.queries.wait_for(query, grantor.clone());
                self.outbox
                    .push_back((grantor, LockMessage::TableRequest { query }));
            }
            None => self
                .notices
                .push_back(LockNotice::Table { query, table: None }),
        }
        self.pump(now);
        query
    }

    /// This member's answer, as grantor, to table query `query`.
    pub(super) fn table_answer(&self, query: u64) -> LockMessage {
        let epoch = self.view.as_deref().map_or(0, View::epoch);
        if !self.grantor.is_serving() {
            return LockMessage::Table {
                query,
                epoch,
                unavailable: true,
                truncated: false,
                locks: Vec::new(),
            };
        }
        let (locks, truncated) = self.grantor.table.snapshot(TABLE_LOCKS_MAX, self.last_now);
        LockMessage::Table {
            query,
            epoch,
            unavailable: false,
            truncated,
            locks,
        }
    }

    /// A table answer from `from` (or from this member itself).
    pub(super) fn on_table(&mut self, from: &MemberId, answer: LockMessage) {
        let LockMessage::Table {
            query,
            epoch,
            unavailable,
            truncated,
            locks,
        } = answer
        else {
            return;
        };
        if from != &self.local && !self.queries.answered(query) {
            return; // not ours, or answered already
        }
        let table =
            (!unavailable).then(|| GrantorTable::new(from.clone(), epoch, locks, truncated));
        self.notices.push_back(LockNotice::Table { query, table });
    }

    /// Answers, with `None`, every table query whose grantor is not the view's coordinator.
    pub(super) fn drop_stale_queries(&mut self) {
        let grantor = self.client.grantor().cloned();
        for query in self.queries.take_stale(grantor.as_ref()) {
            self.notices
                .push_back(LockNotice::Table { query, table: None });
        }
    }
}
