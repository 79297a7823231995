//! `MultiLock`: several named locks held together, all or none.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, ErrorKind, Result};
use crate::lease::LockContext;
use crate::primitives::{Mutex, MutexGuard};

/// Several [`Mutex`]es held together: every one of them or none.
///
/// The locks are the `Mutex`es of the same names (a multi-lock excludes a `Mutex` of each of
/// its names, and the other way round). They are always taken in one order, the same in every
/// process (sorted by key), so two multi-locks over overlapping names can never wait for each
/// other in a circle; when one cannot be had by the deadline, or fails, those taken already
/// are given back before the call returns.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> redmutex::Result<()> {
/// let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let transfer = client.multi_lock(["account:17", "account:42"])?;
/// let guard = transfer.lock()?; // both accounts, or an error and neither
/// // ... move the money ...
/// guard.unlock()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MultiLock {
    /// In the order they are taken.
    locks: Vec<Mutex>,
}

impl MultiLock {
    pub(crate) fn new<I>(ctx: &Arc<LockContext>, names: I) -> Result<Self>
    where
        I: IntoIterator,
        I::Item: AsRef<str>,
    {
        let mut names: Vec<String> = names.into_iter().map(|n| n.as_ref().to_owned()).collect();
        if names.is_empty() {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                "a multi-lock needs at least one name",
            ));
        }
        names.sort();
        if let Some(twice) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!("the name {:?} is given twice", twice[0]),
            ));
        }
        Ok(MultiLock {
            locks: names
                .iter()
                .map(|n| Mutex::new(Arc::clone(ctx), n))
                .collect(),
        })
    }

    /// The names, in the order they are taken.
    pub fn names(&self) -> Vec<&str> {
        self.locks.iter().map(Mutex::name).collect()
    }

    /// Blocks until every lock is held.
    ///
    /// # Errors
    ///
    /// As for [`Mutex::lock`]; then none of the locks is held.
    pub fn lock(&self) -> Result<MultiLockGuard> {
        self.take(None)?
            .ok_or_else(|| Error::new(ErrorKind::Timeout, "lock() gave up without a deadline"))
    }

    /// One attempt at each lock in turn: all of them, or `None` and none.
    ///
    /// # Errors
    ///
    /// As for [`lock`](MultiLock::lock).
    pub fn try_lock(&self) -> Result<Option<MultiLockGuard>> {
        self.take(Some(Instant::now()))
    }

    /// Waits up to `timeout` for all the locks.
    ///
    /// # Errors
    ///
    /// As for [`lock`](MultiLock::lock).
    pub fn try_lock_for(&self, timeout: Duration) -> Result<Option<MultiLockGuard>> {
        self.take(Instant::now().checked_add(timeout))
    }

    /// Waits until `deadline` for all the locks.
    ///
    /// # Errors
    ///
    /// As for [`lock`](MultiLock::lock).
    pub fn try_lock_until(&self, deadline: Instant) -> Result<Option<MultiLockGuard>> {
        self.take(Some(deadline))
    }

    fn take(&self, deadline: Option<Instant>) -> Result<Option<MultiLockGuard>> {
        let mut guards = Vec::with_capacity(self.locks.len());
        for lock in &self.locks {
            let taken = match deadline {
                None => lock.lock().map(Some),
                Some(d) => lock.try_lock_until(d),
            };
            match taken {
                Ok(Some(guard)) => guards.push(guard),
                // Not all to be had: give back what was taken (on drop, in reverse order).
                Ok(None) => return Ok(None),
                Err(e) => return Err(e),
            }
        }
        Ok(Some(MultiLockGuard { guards }))
    }
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLock")
            .field("names", &self.names())
            .finish_non_exhaustive()
    }
}

/// Every lock of a [`MultiLock`], held; all are released when it is dropped.
#[must_use = "if unused the locks are released at once"]
pub struct MultiLockGuard {
    guards: Vec<MutexGuard>,
}

impl MultiLockGuard {
    /// Whether the lease of any of the locks is known to be lost, without a round trip.
    pub fn is_lost(&self) -> bool {
        self.guards.iter().any(MutexGuard::is_lost)
    }

    /// The guard of each lock, in the order they were taken (fencing tokens, lease
    /// watches).
    pub fn guards(&self) -> &[MutexGuard] {
        &self.guards
    }

    /// Releases every lock now. Every one is released even when one fails.
    ///
    /// # Errors
    ///
    /// The first error, as for [`MutexGuard::unlock`].
    pub fn unlock(self) -> Result<()> {
        let mut first = None;
        for guard in self.guards.into_iter().rev() {
            if let Err(e) = guard.unlock() {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }
}

impl fmt::Debug for MultiLockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.guards.iter().map(MutexGuard::name).collect();
        f.debug_struct("MultiLockGuard")
            .field("names", &names)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}
