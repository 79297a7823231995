//! Redlock: one lock over several independent Redis masters, held while a majority of them
//! hold it.
//!
//! The instances are ordinary clients (any deployment each); every instance keeps a lock
//! under the same keys and scripts as a client's. A Redlock is the lease stack over another
//! lessor, the quorum (`lease/quorum.rs`: the rounds over every instance, the validity of a
//! hold, the fencing token ordered across instances). Handles, guards, re-entry, renewal,
//! waiting, events and counters are the client's own.

mod builder;

use std::sync::Arc;
use std::time::Duration;

use crate::client::Client;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::lease::{reentrancy, Handle, Lessor, LockContext, Quorum};
use crate::primitives::{MultiLock, Mutex, MutexGuard, RwLock, Semaphore};
use crate::stats::Stats;
use crate::token::TokenSource;
use crate::waiting::Subscribers;
use crate::IntoAddress;

pub use builder::RedlockBuilder;

/// A lock name held on a majority of a [`Redlock`]'s instances: a [`Mutex`] whose holds live
/// on the quorum, with every method of a client's (waiters listen for releases on every
/// instance; an announcement from any instance wakes them).
pub type RedlockMutex = Mutex;

/// A lock held on a majority of a [`Redlock`]'s instances: a [`MutexGuard`]. Dropping it
/// releases the lock on every instance (the outermost guard of a re-entrant hold; inner ones
/// only count down); a release that a majority confirms is `Ok`, one that too few instances
/// answer to tell is an error, and one that shows no majority held it is
/// [`LockLost`](crate::ErrorKind::LockLost).
pub type RedlockGuard = MutexGuard;

/// A lock manager over several independent Redis masters (no replication between them): a
/// lock is held while a majority of them hold it, so that losing a minority of the masters
/// loses no lock. This is the Redlock algorithm of redis.io, with the additions of the
/// implementations that learnt from it.
///
/// # When to use it
///
/// One server with [`Builder::replica_acks`](crate::Builder::replica_acks), or a Sentinel
/// deployment, is simpler and usually enough. Redlock is for when no single deployment may be
/// a point of failure: it keeps working while a minority of its instances is down, with no
/// failover at all. Its safety rests on timing, as every lease's does (the Kleppmann and
/// Sanfilippo debate, in docs/guide/deployments.md): fence at the resource with the guard's
/// [`fencing_token`](MutexGuard::fencing_token), which is ordered across instances.
///
/// # The delayed-restart rule
///
/// An instance that restarts without persistence forgets its locks: with two such restarts
/// in a lease, another client can take a majority while the first still holds. Keep a
/// restarted instance out of service for one maximum lease (start it with a different port,
/// or firewalled, and open it after the lease), or run the instances with `appendfsync
/// always`.
///
/// # Differences from a client's locks
///
/// The handles are a client's own ([`Mutex`], [`RwLock`], [`Semaphore`]), with the same
/// guards, re-entry, renewal, events and [`Stats`]; only where their holds live differs:
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
    /// Any number of instances is allowed; a lock needs a majority, `n / 2 + 1` (so 2 of 2,
    /// 3 of 4: an even number tolerates no more failures than the odd number below it).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) when no client is given, when two
    /// clients reach the same server, or when two clients disagree on the default lease, the
    /// renewal interval, the outage patience, the backoff or the key prefix (the error names
    /// the setting and both values).
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

    /// This Redlock with how long each instance may take to answer one call before it counts
    /// as not answering (default: the lease / 20, at most 50 ms), so that a dead or slow
    /// instance cannot eat a lease's validity. For a Redlock made with
    /// [`new`](Redlock::new); [`RedlockBuilder::instance_timeout`] sets the same. A lease not
    /// above it is refused by the first acquire.
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

    /// Counters of what this Redlock (and its clones) did so far, as
    /// [`Client::stats`] counts a client's: acquisitions, waits, releases, lost leases, the
    /// renewal's rounds and the wake-ups of its waiters. The instances' own clients count
    /// only the clean-ups they send for it.
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
