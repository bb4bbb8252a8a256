//! Driving the members of a Raft run: their outputs (persistence batches to the model disk,
//! packets through the wire codec into the network, events to the lock users and the
//! checkers), the lock users' calls, the checkers run after every step, and the calm phase's
//! liveness: every wait and read answered, a probe lock on every name granted, one empty
//! table everywhere.

use std::time::Duration;

use conclave_lock_api::{LockLostReason, LockMode};

use crate::raft::wire::encode_packet;
use crate::raft::RaftEvent;

use super::check::Belief;
use super::workload::Action;
use super::{fnv, Asked, Probe, Sim, SlotState, Violation};

/// The owner number of the calm phase's probes.
const PROBE_OWNER: u64 = 1_000;

impl Sim {
    /// Takes every member's outputs until none has more: batches go to the disk's write
    /// queue, packets into the network, events to the users and checkers.
    pub(super) fn flush(&mut self) -> Result<(), Violation> {
        for _ in 0..16 {
            let mut progress = false;
            for index in 0..self.slots.len() {
                if self.slots[index].paused_until.is_some() {
                    continue;
                }
                let Some(node) = self.slots[index].node.as_mut() else {
                    continue;
                };
                let batches: Vec<_> = std::iter::from_fn(|| node.poll_persist()).collect();
                let transmits: Vec<_> = std::iter::from_fn(|| node.poll_transmit()).collect();
                let events: Vec<_> = std::iter::from_fn(|| node.poll_event()).collect();
                if batches.is_empty() && transmits.is_empty() && events.is_empty() {
                    continue;
                }
                progress = true;
                for batch in batches {
                    if self.trace {
                        println!(
                            "{:?} node {index}: batch {} polled: snapshot {:?}, entries {:?}, hard state {:?}",
                            self.now,
                            batch.seq,
                            batch.snapshot.as_ref().map(|s| s.index),
                            batch.entries.first().zip(batch.entries.last()).map(|(a, b)| (a.index, b.index)),
                            batch.hard_state
                        );
                    }
                    let slot = &self.slots[index];
                    let base = slot
                        .fsync
                        .back()
                        .map_or(self.now, |(due, _)| (*due).max(self.now));
                    let max = u64::try_from(self.config.max_fsync.as_nanos()).unwrap_or(0);
                    let due = base + Duration::from_nanos(self.rng.below(max.max(1)));
                    self.slots[index].fsync.push_back((due, batch));
                }
                for (to, packet) in transmits {
                    let Some(to) = self.slots.iter().position(|s| s.name == to) else {
                        continue;
                    };
                    let bytes = encode_packet(self.cluster, &packet);
                    self.network.send(&mut self.rng, self.now, index, to, bytes);
                }
                for event in events {
                    if self.slots[index].node.is_none() {
                        break;
                    }
                    self.on_event(index, event)?;
                }
            }
            if !progress {
                break;
            }
        }
        Ok(())
    }

    fn on_event(&mut self, index: usize, event: RaftEvent) -> Result<(), Violation> {
        if self.trace {
            match &event {
                RaftEvent::Compact(r) | RaftEvent::Installed(r) => {
                    let kind = if matches!(event, RaftEvent::Compact(_)) {
                        "Compact"
                    } else {
                        "Installed"
                    };
                    println!(
                        "{:?} node {index}: {kind} at {} (term {})",
                        self.now, r.index, r.term
                    );
                }
                _ => println!("{:?} node {index}: {event:?}", self.now),
            }
        }
        match event {
            RaftEvent::Granted {
                request,
                token,
                adopted,
            } => self.on_granted(index, request, token, adopted)?,
            RaftEvent::Queued { .. } => self.report.workload.queued += 1,
            RaftEvent::Busy { request } => {
                self.report.workload.busy += 1;
                self.end_request(index, request);
            }
            RaftEvent::Released { request } | RaftEvent::Withdrawn { request } => {
                self.end_request(index, request);
            }
            RaftEvent::CutOff { request } => {
                self.report.workload.cut_off += 1;
                self.end_request(index, request);
            }
            RaftEvent::Lost {
                request, reason, ..
            } => {
                let w = &mut self.report.workload;
                match reason {
                    LockLostReason::Minority => w.lost_minority += 1,
                    LockLostReason::LeaseExpired => w.lost_lease += 1,
                    _ => w.lost_other += 1,
                }
                self.end_request(index, request);
            }
            RaftEvent::Leader(_) => {
                self.report.engine.leader_changes += 1;
                if let Some(node) = self.slots[index].node.as_ref() {
                    let term = node.term();
                    self.report.engine.max_term = self.report.engine.max_term.max(term);
                }
            }
            RaftEvent::TableReady { query } => {
                let Some(node) = self.slots[index].node.as_ref() else {
                    return Ok(());
                };
                let (member, applied) = (node.member().clone(), node.applied_index());
                self.report.workload.reads_answered += 1;
                if let Err(broken) = self.checks.read_ready(index, &member, query, applied) {
                    return Err(self.broken(broken));
                }
            }
            RaftEvent::Compact(record) => {
                self.report.engine.snapshots_made += 1;
                self.harvest(index)?;
                self.slots[index].disk.compact(&record);
            }
            RaftEvent::Installed(_) => self.report.engine.snapshots_installed += 1,
            RaftEvent::Left => {
                if matches!(self.slots[index].state, SlotState::Leaving { .. }) {
                    self.stop(index);
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn on_granted(
        &mut self,
        index: usize,
        request: u64,
        token: conclave_lock_api::FencingToken,
        adopted: bool,
    ) -> Result<(), Violation> {
        let slot = &self.slots[index];
        let Some(node) = slot.node.as_ref() else {
            return Ok(());
        };
        let member = node.member().clone();
        let Some(Asked {
            actor,
            key,
            mode,
            leased,
            at,
        }) = slot.requests.get(&request)
        else {
            return Err(self.violation(
                "a grant answers a request of this incarnation",
                format!("node {index} ({member}): request {request} granted {token:?}"),
            ));
        };
        let (actor, key, mode, leased, at) = (*actor, key.clone(), *mode, *leased, *at);
        self.report.workload.granted += 1;
        self.report.workload.adopted += u64::from(adopted);
        self.report.trace_hash = fnv(self.report.trace_hash, &token.0.to_le_bytes());
        if let Err(broken) = self
            .checks
            .on_granted(self.now, &member, request, &key, at, token, adopted)
        {
            return Err(self.broken(broken));
        }
        let believed = match actor {
            Some(a) => self.slots[index]
                .actors
                .get(a)
                .is_some_and(|actor| actor.request() == Some(request) && !actor.is_idle()),
            None => self
                .probes
                .probes
                .iter()
                .any(|p| p.slot == index && p.request == Some(request)),
        };
        if !believed {
            return Ok(());
        }
        let belief = Belief {
            key,
            mode,
            token,
            since: self.now,
        };
        self.slots[index].beliefs.insert(request, belief);
        match actor {
            Some(a) => {
                let w = self.config.workload.clone();
                if let Some(actor) = self.slots[index].actors.get_mut(a) {
                    actor.granted(&mut self.rng, self.now, &w, leased, self.calm);
                }
            }
            None => {
                for probe in &mut self.probes.probes {
                    if probe.slot == index && probe.request == Some(request) {
                        probe.granted = true;
                    }
                }
            }
        }
        Ok(())
    }

    /// A request ended without its user: it believes nothing of it any more, and thinks again.
    fn end_request(&mut self, index: usize, request: u64) {
        for probe in &mut self.probes.probes {
            if probe.slot == index && probe.request == Some(request) && !probe.granted {
                probe.request = None;
            }
        }
        let slot = &mut self.slots[index];
        slot.beliefs.remove(&request);
        let Some(a) = slot.requests.get(&request).and_then(|asked| asked.actor) else {
            return;
        };
        let w = self.config.workload.clone();
        if let Some(actor) = self.slots[index].actors.get_mut(a) {
            if actor.request() == Some(request) {
                actor.ended(&mut self.rng, self.now, &w);
            }
        }
    }

    /// The lock users of slot `index` act if due.
    pub(super) fn run_actors(&mut self, index: usize) {
        let w = self.config.workload.clone();
        let issue = !self.calm;
        let local = self.local(index);
        for a in 0..self.slots[index].actors.len() {
            let Some(action) = self.slots[index].actors[a].tick(&mut self.rng, self.now, &w, issue)
            else {
                continue;
            };
            if self.trace {
                println!("{:?} node {index} actor {a}: {action:?}", self.now);
            }
            let floor = self.read_floor();
            let slot = &mut self.slots[index];
            let Some(node) = slot.node.as_mut() else {
                return;
            };
            let stats = &mut self.report.workload;
            match action {
                Action::Lock {
                    lock,
                    mode,
                    wait,
                    lease,
                    timeout,
                } => {
                    let request = slot.next_request;
                    slot.next_request += 1;
                    let key = self.keys[lock].clone();
                    node.lock(local, request, key.clone(), a as u64 + 1, mode, wait, lease);
                    slot.requests.insert(
                        request,
                        Asked {
                            actor: Some(a),
                            key,
                            mode,
                            leased: lease.is_some(),
                            at: self.now,
                        },
                    );
                    slot.actors[a].waiting(self.now, request, timeout);
                    if self.trace {
                        println!("{:?} node {index} actor {a}: request {request}", self.now);
                    }
                    stats.requests += 1;
                }
                Action::Cancel(request) => {
                    slot.beliefs.remove(&request);
                    node.cancel(local, request);
                    stats.timeouts += 1;
                }
                Action::Unlock(request) => {
                    slot.beliefs.remove(&request);
                    node.unlock(local, request);
                    stats.unlocked += 1;
                }
                Action::Extend(request, lease) => {
                    node.extend(local, request, lease);
                    stats.extends += 1;
                }
                Action::Read => {
                    let query = slot.next_query;
                    slot.next_query += 1;
                    let member = node.member().clone();
                    node.read_table(local, query);
                    self.checks.read_asked(index, &member, query, floor);
                    stats.reads += 1;
                }
            }
        }
    }

    /// Everything committed anywhere now: a read asked now must see at least this.
    fn read_floor(&self) -> u64 {
        self.slots
            .iter()
            .filter_map(|s| s.node.as_ref().map(|n| n.applied_index()))
            .chain(self.slots.iter().map(|s| s.disk.commit()))
            .max()
            .unwrap_or(0)
            .max(self.checks.committed())
    }

    /// The checkers of every step: exclusion of believed holds, tables at equal indexes and
    /// no grant to gone incarnations.
    pub(super) fn check_step(&mut self) -> Result<(), Violation> {
        // A user believes a hold while it has not given it up and its node says it may (its
        // session and the hold's lease by its own clock): paused processes included.
        let now = self.now;
        let holds: Vec<(usize, u64, &Belief)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((i, s, s.node.as_ref()?)))
            .flat_map(|(i, s, node)| {
                let local = s.clock.local(now);
                s.beliefs
                    .iter()
                    .filter(move |(r, _)| node.believes(local, **r))
                    .map(move |(r, b)| (i, *r, b))
            })
            .collect();
        if let Err(broken) = self.checks.check_exclusion(&holds) {
            return Err(self.broken(broken));
        }
        let rescan = std::mem::take(&mut self.rescan);
        for index in 0..self.slots.len() {
            let Some(node) = self.slots[index].node.as_ref() else {
                continue;
            };
            let applied = node.applied_index();
            let result = if applied != self.slots[index].applied_seen {
                self.checks.check_table(index, node)
            } else if rescan {
                self.checks.check_gone(index, node)
            } else {
                Ok(())
            };
            if let Err(broken) = result {
                return Err(self.broken(broken));
            }
            self.slots[index].applied_seen = applied;
        }
        Ok(())
    }

    /// The calm phase's progress: once every member is up, joined, idle and without reads in
    /// flight, probe every lock name; once every probe was granted (and given back), every
    /// member must reach one table, with no lock in it. `true` then.
    pub(super) fn settle(&mut self) -> Result<bool, Violation> {
        for (index, slot) in self.slots.iter().enumerate() {
            let ready = matches!(slot.state, SlotState::Up)
                && slot.paused_until.is_none()
                && slot.node.as_ref().is_some_and(|n| n.has_joined())
                && slot.actors.iter().all(|a| a.is_idle())
                && self.checks.reads_pending(index) == 0;
            if !ready {
                return Ok(false);
            }
        }
        if !self.probes.started {
            self.probes.started = true;
            let n = self.slots.len();
            self.probes.probes = (0..self.keys.len())
                .map(|key| Probe {
                    slot: key % n,
                    key,
                    request: None,
                    granted: false,
                })
                .collect();
        }
        let mut asked = false;
        for p in 0..self.probes.probes.len() {
            let (index, key, request, granted) = {
                let probe = &self.probes.probes[p];
                (probe.slot, probe.key, probe.request, probe.granted)
            };
            match request {
                None => {
                    let local = self.local(index);
                    let key_name = self.keys[key].clone();
                    let slot = &mut self.slots[index];
                    let request = slot.next_request;
                    slot.next_request += 1;
                    if let Some(node) = slot.node.as_mut() {
                        node.lock(
                            local,
                            request,
                            key_name.clone(),
                            PROBE_OWNER,
                            LockMode::Exclusive,
                            true,
                            None,
                        );
                    }
                    slot.requests.insert(
                        request,
                        Asked {
                            actor: None,
                            key: key_name,
                            mode: LockMode::Exclusive,
                            leased: false,
                            at: self.now,
                        },
                    );
                    self.probes.probes[p].request = Some(request);
                    self.trace(format_args!("node {index}: probe {request} on lock {key}"));
                    asked = true;
                }
                // Granted and believed through one check: give it back.
                Some(request) if granted => {
                    if self.slots[index].beliefs.remove(&request).is_some() {
                        let local = self.local(index);
                        if let Some(node) = self.slots[index].node.as_mut() {
                            node.unlock(local, request);
                            self.report.workload.probes += 1;
                            asked = true;
                        }
                    }
                }
                Some(_) => {}
            }
        }
        if asked {
            self.flush()?;
        }
        if !self.probes.probes.iter().all(|p| p.granted) {
            return Ok(false);
        }
        let nodes: Vec<_> = self.slots.iter().filter_map(|s| s.node.as_ref()).collect();
        let Some(first) = nodes.first() else {
            return Ok(false);
        };
        let same = nodes
            .iter()
            .all(|n| n.applied_index() == first.applied_index() && n.table() == first.table());
        Ok(same && first.locks(None, 1).0.is_empty())
    }

    /// The calm bound passed without liveness: what each member was doing.
    pub(super) fn no_liveness(&self) -> Violation {
        let slots: Vec<String> = self
            .slots
            .iter()
            .enumerate()
            .map(|(i, s)| match &s.node {
                Some(node) => format!(
                    "node {i} {:?}: {node:?}, joined {}, resigned {}, paused {}, actors {:?}, reads {}, locks {:?}",
                    s.state,
                    node.has_joined(),
                    node.is_resigned(),
                    s.paused_until.is_some(),
                    s.actors,
                    self.checks.reads_pending(i),
                    node.locks(None, usize::MAX).0
                ),
                None => format!("node {i} {:?}", s.state),
            })
            .collect();
        self.violation(
            "once faults stop, every wait and read is answered, a new lock on every name is granted and every member reaches one empty table, within the calm bound",
            format!("probes {:?}; {}", self.probes, slots.join("; ")),
        )
    }
}
