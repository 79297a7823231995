//! The Lua scripts every lock shares, and the helpers the primitives' scripts are made of.
//!
//! Each script is a `.lua` file in `lua/` beside this file (a primitive's own scripts sit
//! beside that primitive), with its KEYS / ARGV / reply contract in its header comment. They
//! run by `EVALSHA` (one round trip); `redis::Script` loads one and retries when the server
//! answers `NOSCRIPT` (after a restart or `SCRIPT FLUSH`).

use std::sync::LazyLock;
use std::time::Duration;

use redis::Script;

use crate::connection::millis;
use crate::connection::ScriptCall;
use crate::keys::LockKeys;

/// `is_type_error(reply)`: whether an error of `redis.pcall` means a key of the wrong type.
pub(crate) const ERRORS: &str = include_str!("lua/errors.lua");

/// `next_fence(lock, counter)`: the next fencing token of a lock just taken (needs `ERRORS`).
pub(crate) const FENCE: &str = include_str!("lua/fence.lua");

/// `now_ms()` (the server's clock) and `holder_of(lock)` (a lock key's token, type-checked;
/// needs `ERRORS`).
pub(crate) const HOLDER: &str = include_str!("lua/holder.lua");

/// `renew_member(set, member, lease_ms, now)`: renews a hold that is a member of a sorted set
/// scored by its lease's end.
pub(crate) const MEMBER_LEASE: &str = include_str!("lua/member_lease.lua");

/// `announce(channel, message)`: publishes a release announcement, sharded on Redis 7 and
/// later.
pub(crate) const ANNOUNCE: &str = include_str!("lua/announce.lua");

/// A script made of its parts, in order: helpers before the code that calls them.
pub(crate) fn compose(parts: &[&str]) -> Script {
    Script::new(&parts.concat())
}

/// A script whose body may call `is_type_error` and `next_fence`.
pub(crate) fn with_fence(body: &str) -> Script {
    compose(&[ERRORS, FENCE, body])
}

/// Renews a lease to at least the lease given: see `lua/renew.lua`.
pub(crate) static RENEW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/renew.lua")));

/// Adds to or replaces a lease: see `lua/change_lease.lua`.
pub(crate) static CHANGE_LEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/change_lease.lua")));

/// Whether the lock still holds a token, and for how long: see `lua/check.lua`.
pub(crate) static CHECK: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/check.lua")));

/// Keeps the places of queued waiters alive, for every queue-style primitive: see
/// `lua/queue_heartbeat.lua`.
static QUEUE_HEARTBEAT: LazyLock<Script> =
    LazyLock::new(|| compose(&[ERRORS, HOLDER, include_str!("lua/queue_heartbeat.lua")]));

/// How long a hold that is a member of a sorted set has left: see `lua/member_check.lua`.
pub(crate) static MEMBER_CHECK: LazyLock<Script> =
    LazyLock::new(|| compose(&[HOLDER, MEMBER_LEASE, include_str!("lua/member_check.lua")]));

/// The heartbeat of a queue-style lock's waiters `tokens`: their places kept for `ttl`
/// (with `wants`, a fair semaphore's, their wanted permits too).
pub(crate) fn queue_heartbeat(
    keys: &LockKeys,
    wants: Option<String>,
    tokens: &[&str],
    ttl: Duration,
) -> ScriptCall {
    let call = ScriptCall::new(&QUEUE_HEARTBEAT)
        .key(keys.timeouts())
        .key(keys.queue());
    let call = match wants {
        Some(wants) => call.key(wants),
        None => call,
    };
    call.arg(millis(ttl)).arg(tokens)
}

/// A release by `script` of the lock key, if it holds `token`, that tells the waiting
/// clients on the lock's channel (KEYS: the lock, the waiting clients; ARGV: the token, the
/// channel): a `Mutex`'s, an `RwLock` writer's.
pub(crate) fn release_announced(script: &'static Script, keys: &LockKeys, t: &str) -> ScriptCall {
    ScriptCall::new(script)
        .key(&keys.lock)
        .key(&keys.waiting)
        .arg(t)
        .arg(&*keys.channel)
}

/// Leaves the record of a panicking holder: see `lua/mark_poisoned.lua`.
pub(crate) static MARK_POISONED: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("lua/mark_poisoned.lua")));

/// A module's scripts, by name, as `scripts()`, for the test that loads every script into
/// Redis; `also` chains the lists of its submodules.
macro_rules! listed {
    ($($name:literal => $script:expr,)* $(also $more:expr,)*) => {
        #[cfg(test)]
        pub(crate) fn scripts() -> Vec<(&'static str, &'static redis::Script)> {
            let listed: Vec<(&'static str, &'static redis::Script)> =
                vec![$(($name, &*$script)),*];
            listed.into_iter()$(.chain($more))*.collect()
        }
    };
}
pub(crate) use listed;

listed! {
    "renew" => RENEW, "change_lease" => CHANGE_LEASE, "check" => CHECK,
    "member_check" => MEMBER_CHECK, "mark_poisoned" => MARK_POISONED,
    "queue_heartbeat" => QUEUE_HEARTBEAT,
}
