//! `FairMutex`: a lock granted in the order it was asked for, across all processes; and its
//! queue-based acquire loop.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::client::ClientShared;
use crate::error::{Doing, Result};
use crate::guard::MutexGuard;
use crate::keys::LockKeys;
use crate::mutex::{millis, Attempt, Mutex};
use crate::notify::Subscription;
use crate::renewal::{Registration, Renewal};
use crate::scripts;
use crate::wait::Pause;

/// A lock granted in the order it was asked for (FIFO), across every thread of every process.
///
/// Get one with [`Client::fair_mutex`](crate::Client::fair_mutex). It has the API of
/// [`Mutex`] — blocking and timed acquires, guards that release on drop, re-entry on the same
/// thread, renewal, fencing tokens — and the same [`MutexGuard`].
///
/// # Fairness
///
/// A thread that finds the lock held joins a queue kept in Redis and gets the lock when every
/// waiter ahead of it has had it or has left. A release wakes only the next waiter (on a
/// channel of its client, with its own token as the message), not everyone.
///
/// - [`try_lock`](FairMutex::try_lock) never queues: it takes the lock only when it is free
///   and nobody waits.
/// - A [`try_lock_for`](FairMutex::try_lock_for) that times out leaves the queue at once.
/// - Waiting costs Redis almost nothing: the client's renewal thread sends the heartbeats of
///   all its waiters of one lock in one call, and of those waiting threads only one re-checks
///   the lock now and then; the others wait for their own announcement.
/// - A waiter keeps its place alive with that heartbeat.
///   A waiter whose process died stops sending it and is skipped at most one
///   [default lease](crate::Builder::default_lease) after its last heartbeat (30 s by
///   default). The waiter deadlines are kept in the Redis server's clock, never computed
///   from a client's, so clocks that disagree cannot wedge the queue.
/// - When the last holder and waiter are gone, no key of the lock is left in Redis: the
///   fencing counter goes too, and starts again from the server's clock (in microseconds)
///   at the next acquire, so fencing tokens still increase as long as that clock does not
///   go back.
///
/// Do not use the same name as a `FairMutex` and as a [`Mutex`]: both exclude each other,
/// but a plain `Mutex` ignores the queue.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> redmutex::Result<()> {
/// use std::time::Duration;
///
/// let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let printer = client.fair_mutex("printer");
/// let guard = printer.lock()?; // waits its turn behind earlier callers
/// println!("printing with fencing token {}", guard.fencing_token());
/// drop(guard); // the next waiter in line is woken
///
/// if let Some(_guard) = printer.try_lock_for(Duration::from_secs(1))? {
///     // ...
/// } // timed out: left the queue at once
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct FairMutex {
    inner: Mutex,
}

impl FairMutex {
    pub(crate) fn new(client: Arc<ClientShared>, name: &str) -> Self {
        FairMutex {
            inner: Mutex::new_fair(client, name),
        }
    }

    /// This handle, taking the lock for a fixed `lease` with no renewal; see
    /// [`Mutex::with_lease`].
    pub fn with_lease(self, lease: Duration) -> Self {
        FairMutex {
            inner: self.inner.with_lease(lease),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The fixed lease of this handle, or `None` when the renewal thread keeps it alive.
    pub fn fixed_lease(&self) -> Option<Duration> {
        self.inner.fixed_lease()
    }

    /// Blocks until it is this thread's turn and returns the guard; re-enters at once when
    /// the thread holds the lock already.
    ///
    /// # Errors
    ///
    /// As for [`Mutex::lock`].
    pub fn lock(&self) -> Result<MutexGuard> {
        self.inner.lock()
    }

    /// Takes the lock if it is free and nobody waits for it; never queues.
    ///
    /// # Errors
    ///
    /// As for [`Mutex::lock`]; "held or others waiting" is `Ok(None)`.
    pub fn try_lock(&self) -> Result<Option<MutexGuard>> {
        self.inner.try_lock()
    }

    /// Queues for the lock for up to `timeout`. `Ok(None)` when it was not acquired in time;
    /// the waiter has then left the queue.
    ///
    /// # Errors
    ///
    /// As for [`Mutex::lock`].
    pub fn try_lock_for(&self, timeout: Duration) -> Result<Option<MutexGuard>> {
        self.inner.try_lock_for(timeout)
    }

    /// Queues for the lock until `deadline`. `Ok(None)` when it was not acquired in time; the
    /// waiter has then left the queue.
    ///
    /// # Errors
    ///
    /// As for [`Mutex::lock`].
    pub fn try_lock_until(&self, deadline: Instant) -> Result<Option<MutexGuard>> {
        self.inner.try_lock_until(deadline)
    }

    /// Whether anyone holds the lock now. One round trip.
    ///
    /// # Errors
    ///
    /// As for [`Mutex::is_locked`].
    pub fn is_locked(&self) -> Result<bool> {
        self.inner.is_locked()
    }

    /// Whether the calling thread holds the lock through this client. No round trip.
    pub fn is_held_by_current_thread(&self) -> bool {
        self.inner.is_held_by_current_thread()
    }

    /// How many guards of this lock the calling thread holds now. No round trip.
    pub fn hold_count(&self) -> usize {
        self.inner.hold_count()
    }

    /// Deletes the lock whoever holds it and wakes the next waiter; see
    /// [`Mutex::force_unlock`] (and its warning).
    ///
    /// # Errors
    ///
    /// As for [`Mutex::force_unlock`].
    pub fn force_unlock(&self) -> Result<bool> {
        self.inner.force_unlock()
    }
}

impl fmt::Debug for FairMutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.inner.fmt(f)
    }
}

/// The release (or forced release) of a fair lock: it wakes the next waiter.
pub(crate) fn release_invocation(
    keys: &LockKeys,
    token: &str,
    force: bool,
) -> redis::ScriptInvocation<'static> {
    let mut inv = scripts::FAIR_RELEASE.key(&keys.lock);
    inv.key(&keys.fence)
        .key(&keys.queue)
        .key(&keys.timeouts)
        .arg(token)
        .arg(&keys.waiter_channel_prefix)
        .arg(if force { "force" } else { "release" });
    inv
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Take it if free and nobody waits; do not queue.
    Try,
    /// Take it if it is our turn; else queue (or keep our place).
    Wait,
}

/// One try without queueing, then (when the caller may wait) the queue. When this client
/// listens on its waiter channel of the lock already, the first attempt queues at once.
pub(crate) fn acquire(
    m: &Mutex,
    keys: &Arc<LockKeys>,
    lease: Duration,
    deadline: Option<Instant>,
) -> Result<Option<MutexGuard>> {
    let may_wait = deadline.is_none_or(|d| d > Instant::now());
    let client = &m.client;
    let token: Arc<str> = Arc::from(client.tokens.next());
    let channel = keys.waiter_channel(client.tokens.client_uuid());
    if may_wait {
        if let Some(sub) = client
            .notifier
            .subscribe_if_live(&channel, Some(Arc::clone(&token)))
        {
            return wait_in_queue(m, keys, lease, deadline, token, Some(sub), false);
        }
    }
    match attempt(m, keys, lease, &token, Mode::Try)? {
        Attempt::Acquired(guard) => Ok(Some(guard)),
        Attempt::Held(_) if !may_wait => {
            client.counters.gave_up_at_once();
            Ok(None)
        }
        Attempt::Held(_) => {
            let sub = client
                .notifier
                .subscribe(&channel, Some(Arc::clone(&token)));
            wait_in_queue(m, keys, lease, deadline, token, sub, true)
        }
    }
}

/// Cancels a heartbeat registration when the wait ends, however it ends.
struct Heartbeat<'a> {
    renewal: &'a Renewal,
    id: u64,
}

impl Drop for Heartbeat<'_> {
    fn drop(&mut self) {
        self.renewal.cancel(self.id);
    }
}

/// Queues, then waits for the next-waiter announcement and tries again, in that order so that
/// no announcement is missed, until acquired or `deadline`.
///
/// Every waiting thread has its own place in the queue, but of the threads of one client
/// waiting for one lock only one (the rechecker) also re-checks the lock now and then; the
/// others wait for their own announcement (or for the rechecker's place to free up). The
/// rechecker's attempt tells the next waiter again when the lock is free, so a lost
/// announcement costs one re-check whoever it was for, and a hundred waiting threads cost
/// Redis what one does.
#[cold]
fn wait_in_queue(
    m: &Mutex,
    keys: &Arc<LockKeys>,
    lease: Duration,
    deadline: Option<Instant>,
    token: Arc<str>,
    subscription: Option<Subscription>,
    confirm: bool,
) -> Result<Option<MutexGuard>> {
    let client = &m.client;
    let wait = client.counters.contended_wait();
    let mut pause = Pause::new(subscription, &client.config);
    if confirm {
        let confirm_by = Instant::now() + client.config.response_timeout;
        pause.confirm(deadline.map_or(confirm_by, |d| d.min(confirm_by)));
    }
    let dropped = Arc::new(AtomicBool::new(false));
    let _heartbeat = Heartbeat {
        renewal: &client.renewal,
        id: client.renewal.register(Registration::Waiter {
            queue_key: Arc::from(keys.queue.as_str()),
            timeouts_key: Arc::from(keys.timeouts.as_str()),
            token: Arc::clone(&token),
            dropped: Arc::clone(&dropped),
        })?,
    };
    let mut rechecker = None;
    loop {
        let seen = pause.seen();
        let hint = match attempt(m, keys, lease, &token, Mode::Wait) {
            Ok(Attempt::Acquired(guard)) => return wait.finish(Ok(Some(guard))),
            Ok(Attempt::Held(hint)) => hint,
            Err(e) => {
                // An unknown outcome was handed to the clean-up already (which leaves too).
                if !e.outcome_unknown() {
                    leave(m, keys, &token);
                }
                return wait.finish(Err(e));
            }
        };
        let waited = loop {
            if rechecker.is_none() {
                rechecker = client.rechecks.try_lead(&m.lock_key);
            }
            if rechecker.is_some() || !pause.is_live() {
                break pause.wait(seen, hint, deadline);
            }
            match pause.wait_woken(seen, deadline) {
                // Woken by an announcement, or the deadline passed.
                Some(waited) => break waited,
                // A re-check period passed in silence: join again if the heartbeat found this
                // waiter dropped from the queue (its process was stalled for a lease, say);
                // else see whether the re-checker left.
                None if dropped.swap(false, Ordering::AcqRel) => break true,
                None => continue,
            }
        };
        if !waited {
            leave(m, keys, &token);
            return wait.finish(Ok(None));
        }
    }
}

/// One fair acquire round trip with `token` (see [`Mutex::attempt_with`]).
fn attempt(
    m: &Mutex,
    keys: &Arc<LockKeys>,
    lease: Duration,
    token: &str,
    mode: Mode,
) -> Result<Attempt> {
    let waiter_timeout = millis(m.client.renewal.lease());
    m.attempt_with(keys, lease, token, "acquiring", |c| {
        scripts::FAIR_ACQUIRE
            .key(&keys.lock)
            .key(&keys.fence)
            .key(&keys.queue)
            .key(&keys.timeouts)
            .arg(token)
            .arg(millis(lease))
            .arg(waiter_timeout)
            .arg(if mode == Mode::Wait { "wait" } else { "try" })
            .arg(&keys.waiter_channel_prefix)
            .invoke(c)
    })
}

/// Leaving the queue (and the lock, if the token holds it): see `FAIR_LEAVE`.
pub(crate) fn leave_invocation(keys: &LockKeys, token: &str) -> redis::ScriptInvocation<'static> {
    let mut inv = scripts::FAIR_LEAVE.key(&keys.lock);
    inv.key(&keys.fence)
        .key(&keys.queue)
        .key(&keys.timeouts)
        .arg(token)
        .arg(&keys.waiter_channel_prefix);
    inv
}

/// Leaves the queue: one try now, then the renewal thread's clean-up (a waiter that cannot
/// leave at all is dropped when its heartbeat stops).
fn leave(m: &Mutex, keys: &LockKeys, token: &str) {
    let result = m
        .client
        .call_once(Doing::lock("leaving the queue of", &m.name), |c| {
            leave_invocation(keys, token).invoke::<i64>(c)
        });
    if let Err(e) = result {
        log::debug!("redmutex: {e}; retrying in the background");
        let give_up_at = Instant::now() + m.client.renewal.lease();
        m.clean_up_later(keys, token, give_up_at);
    }
}
