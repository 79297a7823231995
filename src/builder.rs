//! [`Builder`]: a client's settings, each checked where it is set out, and the client made
//! from them and an address.

use std::sync::Arc;
use std::time::Duration;

use crate::client::Client;
use crate::config::{lease_problem, Config, ReplicaAcks};
#[cfg(feature = "tls")]
use crate::connection::ClientCertificate;
use crate::connection::{
    tcp_nodes, Address, AddressKind, ClusterAddress, IntoAddress, PoolSettings, Reach,
    SentinelAddress, Wiring,
};
use crate::error::{Error, Result};
use crate::events::{EventHandler, Events};
use crate::human_duration::Human;
use crate::identity;
use crate::keys;

/// The ways to a client: its settings' defaults, or a builder of them.
impl Client {
    /// Makes a client with the default settings for the Redis at `url`
    /// (`redis://[user:password@]host[:port][/db]`, or `rediss://…` for TLS, which needs the
    /// `tls` feature, on by default).
    ///
    /// A `rediss://` server's certificate is checked against the system's trust store and
    /// the URL's host name; for a private CA, use
    /// `Builder::tls_ca_certificates`. A user name and password in the URL are sent with
    /// `AUTH` on every new connection (Redis ACL users, or `requirepass` with no user name).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) when the URL cannot be parsed.
    /// Nothing is connected yet.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::open("redis://127.0.0.1:6379/0")?;
    /// let over_tls = redmutex::Client::open("rediss://locker:s3cret@redis.internal:6380/")?;
    /// # Ok(()) }
    /// ```
    pub fn open<T: IntoAddress>(url: T) -> Result<Client> {
        Builder::new().open(url)
    }

    /// Starts building a client with settings of your own.
    pub fn builder() -> Builder {
        Builder::new()
    }
}

/// Whether replicas acknowledge lease writes: see [`Builder::replica_acks`].
#[derive(Debug, Clone, Copy)]
enum AckSetting {
    /// One replica under Sentinel and in a Cluster, where the deployment names one.
    Default,
    Off,
    Ask(u32, Duration),
}

/// How long a lease write waits for a replica by default (less when the response timeout or
/// the renewal interval is short).
const DEFAULT_ACK_TIMEOUT: Duration = Duration::from_millis(500);

/// Settings for a [`Client`]; start with [`Client::builder`].
///
/// Every setting has a default fit for most services; [`open`](Builder::open) checks them
/// all and reports a value out of range as an [`ErrorKind::Config`](crate::ErrorKind::Config)
/// error, never a panic.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> redmutex::Result<()> {
/// use std::time::Duration;
///
/// let client = redmutex::Client::builder()
///     .default_lease(Duration::from_secs(10))
///     .renewal_interval(Duration::from_secs(2))
///     .backoff(Duration::from_millis(5), Duration::from_millis(200))
///     .open("redis://127.0.0.1/")?;
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct Builder {
    pool_size: u32,
    idle_timeout: Option<Duration>,
    max_lifetime: Option<Duration>,
    connect_timeout: Duration,
    response_timeout: Duration,
    default_lease: Duration,
    renewal_interval: Option<Duration>,
    key_prefix: String,
    backoff_base: Duration,
    backoff_cap: Duration,
    outage_patience: Duration,
    replica_acks: AckSetting,
    client_name: Option<String>,
    events: Events,
    #[cfg(feature = "metrics")]
    metrics: Option<crate::events::MetricsEvents>,
    /// TLS and the sentinels' credentials.
    wiring: Wiring,
}

impl Default for Builder {
    fn default() -> Self {
        Builder::new()
    }
}

impl Builder {
    /// A builder with every setting at its default.
    pub fn new() -> Self {
        Builder {
            pool_size: 16,
            idle_timeout: Some(Duration::from_secs(600)),
            max_lifetime: Some(Duration::from_secs(1800)),
            connect_timeout: Duration::from_secs(5),
            response_timeout: Duration::from_secs(3),
            default_lease: Duration::from_secs(30),
            renewal_interval: None,
            key_prefix: "redmutex".to_owned(),
            client_name: None,
            events: Events::default(),
            #[cfg(feature = "metrics")]
            metrics: Some(crate::events::MetricsEvents::new()),
            backoff_base: Duration::from_millis(10),
            backoff_cap: Duration::from_millis(500),
            outage_patience: Duration::from_secs(20),
            replica_acks: AckSetting::Default,
            wiring: Wiring::default(),
        }
    }

    /// The most connections the pool holds; each in-flight call uses one. There is a pool
    /// per server (each Sentinel or Cluster master, each Redlock instance); it makes a
    /// connection only when a caller finds none idle.
    ///
    /// Defaults to 16. Must be at least 1.
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// How long a pooled connection may stay unused before it is closed; `None` keeps idle connections open. Checked every 30 seconds.
    ///
    /// Defaults to 10 minutes. Must not be zero.
    pub fn idle_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.idle_timeout = timeout;
        self
    }

    /// How old a pooled connection may grow before it is closed, once idle; `None` keeps connections for as long as they work. Checked every 30
    /// seconds.
    ///
    /// Defaults to 30 minutes. Must not be zero.
    pub fn max_lifetime(mut self, lifetime: Option<Duration>) -> Self {
        self.max_lifetime = lifetime;
        self
    }

    /// How long making a connection, or waiting for a free pooled one, may take.
    ///
    /// Defaults to 5 seconds. Must not be zero.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long Redis may take to answer one call before it fails with
    /// [`ErrorKind::Timeout`](crate::ErrorKind::Timeout).
    ///
    /// Defaults to 3 seconds. Must not be zero.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// The lease of locks taken without a fixed lease: how long a lock outlives a holder that
    /// died. The renewal thread keeps it from running out while the holder lives.
    ///
    /// Defaults to 30 seconds. Must be at least 1 ms and at most [`MAX_LEASE`](crate::MAX_LEASE).
    pub fn default_lease(mut self, lease: Duration) -> Self {
        self.default_lease = lease;
        self
    }

    /// The name this client announces, beside its host, process id and start time, so that
    /// whoever looks at a lock (`redmutex list`, [`Client::lock_info`]) sees who holds it.
    ///
    /// Defaults to the program's name. The announcement is a hash at `P:client:<client id>`,
    /// written by the renewal thread half a second after the client's first lock (or one
    /// renewal interval, if shorter), kept alive with one `PEXPIRE` per renewal period, and
    /// gone within a lease after the process died; nothing is added to an acquire or a
    /// release.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::builder()
    ///     .client_name("billing-worker")
    ///     .open("redis://127.0.0.1/")?;
    /// # Ok(()) }
    /// ```
    pub fn client_name(mut self, name: impl Into<String>) -> Self {
        self.client_name = Some(name.into());
        self
    }

    /// Adds a handler of this client's events: acquisitions and their waits, releases and
    /// their hold times, time-outs, failures, lost leases, renewal rounds and waiting threads
    /// (see [`events`](crate::events)). Handlers run on the thread of the event and must be
    /// quick. Without handlers, the events cost nothing but a branch.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// use redmutex::events::{EventHandler, Released};
    ///
    /// struct LongHolds;
    ///
    /// impl EventHandler for LongHolds {
    ///     fn released(&self, e: &Released<'_>) {
    ///         if e.held.as_secs() > 60 {
    ///             eprintln!("{} was held for {:?}", e.name, e.held);
    ///         }
    ///     }
    /// }
    ///
    /// let client = redmutex::Client::builder()
    ///     .event_handler(LongHolds)
    ///     .open("redis://127.0.0.1/")?;
    /// # Ok(()) }
    /// ```
    pub fn event_handler(mut self, handler: impl EventHandler) -> Self {
        self.events.add(Arc::new(handler));
        self
    }

    /// Whether and how this client records metrics through the `metrics` facade (the
    /// `metrics` feature): `Some` of a [`MetricsEvents`](crate::events::MetricsEvents)
    /// (labels by kind only, by default), or `None` for none. Recording without a recorder
    /// installed costs a few atomic loads.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::builder()
    ///     .metrics(Some(redmutex::events::MetricsEvents::new().with_lock_names()))
    ///     .open("redis://127.0.0.1/")?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "metrics")]
    pub fn metrics(mut self, metrics: Option<crate::events::MetricsEvents>) -> Self {
        self.metrics = metrics;
        self
    }

    /// The event handlers the client gets: the given ones, and the metrics.
    fn all_events(&self) -> Events {
        #[allow(unused_mut)]
        let mut events = self.events.clone();
        #[cfg(feature = "metrics")]
        if let Some(metrics) = &self.metrics {
            events.add(Arc::new(metrics.clone()));
        }
        events
    }

    /// How often the renewal thread renews the leases of held locks.
    ///
    /// Defaults to a third of the default lease. Must not be zero and must be below the
    /// default lease.
    pub fn renewal_interval(mut self, interval: Duration) -> Self {
        self.renewal_interval = Some(interval);
        self
    }

    /// The prefix of every Redis key the client writes (`<prefix>:{<name>}`…).
    ///
    /// Defaults to `redmutex`. Must be 1 to 256 bytes, without `{` or `}`.
    pub fn key_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.key_prefix = prefix.into();
        self
    }

    /// The delays between attempts of a contended acquire: the n-th delay is random in
    /// `[0, min(cap, base × 2ⁿ)]`, and never past the lock's remaining lease nor the
    /// caller's deadline.
    ///
    /// Defaults to a base of 10 ms and a cap of 500 ms. The base must not be zero and the cap
    /// must not be below the base.
    pub fn backoff(mut self, base: Duration, cap: Duration) -> Self {
        self.backoff_base = base;
        self.backoff_cap = cap;
        self
    }

    /// How long a blocking acquire (`lock()`, `try_lock_for`, `try_lock_until`, and their
    /// forms on every primitive) keeps trying through an outage: a server restarting or
    /// briefly unreachable, a Sentinel or Cluster failover the client is following. A
    /// connection error, a time-out, too few replica acknowledgements, or a server's "not
    /// now" (`CLUSTERDOWN`, `TRYAGAIN`, `LOADING`, `MASTERDOWN`, `READONLY`) does not end the
    /// call: it tries again after a backoff step, until the lock is taken, its deadline
    /// passes, or this long has passed since the call's first such error; then it returns
    /// the last error. `try_lock()` stays one attempt and returns the first error. Renewal
    /// keeps trying through an outage too, until the lease runs out on this machine's clock.
    ///
    /// The patience is for a deployment the client has reached: until its first connection
    /// was made (a handshake answered), a blocking call fails as [`Client::check`] does — at
    /// once when the connection is refused, within the connect timeout when the server does
    /// not answer, and with [`ErrorKind::Config`](crate::ErrorKind::Config) when the
    /// sentinels do not know the master's name — since a wrong address is no outage to wait
    /// out. A restart, failover or pause after that is ridden through.
    ///
    /// Defaults to 20 seconds: a restart, and a failover with the servers' usual settings, fit
    /// in it. `Duration::ZERO` returns the first error at once.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::builder()
    ///     .outage_patience(Duration::from_secs(60))
    ///     .open("redis://127.0.0.1/")?;
    /// // Blocks through a restart of up to a minute, then returns the last error.
    /// let _guard = client.mutex("nightly").lock()?;
    /// # Ok(()) }
    /// ```
    pub fn outage_patience(mut self, patience: Duration) -> Self {
        self.outage_patience = patience;
        self
    }

    /// Makes every write that sets a lease wait until `replicas` replicas acknowledged it
    /// (Redis `WAIT`, in the write's round trip), for at most `timeout`: the acquire, each
    /// renewal, [`extend`](crate::MutexGuard::extend) and
    /// [`set_lease`](crate::MutexGuard::set_lease), a reader's and a semaphore holder's
    /// lease. The client counts a lease only from the last write that reached them (less a
    /// clock-drift allowance of 1 % and 2 ms), so a holder cut off with its master is told its
    /// lease ran out before a promoted replica's copy of the lock expires and someone else
    /// can take it there.
    ///
    /// - An acquire that too few replicas acknowledged is rolled back (the lock deleted with
    ///   its own token) and fails with [`ErrorKind::NotReplicated`](crate::ErrorKind::NotReplicated);
    ///   blocking acquires try again within their [outage patience](Builder::outage_patience).
    /// - A renewal that too few acknowledged extends nothing: it is sent again soon, and the
    ///   holder is told when the lease it counts runs out.
    /// - An extension that too few acknowledged fails with `NotReplicated` and the lease the
    ///   holder counts stays as it was.
    ///
    /// Under Sentinel and in a Cluster, only the replicas a failover may promote are asked
    /// (with every replica attached to the master now): a replica the sentinels count down,
    /// or that the Cluster counts failing, is not waited for, so a deployment with a dead
    /// replica keeps granting locks. One server with replicas asks all `replicas` always.
    ///
    /// **Default:** a Sentinel or Cluster client asks one replica, for at most 500 ms (less
    /// when the response timeout or the renewal interval is short), wherever the deployment
    /// names a replica it can promote, and none where it names none; a client of one server
    /// asks none. [`no_replica_acks`](Builder::no_replica_acks) turns them off.
    /// docs/guarantees.md says what this keeps and what it does not: Redis replication stays
    /// asynchronous, and a replica that acknowledged can still lose the write in a crash.
    ///
    /// `replicas` must be at least 1, and `timeout` at least 1 ms and below the
    /// [response timeout](Builder::response_timeout).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// use std::time::Duration;
    ///
    /// // Two replicas of each master must hold every lease the client counts.
    /// let client = redmutex::Client::builder()
    ///     .replica_acks(2, Duration::from_millis(200))
    ///     .open("redis+sentinel://10.0.0.5:26379/orders")?;
    /// # let _ = client; Ok(()) }
    /// ```
    pub fn replica_acks(mut self, replicas: u32, timeout: Duration) -> Self {
        self.replica_acks = AckSetting::Ask(replicas, timeout);
        self
    }

    /// Turns off the replica acknowledgements that a Sentinel or Cluster client asks for by
    /// default (see [`replica_acks`](Builder::replica_acks)): each write that sets a lease is
    /// one command fewer and never waits for a replica, and a holder cut off with its master
    /// may then go on believing it holds the lock for up to a lease after a replica was
    /// promoted and someone else took it there (fencing tokens still order the two).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::builder()
    ///     .no_replica_acks()
    ///     .open("redis+sentinel://10.0.0.5:26379/orders")?;
    /// # let _ = client; Ok(()) }
    /// ```
    pub fn no_replica_acks(mut self) -> Self {
        self.replica_acks = AckSetting::Off;
        self
    }

    /// Trusts the certificate authorities in `pem` (one or more PEM `CERTIFICATE` blocks)
    /// to sign the certificate of a `rediss://` server, instead of the system's trust store:
    /// for a Redis whose certificate comes from a private CA. The server's certificate must
    /// still name the URL's host (a DNS name or an IP address in its subject alternative
    /// names).
    ///
    /// Defaults to the system's trust store. Needs a `rediss://` URL and the `tls` feature
    /// (on by default); [`open`](Builder::open) fails with a
    /// [`Config`](crate::ErrorKind::Config) error when `pem` holds no certificate or one
    /// that cannot be parsed, or when the URL is not `rediss://`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redmutex::Client::builder()
    ///     .tls_ca_certificates(std::fs::read("/etc/redis/tls/ca.crt")?)
    ///     .open("rediss://redis.internal:6380/")?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_ca_certificates(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.wiring.tls.ca_certificates = Some(pem.into());
        self
    }

    /// Presents a client certificate to `rediss://` servers that ask for one (mutual TLS,
    /// `tls-auth-clients yes`): `chain_pem` holds the certificate followed by any
    /// intermediates, `key_pem` its private key (PKCS#8, PKCS#1 or SEC1 PEM). The key is
    /// never shown in `Debug` output or errors.
    ///
    /// Defaults to none. Needs a `rediss://` URL and the `tls` feature (on by default);
    /// [`open`](Builder::open) fails with a [`Config`](crate::ErrorKind::Config) error when
    /// the chain or the key cannot be parsed, when the key does not belong to the
    /// certificate, or when the URL is not `rediss://`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let client = redmutex::Client::builder()
    ///     .tls_ca_certificates(std::fs::read("/etc/redis/tls/ca.crt")?)
    ///     .tls_client_certificate(
    ///         std::fs::read("/etc/myapp/redis-client.crt")?,
    ///         std::fs::read("/etc/myapp/redis-client.key")?,
    ///     )
    ///     .open("rediss://redis.internal:6380/")?;
    /// # Ok(()) }
    /// ```
    #[cfg(feature = "tls")]
    pub fn tls_client_certificate(
        mut self,
        chain_pem: impl Into<Vec<u8>>,
        key_pem: impl Into<Vec<u8>>,
    ) -> Self {
        self.wiring.tls.client_certificate = Some(ClientCertificate {
            chain: chain_pem.into(),
            key: key_pem.into(),
        });
        self
    }

    /// Checks every setting, in named steps, and makes the client's settings of them.
    fn validate(&self) -> Result<Config> {
        let pool = self.pool()?;
        self.timeouts()?;
        let renewal_interval = self.lease_and_renewal()?;
        keys::validate_prefix(&self.key_prefix)?;
        self.backoff_steps()?;
        let replica_acks = self.acks(renewal_interval)?;
        self.wiring.validate()?;
        Ok(Config {
            pool,
            connect_timeout: self.connect_timeout,
            response_timeout: self.response_timeout,
            default_lease: self.default_lease,
            renewal_interval,
            key_prefix: self.key_prefix.clone(),
            backoff_base: self.backoff_base,
            backoff_cap: self.backoff_cap,
            outage_patience: self.outage_patience,
            replica_acks,
            client_name: self
                .client_name
                .clone()
                .unwrap_or_else(identity::program_name),
            events: self.all_events(),
        })
    }

    /// The pool's size and lifetimes.
    fn pool(&self) -> Result<PoolSettings> {
        if self.pool_size == 0 {
            return Err(Error::config("the pool size must be at least 1"));
        }
        if self.idle_timeout.is_some_and(|t| t.is_zero()) {
            return Err(Error::config(
                "the idle timeout must not be zero (None: no limit)",
            ));
        }
        if self.max_lifetime.is_some_and(|t| t.is_zero()) {
            return Err(Error::config(
                "the max lifetime must not be zero (None: no limit)",
            ));
        }
        Ok(PoolSettings {
            size: self.pool_size,
            idle_timeout: self.idle_timeout,
            max_lifetime: self.max_lifetime,
        })
    }

    fn timeouts(&self) -> Result<()> {
        if self.connect_timeout.is_zero() {
            return Err(Error::config("the connect timeout must not be zero"));
        }
        if self.response_timeout.is_zero() {
            return Err(Error::config("the response timeout must not be zero"));
        }
        Ok(())
    }

    /// The default lease, and the renewal interval (a third of it unless set).
    fn lease_and_renewal(&self) -> Result<Duration> {
        if let Some(problem) = lease_problem(self.default_lease) {
            return Err(Error::config(format!("the default lease {problem}")));
        }
        let renewal_interval = self.renewal_interval.unwrap_or(self.default_lease / 3);
        if renewal_interval.is_zero() {
            return Err(Error::config("the renewal interval must not be zero"));
        }
        if renewal_interval >= self.default_lease {
            return Err(Error::config(format!(
                "the renewal interval ({}) must be below the default lease ({})",
                Human(renewal_interval),
                Human(self.default_lease)
            )));
        }
        Ok(renewal_interval)
    }

    fn backoff_steps(&self) -> Result<()> {
        if self.backoff_base.is_zero() {
            return Err(Error::config("the backoff base must not be zero"));
        }
        if self.backoff_cap < self.backoff_base {
            return Err(Error::config(
                "the backoff cap must not be below the backoff base",
            ));
        }
        Ok(())
    }

    /// The replica acknowledgements asked for, or the default's (see `replica_acks`).
    fn acks(&self, renewal_interval: Duration) -> Result<Option<ReplicaAcks>> {
        Ok(match self.replica_acks {
            AckSetting::Ask(replicas, timeout) => {
                if replicas == 0 || timeout < Duration::from_millis(1) {
                    return Err(Error::config(
                        "replica acknowledgements need at least 1 replica and a timeout of 1 ms \
                         or more",
                    ));
                }
                if timeout >= self.response_timeout {
                    return Err(Error::config(
                        "the replica acknowledgement timeout must be below the response timeout",
                    ));
                }
                Some(ReplicaAcks {
                    replicas,
                    timeout,
                    chosen: true,
                })
            }
            AckSetting::Default => Some(ReplicaAcks {
                replicas: 1,
                timeout: DEFAULT_ACK_TIMEOUT
                    .min(self.response_timeout / 2)
                    .min(renewal_interval / 2)
                    .max(Duration::from_millis(1)),
                chosen: false,
            }),
            AckSetting::Off => None,
        })
    }

    /// The credentials the sentinels of a `redis+sentinel://` deployment are asked with, when
    /// they differ from those of the data nodes (which the URL gives).
    ///
    /// Defaults to the data nodes' credentials. `None` for either sends none.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::builder()
    ///     .sentinel_auth(None, Some("sentinel-secret"))
    ///     .open("redis+sentinel://:data-secret@10.0.0.1:26379,10.0.0.2:26379/mymaster")?;
    /// # Ok(()) }
    /// ```
    pub fn sentinel_auth(mut self, username: Option<&str>, password: Option<&str>) -> Self {
        self.wiring.sentinel_auth =
            Some((username.map(str::to_owned), password.map(str::to_owned)));
        self
    }

    /// Checks the settings and makes a client for the Sentinel deployment that monitors
    /// `master_name`, through the sentinels at `sentinels` (each `host:port`, or a
    /// `redis://[user:password@]host:port` / `rediss://…` URL). Connects to nothing.
    ///
    /// The credentials of the sentinel URLs are used for the sentinels and for the data
    /// nodes ([`sentinel_auth`](Builder::sentinel_auth) gives the sentinels others); a
    /// `rediss://` sentinel URL means TLS to the sentinels and the data nodes. The same as
    /// [`open`](Builder::open) with a `redis+sentinel://` URL.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) when a setting is out of range, no
    /// sentinel is given, the master name is empty, or a sentinel address cannot be parsed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// use std::time::Duration;
    ///
    /// let client = redmutex::Client::builder()
    ///     .default_lease(Duration::from_secs(30))
    ///     .sentinel("mymaster", ["10.0.0.1:26379", "10.0.0.2:26379", "10.0.0.3:26379"])?;
    /// let _g = client.mutex("orders:42").lock()?;
    /// # Ok(()) }
    /// ```
    pub fn sentinel<I>(self, master_name: &str, sentinels: I) -> Result<Client>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let (hosts, tls, redis) = tcp_nodes(sentinels, "sentinel")?;
        if master_name.is_empty() {
            return Err(Error::config("the sentinel master name is empty"));
        }
        let address = SentinelAddress {
            master_name: master_name.to_owned(),
            sentinels: hosts,
            tls,
            redis,
        };
        self.open(Address {
            kind: AddressKind::Sentinel(address),
        })
    }

    /// Checks the settings and makes a client for the Redis Cluster that `seeds` belong to
    /// (each `host:port`, or a `redis://[user:password@]host:port` / `rediss://…` URL; a few
    /// are enough, the rest is read from the cluster). Connects to nothing.
    ///
    /// The credentials of the first seed URL are used for every node; a `rediss://` seed
    /// means TLS to every node. The same as [`open`](Builder::open) with a
    /// `redis+cluster://` URL.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) when a setting is out of range, no
    /// seed is given, or a seed cannot be parsed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::builder().cluster(["10.0.0.1:7000", "10.0.0.2:7000"])?;
    /// let _g = client.mutex("orders:42").lock()?;
    /// # Ok(()) }
    /// ```
    pub fn cluster<I>(self, seeds: I) -> Result<Client>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let (seeds, tls, redis) = tcp_nodes(seeds, "cluster seed")?;
        self.open(Address {
            kind: AddressKind::Cluster(ClusterAddress { seeds, tls, redis }),
        })
    }

    /// Checks the settings and makes the client for the Redis at `url` (`redis://…`, or
    /// `rediss://…` for TLS; `redis+sentinel://…` for a Sentinel deployment; see
    /// [`Client::open`] and [`Address::parse`](crate::Address::parse)). Connects to nothing.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) when a setting is out of range, the
    /// URL cannot be parsed, or TLS settings are given for a URL that is not `rediss://`.
    pub fn open<T: IntoAddress>(self, url: T) -> Result<Client> {
        let mut config = self.validate()?;
        let kind = url.into_address()?.kind;
        if matches!(kind, AddressKind::Server(_)) && !config.replica_acks.is_some_and(|a| a.chosen)
        {
            // Nobody promotes one server's replicas: the default asks none.
            config.replica_acks = None;
        }
        let reach = Reach {
            connect_timeout: config.connect_timeout,
            response_timeout: config.response_timeout,
            pool: config.pool,
        };
        let connections = self.wiring.connections(reach, kind)?;
        Ok(Client::new(config, connections))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(b: Builder) -> Result<Config> {
        b.validate()
    }

    #[test]
    fn defaults_are_valid() {
        let c = check(Builder::new()).unwrap();
        assert_eq!(c.default_lease, Duration::from_secs(30));
        assert_eq!(c.renewal_interval, Duration::from_secs(10));
        assert_eq!(c.key_prefix, "redmutex");
    }

    #[test]
    fn out_of_range_settings_are_config_errors() {
        let cases = [
            Builder::new().pool_size(0),
            Builder::new().idle_timeout(Some(Duration::ZERO)),
            Builder::new().max_lifetime(Some(Duration::ZERO)),
            Builder::new().connect_timeout(Duration::ZERO),
            Builder::new().response_timeout(Duration::ZERO),
            Builder::new().default_lease(Duration::ZERO),
            Builder::new().default_lease(Duration::from_micros(10)),
            Builder::new().default_lease(crate::MAX_LEASE + Duration::from_secs(1)),
            Builder::new().renewal_interval(Duration::ZERO),
            Builder::new().renewal_interval(Duration::from_secs(30)),
            Builder::new().key_prefix(""),
            Builder::new().key_prefix("a{b}"),
            Builder::new().backoff(Duration::ZERO, Duration::from_secs(1)),
            Builder::new().backoff(Duration::from_secs(2), Duration::from_secs(1)),
            Builder::new().replica_acks(0, Duration::from_secs(1)),
            Builder::new().replica_acks(1, Duration::ZERO),
            Builder::new().replica_acks(1, Duration::from_secs(3)),
        ];
        for b in cases {
            let dbg = format!("{b:?}");
            let err = check(b).expect_err(&dbg);
            assert!(err.is_config(), "{dbg}: {err}");
        }
    }

    #[test]
    fn a_bad_lease_is_told_in_one_sentence_with_human_durations() {
        let told = |b: Builder| check(b).unwrap_err().to_string();
        assert_eq!(
            told(Builder::new().default_lease(Duration::ZERO)),
            "invalid configuration: the default lease must be at least 1 ms, got 0 s"
        );
        assert_eq!(
            told(Builder::new().default_lease(Duration::from_secs(2 * 31_536_000))),
            "invalid configuration: the default lease must be at most 1 year, got 2 years"
        );
        assert_eq!(
            told(Builder::new().renewal_interval(Duration::from_secs(45))),
            "invalid configuration: the renewal interval (45 s) must be below the default \
             lease (30 s)"
        );
    }

    #[test]
    fn bad_url_is_a_config_error_and_opening_connects_nothing() {
        assert!(Client::open("not a url").unwrap_err().is_config());
        // Nothing listens on port 1; opening still succeeds because it does not connect.
        assert!(Client::open("redis://127.0.0.1:1/").is_ok());
    }

    #[test]
    fn rediss_urls_open_with_the_tls_feature_and_are_config_errors_without() {
        let opened = Client::open("rediss://127.0.0.1:6380/");
        if cfg!(feature = "tls") {
            assert!(opened.is_ok());
        } else {
            assert!(opened.unwrap_err().is_config());
        }
    }

    #[test]
    fn debug_output_hides_the_password() {
        let client = Client::open("redis://user:s3cret-pw@127.0.0.1:6390/").unwrap();
        let dbg = format!("{client:?}");
        assert!(!dbg.contains("s3cret-pw"), "{dbg}");
        assert!(dbg.contains("127.0.0.1"), "{dbg}");
    }
}
