//! The renewal of a Redlock's held leases: a thread per Redlock while it holds any lease,
//! that renews every hold on every instance (one pipelined round trip per instance per
//! period) and keeps a hold valid only while a majority renewed it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::guard::RedlockHold;
use super::{RedlockCore, KIND};
use crate::connection::{Routed, ScriptCall};
use crate::error::Doing;
use crate::lease::LostReason;
use crate::primitives::mutex;

/// The name the renewal thread carries.
const THREAD_NAME: &str = "redmutex-redlock";

#[derive(Default)]
struct Registry {
    holds: Vec<Arc<RedlockHold>>,
    /// A thread is running (it clears this, under the lock, when it ends).
    running: bool,
}

/// The holds that a Redlock renews.
#[derive(Default)]
pub(crate) struct Renewal {
    registry: Arc<Mutex<Registry>>,
    /// Renewal rounds, their round trips (one per instance), and their time in nanoseconds.
    rounds: AtomicU64,
    round_trips: AtomicU64,
    nanos: AtomicU64,
}

impl Renewal {
    /// Renews `hold` from now on, starting the thread when needed. Returns `false` when the
    /// thread cannot be started.
    pub(crate) fn register(&self, hold: &Arc<RedlockHold>) -> bool {
        let mut registry = self.registry.lock();
        registry.holds.push(Arc::clone(hold));
        if registry.running {
            return true;
        }
        let shared = Arc::clone(&self.registry);
        let inner = Arc::clone(&hold.inner);
        let started = std::thread::Builder::new()
            .name(THREAD_NAME.to_owned())
            .spawn(move || run(&shared, &inner));
        match started {
            Ok(_) => {
                registry.running = true;
                true
            }
            Err(e) => {
                registry.holds.pop();
                log::warn!("redmutex: cannot start the Redlock renewal thread: {e}");
                false
            }
        }
    }

    /// Rounds so far, their round trips, and the time they took.
    pub(crate) fn counters(&self) -> (u64, u64, Duration) {
        (
            self.rounds.load(Ordering::Relaxed),
            self.round_trips.load(Ordering::Relaxed),
            Duration::from_nanos(self.nanos.load(Ordering::Relaxed)),
        )
    }

    /// How many holds are renewed now.
    pub(crate) fn registered(&self) -> usize {
        self.registry.lock().holds.len()
    }

    /// Stops renewing `hold`.
    pub(crate) fn unregister(&self, hold: &RedlockHold) {
        self.registry
            .lock()
            .holds
            .retain(|h| !std::ptr::eq(Arc::as_ptr(h), hold));
    }
}

fn run(registry: &Mutex<Registry>, inner: &Arc<RedlockCore>) {
    loop {
        std::thread::sleep(inner.renewal_interval);
        let holds = {
            let mut r = registry.lock();
            if r.holds.is_empty() {
                r.running = false;
                return;
            }
            r.holds.clone()
        };
        let started = Instant::now();
        renew(inner, &holds);
        let r = &inner.renewal;
        r.rounds.fetch_add(1, Ordering::Relaxed);
        r.round_trips
            .fetch_add(inner.instances.len() as u64, Ordering::Relaxed);
        let took = u64::try_from(started.elapsed().as_nanos()).unwrap_or(u64::MAX);
        r.nanos.fetch_add(took, Ordering::Relaxed);
    }
}

/// One period: every hold on every instance, then the majority rule.
fn renew(inner: &RedlockCore, holds: &[Arc<RedlockHold>]) {
    let protocol = mutex::protocol();
    let doing = Doing::work("renewing Redlock leases");
    // Per hold, the send times of the instances that renewed it, and how many said it is not
    // (or no longer) held there.
    let mut renewed: Vec<Vec<Instant>> = vec![Vec::new(); holds.len()];
    let mut not_held = vec![0usize; holds.len()];
    for (i, instance) in inner.instances.iter().enumerate() {
        let calls: Vec<ScriptCall> = holds
            .iter()
            .map(|h| protocol.renew(&h.keys[i], &h.token, h.lease))
            .collect();
        let routed: Vec<Routed<'_>> = holds
            .iter()
            .zip(&calls)
            .map(|(h, call)| (h.keys[i].lock.as_str(), call))
            .collect();
        let sent_at = Instant::now();
        let (replies, _) = instance.ctx.connections.call_batch(&routed, doing);
        for (h, reply) in replies.into_iter().enumerate() {
            match reply {
                Ok(redis::Value::Int(1)) => renewed[h].push(sent_at),
                Ok(redis::Value::Int(_)) => not_held[h] += 1,
                Ok(_) => {}
                Err(e) => log::debug!("redmutex: {e}"),
            }
        }
    }
    let n = inner.instances.len();
    for ((hold, mut times), not_held) in holds.iter().zip(renewed).zip(not_held) {
        if times.len() >= inner.quorum {
            // Valid while the majority-th latest renewal lasts, less the drift.
            times.sort_unstable_by(|a, b| b.cmp(a));
            let lease = hold.lease.saturating_sub(RedlockCore::drift(hold.lease));
            hold.state.renewed(times[inner.quorum - 1], lease);
        } else if not_held > n - inner.quorum {
            if hold.state.mark_lost(LostReason::Taken) {
                inner.counters.lease_lost(&hold.name, KIND);
                log::warn!(
                    "redmutex: Redlock {:?} was lost: renewal found it held on {} of {n} \
                     instances",
                    hold.name,
                    times.len()
                );
            }
            continue;
        }
        // Ran out on this machine's clock (no majority renewed it in time, or their replies
        // came after its end): told once.
        if hold.state.is_lost()
            && hold.state.mark_lost(LostReason::Expired(
                "no majority renewed it before the lease ran out".to_owned(),
            ))
        {
            inner.counters.lease_lost(&hold.name, KIND);
        }
    }
}
