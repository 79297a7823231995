//! `MultiLock`: several named locks held together, all or none; the locks of one hash slot
//! taken in one script.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use redis::Script;

use crate::connection::millis;
use crate::connection::{slot_of, ScriptCall};
use crate::error::{Doing, Error, ErrorKind, Result};
use crate::lease::{LeaseWatch, LeaseWrite, LockContext};
use crate::primitives::mutex::taking_locks;
use crate::primitives::{Mutex, MutexGuard};
use crate::stats::Counters;

/// Takes the locks of one slot in order, up to the first held one: see
/// `multi_lock/acquire.lua`.
static ACQUIRE_TOGETHER: LazyLock<Script> =
    LazyLock::new(|| taking_locks(include_str!("multi_lock/acquire.lua")));

crate::lease::scripts::listed! {
    "multi_lock/acquire" => ACQUIRE_TOGETHER,
}

/// Several [`Mutex`]es held together: every one of them or none.
///
/// The locks are the `Mutex`es of the same names (a multi-lock excludes a `Mutex` of each of
/// its names, and the other way round). They are always taken in one order, the same in every
/// process (by the hash slot of their key, then by name), so two multi-locks over overlapping
/// names can never wait for each other in a circle; when one cannot be had by the deadline,
/// or fails, those taken already are given back before the call returns.
///
/// # Round trips
///
/// Names that share a hash slot — in a Redis Cluster, names that start with the same hash tag,
/// such as `{order:42}:stock` and `{order:42}:payment` — sit next to each other in that order
/// and are taken in one script, in one round trip: every free one up to the first that is
/// held, as taking them in turn would. Only a held lock is waited for on its own. So a
/// multi-lock over the names of one slot costs one round trip when they are free, on every
/// deployment.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> redmutex::Result<()> {
/// let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let transfer = client.multi_lock(["account:17", "account:42"]);
/// let guard = transfer.lock()?; // both accounts, or an error and neither
/// // ... move the money ...
/// guard.unlock()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MultiLock {
    /// In the order they are taken, with the hash slot of each.
    locks: Vec<(u16, Mutex)>,
    /// Why the names cannot be locked together (none, or one given twice): reported by the
    /// first acquire, as a bad name is by every other handle.
    invalid: Option<Error>,
}

impl MultiLock {
    pub(crate) fn new<I>(ctx: &Arc<LockContext>, names: I) -> Self
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let mut names: Vec<String> = names.into_iter().map(|n| n.as_ref().to_owned()).collect();
        names.sort();
        let invalid = match names.windows(2).find(|w| w[0] == w[1]) {
            _ if names.is_empty() => Some("a multi-lock needs at least one name".to_owned()),
            Some(twice) => Some(format!("the name {:?} is given twice", twice[0])),
            None => None,
        };
        if let Some(why) = invalid {
            return MultiLock {
                locks: Vec::new(),
                invalid: Some(Error::new(ErrorKind::InvalidArgument, why)),
            };
        }
        // By slot, then by name: one global order, with the names of one slot side by side.
        let prefix = &ctx.config.key_prefix;
        let mut slotted: Vec<(u16, String)> = names
            .into_iter()
            .map(|n| (slot_of(format!("{prefix}:{{{n}}}").as_bytes()), n))
            .collect();
        slotted.sort();
        MultiLock {
            locks: slotted
                .into_iter()
                .map(|(slot, n)| (slot, Mutex::new(Arc::clone(ctx), &n)))
                .collect(),
            invalid: None,
        }
    }

    /// The names, in the order they are taken.
    pub fn names(&self) -> Vec<&str> {
        self.locks.iter().map(|(_, lock)| lock.name()).collect()
    }

    crate::primitives::acquire_family::acquire_family! {
        take() -> MultiLockGuard, "every lock, all or none";
        /// Blocks until every lock is held.
        ///
        /// # Errors
        ///
        /// As for [`Mutex::lock`]; then none of the locks is held.
        fn lock, try_lock, try_lock_for, try_lock_until;
        ///
        /// Each lock in turn gets one attempt; when one is held elsewhere, those taken are
        /// given back.
    }

    fn take(&self, deadline: Option<Instant>) -> Result<Option<MultiLockGuard>> {
        if let Some(invalid) = &self.invalid {
            return Err(invalid.clone());
        }
        let mut guards = Vec::with_capacity(self.locks.len());
        while guards.len() < self.locks.len() {
            let next = guards.len();
            let run = self.same_slot_run(next);
            if run.len() > 1 && self.may_take_together(run) {
                let held_next = self.take_together(run, &mut guards)?;
                if !held_next {
                    continue;
                }
                if deadline.is_some_and(|d| d <= Instant::now()) {
                    // Held, and no time to wait: give back what was taken (on drop).
                    return Ok(None);
                }
            }
            // Wait for the next lock on its own (or take it alone).
            let lock = &self.locks[guards.len()].1;
            let taken = match deadline {
                None => lock.lock().map(Some),
                Some(d) => lock.try_lock_until(d),
            };
            match taken {
                Ok(Some(guard)) => guards.push(guard),
                // Not all to be had: give back what was taken (on drop, in reverse order).
                Ok(None) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        Ok(Some(MultiLockGuard { guards }))
    }

    /// The locks from `start` on that share its hash slot.
    fn same_slot_run(&self, start: usize) -> &[(u16, Mutex)] {
        let slot = self.locks[start].0;
        let len = self.locks[start..]
            .iter()
            .take_while(|(s, _)| *s == slot)
            .count();
        &self.locks[start..start + len]
    }

    /// Whether a run of locks may be taken in one script: not when the thread holds one of
    /// them already (re-entry is taken without a round trip), nor over a Redlock's instances
    /// (a quorum takes each lock in its own round).
    fn may_take_together(&self, run: &[(u16, Mutex)]) -> bool {
        run.iter()
            .all(|(_, lock)| lock.hold_count() == 0 && lock.raw().on_one_deployment())
    }

    /// One round trip that takes the locks of `run` in order, up to the first held one; their
    /// guards are pushed to `guards`. Returns whether a lock of the run was found held (the
    /// next to take, then).
    fn take_together(&self, run: &[(u16, Mutex)], guards: &mut Vec<MutexGuard>) -> Result<bool> {
        let first = run[0].1.raw();
        let ctx = &first.ctx;
        ctx.ensure_open()?;
        // KEYS: each lock's key, fencing counter and waiting clients; ARGV: the lease, then each
        // lock's token.
        let mut keys_of = Vec::with_capacity(run.len());
        let mut tokens = Vec::with_capacity(run.len());
        let mut lease = Duration::ZERO;
        for (_, lock) in run {
            let (keys, lock_lease, token) = lock.raw().prepare_elsewhere()?;
            keys_of.push(keys);
            tokens.push(token);
            lease = lease.max(lock_lease);
        }
        let mut call = ScriptCall::new(&ACQUIRE_TOGETHER).arg(millis(lease));
        for (keys, token) in keys_of.iter().zip(&tokens) {
            call = call
                .key(&keys.lock)
                .key(&keys.fence)
                .key(&keys.waiting)
                .arg(&**token);
        }
        let route = &keys_of[0].lock;
        let sent_at = Instant::now();
        let doing = Doing::lock("acquiring", first.name());
        let reply = ctx.one_deployment(doing)?.call(route, doing, |c| {
            Counters::add(&ctx.counters.attempts, 1);
            // Replicas must hold the leases: the script and `WAIT`, in one round trip.
            match ctx.replicas_to_ask(LeaseWrite::Acquire, c)? {
                Some((replicas, timeout)) => call
                    .invoke_and_wait::<Vec<i64>>(c, replicas, timeout)
                    .map(|(reply, got)| (reply, Some((got, replicas)))),
                None => call.invoke::<Vec<i64>>(c).map(|reply| (reply, None)),
            }
        });
        let (reply, acks) = match reply {
            Ok(reply) => reply,
            Err(e) => {
                if e.outcome_unknown() {
                    // Some of them may be ours without our knowing: have them given back.
                    for ((_, lock), token) in run.iter().zip(&tokens) {
                        lock.raw().give_back_later(token, sent_at);
                    }
                }
                return Err(e);
            }
        };
        let taken = reply
            .first()
            .and_then(|&n| usize::try_from(n).ok())
            .filter(|&n| n <= run.len() && reply.len() == n + 2)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Server,
                    format!("acquiring {:?}: unexpected reply {reply:?}", first.name()),
                )
            })?;
        if let Some(acks) = acks.filter(|acks| taken > 0 && ctx.too_few_acks(*acks)) {
            for ((_, lock), token) in run.iter().zip(&tokens).take(taken) {
                lock.raw().give_back_later(token, sent_at);
            }
            return Err(ctx.not_replicated(route, acks, "the acquire; it was rolled back"));
        }
        for (i, ((_, lock), token)) in run.iter().zip(&tokens).enumerate().take(taken) {
            let fence = u64::try_from(reply[i + 2]).unwrap_or(0);
            match lock.raw().adopt(token, fence, sent_at) {
                Ok(guard) => guards.push(MutexGuard::new(guard)),
                Err(e) => {
                    // This one was given back by `adopt`; the rest of those taken go too.
                    for ((_, rest), token) in run.iter().zip(&tokens).take(taken).skip(i + 1) {
                        rest.raw().give_back_later(token, sent_at);
                    }
                    return Err(e);
                }
            }
        }
        Ok(taken < run.len())
    }
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLock")
            .field("names", &self.names())
            .finish_non_exhaustive()
    }
}

/// Every lock of a [`MultiLock`], held; all are released when it is dropped.
#[must_use = "if unused the locks are released at once"]
pub struct MultiLockGuard {
    guards: Vec<MutexGuard>,
}

impl MultiLockGuard {
    /// Whether the lease of any of the locks is known to be lost, without a round trip.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(MutexGuard::is_lost)
    }

    /// How long every lock's lease surely still runs (the shortest), by this machine's
    /// clock, without a round trip; zero once one is lost.
    pub fn validity_left(&self) -> std::time::Duration {
        self.guards
            .iter()
            .map(MutexGuard::validity_left)
            .min()
            .unwrap_or_default()
    }

    /// The guard of each lock, in the order they were taken (fencing tokens, lease
    /// watches).
    pub fn guards(&self) -> &[MutexGuard] {
        &self.guards
    }

    /// The name of the first lock taken (every name: [`guards`](Self::guards)).
    pub fn name(&self) -> &str {
        self.guards.first().map_or("", MutexGuard::name)
    }

    /// A handle that tells, from any thread, when the lease of any of the locks is lost
    /// (and that all were released, once they are).
    pub fn lease_watch(&self) -> LeaseWatch {
        LeaseWatch::any(self.guards.iter().map(MutexGuard::lease_watch))
    }

    /// Asks Redis whether every lock is still held; returns the shortest lease left.
    ///
    /// # Errors
    ///
    /// The first error of a lock, as for [`MutexGuard::verify`].
    pub fn verify(&self) -> Result<Duration> {
        self.each(MutexGuard::verify)
            .map(|left| left.into_iter().min().unwrap_or_default())
    }

    /// Adds `additional` to the lease left of every lock.
    ///
    /// # Errors
    ///
    /// The first error of a lock, as for [`MutexGuard::extend`]; the locks before it were
    /// extended.
    pub fn extend(&self, additional: Duration) -> Result<()> {
        self.each(|g| g.extend(additional)).map(drop)
    }

    /// Sets the lease left of every lock to `remaining`.
    ///
    /// # Errors
    ///
    /// As [`extend`](Self::extend).
    pub fn set_lease(&self, remaining: Duration) -> Result<()> {
        self.each(|g| g.set_lease(remaining)).map(drop)
    }

    /// Stops renewing and leaves every lock held until its lease runs out; returns the
    /// shortest lease left (as [`MutexGuard::keep_until_expiry`]).
    ///
    /// # Errors
    ///
    /// The first error of a lock; every lock is kept whatever Redis answered.
    pub fn keep_until_expiry(self) -> Result<Duration> {
        let mut shortest: Result<Duration> = Ok(Duration::MAX);
        for guard in self.guards {
            match (guard.keep_until_expiry(), &mut shortest) {
                (Ok(left), Ok(short)) => *short = (*short).min(left),
                (Err(e), Ok(_)) => shortest = Err(e),
                (_, Err(_)) => {}
            }
        }
        shortest.map(|left| {
            if left == Duration::MAX {
                Duration::ZERO
            } else {
                left
            }
        })
    }

    /// `f` on every guard, in order, up to the first error.
    fn each<T>(&self, f: impl Fn(&MutexGuard) -> Result<T>) -> Result<Vec<T>> {
        self.guards.iter().map(f).collect()
    }

    /// Releases every lock now. Every one is released even when one fails.
    ///
    /// # Errors
    ///
    /// As for [`MutexGuard::unlock`]: a connection or timeout error (the first, when several
    /// locks had one) before [`ErrorKind::LockLost`], whose message names every lock that
    /// was lost.
    pub fn unlock(self) -> Result<()> {
        let mut failed = None;
        let mut lost: Vec<(String, Error)> = Vec::new();
        for guard in self.guards.into_iter().rev() {
            let name = guard.name().to_owned();
            match guard.unlock() {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::LockLost => lost.push((name, e)),
                Err(e) => {
                    failed.get_or_insert(e);
                }
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        match lost.len() {
            0 => Ok(()),
            1 => Err(lost.remove(0).1),
            n => {
                lost.reverse();
                let names: Vec<String> = lost.iter().map(|(name, _)| format!("{name:?}")).collect();
                Err(Error::new(
                    ErrorKind::LockLost,
                    format!(
                        "{n} locks of the multi-lock were lost ({}); the first: {}",
                        names.join(", "),
                        lost[0].1
                    ),
                ))
            }
        }
    }
}

impl fmt::Debug for MultiLockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.guards.iter().map(MutexGuard::name).collect();
        f.debug_struct("MultiLockGuard")
            .field("names", &names)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

crate::primitives::guard_traits::lease_by_own_methods!(MultiLockGuard);
