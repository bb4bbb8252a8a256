//! The named futures of the front end, one per operation, each named after what it does.
//!
//! | future | made by | resolves to |
//! |---|---|---|
//! | [`Lock`] | [`DistributedMutex::lock`], `try_lock`, `lock_timeout` | a [`MutexGuard`] |
//! | [`LockReentrant`] | [`ReentrantLock::lock`], `try_lock`, `lock_timeout` | a [`ReentrantGuard`] |
//! | [`Read`] | [`RwLock::read`], `try_read`, `read_timeout` | a shared [`RwLockGuard`] |
//! | [`Write`] | [`RwLock::write`], `try_write`, `write_timeout` | an exclusive [`RwLockGuard`] |
//! | [`Unlock`] | every guard's `unlock()` | the grantor's acknowledgement |
//! | [`Lost`] | every guard's `lost()` | the reason a hold was lost |
//!
//! Every one of them works under any executor, and is cancel-safe as its method documents.
//!
//! [`DistributedMutex::lock`]: crate::DistributedMutex::lock
//! [`MutexGuard`]: crate::MutexGuard
//! [`ReentrantLock::lock`]: crate::ReentrantLock::lock
//! [`ReentrantGuard`]: crate::ReentrantGuard
//! [`RwLock::read`]: crate::RwLock::read
//! [`RwLock::write`]: crate::RwLock::write
//! [`RwLockGuard`]: crate::RwLockGuard

pub use crate::hold::{Lost, Unlock};
pub use crate::mutex::Lock;
pub use crate::reentrant::LockReentrant;
pub use crate::rwlock::{Read, Write};
