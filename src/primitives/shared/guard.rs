//! `SharedGuard<T>`: the value of a held [`Shared`](crate::Shared), written back with the
//! release.

use std::fmt;
use std::ops::{Deref, DerefMut};
use std::time::Duration;

use serde::Serialize;

use super::{commit_call, Codec};
use crate::error::Result;
use crate::lease::{LeaseGuard, LeaseWatch, PoisonInfo, ReleaseWith};

/// The value of a held [`Shared`](crate::Shared): derefs to `T`. Dropping it writes the value
/// back, when it changed, and releases the lock, in one round trip; a write whose lease was
/// lost is refused (and logged), never applied over a newer holder's.
///
/// A failed release in `drop` is logged with `log::warn!` and never panics; call
/// [`unlock`](SharedGuard::unlock) to see the error instead. A thread that panics while
/// holding the guard writes nothing and leaves a poison record, as a
/// [`MutexGuard`](crate::MutexGuard) does. Not `Send`.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> redmutex::Result<()> {
/// let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let counter = client.shared::<u64>("visits");
/// let mut visits = counter.lock()?;
/// *visits += 1;
/// visits.unlock()?; // written and released; `LockLost` if the lease had run out
/// # Ok(()) }
/// ```
#[must_use = "if unused the lock is released at once"]
pub struct SharedGuard<T: Serialize> {
    /// `None` once released by `unlock`.
    inner: Option<LeaseGuard>,
    value: T,
    /// The bytes in Redis as this holder knows them (read with the lock, or last written).
    stored: Option<Vec<u8>>,
    /// Set by `DerefMut`: the value may differ from `stored`.
    touched: bool,
    /// How many writes this holder made (commits).
    writes: u32,
    codec: Codec,
}

impl<T: Serialize> SharedGuard<T> {
    pub(crate) fn new(inner: LeaseGuard, value: T, stored: Option<Vec<u8>>, codec: Codec) -> Self {
        SharedGuard {
            inner: Some(inner),
            value,
            stored,
            touched: false,
            writes: 0,
            codec,
        }
    }

    /// The version of this holder's next write (see [`version`](super::version)).
    fn next_version(&mut self, fencing_token: u64) -> String {
        self.writes = self.writes.saturating_add(1);
        super::version(fencing_token, self.writes)
    }

    /// Has `lease`'s release write `bytes` (empty: remove the value) as this holder's next
    /// write; `None`: release without writing.
    fn release_writing(&mut self, lease: &mut LeaseGuard, bytes: Option<Vec<u8>>) {
        let with = bytes.map(|bytes| {
            let version = self.next_version(lease.fencing_token());
            let with: ReleaseWith =
                Box::new(move |keys, token| super::release_with(keys, token, &version, &bytes));
            with
        });
        lease.set_release_value(with);
    }

    fn lease(&self) -> Option<&LeaseGuard> {
        self.inner.as_ref()
    }

    /// The fencing token of this acquisition; see
    /// [`MutexGuard::fencing_token`](crate::MutexGuard::fencing_token).
    pub fn fencing_token(&self) -> u64 {
        self.lease().map_or(0, LeaseGuard::fencing_token)
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.lease().map_or("", LeaseGuard::name)
    }

    /// Whether the lease is known to be lost, without a round trip; then the value will not
    /// be written.
    pub fn is_lost(&self) -> bool {
        self.lease().is_none_or(LeaseGuard::is_lost)
    }

    /// How long the lease surely still runs, by this machine's clock, without a round trip;
    /// zero once lost. See [`MutexGuard::validity_left`](crate::MutexGuard::validity_left).
    pub fn validity_left(&self) -> std::time::Duration {
        self.lease()
            .map_or(std::time::Duration::ZERO, LeaseGuard::validity_left)
    }

    /// A handle that tells, from any thread, when the lease is lost; see
    /// [`MutexGuard::lease_watch`](crate::MutexGuard::lease_watch).
    pub fn lease_watch(&self) -> LeaseWatch {
        self.held().lease_watch()
    }

    /// Asks Redis whether the lock is still held by this holder; see
    /// [`MutexGuard::verify`](crate::MutexGuard::verify).
    ///
    /// # Errors
    ///
    /// As for [`MutexGuard::verify`](crate::MutexGuard::verify).
    pub fn verify(&self) -> Result<Duration> {
        self.held().verify()
    }

    /// Adds `additional` to the lock's remaining lease, if it is still held; see
    /// [`MutexGuard::extend`](crate::MutexGuard::extend).
    ///
    /// # Errors
    ///
    /// As for [`MutexGuard::extend`](crate::MutexGuard::extend).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// use std::time::Duration;
    ///
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let stock = client.shared::<u64>("stock:42").with_fixed_lease(Duration::from_secs(5));
    /// let mut left = stock.lock()?;
    /// left.extend(Duration::from_secs(5))?; // the count takes longer than planned
    /// *left -= 1;
    /// left.unlock()?;
    /// # Ok(()) }
    /// ```
    pub fn extend(&self, additional: Duration) -> Result<()> {
        self.held().extend(additional)
    }

    /// Replaces the lock's remaining lease with `remaining`, if it is still held; see
    /// [`MutexGuard::set_lease`](crate::MutexGuard::set_lease).
    ///
    /// # Errors
    ///
    /// As for [`MutexGuard::extend`](crate::MutexGuard::extend).
    pub fn set_lease(&self, remaining: Duration) -> Result<()> {
        self.held().set_lease(remaining)
    }

    /// Writes the value (if it changed), then stops renewing and leaves the lock held in
    /// Redis until its lease runs out; returns how long that is. As
    /// [`MutexGuard::keep_until_expiry`](crate::MutexGuard::keep_until_expiry), for a value
    /// that marks work done (the next holder, after the lease, reads it).
    ///
    /// # Errors
    ///
    /// As [`commit`](SharedGuard::commit): when the value could not be written, the lock is
    /// released (not kept) and the error returned. Otherwise connection and timeout errors of
    /// the look at the lease left; the lock is kept whatever Redis answered.
    pub fn keep_until_expiry(mut self) -> Result<Duration> {
        self.commit()?;
        match self.inner.take() {
            Some(lease) => lease.keep_until_expiry(),
            None => Ok(Duration::ZERO),
        }
    }

    /// The lease guard, which only `unlock`, `remove`, `keep_until_expiry` (all consuming
    /// the guard) and `drop` take away.
    fn held(&self) -> &LeaseGuard {
        match &self.inner {
            Some(lease) => lease,
            None => unreachable!("a SharedGuard's lease is only taken by unlock, remove or drop"),
        }
    }

    /// The record left by a holder that panicked; see
    /// [`MutexGuard::poison`](crate::MutexGuard::poison).
    ///
    /// # Errors
    ///
    /// Connection and timeout errors.
    pub fn poison(&self) -> Result<Option<PoisonInfo>> {
        match self.lease() {
            Some(lease) => lease.poison(),
            None => Ok(None),
        }
    }

    /// Removes the poison record; see
    /// [`MutexGuard::clear_poison`](crate::MutexGuard::clear_poison).
    ///
    /// # Errors
    ///
    /// As for [`MutexGuard::clear_poison`](crate::MutexGuard::clear_poison).
    pub fn clear_poison(&self) -> Result<bool> {
        match self.lease() {
            Some(lease) => lease.clear_poison(),
            None => Ok(false),
        }
    }

    /// Writes the value now, if it changed, and keeps holding the lock: a checkpoint for long
    /// work. Fenced like the release: written only while the lock holds this holder's token.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LockLost`](crate::ErrorKind::LockLost) when the lease was lost (nothing
    /// written); [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) when the
    /// value cannot be encoded or is over [`MAX_VALUE_LEN`](crate::MAX_VALUE_LEN);
    /// connection and timeout errors (the value may or may not have been written).
    pub fn commit(&mut self) -> Result<()> {
        let Some(bytes) = self.changed_bytes()? else {
            return Ok(());
        };
        if let Some(fencing_token) = self.lease().map(LeaseGuard::fencing_token) {
            let version = self.next_version(fencing_token);
            if let Some(lease) = self.lease() {
                lease.run_while_held(
                    "writing the value of",
                    &commit_call(lease.keys(), lease.token(), &version, &bytes),
                )?;
            }
        }
        self.stored = Some(bytes);
        self.touched = false;
        Ok(())
    }

    /// Writes the value (if it changed) and releases the lock now, and says how it went.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LockLost`](crate::ErrorKind::LockLost) when the lease had run out: the
    /// value was not written. [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)
    /// when the value cannot be encoded or is too large: the lock is released without writing.
    /// Connection and timeout errors, as for
    /// [`MutexGuard::unlock`](crate::MutexGuard::unlock).
    pub fn unlock(mut self) -> Result<()> {
        let bytes = self.changed_bytes();
        let Some(mut lease) = self.inner.take() else {
            return Ok(());
        };
        match bytes {
            Ok(bytes) => {
                self.release_writing(&mut lease, bytes);
                lease.unlock()
            }
            Err(e) => {
                drop(lease);
                Err(e)
            }
        }
    }

    /// Removes the value from Redis and releases the lock, in one round trip, fenced like the
    /// release: the next holder finds no value (its handle's default, or
    /// [`ErrorKind::NoValue`](crate::ErrorKind::NoValue)).
    ///
    /// # Errors
    ///
    /// As for [`unlock`](SharedGuard::unlock): `LockLost` when the lease had run out (nothing
    /// removed).
    pub fn remove(mut self) -> Result<()> {
        let Some(mut lease) = self.inner.take() else {
            return Ok(());
        };
        // Empty bytes: the release script removes the value (a stored value is never empty).
        self.release_writing(&mut lease, Some(Vec::new()));
        lease.unlock()
    }

    /// The bytes to write: `None` when the value is as stored.
    pub(super) fn changed_bytes(&self) -> Result<Option<Vec<u8>>> {
        if !self.touched {
            return Ok(None);
        }
        let size_hint = self.stored.as_ref().map_or(0, Vec::len);
        let bytes = self.codec.encode(&self.value, size_hint)?;
        Ok((self.stored.as_deref() != Some(&bytes[..])).then_some(bytes))
    }
}

impl<T: Serialize> Deref for SharedGuard<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: Serialize> DerefMut for SharedGuard<T> {
    fn deref_mut(&mut self) -> &mut T {
        self.touched = true;
        &mut self.value
    }
}

impl<T: Serialize> Drop for SharedGuard<T> {
    fn drop(&mut self) {
        // A panicking thread's lease guard releases without writing and records the panic.
        if self.inner.is_none() || std::thread::panicking() {
            return;
        }
        let bytes = self.changed_bytes();
        if let Some(mut lease) = self.inner.take() {
            match bytes {
                Ok(bytes) => self.release_writing(&mut lease, bytes),
                Err(e) => log::warn!(
                    "redmutex: the value of {:?} is not written: {e}",
                    lease.name()
                ),
            }
        }
    }
}

impl<T: Serialize + fmt::Debug> fmt::Debug for SharedGuard<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SharedGuard")
            .field("name", &self.name())
            .field("value", &self.value)
            .field("fencing_token", &self.fencing_token())
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

impl<T: Serialize> crate::Lease for SharedGuard<T> {
    fn name(&self) -> &str {
        SharedGuard::name(self)
    }
    fn is_lost(&self) -> bool {
        SharedGuard::is_lost(self)
    }
    fn lease_watch(&self) -> LeaseWatch {
        SharedGuard::lease_watch(self)
    }
    fn validity_left(&self) -> Duration {
        SharedGuard::validity_left(self)
    }
    fn verify(&self) -> Result<Duration> {
        SharedGuard::verify(self)
    }
    fn extend(&self, additional: Duration) -> Result<()> {
        SharedGuard::extend(self, additional)
    }
    fn set_lease(&self, remaining: Duration) -> Result<()> {
        SharedGuard::set_lease(self, remaining)
    }
    fn keep_until_expiry(self) -> Result<Duration> {
        SharedGuard::keep_until_expiry(self)
    }
    fn unlock(self) -> Result<()> {
        SharedGuard::unlock(self)
    }
}

impl<T: Serialize> crate::Fenced for SharedGuard<T> {
    fn fencing_token(&self) -> u64 {
        SharedGuard::fencing_token(self)
    }
}
