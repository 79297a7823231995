//! A distributed `Mutex` for threaded (non-async) Rust programs, backed by Redis: a lock
//! taken through a [`Client`] excludes every thread of every process that uses the same Redis
//! and the same name.
//!
//! ```no_run
//! # fn main() -> redmutex::Result<()> {
//! let client = redmutex::Client::open("redis://127.0.0.1/")?;
//! let _g = client.mutex("orders:42").lock()?; // every thread of every process is excluded
//! # Ok(()) }
//! ```
//!
//! It gives what `std::sync::Mutex` gives inside one process — exclusion, a guard that
//! releases on drop, blocking and timed acquires, re-entry on the same thread — and what a
//! network lock needs:
//!
//! - **A lease with automatic renewal.** A lock lives in Redis with an expiry, so a holder
//!   that dies cannot keep it; the client's one renewal thread renews every held lock in
//!   pipelined batches while its guard lives.
//! - **Fencing tokens.** Every acquisition gets a number greater than every earlier one for
//!   that name ([`MutexGuard::fencing_token`]); a resource that remembers the highest token
//!   it accepted can refuse a holder whose lease ran out.
//! - **Knowing when the lease was lost.** [`MutexGuard::is_lost`] answers without a round
//!   trip, [`MutexGuard::verify`] asks Redis, and a [`LeaseWatch`] can be polled or waited on
//!   from any thread. Lost is final: once a lease reads as lost, by Redis or by the client's
//!   clock, every later `is_lost()`, `LeaseWatch` and [`unlock`](MutexGuard::unlock)
//!   ([`ErrorKind::LockLost`]) agree, whatever replies arrive later.
//! - **Speed.** One round trip to take a free lock, one to release it, none to re-enter.
//!
//! Beside [`Mutex`] come [`FairMutex`] (first come, first served), [`RwLock`], [`Semaphore`],
//! [`MultiLock`] (several locks, all or none), [`Shared`] (a value kept under a lock, also
//! updated optimistically) and [`Redlock`], over one server, Redis Sentinel or Redis Cluster.
//!
//! # Common uses
//!
//! **A lock across processes**, with a lease renewed while the guard lives and a start-up
//! check ([`Client::check`]):
//!
//! ```no_run
//! # fn main() -> redmutex::Result<()> {
//! use std::time::Duration;
//!
//! let client = redmutex::Client::builder()
//!     .default_lease(Duration::from_secs(30)) // renewed every 10 s while held
//!     .open("redis://127.0.0.1/")?;
//! client.check()?; // a wrong address, password or database fails here
//! let guard = client.mutex("stock:sku-42").lock()?;
//! println!("fencing token {}", guard.fencing_token());
//! guard.unlock()?; // or drop it; unlock reports a lease that was lost
//! # Ok(()) }
//! ```
//!
//! **Run once across a fleet**: a fixed lease, one attempt, and after the run
//! [`MutexGuard::keep_until_expiry`], which leaves the lock in Redis until its lease ends so
//! that no other instance runs the job in that window:
//!
//! ```no_run
//! # fn main() -> redmutex::Result<()> {
//! use std::time::Duration;
//!
//! let client = redmutex::Client::open("redis://127.0.0.1/")?;
//! let job = client.mutex("nightly-invoices").with_fixed_lease(Duration::from_secs(3600));
//! if let Some(guard) = job.try_lock()? {
//!     // ... run the job ...
//!     let left = guard.keep_until_expiry()?;
//!     println!("no instance runs it again for {left:?}");
//! }
//! # Ok(()) }
//! ```
//!
//! **A shared counter**: [`Client::shared`] gives a `std::sync::Mutex<T>` across processes,
//! whose value comes with the lock and is written back with the release (never by a holder
//! whose lease ran out); [`Shared::get`] and [`Shared::update`] work without the lock:
//!
//! ```no_run
//! # fn main() -> redmutex::Result<()> {
//! let client = redmutex::Client::open("redis://127.0.0.1/")?;
//! let mut id = client.shared::<u64>("next-invoice-id").lock()?;
//! *id += 1;
//! id.unlock()?; // written back with the release
//! # Ok(()) }
//! ```
//!
//! **Waiting with a deadline**: [`Mutex::try_lock_for`] gives `None` when the lock is still
//! held elsewhere when the time is up:
//!
//! ```no_run
//! # fn main() -> redmutex::Result<()> {
//! use std::time::Duration;
//!
//! let client = redmutex::Client::open("redis://127.0.0.1/")?;
//! match client.mutex("nightly-report").try_lock_for(Duration::from_secs(5))? {
//!     Some(_guard) => println!("running it"),
//!     None => println!("another instance held it for 5 s"),
//! }
//! # Ok(()) }
//! ```
//!
//! **Fencing a write**: pass [`MutexGuard::fencing_token`] to the resource, which refuses
//! tokens lower than the highest it accepted. `redmutex::redis` re-exports the `redis` crate
//! for the commands of your own that this takes; its documentation here shows a fenced write.
//!
//! # Deployments and outages
//!
//! [`Client::open`] takes `redis://` (or `rediss://`, TLS), `redis+sentinel://` and
//! `redis+cluster://` URLs; [`Redlock`] spans several independent masters. A client that has
//! never reached its deployment fails a blocking call ([`Mutex::lock`],
//! [`Mutex::try_lock_for`], …) the way [`Client::check`] does: at once when the connection is
//! refused, within the connect timeout when the server is silent, and with
//! [`ErrorKind::Config`] when the sentinels do not know the master name. Once it has reached
//! it, blocking calls ride through restarts and failovers for the
//! [outage patience](Builder::outage_patience) (20 s by default).
//!
//! # The guide
//!
//! The repository's `README.md` is the front page; `docs/guide/` (shipped with the crate)
//! has a chapter per topic:
//!
//! - `primitives.md`: every primitive, the lease, run once, fencing, `Shared<T>` and its
//!   optimistic updates;
//! - `deployments.md`: server versions, Sentinel, Cluster, Redlock, replica
//!   acknowledgements, connections, outages;
//! - `operations.md`: who holds what ([`Client::lock_info`]), the `redmutex` command (the
//!   `cli` feature), metrics (the `metrics` feature) and events, mixed fleets;
//! - `guarantees.md`, `keys.md` (every key in Redis), `tls-and-acl.md`, `performance.md`,
//!   and `examples.md` (the demo, the example programs and the tests).
//!
//! `docs/guarantees.md` lists what is and is not guaranteed and each failure mode,
//! `docs/design.md` how it works, and `docs/performance.md` the measured figures.
//!
//! # Errors
//!
//! Every fallible operation returns [`Error`], whose [`ErrorKind`] tells connection
//! failures, timeouts, invalid arguments, keys of the wrong type, lost locks and refused
//! credentials apart. Nothing panics on bad input or a misbehaving network, and every call
//! has a deadline: the connect timeout and the response timeout of the [`Builder`].

#![warn(missing_docs)]

mod builder;
mod client;
mod config;
mod connection;
mod error;
pub mod events;
mod fast_hash;
mod human_duration;
mod identity;
mod inspect;
mod keys;
mod lease;
mod primitives;
mod stats;
mod token;
mod waiting;

/// The `redis` crate this crate is built on (the same version), for the commands of your own
/// that go with a lock — a fenced write to a resource kept in Redis, say — without adding it
/// to your `Cargo.toml` and keeping the two in step.
///
/// # Examples
///
/// A write accepted only from the holder with the highest fencing token seen (compared as
/// text, so that tokens above 2^53 compare exactly):
///
/// ```no_run
/// use redmutex::redis;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let locks = redmutex::Client::open("redis://127.0.0.1/")?;
/// let mut store = redis::Client::open("redis://127.0.0.1/")?.get_connection()?;
/// let fenced_set = redis::Script::new(
///     r#"
///     local last, token = redis.call('GET', KEYS[1]) or '0', ARGV[1]
///     if #token < #last or (#token == #last and token < last) then return 0 end
///     redis.call('SET', KEYS[1], token)
///     redis.call('SET', KEYS[2], ARGV[2])
///     return 1
///     "#,
/// );
/// let guard = locks.mutex("ledger").lock()?;
/// let accepted: i64 = fenced_set
///     .key("ledger:fence")
///     .key("ledger:balance")
///     .arg(guard.fencing_token())
///     .arg(100)
///     .invoke(&mut store)?;
/// assert_eq!(accepted, 1, "a later holder wrote first: this lease was lost");
/// # Ok(()) }
/// ```
pub use redis;

pub use builder::Builder;
pub use client::Client;
pub use config::MAX_LEASE;
pub use connection::{Address, IntoAddress};
pub use error::{Error, ErrorKind, Result};
pub use inspect::{ClientInfo, HolderInfo, LockInfo};
pub use keys::MAX_NAME_LEN;
pub use lease::{LeaseWatch, PoisonInfo};
#[cfg(feature = "serde")]
pub use primitives::{Codec, Shared, SharedGuard, MAX_VALUE_LEN};
pub use primitives::{Election, Leader, LeaderEvent, Leadership, Observer, MAX_LEADER_VALUE};
pub use primitives::{
    Fair, FairMutex, Fenced, Lease, Lock, LockKind, MultiLock, MultiLockGuard, Mutex, MutexGuard,
    Plain, Redlock, RedlockBuilder, RedlockGuard, RedlockMutex, RwLock, RwLockReadGuard,
    RwLockWriteGuard, Semaphore, SemaphorePermit, MAX_PERMITS,
};
pub use stats::Stats;

/// The README's examples, compiled (not run: they need a Redis) with the doc tests, so that
/// what a new user copies first builds.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

/// The guide's index, compiled with the doc tests as the README is.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/README.md")]
pub struct GuideIndexDoctests;

/// The guide's chapter on the demo, the examples and the tests, compiled with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/examples.md")]
pub struct GuideExamplesDoctests;

/// The guide's chapter on the primitives, compiled with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/primitives.md")]
pub struct GuidePrimitivesDoctests;

/// The guide's chapter on deployments, compiled with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/deployments.md")]
pub struct GuideDeploymentsDoctests;

/// The guide's chapter on operations and the CLI, compiled with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/operations.md")]
pub struct GuideOperationsDoctests;

/// The guide's chapter on guarantees, compiled with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/guarantees.md")]
pub struct GuideGuaranteesDoctests;

/// The guide's chapter on keys in Redis, compiled with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/keys.md")]
pub struct GuideKeysDoctests;

/// The guide's chapter on TLS and ACL, compiled with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/tls-and-acl.md")]
pub struct GuideTlsAndAclDoctests;

/// The guide's chapter on performance, compiled with the doc tests.
#[cfg(doctest)]
#[doc = include_str!("../docs/guide/performance.md")]
pub struct GuidePerformanceDoctests;
