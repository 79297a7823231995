//! Counters of what a client did, for monitoring and for the contention figures of the demo
//! and the benchmarks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use crate::events::{Events, LeaseLost};

/// What a [`Client`](crate::Client) and its clones did since it was built.
///
/// Counters only grow. Take two snapshots and subtract to see a period.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> redmutex::Result<()> {
/// let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// drop(client.mutex("job").lock()?);
/// let stats = client.stats();
/// println!(
///     "{} acquisitions, {} attempts, {} contended, waited {:?}",
///     stats.acquisitions, stats.attempts, stats.contended, stats.wait_time
/// );
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stats {
    /// Locks taken in Redis (re-entries not counted).
    pub acquisitions: u64,
    /// Re-entrant acquires answered locally, without a round trip.
    pub reentries: u64,
    /// Acquire attempts sent to Redis, successful or not.
    pub attempts: u64,
    /// Of the acquisitions, locks that a release handed to this client's queued waiter (a
    /// [`FairMutex`](crate::FairMutex)), taken without an attempt.
    pub handed_over: u64,
    /// Of the acquisitions, locks that a holder of this client passed straight to another of
    /// its waiting threads (a [`Mutex`](crate::Mutex)), taken without an attempt; the holder
    /// released nothing in Redis.
    pub passed_on: u64,
    /// Acquires that found the lock held at least once and had to wait or give up.
    pub contended: u64,
    /// Timed or single-attempt acquires that gave up without the lock.
    pub gave_up: u64,
    /// Time spent waiting by contended acquires, summed over threads.
    pub wait_time: Duration,
    /// Locks released in Redis.
    pub releases: u64,
    /// Holds whose lease was found lost, by renewal or at release.
    pub lost: u64,
    /// Times a blocking acquire started again after an error that may pass (a restart, a
    /// failover): see [`Builder::outage_patience`](crate::Builder::outage_patience).
    pub outage_retries: u64,
    /// Lease renewals (and fair waiters' heartbeats) sent by the renewal thread.
    pub renewals: u64,
    /// Round trips the renewal thread used for them.
    pub renewal_round_trips: u64,
    /// Time the renewal thread spent renewing.
    pub renewal_time: Duration,
    /// Leases registered for renewal right now.
    pub renewed_leases: u64,
    /// Release announcements received by the subscriber.
    pub notifications: u64,
    /// Times the subscriber connection broke and was made again.
    pub subscriber_reconnects: u64,
    /// Optimistic updates of a [`Shared`](crate::Shared) value that ended, written or not
    /// ([`Shared::update`](crate::Shared::update)).
    pub updates: u64,
    /// Tries of optimistic updates that found the value changed or locked since they read it,
    /// and read it again.
    pub update_conflicts: u64,
    /// Clean-ups of calls whose outcome is unknown (an acquire or release that timed out)
    /// that the renewal thread is still sending, until Redis answers or their lease ran out.
    pub pending_cleanups: u64,
}

/// A contended acquire being timed.
pub(crate) struct ContendedWait<'a> {
    counters: &'a Counters,
    started: Instant,
}

impl ContendedWait<'_> {
    /// Records the wait's time, and a give-up when it ends without the lock.
    pub(crate) fn finish<T>(&self, result: crate::Result<Option<T>>) -> crate::Result<Option<T>> {
        let waited = u64::try_from(self.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        Counters::add(&self.counters.wait_nanos, waited);
        if matches!(result, Ok(None)) {
            Counters::add(&self.counters.gave_up, 1);
        }
        result
    }
}

/// What the background threads counted, for a [`Stats`] snapshot.
pub(crate) struct Background {
    pub(crate) renewals: u64,
    pub(crate) renewal_round_trips: u64,
    pub(crate) renewal_time: Duration,
    pub(crate) renewed_leases: u64,
    pub(crate) pending_cleanups: u64,
    pub(crate) notifications: u64,
    pub(crate) subscriber_reconnects: u64,
}

/// The live counters behind [`Stats`], and the client's event handlers.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) acquisitions: AtomicU64,
    pub(crate) reentries: AtomicU64,
    pub(crate) attempts: AtomicU64,
    pub(crate) handed_over: AtomicU64,
    pub(crate) passed_on: AtomicU64,
    pub(crate) contended: AtomicU64,
    pub(crate) gave_up: AtomicU64,
    pub(crate) wait_nanos: AtomicU64,
    pub(crate) releases: AtomicU64,
    pub(crate) lost: AtomicU64,
    pub(crate) outage_retries: AtomicU64,
    pub(crate) updates: AtomicU64,
    pub(crate) update_conflicts: AtomicU64,
    /// Who hears of acquisitions, releases, time-outs, lost leases.
    pub(crate) events: Events,
}

impl Counters {
    pub(crate) fn new(events: Events) -> Self {
        Counters {
            events,
            ..Counters::default()
        }
    }

    /// Counts a lease found lost, and tells the handlers.
    pub(crate) fn lease_lost(&self, name: &str, kind: &'static str) {
        Counters::add(&self.lost, 1);
        self.events
            .emit(|h| h.lease_lost(&LeaseLost { name, kind }));
    }

    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    /// A single attempt found the lock held and the caller would not wait.
    pub(crate) fn gave_up_at_once(&self) {
        Counters::add(&self.contended, 1);
        Counters::add(&self.gave_up, 1);
    }

    /// Counts a contended acquire and times its wait; see [`ContendedWait::finish`].
    pub(crate) fn contended_wait(&self) -> ContendedWait<'_> {
        Counters::add(&self.contended, 1);
        ContendedWait {
            counters: self,
            started: Instant::now(),
        }
    }

    pub(crate) fn snapshot(&self, background: Background) -> Stats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Stats {
            acquisitions: get(&self.acquisitions),
            reentries: get(&self.reentries),
            attempts: get(&self.attempts),
            handed_over: get(&self.handed_over),
            passed_on: get(&self.passed_on),
            contended: get(&self.contended),
            gave_up: get(&self.gave_up),
            wait_time: Duration::from_nanos(get(&self.wait_nanos)),
            releases: get(&self.releases),
            lost: get(&self.lost),
            outage_retries: get(&self.outage_retries),
            updates: get(&self.updates),
            update_conflicts: get(&self.update_conflicts),
            renewals: background.renewals,
            renewal_round_trips: background.renewal_round_trips,
            renewal_time: background.renewal_time,
            renewed_leases: background.renewed_leases,
            notifications: background.notifications,
            subscriber_reconnects: background.subscriber_reconnects,
            pending_cleanups: background.pending_cleanups,
        }
    }
}
