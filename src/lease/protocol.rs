//! The primitive seam: what a kind of lock brings, and all it brings — its scripts, how its
//! waiters wait and are woken. Everything else (re-entry, guards, renewal, lost-lease signals,
//! waiting, clean-ups of unknown outcomes, poisoning, stats) is written once, in this layer
//! and the waiting layer, for every protocol.
//!
//! Every script call a protocol makes is checked against the holder's token and is safe to
//! run twice, and every key it names shares the hash tag of the lock's name (`LockKeys`), so
//! that the call runs on the one server that owns the lock.

use std::sync::Arc;
use std::time::Duration;

use crate::connection::millis;
use crate::connection::ScriptCall;
use crate::keys::LockKeys;
use crate::lease::scripts;

/// How the waiters of a lock wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WaitStyle {
    /// Of the threads of one client, one contends in Redis at a time; a release announces
    /// itself on the lock's channel to whoever listens (`waiting::contend`).
    Contend,
    /// Every waiting thread holds its own place in a queue in Redis, kept alive by the
    /// renewal thread's heartbeat, and a release wakes the next waiter by its token
    /// (`waiting::queue`).
    Queue,
}

/// What a kind of lock is called (in events, `Debug` output and messages), and how its
/// waiters wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Kind {
    pub(crate) name: &'static str,
    pub(crate) waits: WaitStyle,
}

impl Kind {
    /// A kind whose waiters contend (see [`WaitStyle::Contend`]).
    pub(crate) const fn contending(name: &'static str) -> Kind {
        Kind {
            name,
            waits: WaitStyle::Contend,
        }
    }

    /// A kind whose waiters queue (see [`WaitStyle::Queue`]).
    pub(crate) const fn queued(name: &'static str) -> Kind {
        Kind {
            name,
            waits: WaitStyle::Queue,
        }
    }
}

/// How long a lock that a release hands straight to the next queued waiter is held for that
/// waiter before the waiter renews it to its lease (its claim): a waiter that died before
/// its turn holds the others up this long at most. The waiter relies on the claim only while
/// at least half of it is surely ahead; later, it attempts instead.
pub(crate) const HAND_OFF_CLAIM: Duration = Duration::from_secs(1);

/// Whether an attempt may take a free lock with plain commands (see `lease::plain_take`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PlainTake {
    /// Only the acquire script takes the lock.
    Never,
    /// A lock whose key is free is taken.
    WhenFree,
    /// A lock whose key is free is taken unless waiters queue for it (`LockKeys::queue`): a
    /// fair lock's queue comes first.
    WhenFreeOfQueue,
}

/// One acquire attempt, as a protocol's acquire script takes it.
pub(crate) struct AcquireCall<'a> {
    pub(crate) keys: &'a LockKeys,
    /// The holder's token: one per acquire call, for all its attempts.
    pub(crate) token: &'a str,
    pub(crate) lease: Duration,
    /// The caller waits if the lock is not ours yet. Queue style: join the queue (or keep
    /// one's place); contend style: claim what the protocol lets a waiter claim (a
    /// read-write lock's writer keeps new readers out).
    pub(crate) queue: bool,
    /// Queue style: how long a waiter counts as alive after its last heartbeat.
    pub(crate) waiter_timeout: Duration,
    /// How many units the hold takes (a semaphore's permits); 1 for a lock.
    pub(crate) units: u32,
    /// How many units exist (a semaphore's permits); 1 for a lock.
    pub(crate) capacity: u32,
    /// Contend style: other threads of this client wait for the lock too (a lock taken keeps
    /// the client among the waiting, so that a release names it again).
    pub(crate) more: bool,
    /// Contend style: this client just gave the lock up to the other waiting clients (a run
    /// of passes within it reached its bound): a free lock is not taken while they wait; the
    /// client waits behind them.
    pub(crate) after: bool,
    /// Contend style: the attempt follows a long wait of this client's for the lock (a release
    /// may have named the client; if someone else took the lock meanwhile, the client is owed
    /// the next turn).
    pub(crate) overdue: bool,
    /// Contend style: the attempt is a re-check after a wait in which no announcement came
    /// (a failed one tells how many waiting clients are named before the caller's).
    pub(crate) recheck: bool,
    /// Contend style: the fencing token of a lock that a release handed to this client, which
    /// the attempt takes if the lock still holds it (the caller took the note of it).
    pub(crate) claim: Option<u64>,
    /// Contend style: a release handed this client the lock since its last acquire (the lock
    /// passes between clients): it is likely held by another one now.
    pub(crate) likely_held: bool,
    /// Contend style, where releases leave the client a note in a list (a `Mutex` on one
    /// deployment): that list, and how long a blocking pop behind the attempt waits on it
    /// in the same round trip for the note of a lock handed to the client. The script marks
    /// an attempt that leaves the client no place to be named from, so that the pop returns
    /// at once (`mutex/acquire.lua`).
    pub(crate) pop: Option<(&'a str, Duration)>,
    /// With `pop`: the attempt records the pop in Redis, and a release that names the client
    /// leaves the note to it, unannounced (`mutex/waiters.lua`). Only once a pop of the client
    /// brought a note: a pop that Redis refuses (an ACL without `+blpop`) would lose it.
    pub(crate) pop_recorded: bool,
}

impl AcquireCall<'_> {
    pub(crate) fn lease_ms(&self) -> u64 {
        millis(self.lease)
    }
}

/// A kind of lock, as the shared machinery sees it. Implementations are stateless `static`s.
pub(crate) trait Protocol: Send + Sync + 'static {
    /// What the kind is called, and how its waiters wait.
    fn kind(&self) -> Kind;

    /// One acquire attempt. Reply: `{1, fencing token}` when taken — also when the lock
    /// holds `call.token` already (the same attempt sent again after its reply was lost) —
    /// or `{0, milliseconds}` when not, the longest a waiter should wait before trying again.
    /// A key of the wrong type is a `WRONGTYPE` error, and changes nothing.
    fn acquire(&self, call: &AcquireCall<'_>) -> ScriptCall;

    /// Whether this attempt may first try to take the lock with plain commands, without a
    /// script (`lease::plain_take`), and what a free lock must also be free of: for a
    /// protocol whose acquire, on a free lock, only sets the lock key to the token for the
    /// lease and takes the next fencing token, and whose acquire script, run after, settles
    /// every other case. Defaults to [`PlainTake::Never`].
    fn plain_take(&self, _call: &AcquireCall<'_>) -> PlainTake {
        PlainTake::Never
    }

    /// For a protocol whose acquire replies with a value kept under the lock: the value's
    /// key, which a plain take reads after taking the lock, in the same round trip (its
    /// version is not read: only a quorum's acquire compares versions, and it takes no lock
    /// with plain commands). Defaults to none.
    fn plain_payload<'k>(&self, _keys: &'k LockKeys) -> Option<&'k str> {
        None
    }

    /// Releases the lock if it holds `token`, and wakes whom the release concerns.
    /// Reply: 1 when released, 0 when the lock did not hold the token.
    fn release(&self, keys: &LockKeys, token: &str) -> ScriptCall;

    /// Releases the lock whoever holds it, and wakes whom the release concerns.
    /// Reply: 1 when a lock was there, 0 when not.
    fn force_release(&self, keys: &LockKeys) -> ScriptCall;

    /// Removes all that an acquire with `token` may have left — its hold, its place in a
    /// queue — after its reply was lost or its waiter gave up. Reply: 1 when something was
    /// removed. Defaults to [`release`](Self::release).
    fn abandon(&self, keys: &LockKeys, token: &str) -> ScriptCall {
        self.release(keys, token)
    }

    /// The channel on which this client's waiters learn that they may try again.
    fn wake_channel(&self, keys: &LockKeys, client_id: &str) -> Arc<str>;

    /// Contend style: withdraws what the waits of `token` claimed, when the wait ended
    /// without the lock (its deadline passed); `others_wait`: other threads of this client
    /// still wait for the lock; `hand_over`: the claim of a lock handed to the client named
    /// next, if releases hand it over. Reply ignored. `None`: nothing to withdraw.
    fn withdraw(
        &self,
        _keys: &LockKeys,
        _token: &str,
        _others_wait: bool,
        _hand_over: Option<Duration>,
    ) -> Option<ScriptCall> {
        None
    }

    /// Contend style: the payload of the announcements that concern this client's waiters
    /// (`None`: every announcement on the wake channel does).
    fn wake_filter(&self, _client_id: &Arc<str>) -> Option<Arc<str>> {
        None
    }

    /// A word that sets this protocol's keys apart from a lock's of the same name
    /// (`P:<namespace>:{N}…` instead of `P:{N}…`), for a kind whose keys, waiters and
    /// announcements must not mix with a `Mutex`'s. `None`: the lock's own keys.
    fn namespace(&self) -> Option<&'static str> {
        None
    }

    /// Whether a thread that holds the lock takes it again at once, without a round trip (a
    /// lock), or takes another hold (a semaphore's permits).
    fn reentrant(&self) -> bool {
        true
    }

    /// Queue style: keeps the places of `tokens` (waiters of one client) alive for `ttl` (see
    /// `scripts::queue_heartbeat`). Reply: the tokens no longer queued. `None` for
    /// contending locks.
    fn heartbeat(&self, _: &LockKeys, _: &[&str], _ttl: Duration) -> Option<ScriptCall> {
        None
    }

    /// Renews the hold of `token` to at least `lease` (never lowers it, never re-creates it).
    /// Reply: 1 while the lock holds the token, else 0, never an error. Defaults to the
    /// shared `renew.lua`, for locks whose main key holds the holder's token.
    fn renew(&self, keys: &LockKeys, token: &str, lease: Duration) -> ScriptCall {
        ScriptCall::new(&scripts::RENEW)
            .key(&keys.lock)
            .arg(token)
            .arg(millis(lease))
    }

    /// The call that says how long the hold of `token` has left: its remaining lease in
    /// milliseconds, or -1 when the token no longer holds. Defaults to `check.lua`, for locks
    /// whose main key holds the holder's token.
    fn check(&self, keys: &LockKeys, token: &str) -> ScriptCall {
        ScriptCall::new(&scripts::CHECK).key(&keys.lock).arg(token)
    }

    /// The call that adds `by` to the remaining lease of `token`'s hold (`how`: `add`) or
    /// replaces it (`set`), if the token still holds: the remaining lease in milliseconds
    /// afterwards, or -1. Defaults to `change_lease.lua`, for locks whose main key holds the
    /// holder's token.
    fn change_lease(&self, keys: &LockKeys, token: &str, by: Duration, how: &str) -> ScriptCall {
        ScriptCall::new(&scripts::CHANGE_LEASE)
            .key(&keys.lock)
            .arg(token)
            .arg(millis(by))
            .arg(how)
    }
}
