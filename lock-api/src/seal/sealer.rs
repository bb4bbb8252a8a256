//! The sans-IO core of sealing: seals outgoing datagrams, opens, authenticates and
//! de-duplicates incoming ones, counts and logs what it drops.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use aes_gcm::Aes256Gcm;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::format::{
    self, Destination, FormatError, Notice, SealedHeader, NOTICE_MAGIC, SEALED_MAGIC,
};
use super::key::KeyId;
use super::keyring::Keyring;
use super::window::{Verdict, Windows, MAX_SENDERS};
use crate::wire::ClusterId;

/// How often each kind of drop is logged at most (the rest are counted).
const LOG_EVERY: Duration = Duration::from_secs(5);
/// How often at most one address is sent a rejection notice.
const NOTICE_EVERY: Duration = Duration::from_secs(1);
/// The most addresses whose last notice time is remembered.
const NOTICE_TABLE_MAX: usize = 1024;
/// The most rejection notices sent per second, to all addresses together.
const NOTICES_PER_SECOND: u32 = 16;
/// How far a packet's sealing time may lie from the receiver's wall clock, either way: older
/// packets are replays (or late beyond use), and members' clocks must agree within it.
pub const MAX_AGE: Duration = Duration::from_secs(120);

/// Counters of a member's sealing layer, from its start.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct SealStats {
    /// Datagrams sealed and handed to the transport.
    pub sealed: u64,
    /// Packets that opened, were fresh, and were delivered.
    pub opened: u64,
    /// Sealed packets of this cluster that did not open: an unknown key id, a wrong key, or
    /// bytes changed on the way (forged).
    pub failed_authentication: u64,
    /// Plain (unsealed) packets received by a member with a key, or sealed ones by a member
    /// without.
    pub key_mismatch: u64,
    /// Authentic packets seen before (replayed or duplicated) or too far behind the window.
    pub replayed: u64,
    /// Authentic packets of a sender's earlier session (a process since restarted).
    pub stale_session: u64,
    /// Packets sealed more than [`MAX_AGE`] before (or after) the receiver's wall clock:
    /// replays of old traffic, or a sender whose clock is off.
    pub out_of_time: u64,
    /// Bytes that are no packet of this cluster (another cluster's, garbage, truncated).
    pub foreign: u64,
    /// Rejection notices sent to members whose packets did not open.
    pub notices_sent: u64,
    /// Rejection notices received: some member could not open this member's packets.
    pub notices_received: u64,
}

/// A rejection this member met: the latest notice, about one of its own packets, saying that
/// another member cannot open it — it and that member hold different keys (or only one of
/// them holds one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// The other member's transport address.
    pub peer: SocketAddr,
    /// The key this member sends with (`None`: it has no key).
    pub ours: Option<KeyId>,
    /// The key the other member uses, where known (`None`: it has no key, or did not say).
    pub theirs: Option<KeyId>,
}

/// What [`Sealer::open`] made of a received datagram.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// An authentic, fresh datagram: hand it to the protocol.
    Datagram(Vec<u8>),
    /// Dropped (counted and, rate-limited, logged). If `notice` is set, send it back to the
    /// datagram's source: it tells the sender its packets do not open here.
    Dropped {
        /// A rejection notice to send to the source.
        notice: Option<Vec<u8>>,
    },
}

#[derive(Default)]
struct Counters {
    sealed: AtomicU64,
    opened: AtomicU64,
    failed_authentication: AtomicU64,
    key_mismatch: AtomicU64,
    replayed: AtomicU64,
    stale_session: AtomicU64,
    out_of_time: AtomicU64,
    foreign: AtomicU64,
    notices_sent: AtomicU64,
    notices_received: AtomicU64,
}

#[derive(Default)]
struct Receive {
    windows: Windows,
    logged: HashMap<&'static str, (Option<Instant>, u64)>,
    notified: HashMap<SocketAddr, Instant>,
    /// Notices that may still be sent in the current second, and when it started.
    notice_budget: (Option<Instant>, u32),
    rejection: Option<Rejection>,
    /// The session cipher each sender used last (derived once per session and key).
    ciphers: HashMap<SocketAddr, (KeyId, [u8; 16], Aes256Gcm)>,
}

/// Seals and opens one member's datagrams: the sans-IO part of [`super::SealedTransport`].
///
/// With a [`Keyring`], every datagram is sealed with the primary key under a nonce made of
/// this sealer's session id and a counter, and a received packet is delivered only if it
/// opens with an installed key and is fresh for its sender. Without one (`None`), datagrams
/// pass unchanged, and sealed packets and notices received are counted as a key mismatch so
/// that a member without a key can say why nobody answers it.
///
/// ```
/// use conclave_lock_api::seal::{ClusterKey, Keyring, Opened, Sealer};
/// use conclave_lock_api::wire::ClusterId;
/// use std::time::Instant;
///
/// let ring = Keyring::new(ClusterKey::from_bytes([7; 32]));
/// let cluster = ClusterId::from_name("orders");
/// let alice = Sealer::new(cluster, Some(ring.clone()), "127.0.0.1:7800".parse()?)?;
/// let bob = Sealer::new(cluster, Some(ring), "127.0.0.1:7801".parse()?)?;
/// let packet = alice.seal(Some("127.0.0.1:7801".parse()?), b"CNCL...")?;
/// let from = "127.0.0.1:7800".parse()?;
/// assert_eq!(bob.open(Instant::now(), from, &packet), Opened::Datagram(b"CNCL...".to_vec()));
/// // The same packet again is a replay.
/// assert!(matches!(bob.open(Instant::now(), from, &packet), Opened::Dropped { .. }));
/// assert_eq!(bob.stats().replayed, 1);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct Sealer {
    cluster: ClusterId,
    keys: Option<Keyring>,
    local: SocketAddr,
    session: [u8; 16],
    counter: AtomicU64,
    /// The cipher of this sender's session under its primary key, derived on first use.
    send: RwLock<Option<(KeyId, Arc<Aes256Gcm>)>>,
    counters: Counters,
    receive: Mutex<Receive>,
}

impl Sealer {
    /// A sealer for the member at `local` (its transport address, named in every packet it
    /// seals) in `cluster`, sealing with `keys` (none: passing datagrams unchanged).
    ///
    /// Its session id is the current time in nanoseconds since the Unix epoch, then 8 random
    /// bytes: see [the nonce construction](super#nonces).
    ///
    /// # Errors
    /// [`super::KeyError::Random`] if the system's random source fails.
    pub fn new(
        cluster: ClusterId,
        keys: Option<Keyring>,
        local: SocketAddr,
    ) -> Result<Self, super::KeyError> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(1, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
            .max(1);
        let mut session = [0u8; 16];
        session[..8].copy_from_slice(&nanos.to_be_bytes());
        getrandom::fill(&mut session[8..]).map_err(|e| super::KeyError::Random(e.to_string()))?;
        Ok(Self {
            cluster,
            keys,
            local,
            session,
            counter: AtomicU64::new(0),
            send: RwLock::new(None),
            counters: Counters::default(),
            receive: Mutex::new(Receive::default()),
        })
    }

    /// This sealer's session id (public: every packet it seals names it).
    pub fn session(&self) -> [u8; 16] {
        self.session
    }

    /// The keyring, if this member has one.
    pub fn keyring(&self) -> Option<&Keyring> {
        self.keys.as_ref()
    }

    /// How many bytes sealing adds to a datagram: [`super::SEAL_OVERHEAD`] with a keyring,
    /// zero without.
    pub fn overhead(&self) -> usize {
        if self.keys.is_some() {
            format::SEAL_OVERHEAD
        } else {
            0
        }
    }

    /// Seals one datagram for sending to the member at `to` (`None`: to the discovery
    /// channel); without a keyring, a copy of it.
    ///
    /// # Errors
    /// None today; the `Result` leaves room for a keyring that can refuse.
    pub fn seal(&self, to: Option<SocketAddr>, datagram: &[u8]) -> std::io::Result<Vec<u8>> {
        self.seal_at(wall_ms(), to, datagram)
    }

    pub(crate) fn seal_at(
        &self,
        sent_ms: u64,
        to: Option<SocketAddr>,
        datagram: &[u8],
    ) -> std::io::Result<Vec<u8>> {
        let Some(keys) = &self.keys else {
            return Ok(datagram.to_vec());
        };
        // The key id in the header and the cipher come from one look at the keyring, so a
        // concurrent switch of the primary key cannot pair one key's id with another's cipher.
        let ring = keys.read();
        let primary = ring.primary();
        let key = primary.id();
        let cached = {
            let cached = self.send.read().unwrap_or_else(PoisonError::into_inner);
            match &*cached {
                Some((id, cipher)) if *id == key => Some(cipher.clone()),
                _ => None,
            }
        };
        let cipher = match cached {
            Some(cipher) => cipher,
            None => {
                let cipher = Arc::new(primary.session_cipher(&self.session));
                *self.send.write().unwrap_or_else(PoisonError::into_inner) =
                    Some((key, cipher.clone()));
                cipher
            }
        };
        drop(ring);
        let header = SealedHeader {
            cluster: self.cluster,
            key,
            session: self.session,
            counter: self.counter.fetch_add(1, Ordering::Relaxed),
            sent_ms,
            sender: self.local,
            discovery: to.is_none(),
        };
        let to = to.map_or(Destination::Discovery, Destination::Member);
        let packet = format::seal(&cipher, &header, to, datagram);
        self.counters.sealed.fetch_add(1, Ordering::Relaxed);
        Ok(packet)
    }

    /// Judges one received datagram from transport address `from` at `now`.
    pub fn open(&self, now: Instant, from: SocketAddr, bytes: &[u8]) -> Opened {
        self.open_at(now, wall_ms(), from, bytes)
    }

    pub(crate) fn open_at(
        &self,
        now: Instant,
        wall_ms: u64,
        from: SocketAddr,
        bytes: &[u8],
    ) -> Opened {
        let mut receive = self.receive.lock().unwrap_or_else(PoisonError::into_inner);
        let receive = &mut *receive;
        if bytes.starts_with(&NOTICE_MAGIC) {
            return self.notice_received(receive, now, from, bytes);
        }
        let Some(keys) = &self.keys else {
            if bytes.starts_with(&SEALED_MAGIC) {
                let key = SealedHeader::read(bytes)
                    .ok()
                    .filter(|h| h.cluster == self.cluster);
                if let Some(header) = key {
                    self.counters.key_mismatch.fetch_add(1, Ordering::Relaxed);
                    log(receive, now, "sealed", || {
                        tracing::warn!(%from, key_id = %header.key, "sealed packet from {from} (key id {}): this member has no cluster key", header.key);
                    });
                    return self.dropped_with_notice(
                        receive,
                        now,
                        from,
                        bytes.len(),
                        Some(header.key),
                        header.session,
                    );
                }
                self.counters.foreign.fetch_add(1, Ordering::Relaxed);
                return Opened::Dropped { notice: None };
            }
            self.counters.opened.fetch_add(1, Ordering::Relaxed);
            return Opened::Datagram(bytes.to_vec());
        };
        let header = match SealedHeader::read(bytes) {
            Ok(header) if header.cluster == self.cluster => header,
            Ok(_)
            | Err(FormatError::Truncated | FormatError::Version(_) | FormatError::Malformed) => {
                self.counters.foreign.fetch_add(1, Ordering::Relaxed);
                log(receive, now, "foreign", || {
                    tracing::debug!(%from, len = bytes.len(), "packet from {from} is not of this cluster; dropped");
                });
                return Opened::Dropped { notice: None };
            }
            Err(FormatError::NotSealed) => {
                if crate::wire::Header::read(bytes).is_ok_and(|h| h.cluster == self.cluster) {
                    self.counters.key_mismatch.fetch_add(1, Ordering::Relaxed);
                    log(receive, now, "unsealed", || {
                        tracing::warn!(%from, "unsealed packet from {from}: the sender has no cluster key; dropped");
                    });
                    return self.dropped_with_notice(
                        receive,
                        now,
                        from,
                        bytes.len(),
                        None,
                        [0; 16],
                    );
                }
                self.counters.foreign.fetch_add(1, Ordering::Relaxed);
                return Opened::Dropped { notice: None };
            }
        };
        // Old packets, replays and stale sessions are known by their header: they cost no
        // decryption. The header is not authenticated yet, so this only reads state.
        let age_ms = MAX_AGE.as_millis() as u64;
        if header.sent_ms.saturating_add(age_ms) < wall_ms
            || header.sent_ms > wall_ms.saturating_add(age_ms)
        {
            self.counters.out_of_time.fetch_add(1, Ordering::Relaxed);
            log(receive, now, "time", || {
                let behind = (i128::from(wall_ms) - i128::from(header.sent_ms)) / 1000;
                tracing::warn!(%from, sender = %header.sender, "packet from {from} was sealed {behind} s from now by the receiver's clock (more than {} s): a replay, or clocks that differ; dropped", MAX_AGE.as_secs());
            });
            return Opened::Dropped { notice: None };
        }
        let verdict = receive
            .windows
            .peek(now, header.sender, header.session, header.counter);
        if verdict != Verdict::Fresh {
            return self.not_fresh(receive, now, from, header, verdict);
        }
        // A cached session cipher is used only while its key is installed: a removed key
        // opens nothing, also for sessions that began before its removal.
        let opened = {
            let ring = keys.read();
            match ring.get(header.key) {
                None => None,
                Some(key) => {
                    let cached = receive
                        .ciphers
                        .get(&header.sender)
                        .filter(|(k, session, _)| *k == header.key && *session == header.session);
                    match cached {
                        Some((_, _, cipher)) => {
                            format::open(cipher, &header, self.local, bytes).map(|d| (d, None))
                        }
                        None => {
                            let cipher = key.session_cipher(&header.session);
                            format::open(&cipher, &header, self.local, bytes)
                                .map(|d| (d, Some(cipher)))
                        }
                    }
                }
            }
        };
        let Some((datagram, derived)) = opened else {
            self.counters
                .failed_authentication
                .fetch_add(1, Ordering::Relaxed);
            log(receive, now, "authentication", || {
                tracing::warn!(%from, key_id = %header.key, "packet from {from} failed authentication (key id {})", header.key);
            });
            return self.dropped_with_notice(
                receive,
                now,
                from,
                bytes.len(),
                Some(header.key),
                header.session,
            );
        };
        match receive
            .windows
            .check(now, header.sender, header.session, header.counter)
        {
            Verdict::Fresh => {
                if let Some(cipher) = derived {
                    if receive.ciphers.len() >= MAX_SENDERS {
                        receive.ciphers.clear();
                    }
                    receive
                        .ciphers
                        .insert(header.sender, (header.key, header.session, cipher));
                }
                self.counters.opened.fetch_add(1, Ordering::Relaxed);
                Opened::Datagram(datagram)
            }
            verdict => self.not_fresh(receive, now, from, header, verdict),
        }
    }

    /// Counts and logs a replayed or stale packet.
    fn not_fresh(
        &self,
        receive: &mut Receive,
        now: Instant,
        from: SocketAddr,
        header: SealedHeader,
        verdict: Verdict,
    ) -> Opened {
        if verdict == Verdict::Stale {
            self.counters.stale_session.fetch_add(1, Ordering::Relaxed);
            log(receive, now, "stale", || {
                tracing::info!(%from, sender = %header.sender, "packet from {from} belongs to an earlier run of {}; dropped", header.sender);
            });
        } else {
            self.counters.replayed.fetch_add(1, Ordering::Relaxed);
            log(receive, now, "replayed", || {
                tracing::debug!(%from, sender = %header.sender, "packet from {from} was seen before (replayed or duplicated); dropped");
            });
        }
        Opened::Dropped { notice: None }
    }

    /// The counters so far.
    pub fn stats(&self) -> SealStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        SealStats {
            sealed: get(&c.sealed),
            opened: get(&c.opened),
            failed_authentication: get(&c.failed_authentication),
            key_mismatch: get(&c.key_mismatch),
            replayed: get(&c.replayed),
            stale_session: get(&c.stale_session),
            out_of_time: get(&c.out_of_time),
            foreign: get(&c.foreign),
            notices_sent: get(&c.notices_sent),
            notices_received: get(&c.notices_received),
        }
    }

    /// The latest sign that another member holds a different key (or none): a rejection
    /// notice about one of this member's own packets (it names this member's session; a member
    /// without a key accepts notices about its unsealed packets).
    pub fn rejection(&self) -> Option<Rejection> {
        self.receive
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .rejection
    }

    fn primary(&self) -> Option<KeyId> {
        self.keys.as_ref().map(Keyring::primary)
    }

    fn notice_received(
        &self,
        receive: &mut Receive,
        now: Instant,
        from: SocketAddr,
        bytes: &[u8],
    ) -> Opened {
        let Some(notice) = Notice::decode(self.cluster, bytes) else {
            self.counters.foreign.fetch_add(1, Ordering::Relaxed);
            return Opened::Dropped { notice: None };
        };
        self.counters
            .notices_received
            .fetch_add(1, Ordering::Relaxed);
        // Only a notice about this member's own packets says anything about its key: one that
        // names another session is somebody's forgery or a notice meant for another run.
        let ours = if self.keys.is_some() {
            self.session
        } else {
            [0; 16]
        };
        if notice.session != ours {
            return Opened::Dropped { notice: None };
        }
        receive.rejection = Some(Rejection {
            peer: from,
            ours: self.primary(),
            theirs: notice.theirs,
        });
        log(receive, now, "notice", || {
            tracing::warn!(%from, "{from} cannot open this member's packets: its cluster key ({}) differs from ours ({})",
                notice.theirs.map_or("none".to_string(), |k| k.to_string()),
                self.primary().map_or("none".to_string(), |k| k.to_string()));
        });
        Opened::Dropped { notice: None }
    }

    fn dropped_with_notice(
        &self,
        receive: &mut Receive,
        now: Instant,
        from: SocketAddr,
        len: usize,
        rejected: Option<KeyId>,
        session: [u8; 16],
    ) -> Opened {
        // A notice is never longer than what it answers (no amplification), at most one a
        // second goes to one address, and at most `NOTICES_PER_SECOND` in all.
        if len < format::NOTICE_LEN {
            return Opened::Dropped { notice: None };
        }
        let (second, left) = &mut receive.notice_budget;
        if second.is_none_or(|at| now.saturating_duration_since(at) >= Duration::from_secs(1)) {
            *second = Some(now);
            *left = NOTICES_PER_SECOND;
        }
        if *left == 0 {
            return Opened::Dropped { notice: None };
        }
        if receive.notified.len() >= NOTICE_TABLE_MAX {
            receive
                .notified
                .retain(|_, at| now.saturating_duration_since(*at) < NOTICE_EVERY);
        }
        if receive.notified.len() >= NOTICE_TABLE_MAX {
            return Opened::Dropped { notice: None };
        }
        if let Some(at) = receive.notified.get(&from) {
            if now.saturating_duration_since(*at) < NOTICE_EVERY {
                return Opened::Dropped { notice: None };
            }
        }
        receive.notified.insert(from, now);
        receive.notice_budget.1 -= 1;
        self.counters.notices_sent.fetch_add(1, Ordering::Relaxed);
        let notice = Notice {
            rejected,
            theirs: self.primary(),
            session,
        };
        Opened::Dropped {
            notice: Some(notice.encode(self.cluster)),
        }
    }
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealer")
            .field("cluster", &self.cluster)
            .field("keys", &self.keys)
            .field("local", &self.local)
            .finish_non_exhaustive()
    }
}

/// Runs `emit` unless a line of this `kind` was logged less than [`LOG_EVERY`] ago (the
/// suppressed ones are counted and reported with the next line, at debug level).
fn log(receive: &mut Receive, now: Instant, kind: &'static str, emit: impl FnOnce()) {
    let (last, suppressed) = receive.logged.entry(kind).or_insert((None, 0));
    if last.is_none_or(|at| now.saturating_duration_since(at) >= LOG_EVERY) {
        if *suppressed > 0 {
            tracing::debug!(
                kind,
                suppressed = *suppressed,
                "similar packets dropped since the last line"
            );
        }
        *last = Some(now);
        *suppressed = 0;
        emit();
    } else {
        *suppressed += 1;
    }
}

/// The wall clock in milliseconds since the Unix epoch (0 before it).
fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seal::ClusterKey;

    const CLUSTER: ClusterId = ClusterId(77);

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn sealer(port: u16, ring: &Keyring) -> Sealer {
        Sealer::new(CLUSTER, Some(ring.clone()), addr(port)).unwrap()
    }

    fn delivered(opened: &Opened) -> bool {
        matches!(opened, Opened::Datagram(_))
    }

    #[test]
    fn a_removed_key_opens_nothing_also_for_sessions_that_began_before() {
        let (k1, k2) = (
            ClusterKey::from_bytes([1; 32]),
            ClusterKey::from_bytes([2; 32]),
        );
        let sender_ring = Keyring::new(k1.clone());
        let receiver_ring = Keyring::new(k1.clone());
        let (a, b) = (sealer(1, &sender_ring), sealer(2, &receiver_ring));
        let now = Instant::now();
        assert!(delivered(&b.open(
            now,
            addr(1),
            &a.seal(Some(addr(2)), b"x").unwrap()
        )));
        receiver_ring.install(k2.clone()).unwrap();
        receiver_ring.use_key(k2.id()).unwrap();
        receiver_ring.remove(k1.id()).unwrap();
        // The sender was evicted: it still seals with k1, in the session b has cached.
        let after = b.open(now, addr(1), &a.seal(Some(addr(2)), b"y").unwrap());
        assert!(!delivered(&after));
        assert_eq!(b.stats().failed_authentication, 1);
    }

    #[test]
    fn a_packet_sealed_for_one_member_does_not_open_at_another() {
        let ring = Keyring::new(ClusterKey::from_bytes([3; 32]));
        let (a, b, c) = (sealer(1, &ring), sealer(2, &ring), sealer(3, &ring));
        let now = Instant::now();
        let to_b = a.seal(Some(addr(2)), b"for b").unwrap();
        assert!(!delivered(&c.open(now, addr(1), &to_b)));
        assert_eq!(c.stats().failed_authentication, 1);
        assert!(delivered(&b.open(now, addr(1), &to_b)));
        // Discovery is for anyone, once each.
        let ping = a.seal(None, b"ping").unwrap();
        assert!(delivered(&b.open(now, addr(1), &ping)));
        assert!(delivered(&c.open(now, addr(1), &ping)));
        assert!(!delivered(&c.open(now, addr(1), &ping)));
    }

    #[test]
    fn old_packets_are_dropped_also_by_a_receiver_that_never_saw_the_sender() {
        let ring = Keyring::new(ClusterKey::from_bytes([4; 32]));
        let (a, b) = (sealer(1, &ring), sealer(2, &ring));
        let now = Instant::now();
        let wall = wall_ms();
        let age = MAX_AGE.as_millis() as u64;
        let old = a
            .seal_at(wall - age - 1_000, Some(addr(2)), b"old")
            .unwrap();
        let future = a
            .seal_at(wall + age + 1_000, Some(addr(2)), b"future")
            .unwrap();
        let recent = a
            .seal_at(wall - age + 1_000, Some(addr(2)), b"recent")
            .unwrap();
        assert!(!delivered(&b.open_at(now, wall, addr(1), &old)));
        assert!(!delivered(&b.open_at(now, wall, addr(1), &future)));
        assert!(delivered(&b.open_at(now, wall, addr(1), &recent)));
        assert_eq!(b.stats().out_of_time, 2);
    }

    #[test]
    fn only_notices_about_own_packets_count_and_short_triggers_get_none() {
        let ring = Keyring::new(ClusterKey::from_bytes([5; 32]));
        let other = Keyring::new(ClusterKey::from_bytes([6; 32]));
        let (a, b) = (sealer(1, &ring), sealer(2, &other));
        let now = Instant::now();
        // A forged notice naming another session changes nothing.
        let forged = Notice {
            rejected: Some(ring.primary()),
            theirs: None,
            session: [0xab; 16],
        };
        assert!(!delivered(&a.open(now, addr(9), &forged.encode(CLUSTER))));
        assert_eq!(a.rejection(), None);
        // A real one: b cannot open a's packet and says so.
        let Opened::Dropped {
            notice: Some(notice),
        } = b.open(now, addr(1), &a.seal(Some(addr(2)), b"hello").unwrap())
        else {
            panic!("no notice");
        };
        assert!(notice.len() <= format::SEAL_OVERHEAD + 5);
        a.open(now, addr(2), &notice);
        let rejection = a.rejection().unwrap();
        assert_eq!(rejection.peer, addr(2));
        assert_eq!(
            (rejection.ours, rejection.theirs),
            (Some(ring.primary()), Some(other.primary()))
        );
        // Thirteen bytes of an unsealed header earn no notice.
        let mut plain = Vec::new();
        crate::wire::Header::write(CLUSTER, &mut plain);
        assert_eq!(
            b.open(now, addr(3), &plain),
            Opened::Dropped { notice: None }
        );
    }

    #[test]
    fn notices_are_limited_per_second_in_all() {
        let ring = Keyring::new(ClusterKey::from_bytes([7; 32]));
        let other = Keyring::new(ClusterKey::from_bytes([8; 32]));
        let (a, b) = (sealer(1, &ring), sealer(2, &other));
        let now = Instant::now();
        let sent = (0..100u16)
            .filter(|&i| {
                let packet = a.seal(Some(addr(2)), b"spoofed sources").unwrap();
                matches!(
                    b.open(now, addr(1000 + i), &packet),
                    Opened::Dropped { notice: Some(_) }
                )
            })
            .count();
        assert_eq!(sent, NOTICES_PER_SECOND as usize);
    }

    #[test]
    fn installing_an_installed_key_again_changes_nothing() {
        let ring = Keyring::new(ClusterKey::from_bytes([9; 32]));
        assert_eq!(
            ring.install(ClusterKey::from_bytes([9; 32])),
            Ok(ring.primary())
        );
        assert_eq!(ring.ids().len(), 1);
    }
}
