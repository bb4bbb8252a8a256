//! Sealing: every datagram encrypted and authenticated with the cluster key (feature `seal`).
//!
//! A cluster that is given a key ([`ClusterKey`], in a [`Keyring`]) seals every datagram and
//! every TCP frame its members exchange with AES-256-GCM (RustCrypto's `aes-gcm`, under keys
//! derived with RustCrypto's `hkdf` and `sha2`), and drops, counts and logs everything that
//! does not open. The layer sits between the protocol and any [`crate::Transport`]
//! ([`SealedTransport`]); the protocol above never sees an unauthenticated byte.
//!
//! # What a sealed packet is
//! A 73-byte header — magic, seal version, cluster id, the id of the key used, the sender's
//! session id and packet counter, when it was sealed, the sender's address, whether it goes to
//! one member or to the discovery channel — then the encrypted datagram and a 16-byte tag. The
//! associated data is the header and the destination's address (not sent: the receiver puts in
//! its own), so a packet sealed for one member does not open at another (the byte layout is in
//! `docs/protocol.md`). A receiver picks the key by its id ([`KeyId`], a public fingerprint),
//! so a keyring of several keys costs no trial decryptions.
//!
//! # Nonces
//! Every member seals with the same cluster key, so nonces must be unique across all members
//! and all their restarts. Each sealer draws a **session id** when it is made (16 bytes: the
//! wall-clock time in nanoseconds since the Unix epoch, then 8 bytes from the operating
//! system's random source) and seals under its own **session key**: HKDF-SHA256 of the
//! cluster key with the session id in the info string. The AES-GCM nonce is the session's
//! **packet counter** (8 bytes, behind 4 zero bytes), incremented for every packet sent, to
//! anyone. So a (key, nonce) pair repeats only if a counter repeats within a session — a
//! 64-bit atomic counter does not wrap — or if two sessions share an id, which takes two
//! sealers made in the same nanosecond **and** drawing the same 64 random bits; a clock set
//! back does not make that likelier, because the random half is drawn anew. The 16-byte
//! session id is why the key is derived per session rather than the id put in GCM's 12-byte
//! nonce: 96 bits leave no room for both a safe random part and a counter. A receiver derives
//! a sender's session key once per session and keeps it.
//!
//! # Replays
//! A receiver keeps, per sender address (the authenticated one in the header), the sender's
//! current session and a window of the last [`WINDOW`] counters it accepted: a packet seen
//! before or below the window is dropped ([`SealStats::replayed`]). A newer session (the
//! sender restarted: a later start time) replaces the window; a packet of an older session is
//! dropped ([`SealStats::stale_session`]). A packet sealed more than [`MAX_AGE`] before or
//! after the receiver's wall clock is dropped by anyone ([`SealStats::out_of_time`]), so
//! members' clocks must agree within it. Windows of senders silent for [`FORGET_AFTER`] (more
//! than twice [`MAX_AGE`]) are forgotten, and at most [`MAX_SENDERS`] are kept. Two residual
//! cases remain, both in the guide: a member that has not heard a sender (it just started)
//! accepts each of that sender's packets younger than [`MAX_AGE`] once, if they were sealed for
//! it or for discovery; and a member whose clock went back across a restart is refused by those
//! who remember its previous run, until they forget it.
//!
//! # Wrong keys
//! A packet of this cluster that does not open (an unknown or removed key, a wrong key, a
//! changed byte, another member's packet) is counted ([`SealStats::failed_authentication`]),
//! logged at most every few seconds as `packet from X failed authentication (key id N)`, and
//! answered with a small unsealed **rejection notice** naming the packet's session (never
//! longer than the packet, at most once a second per address and 16 a second in all). A member
//! that receives notices about its own packets and no answer knows it holds the wrong key: the
//! node's join then fails with an authentication error instead of founding a cluster of its
//! own. A notice is not authenticated and changes nothing but that error.
//!
//! # Memory
//! Keys, derived session keys and AES round keys are wiped when dropped; the HMAC state
//! inside a key derivation is not (the `hkdf` crate does not wipe it), and lives only for the
//! derivation.
//!
//! # Handshakes
//! A transport with connections proves the key on each before trusting it
//! ([`Keyring::prove`], [`Keyring::verify`]: a tag of the connection's transcript, see
//! [`HandshakeProof`]), and reports a peer that proves another key by a [`Notice`] of its own
//! making ([`Notice::encode`]), so the node hears of it as it hears of a notice sent.

mod format;
mod handshake;
mod key;
mod keyring;
mod sealer;
mod transport;
mod window;

pub use format::{
    Notice, NOTICE_LEN, NOTICE_MAGIC, SEALED_HEADER_LEN, SEALED_MAGIC, SEAL_OVERHEAD, SEAL_VERSION,
    TAG_LEN,
};
pub use handshake::{HandshakeProof, ProofError, PROOF_LABEL, PROOF_TAG_LEN};
pub use key::{ClusterKey, KeyError, KeyId, KEY_ENV, KEY_FILE_ENV};
pub use keyring::{Keyring, KeyringError, MAX_KEYS};
pub use sealer::{Opened, Rejection, SealStats, Sealer, MAX_AGE};
pub use transport::SealedTransport;
pub use window::{FORGET_AFTER, MAX_SENDERS, WINDOW};
