//! Pooled connections to one Redis server: a pool of lazy slots.
//!
//! A slot is room for one connection, made at once without any I/O; the caller that checks
//! out a slot without a live connection connects in its own thread, within the connect
//! timeout, and so hears "connection refused" at once (a pool that connected on a helper
//! thread, retrying there, would cost such a caller the whole checkout timeout).
//!
//! A slot whose connection failed at the transport level is emptied in place, and a
//! connection seen *dropped* also retires every connection made before it: after a Redis
//! restart they are all dead, and each is emptied when it is next checked out. Idle slots
//! are handed out last-in first-out (the connection used last is the one most likely alive),
//! never tested on checkout (no `PING`); a checkout and a return each take the pool's lock
//! once, briefly, and read no clock but the return's. Every 30 seconds a helper thread, one
//! for every pool of the process ([`helper_thread`]), closes the connections of slots idle
//! past [`PoolSettings::idle_timeout`] or older than [`PoolSettings::max_lifetime`], and
//! their slots go.
//!
//! A connection may carry replies still to be read (`conn.rs`): they live in its slot. The
//! renewal thread reads what idle slots still carry ([`Pool::settle_idle`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};
use scheduled_thread_pool::{JobHandle, OnPoolDropBehavior, ScheduledThreadPool};

use super::conn::is_transport_error;
use super::handshake::{ConnectFailure, Handshake};
use super::{Conn, OnReply, ServerFeatures};
use crate::error::{Doing, Error, ErrorKind, Result, Server};

/// How a pool is sized and when it lets connections go.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PoolSettings {
    /// The most connections the pool holds.
    pub(crate) size: u32,
    /// An idle connection is closed after this long unused.
    pub(crate) idle_timeout: Option<Duration>,
    /// A connection is closed once this old, when idle.
    pub(crate) max_lifetime: Option<Duration>,
}

/// How often idle slots are looked at, to close connections idle or old past their time.
const REAP_EVERY: Duration = Duration::from_secs(30);

/// The helper thread that every pool of the process shares (idle connections are closed
/// there): started with the first pool, ended when the last pool is gone.
fn helper_thread() -> Arc<ScheduledThreadPool> {
    static HELPER: Mutex<Weak<ScheduledThreadPool>> = Mutex::new(Weak::new());
    let mut helper = HELPER.lock();
    if let Some(thread) = helper.upgrade() {
        return thread;
    }
    let thread = Arc::new(
        ScheduledThreadPool::builder()
            .num_threads(1)
            .thread_name_pattern("redmutex-pool")
            // Dropped with the last pool: the reaper's next run is not waited for.
            .on_drop_behavior(OnPoolDropBehavior::DiscardPendingScheduled)
            .build(),
    );
    *helper = Arc::downgrade(&thread);
    thread
}

/// Room for one connection, made by the caller that needs it.
pub(crate) struct ConnSlot {
    /// Boxed: a slot moves out of the pool and back at every checkout, and a connection
    /// (redis-rs's, with its reader's state) is some hundreds of bytes to copy each way.
    conn: Option<Box<Conn>>,
    /// The number of the connection it holds, in the order the pool made them.
    number: u64,
    /// When its connection was made.
    born: Option<Instant>,
    /// The read timeout the connection has now.
    read_timeout: Duration,
    /// Counted among the pool's idle slots whose connection carries unread replies.
    carrying: bool,
}

impl ConnSlot {
    fn empty() -> Self {
        ConnSlot {
            conn: None,
            number: 0,
            born: None,
            read_timeout: Duration::ZERO,
            carrying: false,
        }
    }
}

/// An idle slot, and since when.
struct IdleSlot {
    slot: ConnSlot,
    since: Instant,
}

/// The pool's slots: the idle ones, last returned last, and how many are checked out.
#[derive(Default)]
struct Slots {
    idle: Vec<IdleSlot>,
    out: u32,
}

/// What a pool's checkouts share.
struct PoolState {
    /// Makes the connections, within the connect timeout in all.
    handshake: Handshake,
    server: Server,
    /// The number of connections made so far.
    made: AtomicU64,
    /// Connections with a number below this were made before a connection was seen dropped.
    epoch: AtomicU64,
    /// Idle slots whose connection carries unread replies.
    carrying: AtomicUsize,
    /// What the server accepts, learned by its connections.
    features: Arc<ServerFeatures>,
    slots: Mutex<Slots>,
    /// Signalled when a slot comes back.
    returned: Condvar,
    /// Its size (at least 1), and when its connections are closed.
    settings: PoolSettings,
}

/// The connection pool of one server; cheap to clone.
#[derive(Clone)]
pub(crate) struct Pool {
    shared: Arc<PoolState>,
    _reaper: Arc<Reaper>,
}

/// The pool's turn on the helper thread (which it keeps running), cancelled with the last
/// clone of the pool.
struct Reaper {
    job: JobHandle,
    _thread: Arc<ScheduledThreadPool>,
}

impl Drop for Reaper {
    fn drop(&mut self) {
        self.job.cancel();
    }
}

/// A connection checked out of the [`Pool`]; its slot goes back when dropped, emptied if the
/// connection broke. It keeps its pool alive, so that a deployment may replace a pool (after
/// a failover) while connections of the old one are still in use.
pub(crate) struct Checkout {
    slot: ConnSlot,
    shared: Arc<PoolState>,
    broken: bool,
}

impl Pool {
    pub(crate) fn new(redis: redis::Client, server: Server, settings: PoolSettings) -> Self {
        let settings = PoolSettings {
            size: settings.size.max(1),
            ..settings
        };
        let shared = Arc::new(PoolState {
            handshake: Handshake::of(&redis),
            server,
            made: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            carrying: AtomicUsize::new(0),
            features: Arc::default(),
            slots: Mutex::new(Slots::default()),
            returned: Condvar::new(),
            settings,
        });
        let state = Arc::downgrade(&shared);
        let thread = helper_thread();
        let job = thread.execute_at_fixed_rate(REAP_EVERY, REAP_EVERY, move || {
            if let Some(state) = state.upgrade() {
                state.reap(Instant::now());
            }
        });
        Pool {
            shared,
            _reaper: Arc::new(Reaper {
                job,
                _thread: thread,
            }),
        }
    }

    /// The server, as error messages name it.
    pub(crate) fn server(&self) -> &Server {
        &self.shared.server
    }

    /// What is known of the server, shared by its connections.
    pub(crate) fn features(&self) -> &ServerFeatures {
        &self.shared.features
    }

    /// Checks out an idle connection, or a slot and makes its connection, within the connect
    /// timeout, or within `within` when that is shorter.
    pub(crate) fn get(&self, doing: Doing<'_>, within: Option<Duration>) -> Result<Checkout> {
        let shared = &self.shared;
        let limit = within.map_or(shared.server.connect_timeout, |w| {
            w.min(shared.server.connect_timeout)
        });
        let deadline = Instant::now() + limit;
        let slot = shared.take_slot(deadline).ok_or_else(|| {
            Error::new(
                ErrorKind::Connection,
                format!(
                    "all {} connections to redis at {} stayed in use for {} while {doing}",
                    shared.settings.size,
                    shared.server.address,
                    crate::human_duration::Human(limit)
                ),
            )
            .at_checkout()
        })?;
        // Checked out from here: the slot goes back however this ends.
        let mut checkout = Checkout {
            slot,
            shared: Arc::clone(shared),
            broken: false,
        };
        let slot = &mut checkout.slot;
        if std::mem::take(&mut slot.carrying) {
            shared.carrying.fetch_sub(1, Ordering::Relaxed);
        }
        if slot.conn.is_some() && slot.number < shared.epoch.load(Ordering::Relaxed) {
            // Made before a connection was seen dropped: most likely dead too. Its unread
            // replies' handlers are told that the outcome is unknown.
            slot.conn = None;
        }
        if slot.conn.is_none() {
            shared.connect(slot, deadline, doing)?;
        }
        Ok(checkout)
    }

    /// Reads the replies that idle connections still carry, and hands each to its handler
    /// (the renewal thread, now and then, so that a failed release is cleaned up even when
    /// nobody uses the pool). A connection whose read failed is thrown away.
    pub(crate) fn settle_idle(&self) {
        let shared = &self.shared;
        if shared.carrying.load(Ordering::Relaxed) == 0 {
            return;
        }
        // The idle slots that carry replies, taken out at once; each goes back after its read.
        let carrying: Vec<Checkout> = {
            let mut slots = shared.slots.lock();
            let carrying = take_idle(&mut slots, |idle| idle.slot.carrying);
            slots.out += carrying.len() as u32;
            carrying
                .into_iter()
                .map(|idle| Checkout {
                    slot: idle.slot,
                    shared: Arc::clone(shared),
                    broken: false,
                })
                .collect()
        };
        for mut checkout in carrying {
            let slot = &mut checkout.slot;
            slot.carrying = false;
            shared.carrying.fetch_sub(1, Ordering::Relaxed);
            let timeout = shared.server.response_timeout;
            let Some(conn) = slot.conn.as_mut() else {
                continue;
            };
            let settled = match slot.read_timeout == timeout {
                true => Ok(()),
                false => conn.set_read_timeout(timeout),
            }
            .and_then(|()| conn.settle());
            match settled {
                Ok(()) => slot.read_timeout = timeout,
                Err(_) => slot.conn = None,
            }
        }
    }
}

/// Takes the idle slots that `which` picks out of `slots`, the rest kept in their order.
fn take_idle(slots: &mut Slots, which: impl Fn(&IdleSlot) -> bool) -> Vec<IdleSlot> {
    let (taken, kept) = std::mem::take(&mut slots.idle)
        .into_iter()
        .partition(|idle| which(idle));
    slots.idle = kept;
    taken
}

impl PoolState {
    /// An idle slot (the one returned last), or a new empty one while the pool has fewer
    /// than its size; else waits for one to come back until `deadline` (`None` then).
    fn take_slot(&self, deadline: Instant) -> Option<ConnSlot> {
        let mut slots = self.slots.lock();
        loop {
            if let Some(idle) = slots.idle.pop() {
                slots.out += 1;
                return Some(idle.slot);
            }
            if slots.out + (slots.idle.len() as u32) < self.settings.size {
                slots.out += 1;
                return Some(ConnSlot::empty());
            }
            if self.returned.wait_until(&mut slots, deadline).timed_out() {
                return None;
            }
        }
    }

    /// Takes back a slot that was checked out.
    fn give_back(&self, slot: ConnSlot) {
        let since = Instant::now();
        {
            let mut slots = self.slots.lock();
            slots.out = slots.out.saturating_sub(1);
            slots.idle.push(IdleSlot { slot, since });
        }
        self.returned.notify_one();
    }

    /// Closes the connections of idle slots unused since before `now - idle_timeout`, or
    /// made before `now - max_lifetime`; their slots go (a caller that needs one makes a
    /// slot again). Their unread replies' handlers are told the outcome is unknown.
    fn reap(&self, now: Instant) {
        let PoolSettings {
            idle_timeout,
            max_lifetime,
            ..
        } = self.settings;
        let expired = |idle: &IdleSlot| {
            idle_timeout.is_some_and(|t| now.saturating_duration_since(idle.since) >= t)
                || max_lifetime.is_some_and(|t| {
                    idle.slot
                        .born
                        .is_some_and(|born| now.saturating_duration_since(born) >= t)
                })
        };
        let reaped = take_idle(&mut self.slots.lock(), expired);
        let carrying = reaped.iter().filter(|idle| idle.slot.carrying).count();
        self.carrying.fetch_sub(carrying, Ordering::Relaxed);
        // Closed here, outside the pool's lock.
        drop(reaped);
        self.returned.notify_all();
    }

    /// Makes the connection of `slot`, within `deadline`.
    fn connect(&self, slot: &mut ConnSlot, deadline: Instant, doing: Doing<'_>) -> Result<()> {
        let made = self.handshake.connect(deadline).and_then(|conn| {
            let timeouts = conn
                .set_read_timeout(Some(self.server.response_timeout))
                .and_then(|()| conn.set_write_timeout(Some(self.server.response_timeout)));
            timeouts.map(|()| conn).map_err(ConnectFailure::Connect)
        });
        match made {
            Ok(conn) => {
                slot.conn = Some(Box::new(Conn::new(conn, Arc::clone(&self.features))));
                slot.number = self.made.fetch_add(1, Ordering::Relaxed);
                slot.born = Some(Instant::now());
                slot.read_timeout = self.server.response_timeout;
                Ok(())
            }
            Err(failed) => {
                let err = match failed {
                    ConnectFailure::Connect(err) => Error::from_connect(&self.server, doing, err),
                    ConnectFailure::Handshake(err) => {
                        Error::from_handshake(&self.server, doing, err)
                    }
                    ConnectFailure::Tls(err) => Error::from_tls_handshake(&self.server, doing, err),
                };
                log::debug!("redmutex: connecting to redis failed: {err}");
                Err(err)
            }
        }
    }
}

impl Checkout {
    /// Runs one call and returns Redis's own result. A transport error leaves the connection
    /// in an unknown state, so it is thrown away on return; a dropped connection (not a
    /// timeout) also retires every connection made before it.
    pub(crate) fn call_raw<T>(
        &mut self,
        f: impl FnOnce(&mut Conn) -> redis::RedisResult<T>,
    ) -> redis::RedisResult<T> {
        self.run(Some(self.shared.server.response_timeout), f)
    }

    /// [`call_raw`](Self::call_raw) with a read timeout of its own. The connection keeps it
    /// (it is set again only when a call wants another), so that calls with the same
    /// timeout cost no system call.
    pub(crate) fn call_within<T>(
        &mut self,
        read_timeout: Duration,
        f: impl FnOnce(&mut Conn) -> redis::RedisResult<T>,
    ) -> redis::RedisResult<T> {
        self.run(Some(read_timeout), f)
    }

    /// Writes without reading (the read timeout stays as it is), with errors that say what
    /// was being done and on which server.
    pub(crate) fn write(
        &mut self,
        doing: Doing<'_>,
        f: impl FnOnce(&mut Conn) -> redis::RedisResult<()>,
    ) -> Result<()> {
        self.run(None, f)
            .map_err(|e| Error::from_call(&self.shared.server, doing, e))
    }

    fn run<T>(
        &mut self,
        read_timeout: Option<Duration>,
        f: impl FnOnce(&mut Conn) -> redis::RedisResult<T>,
    ) -> redis::RedisResult<T> {
        let slot = &mut self.slot;
        let Some(conn) = slot.conn.as_mut() else {
            return Err(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "connection already thrown away",
            )));
        };
        let result = match read_timeout {
            Some(wanted) if wanted != slot.read_timeout => {
                conn.set_read_timeout(wanted).and_then(|()| {
                    slot.read_timeout = wanted;
                    f(conn)
                })
            }
            _ => f(conn),
        };
        if let Err(err) = &result {
            if is_transport_error(err) {
                self.broken = true;
                if !err.is_timeout() {
                    let made = self.shared.made.load(Ordering::Relaxed);
                    self.shared.epoch.fetch_max(made, Ordering::Relaxed);
                }
            }
        }
        result
    }

    /// Writes an already packed command without reading its reply: `on_reply` gets it when
    /// the connection's next user, or the renewal thread, reads it.
    pub(crate) fn send_unread(
        &mut self,
        doing: Doing<'_>,
        packed: &[u8],
        on_reply: OnReply,
    ) -> Result<()> {
        self.run(None, |c| c.send_unread(packed, on_reply))
            .map_err(|e| Error::from_call(&self.shared.server, doing, e))
    }

    /// What the server of this connection is known to accept.
    pub(crate) fn features(&self) -> &ServerFeatures {
        &self.shared.features
    }

    /// Whether the server ran the script of `hash` on this connection before.
    pub(crate) fn knows_script(&self, hash: &str) -> bool {
        self.slot
            .conn
            .as_ref()
            .is_some_and(|c| c.knows_script(hash))
    }

    /// Runs one call, with errors that say what was being done and on which server.
    pub(crate) fn call<T>(
        &mut self,
        doing: Doing<'_>,
        f: impl FnOnce(&mut Conn) -> redis::RedisResult<T>,
    ) -> Result<T> {
        self.call_raw(f)
            .map_err(|e| Error::from_call(&self.shared.server, doing, e))
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        let shared = &self.shared;
        let mut slot = std::mem::replace(&mut self.slot, ConnSlot::empty());
        if let Some(conn) = slot.conn.as_ref() {
            let stale = slot.number < shared.epoch.load(Ordering::Relaxed);
            if self.broken || stale || !redis::ConnectionLike::is_open(conn) {
                // Its unread replies' handlers are told that the outcome is unknown; the slot
                // goes back empty, and its next user connects.
                slot.conn = None;
            } else if conn.has_unread() {
                slot.carrying = true;
                shared.carrying.fetch_add(1, Ordering::Relaxed);
            }
        }
        shared.give_back(slot);
    }
}
