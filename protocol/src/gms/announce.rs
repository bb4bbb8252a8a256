//! What a member says on the discovery channel: the settings every member must share, and,
//! as coordinator, when it next announces its view.

use std::time::Duration;

use conclave_lock_api::wire::{first_setting_mismatch, Discovery, SharedSetting};
use conclave_lock_api::{MemberId, View};

use crate::time::Instant;

/// How often a refused join or merge is logged at most.
const MISMATCH_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// A setting every member must share that differs between two members.
#[derive(Debug)]
pub(super) struct Mismatch {
    /// The setting's name.
    pub(super) setting: String,
    /// This member's value.
    pub(super) ours: String,
    /// The other member's value.
    pub(super) theirs: String,
    /// Whether to log it (refusals are logged at most every few seconds).
    pub(super) log: bool,
}

/// A member's voice on the discovery channel.
#[derive(Debug)]
pub(super) struct Announcer {
    /// As coordinator: when it next announces its view.
    next: Option<Instant>,
    /// Jitter of the announcements (xorshift state).
    rng: u64,
    /// The settings every member of the cluster must share; joins and merges compare them.
    settings: Vec<SharedSetting>,
    /// When a refused join or merge was last logged (rate-limited).
    mismatch_logged: Option<Instant>,
}

impl Announcer {
    /// The announcer of `local`, which announces nothing until [`Announcer::start`].
    pub(super) fn new(local: &MemberId) -> Self {
        // Jitter only needs to differ between members: the random incarnation id seeds it.
        let rng = (local.incarnation() as u64) ^ ((local.incarnation() >> 64) as u64) | 1;
        Announcer {
            next: None,
            rng,
            settings: Vec::new(),
            mismatch_logged: None,
        }
    }

    /// The settings every member must share.
    pub(super) fn settings(&self) -> &[SharedSetting] {
        &self.settings
    }

    /// Sets the settings every member must share.
    pub(super) fn set_settings(&mut self, settings: Vec<SharedSetting>) {
        self.settings = settings;
    }

    /// The first setting in which `theirs` differs from ours, seen at `now`, if any.
    pub(super) fn mismatch(&mut self, now: Instant, theirs: &[SharedSetting]) -> Option<Mismatch> {
        let (setting, ours, theirs) = first_setting_mismatch(&self.settings, theirs)?;
        let mismatch = Mismatch {
            setting: setting.to_owned(),
            ours: ours.to_owned(),
            theirs: theirs.to_owned(),
            log: self
                .mismatch_logged
                .is_none_or(|at| now.saturating_duration_since(at) >= MISMATCH_LOG_INTERVAL),
        };
        if mismatch.log {
            self.mismatch_logged = Some(now);
        }
        Some(mismatch)
    }

    /// When the next announcement is due.
    pub(super) fn deadline(&self) -> Option<Instant> {
        self.next
    }

    /// Whether an announcement is due at `now`.
    pub(super) fn due(&self, now: Instant) -> bool {
        self.next.is_some_and(|t| now >= t)
    }

    /// Starts announcing at `now` (the member became coordinator).
    pub(super) fn start(&mut self, now: Instant) {
        self.next = Some(now);
    }

    /// Stops announcing (the member no longer coordinates).
    pub(super) fn stop(&mut self) {
        self.next = None;
    }

    /// Announces `view` at `now`, naming the coordinators `heard`; the next announcement is
    /// due after `interval` and up to a quarter of it more, so coordinators drift apart.
    pub(super) fn announce(
        &mut self,
        now: Instant,
        interval: Duration,
        view: &View,
        heard: Vec<u128>,
    ) -> Discovery {
        let jitter = self.jitter(interval / 4);
        self.next = Some(now + interval + jitter);
        Discovery::Announce {
            view: view.clone(),
            heard,
            settings: self.settings.clone(),
        }
    }

    /// The answer to a joiner's ping: `view`, naming nobody heard.
    pub(super) fn reply(&self, view: &View) -> Discovery {
        Discovery::Announce {
            view: view.clone(),
            heard: Vec::new(),
            settings: self.settings.clone(),
        }
    }

    /// A pseudo-random duration in `[0, max)` (xorshift; determinism comes from the seed).
    fn jitter(&mut self, max: Duration) -> Duration {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        let nanos = u64::try_from(max.as_nanos()).unwrap_or(u64::MAX).max(1);
        Duration::from_nanos(self.rng % nanos)
    }
}
