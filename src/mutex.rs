//! `Mutex`: the handle to one named lock, and its acquire loop.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cleanup::Cleanup;
use crate::client::{ClientShared, MAX_LEASE};
use crate::error::{Doing, Error, ErrorKind, Result};
use crate::fair_mutex;
use crate::guard::MutexGuard;
use crate::hold::Hold;
use crate::keys::LockKeys;
use crate::lease::LeaseState;
use crate::notify::Subscription;
use crate::reentrancy;
use crate::renewal::Registration;
use crate::scripts;
use crate::stats::Counters;
use crate::wait::Pause;

/// A lock that excludes every thread of every process using the same Redis and name.
///
/// Get one with [`Client::mutex`](crate::Client::mutex). The handle is cheap, `Clone`,
/// `Send` and `Sync`; it holds nothing in Redis by itself. Locking returns a
/// [`MutexGuard`], which releases the lock when dropped.
///
/// # Leases
///
/// A lock lives in Redis with a lease (a PX expiry), so that a holder that dies cannot keep
/// it forever. By default the lease is the client's
/// [default lease](crate::Builder::default_lease) (30 s) and the client's renewal thread
/// renews it while the guard lives: hold it as long as you need. A handle made with
/// [`with_lease`](Mutex::with_lease) takes the lock for a fixed lease instead, without
/// renewal: after that the lock is free for others whether or not the guard still exists,
/// and [`MutexGuard::is_lost`] says so.
///
/// # Re-entry
///
/// A thread that holds the lock through this client and locks it again (through any handle
/// of the same name from the same client) gets a new guard at once, without a round trip;
/// only the outermost guard's release frees the lock in Redis. Another thread of the same
/// process is excluded like any other process. Guards are not `Send`.
///
/// # Waiting
///
/// A thread that finds the lock held does not poll Redis. Of the threads of one client that
/// wait for the same lock, one contends in Redis while the others wait in the process. It
/// listens on the lock's release channel through the client's one subscriber connection,
/// and a release announces itself there when someone waits, so the waiter tries again
/// within a few round trips of the release. It also re-checks now and then (once per
/// [renewal interval](crate::Builder::renewal_interval), or the backoff cap if longer) and at
/// the lock's expiry, in case an announcement went astray.
/// When announcements are unavailable (the subscriber connection is down), waiters back off
/// exponentially with full jitter instead. No wait goes past the caller's deadline.
///
/// # Fairness
///
/// None: a free lock goes to whichever waiter's attempt reaches Redis first, and a thread
/// that releases and locks again often wins. Use [`FairMutex`](crate::FairMutex) for
/// first-come, first-served.
///
/// # Poisoning
///
/// When a thread panics while holding the lock, its guard releases the lock at once (waiters
/// need not wait out the lease) and leaves a record of who panicked and when, which the next
/// holder, in any process, reads with [`MutexGuard::poison`] and clears with
/// [`MutexGuard::clear_poison`]. Unlike `std::sync::Mutex`, `lock()` does not fail on a
/// poisoned lock: code that does not care keeps working with `lock()?`.
///
/// # Differences from `std::sync::Mutex`
///
/// - It protects no data in memory: it guards a resource outside the process (a row, a file,
///   a job), so the guard has no `Deref`.
/// - Every operation can fail (Redis down, slow, a key of the wrong type): they return
///   [`Result`](crate::Result).
/// - The lock can be lost while held (the lease ran out, someone force-unlocked it). Check
///   [`MutexGuard::is_lost`] in long work, and pass [`MutexGuard::fencing_token`] to the
///   resource so that it can refuse a stale holder.
/// - Locking again on the same thread does not deadlock; it re-enters.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> redmutex::Result<()> {
/// use std::time::Duration;
///
/// let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let stock = client.mutex("stock:sku-42");
/// {
///     let guard = stock.lock()?;
///     // ... read, change and write the stock, tagging the write with
///     // guard.fencing_token() ...
/// } // released here
///
/// match stock.try_lock_for(Duration::from_millis(500))? {
///     Some(_guard) => println!("got it"),
///     None => println!("busy, try later"),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Mutex {
    pub(crate) client: Arc<ClientShared>,
    pub(crate) name: Arc<str>,
    /// The keys, or why the name is invalid (reported by every operation).
    keys: std::result::Result<Arc<LockKeys>, Error>,
    pub(crate) lock_key: Arc<str>,
    fixed_lease: Option<Duration>,
    /// A fair (FIFO) lock: see `FairMutex`.
    pub(crate) fair: bool,
}

/// What one acquire attempt found.
pub(crate) enum Attempt {
    Acquired(MutexGuard),
    /// Held by someone else for at most this long.
    Held(Duration),
}

pub(crate) fn validate_lease(lease: Duration) -> Result<()> {
    if lease < Duration::from_millis(1) {
        return Err(Error::invalid_argument(format!(
            "lease must be at least 1 ms, got {lease:?}"
        )));
    }
    if lease > MAX_LEASE {
        return Err(Error::invalid_argument(format!(
            "lease must be at most {MAX_LEASE:?}, got {lease:?}"
        )));
    }
    Ok(())
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Mutex {
    pub(crate) fn new(client: Arc<ClientShared>, name: &str) -> Self {
        let keys = LockKeys::new(&client.config.key_prefix, name).map(Arc::new);
        let lock_key: Arc<str> = match &keys {
            Ok(k) => Arc::from(k.lock.as_str()),
            Err(_) => Arc::from(""),
        };
        Mutex {
            client,
            name: Arc::from(name),
            keys,
            lock_key,
            fixed_lease: None,
            fair: false,
        }
    }

    pub(crate) fn new_fair(client: Arc<ClientShared>, name: &str) -> Self {
        Mutex {
            fair: true,
            ..Mutex::new(client, name)
        }
    }

    /// This handle, taking the lock for a fixed `lease` with no renewal.
    ///
    /// Use it for work with a known bound, where a holder that hangs must not keep the lock
    /// alive. A lease of zero, under 1 ms or over [`MAX_LEASE`] is reported by the first
    /// operation as an [`ErrorKind::InvalidArgument`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// use std::time::Duration;
    ///
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let report = client.mutex("report").with_lease(Duration::from_secs(5));
    /// if let Some(guard) = report.try_lock()? {
    ///     // ... at most 5 s of work; extend if it needs more ...
    ///     guard.extend(Duration::from_secs(5))?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.fixed_lease = Some(lease);
        self
    }

    /// The lock's name, as given to [`Client::mutex`](crate::Client::mutex).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The fixed lease of this handle, or `None` when the renewal thread keeps it alive.
    pub fn fixed_lease(&self) -> Option<Duration> {
        self.fixed_lease
    }

    /// Blocks until the calling thread holds the lock, and returns its guard.
    ///
    /// If the calling thread holds it already, it re-enters at once (no round trip).
    ///
    /// # Errors
    ///
    /// - [`ErrorKind::InvalidArgument`]: the name or the lease is invalid.
    /// - [`ErrorKind::Connection`] / [`ErrorKind::Timeout`]: Redis could not be reached or did
    ///   not answer in time. Each call has those deadlines; `lock` does not retry them.
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
    pub fn lock(&self) -> Result<MutexGuard> {
        match self.acquire(None)? {
            Some(guard) => Ok(guard),
            None => Err(Error::new(
                ErrorKind::Timeout,
                "lock() gave up without a deadline",
            )),
        }
    }

    /// One attempt: the guard if the lock was free (or already held by this thread), `None`
    /// if someone else holds it.
    ///
    /// # Errors
    ///
    /// As for [`lock`](Mutex::lock); "held by someone else" is `Ok(None)`, not an error.
    pub fn try_lock(&self) -> Result<Option<MutexGuard>> {
        self.acquire(Some(Instant::now()))
    }

    /// Waits up to `timeout` for the lock. `Ok(None)` when it was not acquired in time.
    ///
    /// At least one attempt is made, even with a zero timeout.
    ///
    /// # Errors
    ///
    /// As for [`lock`](Mutex::lock).
    pub fn try_lock_for(&self, timeout: Duration) -> Result<Option<MutexGuard>> {
        // A timeout too large for the clock waits without a deadline.
        self.acquire(Instant::now().checked_add(timeout))
    }

    /// Waits until `deadline` for the lock. `Ok(None)` when it was not acquired in time.
    ///
    /// A deadline in the past makes exactly one attempt.
    ///
    /// # Errors
    ///
    /// As for [`lock`](Mutex::lock).
    pub fn try_lock_until(&self, deadline: Instant) -> Result<Option<MutexGuard>> {
        self.acquire(Some(deadline))
    }

    /// Whether anyone (any thread, any process) holds the lock now. One round trip.
    ///
    /// # Errors
    ///
    /// Connection, timeout and invalid-name errors, as for [`lock`](Mutex::lock).
    pub fn is_locked(&self) -> Result<bool> {
        let keys = self.keys()?;
        self.client.ensure_open()?;
        self.client.call(Doing::lock("checking", &self.name), |c| {
            redis::cmd("EXISTS").arg(&keys.lock).query::<bool>(c)
        })
    }

    /// Whether the calling thread holds the lock through this client. Local, no round trip.
    pub fn is_held_by_current_thread(&self) -> bool {
        self.hold_count() > 0
    }

    /// How many guards of this lock the calling thread holds now. Local, no round trip.
    pub fn hold_count(&self) -> usize {
        if self.keys.is_err() {
            return 0;
        }
        reentrancy::count(self.client.id, &self.lock_key)
    }

    /// Deletes the lock whoever holds it, and wakes its waiters. Returns whether a lock was
    /// there.
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
        let keys = self.keys()?;
        self.client.ensure_open()?;
        let deleted: i64 = self
            .client
            .call(Doing::lock("force-unlocking", &self.name), |c| {
                if self.fair {
                    fair_mutex::release_invocation(keys, "", true).invoke(c)
                } else {
                    scripts::FORCE_RELEASE
                        .key(&keys.lock)
                        .key(&keys.waiting)
                        .arg(&*keys.channel)
                        .invoke(c)
                }
            })?;
        Ok(deleted == 1)
    }

    pub(crate) fn keys(&self) -> Result<&Arc<LockKeys>> {
        self.keys.as_ref().map_err(Clone::clone)
    }

    pub(crate) fn lease(&self) -> Result<Duration> {
        match self.fixed_lease {
            Some(lease) => validate_lease(lease).map(|()| lease),
            None => Ok(self.client.renewal.lease()),
        }
    }

    /// Re-entry, else one attempt, else the waiting loop until `deadline` (`None`: forever).
    #[inline]
    fn acquire(&self, deadline: Option<Instant>) -> Result<Option<MutexGuard>> {
        let keys = self.keys()?;
        let lease = self.lease()?;
        if let Some(guard) = self.reenter()? {
            return Ok(Some(guard));
        }
        if self.fair {
            return fair_mutex::acquire(self, keys, lease, deadline);
        }
        // A blocking acquire queues behind this client's other waiters for the lock instead of
        // trying first: they found it held, and one of them is contending in Redis already.
        let may_wait = deadline.is_none_or(|d| d > Instant::now());
        if may_wait && self.client.gates.has_waiters(&self.lock_key) {
            return self.acquire_contended(keys, lease, deadline, None);
        }
        // When this client listens to the lock's announcements already, joining in before
        // the attempt lets a failed attempt go straight to waiting.
        let early = match may_wait {
            true => self.client.notifier.subscribe_if_live(&keys.channel, None),
            false => None,
        };
        let seen = early.as_ref().map_or(0, Subscription::seen);
        match self.attempt(keys, lease)? {
            Attempt::Acquired(guard) => Ok(Some(guard)),
            Attempt::Held(_) if !may_wait => {
                self.client.counters.gave_up_at_once();
                Ok(None)
            }
            Attempt::Held(ttl) => {
                let early = early.map(|sub| (sub, seen, ttl));
                self.acquire_contended(keys, lease, deadline, early)
            }
        }
    }

    fn reenter(&self) -> Result<Option<MutexGuard>> {
        let Some(hold) = reentrancy::reenter(self.client.id, &self.lock_key) else {
            return Ok(None);
        };
        if let Some(reason) = hold.lease.lost_reason() {
            reentrancy::exit(self.client.id, &self.lock_key);
            return Err(Error::new(
                ErrorKind::LockLost,
                format!(
                    "cannot re-enter lock {:?}: {}",
                    self.name,
                    reason.describe()
                ),
            ));
        }
        Counters::add(&self.client.counters.reentries, 1);
        Ok(Some(MutexGuard::new(Arc::clone(&self.client), hold)))
    }

    /// The slow path. Waits in this client's gate until this thread is the one that contends
    /// in Redis; then subscribes to the lock's release channel and, in this order so that no
    /// announcement is missed, tries, and waits for an announcement or for the backoff delay
    /// (never longer than the lock's remaining lease nor past `deadline`), until acquired.
    ///
    /// `early` is a subscription that was live before a failed attempt, with its wake-up
    /// count and the lock's remaining lease from then: it saves the first attempt here.
    #[cold]
    fn acquire_contended(
        &self,
        keys: &Arc<LockKeys>,
        lease: Duration,
        deadline: Option<Instant>,
        early: Option<(Subscription, u64, Duration)>,
    ) -> Result<Option<MutexGuard>> {
        let client = &self.client;
        let wait = client.counters.contended_wait();
        let Some(pass) = client.gates.lead(&self.lock_key, deadline) else {
            return wait.finish(Ok(None));
        };
        let (subscription, mut skip_attempt) = match early {
            // Nobody led meanwhile: the failed attempt still stands.
            Some((sub, seen, ttl)) if !pass.waited => (Some(sub), Some((seen, ttl))),
            _ => (client.notifier.subscribe(&keys.channel, None), None),
        };
        let mut pause = Pause::new(subscription, &client.config);
        if skip_attempt.is_none() {
            let confirm_by = Instant::now() + client.config.response_timeout;
            pause.confirm(deadline.map_or(confirm_by, |d| d.min(confirm_by)));
        }
        loop {
            let (seen, remaining_ttl) = match skip_attempt.take() {
                Some(earlier) => earlier,
                None => {
                    let seen = pause.seen();
                    match self.attempt(keys, lease) {
                        Ok(Attempt::Acquired(guard)) => return wait.finish(Ok(Some(guard))),
                        Ok(Attempt::Held(ttl)) => (seen, ttl),
                        Err(e) => return wait.finish(Err(e)),
                    }
                }
            };
            if !pause.wait(seen, remaining_ttl, deadline) {
                return wait.finish(Ok(None));
            }
        }
    }

    /// One acquire round trip (two when a dropped connection is retried). On success the
    /// lease is registered for renewal (when it is not fixed) before the guard is returned.
    fn attempt(&self, keys: &Arc<LockKeys>, lease: Duration) -> Result<Attempt> {
        let token = self.client.tokens.next();
        self.attempt_with(keys, lease, &token, "acquiring", |c| {
            scripts::ACQUIRE
                .key(&keys.lock)
                .key(&keys.fence)
                .key(&keys.waiting)
                .arg(&token)
                .arg(millis(lease))
                .invoke(c)
        })
    }

    /// One round trip of an acquire script with `token`, which `acquire` runs and which
    /// replies `{1, fencing token}` when taken or `{0, milliseconds to wait}` when held;
    /// then the replica acknowledgement, when asked for.
    ///
    /// When the connection dropped under it (a Redis restart, a killed connection), the same
    /// call is sent once more on a fresh connection: an acquire script that finds its own
    /// token treats the lock as taken, so this is safe. Any other unknown outcome (a time-out)
    /// is reported at once, and the token-checked clean-up goes to the renewal thread.
    pub(crate) fn attempt_with(
        &self,
        keys: &Arc<LockKeys>,
        lease: Duration,
        token: &str,
        action: &'static str,
        acquire: impl Fn(&mut redis::Connection) -> redis::RedisResult<(i64, i64)>,
    ) -> Result<Attempt> {
        let client = &self.client;
        client.ensure_open()?;
        let doing = Doing::lock(action, &self.name);
        let mut resent = false;
        loop {
            let sent_at = Instant::now();
            let reply = client.call_once(doing, |c| {
                Counters::add(&client.counters.attempts, 1);
                let (taken, value) = acquire(c)?;
                let acks = match taken {
                    1 => client.replica_acks(c)?,
                    _ => None,
                };
                Ok((taken, value, acks))
            });
            return match reply {
                Ok((1, _, Some(acks)))
                    if client
                        .config
                        .replica_acks
                        .is_some_and(|(n, _)| acks < i64::from(n)) =>
                {
                    self.roll_back(keys, token, sent_at + lease);
                    Err(client.not_replicated(acks))
                }
                Ok((1, fencing_token, _)) => {
                    let fencing_token = u64::try_from(fencing_token).unwrap_or(0);
                    self.acquired(keys, lease, token, fencing_token, sent_at)
                        .map(Attempt::Acquired)
                }
                Ok((0, wait_ms, _)) => Ok(Attempt::Held(Duration::from_millis(
                    u64::try_from(wait_ms).unwrap_or(0),
                ))),
                Ok(other) => Err(Error::new(
                    ErrorKind::Server,
                    format!("{doing}: unexpected reply {other:?} from the script"),
                )),
                Err(err) if err.outcome_unknown() => {
                    if err.is_connection() && !resent {
                        resent = true;
                        continue;
                    }
                    // The lock may be ours without our knowing: have it removed, off this path.
                    self.clean_up_later(keys, token, sent_at + lease);
                    Err(err)
                }
                Err(err) => Err(err),
            };
        }
    }

    fn acquired(
        &self,
        keys: &Arc<LockKeys>,
        lease: Duration,
        token: &str,
        fencing_token: u64,
        sent_at: Instant,
    ) -> Result<MutexGuard> {
        let client = &self.client;
        let token: Arc<str> = Arc::from(token);
        let lease_state = LeaseState::new(sent_at + lease);
        let renewal_id = match self.fixed_lease {
            Some(_) => None,
            None => {
                let registration = Registration::Lease {
                    lock_key: Arc::clone(&self.lock_key),
                    token: Arc::clone(&token),
                    state: Arc::clone(&lease_state),
                };
                match client.renewal.register(registration) {
                    Ok(id) => Some(id),
                    Err(e) => {
                        self.roll_back(keys, &token, sent_at + lease);
                        return Err(e);
                    }
                }
            }
        };
        Counters::add(&client.counters.acquisitions, 1);
        let hold = Arc::new(Hold {
            keys: Arc::clone(keys),
            name: Arc::clone(&self.name),
            lock_key: Arc::clone(&self.lock_key),
            token,
            fencing_token,
            fair: self.fair,
            fixed_lease: self.fixed_lease,
            renewal_id,
            lease: lease_state,
        });
        reentrancy::enter(client.id, &self.lock_key, Arc::clone(&hold));
        Ok(MutexGuard::new(Arc::clone(client), hold))
    }

    /// The token-checked call that removes what an acquire with `token` may have left: the
    /// lock if it holds the token (and, for a fair lock, the token's place in the queue).
    pub(crate) fn release_call(
        &self,
        keys: &LockKeys,
        token: &str,
    ) -> redis::ScriptInvocation<'static> {
        if self.fair {
            fair_mutex::leave_invocation(keys, token)
        } else {
            release_invocation(keys, token)
        }
    }

    /// Gives back a lock that was taken but cannot be kept (too few replica acknowledgements,
    /// no renewal thread): one try now, then the renewal thread's clean-up.
    #[cold]
    fn roll_back(&self, keys: &LockKeys, token: &str, give_up_at: Instant) {
        let result = self
            .client
            .call_once(Doing::lock("rolling back", &self.name), |c| {
                self.release_call(keys, token).invoke::<i64>(c)
            });
        if let Err(e) = result {
            log::debug!("redmutex: {e}; retrying in the background");
            self.clean_up_later(keys, token, give_up_at);
        }
    }

    /// Has the renewal thread remove what an acquire with `token` may have left, until Redis
    /// answers or `give_up_at`, when the lease it asked for has passed.
    #[cold]
    pub(crate) fn clean_up_later(&self, keys: &LockKeys, token: &str, give_up_at: Instant) {
        let give_up_at = give_up_at + self.client.config.response_timeout;
        self.client.renewal.clean_up_later(
            &self.lock_key,
            Cleanup {
                name: Arc::clone(&self.name),
                call: self.release_call(keys, token),
                give_up_at,
            },
        );
    }
}

/// The compare-and-delete release of a plain lock, announcing it when someone waits.
pub(crate) fn release_invocation(keys: &LockKeys, token: &str) -> redis::ScriptInvocation<'static> {
    let mut inv = scripts::RELEASE.key(&keys.lock);
    inv.key(&keys.waiting).arg(token).arg(&*keys.channel);
    inv
}

impl fmt::Debug for Mutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct(if self.fair { "FairMutex" } else { "Mutex" })
            .field("name", &self.name)
            .field("fixed_lease", &self.fixed_lease)
            .finish_non_exhaustive()
    }
}
