//! `Semaphore`: a number of permits shared across processes, each held on a lease.
//!
//! Every holder's permits are one entry of a sorted set scored by when its lease ends, so a
//! holder that dies gives its permits back after its lease, and the count of permits lives
//! in Redis beside them. A semaphore's keys (`P:semaphore:{N}…`) stay apart from those of a
//! lock of the same name. Scripts are in `semaphore/`.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use redis::Script;

use crate::connection::millis;
use crate::connection::ScriptCall;
use crate::error::{Doing, Error, ErrorKind, Result};
use crate::keys::{self, suffix, LockKeys, SEMAPHORE_NAMESPACE};
use crate::lease::scripts::{compose, ANNOUNCE, ERRORS, HOLDER, MEMBER_CHECK, MEMBER_LEASE};
use crate::lease::{AcquireCall, Kind, LeaseGuard, LockContext, Protocol, RawLock};

/// The most permits a semaphore may have.
pub const MAX_PERMITS: u32 = 1_000_000;

mod fair;

/// The helpers the semaphore's scripts share: see `semaphore/permits.lua`.
const PERMITS: &str = include_str!("semaphore/permits.lua");

/// The helpers of a fair semaphore's queue: see `semaphore/fair_queue.lua`.
const FAIR_QUEUE: &str = include_str!("semaphore/fair_queue.lua");

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    compose(&[
        ERRORS,
        HOLDER,
        PERMITS,
        include_str!("semaphore/acquire.lua"),
    ])
});
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    compose(&[
        HOLDER,
        PERMITS,
        ANNOUNCE,
        include_str!("semaphore/release.lua"),
    ])
});
static RENEW: LazyLock<Script> = LazyLock::new(|| {
    compose(&[
        HOLDER,
        MEMBER_LEASE,
        PERMITS,
        include_str!("semaphore/renew.lua"),
    ])
});
static CHANGE_LEASE: LazyLock<Script> = LazyLock::new(|| {
    compose(&[
        HOLDER,
        MEMBER_LEASE,
        PERMITS,
        include_str!("semaphore/change_lease.lua"),
    ])
});
static COUNT: LazyLock<Script> = LazyLock::new(|| {
    compose(&[
        ERRORS,
        HOLDER,
        PERMITS,
        ANNOUNCE,
        FAIR_QUEUE,
        include_str!("semaphore/count.lua"),
    ])
});

crate::lease::scripts::listed! {
    "semaphore/acquire" => ACQUIRE, "semaphore/release" => RELEASE, "semaphore/renew" => RENEW,
    "semaphore/change_lease" => CHANGE_LEASE, "semaphore/count" => COUNT,
    also fair::scripts(),
}

fn permits_key(keys: &LockKeys) -> String {
    keys.beside(suffix::PERMITS)
}

fn holders(keys: &LockKeys) -> String {
    keys.beside(suffix::HOLDERS)
}

fn held(keys: &LockKeys) -> String {
    keys.beside(suffix::HELD)
}

/// A fair semaphore's waiters: how many permits each asks for.
fn wants(keys: &LockKeys) -> String {
    keys.beside(suffix::WANTS)
}

/// `call` with a fair semaphore's queue keys added: the queue, the waiters' timeouts and the
/// permits each wants.
fn with_queue_keys(call: ScriptCall, keys: &LockKeys) -> ScriptCall {
    call.key(keys.queue()).key(keys.timeouts()).key(wants(keys))
}

/// Permits of a semaphore.
struct SemaphoreProtocol;

static PROTOCOL: SemaphoreProtocol = SemaphoreProtocol;

fn release_call(keys: &LockKeys, token: &str, force: bool) -> ScriptCall {
    ScriptCall::new(&RELEASE)
        .key(holders(keys))
        .key(held(keys))
        .key(&keys.waiting)
        .arg(token)
        .arg(&*keys.channel)
        .arg(if force { "force" } else { "release" })
}

impl Protocol for SemaphoreProtocol {
    fn kind(&self) -> Kind {
        Kind::contending("Semaphore")
    }

    fn acquire(&self, call: &AcquireCall<'_>) -> ScriptCall {
        let keys = call.keys;
        ScriptCall::new(&ACQUIRE)
            .key(permits_key(keys))
            .key(holders(keys))
            .key(held(keys))
            .key(&keys.waiting)
            .arg(call.token)
            .arg(call.lease_ms())
            .arg(call.units)
            .arg(call.capacity)
    }

    fn release(&self, keys: &LockKeys, token: &str) -> ScriptCall {
        release_call(keys, token, false)
    }

    fn force_release(&self, keys: &LockKeys) -> ScriptCall {
        release_call(keys, "", true)
    }

    fn wake_channel(&self, keys: &LockKeys, _client_id: &str) -> Arc<str> {
        Arc::clone(&keys.channel)
    }

    fn reentrant(&self) -> bool {
        false
    }

    fn namespace(&self) -> Option<&'static str> {
        Some(SEMAPHORE_NAMESPACE)
    }

    fn renew(&self, keys: &LockKeys, token: &str, lease: Duration) -> ScriptCall {
        ScriptCall::new(&RENEW)
            .key(holders(keys))
            .key(held(keys))
            .arg(token)
            .arg(millis(lease))
    }

    fn check(&self, keys: &LockKeys, token: &str) -> ScriptCall {
        ScriptCall::new(&MEMBER_CHECK).key(holders(keys)).arg(token)
    }

    fn change_lease(&self, keys: &LockKeys, token: &str, by: Duration, how: &str) -> ScriptCall {
        ScriptCall::new(&CHANGE_LEASE)
            .key(holders(keys))
            .key(held(keys))
            .arg(token)
            .arg(millis(by))
            .arg(how)
    }
}

/// A counting semaphore across processes: at most `permits` permits are held at once, by any
/// threads of any processes.
///
/// Every holder's permits have a lease, renewed by its client while the permit guard lives:
/// a holder that dies gives its permits back after its lease. The count of permits lives in
/// Redis: the first user stores the count its handle was made with, and from then on every
/// handle follows the stored count (whatever it was made with) until
/// [`set_permits`](Semaphore::set_permits) changes it.
///
/// # Fairness
///
/// A semaphore from [`Client::semaphore`](crate::Client::semaphore) is not fair: of the
/// waiters, whichever tries first after a release gets the permits. Waiters listen for
/// releases (no polling); of the threads of one process that wait, one tries at a time, so a
/// release wakes one waiter per waiting process.
///
/// A semaphore from [`Client::fair_semaphore`](crate::Client::fair_semaphore) grants permits
/// in the order they were asked for, across all processes, as a
/// [`FairMutex`](crate::FairMutex) does:
///
/// - Every waiting thread has its place in a queue kept in Redis. A waiter takes its permits
///   when they are free beyond those the live waiters ahead of it ask for, so nobody
///   overtakes a waiter, not even one that asks for more permits than are free now.
/// - A release wakes, in order, exactly the waiters its permits let in (each on its client's
///   channel, by its token), and nobody else.
/// - [`try_acquire`](Semaphore::try_acquire) never queues, and takes nothing while others
///   wait for those permits; a timed acquire that times out leaves the queue at once.
/// - A waiter whose process died is skipped at most one
///   [default lease](crate::Builder::default_lease) after its last heartbeat.
///
/// Fair and unfair handles of one name share its permits, but an unfair one ignores the
/// queue: give every handle of a name the same fairness.
///
/// # Differences from a lock
///
/// Permits are not re-entrant: a thread that acquires twice holds two holds. A permit guard
/// has no fencing token.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> redmutex::Result<()> {
/// let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let downloads = client.semaphore("downloads", 4); // at most 4 at once, fleet-wide
/// let _permit = downloads.acquire()?;
/// // ... download ...
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Semaphore {
    /// The permits as a lock, one permit per hold (`take` asks for more).
    raw: RawLock,
    /// The semaphore's keys, or why its name is refused.
    keys: std::result::Result<Arc<LockKeys>, Error>,
    name: Arc<str>,
    permits: u32,
    fair: bool,
}

impl Semaphore {
    /// A handle to the semaphore `name`; `fair` grants its permits in the order asked for.
    pub(crate) fn new(ctx: Arc<LockContext>, name: &str, permits: u32, fair: bool) -> Self {
        let prefix = keys::semaphore_space(&ctx.config.key_prefix);
        let protocol: &'static dyn Protocol = match fair {
            true => &fair::PROTOCOL,
            false => &PROTOCOL,
        };
        Semaphore {
            keys: LockKeys::new(&prefix, name).map(Arc::new),
            raw: RawLock::new(ctx, protocol, name).with_units(1, permits),
            name: Arc::from(name),
            permits,
            fair,
        }
    }

    /// Whether this handle grants permits in the order they were asked for.
    pub fn is_fair(&self) -> bool {
        self.fair
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    crate::primitives::acquire_family::acquire_family! {
        take_one() -> SemaphorePermit, "one permit";
        /// Blocks until one permit is held.
        ///
        /// # Errors
        ///
        /// [`ErrorKind::InvalidArgument`] for zero or more than [`MAX_PERMITS`] permits;
        /// otherwise as for [`Mutex::lock`](crate::Mutex::lock).
        fn acquire, try_acquire, try_acquire_for, try_acquire_until;
    }

    crate::primitives::acquire_family::acquire_family! {
        take(n: u32) -> SemaphorePermit, "`n` permits, all at once or none";
        /// Blocks until `n` permits are held, all at once or none.
        ///
        /// # Errors
        ///
        /// [`ErrorKind::InvalidArgument`] when `n` is zero or more than the permits that exist;
        /// otherwise as for [`acquire`](Semaphore::acquire).
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # fn main() -> redmutex::Result<()> {
        /// use std::time::Duration;
        ///
        /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
        /// let slots = client.semaphore("gpu-slots", 8);
        /// match slots.try_acquire_many_for(4, Duration::from_secs(2))? {
        ///     Some(permit) => println!("running on {} slots", permit.permits()),
        ///     None => println!("busy"),
        /// }
        /// # Ok(()) }
        /// ```
        fn acquire_many, try_acquire_many, try_acquire_many_for, try_acquire_many_until;
    }

    fn take_one(&self, deadline: Option<Instant>) -> Result<Option<SemaphorePermit>> {
        self.take(1, deadline)
    }

    /// How many permits are free now. One round trip. Over a Redlock, how many a holder
    /// could take on as many instances as a permit needs.
    ///
    /// # Errors
    ///
    /// Connection and timeout errors; [`ErrorKind::WrongType`] when a key of the semaphore
    /// holds something else.
    pub fn available(&self) -> Result<u32> {
        self.count("available", self.permits)
    }

    /// Changes how many permits exist, for every handle. Holders keep what they hold; when
    /// the count goes down, new acquires wait until enough holders gave theirs back.
    ///
    /// # Errors
    ///
    /// As for [`available`](Semaphore::available), and [`ErrorKind::InvalidArgument`] for
    /// zero or more than [`MAX_PERMITS`], and over a Redlock: there, how many instances a
    /// permit needs depends on the count, and every handle counts with the permits it was
    /// made with, so the count cannot change under them.
    pub fn set_permits(&self, permits: u32) -> Result<()> {
        if !self.raw.on_one_deployment() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "the permits of semaphore {:?} are fixed over a Redlock: how many \
                     instances a permit needs depends on them, in every handle",
                    self.name
                ),
            ));
        }
        self.count("set", permits).map(drop)
    }

    fn check(&self, permits: u32) -> Result<()> {
        if permits == 0 || permits > MAX_PERMITS {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("a semaphore has 1 to {MAX_PERMITS} permits, not {permits}"),
            ));
        }
        Ok(())
    }

    fn take(&self, n: u32, deadline: Option<Instant>) -> Result<Option<SemaphorePermit>> {
        self.check(self.permits)?;
        if n == 0 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "acquiring zero permits",
            ));
        }
        let raw = self.raw.clone().with_units(n, self.permits);
        Ok(raw
            .acquire(deadline)?
            .map(|inner| SemaphorePermit { inner, permits: n }))
    }

    fn count(&self, how: &str, permits: u32) -> Result<u32> {
        self.check(permits)?;
        let keys = self.keys.as_ref().map_err(Clone::clone)?;
        let call = ScriptCall::new(&COUNT)
            .key(permits_key(keys))
            .key(holders(keys))
            .key(held(keys));
        let call = with_queue_keys(call, keys)
            .arg(how)
            .arg(permits)
            .arg(&*keys.channel)
            .arg(keys.waiter_channel_prefix());
        let doing = Doing::lock("counting the permits of", &self.name);
        let raw = self.raw.clone().with_units(1, self.permits);
        Ok(u32::try_from(raw.count(&call, doing)?).unwrap_or(u32::MAX))
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.name)
            .field("permits", &self.permits)
            .field("fair", &self.fair)
            .finish_non_exhaustive()
    }
}

/// Permits of a [`Semaphore`]; given back when dropped.
#[must_use = "if unused the permits are given back at once"]
pub struct SemaphorePermit {
    inner: LeaseGuard,
    permits: u32,
}

impl SemaphorePermit {
    /// How many permits this guard holds.
    pub fn permits(&self) -> u32 {
        self.permits
    }
}

crate::primitives::guard_traits::lease_guard_methods!(
    SemaphorePermit,
    "these permits",
    "client.semaphore(\"exports\", 3).acquire()?"
);

impl fmt::Debug for SemaphorePermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SemaphorePermit")
            .field("name", &self.inner.name())
            .field("permits", &self.permits)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}
