//! `Lock<K>`: the one handle of the exclusive locks, written once over their kinds (as
//! lock_api's `Mutex<R, T>` is over its raw mutexes): [`Mutex`](crate::Mutex) is
//! `Lock<Plain>` and [`FairMutex`](crate::FairMutex) is `Lock<Fair>`. A kind brings its
//! protocol (its keys, scripts and waiting); everything a user calls is here.

use std::fmt;
use std::marker::PhantomData;
use std::time::{Duration, Instant};

#[cfg(doc)]
use crate::error::ErrorKind;
use crate::error::Result;
use crate::lease::RawLock;
use crate::primitives::MutexGuard;

/// The kinds of exclusive lock: [`Plain`] ([`Mutex`](crate::Mutex)) and [`Fair`]
/// ([`FairMutex`](crate::FairMutex)). Sealed: the crate's kinds are the only ones.
pub trait LockKind: sealed::Sealed + Send + Sync + 'static {}

mod sealed {
    pub trait Sealed {}
}

/// The kind of [`Mutex`](crate::Mutex): waiters contend, a release names the client that
/// waited longest, and threads of one process hand the lock to each other first.
#[derive(Debug)]
pub enum Plain {}

/// The kind of [`FairMutex`](crate::FairMutex): first come, first served across all
/// processes, a release handing the lock straight to the next in the queue.
#[derive(Debug)]
pub enum Fair {}

impl sealed::Sealed for Plain {}
impl sealed::Sealed for Fair {}
impl LockKind for Plain {}
impl LockKind for Fair {}

/// A lock that excludes every thread of every process using the same Redis and name, of
/// kind `K`. Use it as [`Mutex`](crate::Mutex) (from [`Client::mutex`](crate::Client::mutex))
/// or [`FairMutex`](crate::FairMutex) (from
/// [`Client::fair_mutex`](crate::Client::fair_mutex)), whose docs tell how each behaves.
#[must_use = "a lock handle does nothing until it locks"]
pub struct Lock<K: LockKind> {
    raw: RawLock,
    kind: PhantomData<fn() -> K>,
}

impl<K: LockKind> Lock<K> {
    /// The handle over `raw`, a lock of kind `K`.
    pub(crate) fn of(raw: RawLock) -> Self {
        Lock {
            raw,
            kind: PhantomData,
        }
    }

    /// The lock under this handle, to change it.
    pub(crate) fn into_raw(self) -> RawLock {
        self.raw
    }

    /// The lock under this handle, for primitives made of locks.
    pub(crate) fn raw(&self) -> &RawLock {
        &self.raw
    }

    /// This handle, with holds leased for `lease` in place of the client's
    /// [default lease](crate::Builder::default_lease), renewed as the default is: a holder
    /// keeps the lock as long as its guard lives, and a holder that dies frees it within
    /// `lease`. A lease shorter than the client's is renewed as often as its length asks
    /// (the same share of it as the [renewal interval](crate::Builder::renewal_interval) is
    /// of the default lease), so one client serves locks that must fail over fast beside
    /// the rest.
    ///
    /// A lease of zero, under 1 ms or over [`MAX_LEASE`](crate::MAX_LEASE) is reported by the
    /// first operation as an [`ErrorKind::InvalidArgument`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// use std::time::Duration;
    ///
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// // Taken over within 2 s of its holder's death, however long the holder keeps it.
    /// let dispatcher = client.mutex("dispatcher").with_lease(Duration::from_secs(2));
    /// let guard = dispatcher.lock()?;
    /// // ... work of any length ...
    /// drop(guard);
    /// # Ok(()) }
    /// ```
    pub fn with_lease(self, lease: Duration) -> Self {
        Lock::of(self.raw.with_renewed_lease(lease))
    }

    /// This handle, taking the lock for a fixed `lease` with no renewal.
    ///
    /// Use it for work with a known bound, where a holder that hangs must not keep the lock
    /// alive. A lease of zero, under 1 ms or over [`MAX_LEASE`](crate::MAX_LEASE) is reported
    /// by the first operation as an [`ErrorKind::InvalidArgument`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// use std::time::Duration;
    ///
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let report = client.mutex("report").with_fixed_lease(Duration::from_secs(5));
    /// if let Some(guard) = report.try_lock()? {
    ///     // ... at most 5 s of work; extend if it needs more ...
    ///     guard.extend(Duration::from_secs(5))?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn with_fixed_lease(self, lease: Duration) -> Self {
        Lock::of(self.raw.with_fixed_lease(lease))
    }

    /// The lock's name, as given to [`Client::mutex`](crate::Client::mutex) or
    /// [`Client::fair_mutex`](crate::Client::fair_mutex).
    pub fn name(&self) -> &str {
        self.raw.name()
    }

    /// The fixed lease of this handle, or `None` when the renewal thread keeps it alive.
    pub fn fixed_lease(&self) -> Option<Duration> {
        self.raw.fixed_lease()
    }

    crate::primitives::acquire_family::acquire_family! {
        take_until() -> MutexGuard, "the lock";
        /// Blocks until the calling thread holds the lock, and returns its guard.
        ///
        /// If the calling thread holds it already, it re-enters at once (no round trip).
        ///
        /// # Errors
        ///
        /// - [`ErrorKind::InvalidArgument`]: the name or the lease is invalid.
        /// - [`ErrorKind::Connection`] / [`ErrorKind::Timeout`]: Redis could not be reached or
        ///   did not answer in time (after riding through an outage for the
        ///   [outage patience](crate::Builder::outage_patience), once the client has reached
        ///   Redis; at once before).
        /// - [`ErrorKind::WrongType`]: the lock's key holds something that is not a lock.
        /// - [`ErrorKind::LockLost`]: re-entry into a hold whose lease was lost.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # fn main() -> redmutex::Result<()> {
        /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
        /// let job = client.mutex("nightly-job");
        /// let outer = job.lock()?;
        /// let inner = job.lock()?; // re-entry: no round trip
        /// assert_eq!(job.hold_count(), 2);
        /// drop(inner);
        /// drop(outer); // released in Redis here
        /// # Ok(()) }
        /// ```
        fn lock, try_lock, try_lock_for, try_lock_until;
        ///
        /// A thread that holds the lock already re-enters at once. A
        /// [`FairMutex`](crate::FairMutex)'s attempt never queues, nor takes a free lock
        /// while others queue for it; its waiter that gives up leaves the queue.
    }

    #[inline]
    fn take_until(&self, deadline: Option<Instant>) -> Result<Option<MutexGuard>> {
        Ok(self.raw.acquire(deadline)?.map(MutexGuard::new))
    }

    /// Whether anyone (any thread, any process) holds the lock now. One round trip.
    ///
    /// # Errors
    ///
    /// Connection, timeout and invalid-name errors, as for [`lock`](Self::lock).
    pub fn is_locked(&self) -> Result<bool> {
        self.raw.is_locked()
    }

    /// Whether the calling thread holds the lock through this client. Local, no round trip.
    pub fn is_held_by_current_thread(&self) -> bool {
        self.hold_count() > 0
    }

    /// How many guards of this lock the calling thread holds now. Local, no round trip.
    pub fn hold_count(&self) -> usize {
        self.raw.hold_count()
    }

    /// Deletes the lock whoever holds it, and wakes its waiters (a
    /// [`FairMutex`](crate::FairMutex) hands it to the next in its queue). Returns whether a
    /// lock was there.
    ///
    /// **Dangerous**: the holder keeps running its critical section while someone else takes
    /// the lock. Use it only for administration, such as clearing a lock left by a holder
    /// known to be dead. The holder's guard finds out at its next renewal or release
    /// ([`ErrorKind::LockLost`]).
    ///
    /// # Errors
    ///
    /// Connection and timeout errors; [`ErrorKind::WrongType`] when the key is not a lock
    /// (it is left alone).
    pub fn force_unlock(&self) -> Result<bool> {
        self.raw.force_unlock()
    }
}

impl<K: LockKind> Clone for Lock<K> {
    fn clone(&self) -> Self {
        Lock::of(self.raw.clone())
    }
}

impl<K: LockKind> fmt::Debug for Lock<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(self.raw.kind())
            .field("name", &self.raw.name())
            .field("fixed_lease", &self.raw.fixed_lease())
            .finish_non_exhaustive()
    }
}
