//! The state of one held lease, shared by its guards, the renewal thread and any
//! [`LeaseWatch`], and the public handle to watch it from any thread.

use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

/// Why a lease counts as lost.
#[derive(Debug, Clone)]
pub(crate) enum LostReason {
    /// Redis no longer holds our token: the lock expired, was deleted or was taken over.
    Taken,
    /// No renewal succeeded before the lease ran out (Redis unreachable, say).
    Expired(String),
    /// The client was shut down, and gave the lock up then (an election's leader resigns).
    ShutDown,
}

impl LostReason {
    pub(crate) fn describe(&self) -> String {
        match self {
            LostReason::Taken => "the lock no longer holds this holder's token".to_owned(),
            LostReason::Expired(why) => format!("the lease ran out without renewal ({why})"),
            LostReason::ShutDown => "the client was shut down and gave the lock up".to_owned(),
        }
    }
}

#[derive(Debug)]
struct LeaseInner {
    /// Set once, never cleared.
    lost: Option<LostReason>,
    /// When the lease runs out at the latest, by this machine's monotonic clock: the send time
    /// of the last successful acquire or renewal plus the lease.
    expires_at: Instant,
    /// The hold was released on purpose; nothing is lost any more.
    released: bool,
    /// The loss was reported (the lease-lost event, a log line): once.
    reported: bool,
}

impl LeaseInner {
    /// Records the loss when the lease ran out by the clock at `now` and was not released.
    /// Returns whether this call recorded it.
    fn record_expiry(&mut self, now: Instant) -> bool {
        if self.lost.is_some() || self.released || now < self.expires_at {
            return false;
        }
        self.lost = Some(LostReason::Expired("no renewal in time".to_owned()));
        true
    }
}

/// The shared state of one lease.
#[derive(Debug)]
pub(crate) struct LeaseState {
    inner: Mutex<LeaseInner>,
    changed: Condvar,
}

impl LeaseState {
    pub(crate) fn new(expires_at: Instant) -> Arc<Self> {
        Arc::new(LeaseState {
            inner: Mutex::new(LeaseInner {
                lost: None,
                expires_at,
                released: false,
                reported: false,
            }),
            changed: Condvar::new(),
        })
    }

    /// Why the lease is lost, if it is. The first read that finds the lease run out by this
    /// machine's clock records it, so a renewal whose reply arrives afterwards cannot bring
    /// the lease back: lost is final.
    pub(crate) fn lost_reason(&self) -> Option<LostReason> {
        let mut inner = self.inner.lock();
        let recorded = inner.record_expiry(Instant::now());
        let lost = inner.lost.clone();
        drop(inner);
        if recorded {
            self.changed.notify_all();
        }
        lost
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost_reason().is_some()
    }

    pub(crate) fn expires_at(&self) -> Instant {
        self.inner.lock().expires_at
    }

    /// Records a successful renewal that keeps the lease surely until `held_until`: a later
    /// expiry set by an extension stays.
    ///
    /// A reply that arrives after the lease ran out by this machine's clock renews nothing:
    /// the lease is lost, whether or not anyone looked in between.
    pub(crate) fn renewed_until(&self, held_until: Instant) {
        self.moved_to(|expires_at| expires_at.max(held_until));
    }

    /// Records a lease changed to end at `expires_at` (an extension, or a replacement that may
    /// shorten it), unless it is lost or ran out before.
    pub(crate) fn expires_at_set(&self, expires_at: Instant) {
        self.moved_to(|_| expires_at);
    }

    fn moved_to(&self, to: impl FnOnce(Instant) -> Instant) {
        let mut inner = self.inner.lock();
        if inner.record_expiry(Instant::now()) {
            drop(inner);
            self.changed.notify_all();
        } else if inner.lost.is_none() {
            inner.expires_at = to(inner.expires_at);
        }
    }

    /// Records the loss (the first reason stays) and wakes every watcher. Returns whether
    /// this call is the first to report it (for the lease-lost event and its log line), also
    /// when a read of the clock recorded the loss before.
    pub(crate) fn mark_lost(&self, reason: LostReason) -> bool {
        let mut inner = self.inner.lock();
        if inner.released {
            return false;
        }
        inner.record_expiry(Instant::now());
        self.report(inner, reason)
    }

    /// Marks the lease lost when a release (sent before its reply was read) found the lock no
    /// longer held, released or not. Returns whether this call is the first to report it.
    pub(crate) fn mark_lost_at_release(&self, reason: LostReason) -> bool {
        let inner = self.inner.lock();
        self.report(inner, reason)
    }

    fn report(
        &self,
        mut inner: parking_lot::MutexGuard<'_, LeaseInner>,
        reason: LostReason,
    ) -> bool {
        inner.lost.get_or_insert(reason);
        let first = !std::mem::replace(&mut inner.reported, true);
        drop(inner);
        self.changed.notify_all();
        first
    }

    pub(crate) fn mark_released(&self) {
        self.inner.lock().released = true;
        self.changed.notify_all();
    }

    fn is_released(&self) -> bool {
        self.inner.lock().released
    }

    /// Waits until the lease is lost or released, or `deadline` passes. Returns whether lost.
    fn wait_until(&self, deadline: Option<Instant>) -> bool {
        let mut inner = self.inner.lock();
        loop {
            if inner.lost.is_some() {
                return true;
            }
            if inner.released {
                return false;
            }
            let now = Instant::now();
            if inner.record_expiry(now) {
                drop(inner);
                self.changed.notify_all();
                return true;
            }
            if deadline.is_some_and(|d| now >= d) {
                return false;
            }
            // Wake at the lease's end at the latest: expiry is noticed without a notifier.
            let wake = match deadline {
                Some(d) => d.min(inner.expires_at),
                None => inner.expires_at,
            };
            self.changed.wait_until(&mut inner, wake);
        }
    }
}

/// A handle that tells, from any thread, whether a held lease was lost.
///
/// Get one with [`MutexGuard::lease_watch`](crate::MutexGuard::lease_watch). It is `Send`,
/// `Sync` and cheap to clone, so a worker thread can poll it or a supervisor can block on it
/// (like etcd's `Session.Done()`), and stop long work early when the lock is gone.
///
/// A lease counts as lost when the renewal thread found the lock no longer holding this
/// holder's token, or when the lease ran out by this machine's clock without a successful
/// renewal. Once lost, it stays lost. After the guard released the lock, the watch reports
/// "not lost" and its waits return at once.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> redmutex::Result<()> {
/// use std::time::Duration;
///
/// let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let guard = client.mutex("nightly-report").lock()?;
/// let watch = guard.lease_watch();
/// for chunk in 0..1000 {
///     if watch.is_lost() {
///         eprintln!("lock lost at chunk {chunk}; stopping");
///         break;
///     }
///     // ... process one chunk ...
/// }
/// // Or, from another thread: watch.wait_timeout(Duration::from_secs(60)) returns true
/// // as soon as the lease is lost.
/// # let _ = Duration::ZERO;
/// guard.unlock()?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct LeaseWatch {
    watched: Watched,
}

/// The leases a watch watches: one, or those of a multi-lock (lost when any is).
#[derive(Debug, Clone)]
enum Watched {
    One(Arc<LeaseState>),
    Any(Arc<[Arc<LeaseState>]>),
}

/// How often a watch of several leases looks at the others while it waits on one (locally:
/// no round trip).
const ANY_SLICE: Duration = Duration::from_millis(10);

impl LeaseWatch {
    pub(crate) fn new(state: Arc<LeaseState>) -> Self {
        LeaseWatch {
            watched: Watched::One(state),
        }
    }

    /// A watch of several leases (a multi-lock's): lost when any is, released when all are.
    pub(crate) fn any(watches: impl IntoIterator<Item = LeaseWatch>) -> Self {
        let states: Vec<Arc<LeaseState>> = watches
            .into_iter()
            .flat_map(|w| match w.watched {
                Watched::One(state) => vec![state],
                Watched::Any(states) => states.to_vec(),
            })
            .collect();
        LeaseWatch {
            watched: Watched::Any(states.into()),
        }
    }

    /// Whether the lease is known to be lost. No round trip.
    pub fn is_lost(&self) -> bool {
        match &self.watched {
            Watched::One(state) => state.is_lost(),
            Watched::Any(states) => states.iter().any(|s| s.is_lost()),
        }
    }

    /// Whether the guard has released the lock.
    pub fn is_released(&self) -> bool {
        match &self.watched {
            Watched::One(state) => state.is_released(),
            Watched::Any(states) => states.iter().all(|s| s.is_released()),
        }
    }

    /// Blocks until the lease is lost (returns `true`) or released (returns `false`).
    ///
    /// It returns at the lease's end at the latest when renewal stops succeeding, so it
    /// cannot outlive a lease that nobody renews.
    pub fn wait(&self) -> bool {
        self.wait_for(None)
    }

    /// Like [`wait`](Self::wait), but returns `false` when `timeout` passes first.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        self.wait_for(Instant::now().checked_add(timeout))
    }

    /// Like [`wait`](Self::wait), but returns `false` when `deadline` passes first.
    pub fn wait_until(&self, deadline: Instant) -> bool {
        self.wait_for(Some(deadline))
    }

    fn wait_for(&self, deadline: Option<Instant>) -> bool {
        let states = match &self.watched {
            Watched::One(state) => return state.wait_until(deadline),
            Watched::Any(states) => states,
        };
        loop {
            if states.iter().any(|s| s.is_lost()) {
                return true;
            }
            let Some(live) = states.iter().find(|s| !s.is_released()) else {
                return false;
            };
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return false;
            }
            let slice = now + ANY_SLICE;
            live.wait_until(Some(deadline.map_or(slice, |d| d.min(slice))));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_runs_out_by_the_local_clock() {
        let state = LeaseState::new(Instant::now() + Duration::from_millis(20));
        assert!(!state.is_lost());
        let watch = LeaseWatch::new(Arc::clone(&state));
        assert!(watch.wait_timeout(Duration::from_secs(30)));
        assert!(state.is_lost());
    }

    #[test]
    fn mark_lost_wakes_a_waiter_and_is_final() {
        let state = LeaseState::new(Instant::now() + Duration::from_secs(3600));
        let watch = LeaseWatch::new(Arc::clone(&state));
        let waiter = std::thread::spawn(move || watch.wait());
        assert!(state.mark_lost(LostReason::Taken));
        assert!(!state.mark_lost(LostReason::Taken));
        assert!(waiter.join().unwrap());
        state.renewed_until(Instant::now() + Duration::from_secs(10));
        assert!(state.is_lost());
    }

    /// A lease seen lost by the clock, then a renewal's reply that arrives late: the reply
    /// renews nothing, and the loss is reported once.
    #[test]
    fn a_lease_read_lost_by_the_clock_stays_lost_after_a_late_renewal() {
        let sent_at = Instant::now();
        let state = LeaseState::new(sent_at + Duration::from_millis(5));
        let watch = LeaseWatch::new(Arc::clone(&state));
        std::thread::sleep(Duration::from_millis(20));
        assert!(watch.is_lost());
        // The renewal was sent before the lease ran out; its reply comes after.
        state.renewed_until(sent_at + Duration::from_secs(30));
        state.expires_at_set(Instant::now() + Duration::from_secs(30));
        assert!(state.is_lost());
        assert!(watch.wait_timeout(Duration::from_millis(1)));
        assert!(matches!(state.lost_reason(), Some(LostReason::Expired(_))));
        // The first to report it is told so, and only the first.
        assert!(state.mark_lost(LostReason::Taken));
        assert!(!state.mark_lost(LostReason::Taken));
        assert!(!state.mark_lost_at_release(LostReason::Taken));
        assert!(matches!(state.lost_reason(), Some(LostReason::Expired(_))));
    }

    /// Nobody looked between the lease's end and the late reply: still lost.
    #[test]
    fn a_renewal_reply_after_the_lease_ran_out_renews_nothing() {
        let sent_at = Instant::now();
        let state = LeaseState::new(sent_at + Duration::from_millis(5));
        std::thread::sleep(Duration::from_millis(20));
        state.renewed_until(sent_at + Duration::from_secs(30));
        assert!(state.is_lost());
        assert!(state.expires_at() < Instant::now());
    }

    #[test]
    fn release_ends_waits_without_loss() {
        let state = LeaseState::new(Instant::now() + Duration::from_secs(3600));
        let watch = LeaseWatch::new(Arc::clone(&state));
        let waiter = std::thread::spawn(move || watch.wait());
        std::thread::sleep(Duration::from_millis(10));
        state.mark_released();
        assert!(!waiter.join().unwrap());
        assert!(!state.is_lost());
        assert!(!state.mark_lost(LostReason::Taken));
    }

    #[test]
    fn timed_wait_returns_false_when_nothing_happens() {
        let state = LeaseState::new(Instant::now() + Duration::from_secs(3600));
        assert!(!LeaseWatch::new(state).wait_timeout(Duration::from_millis(5)));
    }
}
