//! A `Mutex`'s lock cohorting: a release passes the lock to the leading waiter among the
//! client's own threads instead of releasing it in Redis, within the bounds of a run
//! ([`Cohort`]); the release that ends a run sets the client's place among the lock's
//! waiting clients right (`release_held.lua`).

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use redis::Script;

use super::MutexProtocol;
use crate::connection::{millis, ScriptCall};
use crate::error::{Doing, Result};
use crate::keys::LockKeys;
use crate::lease::scripts::{compose, ERRORS};
use crate::lease::{give_back, lost, HandOff, Hold, LeaseWrite, LockContext, LostReason};
use crate::waiting::{Cohort, Passed, COHORT_PASSES};

/// Passes a held lock to another thread of the client: see `mutex/pass_on.lua`.
pub(super) static PASS_ON: LazyLock<Script> =
    LazyLock::new(|| compose(&[ERRORS, include_str!("pass_on.lua")]));

/// How long a holder whose client's threads have been passing the lock among themselves waits
/// for the next of them to listen, before it releases the lock to other clients.
const SIBLING_GRACE: Duration = Duration::from_micros(50);

impl HandOff for MutexProtocol {
    /// Passes the lock to the leading waiter among this client's threads instead of
    /// releasing it, when the hold may (within its run's bounds: [`Cohort::may_pass`]) and a
    /// waiter listens. The lock keeps its token in Redis; the new holder gets the next
    /// fencing token of the run's reserved block and the lease as this hold counts it,
    /// without a round trip, when a token is left and both leases are renewed; else one round
    /// trip (`pass_on.lua`) checks the lock, holds it on for the new holder's lease and
    /// reserves the next block. The waiter is then woken and takes it.
    fn pass_on(&self, ctx: &Arc<LockContext>, hold: &Arc<Hold>) -> Option<Result<()>> {
        let cohort = hold.cohort.filter(Cohort::may_pass)?;
        let kind = hold.protocol.kind().name;
        let taker = match ctx.gates.passable(&hold.lock_key, kind) {
            Some(taker) => taker,
            // Threads that take turns come back for the lock within a few microseconds: give
            // the last holder a moment to start listening before the lock leaves the client.
            None if cohort.passing() => {
                let until = Instant::now() + SIBLING_GRACE;
                loop {
                    std::thread::yield_now();
                    if let Some(taker) = ctx.gates.passable(&hold.lock_key, kind) {
                        break taker;
                    }
                    if Instant::now() >= until {
                        return None;
                    }
                }
            }
            None => return None,
        };
        // A renewed lease goes on as it is when the new holder's is as long; a fixed one, or
        // one of another length, is set anew in Redis for the new holder.
        let renewed = !hold.fixed && !taker.fixed && hold.lease_length() == taker.lease;
        let without_round_trip = cohort
            .pass_from_block()
            .filter(|_| renewed && hold.lease.expires_at() > Instant::now());
        let (fencing_token, expires_at, cohort) = match without_round_trip {
            Some((fencing_token, cohort)) => (fencing_token, hold.lease.expires_at(), cohort),
            None => match pass_through_redis(ctx, hold, cohort, taker.lease)? {
                Ok(passed) => passed,
                Err(e) => return Some(Err(e)),
            },
        };
        let (weak, kept) = (Arc::downgrade(ctx), Arc::clone(hold));
        let passed = Passed::new(
            (Arc::clone(&hold.token), fencing_token),
            (expires_at, cohort),
            (
                taker,
                Box::new(move || {
                    if let Some(ctx) = weak.upgrade() {
                        give_back(&ctx, &kept);
                    }
                }),
            ),
        );
        // A waiter that left meanwhile: the lock passed to nobody is released in Redis.
        if let Err(unwanted) = ctx.gates.pass_on(&hold.lock_key, kind, passed) {
            drop(unwanted);
        }
        Some(Ok(()))
    }

    fn release(&self, keys: &LockKeys, token: &str, claim: Duration) -> ScriptCall {
        ScriptCall::new(&super::RELEASE)
            .key(&keys.lock)
            .key(&keys.waiting)
            .key(&keys.fence)
            .arg(token)
            .arg(&*keys.channel)
            .arg(millis(claim))
            .announcing()
    }

    fn release_held(
        &self,
        keys: &LockKeys,
        (token, fencing_token): (&str, u64),
        (others_wait, place_kept): (bool, Duration),
        claim: Duration,
    ) -> ScriptCall {
        ScriptCall::new(&super::RELEASE_HELD)
            .key(&keys.lock)
            .key(&keys.waiting)
            .key(&keys.fence)
            .arg(token)
            .arg(&*keys.channel)
            .arg(fencing_token)
            .arg(if others_wait { "more" } else { "" })
            .arg(millis(place_kept))
            .arg(millis(claim))
            .announcing()
    }
}

/// The pass that asks Redis: the new holder's fencing token, lease end and run; `None` when
/// the lock is to be released instead (the call failed: the lock still holds the token, which
/// the release removes).
fn pass_through_redis(
    ctx: &LockContext,
    hold: &Hold,
    cohort: Cohort,
    lease: Duration,
) -> Option<Result<(u64, Instant, Cohort)>> {
    let call = ScriptCall::new(&PASS_ON)
        .key(&hold.keys.lock)
        .key(&hold.keys.fence)
        .key(&hold.keys.waiting)
        .arg(&*hold.token)
        .arg(COHORT_PASSES)
        .arg(millis(lease));
    let sent_at = Instant::now();
    let doing = Doing::lock("passing on", &hold.name);
    // A pass needs one server's reply: over a quorum, the lock is released instead.
    let connections = ctx.lessor.one_deployment()?;
    let reply = connections.call(&hold.lock_key, doing, |c| {
        // The pass hands out fencing tokens: it asks the replicas an acquire asks, not the
        // fewer a renewal may (in a planned failover, the replica being promoted has left the
        // master while another still acknowledges it).
        match ctx.replicas_to_ask(LeaseWrite::Acquire, c)? {
            Some((replicas, timeout)) => {
                let (reply, got): (Vec<i64>, i64) = call.invoke_and_wait(c, replicas, timeout)?;
                Ok((reply, Some((got, replicas))))
            }
            None => Ok((call.invoke::<Vec<i64>>(c)?, None)),
        }
    });
    let (last, others) = match reply {
        Ok((reply, acks)) => match (reply.as_slice(), acks) {
            // Too few replicas hold the new lease: released instead, as it stands.
            ([1, _, _], Some(acks)) if ctx.too_few_acks(acks) => {
                let _ = ctx.not_replicated(&hold.lock_key, acks, "the pass");
                return None;
            }
            ([1, last, others], _) => (*last, *others),
            _ => return Some(Err(lost(ctx, hold, LostReason::Taken))),
        },
        Err(e) => {
            log::debug!("redmutex: passing lock {:?} on failed: {e}", hold.name);
            return None;
        }
    };
    let last = u64::try_from(last).unwrap_or(0);
    let first = last.saturating_sub(u64::from(COHORT_PASSES) - 1);
    let others = u64::try_from(others).unwrap_or(0);
    Some(Ok((
        first,
        sent_at + ctx.counted(lease),
        cohort.passed(others, (first, last)),
    )))
}
