//! `Mutex`: the handle to one named lock, and its protocol: a key that holds the holder's
//! token, and releases announced on the lock's channel to whoever waits.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::Script;

use crate::connection::{millis, ScriptCall};
use crate::keys::LockKeys;
use crate::lease::scripts::{compose, release_announced, with_fence, ANNOUNCE, ERRORS, FENCE};
use crate::lease::{AcquireCall, Kind, LockContext, PlainTake, Protocol, RawLock};
use crate::primitives::lock::{Lock, Plain};

mod hand_off;

/// A lock that excludes every thread of every process using the same Redis and name.
///
/// Get one with [`Client::mutex`](crate::Client::mutex). The handle is cheap, `Clone`,
/// `Send` and `Sync`; it holds nothing in Redis by itself. Locking returns a
/// [`MutexGuard`](crate::MutexGuard), which releases the lock when dropped.
///
/// # Leases
///
/// A lock lives in Redis with a lease (a PX expiry), so that a holder that dies cannot keep
/// it forever. By default the lease is the client's
/// [default lease](crate::Builder::default_lease) (30 s) and the client's renewal thread
/// renews it while the guard lives: hold it as long as you need.
/// [`with_lease`](Mutex::with_lease) gives a handle a renewed lease of its own (a short one,
/// for a lock that must be taken over soon after its holder dies).
/// [`with_fixed_lease`](Mutex::with_fixed_lease) takes the lock for a fixed lease instead,
/// without renewal: after that the lock is free for others whether or not the guard still
/// exists, and [`MutexGuard::is_lost`](crate::MutexGuard::is_lost) says so.
///
/// # Re-entry
///
/// A thread that holds the lock through this client and locks it again (through any handle
/// of the same name from the same client) gets a new guard at once, without a round trip;
/// only the outermost guard's release frees the lock in Redis. Another thread of the same
/// process is excluded like any other process. Guards are not `Send`.
///
/// # Waiting
///
/// A thread that finds the lock held does not poll Redis. Of the threads of one client that
/// wait for the same lock, one contends in Redis while the others wait in the process. It
/// listens on the lock's release channel through the client's one subscriber connection,
/// and a release announces itself there when someone waits, so the waiter tries again
/// within a few round trips of the release. It also re-checks now and then (once per
/// [renewal interval](crate::Builder::renewal_interval), or the backoff cap if longer) and at
/// the lock's expiry, in case an announcement went astray.
/// When announcements are unavailable (the subscriber connection is down), waiters back off
/// exponentially with full jitter instead. No wait goes past the caller's deadline.
///
/// # Fairness
///
/// Bounded, for throughput. A release passes the lock straight to another waiting thread of
/// the same client when there is one (no release in Redis; the new holder gets a new, larger
/// fencing token), for at most 16 passes or 2 ms in a row while other clients wait; then it
/// releases in Redis, handing the lock to the client that has waited longest (its leading
/// waiter holds it without another round trip, and no other client takes it first), and this
/// client's threads wait behind it. Over a [`Redlock`](crate::Redlock) a release names that
/// client without handing it the lock: a thread that releases and locks again at once may
/// win the free lock before the named client's attempt (barging, which keeps the lock busy),
/// but a client that has waited 10 ms loses at most one such race. Use
/// [`FairMutex`](crate::FairMutex) for first-come, first-served.
///
/// # Poisoning
///
/// When a thread panics while holding the lock, its guard releases the lock at once (waiters
/// need not wait out the lease) and leaves a record of who panicked and when, which the next
/// holder, in any process, reads with [`MutexGuard::poison`](crate::MutexGuard::poison) and clears with
/// [`MutexGuard::clear_poison`](crate::MutexGuard::clear_poison). Unlike `std::sync::Mutex`, `lock()` does not fail on a
/// poisoned lock: code that does not care keeps working with `lock()?`.
///
/// # Differences from `std::sync::Mutex`
///
/// - It protects no data in memory: it guards a resource outside the process (a row, a file,
///   a job), so the guard has no `Deref`.
/// - Every operation can fail (Redis down, slow, a key of the wrong type): they return
///   [`Result`](crate::Result).
/// - The lock can be lost while held (the lease ran out, someone force-unlocked it). Check
///   [`MutexGuard::is_lost`](crate::MutexGuard::is_lost) in long work, and pass [`MutexGuard::fencing_token`](crate::MutexGuard::fencing_token) to the
///   resource so that it can refuse a stale holder.
/// - Locking again on the same thread does not deadlock; it re-enters.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> redmutex::Result<()> {
/// use std::time::Duration;
///
/// let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let stock = client.mutex("stock:sku-42");
/// {
///     let guard = stock.lock()?;
///     // ... read, change and write the stock, tagging the write with
///     // guard.fencing_token() ...
/// } // released here
///
/// match stock.try_lock_for(Duration::from_millis(500))? {
///     Some(_guard) => println!("got it"),
///     None => println!("busy, try later"),
/// }
/// # Ok(()) }
/// ```
pub type Mutex = Lock<Plain>;

impl Lock<Plain> {
    pub(crate) fn new(ctx: Arc<LockContext>, name: &str) -> Self {
        Lock::of(RawLock::new(ctx, &PROTOCOL, name).with_hand_off(&PROTOCOL))
    }

    /// This handle, keeping the lock at its name itself — the key `orders:42` rather than
    /// `redmutex:{orders:42}` — so that other lock clients that use that key exclude it and
    /// are excluded by it: redis-py's `Lock`, node-redlock on one server, a hand-written
    /// `SET key token NX PX` with a compare-and-delete release. The value is the holder's
    /// token, as theirs is.
    ///
    /// What the other side lacks: it takes no fencing token (the counter still grows with
    /// every redmutex acquisition), and it does not announce its releases, so redmutex
    /// waiters notice a foreign release by re-checking, within one renewal interval (the
    /// backoff cap, if longer) or at the foreign lock's expiry, whichever comes first. Waiters
    /// of the other side notice redmutex's releases by their own polling.
    ///
    /// The rest of the lock (fencing counter, waiting clients, channel) stays at
    /// `redmutex:{name}…`, in the same Cluster slot as the bare key; a name with a brace is
    /// refused (`InvalidArgument`) since its slot would differ.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// // Excludes, and is excluded by, redis-py's `r.lock("nightly-export")`.
    /// let export = client.mutex("nightly-export").with_bare_key();
    /// let _guard = export.lock()?;
    /// # Ok(()) }
    /// ```
    pub fn with_bare_key(self) -> Self {
        Lock::of(self.into_raw().with_bare_key())
    }
}

/// The plain lock's protocol.
struct MutexProtocol;

static PROTOCOL: MutexProtocol = MutexProtocol;

/// The protocol of a `Mutex`, for a kind built over a `Mutex`'s keys (a shared value).
#[cfg_attr(not(feature = "serde"), allow(dead_code))]
pub(crate) fn protocol() -> &'static dyn Protocol {
    &PROTOCOL
}

/// `register_waiter` and `name_next`: the clients waiting for a lock (needs `ANNOUNCE`).
const WAITERS: &str = include_str!("mutex/waiters.lua");

/// A script whose body may call `take_lock(lock, fence, waiting, token, lease, waits)` (see
/// `mutex/take.lua`), with the helpers it needs: for the scripts that take `Mutex` locks.
pub(crate) fn taking_locks(body: &str) -> Script {
    with_fence(&[ANNOUNCE, WAITERS, include_str!("mutex/take.lua"), body].concat())
}

/// A call of `script` with the keys (lock, fencing counter, waiting clients) and arguments
/// (token, lease, whether the caller and more threads of its client wait, whether it has
/// waited long, and whether it re-checks after a silent wait; the fencing token of a lock
/// handed to its client that it takes, or '') of a `Mutex`'s acquire, for
/// the scripts built with [`taking_locks`]; a script that needs more adds its keys after
/// these.
pub(crate) fn acquire_call(script: &'static Script, call: &AcquireCall<'_>) -> ScriptCall {
    let keys = call.keys;
    let script = ScriptCall::new(script)
        .key(&keys.lock)
        .key(&keys.fence)
        .key(&keys.waiting);
    // The list a pop behind the call waits on (`mutex/acquire.lua`).
    let script = match call.pop {
        Some((notes, _)) => script.key(notes),
        None => script,
    };
    let script = script
        .arg(call.token)
        .arg(call.lease_ms())
        .arg(
            match (
                call.queue,
                call.after,
                call.more,
                call.overdue,
                call.recheck,
            ) {
                (false, ..) => "",
                (true, true, ..) => "after",
                (true, false, false, false, false) => "wait",
                (true, false, true, false, false) => "more",
                (true, false, false, true, false) => "wait overdue",
                (true, false, true, true, false) => "more overdue",
                (true, false, false, false, true) => "wait recheck",
                (true, false, true, false, true) => "more recheck",
                (true, false, false, true, true) => "wait overdue recheck",
                (true, false, true, true, true) => "more overdue recheck",
            },
        )
        .arg(
            call.claim
                .map_or_else(String::new, |fence| fence.to_string()),
        );
    // How long that pop waits, when the attempt records it for a release to find
    // (`mutex/acquire.lua`).
    match call.pop {
        Some((_, waits)) if call.pop_recorded => script.arg(waits.as_millis().to_string()),
        _ => script,
    }
}

/// Takes the lock if it is free: see `mutex/acquire.lua`.
static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| taking_locks(include_str!("mutex/acquire.lua")));

/// Compare-and-delete, naming the next waiting client (and handing it the lock when asked):
/// see `mutex/release.lua`.
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    compose(&[
        include_str!("mutex/release.lua"),
        ERRORS,
        FENCE,
        ANNOUNCE,
        WAITERS,
        include_str!("mutex/release_to_named.lua"),
    ])
});

/// The release of a guard's own hold, which sets the client's place among the waiting right:
/// see `mutex/release_held.lua`.
static RELEASE_HELD: LazyLock<Script> = LazyLock::new(|| {
    compose(&[
        ERRORS,
        FENCE,
        ANNOUNCE,
        WAITERS,
        include_str!("mutex/release_held.lua"),
    ])
});

/// Deletes the lock whoever holds it: see `mutex/force_release.lua`.
static FORCE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| compose(&[ANNOUNCE, WAITERS, include_str!("mutex/force_release.lua")]));

/// A client's last waiter gave up: see `mutex/withdraw.lua`.
static WITHDRAW: LazyLock<Script> = LazyLock::new(|| {
    compose(&[
        ERRORS,
        FENCE,
        ANNOUNCE,
        WAITERS,
        include_str!("mutex/withdraw.lua"),
    ])
});

/// A release that names the next waiting client (a `Mutex`'s, a shared value's): `head`
/// releases, and returns when no client waits (KEYS[1]: the lock; KEYS[2]: the waiting
/// clients; ARGV[2]: the release channel); the helpers and the naming follow, made only by
/// a release that needs them (`mutex/release_to_waiting.lua`).
#[cfg(feature = "serde")]
pub(crate) fn then_name_next(head: &str) -> Script {
    compose(&[
        head,
        ANNOUNCE,
        WAITERS,
        include_str!("mutex/release_to_waiting.lua"),
    ])
}

impl Protocol for MutexProtocol {
    fn kind(&self) -> Kind {
        Kind::contending("Mutex")
    }

    fn acquire(&self, call: &AcquireCall<'_>) -> ScriptCall {
        acquire_call(&ACQUIRE, call)
    }

    /// A free lock is taken with `SET NX PX GET` and `INCR` of the fencing counter, unless
    /// the client stays among the waiting (other threads of it wait), which only the script
    /// does, or the lock is likely held (a release handed it to this client since its last
    /// acquire: the script places the client in the same round trip, where plain commands
    /// would cost a held lock a second one), or a pop waits behind the attempt.
    fn plain_take(&self, call: &AcquireCall<'_>) -> PlainTake {
        match call.more
            || call.after
            || call.claim.is_some()
            || call.likely_held
            || call.pop.is_some()
        {
            true => PlainTake::Never,
            false => PlainTake::WhenFree,
        }
    }

    fn release(&self, keys: &LockKeys, token: &str) -> ScriptCall {
        release_announced(&RELEASE, keys, token)
    }

    fn force_release(&self, keys: &LockKeys) -> ScriptCall {
        ScriptCall::new(&FORCE_RELEASE)
            .key(&keys.lock)
            .key(&keys.waiting)
            .arg(&*keys.channel)
    }

    /// The client's own channel: a release names the next client on that client's channel
    /// only (`mutex/waiters.lua`), so a hand-off wakes one client however many wait.
    fn wake_channel(&self, keys: &LockKeys, client_id: &str) -> Arc<str> {
        keys.waiter_channel(client_id)
    }

    /// A release names one waiting client (its id is the message), and only that client's
    /// leading waiter attempts.
    fn wake_filter(&self, client_id: &Arc<str>) -> Option<Arc<str>> {
        Some(Arc::clone(client_id))
    }

    /// Takes the client of `token` out of the lock's waiting clients, unless other threads of
    /// the client still wait: see `mutex/withdraw.lua`.
    /// With `hand_over`, a lock handed to the client is handed to the next waiting client.
    fn withdraw(
        &self,
        keys: &LockKeys,
        token: &str,
        others_wait: bool,
        hand_over: Option<Duration>,
    ) -> Option<ScriptCall> {
        (!others_wait).then(|| {
            let call = ScriptCall::new(&WITHDRAW)
                .key(&keys.lock)
                .key(&keys.waiting)
                .key(&keys.fence)
                .arg(token)
                .arg(&*keys.channel);
            match hand_over {
                Some(claim) => call.arg(millis(claim)),
                None => call,
            }
        })
    }
}

crate::lease::scripts::listed! {
    "mutex/acquire" => ACQUIRE, "mutex/release" => RELEASE,
    "mutex/force_release" => FORCE_RELEASE, "mutex/withdraw" => WITHDRAW,
    "mutex/pass_on" => hand_off::PASS_ON, "mutex/release_held" => RELEASE_HELD,
}
