//! The kinds of lock users take. Each brings only its protocol (its keys, its Lua scripts
//! beside it, how its waiters wait) to the shared lease machinery, and a public handle.

mod acquire_family;
mod election;
mod fair_mutex;
mod guard_traits;
mod lock;
mod multi_lock;
mod mutex;
mod mutex_guard;
mod redlock;
mod rw_lock;
mod semaphore;
#[cfg(feature = "serde")]
mod shared;

pub use election::{Election, Leader, LeaderEvent, Leadership, Observer, MAX_LEADER_VALUE};
pub use fair_mutex::FairMutex;
pub use guard_traits::{Fenced, Lease};
pub use lock::{Fair, Lock, LockKind, Plain};
pub use multi_lock::{MultiLock, MultiLockGuard};
pub use mutex::Mutex;
pub use mutex_guard::MutexGuard;
pub use redlock::{Redlock, RedlockBuilder, RedlockGuard, RedlockMutex};
pub use rw_lock::{RwLock, RwLockReadGuard, RwLockWriteGuard};
pub use semaphore::{Semaphore, SemaphorePermit, MAX_PERMITS};
#[cfg(feature = "serde")]
pub use shared::{Codec, Shared, SharedGuard, MAX_VALUE_LEN};

#[cfg(test)]
mod tests;
