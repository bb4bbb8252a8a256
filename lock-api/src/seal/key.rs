//! Cluster keys and their ids.

use std::fmt;
use std::path::Path;

use aes_gcm::aead::KeyInit;
use aes_gcm::Aes256Gcm;
use hkdf::Hkdf;
use sha2::Sha256;
use thiserror::Error;
use zeroize::Zeroizing;

/// The environment variable [`ClusterKey::from_env`] reads: the key as 64 hex digits.
pub const KEY_ENV: &str = "CONCLAVE_CLUSTER_KEY";
/// The environment variable [`ClusterKey::from_env`] reads when [`KEY_ENV`] is unset: the path
/// of a key file.
pub const KEY_FILE_ENV: &str = "CONCLAVE_CLUSTER_KEY_FILE";

/// The public id of a [`ClusterKey`]: a 32-bit fingerprint every member computes alike.
///
/// It names the key in sealed packets (so a receiver picks the right key without trying them
/// all), in logs ("packet from X failed authentication (key id N)") and in the keyring. It
/// says nothing about the key: it is four bytes derived from the key with HKDF-SHA256 under a
/// label of its own, which only the key's holder can compute.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(pub u32);

impl fmt::Display for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:08x}", self.0)
    }
}

impl fmt::Debug for KeyId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KeyId({self})")
    }
}

/// A 32-byte secret shared by every member of a cluster: it seals (encrypts and
/// authenticates) every datagram and TCP frame the members exchange.
///
/// Never printed: `Debug` shows only its [`KeyId`]. Its bytes are wiped from memory when it is
/// dropped.
///
/// ```
/// use conclave_lock_api::seal::ClusterKey;
///
/// let key = ClusterKey::from_hex(&"2a".repeat(32))?;
/// assert_eq!(format!("{key:?}"), format!("ClusterKey(id {})", key.id()));
/// assert_eq!(key.to_hex(), "2a".repeat(32));
/// # Ok::<(), conclave_lock_api::seal::KeyError>(())
/// ```
#[derive(Clone)]
pub struct ClusterKey {
    bytes: Zeroizing<[u8; 32]>,
    id: KeyId,
}

impl ClusterKey {
    /// The key made of these 32 bytes.
    pub fn from_bytes(bytes: [u8; 32]) -> Self {
        let bytes = Zeroizing::new(bytes);
        let id = fingerprint(&bytes);
        Self { bytes, id }
    }

    /// A new random key from the operating system's generator: what `conclave-node keygen`
    /// style tooling writes to a key file.
    ///
    /// # Errors
    /// [`KeyError::Random`] if the system's random source fails.
    pub fn generate() -> Result<Self, KeyError> {
        let mut bytes = Zeroizing::new([0u8; 32]);
        getrandom::fill(bytes.as_mut()).map_err(|e| KeyError::Random(e.to_string()))?;
        Ok(Self::from_bytes(*bytes))
    }

    /// The key written as 64 hex digits (either case; surrounding whitespace is ignored).
    ///
    /// # Errors
    /// [`KeyError::Format`] if `text` is not exactly 64 hex digits.
    pub fn from_hex(text: &str) -> Result<Self, KeyError> {
        let text = text.trim().as_bytes();
        if text.len() != 64 {
            return Err(KeyError::Format);
        }
        let mut bytes = Zeroizing::new([0u8; 32]);
        for (byte, pair) in bytes.iter_mut().zip(text.chunks_exact(2)) {
            *byte = (hex_digit(pair[0])? << 4) | hex_digit(pair[1])?;
        }
        Ok(Self::from_bytes(*bytes))
    }

    /// The key as 64 lowercase hex digits, for writing a key file.
    pub fn to_hex(&self) -> String {
        self.bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// Reads a key file: 64 hex digits (whitespace around them ignored).
    ///
    /// On Unix a file that others than its owner may read is still accepted, with a warning
    /// in the log, as ssh does for a loose key.
    ///
    /// # Errors
    /// [`KeyError::File`] if the file cannot be read, [`KeyError::Format`] if it does not hold
    /// a key.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, KeyError> {
        let path = path.as_ref();
        let text = Zeroizing::new(std::fs::read_to_string(path).map_err(|e| KeyError::File {
            path: path.display().to_string(),
            error: e.to_string(),
        })?);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            if let Ok(meta) = std::fs::metadata(path) {
                if meta.permissions().mode() & 0o077 != 0 {
                    tracing::warn!(
                        path = %path.display(),
                        "the cluster key file may be read by other users; make it private (chmod 600)"
                    );
                }
            }
        }
        Self::from_hex(&text)
    }

    /// The key named by the environment: [`KEY_ENV`] (64 hex digits) or else [`KEY_FILE_ENV`]
    /// (a key file's path); `Ok(None)` when neither is set.
    ///
    /// # Errors
    /// As [`ClusterKey::from_hex`] and [`ClusterKey::from_file`]: a variable that is set but
    /// holds no valid key is an error, never ignored.
    pub fn from_env() -> Result<Option<Self>, KeyError> {
        if let Some(text) = std::env::var_os(KEY_ENV) {
            let text = Zeroizing::new(text.into_string().map_err(|_| KeyError::Format)?);
            return Self::from_hex(&text).map(Some);
        }
        match std::env::var_os(KEY_FILE_ENV) {
            Some(path) => Self::from_file(path).map(Some),
            None => Ok(None),
        }
    }

    /// This key's public id.
    pub fn id(&self) -> KeyId {
        self.id
    }

    /// The cipher of one sender session: AES-256-GCM under the key HKDF-SHA256 derives from
    /// this cluster key for `session` (see [the nonce construction](super#nonces)).
    pub(crate) fn session_cipher(&self, session: &[u8; 16]) -> Aes256Gcm {
        let mut info = [0u8; SESSION_LABEL.len() + 16];
        info[..SESSION_LABEL.len()].copy_from_slice(SESSION_LABEL);
        info[SESSION_LABEL.len()..].copy_from_slice(session);
        let key = Zeroizing::new(derive::<32>(&self.bytes, &info));
        Aes256Gcm::new(key.as_ref().into())
    }

    /// The handshake tag of `transcript`: 16 bytes of HKDF-SHA256 of this cluster key with
    /// info = `label` ‖ `transcript`. HKDF-Expand is HMAC-SHA256 under the extracted key, so
    /// the tag is a MAC of the transcript that only holders of the key can compute.
    pub(crate) fn handshake_tag(&self, label: &[u8], transcript: &[u8]) -> [u8; 16] {
        let mut out = [0u8; 16];
        // Expanding fails only for outputs above 255 hash lengths.
        let _ = Hkdf::<Sha256>::new(None, self.bytes.as_ref())
            .expand_multi_info(&[label, transcript], &mut out);
        out
    }
}

impl fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ClusterKey(id {})", self.id)
    }
}

impl PartialEq for ClusterKey {
    fn eq(&self, other: &Self) -> bool {
        // Compared by the keyring (two keys with one id are refused) and by tests; the bytes
        // decide.
        *self.bytes == *other.bytes
    }
}

impl Eq for ClusterKey {}

/// Why a cluster key could not be had.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum KeyError {
    /// The text is not 64 hex digits.
    #[error("a cluster key is 64 hex digits (32 bytes)")]
    Format,
    /// The key file could not be read.
    #[error("cannot read the cluster key file {path}: {error}")]
    File {
        /// The file's path.
        path: String,
        /// What the system said.
        error: String,
    },
    /// The system's random source failed.
    #[error("the system's random source failed: {0}")]
    Random(String),
}

fn hex_digit(c: u8) -> Result<u8, KeyError> {
    match c {
        b'0'..=b'9' => Ok(c - b'0'),
        b'a'..=b'f' => Ok(c - b'a' + 10),
        b'A'..=b'F' => Ok(c - b'A' + 10),
        _ => Err(KeyError::Format),
    }
}

/// The label under which a session key is derived (followed by the 16-byte session id).
const SESSION_LABEL: &[u8] = b"conclave seal v1 session ";
/// The label under which the key id is derived.
const ID_LABEL: &[u8] = b"conclave seal v1 key id";

/// `N` bytes of HKDF-SHA256 (no salt) of `key` for `info`.
fn derive<const N: usize>(key: &[u8; 32], info: &[u8]) -> [u8; N] {
    let mut out = [0u8; N];
    // Expanding fails only for outputs above 255 hash lengths; N is at most 32 here.
    let _ = Hkdf::<Sha256>::new(None, key).expand(info, &mut out);
    out
}

/// The key's id: four bytes derived from it under a label of their own.
fn fingerprint(key: &[u8; 32]) -> KeyId {
    KeyId(u32::from_be_bytes(derive::<4>(key, ID_LABEL)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_round_trips_and_bad_text_is_refused() {
        let key = ClusterKey::from_hex(&"0123456789abcdef".repeat(4)).unwrap();
        assert_eq!(key.to_hex(), "0123456789abcdef".repeat(4));
        assert_eq!(
            ClusterKey::from_hex(&"0123456789ABCDEF".repeat(4)).unwrap(),
            key
        );
        assert_eq!(ClusterKey::from_hex("00"), Err(KeyError::Format));
        assert_eq!(
            ClusterKey::from_hex(&"zz".repeat(32)),
            Err(KeyError::Format)
        );
    }

    #[test]
    fn ids_are_stable_and_differ_between_keys() {
        let a = ClusterKey::from_bytes([1; 32]);
        let b = ClusterKey::from_bytes([2; 32]);
        assert_eq!(a.id(), ClusterKey::from_bytes([1; 32]).id());
        assert_ne!(a.id(), b.id());
        assert!(!format!("{a:?}").contains("0101"));
    }

    #[test]
    fn generated_keys_differ() {
        let a = ClusterKey::generate().unwrap();
        let b = ClusterKey::generate().unwrap();
        assert_ne!(a, b);
    }
}
