//! What every lock and guard made from one client shares: the settings, the connections, the
//! background threads, the waiting machinery and the counters.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crate::config::Config;
use crate::connection::{Connections, ScriptCall};
use crate::error::{Doing, Error, ErrorKind, Result};
use crate::identity::Identity;
use crate::lease::cleanup::Cleanup;
use crate::lease::plain_take::SeededCounters;
use crate::lease::renewal::Renewal;
use crate::stats::{Background, Counters, Stats};
use crate::token::TokenSource;
use crate::waiting::{Gates, Subscriber, Waiting};

/// The shared state of one client; the `Client` handle is an `Arc` of it.
pub(crate) struct LockContext {
    /// Names the client in this process's per-thread hold maps.
    pub(crate) id: u64,
    pub(crate) config: Config,
    pub(crate) connections: Arc<Connections>,
    pub(crate) renewal: Renewal,
    pub(crate) subscriber: Subscriber,
    /// Of the contending threads of one lock, the one that attempts.
    pub(crate) gates: Gates,
    /// Of the queued threads of one lock, the one that re-checks.
    pub(crate) rechecks: Gates,
    pub(crate) tokens: TokenSource,
    pub(crate) counters: Arc<Counters>,
    /// The fencing counters this client saw started: the locks it may take plainly.
    pub(crate) seeded: SeededCounters,
    /// Set when the client was shut down.
    closed: AtomicBool,
}

impl LockContext {
    pub(crate) fn new(
        id: u64,
        config: Config,
        connections: Arc<Connections>,
        tokens: TokenSource,
    ) -> Self {
        let counters = Arc::new(Counters::new(config.events.clone()));
        let wake_prefix = format!("{}:client:{}:wake", config.key_prefix, tokens.client_uuid());
        let identity = Identity::new(
            &config.key_prefix,
            tokens.client_uuid(),
            &config.client_name,
            config.default_lease,
        );
        LockContext {
            id,
            renewal: Renewal::new(
                Arc::clone(&connections),
                config.renewal_interval,
                config.default_lease,
                Arc::clone(&counters),
                identity,
            ),
            subscriber: Subscriber::new(Arc::clone(&connections), wake_prefix),
            config,
            connections,
            gates: Gates::default(),
            rechecks: Gates::default(),
            tokens,
            counters,
            seeded: SeededCounters::new(),
            closed: AtomicBool::new(false),
        }
    }

    /// Closes the client: new operations fail, the background threads end for good.
    pub(crate) fn shut_down(&self) {
        self.closed.store(true, Ordering::Release);
        self.renewal.shutdown();
        self.subscriber.shutdown();
        self.connections.shutdown();
    }

    /// Has the renewal thread send `call` (a token-checked removal of what a call whose
    /// outcome is unknown may have left) until Redis answers or `give_up_at`.
    pub(crate) fn clean_up_later(
        &self,
        lock_key: &Arc<str>,
        name: &Arc<str>,
        call: ScriptCall,
        give_up_at: Instant,
    ) {
        self.renewal.clean_up_later(
            lock_key,
            Cleanup {
                name: Arc::clone(name),
                call,
                give_up_at,
            },
        );
    }

    /// Fails at once when the client was shut down.
    pub(crate) fn ensure_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::new(
                ErrorKind::Shutdown,
                "the client was shut down; make a new one to take locks again",
            ));
        }
        Ok(())
    }

    /// What the waiting loops use.
    pub(crate) fn waiting(&self) -> Waiting<'_> {
        Waiting {
            config: &self.config,
            counters: &self.counters,
            subscriber: &self.subscriber,
            gates: &self.gates,
            rechecks: &self.rechecks,
        }
    }

    /// Runs one call that is safe to repeat for the lock routed by `route`, once more on a
    /// fresh connection when the connection dropped under it (a Redis restart leaves every
    /// pooled connection dead). A call that timed out is not repeated: the caller gets the
    /// timeout at once.
    pub(crate) fn call<T>(
        &self,
        route: &str,
        doing: Doing<'_>,
        f: impl Fn(&mut crate::connection::Conn) -> redis::RedisResult<T>,
    ) -> Result<T> {
        match self.connections.call(route, doing, &f) {
            Err(e) if e.is_connection() && !e.is_checkout() => {
                self.connections.call(route, doing, &f)
            }
            other => other,
        }
    }

    /// Runs one call, once (a redirection by a Cluster aside: the call did not run then).
    #[inline]
    pub(crate) fn call_once<T>(
        &self,
        route: &str,
        doing: Doing<'_>,
        f: impl Fn(&mut crate::connection::Conn) -> redis::RedisResult<T>,
    ) -> Result<T> {
        self.connections.call(route, doing, f)
    }

    /// After an acquire on connection `c`: how many replicas acknowledged it, when the client
    /// asks for acknowledgements (`WAIT` must run on the connection that wrote).
    pub(crate) fn replica_acks(
        &self,
        c: &mut crate::connection::Conn,
    ) -> redis::RedisResult<Option<i64>> {
        match self.config.replica_acks {
            Some((replicas, timeout)) => {
                let timeout_ms = u64::try_from(timeout.as_millis()).unwrap_or(u64::MAX);
                redis::cmd("WAIT")
                    .arg(replicas)
                    .arg(timeout_ms)
                    .query::<i64>(c)
                    .map(Some)
            }
            None => Ok(None),
        }
    }

    /// Whether `acks` acknowledgements are too few for the client's setting.
    pub(crate) fn too_few_acks(&self, acks: i64) -> bool {
        self.config
            .replica_acks
            .is_some_and(|(n, _)| acks < i64::from(n))
    }

    /// The error of an acquire that too few replicas acknowledged (and that was rolled back).
    pub(crate) fn not_replicated(&self, acks: i64) -> Error {
        let wanted = self.config.replica_acks.map_or(0, |(n, _)| n);
        Error::new(
            ErrorKind::NotReplicated,
            format!(
                "{acks} of the {wanted} replicas asked for acknowledged the acquire in time; \
                 it was rolled back"
            ),
        )
    }

    /// Counters of what this client did so far.
    pub(crate) fn stats(&self) -> Stats {
        let (renewals, renewal_round_trips, renewal_time) = self.renewal.counters();
        let (notifications, subscriber_reconnects) = self.subscriber.counters();
        self.counters.snapshot(Background {
            renewals,
            renewal_round_trips,
            renewal_time,
            renewed_leases: self.renewal.registered() as u64,
            pending_cleanups: self.renewal.pending_cleanups() as u64,
            notifications,
            subscriber_reconnects,
        })
    }
}
