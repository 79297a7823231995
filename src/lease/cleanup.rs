//! Clean-up of calls whose outcome is unknown, off the caller's path.
//!
//! An acquire whose reply timed out may still be carried out by Redis later (a stalled
//! server runs its buffered commands when it resumes), and a release that timed out may not
//! have been. Either way the caller gets its error at once, and the token-checked release of
//! that attempt goes here: the renewal thread sends every pending one in one pipelined round
//! trip, again and again, until Redis answered or the lease that the attempt asked for has
//! passed (by then the lock has expired by itself).
//!
//! An answer "nothing of ours was there" is believed only the second time: a stalled server
//! runs the commands it buffered in one pass of its event loop and writes the replies after
//! it, so a clean-up sent after that first answer came back runs after the acquire it cleans
//! up, whichever connection each came on.
//!
//! Memory is bounded: pending clean-ups are kept per lock (a flood of failed acquires of one
//! lock keeps at most [`MAX_PER_LOCK`] of them, the newest) and for at most [`MAX_LOCKS`]
//! locks; past that, a clean-up is dropped with a warning and its lock expires with its lease.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use crate::connection::{Routed, ScriptCall};
use crate::fast_hash::FastHashMap;

/// The most pending clean-ups kept for one lock.
pub(crate) const MAX_PER_LOCK: usize = 16;

/// The most locks with pending clean-ups.
pub(crate) const MAX_LOCKS: usize = 4096;

/// One token-checked release (or leave) to run until Redis answered.
pub(crate) struct Cleanup {
    /// The lock's name, for logs.
    pub(crate) name: Arc<str>,
    /// A script call that removes what the failed call may have left, checked against its
    /// token, and replies 1 when it removed something.
    pub(crate) call: ScriptCall,
    /// When the lease that the failed call asked for has passed, at the latest.
    pub(crate) give_up_at: Instant,
}

/// Where clean-ups go: a renewal thread, which sends them until Redis answers.
pub(crate) trait CleanUpLater {
    /// Hands over the clean-up of a call on the lock at `lock_key` whose outcome is unknown.
    fn clean_up_later(&self, lock_key: &Arc<str>, cleanup: Cleanup);
}

struct Pending {
    cleanup: Cleanup,
    /// Redis answered once that nothing was there.
    answered_once: bool,
}

/// The pending clean-ups of one client.
#[derive(Default)]
pub(crate) struct Cleanups {
    by_lock: Mutex<FastHashMap<Arc<str>, Vec<Pending>>>,
    /// Clean-ups taken out for the batch being sent now.
    in_flight: AtomicUsize,
}

/// What became of a batch of clean-ups that was sent.
pub(crate) enum Outcome {
    /// Redis answered: 1 removed something, anything else did not (or was an error reply).
    Answered(redis::Value),
    /// The batch did not reach Redis or its answer was lost.
    Failed,
}

impl Cleanups {
    /// Adds a clean-up for the lock at `lock_key` (also its route). Returns `false` when the
    /// limits refused it.
    pub(crate) fn add(&self, lock_key: &Arc<str>, cleanup: Cleanup) -> bool {
        let mut by_lock = self.by_lock.lock();
        if !by_lock.contains_key(lock_key) && by_lock.len() >= MAX_LOCKS {
            log::warn!(
                "redmutex: {MAX_LOCKS} locks have clean-ups pending; lock {:?} is left to \
                 expire with its lease",
                cleanup.name
            );
            return false;
        }
        let pending = by_lock.entry(Arc::clone(lock_key)).or_default();
        if pending.len() >= MAX_PER_LOCK {
            let oldest = pending.remove(0);
            log::warn!(
                "redmutex: more than {MAX_PER_LOCK} clean-ups pending for lock {:?}; the \
                 oldest is left to expire with its lease",
                oldest.cleanup.name
            );
        }
        pending.push(Pending {
            cleanup,
            answered_once: false,
        });
        true
    }

    /// Whether any clean-up is pending.
    pub(crate) fn is_empty(&self) -> bool {
        self.by_lock.lock().is_empty()
    }

    /// The number of pending clean-ups, the batch being sent included.
    pub(crate) fn len(&self) -> usize {
        let waiting: usize = self.by_lock.lock().values().map(Vec::len).sum();
        waiting + self.in_flight.load(Ordering::Acquire)
    }

    /// Drops what is past its time, then lets `send` try every pending clean-up in one batch
    /// and records what Redis answered. `send` gets the calls with their routes and returns
    /// one outcome each, in order.
    pub(crate) fn run(&self, send: impl FnOnce(&[Routed<'_>]) -> Vec<Outcome>) -> usize {
        let now = Instant::now();
        // Take the batch out, so that callers adding clean-ups meanwhile do not wait for Redis.
        let mut batch: Vec<(Arc<str>, Pending)> = {
            let mut by_lock = self.by_lock.lock();
            let mut batch = Vec::new();
            for (key, pending) in by_lock.drain() {
                for p in pending {
                    if p.cleanup.give_up_at > now {
                        batch.push((Arc::clone(&key), p));
                    }
                }
            }
            self.in_flight.store(batch.len(), Ordering::Release);
            batch
        };
        if batch.is_empty() {
            return 0;
        }
        let outcomes = {
            let calls: Vec<Routed<'_>> = batch
                .iter()
                .map(|(key, p)| (&**key, &p.cleanup.call))
                .collect();
            send(&calls)
        };
        let sent = batch.len();
        let mut keep = Vec::new();
        for ((key, mut p), outcome) in batch.drain(..).zip(
            outcomes
                .into_iter()
                .chain(std::iter::repeat_with(|| Outcome::Failed)),
        ) {
            match outcome {
                Outcome::Answered(redis::Value::Int(1)) => {
                    log::debug!(
                        "redmutex: removed what a failed call left on lock {:?}",
                        p.cleanup.name
                    );
                }
                Outcome::Answered(_) if p.answered_once => {}
                Outcome::Answered(_) => {
                    p.answered_once = true;
                    keep.push((key, p));
                }
                Outcome::Failed => keep.push((key, p)),
            }
        }
        let mut by_lock = self.by_lock.lock();
        for (key, p) in keep {
            let pending = by_lock.entry(key).or_default();
            if pending.len() < MAX_PER_LOCK {
                pending.push(p);
            }
        }
        self.in_flight.store(0, Ordering::Release);
        sent
    }
}
