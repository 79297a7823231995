//! `FairMutex`: a lock granted in the order it was asked for, across all processes; and its
//! protocol: a queue of waiters in Redis, kept in the server's clock, and releases that wake
//! the next waiter only.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::Script;

use crate::connection::millis;
use crate::connection::ScriptCall;
use crate::keys::LockKeys;
use crate::lease::scripts::{
    compose, queue_heartbeat, with_fence, ANNOUNCE, ERRORS, FENCE, HOLDER,
};
use crate::lease::{AcquireCall, Kind, LockContext, PlainTake, Protocol, RawLock, HAND_OFF_CLAIM};
use crate::primitives::lock::{Fair, Lock};

/// A lock granted in the order it was asked for (FIFO), across every thread of every process.
///
/// Get one with [`Client::fair_mutex`](crate::Client::fair_mutex). It has the API of
/// [`Mutex`](crate::Mutex) — blocking and timed acquires, guards that release on drop,
/// re-entry on the same thread, renewal, fencing tokens — and the same [`MutexGuard`](crate::MutexGuard).
///
/// # Fairness
///
/// A thread that finds the lock held joins a queue kept in Redis and gets the lock when every
/// waiter ahead of it has had it or has left. A release hands the lock straight to the next
/// waiter and tells only that waiter (on a channel of its client, with its own token in the
/// message), which then owns the lock without another attempt.
///
/// - [`try_lock`](FairMutex::try_lock) never queues: it takes the lock only when it is free
///   and nobody waits.
/// - A [`try_lock_for`](FairMutex::try_lock_for) that times out leaves the queue at once.
/// - Waiting costs Redis almost nothing: the client's renewal thread sends the heartbeats of
///   all its waiters of one lock in one call, and of those waiting threads only one re-checks
///   the lock now and then; the others wait for their own announcement.
/// - A waiter that died before its turn holds the others up briefly: the release hands it
///   the lock for a claim of one second, which the waiter turns into its lease when it
///   hears of it, and which otherwise runs out; the next waiter then takes the lock at its
///   next re-check.
/// - A waiter keeps its place alive with that heartbeat.
///   A waiter whose process died stops sending it and is skipped at most one
///   [default lease](crate::Builder::default_lease) after its last heartbeat (30 s by
///   default). The waiter deadlines are kept in the Redis server's clock, never computed
///   from a client's, so clocks that disagree cannot wedge the queue.
/// - When the last holder and waiter are gone, no key of the lock is left in Redis: the
///   fencing counter goes too, and starts again from the server's clock (in microseconds)
///   at the next acquire, so fencing tokens still increase as long as that clock does not
///   go back.
///
/// Do not use the same name as a `FairMutex` and as a [`Mutex`](crate::Mutex): both exclude
/// each other, but a plain `Mutex` ignores the queue.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> redmutex::Result<()> {
/// use std::time::Duration;
///
/// let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let printer = client.fair_mutex("printer");
/// let guard = printer.lock()?; // waits its turn behind earlier callers
/// println!("printing with fencing token {}", guard.fencing_token());
/// drop(guard); // the next waiter in line is woken
///
/// if let Some(_guard) = printer.try_lock_for(Duration::from_secs(1))? {
///     // ...
/// } // timed out: left the queue at once
/// # Ok(()) }
/// ```
pub type FairMutex = Lock<Fair>;

impl Lock<Fair> {
    pub(crate) fn new(ctx: Arc<LockContext>, name: &str) -> Self {
        Lock::of(RawLock::new(ctx, &PROTOCOL, name))
    }
}

/// The fair lock's protocol.
struct FairProtocol;

static PROTOCOL: FairProtocol = FairProtocol;

/// The queue helpers the fair scripts share: see `fair_mutex/queue.lua` (needs `IDLE_FENCE`,
/// `HOLDER` and `ANNOUNCE`).
const QUEUE: &str = include_str!("fair_mutex/queue.lua");

/// How long a fencing counter outlives its freed lock: see `fair_mutex/idle_fence.lua` (a
/// constant that `QUEUE` and the release's start use).
const IDLE_FENCE: &str = include_str!("fair_mutex/idle_fence.lua");

/// Takes the lock when it is our turn, else queues: see `fair_mutex/acquire.lua`.
static ACQUIRE: LazyLock<Script> = LazyLock::new(|| {
    with_fence(
        &[
            IDLE_FENCE,
            HOLDER,
            ANNOUNCE,
            QUEUE,
            include_str!("fair_mutex/acquire.lua"),
        ]
        .concat(),
    )
});

/// Releases (or forcibly releases) and hands the lock to the next waiter: see
/// `fair_mutex/release.lua`, which ends before the helpers when nobody queues.
static RELEASE: LazyLock<Script> = LazyLock::new(|| {
    compose(&[
        IDLE_FENCE,
        include_str!("fair_mutex/release.lua"),
        ERRORS,
        FENCE,
        HOLDER,
        ANNOUNCE,
        QUEUE,
        include_str!("fair_mutex/release_handing_on.lua"),
    ])
});

/// Leaves the queue and the lock for good: see `fair_mutex/leave.lua`.
static LEAVE: LazyLock<Script> = LazyLock::new(|| {
    with_fence(
        &[
            IDLE_FENCE,
            HOLDER,
            ANNOUNCE,
            QUEUE,
            include_str!("fair_mutex/leave.lua"),
        ]
        .concat(),
    )
});

impl FairProtocol {
    /// A call of one of the fair scripts, with the four keys they all take, in their order
    /// (KEYS[1] lock, KEYS[2] fencing counter, KEYS[3] queue, KEYS[4] timeouts).
    fn call(script: &'static Script, keys: &LockKeys) -> ScriptCall {
        ScriptCall::new(script)
            .key(&keys.lock)
            .key(&keys.fence)
            .key(keys.queue())
            .key(keys.timeouts())
    }

    fn release_call(keys: &LockKeys, token: &str, force: bool) -> ScriptCall {
        FairProtocol::call(&RELEASE, keys)
            .arg(token)
            .arg(keys.waiter_channel_prefix())
            .arg(if force { "force" } else { "release" })
            .arg(millis(HAND_OFF_CLAIM))
            .announcing()
    }
}

impl Protocol for FairProtocol {
    fn kind(&self) -> Kind {
        Kind::queued("FairMutex")
    }

    /// The first try of an acquire (which does not queue) takes a free lock with `SET NX PX
    /// GET` and `INCR`, and reads the queue's head in the same round trip: a lock taken while
    /// someone queues goes to the head at once (`lease::plain_take`).
    fn plain_take(&self, call: &AcquireCall<'_>) -> PlainTake {
        match call.queue {
            true => PlainTake::Never,
            false => PlainTake::WhenFreeOfQueue,
        }
    }

    fn acquire(&self, call: &AcquireCall<'_>) -> ScriptCall {
        let keys = call.keys;
        FairProtocol::call(&ACQUIRE, keys)
            .arg(call.token)
            .arg(call.lease_ms())
            .arg(millis(call.waiter_timeout))
            .arg(if call.queue { "wait" } else { "try" })
            .arg(keys.waiter_channel_prefix())
    }

    fn release(&self, keys: &LockKeys, token: &str) -> ScriptCall {
        FairProtocol::release_call(keys, token, false)
    }

    fn force_release(&self, keys: &LockKeys) -> ScriptCall {
        FairProtocol::release_call(keys, "", true)
    }

    fn abandon(&self, keys: &LockKeys, token: &str) -> ScriptCall {
        FairProtocol::call(&LEAVE, keys)
            .arg(token)
            .arg(keys.waiter_channel_prefix())
            .arg(millis(HAND_OFF_CLAIM))
    }

    fn wake_channel(&self, keys: &LockKeys, client_id: &str) -> Arc<str> {
        keys.waiter_channel(client_id)
    }

    fn heartbeat(&self, keys: &LockKeys, tokens: &[&str], ttl: Duration) -> Option<ScriptCall> {
        Some(queue_heartbeat(keys, None, tokens, ttl))
    }
}

crate::lease::scripts::listed! {
    "fair_mutex/acquire" => ACQUIRE, "fair_mutex/release" => RELEASE,
    "fair_mutex/leave" => LEAVE,
}
