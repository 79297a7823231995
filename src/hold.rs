//! One acquisition of a lock: what its guards need to renew, extend, check and release it.

use std::sync::Arc;
use std::time::Duration;

use crate::keys::LockKeys;
use crate::lease::LeaseState;

/// A lock held by one thread, shared by all of its (re-entrant) guards.
#[derive(Debug)]
pub(crate) struct Hold {
    pub(crate) keys: Arc<LockKeys>,
    /// The lock's name, for messages.
    pub(crate) name: Arc<str>,
    /// The key as the reentrancy map and the renewal thread know it.
    pub(crate) lock_key: Arc<str>,
    pub(crate) token: Arc<str>,
    pub(crate) fencing_token: u64,
    /// Taken through a fair lock: its release wakes the next waiter in the queue.
    pub(crate) fair: bool,
    /// `Some` for a fixed lease (no renewal); `None` when the renewal thread keeps it alive.
    pub(crate) fixed_lease: Option<Duration>,
    /// The renewal registration, for a renewed lease.
    pub(crate) renewal_id: Option<u64>,
    pub(crate) lease: Arc<LeaseState>,
}
