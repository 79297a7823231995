//! A blocking, re-entrant distributed `Mutex` for threaded Rust programs, backed by Redis.
//!
//! ```no_run
//! # fn main() -> redmutex::Result<()> {
//! let client = redmutex::Client::open("redis://127.0.0.1/")?;
//! let _g = client.mutex("orders:42").lock()?; // every thread of every process is excluded
//! # Ok(()) }
//! ```
//!
//! A lock taken through a [`Client`] excludes every thread of every process that uses the
//! same Redis and the same name, with what `std::sync::Mutex` gives inside one process — a
//! guard that releases on drop, blocking and timed acquires, re-entry on the same thread —
//! and what a network lock needs:
//!
//! - **A lease with automatic renewal.** A lock lives in Redis with an expiry, so a holder
//!   that dies cannot keep it forever; the client's one renewal thread renews every held
//!   lock in pipelined batches while its guard lives.
//! - **Fencing tokens.** Every acquisition gets a number greater than every earlier one for
//!   that name ([`MutexGuard::fencing_token`]); a resource that remembers the highest token
//!   it accepted can refuse a holder whose lease ran out.
//! - **Knowing when the lease was lost.** [`MutexGuard::is_lost`] answers without a round
//!   trip, [`MutexGuard::verify`] asks Redis, and a [`LeaseWatch`] can be polled or waited on
//!   from any thread.
//! - **Speed.** One round trip to take a free lock, one to release it, none to re-enter.
//!
//! # Quick tour
//!
//! ```no_run
//! # fn main() -> redmutex::Result<()> {
//! use std::time::Duration;
//!
//! let client = redmutex::Client::builder()
//!     .default_lease(Duration::from_secs(30))
//!     .open("redis://127.0.0.1/")?;
//! let stock = client.mutex("stock:sku-42");
//!
//! {
//!     let guard = stock.lock()?;           // blocks until held
//!     let again = stock.lock()?;           // re-entry: no round trip
//!     assert_eq!(stock.hold_count(), 2);
//!     println!("fencing token {}", guard.fencing_token());
//!     drop(again);
//! }                                        // released here
//!
//! if let Some(guard) = stock.try_lock_for(Duration::from_millis(500))? {
//!     guard.unlock()?;                     // release and see any error
//! }
//!
//! // A fixed lease, without renewal, for work with a known bound.
//! let report = client.mutex("report").with_lease(Duration::from_secs(5));
//! if let Some(_guard) = report.try_lock()? { /* ... */ }
//! # Ok(()) }
//! ```
//!
//! # Keys in Redis
//!
//! For a lock called `N` and the key prefix `P` (default `redmutex`): `P:{N}` holds the
//! holder's token with a PX expiry, `P:{N}:fence` the fencing counter, and releases are
//! announced on the channel `P:{N}:ch`. All keys of one lock share the hash tag `{N}`.
//!
//! # TLS and credentials
//!
//! `rediss://` URLs connect over TLS (the `tls` feature, on by default), checking the
//! server's certificate against the system's trust store, or against a private CA given to
//! `Builder::tls_ca_certificates`; `Builder::tls_client_certificate` presents a client
//! certificate. A user name and password in the URL authenticate every connection (Redis ACL
//! users, or `requirepass`); no password ever appears in `Debug` output, errors or logs.
//!
//! # Errors
//!
//! Every fallible operation returns [`Error`], whose [`ErrorKind`] tells connection
//! failures, timeouts, invalid arguments, keys of the wrong type, lost locks and refused
//! credentials apart. Nothing panics on bad input or a misbehaving network, and every call
//! has a deadline: the connect timeout and the response timeout of the [`Builder`].

#![warn(missing_docs)]

mod client;
mod config;
mod connection;
mod error;
pub mod events;
mod fast_hash;
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

pub use client::{Builder, Client};
pub use config::MAX_LEASE;
pub use connection::{Address, IntoAddress};
pub use error::{Error, ErrorKind, Result};
pub use inspect::{ClientInfo, HolderInfo, LockInfo};
pub use keys::MAX_NAME_LEN;
pub use lease::{LeaseWatch, PoisonInfo};
#[cfg(feature = "serde")]
pub use primitives::{Codec, Shared, SharedGuard, MAX_VALUE_LEN};
pub use primitives::{
    FairMutex, MultiLock, MultiLockGuard, Mutex, MutexGuard, Redlock, RedlockBuilder, RedlockGuard,
    RedlockMutex, RwLock, RwLockReadGuard, RwLockWriteGuard, Semaphore, SemaphorePermit,
    MAX_PERMITS,
};
pub use stats::Stats;

/// The README's examples, compiled (not run: they need a Redis) with the doc tests, so that
/// what a new user copies first builds.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
