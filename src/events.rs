//! Events for observers: what a client's locks do, as it happens — acquisitions with their
//! wait, releases with their hold time, time-outs, failures, lost leases, renewal rounds and
//! waiting threads. An [`EventHandler`] given to
//! [`Builder::event_handler`](crate::Builder::event_handler) receives them (in the spirit of
//! r2d2's `HandleEvent`); with the `metrics` feature, `MetricsEvents` turns them into
//! metrics through the `metrics` facade.
//!
//! Handlers run on the thread the event happened on (the locking thread, or the renewal
//! thread), so they must be quick and must not block. A client without handlers pays
//! nothing but a branch.

#[cfg(feature = "metrics")]
mod metrics_facade;

use std::sync::Arc;
use std::time::Duration;

use crate::error::ErrorKind;

#[cfg(feature = "metrics")]
pub use metrics_facade::MetricsEvents;

/// A lock taken: by [`Mutex::lock`](crate::Mutex::lock) and every other acquire of every
/// primitive (not re-entries, which take nothing from Redis).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Acquired<'a> {
    /// The lock's name.
    pub name: &'a str,
    /// The primitive: `Mutex`, `FairMutex`, `RwLock` (read or write), `Semaphore`, `Shared`.
    pub kind: &'static str,
    /// From the call to the acquisition.
    pub waited: Duration,
}

/// A lock released by its holder (the outermost guard of a re-entrant hold).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Released<'a> {
    /// The lock's name.
    pub name: &'a str,
    /// The primitive.
    pub kind: &'static str,
    /// From the acquisition to the release.
    pub held: Duration,
    /// Whether the release found the lease lost (the lock was no longer this holder's).
    pub lost: bool,
}

/// An acquire with a deadline that passed without the lock (`try_lock_for`, `try_lock`, …).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct TimedOut<'a> {
    /// The lock's name.
    pub name: &'a str,
    /// The primitive.
    pub kind: &'static str,
    /// How long the caller waited.
    pub waited: Duration,
}

/// An acquire that failed with an error.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Failed<'a> {
    /// The lock's name.
    pub name: &'a str,
    /// The primitive.
    pub kind: &'static str,
    /// What went wrong.
    pub error: ErrorKind,
}

/// A held lock's lease found lost (run out, taken away), by the renewal thread or the guard.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct LeaseLost<'a> {
    /// The lock's name.
    pub name: &'a str,
    /// The primitive.
    pub kind: &'static str,
}

/// One round of the renewal thread.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Renewed {
    /// Leases renewed in this round.
    pub leases: usize,
    /// Round trips the round took (one per batch per server).
    pub round_trips: u64,
    /// How long the round took.
    pub took: Duration,
}

/// A thread starts or stops waiting for a held lock.
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Waiting<'a> {
    /// The lock's name.
    pub name: &'a str,
    /// The primitive.
    pub kind: &'static str,
    /// `true` when the thread starts waiting, `false` when it stops (with or without the
    /// lock).
    pub started: bool,
}

/// An optimistic update of a [`Shared`](crate::Shared) value ended
/// ([`Shared::update`](crate::Shared::update) and its timed forms).
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct Updated<'a> {
    /// The value's name.
    pub name: &'a str,
    /// Tries that found the value changed or locked since they read it, each followed by
    /// another read (and another run of the closure).
    pub conflicts: u32,
    /// Whether a new value was written (not when the closure changed nothing, nor when the
    /// update failed).
    pub written: bool,
    /// How the update failed, if it did ([`ErrorKind::Conflict`] when its deadline passed).
    pub error: Option<ErrorKind>,
    /// From the call to its end.
    pub took: Duration,
}

/// Receives a client's events; every method has a default that does nothing, so a handler
/// implements only what it needs.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> redmutex::Result<()> {
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use redmutex::events::{EventHandler, LeaseLost, TimedOut};
///
/// #[derive(Default)]
/// struct Alarms {
///     lost: AtomicU64,
/// }
///
/// impl EventHandler for Alarms {
///     fn lease_lost(&self, e: &LeaseLost<'_>) {
///         self.lost.fetch_add(1, Ordering::Relaxed);
///         eprintln!("lease of {} lost", e.name);
///     }
///     fn timed_out(&self, e: &TimedOut<'_>) {
///         eprintln!("gave up on {} after {:?}", e.name, e.waited);
///     }
/// }
///
/// let client = redmutex::Client::builder()
///     .event_handler(Alarms::default())
///     .open("redis://127.0.0.1/")?;
/// # Ok(()) }
/// ```
pub trait EventHandler: Send + Sync + 'static {
    /// A lock was taken.
    fn acquired(&self, _event: &Acquired<'_>) {}
    /// A lock was released.
    fn released(&self, _event: &Released<'_>) {}
    /// An acquire's deadline passed.
    fn timed_out(&self, _event: &TimedOut<'_>) {}
    /// An acquire failed.
    fn failed(&self, _event: &Failed<'_>) {}
    /// A lease was lost. Told once per lease, after its holder's
    /// [`LeaseWatch`](crate::LeaseWatch) was woken: the holder learns of a loss first.
    fn lease_lost(&self, _event: &LeaseLost<'_>) {}
    /// The renewal thread finished a round.
    fn renewed(&self, _event: &Renewed) {}
    /// A thread started or stopped waiting.
    fn waiting(&self, _event: &Waiting<'_>) {}
    /// An optimistic update of a [`Shared`](crate::Shared) value ended.
    fn updated(&self, _event: &Updated<'_>) {}
}

/// A shared handler: keep an `Arc` of it to read what it counted while the client tells it
/// of events.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> redmutex::Result<()> {
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use std::sync::Arc;
/// use redmutex::events::{Acquired, EventHandler};
///
/// #[derive(Default)]
/// struct Count(AtomicU64);
///
/// impl EventHandler for Count {
///     fn acquired(&self, _: &Acquired<'_>) {
///         self.0.fetch_add(1, Ordering::Relaxed);
///     }
/// }
///
/// let count = Arc::new(Count::default());
/// let client = redmutex::Client::builder()
///     .event_handler(Arc::clone(&count))
///     .open("redis://127.0.0.1/")?;
/// drop(client.mutex("report").lock()?);
/// println!("{} acquisitions", count.0.load(Ordering::Relaxed));
/// # Ok(()) }
/// ```
impl<T: EventHandler> EventHandler for Arc<T> {
    fn acquired(&self, event: &Acquired<'_>) {
        (**self).acquired(event)
    }
    fn released(&self, event: &Released<'_>) {
        (**self).released(event)
    }
    fn timed_out(&self, event: &TimedOut<'_>) {
        (**self).timed_out(event)
    }
    fn failed(&self, event: &Failed<'_>) {
        (**self).failed(event)
    }
    fn lease_lost(&self, event: &LeaseLost<'_>) {
        (**self).lease_lost(event)
    }
    fn renewed(&self, event: &Renewed) {
        (**self).renewed(event)
    }
    fn waiting(&self, event: &Waiting<'_>) {
        (**self).waiting(event)
    }
    fn updated(&self, event: &Updated<'_>) {
        (**self).updated(event)
    }
}

/// The handlers of one client.
#[derive(Clone, Default)]
pub(crate) struct Events {
    handlers: Vec<Arc<dyn EventHandler>>,
}

impl Events {
    pub(crate) fn add(&mut self, handler: Arc<dyn EventHandler>) {
        self.handlers.push(handler);
    }

    /// Whether anyone listens: when not, events are not even timed.
    #[inline]
    pub(crate) fn on(&self) -> bool {
        !self.handlers.is_empty()
    }

    /// Hands an event to every handler.
    #[inline]
    pub(crate) fn emit(&self, f: impl Fn(&dyn EventHandler)) {
        for handler in &self.handlers {
            f(handler.as_ref());
        }
    }
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events")
            .field("handlers", &self.handlers.len())
            .finish()
    }
}
