//! The model of the `FairMutex`'s queue (see `tests/wait_model.rs`, which checks it, and
//! `src/primitives/tests/model_conformance.rs`, which holds the scripts to it). It shares
//! Redis's lock key and fencing counter with the `Mutex`'s hand-off model; where that one has
//! waiting clients and a gate per client, this one has a queue of waiting threads in Redis,
//! and a release that hands the lock to the queue's head with a note on the head's channel.

use stateright::{Model, Property};

/// A token: the client, the thread and which of its acquisitions.
pub(crate) type Token = (u8, u8, u8);

/// What a thread is doing.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Thread {
    /// Between acquisitions.
    Idle,
    /// Its first try, which does not queue (`try`), is on its way to Redis.
    Trying { seen: u8 },
    /// Its attempt (`fair_mutex/acquire.lua` with `wait`) is on its way to Redis; `seen`:
    /// the wake-ups it had before.
    Attempting { seen: u8 },
    /// Queued: it waits for a wake-up after `seen`.
    Waiting { seen: u8 },
    /// Holds the lock with this fencing token.
    Holding { token: Token, fence: u32 },
    /// Its release (`fair_mutex/release.lua`) is on its way to Redis.
    Releasing { token: Token },
}

/// A thread, and the wake-ups that reached it: how many, and the note of the last one that
/// handed it the lock (its fencing token).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Worker {
    pub(crate) left: u8,
    pub(crate) now: Thread,
    pub(crate) signal: u8,
    pub(crate) note: Option<u32>,
}

/// Redis's keys of the lock, and the messages on their way to a waiter's channel.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Redis {
    /// The token the lock key holds: its holder's, or the one it was handed to.
    pub(crate) lock: Option<Token>,
    pub(crate) counter: u32,
    /// The queue, in arrival order (every waiter alive: its deadline is not modelled).
    pub(crate) queue: Vec<Token>,
    /// Messages to a waiter, with the note of a hand-over (the fencing token) or without
    /// (told again that the lock is free and it is next).
    pub(crate) in_flight: Vec<(Token, Option<u32>)>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct State {
    pub(crate) redis: Redis,
    pub(crate) threads: Vec<Vec<Worker>>,
    pub(crate) last_fence: u32,
    pub(crate) fence_fell: bool,
    /// A thread took the lock while another waited in the queue ahead of it.
    pub(crate) overtaken: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Action {
    /// A thread calls `lock()`: it tries first without queueing (`true`), or, listening
    /// already on its client's channel, queues at once.
    Lock(u8, u8, bool),
    /// Redis runs a thread's attempt.
    RunAttempt(u8, u8),
    /// A waiting thread wakes: with a note that hands it the lock, it takes the lock without
    /// a round trip (`true`) or attempts (`false`: the note came too late to rely on the
    /// claim); without one, it attempts.
    Wake(u8, u8, bool),
    /// A holder releases.
    Release(u8, u8),
    /// Redis runs a release.
    RunRelease(u8, u8),
    /// Redis delivers the `i`-th message on its way.
    Deliver(usize),
}

/// The fair queue, for clients with these many threads, each making `acquisitions`.
pub(crate) struct FairQueue {
    pub(crate) threads: Vec<u8>,
    pub(crate) acquisitions: u8,
}

impl FairQueue {
    pub(crate) fn worker(s: &State, (c, t): (u8, u8)) -> &Worker {
        &s.threads[c as usize][t as usize]
    }

    fn worker_mut(s: &mut State, (c, t): (u8, u8)) -> &mut Worker {
        &mut s.threads[c as usize][t as usize]
    }

    /// The token of thread `(c, t)`'s current acquisition.
    pub(crate) fn token(s: &State, (c, t): (u8, u8)) -> Token {
        (c, t, Self::worker(s, (c, t)).left)
    }

    /// `fair_mutex/acquire.lua`, queueing (`wait`) or not (`try`): the fencing token when
    /// taken.
    pub(crate) fn acquire(r: &mut Redis, token: Token, queue: bool) -> Option<u32> {
        let head = r.queue.first().copied();
        let free = r.lock.is_none() && head.is_none_or(|h| h == token);
        if r.lock == Some(token) || free {
            // Handed over by a release, or free and its turn.
            r.lock = Some(token);
            if head == Some(token) {
                r.queue.remove(0);
            }
            r.counter += 1;
            return Some(r.counter);
        }
        if r.lock.is_none() {
            if let Some(head) = head {
                // Free, with another waiter next: it is told again.
                r.in_flight.push((head, None));
            }
        }
        if queue && !r.queue.contains(&token) {
            r.queue.push(token);
        }
        None
    }

    /// `hand_on` (`fair_mutex/queue.lua`): the lock goes to the queue's head, with a new
    /// fencing token in the note; with nobody queued it is deleted.
    pub(crate) fn hand_on(r: &mut Redis) {
        if r.queue.is_empty() {
            r.lock = None;
            return;
        }
        let head = r.queue.remove(0);
        r.lock = Some(head);
        r.counter += 1;
        r.in_flight.push((head, Some(r.counter)));
    }

    fn begin_hold(s: &mut State, (c, t): (u8, u8), fence: u32, queued_ahead: bool) {
        if fence <= s.last_fence {
            s.fence_fell = true;
        }
        s.last_fence = fence;
        s.overtaken |= queued_ahead;
        let token = Self::token(s, (c, t));
        Self::worker_mut(s, (c, t)).now = Thread::Holding { token, fence };
    }

    /// The clients of the threads that wait in a state in which nothing can happen any more.
    pub(crate) fn forgotten(&self, s: &State) -> bool {
        let mut next = Vec::new();
        self.actions(s, &mut next);
        next.is_empty() && s.threads.iter().flatten().any(|w| w.now != Thread::Idle)
    }
}

impl Model for FairQueue {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let worker = Worker {
            left: self.acquisitions,
            now: Thread::Idle,
            signal: 0,
            note: None,
        };
        vec![State {
            redis: Redis::default(),
            threads: self
                .threads
                .iter()
                .map(|&n| vec![worker.clone(); n as usize])
                .collect(),
            last_fence: 0,
            fence_fell: false,
            overtaken: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        for (c, threads) in s.threads.iter().enumerate() {
            for (t, w) in threads.iter().enumerate() {
                let (c, t) = (c as u8, t as u8);
                match w.now {
                    Thread::Idle if w.left > 0 => {
                        actions.push(Action::Lock(c, t, true));
                        actions.push(Action::Lock(c, t, false));
                    }
                    Thread::Trying { .. } | Thread::Attempting { .. } => {
                        actions.push(Action::RunAttempt(c, t))
                    }
                    Thread::Waiting { seen } if w.signal > seen => {
                        actions.push(Action::Wake(c, t, false));
                        if w.note.is_some() {
                            actions.push(Action::Wake(c, t, true));
                        }
                    }
                    Thread::Holding { .. } => actions.push(Action::Release(c, t)),
                    Thread::Releasing { .. } => actions.push(Action::RunRelease(c, t)),
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
            Action::Lock(c, t, try_first) => {
                let w = Self::worker_mut(&mut s, (c, t));
                let seen = w.signal;
                w.now = match try_first {
                    true => Thread::Trying { seen },
                    false => Thread::Attempting { seen },
                };
            }
            Action::RunAttempt(c, t) => {
                let (seen, queue) = match Self::worker(last, (c, t)).now {
                    Thread::Trying { seen } => (seen, false),
                    Thread::Attempting { seen } => (seen, true),
                    _ => return None,
                };
                let token = Self::token(last, (c, t));
                let ahead = last.redis.queue.iter().take_while(|&&q| q != token).count();
                match Self::acquire(&mut s.redis, token, queue) {
                    Some(fence) => {
                        let handed = last.redis.lock == Some(token);
                        Self::begin_hold(&mut s, (c, t), fence, ahead > 0 && !handed);
                    }
                    // The failed try subscribes, and queues.
                    None if !queue => {
                        let seen = Self::worker(&s, (c, t)).signal;
                        Self::worker_mut(&mut s, (c, t)).now = Thread::Attempting { seen };
                    }
                    None => Self::worker_mut(&mut s, (c, t)).now = Thread::Waiting { seen },
                }
            }
            Action::Wake(c, t, take_note) => {
                let w = Self::worker_mut(&mut s, (c, t));
                let (note, seen) = (w.note.take(), w.signal);
                match (take_note, note) {
                    (true, Some(fence)) => Self::begin_hold(&mut s, (c, t), fence, false),
                    (true, None) => return None,
                    (false, _) => {
                        Self::worker_mut(&mut s, (c, t)).now = Thread::Attempting { seen }
                    }
                }
            }
            Action::Release(c, t) => {
                let Thread::Holding { token, .. } = Self::worker(last, (c, t)).now else {
                    return None;
                };
                Self::worker_mut(&mut s, (c, t)).now = Thread::Releasing { token };
            }
            Action::RunRelease(c, t) => {
                let Thread::Releasing { token } = Self::worker(last, (c, t)).now else {
                    return None;
                };
                if s.redis.lock == Some(token) {
                    Self::hand_on(&mut s.redis);
                }
                let w = Self::worker_mut(&mut s, (c, t));
                w.left -= 1;
                w.now = Thread::Idle;
            }
            Action::Deliver(i) => {
                let (token, note) = s.redis.in_flight.remove(i);
                let (c, t, _) = token;
                // A waiter's subscription takes only the messages that start with its token.
                if Self::token(&s, (c, t)) == token {
                    let w = Self::worker_mut(&mut s, (c, t));
                    w.signal += 1;
                    if note.is_some() {
                        w.note = note;
                    }
                }
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
            Property::always("first come, first served", |_, s: &State| !s.overtaken),
            Property::always("no forgotten waiter", |m, s| !m.forgotten(s)),
            Property::sometimes("a release hands the lock over", |_, s: &State| {
                s.redis.in_flight.iter().any(|(_, note)| note.is_some())
            }),
        ]
    }
}
