//! Proofs of the cluster key for a connection's handshake: a member shows a peer that it holds
//! a key of the cluster without revealing it, bound to that one connection's transcript.
//!
//! The TCP mesh uses them: each side's hello carries a fresh random challenge, and each side
//! then proves the key over both hellos and its role (see `conclave-tcp`'s docs). A proof is
//! the id of the key used and a 16-byte tag: HKDF-SHA256 (expand only, which is HMAC-SHA256
//! under the key extracted from the cluster key) with info = [`PROOF_LABEL`] ‖ transcript,
//! truncated. Fresh challenges on both sides make a proof worthless on any other connection.

use subtle::ConstantTimeEq;
use thiserror::Error;

use super::key::KeyId;
use super::keyring::Keyring;

/// The label the handshake tag is derived under, before the transcript.
pub const PROOF_LABEL: &[u8] = b"conclave tcp hello v1";
/// The length of a handshake tag, in bytes.
pub const PROOF_TAG_LEN: usize = 16;

/// A proof that its sender holds a cluster key: see [`Keyring::prove`].
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct HandshakeProof {
    /// The id of the key the tag was made with (the prover's primary key).
    pub key: KeyId,
    /// The tag of the transcript under that key.
    pub tag: [u8; PROOF_TAG_LEN],
}

impl std::fmt::Debug for HandshakeProof {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HandshakeProof")
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

/// Why a [`HandshakeProof`] was not accepted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum ProofError {
    /// The proof was made with a key this keyring does not hold: the peer uses another key.
    #[error("the peer proved a key this member does not hold (key id {0})")]
    UnknownKey(KeyId),
    /// The tag is wrong for this transcript under the named key: forged, replayed from
    /// another connection, or made over other bytes.
    #[error("the peer's proof for key id {0} is not valid for this connection")]
    Invalid(KeyId),
}

impl Keyring {
    /// Proves this member holds the primary key, for this `transcript` (the bytes both sides
    /// agree on: for the TCP mesh, both hellos and the prover's role).
    pub fn prove(&self, transcript: &[u8]) -> HandshakeProof {
        let ring = self.read();
        let key = ring.primary();
        HandshakeProof {
            key: key.id(),
            tag: key.handshake_tag(PROOF_LABEL, transcript),
        }
    }

    /// Checks a peer's proof for `transcript` with the installed key it names. The tags are
    /// compared in constant time.
    ///
    /// # Errors
    /// [`ProofError::UnknownKey`] if no installed key has the proof's key id,
    /// [`ProofError::Invalid`] if the tag does not match.
    pub fn verify(&self, transcript: &[u8], proof: &HandshakeProof) -> Result<(), ProofError> {
        let ring = self.read();
        let key = ring
            .get(proof.key)
            .ok_or(ProofError::UnknownKey(proof.key))?;
        let expected = key.handshake_tag(PROOF_LABEL, transcript);
        if bool::from(expected.ct_eq(&proof.tag)) {
            Ok(())
        } else {
            Err(ProofError::Invalid(proof.key))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::seal::ClusterKey;

    fn ring(byte: u8) -> Keyring {
        Keyring::new(ClusterKey::from_bytes([byte; 32]))
    }

    #[test]
    fn a_proof_verifies_with_the_same_key() {
        let (a, b) = (ring(1), ring(1));
        let proof = a.prove(b"hello a | hello b | 0");
        assert_eq!(proof.key, a.primary());
        assert_eq!(b.verify(b"hello a | hello b | 0", &proof), Ok(()));
        // Deterministic: the same transcript gives the same tag.
        assert_eq!(a.prove(b"hello a | hello b | 0"), proof);
        assert!(!format!("{proof:?}").contains("tag"));
    }

    #[test]
    fn a_proof_with_another_key_is_refused_by_its_id() {
        let proof = ring(2).prove(b"t");
        assert_eq!(
            ring(1).verify(b"t", &proof),
            Err(ProofError::UnknownKey(proof.key))
        );
        // A forged proof naming our key id, made without the key.
        let forged = HandshakeProof {
            key: ring(1).primary(),
            tag: proof.tag,
        };
        assert_eq!(
            ring(1).verify(b"t", &forged),
            Err(ProofError::Invalid(forged.key))
        );
    }

    #[test]
    fn a_changed_transcript_or_tag_is_refused() {
        let a = ring(3);
        let proof = a.prove(b"initiator|responder|\x00");
        assert!(a.verify(b"initiator|responder|\x01", &proof).is_err());
        assert!(a.verify(b"initiator|responder|", &proof).is_err());
        let mut bent = proof;
        bent.tag[15] ^= 1;
        assert_eq!(
            a.verify(b"initiator|responder|\x00", &bent),
            Err(ProofError::Invalid(a.primary()))
        );
    }

    #[test]
    fn a_proof_replayed_on_another_connection_is_refused() {
        let a = ring(4);
        // Two connections: the verifier's fresh challenge differs, so do the transcripts.
        let first = [b"hello i".as_slice(), &[1; 16], b"hello r", &[0]].concat();
        let second = [b"hello i".as_slice(), &[2; 16], b"hello r", &[0]].concat();
        let recorded = a.prove(&first);
        assert_eq!(a.verify(&first, &recorded), Ok(()));
        assert_eq!(
            a.verify(&second, &recorded),
            Err(ProofError::Invalid(a.primary()))
        );
    }

    #[test]
    fn any_installed_key_verifies_during_a_rotation() {
        let (old, new) = (
            ClusterKey::from_bytes([5; 32]),
            ClusterKey::from_bytes([6; 32]),
        );
        let rotating = Keyring::new(old.clone());
        rotating.install(new.clone()).unwrap();
        let switched = Keyring::new(new);
        assert_eq!(rotating.verify(b"t", &switched.prove(b"t")), Ok(()));
        assert_eq!(
            Keyring::new(old).verify(b"t", &rotating.prove(b"t")),
            Ok(())
        );
    }
}
