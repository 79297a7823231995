//! What every lock and guard made from one client shares: the settings, the connections, the
//! background threads, the waiting machinery and the counters.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::connection::{Connections, ScriptCall};
use crate::error::{Doing, Error, ErrorKind, Result};
use crate::identity::Identity;
use crate::lease::at_shutdown::AtShutdown;
use crate::lease::cleanup::{CleanUpLater, Cleanup};
use crate::lease::lessor::Lessor;
use crate::lease::renewal::Renewal;
use crate::lease::replication::{self, LeaseWrite};
use crate::lease::single::{call_retried, Single};
use crate::stats::{Background, Counters, Stats};
use crate::token::TokenSource;
use crate::waiting::{Gates, Subscriber, Subscribers, WaitContext};

/// The shared state of one client, or of one Redlock: the `Client` handle is an `Arc` of it.
pub(crate) struct LockContext {
    /// Names the client in this process's per-thread hold maps.
    pub(crate) id: u64,
    pub(crate) config: Config,
    /// Where the holds live: the client's deployment, or a quorum of instances.
    pub(crate) lessor: Arc<dyn Lessor>,
    pub(crate) renewal: Renewal,
    pub(crate) subscriber: Subscribers,
    /// Of the contending threads of one lock, the one that attempts.
    pub(crate) gates: Gates,
    /// Of the queued threads of one lock, the one that re-checks.
    pub(crate) rechecks: Gates,
    pub(crate) tokens: TokenSource,
    pub(crate) counters: Arc<Counters>,
    /// What the shutdown does before it closes the client.
    pub(crate) at_shutdown: AtShutdown<LockContext>,
    /// Set when the client was shut down.
    closed: AtomicBool,
    /// Set when Redis refused a blocking pop (an ACL user without `+blpop`): waiters wait
    /// for announcements alone from then on (see `RawLock::pop_note`).
    pub(crate) pop_refused: AtomicBool,
    /// Set when a blocking pop of the client's brought a note: its first attempts then
    /// record the pop behind them, so that a release leaves the note to it (see
    /// `AcquireCall::pop_recorded`).
    pub(crate) pops_answered: AtomicBool,
    /// The handles alive now (see [`Handle`]).
    handles: AtomicUsize,
}

/// One hold on a client's background threads (renewal, subscriber, Sentinel watcher): every
/// `Client` clone and every lock handle made from one carries one; guards do not. When the
/// last is dropped the threads stop (drop = stop, as crossbeam's channels and r2d2's pools
/// do), so a guard leaked with `mem::forget`, or one that outlives every handle, is no longer
/// renewed and its lock expires with its lease. Handles are only made from handles, so the
/// count never rises again once it reached zero.
pub(crate) struct Handle {
    ctx: Arc<LockContext>,
}

impl Handle {
    pub(crate) fn new(ctx: &Arc<LockContext>) -> Self {
        ctx.handles.fetch_add(1, Ordering::AcqRel);
        Handle {
            ctx: Arc::clone(ctx),
        }
    }
}

impl Clone for Handle {
    fn clone(&self) -> Self {
        Handle::new(&self.ctx)
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        if self.ctx.handles.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.ctx.last_handle_dropped();
        }
    }
}

impl LockContext {
    /// The context of a client whose holds live on `connections`.
    pub(crate) fn single(
        id: u64,
        config: Config,
        connections: Arc<Connections>,
        tokens: TokenSource,
    ) -> Self {
        let wake_prefix = format!("{}:client:{}:wake", config.key_prefix, tokens.client_uuid());
        let identity = Identity::new(
            &config.key_prefix,
            tokens.client_uuid(),
            &config.client_name,
            config.default_lease,
        );
        let subscriber = Subscribers::own(Subscriber::new(Arc::clone(&connections), wake_prefix));
        let lessor = Single::new(
            connections,
            config.replica_acks,
            config.response_timeout,
            identity,
        );
        LockContext::new(id, config, Arc::new(lessor), subscriber, tokens)
    }

    /// The context of holds that live with `lessor`, whose waiters listen with `subscriber`.
    pub(crate) fn new(
        id: u64,
        config: Config,
        lessor: Arc<dyn Lessor>,
        subscriber: Subscribers,
        tokens: TokenSource,
    ) -> Self {
        let counters = Arc::new(Counters::new(config.events.clone()));
        LockContext {
            id,
            renewal: Renewal::new(
                Arc::clone(&lessor),
                config.renewal_interval,
                config.default_lease,
                Arc::clone(&counters),
            ),
            subscriber,
            config,
            lessor,
            gates: Gates::default(),
            rechecks: Gates::default(),
            tokens,
            counters,
            at_shutdown: AtShutdown::default(),
            closed: AtomicBool::new(false),
            pop_refused: AtomicBool::new(false),
            pops_answered: AtomicBool::new(false),
            handles: AtomicUsize::new(0),
        }
    }

    /// Stops the background threads once no handle is left: nobody can take a lock or wait
    /// any more, and the guards still alive release as usual but are no longer renewed.
    fn last_handle_dropped(&self) {
        let held = self.renewal.registered();
        if held > 0 {
            log::warn!(
                "redmutex: the last handle of a client was dropped while it holds {held} locks: \
                 they are no longer renewed and expire with their leases"
            );
        }
        // Without waiting: a drop never blocks on a thread's read.
        self.renewal.shutdown(false);
        self.subscriber.shutdown(false);
        self.lessor.shutdown(false);
    }

    /// Closes the client: new operations fail, the background threads end for good.
    pub(crate) fn shut_down(&self) {
        // New acquires fail from here: a thread whose hold is given up below cannot take the
        // lock again before the client closes (a leader's `run_while_leader` campaigns again
        // as soon as it sees its leadership lost).
        self.closed.store(true, Ordering::Release);
        // Holds that give themselves up at shutdown do it now, while the connections and the
        // background threads still run.
        for work in self.at_shutdown.take_all() {
            work(self);
        }
        self.renewal.shutdown(true);
        self.subscriber.shutdown(true);
        self.lessor.shutdown(true);
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
    pub(crate) fn waiting(&self) -> WaitContext<'_> {
        WaitContext {
            config: &self.config,
            counters: &self.counters,
            subscriber: &self.subscriber,
            gates: &self.gates,
            rechecks: &self.rechecks,
        }
    }

    /// The single deployment's connections, for what is defined on one deployment only; an
    /// error over a quorum.
    pub(crate) fn one_deployment(&self, doing: Doing<'_>) -> Result<&Arc<Connections>> {
        self.lessor.one_deployment().ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidArgument,
                format!("{doing}: not offered over a Redlock's instances"),
            )
        })
    }

    /// Runs one call that is safe to repeat for the lock routed by `route`, once more on a
    /// fresh connection when the connection dropped under it (a Redis restart leaves every
    /// pooled connection dead). A call that timed out is not repeated: the caller gets the
    /// timeout at once. For what is defined on one deployment only (an optimistic read;
    /// a call sent once goes through [`one_deployment`](Self::one_deployment)).
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    pub(crate) fn call<T>(
        &self,
        route: &str,
        doing: Doing<'_>,
        f: impl Fn(&mut crate::connection::Conn) -> redis::RedisResult<T>,
    ) -> Result<T> {
        call_retried(self.one_deployment(doing)?, route, doing, f)
    }

    /// How many replicas a write of a lease on `c`'s server must reach, and how long it
    /// waits for them: see [`replication::replicas_to_ask`].
    pub(crate) fn replicas_to_ask(
        &self,
        write: LeaseWrite,
        c: &mut crate::connection::Conn,
    ) -> redis::RedisResult<Option<(u32, Duration)>> {
        replication::replicas_to_ask(self.config.replica_acks, write, c)
    }

    /// The part of a lease the client counts from the send of a write that set it.
    pub(crate) fn counted(&self, lease: Duration) -> Duration {
        replication::counted(self.config.replica_acks, lease)
    }

    /// Whether too few replicas acknowledged (`acks`: how many did, of how many had to).
    pub(crate) fn too_few_acks(&self, acks: (i64, u32)) -> bool {
        replication::too_few(acks)
    }

    /// The error of a write that too few replicas acknowledged, after the deployment was
    /// told to look at its replicas again: `what` says which write, and what became of it
    /// ("the acquire …; it was rolled back").
    pub(crate) fn not_replicated(&self, route: &str, acks: (i64, u32), what: &str) -> Error {
        if let Some(connections) = self.lessor.one_deployment() {
            connections.replicas_short(route);
        }
        replication::not_replicated(self.config.replica_acks, acks, what)
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
