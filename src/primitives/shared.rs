//! `Shared<T>`: a value kept in Redis under a lock, read with the acquire and written with the
//! release; and its protocol: a `Mutex`'s, whose acquire also replies with the value and
//! whose release may write it, fenced by the holder's token. Scripts are in `shared/`.

mod codec;
mod guard;
mod optimistic;

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use redis::Script;
use serde::de::DeserializeOwned;
use serde::Serialize;

pub use codec::{Codec, MAX_VALUE_LEN};
pub use guard::SharedGuard;

use crate::connection::ScriptCall;
use crate::error::{Error, ErrorKind, Result};
use crate::keys::LockKeys;
use crate::lease::{AcquireCall, Kind, LockContext, PlainTake, Protocol, RawLock};
use crate::primitives::mutex::{self, taking_locks, then_name_next};

/// Takes the lock and reads the value: see `shared/acquire.lua`.
static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| taking_locks(include_str!("shared/acquire.lua")));

/// Writes the value and releases: see `shared/release.lua`.
static RELEASE_WITH: LazyLock<Script> =
    LazyLock::new(|| then_name_next(include_str!("shared/release.lua")));

/// Writes the value and keeps the lock: see `shared/commit.lua`.
static COMMIT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("shared/commit.lua")));

crate::lease::scripts::listed! {
    "shared/acquire" => ACQUIRE, "shared/release" => RELEASE_WITH, "shared/commit" => COMMIT,
    "shared/update" => optimistic::UPDATE,
}

/// The version of a holder's `n`-th write of the value (from 1): `T.n`, `T` its fencing
/// token. A quorum takes the copy of the largest `(T, n)`: a later holder's, or the same
/// holder's later write. An optimistic update's is the fencing counter it moved, `T`.
pub(crate) fn version(fencing_token: u64, n: u32) -> String {
    // Not `format!`: its machinery, run with cold caches after each wait for Redis, was
    // half a percent of a shared value's lock cycle.
    let (mut token, mut write) = (itoa::Buffer::new(), itoa::Buffer::new());
    let (token, write) = (token.format(fencing_token), write.format(n));
    let mut version = String::with_capacity(token.len() + 1 + write.len());
    version.push_str(token);
    version.push('.');
    version.push_str(write);
    version
}

/// The call that writes `bytes` while the lock holds `token`, keeping it, as `version`.
pub(crate) fn commit_call(keys: &LockKeys, token: &str, version: &str, bytes: &[u8]) -> ScriptCall {
    ScriptCall::carrying(&COMMIT, bytes.len())
        .key(&keys.lock)
        .key(keys.value())
        .key(keys.value_fence())
        .arg(token)
        .arg(bytes)
        .arg(version)
}

/// Releases the lock if it holds `token` and writes `value` under it as `version`, in the
/// same script (empty bytes remove the value): the release of a guard whose value changed.
/// Reply as for a release; nothing is written when the lock did not hold the token.
pub(crate) fn release_with(
    keys: &LockKeys,
    token: &str,
    version: &str,
    value: &[u8],
) -> ScriptCall {
    ScriptCall::carrying(&RELEASE_WITH, value.len())
        .key(&keys.lock)
        .key(&keys.waiting)
        .key(keys.value())
        .key(keys.value_fence())
        .arg(token)
        .arg(&*keys.channel)
        .arg(value)
        .arg(version)
}

/// A `Mutex` that carries a value.
struct SharedProtocol;

static PROTOCOL: SharedProtocol = SharedProtocol;

impl Protocol for SharedProtocol {
    fn kind(&self) -> Kind {
        Kind::contending("Shared")
    }

    fn acquire(&self, call: &AcquireCall<'_>) -> ScriptCall {
        mutex::acquire_call(&ACQUIRE, call)
            .key(call.keys.value())
            .key(call.keys.value_fence())
    }

    /// As a `Mutex`'s: a free lock is taken with plain commands, which also read the value
    /// after the `SET` (no holder writes the value once the lock holds the taker's token, so
    /// what it reads is the latest).
    fn plain_take(&self, call: &AcquireCall<'_>) -> PlainTake {
        mutex::protocol().plain_take(call)
    }

    fn plain_payload<'k>(&self, keys: &'k LockKeys) -> Option<&'k str> {
        Some(keys.value())
    }

    fn release(&self, keys: &LockKeys, token: &str) -> ScriptCall {
        mutex::protocol().release(keys, token)
    }

    fn force_release(&self, keys: &LockKeys) -> ScriptCall {
        mutex::protocol().force_release(keys)
    }

    fn wake_channel(&self, keys: &LockKeys, client_id: &str) -> Arc<str> {
        mutex::protocol().wake_channel(keys, client_id)
    }

    fn wake_filter(&self, client_id: &Arc<str>) -> Option<Arc<str>> {
        mutex::protocol().wake_filter(client_id)
    }

    fn withdraw(
        &self,
        keys: &LockKeys,
        token: &str,
        others_wait: bool,
        hand_over: Option<Duration>,
    ) -> Option<ScriptCall> {
        mutex::protocol().withdraw(keys, token, others_wait, hand_over)
    }
}

/// What a handle does when no value is stored yet.
type Missing<T> = Option<Arc<dyn Fn() -> T + Send + Sync>>;

/// A value of type `T` kept in Redis under a lock: the cross-process `std::sync::Mutex<T>`.
///
/// Get one with [`Client::shared`](crate::Client::shared) (a missing value starts as
/// `T::default()`), [`Client::shared_or`](crate::Client::shared_or) (as a value you give) or
/// [`Client::shared_existing`](crate::Client::shared_existing) (a missing value is an
/// [`ErrorKind::NoValue`] error). Locking returns a [`SharedGuard`] that derefs to the value;
/// dropping the guard writes the value back (when it changed) and releases the lock, in one
/// round trip.
///
/// - **The value comes with the lock.** The acquire replies with the stored value: taking a
///   `Shared<T>` costs the one round trip of a [`Mutex`](crate::Mutex) (and, as a `Mutex`
///   taken before, no script: the value's `GET` follows the plain `SET NX` in the same round
///   trip).
/// - **Only the holder writes.** The release writes the value only while the lock still holds
///   this holder's token, in the same script: a holder whose lease ran out never overwrites
///   the value of a newer holder. Its write is refused, [`SharedGuard::unlock`] returns
///   [`ErrorKind::LockLost`], and `drop` logs it.
/// - **Written only when changed**: a guard never dereferenced mutably, or whose value encodes
///   to the bytes that were read, releases without writing.
/// - **Checkpoints**: [`SharedGuard::commit`] writes the value now, fenced the same way, and
///   keeps holding.
/// - **Keys**: the value lives at `P:{N}:value`, beside the lock `P:{N}` (the lock of a
///   [`Mutex`](crate::Mutex) of the same name, which it excludes), in the same Cluster slot.
///   It has no expiry.
/// - **Encoding**: through serde, as MessagePack by default or JSON ([`Codec`],
///   [`with_codec`](Shared::with_codec)), behind a tag that names the codec. A value over
///   [`MAX_VALUE_LEN`] encoded is refused before it is sent.
///
/// Renewal, lost-lease signals, fencing tokens, timed acquires and poisoning work as for a
/// [`Mutex`](crate::Mutex).
///
/// # Differences from `std::sync::Mutex`
///
/// - The value lives in Redis, not in the handle: every `lock()` reads it, and the guard's
///   drop writes it. Work on the guard's copy; a panic while holding writes nothing.
/// - Not re-entrant: a second `lock()` on a thread that holds the lock (through a `Shared` or
///   a `Mutex` of the same name) is an [`ErrorKind::InvalidArgument`] error at once, where
///   std would deadlock: two guards would be two `&mut` to one value.
/// - Poisoning does not lock you out: the next holder gets the last value written before the
///   panic, and [`SharedGuard::poison`] tells it what happened.
/// - A lease can be lost while the guard lives (a paused process): then the write is
///   refused, and the change is lost, never applied over a newer holder's.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> redmutex::Result<()> {
/// let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let stock = client.shared::<u64>("stock:sku-42");
/// {
///     let mut left = stock.lock()?; // the value comes with the lock
///     if *left > 0 {
///         *left -= 1;
///     }
/// } // written back with the release
/// # Ok(()) }
/// ```
pub struct Shared<T> {
    raw: RawLock,
    codec: Codec,
    missing: Missing<T>,
    _value: PhantomData<fn() -> T>,
}

impl<T> Clone for Shared<T> {
    fn clone(&self) -> Self {
        Shared {
            raw: self.raw.clone(),
            codec: self.codec,
            missing: self.missing.clone(),
            _value: PhantomData,
        }
    }
}

impl<T: Serialize + DeserializeOwned> Shared<T> {
    pub(crate) fn new(ctx: Arc<LockContext>, name: &str, missing: Missing<T>) -> Self {
        Shared {
            raw: RawLock::new(ctx, &PROTOCOL, name),
            codec: Codec::default(),
            missing,
            _value: PhantomData,
        }
    }

    /// A handle whose missing value starts as `T::default()`.
    pub(crate) fn defaulting(ctx: Arc<LockContext>, name: &str) -> Self
    where
        T: Default + 'static,
    {
        Shared::new(ctx, name, Some(Arc::new(T::default)))
    }

    /// A handle whose missing value starts as `initial`.
    pub(crate) fn starting_as(ctx: Arc<LockContext>, name: &str, initial: T) -> Self
    where
        T: Clone + Send + Sync + 'static,
    {
        Shared::new(ctx, name, Some(Arc::new(move || initial.clone())))
    }

    /// This handle, reading and writing the value with `codec`. Every handle of one name must
    /// use the same codec: a value written with another one is an [`ErrorKind::Decode`]
    /// error.
    pub fn with_codec(mut self, codec: Codec) -> Self {
        self.codec = codec;
        self
    }

    /// This handle, with holds leased for `lease` in place of the client's default lease,
    /// and renewed; see [`Mutex::with_lease`](crate::Mutex::with_lease).
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.raw = self.raw.with_renewed_lease(lease);
        self
    }

    /// This handle, taking the lock for a fixed `lease` with no renewal; see
    /// [`Mutex::with_fixed_lease`](crate::Mutex::with_fixed_lease).
    pub fn with_fixed_lease(mut self, lease: Duration) -> Self {
        self.raw = self.raw.with_fixed_lease(lease);
        self
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.raw.name()
    }

    /// The codec of this handle.
    pub fn codec(&self) -> Codec {
        self.codec
    }

    crate::primitives::acquire_family::acquire_family! {
        take() -> SharedGuard<T>, "the lock and its value";
        /// Blocks until the lock is held, and returns the guard of the value.
        ///
        /// # Errors
        ///
        /// As for [`Mutex::lock`](crate::Mutex::lock), and:
        /// - [`ErrorKind::InvalidArgument`] when this thread holds the lock already;
        /// - [`ErrorKind::Decode`] when the stored value does not decode into `T` (or was
        ///   written with another codec), [`ErrorKind::NoValue`] when there is none and the
        ///   handle has no default, [`ErrorKind::WrongType`] when the value's key is not a
        ///   string: the lock is then released at once and nothing is written.
        fn lock, try_lock, try_lock_for, try_lock_until;
    }

    /// Deletes the lock whoever holds it, and wakes the waiters; the value stays. See
    /// [`Mutex::force_unlock`](crate::Mutex::force_unlock) (and its warning).
    ///
    /// # Errors
    ///
    /// As for [`Mutex::force_unlock`](crate::Mutex::force_unlock).
    pub fn force_unlock(&self) -> Result<bool> {
        self.raw.force_unlock()
    }

    fn take(&self, deadline: Option<Instant>) -> Result<Option<SharedGuard<T>>> {
        if self.raw.hold_count() > 0 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "shared value {:?} is locked by this thread already: a second guard would \
                     be a second `&mut` to the value",
                    self.raw.name()
                ),
            ));
        }
        let Some(mut inner) = self.raw.acquire(deadline)? else {
            return Ok(None);
        };
        // On an error below, `inner` is dropped: the lock is released, nothing written.
        let stored = inner.take_payload();
        let value = self.value_of(inner.keys().value(), stored.as_deref())?;
        Ok(Some(SharedGuard::new(inner, value, stored, self.codec)))
    }
}

impl<T> fmt::Debug for Shared<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Shared")
            .field("name", &self.raw.name())
            .field("type", &std::any::type_name::<T>())
            .field("codec", &self.codec)
            .field("fixed_lease", &self.raw.fixed_lease())
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_version_is_the_token_a_dot_and_the_write() {
        assert_eq!(super::version(42, 3), "42.3");
        assert_eq!(
            super::version(u64::MAX, u32::MAX),
            format!("{}.{}", u64::MAX, u32::MAX)
        );
    }
}
