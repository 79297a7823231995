//! Pooled connections to one Redis server: an r2d2 pool of lazy slots.
//!
//! r2d2 makes a pool's members on its helper thread while the caller waits, and retries there
//! when that fails: a server that refuses connections would cost the caller the whole
//! checkout timeout. So what r2d2 pools here is a [`ConnSlot`], which the manager makes at once
//! without any I/O; the caller that checks out a slot without a live connection connects in
//! its own thread, within the connect timeout, and so hears "connection refused" at once.
//!
//! A slot whose connection failed at the transport level is emptied in place (rather than
//! reported broken to r2d2, which would drop the slot and make the next caller wait for its
//! helper thread to make another), and a connection seen *dropped* also retires every
//! connection made before it: after a Redis restart they are all dead, and each is emptied
//! when it is next checked out. r2d2 hands out idle slots last-in first-out (the connection
//! used last is the one most likely alive), never tests them on checkout (no `PING`), and
//! reaps slots idle past [`PoolSettings::idle_timeout`] or older than
//! [`PoolSettings::max_lifetime`]. Its helper thread, which adds slots and reaps them, is one
//! for every pool of the process ([`helper_thread`]).
//!
//! A connection may carry replies still to be read (`conn.rs`): they live in its slot. The
//! renewal thread reads what idle slots still carry ([`Pool::settle_idle`]).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use scheduled_thread_pool::{OnPoolDropBehavior, ScheduledThreadPool};

use super::conn::is_transport_error;
use super::handshake::{ConnectFailure, Handshake};
use super::{Conn, OnReply, ServerFeatures};
use crate::error::{Doing, Error, ErrorKind, Result, Server};

/// How a pool is sized and when it lets connections go.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PoolSettings {
    /// The most connections the pool holds.
    pub(crate) size: u32,
    /// An idle connection is closed after this long unused (r2d2's `idle_timeout`).
    pub(crate) idle_timeout: Option<Duration>,
    /// A connection is closed once this old, when idle (r2d2's `max_lifetime`).
    pub(crate) max_lifetime: Option<Duration>,
}

/// The helper thread that every pool of the process shares (r2d2 adds slots and reaps idle
/// ones there): started with the first pool, ended when the last pool is gone.
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

/// What r2d2 pools: room for one connection, made by the caller that needs it.
pub(crate) struct ConnSlot {
    conn: Option<Conn>,
    /// The number of the connection it holds, in the order the pool made them.
    number: u64,
    /// The read timeout the connection has now.
    read_timeout: Duration,
    /// Counted among the pool's idle slots whose connection carries unread replies.
    carrying: bool,
}

/// Makes empty slots; a slot is never broken (its connection is replaced in place).
struct SlotManager;

impl r2d2::ManageConnection for SlotManager {
    type Connection = ConnSlot;
    type Error = std::convert::Infallible;

    fn connect(&self) -> std::result::Result<ConnSlot, Self::Error> {
        Ok(ConnSlot {
            conn: None,
            number: 0,
            read_timeout: Duration::ZERO,
            carrying: false,
        })
    }

    fn is_valid(&self, _: &mut ConnSlot) -> std::result::Result<(), Self::Error> {
        Ok(())
    }

    fn has_broken(&self, _: &mut ConnSlot) -> bool {
        false
    }
}

/// What a pool's checkouts share.
struct PoolState {
    /// Makes the connections, within the connect timeout in all.
    handshake: Handshake,
    server: Server,
    size: u32,
    /// The number of connections made so far.
    made: AtomicU64,
    /// Connections with a number below this were made before a connection was seen dropped.
    epoch: AtomicU64,
    /// Idle slots whose connection carries unread replies.
    carrying: AtomicUsize,
    /// What the server accepts, learned by its connections.
    features: Arc<ServerFeatures>,
}

/// The connection pool of one server; cheap to clone.
#[derive(Clone)]
pub(crate) struct Pool {
    slots: r2d2::Pool<SlotManager>,
    shared: Arc<PoolState>,
}

/// A connection checked out of the [`Pool`]; its slot goes back when dropped, emptied if the
/// connection broke. It keeps its pool alive, so that a deployment may replace a pool (after
/// a failover) while connections of the old one are still in use.
pub(crate) struct Checkout {
    slot: r2d2::PooledConnection<SlotManager>,
    shared: Arc<PoolState>,
    broken: bool,
}

impl Pool {
    pub(crate) fn new(redis: redis::Client, server: Server, settings: PoolSettings) -> Self {
        let size = settings.size.max(1);
        let slots = r2d2::Pool::builder()
            .max_size(size)
            .min_idle(Some(0))
            .test_on_check_out(false)
            .connection_timeout(server.connect_timeout)
            .idle_timeout(settings.idle_timeout)
            .max_lifetime(settings.max_lifetime)
            .thread_pool(helper_thread())
            .build_unchecked(SlotManager);
        Pool {
            slots,
            shared: Arc::new(PoolState {
                handshake: Handshake::of(&redis),
                server,
                size,
                made: AtomicU64::new(0),
                epoch: AtomicU64::new(0),
                carrying: AtomicUsize::new(0),
                features: Arc::default(),
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
        let mut slot = self.slots.get_timeout(limit).map_err(|_| {
            Error::new(
                ErrorKind::Connection,
                format!(
                    "all {} connections to redis at {} stayed in use for {} while {doing}",
                    shared.size,
                    shared.server.address,
                    crate::human_duration::Human(limit)
                ),
            )
            .at_checkout()
        })?;
        if std::mem::take(&mut slot.carrying) {
            shared.carrying.fetch_sub(1, Ordering::Relaxed);
        }
        if slot.conn.is_some() && slot.number < shared.epoch.load(Ordering::Relaxed) {
            // Made before a connection was seen dropped: most likely dead too. Its unread
            // replies' handlers are told that the outcome is unknown.
            slot.conn = None;
        }
        if slot.conn.is_none() {
            shared.connect(&mut slot, deadline, doing)?;
        }
        Ok(Checkout {
            slot,
            shared: Arc::clone(shared),
            broken: false,
        })
    }

    /// Reads the replies that idle connections still carry, and hands each to its handler
    /// (the renewal thread, now and then, so that a failed release is cleaned up even when
    /// nobody uses the pool). A connection whose read failed is thrown away.
    pub(crate) fn settle_idle(&self) {
        let shared = &self.shared;
        if shared.carrying.load(Ordering::Relaxed) == 0 {
            return;
        }
        // Every idle slot, taken at once (r2d2 hands them out last-in first-out, so a slot
        // given back would be the next one taken); those with nothing to read go back
        // before any read.
        let mut idle = Vec::new();
        while let Some(slot) = self.slots.try_get() {
            idle.push(slot);
        }
        let carrying: Vec<_> = idle.into_iter().filter(|slot| slot.carrying).collect();
        for mut pooled in carrying {
            let slot = &mut *pooled;
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

impl PoolState {
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
                slot.conn = Some(Conn::new(conn, Arc::clone(&self.features)));
                slot.number = self.made.fetch_add(1, Ordering::Relaxed);
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
        let slot = &mut *self.slot;
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
        let slot = &mut *self.slot;
        let Some(conn) = slot.conn.as_ref() else {
            return;
        };
        let stale = slot.number < shared.epoch.load(Ordering::Relaxed);
        if self.broken || stale || !redis::ConnectionLike::is_open(conn) {
            // Its unread replies' handlers are told that the outcome is unknown; the slot
            // goes back empty, and its next user connects.
            slot.conn = None;
        } else if conn.has_unread() {
            slot.carrying = true;
            shared.carrying.fetch_add(1, Ordering::Relaxed);
        }
        // The slot goes back to r2d2 when `self.slot` drops, after this.
    }
}
