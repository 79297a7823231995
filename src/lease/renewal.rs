//! The renewal (watchdog) thread: one per client, started lazily, renewing every registered
//! lease each interval in pipelined batches, and marking leases lost when renewal finds the
//! token gone or cannot renew before the lease runs out. It also sends the heartbeats of
//! queued waiters (one call per lock for all waiters of this client) and retries the clean-ups
//! of calls whose outcome is unknown (see `cleanup`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender};
use parking_lot::Mutex;

use crate::connection::Routed;
use crate::error::{Doing, Error, ErrorKind, Result};
use crate::events::Renewed;
use crate::fast_hash::FastHashMap;
use crate::keys::LockKeys;
use crate::lease::cleanup::{CleanUpLater, Cleanup, Cleanups, Outcome};
use crate::lease::lessor::{Lessor, Renewing, Site};
use crate::lease::protocol::Protocol;
use crate::lease::state::{LeaseState, LostReason};
use crate::stats::Counters;

/// How often pending clean-ups are tried again.
const CLEANUP_RETRY: Duration = Duration::from_millis(200);

/// How long after the thread starts the client first announces itself (at most; sooner when
/// the renewal interval is shorter).
const FIRST_ANNOUNCEMENT: Duration = Duration::from_millis(500);

/// How soon a renewal that failed (a server restarting, a master failing over) is sent again:
/// a quarter of the renewal interval, at most this, so that a lease reaches the new master
/// soon after it is promoted, and a holder whose lock the new master does not have is told
/// soon.
const RENEWAL_RETRY: Duration = Duration::from_millis(250);

/// The shortest time between two renewals of a lease on a schedule of its own.
const MIN_PERIOD: Duration = Duration::from_millis(1);

/// How many renewals go in one pipelined round trip.
pub(crate) const BATCH_SIZE: usize = 1000;

/// The name the renewal thread carries (visible in debuggers and `/proc`).
pub(crate) const THREAD_NAME: &str = "redmutex-renewal";

/// Something the renewal thread keeps alive.
#[derive(Clone)]
pub(crate) enum Registration {
    /// A held lock's lease.
    Lease {
        protocol: &'static dyn Protocol,
        /// How many units of the lock exist (a semaphore's permits; 1 for a lock).
        capacity: u32,
        /// The lock's name, for messages and events.
        name: Arc<str>,
        keys: Arc<LockKeys>,
        token: Arc<str>,
        state: Arc<LeaseState>,
        /// The lease each renewal sets: the client's, or the lock handle's own.
        lease: LeaseLength,
    },
    /// A queued waiter's place (its heartbeat).
    Waiter {
        protocol: &'static dyn Protocol,
        keys: Arc<LockKeys>,
        token: Arc<str>,
        /// Set when the heartbeat found the waiter dropped from the queue as dead: it must
        /// attempt again to join again.
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

    fn get(&self, id: u64) -> Option<Registration> {
        self.shard(id).lock().get(&id).cloned()
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
struct RenewalState {
    registry: Registry,
    /// Leases to renew before the next tick (locks handed over with a short claim).
    due: Mutex<Due>,
    cleanups: Cleanups,
    /// Where the leases live.
    lessor: Arc<dyn Lessor>,
    interval: Duration,
    lease: Duration,
    renewals: AtomicU64,
    batches: AtomicU64,
    busy_nanos: AtomicU64,
    counters: Arc<Counters>,
}

impl RenewalState {
    /// How often a registered lease is renewed apart from the ticks: `None` for one renewed
    /// each tick (a waiter's heartbeat, a lease as long as the client's or longer); for a
    /// shorter lease, the same share of its length as the interval is of the client's lease.
    fn own_period(&self, registration: &Registration) -> Option<Duration> {
        match registration {
            Registration::Lease { lease, .. } if *lease < LeaseLength::of(self.lease) => {
                let share = self.interval.as_secs_f64() / self.lease.as_secs_f64();
                Some(lease.get().mul_f64(share).max(MIN_PERIOD))
            }
            _ => None,
        }
    }

    /// Has the thread renew lease `id` at `at`: in place of a renewal asked for before
    /// (`replace`), or unless one is asked for already.
    fn schedule(&self, id: u64, at: Instant, replace: bool) {
        let mut due = self.due.lock();
        match due.renewals.iter_mut().find(|(due_id, _)| *due_id == id) {
            Some(entry) if replace => entry.1 = at,
            Some(_) => {}
            None => due.renewals.push((id, at)),
        }
    }
}

/// Leases to renew before the next tick, and until when the thread sleeps (`None` while it
/// works), so that a renewal due earlier wakes it and one due later does not.
#[derive(Default)]
struct Due {
    renewals: Vec<(u64, Instant)>,
    sleeping_until: Option<Instant>,
}

/// The client's side of the renewal thread.
pub(crate) struct Renewal {
    shared: Arc<RenewalState>,
    next_id: AtomicU64,
    worker: Mutex<Option<Worker>>,
    /// Set by `shutdown`: the thread is not started again.
    stopped: AtomicBool,
}

impl Renewal {
    pub(crate) fn new(
        lessor: Arc<dyn Lessor>,
        interval: Duration,
        lease: Duration,
        counters: Arc<Counters>,
    ) -> Self {
        Renewal {
            shared: Arc::new(RenewalState {
                registry: Registry::new(),
                due: Mutex::default(),
                cleanups: Cleanups::default(),
                lessor,
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

    /// Registers a lease for renewal, starting the thread when it is not running. A lease
    /// shorter than the client's is renewed on a schedule of its own (see `own_period`).
    pub(crate) fn register(&self, registration: Registration) -> Result<u64> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let period = self.shared.own_period(&registration);
        self.shared.registry.insert(id, registration);
        if let Err(e) = self.ensure_running() {
            self.shared.registry.remove(id);
            return Err(e);
        }
        if let Some(period) = period {
            self.renew_at(id, Instant::now() + period);
        }
        Ok(id)
    }

    /// Has the thread renew a registered lease at `at` rather than at its next tick (a lock
    /// handed over with a short claim, which the renewal turns into the lease). The thread
    /// is woken only when it would sleep past `at`; a lease released before then costs
    /// nothing.
    pub(crate) fn renew_at(&self, id: u64, at: Instant) {
        let mut due = self.shared.due.lock();
        due.renewals.push((id, at));
        if due.sleeping_until.is_some_and(|until| until <= at) {
            return;
        }
        drop(due);
        if let Some(w) = self.worker.lock().as_ref() {
            let _ = w.wake.try_send(());
        }
    }

    /// Stops renewing a lease. After this returns, the thread never reports it lost.
    pub(crate) fn cancel(&self, id: u64) {
        self.shared.registry.remove(id);
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

    /// Stops the thread for good and, with `wait`, waits for it; it makes one last pass over
    /// pending clean-ups first. Registered leases are no longer renewed. Without `wait` (the
    /// last handle dropped), the thread ends on its own at once, and nobody's drop blocks.
    pub(crate) fn shutdown(&self, wait: bool) {
        self.stopped.store(true, Ordering::Release);
        let worker = self.worker.lock().take();
        if let Some(Worker { wake, join }) = worker {
            drop(wake);
            // Not from the thread itself (a handle dropped in an event handler).
            if !wait || join.thread().id() == std::thread::current().id() {
                return;
            }
            if join.join().is_err() {
                log::warn!("redmutex: the renewal thread panicked");
            }
        }
    }
}

impl CleanUpLater for Renewal {
    /// Hands the clean-up of a call whose outcome is unknown to the thread, which sends it
    /// at once and again until Redis answered (see `cleanup`).
    fn clean_up_later(&self, lock_key: &Arc<str>, cleanup: Cleanup) {
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
}

struct RenewalThread {
    shared: Arc<RenewalState>,
    wake: Receiver<()>,
}

impl RenewalThread {
    fn run(self) {
        let s = &*self.shared;
        let mut next_tick = Instant::now() + s.interval;
        // The client announces itself soon after its first lock (not at once: the thread
        // starts beside that lock's first call), then keeps the announcement alive each tick.
        let mut first_announcement = Some(Instant::now() + s.interval.min(FIRST_ANNOUNCEMENT));
        loop {
            let now = Instant::now();
            let mut until = next_tick;
            if !s.cleanups.is_empty() {
                until = until.min(now + CLEANUP_RETRY);
            }
            if let Some(at) = first_announcement {
                until = until.min(at);
            }
            {
                let mut due = s.due.lock();
                // A lease released meanwhile needs no renewal, and no wake-up.
                due.renewals.retain(|(id, _)| s.registry.contains(*id));
                if let Some(at) = due.renewals.iter().map(|(_, at)| *at).min() {
                    until = until.min(at);
                }
                due.sleeping_until = Some(until);
            }
            let woken = self.wake.recv_timeout(until.saturating_duration_since(now));
            s.due.lock().sleeping_until = None;
            match woken {
                Ok(()) | Err(RecvTimeoutError::Timeout) => {}
                // Disconnected: the client is gone or shutting down.
                Err(RecvTimeoutError::Disconnected) => {
                    s.lessor.settle_unread();
                    self.run_cleanups();
                    if first_announcement.is_none() {
                        s.lessor.withdraw_announcement();
                    }
                    return;
                }
            }
            self.renew_due();
            if first_announcement.is_some_and(|at| Instant::now() >= at) {
                first_announcement = None;
                self.announce(true);
            }
            if Instant::now() >= next_tick {
                next_tick += s.interval;
                self.renew_all();
                // Replies to releases written by guards' drops, on connections nobody used
                // since: a failed one becomes a clean-up.
                s.lessor.settle_unread();
                if first_announcement.is_none() {
                    self.announce(false);
                }
                let now = Instant::now();
                if next_tick < now {
                    // Renewal took longer than an interval: start the next one from now.
                    next_tick = now + s.interval;
                }
            }
            self.run_cleanups();
        }
    }

    /// Keeps this client's announcement alive for a lease past the next tick.
    fn announce(&self, first: bool) {
        let s = &*self.shared;
        s.lessor.announce(first, s.lease + s.interval);
    }

    fn run_cleanups(&self) {
        let s = &*self.shared;
        s.cleanups.run(|calls| {
            let doing = Doing::work("cleaning up after failed calls");
            s.lessor
                .batch(calls, doing)
                .0
                .into_iter()
                .map(|reply| match reply {
                    Ok(value) => Outcome::Answered(value),
                    Err(e) => {
                        log::debug!("redmutex: {e}");
                        Outcome::Failed
                    }
                })
                .collect()
        });
    }

    /// Renews, in one batch, the leases asked for by `Renewal::renew_at` whose time has come
    /// and that are still registered.
    fn renew_due(&self) {
        let s = &*self.shared;
        let now = Instant::now();
        let due: Vec<u64> = {
            let mut due = s.due.lock();
            let mut ids = Vec::new();
            due.renewals.retain(|(id, at)| {
                let ready = *at <= now;
                if ready {
                    ids.push(*id);
                }
                !ready
            });
            ids
        };
        let batch: Vec<(u64, Registration)> = due
            .into_iter()
            .filter_map(|id| s.registry.get(id).map(|r| (id, r)))
            .collect();
        if !batch.is_empty() {
            self.renew_batch(&batch);
        }
    }

    fn renew_all(&self) {
        let s = &*self.shared;
        let started = Instant::now();
        let batches_before = s.batches.load(Ordering::Relaxed);
        let snapshot = s.registry.snapshot();
        // Leases on a schedule of their own are renewed by `renew_due`.
        let (leases, waiters): (Vec<_>, Vec<_>) = snapshot
            .into_iter()
            .filter(|(_, r)| s.own_period(r).is_none())
            .partition(|(_, r)| matches!(r, Registration::Lease { .. }));
        if !leases.is_empty() {
            self.renew_batch(&leases);
        }
        if !waiters.is_empty() {
            self.send_heartbeats(&waiters);
        }
        if s.counters.events.on() {
            let leases = leases.len();
            let round_trips = s.batches.load(Ordering::Relaxed) - batches_before;
            let took = started.elapsed();
            s.counters.events.emit(|h| {
                h.renewed(&Renewed {
                    leases,
                    round_trips,
                    took,
                })
            });
        }
        let busy = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        s.busy_nanos.fetch_add(busy, Ordering::Relaxed);
    }

    /// One heartbeat call per lock for every queued waiter of this client; waiters found
    /// dropped from their queue are told to join again.
    fn send_heartbeats(&self, waiters: &[(u64, Registration)]) {
        let s = &*self.shared;
        type Waiters<'a> = (
            &'static dyn Protocol,
            &'a Arc<LockKeys>,
            Vec<(&'a str, &'a Arc<AtomicBool>)>,
        );
        let mut by_lock: FastHashMap<&str, Waiters<'_>> = FastHashMap::default();
        for (_, r) in waiters {
            if let Registration::Waiter {
                protocol,
                keys,
                token,
                dropped,
            } = r
            {
                by_lock
                    .entry(keys.lock.as_str())
                    .or_insert_with(|| (*protocol, keys, Vec::new()))
                    .2
                    .push((&**token, dropped));
            }
        }
        // A waiter counts as dead one lease after its last heartbeat.
        let groups: Vec<_> = by_lock
            .into_values()
            .filter_map(|(protocol, keys, waiters)| {
                let tokens: Vec<&str> = waiters.iter().map(|(t, _)| *t).collect();
                let call = protocol.heartbeat(keys, &tokens, s.lease)?;
                Some((keys, waiters, call))
            })
            .collect();
        let calls: Vec<Routed<'_>> = groups
            .iter()
            .map(|(keys, _, call)| (keys.lock.as_str(), call))
            .collect();
        s.renewals
            .fetch_add(waiters.len() as u64, Ordering::Relaxed);
        let (replies, trips) = s
            .lessor
            .batch(&calls, Doing::work("sending queued waiters' heartbeats"));
        s.batches.fetch_add(trips, Ordering::Relaxed);
        for ((_, waiters, _), reply) in groups.iter().zip(replies) {
            let dropped: Vec<String> = match reply {
                Ok(value) => redis::from_redis_value(value).unwrap_or_default(),
                Err(e) => {
                    log::debug!("redmutex: {e}");
                    continue;
                }
            };
            for (token, flag) in waiters {
                if dropped.iter().any(|d| d == token) {
                    flag.store(true, Ordering::Release);
                }
            }
        }
    }

    /// Renews the leases of `batch` (the lessor sends them in as few round trips as it can)
    /// and tells each what became of it.
    ///
    /// A lease lost already is not renewed (lost is final): it is told, once, and left to
    /// run out, so that no copy of it lingers where it could still be renewed (a quorum's
    /// minority that the holder still reaches).
    fn renew_batch(&self, batch: &[(u64, Registration)]) {
        let mut batch: Vec<&(u64, Registration)> = batch
            .iter()
            .filter(|(id, r)| match r {
                Registration::Lease { state, .. } => match state.lost_reason() {
                    Some(reason) => {
                        self.report_loss(*id, r, reason);
                        false
                    }
                    None => true,
                },
                Registration::Waiter { .. } => false,
            })
            .collect();
        // One renewal call to the lessor per lease length (most batches have one).
        batch.sort_by_key(|(_, r)| lease_of(r));
        for group in batch.chunk_by(|(_, a), (_, b)| lease_of(a) == lease_of(b)) {
            self.renew_group(group, lease_of(&group[0].1).get());
        }
    }

    /// Renews leases of one length, `lease`, and tells each what became of it.
    fn renew_group(&self, batch: &[&(u64, Registration)], lease: Duration) {
        let s = &*self.shared;
        let invocations: Vec<_> = batch
            .iter()
            .filter_map(|(_, r)| match r {
                Registration::Lease {
                    protocol,
                    capacity,
                    keys,
                    token,
                    ..
                } => Some((keys, *capacity, protocol.renew(keys, token, lease))),
                Registration::Waiter { .. } => None,
            })
            .collect();
        let calls: Vec<Renewing<'_>> = invocations
            .iter()
            .map(|(keys, capacity, call)| {
                let site = Site {
                    route: keys.lock.as_str(),
                    capacity: *capacity,
                };
                (site, call)
            })
            .collect();
        let (outcomes, trips) = s.lessor.renew(&calls, lease);
        s.batches.fetch_add(trips, Ordering::Relaxed);
        s.renewals.fetch_add(batch.len() as u64, Ordering::Relaxed);
        let period = s.own_period(&batch[0].1);
        let mut retry: Vec<u64> = Vec::new();
        for ((id, r), outcome) in batch.iter().zip(outcomes) {
            let Registration::Lease { state, .. } = r else {
                continue;
            };
            match outcome {
                Ok(Some(held_until)) => {
                    state.renewed_until(held_until);
                    if let Some(period) = period {
                        s.schedule(*id, Instant::now() + period, true);
                    }
                    // A reply that came after the lease ran out renews nothing: lost is final.
                    if state.is_lost() {
                        let why = "the renewal's reply came after the lease ran out";
                        self.report_loss(*id, r, LostReason::Expired(why.to_owned()));
                    }
                }
                Ok(None) => self.report_loss(*id, r, LostReason::Taken),
                Err(e) => {
                    retry.push(*id);
                    if Instant::now() >= state.expires_at() {
                        self.report_loss(*id, r, LostReason::Expired(e.to_string()));
                    }
                }
            }
        }
        if !retry.is_empty() {
            log::debug!("redmutex: renewal of {} leases failed", retry.len());
            let at = Instant::now() + (period.unwrap_or(s.interval) / 4).min(RENEWAL_RETRY);
            for id in retry {
                s.schedule(id, at, false);
            }
        }
    }

    /// Marks a registered lease lost for `reason`, and tells of it once (the lease-lost
    /// event, `Stats::lost`, a warning).
    fn report_loss(&self, id: u64, registration: &Registration, reason: LostReason) {
        let s = &*self.shared;
        let Registration::Lease {
            keys,
            state,
            name,
            protocol,
            ..
        } = registration
        else {
            return;
        };
        let why = reason.describe();
        if s.registry.contains(id) && state.mark_lost(reason) {
            s.counters.lease_lost(name, protocol.kind().name);
            log::warn!("redmutex: lock {} was lost: {why}", keys.lock);
        }
    }
}

/// The lease a registration's renewals set (none for a waiter's heartbeat).
fn lease_of(registration: &Registration) -> LeaseLength {
    match registration {
        Registration::Lease { lease, .. } => *lease,
        Registration::Waiter { .. } => LeaseLength(0),
    }
}

/// A lease's length in 32 bits, so that a registration is no larger for carrying one (it
/// shares a word with the capacity): milliseconds below 2^31 (24.8 days), whole seconds above
/// (a lease is at most a year). Renewals send milliseconds, so nothing they set is lost. The
/// order of the bits is the order of the lengths.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct LeaseLength(u32);

impl LeaseLength {
    /// The bit that marks a length in seconds.
    const SECONDS: u32 = 1 << 31;

    pub(crate) fn of(lease: Duration) -> Self {
        match u32::try_from(lease.as_millis()) {
            Ok(ms) if ms < Self::SECONDS => LeaseLength(ms),
            _ => {
                let secs = u32::try_from(lease.as_secs()).unwrap_or(u32::MAX);
                LeaseLength(Self::SECONDS | secs.min(Self::SECONDS - 1))
            }
        }
    }

    pub(crate) fn get(self) -> Duration {
        match self.0 & Self::SECONDS {
            0 => Duration::from_millis(u64::from(self.0)),
            _ => Duration::from_secs(u64::from(self.0 & !Self::SECONDS)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_length_keeps_milliseconds_and_its_order() {
        let lengths = [
            Duration::from_millis(1),
            Duration::from_millis(1500),
            Duration::from_secs(30),
            Duration::from_millis(u64::from(LeaseLength::SECONDS) - 1),
            Duration::from_secs(30 * 24 * 3600),
            crate::MAX_LEASE,
        ];
        for lease in lengths {
            assert_eq!(LeaseLength::of(lease).get(), lease);
        }
        assert_eq!(
            LeaseLength::of(Duration::from_micros(1_500_700)).get(),
            Duration::from_millis(1500)
        );
        let compact: Vec<_> = lengths.iter().map(|l| LeaseLength::of(*l)).collect();
        assert!(compact.windows(2).all(|w| w[0] < w[1]));
        // As small as a registration was before it carried its lease (the heap per held
        // lock that `benches/scale.rs` measures).
        if cfg!(target_pointer_width = "64") {
            assert_eq!(std::mem::size_of::<Registration>(), 72);
        }
    }
}
