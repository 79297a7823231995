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
    compose, release_announced, with_fence, ANNOUNCE, ERRORS, HOLDER, MEMBER_CHECK, MEMBER_LEASE,
};
use crate::lease::{AcquireCall, Kind, LeaseGuard, LockContext, PoisonInfo, Protocol, RawLock};

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

crate::lease::scripts::listed! {
    "rw_lock/read_acquire" => READ_ACQUIRE, "rw_lock/read_change_lease" => READ_CHANGE_LEASE,
    "rw_lock/write_acquire" => WRITE_ACQUIRE, "rw_lock/read_release" => READ_RELEASE,
    "rw_lock/write_release" => WRITE_RELEASE, "rw_lock/read_renew" => READ_RENEW,
    "rw_lock/force_release" => FORCE_RELEASE, "rw_lock/withdraw" => WITHDRAW,
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
    fn kind(&self) -> Kind {
        Kind::contending("RwLock")
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
    fn kind(&self) -> Kind {
        Kind::contending("RwLock")
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
        release_announced(&WRITE_RELEASE, keys, token)
    }

    fn force_release(&self, keys: &LockKeys) -> ScriptCall {
        force_release(keys)
    }

    fn wake_channel(&self, keys: &LockKeys, _client_id: &str) -> Arc<str> {
        Arc::clone(&keys.channel)
    }

    fn withdraw(
        &self,
        keys: &LockKeys,
        token: &str,
        _others_wait: bool,
        _hand_over: Option<Duration>,
    ) -> Option<ScriptCall> {
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
            // Read and write holds share keys, not re-entry: a read hold is known apart.
            read: RawLock::new(Arc::clone(&ctx), &READ, name).with_hold_suffix(":read"),
            write: RawLock::new(ctx, &WRITE, name),
        }
    }

    /// This handle, with holds (readers' and writers') leased for `lease` in place of the
    /// client's default lease, and renewed (as [`Mutex::with_lease`](crate::Mutex::with_lease)).
    pub fn with_lease(self, lease: Duration) -> Self {
        RwLock {
            read: self.read.with_renewed_lease(lease),
            write: self.write.with_renewed_lease(lease),
        }
    }

    /// This handle, with a fixed lease for its readers and writers that is not renewed:
    /// each hold ends when its lease runs out unless released or extended before (as
    /// [`Mutex::with_fixed_lease`](crate::Mutex::with_fixed_lease)).
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
    /// let rebuild = client.rwlock("index").with_fixed_lease(Duration::from_secs(60));
    /// if let Some(w) = rebuild.try_write()? {
    ///     // ... at most a minute of work; extend if it needs more ...
    ///     w.extend(Duration::from_secs(60))?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn with_fixed_lease(self, lease: Duration) -> Self {
        RwLock {
            read: self.read.with_fixed_lease(lease),
            write: self.write.with_fixed_lease(lease),
        }
    }

    /// The lock's name.
    pub fn name(&self) -> &str {
        self.read.name()
    }

    crate::primitives::acquire_family::acquire_family! {
        take_read() -> RwLockReadGuard, "a read hold";
        /// Blocks until the calling thread holds a read hold.
        ///
        /// # Errors
        ///
        /// As for [`Mutex::lock`](crate::Mutex::lock).
        fn read, try_read, try_read_for, try_read_until;
    }

    fn take_read(&self, deadline: Option<Instant>) -> Result<Option<RwLockReadGuard>> {
        Ok(self
            .read
            .acquire(deadline)?
            .map(|inner| RwLockReadGuard { inner }))
    }

    crate::primitives::acquire_family::acquire_family! {
        take_write() -> RwLockWriteGuard, "the write hold";
        /// Blocks until the calling thread holds the write hold.
        ///
        /// # Errors
        ///
        /// [`ErrorKind::InvalidArgument`] at once when the calling thread holds a read hold and
        /// not the write hold (an upgrade would wait for itself); otherwise as for
        /// [`Mutex::lock`](crate::Mutex::lock).
        fn write, try_write, try_write_for, try_write_until;
    }

    fn take_write(&self, deadline: Option<Instant>) -> Result<Option<RwLockWriteGuard>> {
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

crate::primitives::guard_traits::lease_guard_methods!(
    RwLockReadGuard,
    "this read hold",
    "client.rwlock(\"index\").read()?"
);

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

    /// The record a writer left when its thread panicked while holding the write hold (its
    /// writes may be half done), as for [`MutexGuard::poison`](crate::MutexGuard::poison).
    /// Readers leave none: they share the lock, and a reader's panic changes nothing.
    ///
    /// # Errors
    ///
    /// Connection and timeout errors.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let index = client.rwlock("index").write()?;
    /// if let Some(poison) = index.poison()? {
    ///     eprintln!("a writer died mid-way: {poison}; rebuilding the index");
    ///     index.clear_poison()?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn poison(&self) -> Result<Option<PoisonInfo>> {
        self.inner.poison()
    }

    /// Removes the poison record of this lock. Returns whether there was one.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LockLost`] when the lease is known to be lost (only the holder may clear
    /// it); connection and timeout errors.
    pub fn clear_poison(&self) -> Result<bool> {
        self.inner.clear_poison()
    }
}

crate::primitives::guard_traits::lease_guard_methods!(
    RwLockWriteGuard,
    "the write hold",
    "client.rwlock(\"index\").write()?"
);

impl crate::Fenced for RwLockWriteGuard {
    fn fencing_token(&self) -> u64 {
        RwLockWriteGuard::fencing_token(self)
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
