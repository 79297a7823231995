//! The renewal (watchdog) thread: one per client, started lazily, renewing every registered
//! lease each interval in pipelined batches, and marking leases lost when renewal finds the
//! token gone or cannot renew before the lease runs out.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::fast_hash::FastHashMap;
use crate::lease::{LeaseState, LostReason};
use crate::pool::Pool;
use crate::scripts;
use crate::stats::Counters;

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
    // Dropping the sender is the stop signal.
    _stop: Sender<()>,
    join: JoinHandle<()>,
}

/// The client's side of the renewal thread.
pub(crate) struct Renewal {
    registry: Arc<Registry>,
    next_id: AtomicU64,
    worker: Mutex<Option<Worker>>,
    pool: Pool,
    interval: Duration,
    lease: Duration,
    renewals: Arc<AtomicU64>,
    batches: Arc<AtomicU64>,
    busy_nanos: Arc<AtomicU64>,
    counters: Arc<Counters>,
}

impl Renewal {
    pub(crate) fn new(
        pool: Pool,
        interval: Duration,
        lease: Duration,
        counters: Arc<Counters>,
    ) -> Self {
        Renewal {
            registry: Arc::new(Registry::new()),
            next_id: AtomicU64::new(1),
            worker: Mutex::new(None),
            pool,
            interval,
            lease,
            renewals: Arc::new(AtomicU64::new(0)),
            batches: Arc::new(AtomicU64::new(0)),
            busy_nanos: Arc::new(AtomicU64::new(0)),
            counters,
        }
    }

    /// The lease given to renewed locks.
    pub(crate) fn lease(&self) -> Duration {
        self.lease
    }

    /// Registers a lease for renewal, starting the thread when it is not running.
    pub(crate) fn register(&self, registration: Registration) -> Result<u64> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.registry.insert(id, registration);
        if let Err(e) = self.ensure_running() {
            self.registry.remove(id);
            return Err(e);
        }
        Ok(id)
    }

    /// Stops renewing a lease. After this returns, the thread never reports it lost.
    pub(crate) fn cancel(&self, id: u64) {
        self.registry.remove(id);
    }

    /// The number of leases registered now.
    pub(crate) fn registered(&self) -> usize {
        self.registry.leases()
    }

    /// Renewals sent, round trips used and time spent renewing, since the client was built.
    pub(crate) fn counters(&self) -> (u64, u64, Duration) {
        (
            self.renewals.load(Ordering::Relaxed),
            self.batches.load(Ordering::Relaxed),
            Duration::from_nanos(self.busy_nanos.load(Ordering::Relaxed)),
        )
    }

    fn ensure_running(&self) -> Result<()> {
        let mut worker = self.worker.lock();
        if worker.as_ref().is_some_and(|w| !w.join.is_finished()) {
            return Ok(());
        }
        let (stop_tx, stop_rx) = crossbeam_channel::bounded::<()>(0);
        let thread = RenewalThread {
            registry: Arc::clone(&self.registry),
            pool: self.pool.clone(),
            interval: self.interval,
            lease: self.lease,
            stop: stop_rx,
            renewals: Arc::clone(&self.renewals),
            batches: Arc::clone(&self.batches),
            busy_nanos: Arc::clone(&self.busy_nanos),
            counters: Arc::clone(&self.counters),
        };
        let join = std::thread::Builder::new()
            .name(THREAD_NAME.to_owned())
            .spawn(move || thread.run())
            .map_err(|e| {
                Error::new(
                    crate::ErrorKind::Connection,
                    "cannot start the renewal thread",
                )
                .with_source(e)
            })?;
        *worker = Some(Worker {
            _stop: stop_tx,
            join,
        });
        Ok(())
    }

    /// Stops the thread and waits for it. Registered leases stay registered; a later
    /// registration starts a new thread that renews them again.
    pub(crate) fn shutdown(&self) {
        let worker = self.worker.lock().take();
        if let Some(Worker { _stop, join }) = worker {
            drop(_stop);
            if join.join().is_err() {
                log::warn!("redmutex: the renewal thread panicked");
            }
        }
    }
}

struct RenewalThread {
    registry: Arc<Registry>,
    pool: Pool,
    interval: Duration,
    lease: Duration,
    stop: Receiver<()>,
    renewals: Arc<AtomicU64>,
    batches: Arc<AtomicU64>,
    busy_nanos: Arc<AtomicU64>,
    counters: Arc<Counters>,
}

impl RenewalThread {
    fn run(self) {
        let mut next_tick = Instant::now() + self.interval;
        loop {
            let wait = next_tick.saturating_duration_since(Instant::now());
            match self.stop.recv_timeout(wait) {
                Err(RecvTimeoutError::Timeout) => {}
                // Disconnected: the client is gone or shutting down.
                _ => return,
            }
            next_tick += self.interval;
            self.renew_all();
            let now = Instant::now();
            if next_tick < now {
                // Renewal took longer than an interval: start the next one from now.
                next_tick = now + self.interval;
            }
        }
    }

    fn renew_all(&self) {
        let started = Instant::now();
        let snapshot = self.registry.snapshot();
        for batch in snapshot.chunks(BATCH_SIZE) {
            self.renew_batch(batch);
        }
        let busy = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.busy_nanos.fetch_add(busy, Ordering::Relaxed);
    }

    fn send_batch(&self, pipe: &redis::Pipeline) -> Result<Vec<i64>> {
        let mut conn = self.pool.get()?;
        self.batches.fetch_add(1, Ordering::Relaxed);
        let mut replies = conn.call(|c| pipe.query::<Vec<i64>>(c));
        if let Err(e) = &replies {
            if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) {
                // Redis restarted or its scripts were flushed: load and send once more.
                self.batches.fetch_add(3, Ordering::Relaxed);
                replies = conn
                    .call(|c| scripts::EXTEND.load(c))
                    .and_then(|_| conn.call(|c| pipe.query::<Vec<i64>>(c)));
            }
        }
        replies.map_err(|e| Error::from_redis("renewing leases", e))
    }

    fn renew_batch(&self, batch: &[(u64, Registration)]) {
        let sent_at = Instant::now();
        let lease_ms = u64::try_from(self.lease.as_millis()).unwrap_or(u64::MAX);
        let mut pipe = redis::pipe();
        let invocations: Vec<_> = batch
            .iter()
            .map(|(_, r)| match r {
                Registration::Lease {
                    lock_key, token, ..
                } => {
                    let mut inv = scripts::EXTEND.key(&**lock_key);
                    inv.arg(&**token).arg(lease_ms);
                    inv
                }
                // A waiter counts as dead one lease after its last heartbeat.
                Registration::Waiter {
                    queue_key,
                    timeouts_key,
                    token,
                } => {
                    let mut inv = scripts::FAIR_HEARTBEAT.key(&**queue_key);
                    inv.key(&**timeouts_key).arg(&**token).arg(lease_ms);
                    inv
                }
            })
            .collect();
        for inv in &invocations {
            pipe.invoke_script(inv);
        }
        let mut result = self.send_batch(&pipe);
        if matches!(&result, Err(e) if e.is_connection() && !e.is_checkout()) {
            // A dropped connection (Redis restarted, say): renewal is idempotent, so resend.
            result = self.send_batch(&pipe);
        }
        self.renewals
            .fetch_add(batch.len() as u64, Ordering::Relaxed);
        match result {
            Ok(replies) => {
                for ((id, r), reply) in batch.iter().zip(replies) {
                    let Registration::Lease {
                        lock_key, state, ..
                    } = r
                    else {
                        // A waiter dropped as dead re-joins the queue on its next attempt.
                        continue;
                    };
                    if reply == 1 {
                        state.renewed(sent_at, self.lease);
                    } else if self.registry.contains(*id) && state.mark_lost(LostReason::Taken) {
                        Counters::add(&self.counters.lost, 1);
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
                        && self.registry.contains(*id)
                        && state.mark_lost(LostReason::Expired(e.to_string()))
                    {
                        Counters::add(&self.counters.lost, 1);
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
