//! `Client`: the handle to one Redis deployment, from which locks are made (its settings are
//! the [`Builder`](crate::Builder)'s).

use std::fmt;
use std::sync::Arc;

use crate::config::Config;
use crate::connection::Connections;
use crate::error::Result;
use crate::inspect::{self, LockInfo};
use crate::lease::{reentrancy, Handle, LockContext};
#[cfg(feature = "serde")]
use crate::primitives::Shared;
use crate::primitives::{Election, FairMutex, MultiLock, Mutex, RwLock, Semaphore};
use crate::stats::Stats;
use crate::token::TokenSource;
#[cfg(feature = "serde")]
use serde::{de::DeserializeOwned, Serialize};

/// A handle to one Redis deployment, from which locks are made.
///
/// A `Client` owns a pool of connections per server and a few background threads, whatever
/// the number of locks and waiters, each started when first needed: the renewal thread (once
/// a lock needs renewal, or a failed call needs cleaning up after), a subscriber thread per
/// server that has waiters (once a thread waits), and, for a Sentinel deployment, a listener
/// for failovers. (Every pool of the process shares one more thread, which closes idle
/// connections.) It is cheap to clone (an `Arc` inside), `Send` and `Sync`: make one per
/// Redis and share it. Building one makes no connection; the first operation connects. Until
/// a connection has been made, a call fails as [`check`](Client::check) does (at once when
/// the connection is refused); after that, a blocking acquire rides through an outage for the
/// [outage patience](crate::Builder::outage_patience).
///
/// The background threads stop when the last handle is dropped: the last clone of the
/// client and of every lock handle made from it ([`Mutex`], [`FairMutex`](crate::FairMutex),
/// …; guards do not count), as crossbeam's channels and r2d2's pools stop with their last
/// handle. A guard that outlives every handle (one leaked with `std::mem::forget`, or
/// returned from a function whose client was a local) still releases on drop, but is no
/// longer renewed: its lock expires with its lease, and its [`LeaseWatch`](crate::LeaseWatch)
/// reports the loss then (a warning is logged). Keep the client, or the lock's handle, for as
/// long as you hold its locks; to leave a lock held until its lease ends, use
/// [`MutexGuard::keep_until_expiry`](crate::MutexGuard::keep_until_expiry).
/// [`Client::shutdown`] closes every clone at once and waits for the threads.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> redmutex::Result<()> {
/// use std::time::Duration;
///
/// let client = redmutex::Client::builder()
///     .pool_size(8)
///     .response_timeout(Duration::from_secs(1))
///     .key_prefix("billing")
///     .open("redis://127.0.0.1/")?;
/// let _guard = client.mutex("invoice:2026-11").lock()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Client {
    shared: Arc<LockContext>,
    /// The deployment's connections (the context's lessor sends through them too).
    connections: Arc<Connections>,
    /// Keeps the background threads running while a clone lives (see `Handle`).
    _handle: Handle,
}

impl Client {
    /// A handle to the lock called `name`. Cheap; nothing is sent to Redis.
    ///
    /// The name is checked here but an invalid one (empty, or longer than
    /// [`MAX_NAME_LEN`](crate::MAX_NAME_LEN) bytes) is reported by the first operation on the
    /// handle, as an [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument), so
    /// that `client.mutex(name).lock()?` reads naturally.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let stock = client.mutex("stock:sku-42");
    /// let guard = stock.lock()?;
    /// println!("fencing token {}", guard.fencing_token());
    /// # Ok(()) }
    /// ```
    pub fn mutex(&self, name: impl AsRef<str>) -> Mutex {
        Mutex::new(Arc::clone(&self.shared), name.as_ref())
    }

    /// The election called `name`: one leader at a time among every process that campaigns
    /// in it, with rising terms. Cheap; nothing is sent to Redis. See [`Election`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let leadership = client.election("scheduler").campaign("10.0.0.7:8080")?;
    /// println!("leading, term {}", leadership.term());
    /// # Ok(()) }
    /// ```
    pub fn election(&self, name: impl AsRef<str>) -> Election {
        Election::new(Arc::clone(&self.shared), name.as_ref())
    }

    /// A handle to the fair (FIFO) lock called `name`: waiters get it in the order they asked
    /// for it, across every process. Cheap; nothing is sent to Redis. See [`FairMutex`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let _turn = client.fair_mutex("batch-slot").lock()?;
    /// # Ok(()) }
    /// ```
    pub fn fair_mutex(&self, name: impl AsRef<str>) -> FairMutex {
        FairMutex::new(Arc::clone(&self.shared), name.as_ref())
    }

    /// A handle to the read-write lock called `name`: many readers at once, or one writer.
    /// Cheap; nothing is sent to Redis. See [`RwLock`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let _read = client.rwlock("catalog").read()?;
    /// # Ok(()) }
    /// ```
    pub fn rwlock(&self, name: impl AsRef<str>) -> RwLock {
        RwLock::new(Arc::clone(&self.shared), name.as_ref())
    }

    /// A handle to the counting semaphore called `name`, with `permits` permits unless Redis
    /// has a count for it already (then that count). Cheap; nothing is sent to Redis. See
    /// [`Semaphore`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let _permit = client.semaphore("exports", 3).acquire()?;
    /// # Ok(()) }
    /// ```
    pub fn semaphore(&self, name: impl AsRef<str>, permits: u32) -> Semaphore {
        Semaphore::new(Arc::clone(&self.shared), name.as_ref(), permits, false)
    }

    /// A handle to the counting semaphore called `name`, as [`semaphore`](Client::semaphore)
    /// gives, that grants its permits in the order they were asked for, across all processes
    /// (see [`Semaphore`]'s `# Fairness`). Cheap; nothing is sent to Redis.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let reports = client.fair_semaphore("reports", 2);
    /// let _big = reports.acquire_many(2)?; // later callers of one permit wait behind it
    /// # Ok(()) }
    /// ```
    pub fn fair_semaphore(&self, name: impl AsRef<str>, permits: u32) -> Semaphore {
        Semaphore::new(Arc::clone(&self.shared), name.as_ref(), permits, true)
    }

    /// A handle to the locks called `names`, held together: all or none. See [`MultiLock`].
    /// Cheap; nothing is sent to Redis. As with every other handle, bad input is reported by
    /// the first acquire: [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)
    /// when no name is given, one is given twice, or a name is not valid.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let _both = client.multi_lock(["account:17", "account:42"]).lock()?;
    /// # Ok(()) }
    /// ```
    pub fn multi_lock<I>(&self, names: I) -> MultiLock
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        MultiLock::new(&self.shared, names)
    }

    /// A handle to the value called `name`, kept in Redis under a lock (see [`Shared`]); a
    /// missing value starts as `T::default()`. Cheap; nothing is sent to Redis.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let mut next_id = client.shared::<u64>("next-invoice-id").lock()?;
    /// *next_id += 1;
    /// println!("invoice {}", *next_id);
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "serde")]
    pub fn shared<T>(&self, name: impl AsRef<str>) -> Shared<T>
    where
        T: Serialize + DeserializeOwned + Default + 'static,
    {
        Shared::defaulting(Arc::clone(&self.shared), name.as_ref())
    }

    /// A handle to the value called `name`, as [`shared`](Client::shared) gives, whose
    /// missing value starts as `initial`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let stock = client.shared_or("stock:sku-42", 100u64);
    /// let left = stock.lock()?; // 100 the first time
    /// # drop(left);
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "serde")]
    pub fn shared_or<T>(&self, name: impl AsRef<str>, initial: T) -> Shared<T>
    where
        T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
    {
        Shared::starting_as(Arc::clone(&self.shared), name.as_ref(), initial)
    }

    /// A handle to the value called `name`, as [`shared`](Client::shared) gives, for which a
    /// missing value is an [`ErrorKind::NoValue`](crate::ErrorKind::NoValue) error (the lock
    /// released at once).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// match client.shared_existing::<String>("config:leader").lock() {
    ///     Ok(leader) => println!("leader: {}", *leader),
    ///     Err(e) if e.kind() == redmutex::ErrorKind::NoValue => println!("no leader yet"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "serde")]
    pub fn shared_existing<T>(&self, name: impl AsRef<str>) -> Shared<T>
    where
        T: Serialize + DeserializeOwned + 'static,
    {
        Shared::new(Arc::clone(&self.shared), name.as_ref(), None)
    }

    /// The names of the locks (of every kind) that hold keys in Redis now and match
    /// `pattern`, a glob over names (`*`, `?`, `[…]`), sorted. Reads with `SCAN` on every
    /// server, never `KEYS`; a name whose only keys left are its fencing counter and a removed
    /// value's version (used before, free now) is not listed.
    ///
    /// # Errors
    ///
    /// Connection and timeout errors.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// for name in client.lock_names("orders:*")? {
    ///     let info = client.lock_info(&name)?;
    ///     println!("{name}: held {}", info.is_held());
    /// }
    /// # Ok(()) }
    /// ```
    pub fn lock_names(&self, pattern: &str) -> Result<Vec<String>> {
        inspect::lock_names(&self.connections, &self.shared.config.key_prefix, pattern)
    }

    /// Everything Redis says about the lock `name` now, of whatever kind: its holder or
    /// holders with their clients' announcements ([`Builder::client_name`](crate::Builder::client_name), host, process),
    /// how long their leases have left, the fencing counter, the queue and the waiting
    /// clients. Takes nothing; a few round trips.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) for a bad name;
    /// connection and timeout errors.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let info = client.lock_info("orders:42")?;
    /// if let Some(holder) = &info.holder {
    ///     let who = holder.client.as_ref().map_or("an unknown client", |c| c.name.as_str());
    ///     println!("held by {who}, thread {}", holder.thread);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn lock_info(&self, name: &str) -> Result<LockInfo> {
        inspect::lock_info(&self.connections, &self.shared.config.key_prefix, name)
    }

    /// Checks that the client can reach Redis as its address says, for a service to run at
    /// start-up: connects (within the connect timeout), authenticates and selects the
    /// database, and gets an answer to a `TIME` (within the response timeout; a command the
    /// ACL list in docs/guide/tls-and-acl.md allows), from the
    /// server, the master the sentinels name, or every master of a cluster. Opening a client
    /// connects nothing; without this check, a wrong address shows at the first lock.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) for a database index the server does
    /// not have (or a master name the sentinels do not know);
    /// [`ErrorKind::Auth`](crate::ErrorKind::Auth) for wrong credentials;
    /// [`ErrorKind::Connection`](crate::ErrorKind::Connection) when nothing answers there, or
    /// something that does not speak Redis; [`ErrorKind::Timeout`](crate::ErrorKind::Timeout)
    /// when the server does not answer in time.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::open("redis://127.0.0.1:6379/0")?;
    /// client.check()?; // fail at start-up, not at the first lock
    /// # Ok(()) }
    /// ```
    pub fn check(&self) -> Result<()> {
        self.shared.ensure_open()?;
        let connections = &self.connections;
        let doing = crate::error::Doing::work("checking the connection");
        for shard in 0..connections.shards().max(1) {
            connections.call_shard(shard, doing, |c| redis::cmd("TIME").query::<()>(c))?;
        }
        Ok(())
    }

    /// Counters of what this client (and its clones) did so far; see [`Stats`].
    pub fn stats(&self) -> Stats {
        self.shared.stats()
    }

    /// Shuts the client down: every clone of it stops taking locks, and its background
    /// threads end.
    ///
    /// After `shutdown` returns:
    /// - every acquire, [`is_locked`](crate::Mutex::is_locked) and
    ///   [`force_unlock`](crate::Mutex::force_unlock) through any clone, and through every
    ///   handle made from one, fails at once with
    ///   [`ErrorKind::Shutdown`](crate::ErrorKind::Shutdown), also in threads that were
    ///   waiting for a lock (they wake up and fail);
    /// - guards still held keep working and still release their lock on drop or
    ///   [`unlock`](crate::MutexGuard::unlock), but their leases are no longer renewed: they
    ///   run out, and the guards report the lease lost then;
    /// - every [`Leadership`](crate::Leadership) of the client has resigned (once the
    ///   client took no more locks, so that its leader cannot campaign again, and before its
    ///   connections closed): it reads as lost, and a waiting candidate leads at once;
    /// - the renewal and subscriber threads have ended (the renewal thread makes one last
    ///   attempt at pending clean-ups first, within the client's timeouts), and they are not
    ///   started again.
    ///
    /// It does not wait for other clones to be dropped. Dropping every clone and handle
    /// instead ends the threads by themselves, without closing anything early.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let worker = client.clone();
    /// client.shutdown();
    /// let err = worker.mutex("job").lock().unwrap_err();
    /// assert!(err.is_shutdown());
    /// # Ok(()) }
    /// ```
    pub fn shutdown(self) {
        self.shared.shut_down();
    }

    /// What every lock made from this client shares.
    pub(crate) fn context(&self) -> &Arc<LockContext> {
        &self.shared
    }

    /// The client of a deployment's connections, with checked settings.
    pub(crate) fn new(config: Config, connections: Connections) -> Client {
        let connections = Arc::new(connections);
        let shared = Arc::new(LockContext::single(
            reentrancy::new_owner(),
            config,
            Arc::clone(&connections),
            TokenSource::new(),
        ));
        Client {
            _handle: Handle::new(&shared),
            shared,
            connections,
        }
    }

    /// The deployment's connections.
    pub(crate) fn connections(&self) -> &Arc<Connections> {
        &self.connections
    }
}

impl fmt::Debug for Client {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Client")
            .field("address", &self.connections.describe())
            .field("client_id", &self.shared.tokens.client_uuid())
            .field("key_prefix", &self.shared.config.key_prefix)
            .finish_non_exhaustive()
    }
}
