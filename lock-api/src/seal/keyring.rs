//! The keys a member accepts, and the one it sends with.

use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};

use thiserror::Error;

use super::key::{ClusterKey, KeyId};

/// The most keys a keyring holds: a rotation needs two.
pub const MAX_KEYS: usize = 8;

/// The cluster keys a member holds: it opens packets sealed with any of them and seals its own
/// with the **primary** one.
///
/// A `Keyring` is a handle: clones share one ring, so the copy you keep after giving one to
/// the node builder rotates the running node's keys. Rotation without downtime, as in
/// HashiCorp's memberlist, is three steps, each done on every member before the next starts:
///
/// 1. [`Keyring::install`] the new key (everyone now accepts it);
/// 2. [`Keyring::use_key`] it (everyone sends with it; old packets still open);
/// 3. [`Keyring::remove`] the old key.
///
/// ```
/// use conclave_lock_api::seal::{ClusterKey, Keyring};
///
/// let old = ClusterKey::from_bytes([1; 32]);
/// let new = ClusterKey::from_bytes([2; 32]);
/// let ring = Keyring::new(old.clone());
/// let handle = ring.clone(); // kept by the operator's code
/// handle.install(new.clone())?;
/// handle.use_key(new.id())?;
/// handle.remove(old.id())?;
/// assert_eq!(ring.primary(), new.id());
/// assert_eq!(ring.ids(), vec![new.id()]);
/// # Ok::<(), conclave_lock_api::seal::KeyringError>(())
/// ```
#[derive(Clone)]
pub struct Keyring {
    ring: Arc<RwLock<Ring>>,
}

pub(crate) struct Ring {
    primary: KeyId,
    keys: Vec<(KeyId, ClusterKey)>,
}

impl Ring {
    pub(crate) fn primary(&self) -> &ClusterKey {
        self.keys
            .iter()
            .find(|(id, _)| *id == self.primary)
            .map_or(&self.keys[0].1, |(_, key)| key)
    }

    pub(crate) fn get(&self, id: KeyId) -> Option<&ClusterKey> {
        self.keys.iter().find(|(k, _)| *k == id).map(|(_, c)| c)
    }
}

impl Keyring {
    /// A keyring holding one key, its primary.
    pub fn new(primary: ClusterKey) -> Self {
        Self {
            ring: Arc::new(RwLock::new(Ring {
                primary: primary.id(),
                keys: vec![(primary.id(), primary)],
            })),
        }
    }

    /// Adds a key this member accepts (it still sends with its primary). Installing a key
    /// already held does nothing.
    ///
    /// # Errors
    /// [`KeyringError::Full`] with [`MAX_KEYS`] keys installed; [`KeyringError::Collision`]
    /// if another installed key has the same id (a 2^-32 chance: generate another key).
    pub fn install(&self, key: ClusterKey) -> Result<KeyId, KeyringError> {
        let mut ring = self.ring.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(installed) = ring.get(key.id()) {
            if *installed != key {
                return Err(KeyringError::Collision(key.id()));
            }
        } else {
            if ring.keys.len() >= MAX_KEYS {
                return Err(KeyringError::Full);
            }
            let id = key.id();
            ring.keys.push((id, key));
            return Ok(id);
        }
        Ok(key.id())
    }

    /// Makes an installed key the primary: every packet sent from now on is sealed with it.
    ///
    /// # Errors
    /// [`KeyringError::NotInstalled`] if no installed key has this id.
    pub fn use_key(&self, id: KeyId) -> Result<(), KeyringError> {
        let mut ring = self.ring.write().unwrap_or_else(PoisonError::into_inner);
        if ring.get(id).is_none() {
            return Err(KeyringError::NotInstalled(id));
        }
        ring.primary = id;
        Ok(())
    }

    /// Removes a key: packets sealed with it no longer open here.
    ///
    /// # Errors
    /// [`KeyringError::Primary`] for the primary key (switch first),
    /// [`KeyringError::NotInstalled`] if no installed key has this id.
    pub fn remove(&self, id: KeyId) -> Result<(), KeyringError> {
        let mut ring = self.ring.write().unwrap_or_else(PoisonError::into_inner);
        if ring.primary == id {
            return Err(KeyringError::Primary(id));
        }
        let before = ring.keys.len();
        ring.keys.retain(|(k, _)| *k != id);
        if ring.keys.len() == before {
            return Err(KeyringError::NotInstalled(id));
        }
        Ok(())
    }

    /// The id of the key packets are sealed with.
    pub fn primary(&self) -> KeyId {
        self.read().primary
    }

    /// The ids of every installed key, in the order they were installed.
    pub fn ids(&self) -> Vec<KeyId> {
        self.read().keys.iter().map(|(id, _)| *id).collect()
    }

    pub(crate) fn read(&self) -> RwLockReadGuard<'_, Ring> {
        self.ring.read().unwrap_or_else(PoisonError::into_inner)
    }
}

impl std::fmt::Debug for Keyring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keyring")
            .field("primary", &self.primary())
            .field("keys", &self.ids())
            .finish()
    }
}

/// A keyring operation that could not be done.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum KeyringError {
    /// The keyring already holds [`MAX_KEYS`] keys.
    #[error("the keyring is full ({MAX_KEYS} keys)")]
    Full,
    /// No installed key has this id.
    #[error("no installed key has id {0}")]
    NotInstalled(KeyId),
    /// Another installed key has the same id.
    #[error("another installed key has id {0}: generate a new key")]
    Collision(KeyId),
    /// The primary key cannot be removed.
    #[error("key {0} is the primary key: make another key primary before removing it")]
    Primary(KeyId),
}
