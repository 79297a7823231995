//! The validated settings of a client, and the checks every lease goes through.

use std::time::Duration;

use crate::connection::PoolSettings;
use crate::error::{Error, Result};
use crate::events::Events;
use crate::human_duration::Human;

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
    /// Replicas that every write of a lease must reach before the client counts that lease.
    pub(crate) replica_acks: Option<ReplicaAcks>,
    /// The name this client announces (see `identity`).
    pub(crate) client_name: String,
    /// Who hears of the client's events.
    pub(crate) events: Events,
}

/// Replicas that every write of a lease (an acquire, a renewal, an extension) must reach
/// before the client counts the lease it sets (Redis `WAIT`, in the write's round trip).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplicaAcks {
    /// How many replicas at most.
    pub(crate) replicas: u32,
    /// How long a write waits for them.
    pub(crate) timeout: Duration,
    /// Chosen by the user ([`Builder::replica_acks`](crate::Builder::replica_acks)): every
    /// replica asked for that the deployment does not count down, and those attached to the
    /// master now. Otherwise the default of a Sentinel or Cluster client: one replica where
    /// the deployment names one it can promote, none where it names none (and none on one
    /// server, whose replicas nobody promotes).
    pub(crate) chosen: bool,
}

impl ReplicaAcks {
    /// The part of a lease the client counts when replicas acknowledge its writes: the
    /// lease less the drift allowed between the clock of the master that granted it and that
    /// of a replica promoted in its place (which expires its copy by its own clock).
    pub(crate) fn counted(lease: Duration) -> Duration {
        lease.saturating_sub(clock_drift(lease))
    }
}

/// The clock drift allowed over `lease` between two servers, or a server and this machine:
/// 1 % of it and 2 ms (the Redlock paper's allowance).
pub(crate) fn clock_drift(lease: Duration) -> Duration {
    lease / 100 + Duration::from_millis(2)
}

/// Checks a lease: at least 1 ms, at most [`MAX_LEASE`].
pub(crate) fn validate_lease(lease: Duration) -> Result<()> {
    lease_problem(lease).map_or(Ok(()), |problem| {
        Err(Error::invalid_argument(format!("a lease {problem}")))
    })
}

/// What is wrong with a lease, as the end of a sentence ("must be at least 1 ms, got 0 s").
pub(crate) fn lease_problem(lease: Duration) -> Option<String> {
    if lease < Duration::from_millis(1) {
        return Some(format!("must be at least 1 ms, got {}", Human(lease)));
    }
    if lease > MAX_LEASE {
        return Some(format!(
            "must be at most {}, got {}",
            Human(MAX_LEASE),
            Human(lease)
        ));
    }
    None
}

impl Config {
    /// The first setting of leases, keys and waiting on which two configurations differ (a
    /// Redlock's clients must agree on them): its name and both values, in words.
    pub(crate) fn lease_difference(
        &self,
        other: &Config,
    ) -> Option<(&'static str, String, String)> {
        let (a, b) = (self, other);
        let durations = [
            ("default lease", a.default_lease, b.default_lease),
            ("renewal interval", a.renewal_interval, b.renewal_interval),
            ("outage patience", a.outage_patience, b.outage_patience),
        ];
        let prefix = ("key prefix", &a.key_prefix, &b.key_prefix);
        let backoff = (
            "backoff",
            (a.backoff_base, a.backoff_cap),
            (b.backoff_base, b.backoff_cap),
        );
        durations
            .into_iter()
            .find(|(_, x, y)| x != y)
            .map(in_words)
            .or_else(|| (prefix.1 != prefix.2).then(|| in_words(prefix)))
            .or_else(|| (backoff.1 != backoff.2).then(|| in_words(backoff)))
    }
}

/// A setting's name and two values, in words (`Debug`).
fn in_words<T: std::fmt::Debug>(
    (what, x, y): (&'static str, T, T),
) -> (&'static str, String, String) {
    (what, format!("{x:?}"), format!("{y:?}"))
}
