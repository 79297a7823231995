//! Pooled connections to one Redis server.
//!
//! A connection is made when a caller needs one and none is idle, in the caller's own thread,
//! so that an answer such as "connection refused" reaches that caller at once instead of
//! after the whole connect timeout. Idle connections are reused last-in first-out (the one
//! used last is the one most likely alive). A connection that failed at the transport level
//! is thrown away, and a connection seen *dropped* also retires every connection made before
//! it: after a Redis restart they are all dead, and a retry must get a fresh one.
//!
//! A connection may carry replies still to be read ([`Conn::send_unread`]: a guard's release,
//! written before the guard's drop returns). Its next user writes its own command first, then
//! reads those replies and hands each to its handler, then reads its own: the earlier reply
//! costs that user no round trip of its own, and no caller ever reads a reply that is not
//! its own. The renewal thread reads what idle connections still carry
//! ([`Pool::settle_idle`]); a connection thrown away with replies unread tells their handlers
//! that the outcome is unknown.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::ServerFeatures;
use crate::error::{Doing, Error, ErrorKind, Result, Server};

/// Whether an error leaves the connection in an unknown state (timed out mid-reply, closed,
/// garbled) rather than being an error reply from the server.
fn is_transport_error(err: &redis::RedisError) -> bool {
    !matches!(
        err.kind(),
        redis::ErrorKind::Server(_) | redis::ErrorKind::Extension
    )
}

/// What to do with a reply read later: Redis's reply, or the error that kept it from being
/// read (the outcome is unknown then).
pub(crate) type OnReply = Box<dyn FnOnce(redis::RedisResult<redis::Value>) + Send>;

/// The most replies one connection carries unread; a send past it reads the oldest first.
const MAX_UNREAD: usize = 8;

/// A pooled connection, with the replies to commands written earlier that are still to be
/// read, oldest first.
pub(crate) struct Conn {
    inner: redis::Connection,
    unread: VecDeque<OnReply>,
    /// The hashes of the scripts that this connection saw its server run (so that a call
    /// written without waiting for its reply is not refused with `NOSCRIPT`).
    scripts: Vec<&'static str>,
    /// What its server accepts, shared with the other connections to it.
    features: Arc<ServerFeatures>,
}

impl Conn {
    fn new(inner: redis::Connection, features: Arc<ServerFeatures>) -> Self {
        Conn {
            inner,
            unread: VecDeque::new(),
            scripts: Vec::new(),
            features,
        }
    }

    /// What the connection's server accepts.
    pub(crate) fn features(&self) -> &ServerFeatures {
        &self.features
    }

    /// Notes that the server ran (or has) the script of `hash`.
    pub(crate) fn saw_script(&mut self, hash: &'static str) {
        if !self.knows_script(hash) {
            self.scripts.push(hash);
        }
    }

    /// Whether the server ran the script of `hash` on this connection before.
    pub(crate) fn knows_script(&self, hash: &str) -> bool {
        self.scripts.contains(&hash)
    }

    /// Writes an already packed command without reading its reply; `on_reply` gets the reply
    /// when the connection's next user (or [`Pool::settle_idle`]) reads it.
    pub(crate) fn send_unread(
        &mut self,
        packed: &[u8],
        on_reply: OnReply,
    ) -> redis::RedisResult<()> {
        if self.unread.len() >= MAX_UNREAD {
            self.settle()?;
        }
        self.inner.send_packed_command(packed)?;
        self.unread.push_back(on_reply);
        Ok(())
    }

    /// Writes an already packed command (its reply is read with
    /// [`recv_response`](Self::recv_response)), after reading what was unread.
    pub(crate) fn send_packed_command(&mut self, packed: &[u8]) -> redis::RedisResult<()> {
        self.settle()?;
        self.inner.send_packed_command(packed)
    }

    /// Reads one reply.
    pub(crate) fn recv_response(&mut self) -> redis::RedisResult<redis::Value> {
        self.inner.recv_response()
    }

    fn set_read_timeout(&self, timeout: Duration) -> redis::RedisResult<()> {
        self.inner.set_read_timeout(Some(timeout))
    }

    /// Whether replies are still to be read.
    fn has_unread(&self) -> bool {
        !self.unread.is_empty()
    }

    /// Reads every unread reply and hands each to its handler. After a transport error the
    /// rest are told that their outcome is unknown, and the error is returned.
    fn settle(&mut self) -> redis::RedisResult<()> {
        while let Some(on_reply) = self.unread.pop_front() {
            let reply = self.inner.recv_response();
            let failed = reply
                .as_ref()
                .err()
                .filter(|e| is_transport_error(e))
                .cloned();
            on_reply(reply);
            if let Some(err) = failed {
                self.abandon_unread(&err);
                return Err(err);
            }
        }
        Ok(())
    }

    /// Tells every handler still waiting that its reply will never be read.
    fn abandon_unread(&mut self, err: &redis::RedisError) {
        for on_reply in self.unread.drain(..) {
            on_reply(Err(err.clone()));
        }
    }
}

impl redis::ConnectionLike for Conn {
    fn req_packed_command(&mut self, cmd: &[u8]) -> redis::RedisResult<redis::Value> {
        if self.unread.is_empty() {
            return self.inner.req_packed_command(cmd);
        }
        // Ours goes out first, so that the earlier replies cost no round trip of their own.
        self.inner.send_packed_command(cmd)?;
        self.settle()?;
        loop {
            match self.inner.recv_response()? {
                redis::Value::Push { .. } => continue,
                value => return Ok(value),
            }
        }
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> redis::RedisResult<Vec<redis::Value>> {
        if self.unread.is_empty() || offset != 0 {
            self.settle()?;
            return self.inner.req_packed_commands(cmd, offset, count);
        }
        // A plain pipeline (not a transaction) goes out first too, as a single command does.
        self.inner.send_packed_command(cmd)?;
        self.settle()?;
        let mut replies = Vec::with_capacity(count);
        while replies.len() < count {
            match self.inner.recv_response()? {
                redis::Value::Push { .. } => continue,
                value => replies.push(value),
            }
        }
        Ok(replies)
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }

    fn check_connection(&mut self) -> bool {
        self.settle().is_ok() && self.inner.check_connection()
    }

    fn is_open(&self) -> bool {
        self.inner.is_open()
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if self.has_unread() {
            let closed = redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "the connection was closed before the reply was read",
            ));
            self.abandon_unread(&closed);
        }
    }
}

struct Idle {
    conn: Conn,
    number: u64,
    /// The read timeout the connection has now.
    read_timeout: Duration,
}

#[derive(Default)]
struct PoolState {
    idle: Vec<Idle>,
    /// Connections that exist or are being made: idle, checked out, connecting.
    open: usize,
}

struct PoolInner {
    redis: redis::Client,
    server: Server,
    max: usize,
    state: Mutex<PoolState>,
    /// Signalled when a connection goes back or a slot frees up.
    freed: Condvar,
    /// The number of connections made so far.
    made: AtomicU64,
    /// Connections with a number below this were made before a connection was seen dropped.
    epoch: AtomicU64,
    /// What the server accepts, learned by its connections.
    features: Arc<ServerFeatures>,
}

/// The connection pool of one server; cheap to clone.
#[derive(Clone)]
pub(crate) struct Pool {
    inner: Arc<PoolInner>,
}

/// A connection checked out of the [`Pool`]; it goes back when dropped, unless broken. It
/// keeps its pool alive, so that a deployment may replace a pool (after a failover) while
/// connections of the old one are still in use.
pub(crate) struct Checkout {
    pool: Arc<PoolInner>,
    conn: Option<Conn>,
    number: u64,
    broken: bool,
    /// The read timeout the connection has now.
    read_timeout: Duration,
}

impl Pool {
    pub(crate) fn new(redis: redis::Client, server: Server, max: u32) -> Self {
        Pool {
            inner: Arc::new(PoolInner {
                redis,
                server,
                max: usize::try_from(max).unwrap_or(usize::MAX).max(1),
                state: Mutex::new(PoolState::default()),
                freed: Condvar::new(),
                made: AtomicU64::new(0),
                epoch: AtomicU64::new(0),
                features: Arc::default(),
            }),
        }
    }

    /// The server, as error messages name it.
    pub(crate) fn server(&self) -> &Server {
        &self.inner.server
    }

    /// Checks out an idle connection, or makes one, within the connect timeout.
    pub(crate) fn get(&self, doing: Doing<'_>) -> Result<Checkout> {
        let inner = &self.inner;
        let deadline = Instant::now() + inner.server.connect_timeout;
        let mut state = inner.state.lock();
        let mut retired = Vec::new();
        loop {
            while let Some(idle) = state.idle.pop() {
                if idle.number >= inner.epoch.load(Ordering::Relaxed) {
                    drop(state);
                    // Their unread replies' handlers run outside the pool's lock.
                    drop(retired);
                    return Ok(Checkout {
                        pool: Arc::clone(inner),
                        conn: Some(idle.conn),
                        number: idle.number,
                        broken: false,
                        read_timeout: idle.read_timeout,
                    });
                }
                // Made before a connection was seen dropped: most likely dead too.
                state.open -= 1;
                retired.push(idle);
            }
            if state.open < inner.max {
                state.open += 1;
                drop(state);
                drop(retired);
                return PoolInner::connect(inner, deadline, doing);
            }
            if !retired.is_empty() {
                // Run their handlers before waiting, outside the pool's lock.
                drop(state);
                retired.clear();
                state = inner.state.lock();
                continue;
            }
            if inner.freed.wait_until(&mut state, deadline).timed_out() {
                return Err(Error::new(
                    ErrorKind::Connection,
                    format!(
                        "all {} connections to redis at {} stayed in use for {} while {doing}",
                        inner.max,
                        inner.server.address,
                        crate::error::human(inner.server.connect_timeout)
                    ),
                )
                .at_checkout());
            }
        }
    }
}

impl Pool {
    /// Reads the replies that idle connections still carry, and hands each to its handler
    /// (the renewal thread, now and then, so that a failed release is cleaned up even when
    /// nobody uses the pool). A connection whose read failed is thrown away.
    pub(crate) fn settle_idle(&self) {
        let inner = &self.inner;
        let carrying: Vec<Idle> = {
            let mut state = inner.state.lock();
            if !state.idle.iter().any(|idle| idle.conn.has_unread()) {
                return;
            }
            let (carrying, rest) = std::mem::take(&mut state.idle)
                .into_iter()
                .partition(|idle| idle.conn.has_unread());
            state.idle = rest;
            carrying
        };
        for mut idle in carrying {
            let timeout = inner.server.response_timeout;
            let settled = match idle.read_timeout == timeout {
                true => Ok(()),
                false => idle.conn.set_read_timeout(timeout),
            }
            .and_then(|()| idle.conn.settle());
            match settled {
                Ok(()) => {
                    idle.read_timeout = timeout;
                    inner.state.lock().idle.push(idle);
                    inner.freed.notify_one();
                }
                Err(_) => {
                    drop(idle);
                    inner.release_slot();
                }
            }
        }
    }
}

impl PoolInner {
    /// Makes a connection for a slot already counted in `open`; frees the slot on failure.
    fn connect(self: &Arc<Self>, deadline: Instant, doing: Doing<'_>) -> Result<Checkout> {
        let made = (|| {
            let remaining = deadline
                .saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1));
            let conn = self.redis.get_connection_with_timeout(remaining)?;
            conn.set_read_timeout(Some(self.server.response_timeout))?;
            conn.set_write_timeout(Some(self.server.response_timeout))?;
            Ok(conn)
        })();
        match made {
            Ok(conn) => Ok(Checkout {
                pool: Arc::clone(self),
                conn: Some(Conn::new(conn, Arc::clone(&self.features))),
                number: self.made.fetch_add(1, Ordering::Relaxed),
                broken: false,
                read_timeout: self.server.response_timeout,
            }),
            Err(err) => {
                self.release_slot();
                let err = Error::from_connect(&self.server, doing, err);
                log::debug!("redmutex: connecting to redis failed: {err}");
                Err(err)
            }
        }
    }

    fn release_slot(&self) {
        self.state.lock().open -= 1;
        self.freed.notify_one();
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
        self.run(Some(self.pool.server.response_timeout), f)
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
            .map_err(|e| Error::from_call(&self.pool.server, doing, e))
    }

    fn run<T>(
        &mut self,
        read_timeout: Option<Duration>,
        f: impl FnOnce(&mut Conn) -> redis::RedisResult<T>,
    ) -> redis::RedisResult<T> {
        let Some(conn) = self.conn.as_mut() else {
            return Err(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "connection already returned",
            )));
        };
        let result = match read_timeout {
            Some(wanted) if wanted != self.read_timeout => {
                conn.set_read_timeout(wanted).and_then(|()| {
                    self.read_timeout = wanted;
                    f(conn)
                })
            }
            _ => f(conn),
        };
        if let Err(err) = &result {
            if is_transport_error(err) {
                self.broken = true;
                if !err.is_timeout() {
                    let made = self.pool.made.load(Ordering::Relaxed);
                    self.pool.epoch.fetch_max(made, Ordering::Relaxed);
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
            .map_err(|e| Error::from_call(&self.pool.server, doing, e))
    }

    /// Whether the server ran the script of `hash` on this connection before.
    pub(crate) fn knows_script(&self, hash: &str) -> bool {
        self.conn.as_ref().is_some_and(|c| c.knows_script(hash))
    }

    /// Runs one call, with errors that say what was being done and on which server.
    pub(crate) fn call<T>(
        &mut self,
        doing: Doing<'_>,
        f: impl FnOnce(&mut Conn) -> redis::RedisResult<T>,
    ) -> Result<T> {
        self.call_raw(f)
            .map_err(|e| Error::from_call(&self.pool.server, doing, e))
    }
}

impl Drop for Checkout {
    fn drop(&mut self) {
        let Some(conn) = self.conn.take() else {
            return;
        };
        let stale = self.number < self.pool.epoch.load(Ordering::Relaxed);
        if self.broken || stale || !redis::ConnectionLike::is_open(&conn) {
            drop(conn);
            self.pool.release_slot();
            return;
        }
        self.pool.state.lock().idle.push(Idle {
            conn,
            number: self.number,
            read_timeout: self.read_timeout,
        });
        self.pool.freed.notify_one();
    }
}
