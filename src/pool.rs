//! Pooled Redis connections: made lazily, with connect and response timeouts, never tested
//! with a PING on checkout. A connection that failed at the transport level is discarded, and
//! so is every connection made before it (after a Redis restart they are all dead), so that a
//! retry gets a fresh one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use scheduled_thread_pool::{OnPoolDropBehavior, ScheduledThreadPool};

use crate::error::{Error, ErrorKind, Result};

/// What the pool's manager and its connections share.
#[derive(Default)]
struct PoolShared {
    /// The last connect failure, to report the real cause of a pool timeout.
    last_error: Mutex<Option<redis::RedisError>>,
    /// The number of connections made so far.
    made: AtomicU64,
    /// Connections with a number below this were made before a connection was seen dropped.
    epoch: AtomicU64,
}

/// A pooled connection and whether it must be thrown away.
pub(crate) struct PooledConnection {
    conn: redis::Connection,
    number: u64,
    broken: bool,
    shared: Arc<PoolShared>,
}

/// Whether an error means the connection is in an unknown state (timed out mid-reply,
/// closed, garbled) rather than an error reply from the server.
fn is_transport_error(err: &redis::RedisError) -> bool {
    !matches!(
        err.kind(),
        redis::ErrorKind::Server(_) | redis::ErrorKind::Extension
    )
}

impl PooledConnection {
    /// Runs one call. A transport error leaves the connection in an unknown state, so it is
    /// marked broken and the pool drops it on return; a dropped connection (not a timeout)
    /// also retires every connection made before it.
    pub(crate) fn call<T>(
        &mut self,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> redis::RedisResult<T> {
        let result = f(&mut self.conn);
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

    fn is_stale(&self) -> bool {
        self.number < self.shared.epoch.load(Ordering::Relaxed)
    }
}

/// Makes connections for r2d2.
pub(crate) struct ConnectionManager {
    client: redis::Client,
    connect_timeout: Duration,
    response_timeout: Duration,
    shared: Arc<PoolShared>,
}

impl ConnectionManager {
    pub(crate) fn new(
        client: redis::Client,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> Self {
        ConnectionManager {
            client,
            connect_timeout,
            response_timeout,
            shared: Arc::new(PoolShared::default()),
        }
    }

    fn connect_once(&self) -> redis::RedisResult<redis::Connection> {
        let conn = self
            .client
            .get_connection_with_timeout(self.connect_timeout)?;
        conn.set_read_timeout(Some(self.response_timeout))?;
        conn.set_write_timeout(Some(self.response_timeout))?;
        Ok(conn)
    }
}

impl r2d2::ManageConnection for ConnectionManager {
    type Connection = PooledConnection;
    type Error = redis::RedisError;

    fn connect(&self) -> redis::RedisResult<PooledConnection> {
        match self.connect_once() {
            Ok(conn) => {
                *self.shared.last_error.lock() = None;
                Ok(PooledConnection {
                    conn,
                    number: self.shared.made.fetch_add(1, Ordering::Relaxed),
                    broken: false,
                    shared: Arc::clone(&self.shared),
                })
            }
            Err(err) => {
                *self.shared.last_error.lock() = Some(err.clone());
                Err(err)
            }
        }
    }

    fn is_valid(&self, conn: &mut PooledConnection) -> redis::RedisResult<()> {
        conn.call(|c| redis::cmd("PING").query::<()>(c))
    }

    fn has_broken(&self, conn: &mut PooledConnection) -> bool {
        conn.broken || conn.is_stale() || !redis::ConnectionLike::is_open(&conn.conn)
    }
}

/// Logs connection failures of the pool's background connector at debug level: the caller
/// that waited for the connection gets the error itself.
#[derive(Debug)]
struct QuietErrorHandler;

impl r2d2::HandleError<redis::RedisError> for QuietErrorHandler {
    fn handle_error(&self, error: redis::RedisError) {
        log::debug!("redmutex: connecting to redis failed: {error}");
    }
}

/// The connection pool of a client.
#[derive(Clone)]
pub(crate) struct Pool {
    inner: r2d2::Pool<ConnectionManager>,
    shared: Arc<PoolShared>,
}

/// A connection checked out of the [`Pool`]; it goes back when dropped.
pub(crate) type Checkout = r2d2::PooledConnection<ConnectionManager>;

impl Pool {
    pub(crate) fn new(manager: ConnectionManager, size: u32, connect_timeout: Duration) -> Self {
        let shared = Arc::clone(&manager.shared);
        let inner = r2d2::Pool::builder()
            .max_size(size)
            .min_idle(Some(0))
            .test_on_check_out(false)
            .connection_timeout(connect_timeout)
            .error_handler(Box::new(QuietErrorHandler))
            // One helper thread (r2d2's default is three) for the pool's background work:
            // connecting for waiting callers and reaping idle connections.
            // It drops pending jobs when the pool goes, so that it ends with its client.
            .thread_pool(Arc::new(
                ScheduledThreadPool::builder()
                    .num_threads(1)
                    .thread_name_pattern("redmutex-pool-{}")
                    .on_drop_behavior(OnPoolDropBehavior::DiscardPendingScheduled)
                    .build(),
            ))
            .build_unchecked(manager);
        Pool { inner, shared }
    }

    /// Checks a live connection out, or explains why none could be had within the connect
    /// timeout.
    pub(crate) fn get(&self) -> Result<Checkout> {
        loop {
            let mut conn = self
                .inner
                .get()
                .map_err(|e| self.checkout_error(e).at_checkout())?;
            if !conn.is_stale() {
                return Ok(conn);
            }
            // Made before a connection was seen dropped: most likely dead too.
            conn.broken = true;
        }
    }

    fn checkout_error(&self, pool_err: r2d2::Error) -> Error {
        match self.shared.last_error.lock().clone() {
            Some(err) => {
                let e = Error::from_redis("cannot connect to redis", err);
                if e.is_timeout() {
                    Error::new(ErrorKind::Connection, e.to_string())
                } else {
                    e
                }
            }
            // No connection attempt failed (yet): one is still under way (a server that
            // accepted but does not answer, a slow TLS handshake), or all are in use.
            None => Error::new(
                ErrorKind::Connection,
                format!(
                    "no redis connection was made or became free within the connect timeout: {pool_err}"
                ),
            ),
        }
    }
}
