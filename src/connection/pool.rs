//! Pooled connections to one Redis server.
//!
//! A connection is made when a caller needs one and none is idle, in the caller's own thread,
//! so that an answer such as "connection refused" reaches that caller at once instead of
//! after the whole connect timeout. Idle connections are reused last-in first-out (the one
//! used last is the one most likely alive). A connection that failed at the transport level
//! is thrown away, and a connection seen *dropped* also retires every connection made before
//! it: after a Redis restart they are all dead, and a retry must get a fresh one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::error::{Doing, Error, ErrorKind, Result, Server};

/// Whether an error leaves the connection in an unknown state (timed out mid-reply, closed,
/// garbled) rather than being an error reply from the server.
fn is_transport_error(err: &redis::RedisError) -> bool {
    !matches!(
        err.kind(),
        redis::ErrorKind::Server(_) | redis::ErrorKind::Extension
    )
}

struct Idle {
    conn: redis::Connection,
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
    conn: Option<redis::Connection>,
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
        loop {
            while let Some(idle) = state.idle.pop() {
                if idle.number >= inner.epoch.load(Ordering::Relaxed) {
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
            }
            if state.open < inner.max {
                state.open += 1;
                drop(state);
                return PoolInner::connect(inner, deadline, doing);
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
                conn: Some(conn),
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
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> redis::RedisResult<T> {
        self.run(Some(self.pool.server.response_timeout), f)
    }

    /// [`call_raw`](Self::call_raw) with a read timeout of its own. The connection keeps it
    /// (it is set again only when a call wants another), so that calls with the same
    /// timeout cost no system call.
    pub(crate) fn call_within<T>(
        &mut self,
        read_timeout: Duration,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> redis::RedisResult<T> {
        self.run(Some(read_timeout), f)
    }

    /// Writes without reading (the read timeout stays as it is), with errors that say what
    /// was being done and on which server.
    pub(crate) fn write(
        &mut self,
        doing: Doing<'_>,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<()>,
    ) -> Result<()> {
        self.run(None, f)
            .map_err(|e| Error::from_call(&self.pool.server, doing, e))
    }

    fn run<T>(
        &mut self,
        read_timeout: Option<Duration>,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> redis::RedisResult<T> {
        let Some(conn) = self.conn.as_mut() else {
            return Err(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "connection already returned",
            )));
        };
        let result = match read_timeout {
            Some(wanted) if wanted != self.read_timeout => {
                conn.set_read_timeout(Some(wanted)).and_then(|()| {
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

    /// Runs one call, with errors that say what was being done and on which server.
    pub(crate) fn call<T>(
        &mut self,
        doing: Doing<'_>,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
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
