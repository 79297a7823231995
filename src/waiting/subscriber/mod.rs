//! The pub/sub subscriber: for each shard (server) on which this client's threads wait, one
//! dedicated connection and one thread (a "lane"), shared by every waiting thread of the
//! client, that wakes waiters when a release is announced.
//!
//! Pub/sub is a hint. A waiter subscribes (and waits for Redis to confirm) before its attempt,
//! so no announcement after that attempt can be missed while the connection lives; when the
//! connection breaks, every waiter of its lane is woken to retry, and waiters always bound
//! their wait by their backoff delay, so a lost message costs at most one backoff step.
//!
//! On Redis 7 and later the subscriber uses sharded pub/sub (`SSUBSCRIBE`) on the master of
//! each channel's slot, and the scripts announce with `SPUBLISH`: in a Cluster a message stays
//! in its shard instead of crossing the cluster bus to every node. When a slot moves, the
//! server drops its channels' subscriptions; the lane then finds their new shard and hands
//! them to its lane. Before Redis 7, classic pub/sub.

mod lane;
mod push;
mod set;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use parking_lot::{Condvar, Mutex};

use crate::connection::Connections;
use crate::error::Doing;
use crate::fast_hash::FastHashMap;
use lane::LaneThread;
use push::Flavour;
pub(crate) use set::Subscribers;

/// The name the subscriber threads carry.
pub(crate) const THREAD_NAME: &str = "redmutex-notify";

/// A waiter's wake-up signal: a counter that the subscriber bumps, and the note that came
/// with the last message (a lock handed over). Subscriptions to the channels of several
/// servers (a Redlock waiter's) can share one.
#[derive(Default)]
pub(crate) struct Signal {
    generation: Mutex<u64>,
    bumped: Condvar,
    note: Mutex<Option<Box<str>>>,
}

impl Signal {
    /// Wakes the waiter as a message would (a lock passed on within the process).
    pub(crate) fn poke(&self) {
        self.bump();
    }

    fn bump(&self) {
        self.advance();
        self.wake();
    }

    /// Counts a wake-up without waking the waiter yet (see [`wake`](Self::wake)): a waiter
    /// that looks at the count from now on does not wait.
    fn advance(&self) {
        *self.generation.lock() += 1;
    }

    /// Keeps `note` for the waiter and counts a wake-up, without waking it yet.
    fn advance_with(&self, note: &str) {
        *self.note.lock() = Some(Box::from(note));
        self.advance();
    }

    /// Wakes the waiter if it waits, after [`advance`](Self::advance).
    fn wake(&self) {
        self.bumped.notify_all();
    }
}

struct Registration {
    /// Only messages with this payload, or this payload, a space and a note, wake the
    /// waiter; `None`: every message does.
    filter: Option<Arc<str>>,
    signal: Arc<Signal>,
}

impl Registration {
    /// Counts a wake-up of the waiter when `payload` is for it, keeping the note that came
    /// with it, and adds its signal to those to wake.
    fn deliver(&self, payload: &str, woken: &mut Vec<Arc<Signal>>) {
        let note = match self.filter.as_deref().map(|f| payload.strip_prefix(f)) {
            None | Some(Some("")) => None,
            Some(Some(rest)) => match rest.strip_prefix(' ') {
                Some(note) => Some(note),
                None => return,
            },
            Some(None) => return,
        };
        match note {
            Some(note) => self.signal.advance_with(note),
            None => self.signal.advance(),
        }
        woken.push(Arc::clone(&self.signal));
    }
}

#[derive(Default)]
struct Channel {
    registrations: FastHashMap<u64, Registration>,
    /// The lane (shard) that subscribes it; `None` while its shard is being found again.
    lane: Option<usize>,
    /// Subscribed on the lane's live connection (Redis confirmed it).
    confirmed: bool,
    /// When a subscription was sent whose confirmation has not come yet.
    subscribing: Option<Instant>,
    /// An unsubscription was sent and its confirmation has not come yet.
    unsubscribing: bool,
    /// When the last waiter left.
    idle_since: Option<Instant>,
    /// The subscription was lost (its connection broke, or the server dropped it when the
    /// slot moved) while waiters listened: a release meanwhile went unheard, so the waiters
    /// re-check once more when the new subscription is confirmed.
    lost: bool,
    /// On a channel of one client (its waiters' filter), the notes of locks handed to it.
    kept: Option<KeptNotes>,
}

/// The notes of the locks that releases hand to one client on its own channel (a `Mutex`'s:
/// `mutex/waiters.lua`): kept by the channel rather than by a waiter's signal, so that each
/// is taken out once by whichever waiter of the client looks first (several of its threads
/// may listen at once: a leader, and one that attempted before it entered the gate), and one
/// that comes between two leaders' subscriptions waits for the next leader.
struct KeptNotes {
    /// The messages for the client start with its id and a space.
    filter: Arc<str>,
    /// The note with the highest fencing token (its first field) not taken yet.
    note: Option<Box<str>>,
    /// When the client last withdrew from the lock's waiting clients (see
    /// [`Subscription::withdrew`]).
    withdrawn_at: Option<Instant>,
    /// A note came since the last live subscription (see [`Subscription::named_before`]).
    named: bool,
    /// The fencing token of the highest note taken out: a note comes twice (announced, and
    /// popped from the client's list by its leader: see [`Subscription::deliver_note`]), and
    /// is taken once.
    taken: u64,
    /// When the last note came: the lock passes between clients.
    noted_at: Option<Instant>,
    /// First attempts with a pop behind them that took the lock, free, since the last note:
    /// the lock may have stopped passing between clients (see
    /// [`Subscription::free_takes`]).
    free_takes: u32,
}

impl KeptNotes {
    /// Keeps `note` unless a note with a higher fencing token waits (notes can come out of
    /// order across a reconnection).
    /// Returns `false` for a note taken out already (see [`taken`](Self::taken)).
    fn offer(&mut self, note: &str) -> bool {
        self.noted_at = Some(Instant::now());
        self.free_takes = 0;
        if note_fence(note).is_some_and(|fence| fence <= self.taken) {
            return false;
        }
        if self.note.as_deref().and_then(note_fence) < note_fence(note) || self.note.is_none() {
            self.note = Some(Box::from(note));
        }
        self.named = true;
        true
    }
}

/// The fencing token a note starts with.
fn note_fence(note: &str) -> Option<u64> {
    note.split(' ').next().and_then(|f| f.parse().ok())
}

/// A note taken out of a client's channel, and when the client last withdrew from the lock's
/// waiting clients (the lock a note that came from before may hand over is gone).
/// Where the notes that come with a waiter's announcements are kept.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Notes {
    /// By the waiter (a fair lock's: each waiter has its own filter, its token).
    Waiter,
    /// By the channel, for the client whose id is the filter (see [`KeptNotes`]).
    Client,
}

pub(crate) struct Note {
    /// What followed the client's id in the message.
    pub(crate) text: Box<str>,
    /// When the client last withdrew, if it did while the channel was subscribed: a note
    /// from before the withdrawal may come after it.
    pub(crate) withdrawn_at: Option<Instant>,
}

impl Channel {
    /// Wakes every waiter of the channel.
    fn wake_all(&self) {
        for r in self.registrations.values() {
            r.signal.bump();
        }
    }

    /// Counts a wake-up of every waiter of the channel, and adds their signals to those to
    /// wake.
    fn advance_all(&self, woken: &mut Vec<Arc<Signal>>) {
        for r in self.registrations.values() {
            r.signal.advance();
            woken.push(Arc::clone(&r.signal));
        }
    }

    /// Keeps `note` for the channel's client, for whichever of its waiters looks first (see
    /// [`KeptNotes`]), and counts a wake-up of every waiter, adding their signals to `woken`.
    /// Returns whether it was kept: `false` on a channel that keeps no notes, or for a note
    /// taken out already.
    fn keep_note(&mut self, note: &str, woken: &mut Vec<Arc<Signal>>) -> bool {
        let kept = self.kept.as_mut().is_some_and(|kept| kept.offer(note));
        if kept {
            self.advance_all(woken);
        }
        kept
    }
}

#[derive(Default)]
struct State {
    channels: FastHashMap<Arc<str>, Channel>,
}

/// What the client's side and the lane threads share.
struct SubscriberState {
    state: Mutex<State>,
    /// Signalled when a subscription is confirmed or a connection is lost.
    confirmations: Condvar,
    next_id: AtomicU64,
    /// Messages received and reconnections, for `Stats`.
    messages: AtomicU64,
    reconnects: AtomicU64,
    connections: Arc<Connections>,
    /// The start of this client's channels for waking its own lane threads.
    wake_prefix: String,
    /// Set by `shutdown`: no lane is started again.
    stopped: AtomicBool,
}

/// What a caller needs to wake a lane thread that blocks reading its connection.
#[derive(Default)]
struct Link {
    /// The lane's wake channel and how to publish on it, while the lane reads its
    /// connection (subscribed to that channel).
    serving: Mutex<Option<(String, Flavour)>>,
}

struct Lane {
    wake: Sender<()>,
    join: JoinHandle<()>,
    link: Arc<Link>,
}

/// The running lanes, by shard. Lane threads hold it weakly: dropping the client's
/// `Subscriber` drops every lane's wake sender, which ends its thread.
struct Lanes {
    shared: Arc<SubscriberState>,
    running: Mutex<FastHashMap<usize, Lane>>,
}

/// The client's side of the subscriber threads. Clones share them.
#[derive(Clone)]
pub(crate) struct Subscriber {
    lanes: Arc<Lanes>,
}

/// One waiter's interest in one channel (or in one channel on each of several servers,
/// sharing one signal: see [`Subscribers`]). Dropping it ends the interest.
pub(crate) struct Subscription {
    shared: Arc<SubscriberState>,
    channel: Arc<str>,
    id: u64,
    signal: Arc<Signal>,
    /// The same channel on other servers, sharing `signal`.
    others: Vec<Subscription>,
    /// How many of this one and `others` must be live for the whole to be.
    needed: usize,
    /// See [`named_before`](Self::named_before).
    named_before: bool,
    /// When the last note for the client came on the channel, as of the subscription (see
    /// [`Subscriber::subscribe_if_live`]).
    noted_at: Option<Instant>,
    /// See [`free_takes`](Self::free_takes).
    free_takes: u32,
    /// Since when the channel had no other waiter, as of the subscription (`None`: it had
    /// some); see [`end_unneeded`](Self::end_unneeded).
    idle_before: Option<Instant>,
    /// Ended already, by [`end_unneeded`](Self::end_unneeded): dropping it does nothing.
    ended: bool,
}

impl Subscriber {
    /// `wake_prefix` starts the names of the channels on which the client wakes its own lane
    /// threads.
    pub(crate) fn new(connections: Arc<Connections>, wake_prefix: String) -> Self {
        let shared = Arc::new(SubscriberState {
            state: Mutex::new(State::default()),
            confirmations: Condvar::new(),
            next_id: AtomicU64::new(1),
            messages: AtomicU64::new(0),
            reconnects: AtomicU64::new(0),
            connections,
            wake_prefix,
            stopped: AtomicBool::new(false),
        });
        Subscriber {
            lanes: Arc::new(Lanes {
                shared,
                running: Mutex::new(FastHashMap::default()),
            }),
        }
    }

    fn shared(&self) -> &Arc<SubscriberState> {
        &self.lanes.shared
    }

    /// Registers interest in `channel` only if it is subscribed and confirmed already (an
    /// attempt made after this cannot miss an announcement), bumping `signal` on a wake-up.
    /// Cheap (no round trip, no wake-up).
    /// The subscription tells whether a note came for the client since
    /// the last such call on the channel ([`Subscription::named_before`]), and when the last
    /// came ([`Subscription::noted_before_within`]).
    pub(crate) fn subscribe_if_live(
        &self,
        channel: &Arc<str>,
        (filter, notes): (Option<Arc<str>>, Notes),
        signal: Arc<Signal>,
    ) -> Option<Subscription> {
        let shared = self.shared();
        let mut state = shared.state.lock();
        let entry = state.channels.get_mut(channel)?;
        if !entry.confirmed {
            return None;
        }
        let (named, noted_at, free_takes) = match entry.kept.as_mut() {
            Some(k) => (std::mem::take(&mut k.named), k.noted_at, k.free_takes),
            None => (false, None, 0),
        };
        let idle_before = entry.idle_since;
        let mut subscription = register(shared, entry, channel, (filter, notes), signal);
        subscription.named_before = named;
        subscription.noted_at = noted_at;
        subscription.free_takes = free_takes;
        subscription.idle_before = idle_before;
        Some(subscription)
    }

    /// Registers interest in `channel` (only in messages equal to `filter`, if given, or that
    /// and a note, kept as `notes` says), starting the lane of its shard when needed, bumping
    /// `signal` on a wake-up (a signal shared with subscriptions of other clients wakes one
    /// waiter from any of them). Returns `None` when the thread cannot be started; the caller
    /// then waits with backoff alone.
    pub(crate) fn subscribe(
        &self,
        channel: &Arc<str>,
        (filter, notes): (Option<Arc<str>>, Notes),
        signal: Arc<Signal>,
    ) -> Option<Subscription> {
        let shared = self.shared();
        let shard = shared.connections.shard_of(channel);
        let (subscription, needs_subscribe, lane) = {
            let mut state = shared.state.lock();
            let entry = state.channels.entry(Arc::clone(channel)).or_default();
            if !entry.confirmed && entry.subscribing.is_none() {
                entry.lane = Some(shard);
            }
            let lane = entry.lane.unwrap_or(shard);
            (
                register(shared, entry, channel, (filter, notes), signal),
                !entry.confirmed,
                lane,
            )
        };
        if !self.lanes.ensure(lane, needs_subscribe) {
            return None;
        }
        Some(subscription)
    }

    /// The client whose channel `channel` is just withdrew from the lock's waiting clients,
    /// which gave up a lock handed to it: a note kept now is of that lock, and one that comes
    /// from now on may be (see [`Note::withdrawn_at`]).
    pub(crate) fn withdrew(&self, channel: &str) {
        let mut state = self.shared().state.lock();
        if let Some(kept) = state
            .channels
            .get_mut(channel)
            .and_then(|c| c.kept.as_mut())
        {
            kept.note = None;
            kept.withdrawn_at = Some(Instant::now());
        }
    }

    /// Messages received and reconnections so far.
    pub(crate) fn counters(&self) -> (u64, u64) {
        let shared = self.shared();
        (
            shared.messages.load(Ordering::Relaxed),
            shared.reconnects.load(Ordering::Relaxed),
        )
    }

    /// Stops the threads for good and, with `wait`, waits for them; every waiter is woken.
    /// Without `wait` (the last handle dropped), each ends on its own when its read returns.
    pub(crate) fn shutdown(&self, wait: bool) {
        let shared = self.shared();
        shared.stopped.store(true, Ordering::Release);
        let lanes: Vec<Lane> = self.lanes.running.lock().drain().map(|(_, l)| l).collect();
        for Lane { wake, join, .. } in lanes {
            drop(wake);
            // Not from the lane's own thread (an event handler there).
            if !wait || join.thread().id() == std::thread::current().id() {
                continue;
            }
            if join.join().is_err() {
                log::warn!("redmutex: a subscriber thread panicked");
            }
        }
        let state = shared.state.lock();
        for channel in state.channels.values() {
            channel.wake_all();
        }
    }
}

/// Adds a waiter to a channel's entry (under the state lock).
fn register(
    shared: &Arc<SubscriberState>,
    entry: &mut Channel,
    channel: &Arc<str>,
    (filter, notes): (Option<Arc<str>>, Notes),
    signal: Arc<Signal>,
) -> Subscription {
    let id = shared.next_id.fetch_add(1, Ordering::Relaxed);
    entry.idle_since = None;
    if let (Notes::Client, Some(filter), None) = (notes, &filter, &entry.kept) {
        entry.kept = Some(KeptNotes {
            filter: Arc::clone(filter),
            note: None,
            withdrawn_at: None,
            named: false,
            taken: 0,
            noted_at: None,
            free_takes: 0,
        });
    }
    entry.registrations.insert(
        id,
        Registration {
            filter,
            signal: Arc::clone(&signal),
        },
    );
    Subscription {
        shared: Arc::clone(shared),
        channel: Arc::clone(channel),
        id,
        signal,
        others: Vec::new(),
        needed: 1,
        named_before: false,
        noted_at: None,
        free_takes: 0,
        idle_before: None,
        ended: false,
    }
}

impl Lanes {
    /// Makes sure the lane of `shard` runs, and (`wake`) that it looks at its channels now.
    /// Returns `false` when its thread cannot be started.
    fn ensure(self: &Arc<Self>, shard: usize, wake: bool) -> bool {
        let mut running = self.running.lock();
        if let Some(lane) = running.get(&shard) {
            if !lane.join.is_finished() {
                if wake {
                    let _ = lane.wake.try_send(());
                    let link = Arc::clone(&lane.link);
                    drop(running);
                    self.wake_reader(&link);
                }
                return true;
            }
        }
        if self.shared.stopped.load(Ordering::Acquire) {
            return false;
        }
        let (wake_tx, wake_rx) = crossbeam_channel::bounded(1);
        let link = Arc::new(Link::default());
        let thread = LaneThread::new(
            Arc::clone(&self.shared),
            Arc::downgrade(self),
            shard,
            Arc::clone(&link),
            wake_rx,
        );
        match std::thread::Builder::new()
            .name(THREAD_NAME.to_owned())
            .spawn(move || thread.run())
        {
            Ok(join) => {
                running.insert(
                    shard,
                    Lane {
                        wake: wake_tx,
                        join,
                        link,
                    },
                );
                true
            }
            Err(e) => {
                log::warn!("redmutex: cannot start a subscriber thread: {e}");
                false
            }
        }
    }

    /// Wakes a lane thread blocked reading its connection, so that it subscribes now. Best
    /// effort: it looks at its state every second anyway.
    fn wake_reader(&self, link: &Link) {
        let Some((channel, flavour)) = link.serving.lock().clone() else {
            return;
        };
        let doing = Doing::work("waking the subscriber");
        let result = self.shared.connections.call(&channel, doing, |c| {
            redis::cmd(flavour.publish())
                .arg(&channel)
                .arg("wake")
                .query::<i64>(c)
        });
        if let Err(e) = result {
            log::debug!("redmutex: {e}");
        }
    }
}

/// Hands channels that lost their lane to the lanes of their shards now, starting those.
fn reassign(shared: &SubscriberState, lanes: &Weak<Lanes>, channels: Vec<Arc<str>>) {
    if channels.is_empty() {
        return;
    }
    let shards: Vec<usize> = channels
        .iter()
        .map(|c| shared.connections.shard_of(c))
        .collect();
    let mut wanted: Vec<usize> = Vec::new();
    {
        let mut state = shared.state.lock();
        for (channel, shard) in channels.iter().zip(shards) {
            if state
                .channels
                .get(channel)
                .is_some_and(|e| e.lane.is_none() && e.registrations.is_empty())
            {
                state.channels.remove(channel);
                continue;
            }
            if let Some(entry) = state.channels.get_mut(channel) {
                if entry.lane.is_none() {
                    entry.lane = Some(shard);
                    if !wanted.contains(&shard) {
                        wanted.push(shard);
                    }
                }
            }
        }
    }
    if let Some(lanes) = lanes.upgrade() {
        for shard in wanted {
            lanes.ensure(shard, true);
        }
    }
}

impl Subscription {
    /// One subscription of `parts`, each to the same channel on another server and sharing
    /// one signal, live while `needed` of them are. `None` when `parts` is empty.
    pub(crate) fn joined(mut parts: Vec<Subscription>, needed: usize) -> Option<Subscription> {
        if parts.is_empty() {
            return None;
        }
        let mut first = parts.remove(0);
        first.others = parts;
        first.needed = needed;
        Some(first)
    }

    /// Waits until Redis confirmed the subscription, or `deadline`. Returns whether confirmed
    /// (on as many servers as the subscription needs).
    pub(crate) fn wait_confirmed(&self, deadline: Instant) -> bool {
        if self.others.is_empty() {
            return self.wait_confirmed_here(deadline);
        }
        let confirmed = usize::from(self.wait_confirmed_here(deadline))
            + self
                .others
                .iter()
                .filter(|o| o.wait_confirmed_here(deadline))
                .count();
        confirmed >= self.needed
    }

    fn wait_confirmed_here(&self, deadline: Instant) -> bool {
        let mut state = self.shared.state.lock();
        loop {
            if state
                .channels
                .get(&self.channel)
                .is_some_and(|c| c.confirmed)
            {
                return true;
            }
            if self
                .shared
                .confirmations
                .wait_until(&mut state, deadline)
                .timed_out()
            {
                return false;
            }
        }
    }

    /// Whether the subscription is live now (confirmed on a working connection, on as many
    /// servers as it needs).
    pub(crate) fn is_live(&self) -> bool {
        if self.others.is_empty() {
            return self.is_live_here();
        }
        let live = usize::from(self.is_live_here())
            + self.others.iter().filter(|o| o.is_live_here()).count();
        live >= self.needed
    }

    fn is_live_here(&self) -> bool {
        self.shared
            .state
            .lock()
            .channels
            .get(&self.channel)
            .is_some_and(|c| c.confirmed)
    }

    /// Whether, when this subscription was made by [`Subscriber::subscribe_if_live`], the last
    /// note for its client had come within `within` of now (without the subscriber's lock,
    /// which [`noted_within`](Self::noted_within) takes).
    pub(crate) fn noted_before_within(&self, within: Duration) -> bool {
        self.noted_at.is_some_and(|at| at.elapsed() < within)
    }

    /// Whether a note came for this subscription's client within `within`: the lock passes
    /// between clients now, and the next is likely to come soon.
    pub(crate) fn noted_within(&self, within: Duration) -> bool {
        let state = self.shared.state.lock();
        state
            .channels
            .get(&self.channel)
            .and_then(|c| c.kept.as_ref())
            .and_then(|k| k.noted_at)
            .is_some_and(|at| at.elapsed() < within)
    }

    /// Delivers `note`, popped from its client's list of notes (`mutex/waiters.lua`) rather
    /// than announced, as the subscriber delivers an announcement's: kept by the channel (the
    /// announcement of the same note is not kept again once taken), and a wake-up counted for
    /// each waiter of the channel, this one included. Returns whether it was kept: `false`
    /// for a note taken out already (its announcement came first).
    pub(crate) fn deliver_note(&self, note: &str) -> bool {
        let mut woken = Vec::new();
        let kept = self
            .shared
            .state
            .lock()
            .channels
            .get_mut(&self.channel)
            .is_some_and(|channel| channel.keep_note(note, &mut woken));
        for signal in woken {
            signal.wake();
        }
        kept
    }

    /// The signal that wakes this waiter, for a thread that passes it a lock.
    pub(crate) fn signal(&self) -> Arc<Signal> {
        Arc::clone(&self.signal)
    }

    /// The current wake-up count; pass it to [`wait`](Self::wait).
    pub(crate) fn seen(&self) -> u64 {
        *self.signal.generation.lock()
    }

    /// The note of the last message that woke this waiter with one, taken out; on a channel
    /// that keeps its client's notes, the highest note not taken yet, whoever it woke.
    pub(crate) fn take_note(&self) -> Option<Note> {
        let mut state = self.shared.state.lock();
        if let Some(kept) = state
            .channels
            .get_mut(&self.channel)
            .and_then(|c| c.kept.as_mut())
        {
            let withdrawn_at = kept.withdrawn_at;
            let text = kept.note.take()?;
            kept.taken = kept.taken.max(note_fence(&text).unwrap_or(0));
            return Some(Note { text, withdrawn_at });
        }
        drop(state);
        let text = self.signal.note.lock().take()?;
        Some(Note {
            text,
            withdrawn_at: None,
        })
    }

    /// Whether a release named this client on this channel (a note of a lock handed to it)
    /// between the last live subscription to it and this one (see
    /// [`Subscriber::subscribe_if_live`]): then the lock passes between clients, and is likely
    /// held by another when this client wants it again.
    pub(crate) fn named_before(&self) -> bool {
        self.named_before || self.others.iter().any(Subscription::named_before)
    }

    /// How many first attempts with a pop behind them took the lock, free, between the last
    /// note for the client and this subscription (see [`end_unneeded`](Self::end_unneeded)):
    /// past a few, the lock has stopped passing between clients, and another pop behind a
    /// first attempt would likely be spent on a free lock (`waiting::first_pop`).
    pub(crate) fn free_takes(&self) -> u32 {
        self.others
            .iter()
            .map(Subscription::free_takes)
            .fold(self.free_takes, u32::max)
    }

    /// Ends a subscription that a first attempt made, which took the lock: the subscription
    /// was not needed. The channel's idle time runs on from before it, so that a channel
    /// that only such attempts touch is dropped after its linger time, as if they never came
    /// (a lock once contended, then taken free by every acquire, would otherwise keep its
    /// channel, and each acquire would register with the subscriber and leave it again).
    /// `popped`: a pop rode behind the attempt, and is counted among the
    /// [`free_takes`](Self::free_takes).
    pub(crate) fn end_unneeded(mut self, popped: bool) {
        self.end(true, popped);
    }

    /// Ends the interest, here and on the other servers. When this was the channel's last
    /// waiter, the channel is idle from now, or (`unneeded`) from before the subscription;
    /// `free_take` counts a free take by a first attempt with a pop behind it.
    fn end(&mut self, unneeded: bool, free_take: bool) {
        self.ended = true;
        for other in &mut self.others {
            other.end(unneeded, free_take);
        }
        let idle_since = self.idle_before.filter(|_| unneeded);
        let mut state = self.shared.state.lock();
        if let Some(entry) = state.channels.get_mut(&self.channel) {
            entry.registrations.remove(&self.id);
            if let (true, Some(kept)) = (free_take, entry.kept.as_mut()) {
                kept.free_takes = kept.free_takes.saturating_add(1);
            }
            if entry.registrations.is_empty() {
                if entry.lane.is_none() && !entry.confirmed {
                    // Between lanes: nothing to unsubscribe.
                    state.channels.remove(&self.channel);
                } else {
                    entry.idle_since = Some(idle_since.unwrap_or_else(Instant::now));
                }
            }
        }
    }

    /// Waits until a wake-up after `seen`, or `until`. Returns whether woken.
    pub(crate) fn wait(&self, seen: u64, until: Instant) -> bool {
        let mut generation = self.signal.generation.lock();
        while *generation == seen {
            if self
                .signal
                .bumped
                .wait_until(&mut generation, until)
                .timed_out()
            {
                return *generation != seen;
            }
        }
        true
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        if !self.ended {
            self.end(false, false);
        }
    }
}
