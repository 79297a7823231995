//! The single-deployment lessor: a client's holds live on the one server (standalone, the
//! Sentinel master, or the Cluster master of the lock's slot) that owns the lock's keys. It
//! adds what one deployment can do: plain commands for a free lock (`plain_take`), replica
//! acknowledgements (`WAIT`) with the lease counted from the send, and releases written
//! without waiting for their reply.

use std::cell::{Cell, LazyCell};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::ReplicaAcks;
use crate::connection::{AckRule, Acked, Conn, Connections, OnReply, Routed, ScriptCall};
use crate::error::{Doing, Error, ErrorKind, Result};
use crate::identity::Identity;
use crate::lease::cleanup::{CleanUpLater, Cleanup};
use crate::lease::contended::ContendedLocks;
use crate::lease::lessor::{
    Attempted, Attempting, Contact, HoldCall, Lessor, Popped, Renewing, Site, ValueAt,
};
use crate::lease::plain_take::{self, SeededCounters};
use crate::lease::protocol::{AcquireCall, PlainTake};
use crate::lease::renewal::BATCH_SIZE;
use crate::lease::replication::{self, LeaseWrite};
use crate::lease::reply::AcquireReply;
use crate::waiting::Release;

/// What one attempt's round trip got: the script's (or plain commands') reply, the replica
/// acknowledgements of a lock taken as (got, asked), and what a pop behind it gave.
type SentAttempt = (AcquireReply, Option<(i64, u32)>, Popped);

/// A client's one deployment, as the lease stack's lessor.
pub(crate) struct Single {
    connections: Arc<Connections>,
    /// Replicas each lease write must reach before it counts.
    acks: Option<ReplicaAcks>,
    /// How long past a lease a clean-up is still sent.
    response_timeout: Duration,
    /// The fencing counters this client saw started: the locks it may take plainly.
    seeded: SeededCounters,
    /// The locks a first attempt found held lately: their first attempts send the script.
    contended: ContendedLocks,
    /// Who the client is, announced while its renewal thread runs.
    identity: Identity,
}

impl Single {
    pub(crate) fn new(
        connections: Arc<Connections>,
        acks: Option<ReplicaAcks>,
        response_timeout: Duration,
        identity: Identity,
    ) -> Self {
        Single {
            connections,
            acks,
            response_timeout,
            seeded: SeededCounters::new(),
            contended: ContendedLocks::new(),
            identity,
        }
    }

    /// Runs one call that is safe to repeat, once more on a fresh connection when the
    /// connection dropped under it (a Redis restart leaves every pooled connection dead). A
    /// call that timed out is not repeated.
    fn call<T>(
        &self,
        route: &str,
        doing: Doing<'_>,
        f: impl Fn(&mut Conn) -> redis::RedisResult<T>,
    ) -> Result<T> {
        call_retried(&self.connections, route, doing, f)
    }

    /// The round trip of one attempt on connection `c`: plain commands when `plainly` (`took`
    /// is set if they left the lock holding the token), else the script; with `WAIT` in the
    /// same round trip when replicas must hold the lease (the acknowledgements, as (got,
    /// asked), of a lock taken), or else `popping`'s pop behind the script (what it gave).
    fn send_attempt(
        &self,
        c: &mut Conn,
        a: &Attempting<'_>,
        script: &LazyCell<ScriptCall, impl FnOnce() -> ScriptCall>,
        (plainly, popping): (bool, Option<(&str, Duration)>),
        took: &Cell<bool>,
    ) -> redis::RedisResult<SentAttempt> {
        let asked = self.replicas_to_ask(LeaseWrite::Acquire, c)?;
        let popped = Cell::new(Popped::Nothing);
        let by_script = |c: &mut Conn| -> redis::RedisResult<plain_take::Acknowledged> {
            match (asked, popping) {
                (Some((replicas, timeout)), _) => {
                    let (reply, got) = script.invoke_and_wait(c, replicas, timeout)?;
                    Ok((reply, Some(got)))
                }
                (None, Some((notes, timeout))) => {
                    let (reply, pop) = script.invoke_then_pop(c, notes, timeout)?;
                    popped.set(match pop {
                        // The script's mark: no note is coming.
                        Ok(Some(note)) if note.is_empty() => Popped::Nothing,
                        Ok(Some(note)) => Popped::Note(note),
                        Ok(None) => Popped::Nothing,
                        Err(e) if e.code() == Some("NOPERM") => Popped::Refused(e.to_string()),
                        Err(e) => {
                            log::debug!("redmutex: {e}");
                            Popped::Nothing
                        }
                    });
                    Ok((reply, None))
                }
                (None, None) => Ok((script.invoke(c)?, None)),
            }
        };
        // Set when the plain commands found the lock held by another client.
        let held = Cell::new(false);
        let (reply, got) = match plainly {
            false => by_script(c)?,
            true => {
                let (call, protocol) = (a.call, a.protocol);
                let (keys, token) = (call.keys, call.token);
                let beside = plain_take::Beside {
                    waits: call.queue,
                    queue: (protocol.plain_take(call) == PlainTake::WhenFreeOfQueue)
                        .then_some(keys.queue()),
                    payload: protocol.plain_payload(keys),
                    replicas: asked,
                };
                plain_take::acquire(
                    c,
                    (keys, token, call.lease_ms()),
                    &beside,
                    (by_script, || protocol.release(keys, token)),
                    took,
                    &held,
                )?
            }
        };
        if held.get() {
            self.contended.found_held(&a.call.keys.lock);
        }
        // A lock taken counts the replicas that acknowledged it, as (got, asked).
        let acks = asked
            .filter(|_| reply.taken == 1)
            .map(|(replicas, _)| (got.unwrap_or(0), replicas));
        Ok((reply, acks, popped.into_inner()))
    }

    /// What an attempt's reply means (a lock taken that too few replicas acknowledged is
    /// given back, and is an error).
    fn attempt_outcome(
        &self,
        a: &Attempting<'_>,
        (reply, acks, popped): SentAttempt,
        sent_at: Instant,
        later: &dyn CleanUpLater,
    ) -> Result<Attempted> {
        let keys = a.call.keys;
        if let Some(acks) = acks.filter(|&a| reply.taken == 1 && replication::too_few(a)) {
            self.roll_back(a, sent_at + a.call.lease, later);
            self.connections.replicas_short(&keys.lock);
            return Err(self.not_replicated(acks, "the acquire; it was rolled back"));
        }
        match reply {
            AcquireReply {
                taken: 1,
                value: fencing_token,
                payload,
                ..
            } => {
                let fencing_token = u64::try_from(fencing_token).unwrap_or(0);
                self.seeded.saw(&keys.fence, fencing_token);
                Ok(Attempted::Taken {
                    fencing_token,
                    held_until: sent_at + self.counted(a.call.lease),
                    payload,
                })
            }
            AcquireReply {
                taken: 0,
                value: wait_ms,
                server_ms,
                own_place,
                ahead,
                ..
            } => Ok(Attempted::Held {
                wait: Duration::from_millis(wait_ms.unsigned_abs()),
                // A negative time: the holder does not announce its release.
                release: match (wait_ms < 0, ahead) {
                    (true, _) => Release::Unannounced,
                    (false, None) => Release::Announced,
                    (false, Some(ahead)) => Release::Behind(ahead),
                },
                contact: server_ms.map(|server_ms| Contact { sent_at, server_ms }),
                own_place,
                popped,
            }),
            AcquireReply { taken, value, .. } => Err(Error::new(
                ErrorKind::Server,
                format!(
                    "{}: unexpected reply {{{taken}, {value}}} from the script",
                    Doing::lock("acquiring", a.name)
                ),
            )),
        }
    }

    /// Gives back a lock that was taken but cannot be kept: one try now, then the renewal
    /// thread's clean-up.
    #[cold]
    fn roll_back(&self, a: &Attempting<'_>, give_up_at: Instant, later: &dyn CleanUpLater) {
        let (keys, token) = (a.call.keys, a.call.token);
        let doing = Doing::lock("rolling back", a.name);
        let result = self.connections.call(&keys.lock, doing, |c| {
            a.protocol.abandon(keys, token).invoke::<i64>(c)
        });
        if let Err(e) = result {
            log::debug!("redmutex: {e}; retrying in the background");
            self.abandon_later(a, give_up_at, later);
        }
    }

    /// Has the renewal thread remove what the attempt may have left, until Redis answers or
    /// `give_up_at`, when the lease it asked for has passed.
    #[cold]
    fn abandon_later(&self, a: &Attempting<'_>, give_up_at: Instant, later: &dyn CleanUpLater) {
        later.clean_up_later(
            a.lock_key,
            Cleanup {
                name: Arc::clone(a.name),
                call: a.protocol.abandon(a.call.keys, a.call.token),
                give_up_at: give_up_at + self.response_timeout,
            },
        );
    }

    fn replicas_to_ask(
        &self,
        write: LeaseWrite,
        c: &mut Conn,
    ) -> redis::RedisResult<Option<(u32, Duration)>> {
        replication::replicas_to_ask(self.acks, write, c)
    }

    /// The part of a lease the client counts from the send of a write that set it.
    fn counted(&self, lease: Duration) -> Duration {
        replication::counted(self.acks, lease)
    }

    /// The error of a write that too few replicas acknowledged: `what` says which, and what
    /// became of it ("the acquire …; it was rolled back").
    fn not_replicated(&self, acks: (i64, u32), what: &str) -> Error {
        replication::not_replicated(self.acks, acks, what)
    }
}

/// Runs one call that is safe to repeat on `connections`, once more on a fresh connection
/// when the connection dropped under it.
pub(crate) fn call_retried<T>(
    connections: &Connections,
    route: &str,
    doing: Doing<'_>,
    f: impl Fn(&mut Conn) -> redis::RedisResult<T>,
) -> Result<T> {
    match connections.call(route, doing, &f) {
        Err(e) if e.is_connection() && !e.is_checkout() => connections.call(route, doing, &f),
        other => other,
    }
}

impl Lessor for Single {
    fn reached(&self) -> bool {
        self.connections.reached()
    }

    fn one_deployment(&self) -> Option<&Arc<Connections>> {
        Some(&self.connections)
    }

    /// After a dropped connection (a reply that cannot have come), the same call is sent once
    /// more on a fresh connection: an acquire script that finds its own token treats the lock
    /// as taken, so this is safe. Any other unknown outcome (a time-out) is reported at once,
    /// and the token-checked clean-up goes to the renewal thread.
    fn attempt(&self, a: &Attempting<'_>, later: &dyn CleanUpLater) -> Result<Attempted> {
        // A pop rides behind the script only where no `WAIT` goes there (replica
        // acknowledgements); elsewhere the script is not given the list to mark, since no pop
        // would take the mark.
        let unpopped;
        let call = match a.call.pop.is_some() && self.acks.is_some() {
            true => {
                unpopped = AcquireCall {
                    pop: None,
                    ..*a.call
                };
                &unpopped
            }
            false => a.call,
        };
        let keys = call.keys;
        let doing = Doing::lock("acquiring", a.name);
        // Built when first sent: an attempt that plain commands settle never sends it.
        let script = LazyCell::new(|| a.protocol.acquire(call));
        // Plain commands on the first try only: a try sent again after a redirection (a
        // Cluster's `ASK` lets in only the one command after `ASKING`) or a lost connection
        // sends the script, which settles every case in one command.
        let plainly = Cell::new(
            a.first
                && a.protocol.plain_take(call) != PlainTake::Never
                && self.seeded.contains(&keys.fence)
                && !self.contended.lately(&keys.lock),
        );
        // The pop behind the script on the first try only, as the plain commands.
        let popping = Cell::new(call.pop);
        let mut resent = false;
        // Set when a plain take left the lock holding the token before the script's reply.
        let took = Cell::new(false);
        loop {
            let sent_at = Instant::now();
            let reply = self.connections.call(&keys.lock, doing, |c| {
                let first_try = (plainly.replace(false), popping.replace(None));
                self.send_attempt(c, a, &script, first_try, &took)
            });
            return match reply {
                Ok(reply) => self.attempt_outcome(a, reply, sent_at, later),
                // The lock may be ours without our knowing, or a plain `SET` took it and the
                // script refused to finish the take (an ACL without `EVALSHA`): the token is
                // never used again, so the lock is removed off this path.
                Err(err) if err.outcome_unknown() || took.get() => {
                    if err.is_connection() && !resent {
                        resent = true;
                        continue;
                    }
                    self.abandon_later(a, sent_at + call.lease, later);
                    Err(err)
                }
                Err(err) => Err(err),
            };
        }
    }

    fn release(&self, c: HoldCall<'_>) -> Result<bool> {
        let released: i64 = self
            .connections
            .call(c.site.route, c.doing, |conn| c.call.invoke(conn))?;
        Ok(released == 1)
    }

    fn release_unread(&self, c: HoldCall<'_>, settle: OnReply) -> Result<bool> {
        self.connections
            .send_unread(c.site.route, c.call, c.doing, settle)
    }

    fn remaining(&self, c: HoldCall<'_>) -> Result<Option<Duration>> {
        let ms: i64 = self.call(c.site.route, c.doing, |conn| c.call.invoke(conn))?;
        Ok(u64::try_from(ms).ok().map(Duration::from_millis))
    }

    fn count(&self, c: HoldCall<'_>) -> Result<u64> {
        let n: i64 = self.call(c.site.route, c.doing, |conn| c.call.invoke(conn))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    fn change_lease(&self, c: HoldCall<'_>) -> Result<Option<Instant>> {
        let (site, call, doing) = (c.site, c.call, c.doing);
        let sent_at = Instant::now();
        let (remaining, acks): (i64, Option<(i64, u32)>) = self.call(site.route, doing, |c| {
            match self.replicas_to_ask(LeaseWrite::Renewal, c)? {
                Some((replicas, timeout)) => {
                    let (remaining, got) = call.invoke_and_wait(c, replicas, timeout)?;
                    Ok((remaining, Some((got, replicas))))
                }
                None => Ok((call.invoke(c)?, None)),
            }
        })?;
        if let Some(acks) = acks.filter(|acks| remaining >= 0 && replication::too_few(*acks)) {
            // The lease the holder counts stays as it was: a failover may lose the change.
            self.connections.replicas_short(site.route);
            return Err(
                self.not_replicated(acks, "the lease change; the lease counted stays as it was")
            );
        }
        // Counted from the sending: the local view never outlives Redis's.
        Ok(u64::try_from(remaining)
            .ok()
            .map(|ms| sent_at + self.counted(Duration::from_millis(ms))))
    }

    fn acted(&self, c: HoldCall<'_>) -> Result<bool> {
        let done: i64 = self.call(c.site.route, c.doing, |conn| c.call.invoke(conn))?;
        Ok(done == 1)
    }

    fn found(&self, c: HoldCall<'_>) -> Result<bool> {
        self.acted(c)
    }

    fn read(&self, lock_key: &str, key: &str, doing: Doing<'_>) -> Result<Option<String>> {
        self.call(lock_key, doing, |c| redis::cmd("GET").arg(key).query(c))
    }

    /// One copy: its version does not matter.
    fn read_value(&self, at: ValueAt<'_>, doing: Doing<'_>) -> Result<Option<Vec<u8>>> {
        self.call(at.route, doing, |c| {
            redis::cmd("GET").arg(at.value).query(c)
        })
    }

    fn copies(&self) -> (usize, usize) {
        (1, 1)
    }

    fn read_each(
        &self,
        route: &str,
        calls: &[ScriptCall],
        doing: Doing<'_>,
    ) -> Result<Vec<Option<redis::Value>>> {
        let Some(call) = calls.first() else {
            return Ok(Vec::new());
        };
        let reply = self
            .connections
            .call(route, doing, |conn| call.invoke::<redis::Value>(conn))?;
        Ok(vec![Some(reply)])
    }

    fn delete(&self, lock_key: &str, key: &str, doing: Doing<'_>) -> Result<bool> {
        let removed: i64 = self.call(lock_key, doing, |c| redis::cmd("DEL").arg(key).query(c))?;
        Ok(removed == 1)
    }

    fn key_type(&self, lock_key: &str, doing: Doing<'_>) -> Result<String> {
        self.call(lock_key, doing, |c| {
            redis::cmd("TYPE").arg(lock_key).query(c)
        })
    }

    fn send(&self, c: HoldCall<'_>) -> Result<()> {
        self.connections
            .call(c.site.route, c.doing, |conn| {
                c.call.invoke::<redis::Value>(conn)
            })
            .map(drop)
    }

    /// Grouped by server first, so that every batch is one round trip to one server: the
    /// leases of a period cost at most one round trip per server more than one per batch.
    /// With replica acknowledgements, each server's renewals end with `WAIT`: a renewal that
    /// too few replicas acknowledged extends nothing (a failover may lose it).
    fn renew(
        &self,
        leases: &[Renewing<'_>],
        lease: Duration,
    ) -> (Vec<Result<Option<Instant>>>, u64) {
        let mut by_shard: Vec<(usize, Vec<usize>)> = Vec::new();
        for (i, (Site { route, .. }, _)) in leases.iter().enumerate() {
            let shard = self.connections.shard_of(route);
            match by_shard.iter_mut().find(|(s, _)| *s == shard) {
                Some((_, group)) => group.push(i),
                None => by_shard.push((shard, vec![i])),
            }
        }
        let acks_rule = |c: &mut Conn| self.replicas_to_ask(LeaseWrite::Renewal, c);
        let rule: Option<AckRule<'_>> = self.acks.is_some().then_some(&acks_rule);
        let counted = self.counted(lease);
        let mut outcomes: Vec<Result<Option<Instant>>> =
            (0..leases.len()).map(|_| Ok(None)).collect();
        let (mut trips, mut short) = (0, None);
        for (_, group) in &by_shard {
            for chunk in group.chunks(BATCH_SIZE) {
                let calls: Vec<Routed<'_>> = chunk
                    .iter()
                    .map(|&i| (leases[i].0.route, leases[i].1))
                    .collect();
                let sent_at = Instant::now();
                let (replies, used) =
                    self.connections
                        .call_batch_acked(&calls, Doing::work("renewing leases"), rule);
                trips += used;
                for (&i, reply) in chunk.iter().zip(replies) {
                    outcomes[i] = renewal_outcome(reply, leases[i].0.route, &mut short)
                        .map(|held| held.then(|| sent_at + counted));
                }
            }
        }
        if let Some(route) = short {
            // The deployment may count replicas that are gone: have it look again.
            self.connections.replicas_short(route);
        }
        (outcomes, trips)
    }

    fn batch(&self, calls: &[Routed<'_>], doing: Doing<'_>) -> (Vec<Result<redis::Value>>, u64) {
        self.connections.call_batch(calls, doing)
    }

    fn settle_unread(&self) {
        self.connections.settle_unread();
    }

    /// Keeps the announcement alive for `ttl` (one `PEXPIRE`), or writes it whole when it is
    /// new or Redis lost it. Best effort: a failure is logged.
    fn announce(&self, first: bool, ttl: Duration) {
        let identity = &self.identity;
        let doing = Doing::work("announcing this client");
        let kept = match first {
            true => Ok(false),
            false => self.connections.call(&identity.key, doing, |c| {
                identity.keep(ttl).query::<i64>(c).map(|n| n == 1)
            }),
        };
        let result = match kept {
            Ok(true) => Ok(()),
            Ok(false) => self.connections.call(&identity.key, doing, |c| {
                identity.announce(ttl).query::<()>(c)
            }),
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            log::debug!("redmutex: {e}");
        }
    }

    /// Deletes the announcement, as the client shuts down cleanly (`redmutex list` then shows
    /// no client that is gone). Best effort: it expires a lease later anyway.
    fn withdraw_announcement(&self) {
        let identity = &self.identity;
        let doing = Doing::work("withdrawing this client's announcement");
        if let Err(e) = self.connections.call(&identity.key, doing, |c| {
            identity.withdraw().query::<i64>(c)
        }) {
            log::debug!("redmutex: {e}");
        }
    }

    fn shutdown(&self, wait: bool) {
        self.connections.shutdown(wait);
    }
}

/// A renewal's reply: whether the lock still held the token. An error reply (`READONLY` from
/// a demoted master, say) is a failed renewal, not a lost lock (the lease runs out on this
/// machine's clock if renewal keeps failing), and so is a renewal that too few replicas
/// acknowledged (its lock is named in `short`).
fn renewal_outcome<'k>(
    reply: Result<Acked>,
    route: &'k str,
    short: &mut Option<&'k str>,
) -> Result<bool> {
    match reply {
        Ok((redis::Value::ServerError(e), _)) => Err(Error::new(
            ErrorKind::Server,
            format!("renewing leases: {}", redis::RedisError::from(e)),
        )),
        Ok((redis::Value::Int(1), Some((got, asked)))) if replication::too_few((got, asked)) => {
            *short = Some(route);
            Err(Error::new(
                ErrorKind::NotReplicated,
                format!(
                    "renewing leases: {got} of {asked} replicas acknowledged the renewal in time"
                ),
            ))
        }
        Ok((redis::Value::Int(1), _)) => Ok(true),
        Ok(_) => Ok(false),
        Err(e) => Err(e),
    }
}
