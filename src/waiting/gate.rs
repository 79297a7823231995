//! The local gate of a lock: of the threads of one client that wait for the same lock, one
//! (the leader) contends in Redis while the others wait in the process, so that a hundred
//! waiting threads cost Redis what one does.

use std::sync::Arc;
use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use crate::fast_hash::FastHashMap;
use crate::waiting::subscriber::Subscription;

/// What a leader that took the lock leaves to the next: its subscription, still registered,
/// and the wake-up count from before its winning attempt, which kept this client among the
/// lock's waiting clients in Redis. The next leader waits for the next announcement that
/// names this client, with nothing to send first and no announcement missed in between.
pub(crate) struct Baton {
    pub(crate) subscription: Subscription,
    pub(crate) seen: u64,
}

#[derive(Default)]
struct GateState {
    leader: bool,
    /// Threads in the gate, the leader included.
    inside: usize,
    baton: Option<Baton>,
}

#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    turn: Condvar,
}

/// The gates of one client, one per lock that has waiters.
#[derive(Default)]
pub(crate) struct Gates {
    gates: Mutex<FastHashMap<Arc<str>, Arc<Gate>>>,
}

/// A thread's place in a gate; dropping it leaves the gate (and hands leadership on).
pub(crate) struct GatePass<'a> {
    gates: &'a Gates,
    key: Arc<str>,
    gate: Arc<Gate>,
    leader: bool,
    /// Another thread led before this one: the lock may have changed hands meanwhile.
    pub(crate) waited: bool,
}

impl GatePass<'_> {
    /// Takes what the previous leader left, if anything.
    pub(crate) fn take_baton(&self) -> Option<Baton> {
        self.gate.state.lock().baton.take()
    }

    /// Leaves `baton` to the next leader; it is dropped with the gate if nobody leads again.
    pub(crate) fn hand_over(&self, baton: Baton) {
        self.gate.state.lock().baton = Some(baton);
    }

    /// Whether other threads wait in this gate besides this one.
    pub(crate) fn others_inside(&self) -> bool {
        self.gate.state.lock().inside > 1
    }
}

impl Gates {
    /// Whether other threads of this client wait for the lock now.
    pub(crate) fn has_waiters(&self, key: &str) -> bool {
        self.gates
            .lock()
            .get(key)
            .is_some_and(|g| g.state.lock().inside > 0)
    }

    /// Enters the gate of `key` and waits to become its leader, until `deadline`. Returns
    /// `None` when the deadline passed first.
    pub(crate) fn lead(&self, key: &Arc<str>, deadline: Option<Instant>) -> Option<GatePass<'_>> {
        let gate = {
            let mut gates = self.gates.lock();
            let gate = Arc::clone(gates.entry(Arc::clone(key)).or_default());
            gate.state.lock().inside += 1;
            gate
        };
        let mut pass = GatePass {
            gates: self,
            key: Arc::clone(key),
            gate,
            leader: false,
            waited: false,
        };
        let mut state = pass.gate.state.lock();
        while state.leader {
            pass.waited = true;
            let timed_out = match deadline {
                Some(d) => pass.gate.turn.wait_until(&mut state, d).timed_out(),
                None => {
                    pass.gate.turn.wait(&mut state);
                    false
                }
            };
            if timed_out && state.leader {
                drop(state);
                return None; // `pass` leaves the gate on drop
            }
        }
        state.leader = true;
        drop(state);
        pass.leader = true;
        Some(pass)
    }
}

impl Gates {
    /// Becomes the leader of `key`'s gate if it has none, without waiting.
    pub(crate) fn try_lead(&self, key: &Arc<str>) -> Option<GatePass<'_>> {
        let mut gates = self.gates.lock();
        let gate = Arc::clone(gates.entry(Arc::clone(key)).or_default());
        let mut state = gate.state.lock();
        if state.leader {
            return None;
        }
        state.leader = true;
        state.inside += 1;
        drop(state);
        drop(gates);
        Some(GatePass {
            gates: self,
            key: Arc::clone(key),
            gate,
            leader: true,
            waited: false,
        })
    }
}

impl Drop for GatePass<'_> {
    fn drop(&mut self) {
        let mut state = self.gate.state.lock();
        state.inside -= 1;
        if self.leader {
            state.leader = false;
            self.gate.turn.notify_one();
        }
        let empty = state.inside == 0;
        // The baton's subscription is dropped outside the gate's lock.
        let baton = if empty { state.baton.take() } else { None };
        drop(state);
        drop(baton);
        if empty {
            let mut gates = self.gates.gates.lock();
            // Someone may have entered since: remove only a gate that is still empty.
            if gates
                .get(&self.key)
                .is_some_and(|g| Arc::ptr_eq(g, &self.gate) && g.state.lock().inside == 0)
            {
                gates.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[test]
    fn one_leader_at_a_time_and_leadership_passes_on() {
        let gates = Arc::new(Gates::default());
        let key: Arc<str> = Arc::from("k");
        let leaders = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (gates, key, leaders) = (gates.clone(), key.clone(), leaders.clone());
                std::thread::spawn(move || {
                    let pass = gates.lead(&key, None).unwrap();
                    assert_eq!(leaders.fetch_add(1, Ordering::SeqCst), 0);
                    std::thread::sleep(Duration::from_millis(2));
                    leaders.fetch_sub(1, Ordering::SeqCst);
                    drop(pass);
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(!gates.has_waiters("k"));
        assert!(gates.gates.lock().is_empty());
    }

    #[test]
    fn a_follower_gives_up_at_its_deadline() {
        let gates = Gates::default();
        let key: Arc<str> = Arc::from("k");
        let leader = gates.lead(&key, None).unwrap();
        assert!(gates.has_waiters("k"));
        let deadline = Instant::now() + Duration::from_millis(20);
        assert!(gates.lead(&key, Some(deadline)).is_none());
        drop(leader);
        assert!(gates.lead(&key, Some(Instant::now())).is_some());
        assert!(!gates.has_waiters("k"));
    }
}
