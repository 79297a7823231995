//! Work a client does as it is shut down, before it closes: holds that give themselves up
//! then (an election's leaders resign at once, as an etcd session's close revokes its lease),
//! rather than being left to run out.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::fast_hash::FastHashMap;

/// One piece of work for the shutdown; it is given what it shuts down (the client's
/// context, still open).
pub(crate) type ShutdownWork<C> = Box<dyn FnOnce(&C) + Send>;

/// The work registered for the shutdown of a `C` (a client's context), by id.
pub(crate) struct AtShutdown<C> {
    next_id: AtomicU64,
    work: Mutex<FastHashMap<u64, ShutdownWork<C>>>,
}

impl<C> Default for AtShutdown<C> {
    fn default() -> Self {
        AtShutdown {
            next_id: AtomicU64::new(0),
            work: Mutex::default(),
        }
    }
}

impl<C> AtShutdown<C> {
    /// Registers `work`; the id cancels it.
    pub(crate) fn add(&self, work: ShutdownWork<C>) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.work.lock().insert(id, work);
        id
    }

    /// Cancels the work registered as `id` (done already, or never registered: nothing).
    pub(crate) fn cancel(&self, id: u64) {
        self.work.lock().remove(&id);
    }

    /// Every piece of work registered, taken out (each runs once).
    pub(crate) fn take_all(&self) -> Vec<ShutdownWork<C>> {
        self.work.lock().drain().map(|(_, work)| work).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cancelled_work_is_not_taken_and_work_is_taken_once() {
        let at = AtShutdown::<()>::default();
        let kept = at.add(Box::new(|_| {}));
        let cancelled = at.add(Box::new(|_| {}));
        assert_ne!(kept, cancelled);
        at.cancel(cancelled);
        assert_eq!(at.take_all().len(), 1);
        assert!(at.take_all().is_empty());
    }
}
