//! The per-thread hold map: which locks this thread holds, through which owner (a client, or
//! a Redlock over several), how many times. Re-entry is answered here without a round trip.
//! Written once for every lessor: each kind of hold ([`Held`]) has its own table on each
//! thread, so that a lookup costs no dynamic type check.

use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::LocalKey;

use crate::fast_hash::FastHashMap;
use crate::lease::state::LostReason;

/// (owner id, lock key) — a lock held through one owner.
pub(crate) type HoldKey = (u64, Arc<str>);

/// A hold of this thread's, and how many of its guards live.
pub(crate) struct LocalHold<H> {
    count: usize,
    hold: Arc<H>,
}

/// One thread's table of the holds of one kind.
pub(crate) type HoldTable<H> = RefCell<FastHashMap<HoldKey, LocalHold<H>>>;

/// A kind of hold that the map keeps: it names its table, a `thread_local!` of its own, and
/// says whether its lease was lost.
pub(crate) trait Held: Sized + 'static {
    fn table() -> &'static LocalKey<HoldTable<Self>>;

    /// Why the hold's lease is lost, if it is.
    fn lost_reason(&self) -> Option<LostReason>;
}

static NEXT_OWNER: AtomicU64 = AtomicU64::new(1);

/// A new owner id: every client and every Redlock has its own, so that their holds of the
/// same key never meet in the map.
pub(crate) fn new_owner() -> u64 {
    NEXT_OWNER.fetch_add(1, Ordering::Relaxed)
}

/// When this thread holds the lock, counts one more hold and returns it; `Err` with the
/// reason when its lease was lost (lost is final: it is not entered again).
pub(crate) fn reenter<H: Held>(
    owner: u64,
    lock_key: &Arc<str>,
) -> Result<Option<Arc<H>>, LostReason> {
    H::table()
        .try_with(|holds| {
            let mut holds = holds.borrow_mut();
            let Some(local) = holds.get_mut(&(owner, Arc::clone(lock_key))) else {
                return Ok(None);
            };
            if let Some(reason) = local.hold.lost_reason() {
                return Err(reason);
            }
            local.count += 1;
            Ok(Some(Arc::clone(&local.hold)))
        })
        .unwrap_or(Ok(None))
}

/// Records the first hold of a lock by this thread.
pub(crate) fn enter<H: Held>(owner: u64, lock_key: &Arc<str>, hold: Arc<H>) {
    // Fails only while the thread is being torn down; the guard still releases then.
    let _ = H::table().try_with(|holds| {
        holds
            .borrow_mut()
            .insert((owner, Arc::clone(lock_key)), LocalHold { count: 1, hold });
    });
}

/// Counts one hold less. Returns `true` when that was the outermost one, so the caller must
/// release the lock.
pub(crate) fn exit<H: Held>(owner: u64, lock_key: &Arc<str>) -> bool {
    H::table()
        .try_with(|holds| {
            let mut holds = holds.borrow_mut();
            let key = (owner, Arc::clone(lock_key));
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
pub(crate) fn count<H: Held>(owner: u64, lock_key: &Arc<str>) -> usize {
    H::table()
        .try_with(|holds| {
            holds
                .borrow()
                .get(&(owner, Arc::clone(lock_key)))
                .map_or(0, |l| l.count)
        })
        .unwrap_or(0)
}
