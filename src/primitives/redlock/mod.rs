//! Redlock: one lock over several independent Redis masters, held while a majority of them
//! hold it.
//!
//! The instances are ordinary clients (any deployment each); every instance keeps the lock
//! under the same keys and scripts as a [`Mutex`](crate::Mutex). Redlock adds the quorum: the
//! fan-out of each call to every instance (`instances.rs`), the validity of a hold (the lease
//! minus the time the acquire took and the clock drift), the fencing token ordered across
//! instances (`raise_fence.lua`), renewal on every instance (`renewal.rs`), and the waiting
//! loop over the announcements of every instance (`mutex.rs`).

mod builder;
mod guard;
mod instances;
mod mutex;
mod quorum;
mod renewal;

use std::sync::Arc;
use std::time::Duration;

use crate::client::Client;
use crate::error::{Error, Result};
use crate::lease::{reentrancy, Handle};
use crate::stats::{Background, Counters, Stats};
use crate::waiting::Outage;
use crate::IntoAddress;

pub use builder::RedlockBuilder;
pub use guard::RedlockGuard;
pub use mutex::RedlockMutex;

use instances::Instance;
#[cfg(test)]
pub(crate) use quorum::scripts;
use renewal::Renewal;

/// The longest default per-instance timeout.
const MAX_DEFAULT_INSTANCE_TIMEOUT: Duration = Duration::from_millis(50);

/// The kind its events name.
pub(crate) const KIND: &str = "Redlock";

/// A lock manager over several independent Redis masters (no replication between them): a
/// lock is held while a majority of them hold it, so that losing a minority of the masters
/// loses no lock. This is the Redlock algorithm of redis.io, with the additions of the
/// implementations that learnt from it.
///
/// # When to use it
///
/// One server with [`Builder::replica_acks`](crate::Builder::replica_acks), or a Sentinel
/// deployment, is simpler and usually enough: a failover loses no acknowledged lock. Redlock
/// is for when no single deployment may be a point of failure: it keeps working while a
/// minority of its instances is down, with no failover at all.
///
/// # What the debate says
///
/// Martin Kleppmann argued that Redlock relies on timing (bounded pauses, clock drift and
/// network delay) for safety, and that its per-instance counters give no ordered fencing
/// token; Salvatore Sanfilippo answered that the timing assumptions are those of any lease
/// with an expiry, checked as well as they can be (the validity time left after the acquire).
/// Both agree that a lock protecting correctness needs fencing at the resource. This type
/// gives an ordered fencing token (see [`RedlockGuard::fencing_token`]), renews its leases
/// and tells a holder whose majority is gone.
///
/// # The delayed-restart rule
///
/// An instance that restarts without persistence forgets its locks: with two such restarts
/// in a lease, another client can take a majority while the first still holds. Keep a
/// restarted instance out of service for one maximum lease (start it with a different port,
/// or firewalled, and open it after the lease), or run the instances with `appendfsync
/// always`.
///
/// # Differences from [`Mutex`](crate::Mutex)
///
/// - Each operation goes to every instance at once (writes first, then reads): a round costs
///   about one round trip, bounded by the per-instance timeout
///   ([`instance_timeout`](Redlock::instance_timeout)).
/// - A lease counts from the start of the acquire, minus the time the acquire took and a
///   drift allowance of 1% of the lease plus 2 ms.
/// - A poison record (a thread panicked while holding) is written to every instance that
///   holds the lock, and read from the first instance that has one.
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
    inner: Arc<RedlockCore>,
}

pub(crate) struct RedlockCore {
    id: u64,
    instances: Vec<Instance>,
    quorum: usize,
    /// `None`: the lease / 20, at most 50 ms.
    instance_timeout: Option<Duration>,
    default_lease: Duration,
    renewal_interval: Duration,
    backoff: (Duration, Duration),
    /// How long a blocking acquire rides through too few instances answering.
    outage_patience: Duration,
    renewal: Renewal,
    /// What the Redlock's calls counted, and the handlers its builder was given.
    counters: Arc<Counters>,
}

impl Redlock {
    /// The settings of a Redlock and of the clients it makes for its instances, starting at
    /// their defaults: see [`RedlockBuilder`].
    pub fn builder() -> RedlockBuilder {
        RedlockBuilder::default()
    }

    /// A Redlock over the instances that `clients` reach, with their lease, renewal and
    /// backoff settings, which must be the same on every client.
    ///
    /// Any number of instances is allowed; a lock needs a majority, `n / 2 + 1` (so 2 of 2,
    /// 3 of 4: an even number tolerates no more failures than the odd number below it).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) when no client is given, when two
    /// clients reach the same server, or when two clients disagree on the default lease, the
    /// renewal interval, the outage patience or the backoff (the error names the setting and
    /// both values).
    pub fn new<I>(clients: I) -> Result<Redlock>
    where
        I: IntoIterator<Item = Client>,
    {
        let clients: Vec<Client> = clients.into_iter().collect();
        let Some(first) = clients.first() else {
            return Err(Error::config("a Redlock needs at least one instance"));
        };
        if let Some(conflict) = builder::first_conflict(&clients) {
            return Err(conflict);
        }
        let config = &first.context().config;
        let (default_lease, renewal_interval) = (config.default_lease, config.renewal_interval);
        let backoff = (config.backoff_base, config.backoff_cap);
        let mut seen: Vec<String> = Vec::new();
        for client in &clients {
            let server = client.context().connections.describe();
            if seen.contains(&server) {
                return Err(Error::config(format!(
                    "{server} is given twice: a Redlock's instances must be independent servers"
                )));
            }
            seen.push(server);
        }
        let instances: Vec<Instance> = clients
            .iter()
            .map(|c| Instance {
                ctx: Arc::clone(c.context()),
                _handle: Handle::new(c.context()),
            })
            .collect();
        let quorum = instances.len() / 2 + 1;
        Ok(Redlock {
            inner: Arc::new(RedlockCore {
                id: reentrancy::new_owner(),
                instances,
                quorum,
                instance_timeout: None,
                default_lease,
                renewal_interval,
                backoff,
                outage_patience: config.outage_patience,
                renewal: Renewal::default(),
                counters: Arc::new(Counters::new(config.events.clone())),
            }),
        })
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
    /// [`new`](Redlock::new); [`RedlockBuilder::instance_timeout`] sets the same.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) when `timeout` is zero, or not below
    /// the default lease.
    pub fn instance_timeout(self, timeout: Duration) -> Result<Redlock> {
        if timeout.is_zero() || timeout >= self.inner.default_lease {
            return Err(Error::config(format!(
                "the per-instance timeout ({timeout:?}) must be above zero and below the lease \
                 ({:?})",
                self.inner.default_lease
            )));
        }
        let inner = RedlockCore {
            id: self.inner.id,
            instances: self.inner.instances.clone(),
            quorum: self.inner.quorum,
            instance_timeout: Some(timeout),
            default_lease: self.inner.default_lease,
            renewal_interval: self.inner.renewal_interval,
            backoff: self.inner.backoff,
            outage_patience: self.inner.outage_patience,
            renewal: Renewal::default(),
            counters: Arc::clone(&self.inner.counters),
        };
        Ok(Redlock {
            inner: Arc::new(inner),
        })
    }

    /// The number of instances.
    pub fn instances(&self) -> usize {
        self.inner.instances.len()
    }

    /// How many instances must hold a lock: `instances() / 2 + 1`.
    pub fn quorum(&self) -> usize {
        self.inner.quorum
    }

    /// A handle to the lock `name`, held on a majority of the instances. Cheap: nothing is
    /// sent until it is used.
    pub fn mutex(&self, name: impl AsRef<str>) -> RedlockMutex {
        RedlockMutex::new(Arc::clone(&self.inner), name.as_ref())
    }

    /// Counters of what this Redlock (and its clones) did so far, as
    /// [`Client::stats`](crate::Client::stats) counts a client's: acquisitions, waits,
    /// releases, lost leases, and the majority renewal's rounds. The instances' own clients
    /// count only their clean-ups and wake-ups.
    pub fn stats(&self) -> Stats {
        let inner = &self.inner;
        let (renewals, renewal_round_trips, renewal_time) = inner.renewal.counters();
        let (mut notifications, mut subscriber_reconnects, mut pending_cleanups) = (0, 0, 0);
        for instance in &inner.instances {
            let stats = instance.ctx.stats();
            notifications += stats.notifications;
            subscriber_reconnects += stats.subscriber_reconnects;
            pending_cleanups += stats.pending_cleanups;
        }
        inner.counters.snapshot(Background {
            renewals,
            renewal_round_trips,
            renewal_time,
            renewed_leases: inner.renewal.registered() as u64,
            pending_cleanups,
            notifications,
            subscriber_reconnects,
        })
    }
}

impl RedlockCore {
    /// The per-instance timeout for a lease.
    fn instance_timeout(&self, lease: Duration) -> Duration {
        self.instance_timeout
            .unwrap_or_else(|| (lease / 20).min(MAX_DEFAULT_INSTANCE_TIMEOUT))
            .max(Duration::from_millis(1))
    }

    /// The outage rule of a blocking acquire: it rides through too few instances answering
    /// once a majority of them was reached.
    fn outage(&self) -> Outage<'_> {
        let reached = self
            .instances
            .iter()
            .filter(|i| i.ctx.connections.reached())
            .count();
        Outage::with(
            reached >= self.quorum,
            self.outage_patience,
            self.backoff,
            &self.counters,
        )
    }

    /// The clock drift allowed for a lease: 1% of it plus 2 ms.
    fn drift(lease: Duration) -> Duration {
        crate::config::clock_drift(lease)
    }
}

impl std::fmt::Debug for Redlock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let instances: Vec<String> = self
            .inner
            .instances
            .iter()
            .map(|i| i.ctx.connections.describe())
            .collect();
        f.debug_struct("Redlock")
            .field("instances", &instances)
            .field("quorum", &self.inner.quorum)
            .finish_non_exhaustive()
    }
}
