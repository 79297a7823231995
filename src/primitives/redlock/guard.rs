//! `RedlockGuard`: proof of holding a lock on a majority of a Redlock's instances.

use std::cell::RefCell;
use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::LocalKey;
use std::time::{Duration, Instant};

use super::{RedlockCore, KIND};
use crate::config::validate_lease;
use crate::error::{Doing, Error, ErrorKind, Result};
use crate::events::Released;
use crate::fast_hash::FastHashMap;
use crate::keys::LockKeys;
use crate::lease::reentrancy::{self, Held, HoldTable};
use crate::lease::{LeaseState, LeaseWatch, LostReason, PoisonInfo};
use crate::stats::Counters;

/// One hold of a Redlock lock, shared by its re-entrant guards and the renewal thread.
pub(crate) struct RedlockHold {
    pub(crate) inner: Arc<RedlockCore>,
    pub(crate) name: Arc<str>,
    pub(crate) keys: Arc<Vec<LockKeys>>,
    pub(crate) token: Arc<str>,
    pub(crate) fencing_token: u64,
    pub(crate) lease: Duration,
    pub(crate) fixed_lease: bool,
    pub(crate) state: Arc<LeaseState>,
    pub(crate) released: AtomicBool,
    /// When it was taken, for the released event.
    pub(crate) acquired_at: Instant,
}

thread_local! {
    /// This thread's holds through Redlocks.
    static HOLDS: HoldTable<RedlockHold> = RefCell::new(FastHashMap::default());
}

impl Held for RedlockHold {
    fn table() -> &'static LocalKey<HoldTable<RedlockHold>> {
        &HOLDS
    }

    fn lost_reason(&self) -> Option<LostReason> {
        self.state.lost_reason()
    }
}

/// The hold of `name` on this thread, counted once more, if any. A hold whose lease was lost
/// is not entered again: lost is final.
pub(crate) fn reenter(redlock: u64, name: &Arc<str>) -> Result<Option<Arc<RedlockHold>>> {
    reentrancy::reenter::<RedlockHold>(redlock, name).map_err(|reason| {
        Error::new(
            ErrorKind::LockLost,
            format!("cannot re-enter Redlock {name:?}: {}", reason.describe()),
        )
    })
}

/// How many guards of `name` this thread holds.
pub(crate) fn hold_count(redlock: u64, name: &Arc<str>) -> usize {
    reentrancy::count::<RedlockHold>(redlock, name)
}

/// Counts one guard of `hold` out; returns whether it was the last.
fn leave(hold: &RedlockHold) -> bool {
    reentrancy::exit::<RedlockHold>(hold.inner.id, &hold.name)
}

impl RedlockHold {
    fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }

    /// Releases on every instance, once. `Ok` when a majority released it; `LockLost` when
    /// the lease was lost or a majority no longer held it.
    fn release(&self) -> Result<()> {
        if self.released.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let result = self.release_round();
        let counters = &self.inner.counters;
        if result.is_ok() {
            Counters::add(&counters.releases, 1);
        }
        let (name, held) = (&*self.name, self.acquired_at.elapsed());
        let lost = result.as_ref().is_err_and(Error::is_lock_lost);
        counters.events.emit(|h| {
            h.released(&Released {
                name,
                kind: KIND,
                held,
                lost,
            })
        });
        result
    }

    /// The release on every instance, and what it tells of the hold.
    fn release_round(&self) -> Result<()> {
        self.inner.renewal.unregister(self);
        let lost = self.state.lost_reason();
        let doing = Doing::lock("releasing", &self.name);
        let (released, not_ours, error) =
            self.inner
                .release_round(&self.name, &self.keys, &self.token, self.lease, doing);
        self.state.mark_released();
        let n = self.inner.instances.len();
        if released < self.inner.quorum {
            log::warn!(
                "redmutex: Redlock {:?} was released on {released} of {n} instances; the rest \
                 expire with the lease",
                self.name
            );
        }
        if let Some(reason) = lost {
            return Err(self.lost(reason));
        }
        match release_outcome(released, not_ours, n, self.inner.quorum) {
            ReleaseOutcome::Confirmed => Ok(()),
            ReleaseOutcome::Lost => Err(self.lost(LostReason::Taken)),
            ReleaseOutcome::Unknown => {
                let why = error.unwrap_or_else(|| Error::new(ErrorKind::Server, "no reply"));
                let answered = released + not_ours;
                Err(Error::new(
                    why.kind(),
                    format!(
                        "releasing Redlock {:?}: only {answered} of {n} instances answered \
                         ({released} released it), too few to tell whether it was still held; \
                         the rest expire with the lease: {why}",
                        self.name
                    ),
                ))
            }
        }
    }

    /// Marks the lease lost (told once: the event and `Stats::lost`) and makes the error
    /// that says so.
    fn lost(&self, reason: LostReason) -> Error {
        if self.state.mark_lost_at_release(reason.clone()) {
            self.inner.counters.lease_lost(&self.name, KIND);
        }
        Error::new(
            ErrorKind::LockLost,
            format!("Redlock {:?} was lost: {}", self.name, reason.describe()),
        )
    }
}

/// What a release round tells of a hold that was not known to be lost before it.
#[derive(Debug, PartialEq, Eq)]
enum ReleaseOutcome {
    /// A majority of the instances answered: the lock is no longer this holder's on a
    /// majority, and the hold, valid until the release, was not lost.
    Confirmed,
    /// Too few instances released it for a majority to have held it: it was lost.
    Lost,
    /// Too few instances answered to tell.
    Unknown,
}

/// The outcome of a release that `released` instances carried out and `not_ours` found not
/// (or no longer) holding this holder's token, of `n`, the others not answering. An instance
/// that never granted the hold (it was down, or someone else's copy was there when the hold
/// was taken) says "not ours" too, so those answers confirm the release without counting as
/// a loss while the instances that did not answer could still make up the majority that held
/// it (an instance killed during the release round, say).
fn release_outcome(released: usize, not_ours: usize, n: usize, quorum: usize) -> ReleaseOutcome {
    let silent = n - released - not_ours;
    if released >= quorum {
        ReleaseOutcome::Confirmed
    } else if released + silent < quorum {
        ReleaseOutcome::Lost
    } else if released + not_ours >= quorum {
        ReleaseOutcome::Confirmed
    } else {
        ReleaseOutcome::Unknown
    }
}

/// A lock held on a majority of a Redlock's instances. Dropping it releases the lock on every
/// instance (the outermost guard of a re-entrant hold; inner ones only count down).
///
/// A failed release in `drop` is logged and never panics; call
/// [`unlock`](RedlockGuard::unlock) to see the error instead. The guard is not `Send`.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> redmutex::Result<()> {
/// let redlock = redmutex::Redlock::open(["redis://a/", "redis://b/", "redis://c/"])?;
/// let guard = redlock.mutex("ledger").lock()?;
/// // ... write, passing guard.fencing_token() ...
/// if guard.is_lost() {
///     eprintln!("the majority was lost; the write may have overlapped another holder");
/// }
/// guard.unlock()?;
/// # Ok(()) }
/// ```
#[must_use = "if unused the Redlock will immediately unlock"]
pub struct RedlockGuard {
    hold: Arc<RedlockHold>,
    _not_send: PhantomData<*const ()>,
}

impl RedlockGuard {
    pub(crate) fn new(hold: Arc<RedlockHold>, reentered: bool) -> Self {
        if !reentered {
            reentrancy::enter(hold.inner.id, &hold.name, Arc::clone(&hold));
        }
        RedlockGuard {
            hold,
            _not_send: PhantomData,
        }
    }

    /// The fencing token of this acquisition, ordered across every Redlock acquisition of
    /// the same name: strictly greater than that of every acquisition that held the lock
    /// before this one.
    ///
    /// Each instance keeps a counter, as for a [`Mutex`](crate::Mutex). An acquisition takes
    /// the largest counter its majority returned, and raises the counters of that majority
    /// to it while it holds the lock there, before the guard is returned. Any later
    /// acquisition's majority shares at least one instance with that majority, and its
    /// counter there can only have grown since: its token is larger. This holds across a
    /// restart of an instance without data when the restart follows the delayed-restart rule
    /// (a missing counter starts again from the server's clock in microseconds, above every
    /// token handed out a lease earlier).
    pub fn fencing_token(&self) -> u64 {
        self.hold.fencing_token
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.hold.name
    }

    /// Whether the lease is known to be lost, without a round trip: renewal found a majority
    /// no longer holding it, or the lease ran out (counted from the start of the acquire,
    /// minus the drift allowance) without a majority renewing it.
    pub fn is_lost(&self) -> bool {
        self.hold.state.is_lost()
    }

    /// How long the hold is surely valid still, without a round trip: the time until the
    /// lease a majority last granted or renewed runs out, counted from the local send time
    /// of that round, minus the drift allowance. Zero once the lease is lost or released.
    ///
    /// Work that must finish while the lock is held checks this before a step that could
    /// overrun it, as the Redlock algorithm's "validity time" asks.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// # fn main() -> redmutex::Result<()> {
    /// let redlock = redmutex::Redlock::open(["redis://a/", "redis://b/", "redis://c/"])?;
    /// let guard = redlock.mutex("ledger").lock()?;
    /// if guard.validity_left() > Duration::from_secs(2) {
    ///     // ... a step that takes at most two seconds ...
    /// }
    /// # Ok(()) }
    /// ```
    pub fn validity_left(&self) -> Duration {
        let state = &self.hold.state;
        if state.is_lost() || self.hold.is_released() {
            return Duration::ZERO;
        }
        state.expires_at().saturating_duration_since(Instant::now())
    }

    /// A handle that tells, from any thread, when the lease is lost.
    pub fn lease_watch(&self) -> LeaseWatch {
        LeaseWatch::new(Arc::clone(&self.hold.state))
    }

    /// Asks every instance whether it still holds this guard's token; returns the remaining
    /// lease as a majority sees it.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LockLost`] when fewer than a majority hold it; a connection error when
    /// too few instances answered to tell.
    pub fn verify(&self) -> Result<Duration> {
        let h = &self.hold;
        match h.inner.check_round(&h.name, &h.keys, &h.token)? {
            Some(remaining) => Ok(remaining),
            None => Err(h.lost(LostReason::Taken)),
        }
    }

    /// Adds `additional` to the remaining lease on every instance that holds it.
    ///
    /// # Errors
    ///
    /// As [`verify`](RedlockGuard::verify), and
    /// [`ErrorKind::InvalidArgument`] for a lease out of range.
    pub fn extend(&self, additional: Duration) -> Result<()> {
        self.change_lease(additional, "add")
    }

    /// Sets the remaining lease to `remaining` (shorter or longer) on every instance that
    /// holds it.
    ///
    /// # Errors
    ///
    /// As [`extend`](RedlockGuard::extend).
    pub fn set_lease(&self, remaining: Duration) -> Result<()> {
        self.change_lease(remaining, "set")
    }

    /// Stops renewing and leaves the lock held on the instances until its lease runs out;
    /// returns how long that is, as a majority sees it (as
    /// [`MutexGuard::keep_until_expiry`](crate::MutexGuard::keep_until_expiry)). An inner
    /// re-entrant guard only counts down.
    ///
    /// # Errors
    ///
    /// As [`verify`](RedlockGuard::verify); the lock is kept whatever the instances answered.
    pub fn keep_until_expiry(self) -> Result<Duration> {
        let remaining = self.verify();
        let hold = Arc::clone(&self.hold);
        std::mem::forget(self);
        if leave(&hold) && !hold.released.swap(true, Ordering::AcqRel) {
            hold.inner.renewal.unregister(&hold);
            hold.state.mark_released();
        }
        remaining
    }

    /// Adds `by` to the remaining lease (`add`) or replaces it (`set`) on every instance.
    fn change_lease(&self, by: Duration, how: &'static str) -> Result<()> {
        validate_lease(by)?;
        let h = &self.hold;
        if let Some(reason) = h.state.lost_reason() {
            return Err(h.lost(reason));
        }
        let sent_at = Instant::now();
        match h
            .inner
            .change_lease_round(&h.name, &h.keys, &h.token, by, how)?
        {
            Some(remaining) => {
                let drift = RedlockCore::drift(remaining);
                h.state
                    .expires_at_set(sent_at + remaining.saturating_sub(drift));
                Ok(())
            }
            None => Err(h.lost(LostReason::Taken)),
        }
    }

    /// Releases the lock on every instance now and says how it went.
    ///
    /// # Errors
    ///
    /// `Ok` when a majority of the instances answered (released it, or did not hold it:
    /// an instance that never granted this hold, or was killed during the round, does not
    /// fail an unlock that a majority confirmed). [`ErrorKind::LockLost`] when the lease was
    /// lost, or the answers show that no majority still held it. When fewer than a majority
    /// answered, the error of an instance that did not, saying how many answered (their
    /// copies are released later, or expire with the lease). Inner re-entrant guards only
    /// count down and return `Ok`.
    pub fn unlock(self) -> Result<()> {
        let hold = Arc::clone(&self.hold);
        std::mem::forget(self);
        if leave(&hold) {
            hold.release()
        } else {
            Ok(())
        }
    }

    /// The record a holder left when its thread panicked while holding this lock (as with
    /// [`MutexGuard::poison`](crate::MutexGuard::poison)), from the first instance that has
    /// one.
    ///
    /// # Errors
    ///
    /// A connection or timeout error when too few instances answered to tell.
    pub fn poison(&self) -> Result<Option<PoisonInfo>> {
        self.hold
            .inner
            .poison_round(&self.hold.name, &self.hold.keys)
    }

    /// Removes the poison record on every instance. Returns whether there was one.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LockLost`] when the lease is known to be lost; the error of an instance
    /// that did not answer (its record stays).
    pub fn clear_poison(&self) -> Result<bool> {
        let h = &self.hold;
        if let Some(reason) = h.state.lost_reason() {
            return Err(h.lost(reason));
        }
        h.inner.clear_poison_round(&h.name, &h.keys)
    }

    /// How many guards of this lock the current thread holds (this one included).
    pub fn hold_count(&self) -> usize {
        hold_count(self.hold.inner.id, &self.hold.name)
    }

    /// Whether the lease has a fixed length (no renewal).
    pub fn is_fixed_lease(&self) -> bool {
        self.hold.fixed_lease
    }
}

impl Drop for RedlockGuard {
    fn drop(&mut self) {
        if leave(&self.hold) {
            if std::thread::panicking() && !self.hold.is_released() {
                let h = &self.hold;
                h.inner.mark_poisoned_round(&h.name, &h.keys, &h.token);
            }
            if let Err(e) = self.hold.release() {
                log::warn!(
                    "redmutex: releasing Redlock {:?} failed: {e}",
                    self.hold.name
                );
            }
        }
    }
}

impl fmt::Debug for RedlockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockGuard")
            .field("name", &self.hold.name)
            .field("fencing_token", &self.hold.fencing_token)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::{release_outcome, ReleaseOutcome};

    #[test]
    fn a_release_is_judged_by_the_instances_that_answered() {
        // (released, not ours, of 5 with a quorum of 3)
        let cases = [
            ((5, 0), ReleaseOutcome::Confirmed),
            ((3, 0), ReleaseOutcome::Confirmed),
            // Held on three, one of them killed during the release; two never granted it.
            ((2, 2), ReleaseOutcome::Confirmed),
            ((1, 2), ReleaseOutcome::Confirmed),
            // No majority could have held it.
            ((2, 3), ReleaseOutcome::Lost),
            ((0, 5), ReleaseOutcome::Lost),
            ((1, 3), ReleaseOutcome::Lost),
            // Three instances silent: too few answered to tell.
            ((2, 0), ReleaseOutcome::Unknown),
            ((0, 0), ReleaseOutcome::Unknown),
            ((0, 2), ReleaseOutcome::Unknown),
        ];
        for ((released, not_ours), outcome) in cases {
            assert_eq!(
                release_outcome(released, not_ours, 5, 3),
                outcome,
                "{released} released, {not_ours} not ours"
            );
        }
    }
}

crate::primitives::guard_traits::lease_by_own_methods!(fenced RedlockGuard);
