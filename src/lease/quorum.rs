//! The quorum lessor: a hold lives on a majority of a Redlock's independent instances (the
//! clients that reach them). Each
//! operation is a round — one call to every instance at once — whose answers are counted:
//! a lease is held while a majority holds it, valid until the lease, less the time the
//! acquire took and the clock drift, and its fencing token is ordered across instances.

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use redis::Script;

mod instances;

use crate::connection::{Connections, OnReply, Routed, ScriptCall};
use crate::error::{Doing, Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::lease::cleanup::CleanUpLater;
use crate::lease::context::{Handle, LockContext};
use crate::lease::lessor::{
    Attempted, Attempting, HoldCall, Lessor, Popped, Renewing, Site, ValueAt,
};
use crate::lease::plain_take::{self, SeededCounters};
use crate::lease::protocol::PlainTake;
use crate::lease::reply::{self, AcquireReply};
use crate::waiting::Release;
use instances::{fan_out, fan_out_commands, too_few_answered, unexpected, Reply};

use instances::Instance;

/// Raises a lock's fencing counter to a Redlock's token: see `raise_fence.lua`.
static RAISE_FENCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("quorum/raise_fence.lua")));

/// One plain command on a key: see `key.lua`.
static KEY: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("quorum/key.lua")));

crate::lease::scripts::listed! {
    "quorum/raise_fence" => RAISE_FENCE, "quorum/key" => KEY,
}

/// The longest default per-instance timeout.
const MAX_DEFAULT_INSTANCE_TIMEOUT: Duration = Duration::from_millis(50);

/// A Redlock's instances, as the lease stack's lessor.
#[derive(Clone)]
pub(crate) struct Quorum {
    pub(crate) instances: Vec<Instance>,
    /// How many instances must hold a lock.
    pub(crate) quorum: usize,
    /// `None`: the lease / 20, at most 50 ms.
    pub(crate) instance_timeout: Option<Duration>,
    /// The default lease of the instances' clients (for the default per-instance timeout of
    /// a release).
    pub(crate) lease: Duration,
    /// The fencing counters that a round won with started counters on every instance: the
    /// locks a first attempt takes with plain commands (see [`Quorum::plain_round`]).
    pub(crate) seeded: Arc<SeededCounters>,
}

/// How many of `n` instances must hold a lock of which `capacity` units exist (see
/// [`Quorum::needed`]).
fn needed_of(n: usize, capacity: u32) -> usize {
    let c = usize::try_from(capacity.max(1)).unwrap_or(usize::MAX);
    (n.saturating_mul(c) / c.saturating_add(1) + 1).min(n)
}

/// What an instance said to an acquire.
enum Took {
    /// Taken, with its fencing counter, the bytes that came with the lock and their version.
    Yes(u64, Option<Vec<u8>>, (u64, u64)),
    /// Held by another: how long, in milliseconds.
    No(i64),
    Failed(Error),
}

impl Took {
    /// What an instance's reply to an acquire says.
    fn from_reply(reply: Reply, doing: Doing<'_>) -> Took {
        let parsed = reply.map(|r| {
            r.and_then(|v| {
                redis::from_redis_value_ref::<AcquireReply>(&v).map_err(|_| unexpected(doing, &v))
            })
        });
        match parsed {
            Some(Ok(r)) if r.taken == 1 => Took::Yes(
                u64::try_from(r.value).unwrap_or(0),
                r.payload,
                r.payload_version,
            ),
            Some(Ok(r)) => Took::No(r.value),
            Some(Err(e)) => Took::Failed(e),
            None => Took::Failed(Error::new(ErrorKind::Server, "not sent")),
        }
    }

    /// The bytes of the newest version among the instances that granted the lock (its
    /// writer's fencing token the largest): a quorum holds the last write, which only a
    /// holder of a quorum makes, on at least one of them. A removal is a version with no
    /// bytes.
    fn newest_payload(took: Vec<Took>) -> Option<Vec<u8>> {
        took.into_iter()
            .filter_map(|t| match t {
                Took::Yes(_, payload, version) => Some((version, payload)),
                _ => None,
            })
            .max_by_key(|(version, _)| *version)
            .and_then(|(_, payload)| payload)
    }

    fn error(&self) -> Option<Error> {
        match self {
            Took::Failed(e) => Some(e.clone()),
            _ => None,
        }
    }
}

/// What the instances of a round answered.
#[derive(Default)]
struct Answers {
    values: Vec<redis::Value>,
    /// The errors of the instances that did not answer, or answered with an error.
    failed: Vec<Error>,
}

impl Answers {
    /// The answers that are integers.
    fn ints(&self) -> impl Iterator<Item = i64> + '_ {
        self.values.iter().filter_map(|v| match v {
            redis::Value::Int(n) => Some(*n),
            _ => None,
        })
    }
}

/// What a release round tells of a hold that was not known to be lost before it.
#[derive(Debug, PartialEq, Eq)]
enum ReleaseOutcome {
    /// A majority of the instances answered: the lock is no longer this holder's on a
    /// majority, and the hold, valid until the release, was not lost.
    Confirmed,
    /// Too few instances released it for a majority to have held it: it was lost.
    Lost,
    /// Too few instances answered to tell.
    Unknown,
}

/// The outcome of a release that `released` instances carried out and `not_ours` found not
/// (or no longer) holding this holder's token, of `n`, the others not answering. An instance
/// that never granted the hold (it was down, or someone else's copy was there when the hold
/// was taken) says "not ours" too, so those answers confirm the release without counting as
/// a loss while the instances that did not answer could still make up the majority that held
/// it (an instance killed during the release round, say).
fn release_outcome(released: usize, not_ours: usize, n: usize, quorum: usize) -> ReleaseOutcome {
    let silent = n - released - not_ours;
    if released >= quorum {
        ReleaseOutcome::Confirmed
    } else if released + silent < quorum {
        ReleaseOutcome::Lost
    } else if released + not_ours >= quorum {
        ReleaseOutcome::Confirmed
    } else {
        ReleaseOutcome::Unknown
    }
}

impl Quorum {
    /// The quorum of the instances that these clients (their contexts and connections)
    /// reach: a majority of them.
    ///
    /// # Errors
    ///
    /// `Config` when two clients reach the same server.
    pub(crate) fn of(clients: Vec<(Arc<LockContext>, Arc<Connections>)>) -> Result<Quorum> {
        let mut instances: Vec<Instance> = Vec::with_capacity(clients.len());
        for (ctx, connections) in clients {
            let server = connections.describe();
            if instances.iter().any(|i| i.connections.describe() == server) {
                return Err(Error::config(format!(
                    "{server} is given twice: a Redlock's instances must be independent servers"
                )));
            }
            instances.push(Instance {
                _handle: Handle::new(&ctx),
                ctx,
                connections,
            });
        }
        let quorum = instances.len() / 2 + 1;
        let lease = instances
            .first()
            .map_or(Duration::from_secs(30), |i| i.ctx.config.default_lease);
        Ok(Quorum {
            instances,
            quorum,
            instance_timeout: None,
            lease,
            seeded: Arc::new(SeededCounters::new()),
        })
    }

    /// The servers of the instances, as messages name them.
    pub(crate) fn servers(&self) -> Vec<String> {
        self.instances
            .iter()
            .map(|i| i.connections.describe())
            .collect()
    }

    /// The per-instance timeout for a lease.
    pub(crate) fn instance_timeout(&self, lease: Duration) -> Duration {
        self.instance_timeout
            .unwrap_or_else(|| (lease / 20).min(MAX_DEFAULT_INSTANCE_TIMEOUT))
            .max(Duration::from_millis(1))
    }

    /// How many instances must hold a lock of which `capacity` units exist: a majority for
    /// a lock one holder at a time may have. A lock that `c` may hold at once (a semaphore's
    /// permits) needs more, `n·c/(c+1) + 1` of `n`: with fewer, `c + 1` holders could each
    /// hold on their own set of instances, no instance seeing more than `c` of them. (Readers
    /// of a read-write lock share it without a bound, and a writer, with a capacity of 1,
    /// meets each of them on some instance.)
    pub(crate) fn needed(&self, capacity: u32) -> usize {
        needed_of(self.instances.len(), capacity)
    }

    /// The longest response timeout of the instances.
    fn response_timeout(&self) -> Duration {
        self.instances
            .iter()
            .map(|i| i.ctx.config.response_timeout)
            .max()
            .unwrap_or(Duration::from_secs(1))
    }

    /// `call` on every instance, each answer read within the response timeout.
    fn round(&self, route: &str, call: &ScriptCall, doing: Doing<'_>) -> Vec<Reply> {
        let c = HoldCall {
            site: Site { route, capacity: 1 },
            call,
            doing,
        };
        self.round_within(c, self.response_timeout())
    }

    /// `c`'s call on every instance, each answer read within `timeout`.
    fn round_within(&self, c: HoldCall<'_>, timeout: Duration) -> Vec<Reply> {
        let calls: Vec<Option<&ScriptCall>> = self.instances.iter().map(|_| Some(c.call)).collect();
        fan_out(&self.instances, c.site.route, &calls, timeout, c.doing)
    }

    /// Splits the replies of a round into values and failures.
    fn answers(replies: Vec<Reply>, doing: Doing<'_>) -> Answers {
        let mut answers = Answers::default();
        for reply in replies.into_iter().flatten() {
            match reply {
                Ok(redis::Value::ServerError(e)) => answers
                    .failed
                    .push(unexpected(doing, &redis::Value::ServerError(e))),
                Ok(value) => answers.values.push(value),
                Err(e) => answers.failed.push(e),
            }
        }
        answers
    }

    /// Fails when more instances failed than `needed` can spare.
    fn enough_answered(&self, needed: usize, failed: &[Error], doing: Doing<'_>) -> Result<()> {
        let n = self.instances.len();
        match failed.first() {
            Some(first) if failed.len() > n - needed => {
                Err(too_few_answered(n - failed.len(), n, doing, first))
            }
            _ => Ok(()),
        }
    }

    /// A round of `c`, whose replies are counts or milliseconds (negative: none): the
    /// `needed`-th largest for the hold's capacity, `None` when fewer than `needed` are
    /// non-negative; an error when too few answered to tell.
    fn needed_th(&self, c: HoldCall<'_>) -> Result<Option<u64>> {
        let (site, doing) = (c.site, c.doing);
        let needed = self.needed(site.capacity);
        let answers = Self::answers(self.round(site.route, c.call, doing), doing);
        let mut held: Vec<u64> = answers
            .ints()
            .filter_map(|ms| u64::try_from(ms).ok())
            .collect();
        if held.len() >= needed {
            held.sort_unstable_by(|a, b| b.cmp(a));
            return Ok(Some(held[needed - 1]));
        }
        let failed = &answers.failed;
        if let Some(first) = failed
            .first()
            .filter(|_| held.len() + failed.len() >= needed)
        {
            // The instances that did not answer could make a majority: no telling.
            let n = self.instances.len();
            return Err(too_few_answered(n - failed.len(), n, doing, first));
        }
        Ok(None)
    }

    /// The fencing token of a round that a majority granted (the largest of their counters),
    /// once the counters of that majority are raised to it; `None` when the round was not won
    /// or the raise did not reach a majority before `valid_until`.
    fn won(
        &self,
        needed: usize,
        (keys, token): (&LockKeys, &str),
        took: &[Took],
        timeout: Duration,
        valid_until: Instant,
    ) -> Option<u64> {
        let fences: Vec<Option<u64>> = took
            .iter()
            .map(|t| match t {
                Took::Yes(fence, ..) => Some(*fence),
                _ => None,
            })
            .collect();
        let taken = fences.iter().flatten().count();
        if taken < needed || Instant::now() >= valid_until {
            return None;
        }
        let fencing_token = fences.iter().flatten().copied().max().unwrap_or(0);
        // Instances whose counter is below the token are raised to it; when a majority is
        // there already (counters in step, as when every instance granted the last
        // acquisitions), no raise is needed.
        let raise = ScriptCall::new(&RAISE_FENCE)
            .key(&keys.lock)
            .key(&keys.fence)
            .arg(token)
            .arg(fencing_token);
        let calls: Vec<Option<&ScriptCall>> = fences
            .iter()
            .map(|f| f.filter(|&f| f < fencing_token).map(|_| &raise))
            .collect();
        let mut at_token = taken - calls.iter().flatten().count();
        if at_token < needed {
            let doing = Doing::work("ordering the fencing token of a Redlock");
            let replies = fan_out(&self.instances, &keys.lock, &calls, timeout, doing);
            at_token += replies
                .iter()
                .filter(|r| matches!(r, Some(Ok(redis::Value::Int(1)))))
                .count();
        }
        (at_token >= needed && Instant::now() < valid_until).then_some(fencing_token)
    }

    /// A first attempt's round of plain commands, as a single server's (`lease::plain_take`:
    /// `SET … NX PX … GET` and `INCR` of the fencing counter, no script, a fraction of the
    /// server's time), for a protocol that allows it and a lock whose counters every instance
    /// started in a round won before. The hold when `needed` instances took the lock with a
    /// started counter; `None` leaves the attempt to the script round, which takes the lock
    /// where these commands left it holding the token, and settles every other case (a
    /// lock held, a waiter to register, a counter to start, a server that refuses the
    /// `SET`'s form), one round trip later.
    fn plain_round(
        &self,
        a: &Attempting<'_>,
        (needed, timeout, drift): (usize, Duration, Duration),
        doing: Doing<'_>,
    ) -> Option<Attempted> {
        let call = a.call;
        let keys = call.keys;
        let allowed = a.first
            && a.protocol.plain_take(call) == PlainTake::WhenFree
            && a.protocol.plain_payload(keys).is_none()
            && self.seeded.contains(&keys.fence);
        if !allowed {
            return None;
        }
        let lock = (keys, call.token, call.lease_ms());
        let started = Instant::now();
        let replies = fan_out_commands(
            &self.instances,
            &keys.lock,
            (timeout, doing),
            |features| plain_take::packed(features, lock),
            plain_take::saw,
        );
        let took: Vec<Took> = replies
            .iter()
            .map(|r| match r {
                Some(Ok(replies)) => match plain_take::taken(replies) {
                    Some(fence) => Took::Yes(fence, None, (0, 0)),
                    None => Took::No(0),
                },
                _ => Took::No(0),
            })
            .collect();
        let valid_until = started + call.lease.saturating_sub(drift);
        let fencing_token = self.won(needed, (keys, call.token), &took, timeout, valid_until)?;
        Some(Attempted::Taken {
            fencing_token,
            held_until: valid_until,
            payload: None,
        })
    }

    /// A round not won. When too few instances answered, the acquire ends here and its
    /// token is never sent again: what it may have left is given back by each instance's
    /// renewal thread, off the caller's path. Else the waiter attempts again with the same
    /// token, so what it took is given back now (no two waiters then hold each other's quorum
    /// off until their leases run out), not later (a later give-back could remove what the
    /// next attempt takes); an instance whose reply was lost keeps its copy until the lease
    /// ends, or until the next attempt, which takes it as its own.
    fn lost_round(
        &self,
        a: &Attempting<'_>,
        took: &[Took],
        (needed, timeout, started): (usize, Duration, Instant),
    ) -> Result<Attempted> {
        let (call, doing) = (a.call, Doing::lock("acquiring", a.name));
        let failed: Vec<Error> = took.iter().filter_map(Took::error).collect();
        if let Err(e) = self.enough_answered(needed, &failed, doing) {
            for (i, t) in took.iter().enumerate() {
                if !matches!(t, Took::No(_)) {
                    let abandon = a.protocol.abandon(call.keys, call.token);
                    let at = started + call.lease;
                    self.clean_up_on(i, (a.name, a.lock_key), abandon, at);
                }
            }
            return Err(e);
        }
        let abandon = a.protocol.abandon(call.keys, call.token);
        let give_back: Vec<Option<&ScriptCall>> = took
            .iter()
            .map(|t| matches!(t, Took::Yes(..)).then_some(&abandon))
            .collect();
        if give_back.iter().any(Option::is_some) {
            let doing = Doing::lock("giving back a round of", a.name);
            fan_out(&self.instances, &call.keys.lock, &give_back, timeout, doing);
        }
        let wait = took
            .iter()
            .filter_map(|t| match t {
                Took::No(ms) if *ms > 0 => Some(ms.unsigned_abs()),
                _ => None,
            })
            .min()
            .unwrap_or(0);
        Ok(Attempted::Held {
            wait: Duration::from_millis(wait),
            release: Release::Announced,
            contact: None,
            own_place: None,
            popped: Popped::Nothing,
        })
    }

    /// Has instance `i`'s renewal thread send `call` (a token-checked release or abandon) at
    /// once and again until it answers or `give_up_at`.
    fn clean_up_on(
        &self,
        i: usize,
        a: (&Arc<str>, &Arc<str>),
        call: ScriptCall,
        give_up_at: Instant,
    ) {
        let (name, lock_key) = a;
        self.instances[i].ctx.clean_up_later(
            lock_key,
            name,
            call,
            give_up_at + self.response_timeout(),
        );
    }
}

impl Lessor for Quorum {
    /// A majority of the instances was reached once.
    fn reached(&self) -> bool {
        let reached = self
            .instances
            .iter()
            .filter(|i| i.connections.reached())
            .count();
        reached >= self.quorum
    }

    fn one_deployment(&self) -> Option<&Arc<Connections>> {
        None
    }

    /// One round: the acquire on every instance; with the hold's quorum and validity left,
    /// the fencing counters of that quorum raised to the largest token it returned; else what
    /// was taken is given back (see [`lost_round`](Self::lost_round)).
    fn attempt(&self, a: &Attempting<'_>, _later: &dyn CleanUpLater) -> Result<Attempted> {
        let call = a.call;
        let timeout = self.instance_timeout(call.lease);
        if call.lease <= timeout {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "the lease ({:?}) must be above the per-instance timeout ({timeout:?})",
                    call.lease
                ),
            ));
        }
        let doing = Doing::lock("acquiring", a.name);
        let needed = self.needed(call.capacity);
        let drift = crate::config::clock_drift(call.lease);
        if let Some(taken) = self.plain_round(a, (needed, timeout, drift), doing) {
            return Ok(taken);
        }
        let script = a.protocol.acquire(call);
        let calls: Vec<Option<&ScriptCall>> =
            self.instances.iter().map(|_| Some(&script)).collect();
        let started = Instant::now();
        let took: Vec<Took> = fan_out(&self.instances, &call.keys.lock, &calls, timeout, doing)
            .into_iter()
            .map(|reply| Took::from_reply(reply, doing))
            .collect();
        let valid_until = started + call.lease.saturating_sub(drift);
        let won = self.won(needed, (call.keys, call.token), &took, timeout, valid_until);
        match won {
            Some(fencing_token) => {
                if took.iter().all(|t| matches!(t, Took::Yes(..))) {
                    self.seeded.saw(&call.keys.fence, fencing_token);
                }
                Ok(Attempted::Taken {
                    fencing_token,
                    held_until: valid_until,
                    payload: Took::newest_payload(took),
                })
            }
            None => self.lost_round(a, &took, (needed, timeout, started)),
        }
    }

    fn release(&self, c: HoldCall<'_>) -> Result<bool> {
        let (site, doing) = (c.site, c.doing);
        let needed = self.needed(site.capacity);
        // Bounded by the per-instance timeout, as an acquire is: a paused instance costs an
        // `unlock` that timeout, not the response timeout.
        let timeout = self.instance_timeout(self.lease);
        let replies = self.round_within(c, timeout);
        let n = self.instances.len();
        let (mut released, mut not_ours, mut error) = (0, 0, None);
        for reply in replies.into_iter().flatten() {
            match reply {
                Ok(redis::Value::Int(1)) => released += 1,
                Ok(redis::Value::Int(_)) => not_ours += 1,
                Ok(other) => {
                    error.get_or_insert(unexpected(doing, &other));
                }
                Err(e) => {
                    error.get_or_insert(e);
                }
            }
        }
        if released < needed {
            log::warn!(
                "redmutex: {doing}: released on {released} of {n} Redlock instances; the rest \
                 expire with the lease"
            );
        }
        match release_outcome(released, not_ours, n, needed) {
            ReleaseOutcome::Confirmed => Ok(true),
            ReleaseOutcome::Lost => Ok(false),
            ReleaseOutcome::Unknown => {
                let why = error.unwrap_or_else(|| Error::new(ErrorKind::Server, "no reply"));
                let answered = released + not_ours;
                Err(Error::new(
                    why.kind(),
                    format!(
                        "{doing}: only {answered} of {n} Redlock instances answered \
                         ({released} released it), too few to tell whether it was still held; \
                         the rest expire with the lease: {why}"
                    ),
                ))
            }
        }
    }

    /// Never unread: a quorum's release counts its answers.
    fn release_unread(&self, _: HoldCall<'_>, _: OnReply) -> Result<bool> {
        Ok(false)
    }

    fn remaining(&self, c: HoldCall<'_>) -> Result<Option<Duration>> {
        Ok(self.needed_th(c)?.map(Duration::from_millis))
    }

    /// The `needed`-th largest count: what a hold of that many could take on as many
    /// instances as it needs.
    fn count(&self, c: HoldCall<'_>) -> Result<u64> {
        Ok(self.needed_th(c)?.unwrap_or(0))
    }

    /// Valid while the majority-th longest remaining lease lasts, from the round's start,
    /// less the drift.
    fn change_lease(&self, c: HoldCall<'_>) -> Result<Option<Instant>> {
        let sent_at = Instant::now();
        let remaining = self.needed_th(c)?.map(Duration::from_millis);
        Ok(remaining.map(|r| sent_at + r.saturating_sub(crate::config::clock_drift(r))))
    }

    fn acted(&self, c: HoldCall<'_>) -> Result<bool> {
        let (site, call, doing) = (c.site, c.call, c.doing);
        let answers = Self::answers(self.round(site.route, call, doing), doing);
        let acted = answers.ints().filter(|&n| n == 1).count();
        if acted >= self.needed(site.capacity) {
            return Ok(true);
        }
        self.enough_answered(self.needed(site.capacity), &answers.failed, doing)?;
        Ok(false)
    }

    fn found(&self, c: HoldCall<'_>) -> Result<bool> {
        let (lock_key, call, doing) = (c.site.route, c.call, c.doing);
        let answers = Self::answers(self.round(lock_key, call, doing), doing);
        self.enough_answered(self.quorum, &answers.failed, doing)?;
        let any = answers.ints().any(|n| n > 0);
        Ok(any)
    }

    /// From the first instance that has the key.
    fn read(&self, lock_key: &str, key: &str, doing: Doing<'_>) -> Result<Option<String>> {
        let call = ScriptCall::new(&KEY).key(key).arg("get");
        let answers = Self::answers(self.round(lock_key, &call, doing), doing);
        if let Some(value) = answers
            .values
            .iter()
            .find_map(|v| redis::from_redis_value_ref::<String>(v).ok())
        {
            return Ok(Some(value));
        }
        self.enough_answered(self.quorum, &answers.failed, doing)?;
        Ok(None)
    }

    /// The copy of the largest version among a quorum's answers: the last write that reached
    /// a quorum is on at least one of them.
    fn read_value(&self, at: ValueAt<'_>, doing: Doing<'_>) -> Result<Option<Vec<u8>>> {
        let call = ScriptCall::new(&KEY).key(at.value).key(at.version);
        let call = call.arg("versioned");
        let answers = Self::answers(self.round(at.route, &call, doing), doing);
        self.enough_answered(self.quorum, &answers.failed, doing)?;
        let copies = answers.values.iter().filter_map(|v| {
            let (bytes, version) =
                redis::from_redis_value_ref::<(Option<Vec<u8>>, Option<String>)>(v).ok()?;
            let version = version.as_deref().and_then(reply::parse_version);
            Some((version.unwrap_or((0, 0)), bytes))
        });
        Ok(copies
            .max_by_key(|(version, _)| *version)
            .and_then(|(_, bytes)| bytes))
    }

    fn copies(&self) -> (usize, usize) {
        (self.instances.len(), self.quorum)
    }

    /// Each instance's call, every answer read within the response timeout; a majority must
    /// answer.
    fn read_each(
        &self,
        route: &str,
        calls: &[ScriptCall],
        doing: Doing<'_>,
    ) -> Result<Vec<Option<redis::Value>>> {
        let calls: Vec<Option<&ScriptCall>> = calls.iter().map(Some).collect();
        let replies = fan_out(
            &self.instances,
            route,
            &calls,
            self.response_timeout(),
            doing,
        );
        let mut failed = Vec::new();
        let values = replies
            .into_iter()
            .map(|reply| match reply {
                Some(Ok(redis::Value::ServerError(e))) => {
                    failed.push(unexpected(doing, &redis::Value::ServerError(e)));
                    None
                }
                Some(Ok(value)) => Some(value),
                Some(Err(e)) => {
                    failed.push(e);
                    None
                }
                None => None,
            })
            .collect();
        self.enough_answered(self.quorum, &failed, doing)?;
        Ok(values)
    }

    /// On every instance; whether any had it.
    fn delete(&self, lock_key: &str, key: &str, doing: Doing<'_>) -> Result<bool> {
        let call = ScriptCall::new(&KEY).key(key).arg("del");
        let answers = Self::answers(self.round(lock_key, &call, doing), doing);
        self.enough_answered(self.quorum, &answers.failed, doing)?;
        let any = answers.ints().any(|n| n > 0);
        Ok(any)
    }

    /// `string` when a majority holds the lock, a type other than a lock's when any instance
    /// has one there, else `none`.
    fn key_type(&self, lock_key: &str, doing: Doing<'_>) -> Result<String> {
        let call = ScriptCall::new(&KEY).key(lock_key).arg("type");
        let answers = Self::answers(self.round(lock_key, &call, doing), doing);
        self.enough_answered(self.quorum, &answers.failed, doing)?;
        let types: Vec<String> = answers
            .values
            .iter()
            .filter_map(|v| redis::from_redis_value_ref::<String>(v).ok())
            .collect();
        if let Some(other) = types.iter().find(|t| *t != "none" && *t != "string") {
            return Ok(other.clone());
        }
        let held = types.iter().filter(|t| *t == "string").count();
        Ok(match held >= self.quorum {
            true => "string".to_owned(),
            false => "none".to_owned(),
        })
    }

    fn send(&self, c: HoldCall<'_>) -> Result<()> {
        let (lock_key, call, doing) = (c.site.route, c.call, c.doing);
        let answers = Self::answers(self.round(lock_key, call, doing), doing);
        match (answers.values.is_empty(), answers.failed.into_iter().next()) {
            (true, Some(e)) => Err(e),
            _ => Ok(()),
        }
    }

    /// Every lease on every instance (one pipelined round trip per instance); a lease is
    /// valid while the majority-th latest renewal lasts, less the drift. Lost when so many
    /// instances no longer hold it that the rest cannot make a majority.
    fn renew(
        &self,
        leases: &[Renewing<'_>],
        lease: Duration,
    ) -> (Vec<Result<Option<Instant>>>, u64) {
        let routed: Vec<Routed<'_>> = leases
            .iter()
            .map(|(site, call)| (site.route, *call))
            .collect();
        let doing = Doing::work("renewing Redlock leases");
        let mut renewed: Vec<Vec<Instant>> = vec![Vec::new(); leases.len()];
        let mut not_held = vec![0usize; leases.len()];
        let mut failure: Vec<Option<Error>> = vec![None; leases.len()];
        let mut trips = 0;
        for instance in &self.instances {
            let sent_at = Instant::now();
            let (replies, used) = instance.connections.call_batch(&routed, doing);
            trips += used;
            for (l, reply) in replies.into_iter().enumerate() {
                match reply {
                    Ok(redis::Value::Int(1)) => renewed[l].push(sent_at),
                    Ok(redis::Value::Int(_)) => not_held[l] += 1,
                    Ok(other) => failure[l] = Some(unexpected(doing, &other)),
                    Err(e) => failure[l] = Some(e),
                }
            }
        }
        let n = self.instances.len();
        let valid = lease.saturating_sub(crate::config::clock_drift(lease));
        let outcomes = renewed
            .into_iter()
            .zip(not_held)
            .zip(failure)
            .zip(leases)
            .map(|(((mut times, not_held), failure), (site, _))| {
                let needed = self.needed(site.capacity);
                if times.len() >= needed {
                    times.sort_unstable_by(|a, b| b.cmp(a));
                    return Ok(Some(times[needed - 1] + valid));
                }
                if not_held > n - needed {
                    return Ok(None);
                }
                Err(failure.unwrap_or_else(|| {
                    Error::new(
                        ErrorKind::Server,
                        format!("{doing}: too few instances answered"),
                    )
                }))
            })
            .collect();
        (outcomes, trips)
    }

    /// Each call on every instance (one pipelined round trip per instance): the first
    /// instance's answer when every instance answered (for integers, the largest), else the
    /// first error.
    fn batch(&self, calls: &[Routed<'_>], doing: Doing<'_>) -> (Vec<Result<redis::Value>>, u64) {
        let mut combined: Vec<Result<redis::Value>> =
            calls.iter().map(|_| Ok(redis::Value::Nil)).collect();
        let mut trips = 0;
        for (i, instance) in self.instances.iter().enumerate() {
            let (replies, used) = instance.connections.call_batch(calls, doing);
            trips += used;
            for (slot, reply) in combined.iter_mut().zip(replies) {
                *slot = match (std::mem::replace(slot, Ok(redis::Value::Nil)), reply) {
                    (Err(e), _) | (_, Err(e)) => Err(e),
                    (Ok(redis::Value::Int(a)), Ok(redis::Value::Int(b))) => {
                        Ok(redis::Value::Int(a.max(b)))
                    }
                    (Ok(_), Ok(value)) if i == 0 => Ok(value),
                    (Ok(value), Ok(_)) => Ok(value),
                };
            }
        }
        (combined, trips)
    }

    /// The instances belong to their own clients: nothing to stop here.
    fn shutdown(&self, _wait: bool) {}
}

#[cfg(test)]
mod tests {
    use super::{needed_of, release_outcome, ReleaseOutcome};

    #[test]
    fn a_lock_that_several_may_hold_needs_more_instances() {
        // (instances, capacity) -> instances needed
        let cases = [
            ((3, 1), 2),
            ((5, 1), 3),
            ((4, 1), 3),
            ((3, 2), 3),
            ((5, 2), 4),
            ((5, 4), 5),
            ((7, 2), 5),
            ((1, 9), 1),
            ((5, u32::MAX), 5),
        ];
        for ((n, capacity), needed) in cases {
            assert_eq!(
                needed_of(n, capacity),
                needed,
                "{n} instances, {capacity} units"
            );
            // c + 1 holders, each on `needed` instances, cannot fit on n instances of at most
            // c each: (c + 1) · needed > n · c.
            let c = u64::from(capacity.min(1000));
            assert!((c + 1) * needed as u64 > n as u64 * c);
        }
    }

    #[test]
    fn a_release_is_judged_by_the_instances_that_answered() {
        // (released, not ours, of 5 with a quorum of 3)
        let cases = [
            ((5, 0), ReleaseOutcome::Confirmed),
            ((3, 0), ReleaseOutcome::Confirmed),
            // Held on three, one of them killed during the release; two never granted it.
            ((2, 2), ReleaseOutcome::Confirmed),
            ((1, 2), ReleaseOutcome::Confirmed),
            // No majority could have held it.
            ((2, 3), ReleaseOutcome::Lost),
            ((0, 5), ReleaseOutcome::Lost),
            ((1, 3), ReleaseOutcome::Lost),
            // Three instances silent: too few answered to tell.
            ((2, 0), ReleaseOutcome::Unknown),
            ((0, 0), ReleaseOutcome::Unknown),
            ((0, 2), ReleaseOutcome::Unknown),
        ];
        for ((released, not_ours), outcome) in cases {
            assert_eq!(
                release_outcome(released, not_ours, 5, 3),
                outcome,
                "{released} released, {not_ours} not ours"
            );
        }
    }
}
