//! What happened at each seed: the mesh's discovery report (`Transport::discovery_report`)
//! and the warnings for seeds that cannot be reached.
//!
//! A small map, one entry per configured seed, updated where connects, handshakes and frames
//! already happen. Without a cluster key a hello names no cluster, so a seed counts as
//! answered once a frame of our cluster comes from it: the mesh compares the header of the
//! frames it receives from a seed (see [`DatagramKind`]) with that of the first frame it sent.
//! With a key, a handshake that proved the key is an answer of our cluster.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{self, ErrorKind};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use conclave_lock_api::wire::{
    ClusterId, DatagramKind, WireVersion, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION,
};
use conclave_lock_api::{DiscoveryOutcome, DiscoveryPlace, DiscoveryReport};
use tracing::warn;

/// How often the same failure of one seed is logged at most.
const WARN_EVERY: Duration = Duration::from_secs(10);

/// The seeds and what happened at each.
#[derive(Debug)]
pub(crate) struct Discovery {
    /// Our listen address, named in the hint for a seed a loopback address cannot reach.
    local: SocketAddr,
    seeds: BTreeMap<SocketAddr, Seed>,
    /// What our own frames say: learned from the first one we sent, or from the keyring.
    ours: Option<DatagramKind>,
    /// The mesh has the cluster's keys: a handshake that completes is with a member of ours.
    keyed: bool,
}

/// One seed.
#[derive(Debug, Default)]
struct Seed {
    seen: Seen,
    /// When this seed's failure was last logged, and what it was.
    warned: Option<(Instant, String)>,
}

/// The last thing that happened at a seed, as far as it is news (see [`Discovery::note`]).
#[derive(Debug, Default)]
enum Seen {
    /// Never tried.
    #[default]
    Nothing,
    /// The last connect failed, so.
    Unreachable(String),
    /// The connection was made, but its handshake failed, so.
    Refused(String),
    /// Connected (or greeted, without a key): nothing of a cluster heard yet.
    Connected,
    /// A frame came, before we knew our own cluster: decided when the report is made.
    Heard(DatagramKind),
    /// A member of our cluster answered.
    Answered,
}

impl Discovery {
    /// The seeds of a mesh listening at `local`; `local` itself is not one.
    pub(crate) fn new(seeds: &[SocketAddr], local: SocketAddr) -> Self {
        Self {
            local,
            seeds: seeds
                .iter()
                .filter(|seed| **seed != local)
                .map(|seed| (*seed, Seed::default()))
                .collect(),
            ours: None,
            keyed: false,
        }
    }

    /// The mesh was given the cluster's keys: our frames are sealed for `cluster`.
    pub(crate) fn keyed(&mut self, cluster: ClusterId) {
        self.keyed = true;
        self.ours.get_or_insert(DatagramKind::Sealed { cluster });
    }

    /// We send `payload`: the first frame tells our cluster (a notice does not).
    pub(crate) fn sending(&mut self, payload: &[u8]) {
        if self.ours.is_none() && !self.seeds.is_empty() {
            self.ours = DatagramKind::peek(payload)
                .filter(|kind| !matches!(kind, DatagramKind::Notice { .. }));
        }
    }

    /// A connect to `addr` failed with `error`: a seed is unreachable, and the failure is
    /// logged at WARN (at most every [`WARN_EVERY`] per seed, unless the error changes).
    pub(crate) fn connect_failed(&mut self, addr: SocketAddr, error: &io::Error, now: Instant) {
        if !self.seeds.contains_key(&addr) {
            return;
        }
        let why = self.describe(addr, error);
        if let Some(seed) = self.seeds.get_mut(&addr) {
            if seed.should_warn(&why, now) {
                warn!(seed = %addr, error = %why, "cannot connect to seed {addr}: {why}");
            }
            seed.seen = Seen::Unreachable(why);
        }
    }

    /// A connection made to `addr` failed its handshake, for `why`. `warn`: log it at WARN
    /// (rate-limited as a failed connect is), where the caller did not already.
    pub(crate) fn refused(
        &mut self,
        addr: SocketAddr,
        why: impl fmt::Display,
        warn: bool,
        now: Instant,
    ) {
        let Some(seed) = self.seeds.get_mut(&addr) else {
            return;
        };
        let why = why.to_string();
        if warn && seed.should_warn(&why, now) {
            warn!(seed = %addr, why = %why, "seed {addr} refused this member: {why}");
        }
        seed.seen = Seen::Refused(why);
    }

    /// The connect to `addr` completed.
    pub(crate) fn connected(&mut self, addr: SocketAddr) {
        if let Some(seed) = self.seeds.get_mut(&addr) {
            if matches!(seed.seen, Seen::Nothing | Seen::Unreachable(_)) {
                seed.seen = Seen::Connected;
            }
        }
    }

    /// The handshake with `addr` completed: on a keyed mesh, with a member of our cluster.
    pub(crate) fn greeted(&mut self, addr: SocketAddr) {
        if self.keyed {
            if let Some(seed) = self.seeds.get_mut(&addr) {
                seed.seen = Seen::Answered;
            }
        } else {
            self.connected(addr);
        }
    }

    /// A frame came from `addr`: a member of our cluster answered, or a stranger.
    pub(crate) fn heard(&mut self, addr: SocketAddr, payload: &[u8]) {
        let Some(seed) = self.seeds.get_mut(&addr) else {
            return;
        };
        if matches!(seed.seen, Seen::Answered) {
            return;
        }
        let Some(kind) = DatagramKind::peek(payload) else {
            return;
        };
        seed.seen = match self.ours.map(|ours| judge(ours, kind)) {
            Some(DiscoveryOutcome::Answered) => Seen::Answered,
            _ => Seen::Heard(kind),
        };
    }

    /// One report per seed.
    pub(crate) fn report(&self) -> Vec<DiscoveryReport> {
        self.seeds
            .iter()
            .map(|(addr, seed)| DiscoveryReport {
                place: DiscoveryPlace::Seed(*addr),
                outcome: match &seed.seen {
                    Seen::Nothing | Seen::Connected => DiscoveryOutcome::NoAnswer,
                    Seen::Unreachable(why) => DiscoveryOutcome::Unreachable(why.clone()),
                    Seen::Refused(why) => DiscoveryOutcome::Refused(why.clone()),
                    Seen::Heard(kind) => self
                        .ours
                        .map_or(DiscoveryOutcome::NoAnswer, |ours| judge(ours, *kind)),
                    Seen::Answered => DiscoveryOutcome::Answered,
                },
            })
            .collect()
    }

    /// A connect error in words, with a hint where a loopback listen address cannot reach a
    /// seed elsewhere (connections are made from the listen address's IP).
    fn describe(&self, seed: SocketAddr, error: &io::Error) -> String {
        let local = self.local.ip();
        let unroutable = matches!(
            error.kind(),
            ErrorKind::InvalidInput | ErrorKind::AddrNotAvailable
        ) || error.raw_os_error() == Some(22);
        if unroutable && local.is_loopback() && !seed.ip().is_loopback() {
            format!(
                "{error}; this member listens on the loopback address {local} \
                 (TcpConfig::bind) and connects from it, which cannot reach {}",
                seed.ip()
            )
        } else {
            error.to_string()
        }
    }
}

impl Seed {
    /// Whether `why` is to be logged now: the first failure, another one, or the same after
    /// [`WARN_EVERY`]. Notes it if so.
    fn should_warn(&mut self, why: &str, now: Instant) -> bool {
        let due = self.warned.as_ref().is_none_or(|(at, last)| {
            last != why || now.saturating_duration_since(*at) >= WARN_EVERY
        });
        if due {
            self.warned = Some((now, why.to_owned()));
        }
        due
    }
}

/// What a frame of kind `theirs` from a seed says, our frames being of kind `ours`.
fn judge(ours: DatagramKind, theirs: DatagramKind) -> DiscoveryOutcome {
    let refused = |why: String| DiscoveryOutcome::Refused(why);
    if theirs.cluster() != ours.cluster() {
        return refused(format!(
            "it is a member of another cluster ({:?}; this member's is {:?}): \
             check the cluster name",
            theirs.cluster(),
            ours.cluster()
        ));
    }
    match (ours, theirs) {
        (_, DatagramKind::Notice { .. }) => refused(
            "it cannot open this member's datagrams: it holds another cluster key, or none"
                .to_owned(),
        ),
        // A member of another build may send another version this one speaks.
        (DatagramKind::Plain { .. }, DatagramKind::Plain { version, .. })
            if WireVersion::from_byte(version).is_none() =>
        {
            refused(format!(
                "it speaks protocol version {version}, this member versions \
                 {MIN_PROTOCOL_VERSION} to {PROTOCOL_VERSION}"
            ))
        }
        (DatagramKind::Plain { .. }, DatagramKind::Sealed { .. }) => {
            refused("its datagrams are sealed with a cluster key; this member has none".to_owned())
        }
        (DatagramKind::Sealed { .. }, DatagramKind::Plain { .. }) => {
            refused("its datagrams are not sealed; this member has a cluster key".to_owned())
        }
        _ => DiscoveryOutcome::Answered,
    }
}

#[cfg(test)]
mod tests {
    use conclave_lock_api::wire::Header;

    use super::*;

    fn addr(port: u16) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], port))
    }

    fn frame(cluster: u64) -> Vec<u8> {
        let mut out = Vec::new();
        Header::write(ClusterId(cluster), &mut out);
        out.extend_from_slice(b"body");
        out
    }

    fn outcome(d: &Discovery, seed: SocketAddr) -> DiscoveryOutcome {
        d.report()
            .into_iter()
            .find(|r| r.place == DiscoveryPlace::Seed(seed))
            .map(|r| r.outcome)
            .expect("a seed")
    }

    #[test]
    fn one_entry_per_seed_but_ourselves() {
        let d = Discovery::new(&[addr(2), addr(1), addr(3), addr(2)], addr(1));
        let places: Vec<_> = d.report().into_iter().map(|r| r.place).collect();
        assert_eq!(
            places,
            [DiscoveryPlace::Seed(addr(2)), DiscoveryPlace::Seed(addr(3))]
        );
        assert_eq!(outcome(&d, addr(2)), DiscoveryOutcome::NoAnswer);
    }

    #[test]
    fn frames_are_judged_against_ours() {
        let (a, b, c) = (addr(2), addr(3), addr(4));
        let mut d = Discovery::new(&[a, b, c], addr(1));
        // Heard before we sent anything: decided once we know our cluster.
        d.heard(a, &frame(7));
        assert_eq!(outcome(&d, a), DiscoveryOutcome::NoAnswer);
        d.sending(&frame(7));
        assert_eq!(outcome(&d, a), DiscoveryOutcome::Answered);
        d.heard(b, &frame(8));
        assert!(
            matches!(outcome(&d, b), DiscoveryOutcome::Refused(why) if why.contains("another cluster")),
            "{:?}",
            outcome(&d, b)
        );
        // Other bytes say nothing.
        d.connected(c);
        d.heard(c, b"GET / HTTP/1.1\r\n\r\n");
        assert_eq!(outcome(&d, c), DiscoveryOutcome::NoAnswer);
        let mut old = frame(7);
        old[4] = PROTOCOL_VERSION.wrapping_add(1);
        d.heard(c, &old);
        assert!(
            matches!(outcome(&d, c), DiscoveryOutcome::Refused(why) if why.contains("protocol version"))
        );
        // Another version this build speaks is an answer (a rolling upgrade).
        let mut older = frame(7);
        older[4] = MIN_PROTOCOL_VERSION;
        d.heard(c, &older);
        assert_eq!(outcome(&d, c), DiscoveryOutcome::Answered);
        // An answer sticks; a failed connect later is news.
        d.heard(c, &frame(7));
        d.heard(c, &frame(8));
        assert_eq!(outcome(&d, c), DiscoveryOutcome::Answered);
        d.connect_failed(
            c,
            &io::Error::from(ErrorKind::ConnectionRefused),
            Instant::now(),
        );
        assert!(matches!(outcome(&d, c), DiscoveryOutcome::Unreachable(_)));
    }

    #[test]
    fn a_refusal_outlives_the_next_connect() {
        let seed = addr(2);
        let mut d = Discovery::new(&[seed], addr(1));
        let now = Instant::now();
        d.connect_failed(seed, &io::Error::from_raw_os_error(111), now);
        assert!(
            matches!(outcome(&d, seed), DiscoveryOutcome::Unreachable(why) if why.contains("os error 111"))
        );
        d.connected(seed);
        assert_eq!(outcome(&d, seed), DiscoveryOutcome::NoAnswer);
        d.refused(seed, "it has no cluster key", false, now);
        d.connected(seed);
        assert_eq!(
            outcome(&d, seed),
            DiscoveryOutcome::Refused("it has no cluster key".to_owned())
        );
    }

    #[test]
    fn a_keyed_handshake_is_an_answer() {
        let seed = addr(2);
        let mut d = Discovery::new(&[seed], addr(1));
        d.greeted(seed);
        assert_eq!(outcome(&d, seed), DiscoveryOutcome::NoAnswer);
        d.keyed(ClusterId(7));
        d.greeted(seed);
        assert_eq!(outcome(&d, seed), DiscoveryOutcome::Answered);
    }

    #[test]
    fn a_loopback_member_is_told_why_it_cannot_reach_a_lan_seed() {
        let seed = SocketAddr::from(([192, 0, 2, 7], 7800));
        let mut d = Discovery::new(&[seed], addr(1));
        d.connect_failed(seed, &io::Error::from_raw_os_error(22), Instant::now());
        let DiscoveryOutcome::Unreachable(why) = outcome(&d, seed) else {
            panic!("{:?}", outcome(&d, seed));
        };
        assert!(why.contains("os error 22"), "{why}");
        assert!(
            why.contains("loopback address 127.0.0.1 (TcpConfig::bind)"),
            "{why}"
        );
    }

    #[test]
    fn warnings_are_rate_limited_per_seed_and_error() {
        let mut seed = Seed::default();
        let now = Instant::now();
        assert!(seed.should_warn("refused", now));
        assert!(!seed.should_warn("refused", now + Duration::from_secs(1)));
        assert!(seed.should_warn("timed out", now + Duration::from_secs(2)));
        assert!(!seed.should_warn("timed out", now + Duration::from_secs(11)));
        assert!(seed.should_warn("timed out", now + WARN_EVERY + Duration::from_secs(2)));
    }
}
