//! The renewal (watchdog) thread: one per client, started lazily, renewing every registered
//! lease each interval in pipelined batches, and marking leases lost when renewal finds the
//! token gone or cannot renew before the lease runs out. It also sends the fair waiters'
//! heartbeats (one call per lock for all waiters of this client) and retries the clean-ups of
//! calls whose outcome is unknown (see `cleanup`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use crate::cleanup::{Cleanup, Cleanups, Outcome};
use crate::error::{Doing, Error, ErrorKind, Result};
use crate::fast_hash::FastHashMap;
use crate::lease::{LeaseState, LostReason};
use crate::pool::Pool;
use crate::scripts;
use crate::stats::Counters;

/// How often pending clean-ups are tried again.
const CLEANUP_RETRY: Duration = Duration::from_millis(200);

/// How many renewals go in one pipelined round trip.
pub(crate) const BATCH_SIZE: usize = 1000;

/// The name the renewal thread carries (visible in debuggers and `/proc`).
pub(crate) const THREAD_NAME: &str = "redmutex-renewal";

/// Something the renewal thread keeps alive.
#[derive(Debug, Clone)]
pub(crate) enum Registration {
    /// A held lock's lease.
    Lease {
        lock_key: Arc<str>,
        token: Arc<str>,
        state: Arc<LeaseState>,
    },
    /// A fair lock waiter's place in the queue (its heartbeat).
    Waiter {
        queue_key: Arc<str>,
        timeouts_key: Arc<str>,
        token: Arc<str>,
        /// Set when the heartbeat found the waiter dropped from the queue as dead: it must
        /// attempt again to re-join.
        dropped: Arc<AtomicBool>,
    },
}

/// The registrations, in shards (by id) so that threads registering and cancelling at once
/// rarely meet on one lock.
struct Registry {
    shards: Vec<Mutex<FastHashMap<u64, Registration>>>,
}

const SHARDS: u64 = 16;

impl Registry {
    fn new() -> Self {
        Registry {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }

    fn shard(&self, id: u64) -> &Mutex<FastHashMap<u64, Registration>> {
        &self.shards[(id % SHARDS) as usize]
    }

    fn insert(&self, id: u64, registration: Registration) {
        self.shard(id).lock().insert(id, registration);
    }

    fn remove(&self, id: u64) {
        self.shard(id).lock().remove(&id);
    }

    fn contains(&self, id: u64) -> bool {
        self.shard(id).lock().contains_key(&id)
    }

    fn snapshot(&self) -> Vec<(u64, Registration)> {
        let mut all = Vec::new();
        for shard in &self.shards {
            all.extend(shard.lock().iter().map(|(id, r)| (*id, r.clone())));
        }
        all
    }

    fn leases(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                s.lock()
                    .values()
                    .filter(|r| matches!(r, Registration::Lease { .. }))
                    .count()
            })
            .sum()
    }
}

struct Worker {
    /// A message wakes the thread for clean-ups; dropping the sender is the stop signal.
    wake: Sender<()>,
    join: JoinHandle<()>,
}

/// What the client's side and the thread share.
struct Shared {
    registry: Registry,
    cleanups: Cleanups,
    pool: Pool,
    interval: Duration,
    lease: Duration,
    renewals: AtomicU64,
    batches: AtomicU64,
    busy_nanos: AtomicU64,
    counters: Arc<Counters>,
}

/// The client's side of the renewal thread.
pub(crate) struct Renewal {
    shared: Arc<Shared>,
    next_id: AtomicU64,
    worker: Mutex<Option<Worker>>,
    /// Set by `shutdown`: the thread is not started again.
    stopped: AtomicBool,
}

impl Renewal {
    pub(crate) fn new(
        pool: Pool,
        interval: Duration,
        lease: Duration,
        counters: Arc<Counters>,
    ) -> Self {
        Renewal {
            shared: Arc::new(Shared {
                registry: Registry::new(),
                cleanups: Cleanups::default(),
                pool,
                interval,
                lease,
                renewals: AtomicU64::new(0),
                batches: AtomicU64::new(0),
                busy_nanos: AtomicU64::new(0),
                counters,
            }),
            next_id: AtomicU64::new(1),
            worker: Mutex::new(None),
            stopped: AtomicBool::new(false),
        }
    }

    /// The lease given to renewed locks.
    pub(crate) fn lease(&self) -> Duration {
        self.shared.lease
    }

    /// Registers a lease for renewal, starting the thread when it is not running.
    pub(crate) fn register(&self, registration: Registration) -> Result<u64> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.shared.registry.insert(id, registration);
        if let Err(e) = self.ensure_running() {
            self.shared.registry.remove(id);
            return Err(e);
        }
        Ok(id)
    }

    /// Stops renewing a lease. After this returns, the thread never reports it lost.
    pub(crate) fn cancel(&self, id: u64) {
        self.shared.registry.remove(id);
    }

    /// Hands the clean-up of a call whose outcome is unknown to the thread, which sends it
    /// at once and again until Redis answered (see `cleanup`).
    pub(crate) fn clean_up_later(&self, lock_key: &Arc<str>, cleanup: Cleanup) {
        let name = Arc::clone(&cleanup.name);
        if !self.shared.cleanups.add(lock_key, cleanup) {
            return;
        }
        match self.ensure_running() {
            Ok(()) => {
                if let Some(w) = self.worker.lock().as_ref() {
                    let _ = w.wake.try_send(());
                }
            }
            Err(e) => log::warn!(
                "redmutex: cannot clean up after a failed call on lock {name:?} (it expires \
                 with its lease): {e}"
            ),
        }
    }

    /// The number of leases registered now.
    pub(crate) fn registered(&self) -> usize {
        self.shared.registry.leases()
    }

    /// The number of clean-ups waiting for Redis to answer.
    pub(crate) fn pending_cleanups(&self) -> usize {
        self.shared.cleanups.len()
    }

    /// Renewals sent, round trips used and time spent renewing, since the client was built.
    pub(crate) fn counters(&self) -> (u64, u64, Duration) {
        let s = &self.shared;
        (
            s.renewals.load(Ordering::Relaxed),
            s.batches.load(Ordering::Relaxed),
            Duration::from_nanos(s.busy_nanos.load(Ordering::Relaxed)),
        )
    }

    fn ensure_running(&self) -> Result<()> {
        let mut worker = self.worker.lock();
        if worker.as_ref().is_some_and(|w| !w.join.is_finished()) {
            return Ok(());
        }
        if self.stopped.load(Ordering::Acquire) {
            return Err(Error::new(
                ErrorKind::Shutdown,
                "the client was shut down: its renewal thread is stopped",
            ));
        }
        let (wake_tx, wake_rx) = crossbeam_channel::bounded::<()>(1);
        let thread = RenewalThread {
            shared: Arc::clone(&self.shared),
            wake: wake_rx,
        };
        let join = std::thread::Builder::new()
            .name(THREAD_NAME.to_owned())
            .spawn(move || thread.run())
            .map_err(|e| {
                Error::new(ErrorKind::Connection, "cannot start the renewal thread").with_source(e)
            })?;
        *worker = Some(Worker {
            wake: wake_tx,
            join,
        });
        Ok(())
    }

    /// Stops the thread for good and waits for it; it makes one last pass over pending
    /// clean-ups first. Registered leases are no longer renewed.
    pub(crate) fn shutdown(&self) {
        self.stopped.store(true, Ordering::Release);
        let worker = self.worker.lock().take();
        if let Some(Worker { wake, join }) = worker {
            drop(wake);
            if join.join().is_err() {
                log::warn!("redmutex: the renewal thread panicked");
            }
        }
    }
}

struct RenewalThread {
    shared: Arc<Shared>,
    wake: Receiver<()>,
}

impl RenewalThread {
    fn run(self) {
        let s = &*self.shared;
        let mut next_tick = Instant::now() + s.interval;
        loop {
            let now = Instant::now();
            let mut until = next_tick;
            if !s.cleanups.is_empty() {
                until = until.min(now + CLEANUP_RETRY);
            }
            match self.wake.recv_timeout(until.saturating_duration_since(now)) {
                Ok(()) | Err(RecvTimeoutError::Timeout) => {}
                // Disconnected: the client is gone or shutting down.
                Err(RecvTimeoutError::Disconnected) => {
                    self.run_cleanups();
                    return;
                }
            }
            if Instant::now() >= next_tick {
                next_tick += s.interval;
                self.renew_all();
                let now = Instant::now();
                if next_tick < now {
                    // Renewal took longer than an interval: start the next one from now.
                    next_tick = now + s.interval;
                }
            }
            self.run_cleanups();
        }
    }

    fn run_cleanups(&self) {
        let s = &*self.shared;
        s.cleanups.run(|calls| {
            let mut pipe = redis::pipe();
            pipe.ignore_errors();
            for call in calls {
                pipe.invoke_script(call);
            }
            let doing = Doing::work("cleaning up after failed calls");
            let sent = s.pool.get(doing).and_then(|mut conn| {
                let replies = conn.call(doing, |c| pipe.query::<Vec<redis::Value>>(c))?;
                // After a restart or `SCRIPT FLUSH`: load what was missing; the next pass
                // sends those again.
                for (call, reply) in calls.iter().zip(&replies) {
                    if is_noscript(reply) {
                        let _ = conn.call_raw(|c| call.load(c));
                    }
                }
                Ok(replies)
            });
            match sent {
                Ok(replies) => replies
                    .into_iter()
                    .map(|r| match is_noscript(&r) {
                        true => Outcome::Failed,
                        false => Outcome::Answered(r),
                    })
                    .collect(),
                Err(e) => {
                    log::debug!("redmutex: {e}");
                    Vec::new()
                }
            }
        });
    }

    fn renew_all(&self) {
        let s = &*self.shared;
        let started = Instant::now();
        let snapshot = s.registry.snapshot();
        let (leases, waiters): (Vec<_>, Vec<_>) = snapshot
            .into_iter()
            .partition(|(_, r)| matches!(r, Registration::Lease { .. }));
        for batch in leases.chunks(BATCH_SIZE) {
            self.renew_batch(batch);
        }
        if !waiters.is_empty() {
            self.send_heartbeats(&waiters);
        }
        let busy = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        s.busy_nanos.fetch_add(busy, Ordering::Relaxed);
    }

    /// Sends one pipelined batch of script calls; once more after a dropped connection (they
    /// are all idempotent), and after loading the scripts when Redis lost them.
    fn send_batch<T: redis::FromRedisValue>(
        &self,
        pipe: &redis::Pipeline,
        doing: Doing<'_>,
    ) -> Result<Vec<T>> {
        let s = &*self.shared;
        let once = || -> Result<Vec<T>> {
            let mut conn = s.pool.get(doing)?;
            s.batches.fetch_add(1, Ordering::Relaxed);
            let mut replies = conn.call_raw(|c| pipe.query::<Vec<T>>(c));
            if let Err(e) = &replies {
                if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) {
                    // Redis restarted or its scripts were flushed: load and send once more.
                    s.batches.fetch_add(1, Ordering::Relaxed);
                    replies = conn
                        .call_raw(|c| scripts::RENEW.load(c))
                        .and_then(|_| conn.call_raw(|c| scripts::FAIR_HEARTBEAT.load(c)))
                        .and_then(|_| conn.call_raw(|c| pipe.query::<Vec<T>>(c)));
                }
            }
            replies.map_err(|e| Error::from_call(s.pool.server(), doing, e))
        };
        let result = once();
        match result {
            Err(e) if e.is_connection() && !e.is_checkout() => once(),
            other => other,
        }
    }

    /// One heartbeat call per fair lock for every waiter of this client; waiters found
    /// dropped from their queue are told to join again.
    fn send_heartbeats(&self, waiters: &[(u64, Registration)]) {
        let s = &*self.shared;
        let lease_ms = u64::try_from(s.lease.as_millis()).unwrap_or(u64::MAX);
        type Waiters<'a> = Vec<(&'a str, &'a Arc<AtomicBool>)>;
        let mut by_lock: FastHashMap<(&str, &str), Waiters<'_>> = FastHashMap::default();
        for (_, r) in waiters {
            if let Registration::Waiter {
                queue_key,
                timeouts_key,
                token,
                dropped,
            } = r
            {
                by_lock
                    .entry((&**queue_key, &**timeouts_key))
                    .or_default()
                    .push((&**token, dropped));
            }
        }
        let groups: Vec<_> = by_lock.into_iter().collect();
        let mut pipe = redis::pipe();
        let invocations: Vec<_> = groups
            .iter()
            .map(|((queue, timeouts), waiters)| {
                // A waiter counts as dead one lease after its last heartbeat.
                let mut inv = scripts::FAIR_HEARTBEAT.key(*queue);
                inv.key(*timeouts).arg(lease_ms);
                for (token, _) in waiters {
                    inv.arg(*token);
                }
                inv
            })
            .collect();
        for inv in &invocations {
            pipe.invoke_script(inv);
        }
        s.renewals
            .fetch_add(waiters.len() as u64, Ordering::Relaxed);
        let doing = Doing::work("sending fair waiters' heartbeats");
        match self.send_batch::<Vec<String>>(&pipe, doing) {
            Ok(replies) => {
                for ((_, waiters), dropped) in groups.iter().zip(replies) {
                    for (token, flag) in waiters {
                        if dropped.iter().any(|d| d == token) {
                            flag.store(true, Ordering::Release);
                        }
                    }
                }
            }
            Err(e) => log::debug!("redmutex: {e}"),
        }
    }

    fn renew_batch(&self, batch: &[(u64, Registration)]) {
        let s = &*self.shared;
        let sent_at = Instant::now();
        let lease_ms = u64::try_from(s.lease.as_millis()).unwrap_or(u64::MAX);
        let mut pipe = redis::pipe();
        let invocations: Vec<_> = batch
            .iter()
            .filter_map(|(_, r)| match r {
                Registration::Lease {
                    lock_key, token, ..
                } => {
                    let mut inv = scripts::RENEW.key(&**lock_key);
                    inv.arg(&**token).arg(lease_ms);
                    Some(inv)
                }
                Registration::Waiter { .. } => None,
            })
            .collect();
        for inv in &invocations {
            pipe.invoke_script(inv);
        }
        let result = self.send_batch::<i64>(&pipe, Doing::work("renewing leases"));
        s.renewals.fetch_add(batch.len() as u64, Ordering::Relaxed);
        match result {
            Ok(replies) => {
                for ((id, r), reply) in batch.iter().zip(replies) {
                    let Registration::Lease {
                        lock_key, state, ..
                    } = r
                    else {
                        continue;
                    };
                    if reply == 1 {
                        state.renewed(sent_at, s.lease);
                    } else if s.registry.contains(*id) && state.mark_lost(LostReason::Taken) {
                        Counters::add(&s.counters.lost, 1);
                        log::warn!(
                            "redmutex: lock {lock_key} was lost: renewal found it no longer \
                             holding this holder's token"
                        );
                    }
                }
            }
            Err(e) => {
                let now = Instant::now();
                for (id, r) in batch {
                    let Registration::Lease {
                        lock_key, state, ..
                    } = r
                    else {
                        continue;
                    };
                    if now >= state.expires_at()
                        && s.registry.contains(*id)
                        && state.mark_lost(LostReason::Expired(e.to_string()))
                    {
                        Counters::add(&s.counters.lost, 1);
                        log::warn!(
                            "redmutex: lock {lock_key} was lost: its lease ran out while \
                             renewal failed: {e}"
                        );
                    }
                }
                log::debug!("redmutex: renewal of {} leases failed: {e}", batch.len());
            }
        }
    }
}

fn is_noscript(reply: &redis::Value) -> bool {
    matches!(reply, redis::Value::ServerError(e) if e.code() == "NOSCRIPT")
}
