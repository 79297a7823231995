//! Work a client does as it is shut down, once it takes no more locks and before its
//! connections close: holds that give themselves up then (an election's leaders resign at
//! once, as an etcd session's close revokes its lease), rather than being left to run out.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::fast_hash::FastHashMap;

/// One piece of work for the shutdown; it is given what it shuts down (the client's
/// context, still open).
pub(crate) type ShutdownWork<C> = Box<dyn FnOnce(&C) + Send>;

/// The work registered for the shutdown of a `C` (a client's context), by id.
pub(crate) struct AtShutdown<C> {
    next_id: AtomicU64,
    /// `None` once the shutdown took the work out.
    work: Mutex<Option<FastHashMap<u64, ShutdownWork<C>>>>,
}

impl<C> Default for AtShutdown<C> {
    fn default() -> Self {
        AtShutdown {
            next_id: AtomicU64::new(0),
            work: Mutex::new(Some(FastHashMap::default())),
        }
    }
}

impl<C> AtShutdown<C> {
    /// Registers `work`; the id cancels it. Once the shutdown has taken the work out, `work`
    /// runs at once on `ctx` instead: a hold whose acquire got past the check that the client
    /// is open just before it closed gives itself up as the others did.
    pub(crate) fn add(&self, work: ShutdownWork<C>, ctx: &C) -> u64 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let late = match &mut *self.work.lock() {
            Some(registered) => {
                registered.insert(id, work);
                None
            }
            None => Some(work),
        };
        if let Some(work) = late {
            work(ctx);
        }
        id
    }

    /// Cancels the work registered as `id` (done already, or never registered: nothing).
    pub(crate) fn cancel(&self, id: u64) {
        if let Some(registered) = &mut *self.work.lock() {
            registered.remove(&id);
        }
    }

    /// Every piece of work registered, taken out (each runs once); work registered from
    /// now on runs as it is registered.
    pub(crate) fn take_all(&self) -> Vec<ShutdownWork<C>> {
        self.work
            .lock()
            .take()
            .map(|registered| registered.into_values().collect())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::AtomicUsize;

    #[test]
    fn cancelled_work_is_not_taken_and_work_is_taken_once() {
        let at = AtShutdown::<()>::default();
        let kept = at.add(Box::new(|_| {}), &());
        let cancelled = at.add(Box::new(|_| {}), &());
        assert_ne!(kept, cancelled);
        at.cancel(cancelled);
        assert_eq!(at.take_all().len(), 1);
        assert!(at.take_all().is_empty());
    }

    #[test]
    fn work_registered_after_the_shutdown_took_the_rest_runs_at_once() {
        let at = AtShutdown::<AtomicUsize>::default();
        let ran = AtomicUsize::new(0);
        let count = |ran: &AtomicUsize| {
            ran.fetch_add(1, Ordering::Relaxed);
        };
        at.add(Box::new(count), &ran);
        assert_eq!(ran.load(Ordering::Relaxed), 0);
        for work in at.take_all() {
            work(&ran);
        }
        assert_eq!(ran.load(Ordering::Relaxed), 1);
        let late = at.add(Box::new(count), &ran);
        assert_eq!(ran.load(Ordering::Relaxed), 2);
        at.cancel(late);
        assert!(at.take_all().is_empty());
    }
}
