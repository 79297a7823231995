//! Riding through an outage: the one rule that every loop which tries again after an error
//! follows — a blocking acquire of any kind (over one deployment or a Redlock's majority) and
//! an optimistic update of a shared value.
//!
//! An error that may pass (a refused connection, a time-out, `CLUSTERDOWN`, too few Redlock
//! instances answering) is tried again after a backoff step, for the outage patience since
//! the first such error, never past the caller's deadline; the last try is made when the
//! patience ends. A caller that has never reached its deployment has no outage to ride
//! through: a misconfiguration fails at once.

use std::time::{Duration, Instant};

use crate::config::Config;
use crate::error::Result;
use crate::stats::Counters;
use crate::waiting::Backoff;

/// The outage of one call: since when it has lasted, and its backoff.
pub(crate) struct Outage<'a> {
    /// Whether the deployment was ever reached; if not, nothing is tried again.
    reached: bool,
    patience: Duration,
    base: Duration,
    backoff: Backoff,
    /// The first error of the outage now under way, if one is.
    since: Option<Instant>,
    counters: &'a Counters,
}

impl<'a> Outage<'a> {
    /// The outage rule of a client with `config` (its patience and backoff), counting its
    /// retries in `counters`; `reached`: whether its deployment was ever reached.
    pub(crate) fn new(config: &Config, reached: bool, counters: &'a Counters) -> Self {
        Outage::with(
            reached,
            config.outage_patience,
            (config.backoff_base, config.backoff_cap),
            counters,
        )
    }

    /// The outage rule with these settings (a Redlock's, taken from its clients).
    pub(crate) fn with(
        reached: bool,
        patience: Duration,
        (base, cap): (Duration, Duration),
        counters: &'a Counters,
    ) -> Self {
        Outage {
            reached,
            patience,
            base,
            backoff: Backoff::new(base, cap),
            since: None,
            counters,
        }
    }

    /// After an error that may pass: how long to wait before trying again, or `None` when
    /// the error is final (the deployment was never reached, the patience since the
    /// outage's first error is spent, or `deadline` has come).
    pub(crate) fn retry_after(&mut self, deadline: Option<Instant>) -> Option<Duration> {
        if !self.reached {
            return None;
        }
        let now = Instant::now();
        let since = *self.since.get_or_insert(now);
        let mut until = since
            .checked_add(self.patience)
            .unwrap_or_else(|| now + Duration::from_secs(86_400 * 365));
        if let Some(deadline) = deadline {
            until = until.min(deadline);
        }
        let left = until.saturating_duration_since(now);
        if left.is_zero() {
            return None;
        }
        Counters::add(&self.counters.outage_retries, 1);
        Some(self.backoff.next_delay().max(self.base).min(left))
    }

    /// A try got through: the outage, if one was under way, is over. Used by the optimistic
    /// updates of `Shared<T>` (the `serde` feature).
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    pub(crate) fn over(&mut self) {
        self.since = None;
    }

    /// Runs `again` after each error of `result` that may pass, as long as the rule allows,
    /// and returns the last result: a blocking acquire through an outage.
    pub(crate) fn ride_through<T>(
        mut self,
        deadline: Option<Instant>,
        mut result: Result<T>,
        mut again: impl FnMut() -> Result<T>,
    ) -> Result<T> {
        while let Err(e) = &result {
            if !e.is_transient() {
                break;
            }
            let Some(delay) = self.retry_after(deadline) else {
                break;
            };
            log::debug!("redmutex: {e}; trying again in {delay:?}");
            std::thread::sleep(delay);
            result = again();
        }
        result
    }
}
