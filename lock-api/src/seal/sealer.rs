//! The sans-IO core of sealing: seals outgoing datagrams, opens, authenticates and
//! de-duplicates incoming ones, counts and logs what it drops.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use aes_gcm::Aes256Gcm;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::format::{self, FormatError, Notice, SealedHeader, NOTICE_MAGIC, SEALED_MAGIC};
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
    /// Bytes that are no packet of this cluster (another cluster's, garbage, truncated).
    pub foreign: u64,
    /// Rejection notices sent to members whose packets did not open.
    pub notices_sent: u64,
    /// Rejection notices received: some member could not open this member's packets.
    pub notices_received: u64,
}

/// A rejection this member met: the first sign that it and another member hold different
/// keys (or that only one of them holds one).
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
    foreign: AtomicU64,
    notices_sent: AtomicU64,
    notices_received: AtomicU64,
}

#[derive(Default)]
struct Receive {
    windows: Windows,
    logged: HashMap<&'static str, (Option<Instant>, u64)>,
    notified: HashMap<SocketAddr, Instant>,
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
/// let packet = alice.seal(b"CNCL...")?;
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

    /// Seals one datagram for sending (a copy of it, without a keyring).
    ///
    /// # Errors
    /// None today; the `Result` leaves room for a keyring that can refuse.
    pub fn seal(&self, datagram: &[u8]) -> std::io::Result<Vec<u8>> {
        let Some(keys) = &self.keys else {
            return Ok(datagram.to_vec());
        };
        let key = keys.primary();
        let cipher = {
            let cached = self.send.read().unwrap_or_else(PoisonError::into_inner);
            match &*cached {
                Some((id, cipher)) if *id == key => Some(cipher.clone()),
                _ => None,
            }
        };
        let cipher = match cipher {
            Some(cipher) => cipher,
            None => {
                let ring = keys.read();
                let primary = ring.primary();
                let cipher = Arc::new(primary.session_cipher(&self.session));
                *self.send.write().unwrap_or_else(PoisonError::into_inner) =
                    Some((primary.id(), cipher.clone()));
                cipher
            }
        };
        let header = SealedHeader {
            cluster: self.cluster,
            key,
            session: self.session,
            counter: self.counter.fetch_add(1, Ordering::Relaxed),
            sender: self.local,
        };
        let packet = format::seal(&cipher, &header, datagram);
        self.counters.sealed.fetch_add(1, Ordering::Relaxed);
        Ok(packet)
    }

    /// Judges one received datagram from transport address `from` at `now`.
    pub fn open(&self, now: Instant, from: SocketAddr, bytes: &[u8]) -> Opened {
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
                    self.note_rejection(receive, from, Some(header.key));
                    log(receive, now, "sealed", || {
                        tracing::warn!(%from, key_id = %header.key, "sealed packet from {from} (key id {}): this member has no cluster key", header.key);
                    });
                    return self.dropped_with_notice(receive, now, from, Some(header.key));
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
            | Err(FormatError::Truncated | FormatError::Version(_) | FormatError::Address) => {
                self.counters.foreign.fetch_add(1, Ordering::Relaxed);
                log(receive, now, "foreign", || {
                    tracing::debug!(%from, len = bytes.len(), "packet from {from} is not of this cluster; dropped");
                });
                return Opened::Dropped { notice: None };
            }
            Err(FormatError::NotSealed) => {
                if crate::wire::Header::read(bytes).is_ok_and(|h| h.cluster == self.cluster) {
                    self.counters.key_mismatch.fetch_add(1, Ordering::Relaxed);
                    self.note_rejection(receive, from, None);
                    log(receive, now, "unsealed", || {
                        tracing::warn!(%from, "unsealed packet from {from}: the sender has no cluster key; dropped");
                    });
                    return self.dropped_with_notice(receive, now, from, None);
                }
                self.counters.foreign.fetch_add(1, Ordering::Relaxed);
                return Opened::Dropped { notice: None };
            }
        };
        // Replays and stale packets are known by their header: they cost no decryption. The
        // header is not authenticated yet, so this only reads the windows.
        let verdict = receive
            .windows
            .peek(now, header.sender, header.session, header.counter);
        if verdict != Verdict::Fresh {
            return self.not_fresh(receive, now, from, header, verdict);
        }
        let cached = receive
            .ciphers
            .get(&header.sender)
            .filter(|(key, session, _)| *key == header.key && *session == header.session);
        let opened = match cached {
            Some((_, _, cipher)) => format::open(cipher, &header, bytes).map(|d| (d, None)),
            None => {
                let cipher = keys
                    .read()
                    .get(header.key)
                    .map(|k| k.session_cipher(&header.session));
                cipher.and_then(|c| format::open(&c, &header, bytes).map(|d| (d, Some(c))))
            }
        };
        let Some((datagram, derived)) = opened else {
            self.counters
                .failed_authentication
                .fetch_add(1, Ordering::Relaxed);
            self.note_rejection(receive, from, Some(header.key));
            log(receive, now, "authentication", || {
                tracing::warn!(%from, key_id = %header.key, "packet from {from} failed authentication (key id {})", header.key);
            });
            return self.dropped_with_notice(receive, now, from, Some(header.key));
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
            foreign: get(&c.foreign),
            notices_sent: get(&c.notices_sent),
            notices_received: get(&c.notices_received),
        }
    }

    /// The first sign that another member holds a different key (or none): a notice it sent,
    /// or a packet of this cluster that did not open here.
    pub fn rejection(&self) -> Option<Rejection> {
        self.receive
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .rejection
    }

    fn primary(&self) -> Option<KeyId> {
        self.keys.as_ref().map(Keyring::primary)
    }

    fn note_rejection(&self, receive: &mut Receive, peer: SocketAddr, theirs: Option<KeyId>) {
        receive.rejection.get_or_insert(Rejection {
            peer,
            ours: self.primary(),
            theirs,
        });
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
        self.note_rejection(receive, from, notice.theirs);
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
        rejected: Option<KeyId>,
    ) -> Opened {
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
        self.counters.notices_sent.fetch_add(1, Ordering::Relaxed);
        let notice = Notice {
            rejected,
            theirs: self.primary(),
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
