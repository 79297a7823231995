//! The model of the `Mutex`'s hand-off between clients (see `tests/wait_model.rs`, which
//! checks it, and `src/primitives/tests/model_conformance.rs`, which holds the scripts to it).
//!
//! Time appears only as the short waits that end by themselves: the 5 ms a client waits after
//! it gave the lock up and finds it standing free (`after`), the 20 ms an owed turn is held for
//! its client, the end of a yield (1 s); and, with faults, the claim of a lock handed to a
//! client that none of its threads took in time (`Fix::HandedOver`). A thread that waits for anything else waits for a
//! wake-up: a state in which it can do nothing else is one that only a re-check period would
//! end, and the properties forbid it.

use std::collections::{BTreeMap, BTreeSet};

use stateright::{Model, Property};

/// A token: the client, the thread and which of its acquisitions.
pub(crate) type Token = (u8, u8, u8);

/// The score of a client owed the next turn (`OWED` in `mutex/waiters.lua`).
pub(crate) const OWED: i64 = -1;

/// The thread of a token that a release wrote for a client it handed the lock to (from
/// `Fix::HandedOver`): `(client, CLAIM, fencing token)`, which that client's leader takes
/// without an attempt when the announcement's note reaches it.
pub(crate) const CLAIM: u8 = u8::MAX;

/// What a thread found when it entered its client's gate (`waiting::Entered`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Entered {
    Plainly,
    /// A sibling held the lock: no attempt first.
    SiblingHeld,
    /// Its client just gave the lock up to other clients: its first attempt waits behind
    /// them.
    Yielded,
}

/// What a leader's attempt asks (`waiting::Turn`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Ask {
    /// Others wait in the gate.
    pub(crate) more: bool,
    /// Its client just gave the lock up: behind the others, even when the lock stands free.
    pub(crate) after: bool,
    /// It has waited long: named and beaten to the lock, its client is owed the next turn.
    pub(crate) overdue: bool,
}

impl Ask {
    /// What `mutex/acquire.lua` is told (`mutex::acquire_call`).
    pub(crate) fn waits(self) -> &'static str {
        match (self.more, self.after, self.overdue) {
            (_, true, _) => "after",
            (false, false, false) => "wait",
            (true, false, false) => "more",
            (false, false, true) => "wait overdue",
            (true, false, true) => "more overdue",
        }
    }
}

/// What a thread is doing.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Thread {
    /// Between acquisitions.
    Idle,
    /// Its first attempt, outside the gate, is on its way to Redis (`seen`: wake-ups before
    /// it, on a subscription that was live already; `begun`: the client's holds begun
    /// before it), with a pop of its client's notes behind it (`pops`; from
    /// `Fix::PoppedNote`).
    First { seen: u8, begun: u8, pops: bool },
    /// Its first attempt found the lock held and placed its client; the pop behind it waits
    /// for the client's note (`Redis::popping`) or has one on its way (`Redis::popped`),
    /// before the thread enters the gate (from `Fix::PoppedNote`).
    Popping { seen: u8, short: bool, begun: u8 },
    /// Its first attempt found the lock held (and put its client among the waiting): it
    /// enters the gate next, with what the attempt told (a short wait or not).
    FirstFailed { seen: u8, short: bool, begun: u8 },
    /// In the gate behind the leader.
    Follower { entered: Entered },
    /// The gate's leader, about to take the baton or a subscription and decide whether to
    /// attempt.
    Deciding {
        entered: Entered,
        /// The first attempt's outcome, when it leads at once with a subscription that was
        /// live before that attempt: it need not attempt again.
        early: Option<(u8, bool)>,
    },
    /// The leader's attempt is on its way to Redis (`seen`: wake-ups before it).
    Attempting { seen: u8, ask: Ask },
    /// The leader waits for a wake-up after `seen`, or (`short`) for a few milliseconds.
    Sleeping { seen: u8, short: bool },
    /// Holds the lock (whose key holds `token`) with this fencing token.
    Holding { token: Token, fence: u32 },
    /// Decided to pass the lock to its gate's leader; the pass is on its way to Redis.
    Passing { token: Token, fence: u32 },
    /// Gave up at its deadline, its client's last waiter: `mutex/withdraw.lua` is on its way
    /// (from `Fix::WithdrawnPlace`, while the thread is still in its gate).
    Withdrawing { token: Token },
    /// Gave up at its deadline, its client's last waiter, while a release that keeps its
    /// client's place is on its way: it waits in its gate, no longer listening for a pass,
    /// until that release has run (`Fix::KeptPlace`).
    GivingUp { token: Token },
    /// Decided to release in Redis, with what the release does with its client's place.
    Releasing {
        token: Token,
        fence: u32,
        place: Place,
    },
}

/// What a release does with its client's place among the waiting (see `waiting::Place`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Place {
    Never,
    GiveUp,
    Keep,
}

/// One client's gate for the lock.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Gate {
    pub(crate) leader: Option<u8>,
    pub(crate) inside: u8,
    /// The wake-ups the baton's holder had seen before its winning attempt.
    pub(crate) baton: Option<u8>,
    /// A lock passed to the leader: its token and the new holder's fencing token.
    pub(crate) passed: Option<(Token, u32)>,
    /// A thread of the client holds the lock (`Some(placed)`), as `Gates::held` says.
    pub(crate) held: Option<bool>,
    /// The client gave the lock up to other clients a moment ago (`LastHold::Yielded`).
    pub(crate) yielded: bool,
    /// How many holds of the client began (`Gates::hold_begins`).
    pub(crate) begun: u8,
    /// Threads whose first attempt, outside the gate, is on its way or failed, and which have
    /// not entered the gate yet (`Gates::coming`; counted from `Fix::WithdrawnPlace`).
    pub(crate) coming: u8,
    /// Releases on their way that keep the client's place among the waiting (for threads in
    /// the gate when the release was decided; counted from `Fix::KeptPlace`).
    pub(crate) keeping: u8,
    /// The highest score of a place made by the attempts of a thread that gave up while a
    /// sibling held, for the hold's release to give up (`LastHold::Now::given`; from
    /// `Fix::GivenPlace`).
    pub(crate) given: u32,
    /// A thread that gave up left its client's place to siblings on their way to the gate:
    /// the next hold of the client gives it up on release when nobody waits
    /// (`Shard::handed`; from `Fix::GivenPlace`).
    pub(crate) handed: bool,
    /// The client's wake-ups (announcements that named it, pokes).
    pub(crate) signal: u8,
    /// The note of the last announcement that handed the lock to the client, not yet taken
    /// (from `Fix::HandedOver`).
    pub(crate) note: Option<u32>,
    /// The fencing counter's value when the client's last withdrawal ran (the withdrawal
    /// tells it): a note at or below it is of a lock handed to the client before it left the
    /// waiting, which the withdrawal handed on (from `Fix::HandedOver`).
    pub(crate) withdrawn: u32,
    /// The highest note the client took out: one that comes again (from the list, after its
    /// announcement) is refused (`KeptNotes::taken`; kept from `Fix::PoppedNote`, where a
    /// note reaches a client twice).
    pub(crate) taken: u32,
}

/// Redis's keys of the lock, and the announcements on their way.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Redis {
    pub(crate) lock: Option<Token>,
    /// The lock key holds this client's owed turn (`client:turn`) rather than a token.
    pub(crate) turn: Option<u8>,
    pub(crate) counter: u32,
    /// The waiting clients and their scores (`mutex/waiters.lua`).
    pub(crate) waiting: BTreeMap<u8, i64>,
    /// Announcements naming a client, not yet delivered, with the note of a lock handed to
    /// it (its fencing token; from `Fix::HandedOver`).
    pub(crate) in_flight: Vec<(u8, Option<u32>)>,
    /// Clients whose first attempt placed them with a pop behind it, which Redis records for
    /// a little less than the pop waits: a release that names such a client leaves the note
    /// to the pop and announces nothing (from `Fix::PoppedNote`).
    pub(crate) popping: BTreeSet<u8>,
    /// The replies of pops on their way: the note a pop took, or none (a claim that ran out
    /// since).
    pub(crate) popped: BTreeMap<u8, Option<u32>>,
    /// The note left in a client's list (`waiters.lua`) by an announced hand-off, which a pop
    /// takes (from `Fix::PoppedNote`).
    pub(crate) notes: BTreeMap<u8, u32>,
    /// How many notes releases left to pops, announcing nothing.
    pub(crate) left_to_pops: u8,
}

/// A thread: how many acquisitions it has left (the current one included), and what it does.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Worker {
    pub(crate) left: u8,
    pub(crate) now: Thread,
    /// The score of a place this thread's attempts made while its own client held the lock
    /// (0: none), which its own release gives up (`Fix::StalePlace`).
    pub(crate) placed_at: u32,
    /// The lease of its hold counts: it began while the lock held its token, and has not run
    /// out since (`Action::Expire`).
    pub(crate) leased: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct State {
    pub(crate) redis: Redis,
    pub(crate) gates: Vec<Gate>,
    pub(crate) threads: Vec<Vec<Worker>>,
    /// The fencing token of the last holder, and whether one ever went down.
    pub(crate) last_fence: u32,
    pub(crate) fence_fell: bool,
    /// The clients owed their turn, and how many times another client took the lock in Redis
    /// since (a client whose turn ran out is owed nothing any more).
    pub(crate) barged: BTreeMap<u8, u8>,
    /// A fault happened (a lease ran out under its holder, an announcement was lost): from
    /// then on a waiter may be left to its re-check, as the protocol intends.
    pub(crate) faulted: bool,
    /// A waiter gave up at its deadline.
    pub(crate) gave_up: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    /// A thread calls `lock()`.
    Lock(u8, u8),
    /// A thread that comes alone calls `lock()`, with a pop behind its first attempt (from
    /// `Fix::PoppedNote`).
    LockPopping(u8, u8),
    /// The reply of a pop behind a first attempt reaches its thread, which delivers the note
    /// as an announcement's (`Subscription::deliver_note`) and goes on to the gate.
    PopReturns(u8, u8),
    /// The pop behind a first attempt times out (Redis's record of it ran out just before).
    PopEnds(u8, u8),
    /// Fault: the connection of a pop behind a first attempt drops; Redis's record of it
    /// stays until it runs out.
    PopLost(u8, u8),
    /// A leader's own pop takes the note left in its client's list (`waiting::popped`).
    DrainNote(u8),
    /// A thread calls `lock()` while a pass waits for its gate's leader, and takes that pass
    /// (from `Fix::Barging`).
    Barge(u8, u8),
    /// Redis runs the acquire script of a thread's attempt.
    RunAttempt(u8, u8),
    /// A thread whose first attempt failed enters the gate; its subscription was live before
    /// that attempt or not.
    EnterGate(u8, u8, bool),
    /// A follower becomes the leader of a gate nobody leads.
    Promote(u8, u8),
    /// The leader takes the baton or subscribes, and decides.
    Decide(u8, u8),
    /// A sleeping leader wakes (a wake-up came after what it had seen, or its short wait
    /// ended); its next attempt is overdue or not.
    Wake(u8, u8, bool),
    /// A holder hands the lock to its gate's listening leader (or, from
    /// `Fix::ComingLeader`, to the leader about to begin).
    Pass(u8, u8),
    /// A holder releases in Redis (the client decides what becomes of its place), giving
    /// the lock up to other waiting clients (a yield) or not.
    Release(u8, u8, bool),
    /// Redis runs a pass or a release.
    RunRelease(u8, u8),
    /// Redis delivers the `i`-th announcement on its way.
    Deliver(usize),
    /// An owed turn nobody took runs out.
    TurnExpires,
    /// A client's yield is over.
    YieldEnds(u8),
    /// Fault: the holder's lease runs out (it was stalled, or cut off from Redis): the lock
    /// key is gone, and waiters wake at its expiry, as the hint of their attempt said.
    Expire,
    /// Fault: the `i`-th announcement on its way is lost (a subscriber reconnected).
    Lose(usize),
    /// A waiting thread's deadline passes: it leaves its client's gate (a leader with a lock
    /// passed to it takes that lock instead: the pass came first), and the client's last
    /// waiter withdraws its client from the waiting.
    GiveUp(u8, u8),
    /// Redis runs a withdrawal.
    RunWithdraw(u8, u8),
    /// The releases that kept the place of a thread's client, on their way when it gave up,
    /// have run: it decides whether to withdraw its client.
    GiveUpAfter(u8, u8),
}

/// Which version of the protocol the model runs.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
pub(crate) enum Fix {
    /// Before any fix: a place is added with `NX`, whoever holds.
    Before,
    /// The acquire script re-scores a place when its own client holds, and a take with
    /// `more` always does.
    LostPlace,
    /// And a place made while its own client holds moves the counter, its score goes back to
    /// the thread, and the thread's release gives it up.
    StalePlace,
    /// And a thread whose first attempt failed skips its attempt as the gate's leader only
    /// when no hold of its client began since that attempt (whose release may have given up
    /// the place the attempt made).
    EarlyPlace,
    /// And a thread that gives up decides whether to withdraw its client, and waits for the
    /// withdrawal, while it is still in its gate, counting as waiting the threads of its client
    /// whose first attempt is on its way or failed: a thread that comes meanwhile goes through
    /// the gate, behind the withdrawal.
    WithdrawnPlace,
    /// And a thread that gives up, its client's last waiter, while a release that keeps its
    /// client's place is on its way, waits in its gate until that release has run before it
    /// decides: the withdrawal comes after the release.
    KeptPlace,
    /// And a client that just gave the lock up to other clients (a yield) does not count as
    /// waiting for a thread of it that gives up: its withdrawal passes on a turn that a
    /// release after the yield named its client for.
    YieldedTurn,
    /// And a thread that gives up while a sibling holds hands that hold the score of the
    /// place its own attempts made while its client held (`Worker::placed_at`, which may be
    /// above the hold's token), and a release that gives places up gives up the one at its
    /// own token too (made by its take for threads that waited then, and have left); a thread
    /// on its way to the gate, whose first attempt such a release may have undone, attempts
    /// again as the gate's leader.
    GivenPlace,
    /// And a holder passes the lock to a leader about to begin (a follower of a gate nobody
    /// leads, or a leader deciding), which takes it before anything else, with no wake-up:
    /// not a fix, the pass rule of `Gates::pass_on` since lock cohorting no longer waits for
    /// the next leader to listen.
    ComingLeader,
    /// And a thread that comes for the lock while a pass waits for its gate's leader takes
    /// that pass (the bound on such passes in a row is left out: either step may happen),
    /// and a leader woken without a pass while a sibling holds waits on without an attempt:
    /// not a fix, the pass rule of `Gates::lead` since a pass goes to a running thread
    /// first.
    Barging,
    /// And a release that names a client hands it the lock: the lock key holds a token for
    /// that client (`CLAIM`) with a new fencing token, which the announcement carries as its
    /// note; the client's leader takes the lock by the note, before any attempt (no attempt
    /// takes it: to the client's own attempts it is held by the client). A note at or below
    /// the counter that its client's last withdrawal read is refused (the withdrawal handed
    /// the lock on), and so is one of a lock that ran out (a fault); the highest note wins. A
    /// leader with a note takes it rather than give up, and a waiter that gives up before a
    /// sibling took its client's lock leaves its place to that sibling's hold. What a
    /// `Mutex`'s release on one deployment runs (before a pop of its client brought a note).
    HandedOver,
    /// And a thread that comes alone has a pop of its client's notes behind its first
    /// attempt, in the same round trip; an attempt that places its client with such a pop
    /// records it in Redis (for a little less than the pop waits) unless a note waits in the
    /// list already (which the pop takes at once), and a release that names a client so
    /// recorded leaves the note to the pop alone, without an announcement: the pop delivers
    /// it as an announcement would. A leader's own pop may take a note left in the list; the
    /// release of a hold handed over spends the list. What a `Mutex` on one deployment runs
    /// once a pop of its client brought a note.
    PoppedNote,
}

/// The protocol, for clients with these many threads, each making `acquisitions`; with the
/// faults (`Expire`, `Lose`) or without.
pub(crate) struct Handoff {
    pub(crate) threads: Vec<u8>,
    pub(crate) acquisitions: u8,
    pub(crate) fix: Fix,
    pub(crate) faults: bool,
    /// A waiter may give up at its deadline (once per run, to bound the states).
    pub(crate) give_up: bool,
}

/// What an attempt found, when it did not take the lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Refused {
    /// The score of the place made while its own client held (told to the thread).
    pub(crate) placed: Option<u32>,
    /// The lock stands free for a moment or holds a turn: the wait is short.
    pub(crate) short: bool,
}

impl Handoff {
    pub(crate) fn thread<'a>(&self, s: &'a State, (c, t): (u8, u8)) -> &'a Thread {
        &s.threads[c as usize][t as usize].now
    }

    /// The token of thread `(c, t)`'s current acquisition.
    pub(crate) fn token(s: &State, (c, t): (u8, u8)) -> Token {
        (c, t, s.threads[c as usize][t as usize].left)
    }

    /// Whether threads of client `c` wait for the lock, hold it or just gave it up
    /// (`Gates::has_waiters`).
    fn has_waiters(g: &Gate) -> bool {
        g.held.is_some() || g.inside > 0 || g.yielded
    }

    /// A thread counted as coming entered the gate or took the lock.
    fn arrived(&self, s: &mut State, c: u8) {
        if self.fix >= Fix::WithdrawnPlace {
            s.gates[c as usize].coming -= 1;
        }
    }

    /// `mutex/acquire.lua`: the fence when taken; else what the caller is told.
    pub(crate) fn acquire(&self, r: &mut Redis, token: Token, ask: Ask) -> Result<u32, Refused> {
        let client = token.0;
        let free = r.lock.is_none() && r.turn.is_none();
        if ask.after && free {
            // Behind every client waiting now, for a moment.
            r.waiting.insert(client, i64::from(r.counter));
            return Err(Refused {
                placed: None,
                short: true,
            });
        }
        if free || (r.lock.is_none() && r.turn == Some(client)) {
            r.turn = None;
            r.counter += 1;
            r.lock = Some(token);
            if ask.more && !ask.after {
                // Behind every client waiting now: a place from before is stale.
                if self.fix >= Fix::LostPlace {
                    r.waiting.insert(client, i64::from(r.counter));
                } else {
                    r.waiting.entry(client).or_insert(i64::from(r.counter));
                }
            } else if ask.overdue {
                r.waiting.remove(&client);
            }
            return Ok(r.counter);
        }
        let own = r.lock.is_some_and(|holder| holder.0 == client);
        if own && self.fix >= Fix::StalePlace {
            // Its own client holds: a place that counts from a new tick of the counter.
            r.counter += 1;
            r.waiting.insert(client, i64::from(r.counter));
            return Err(Refused {
                placed: Some(r.counter),
                short: false,
            });
        }
        let since = i64::from(r.counter);
        let added = if self.fix >= Fix::LostPlace && own {
            // A place from before its own client's hold is stale: it counts from now.
            r.waiting.insert(client, since).is_none()
        } else {
            let added = !r.waiting.contains_key(&client);
            r.waiting.entry(client).or_insert(since);
            added
        };
        if added && ask.overdue && !own {
            // Named, and beaten to the lock: owed the next turn.
            r.waiting.insert(client, OWED);
        }
        Err(Refused {
            placed: None,
            short: r.turn.is_some(),
        })
    }

    /// `name_next` (`mutex/waiters.lua`): the client of the lowest score is told; a client
    /// owed its turn gets the lock held for it. From `Fix::HandedOver` every client named
    /// gets the lock, with a new fencing token that the announcement carries.
    fn name_next(&self, r: &mut Redis) {
        let first = r
            .waiting
            .iter()
            .min_by_key(|(client, score)| (**score, **client))
            .map(|(client, score)| (*client, *score));
        if let Some((client, score)) = first {
            r.waiting.remove(&client);
            if self.fix >= Fix::HandedOver {
                r.counter += 1;
                r.lock = Some((client, CLAIM, r.counter as u8));
                if self.fix >= Fix::PoppedNote {
                    // A pop waits for the note: it takes it, and nothing is announced.
                    if r.popping.remove(&client) {
                        r.popped.insert(client, Some(r.counter));
                        r.left_to_pops += 1;
                        return;
                    }
                    r.notes.insert(client, r.counter);
                }
                r.in_flight.push((client, Some(r.counter)));
                return;
            }
            if score < 0 {
                r.turn = Some(client);
            }
            r.in_flight.push((client, None));
        }
    }

    /// The fencing token of the lock handed to `client`, if the lock key holds it.
    fn claim_of(r: &Redis, client: u8) -> Option<u32> {
        match r.lock {
            Some((c, CLAIM, fence)) if c == client => Some(u32::from(fence)),
            _ => None,
        }
    }

    /// The lock handed with the note `fence` ran out in Redis: a note of it that reaches the
    /// client now is refused (its time is up: `RawLock::take_handed`).
    fn claim_gone(s: &mut State, client: u8, fence: u32) {
        let g = &mut s.gates[client as usize];
        if g.note == Some(fence) {
            g.note = None;
        }
        for message in &mut s.redis.in_flight {
            if *message == (client, Some(fence)) {
                message.1 = None;
            }
        }
        // The list's note lasts as long as the claim.
        if s.redis.notes.get(&client) == Some(&fence) {
            s.redis.notes.remove(&client);
        }
        if let Some(note) = s.redis.popped.get_mut(&client) {
            if *note == Some(fence) {
                *note = None;
            }
        }
    }

    /// The lock key holds a lock handed to a client that none of its threads holds yet: its
    /// time may run out (a thread that took it renews it to its own lease).
    fn unheld_claim(s: &State) -> bool {
        let Some(claim @ (_, CLAIM, _)) = s.redis.lock else {
            return false;
        };
        !s.threads.iter().flatten().any(|w| match w.now {
            Thread::Holding { token, .. }
            | Thread::Passing { token, .. }
            | Thread::Releasing { token, .. } => token == claim,
            _ => false,
        })
    }

    /// Whether client `c` has the note of a lock handed to it that it may take: not handed
    /// before its last withdrawal, nor run out (`claim_gone`).
    fn has_note(g: &Gate) -> bool {
        g.note.is_some_and(|fence| fence > g.withdrawn)
    }

    /// A leader about to attempt (or wait without an attempt) takes the lock handed to its
    /// client instead, when it has the note of it (from `Fix::HandedOver`): it leaves the
    /// gate as after a winning attempt. Only the thread that takes the note out takes the
    /// lock so handed: no attempt takes it (to an attempt of the client it is held by the
    /// client), so that two threads of the client never both take it.
    fn take_note(&self, s: &mut State, (c, t): (u8, u8)) -> bool {
        let g = &mut s.gates[c as usize];
        if g.passed.is_some() || !Self::has_note(g) {
            return false;
        }
        let Some(fence) = g.note.take() else {
            return false;
        };
        if self.fix >= Fix::PoppedNote {
            g.taken = fence;
        }
        let more = g.inside > 1;
        let seen = g.signal;
        Self::leave_gate(s, c);
        if more && s.gates[c as usize].inside > 0 {
            s.gates[c as usize].baton = Some(seen);
        }
        Self::taken_in_redis(s, c);
        // Taken after a wait: the attempts of the wait may have left the client a place,
        // which the hold's release sets right, as after a winning attempt.
        self.begin_hold(s, (c, t), (c, CLAIM, fence as u8), fence, true);
        true
    }

    /// A note reaches client `c`'s gate (an announcement's, or a pop's): the highest wins,
    /// and one taken out already is refused.
    fn offer_note(&self, s: &mut State, c: u8, note: Option<u32>) {
        let g = &mut s.gates[c as usize];
        g.signal += 1;
        // The highest note: a later hand-off has a higher fencing token, whatever order its
        // announcement comes in.
        let fresh = note.filter(|&fence| self.fix < Fix::PoppedNote || fence > g.taken);
        g.note = g.note.max(fresh);
    }

    /// Records the score of a place a thread's attempt made while its own client held.
    fn placed(s: &mut State, (c, t): (u8, u8), score: Option<u32>) {
        if let Some(score) = score {
            let worker = &mut s.threads[c as usize][t as usize];
            worker.placed_at = worker.placed_at.max(score);
        }
    }

    fn set(s: &mut State, (c, t): (u8, u8), to: Thread) {
        s.threads[c as usize][t as usize].now = to;
    }

    /// A thread takes the lock: it leaves its gate (if in it), and the client's hold begins.
    fn begin_hold(&self, s: &mut State, (c, t): (u8, u8), token: Token, fence: u32, placed: bool) {
        // A hold whose lease ran out before it began (a lock passed on, taken after the
        // lease expired) holds nothing: its guard is lost at once, and its lower token is
        // what lets a resource refuse it.
        let leased = s.redis.lock == Some(token);
        if leased {
            if fence <= s.last_fence {
                s.fence_fell = true;
            }
            s.last_fence = fence;
        }
        s.threads[c as usize][t as usize].leased = leased;
        let g = &mut s.gates[c as usize];
        let kept = matches!(g.held, Some(true));
        let handed = std::mem::take(&mut g.handed);
        g.held = Some(placed || kept || handed);
        g.yielded = false;
        g.begun += 1;
        Self::set(s, (c, t), Thread::Holding { token, fence });
    }

    /// The leader leaves its gate.
    /// Whether a holder of client `c` may pass the lock to its gate's leader now: `true`
    /// when the leader listens (the pass wakes it), `false` when it is about to begin (a
    /// follower of a gate nobody leads, or a leader deciding: it takes the lock before
    /// anything else, from `Fix::ComingLeader`).
    fn pass_to(&self, s: &State, c: u8) -> Option<bool> {
        let g = &s.gates[c as usize];
        if g.passed.is_some() {
            return None;
        }
        let threads = &s.threads[c as usize];
        let coming = self.fix >= Fix::ComingLeader;
        match g.leader.map(|l| &threads[l as usize].now) {
            Some(Thread::Sleeping { .. } | Thread::Attempting { .. }) => Some(true),
            Some(Thread::Deciding { .. }) if coming => Some(false),
            None if coming
                && threads
                    .iter()
                    .any(|w| matches!(w.now, Thread::Follower { .. })) =>
            {
                Some(false)
            }
            _ => None,
        }
    }

    fn leave_gate(s: &mut State, c: u8) {
        let g = &mut s.gates[c as usize];
        g.leader = None;
        g.inside -= 1;
        if g.inside == 0 {
            g.baton = None;
        }
    }

    fn enter_gate(s: &mut State, (c, t): (u8, u8), early: Option<(u8, bool)>) {
        let g = &mut s.gates[c as usize];
        g.inside += 1;
        let entered = match (g.held, g.yielded) {
            (Some(_), _) => {
                g.held = Some(true);
                Entered::SiblingHeld
            }
            (None, true) => Entered::Yielded,
            (None, false) => Entered::Plainly,
        };
        let next = match g.leader {
            None => {
                g.leader = Some(t);
                Thread::Deciding { entered, early }
            }
            Some(_) => Thread::Follower { entered },
        };
        Self::set(s, (c, t), next);
    }

    /// The leader's attempt after it decided or woke; a passed lock, if any, first, then a
    /// lock handed to its client by a release (from `Fix::HandedOver`).
    fn next_attempt(&self, s: &mut State, (c, t): (u8, u8), after: bool, overdue: bool) {
        if self.take_note(s, (c, t)) {
            return;
        }
        let g = &mut s.gates[c as usize];
        match g.passed.take() {
            Some((token, fence)) => {
                let more = g.inside > 1;
                let seen = g.signal;
                Self::leave_gate(s, c);
                // The baton is left in the gate, and goes with it when it empties.
                if more && s.gates[c as usize].inside > 0 {
                    s.gates[c as usize].baton = Some(seen);
                }
                self.begin_hold(s, (c, t), token, fence, true);
            }
            None => {
                let ask = Ask {
                    more: g.inside > 1,
                    after,
                    overdue,
                };
                let seen = g.signal;
                Self::set(s, (c, t), Thread::Attempting { seen, ask });
            }
        }
    }

    /// The clients of the threads that wait in a state in which nothing can happen any more
    /// (only a re-check period would wake them): empty while anything can.
    pub(crate) fn forgotten(&self, s: &State) -> Vec<u8> {
        let mut next = Vec::new();
        self.actions(s, &mut next);
        if !next.is_empty() {
            return Vec::new();
        }
        s.threads
            .iter()
            .enumerate()
            .filter(|(_, workers)| workers.iter().any(|w| w.now != Thread::Idle))
            .map(|(c, _)| c as u8)
            .collect()
    }

    fn run_attempt(&self, s: &mut State, last: &State, (c, t): (u8, u8)) -> Option<()> {
        let token = Self::token(last, (c, t));
        match self.thread(last, (c, t)).clone() {
            Thread::First { seen, begun, pops } => {
                match self.acquire(&mut s.redis, token, Ask::plain()) {
                    Ok(fence) => {
                        // The pop behind takes a note waiting in the list, at once; the
                        // thread, holding, has no use for it.
                        if pops {
                            s.redis.notes.remove(&c);
                        }
                        self.arrived(s, c);
                        Self::taken_in_redis(s, c);
                        self.begin_hold(s, (c, t), token, fence, false)
                    }
                    Err(refused) => {
                        Self::placed(s, (c, t), refused.placed);
                        let short = refused.short;
                        if pops {
                            // A note in the list goes to the pop at once; else the pop
                            // waits, and Redis records it.
                            match s.redis.notes.remove(&c) {
                                Some(fence) => {
                                    s.redis.popped.insert(c, Some(fence));
                                }
                                None => {
                                    s.redis.popping.insert(c);
                                }
                            }
                            Self::set(s, (c, t), Thread::Popping { seen, short, begun });
                        } else {
                            Self::set(s, (c, t), Thread::FirstFailed { seen, short, begun });
                        }
                    }
                }
            }
            Thread::Attempting { seen, ask } => match self.acquire(&mut s.redis, token, ask) {
                Ok(fence) => {
                    Self::taken_in_redis(s, c);
                    Self::leave_gate(s, c);
                    if ask.more && s.gates[c as usize].inside > 0 {
                        s.gates[c as usize].baton = Some(seen);
                    }
                    self.begin_hold(s, (c, t), token, fence, true);
                }
                Err(refused) => {
                    Self::placed(s, (c, t), refused.placed);
                    if s.redis.waiting.get(&c) == Some(&OWED) {
                        s.barged.entry(c).or_insert(0);
                    }
                    let short = refused.short;
                    Self::set(s, (c, t), Thread::Sleeping { seen, short });
                }
            },
            _ => return None,
        }
        Some(())
    }

    /// Client `c` took the lock in Redis: it is owed nothing any more, and every other client
    /// owed its turn was barged once more.
    fn taken_in_redis(s: &mut State, c: u8) {
        s.barged.remove(&c);
        for (_, times) in s.barged.iter_mut() {
            *times = times.saturating_add(1);
        }
    }

    fn release(&self, s: &mut State, (c, t): (u8, u8), yielded: bool) -> Option<()> {
        let Thread::Holding { token, fence } = s.threads[c as usize][t as usize].now else {
            return None;
        };
        // A place of its own attempts, made while its client held, is given up too, and one
        // of a sibling that gave up meanwhile.
        let placed_at = s.threads[c as usize][t as usize].placed_at;
        let g = &mut s.gates[c as usize];
        let given = std::mem::take(&mut g.given);
        let fence = match self.fix >= Fix::GivenPlace {
            // And the place its own take made for the threads then waiting, at its token:
            // they are gone when its release gives places up.
            true => fence.max(placed_at).max(given).saturating_add(1),
            false => fence.max(placed_at.saturating_add(1)),
        };
        let placed = g.held.take().unwrap_or(true);
        g.yielded = yielded;
        let place = match (g.inside > 0, placed) {
            (true, _) => Place::Keep,
            (false, true) => Place::GiveUp,
            (false, false) => Place::Never,
        };
        if place == Place::Keep && self.fix >= Fix::KeptPlace {
            g.keeping += 1;
        }
        if place == Place::GiveUp && self.fix >= Fix::GivenPlace {
            // It may give up the place a thread on its way to the gate found: that thread
            // attempts again as the gate's leader (as after a hold that began).
            g.begun += 1;
        }
        let releasing = Thread::Releasing {
            token,
            fence,
            place,
        };
        Self::set(s, (c, t), releasing);
        Some(())
    }

    /// Thread `(c, t)` gives up its wait (`waiting::contend`, `RawLock::withdraw`), and
    /// withdraws its client when no other thread of the client waits, comes, holds or just
    /// gave the lock up. From `Fix::WithdrawnPlace` it decides this in its gate, and leaves
    /// the gate once the withdrawal ran; before, it left the gate first. From
    /// `Fix::KeptPlace`, a release on its way that keeps its client's place makes it wait
    /// for that release first.
    fn give_up(&self, s: &mut State, (c, t): (u8, u8)) -> Option<()> {
        s.gave_up = true;
        let token = Self::token(s, (c, t));
        let (Thread::Follower { .. } | Thread::Sleeping { .. }) =
            s.threads[c as usize][t as usize].now
        else {
            return None;
        };
        let g = &s.gates[c as usize];
        if self.fix >= Fix::KeptPlace && !self.others_wait(g) && g.keeping > 0 {
            Self::set(s, (c, t), Thread::GivingUp { token });
            return Some(());
        }
        self.decide_give_up(s, (c, t), token);
        Some(())
    }

    /// Whether other threads of client `c`, besides one in its gate, wait, come or hold the
    /// lock (`GatePass::others_wait`); or, before `Fix::YieldedTurn`, just gave it up.
    fn others_wait(&self, g: &Gate) -> bool {
        let yielded = g.yielded && self.fix < Fix::YieldedTurn;
        g.held.is_some() || yielded || g.coming > 0 || g.inside > 1
    }

    /// A thread that gave up decides whether to withdraw its client.
    fn decide_give_up(&self, s: &mut State, (c, t): (u8, u8), token: Token) {
        let in_gate = self.fix >= Fix::WithdrawnPlace;
        let g = &s.gates[c as usize];
        let others = match in_gate {
            true => self.others_wait(g),
            false => g.held.is_some() || g.yielded || g.inside > 1,
        };
        if !in_gate || others {
            Self::leave(s, (c, t));
        }
        let placed_at = s.threads[c as usize][t as usize].placed_at;
        let g = &mut s.gates[c as usize];
        if self.fix >= Fix::GivenPlace && g.held.is_some() {
            // The hold's release gives the client's place up (`Place::GiveUp`).
            g.held = Some(true);
            g.given = g.given.max(placed_at);
        } else if self.fix >= Fix::GivenPlace && others {
            g.handed = true;
            if self.fix >= Fix::HandedOver {
                // Its attempts may have made a place while the lock was handed to its client
                // and nobody of it held yet (the client holds it, to Redis): the next hold of
                // the client, which takes that lock, gives the place up with its own.
                g.given = g.given.max(placed_at);
            }
        }
        let worker = &mut s.threads[c as usize][t as usize];
        worker.placed_at = 0;
        if others {
            worker.left -= 1;
            worker.now = Thread::Idle;
        } else {
            worker.now = Thread::Withdrawing { token };
        }
    }

    /// Thread `(c, t)` leaves its gate without the lock.
    fn leave(s: &mut State, (c, t): (u8, u8)) {
        let g = &mut s.gates[c as usize];
        g.inside -= 1;
        if g.leader == Some(t) {
            g.leader = None;
        }
        if g.inside == 0 {
            g.baton = None;
        }
    }

    fn run_release(&self, s: &mut State, (c, t): (u8, u8)) -> Option<()> {
        match s.threads[c as usize][t as usize].now {
            // `mutex/pass_on.lua`: a new fencing token for the leader. A pass that finds the
            // lease lost is the releasing guard's `LockLost`; the leader waits on.
            Thread::Passing { token, fence } if s.redis.lock == Some(token) => {
                s.redis.counter += 1;
                let Some(woken) = self.pass_to(s, c) else {
                    // The leader left meanwhile (it gave up): the lock passed to nobody is
                    // released in Redis instead (`Gates::pass_on`, `give_back`), as the hold
                    // it was.
                    Self::set(s, (c, t), Thread::Holding { token, fence });
                    return self.release(s, (c, t), false);
                };
                let g = &mut s.gates[c as usize];
                g.passed = Some((token, s.redis.counter));
                if woken {
                    g.signal += 1;
                }
            }
            Thread::Passing { .. } => {}
            Thread::Releasing {
                token,
                fence,
                place,
            } => {
                if place == Place::Keep && self.fix >= Fix::KeptPlace {
                    s.gates[c as usize].keeping -= 1;
                }
                if s.redis.lock == Some(token) {
                    s.redis.lock = None;
                    let r = &mut s.redis;
                    // The release of a hold handed over spends the list its note was left in
                    // (`mutex/release_held.lua`).
                    if self.fix >= Fix::PoppedNote && token.1 == CLAIM && place != Place::Never {
                        r.notes.remove(&c);
                    }
                    match place {
                        Place::Never => {}
                        Place::Keep => {
                            r.waiting.insert(c, i64::from(r.counter));
                        }
                        Place::GiveUp => {
                            if r.waiting.get(&c).is_some_and(|&at| at < i64::from(fence)) {
                                r.waiting.remove(&c);
                            }
                        }
                    }
                    self.name_next(r);
                }
            }
            _ => return None,
        }
        let worker = &mut s.threads[c as usize][t as usize];
        worker.left -= 1;
        worker.now = Thread::Idle;
        worker.placed_at = 0;
        Some(())
    }
}

impl Ask {
    /// A first attempt, outside the gate.
    pub(crate) fn plain() -> Ask {
        Ask {
            more: false,
            after: false,
            overdue: false,
        }
    }
}

impl Model for Handoff {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            redis: Redis::default(),
            gates: self.threads.iter().map(|_| Gate::default()).collect(),
            threads: self
                .threads
                .iter()
                .map(|&n| {
                    (0..n)
                        .map(|_| Worker {
                            left: self.acquisitions,
                            now: Thread::Idle,
                            placed_at: 0,
                            leased: false,
                        })
                        .collect()
                })
                .collect(),
            last_fence: 0,
            fence_fell: false,
            barged: BTreeMap::new(),
            faulted: false,
            gave_up: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        // Another client waits in Redis: a run of passes may end by giving the lock up.
        let contested = |c: usize| s.redis.waiting.keys().any(|&w| w as usize != c);
        for (c, threads) in s.threads.iter().enumerate() {
            let g = &s.gates[c];
            for (t, worker) in threads.iter().enumerate() {
                let (c, t) = (c as u8, t as u8);
                match &worker.now {
                    Thread::Idle if worker.left > 0 => {
                        actions.push(Action::Lock(c, t));
                        if self.fix >= Fix::PoppedNote && g.coming == 0 && !Self::has_waiters(g) {
                            actions.push(Action::LockPopping(c, t));
                        }
                        if self.fix >= Fix::Barging && g.passed.is_some() {
                            actions.push(Action::Barge(c, t));
                        }
                    }
                    Thread::First { .. } | Thread::Attempting { .. } => {
                        actions.push(Action::RunAttempt(c, t))
                    }
                    Thread::FirstFailed { .. } => {
                        actions.push(Action::EnterGate(c, t, false));
                        actions.push(Action::EnterGate(c, t, true));
                    }
                    Thread::Popping { .. } => {
                        if s.redis.popped.contains_key(&c) {
                            actions.push(Action::PopReturns(c, t));
                        }
                        if s.redis.popping.contains(&c) {
                            actions.push(Action::PopEnds(c, t));
                            if self.faults {
                                actions.push(Action::PopLost(c, t));
                            }
                        }
                    }
                    Thread::Follower { .. } if g.leader.is_none() => {
                        actions.push(Action::Promote(c, t))
                    }
                    Thread::Deciding { .. } => actions.push(Action::Decide(c, t)),
                    Thread::Sleeping { seen, short } if g.signal > *seen || *short => {
                        actions.push(Action::Wake(c, t, false));
                        actions.push(Action::Wake(c, t, true));
                    }
                    Thread::Holding { .. } => {
                        if self.pass_to(s, c).is_some() {
                            actions.push(Action::Pass(c, t));
                        }
                        actions.push(Action::Release(c, t, false));
                        if contested(c as usize) {
                            actions.push(Action::Release(c, t, true));
                        }
                    }
                    Thread::Passing { .. } | Thread::Releasing { .. } => {
                        actions.push(Action::RunRelease(c, t))
                    }
                    Thread::Withdrawing { .. } => actions.push(Action::RunWithdraw(c, t)),
                    Thread::GivingUp { .. } if g.keeping == 0 => {
                        actions.push(Action::GiveUpAfter(c, t))
                    }
                    _ => {}
                }
            }
            if g.yielded {
                actions.push(Action::YieldEnds(c as u8));
            }
            // A leader pops while it sleeps (`waiting::popped`).
            let leader_sleeps = g
                .leader
                .is_some_and(|l| matches!(threads[l as usize].now, Thread::Sleeping { .. }));
            if s.redis.notes.contains_key(&(c as u8)) && leader_sleeps {
                actions.push(Action::DrainNote(c as u8));
            }
        }
        for i in 0..s.redis.in_flight.len() {
            actions.push(Action::Deliver(i));
        }
        // A lock handed to a client runs out only when none of its threads takes it in time:
        // one stalled, or cut off from Redis (a fault).
        if s.redis.turn.is_some() || (self.faults && Self::unheld_claim(s)) {
            actions.push(Action::TurnExpires);
        }
        if self.give_up && !s.gave_up {
            for (c, threads) in s.threads.iter().enumerate() {
                let g = &s.gates[c];
                for (t, w) in threads.iter().enumerate() {
                    // A thread whose first attempt failed enters the gate even when its deadline
                    // has passed (`Gates::lead`), and gives up from there.
                    let waiting = match w.now {
                        // A follower gives up behind a leader. One whose deadline passes while
                        // nobody leads becomes the leader (`Gates::lead`: `Promote`), and
                        // decides as every leader does before it gives up, so that no thread
                        // that comes meanwhile leads before its withdrawal ran.
                        Thread::Follower { .. } => g.leader.is_some(),
                        // A leader with the note of a lock handed to its client takes that
                        // lock: it came first.
                        Thread::Sleeping { .. } => g.passed.is_none() && !Self::has_note(g),
                        _ => false,
                    };
                    if waiting {
                        actions.push(Action::GiveUp(c as u8, t as u8));
                    }
                }
            }
        }
        if self.faults {
            if s.redis.lock.is_some() {
                actions.push(Action::Expire);
            }
            for i in 0..s.redis.in_flight.len() {
                actions.push(Action::Lose(i));
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Lock(c, t) | Action::LockPopping(c, t) => {
                let pops = matches!(action, Action::LockPopping(..));
                let g = &mut s.gates[c as usize];
                if Self::has_waiters(g) {
                    if pops {
                        return None;
                    }
                    Self::enter_gate(&mut s, (c, t), None);
                } else {
                    if self.fix >= Fix::WithdrawnPlace {
                        g.coming += 1;
                    }
                    let (seen, begun) = (g.signal, g.begun);
                    Self::set(&mut s, (c, t), Thread::First { seen, begun, pops });
                }
            }
            Action::PopReturns(c, t) => {
                let Thread::Popping { seen, short, begun } = *self.thread(last, (c, t)) else {
                    return None;
                };
                let note = s.redis.popped.remove(&c)?;
                self.offer_note(&mut s, c, note);
                Self::set(&mut s, (c, t), Thread::FirstFailed { seen, short, begun });
            }
            Action::PopEnds(c, t) | Action::PopLost(c, t) => {
                let Thread::Popping { seen, short, begun } = *self.thread(last, (c, t)) else {
                    return None;
                };
                if matches!(action, Action::PopEnds(..)) {
                    s.redis.popping.remove(&c);
                } else {
                    s.faulted = true;
                }
                Self::set(&mut s, (c, t), Thread::FirstFailed { seen, short, begun });
            }
            Action::DrainNote(c) => {
                let fence = s.redis.notes.remove(&c)?;
                self.offer_note(&mut s, c, Some(fence));
            }
            Action::RunAttempt(c, t) => self.run_attempt(&mut s, last, (c, t))?,
            Action::EnterGate(c, t, live) => {
                let Thread::FirstFailed { seen, short, begun } = *self.thread(last, (c, t)) else {
                    return None;
                };
                let unchanged = self.fix < Fix::EarlyPlace || s.gates[c as usize].begun == begun;
                let early = (live && unchanged).then_some((seen, short));
                self.arrived(&mut s, c);
                Self::enter_gate(&mut s, (c, t), early);
            }
            Action::Promote(c, t) => {
                let Thread::Follower { entered } = *self.thread(last, (c, t)) else {
                    return None;
                };
                s.gates[c as usize].leader = Some(t);
                let early = None;
                Self::set(&mut s, (c, t), Thread::Deciding { entered, early });
            }
            Action::Decide(c, t) => {
                let Thread::Deciding { entered, early } = *self.thread(last, (c, t)) else {
                    return None;
                };
                if self.take_note(&mut s, (c, t)) {
                    return Some(s);
                }
                let g = &mut s.gates[c as usize];
                if g.passed.is_some() {
                    // Passed while it was about to lead: taken first (`contend`'s loop).
                    g.baton = None;
                    self.next_attempt(&mut s, (c, t), false, false);
                    return Some(s);
                }
                let sibling_held = entered == Entered::SiblingHeld;
                // `leader_subscription` and `sibling_holds`: the baton's holder won with its
                // client kept among the waiting; the first attempt placed it; a sibling holds,
                // and its release keeps the place.
                let skip = match (g.baton.take(), early) {
                    (Some(seen), _) => Some((seen, false)),
                    (None, Some(early)) => Some(early),
                    (None, None) if sibling_held && g.held.is_some() => Some((g.signal, false)),
                    (None, None) => None,
                };
                match skip {
                    Some((seen, short)) => {
                        Self::set(&mut s, (c, t), Thread::Sleeping { seen, short })
                    }
                    None => {
                        let after = entered == Entered::Yielded;
                        self.next_attempt(&mut s, (c, t), after, false);
                    }
                }
            }
            Action::Barge(c, t) => {
                // `Gates::lead`: it enters the gate (a sibling holds: its hold is placed),
                // takes the pass and leaves.
                let g = &mut s.gates[c as usize];
                let (token, fence) = g.passed.take()?;
                g.held = Some(true);
                self.begin_hold(&mut s, (c, t), token, fence, true);
            }
            Action::Wake(c, t, overdue) => {
                let g = &s.gates[c as usize];
                let woken = match *self.thread(last, (c, t)) {
                    Thread::Sleeping { seen, .. } => g.signal > seen,
                    _ => false,
                };
                // `contend`: woken for a pass that a sibling took as it came, the leader waits
                // on while that sibling holds (a short wait that ended unwoken attempts).
                if self.fix >= Fix::Barging && woken && g.passed.is_none() && g.held.is_some() {
                    let seen = g.signal;
                    Self::set(&mut s, (c, t), Thread::Sleeping { seen, short: false });
                } else {
                    self.next_attempt(&mut s, (c, t), false, overdue);
                }
            }
            Action::Pass(c, t) => {
                let Thread::Holding { token, fence } = *self.thread(last, (c, t)) else {
                    return None;
                };
                Self::set(&mut s, (c, t), Thread::Passing { token, fence });
            }
            Action::Release(c, t, yielded) => self.release(&mut s, (c, t), yielded)?,
            Action::RunRelease(c, t) => self.run_release(&mut s, (c, t))?,
            Action::Deliver(i) => {
                let (client, note) = s.redis.in_flight.remove(i);
                self.offer_note(&mut s, client, note);
            }
            Action::TurnExpires => {
                if let Some(c) = s.redis.turn.take() {
                    s.barged.remove(&c);
                }
                if let Some((c, CLAIM, fence)) = s.redis.lock {
                    // Its client was stalled or cut off past the time given to take it.
                    s.redis.lock = None;
                    Self::claim_gone(&mut s, c, u32::from(fence));
                    s.barged.remove(&c);
                    s.faulted = true;
                }
            }
            Action::YieldEnds(c) => s.gates[c as usize].yielded = false,
            Action::Expire => {
                let expired = s.redis.lock.take();
                if let Some((c, CLAIM, fence)) = expired {
                    Self::claim_gone(&mut s, c, u32::from(fence));
                }
                s.faulted = true;
                for w in s.threads.iter_mut().flatten() {
                    match &mut w.now {
                        Thread::Sleeping { short, .. } => *short = true,
                        Thread::Holding { token, .. } if Some(*token) == expired => {
                            w.leased = false
                        }
                        _ => {}
                    }
                }
            }
            Action::Lose(i) => {
                s.redis.in_flight.remove(i);
                s.faulted = true;
            }
            Action::GiveUp(c, t) => self.give_up(&mut s, (c, t))?,
            Action::GiveUpAfter(c, t) => {
                let Thread::GivingUp { token } = *self.thread(last, (c, t)) else {
                    return None;
                };
                self.decide_give_up(&mut s, (c, t), token);
            }
            Action::RunWithdraw(c, t) => {
                let Thread::Withdrawing { .. } = *self.thread(last, (c, t)) else {
                    return None;
                };
                // `mutex/withdraw.lua`.
                let r = &mut s.redis;
                r.waiting.remove(&c);
                if r.turn == Some(c) {
                    r.turn = None;
                }
                if Self::claim_of(r, c).is_some() {
                    // Handed to the client that leaves: handed on (a note of it is at or below
                    // the counter that the withdrawal tells).
                    r.lock = None;
                }
                if self.fix >= Fix::HandedOver {
                    s.gates[c as usize].withdrawn = s.redis.counter;
                }
                let r = &mut s.redis;
                if r.lock.is_none() && r.turn.is_none() {
                    self.name_next(r);
                }
                s.barged.remove(&c);
                if self.fix >= Fix::WithdrawnPlace {
                    Self::leave(&mut s, (c, t));
                }
                let worker = &mut s.threads[c as usize][t as usize];
                worker.left -= 1;
                worker.now = Thread::Idle;
                worker.placed_at = 0;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut properties = vec![
            Property::always("exclusion", |_, s: &State| {
                let holding = s
                    .threads
                    .iter()
                    .flatten()
                    .filter(|w| matches!(w.now, Thread::Holding { .. }))
                    .count();
                s.faulted || holding <= 1
            }),
            // Under faults: at most one thread holds the lock while its lease counts (it began
            // while the lock held its token and has not run out since); a holder whose lease
            // ran out is told (`is_lost`).
            Property::always("exclusion of the leases that count", |_, s: &State| {
                let holding = s
                    .threads
                    .iter()
                    .flatten()
                    .filter(|w| w.leased && matches!(w.now, Thread::Holding { .. }))
                    .count();
                holding <= 1
            }),
            Property::always("fencing tokens rise", |_, s: &State| !s.fence_fell),
            // Owed its turn (it waited past `OVERDUE` and was beaten to the lock), a client
            // takes the lock before another client takes it twice.
            Property::always("bounded barging", |_, s: &State| {
                s.faulted || s.barged.values().all(|&times| times < 2)
            }),
            Property::always(
                "no waiter of a client missing from the set",
                |m: &Handoff, s: &State| {
                    s.faulted
                        || !m
                            .forgotten(s)
                            .iter()
                            .any(|&c| !s.redis.waiting.contains_key(&c))
                },
            ),
            Property::always(
                "no waiter behind a stale place",
                |m: &Handoff, s: &State| {
                    s.faulted
                        || !m
                            .forgotten(s)
                            .iter()
                            .any(|&c| s.redis.waiting.contains_key(&c))
                },
            ),
        ];
        properties.extend(match self.faults {
            // The parts that only some runs reach are reached.
            // From `Fix::HandedOver` a client named is never beaten to the lock (it is handed
            // to it), and so never owed a turn.
            false if self.fix >= Fix::HandedOver => vec![
                Property::always("no client is owed its turn", |_, s: &State| {
                    s.redis.waiting.values().all(|&score| score != OWED)
                }),
                Property::sometimes("a release hands the lock over", |_, s: &State| {
                    matches!(s.redis.lock, Some((_, CLAIM, _)))
                }),
                Property::sometimes("a client yields", |_, s: &State| {
                    s.gates.iter().any(|g| g.yielded)
                }),
            ],
            false => vec![
                Property::sometimes("a client is owed its turn", |_, s: &State| {
                    s.redis.waiting.values().any(|&score| score == OWED)
                }),
                Property::sometimes("a release hands a turn over", |_, s: &State| {
                    s.redis.turn.is_some()
                }),
                Property::sometimes("a client yields", |_, s: &State| {
                    s.gates.iter().any(|g| g.yielded)
                }),
            ],
            true => vec![Property::sometimes(
                "a lease runs out under its holder",
                |_, s: &State| {
                    s.threads.iter().flatten().any(|w| match w.now {
                        Thread::Holding { token, .. } => s.redis.lock != Some(token),
                        _ => false,
                    })
                },
            )],
        });
        if self.fix >= Fix::HandedOver && !self.faults {
            properties.push(Property::sometimes(
                "a leader takes a lock handed to it by its note",
                |_, s: &State| {
                    s.threads.iter().flatten().any(|w| {
                        matches!(
                            w.now,
                            Thread::Holding {
                                token: (_, CLAIM, _),
                                ..
                            }
                        )
                    })
                },
            ));
        }
        if self.fix >= Fix::PoppedNote && !self.faults {
            properties.push(Property::sometimes(
                "a leader takes a lock whose note a release left to a pop",
                |_, s: &State| {
                    s.redis.left_to_pops > 0
                        && s.redis.in_flight.is_empty()
                        && s.threads.iter().flatten().any(|w| {
                            matches!(
                                w.now,
                                Thread::Holding {
                                    token: (_, CLAIM, _),
                                    ..
                                }
                            )
                        })
                },
            ));
        }
        properties
    }
}
