//! One lane of the subscriber: a thread with a RESP3 connection to one shard's server, on
//! which it subscribes the channels of that shard and reads their announcements.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, TryRecvError};

use super::push::{Flavour, Push};
use super::{reassign, Lanes, Link, Signal, State, SubscriberState};

/// How long the thread blocks reading messages before it looks at its state anyway (new
/// subscriptions wake it sooner, with a message on its own wake channel).
const POLL: Duration = Duration::from_secs(1);

/// How long a channel stays subscribed after its last waiter left: under steady contention
/// waiters come and go, and re-subscribing each time would cost a round trip per wait.
const LINGER: Duration = Duration::from_secs(2);

/// The pauses between reconnection attempts: doubling from the first to the last, and back
/// to the first once a connection served that long.
const MIN_RECONNECT_DELAY: Duration = Duration::from_millis(50);
const MAX_RECONNECT_DELAY: Duration = Duration::from_secs(2);

/// How many names to try for a wake channel that the lane's shard serves.
const WAKE_CHANNEL_TRIES: usize = 65_536;

pub(super) struct LaneThread {
    shared: Arc<SubscriberState>,
    lanes: Weak<Lanes>,
    shard: usize,
    link: Arc<Link>,
    wake: Receiver<()>,
}

/// Why a connection's loop ended.
enum Exit {
    Stop,
    Broken(String),
    /// The deployment's servers changed (a failover, a new slot map): connect again at once,
    /// to wherever the lane's channels are now.
    Moved,
}

impl LaneThread {
    pub(super) fn new(
        shared: Arc<SubscriberState>,
        lanes: Weak<Lanes>,
        shard: usize,
        link: Arc<Link>,
        wake: Receiver<()>,
    ) -> Self {
        LaneThread {
            shared,
            lanes,
            shard,
            link,
            wake,
        }
    }

    pub(super) fn run(self) {
        let mut delay = MIN_RECONNECT_DELAY;
        loop {
            if !self.wait_for_work() {
                return;
            }
            let started = Instant::now();
            let generation = self.shared.connections.generation();
            let exit = match self.connect() {
                Ok(mut conn) => {
                    let exit = self.serve(&mut conn, generation);
                    *self.link.serving.lock() = None;
                    if matches!(exit, Exit::Broken(_) | Exit::Moved) {
                        self.shared.reconnects.fetch_add(1, Ordering::Relaxed);
                    }
                    exit
                }
                Err(e) => Exit::Broken(format!("cannot connect: {e}")),
            };
            match exit {
                Exit::Stop => {
                    self.release_channels(false);
                    return;
                }
                Exit::Broken(why) => {
                    log::debug!("redmutex: subscriber connection lost: {why}");
                    self.release_channels(true);
                }
                Exit::Moved => {
                    // Not a failure: no pause, and the pauses start again from the first.
                    self.release_channels(true);
                    delay = MIN_RECONNECT_DELAY;
                    continue;
                }
            }
            if started.elapsed() >= MAX_RECONNECT_DELAY {
                delay = MIN_RECONNECT_DELAY;
            }
            if !self.pause(delay) {
                return;
            }
            delay = (delay * 2).min(MAX_RECONNECT_DELAY);
        }
    }

    fn connect(&self) -> redis::RedisResult<redis::Connection> {
        let conn = self.shared.connections.subscriber_connection(self.shard)?;
        conn.set_read_timeout(Some(self.response_timeout()))?;
        Ok(conn)
    }

    fn response_timeout(&self) -> Duration {
        self.shared
            .connections
            .shard_server(self.shard)
            .response_timeout
    }

    /// Blocks while the lane has no channel. Returns `false` when the client is gone.
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

    /// Sleeps `delay` (wake-ups do not cut it short). Returns `false` when the client is gone.
    fn pause(&self, delay: Duration) -> bool {
        let until = Instant::now() + delay;
        loop {
            let now = Instant::now();
            if now >= until {
                return true;
            }
            if let Err(RecvTimeoutError::Disconnected) = self.wake.recv_timeout(until - now) {
                return false;
            }
        }
    }

    fn stopped(&self) -> bool {
        matches!(self.wake.try_recv(), Err(TryRecvError::Disconnected))
    }

    fn has_channels(&self) -> bool {
        let state = self.shared.state.lock();
        state.channels.values().any(|c| c.lane == Some(self.shard))
    }

    /// A channel name that the lane's shard serves, for waking the thread.
    fn wake_channel(&self) -> String {
        let prefix = &self.shared.wake_prefix;
        (0..WAKE_CHANNEL_TRIES)
            .map(|tag| format!("{prefix}:{{{tag}}}"))
            .find(|name| self.shared.connections.shard_of(name) == self.shard)
            .unwrap_or_else(|| format!("{prefix}:{{0}}"))
    }

    /// Marks the lane's channels unsubscribed and wakes their waiters, so that each retries
    /// now and then waits with backoff until its subscription is back; with `reassign`, hands
    /// them to the lanes of their shards (this one again, unless their slot moved).
    fn release_channels(&self, reassign_them: bool) {
        let mut moved = Vec::new();
        {
            let mut state = self.shared.state.lock();
            state.channels.retain(|name, c| {
                if c.lane != Some(self.shard) {
                    return true;
                }
                c.lost |= c.confirmed && !c.registrations.is_empty();
                c.confirmed = false;
                c.subscribing = None;
                c.unsubscribing = false;
                c.wake_all();
                if c.registrations.is_empty() {
                    return false;
                }
                c.lane = None;
                moved.push(Arc::clone(name));
                true
            });
        }
        self.shared.confirmations.notify_all();
        if reassign_them {
            reassign(&self.shared, &self.lanes, moved);
        }
    }

    /// Serves one connection until it breaks or the client is gone.
    ///
    /// The connection speaks RESP3: confirmations and messages arrive as push frames, each
    /// naming its channel, so a channel counts as subscribed exactly when Redis confirmed it.
    /// Commands are written without waiting; replies are read in one place.
    fn serve(&self, conn: &mut redis::Connection, generation: u64) -> Exit {
        let wake = self.wake_channel();
        let flavour = match self.start(conn, &wake) {
            Ok(flavour) => flavour,
            Err(why) => return Exit::Broken(why),
        };
        if let Err(e) = conn.set_read_timeout(Some(POLL)) {
            return Exit::Broken(e.to_string());
        }
        *self.link.serving.lock() = Some((wake.clone(), flavour));
        self.serve_subscribed(conn, generation, &wake, flavour)
    }

    /// Subscribes the wake channel, sharded when the server knows how (Redis 7 and later),
    /// else classic, within the response timeout. Returns the flavour the server speaks.
    fn start(&self, conn: &mut redis::Connection, wake: &str) -> Result<Flavour, String> {
        let wake = [wake.to_owned()];
        let mut flavour = Flavour::Sharded;
        flavour
            .subscribe_to(conn, &wake)
            .map_err(|e| e.to_string())?;
        let deadline = Instant::now() + self.response_timeout();
        loop {
            match Push::read(conn) {
                Ok(Some(Push::Subscribed(channel))) if channel == wake[0] => return Ok(flavour),
                Ok(Some(Push::Refused(why)))
                    if flavour == Flavour::Sharded
                        && why.to_ascii_lowercase().contains("unknown command") =>
                {
                    flavour = Flavour::Classic;
                    flavour
                        .subscribe_to(conn, &wake)
                        .map_err(|e| e.to_string())?;
                }
                Ok(Some(Push::Refused(why))) => {
                    log::warn!(
                        "redmutex: cannot subscribe ({why}); waiters fall back to re-checks"
                    );
                    return Err(why);
                }
                Ok(_) if Instant::now() < deadline => {}
                Ok(_) => return Err("the subscription was not confirmed in time".to_owned()),
                Err(e) => return Err(e.to_string()),
            }
        }
    }

    fn serve_subscribed(
        &self,
        conn: &mut redis::Connection,
        generation: u64,
        wake: &str,
        flavour: Flavour,
    ) -> Exit {
        let response_timeout = self.response_timeout();
        loop {
            if self.stopped() {
                return Exit::Stop;
            }
            if self.shared.connections.generation() != generation {
                // The deployment's servers changed (a failover, a new slot map): follow them.
                return Exit::Moved;
            }
            let (subscribe, unsubscribe, overdue) = self.pending_changes(response_timeout);
            if overdue {
                // A refusal (a slot that moved, say) may have gone unseen: find the shards
                // again.
                self.shared.connections.routes_changed();
                return Exit::Broken("a subscription was not confirmed in time".to_owned());
            }
            if let Err(e) = flavour.subscribe_to(conn, &subscribe) {
                return Exit::Broken(e.to_string());
            }
            if let Err(e) = flavour.unsubscribe_from(conn, &unsubscribe) {
                return Exit::Broken(e.to_string());
            }
            if !self.has_channels() {
                // Nothing to listen to: keep the connection and sleep until a waiter comes.
                match self.wake.recv_timeout(LINGER) {
                    Ok(()) | Err(RecvTimeoutError::Timeout) => continue,
                    Err(RecvTimeoutError::Disconnected) => return Exit::Stop,
                }
            }
            match Push::read(conn) {
                Ok(Some(push)) => {
                    if let Some(exit) = self.handle(push, wake) {
                        return exit;
                    }
                }
                Ok(None) => {}
                Err(e) => return Exit::Broken(e.to_string()),
            }
        }
    }

    fn handle(&self, push: Push, wake: &str) -> Option<Exit> {
        match push {
            Push::Message(channel, _) if channel == wake => {} // only there to wake the thread
            Push::Message(channel, payload) => self.dispatch(&channel, &payload),
            Push::Subscribed(channel) => self.confirm(&channel),
            Push::Unsubscribed(channel) if channel == wake => {
                self.shared.connections.routes_changed();
                return Some(Exit::Broken("the wake channel's slot moved".to_owned()));
            }
            Push::Unsubscribed(channel) => self.unsubscribed(&channel),
            Push::Refused(why) => {
                self.shared.connections.routes_changed();
                return Some(Exit::Broken(format!("a subscription was refused: {why}")));
            }
        }
        None
    }

    /// Channels to subscribe (wanted, not subscribed) and to drop (idle past the linger time),
    /// and whether a subscription went unconfirmed for longer than `timeout`.
    fn pending_changes(&self, timeout: Duration) -> (Vec<String>, Vec<String>, bool) {
        let now = Instant::now();
        let mut state = self.shared.state.lock();
        let mut subscribe = Vec::new();
        let mut unsubscribe = Vec::new();
        let mut overdue = false;
        for (name, channel) in state.channels.iter_mut() {
            if channel.lane != Some(self.shard) {
                continue;
            }
            if let Some(since) = channel.subscribing {
                overdue |= now.duration_since(since) > timeout;
                continue; // its confirmation comes first
            }
            if channel.unsubscribing {
                continue;
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
                channel.subscribing = Some(now);
                subscribe.push(name.to_string());
            }
        }
        (subscribe, unsubscribe, overdue)
    }

    fn confirm(&self, name: &str) {
        let mut state = self.shared.state.lock();
        if let Some(channel) = state.channels.get_mut(name) {
            if channel.lane == Some(self.shard) {
                channel.subscribing = None;
                channel.confirmed = true;
                if std::mem::take(&mut channel.lost) {
                    // Listening again: whatever was released while it was not is found by
                    // one more re-check, now that no later release can go unheard.
                    channel.wake_all();
                }
            }
        }
        drop(state);
        self.shared.confirmations.notify_all();
    }

    /// An unsubscription: the confirmation of ours, or the server dropping a sharded channel
    /// whose slot moved to another node. Then the channel goes to the lane of its new shard,
    /// and its waiters retry now (a release during the move may have gone unannounced).
    fn unsubscribed(&self, name: &str) {
        let mut state = self.shared.state.lock();
        let Some(channel) = state.channels.get_mut(name) else {
            return;
        };
        if channel.unsubscribing {
            if channel.registrations.is_empty() {
                state.channels.remove(name);
            } else {
                // A waiter came back meanwhile: it needs a fresh subscription.
                channel.unsubscribing = false;
                channel.confirmed = false;
            }
            return;
        }
        channel.lost |= !channel.registrations.is_empty();
        channel.confirmed = false;
        channel.subscribing = None;
        channel.lane = None;
        channel.wake_all();
        let moved = vec![Arc::from(name)];
        drop(state);
        self.shared.connections.routes_changed();
        reassign(&self.shared, &self.lanes, moved);
    }

    /// Delivers a message: counts a wake-up of each waiter it is for (keeping its note) while
    /// the state is locked, and wakes them once it is not: a woken waiter looks at the state
    /// first (its note, its subscription), and would find it locked while this thread is
    /// still in the system call that wakes it.
    fn dispatch(&self, channel: &str, payload: &str) {
        self.shared.messages.fetch_add(1, Ordering::Relaxed);
        let mut woken = Vec::new();
        deliver(
            &mut self.shared.state.lock(),
            (channel, payload),
            &mut woken,
        );
        for signal in woken {
            signal.wake();
        }
    }
}

/// Keeps the note of a message for its client's waiters, or hands it to each waiter it is
/// for, counting their wake-ups and adding their signals to `woken`.
fn deliver(state: &mut State, (channel, payload): (&str, &str), woken: &mut Vec<Arc<Signal>>) {
    let Some(channel) = state.channels.get_mut(channel) else {
        return;
    };
    let note = channel.kept.as_ref().and_then(|kept| {
        payload
            .strip_prefix(&*kept.filter)
            .and_then(|rest| rest.strip_prefix(' '))
    });
    if let Some(note) = note {
        channel.keep_note(note, woken);
        return;
    }
    for r in channel.registrations.values() {
        r.deliver(payload, woken);
    }
}
