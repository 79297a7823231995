//! `MutexGuard`: proof of holding a lock; releases it when dropped.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cleanup::Cleanup;
use crate::client::ClientShared;
use crate::error::{Doing, Error, ErrorKind, Result};
use crate::fair_mutex;
use crate::hold::Hold;
use crate::lease::{LeaseWatch, LostReason};
use crate::mutex::{millis, release_invocation, validate_lease};
use crate::poison::PoisonInfo;
use crate::reentrancy;
use crate::scripts;
use crate::stats::Counters;

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
    client: Arc<ClientShared>,
    hold: Arc<Hold>,
    released: bool,
    _not_send: PhantomData<*const ()>,
}

impl MutexGuard {
    pub(crate) fn new(client: Arc<ClientShared>, hold: Arc<Hold>) -> Self {
        MutexGuard {
            client,
            hold,
            released: false,
            _not_send: PhantomData,
        }
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
        self.hold.fencing_token
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.hold.name
    }

    /// Whether the lease is known to be lost: renewal found the lock no longer ours, or the
    /// lease ran out (by this machine's clock) without a successful renewal or extension.
    /// Local, no round trip.
    pub fn is_lost(&self) -> bool {
        self.hold.lease.is_lost()
    }

    /// A handle that tells any thread when this lease is lost; see [`LeaseWatch`].
    pub fn lease_watch(&self) -> LeaseWatch {
        LeaseWatch::new(Arc::clone(&self.hold.lease))
    }

    /// Asks Redis whether the lock is still held by this holder. One round trip. Returns the
    /// remaining lease.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LockLost`] when it is not (the guard then reports
    /// [`is_lost`](Self::is_lost) too); connection and timeout errors.
    pub fn verify(&self) -> Result<Duration> {
        let keys = &self.hold.keys;
        let ttl: i64 = self.client.call(self.doing("verifying"), |c| {
            scripts::CHECK
                .key(&keys.lock)
                .arg(&*self.hold.token)
                .invoke(c)
        })?;
        match u64::try_from(ttl) {
            Ok(ms) => Ok(Duration::from_millis(ms)),
            Err(_) => Err(self.lost(LostReason::Taken)),
        }
    }

    /// Adds `additional` to the lock's remaining lease, if it is still held. One round trip.
    ///
    /// For a [fixed lease](crate::Mutex::with_lease) that turns out too short, or to make a
    /// renewed lock outlive a stall of the renewal thread. On a lock kept alive by the
    /// renewal thread the extension stays: renewal only ever raises the remaining lease to
    /// the default lease, never lowers it. (Like `extend(additional_time)` of redis-py's
    /// `Lock`; [`set_lease`](Self::set_lease) replaces the remaining lease instead.)
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`] for a duration under 1 ms or over
    /// [`MAX_LEASE`](crate::MAX_LEASE); [`ErrorKind::LockLost`] when the lock is no longer
    /// held (it is never re-created); connection and timeout errors.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// use std::time::Duration;
    ///
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let report = client.mutex("report").with_lease(Duration::from_secs(5));
    /// let guard = report.lock()?;
    /// // ... the work takes longer than planned ...
    /// guard.extend(Duration::from_secs(5))?; // about 10 s left now
    /// # Ok(()) }
    /// ```
    pub fn extend(&self, additional: Duration) -> Result<()> {
        self.change_lease(additional, "add")
    }

    /// Replaces the lock's remaining lease with `remaining`, if it is still held: it may
    /// shorten the lease. One round trip.
    ///
    /// Meant for a [fixed lease](crate::Mutex::with_lease). On a lock kept alive by the
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
    /// let guard = client.mutex("report").with_lease(Duration::from_secs(60)).lock()?;
    /// // The work is nearly done: let the lock lapse soon if this process hangs now.
    /// guard.set_lease(Duration::from_secs(2))?;
    /// # Ok(()) }
    /// ```
    pub fn set_lease(&self, remaining: Duration) -> Result<()> {
        self.change_lease(remaining, "set")
    }

    fn change_lease(&self, by: Duration, how: &'static str) -> Result<()> {
        validate_lease(by)?;
        if let Some(reason) = self.hold.lease.lost_reason() {
            return Err(self.lost(reason));
        }
        let keys = &self.hold.keys;
        let sent_at = Instant::now();
        let remaining: i64 = self
            .client
            .call(self.doing("extending the lease of"), |c| {
                scripts::CHANGE_LEASE
                    .key(&keys.lock)
                    .arg(&*self.hold.token)
                    .arg(millis(by))
                    .arg(how)
                    .invoke(c)
            })?;
        match u64::try_from(remaining) {
            Ok(ms) => {
                // Counted from the sending: the local view never outlives Redis's.
                self.hold
                    .lease
                    .expires_at_set(sent_at + Duration::from_millis(ms));
                Ok(())
            }
            Err(_) => Err(self.lost(LostReason::Taken)),
        }
    }

    /// Releases the lock now and reports how that went.
    ///
    /// # Errors
    ///
    /// - [`ErrorKind::LockLost`]: the lease had run out or the lock was taken away before
    ///   the release; whoever holds it now is left alone.
    /// - Connection and timeout errors: the release may not have happened; the lock then
    ///   expires with its lease (it is no longer renewed).
    pub fn unlock(mut self) -> Result<()> {
        self.release()
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
        let keys = &self.hold.keys;
        let stored: Option<String> = self
            .client
            .call(self.doing("reading the poison record of"), |c| {
                redis::cmd("GET").arg(&keys.poison).query(c)
            })?;
        Ok(stored.map(|s| PoisonInfo::decode(&s)))
    }

    /// Removes the poison record of this lock. Returns whether there was one.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LockLost`] when the lease is known to be lost (only the holder may clear
    /// it); connection and timeout errors.
    pub fn clear_poison(&self) -> Result<bool> {
        if let Some(reason) = self.hold.lease.lost_reason() {
            return Err(self.lost(reason));
        }
        let keys = &self.hold.keys;
        let removed: i64 = self
            .client
            .call(self.doing("clearing the poison record of"), |c| {
                redis::cmd("DEL").arg(&keys.poison).query(c)
            })?;
        Ok(removed == 1)
    }

    /// Leaves the poison record on the way out of a panicking thread. Best effort: a failure
    /// is logged.
    #[cold]
    fn mark_poisoned(&self) {
        let keys = &self.hold.keys;
        let record = PoisonInfo::here(&self.hold.token).encode();
        let result = self.client.call(self.doing("recording a panic on"), |c| {
            scripts::MARK_POISONED
                .key(&keys.lock)
                .key(&keys.poison)
                .arg(&*self.hold.token)
                .arg(&record)
                .invoke::<i64>(c)
        });
        match result {
            Ok(_) => log::warn!(
                "redmutex: a thread panicked while holding lock {:?}; it is released and \
                 marked poisoned",
                self.hold.name
            ),
            Err(e) => log::warn!(
                "redmutex: a thread panicked while holding lock {:?}, and marking it \
                 poisoned failed: {e}",
                self.hold.name
            ),
        }
    }

    fn lost(&self, reason: LostReason) -> Error {
        if self.hold.lease.mark_lost(reason.clone()) {
            Counters::add(&self.client.counters.lost, 1);
        }
        Error::new(
            ErrorKind::LockLost,
            format!("lock {:?}: {}", self.hold.name, reason.describe()),
        )
    }

    fn release(&mut self) -> Result<()> {
        if self.released {
            return Ok(());
        }
        self.released = true;
        if !reentrancy::exit(self.client.id, &self.hold.lock_key) {
            return Ok(());
        }
        if std::thread::panicking() {
            self.mark_poisoned();
        }
        if let Some(id) = self.hold.renewal_id {
            self.client.renewal.cancel(id);
        }
        let result = self.release_in_redis();
        self.hold.lease.mark_released();
        result
    }

    /// The compare-and-delete release. After a dropped connection it is sent once more (it
    /// is idempotent); after a time-out the caller gets the error at once and the renewal
    /// thread sends it again until Redis answers or the lease has run out.
    fn release_in_redis(&self) -> Result<()> {
        let lost_before = self.hold.lease.lost_reason();
        let mut reply = self.send_release();
        if let Err(first) = &reply {
            if first.is_connection() && !first.is_checkout() {
                reply = match self.send_release() {
                    // The first one ran before its connection dropped.
                    Ok(0) if lost_before.is_none() => Ok(1),
                    Ok(n) => Ok(n),
                    Err(_) => Err(first.clone()),
                };
            }
        }
        match reply {
            Ok(1) => {
                Counters::add(&self.client.counters.releases, 1);
                Ok(())
            }
            Ok(_) => Err(self.lost(lost_before.unwrap_or(LostReason::Taken))),
            Err(e) => {
                if e.outcome_unknown() {
                    self.release_later();
                }
                Err(e)
            }
        }
    }

    fn release_call(&self) -> redis::ScriptInvocation<'static> {
        let keys = &self.hold.keys;
        if self.hold.fair {
            fair_mutex::release_invocation(keys, &self.hold.token, false)
        } else {
            release_invocation(keys, &self.hold.token)
        }
    }

    fn send_release(&self) -> Result<i64> {
        self.client
            .call_once(self.doing("releasing"), |c| self.release_call().invoke(c))
    }

    #[cold]
    fn release_later(&self) {
        let give_up_at = self.hold.lease.expires_at() + self.client.config.response_timeout;
        self.client.renewal.clean_up_later(
            &self.hold.lock_key,
            Cleanup {
                name: Arc::clone(&self.hold.name),
                call: self.release_call(),
                give_up_at,
            },
        );
    }

    fn doing(&self, action: &'static str) -> Doing<'_> {
        Doing::lock(action, &self.hold.name)
    }
}

impl Drop for MutexGuard {
    fn drop(&mut self) {
        if let Err(e) = self.release() {
            log::warn!("redmutex: releasing lock {:?} failed: {e}", self.hold.name);
        }
    }
}

impl fmt::Debug for MutexGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MutexGuard")
            .field("name", &self.hold.name)
            .field("fencing_token", &self.hold.fencing_token)
            .field("fixed_lease", &self.hold.fixed_lease)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}
