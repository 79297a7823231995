//! The renewal of a Redlock's held leases: a thread per Redlock while it holds any lease,
//! that renews every hold on every instance (one pipelined round trip per instance per
//! period) and keeps a hold valid only while a majority renewed it.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::guard::RedlockHold;
use super::Inner;
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

    /// Stops renewing `hold`.
    pub(crate) fn unregister(&self, hold: &RedlockHold) {
        self.registry
            .lock()
            .holds
            .retain(|h| !std::ptr::eq(Arc::as_ptr(h), hold));
    }
}

fn run(registry: &Mutex<Registry>, inner: &Arc<Inner>) {
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
        renew(inner, &holds);
    }
}

/// One period: every hold on every instance, then the majority rule.
fn renew(inner: &Inner, holds: &[Arc<RedlockHold>]) {
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
            let lease = hold.lease.saturating_sub(Inner::drift(hold.lease));
            hold.state.renewed(times[inner.quorum - 1], lease);
        } else if not_held > n - inner.quorum && hold.state.mark_lost(LostReason::Taken) {
            log::warn!(
                "redmutex: Redlock {:?} was lost: renewal found it held on {} of {n} instances",
                hold.name,
                times.len()
            );
        }
    }
}
