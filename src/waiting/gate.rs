//! The local gate of a lock: of the threads of one client that wait for the same lock, one
//! (the leader) contends in Redis while the others wait in the process, so that a hundred
//! waiting threads cost Redis what one does.

use std::hash::Hasher;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::fast_hash::{FastHashMap, FxHasher};
use crate::waiting::subscriber::{Signal, Subscription};

/// What a leader that took the lock leaves to the next: its subscription, still registered,
/// and the wake-up count from before its winning attempt, which kept this client among the
/// lock's waiting clients in Redis. The next leader waits for the next announcement that
/// names this client, with nothing to send first and no announcement missed in between.
pub(crate) struct Baton {
    pub(crate) subscription: Subscription,
    pub(crate) seen: u64,
}

/// How long the threads of one client may pass a lock among themselves, from the first pass
/// that found other clients waiting: then a holder releases it in Redis, which names the
/// client that waited longest. Long enough for 16 short holds, each passed on without a
/// release, an announcement and an attempt; short enough that a client waiting behind three
/// others waits no longer at the tail than when every hand-off crossed processes (4
/// processes x 4 threads holding 200 us: wait p99 12.5 ms before; 5 ms runs made it 20.8 ms).
/// parking_lot forces a fair unlock about every 0.5 ms for the same reason, with hand-offs
/// that cost a cache miss rather than a network round trip.
pub(crate) const COHORT_TIME: Duration = Duration::from_millis(2);

/// At most this many passes within one client in a row while other clients wait, whatever
/// the time: a bound on the unfairness that does not depend on the hold times.
pub(crate) const COHORT_PASSES: u32 = 16;

/// At most this many passes in a row go to threads that came for the lock while the pass
/// waited for the gate's leader (see [`Gates::lead`]), rather than to the leader; then one
/// waits for the leader. A pass to a thread that runs (often the holder, back for the lock)
/// costs no wake-up of a parked one, which takes 10 to 30 us on two busy cores where the pass
/// itself takes a few; one pass in four to the leader, in the gate's order, serves every
/// thread of a client of four within each run of [`COHORT_PASSES`] passes. parking_lot's
/// mutex lets a running thread barge the same way, and forces a fair hand-off now and then.
pub(crate) const BARGES: u32 = 3;

/// The run of holds of one lock by the threads of one client, passed from one to the next
/// without a release in Redis.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Cohort {
    /// When the run began: a thread of the client took the lock in Redis, or other clients
    /// began to wait.
    since: Instant,
    /// Passes since then.
    passes: u32,
    /// Whether other clients waited for the lock at the last pass that asked Redis.
    contested: bool,
    /// Fencing tokens reserved for passes without a round trip: the next, and the last.
    block: (u64, u64),
    /// Passes in a row taken by threads that came meanwhile, not by the gate's leader.
    barged: u32,
}

impl Cohort {
    /// A run that begins with a take in Redis, with no tokens reserved. Whether other
    /// clients wait is not known until its first pass asks Redis.
    pub(crate) fn start() -> Self {
        Cohort {
            since: Instant::now(),
            passes: 0,
            contested: false,
            block: (1, 0),
            barged: 0,
        }
    }

    /// Whether a thread that comes for the lock may take a pass meant for the gate's leader.
    fn may_barge(&self) -> bool {
        self.barged < BARGES
    }

    /// Whether the holder may pass the lock on within its client instead of releasing it:
    /// always while no other client waits, else within [`COHORT_PASSES`] and
    /// [`COHORT_TIME`].
    pub(crate) fn may_pass(&self) -> bool {
        !self.contested || (self.passes < COHORT_PASSES && self.since.elapsed() < COHORT_TIME)
    }

    /// Whether the run has passed the lock on at least once: its threads take turns.
    pub(crate) fn passing(&self) -> bool {
        self.passes > 0
    }

    /// Whether other clients may be waiting for the lock (they were at the last look).
    pub(crate) fn contested(&self) -> bool {
        self.contested
    }

    /// The next reserved fencing token and the run after a pass with it, if one is left.
    pub(crate) fn pass_from_block(self) -> Option<(u64, Cohort)> {
        let (next, last) = self.block;
        (next <= last).then(|| {
            (
                next,
                Cohort {
                    passes: self.passes + 1,
                    block: (next + 1, last),
                    ..self
                },
            )
        })
    }

    /// The run after a pass that asked Redis, which found `others` other clients waiting and
    /// reserved the tokens `first..=last`, the first for the new holder: a run that was not
    /// contested begins anew.
    pub(crate) fn passed(self, others: u64, (first, last): (u64, u64)) -> Self {
        let block = (first + 1, last);
        match (self.contested, others > 0) {
            (_, false) => Cohort {
                since: Instant::now(),
                passes: 0,
                contested: false,
                block,
                ..self
            },
            (false, true) => Cohort {
                since: Instant::now(),
                passes: 1,
                contested: true,
                block,
                ..self
            },
            (true, true) => Cohort {
                passes: self.passes + 1,
                block,
                ..self
            },
        }
    }
}

/// How a leader takes a lock passed to it: the lease it takes, whether it is fixed (no
/// renewal), and the kind of lock it waits for (a gate's key is one lock's).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) struct Taker {
    pub(crate) lease: Duration,
    pub(crate) fixed: bool,
    pub(crate) kind: &'static str,
}

/// A lock that its holder passed to the leading waiter of its client: the lock holds `token`,
/// the new holder's fencing token is `fencing_token`, and its lease surely lasts until
/// `expires_at`. Dropped before a waiter took it (the waiter left meanwhile), it runs
/// `give_back`, the release in Redis.
pub(crate) struct Passed {
    pub(crate) token: Arc<str>,
    pub(crate) fencing_token: u64,
    pub(crate) expires_at: Instant,
    pub(crate) cohort: Cohort,
    /// How the holder that passed it expected the leader to take it.
    taker: Taker,
    give_back: Option<Box<dyn FnOnce() + Send>>,
}

impl Passed {
    pub(crate) fn new(
        (token, fencing_token): (Arc<str>, u64),
        (expires_at, cohort): (Instant, Cohort),
        (taker, give_back): (Taker, Box<dyn FnOnce() + Send>),
    ) -> Self {
        Passed {
            token,
            fencing_token,
            expires_at,
            cohort,
            taker,
            give_back: Some(give_back),
        }
    }

    /// Taken by the leader it was passed to: nothing is given back, and the count of passes
    /// taken by threads that came begins anew.
    pub(crate) fn take(mut self) -> Self {
        self.give_back = None;
        self.cohort.barged = 0;
        self
    }

    /// To be taken by a thread that came for the lock before the leader it was passed to
    /// took it.
    fn barge(mut self) -> Self {
        self.cohort.barged += 1;
        self
    }
}

impl Drop for Passed {
    fn drop(&mut self) {
        if let Some(give_back) = self.give_back.take() {
            give_back();
        }
    }
}

/// The leader, while it can be passed the lock: what wakes it, and how it takes the lock.
struct Listener {
    signal: Arc<Signal>,
    taker: Taker,
}

/// Whether a holder of the client may pass the lock to the gate's leader.
#[derive(Default)]
enum Listening {
    /// A leader is about to begin (a thread in the gate is taking over from the one that
    /// left), or has begun and not yet listened: it looks for a lock passed to it before it
    /// attempts, so a pass needs no wake-up. It takes the lock as every thread in the gate
    /// does, if they all take it alike (see [`GateState::taker`]).
    #[default]
    Soon,
    /// The leader listens: the signal wakes it.
    Now(Listener),
    /// The leader takes no pass: it cannot be woken for one, or its deadline passed.
    Not,
}

#[derive(Default)]
struct GateState {
    leader: bool,
    /// Threads in the gate, the leader included.
    inside: usize,
    /// Threads that wait in the gate to lead. While any does, a thread that enters waits
    /// behind it even if nobody leads: the last leader woke the longest waiting, which leads
    /// next, not a thread that enters meanwhile (often the holder that just passed the lock
    /// on, coming back for it), so that no thread of the client waits behind the same few
    /// again and again.
    queued: usize,
    /// Threads in the gate whose deadline passed behind a leader: they leave, and none of
    /// them leads.
    leaving: usize,
    /// How every thread in the gate takes a lock passed to it, when they all take it alike;
    /// `None` when they do not (or one cannot be passed a lock).
    taker: Option<Taker>,
    baton: Option<Baton>,
    listener: Listening,
    passed: Option<Passed>,
    /// Releases on their way that keep this client's place among the lock's waiting clients
    /// (see [`Keeping`]).
    keeping: usize,
}

impl GateState {
    /// Whether a thread that enters now waits to lead: another leads, or was woken to.
    fn taken(&self) -> bool {
        self.leader || self.queued > 0
    }

    /// A thread enters that takes a lock passed to it with `taker`.
    fn enter(&mut self, taker: Option<Taker>) {
        self.taker = match self.inside {
            0 => taker,
            _ => self.taker.filter(|&t| Some(t) == taker),
        };
        self.inside += 1;
    }

    /// Whether a holder may pass the lock to the gate's leader (one of `kind`) now: how the
    /// leader takes it, and the signal that wakes it (`None`: a leader about to begin, which
    /// looks for the lock before it attempts).
    fn pass_to(&self, kind: &str) -> Option<(Taker, Option<Arc<Signal>>)> {
        if self.passed.is_some() {
            return None;
        }
        match &self.listener {
            Listening::Now(listener) if self.leader && listener.taker.kind == kind => {
                Some((listener.taker, Some(Arc::clone(&listener.signal))))
            }
            // Some thread in the gate leads, or is about to: one whose deadline passed behind
            // the last leader leaves without leading.
            Listening::Soon if self.inside > self.leaving => self
                .taker
                .filter(|taker| taker.kind == kind)
                .map(|taker| (taker, None)),
            _ => None,
        }
    }
}

#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    /// Wakes the thread that leads next.
    turn: Condvar,
    /// Wakes the threads that wait for the releases that keep their client's place.
    kept: Condvar,
}

/// How long after its client gave a lock up to other clients a thread that comes for it
/// waits behind them rather than taking it while it stands free.
const YIELD_FOR: Duration = Duration::from_secs(1);

/// What this client did last with a lock whose holds it may pass on.
#[derive(Clone, Copy)]
enum LastHold {
    /// A thread of it holds the lock; `placed`: the client may have a place among the lock's
    /// waiting clients in Redis (a thread of it attempted after a wait, entered the gate or
    /// gave up, since the run of holds began); `given`: the highest score of a place made by
    /// the attempts of a thread that gave up meanwhile (see [`GatePass::gives_up`]).
    Now { placed: bool, given: u64 },
    /// It released the lock to other waiting clients at the end of a run of passes, then.
    Yielded(Instant),
}

/// What the release in Redis of a hold that may be passed on does with its client's place
/// among the lock's waiting clients.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Place {
    /// The client never took one since its run of holds began (every hold of it was won at a
    /// first attempt, and no other thread of it came for the lock): the plain release.
    Never,
    /// It may have one from before this hold, or one its own take made for threads that
    /// waited then, which nobody of it waits for any more: given up, and one with a score up
    /// to the one given (see [`GatePass::gives_up`]).
    GiveUp { given: u64 },
    /// More of its threads wait: it waits behind every client waiting now.
    Keep,
}

/// A release on its way that keeps its client's place among the lock's waiting clients (it
/// was decided while threads of the client waited in the gate), until the release has run in
/// Redis or its fate is left to the renewal thread: a thread of the client that gives up
/// meanwhile waits for it before it withdraws its client, so that the release cannot put
/// the client back after the withdrawal (`tests/wait_model.rs`, the place kept for nobody).
pub(crate) struct Keeping(Arc<Gate>);

impl Keeping {
    /// One more count of the same release, for what may end it besides this one (the
    /// handler of a reply read later, and the release sent after a write that failed).
    pub(crate) fn also(&self) -> Keeping {
        self.0.state.lock().keeping += 1;
        Keeping(Arc::clone(&self.0))
    }
}

impl Drop for Keeping {
    fn drop(&mut self) {
        let mut state = self.0.state.lock();
        state.keeping -= 1;
        if state.keeping == 0 {
            self.0.kept.notify_all();
        }
    }
}

/// What a thread found when it entered a gate.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Entered {
    /// Nothing of note: it attempts.
    Plainly,
    /// Another thread of this client held the lock: it passes the lock on, or its release
    /// keeps this client among the waiting; no attempt is needed first.
    SiblingHeld,
    /// This client just gave the lock up to other waiting clients: the first attempt waits
    /// behind them rather than take the lock while it stands free.
    Yielded,
}

/// The gates of one client, one per lock that has waiters; and the locks whose holds it may
/// pass on that a thread of it holds or just gave up. Kept in shards by the lock's key, each
/// under one mutex (a gate's own state is locked after it), so that threads of one client
/// taking different locks do not queue for one mutex: every acquire and release of a lock
/// that may be passed on looks here.
pub(crate) struct Gates {
    shards: Box<[Mutex<Shard>]>,
}

/// The gates, and the locks held or just given up, of the keys of one shard.
#[derive(Default)]
struct Shard {
    gates: FastHashMap<Arc<str>, Arc<Gate>>,
    held: FastHashMap<Arc<str>, LastHold>,
    /// Threads that attempt outside the gate, or whose first attempt failed and which have
    /// not entered the gate yet (see [`Coming`]), by key.
    coming: FastHashMap<Arc<str>, usize>,
    /// Keys whose place among the waiting a thread that gave up left to siblings on their way
    /// to the gate (see [`GatePass::gives_up`]): the next hold is placed, and gives up places
    /// up to this score on release.
    handed: FastHashMap<Arc<str>, u64>,
    /// How many holds of this shard's locks began or gave places up (see [`HoldsBegun`]).
    holds_begun: u64,
}

impl Shard {
    /// A thread counted as coming for `key` entered its gate or went away.
    fn arrived(&mut self, key: &str) {
        if let Some(n) = self.coming.get_mut(key) {
            *n -= 1;
            if *n == 0 {
                self.coming.remove(key);
            }
        }
    }
}

/// A thread that attempts outside the gate first, until it enters the gate or goes away: it
/// counts as waiting for a thread of its client that gives up (see
/// [`GatePass::others_wait`]), whose withdrawal would otherwise take away the place its
/// attempt found or made (`tests/wait_model.rs`, the withdrawn place).
pub(crate) struct Coming<'a> {
    gates: &'a Gates,
    /// Its key while it still counts.
    key: Option<Arc<str>>,
    /// The holds of its shard's locks begun before its attempt.
    pub(crate) begun: HoldsBegun,
    /// No other thread of the client came for the lock when this one did.
    pub(crate) alone: bool,
}

impl Drop for Coming<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key.take() {
            self.gates.shard(&key).lock().arrived(&key);
        }
    }
}

/// How many holds of the locks of a shard had begun, or ended giving places up, when a
/// thread attempted outside its gate. A hold of its client that begins after that attempt
/// may, on release, give up the place the attempt made (no thread of the client was in the
/// gate yet), and so may a release after it that gives places up: a thread that then leads
/// the gate attempts again rather than count on that place (`tests/wait_model.rs`, the early
/// place and the place of a waiter that gave up). Holds of other locks of the shard only cost
/// such a thread an attempt.
#[derive(Clone, Copy, PartialEq, Eq, Debug, Default)]
pub(crate) struct HoldsBegun(u64);

/// How many shards a client's gates are kept in.
const SHARDS: usize = 16;

impl Default for Gates {
    fn default() -> Self {
        Gates {
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }
}

/// A thread's place in a gate; dropping it leaves the gate (and hands leadership on).
pub(crate) struct GatePass<'a> {
    gates: &'a Gates,
    key: Arc<str>,
    gate: Arc<Gate>,
    leader: bool,
    /// Its deadline passed behind a leader: it leaves without leading.
    leaving: bool,
    /// Another thread led before this one: the lock may have changed hands meanwhile.
    pub(crate) waited: bool,
    /// What this thread found when it entered.
    pub(crate) entered: Entered,
    /// The holds of its shard's locks begun when it entered.
    begun: HoldsBegun,
    /// A lock passed to the leader that this thread took as it entered (see [`Gates::lead`]).
    barged: Option<Box<Passed>>,
}

impl GatePass<'_> {
    /// The lock this thread took as it entered the gate, passed to a leader that had not
    /// taken it yet: it holds the lock, and leaves the gate.
    pub(crate) fn take_barged(&mut self) -> Option<Passed> {
        self.barged.take().map(|mut passed| {
            passed.give_back = None;
            *passed
        })
    }

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

    /// Lets a holder of this client pass the lock to this leader, which `signal` wakes and
    /// which takes it with `taker`; `None`: it takes no pass from now on (it cannot be woken
    /// for one, or its deadline passed).
    pub(crate) fn listen(&self, signal: Option<Arc<Signal>>, taker: Taker) {
        self.gate.state.lock().listener = match signal {
            Some(signal) => Listening::Now(Listener { signal, taker }),
            None => Listening::Not,
        };
    }

    /// Stops this leader from being passed the lock (a thread that cannot be woken for a
    /// pass while it waits in Redis), unless a lock was passed to it already: whether it
    /// stopped. [`listen`](Self::listen) lets it be passed the lock again.
    pub(crate) fn stop_listening(&self) -> bool {
        let mut state = self.gate.state.lock();
        if state.passed.is_some() {
            return false;
        }
        state.listener = Listening::Not;
        true
    }

    /// Whether a thread of this client holds the lock now, with a hold it may pass on.
    pub(crate) fn sibling_holds(&self) -> bool {
        let shard = self.gates.shard(&self.key).lock();
        matches!(shard.held.get(&self.key), Some(LastHold::Now { .. }))
    }

    /// Whether a hold of a lock of this shard began between `mark` and this thread's entry.
    pub(crate) fn held_since(&self, mark: HoldsBegun) -> bool {
        self.begun != mark
    }

    /// For a thread that gives up while no other thread of its client waits (see
    /// [`others_wait`](Self::others_wait)): waits until the releases on their way that keep
    /// its client's place have run (see [`Keeping`]), reading with `settle` the replies
    /// nobody waited for (a release written by a guard's drop ends when its reply is read),
    /// for at most `within`.
    pub(crate) fn await_kept_places(&self, within: Duration, settle: impl Fn()) {
        let until = Instant::now() + within;
        while self.gate.state.lock().keeping > 0 && Instant::now() < until {
            settle();
            let mut state = self.gate.state.lock();
            if state.keeping > 0 {
                let slice = Instant::now() + Duration::from_millis(5);
                self.gate.kept.wait_until(&mut state, slice.min(until));
            }
        }
    }

    /// The lock passed to this leader, if one was.
    pub(crate) fn take_passed(&self) -> Option<Passed> {
        self.gate.state.lock().passed.take().map(Passed::take)
    }

    /// Whether, besides this thread, threads of this client wait for the lock, come for it
    /// (see [`Coming`]) or hold it with a hold they may pass on. Asked by a thread that gives
    /// up, while it is still in the gate: a thread that comes after this answer goes through
    /// the gate, behind the withdrawal. A client that just gave the lock up to other clients
    /// (a yield) waits no more for that: a release may have named it since.
    pub(crate) fn others_wait(&self) -> bool {
        Self::others_in(&self.gates.shard(&self.key).lock(), self)
    }

    /// Whether a thread of this client comes for the lock, attempting outside the gate (see
    /// [`Coming`]): it may be waiting for its client's note with a pop behind its attempt.
    pub(crate) fn others_coming(&self) -> bool {
        self.gates
            .shard(&self.key)
            .lock()
            .coming
            .contains_key(&self.key)
    }

    fn others_in(shard: &Shard, pass: &GatePass<'_>) -> bool {
        matches!(shard.held.get(&pass.key), Some(LastHold::Now { .. }))
            || shard.coming.contains_key(&pass.key)
            || pass.gate.state.lock().inside > 1
    }

    /// This thread gives up its wait, `own_place` the highest score of a place its attempts
    /// made while a sibling held (0: none): whether other threads wait (see
    /// [`others_wait`](Self::others_wait)), else it withdraws its client. The place it leaves
    /// is given up by a hold of a sibling that lasts (its release gives up places up to
    /// `own_place` too), or by the next hold, when it leaves it to siblings on their way.
    pub(crate) fn gives_up(&self, own_place: u64) -> bool {
        let mut shard = self.gates.shard(&self.key).lock();
        let others = Self::others_in(&shard, self);
        match shard.held.get_mut(&self.key) {
            Some(LastHold::Now { placed, given }) => {
                *placed = true;
                *given = (*given).max(own_place);
            }
            _ if others => {
                // A lock a release handed to the client, which no thread of it holds yet, is
                // held by the client to its attempts: the place they made meanwhile is given up
                // by the next hold (the one that takes that lock, whose token is below it).
                let given = shard.handed.entry(Arc::clone(&self.key)).or_insert(0);
                *given = (*given).max(own_place);
            }
            _ => {}
        }
        others
    }
}

impl Gates {
    /// The shard of `key`.
    fn shard(&self, key: &str) -> &Mutex<Shard> {
        let mut hasher = FxHasher::default();
        hasher.write(key.as_bytes());
        // The high bits: the Fx hash mixes them best.
        &self.shards[(hasher.finish() >> 56) as usize % SHARDS]
    }

    /// When a leader of `key`'s gate, waiting for a lock of `kind`, can be passed the lock
    /// now (it listens, or is about to lead: see [`Listening`]): how it takes it.
    pub(crate) fn passable(&self, key: &str, kind: &str) -> Option<Taker> {
        let shard = self.shard(key).lock();
        let state = shard.gates.get(key)?.state.lock();
        state.pass_to(kind).map(|(taker, _)| taker)
    }

    /// A thread of this client took `key` with a hold it may pass on: threads that wait for
    /// it from now on need not attempt first. `placed`: it took it after a wait (its attempts
    /// may have given the client a place among the lock's waiting clients); a hold passed on
    /// within the client keeps what the run knew.
    pub(crate) fn hold_begins(&self, key: &Arc<str>, placed: bool) {
        let mut shard = self.shard(key).lock();
        shard.holds_begun += 1;
        let handed = match shard.handed.is_empty() {
            true => None,
            false => shard.handed.remove(&**key),
        };
        let held = &mut shard.held;
        let (placed, given) = match held.get(&**key) {
            Some(&LastHold::Now { placed: was, given }) => (placed || was, given),
            _ => (placed, 0),
        };
        let (placed, given) = match handed {
            Some(more) => (true, given.max(more)),
            None => (placed, given),
        };
        held.insert(Arc::clone(key), LastHold::Now { placed, given });
    }

    /// The hold of `key` ends in Redis (released, kept until it expires, lost): returns what
    /// its release does with the client's place among the lock's waiting clients. Threads of
    /// this client that wait for it count on that release to keep the place; the release
    /// holds the [`Keeping`] until it has run. `yielded`: the release gives the lock up to
    /// other waiting clients (a run of passes reached its bound), and a thread that comes for
    /// it soon waits behind them; else a thread that enters later attempts as usual.
    pub(crate) fn hold_ends(&self, key: &str, yielded: bool) -> (Place, Option<Keeping>) {
        let mut shard = self.shard(key).lock();
        let keeping = shard.gates.get(key).and_then(|g| {
            let mut state = g.state.lock();
            (state.inside > 0).then(|| {
                state.keeping += 1;
                Keeping(Arc::clone(g))
            })
        });
        let held = &mut shard.held;
        let (placed, given) = match held.get(key) {
            Some(&LastHold::Now { placed, given }) => (placed, given),
            _ => (true, 0),
        };
        match (yielded, held.get_mut(key)) {
            (true, Some(state)) => *state = LastHold::Yielded(Instant::now()),
            _ => {
                held.remove(key);
            }
        }
        let place = match keeping.is_some() {
            true => Place::Keep,
            false if placed => {
                // A thread on its way to the gate may have found the place this release
                // gives up: it attempts again as the gate's leader.
                shard.holds_begun += 1;
                Place::GiveUp { given }
            }
            false => Place::Never,
        };
        (place, keeping)
    }

    /// Hands `passed` (a lock of `kind`) to the leader of `key`'s gate and wakes it, or
    /// leaves it to the leader about to begin; gives it back when there is no leader to take
    /// it any more (it is dropped, which releases it in Redis).
    pub(crate) fn pass_on(&self, key: &str, kind: &str, passed: Passed) -> Result<(), Box<Passed>> {
        let shard = self.shard(key).lock();
        let Some(gate) = shard.gates.get(key) else {
            return Err(Box::new(passed));
        };
        let mut state = gate.state.lock();
        let Some((_, signal)) = state.pass_to(kind) else {
            return Err(Box::new(passed));
        };
        state.passed = Some(passed);
        drop(state);
        drop(shard);
        if let Some(signal) = signal {
            signal.poke();
        }
        Ok(())
    }

    /// Whether other threads of this client wait for the lock now, hold it with a hold they
    /// may pass on, or just gave it up to other clients: a thread that comes for it then
    /// goes through the gate.
    #[cfg(test)]
    fn has_waiters(&self, key: &str) -> bool {
        Self::waiters_in(&self.shard(key).lock(), key)
    }

    fn waiters_in(shard: &Shard, key: &str) -> bool {
        shard.held.contains_key(key)
            || shard
                .gates
                .get(key)
                .is_some_and(|g| g.state.lock().inside > 0)
    }

    /// For a thread that comes for `key` and may wait: `None` when it goes through the gate
    /// (other threads of this client wait for the lock, hold it or just gave it up); else it
    /// attempts first, and counts as coming until it enters the gate (to which it hands the
    /// [`Coming`]) or goes away.
    pub(crate) fn attempt_first(&self, key: &Arc<str>) -> Option<Coming<'_>> {
        let mut shard = self.shard(key).lock();
        if Self::waiters_in(&shard, key) {
            return None;
        }
        let coming = shard.coming.entry(Arc::clone(key)).or_insert(0);
        *coming += 1;
        let alone = *coming == 1;
        Some(Coming {
            gates: self,
            key: Some(Arc::clone(key)),
            begun: HoldsBegun(shard.holds_begun),
            alone,
        })
    }

    /// What a thread entering `key`'s gate finds (`held`: its shard's, locked); forgets a
    /// yield that is over.
    fn entered(held: &mut FastHashMap<Arc<str>, LastHold>, key: &str) -> Entered {
        match held.get_mut(key) {
            Some(LastHold::Now { placed, .. }) => {
                // This thread may attempt (and take a place) before the hold ends.
                *placed = true;
                Entered::SiblingHeld
            }
            Some(LastHold::Yielded(at)) if at.elapsed() < YIELD_FOR => Entered::Yielded,
            Some(LastHold::Yielded(_)) => {
                held.remove(key);
                Entered::Plainly
            }
            None => Entered::Plainly,
        }
    }

    /// Enters the gate of `key` (no longer `coming`: both at once) and waits to become its
    /// leader, until `deadline`. `Err` when the deadline passed first: the thread is in the
    /// gate until that pass drops, as a follower. `taker`: how it takes a lock passed to it
    /// (`None`: it takes none).
    ///
    /// A lock passed to the leader that the leader has not taken yet (it is waking up) goes
    /// to this thread instead, when it takes it alike and fewer than [`BARGES`] passes in a
    /// row went so: it returns at once, holding that lock in its pass
    /// ([`GatePass::take_barged`]). The leader, woken for nothing, waits on while the lock
    /// stays in its client (`tests/wait_model.rs`, `Fix::Barging`).
    pub(crate) fn lead(
        &self,
        key: &Arc<str>,
        (deadline, taker): (Option<Instant>, Option<Taker>),
        coming: Option<Coming<'_>>,
    ) -> Result<GatePass<'_>, GatePass<'_>> {
        let (gate, entered, begun) = {
            let mut shard = self.shard(key).lock();
            let gate = Arc::clone(shard.gates.entry(Arc::clone(key)).or_default());
            gate.state.lock().enter(taker);
            if let Some(key) = coming.and_then(|mut c| c.key.take()) {
                shard.arrived(&key);
            }
            let begun = HoldsBegun(shard.holds_begun);
            (gate, Gates::entered(&mut shard.held, key), begun)
        };
        let mut pass = GatePass {
            gates: self,
            key: Arc::clone(key),
            gate,
            leader: false,
            leaving: false,
            waited: false,
            entered,
            begun,
            barged: None,
        };
        let mut state = pass.gate.state.lock();
        if state.taken() && taker.is_some() {
            let pending = state.passed.as_ref();
            if pending.is_some_and(|p| Some(p.taker) == taker && p.cohort.may_barge()) {
                pass.barged = state.passed.take().map(|p| Box::new(p.barge()));
                drop(state);
                return Ok(pass);
            }
        }
        if state.taken() {
            pass.waited = true;
            state.queued += 1;
            // Woken as the next leader (or at its deadline while nobody leads): it leads.
            loop {
                let timed_out = match deadline {
                    Some(d) => pass.gate.turn.wait_until(&mut state, d).timed_out(),
                    None => {
                        pass.gate.turn.wait(&mut state);
                        false
                    }
                };
                if !state.leader {
                    break;
                }
                if timed_out {
                    state.queued -= 1;
                    state.leaving += 1;
                    drop(state);
                    pass.leaving = true;
                    return Err(pass); // it leaves the gate when dropped
                }
            }
            state.queued -= 1;
        }
        state.leader = true;
        drop(state);
        pass.leader = true;
        Ok(pass)
    }
}

impl Gates {
    /// Becomes the leader of `key`'s gate if it has none, without waiting.
    pub(crate) fn try_lead(&self, key: &Arc<str>) -> Option<GatePass<'_>> {
        let mut shard = self.shard(key).lock();
        let gate = Arc::clone(shard.gates.entry(Arc::clone(key)).or_default());
        let begun = HoldsBegun(shard.holds_begun);
        let mut state = gate.state.lock();
        if state.taken() {
            return None;
        }
        state.leader = true;
        state.enter(None);
        drop(state);
        drop(shard);
        Some(GatePass {
            gates: self,
            key: Arc::clone(key),
            gate,
            leader: true,
            leaving: false,
            waited: false,
            entered: Entered::Plainly,
            begun,
            barged: None,
        })
    }
}

impl Drop for GatePass<'_> {
    fn drop(&mut self) {
        let mut state = self.gate.state.lock();
        state.inside -= 1;
        if self.leaving {
            state.leaving -= 1;
        }
        if self.leader {
            state.leader = false;
            // The thread that waited longest to lead leads next.
            state.listener = Listening::Soon;
            if state.queued > 0 {
                self.gate.turn.notify_one();
            }
        }
        let empty = state.inside == 0;
        // The baton's subscription is dropped outside the gate's lock, and so is a lock
        // passed to nobody (which releases it in Redis); a lock passed to a leader that left
        // goes to the next.
        let (baton, passed) = match empty {
            true => (state.baton.take(), state.passed.take()),
            false => (None, None),
        };
        drop(state);
        drop(baton);
        drop(passed);
        if empty {
            let gates = &mut self.gates.shard(&self.key).lock().gates;
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
                    let pass = gates.lead(&key, (None, None), None).ok().unwrap();
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
        assert!(gates.shards.iter().all(|s| s.lock().gates.is_empty()));
    }

    #[test]
    fn a_follower_gives_up_at_its_deadline() {
        let gates = Gates::default();
        let key: Arc<str> = Arc::from("k");
        let leader = gates.lead(&key, (None, None), None).ok().unwrap();
        assert!(gates.has_waiters("k"));
        let deadline = Instant::now() + Duration::from_millis(20);
        let follower = gates
            .lead(&key, (Some(deadline), None), None)
            .err()
            .unwrap();
        assert!(follower.others_wait(), "the leader waits");
        drop(follower);
        drop(leader);
        assert!(gates.lead(&key, (Some(Instant::now()), None), None).is_ok());
        assert!(!gates.has_waiters("k"));
    }

    /// The withdrawn place (`tests/wait_model.rs`): a thread that gives up counts a sibling
    /// whose first attempt is on its way, and one that comes while it is in the gate goes
    /// through the gate.
    #[test]
    fn a_thread_that_gives_up_counts_a_sibling_on_its_way_to_the_gate() {
        let gates = Gates::default();
        let key: Arc<str> = Arc::from("k");
        let coming = gates.attempt_first(&key).expect("nobody waits");
        let leader = gates.lead(&key, (None, None), None).ok().unwrap();
        assert!(leader.others_wait(), "the sibling's attempt is on its way");
        assert!(
            gates.attempt_first(&key).is_none(),
            "a leader is in the gate: through the gate"
        );
        let sibling = gates.lead(&key, (Some(Instant::now()), None), Some(coming));
        let sibling = sibling.err().expect("the leader leads still");
        assert!(leader.others_wait(), "the sibling is in the gate");
        drop(sibling);
        assert!(!leader.others_wait());
        drop(leader);
        let coming = gates.attempt_first(&key).unwrap();
        drop(coming);
        let leader = gates.lead(&key, (None, None), None).ok().unwrap();
        assert!(
            !leader.others_wait(),
            "a thread that went away counts no more"
        );
    }

    /// The place kept for nobody (`tests/wait_model.rs`): a thread that gives up, its
    /// client's last waiter, waits for a release on its way that keeps its client's place,
    /// reading unread replies meanwhile.
    #[test]
    fn a_thread_that_gives_up_waits_for_a_release_that_keeps_its_place() {
        let gates = Gates::default();
        let key: Arc<str> = Arc::from("k");
        gates.hold_begins(&key, false);
        let leader = gates.lead(&key, (None, None), None).ok().unwrap();
        let (place, keeping) = gates.hold_ends(&key, false);
        assert_eq!(place, Place::Keep, "a thread waits in the gate");
        let until_read = keeping.as_ref().map(Keeping::also);
        drop(keeping);
        assert!(!leader.others_wait());
        let settled = AtomicUsize::new(0);
        std::thread::scope(|s| {
            s.spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                drop(until_read);
            });
            leader.await_kept_places(Duration::from_secs(600), || {
                settled.fetch_add(1, Ordering::SeqCst);
            });
            assert_eq!(
                leader.gate.state.lock().keeping,
                0,
                "it waited for the release"
            );
        });
        assert!(settled.load(Ordering::SeqCst) >= 1);
        // Nothing on its way: it does not wait.
        leader.await_kept_places(Duration::from_secs(600), || panic!("settled"));
        drop(leader);
        let (place, keeping) = gates.hold_ends(&key, false);
        assert!(place != Place::Keep && keeping.is_none(), "nobody waits");
    }

    /// The place of a waiter that gave up (`tests/wait_model.rs`): a sibling's hold that
    /// lasts takes it over (its release gives it up), else the next hold does.
    #[test]
    fn the_place_of_a_thread_that_gives_up_goes_to_a_hold_of_its_client() {
        let gates = Gates::default();
        let key: Arc<str> = Arc::from("k");
        // A sibling holds, taken at a first attempt (no place of the client known).
        gates.hold_begins(&key, false);
        let waiter = gates.lead(&key, (None, None), None).ok().unwrap();
        assert!(waiter.gives_up(7), "a sibling holds");
        drop(waiter);
        let (place, keeping) = gates.hold_ends(&key, false);
        assert_eq!(place, Place::GiveUp { given: 7 });
        assert!(keeping.is_none());

        // Nobody holds; a sibling's first attempt is on its way.
        let coming = gates.attempt_first(&key).unwrap();
        let waiter = gates.lead(&key, (None, None), None).ok().unwrap();
        let mark = coming.begun;
        assert!(waiter.gives_up(0), "a sibling is on its way");
        drop(waiter);
        drop(coming);
        gates.hold_begins(&key, false);
        let (place, _) = gates.hold_ends(&key, false);
        assert_eq!(
            place,
            Place::GiveUp { given: 0 },
            "the next hold gives it up"
        );
        // That release may undo a first attempt made before it.
        let pass = gates.lead(&key, (None, None), None).ok().unwrap();
        assert!(pass.held_since(mark));
    }

    /// The early place (`tests/wait_model.rs`): a thread that attempted outside the gate
    /// learns on entering it whether a hold of its client began in between, whose release
    /// may have given up the place its attempt made.
    #[test]
    fn a_leader_knows_whether_a_sibling_held_since_its_first_attempt() {
        let gates = Gates::default();
        let key: Arc<str> = Arc::from("k");
        let coming = gates
            .attempt_first(&key)
            .expect("nobody waits: it attempts first");
        let mark = coming.begun;
        let pass = gates.lead(&key, (None, None), Some(coming)).ok().unwrap();
        assert!(!pass.held_since(mark));
        drop(pass);

        let mark = gates.attempt_first(&key).unwrap().begun;
        // A sibling's hold begins (and ends) before the thread enters the gate.
        gates.hold_begins(&key, true);
        assert!(
            gates.attempt_first(&key).is_none(),
            "a sibling holds: through the gate"
        );
        let _ = gates.hold_ends(&key, false);
        let pass = gates.lead(&key, (None, None), None).ok().unwrap();
        assert!(pass.held_since(mark));
    }

    const TAKER: Taker = Taker {
        lease: Duration::from_secs(30),
        fixed: false,
        kind: "mutex",
    };

    fn passed(given_back: &Arc<AtomicUsize>) -> Passed {
        let given_back = Arc::clone(given_back);
        Passed::new(
            (Arc::from("token"), 7),
            (Instant::now() + Duration::from_secs(30), Cohort::start()),
            (
                TAKER,
                Box::new(move || {
                    given_back.fetch_add(1, Ordering::SeqCst);
                }),
            ),
        )
    }

    /// The leader that took a pass has left, and the next has not begun to listen: a holder
    /// passes the lock to it all the same, which takes it before it attempts; and the thread
    /// that waited to lead leads, not one that enters after the last leader left.
    #[test]
    fn a_lock_is_passed_to_the_leader_about_to_begin() {
        let gates = Arc::new(Gates::default());
        let key: Arc<str> = Arc::from("k");
        let leader = gates.lead(&key, (None, Some(TAKER)), None).ok().unwrap();
        assert!(
            gates.passable(&key, "mutex").is_some(),
            "a leader about to listen"
        );
        leader.listen(None, TAKER);
        assert!(gates.passable(&key, "mutex").is_none(), "it takes no pass");
        let (go, wait_for_go) = std::sync::mpsc::channel::<()>();
        let waiting = {
            let (gates, key) = (Arc::clone(&gates), Arc::clone(&key));
            std::thread::spawn(move || {
                let next = gates.lead(&key, (None, Some(TAKER)), None).ok().unwrap();
                // It leads, and has not begun to listen.
                wait_for_go.recv().unwrap();
                let taken = next.take_passed().map(|p| p.fencing_token);
                drop(next);
                taken
            })
        };
        assert!(eventually(|| gates.shard(&key).lock().gates[&key]
            .state
            .lock()
            .queued
            == 1));
        // The leader leaves (it took a pass, say): the one that waited leads next.
        drop(leader);
        assert!(
            gates.try_lead(&key).is_none(),
            "the thread that waited leads, not one that comes now"
        );
        assert_eq!(gates.passable(&key, "mutex"), Some(TAKER));
        assert!(
            gates.passable(&key, "fair").is_none(),
            "another kind of lock"
        );
        let given_back = Arc::new(AtomicUsize::new(0));
        assert!(gates.pass_on(&key, "mutex", passed(&given_back)).is_ok());
        assert!(gates.passable(&key, "mutex").is_none(), "passed already");
        go.send(()).unwrap();
        assert_eq!(waiting.join().unwrap(), Some(7));
        assert_eq!(
            given_back.load(Ordering::SeqCst),
            0,
            "taken, not given back"
        );
    }

    /// Threads that take a passed lock differently (another lease) are passed none before
    /// their leader listens, and a thread whose deadline passed behind a leader is passed
    /// none.
    #[test]
    fn no_lock_is_passed_to_a_gate_of_mixed_takers_or_of_leaving_threads() {
        let gates = Gates::default();
        let key: Arc<str> = Arc::from("k");
        let leader = gates.lead(&key, (None, Some(TAKER)), None).ok().unwrap();
        let other = Taker {
            lease: Duration::from_secs(5),
            ..TAKER
        };
        let follower = gates.lead(&key, (Some(Instant::now()), Some(other)), None);
        let follower = follower.err().expect("the leader leads still");
        assert!(
            gates.passable(&key, "mutex").is_none(),
            "two ways to take it"
        );
        drop(leader);
        assert!(
            gates.passable(&key, "mutex").is_none(),
            "its only thread is leaving"
        );
        let given_back = Arc::new(AtomicUsize::new(0));
        let refused = gates.pass_on(&key, "mutex", passed(&given_back));
        drop(refused.expect_err("nobody to take it"));
        assert_eq!(given_back.load(Ordering::SeqCst), 1, "released instead");
        drop(follower);
    }

    /// A thread that comes while a pass waits for the leader takes it, at most [`BARGES`]
    /// times in a row; then the pass waits for the leader, which resets the count. A thread
    /// that would take the lock otherwise (another lease) never takes it.
    #[test]
    fn a_thread_that_comes_takes_a_waiting_pass_a_bounded_number_of_times_in_a_row() {
        let gates = Gates::default();
        let key: Arc<str> = Arc::from("k");
        let leader = gates.lead(&key, (None, Some(TAKER)), None).ok().unwrap();
        leader.listen(Some(Arc::new(Signal::default())), TAKER);
        let given_back = Arc::new(AtomicUsize::new(0));
        let mut pass = passed(&given_back);
        for barged in 1..=BARGES {
            assert!(gates.pass_on(&key, "mutex", pass).is_ok());
            let other = Taker {
                lease: Duration::from_secs(5),
                ..TAKER
            };
            let unlike = gates.lead(&key, (Some(Instant::now()), Some(other)), None);
            assert!(unlike.is_err(), "another lease: it waits behind the leader");
            drop(unlike);
            let mut came = gates.lead(&key, (None, Some(TAKER)), None).ok().unwrap();
            let taken = came.take_barged().expect("the waiting pass");
            assert_eq!(taken.cohort.barged, barged);
            drop(came);
            pass = Passed::new(
                (Arc::clone(&taken.token), taken.fencing_token + 1),
                (taken.expires_at, taken.cohort),
                (TAKER, Box::new(|| {})),
            );
        }
        assert!(gates.pass_on(&key, "mutex", pass).is_ok());
        let came = gates.lead(&key, (Some(Instant::now()), Some(TAKER)), None);
        let came = came.err().expect("the bound: it waits behind the leader");
        drop(came);
        let taken = leader
            .take_passed()
            .expect("the pass waited for the leader");
        assert_eq!(
            taken.cohort.barged, 0,
            "the leader took it: the count begins anew"
        );
        assert_eq!(given_back.load(Ordering::SeqCst), 0, "nothing given back");
        drop(leader);
    }

    fn eventually(mut cond: impl FnMut() -> bool) -> bool {
        let until = Instant::now() + Duration::from_secs(60);
        while Instant::now() < until {
            if cond() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }
}
