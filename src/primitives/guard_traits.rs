//! What every guard can be asked, whatever its kind: the lease it holds ([`Lease`]) and, for
//! the guards of exclusive holds, the fencing token ([`Fenced`]). Generic code (a supervisor
//! that watches leases, a helper that extends long work) takes `impl Lease`.

use std::time::Duration;

use crate::error::Result;
use crate::lease::LeaseWatch;

/// A lock held on a lease: every guard of the crate implements it — [`MutexGuard`]
/// (a `Mutex`'s and a `FairMutex`'s), [`RwLockReadGuard`], [`RwLockWriteGuard`],
/// [`SemaphorePermit`], [`SharedGuard`], [`MultiLockGuard`] and [`RedlockGuard`].
///
/// The guards also have these methods as their own, so the trait is needed only in generic
/// code. Each guard's own method says what differs for its kind.
///
/// [`MutexGuard`]: crate::MutexGuard
/// [`RwLockReadGuard`]: crate::RwLockReadGuard
/// [`RwLockWriteGuard`]: crate::RwLockWriteGuard
/// [`SemaphorePermit`]: crate::SemaphorePermit
/// [`SharedGuard`]: crate::SharedGuard
/// [`MultiLockGuard`]: crate::MultiLockGuard
/// [`RedlockGuard`]: crate::RedlockGuard
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use redmutex::Lease;
///
/// /// Long work in steps, stopped as soon as the lease is lost, whatever the lock's kind.
/// fn work_while_held(guard: impl Lease, steps: u32) -> redmutex::Result<()> {
///     for _ in 0..steps {
///         if guard.is_lost() {
///             eprintln!("lost {}; stopping", guard.name());
///             return guard.unlock(); // says LockLost
///         }
///         // ... one step ...
///     }
///     guard.unlock()
/// }
///
/// fn main() -> redmutex::Result<()> {
///     let client = redmutex::Client::open("redis://127.0.0.1/")?;
///     work_while_held(client.mutex("report").lock()?, 10)?;
///     work_while_held(client.semaphore("exports", 3).acquire()?, 10)?;
///     work_while_held(client.rwlock("catalog").read()?, 10)
/// }
/// ```
pub trait Lease {
    /// The name of the lock (a multi-lock's: that of the first lock it took).
    fn name(&self) -> &str;

    /// Whether the lease is known to be lost, without a round trip. Once lost, it stays
    /// lost.
    fn is_lost(&self) -> bool;

    /// A handle that tells, from any thread, when the lease is lost.
    fn lease_watch(&self) -> LeaseWatch;

    /// How long the lease surely still runs, by this machine's clock (which ends a lease
    /// before the server's), without a round trip; zero once lost. Renewal moves it on.
    fn validity_left(&self) -> Duration;

    /// Asks Redis whether the lock is still held, and returns the lease left.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LockLost`](crate::ErrorKind::LockLost) when it is not; connection and
    /// timeout errors.
    fn verify(&self) -> Result<Duration>;

    /// Adds `additional` to the lease left.
    ///
    /// # Errors
    ///
    /// As [`verify`](Lease::verify), and [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)
    /// for a lease out of range.
    fn extend(&self, additional: Duration) -> Result<()>;

    /// Sets the lease left to `remaining` (shorter or longer).
    ///
    /// # Errors
    ///
    /// As [`extend`](Lease::extend).
    fn set_lease(&self, remaining: Duration) -> Result<()>;

    /// Stops renewing and leaves the lock held in Redis until its lease runs out (run-once
    /// jobs); returns how long that is.
    ///
    /// # Errors
    ///
    /// As [`verify`](Lease::verify); the lock is kept whatever Redis answered.
    fn keep_until_expiry(self) -> Result<Duration>
    where
        Self: Sized;

    /// Releases the lock now and says how it went.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LockLost`](crate::ErrorKind::LockLost) when the lease was lost;
    /// connection and timeout errors.
    fn unlock(self) -> Result<()>
    where
        Self: Sized;
}

/// A lock held exclusively, with a fencing token: greater than that of every earlier
/// exclusive holder of the same name. Readers of an `RwLock` and holders of a semaphore's
/// permits share their lock, so their guards carry no token of their own: they do not
/// implement it.
pub trait Fenced: Lease {
    /// The fencing token of this acquisition; see
    /// [`MutexGuard::fencing_token`](crate::MutexGuard::fencing_token).
    fn fencing_token(&self) -> u64;
}

/// Implements [`Lease`] (and [`Fenced`] with `fenced`) for guards by calling their own
/// methods of the same names.
macro_rules! lease_by_own_methods {
    ($($guard:ty),+ $(,)?) => {$(
        impl $crate::Lease for $guard {
            fn name(&self) -> &str {
                <$guard>::name(self)
            }
            fn is_lost(&self) -> bool {
                <$guard>::is_lost(self)
            }
            fn lease_watch(&self) -> $crate::LeaseWatch {
                <$guard>::lease_watch(self)
            }
            fn validity_left(&self) -> std::time::Duration {
                <$guard>::validity_left(self)
            }
            fn verify(&self) -> $crate::Result<std::time::Duration> {
                <$guard>::verify(self)
            }
            fn extend(&self, additional: std::time::Duration) -> $crate::Result<()> {
                <$guard>::extend(self, additional)
            }
            fn set_lease(&self, remaining: std::time::Duration) -> $crate::Result<()> {
                <$guard>::set_lease(self, remaining)
            }
            fn keep_until_expiry(self) -> $crate::Result<std::time::Duration> {
                <$guard>::keep_until_expiry(self)
            }
            fn unlock(self) -> $crate::Result<()> {
                <$guard>::unlock(self)
            }
        }
    )+};
    (fenced $($guard:ty),+ $(,)?) => {
        $crate::primitives::guard_traits::lease_by_own_methods!($($guard),+);
        $(impl $crate::Fenced for $guard {
            fn fencing_token(&self) -> u64 {
                <$guard>::fencing_token(self)
            }
        })+
    };
}

pub(crate) use lease_by_own_methods;

/// Writes the lease methods of a guard over a `LeaseGuard` (its field `inner`) once: `$what`
/// names what the guard holds in the docs ("this read hold"), `$take` is the expression that
/// takes one in the examples, from a `client`.
macro_rules! lease_guard_methods {
    ($guard:ty, $what:literal, $take:literal) => {
        impl $guard {
            #[doc = concat!("The name of the lock ", $what, " is of.")]
            pub fn name(&self) -> &str {
                self.inner.name()
            }

            #[doc = concat!("Whether the lease of ", $what, " is known to be lost, without a ")]
            /// round trip. Once lost, it stays lost.
            pub fn is_lost(&self) -> bool {
                self.inner.is_lost()
            }

            #[doc = concat!("A handle that tells, from any thread, when the lease of ", $what)]
            /// is lost; see [`LeaseWatch`](crate::LeaseWatch).
            pub fn lease_watch(&self) -> $crate::LeaseWatch {
                self.inner.lease_watch()
            }

            #[doc = concat!("How long the lease of ", $what, " surely still runs, by this")]
            /// machine's clock, without a round trip; zero once lost. See
            /// [`Lease::validity_left`](crate::Lease::validity_left).
            pub fn validity_left(&self) -> std::time::Duration {
                self.inner.validity_left()
            }

            #[doc = concat!("Asks Redis whether ", $what, " is still this holder's; returns")]
            /// the remaining lease. One round trip.
            ///
            /// # Errors
            ///
            /// [`ErrorKind::LockLost`](crate::ErrorKind::LockLost) when it is not (the guard
            /// then reports [`is_lost`](Self::is_lost) too); connection and timeout errors.
            pub fn verify(&self) -> $crate::Result<std::time::Duration> {
                self.inner.verify()
            }

            #[doc = concat!("Adds `additional` to the remaining lease of ", $what, ", if it")]
            /// is still held, as [`MutexGuard::extend`](crate::MutexGuard::extend). One round
            /// trip.
            ///
            /// # Errors
            ///
            /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) for a
            /// duration under 1 ms or over [`MAX_LEASE`](crate::MAX_LEASE);
            /// [`ErrorKind::LockLost`](crate::ErrorKind::LockLost) when it is gone (it is
            /// never re-created); connection and timeout errors.
            ///
            /// # Examples
            ///
            /// ```no_run
            /// # fn main() -> redmutex::Result<()> {
            /// use std::time::Duration;
            ///
            /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
            #[doc = concat!("let held = ", $take, ";")]
            /// // ... the work takes longer than planned ...
            /// held.extend(Duration::from_secs(60))?;
            /// # Ok(()) }
            /// ```
            pub fn extend(&self, additional: std::time::Duration) -> $crate::Result<()> {
                self.inner.extend(additional)
            }

            #[doc = concat!("Replaces the remaining lease of ", $what, " with `remaining`,")]
            /// if it is still held, as [`MutexGuard::set_lease`](crate::MutexGuard::set_lease).
            /// One round trip.
            ///
            /// # Errors
            ///
            /// As for [`extend`](Self::extend).
            pub fn set_lease(&self, remaining: std::time::Duration) -> $crate::Result<()> {
                self.inner.set_lease(remaining)
            }

            #[doc = concat!("Stops renewing and leaves ", $what, " held in Redis until its")]
            /// lease runs out; returns how long that is. As
            /// [`MutexGuard::keep_until_expiry`](crate::MutexGuard::keep_until_expiry).
            ///
            /// # Errors
            ///
            /// Connection and timeout errors; the hold is kept whatever Redis answered.
            pub fn keep_until_expiry(self) -> $crate::Result<std::time::Duration> {
                self.inner.keep_until_expiry()
            }

            #[doc = concat!("Releases ", $what, " now and says how it went.")]
            ///
            /// # Errors
            ///
            /// [`ErrorKind::LockLost`](crate::ErrorKind::LockLost) when its lease had run out;
            /// connection and timeout errors.
            pub fn unlock(self) -> $crate::Result<()> {
                self.inner.unlock()
            }
        }

        $crate::primitives::guard_traits::lease_by_own_methods!($guard);
    };
}

pub(crate) use lease_guard_methods;
