//! The quorum rounds of a Redlock: each sends one call to every instance at once and counts
//! the instances that agree.

use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use redis::Script;

use super::instances::{fan_out, too_few_answered, unexpected};
use super::RedlockCore;
use crate::connection::millis;
use crate::connection::ScriptCall;
use crate::error::{Doing, Error, Result};
use crate::keys::LockKeys;
use crate::lease::scripts::{CHANGE_LEASE, CHECK, MARK_POISONED};
use crate::lease::{AcquireCall, PoisonInfo};
use crate::primitives::mutex;

/// Raises a lock's fencing counter to a Redlock's token: see `raise_fence.lua`.
static RAISE_FENCE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("raise_fence.lua")));

/// Reads or clears a lock's poison record: see `poison_record.lua`.
static POISON_RECORD: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("poison_record.lua")));

/// The remaining lease of a lock, whoever holds it: see `remaining.lua`.
static REMAINING: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("remaining.lua")));

/// The scripts of this module, for the test that loads every script into Redis.
#[cfg(test)]
pub(crate) fn scripts() -> Vec<(&'static str, &'static Script)> {
    vec![
        ("redlock/raise_fence", &*RAISE_FENCE),
        ("redlock/remaining", &*REMAINING),
        ("redlock/poison_record", &*POISON_RECORD),
    ]
}

/// What one acquire round won.
pub(crate) enum Round {
    /// Held on a majority, with the fencing token, until `valid_until` at the latest.
    Acquired {
        fencing_token: u64,
        valid_until: Instant,
    },
    /// Not acquired; try again after at most this long (the shortest lease the holders had
    /// left, or a backoff step when that is unknown).
    Held(Option<Duration>),
}

/// What an instance said to an acquire.
enum Took {
    Yes(u64),
    No(Duration),
    Failed(Error),
}

/// One call per instance, made from the lock's keys there.
fn on_every(keys: &[LockKeys], call: impl Fn(&LockKeys) -> ScriptCall) -> Vec<Option<ScriptCall>> {
    keys.iter().map(|k| Some(call(k))).collect()
}

impl RedlockCore {
    /// The keys of lock `name` on every instance.
    pub(crate) fn keys(&self, name: &str) -> Result<Vec<LockKeys>> {
        self.instances.iter().map(|i| i.keys(name)).collect()
    }

    /// One acquire round: the acquire on every instance; with a majority and validity left,
    /// the fencing counters of that majority raised to the largest token it returned; else
    /// (or if the raise did not reach a majority in time) a release on every instance.
    pub(crate) fn acquire_round(
        &self,
        name: &Arc<str>,
        keys: &[LockKeys],
        token: &str,
        lease: Duration,
    ) -> Result<Round> {
        let doing = Doing::lock("acquiring", name);
        let started = Instant::now();
        let timeout = self.instance_timeout(lease);
        let took = self.take_on_every(keys, token, lease, timeout, doing);
        let valid_until = started + lease.saturating_sub(RedlockCore::drift(lease));
        if let Some(fencing_token) = self.won(name, keys, token, &took, timeout, valid_until) {
            return Ok(Round::Acquired {
                fencing_token,
                valid_until,
            });
        }
        // Not won: whatever was taken is given back by each instance's renewal thread, at
        // once and off the caller's path, on every instance that took it or did not answer.
        for (i, t) in took.iter().enumerate() {
            if !matches!(t, Took::No(_)) {
                self.release_later(i, name, &keys[i], token, lease);
            }
        }
        let failed: Vec<Error> = took
            .iter()
            .filter_map(|t| match t {
                Took::Failed(e) => Some(e.clone()),
                _ => None,
            })
            .collect();
        self.majority_answered(&failed, doing)?;
        let wait = took
            .iter()
            .filter_map(|t| match t {
                Took::No(ms) if !ms.is_zero() => Some(*ms),
                _ => None,
            })
            .min();
        Ok(Round::Held(wait))
    }

    /// The acquire on every instance, and what each said.
    fn take_on_every(
        &self,
        keys: &[LockKeys],
        token: &str,
        lease: Duration,
        timeout: Duration,
        doing: Doing<'_>,
    ) -> Vec<Took> {
        let protocol = mutex::protocol();
        let calls = on_every(keys, |k| {
            protocol.acquire(&AcquireCall {
                keys: k,
                token,
                lease,
                // A failed round names this client among each instance's waiting clients, so
                // that a release there announces itself (Redlock's waiters listen to every
                // announcement, whoever it names).
                queue: true,
                waiter_timeout: lease,
                units: 1,
                capacity: 1,
                more: false,
                after: false,
                overdue: false,
            })
        });
        fan_out(&self.instances, keys, &calls, timeout, doing)
            .into_iter()
            .map(|reply| match reply {
                Some(Ok(value)) => match redis::from_redis_value::<(i64, i64)>(value.clone()) {
                    Ok((1, fence)) => Took::Yes(u64::try_from(fence).unwrap_or(0)),
                    Ok((0, ms)) => Took::No(Duration::from_millis(u64::try_from(ms).unwrap_or(0))),
                    _ => Took::Failed(unexpected(doing, &value)),
                },
                Some(Err(e)) => Took::Failed(e),
                None => Took::Failed(Error::new(crate::ErrorKind::Server, "not sent")),
            })
            .collect()
    }

    /// The fencing token of a round that a majority granted with validity left, once the
    /// counters of that majority are raised to it in time; `None` when the round was not won.
    fn won(
        &self,
        name: &str,
        keys: &[LockKeys],
        token: &str,
        took: &[Took],
        timeout: Duration,
        valid_until: Instant,
    ) -> Option<u64> {
        let taken: Vec<usize> = (0..took.len())
            .filter(|&i| matches!(took[i], Took::Yes(_)))
            .collect();
        if taken.len() < self.quorum || Instant::now() >= valid_until {
            return None;
        }
        let fencing_token = took
            .iter()
            .filter_map(|t| match t {
                Took::Yes(fence) => Some(*fence),
                _ => None,
            })
            .max()
            .unwrap_or(0);
        // Instances whose counter is below the token are raised to it; when a majority is
        // there already (counters in step, as when every instance granted the last
        // acquisitions), no raise is needed.
        let behind: Vec<usize> = taken
            .iter()
            .copied()
            .filter(|&i| matches!(took[i], Took::Yes(f) if f < fencing_token))
            .collect();
        let at_token = taken.len() - behind.len();
        let raised = at_token >= self.quorum
            || at_token + self.raise_fences(name, keys, token, fencing_token, &behind, timeout)
                >= self.quorum;
        (raised && Instant::now() < valid_until).then_some(fencing_token)
    }

    /// Raises the fencing counters on the instances in `behind` to `fencing_token`, while the
    /// lock is held there. Returns how many did it in time.
    fn raise_fences(
        &self,
        name: &str,
        keys: &[LockKeys],
        token: &str,
        fencing_token: u64,
        behind: &[usize],
        timeout: Duration,
    ) -> usize {
        let calls: Vec<Option<ScriptCall>> = keys
            .iter()
            .enumerate()
            .map(|(i, k)| {
                behind.contains(&i).then(|| {
                    ScriptCall::new(&RAISE_FENCE)
                        .key(&k.lock)
                        .key(&k.fence)
                        .arg(token)
                        .arg(fencing_token)
                })
            })
            .collect();
        let doing = Doing::lock("ordering the fencing token of", name);
        let replies = fan_out(&self.instances, keys, &calls, timeout, doing);
        replies
            .iter()
            .filter(|r| matches!(r, Some(Ok(redis::Value::Int(1)))))
            .count()
    }

    /// Has instance `i`'s renewal thread release the lock held with `token` there (a
    /// compare-and-delete), at once and again until it answers or the lease has passed.
    fn release_later(
        &self,
        i: usize,
        name: &Arc<str>,
        keys: &LockKeys,
        token: &str,
        lease: Duration,
    ) {
        let lock_key: Arc<str> = Arc::from(keys.lock.as_str());
        self.instances[i].ctx.clean_up_later(
            &lock_key,
            name,
            mutex::protocol().release(keys, token),
            Instant::now() + lease + self.response_timeout(),
        );
    }

    /// Releases the lock held with `token` on every instance, each within the per-instance
    /// timeout. Returns how many instances released it, how many said it was not (or no
    /// longer) ours, and the first error; an instance whose answer was lost gets a clean-up
    /// from its client's renewal thread.
    pub(crate) fn release_round(
        &self,
        name: &Arc<str>,
        keys: &[LockKeys],
        token: &str,
        lease: Duration,
        doing: Doing<'_>,
    ) -> (usize, usize, Option<Error>) {
        let protocol = mutex::protocol();
        let calls = on_every(keys, |k| protocol.release(k, token));
        let replies = fan_out(
            &self.instances,
            keys,
            &calls,
            self.instance_timeout(lease),
            doing,
        );
        let (mut released, mut not_ours, mut error) = (0, 0, None);
        for (i, reply) in replies.into_iter().enumerate() {
            match reply {
                Some(Ok(redis::Value::Int(1))) => released += 1,
                Some(Ok(_)) => not_ours += 1,
                Some(Err(e)) => {
                    if e.outcome_unknown() {
                        self.release_later(i, name, &keys[i], token, lease);
                    }
                    error.get_or_insert(e);
                }
                None => {}
            }
        }
        (released, not_ours, error)
    }

    /// The longest response timeout of the instances.
    pub(crate) fn response_timeout(&self) -> Duration {
        self.instances
            .iter()
            .map(|i| i.ctx.config.response_timeout)
            .max()
            .unwrap_or(Duration::from_secs(1))
    }

    /// The remaining lease of a hold on the instances that still hold `token`, as a majority
    /// sees it (the majority-th longest), or `None` when fewer than a majority hold it.
    pub(crate) fn check_round(
        &self,
        name: &str,
        keys: &[LockKeys],
        token: &str,
    ) -> Result<Option<Duration>> {
        let doing = Doing::lock("verifying", name);
        let calls = on_every(keys, |k| ScriptCall::new(&CHECK).key(&k.lock).arg(token));
        let replies = self.timed_fan_out(keys, &calls, doing);
        self.majority_ms(replies, doing)
    }

    /// Adds to (`add`) or replaces (`set`) the lease on every instance that holds `token`;
    /// returns the new remaining lease as a majority sees it, or `None` when fewer than a
    /// majority hold it.
    pub(crate) fn change_lease_round(
        &self,
        name: &str,
        keys: &[LockKeys],
        token: &str,
        by: Duration,
        how: &'static str,
    ) -> Result<Option<Duration>> {
        let doing = Doing::lock("extending the lease of", name);
        let calls = on_every(keys, |k| {
            ScriptCall::new(&CHANGE_LEASE)
                .key(&k.lock)
                .arg(token)
                .arg(millis(by))
                .arg(how)
        });
        let replies = self.timed_fan_out(keys, &calls, doing);
        self.majority_ms(replies, doing)
    }

    /// Whether a majority of the instances hold the lock, whoever holds it.
    pub(crate) fn locked_round(&self, name: &str, keys: &[LockKeys]) -> Result<bool> {
        let doing = Doing::lock("checking", name);
        let calls = on_every(keys, |k| ScriptCall::new(&REMAINING).key(&k.lock));
        let replies = self.timed_fan_out(keys, &calls, doing);
        Ok(self.majority_ms(replies, doing)?.is_some())
    }

    /// Deletes the lock on every instance, whoever holds it. Returns whether any instance
    /// had it.
    pub(crate) fn force_round(&self, name: &str, keys: &[LockKeys]) -> Result<bool> {
        let doing = Doing::lock("force-unlocking", name);
        let protocol = mutex::protocol();
        let calls = on_every(keys, |k| protocol.force_release(k));
        let answers = self.answers(self.timed_fan_out(keys, &calls, doing), doing);
        self.majority_answered(&answers.failed, doing)?;
        let any = answers.ints().any(|n| n > 0);
        Ok(any)
    }

    /// Leaves a poison record on every instance that still holds `token` (a thread panicked
    /// while holding it). Best effort: failures are logged.
    pub(crate) fn mark_poisoned_round(&self, name: &str, keys: &[LockKeys], token: &str) {
        let doing = Doing::lock("recording a panic on", name);
        let record = PoisonInfo::here(token).encode();
        let calls = on_every(keys, |k| {
            ScriptCall::new(&MARK_POISONED)
                .key(&k.lock)
                .key(&k.poison)
                .arg(token)
                .arg(&record)
        });
        let replies = self.timed_fan_out(keys, &calls, doing);
        let marked = replies
            .iter()
            .filter(|r| matches!(r, Some(Ok(redis::Value::Int(1)))))
            .count();
        log::warn!(
            "redmutex: a thread panicked while holding Redlock {name:?}; it is released and \
             marked poisoned on {marked} of {} instances",
            self.instances.len()
        );
    }

    /// The poison record of the lock, from the first instance that has one.
    pub(crate) fn poison_round(&self, name: &str, keys: &[LockKeys]) -> Result<Option<PoisonInfo>> {
        let doing = Doing::lock("reading the poison record of", name);
        let answers = self.answers(self.poison_record(keys, "get", doing), doing);
        if let Some(record) = answers
            .values
            .iter()
            .find_map(|v| redis::from_redis_value_ref::<String>(v).ok())
        {
            return Ok(Some(PoisonInfo::decode(&record)));
        }
        self.majority_answered(&answers.failed, doing)?;
        Ok(None)
    }

    /// Removes the poison record on every instance; returns whether any had one.
    pub(crate) fn clear_poison_round(&self, name: &str, keys: &[LockKeys]) -> Result<bool> {
        let doing = Doing::lock("clearing the poison record of", name);
        let answers = self.answers(self.poison_record(keys, "clear", doing), doing);
        if let Some(first) = answers.failed.first() {
            let answered = self.instances.len() - answers.failed.len();
            return Err(too_few_answered(
                answered,
                self.instances.len(),
                doing,
                first,
            ));
        }
        let any = answers.ints().any(|n| n > 0);
        Ok(any)
    }

    fn poison_record(
        &self,
        keys: &[LockKeys],
        how: &str,
        doing: Doing<'_>,
    ) -> Vec<Option<Result<redis::Value>>> {
        let calls = on_every(keys, |k| {
            ScriptCall::new(&POISON_RECORD).key(&k.poison).arg(how)
        });
        self.timed_fan_out(keys, &calls, doing)
    }

    fn timed_fan_out(
        &self,
        keys: &[LockKeys],
        calls: &[Option<ScriptCall>],
        doing: Doing<'_>,
    ) -> Vec<Option<Result<redis::Value>>> {
        fan_out(&self.instances, keys, calls, self.response_timeout(), doing)
    }

    /// From replies in milliseconds (negative: not held): the majority-th longest, `None`
    /// when fewer than a majority are non-negative; an error when too few answered to tell.
    fn majority_ms(
        &self,
        replies: Vec<Option<Result<redis::Value>>>,
        doing: Doing<'_>,
    ) -> Result<Option<Duration>> {
        let answers = self.answers(replies, doing);
        let mut held: Vec<u64> = answers
            .ints()
            .filter_map(|ms| u64::try_from(ms).ok())
            .collect();
        if held.len() >= self.quorum {
            held.sort_unstable_by(|a, b| b.cmp(a));
            return Ok(Some(Duration::from_millis(held[self.quorum - 1])));
        }
        let failed = &answers.failed;
        if !failed.is_empty() && held.len() + failed.len() >= self.quorum {
            // The instances that did not answer could make a majority: no telling.
            let answered = self.instances.len() - failed.len();
            return Err(too_few_answered(
                answered,
                self.instances.len(),
                doing,
                &failed[0],
            ));
        }
        Ok(None)
    }

    /// Splits the replies of a round into values and failures.
    fn answers(&self, replies: Vec<Option<Result<redis::Value>>>, doing: Doing<'_>) -> Answers {
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

    /// Fails when more instances failed than a majority can spare.
    fn majority_answered(&self, failed: &[Error], doing: Doing<'_>) -> Result<()> {
        if failed.len() > self.instances.len() - self.quorum {
            let answered = self.instances.len() - failed.len();
            return Err(too_few_answered(
                answered,
                self.instances.len(),
                doing,
                &failed[0],
            ));
        }
        Ok(())
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
