//! The locks that a first attempt of this client found held lately: a hint that sends the
//! next first attempt of such a lock to the acquire script rather than the plain commands
//! (`plain_take`).
//!
//! Plain commands take a free lock for less than the script costs Redis, but on a held one
//! they can only tell that it is held: the script must follow in a second round trip to place
//! the client among the waiting. A lock that passes between clients is held at most first
//! attempts, and there each costs two round trips where the script alone costs one. Worse,
//! the release of the holder comes during the second and finds nobody waiting, so the lock
//! goes free instead of being handed over: between two processes taking turns, one of them
//! took the lock that way at every turn (2 x 1 through a network of 250 us each way: 0.70 of
//! a `FairMutex`'s hand-offs). A client whose first attempt found a lock held within
//! [`CONTENDED_FOR`] sends the script at once.
//!
//! A table of 1,024 places, written and read without a lock, each the hash of a lock key and
//! when it was found held: a lock that another evicted, or a hash that two keys share, only
//! costs a first attempt its better guess.

use std::hash::Hasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::fast_hash::FxHasher;

/// How long after a first attempt found a lock held the next ones go to the script: the
/// time the lock is likely still passing between clients (as long as a client's leader pops
/// notes after the last came, `waiting::POPS_WHILE_NOTED`).
pub(crate) const CONTENDED_FOR: Duration = Duration::from_secs(1);

const SLOTS: usize = 1024;

/// See the module's documentation.
pub(crate) struct ContendedLocks {
    /// Per place: the hash of a lock key (never 0, the empty place), and when it was found
    /// held, in milliseconds from `epoch` (the two are written apart: a place read between
    /// the writes mixes two locks, which costs a guess only).
    slots: Box<[(AtomicU64, AtomicU64)]>,
    epoch: Instant,
}

impl ContendedLocks {
    pub(crate) fn new() -> Self {
        ContendedLocks {
            slots: (0..SLOTS)
                .map(|_| (AtomicU64::new(0), AtomicU64::new(0)))
                .collect(),
            epoch: Instant::now(),
        }
    }

    /// The lock's hash and its place.
    fn place(&self, lock: &str) -> (u64, &(AtomicU64, AtomicU64)) {
        let mut hasher = FxHasher::default();
        hasher.write(lock.as_bytes());
        let hash = hasher.finish() | 1;
        // The high bits: the Fx hash mixes them best.
        (hash, &self.slots[(hash >> 54) as usize % SLOTS])
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// A first attempt's plain `SET` found `lock` held by another client.
    pub(crate) fn found_held(&self, lock: &str) {
        let (hash, (key, at)) = self.place(lock);
        at.store(self.now_ms(), Ordering::Relaxed);
        key.store(hash, Ordering::Relaxed);
    }

    /// Whether a first attempt found `lock` held within [`CONTENDED_FOR`].
    pub(crate) fn lately(&self, lock: &str) -> bool {
        let (hash, (key, at)) = self.place(lock);
        if key.load(Ordering::Relaxed) != hash {
            return false;
        }
        let age = self.now_ms().saturating_sub(at.load(Ordering::Relaxed));
        u128::from(age) < CONTENDED_FOR.as_millis()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;
    use std::time::{Duration, Instant};

    use super::{ContendedLocks, CONTENDED_FOR};

    #[test]
    fn a_lock_found_held_is_contended_and_others_are_not() {
        let contended = ContendedLocks::new();
        assert!(!contended.lately("lock:{a}"));
        contended.found_held("lock:{a}");
        assert!(contended.lately("lock:{a}"));
        assert!(!contended.lately("lock:{b}"));
    }

    #[test]
    fn the_hint_ends_after_its_time() {
        let Some(epoch) = Instant::now().checked_sub(Duration::from_secs(10)) else {
            return;
        };
        let contended = ContendedLocks {
            epoch,
            ..ContendedLocks::new()
        };
        contended.found_held("lock:{a}");
        assert!(contended.lately("lock:{a}"));
        let (_, (_, at)) = contended.place("lock:{a}");
        let past = 2 * u64::try_from(CONTENDED_FOR.as_millis()).unwrap_or(u64::MAX);
        at.store(contended.now_ms() - past, Ordering::Relaxed);
        assert!(!contended.lately("lock:{a}"));
    }
}
