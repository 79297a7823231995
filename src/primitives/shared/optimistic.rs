//! Optimistic access to a [`Shared`] value, beside the lock: [`Shared::get`] reads the value
//! without taking the lock; [`Shared::update`] reads it with its version, runs the caller's
//! closure on a copy, and writes the result back only if nobody wrote or took the lock in
//! between (`update.lua`), else reads again and runs the closure again.
//!
//! The version is who wrote the value last (`P:{N}:value-fence`): every holder's write records
//! its own (its fencing token and its count of writes, in the release and commit scripts), and
//! every update records the next fencing token. So an update never overwrites a write it did
//! not read, and a holder's write never goes under an update: while the lock is held, updates
//! wait.

use std::sync::LazyLock;
use std::time::{Duration, Instant};

use redis::Script;
use serde::de::DeserializeOwned;
use serde::Serialize;

use super::Shared;
use crate::connection::ScriptCall;
use crate::error::{Error, ErrorKind, Result};
use crate::events::Updated;
use crate::keys::LockKeys;
use crate::lease::scripts::with_fence;
use crate::lease::ValueAt;
use crate::stats::Counters;
use crate::waiting::{Backoff, Outage};

/// Writes a value if nothing changed since it was read: see `update.lua`.
pub(super) static UPDATE: LazyLock<Script> =
    LazyLock::new(|| with_fence(include_str!("update.lua")));

/// The value as an update read it, in one step: its bytes, its version (who wrote it, empty
/// when nobody did) and whether the lock was held.
struct Snapshot {
    bytes: Option<Vec<u8>>,
    version: String,
    held: bool,
}

/// The least base of the wait after a collision with another write.
const MIN_COLLISION_BASE: Duration = Duration::from_micros(20);

/// How one try of an update ended, when it did not fail.
enum Tried<R> {
    /// What the change returned, and whether a value was written.
    Done(R, bool),
    /// The lock was held: the change did not run.
    Held,
    /// Another write came between the read and the write: nothing written.
    Collided,
}

impl<T: Serialize + DeserializeOwned> Shared<T> {
    /// The value now, read without taking the lock: one round trip, never blocked by a holder.
    /// It is the last value written by a holder's release or [`commit`](super::SharedGuard::commit),
    /// or by an [`update`](Shared::update) — not the changes a holder has not written yet.
    ///
    /// A missing value is `T::default()` (or the handle's initial value); a handle made with
    /// [`Client::shared_existing`](crate::Client::shared_existing) reports it as an
    /// [`ErrorKind::NoValue`] error.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Decode`] when the stored value does not decode into `T`,
    /// [`ErrorKind::NoValue`] as above, [`ErrorKind::WrongType`] when the value's key is not a
    /// string; and the errors of any call to Redis ([`ErrorKind::Connection`],
    /// [`ErrorKind::Timeout`], …).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let catalogue = client.shared::<Vec<String>>("catalogue");
    /// for item in catalogue.get()? {
    ///     println!("{item}");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn get(&self) -> Result<T> {
        let keys = self.raw.keys()?;
        let ctx = &self.raw.ctx;
        ctx.ensure_open()?;
        let key = keys.value();
        let at = ValueAt {
            route: &keys.lock,
            value: key,
            version: keys.value_fence(),
        };
        let bytes = ctx.lessor.read_value(at, self.raw.doing("reading"))?;
        self.value_of(key, bytes.as_deref())
    }

    /// Changes the value without taking the lock: reads it with its version, runs `change` on
    /// it here, and writes the result back in one script round trip only if nobody wrote the
    /// value or took the lock since the read. On such a conflict it starts again: a new read,
    /// and `change` again on the new value, after a random wait (full jitter) of up to the
    /// time the try took, doubling with each conflict up to the client's
    /// [backoff cap](crate::Builder::backoff). While the lock is held, it waits for the holder,
    /// re-checking with the client's backoff. Keeps trying until it succeeds; see
    /// [`update_for`](Shared::update_for) for a bound.
    ///
    /// `change` may run several times, so it must not have other effects; it returns what
    /// the call returns (from its last run). A value it leaves as it was (encoded to the same
    /// bytes) is not written: the call then costs one round trip. A panic in `change` writes
    /// nothing and goes on up.
    ///
    /// Suited to values read far more often than written: reads ([`get`](Shared::get)) never
    /// wait, and updates cost two round trips when they do not collide. Under many writers of
    /// one value, [`lock`](Shared::lock) does better (see docs/guide/primitives.md).
    ///
    /// # Errors
    ///
    /// As for [`get`](Shared::get), and [`ErrorKind::WrongType`] when the fencing counter is
    /// not an integer or the value's version (`P:{N}:value-fence`) not a string. Errors that
    /// may pass (a connection refused, `READONLY` during a failover) are tried again for the
    /// client's [outage patience](crate::Builder::outage_patience) when they cannot have written
    /// anything; an error whose outcome is unknown (a [`Timeout`](ErrorKind::Timeout) of the
    /// write, or its connection dropped) is returned at once: the value may or may not have
    /// been written.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let stock = client.shared::<u64>("stock:sku-42");
    /// // Take one if there is one; `change` says whether it did.
    /// let took = stock.update(|left| {
    ///     if *left == 0 {
    ///         return false; // nothing written
    ///     }
    ///     *left -= 1;
    ///     true
    /// })?;
    /// println!("took one: {took}");
    /// # Ok(()) }
    /// ```
    pub fn update<R>(&self, change: impl FnMut(&mut T) -> R) -> Result<R> {
        self.update_by(None, change)
    }

    /// [`update`](Shared::update), giving up when `timeout` has passed: then an
    /// [`ErrorKind::Conflict`] error, with nothing written.
    ///
    /// # Errors
    ///
    /// As for [`update`](Shared::update), and [`ErrorKind::Conflict`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # use std::time::Duration;
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let visits = client.shared::<u64>("visits");
    /// match visits.update_for(Duration::from_secs(2), |n| *n += 1) {
    ///     Ok(()) => {}
    ///     Err(e) if e.kind() == redmutex::ErrorKind::Conflict => println!("too busy; later"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn update_for<R>(&self, timeout: Duration, change: impl FnMut(&mut T) -> R) -> Result<R> {
        self.update_by(Instant::now().checked_add(timeout), change)
    }

    /// [`update`](Shared::update), giving up at `deadline`: then an [`ErrorKind::Conflict`]
    /// error, with nothing written.
    ///
    /// # Errors
    ///
    /// As for [`update_for`](Shared::update_for).
    pub fn update_until<R>(&self, deadline: Instant, change: impl FnMut(&mut T) -> R) -> Result<R> {
        self.update_by(Some(deadline), change)
    }

    fn update_by<R>(
        &self,
        deadline: Option<Instant>,
        mut change: impl FnMut(&mut T) -> R,
    ) -> Result<R> {
        let started = Instant::now();
        let mut conflicts = 0u32;
        let result = match self.raw.ctx.lessor.one_deployment() {
            Some(_) => self.update_loop(deadline, &mut change, &mut conflicts),
            None => self.update_held(deadline, &mut change),
        };
        let ctx = &self.raw.ctx;
        Counters::add(&ctx.counters.updates, 1);
        Counters::add(&ctx.counters.update_conflicts, u64::from(conflicts));
        ctx.counters.events.emit(|h| {
            h.updated(&Updated {
                name: self.raw.name(),
                conflicts,
                written: matches!(result, Ok((_, true))),
                error: result.as_ref().err().map(Error::kind),
                took: started.elapsed(),
            })
        });
        result.map(|(out, _)| out)
    }

    /// Tries until written, unchanged, or the deadline: what `change` returned, and whether
    /// a value was written.
    fn update_loop<R>(
        &self,
        deadline: Option<Instant>,
        change: &mut impl FnMut(&mut T) -> R,
        conflicts: &mut u32,
    ) -> Result<(R, bool)> {
        let keys = self.raw.keys()?;
        let ctx = &self.raw.ctx;
        let config = &ctx.config;
        let key = keys.value();
        // Waits for a holder, and through outages: the client's backoff. After a collision
        // with another write: up to the time the try took, doubling.
        let mut waits = Backoff::new(config.backoff_base, config.backoff_cap);
        let mut collisions = Backoff::new(config.backoff_base, config.backoff_cap);
        // Errors that may pass keep this update from trying.
        let mut outage = Outage::new(config, ctx.lessor.reached(), &ctx.counters);
        loop {
            ctx.ensure_open()?;
            let try_began = Instant::now();
            let tried = self.try_once(keys, key, change);
            let delay = match tried {
                Ok(Tried::Done(out, written)) => return Ok((out, written)),
                Ok(Tried::Held) => {
                    outage.over();
                    *conflicts = conflicts.saturating_add(1);
                    waits.next_delay()
                }
                Ok(Tried::Collided) => {
                    outage.over();
                    *conflicts = conflicts.saturating_add(1);
                    collisions.next_delay_from(try_began.elapsed().max(MIN_COLLISION_BASE))
                }
                // Nothing was written: try again while the outage may pass.
                Err(e) if e.is_transient() && !e.outcome_unknown() => {
                    match outage.retry_after(deadline) {
                        Some(delay) => delay,
                        None => return Err(e),
                    }
                }
                Err(e) => return Err(e),
            };
            let now = Instant::now();
            let mut delay = delay;
            if let Some(deadline) = deadline {
                if now >= deadline {
                    return Err(Error::new(
                        ErrorKind::Conflict,
                        format!(
                            "updating shared value {:?}: changed or locked by someone else at \
                             each of {conflicts} tries; nothing written",
                            self.raw.name(),
                        ),
                    ));
                }
                delay = delay.min(deadline - now);
            }
            std::thread::sleep(delay);
        }
    }

    /// An update over a Redlock's quorum, which has no one server to compare and set on: the
    /// lock is taken (waiting until `deadline`), `change` runs once on the value, and the
    /// release writes it.
    fn update_held<R>(
        &self,
        deadline: Option<Instant>,
        change: &mut impl FnMut(&mut T) -> R,
    ) -> Result<(R, bool)> {
        let Some(mut guard) = self.take(deadline)? else {
            return Err(Error::new(
                ErrorKind::Conflict,
                format!(
                    "updating shared value {:?}: locked by someone else until the deadline; \
                     nothing written",
                    self.raw.name(),
                ),
            ));
        };
        let out = change(&mut guard);
        let written = guard.changed_bytes()?.is_some();
        guard.unlock()?;
        Ok((out, written))
    }

    /// One try: read the value and its version, run `change` on a copy, and write the result
    /// only if nothing changed since the read.
    fn try_once<R>(
        &self,
        keys: &LockKeys,
        key: &str,
        change: &mut impl FnMut(&mut T) -> R,
    ) -> Result<Tried<R>> {
        let snapshot = self.read_versioned(keys, key)?;
        if snapshot.held {
            return Ok(Tried::Held);
        }
        let mut value = self.value_of(key, snapshot.bytes.as_deref())?;
        // What is stored, as bytes: a missing value is its initial value's.
        let before = match snapshot.bytes {
            Some(bytes) => bytes,
            None => self.codec.encode(&value, 0)?,
        };
        let out = change(&mut value);
        let bytes = self.codec.encode(&value, before.len())?;
        if bytes == before {
            return Ok(Tried::Done(out, false));
        }
        Ok(
            match self.write_if_unchanged(keys, key, &snapshot.version, &bytes)? {
                true => Tried::Done(out, true),
                false => Tried::Collided,
            },
        )
    }

    /// Reads the value, its version (who wrote it) and whether the lock is held, in one step
    /// (`MGET`: the three keys share a slot).
    fn read_versioned(&self, keys: &LockKeys, key: &str) -> Result<Snapshot> {
        let (bytes, version, holder): (Option<Vec<u8>>, Option<String>, Option<Vec<u8>>) = self
            .raw
            .ctx
            .call(&keys.lock, self.raw.doing("reading"), |c| {
                redis::cmd("MGET")
                    .arg(key)
                    .arg(keys.value_fence())
                    .arg(&keys.lock)
                    .query(c)
            })?;
        Ok(Snapshot {
            bytes,
            version: version.unwrap_or_default(),
            held: holder.is_some(),
        })
    }

    /// Writes `bytes` if the lock is free and the version is still `version`: whether it
    /// wrote.
    fn write_if_unchanged(
        &self,
        keys: &LockKeys,
        key: &str,
        version: &str,
        bytes: &[u8],
    ) -> Result<bool> {
        let call = ScriptCall::carrying(&UPDATE, bytes.len())
            .key(&keys.lock)
            .key(&keys.fence)
            .key(key)
            .key(keys.value_fence())
            .arg(version)
            .arg(bytes);
        let doing = self.raw.doing("updating");
        let (written, _): (i64, String) =
            self.raw
                .ctx
                .one_deployment(doing)?
                .call(&keys.lock, doing, |c| call.invoke(c))?;
        Ok(written == 1)
    }

    /// The value stored as `bytes` at `key`, or the handle's initial value when none is.
    pub(super) fn value_of(&self, key: &str, bytes: Option<&[u8]>) -> Result<T> {
        match (bytes, &self.missing) {
            (Some(bytes), _) => self.codec.decode(key, bytes),
            (None, Some(initial)) => Ok(initial()),
            (None, None) => Err(Error::new(
                ErrorKind::NoValue,
                format!("shared value {:?} has no value stored", self.raw.name()),
            )),
        }
    }
}
