//! The pub/sub subscriber: one dedicated connection and one thread per client, shared by every
//! waiting thread of that client, that wakes waiters when a release is announced.
//!
//! Pub/sub is a hint. A waiter subscribes (and waits for Redis to confirm) before its attempt,
//! so no announcement after that attempt can be missed while the connection lives; when the
//! connection breaks, every waiter is woken to retry, and waiters always bound their wait by
//! their backoff delay, so a lost message costs at most one backoff step.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use parking_lot::{Condvar, Mutex};

use crate::connection::Connections;
use crate::error::Doing;
use crate::fast_hash::FastHashMap;

/// The name the subscriber thread carries.
pub(crate) const THREAD_NAME: &str = "redmutex-notify";

/// How long the thread blocks reading messages before it looks at its state anyway (new
/// subscriptions wake it sooner, with a message on its own wake channel).
const POLL: Duration = Duration::from_secs(1);

/// How long a channel stays subscribed after its last waiter left: under steady contention
/// waiters come and go, and re-subscribing each time would cost a round trip per wait.
const LINGER: Duration = Duration::from_secs(2);

/// The longest pause between reconnection attempts.
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(2);

/// A waiter's wake-up signal: a counter that the subscriber bumps.
#[derive(Default)]
struct Signal {
    generation: Mutex<u64>,
    bumped: Condvar,
}

impl Signal {
    fn bump(&self) {
        *self.generation.lock() += 1;
        self.bumped.notify_all();
    }
}

struct Registration {
    /// Only messages with this payload wake the waiter; `None`: every message does.
    filter: Option<Arc<str>>,
    signal: Arc<Signal>,
}

#[derive(Default)]
struct Channel {
    registrations: FastHashMap<u64, Registration>,
    /// Subscribed on the live connection (Redis confirmed it).
    confirmed: bool,
    /// A `SUBSCRIBE` was sent and its confirmation has not come yet.
    subscribing: bool,
    /// An `UNSUBSCRIBE` was sent and its confirmation has not come yet.
    unsubscribing: bool,
    /// When the last waiter left.
    idle_since: Option<Instant>,
}

#[derive(Default)]
struct State {
    channels: FastHashMap<Arc<str>, Channel>,
}

struct Shared {
    state: Mutex<State>,
    /// Signalled when a subscription is confirmed or the connection is lost.
    confirmations: Condvar,
    next_id: AtomicU64,
    /// Messages received and reconnections, for `Stats`.
    messages: AtomicU64,
    reconnects: AtomicU64,
    /// The thread is reading its connection (subscribed to the wake channel): a message
    /// there, not the in-process channel, wakes it.
    serving: AtomicBool,
    /// This client's own channel for waking the thread.
    wake_channel: String,
}

struct Worker {
    wake: Sender<()>,
    join: JoinHandle<()>,
}

/// The client's side of the subscriber thread.
pub(crate) struct Subscriber {
    shared: Arc<Shared>,
    worker: Mutex<Option<Worker>>,
    /// For the subscriber's connections and publishing on the wake channel.
    connections: Arc<Connections>,
    /// Set by `shutdown`: the thread is not started again.
    stopped: AtomicBool,
}

/// One waiter's interest in one channel. Dropping it ends the interest.
pub(crate) struct Subscription {
    shared: Arc<Shared>,
    channel: Arc<str>,
    id: u64,
    signal: Arc<Signal>,
}

impl Subscriber {
    pub(crate) fn new(connections: Arc<Connections>, wake_channel: String) -> Self {
        Subscriber {
            shared: Arc::new(Shared {
                state: Mutex::new(State::default()),
                confirmations: Condvar::new(),
                next_id: AtomicU64::new(1),
                messages: AtomicU64::new(0),
                reconnects: AtomicU64::new(0),
                serving: AtomicBool::new(false),
                wake_channel,
            }),
            worker: Mutex::new(None),
            connections,
            stopped: AtomicBool::new(false),
        }
    }

    /// Registers interest in `channel` only if it is subscribed and confirmed already: an
    /// attempt made after this cannot miss an announcement. Cheap (no round trip, no wake-up).
    pub(crate) fn subscribe_if_live(
        &self,
        channel: &Arc<str>,
        filter: Option<Arc<str>>,
    ) -> Option<Subscription> {
        let mut state = self.shared.state.lock();
        let entry = state.channels.get_mut(channel)?;
        if !entry.confirmed {
            return None;
        }
        Some(self.register(entry, channel, filter))
    }

    /// Adds a waiter to a channel's entry (under the state lock).
    fn register(
        &self,
        entry: &mut Channel,
        channel: &Arc<str>,
        filter: Option<Arc<str>>,
    ) -> Subscription {
        let id = self.shared.next_id.fetch_add(1, Ordering::Relaxed);
        let signal = Arc::new(Signal::default());
        entry.idle_since = None;
        entry.registrations.insert(
            id,
            Registration {
                filter,
                signal: Arc::clone(&signal),
            },
        );
        Subscription {
            shared: Arc::clone(&self.shared),
            channel: Arc::clone(channel),
            id,
            signal,
        }
    }

    /// Registers interest in `channel` (only in messages equal to `filter`, if given), starting
    /// the subscriber thread when needed. Returns `None` when the thread cannot be started;
    /// the caller then waits with backoff alone.
    pub(crate) fn subscribe(
        &self,
        channel: &Arc<str>,
        filter: Option<Arc<str>>,
    ) -> Option<Subscription> {
        let (subscription, needs_subscribe) = {
            let mut state = self.shared.state.lock();
            let entry = state.channels.entry(Arc::clone(channel)).or_default();
            (self.register(entry, channel, filter), !entry.confirmed)
        };
        if !self.ensure_running(needs_subscribe) {
            return None;
        }
        Some(subscription)
    }

    fn ensure_running(&self, wake: bool) -> bool {
        let mut worker = self.worker.lock();
        if let Some(w) = worker.as_ref() {
            if !w.join.is_finished() {
                if wake {
                    let _ = w.wake.try_send(());
                    drop(worker);
                    if self.shared.serving.load(Ordering::Acquire) {
                        self.wake_reader();
                    }
                }
                return true;
            }
        }
        if self.stopped.load(Ordering::Acquire) {
            return false;
        }
        let (wake_tx, wake_rx) = crossbeam_channel::bounded(1);
        let thread = SubscriberThread {
            shared: Arc::clone(&self.shared),
            connections: Arc::clone(&self.connections),
            response_timeout: self
                .connections
                .server(&self.shared.wake_channel)
                .response_timeout,
            wake: wake_rx,
        };
        match std::thread::Builder::new()
            .name(THREAD_NAME.to_owned())
            .spawn(move || thread.run())
        {
            Ok(join) => {
                *worker = Some(Worker {
                    wake: wake_tx,
                    join,
                });
                true
            }
            Err(e) => {
                log::warn!("redmutex: cannot start the subscriber thread: {e}");
                false
            }
        }
    }

    /// Wakes a thread blocked reading its connection, so that it subscribes now. Best effort:
    /// it looks at its state every `POLL` anyway.
    fn wake_reader(&self) {
        let doing = Doing::work("waking the subscriber");
        let channel = &self.shared.wake_channel;
        let result = self.connections.call(channel, doing, |c| {
            redis::cmd("PUBLISH")
                .arg(channel)
                .arg("wake")
                .query::<i64>(c)
        });
        if let Err(e) = result {
            log::debug!("redmutex: {e}");
        }
    }

    /// Messages received and reconnections so far.
    pub(crate) fn counters(&self) -> (u64, u64) {
        (
            self.shared.messages.load(Ordering::Relaxed),
            self.shared.reconnects.load(Ordering::Relaxed),
        )
    }

    /// Stops the thread for good and waits for it; every waiter is woken.
    pub(crate) fn shutdown(&self) {
        self.stopped.store(true, Ordering::Release);
        let worker = self.worker.lock().take();
        if let Some(Worker { wake, join }) = worker {
            drop(wake);
            if join.join().is_err() {
                log::warn!("redmutex: the subscriber thread panicked");
            }
        }
        let state = self.shared.state.lock();
        for channel in state.channels.values() {
            for r in channel.registrations.values() {
                r.signal.bump();
            }
        }
    }
}

impl Subscription {
    /// Waits until Redis confirmed the subscription, or `deadline`. Returns whether confirmed.
    pub(crate) fn wait_confirmed(&self, deadline: Instant) -> bool {
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

    /// Whether the subscription is live now (confirmed on a working connection).
    pub(crate) fn is_live(&self) -> bool {
        self.shared
            .state
            .lock()
            .channels
            .get(&self.channel)
            .is_some_and(|c| c.confirmed)
    }

    /// The current wake-up count; pass it to [`wait`](Self::wait).
    pub(crate) fn seen(&self) -> u64 {
        *self.signal.generation.lock()
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
        let mut state = self.shared.state.lock();
        if let Some(entry) = state.channels.get_mut(&self.channel) {
            entry.registrations.remove(&self.id);
            if entry.registrations.is_empty() {
                entry.idle_since = Some(Instant::now());
            }
        }
    }
}

struct SubscriberThread {
    shared: Arc<Shared>,
    connections: Arc<Connections>,
    response_timeout: Duration,
    wake: Receiver<()>,
}

/// Why a connection's loop ended.
enum Exit {
    Stop,
    Broken(redis::RedisError),
}

impl SubscriberThread {
    fn run(self) {
        let mut reconnect_delay = Duration::from_millis(50);
        loop {
            if !self.wait_for_work() {
                return;
            }
            let generation = self.connections.generation();
            let conn = self
                .connections
                .subscriber_connection(&self.shared.wake_channel)
                .and_then(|c| {
                    c.set_read_timeout(Some(POLL))?;
                    Ok(c)
                });
            let mut conn = match conn {
                Ok(conn) => conn,
                Err(e) => {
                    log::debug!("redmutex: subscriber cannot connect: {e}");
                    self.connection_lost();
                    if !self.pause(reconnect_delay) {
                        return;
                    }
                    reconnect_delay = (reconnect_delay * 2).min(MAX_RECONNECT_DELAY);
                    continue;
                }
            };
            match self.serve(&mut conn, generation) {
                Exit::Stop => {
                    self.connection_lost();
                    return;
                }
                Exit::Broken(e) => {
                    log::debug!("redmutex: subscriber connection lost: {e}");
                    self.shared.reconnects.fetch_add(1, Ordering::Relaxed);
                    self.connection_lost();
                    reconnect_delay = Duration::from_millis(50);
                    if !self.pause(reconnect_delay) {
                        return;
                    }
                }
            }
        }
    }

    /// Blocks while no channel is wanted. Returns `false` when the client is gone.
    fn wait_for_work(&self) -> bool {
        loop {
            if self.stopped() {
                return false;
            }
            if self.has_channels() {
                return true;
            }
            match self.wake.recv_timeout(LINGER) {
                Ok(()) | Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => return false,
            }
        }
    }

    fn pause(&self, delay: Duration) -> bool {
        !matches!(
            self.wake.recv_timeout(delay),
            Err(RecvTimeoutError::Disconnected)
        )
    }

    fn stopped(&self) -> bool {
        matches!(self.wake.try_recv(), Err(TryRecvError::Disconnected))
    }

    fn has_channels(&self) -> bool {
        !self.shared.state.lock().channels.is_empty()
    }

    /// Marks every channel unsubscribed and wakes every waiter, so that each retries now and
    /// then waits with backoff until the subscription is back.
    fn connection_lost(&self) {
        let mut state = self.shared.state.lock();
        for channel in state.channels.values_mut() {
            channel.confirmed = false;
            channel.subscribing = false;
            channel.unsubscribing = false;
            for r in channel.registrations.values() {
                r.signal.bump();
            }
        }
        state.channels.retain(|_, c| !c.registrations.is_empty());
        drop(state);
        self.shared.confirmations.notify_all();
    }

    /// Serves one connection until it breaks or the client is gone.
    ///
    /// The connection speaks RESP3: confirmations and messages arrive as push frames, each
    /// naming its channel, so a channel counts as subscribed exactly when Redis confirmed it
    /// (with RESP2, a `SUBSCRIBE` of several channels leaves confirmations on the wire that a
    /// later command would take for its own, and a waiter could rely on a subscription that
    /// was not made yet). Commands are written without waiting; replies are read in one place.
    fn serve(&self, conn: &mut redis::Connection, generation: u64) -> Exit {
        let wake = [self.shared.wake_channel.clone()];
        if let Err(e) = send(conn, "SUBSCRIBE", &wake) {
            return Exit::Broken(e);
        }
        // The wake channel's confirmation, within the response timeout.
        let deadline = Instant::now() + self.response_timeout;
        loop {
            match self.read(conn) {
                Ok(Some(Push::Subscribed(channel))) if channel == wake[0] => break,
                Ok(Some(push)) => self.handle(push),
                Ok(None) if Instant::now() < deadline => {}
                Ok(None) => {
                    return Exit::Broken(redis::RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        "the subscription was not confirmed in time",
                    )))
                }
                Err(e) => return Exit::Broken(e),
            }
        }
        self.shared.serving.store(true, Ordering::Release);
        let exit = self.serve_subscribed(conn, generation);
        self.shared.serving.store(false, Ordering::Release);
        exit
    }

    fn serve_subscribed(&self, conn: &mut redis::Connection, generation: u64) -> Exit {
        loop {
            if self.stopped() {
                return Exit::Stop;
            }
            if self.connections.generation() != generation {
                // The deployment's servers changed (a failover): follow them.
                return Exit::Broken(redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "the master changed",
                )));
            }
            let (subscribe, unsubscribe) = self.pending_changes();
            if !subscribe.is_empty() {
                if let Err(e) = send(conn, "SUBSCRIBE", &subscribe) {
                    return Exit::Broken(e);
                }
            }
            if !unsubscribe.is_empty() {
                if let Err(e) = send(conn, "UNSUBSCRIBE", &unsubscribe) {
                    return Exit::Broken(e);
                }
            }
            if !self.has_channels() {
                // Nothing to listen to: keep the connection and sleep until a waiter comes.
                match self.wake.recv_timeout(LINGER) {
                    Ok(()) | Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => return Exit::Stop,
                }
            }
            match self.read(conn) {
                Ok(Some(push)) => self.handle(push),
                Ok(None) => {}
                Err(e) => return Exit::Broken(e),
            }
        }
    }

    /// Reads one frame, waiting at most `POLL`. `Ok(None)` when nothing came, or something
    /// that is not for us.
    fn read(&self, conn: &mut redis::Connection) -> redis::RedisResult<Option<Push>> {
        match conn.recv_response() {
            Ok(redis::Value::Push { kind, data }) => Ok(Push::parse(kind, data)),
            Ok(_) => Ok(None),
            Err(e) if e.is_timeout() => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn handle(&self, push: Push) {
        match push {
            Push::Message(channel, payload) => self.dispatch(&channel, &payload),
            Push::Subscribed(channel) => self.confirm(&channel),
            Push::Unsubscribed(channel) => self.forget(&channel),
        }
    }

    /// Channels to subscribe (wanted, not subscribed) and to drop (idle past the linger time).
    fn pending_changes(&self) -> (Vec<String>, Vec<String>) {
        let now = Instant::now();
        let mut state = self.shared.state.lock();
        let mut subscribe = Vec::new();
        let mut unsubscribe = Vec::new();
        for (name, channel) in state.channels.iter_mut() {
            if channel.subscribing || channel.unsubscribing {
                continue; // its confirmation comes first
            }
            let idle_done = channel
                .idle_since
                .is_some_and(|since| now.duration_since(since) >= LINGER);
            if channel.registrations.is_empty() && idle_done {
                // No longer live from now on: a waiter that comes while the unsubscription is
                // under way must not count on it, and needs a new subscription.
                channel.confirmed = false;
                channel.unsubscribing = true;
                unsubscribe.push(name.to_string());
            } else if !channel.confirmed && !channel.registrations.is_empty() {
                channel.subscribing = true;
                subscribe.push(name.to_string());
            }
        }
        (subscribe, unsubscribe)
    }

    fn confirm(&self, name: &str) {
        let mut state = self.shared.state.lock();
        if let Some(channel) = state.channels.get_mut(name) {
            channel.subscribing = false;
            channel.confirmed = true;
        }
        drop(state);
        self.shared.confirmations.notify_all();
    }

    fn forget(&self, name: &str) {
        let mut state = self.shared.state.lock();
        // A waiter may have come back meanwhile: it then needs a fresh subscription.
        let remove = match state.channels.get_mut(name) {
            Some(channel) if channel.registrations.is_empty() => true,
            Some(channel) => {
                channel.unsubscribing = false;
                channel.confirmed = false;
                false
            }
            None => false,
        };
        if remove {
            state.channels.remove(name);
        }
    }

    fn dispatch(&self, channel: &str, payload: &str) {
        if channel == self.shared.wake_channel {
            return; // only there to wake the thread
        }
        self.shared.messages.fetch_add(1, Ordering::Relaxed);
        let state = self.shared.state.lock();
        if let Some(channel) = state.channels.get(channel) {
            for r in channel.registrations.values() {
                if r.filter.as_deref().is_none_or(|f| f == payload) {
                    r.signal.bump();
                }
            }
        }
    }
}

/// A push frame the subscriber acts on.
enum Push {
    /// A message: the channel and the payload.
    Message(String, String),
    /// Redis confirmed a subscription.
    Subscribed(String),
    /// Redis confirmed an unsubscription (or dropped a subscription by itself).
    Unsubscribed(String),
}

impl Push {
    fn parse(kind: redis::PushKind, data: Vec<redis::Value>) -> Option<Push> {
        let text = |v: &redis::Value| redis::from_redis_value_ref::<String>(v).ok();
        let channel = data.first().and_then(text)?;
        match kind {
            redis::PushKind::Message => Some(Push::Message(channel, data.get(1).and_then(text)?)),
            redis::PushKind::Subscribe => Some(Push::Subscribed(channel)),
            redis::PushKind::Unsubscribe => Some(Push::Unsubscribed(channel)),
            _ => None,
        }
    }
}

/// Writes `command channel…` without reading its confirmations (they come as pushes).
fn send(
    conn: &mut redis::Connection,
    command: &str,
    channels: &[String],
) -> redis::RedisResult<()> {
    conn.send_packed_command(&redis::cmd(command).arg(channels).get_packed_command())
}
