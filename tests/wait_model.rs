//! The `Mutex`'s hand-off protocol between clients, as a model checked for every interleaving
//! (`stateright`): Redis's state for one lock (the holder's token, the fencing counter, the
//! waiting clients with their scores, the announcements on their way), each client's gate
//! (its leader, the threads inside, the baton, the lock passed within it, what it last did
//! with the lock) and each thread. Every script is one atomic step, and so is every decision
//! a client makes under its gate's lock; the steps of different threads and of Redis
//! interleave in every order.
//!
//! Checked: exclusion, fencing tokens that rise with every holder, and that no waiter is
//! forgotten (a state in which nothing can happen any more while a thread still waits, so
//! that only a re-check period would wake it), whether its client is missing from the waiting
//! set (a lost place) or a release named another client that had nobody waiting (a stale
//! place). Three versions of the protocol ([`Fix`]): before the fix of the lost place, and
//! before the fix of the stale place, each of which the model shows failing; and the
//! scripts' own, which holds every property.

use std::collections::BTreeMap;

use stateright::{Checker, Model, Property};

/// A token: the client, the thread and which of its acquisitions.
type Token = (u8, u8, u8);

/// What a thread is doing.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Thread {
    /// Between acquisitions.
    Idle,
    /// Its first attempt, outside the gate, is on its way to Redis.
    First,
    /// Its first attempt found the lock held (and put its client among the waiting): it
    /// enters the gate next.
    FirstFailed,
    /// In the gate behind the leader.
    Follower { sibling_held: bool },
    /// The gate's leader, about to take the baton or a subscription and decide whether to
    /// attempt.
    Deciding { sibling_held: bool },
    /// The leader's attempt is on its way to Redis (`seen`: wake-ups before it; `more`:
    /// others wait in the gate).
    Attempting { seen: u8, more: bool },
    /// The leader waits for a wake-up after `seen`.
    Sleeping { seen: u8 },
    /// Holds the lock (whose key holds `token`) with this fencing token.
    Holding { token: Token, fence: u32 },
    /// Decided to pass the lock to its gate's leader; the pass is on its way to Redis.
    Passing { token: Token },
    /// Decided to release in Redis, with what the release does with its client's place.
    Releasing {
        token: Token,
        fence: u32,
        place: Place,
    },
}

/// What a release does with its client's place among the waiting (see `waiting::Place`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Place {
    Never,
    GiveUp,
    Keep,
}

/// One client's gate for the lock.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Gate {
    leader: Option<u8>,
    inside: u8,
    /// The wake-ups the baton's holder had seen before its winning attempt.
    baton: Option<u8>,
    /// A lock passed to the leader: its token and the new holder's fencing token.
    passed: Option<(Token, u32)>,
    /// A thread of the client holds the lock (`Some(placed)`), as `Gates::held` says.
    held: Option<bool>,
    /// The client's wake-ups (announcements that named it, pokes).
    signal: u8,
}

/// Redis's keys of the lock, and the announcements on their way.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
struct Redis {
    lock: Option<Token>,
    counter: u32,
    /// The waiting clients and their scores (`mutex/waiters.lua`).
    waiting: BTreeMap<u8, u32>,
    /// Announcements naming a client, not yet delivered.
    in_flight: Vec<u8>,
}

/// A thread: how many acquisitions it has left (the current one included), and what it does.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Worker {
    left: u8,
    now: Thread,
    /// The score of a place this thread's attempts made while its own client held the lock
    /// (0: none), which its own release gives up (`Fix::StalePlace`).
    placed_at: u32,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct State {
    redis: Redis,
    gates: Vec<Gate>,
    threads: Vec<Vec<Worker>>,
    /// The fencing token of the last holder, and whether one ever went down.
    last_fence: u32,
    fence_fell: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Action {
    /// A thread calls `lock()`.
    Lock(u8, u8),
    /// Redis runs the acquire script of a thread's attempt.
    RunAttempt(u8, u8),
    /// A thread whose first attempt failed enters the gate.
    EnterGate(u8, u8),
    /// A follower becomes the leader of a gate nobody leads.
    Promote(u8, u8),
    /// The leader takes the baton or subscribes, and decides.
    Decide(u8, u8),
    /// A sleeping leader wakes (a wake-up came after what it had seen).
    Wake(u8, u8),
    /// A holder hands the lock to its gate's listening leader.
    Pass(u8, u8),
    /// A holder releases in Redis (the client decides what becomes of its place).
    Release(u8, u8),
    /// Redis runs a pass or a release.
    RunRelease(u8, u8),
    /// Redis delivers the `i`-th announcement on its way.
    Deliver(usize),
}

/// Which version of the protocol the model runs.
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Debug)]
enum Fix {
    /// Before any fix: a place is added with `NX`, whoever holds.
    Before,
    /// The acquire script re-scores a place when its own client holds, and a take with
    /// `more` always does.
    LostPlace,
    /// And a place made while its own client holds moves the counter, its score goes back to
    /// the thread, and the thread's release gives it up.
    StalePlace,
}

/// The protocol, for clients with these many threads, each making `acquisitions`.
struct Handoff {
    threads: Vec<u8>,
    acquisitions: u8,
    fix: Fix,
}

impl Handoff {
    fn thread<'a>(&self, s: &'a State, (c, t): (u8, u8)) -> &'a Thread {
        &s.threads[c as usize][t as usize].now
    }

    /// The token of thread `(c, t)`'s current acquisition.
    fn token(s: &State, (c, t): (u8, u8)) -> Token {
        (c, t, s.threads[c as usize][t as usize].left)
    }

    /// Whether threads of client `c` wait for the lock or hold it (`Gates::has_waiters`).
    fn has_waiters(g: &Gate) -> bool {
        g.held.is_some() || g.inside > 0
    }

    /// `mutex/acquire.lua` with `wait` or `more`: the fence when taken; else the score of the
    /// place made while the caller's own client holds, when the script tells it.
    fn acquire(&self, r: &mut Redis, token: Token, more: bool) -> Result<u32, Option<u32>> {
        let client = token.0;
        match r.lock {
            None => {
                r.counter += 1;
                r.lock = Some(token);
                if more {
                    // Behind every client waiting now: a place from before is stale.
                    if self.fix >= Fix::LostPlace {
                        r.waiting.insert(client, r.counter);
                    } else {
                        r.waiting.entry(client).or_insert(r.counter);
                    }
                }
                Ok(r.counter)
            }
            Some(holder) if holder.0 == client && self.fix == Fix::StalePlace => {
                // Its own client holds: a place that counts from a new tick of the counter.
                r.counter += 1;
                r.waiting.insert(client, r.counter);
                Err(Some(r.counter))
            }
            Some(holder) => {
                let since = r.counter;
                if self.fix >= Fix::LostPlace && holder.0 == client {
                    // A place from before its own client's hold is stale: it counts from now.
                    r.waiting.insert(client, since);
                } else {
                    r.waiting.entry(client).or_insert(since);
                }
                Err(None)
            }
        }
    }

    /// `name_next` (`mutex/waiters.lua`): the client of the lowest score is told.
    fn name_next(r: &mut Redis) {
        let first = r
            .waiting
            .iter()
            .min_by_key(|(client, score)| (**score, **client))
            .map(|(client, _)| *client);
        if let Some(client) = first {
            r.waiting.remove(&client);
            r.in_flight.push(client);
        }
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
        if fence <= s.last_fence {
            s.fence_fell = true;
        }
        s.last_fence = fence;
        let g = &mut s.gates[c as usize];
        let kept = matches!(g.held, Some(true));
        g.held = Some(placed || kept);
        Self::set(s, (c, t), Thread::Holding { token, fence });
    }

    /// The leader leaves its gate.
    fn leave_gate(s: &mut State, c: u8) {
        let g = &mut s.gates[c as usize];
        g.leader = None;
        g.inside -= 1;
        if g.inside == 0 {
            g.baton = None;
        }
    }

    fn enter_gate(s: &mut State, (c, t): (u8, u8)) {
        let g = &mut s.gates[c as usize];
        g.inside += 1;
        let sibling_held = g.held.is_some();
        if sibling_held {
            g.held = Some(true);
        }
        let next = match g.leader {
            None => {
                g.leader = Some(t);
                Thread::Deciding { sibling_held }
            }
            Some(_) => Thread::Follower { sibling_held },
        };
        Self::set(s, (c, t), next);
    }

    /// The clients of the threads that wait in a state in which nothing can happen any more
    /// (only a re-check period would wake them): empty while anything can.
    fn forgotten(&self, s: &State) -> Vec<u8> {
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
                        })
                        .collect()
                })
                .collect(),
            last_fence: 0,
            fence_fell: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (c, threads) in s.threads.iter().enumerate() {
            let g = &s.gates[c];
            for (t, worker) in threads.iter().enumerate() {
                let (c, t) = (c as u8, t as u8);
                match &worker.now {
                    Thread::Idle if worker.left > 0 => actions.push(Action::Lock(c, t)),
                    Thread::First | Thread::Attempting { .. } => {
                        actions.push(Action::RunAttempt(c, t))
                    }
                    Thread::FirstFailed => actions.push(Action::EnterGate(c, t)),
                    Thread::Follower { .. } if g.leader.is_none() => {
                        actions.push(Action::Promote(c, t))
                    }
                    Thread::Deciding { .. } => actions.push(Action::Decide(c, t)),
                    Thread::Sleeping { seen } if g.signal > *seen => {
                        actions.push(Action::Wake(c, t))
                    }
                    Thread::Holding { .. } => {
                        let listening = g.leader.is_some_and(|l| {
                            matches!(
                                threads[l as usize].now,
                                Thread::Sleeping { .. } | Thread::Attempting { .. }
                            )
                        });
                        if listening && g.passed.is_none() {
                            actions.push(Action::Pass(c, t));
                        }
                        actions.push(Action::Release(c, t));
                    }
                    Thread::Passing { .. } | Thread::Releasing { .. } => {
                        actions.push(Action::RunRelease(c, t))
                    }
                    _ => {}
                }
            }
        }
        for i in 0..s.redis.in_flight.len() {
            actions.push(Action::Deliver(i));
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::Lock(c, t) => {
                if Self::has_waiters(&s.gates[c as usize]) {
                    Self::enter_gate(&mut s, (c, t));
                } else {
                    Self::set(&mut s, (c, t), Thread::First);
                }
            }
            Action::RunAttempt(c, t) => {
                let token = Self::token(last, (c, t));
                match self.thread(last, (c, t)).clone() {
                    Thread::First => match self.acquire(&mut s.redis, token, false) {
                        Ok(fence) => self.begin_hold(&mut s, (c, t), token, fence, false),
                        Err(placed) => {
                            Self::placed(&mut s, (c, t), placed);
                            Self::set(&mut s, (c, t), Thread::FirstFailed);
                        }
                    },
                    Thread::Attempting { seen, more } => {
                        match self.acquire(&mut s.redis, token, more) {
                            Ok(fence) => {
                                Self::leave_gate(&mut s, c);
                                if more {
                                    s.gates[c as usize].baton = Some(seen);
                                }
                                self.begin_hold(&mut s, (c, t), token, fence, true);
                            }
                            Err(placed) => {
                                Self::placed(&mut s, (c, t), placed);
                                Self::set(&mut s, (c, t), Thread::Sleeping { seen });
                            }
                        }
                    }
                    _ => return None,
                }
            }
            Action::EnterGate(c, t) => Self::enter_gate(&mut s, (c, t)),
            Action::Promote(c, t) => {
                let Thread::Follower { sibling_held } = *self.thread(last, (c, t)) else {
                    return None;
                };
                s.gates[c as usize].leader = Some(t);
                Self::set(&mut s, (c, t), Thread::Deciding { sibling_held });
            }
            Action::Decide(c, t) => {
                let Thread::Deciding { sibling_held } = *self.thread(last, (c, t)) else {
                    return None;
                };
                let g = &mut s.gates[c as usize];
                let next = match g.baton.take() {
                    Some(seen) => Thread::Sleeping { seen },
                    None if sibling_held && g.held.is_some() => Thread::Sleeping { seen: g.signal },
                    None => Thread::Attempting {
                        seen: g.signal,
                        more: g.inside > 1,
                    },
                };
                Self::set(&mut s, (c, t), next);
            }
            Action::Wake(c, t) => {
                let g = &mut s.gates[c as usize];
                match g.passed.take() {
                    Some((token, fence)) => {
                        let more = g.inside > 1;
                        let seen = g.signal;
                        Self::leave_gate(&mut s, c);
                        if more {
                            s.gates[c as usize].baton = Some(seen);
                        }
                        self.begin_hold(&mut s, (c, t), token, fence, true);
                    }
                    None => {
                        let next = Thread::Attempting {
                            seen: g.signal,
                            more: g.inside > 1,
                        };
                        Self::set(&mut s, (c, t), next);
                    }
                }
            }
            Action::Pass(c, t) => {
                let Thread::Holding { token, .. } = *self.thread(last, (c, t)) else {
                    return None;
                };
                Self::set(&mut s, (c, t), Thread::Passing { token });
            }
            Action::Release(c, t) => {
                let Thread::Holding { token, fence } = *self.thread(last, (c, t)) else {
                    return None;
                };
                // A place of its own attempts, made while its client held, is given up too.
                let placed_at = s.threads[c as usize][t as usize].placed_at;
                let fence = fence.max(placed_at.saturating_add(1));
                let g = &mut s.gates[c as usize];
                let placed = g.held.take().unwrap_or(true);
                let place = match (g.inside > 0, placed) {
                    (true, _) => Place::Keep,
                    (false, true) => Place::GiveUp,
                    (false, false) => Place::Never,
                };
                Self::set(
                    &mut s,
                    (c, t),
                    Thread::Releasing {
                        token,
                        fence,
                        place,
                    },
                );
            }
            Action::RunRelease(c, t) => {
                match *self.thread(last, (c, t)) {
                    Thread::Passing { token } => {
                        // `mutex/pass_on.lua`: a new fencing token for the leader.
                        if s.redis.lock != Some(token) {
                            return None;
                        }
                        s.redis.counter += 1;
                        let g = &mut s.gates[c as usize];
                        g.passed = Some((token, s.redis.counter));
                        g.signal += 1;
                    }
                    Thread::Releasing {
                        token,
                        fence,
                        place,
                    } => {
                        if s.redis.lock == Some(token) {
                            s.redis.lock = None;
                            let r = &mut s.redis;
                            match place {
                                Place::Never => {}
                                Place::Keep => {
                                    r.waiting.insert(c, r.counter);
                                }
                                Place::GiveUp => {
                                    if r.waiting.get(&c).is_some_and(|&score| score < fence) {
                                        r.waiting.remove(&c);
                                    }
                                }
                            }
                            Self::name_next(r);
                        }
                    }
                    _ => return None,
                }
                let worker = &mut s.threads[c as usize][t as usize];
                worker.left -= 1;
                worker.now = Thread::Idle;
                worker.placed_at = 0;
            }
            Action::Deliver(i) => {
                let client = s.redis.in_flight.remove(i);
                s.gates[client as usize].signal += 1;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("exclusion", |_, s: &State| {
                let holding = s
                    .threads
                    .iter()
                    .flatten()
                    .filter(|w| matches!(w.now, Thread::Holding { .. }))
                    .count();
                holding <= 1
            }),
            Property::always("fencing tokens rise", |_, s: &State| !s.fence_fell),
            Property::always("no waiter of a client missing from the set", |m, s| {
                !m.forgotten(s)
                    .iter()
                    .any(|&c| !s.redis.waiting.contains_key(&c))
            }),
            Property::always("no waiter behind a stale place", |m, s| {
                !m.forgotten(s)
                    .iter()
                    .any(|&c| s.redis.waiting.contains_key(&c))
            }),
        ]
    }
}

/// Every state of the protocol version `fix` for two clients, of two threads and one, two
/// acquisitions each.
fn check(fix: Fix) -> impl Checker<Handoff> {
    let model = Handoff {
        threads: vec![2, 1],
        acquisitions: 2,
        fix,
    };
    model.checker().spawn_bfs().join()
}

#[test]
fn the_model_finds_the_stale_place_of_the_protocol_before_its_fix() {
    let checker = check(Fix::LostPlace);
    for property in [
        "exclusion",
        "fencing tokens rise",
        "no waiter of a client missing from the set",
    ] {
        if let Some(path) = checker.discovery(property) {
            panic!("{property}: {:?}", path.into_actions());
        }
    }
    let path = checker
        .discovery("no waiter behind a stale place")
        .expect("the model no longer sees the stale place");
    println!("{:?}", path.into_actions());
}

#[test]
fn the_model_finds_the_lost_place_of_the_protocol_before_its_fix() {
    let checker = check(Fix::Before);
    let path = checker
        .discovery("no waiter of a client missing from the set")
        .expect("the model no longer sees the lost place");
    println!("{:?}", path.into_actions());
    assert!(checker.discovery("exclusion").is_none());
}

/// The scripts' protocol: every property holds.
#[test]
fn the_handoff_keeps_exclusion_and_rising_tokens_and_forgets_no_waiter() {
    let checker = check(Fix::StalePlace);
    println!("states explored: {}", checker.unique_state_count());
    checker.assert_properties();
}
