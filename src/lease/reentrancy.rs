//! The per-thread hold map: which locks this thread holds, through which client, how many
//! times. Re-entry is answered here without a round trip.

use std::cell::RefCell;
use std::sync::Arc;

use crate::fast_hash::FastHashMap;
use crate::lease::hold::Hold;

/// (client id, lock key) — a lock held through one client.
type HoldKey = (u64, Arc<str>);

struct LocalHold {
    count: usize,
    hold: Arc<Hold>,
}

thread_local! {
    static HOLDS: RefCell<FastHashMap<HoldKey, LocalHold>> = RefCell::new(FastHashMap::default());
}

/// When this thread holds the lock, counts one more hold and returns it.
pub(crate) fn reenter(client: u64, lock_key: &Arc<str>) -> Option<Arc<Hold>> {
    HOLDS
        .try_with(|holds| {
            let mut holds = holds.borrow_mut();
            let local = holds.get_mut(&(client, Arc::clone(lock_key)))?;
            local.count += 1;
            Some(Arc::clone(&local.hold))
        })
        .ok()
        .flatten()
}

/// Records the first hold of a lock by this thread.
pub(crate) fn enter(client: u64, lock_key: &Arc<str>, hold: Arc<Hold>) {
    // Fails only while the thread is being torn down; the guard still releases then.
    let _ = HOLDS.try_with(|holds| {
        holds
            .borrow_mut()
            .insert((client, Arc::clone(lock_key)), LocalHold { count: 1, hold });
    });
}

/// Counts one hold less. Returns `true` when that was the outermost one, so the caller must
/// release the lock in Redis.
pub(crate) fn exit(client: u64, lock_key: &Arc<str>) -> bool {
    HOLDS
        .try_with(|holds| {
            let mut holds = holds.borrow_mut();
            let key = (client, Arc::clone(lock_key));
            match holds.get_mut(&key) {
                Some(local) if local.count > 1 => {
                    local.count -= 1;
                    false
                }
                Some(_) => {
                    holds.remove(&key);
                    true
                }
                None => true,
            }
        })
        .unwrap_or(true)
}

/// How many times this thread holds the lock now.
pub(crate) fn count(client: u64, lock_key: &Arc<str>) -> usize {
    HOLDS
        .try_with(|holds| {
            holds
                .borrow()
                .get(&(client, Arc::clone(lock_key)))
                .map_or(0, |l| l.count)
        })
        .unwrap_or(0)
}
