//! The contract shared by every Conclave crate.
//!
//! This crate depends on nothing else of Conclave's. It defines:
//!
//! - identities: [`ClusterName`] (validated), [`MemberId`] (one per process incarnation),
//!   [`OwnerId`], [`RequestId`];
//! - membership: [`ViewId`] and [`View`];
//! - locks: [`LockName`] (validated), [`LockMode`], [`FencingToken`], [`LockEvent`];
//! - the wire format ([`wire`]): every protocol message as a serde type, encoded as CBOR inside a
//!   versioned envelope that names the protocol version and the cluster;
//! - the [`Transport`] trait a membership backend implements and the [`LockBackend`] trait the
//!   front end drives;
//! - with the feature `wake` (Unix), [`wake::WakePipe`], the wake-up pipe of the backends'
//!   blocking receives;
//! - with the feature `seal`, [`seal`]: the sealing layer, every datagram and frame sealed
//!   with the cluster key. It is a module tree of its own (`seal/`) that uses only the
//!   [`Transport`] trait and the [`wire`] format of this crate; it lives here because every
//!   backend needs it and already depends on this crate alone. What it promises, and what it
//!   does not, is in its module documentation.
//!
//! ```
//! use conclave_lock_api::{LockName, LockNameError};
//!
//! let name = LockName::new("invoice-42")?;
//! assert_eq!(name.as_str(), "invoice-42");
//! assert_eq!(LockName::new(""), Err(LockNameError::Empty));
//! # Ok::<(), LockNameError>(())
//! ```

mod backend;
mod error;
mod event;
mod ids;
mod lock;
#[cfg(feature = "seal")]
pub mod seal;
mod transport;
mod view;
#[cfg(all(unix, feature = "wake"))]
pub mod wake;
pub mod wire;

pub use backend::{
    Acquire, ClusterBackend, GrantorTable, HeldLock, LockBackend, LockLost, LockStatus,
    LostHandler, RawLockBackend, UnexpectedHandler, UnexpectedLock,
};
pub use error::{ClusterNameError, LockError, LockNameError, MemberNameError, UnlockError};
pub use event::{LockEvent, LockLostReason, UnexpectedGrant};
pub use ids::{ClusterName, MemberId, OwnerId, RequestId};
pub use lock::{FencingToken, LockMode, LockName, ServiceName};
pub use transport::{
    BlockingRecv, Datagram, DiscoveryOutcome, DiscoveryPlace, DiscoveryReport, Transport,
};
pub use view::{View, ViewError, ViewId};
