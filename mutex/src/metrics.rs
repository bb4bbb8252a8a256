//! What a node reports through the `metrics` facade crate (feature `metrics`): install any recorder (a Prometheus exporter, say) and every node in the process
//! reports to it. Every metric carries the label `member` (the member's name).
//!
//! Counters (totals since the node started; published by the node's driver at most once a
//! second, as absolute values, and when it stops):
//!
//! | name | what |
//! |---|---|
//! | `conclave_grants_total` | grants made by this member as grantor |
//! | `conclave_contended_grants_total` | of those, grants to a request that waited in the queue |
//! | `conclave_reconciliations_total` | lock-table reconciliations completed as grantor |
//! | `conclave_duplicates_resolved_total` | duplicate holders dropped (and told) after a merge |
//! | `conclave_lease_expiries_total` | holds freed by the grantor because their own lease ran out |
//! | `conclave_views_installed_total` | views installed by this member |
//! | `conclave_members_excluded_total` | members excluded as failed by this member as coordinator |
//! | `conclave_takeovers_total` | takeovers of a failed coordinator by this member |
//! | `conclave_segments_sent_total` | reliable-layer data segments sent, retransmissions included |
//! | `conclave_segments_retransmitted_total` | of those, retransmissions |
//! | `conclave_messages_delivered_total` | messages delivered by the reliable layer |
//! | `conclave_cache_hits_total` | local acquisitions served from a node grant, without a message |
//! | `conclave_datagrams_dropped_total` | datagrams dropped, label `cause`: `foreign`, `version`, `malformed` |
//! | `conclave_seal_failures_total` | packets the sealing layer refused, label `cause`: `authentication`, `key_mismatch`, `replayed`, `stale_session`, `out_of_time` |
//!
//! Gauges (published with the counters): `conclave_view_members` (members in this member's
//! view), `conclave_held_locks` (holds of this member's default lock service),
//! `conclave_pending_requests` (its requests waiting for a grant).
//!
//! Histograms (recorded as they happen, in seconds): `conclave_lock_wait_seconds` (from a lock
//! call's first poll to the guard it hands out) and `conclave_lock_hold_seconds` (from the hand-out
//! to the release, or to the moment the guard learnt it was lost), both with the label `mode`
//! (`exclusive` or `shared`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use conclave_lock_api::seal::Sealer;
use conclave_lock_api::LockMode;
use conclave_protocol::EndpointStats;
use metrics::{counter, gauge, histogram};

/// How often the driver publishes the counters at most.
const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// What the driver publishes, besides the protocol's counters.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Gauges {
    pub(crate) view_members: usize,
    pub(crate) held_locks: usize,
    pub(crate) pending_requests: usize,
}

/// The driver's publishing schedule.
#[derive(Debug)]
pub(crate) struct Publisher {
    member: String,
    next: Option<Instant>,
    /// The node's sealing layer, whose refusals are counted.
    sealer: Arc<Sealer>,
}

impl Publisher {
    pub(crate) fn new(member: &str, sealer: Arc<Sealer>) -> Self {
        Self {
            member: member.to_owned(),
            next: None,
            sealer,
        }
    }

    /// Whether it is time to publish again (`force`: the node stops).
    pub(crate) fn due(&mut self, force: bool) -> bool {
        let now = Instant::now();
        if !force && self.next.is_some_and(|next| now < next) {
            return false;
        }
        self.next = Some(now + PUBLISH_EVERY);
        true
    }

    /// Publishes one snapshot.
    pub(crate) fn publish(&self, stats: &EndpointStats, gauges: Gauges) {
        let seal = self.sealer.stats();
        let member = self.member.clone();
        let total = |name: &'static str, value: u64| {
            counter!(name, "member" => member.clone()).absolute(value);
        };
        total("conclave_grants_total", stats.grantor.grants);
        total(
            "conclave_contended_grants_total",
            stats.grantor.contended_grants,
        );
        total(
            "conclave_reconciliations_total",
            stats.grantor.reconciliations,
        );
        total(
            "conclave_duplicates_resolved_total",
            stats.grantor.duplicates_resolved,
        );
        total(
            "conclave_lease_expiries_total",
            stats.grantor.lease_expiries,
        );
        total("conclave_views_installed_total", stats.gms.views_installed);
        total(
            "conclave_members_excluded_total",
            stats.gms.members_excluded,
        );
        total("conclave_takeovers_total", stats.gms.takeovers);
        total("conclave_segments_sent_total", stats.reliable.segments_sent);
        total(
            "conclave_segments_retransmitted_total",
            stats.reliable.segments_retransmitted,
        );
        total(
            "conclave_messages_delivered_total",
            stats.reliable.messages_delivered,
        );
        total("conclave_cache_hits_total", stats.cache.hits);
        for (cause, value) in [
            ("foreign", stats.dropped_foreign),
            ("version", stats.dropped_version),
            ("malformed", stats.dropped_malformed),
        ] {
            counter!("conclave_datagrams_dropped_total", "member" => member.clone(), "cause" => cause)
                .absolute(value);
        }
        for (cause, value) in [
            ("authentication", seal.failed_authentication),
            ("key_mismatch", seal.key_mismatch),
            ("replayed", seal.replayed),
            ("stale_session", seal.stale_session),
            ("out_of_time", seal.out_of_time),
        ] {
            counter!("conclave_seal_failures_total", "member" => member.clone(), "cause" => cause)
                .absolute(value);
        }
        gauge!("conclave_view_members", "member" => member.clone()).set(gauges.view_members as f64);
        gauge!("conclave_held_locks", "member" => member.clone()).set(gauges.held_locks as f64);
        gauge!("conclave_pending_requests", "member" => member).set(gauges.pending_requests as f64);
    }
}

fn mode_label(mode: LockMode) -> &'static str {
    match mode {
        LockMode::Exclusive => "exclusive",
        LockMode::Shared => "shared",
    }
}

/// A lock call handed out a guard after waiting `waited`.
pub(crate) fn lock_waited(member: &str, mode: LockMode, waited: Duration) {
    histogram!("conclave_lock_wait_seconds", "member" => member.to_owned(), "mode" => mode_label(mode))
        .record(waited.as_secs_f64());
}

/// A hold ended after `held`.
pub(crate) fn lock_held(member: &str, mode: LockMode, held: Duration) {
    histogram!("conclave_lock_hold_seconds", "member" => member.to_owned(), "mode" => mode_label(mode))
        .record(held.as_secs_f64());
}
