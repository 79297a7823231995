//! The per-thread hold map: which locks this thread holds, through which owner (a client, or
//! a Redlock over several), how many times. Re-entry is answered here without a round trip.
//!
//! The map is a short list of owners (a thread rarely uses more than one client), each with
//! its table keyed by the lock key. A lookup borrows the key: no reference count moves. A
//! table that empties stays, with its memory, for the next owner that needs one: the list is
//! as long as the most owners through which the thread held locks at once.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::fast_hash::FastHashMap;
use crate::lease::hold::Hold;
use crate::lease::state::LostReason;

/// A hold of this thread's, and how many of its guards live.
struct LocalHold {
    count: usize,
    hold: Arc<Hold>,
}

/// The locks that this thread holds through one owner.
struct OwnerHolds {
    owner: u64,
    holds: FastHashMap<Arc<str>, LocalHold>,
}

thread_local! {
    static HOLDS: RefCell<Vec<OwnerHolds>> = const { RefCell::new(Vec::new()) };
}

static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);

/// A new owner id: every client and every Redlock has its own, so that their holds of the
/// same key never meet in the map.
pub(crate) fn new_owner() -> u64 {
    NEXT_OWNER.fetch_add(1, Ordering::Relaxed)
}

/// `f` on the table of `owner`'s holds on this thread, if it has one (and the thread is not
/// being torn down).
#[inline]
fn with_table<R>(
    owner: u64,
    f: impl FnOnce(&mut FastHashMap<Arc<str>, LocalHold>) -> R,
) -> Option<R> {
    HOLDS
        .try_with(|owners| {
            let mut owners = owners.borrow_mut();
            let table = owners.iter_mut().find(|o| o.owner == owner)?;
            Some(f(&mut table.holds))
        })
        .ok()
        .flatten()
}

/// When this thread holds the lock, counts one more hold and returns it; `Err` with the
/// reason when its lease was lost (lost is final: it is not entered again).
#[inline]
pub(crate) fn reenter(owner: u64, lock_key: &str) -> Result<Option<Arc<Hold>>, LostReason> {
    with_table(owner, |holds| {
        let Some(local) = holds.get_mut(lock_key) else {
            return Ok(None);
        };
        if let Some(reason) = local.hold.lease.lost_reason() {
            return Err(reason);
        }
        local.count += 1;
        Ok(Some(Arc::clone(&local.hold)))
    })
    .unwrap_or(Ok(None))
}

/// Records the first hold of a lock by this thread.
pub(crate) fn enter(owner: u64, lock_key: &Arc<str>, hold: Arc<Hold>) {
    // Fails only while the thread is being torn down; the guard still releases then.
    let _ = HOLDS.try_with(|owners| {
        let mut owners = owners.borrow_mut();
        let at = match owners.iter().position(|o| o.owner == owner) {
            Some(at) => at,
            // An empty table (of an owner gone, or holding nothing here now) is taken over
            // with the memory it grew, as one map for every owner would keep it.
            None => match owners.iter().position(|o| o.holds.is_empty()) {
                Some(empty) => {
                    owners[empty].owner = owner;
                    empty
                }
                None => {
                    owners.push(OwnerHolds {
                        owner,
                        holds: FastHashMap::default(),
                    });
                    owners.len() - 1
                }
            },
        };
        owners[at]
            .holds
            .insert(Arc::clone(lock_key), LocalHold { count: 1, hold });
    });
}

/// Counts one hold less. Returns `true` when that was the outermost one, so the caller must
/// release the lock.
#[inline]
pub(crate) fn exit(owner: u64, lock_key: &str) -> bool {
    with_table(owner, |holds| match holds.get_mut(lock_key) {
        Some(local) if local.count > 1 => {
            local.count -= 1;
            false
        }
        Some(_) => {
            holds.remove(lock_key);
            true
        }
        None => true,
    })
    .unwrap_or(true)
}

/// How many times this thread holds the lock now.
pub(crate) fn count(owner: u64, lock_key: &str) -> usize {
    with_table(owner, |holds| holds.get(lock_key).map_or(0, |l| l.count)).unwrap_or(0)
}
