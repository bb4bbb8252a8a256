//! What this mesh says and proves in a handshake (its hello, the cluster's keys), and what
//! failed handshakes leave behind: rejection notices to deliver, and the rate limit of their
//! logs.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use conclave_lock_api::seal::Keyring;
use conclave_lock_api::wire::ClusterId;
use conclave_lock_api::Datagram;

use crate::conn::Handshake;
use crate::frame::{self, Hello, HelloSeal, CHALLENGE_LEN};

/// The most rejection notices of the handshake waiting to be received; more are dropped.
const MAX_NOTICES: usize = 64;
/// How often a failed authentication is logged at most (the rest are counted).
const AUTH_LOG_EVERY: Duration = Duration::from_secs(5);

/// The cluster's keys, once the node gave them (`State::use_keyring`).
#[derive(Debug)]
pub(crate) struct Auth {
    pub(crate) cluster: ClusterId,
    pub(crate) keys: Keyring,
    /// The member's sealing session: the notices this mesh makes name it, as a notice about
    /// the member's own packets does.
    pub(crate) session: [u8; 16],
}

/// A mesh's handshake credentials and their by-products.
#[derive(Debug)]
pub(super) struct Credentials {
    local: SocketAddr,
    /// This mesh's instance id, named in every hello.
    instance: u64,
    /// Our hello frame, queued first on every connection (without a key; with one, every
    /// connection's hello has a challenge of its own).
    hello: Vec<u8>,
    /// The cluster's keys: every connection must prove one before it is trusted.
    auth: Option<Auth>,
    /// Rejection notices the handshake made (a peer with another key, or none), delivered as
    /// datagrams from the peer; at most [`MAX_NOTICES`].
    notices: VecDeque<Datagram>,
    /// When a failed authentication was last logged, and how many since went unlogged.
    auth_logged: (Option<Instant>, u64),
}

impl Credentials {
    /// The credentials of the mesh instance `instance` listening at `local`, without a key.
    pub(super) fn new(local: SocketAddr, instance: u64) -> Self {
        let hello = Hello {
            instance,
            addr: local,
            seal: None,
        }
        .encode();
        Credentials {
            local,
            instance,
            hello,
            auth: None,
            notices: VecDeque::new(),
            auth_logged: (None, 0),
        }
    }

    /// From now on, every connection must prove a key of `auth`.
    pub(super) fn set_auth(&mut self, auth: Auth) {
        self.auth = Some(auth);
    }

    /// The cluster's keys, if the node gave them.
    pub(super) fn auth(&self) -> Option<&Auth> {
        self.auth.as_ref()
    }

    /// A new connection's hello frame and, on a keyed mesh, its payload (the connection's
    /// handshake starts from it). Each keyed hello has a fresh random challenge.
    ///
    /// # Errors
    /// The system's random source failed.
    pub(super) fn new_hello(&self) -> io::Result<(Vec<u8>, Option<Handshake>)> {
        let Some(auth) = &self.auth else {
            return Ok((self.hello.clone(), None));
        };
        let mut challenge = [0u8; CHALLENGE_LEN];
        getrandom::fill(&mut challenge).map_err(|e| io::Error::other(e.to_string()))?;
        let hello = Hello {
            instance: self.instance,
            addr: self.local,
            seal: Some(HelloSeal {
                cluster: auth.cluster,
                key: auth.keys.primary(),
                challenge,
            }),
        };
        let payload = hello.payload();
        let handshake = Handshake {
            ours: payload.clone(),
            theirs: None,
        };
        Ok((frame::encode(&payload), Some(handshake)))
    }

    /// Queues a rejection notice for the member, unless [`MAX_NOTICES`] wait. Returns whether
    /// it was queued.
    pub(super) fn push_notice(&mut self, notice: Datagram) -> bool {
        if self.notices.len() >= MAX_NOTICES {
            return false;
        }
        self.notices.push_back(notice);
        true
    }

    /// The oldest rejection notice waiting, if any.
    pub(super) fn pop_notice(&mut self) -> Option<Datagram> {
        self.notices.pop_front()
    }

    /// Whether a failed authentication at `now` is logged: `Some` with how many went unlogged
    /// since the last log (the count starts again), or `None` (it is counted).
    pub(super) fn auth_log(&mut self, now: Instant) -> Option<u64> {
        let (last, suppressed) = &mut self.auth_logged;
        if last.is_none_or(|at| now.saturating_duration_since(at) >= AUTH_LOG_EVERY) {
            let unlogged = *suppressed;
            *last = Some(now);
            *suppressed = 0;
            Some(unlogged)
        } else {
            *suppressed += 1;
            None
        }
    }
}
