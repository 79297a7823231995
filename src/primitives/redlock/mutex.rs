//! `RedlockMutex`: the handle to one lock name over a Redlock's instances, and its waiting
//! loop.

use std::fmt;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::guard::{self, RedlockGuard, RedlockHold};
use super::quorum::Round;
use super::{RedlockCore, KIND};
use crate::config::validate_lease;
use crate::error::{Error, ErrorKind, Result};
use crate::events::{Acquired, Failed, TimedOut, Waiting};
use crate::keys::LockKeys;
use crate::lease::LeaseState;
use crate::stats::Counters;
use crate::waiting::{Backoff, Signal, Subscription};

/// A lock name held on a majority of a [`Redlock`](crate::Redlock)'s instances: the methods of
/// [`Mutex`](crate::Mutex), with a [`RedlockGuard`].
///
/// Waiters listen for releases on every instance (an announcement from any instance wakes
/// them) and retry with exponential backoff and full jitter, within their deadline.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> redmutex::Result<()> {
/// use std::time::Duration;
///
/// let redlock = redmutex::Redlock::open(["redis://a/", "redis://b/", "redis://c/"])?;
/// let job = redlock.mutex("nightly-report");
/// match job.try_lock_for(Duration::from_secs(1))? {
///     Some(_guard) => println!("running the report"),
///     None => println!("another instance runs it"),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RedlockMutex {
    inner: Arc<RedlockCore>,
    name: Arc<str>,
    /// The keys on each instance, or why the name is refused.
    keys: std::result::Result<Arc<Vec<LockKeys>>, Error>,
    fixed_lease: Option<Duration>,
}

impl RedlockMutex {
    pub(crate) fn new(inner: Arc<RedlockCore>, name: &str) -> Self {
        let keys = inner.keys(name).map(Arc::new);
        RedlockMutex {
            inner,
            name: Arc::from(name),
            keys,
            fixed_lease: None,
        }
    }

    /// This handle, taking the lock for a fixed `lease` with no renewal. A lease of zero, over
    /// [`MAX_LEASE`](crate::MAX_LEASE), or not above the per-instance timeout is reported by
    /// the first acquire as an error.
    pub fn with_lease(self, lease: Duration) -> Self {
        RedlockMutex {
            fixed_lease: Some(lease),
            ..self
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    crate::primitives::acquire_family::acquire_family! {
        acquire() -> RedlockGuard, "the lock on a majority of the instances";
        /// Blocks until the calling thread holds the lock on a majority of the instances.
        ///
        /// # Errors
        ///
        /// A connection or timeout error when too few instances answer to make a majority;
        /// [`ErrorKind::InvalidArgument`] for a bad name or lease.
        fn lock, try_lock, try_lock_for, try_lock_until;
        ///
        /// A thread that holds the lock already re-enters at once.
    }

    /// Whether a majority of the instances hold the lock now (anyone's).
    ///
    /// # Errors
    ///
    /// A connection or timeout error when too few instances answer to tell.
    pub fn is_locked(&self) -> Result<bool> {
        let keys = self.keys()?;
        self.inner.locked_round(&self.name, keys)
    }

    /// Whether the calling thread holds the lock through this Redlock. Local.
    pub fn is_held_by_current_thread(&self) -> bool {
        self.hold_count() > 0
    }

    /// How many guards of this lock the calling thread holds now. Local.
    pub fn hold_count(&self) -> usize {
        guard::hold_count(self.inner.id, &self.name)
    }

    /// Deletes the lock on every instance, whoever holds it, and wakes its waiters. Returns
    /// whether any instance had it. **Dangerous**, as [`Mutex::force_unlock`].
    ///
    /// [`Mutex::force_unlock`]: crate::Mutex::force_unlock
    ///
    /// # Errors
    ///
    /// A connection or timeout error when a majority did not answer.
    pub fn force_unlock(&self) -> Result<bool> {
        let keys = self.keys()?;
        self.inner.force_round(&self.name, keys)
    }

    fn keys(&self) -> Result<&Arc<Vec<LockKeys>>> {
        self.keys.as_ref().map_err(Clone::clone)
    }

    fn lease(&self) -> Result<Duration> {
        let lease = self.fixed_lease.unwrap_or(self.inner.default_lease);
        validate_lease(lease)?;
        if let Some(timeout) = self.inner.instance_timeout {
            if lease <= timeout {
                return Err(Error::new(
                    ErrorKind::InvalidArgument,
                    format!(
                        "the lease ({lease:?}) must be above the per-instance timeout \
                         ({timeout:?})"
                    ),
                ));
            }
        }
        Ok(lease)
    }

    /// An acquire, counted and told to the event handlers as a client's are.
    fn acquire(&self, deadline: Option<Instant>) -> Result<Option<RedlockGuard>> {
        let counters = &self.inner.counters;
        if let Some(hold) = guard::reenter(self.inner.id, &self.name)? {
            Counters::add(&counters.reentries, 1);
            return Ok(Some(RedlockGuard::new(hold, true)));
        }
        let started = Instant::now();
        let result = self.acquire_new(deadline);
        if matches!(result, Ok(Some(_))) {
            Counters::add(&counters.acquisitions, 1);
        }
        let (name, waited) = (&*self.name, started.elapsed());
        counters.events.emit(|h| match &result {
            Ok(Some(_)) => h.acquired(&Acquired {
                name,
                kind: KIND,
                waited,
            }),
            Ok(None) => h.timed_out(&TimedOut {
                name,
                kind: KIND,
                waited,
            }),
            Err(e) => h.failed(&Failed {
                name,
                kind: KIND,
                error: e.kind(),
            }),
        });
        result
    }

    /// A new acquire, through an outage as a client's blocking acquire rides through one
    /// (see [`RedlockBuilder::outage_patience`](crate::RedlockBuilder::outage_patience)).
    fn acquire_new(&self, deadline: Option<Instant>) -> Result<Option<RedlockGuard>> {
        let keys = self.keys()?;
        let lease = self.lease()?;
        let result = self.acquire_once(keys, lease, deadline);
        if deadline.is_some_and(|d| d <= Instant::now()) {
            return result;
        }
        self.inner.outage().ride_through(deadline, result, || {
            self.acquire_once(keys, lease, deadline)
        })
    }

    /// One acquire, with new tokens: a round, and the waiting loop when the caller may wait.
    fn acquire_once(
        &self,
        keys: &Arc<Vec<LockKeys>>,
        lease: Duration,
        deadline: Option<Instant>,
    ) -> Result<Option<RedlockGuard>> {
        if let Some(guard) = self.attempt(keys, lease)? {
            return Ok(Some(guard));
        }
        let counters = &self.inner.counters;
        if deadline.is_some_and(|d| Instant::now() >= d) {
            counters.gave_up_at_once();
            return Ok(None);
        }
        let wait = counters.contended_wait();
        let name = &*self.name;
        let waiting = |started| Waiting {
            name,
            kind: KIND,
            started,
        };
        counters.events.emit(|h| h.waiting(&waiting(true)));
        let result = self.wait(keys, lease, deadline);
        counters.events.emit(|h| h.waiting(&waiting(false)));
        wait.finish(result)
    }

    /// One round with a new token; the guard when won.
    fn attempt(&self, keys: &Arc<Vec<LockKeys>>, lease: Duration) -> Result<Option<RedlockGuard>> {
        self.attempt_or_wait_hint(keys, lease)
            .map(|(guard, _)| guard)
    }

    fn attempt_or_wait_hint(
        &self,
        keys: &Arc<Vec<LockKeys>>,
        lease: Duration,
    ) -> Result<(Option<RedlockGuard>, Option<Duration>)> {
        Counters::add(&self.inner.counters.attempts, 1);
        let token: Arc<str> = Arc::from(self.inner.instances[0].ctx.tokens.next());
        match self.inner.acquire_round(&self.name, keys, &token, lease)? {
            Round::Acquired {
                fencing_token,
                valid_until,
            } => {
                let hold = Arc::new(RedlockHold {
                    inner: Arc::clone(&self.inner),
                    name: Arc::clone(&self.name),
                    keys: Arc::clone(keys),
                    token,
                    fencing_token,
                    lease,
                    fixed_lease: self.fixed_lease.is_some(),
                    state: LeaseState::new(valid_until),
                    released: AtomicBool::new(false),
                    acquired_at: Instant::now(),
                });
                if self.fixed_lease.is_none() && !self.inner.renewal.register(&hold) {
                    // No renewal: give it back rather than hold a lease nobody renews.
                    drop(RedlockGuard::new(hold, false));
                    return Err(Error::new(
                        ErrorKind::Connection,
                        "cannot start the Redlock renewal thread",
                    ));
                }
                Ok((Some(RedlockGuard::new(hold, false)), None))
            }
            Round::Held(hint) => Ok((None, hint)),
        }
    }

    /// Waits for the lock: listens on every instance's release channel, and tries again when
    /// a release is announced, or after a backoff step (a re-check period while a majority of
    /// the subscriptions is live), never past the holders' remaining lease nor `deadline`.
    #[cold]
    fn wait(
        &self,
        keys: &Arc<Vec<LockKeys>>,
        lease: Duration,
        deadline: Option<Instant>,
    ) -> Result<Option<RedlockGuard>> {
        let signal = Arc::new(Signal::default());
        let subscriptions: Vec<Subscription> = self
            .inner
            .instances
            .iter()
            .zip(keys.iter())
            .filter_map(|(i, k)| {
                i.ctx
                    .subscriber
                    .subscribe_with(&k.channel, None, Arc::clone(&signal))
            })
            .collect();
        let confirm_by = Instant::now() + self.inner.response_timeout();
        let confirm_by = deadline.map_or(confirm_by, |d| d.min(confirm_by));
        for s in &subscriptions {
            s.wait_confirmed(confirm_by);
        }
        let (base, cap) = self.inner.backoff;
        let mut backoff = Backoff::new(base, cap);
        let recheck = cap.max(self.inner.renewal_interval);
        loop {
            let seen = subscriptions.first().map_or(0, Subscription::seen);
            let (won, hint) = self.attempt_or_wait_hint(keys, lease)?;
            if won.is_some() {
                return Ok(won);
            }
            let now = Instant::now();
            if deadline.is_some_and(|d| now >= d) {
                return Ok(None);
            }
            let live = subscriptions.iter().filter(|s| s.is_live()).count();
            let step = if live >= self.inner.quorum {
                recheck
            } else {
                backoff.next_delay()
            };
            let mut delay = hint.map_or(step, |h| step.min(h.max(Duration::from_millis(1))));
            if let Some(d) = deadline {
                delay = delay.min(d - now);
            }
            match subscriptions.first() {
                Some(s) => {
                    s.wait(seen, now + delay);
                }
                None => std::thread::sleep(delay),
            }
        }
    }
}

impl fmt::Debug for RedlockMutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedlockMutex")
            .field("name", &self.name)
            .field("fixed_lease", &self.fixed_lease)
            .finish_non_exhaustive()
    }
}
