//! `MetricsEvents`: the client's events as metrics, through the `metrics` crate's facade
//! (the `metrics` feature). The library never installs a recorder; the application does
//! (Prometheus, StatsD, …). Without one, recording costs a few atomic loads.
//!
//! | metric | type | what |
//! |---|---|---|
//! | `redmutex_acquisitions_total` | counter | locks taken (not re-entries) |
//! | `redmutex_acquire_wait_seconds` | histogram | from the call to the acquisition |
//! | `redmutex_acquire_timeouts_total` | counter | acquires whose deadline passed |
//! | `redmutex_acquire_errors_total` | counter | acquires that failed, by `error` |
//! | `redmutex_hold_seconds` | histogram | from the acquisition to the release |
//! | `redmutex_leases_lost_total` | counter | leases found lost |
//! | `redmutex_waiting_threads` | gauge | threads waiting for a held lock now |
//! | `redmutex_renewal_round_seconds` | histogram | one round of the renewal thread |
//! | `redmutex_renewal_batch_size` | histogram | leases renewed per round |
//! | `redmutex_renewal_round_trips_total` | counter | round trips renewal took |
//! | `redmutex_updates_total` | counter | optimistic updates of a `Shared` value that ended, by `outcome` (`written`, `unchanged`, or the error kind) |
//! | `redmutex_update_conflicts_total` | counter | their tries that found the value changed or locked, and read it again |
//!
//! Every lock metric has a `kind` label (`Mutex`, `FairMutex`, …); a `lock` label with the
//! lock's name only when asked ([`with_lock_names`](MetricsEvents::with_lock_names), or
//! mapped by a function: names are often unbounded, and every value is a time series).

use std::fmt;
use std::sync::Arc;

use ::metrics::{counter, gauge, histogram, Label};

use super::{
    Acquired, EventHandler, Failed, LeaseLost, Released, Renewed, TimedOut, Updated, Waiting,
};

/// A function from a lock's name to its `lock` label (or none).
type NameMap = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// How lock names become labels.
#[derive(Clone)]
enum Names {
    None,
    Raw,
    Mapped(NameMap),
}

/// The client's events as metrics; see the module's table. With the `metrics` feature every
/// client records them unless [`Builder::metrics`](crate::Builder::metrics) says otherwise.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> redmutex::Result<()> {
/// use redmutex::events::MetricsEvents;
///
/// // Label by the part of the name before the first ':' ("orders:42" -> "orders").
/// let metrics = MetricsEvents::new()
///     .with_lock_name_map(|name| name.split(':').next().map(str::to_owned));
/// let client = redmutex::Client::builder()
///     .metrics(Some(metrics))
///     .open("redis://127.0.0.1/")?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct MetricsEvents {
    names: Names,
}

impl Default for MetricsEvents {
    fn default() -> Self {
        MetricsEvents::new()
    }
}

impl fmt::Debug for MetricsEvents {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = match self.names {
            Names::None => "none",
            Names::Raw => "raw",
            Names::Mapped(_) => "mapped",
        };
        f.debug_struct("MetricsEvents")
            .field("lock_names", &names)
            .finish()
    }
}

impl MetricsEvents {
    /// Metrics labelled by the kind of lock only.
    pub fn new() -> Self {
        MetricsEvents { names: Names::None }
    }

    /// Adds the lock's name as the `lock` label (one time series per name: only for a
    /// bounded set of names).
    pub fn with_lock_names(mut self) -> Self {
        self.names = Names::Raw;
        self
    }

    /// Adds a `lock` label made from each name by `map`, or none where it returns `None`.
    pub fn with_lock_name_map(
        mut self,
        map: impl Fn(&str) -> Option<String> + Send + Sync + 'static,
    ) -> Self {
        self.names = Names::Mapped(Arc::new(map));
        self
    }

    fn labels(&self, name: &str, kind: &'static str) -> Vec<Label> {
        let mut labels = vec![Label::new("kind", kind)];
        let lock = match &self.names {
            Names::None => None,
            Names::Raw => Some(name.to_owned()),
            Names::Mapped(map) => map(name),
        };
        if let Some(lock) = lock {
            labels.push(Label::new("lock", lock));
        }
        labels
    }
}

impl EventHandler for MetricsEvents {
    fn acquired(&self, e: &Acquired<'_>) {
        let labels = self.labels(e.name, e.kind);
        counter!("redmutex_acquisitions_total", labels.iter()).increment(1);
        histogram!("redmutex_acquire_wait_seconds", labels.iter()).record(e.waited.as_secs_f64());
    }

    fn released(&self, e: &Released<'_>) {
        let labels = self.labels(e.name, e.kind);
        histogram!("redmutex_hold_seconds", labels.iter()).record(e.held.as_secs_f64());
    }

    fn timed_out(&self, e: &TimedOut<'_>) {
        let labels = self.labels(e.name, e.kind);
        counter!("redmutex_acquire_timeouts_total", labels.iter()).increment(1);
    }

    fn failed(&self, e: &Failed<'_>) {
        let mut labels = self.labels(e.name, e.kind);
        labels.push(Label::new("error", format!("{:?}", e.error)));
        counter!("redmutex_acquire_errors_total", labels.iter()).increment(1);
    }

    fn lease_lost(&self, e: &LeaseLost<'_>) {
        let labels = self.labels(e.name, e.kind);
        counter!("redmutex_leases_lost_total", labels.iter()).increment(1);
    }

    fn renewed(&self, e: &Renewed) {
        histogram!("redmutex_renewal_round_seconds").record(e.took.as_secs_f64());
        histogram!("redmutex_renewal_batch_size").record(e.leases as f64);
        counter!("redmutex_renewal_round_trips_total").increment(e.round_trips);
    }

    fn waiting(&self, e: &Waiting<'_>) {
        let labels = self.labels(e.name, e.kind);
        let threads = gauge!("redmutex_waiting_threads", labels.iter());
        match e.started {
            true => threads.increment(1.0),
            false => threads.decrement(1.0),
        }
    }

    fn updated(&self, e: &Updated<'_>) {
        let mut labels = self.labels(e.name, "Shared");
        let outcome = match (e.error, e.written) {
            (Some(kind), _) => format!("{kind:?}"),
            (None, true) => "written".to_owned(),
            (None, false) => "unchanged".to_owned(),
        };
        counter!("redmutex_update_conflicts_total", labels.iter())
            .increment(u64::from(e.conflicts));
        labels.push(Label::new("outcome", outcome));
        counter!("redmutex_updates_total", labels.iter()).increment(1);
    }
}
