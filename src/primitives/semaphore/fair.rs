//! The fair semaphore's protocol: the permits and holders of every semaphore, plus a queue of
//! waiters in Redis, kept in the server's clock; a release wakes, in arrival order, the
//! waiters whose permits it lets in, and nobody overtakes a waiter.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use redis::Script;

use super::{held, holders, permits_key, with_queue_keys, FAIR_QUEUE, PERMITS};
use crate::connection::millis;
use crate::connection::ScriptCall;
use crate::keys::LockKeys;
use crate::keys::SEMAPHORE_NAMESPACE as NAMESPACE;
use crate::lease::scripts::{compose, queue_heartbeat, ANNOUNCE, ERRORS, HOLDER};
use crate::lease::{AcquireCall, Kind, Protocol};

/// A script of the fair semaphore: the queue helpers and a body.
fn fair_script(body: &str) -> Script {
    compose(&[ERRORS, HOLDER, PERMITS, ANNOUNCE, FAIR_QUEUE, body])
}

static ACQUIRE: LazyLock<Script> = LazyLock::new(|| fair_script(include_str!("fair_acquire.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| fair_script(include_str!("fair_release.lua")));
static LEAVE: LazyLock<Script> = LazyLock::new(|| fair_script(include_str!("fair_leave.lua")));

crate::lease::scripts::listed! {
    "semaphore/fair_acquire" => ACQUIRE, "semaphore/fair_release" => RELEASE,
    "semaphore/fair_leave" => LEAVE,
}

/// Permits of a fair semaphore.
pub(super) struct FairSemaphoreProtocol;

pub(super) static PROTOCOL: FairSemaphoreProtocol = FairSemaphoreProtocol;

/// A call of one of the fair scripts, with the six keys they all take, in their order
/// (KEYS[1] permit count, KEYS[2] holders, KEYS[3] held permits, KEYS[4..6] the queue).
fn call(script: &'static Script, keys: &LockKeys) -> ScriptCall {
    let call = ScriptCall::new(script)
        .key(permits_key(keys))
        .key(holders(keys))
        .key(held(keys));
    with_queue_keys(call, keys)
}

fn release_call(keys: &LockKeys, token: &str, force: bool) -> ScriptCall {
    call(&RELEASE, keys)
        .arg(token)
        .arg(keys.waiter_channel_prefix())
        .arg(if force { "force" } else { "release" })
}

impl Protocol for FairSemaphoreProtocol {
    fn kind(&self) -> Kind {
        Kind::queued("Semaphore")
    }

    fn acquire(&self, acquire: &AcquireCall<'_>) -> ScriptCall {
        let keys = acquire.keys;
        call(&ACQUIRE, keys)
            .arg(acquire.token)
            .arg(acquire.lease_ms())
            .arg(acquire.units)
            .arg(acquire.capacity)
            .arg(millis(acquire.waiter_timeout))
            .arg(if acquire.queue { "wait" } else { "try" })
            .arg(keys.waiter_channel_prefix())
    }

    fn release(&self, keys: &LockKeys, token: &str) -> ScriptCall {
        release_call(keys, token, false)
    }

    fn force_release(&self, keys: &LockKeys) -> ScriptCall {
        release_call(keys, "", true)
    }

    fn abandon(&self, keys: &LockKeys, token: &str) -> ScriptCall {
        call(&LEAVE, keys)
            .arg(token)
            .arg(keys.waiter_channel_prefix())
    }

    fn wake_channel(&self, keys: &LockKeys, client_id: &str) -> Arc<str> {
        keys.waiter_channel(client_id)
    }

    fn reentrant(&self) -> bool {
        false
    }

    fn namespace(&self) -> Option<&'static str> {
        Some(NAMESPACE)
    }

    fn heartbeat(&self, keys: &LockKeys, tokens: &[&str], ttl: Duration) -> Option<ScriptCall> {
        Some(queue_heartbeat(keys, Some(super::wants(keys)), tokens, ttl))
    }

    fn renew(&self, keys: &LockKeys, token: &str, lease: Duration) -> ScriptCall {
        super::PROTOCOL.renew(keys, token, lease)
    }

    fn check(&self, keys: &LockKeys, token: &str) -> ScriptCall {
        super::PROTOCOL.check(keys, token)
    }

    fn change_lease(&self, keys: &LockKeys, token: &str, by: Duration, how: &str) -> ScriptCall {
        super::PROTOCOL.change_lease(keys, token, by, how)
    }
}
