//! Waiting for a lock without polling Redis: the per-client gate, the subscriber thread, the
//! pause between attempts and its backoff, and the two waiting loops every lock uses.
//!
//! A loop knows nothing of the lock it waits for: it gets an `attempt` to call, the channel
//! on which the lock's releases are announced, and the style of waiting.
//! - [`contend`]: of the threads of one client waiting for one lock, one at a time (the gate's
//!   leader) attempts in Redis; the others wait in the process.
//! - [`queue`]: every waiting thread holds its own place in a queue kept in Redis, and is
//!   told when its turn comes; one of them (the re-checker) also re-checks now and then.
//!
//! Both subscribe (and wait for Redis to confirm) before an attempt, take the wake-up count
//! before it and wait after it, so that no announcement between the two is missed.

mod backoff;
mod gate;
mod outage;
mod pause;
mod subscriber;

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::error::Result;
use crate::stats::Counters;

pub(crate) use backoff::Backoff;
pub(crate) use gate::{
    Baton, Cohort, Coming, Entered, GatePass, Gates, HoldsBegun, Keeping, Passed, Place, Taker,
    COHORT_PASSES,
};
pub(crate) use outage::Outage;
pub(crate) use pause::Pause;
pub(crate) use subscriber::{Note, Notes, Signal, Subscriber, Subscribers, Subscription};

/// What one acquire attempt found.
pub(crate) enum Attempt<W> {
    /// Taken: what the attempt won (a guard).
    Acquired(W),
    /// Held by someone else (or not our turn) for at most this long, by a holder whose
    /// release is or is not announced.
    Held(Duration, Release),
}

/// Whether a holder's release is announced to the waiters.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Release {
    /// A redmutex client holds the lock: its release is announced, and a waiter re-checks
    /// only in case an announcement went astray.
    Announced,
    /// As `Announced`, to the waiting clients in turn, and a re-check found this many named
    /// before the waiter's client: it re-checks the less often the further back it is, so
    /// that many waiting processes cost Redis about what the first few do (see
    /// [`Pause::wait`]).
    Behind(u32),
    /// Something else holds it (redis-py's `Lock` on a bare key, a hand-written `SET NX
    /// PX`): nothing will announce its release, so a waiter re-checks with the backoff.
    Unannounced,
}

/// How a contending leader's attempt stands, for a lock whose releases name one client.
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct Turn {
    /// Other threads of this client wait in its gate: a lock taken keeps the client among the
    /// lock's waiting clients.
    pub(crate) more: bool,
    /// This client just gave the lock up to the other waiting clients: the attempt waits
    /// behind them rather than take the lock while it stands free.
    pub(crate) after: bool,
    /// The attempt follows a wait in Redis of this client's that has lasted [`OVERDUE`]:
    /// if a release named the client and someone else took the lock meanwhile, the client is
    /// owed the next turn, which the next release hands to it.
    pub(crate) overdue: bool,
    /// The attempt is a re-check: no announcement came during the wait before it, a whole
    /// re-check period or more (not a short wait an attempt asked for, as a client that gave
    /// the lock up does).
    pub(crate) recheck: bool,
    /// The fencing token of a lock a release handed to this client, whose note this leader
    /// took but could not rely on alone: the attempt takes the lock if Redis still holds it
    /// for the client (see [`Handed::Attempt`]).
    pub(crate) claim: Option<u64>,
    /// A release handed this client the lock since its last acquire: the lock passes
    /// between clients, and is likely held by another one now.
    pub(crate) likely_held: bool,
    /// How long a blocking pop behind the attempt, in the same round trip, waits for the note
    /// of a lock handed to the client (see [`Contending::notes`]): a first attempt's, whose
    /// client is likely to be named soon ([`first_pop`]).
    pub(crate) pop: Option<Duration>,
}

/// What a contending leader makes of the note of a lock that a release handed to its client
/// (see [`contend`]).
pub(crate) enum Handed<W> {
    /// It took the lock by the note, without a round trip (or the error that kept it from
    /// holding it).
    Taken(Result<W>),
    /// It cannot rely on the note alone (its client's clock reading of the server is missing,
    /// its lease is fixed or must be acknowledged, it withdrew lately): its next attempt
    /// names the lock's fencing token, and takes the lock if Redis still holds it for the
    /// client.
    Attempt(u64),
}

/// How long a client's leading waiter waits before its client is owed a turn that a named
/// attempt lost: the bound on barging between clients. Five runs of passes within a client
/// ([`COHORT_TIME`](gate::COHORT_TIME)), and past the waits of a busy lock whose clients
/// take turns (4 processes x 1 thread: p99.9 of 4.5 to 6 ms), so that barging keeps the lock
/// busy while waits are short; well under the 50 ms by which no waiter should starve.
pub(crate) const OVERDUE: Duration = Duration::from_millis(10);

/// How long a leader that counts on its client's place among the waiting, kept by a sibling's
/// winning attempt or release (it waits without an attempt of its own), waits before it
/// attempts: until its client is named, with the re-check period as the safety net for an
/// announcement gone astray, as every waiter. The model of the hand-off
/// (`tests/wait_model.rs`) shows that no interleaving loses such a place.
const KEPT_PLACE_WAIT: Duration = Duration::MAX;

/// What the waiting loops use of a client.
#[derive(Clone, Copy)]
pub(crate) struct WaitContext<'a> {
    pub(crate) config: &'a Config,
    pub(crate) counters: &'a Counters,
    pub(crate) subscriber: &'a Subscribers,
    /// Of the contending threads of one lock, the one that attempts.
    pub(crate) gates: &'a Gates,
    /// Of the queued threads of one lock, the one that re-checks.
    pub(crate) rechecks: &'a Gates,
}

/// A contending wait for a lock (see [`contend`]).
pub(crate) struct Contending<'a> {
    /// The lock's gate in this client.
    pub(crate) lock_key: &'a Arc<str>,
    /// The wake channel, and the announcements on it that concern this client.
    pub(crate) channel: &'a Arc<str>,
    pub(crate) filter: Option<Arc<str>>,
    pub(crate) deadline: Option<Instant>,
    /// A failed first attempt's count as coming, handed to the gate on entry.
    pub(crate) coming: Option<Coming<'a>>,
    /// A subscription live before a failed first attempt, and what the attempt found.
    pub(crate) early: Option<Early>,
    /// How the waiter takes a lock passed to it within the client.
    pub(crate) taker: Taker,
    /// Where releases hand the lock to this client and also leave the note in a list of the
    /// client's (a `Mutex`'s on one deployment: `mutex/waiters.lua`): pops the note within
    /// the time given, with a blocking pop on a connection of the caller's.
    pub(crate) notes: Option<PopNote<'a>>,
}

/// Pops the note of a lock handed to the waiter's client, waiting for it up to the time
/// given (see [`Contending::notes`]).
pub(crate) type PopNote<'a> = &'a dyn Fn(Duration) -> Option<String>;

/// The longest a leader waits for its client's note with a blocking pop, which holds a
/// connection meanwhile; a longer wait goes on for the announcement, as every wait does.
/// Past the waits of a lock whose clients take turns (4 processes of 1 thread: p99 0.6 ms).
const POP_FOR: Duration = Duration::from_millis(50);

/// A blocking pop shorter than this is not worth its command.
const POP_AT_LEAST: Duration = Duration::from_millis(1);

/// How long the first attempt of a thread that comes alone for a lock waits for its client's
/// note with a pop behind the attempt, in the same round trip ([`Turn::pop`]), while notes
/// come for the client (`subscription`'s: a release handed it the lock since its last
/// acquire, or within [`POPS_WHILE_NOTED`]; the lock passes between clients): as long as a
/// leader pops after an attempt ([`POP_FOR`], half the response timeout, never past
/// `deadline`); `None` when no note came lately, when first attempts took the lock free since
/// ([`FREE_TAKES_END_POPS`]), or when that is too short to be worth the command. The pop is at
/// Redis when the release that names the client comes, however soon: a pop sent after the
/// attempt's reply misses a release that comes in the meantime (two processes taking turns
/// through a network: the note then waited for the pop at about one hand-off in three), and
/// costs a round trip of its own. The attempt marks a failure that leaves the client no
/// place, and a lock taken, so that the pop returns at once.
pub(crate) fn first_pop(
    config: &Config,
    deadline: Option<Instant>,
    subscription: &Subscription,
) -> Option<Duration> {
    let noted = subscription.named_before() || subscription.noted_before_within(POPS_WHILE_NOTED);
    if !noted || subscription.free_takes() >= FREE_TAKES_END_POPS {
        return None;
    }
    let mut timeout = POP_FOR.min(config.response_timeout / 2);
    if let Some(deadline) = deadline {
        timeout = timeout.min(deadline.saturating_duration_since(Instant::now()));
    }
    (timeout >= POP_AT_LEAST).then_some(timeout)
}

/// After this many first attempts with a pop behind them took the lock free since the last
/// note for the client, first attempts go without a pop until the next note: the lock has
/// stopped passing between clients. A lock contended once among many that are taken free
/// (16 threads over 1,000 names) would otherwise send the acquire script, its mark and a pop
/// on every acquire for [`POPS_WHILE_NOTED`] after each note, where a plain `SET` takes it
/// (there, about 50 acquires of a name by its client). Not after a few: a lock that passes
/// between clients is found free now and then, a few times in a row, and a first attempt
/// without the pop that finds it held costs a round trip more (two processes taking turns
/// through a network: after two free takes, 2.08 round trips per acquisition against 2.00,
/// and 0.91 of a bare token's hand-offs against 0.95).
const FREE_TAKES_END_POPS: u32 = 8;

/// A leader pops only while notes come for its client, the last within this: the lock
/// passes between clients, and a pop is likely to find the next soon. A waiter behind a long
/// hold pops nothing, and idle waiters cost Redis no more commands than before.
const POPS_WHILE_NOTED: Duration = Duration::from_secs(1);

/// A failed first attempt, made outside the gate with a subscription that was live before
/// it: a leader that comes straight from it need not attempt again.
pub(crate) struct Early {
    pub(crate) subscription: Subscription,
    /// The subscription's wake-up count before the attempt.
    pub(crate) seen: u64,
    /// The lock's remaining lease and how its holder releases, as the attempt found them.
    pub(crate) held: (Duration, Release),
    /// The holds begun before the attempt: one of the client's begun since may have given
    /// up the place the attempt made.
    pub(crate) begun: HoldsBegun,
}

/// A queued wait for a lock (see [`queue`]).
pub(crate) struct Queued<'a> {
    /// The lock's re-check gate in this client.
    pub(crate) lock_key: &'a Arc<str>,
    /// The waiter's subscription to its wake channel, and whether to wait for Redis to
    /// confirm it first.
    pub(crate) subscription: Option<Subscription>,
    pub(crate) confirm: bool,
    pub(crate) deadline: Option<Instant>,
    /// Set when the waiter was dropped from the queue as dead.
    pub(crate) dropped: &'a AtomicBool,
}

impl WaitContext<'_> {
    /// Waits up to the response timeout (and never past `deadline`) for Redis to confirm the
    /// subscription of `pause`.
    fn confirm(&self, pause: &Pause, deadline: Option<Instant>) {
        let confirm_by = Instant::now() + self.config.response_timeout;
        pause.confirm(deadline.map_or(confirm_by, |d| d.min(confirm_by)));
    }
}

/// Waits in this client's gate for `lock_key` until this thread is the one that contends in
/// Redis; then listens on the wake channel (for announcements equal to its filter, if any)
/// and, in this order so that no announcement is missed, attempts, and waits for an
/// announcement or a re-check or backoff delay (never longer than the lock's remaining lease
/// nor past `deadline`), until acquired.
///
/// `early` is a subscription that was live before a failed first attempt, with its wake-up
/// count and the lock's remaining lease from then: it saves an attempt here, unless a hold of
/// the client began since that attempt (see [`HoldsBegun`]). So does a
/// [`Baton`] left by the previous leader, which took the lock while this thread waited.
///
/// With a filter (releases name one client), `attempt` is told whether other threads of
/// this client wait in the gate: a lock taken then keeps the client among the lock's waiting
/// clients in Redis, and the leader hands its subscription on to the next. It is also told
/// whether this leader has waited long ([`Turn::overdue`]): then a named client that finds the
/// lock taken is owed the next turn, which the next release hands to it.
///
/// A holder of this client may pass the lock straight to the leader instead of releasing it
/// (lock cohorting): the leader listens for that with how it takes the lock (`taker`), and
/// `take_over`
/// makes what was won of a lock passed to it, without a round trip.
///
/// A release may hand the lock to this client (`mutex/waiters.lua`): the announcement's note
/// is kept for the client, and the leader, before each attempt (or wait without one), takes
/// it out and makes what was won of it with `handed` (see [`Handed`]); so it does at its
/// deadline, before it gives up (the lock came first). Only the thread that took the note out
/// takes that lock: to every attempt of the client it is held by the client.
///
/// A thread whose deadline passes gives up while it is still in the gate: `give_up` gets its
/// place there, asks it whether other threads of its client wait (see
/// [`GatePass::others_wait`]), and withdraws what its attempts claimed before a thread of
/// its client that comes later attempts.
#[cold]
pub(crate) fn contend<W>(
    w: WaitContext<'_>,
    contending: Contending<'_>,
    mut attempt: impl FnMut(Turn) -> Result<Attempt<W>>,
    (mut take_over, mut handed, give_up): (
        impl FnMut(Passed) -> Result<W>,
        impl FnMut(&Note) -> Option<Handed<W>>,
        impl FnOnce(&GatePass<'_>),
    ),
) -> Result<Option<W>> {
    let Contending {
        lock_key,
        channel,
        filter,
        deadline,
        coming,
        early,
        taker,
        notes,
    } = contending;
    let wait = w.counters.contended_wait();
    let mut pass = match w.gates.lead(lock_key, (deadline, Some(taker)), coming) {
        Ok(pass) => pass,
        Err(follower) => {
            give_up(&follower);
            return wait.finish(Ok(None));
        }
    };
    if let Some(passed) = pass.take_barged() {
        return wait.finish(take_over(passed).map(Some));
    }
    // Releases that name one client: its threads pass the turn on (see `attempt` above).
    // Other releases wake every waiter, and each leader attempts.
    let named = filter.is_some();
    let (mut pause, mut skip_attempt) =
        start_leading(w, &pass, (early, deadline, taker), (channel, filter));
    let mut leading = Leading::new(&pass, named, skip_attempt.is_none());
    loop {
        let found = passed_or_handed(&pass, &mut pause, named, (&mut take_over, &mut handed));
        let claim = match found {
            ControlFlow::Break(won) => return wait.finish(won),
            ControlFlow::Continue(claim) => claim,
        };
        // The attempt that names a note's fencing token is not skipped.
        skip_attempt = skip_attempt.filter(|_| claim.is_none());
        let (seen, remaining, release) = match skip_attempt.take() {
            Some(earlier) => earlier,
            None => {
                let turn = leading.turn(&pass, claim);
                match attempt_turn(&pass, &mut pause, turn, &mut attempt) {
                    Ok(ControlFlow::Break(won)) => return wait.finish(Ok(Some(won))),
                    Ok(ControlFlow::Continue(held)) => held,
                    Err(e) => return wait.finish(Err(e)),
                }
            }
        };
        let waiting = (remaining, release, deadline);
        if notes.is_some_and(|pop| popped(w, (&pass, &pause), pop, waiting, taker)) {
            leading.waited = named;
            (leading.silent, skip_attempt) = after_wait(&pass, &pause, named, seen);
            continue;
        }
        if !pause.wait(seen, remaining, release, deadline) {
            let end = at_deadline(
                &pass,
                &mut pause,
                (named, taker),
                (&mut take_over, &mut handed, &mut attempt),
                give_up,
            );
            return wait.finish(end);
        }
        leading.waited = named;
        (leading.silent, skip_attempt) = after_wait(&pass, &pause, named, seen);
    }
}

/// A leader's wait for the note of a lock handed to its client with a blocking pop (see
/// [`Contending::notes`]): its own connection wakes it, one wake-up fewer than through the
/// subscriber thread. Only while notes come for its client ([`POPS_WHILE_NOTED`]), no
/// thread of it holds the lock (whose release passes it on within the client, which a thread
/// in a blocking pop cannot be woken for: it takes no pass meanwhile) and none comes for it
/// (whose first attempt may have a pop behind it: the note it takes out is delivered to this
/// leader, which a thread in a pop of its own would not see), for at most [`POP_FOR`] and
/// half the response timeout, never past the wait's hint or `deadline`.
/// Returns whether a note came (delivered as an announcement's), not one taken already; else
/// the leader waits on as ever, and an announcement that came meanwhile ends that wait at
/// once.
fn popped(
    w: WaitContext<'_>,
    (pass, pause): (&GatePass<'_>, &Pause),
    pop: PopNote<'_>,
    (remaining, release, deadline): (Duration, Release, Option<Instant>),
    taker: Taker,
) -> bool {
    if release == Release::Unannounced
        || !pause.noted_within(POPS_WHILE_NOTED)
        || pass.sibling_holds()
        || pass.others_coming()
    {
        return false;
    }
    let mut timeout = POP_FOR.min(remaining).min(w.config.response_timeout / 2);
    if let Some(deadline) = deadline {
        timeout = timeout.min(deadline.saturating_duration_since(Instant::now()));
    }
    if timeout < POP_AT_LEAST || !pass.stop_listening() {
        return false;
    }
    let note = pop(timeout);
    pass.listen(pause.signal(), taker);
    note.is_some_and(|note| pause.deliver_note(&note))
}

/// A new leader's start: the subscription it waits with (confirmed by Redis when new), its
/// listening for a lock passed within its client, and the attempt it need not make (see
/// [`leader_subscription`]), or need not make first because a sibling holds the lock and
/// its release keeps the client's place.
fn start_leading(
    w: WaitContext<'_>,
    pass: &GatePass<'_>,
    (early, deadline, taker): (Option<Early>, Option<Instant>, Taker),
    (channel, filter): (&Arc<str>, Option<Arc<str>>),
) -> (Pause, Option<Earlier>) {
    let named = filter.is_some();
    let (subscription, earlier) = leader_subscription(w, pass, early, (channel, filter));
    let pause = Pause::new(subscription, w.config);
    if earlier.is_none() {
        w.confirm(&pause, deadline);
    }
    let seen = pause.seen();
    pass.listen(pause.signal(), taker);
    let skip = earlier.or_else(|| {
        sibling_holds(pass, &pause, named).then_some((seen, KEPT_PLACE_WAIT, Release::Announced))
    });
    (pause, skip)
}

/// How a leader's attempts stand across its waits: what its next [`Turn`] says.
struct Leading {
    /// Releases name one client.
    named: bool,
    /// The client just gave the lock up to the other waiting clients, and this leader has
    /// not attempted yet.
    yielded: bool,
    /// Since when this thread has waited in Redis for its client.
    led_at: Instant,
    /// It has waited for an announcement naming its client.
    waited: bool,
    /// Its last wait was a whole re-check period without an announcement.
    silent: bool,
}

impl Leading {
    /// A leader that entered its gate through `pass`, whose first attempt is made (not
    /// skipped) when `attempts_first`.
    fn new(pass: &GatePass<'_>, named: bool, attempts_first: bool) -> Leading {
        Leading {
            named,
            // Only a first attempt before any wait: an attempt after an announcement that
            // named this client takes the lock.
            yielded: pass.entered == Entered::Yielded && attempts_first,
            led_at: Instant::now(),
            waited: false,
            silent: false,
        }
    }

    /// The next attempt's turn, naming the fencing token of a lock handed to the client
    /// (`claim`) if any.
    fn turn(&mut self, pass: &GatePass<'_>, claim: Option<u64>) -> Turn {
        Turn {
            more: self.named && pass.others_inside(),
            // The first attempt of a client that just gave the lock up waits behind the
            // clients it gave it to.
            after: self.named && std::mem::replace(&mut self.yielded, false),
            overdue: self.waited && self.led_at.elapsed() >= OVERDUE,
            recheck: std::mem::replace(&mut self.silent, false),
            claim,
            // An attempt after a wait is the script already.
            likely_held: false,
            pop: None,
        }
    }
}

/// What a leader looks for before it attempts or waits: a lock passed to it, then the note of
/// a lock handed to its client, which it takes (`Break`, with what was won of either), or
/// whose fencing token its next attempt names (see [`Handed::Attempt`]).
fn passed_or_handed<W>(
    pass: &GatePass<'_>,
    pause: &mut Pause,
    named: bool,
    (take_over, handed): (
        impl FnOnce(Passed) -> Result<W>,
        impl FnOnce(&Note) -> Option<Handed<W>>,
    ),
) -> ControlFlow<Result<Option<W>>, Option<u64>> {
    if let Some(passed) = pass.take_passed() {
        return ControlFlow::Break(took_over(pass, pause, named, take_over(passed)));
    }
    match pause.take_note().and_then(|note| handed(&note)) {
        Some(Handed::Taken(won)) => ControlFlow::Break(took_over(pass, pause, named, won)),
        Some(Handed::Attempt(fence)) => ControlFlow::Continue(Some(fence)),
        None => ControlFlow::Continue(None),
    }
}

/// The leader's attempt with `turn`: the lock won (a leader whose client's other threads
/// wait hands its subscription on to the next), or what to wait for: the wake-up count
/// before the attempt, the holder's remaining lease and how it releases.
fn attempt_turn<W>(
    pass: &GatePass<'_>,
    pause: &mut Pause,
    turn: Turn,
    attempt: &mut impl FnMut(Turn) -> Result<Attempt<W>>,
) -> Result<ControlFlow<W, Earlier>> {
    let seen = pause.seen();
    Ok(match attempt(turn)? {
        Attempt::Acquired(won) => {
            if turn.more {
                hand_subscription_on(pass, pause, seen);
            }
            ControlFlow::Break(won)
        }
        Attempt::Held(remaining, release) => ControlFlow::Continue((seen, remaining, release)),
    })
}

/// What a leader does after a wait that began at the wake-up count `seen`: whether its next
/// attempt is a re-check (a whole period passed in silence), and the attempt it skips when it
/// was woken (for a pass that a thread of its client took as it came: see `Gates::lead`)
/// while a sibling holds: that sibling's release passes the lock to it or keeps its client's
/// place, as when the leader began. A wait that ended unwoken attempts, as ever: a sibling
/// whose lease was lost still counts as holding until its guard goes.
fn after_wait(
    pass: &GatePass<'_>,
    pause: &Pause,
    named: bool,
    seen: u64,
) -> (bool, Option<Earlier>) {
    // The count is read before the sibling's hold is looked at: a pass after it wakes the
    // next wait.
    let now_seen = pause.seen();
    let silent = named && pause.waited_whole_period() && now_seen == seen;
    let woken_behind_sibling = now_seen != seen && named && pause.is_live() && pass.sibling_holds();
    let skip = woken_behind_sibling.then_some((now_seen, KEPT_PLACE_WAIT, Release::Announced));
    (silent, skip)
}

/// A leader's deadline passed: no pass may come now; one that came first is taken, and so is
/// a lock handed to its client whose note came (by one last attempt that names it, when the
/// note alone cannot be relied on); else the thread gives up while it is still in its gate.
fn at_deadline<W>(
    pass: &GatePass<'_>,
    pause: &mut Pause,
    (named, taker): (bool, Taker),
    (take_over, handed, attempt): (
        impl FnOnce(Passed) -> Result<W>,
        impl FnOnce(&Note) -> Option<Handed<W>>,
        &mut impl FnMut(Turn) -> Result<Attempt<W>>,
    ),
    give_up: impl FnOnce(&GatePass<'_>),
) -> Result<Option<W>> {
    pass.listen(None, taker);
    if let Some(passed) = pass.take_passed() {
        return took_over(pass, pause, named, take_over(passed));
    }
    match pause.take_note().and_then(|note| handed(&note)) {
        Some(Handed::Taken(won)) => return took_over(pass, pause, named, won),
        Some(Handed::Attempt(fence)) => {
            let turn = Turn {
                claim: Some(fence),
                ..Turn::default()
            };
            if let ControlFlow::Break(won) = attempt_turn(pass, pause, turn, attempt)? {
                return Ok(Some(won));
            }
        }
        None => {}
    }
    give_up(pass);
    Ok(None)
}

/// What a leader `won` of a lock passed to it: with releases that name one client and other
/// threads in the gate, it hands its subscription on (the client keeps its place).
fn took_over<W>(
    pass: &GatePass<'_>,
    pause: &mut Pause,
    named: bool,
    won: Result<W>,
) -> Result<Option<W>> {
    if won.is_ok() && named && pass.others_inside() {
        let seen = pause.seen();
        hand_subscription_on(pass, pause, seen);
    }
    won.map(Some)
}

/// The outcome of an attempt that a leader need not make again: the wake-ups seen before
/// it, the holder's remaining lease, and how the holder releases.
type Earlier = (u64, Duration, Release);

/// The subscription a new leader waits with, and the attempt it need not make: a baton's,
/// when the previous leader left the lock to a sibling and this client waits in Redis for
/// its turn; the early one, when nobody led since the failed first attempt; else a new
/// subscription, and an attempt to make.
fn leader_subscription(
    w: WaitContext<'_>,
    pass: &GatePass<'_>,
    early: Option<Early>,
    (channel, filter): (&Arc<str>, Option<Arc<str>>),
) -> (Option<Subscription>, Option<Earlier>) {
    match (pass.take_baton(), early) {
        (Some(baton), _) => (
            Some(baton.subscription),
            Some((baton.seen, KEPT_PLACE_WAIT, Release::Announced)),
        ),
        (None, Some(early)) if !pass.waited && !pass.held_since(early.begun) => {
            let (ttl, release) = early.held;
            (Some(early.subscription), Some((early.seen, ttl, release)))
        }
        _ => (
            w.subscriber.subscribe(channel, (filter, Notes::Client)),
            None,
        ),
    }
}

/// Whether a sibling holds the lock still, now that this leader listens (for a pass) and
/// its subscription is confirmed (for the announcement of its client's turn, which the
/// sibling's release keeps): then it has nothing to attempt first. Asked only then: a
/// release before was neither a pass to this thread nor surely heard by it.
fn sibling_holds(pass: &GatePass<'_>, pause: &Pause, named: bool) -> bool {
    named && pass.entered == Entered::SiblingHeld && pause.is_live() && pass.sibling_holds()
}

/// Hands this leader's subscription on to the next leader of its client, with the count of
/// wake-ups `seen` before its last attempt (an announcement during the attempt still wakes
/// the next leader).
fn hand_subscription_on(pass: &GatePass<'_>, pause: &mut Pause, seen: u64) {
    if let Some(subscription) = pause.take_subscription() {
        pass.hand_over(Baton { subscription, seen });
    }
}

/// Waits in a queue kept in Redis: attempts (which queues this waiter, or keeps its place),
/// then waits for its own announcement, until acquired or `deadline`; `leave` gives up the
/// place when the wait ends without the lock (but not after an error whose outcome is
/// unknown: its clean-up leaves too).
///
/// Every waiting thread has its own place, but of the threads of one client waiting for one
/// lock only one (the re-checker) also re-checks now and then; the others wait for their own
/// announcement, or until the re-checker's place frees up. An attempt that finds the lock
/// free with another live waiter next tells that waiter again, so the re-checker's attempt
/// covers an announcement lost on its way to anyone, and a hundred waiting threads cost
/// Redis what one does. `dropped` is set (by the renewal thread's heartbeat) when this waiter
/// was dropped from the queue as dead: it then attempts again at once, to join again.
///
/// An announcement that comes with a note handed the lock to this waiter: `handed` makes
/// what was won of the note, without an attempt, or `None` when the note cannot be relied on
/// (then the waiter attempts, as after any announcement).
#[cold]
pub(crate) fn queue<W>(
    w: WaitContext<'_>,
    queued: Queued<'_>,
    (mut attempt, mut handed): (
        impl FnMut() -> Result<Attempt<W>>,
        impl FnMut(&str) -> Option<W>,
    ),
    leave: impl FnOnce(),
) -> Result<Option<W>> {
    let Queued {
        lock_key,
        subscription,
        confirm,
        deadline,
        dropped,
    } = queued;
    let wait = w.counters.contended_wait();
    let mut pause = Pause::new(subscription, w.config);
    if confirm {
        w.confirm(&pause, deadline);
    }
    let mut rechecker = None;
    loop {
        let seen = pause.seen();
        let (remaining, release) = match attempt() {
            Ok(Attempt::Acquired(won)) => return wait.finish(Ok(Some(won))),
            Ok(Attempt::Held(remaining, release)) => (remaining, release),
            Err(e) => {
                if !e.outcome_unknown() {
                    leave();
                }
                return wait.finish(Err(e));
            }
        };
        let waited = loop {
            if rechecker.is_none() {
                rechecker = w.rechecks.try_lead(lock_key);
            }
            if rechecker.is_some() || !pause.is_live() {
                break pause.wait(seen, remaining, release, deadline);
            }
            match pause.wait_woken(seen, deadline) {
                // Woken by an announcement, or the deadline passed.
                Some(waited) => break waited,
                // A re-check period passed in silence: join again if the heartbeat found this
                // waiter dropped from the queue (its process was stalled for a lease, say);
                // else see whether the re-checker left.
                None if dropped.swap(false, Ordering::AcqRel) => break true,
                None => continue,
            }
        };
        if !waited {
            leave();
            return wait.finish(Ok(None));
        }
        if let Some(won) = pause.take_note().and_then(|note| handed(&note.text)) {
            return wait.finish(Ok(Some(won)));
        }
    }
}
