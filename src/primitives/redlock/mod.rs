//! Redlock: one lock over several independent Redis masters, held while a majority of them
//! hold it. The lease stack over another lessor, the quorum (`lease/quorum.rs`); each
//! instance is an ordinary client, keeping a lock under a client's keys and scripts.

mod builder;

use std::sync::Arc;
use std::time::Duration;

use crate::client::Client;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::lease::{reentrancy, Handle, Lessor, LockContext, Quorum};
#[cfg(feature = "serde")]
use crate::primitives::Shared;
use crate::primitives::{Election, MultiLock, Mutex, MutexGuard, RwLock, Semaphore};
use crate::stats::Stats;
use crate::token::TokenSource;
use crate::waiting::Subscribers;
use crate::IntoAddress;
#[cfg(feature = "serde")]
use serde::{de::DeserializeOwned, Serialize};

pub use builder::RedlockBuilder;

/// A lock held on a majority of a [`Redlock`]'s instances: a [`Mutex`] whose holds live on
/// the quorum (an announcement from any instance wakes its waiters).
pub type RedlockMutex = Mutex;

/// A [`MutexGuard`] of a [`RedlockMutex`]. Its release is `Ok` when a majority confirms it,
/// [`LockLost`](crate::ErrorKind::LockLost) when no majority can have held it, and an error
/// when too few instances answer to tell.
pub type RedlockGuard = MutexGuard;

/// Locks over several independent Redis masters, each held while a majority of them hold it:
/// the Redlock algorithm of redis.io, with what the implementations since added.
///
/// # When to use it
///
/// When no single deployment may be a point of failure (one server with
/// [`replica_acks`](crate::Builder::replica_acks), or Sentinel, is simpler and usually
/// enough): it works while a minority of its instances is down, with no failover. Its safety
/// rests on timing, as every lease's does (docs/guide/deployments.md): fence at the resource
/// with the [`fencing_token`](MutexGuard::fencing_token), ordered across instances.
///
/// # The delayed-restart rule
///
/// An instance that restarts without persistence forgets its locks: with two such restarts
/// in a lease, another client can take a majority while the first still holds. Keep a
/// restarted instance out of service for one maximum lease, or run the instances with
/// `appendfsync always`.
///
/// # Differences from a client's locks
///
/// The handles, guards, re-entry, renewal, events and [`Stats`] are a client's; only where
/// the holds live differs:
///
/// - Each operation goes to every instance at once (writes first, then reads): a round costs
///   about one round trip, bounded by the per-instance timeout
///   ([`instance_timeout`](Redlock::instance_timeout)).
/// - A lease counts from the start of the acquire, minus the time the acquire took and a
///   drift allowance of 1% of the lease plus 2 ms.
/// - A poison record (a thread panicked while holding) is written to every instance that
///   holds the lock, and read from the first instance that has one.
/// - Releases are always awaited (a quorum counts its answers), and a `Mutex`'s holds are
///   never passed between threads of one process without Redis.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> redmutex::Result<()> {
/// let redlock = redmutex::Redlock::open([
///     "redis://10.0.0.1:6379/",
///     "redis://10.0.0.2:6379/",
///     "redis://10.0.0.3:6379/",
/// ])?;
/// let guard = redlock.mutex("orders:42").lock()?;
/// // ... work, passing guard.fencing_token() to the resource ...
/// guard.unlock()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Redlock {
    /// The lease stack over the quorum.
    ctx: Arc<LockContext>,
    quorum: Arc<Quorum>,
    /// Keeps the stack's background threads running while a clone lives.
    _handle: Handle,
}

impl Redlock {
    /// The settings of a Redlock and of the clients it makes for its instances, starting at
    /// their defaults: see [`RedlockBuilder`].
    pub fn builder() -> RedlockBuilder {
        RedlockBuilder::default()
    }

    /// A Redlock over the instances that `clients` reach, with their lease, renewal, backoff
    /// and key settings, which must be the same on every client.
    ///
    /// A lock needs a majority, `n / 2 + 1` of `n` (an even `n` tolerates no more failures
    /// than the odd number below it).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) when no client is given, two reach the
    /// same server, or two disagree on a setting of the lease, backoff or keys (named).
    pub fn new<I>(clients: I) -> Result<Redlock>
    where
        I: IntoIterator<Item = Client>,
    {
        let clients: Vec<Client> = clients.into_iter().collect();
        if clients.is_empty() {
            return Err(Error::config("a Redlock needs at least one instance"));
        }
        if let Some(conflict) = builder::first_conflict(&clients) {
            return Err(conflict);
        }
        let reaching = clients
            .iter()
            .map(|c| (Arc::clone(c.context()), Arc::clone(c.connections())));
        Ok(Redlock::over(Quorum::of(reaching.collect())?))
    }

    /// The lease stack over `quorum`, with the settings of its first instance's client.
    fn over(quorum: Quorum) -> Redlock {
        let first = &quorum.instances[0].ctx;
        let config = Config {
            // Each instance's client asks its own replicas; the quorum asks none.
            replica_acks: None,
            ..first.config.clone()
        };
        let subscribers = Subscribers::of_quorum(
            quorum.instances.iter().map(|i| &i.ctx.subscriber),
            quorum.quorum,
        );
        let quorum = Arc::new(quorum);
        let lessor: Arc<dyn Lessor> = Arc::clone(&quorum) as Arc<dyn Lessor>;
        let ctx = Arc::new(LockContext::new(
            reentrancy::new_owner(),
            config,
            lessor,
            subscribers,
            TokenSource::new(),
        ));
        Redlock {
            _handle: Handle::new(&ctx),
            ctx,
            quorum,
        }
    }

    /// A Redlock over one client per URL, each with the default settings (for others, see
    /// [`builder`](Redlock::builder)).
    ///
    /// # Errors
    ///
    /// As [`Client::open`] for each URL, and as [`new`](Redlock::new).
    pub fn open<I>(urls: I) -> Result<Redlock>
    where
        I: IntoIterator,
        I::Item: IntoAddress,
    {
        Redlock::builder().open(urls)
    }

    /// This Redlock with how long each instance may take to answer one call (see
    /// [`RedlockBuilder::instance_timeout`], which sets the same). A lease not above it is
    /// refused by the first acquire.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) when `timeout` is zero, or not below
    /// the default lease.
    pub fn instance_timeout(self, timeout: Duration) -> Result<Redlock> {
        let lease = self.ctx.config.default_lease;
        if timeout.is_zero() || timeout >= lease {
            return Err(Error::config(format!(
                "the per-instance timeout ({timeout:?}) must be above zero and below the lease \
                 ({lease:?})"
            )));
        }
        Ok(Redlock::over(Quorum {
            instance_timeout: Some(timeout),
            ..Quorum::clone(&self.quorum)
        }))
    }

    /// The number of instances.
    pub fn instances(&self) -> usize {
        self.quorum.instances.len()
    }

    /// How many instances must hold a lock: `instances() / 2 + 1`.
    pub fn quorum(&self) -> usize {
        self.quorum.quorum
    }

    /// A handle to the lock `name`, held on a majority of the instances. Cheap: nothing is
    /// sent until it is used.
    pub fn mutex(&self, name: impl AsRef<str>) -> RedlockMutex {
        Mutex::new(Arc::clone(&self.ctx), name.as_ref())
    }

    /// The election `name`, led by the holder of a lock held on a majority of the instances,
    /// as [`Client::election`] gives one. Cheap. The leader's record and the log of changes
    /// are written on every instance it reaches; [`leader`](Election::leader) names a leader
    /// only when a majority of the instances name its term, and an
    /// [`Observer`](crate::Observer) reads every instance's log and tells each change once,
    /// in order.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let redlock = redmutex::Redlock::open([
    ///     "redis://10.0.0.1/",
    ///     "redis://10.0.0.2/",
    ///     "redis://10.0.0.3/",
    /// ])?;
    /// let leadership = redlock.election("scheduler").campaign("10.0.0.7:8080")?;
    /// println!("leading with term {}", leadership.term());
    /// # Ok(()) }
    /// ```
    pub fn election(&self, name: impl AsRef<str>) -> Election {
        Election::new(Arc::clone(&self.ctx), name.as_ref())
    }

    /// A handle to the read-write lock `name`, held on a majority of the instances, as
    /// [`Client::rwlock`] gives one. Cheap.
    pub fn rwlock(&self, name: impl AsRef<str>) -> RwLock {
        RwLock::new(Arc::clone(&self.ctx), name.as_ref())
    }

    /// A handle to the semaphore `name` with `permits` permits, as [`Client::semaphore`]
    /// gives one. Cheap.
    ///
    /// A permit is held on more than a majority when there are several: on `n·p/(p+1) + 1`
    /// of `n` instances for `p` permits (3 of 3 for two permits; 4 of 5), since with fewer,
    /// `p + 1` holders could each hold on their own instances without any instance seeing
    /// more than `p` of them. So a semaphore of many permits tolerates no instance down; one
    /// permit is a lock, and needs a majority.
    pub fn semaphore(&self, name: impl AsRef<str>, permits: u32) -> Semaphore {
        Semaphore::new(Arc::clone(&self.ctx), name.as_ref(), permits, false)
    }

    /// A handle to the locks `names`, taken all or none in one global order, as
    /// [`Client::multi_lock`] gives one; each lock is taken in its own round. Cheap.
    pub fn multi_lock<I>(&self, names: I) -> MultiLock
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        MultiLock::new(&self.ctx, names)
    }

    /// A handle to the value `name` under a lock held on a majority, as [`Client::shared`]
    /// gives one. Cheap. Each write carries its holder's fencing token, and an acquire or
    /// [`get`](Shared::get) reads the newest copy among a majority; a write that reached too
    /// few instances is reported (`LockLost`, or an error that counts them) and may or may
    /// not be what the next holder reads. [`update`](Shared::update) takes the lock.
    #[cfg(feature = "serde")]
    pub fn shared<T>(&self, name: impl AsRef<str>) -> Shared<T>
    where
        T: Serialize + DeserializeOwned + Default + 'static,
    {
        Shared::defaulting(Arc::clone(&self.ctx), name.as_ref())
    }

    /// As [`shared`](Redlock::shared), a missing value starting as `initial`.
    #[cfg(feature = "serde")]
    pub fn shared_or<T>(&self, name: impl AsRef<str>, initial: T) -> Shared<T>
    where
        T: Serialize + DeserializeOwned + Clone + Send + Sync + 'static,
    {
        Shared::starting_as(Arc::clone(&self.ctx), name.as_ref(), initial)
    }

    /// As [`shared`](Redlock::shared), a missing value an
    /// [`ErrorKind::NoValue`](crate::ErrorKind::NoValue) error.
    #[cfg(feature = "serde")]
    pub fn shared_existing<T>(&self, name: impl AsRef<str>) -> Shared<T>
    where
        T: Serialize + DeserializeOwned + 'static,
    {
        Shared::new(Arc::clone(&self.ctx), name.as_ref(), None)
    }

    /// Counters of what this Redlock (and its clones) did so far, as [`Client::stats`]
    /// counts a client's; the instances' clients count only their clean-ups for it.
    pub fn stats(&self) -> Stats {
        self.ctx.stats()
    }
}

impl std::fmt::Debug for Redlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redlock")
            .field("instances", &self.quorum.servers())
            .field("quorum", &self.quorum.quorum)
            .finish_non_exhaustive()
    }
}
