//! `MutexGuard`: proof of holding a `Mutex` or a `FairMutex`; releases it when dropped.

use std::fmt;
use std::time::Duration;

use crate::error::Result;
use crate::lease::{LeaseGuard, LeaseWatch, PoisonInfo};

/// A held lock. Dropping it releases the lock (the outermost guard of a re-entrant hold
/// releases it in Redis; inner ones only count down).
///
/// A failed release in `drop` is logged with `log::warn!` and never panics; call
/// [`unlock`](MutexGuard::unlock) to see the error instead. The guard is not `Send`: it
/// belongs to the thread that locked.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> redmutex::Result<()> {
/// let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let guard = client.mutex("ledger").lock()?;
/// let token = guard.fencing_token();
/// // ... write to the ledger, passing `token` so it can refuse stale holders ...
/// if guard.is_lost() {
///     eprintln!("lease lost; the write may have overlapped another holder");
/// }
/// guard.unlock()?; // or just let it drop
/// # let _ = token;
/// # Ok(()) }
/// ```
#[must_use = "if unused the Mutex will immediately unlock"]
pub struct MutexGuard {
    inner: LeaseGuard,
}

impl MutexGuard {
    pub(crate) fn new(inner: LeaseGuard) -> Self {
        MutexGuard { inner }
    }

    /// The hold under this guard, for kinds made of a `Mutex`.
    pub(crate) fn lease(&self) -> &LeaseGuard {
        &self.inner
    }

    /// The fencing token of this acquisition: strictly greater than that of every earlier
    /// acquisition of the same lock name, by any client in any process. Re-entrant guards
    /// share their outer guard's token.
    ///
    /// A lease can run out while its holder is paused (GC, swap, `SIGSTOP`), and another
    /// holder can take the lock meanwhile. The lock alone cannot stop the paused holder from
    /// writing afterwards; the resource can: pass the token with every write, and let the
    /// resource refuse a token lower than the highest it has accepted.
    ///
    /// Tokens keep increasing after Redis lost its data (a restart without persistence): a
    /// missing counter starts again from the Redis server's clock in microseconds. What
    /// remains assumed is that this clock does not go back.
    ///
    /// # Examples
    ///
    /// A resource that checks the token (here a Redis hash, with the check in one script):
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let mut storage = redis::Client::open("redis://127.0.0.1/")?.get_connection()?;
    /// // Accept the write only from a token at least as high as any accepted before.
    /// let fenced_write = redis::Script::new(
    ///     r"local seen = tonumber(redis.call('HGET', KEYS[1], 'token') or '0')
    ///       if tonumber(ARGV[1]) < seen then return 0 end
    ///       redis.call('HSET', KEYS[1], 'token', ARGV[1], 'value', ARGV[2])
    ///       return 1",
    /// );
    ///
    /// let guard = client.mutex("stock:sku-42").lock()?;
    /// let accepted: i64 = fenced_write
    ///     .key("stock:sku-42:data")
    ///     .arg(guard.fencing_token())
    ///     .arg(17)
    ///     .invoke(&mut storage)?;
    /// if accepted == 0 {
    ///     eprintln!("a later holder wrote first: this holder's lease had run out");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn fencing_token(&self) -> u64 {
        self.inner.fencing_token()
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Whether the lease is known to be lost: renewal found the lock no longer ours, or the
    /// lease ran out (by this machine's clock) without a successful renewal or extension.
    /// Local, no round trip.
    pub fn is_lost(&self) -> bool {
        self.inner.is_lost()
    }

    /// How long the lease surely still runs, by this machine's clock (which ends a lease
    /// before the server's: over a [`Redlock`](crate::Redlock), less the time the acquire
    /// took and the clock drift), without a round trip; zero once lost. Renewal moves it on.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// use std::time::Duration;
    ///
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.mutex("ledger").lock()?;
    /// if guard.validity_left() > Duration::from_secs(2) {
    ///     // ... a step that takes at most two seconds ...
    /// }
    /// # Ok(()) }
    /// ```
    pub fn validity_left(&self) -> Duration {
        self.inner.validity_left()
    }

    /// A handle that tells any thread when this lease is lost; see [`LeaseWatch`].
    pub fn lease_watch(&self) -> LeaseWatch {
        self.inner.lease_watch()
    }

    /// Asks Redis whether the lock is still held by this holder. One round trip. Returns the
    /// remaining lease.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LockLost`](crate::ErrorKind::LockLost) when it is not (the guard then reports
    /// [`is_lost`](Self::is_lost) too); connection and timeout errors.
    pub fn verify(&self) -> Result<Duration> {
        self.inner.verify()
    }

    /// Adds `additional` to the lock's remaining lease, if it is still held. One round trip.
    ///
    /// For a [fixed lease](crate::Mutex::with_fixed_lease) that turns out too short, or to make a
    /// renewed lock outlive a stall of the renewal thread. On a lock kept alive by the
    /// renewal thread the extension stays: renewal only ever raises the remaining lease to
    /// the default lease, never lowers it. (Like `extend(additional_time)` of redis-py's
    /// `Lock`; [`set_lease`](Self::set_lease) replaces the remaining lease instead.)
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) for a duration under
    /// 1 ms or over [`MAX_LEASE`](crate::MAX_LEASE);
    /// [`ErrorKind::LockLost`](crate::ErrorKind::LockLost) when the lock is no longer held (it
    /// is never re-created); connection and timeout errors.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// use std::time::Duration;
    ///
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let report = client.mutex("report").with_fixed_lease(Duration::from_secs(5));
    /// let guard = report.lock()?;
    /// // ... the work takes longer than planned ...
    /// guard.extend(Duration::from_secs(5))?; // about 10 s left now
    /// # Ok(()) }
    /// ```
    pub fn extend(&self, additional: Duration) -> Result<()> {
        self.inner.extend(additional)
    }

    /// Replaces the lock's remaining lease with `remaining`, if it is still held: it may
    /// shorten the lease. One round trip.
    ///
    /// Meant for a [fixed lease](crate::Mutex::with_fixed_lease). On a lock kept alive by the
    /// renewal thread, the next renewal raises a shorter lease back to the default lease.
    ///
    /// # Errors
    ///
    /// As for [`extend`](Self::extend).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// use std::time::Duration;
    ///
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.mutex("report").with_fixed_lease(Duration::from_secs(60)).lock()?;
    /// // The work is nearly done: let the lock lapse soon if this process hangs now.
    /// guard.set_lease(Duration::from_secs(2))?;
    /// # Ok(()) }
    /// ```
    pub fn set_lease(&self, remaining: Duration) -> Result<()> {
        self.inner.set_lease(remaining)
    }

    /// Releases the lock now and reports how that went.
    ///
    /// # Errors
    ///
    /// - [`ErrorKind::LockLost`](crate::ErrorKind::LockLost): the lease had run out or the
    ///   lock was taken away before the release; whoever holds it now is left alone.
    /// - Connection and timeout errors: the release may not have happened; the lock then
    ///   expires with its lease (it is no longer renewed).
    pub fn unlock(self) -> Result<()> {
        self.inner.unlock()
    }

    /// Keeps the lock until its lease runs out, instead of releasing it: renewal stops, the
    /// guard goes without a release, and the lock stays in Redis for what is left of its
    /// lease, which this returns (one round trip). This is the run-once pattern ("the job ran
    /// in this window; nobody runs it again until the lease is over") without
    /// `std::mem::forget`, which would keep renewing the lock for as long as the process
    /// lives. An inner re-entrant guard only counts down, as
    /// [`unlock`](MutexGuard::unlock) does.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LockLost`](crate::ErrorKind::LockLost) when the lock was no longer held;
    /// connection and timeout errors when Redis did not say (the lock still expires with its
    /// lease: nothing renews it any more).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let job = client.mutex("nightly-report").with_fixed_lease(Duration::from_secs(3600));
    /// if let Some(guard) = job.try_lock()? {
    ///     // ... run the report ...
    ///     let left = guard.keep_until_expiry()?;
    ///     println!("no other instance runs it for another {left:?}");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn keep_until_expiry(self) -> Result<Duration> {
        self.inner.keep_until_expiry()
    }

    /// Whether the previous holder's thread panicked while holding the lock (in any
    /// process), and who and when. One round trip.
    ///
    /// Unlike `std::sync::Mutex`, a poisoned lock still locks: [`Mutex::lock`] does not fail
    /// because of it, so callers that do not care need do nothing. Callers that do care check
    /// here after locking, repair the protected resource, then
    /// [`clear_poison`](Self::clear_poison). A holder whose process was killed (or that
    /// aborts on panic) leaves no record: its lock simply expires after its lease.
    ///
    /// # Errors
    ///
    /// Connection and timeout errors.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let guard = client.mutex("ledger").lock()?;
    /// if let Some(poison) = guard.poison()? {
    ///     eprintln!("previous holder died mid-way: {poison}; repairing");
    ///     // ... check and repair the ledger ...
    ///     guard.clear_poison()?;
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// [`Mutex::lock`]: crate::Mutex::lock
    pub fn poison(&self) -> Result<Option<PoisonInfo>> {
        self.inner.poison()
    }

    /// Removes the poison record of this lock. Returns whether there was one.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LockLost`](crate::ErrorKind::LockLost) when the lease is known to be lost
    /// (only the holder may clear it); connection and timeout errors.
    pub fn clear_poison(&self) -> Result<bool> {
        self.inner.clear_poison()
    }
}

impl fmt::Debug for MutexGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MutexGuard")
            .field("name", &self.inner.name())
            .field("fencing_token", &self.inner.fencing_token())
            .field("fixed_lease", &self.inner.fixed_lease())
            .field("lost", &self.inner.is_lost())
            .finish_non_exhaustive()
    }
}

crate::primitives::guard_traits::lease_by_own_methods!(fenced MutexGuard);
