//! The validated settings of a client, and the checks every lease goes through.

use std::time::Duration;

use crate::connection::PoolSettings;
use crate::error::{Error, Result};
use crate::events::Events;

/// The longest lease accepted: 365 days.
pub const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

/// The validated settings of a client.
#[derive(Debug, Clone)]
pub(crate) struct Config {
    pub(crate) pool: PoolSettings,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) default_lease: Duration,
    pub(crate) renewal_interval: Duration,
    pub(crate) key_prefix: String,
    pub(crate) backoff_base: Duration,
    pub(crate) backoff_cap: Duration,
    /// How long a blocking acquire keeps trying through an outage (zero: not at all).
    pub(crate) outage_patience: Duration,
    /// Replicas that must acknowledge an acquire, and how long to wait for them.
    pub(crate) replica_acks: Option<(u32, Duration)>,
    /// The name this client announces (see `identity`).
    pub(crate) client_name: String,
    /// Who hears of the client's events.
    pub(crate) events: Events,
}

/// Checks a lease: at least 1 ms, at most [`MAX_LEASE`].
pub(crate) fn validate_lease(lease: Duration) -> Result<()> {
    if lease < Duration::from_millis(1) {
        return Err(Error::invalid_argument(format!(
            "lease must be at least 1 ms, got {lease:?}"
        )));
    }
    if lease > MAX_LEASE {
        return Err(Error::invalid_argument(format!(
            "lease must be at most {MAX_LEASE:?}, got {lease:?}"
        )));
    }
    Ok(())
}

/// A duration in whole milliseconds, as scripts take it.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
