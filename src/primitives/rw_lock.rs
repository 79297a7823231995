//! `RwLock`: many readers or one writer, across processes, with writers never starved.
//!
//! Two protocols share one lock's keys: the writer's hold is the lock key (as for a
//! [`Mutex`](crate::Mutex), with a fencing token), and every reader's hold is one entry, with
//! its own lease, in a sorted set scored by when that lease ends. A writer that waits claims
//! the next turn (`P:{N}:writer-waiting`), which keeps new readers out. Scripts are in
//! `rw_lock/`.

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant};

use redis::Script;

use crate::connection::millis;
use crate::connection::ScriptCall;
use crate::error::{Error, ErrorKind, Result};
use crate::keys::{suffix, LockKeys};
use crate::lease::scripts::{
    compose, with_fence, ANNOUNCE, ERRORS, HOLDER, MEMBER_CHECK, MEMBER_LEASE,
};
use crate::lease::{
    AcquireCall, LeaseGuard, LeaseWatch, LockContext, Protocol, RawLock, WaitStyle,
};

/// The helpers the read-write lock's scripts share: see `rw_lock/rw.lua`.
const RW: &str = include_str!("rw_lock/rw.lua");

static READ_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| compose(&[ERRORS, HOLDER, RW, include_str!("rw_lock/read_acquire.lua")]));
static WRITE_ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| with_fence(&[HOLDER, RW, include_str!("rw_lock/write_acquire.lua")].concat()));
static READ_RELEASE: LazyLock<Script> = LazyLock::new(|| {
    compose(&[
        ERRORS,
        HOLDER,
        RW,
        ANNOUNCE,
        include_str!("rw_lock/read_release.lua"),
    ])
});
static READ_RENEW: LazyLock<Script> = LazyLock::new(|| {
    compose(&[
        ERRORS,
        HOLDER,
        MEMBER_LEASE,
        RW,
        include_str!("rw_lock/read_renew.lua"),
    ])
});
static READ_CHANGE_LEASE: LazyLock<Script> = LazyLock::new(|| {
    compose(&[
        ERRORS,
        HOLDER,
        MEMBER_LEASE,
        RW,
        include_str!("rw_lock/read_change_lease.lua"),
    ])
});
static WRITE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| compose(&[ANNOUNCE, include_str!("rw_lock/write_release.lua")]));
static FORCE_RELEASE: LazyLock<Script> =
    LazyLock::new(|| compose(&[ANNOUNCE, include_str!("rw_lock/force_release.lua")]));
static WITHDRAW: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("rw_lock/withdraw.lua")));

/// The scripts of this primitive, for the test that loads every script into Redis.
#[cfg(test)]
pub(crate) fn scripts() -> Vec<(&'static str, &'static Script)> {
    vec![
        ("rw_lock/read_acquire", &*READ_ACQUIRE),
        ("rw_lock/read_change_lease", &*READ_CHANGE_LEASE),
        ("rw_lock/write_acquire", &*WRITE_ACQUIRE),
        ("rw_lock/read_release", &*READ_RELEASE),
        ("rw_lock/write_release", &*WRITE_RELEASE),
        ("rw_lock/read_renew", &*READ_RENEW),
        ("rw_lock/force_release", &*FORCE_RELEASE),
        ("rw_lock/withdraw", &*WITHDRAW),
    ]
}

/// The readers' key and the waiting writer's key of a lock.
fn readers(keys: &LockKeys) -> String {
    keys.beside(suffix::READERS)
}

fn writer_waiting(keys: &LockKeys) -> String {
    keys.beside(suffix::WRITER_WAITING)
}

/// Readers' holds.
struct ReadProtocol;

/// The writer's hold.
struct WriteProtocol;

static READ: ReadProtocol = ReadProtocol;
static WRITE: WriteProtocol = WriteProtocol;

fn force_release(keys: &LockKeys) -> ScriptCall {
    ScriptCall::new(&FORCE_RELEASE)
        .key(&keys.lock)
        .key(readers(keys))
        .key(writer_waiting(keys))
        .key(&keys.waiting)
        .arg(&*keys.channel)
}

impl Protocol for ReadProtocol {
    fn kind(&self) -> &'static str {
        "RwLock"
    }

    fn wait_style(&self) -> WaitStyle {
        WaitStyle::Contend
    }

    fn acquire(&self, call: &AcquireCall<'_>) -> ScriptCall {
        let keys = call.keys;
        ScriptCall::new(&READ_ACQUIRE)
            .key(&keys.lock)
            .key(readers(keys))
            .key(writer_waiting(keys))
            .key(&keys.waiting)
            .arg(call.token)
            .arg(call.lease_ms())
    }

    fn release(&self, keys: &LockKeys, token: &str) -> ScriptCall {
        ScriptCall::new(&READ_RELEASE)
            .key(readers(keys))
            .key(&keys.waiting)
            .arg(token)
            .arg(&*keys.channel)
    }

    fn force_release(&self, keys: &LockKeys) -> ScriptCall {
        force_release(keys)
    }

    fn wake_channel(&self, keys: &LockKeys, _client_id: &str) -> Arc<str> {
        Arc::clone(&keys.channel)
    }

    fn hold_key(&self, keys: &LockKeys) -> String {
        format!("{}:read", keys.lock)
    }

    fn renew(&self, keys: &LockKeys, token: &str, lease: Duration) -> ScriptCall {
        ScriptCall::new(&READ_RENEW)
            .key(readers(keys))
            .arg(token)
            .arg(millis(lease))
    }

    fn check(&self, keys: &LockKeys, token: &str) -> ScriptCall {
        ScriptCall::new(&MEMBER_CHECK).key(readers(keys)).arg(token)
    }

    fn change_lease(&self, keys: &LockKeys, token: &str, by: Duration, how: &str) -> ScriptCall {
        ScriptCall::new(&READ_CHANGE_LEASE)
            .key(readers(keys))
            .arg(token)
            .arg(millis(by))
            .arg(how)
    }
}

impl Protocol for WriteProtocol {
    fn kind(&self) -> &'static str {
        "RwLock"
    }

    fn wait_style(&self) -> WaitStyle {
        WaitStyle::Contend
    }

    fn acquire(&self, call: &AcquireCall<'_>) -> ScriptCall {
        let keys = call.keys;
        ScriptCall::new(&WRITE_ACQUIRE)
            .key(&keys.lock)
            .key(&keys.fence)
            .key(readers(keys))
            .key(writer_waiting(keys))
            .key(&keys.waiting)
            .arg(call.token)
            .arg(call.lease_ms())
            .arg(if call.queue { "claim" } else { "try" })
    }

    fn release(&self, keys: &LockKeys, token: &str) -> ScriptCall {
        ScriptCall::new(&WRITE_RELEASE)
            .key(&keys.lock)
            .key(&keys.waiting)
            .arg(token)
            .arg(&*keys.channel)
    }

    fn force_release(&self, keys: &LockKeys) -> ScriptCall {
        force_release(keys)
    }

    fn wake_channel(&self, keys: &LockKeys, _client_id: &str) -> Arc<str> {
        Arc::clone(&keys.channel)
    }

    fn withdraw(&self, keys: &LockKeys, token: &str, _others_wait: bool) -> Option<ScriptCall> {
        Some(
            ScriptCall::new(&WITHDRAW)
                .key(writer_waiting(keys))
                .arg(token),
        )
    }
}

/// A read-write lock across processes: many readers at once, or one writer.
///
/// # Fairness
///
/// Writers are never starved: a writer that waits claims the next turn, and from then on new
/// readers wait (readers that hold it finish, re-entry included). Among waiters of one kind
/// the order is not guaranteed. A writer that gives up waiting withdraws its claim.
///
/// Every reader's hold has a lease of its own, renewed by its client: a reader that dies
/// stops blocking writers after its lease, whatever the other readers do.
///
/// # Re-entry, downgrade and upgrade
///
/// A thread may take read in read and write in write (as a `Mutex` re-enters). A writer may
/// take read too (a downgrade: it keeps read after releasing write). A reader asking for
/// write gets [`ErrorKind::InvalidArgument`] at once: waiting for itself to leave would never
/// end.
///
/// # Differences from `std::sync::RwLock`
///
/// It guards no data in memory; operations can fail; holds can be lost (leases); readers get
/// no fencing token (they change nothing), the writer does.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> redmutex::Result<()> {
/// let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let config = client.rwlock("config:pricing");
/// {
///     let _r = config.read()?; // any number of processes read at once
/// }
/// let w = config.write()?; // one writer, no readers
/// println!("writing with fencing token {}", w.fencing_token());
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RwLock {
    read: RawLock,
    write: RawLock,
}

impl RwLock {
    pub(crate) fn new(ctx: Arc<LockContext>, name: &str) -> Self {
        RwLock {
            read: RawLock::new(Arc::clone(&ctx), &READ, name),
            write: RawLock::new(ctx, &WRITE, name),
        }
    }

    /// This handle, with a fixed lease for its readers and writers that is not renewed:
    /// each hold ends when its lease runs out unless released or extended before (as
    /// [`Mutex::with_lease`](crate::Mutex::with_lease)).
    ///
    /// A lease of zero, under 1 ms or over [`MAX_LEASE`](crate::MAX_LEASE) is reported by the
    /// first operation as an [`ErrorKind::InvalidArgument`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// use std::time::Duration;
    ///
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let rebuild = client.rwlock("index").with_lease(Duration::from_secs(60));
    /// if let Some(w) = rebuild.try_write()? {
    ///     // ... at most a minute of work; extend if it needs more ...
    ///     w.extend(Duration::from_secs(60))?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn with_lease(self, lease: Duration) -> Self {
        RwLock {
            read: self.read.with_lease(lease),
            write: self.write.with_lease(lease),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.read.name()
    }

    /// Blocks until the calling thread holds a read hold.
    ///
    /// # Errors
    ///
    /// As for [`Mutex::lock`](crate::Mutex::lock).
    pub fn read(&self) -> Result<RwLockReadGuard> {
        self.try_read_until_opt(None)?
            .ok_or_else(|| Error::new(ErrorKind::Timeout, "read() gave up without a deadline"))
    }

    /// One attempt at a read hold.
    ///
    /// # Errors
    ///
    /// As for [`read`](RwLock::read).
    pub fn try_read(&self) -> Result<Option<RwLockReadGuard>> {
        self.try_read_until_opt(Some(Instant::now()))
    }

    /// Waits up to `timeout` for a read hold.
    ///
    /// # Errors
    ///
    /// As for [`read`](RwLock::read).
    pub fn try_read_for(&self, timeout: Duration) -> Result<Option<RwLockReadGuard>> {
        self.try_read_until_opt(Instant::now().checked_add(timeout))
    }

    /// Waits until `deadline` for a read hold.
    ///
    /// # Errors
    ///
    /// As for [`read`](RwLock::read).
    pub fn try_read_until(&self, deadline: Instant) -> Result<Option<RwLockReadGuard>> {
        self.try_read_until_opt(Some(deadline))
    }

    fn try_read_until_opt(&self, deadline: Option<Instant>) -> Result<Option<RwLockReadGuard>> {
        Ok(self
            .read
            .acquire(deadline)?
            .map(|inner| RwLockReadGuard { inner }))
    }

    /// Blocks until the calling thread holds the write hold.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`] at once when the calling thread holds a read hold and
    /// not the write hold (an upgrade would wait for itself); otherwise as for
    /// [`Mutex::lock`](crate::Mutex::lock).
    pub fn write(&self) -> Result<RwLockWriteGuard> {
        self.try_write_until_opt(None)?
            .ok_or_else(|| Error::new(ErrorKind::Timeout, "write() gave up without a deadline"))
    }

    /// One attempt at the write hold.
    ///
    /// # Errors
    ///
    /// As for [`write`](RwLock::write).
    pub fn try_write(&self) -> Result<Option<RwLockWriteGuard>> {
        self.try_write_until_opt(Some(Instant::now()))
    }

    /// Waits up to `timeout` for the write hold.
    ///
    /// # Errors
    ///
    /// As for [`write`](RwLock::write).
    pub fn try_write_for(&self, timeout: Duration) -> Result<Option<RwLockWriteGuard>> {
        self.try_write_until_opt(Instant::now().checked_add(timeout))
    }

    /// Waits until `deadline` for the write hold.
    ///
    /// # Errors
    ///
    /// As for [`write`](RwLock::write).
    pub fn try_write_until(&self, deadline: Instant) -> Result<Option<RwLockWriteGuard>> {
        self.try_write_until_opt(Some(deadline))
    }

    fn try_write_until_opt(&self, deadline: Option<Instant>) -> Result<Option<RwLockWriteGuard>> {
        if self.read.hold_count() > 0 && self.write.hold_count() == 0 {
            return Err(Error::new(
                ErrorKind::InvalidArgument,
                format!(
                    "this thread holds a read hold of {:?}: it cannot take the write hold \
                     (it would wait for itself); release the read hold first",
                    self.name()
                ),
            ));
        }
        Ok(self
            .write
            .acquire(deadline)?
            .map(|inner| RwLockWriteGuard { inner }))
    }

    /// How many read guards of this lock the calling thread holds. Local.
    pub fn read_count(&self) -> usize {
        self.read.hold_count()
    }

    /// How many write guards of this lock the calling thread holds. Local.
    pub fn write_count(&self) -> usize {
        self.write.hold_count()
    }

    /// Removes the writer and every reader, whoever they are, and wakes the waiters. Returns
    /// whether anyone held it. **Dangerous**, as [`Mutex::force_unlock`].
    ///
    /// [`Mutex::force_unlock`]: crate::Mutex::force_unlock
    ///
    /// # Errors
    ///
    /// Connection and timeout errors.
    pub fn force_unlock(&self) -> Result<bool> {
        self.write.force_unlock()
    }
}

impl fmt::Debug for RwLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLock")
            .field("name", &self.name())
            .finish_non_exhaustive()
    }
}

/// A read hold of an [`RwLock`]; released when dropped.
#[must_use = "if unused the read hold is released at once"]
pub struct RwLockReadGuard {
    inner: LeaseGuard,
}

impl RwLockReadGuard {
    /// Asks Redis whether this read hold is still ours; returns the remaining lease. One round trip.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LockLost`](crate::ErrorKind::LockLost) when it is not (the guard then
    /// reports [`is_lost`](Self::is_lost) too); connection and timeout errors.
    pub fn verify(&self) -> Result<Duration> {
        self.inner.verify()
    }

    /// Adds `additional` to the remaining lease of this read hold, if it is still held, as
    /// [`MutexGuard::extend`](crate::MutexGuard::extend). One round trip.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) for a duration under
    /// 1 ms or over [`MAX_LEASE`](crate::MAX_LEASE);
    /// [`ErrorKind::LockLost`](crate::ErrorKind::LockLost) when it is gone (it is never
    /// re-created); connection and timeout errors.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// use std::time::Duration;
    ///
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let r = client.rwlock("index").with_lease(Duration::from_secs(30)).read()?;
    /// // ... the scan takes longer than planned ...
    /// r.extend(Duration::from_secs(30))?;
    /// # Ok(()) }
    /// ```
    pub fn extend(&self, additional: Duration) -> Result<()> {
        self.inner.extend(additional)
    }

    /// Replaces the remaining lease of this read hold with `remaining`, if it is still held, as
    /// [`MutexGuard::set_lease`](crate::MutexGuard::set_lease). One round trip.
    ///
    /// # Errors
    ///
    /// As for [`extend`](Self::extend).
    pub fn set_lease(&self, remaining: Duration) -> Result<()> {
        self.inner.set_lease(remaining)
    }

    /// Whether this reader's lease is known to be lost, without a round trip.
    pub fn is_lost(&self) -> bool {
        self.inner.is_lost()
    }

    /// A handle that tells, from any thread, when the lease is lost.
    pub fn lease_watch(&self) -> LeaseWatch {
        self.inner.lease_watch()
    }

    /// The name of the lock.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Stops renewing and leaves this read hold held in Redis until its lease runs out; returns
    /// how long that is. As
    /// [`MutexGuard::keep_until_expiry`](crate::MutexGuard::keep_until_expiry).
    ///
    /// # Errors
    ///
    /// Connection and timeout errors; the hold is kept whatever Redis answered.
    pub fn keep_until_expiry(self) -> Result<Duration> {
        self.inner.keep_until_expiry()
    }

    /// Releases the read hold now and says how it went.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LockLost`] when the hold had expired; connection and timeout errors.
    pub fn unlock(self) -> Result<()> {
        self.inner.unlock()
    }
}

impl fmt::Debug for RwLockReadGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLockReadGuard")
            .field("name", &self.inner.name())
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

/// The write hold of an [`RwLock`]; released when dropped.
#[must_use = "if unused the write hold is released at once"]
pub struct RwLockWriteGuard {
    inner: LeaseGuard,
}

impl RwLockWriteGuard {
    /// The fencing token of this write hold: greater than that of every earlier write hold
    /// of the lock, as for [`MutexGuard::fencing_token`](crate::MutexGuard::fencing_token).
    pub fn fencing_token(&self) -> u64 {
        self.inner.fencing_token()
    }

    /// Whether the lease is known to be lost, without a round trip.
    pub fn is_lost(&self) -> bool {
        self.inner.is_lost()
    }

    /// A handle that tells, from any thread, when the lease is lost.
    pub fn lease_watch(&self) -> LeaseWatch {
        self.inner.lease_watch()
    }

    /// Asks Redis whether the write hold is still ours; returns the remaining lease.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LockLost`] when it is not; connection and timeout errors.
    pub fn verify(&self) -> Result<Duration> {
        self.inner.verify()
    }

    /// Adds `additional` to the write hold's remaining lease, if it is still held, as
    /// [`MutexGuard::extend`](crate::MutexGuard::extend). One round trip.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`] for a duration under 1 ms or over
    /// [`MAX_LEASE`](crate::MAX_LEASE); [`ErrorKind::LockLost`] when the hold is gone (it is
    /// never re-created); connection and timeout errors.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// use std::time::Duration;
    ///
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let w = client.rwlock("index").with_lease(Duration::from_secs(30)).write()?;
    /// // ... the rebuild takes longer than planned ...
    /// w.extend(Duration::from_secs(30))?;
    /// # Ok(()) }
    /// ```
    pub fn extend(&self, additional: Duration) -> Result<()> {
        self.inner.extend(additional)
    }

    /// Replaces the write hold's remaining lease with `remaining`, if it is still held, as
    /// [`MutexGuard::set_lease`](crate::MutexGuard::set_lease). One round trip.
    ///
    /// # Errors
    ///
    /// As for [`extend`](Self::extend).
    pub fn set_lease(&self, remaining: Duration) -> Result<()> {
        self.inner.set_lease(remaining)
    }

    /// The name of the lock.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// Stops renewing and leaves the write lock held in Redis until its lease runs out; returns
    /// how long that is. As
    /// [`MutexGuard::keep_until_expiry`](crate::MutexGuard::keep_until_expiry).
    ///
    /// # Errors
    ///
    /// Connection and timeout errors; the hold is kept whatever Redis answered.
    pub fn keep_until_expiry(self) -> Result<Duration> {
        self.inner.keep_until_expiry()
    }

    /// Releases the write hold now and says how it went.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LockLost`] when it was lost; connection and timeout errors.
    pub fn unlock(self) -> Result<()> {
        self.inner.unlock()
    }
}

impl fmt::Debug for RwLockWriteGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RwLockWriteGuard")
            .field("name", &self.inner.name())
            .field("fencing_token", &self.fencing_token())
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}

crate::primitives::guard_traits::lease_by_own_methods!(RwLockReadGuard);
crate::primitives::guard_traits::lease_by_own_methods!(fenced RwLockWriteGuard);
