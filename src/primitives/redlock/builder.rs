//! `RedlockBuilder`: the settings of a Redlock and of the client it makes for each instance.

use std::time::Duration;

use super::Redlock;
use crate::builder::Builder;
use crate::client::Client;
use crate::error::{Error, Result};
use crate::events::EventHandler;
use crate::IntoAddress;

/// Setters that pass a setting on to the client of every instance (the [`Builder`] setter of
/// the same name).
macro_rules! client_settings {
    ($($(#[doc = $doc:literal])* fn $name:ident($($arg:ident: $ty:ty),*);)*) => {$(
        $(#[doc = $doc])*
        pub fn $name(self, $($arg: $ty),*) -> Self {
            self.with_client(|b| b.$name($($arg),*))
        }
    )*};
}

/// The settings of a [`Redlock`]: its leases, renewal, backoff and per-instance timeout, and
/// the connection settings of the client it makes for each instance. Made by
/// [`Redlock::builder`]; every setting starts at the default of [`Client::builder`], and
/// each instance's client gets the same.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
///
/// # fn main() -> redmutex::Result<()> {
/// let redlock = redmutex::Redlock::builder()
///     .default_lease(Duration::from_secs(10))
///     .instance_timeout(Duration::from_millis(20))
///     .connect_timeout(Duration::from_millis(500))
///     .open(["redis://10.0.0.1/", "redis://10.0.0.2/", "redis://10.0.0.3/"])?;
/// let guard = redlock.mutex("ledger").lock()?;
/// println!("valid for at least {:?} more", guard.validity_left());
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
#[must_use = "a builder does nothing until `open` is called"]
pub struct RedlockBuilder {
    client: Builder,
    /// `None`: the lease / 20, at most 50 ms.
    instance_timeout: Option<Duration>,
}

impl RedlockBuilder {
    /// Starts from these client settings, for what this builder does not repeat (TLS
    /// certificates, credentials of the URLs' kind, metrics, pool lifetimes). The settings
    /// set on this builder afterwards apply on top.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let clients = redmutex::Client::builder().max_lifetime(None);
    /// let redlock = redmutex::Redlock::builder()
    ///     .client_settings(clients)
    ///     .open(["redis://a/", "redis://b/", "redis://c/"])?;
    /// # let _ = redlock;
    /// # Ok(()) }
    /// ```
    pub fn client_settings(self, builder: Builder) -> Self {
        RedlockBuilder {
            client: builder,
            ..self
        }
    }

    /// How long each instance may take to answer one call of a round before it counts as
    /// not answering, so that a dead, paused or slow instance cannot eat a lease's validity.
    /// A failed attempt's clean-up runs in the background and costs the caller nothing more.
    ///
    /// Defaults to the lease / 20, at most 50 ms. Must be above zero and below the default
    /// lease.
    pub fn instance_timeout(self, timeout: Duration) -> Self {
        RedlockBuilder {
            instance_timeout: Some(timeout),
            ..self
        }
    }

    client_settings! {
        /// The lease of locks taken without a fixed lease, on every instance (see
        /// [`Builder::default_lease`]). Defaults to 30 seconds.
        fn default_lease(lease: Duration);
        /// How often held leases are renewed on every instance (see
        /// [`Builder::renewal_interval`]). Defaults to a third of the default lease.
        fn renewal_interval(interval: Duration);
        /// The delays between attempts of a contended acquire (see [`Builder::backoff`]).
        /// Defaults to a base of 10 ms and a cap of 500 ms.
        fn backoff(base: Duration, cap: Duration);
        /// How long a blocking `lock()` keeps trying while too few instances answer to make a
        /// majority, once a majority was reached (see [`Builder::outage_patience`]). Defaults
        /// to 20 seconds.
        fn outage_patience(patience: Duration);
        /// How long connecting to one instance may take (see [`Builder::connect_timeout`]).
        /// A round connects within the per-instance timeout whatever this is; this bounds the
        /// calls outside rounds (the announcements, the waiters' subscriptions). Defaults to 5
        /// seconds.
        fn connect_timeout(timeout: Duration);
        /// How long an instance may take to answer a call outside the acquire and release
        /// rounds (`verify`, `extend`, `is_locked`, the poison record; see
        /// [`Builder::response_timeout`]). Defaults to 3 seconds.
        fn response_timeout(timeout: Duration);
        /// The prefix of every key written on the instances (see [`Builder::key_prefix`]).
        fn key_prefix(prefix: impl Into<String>);
        /// The most connections kept to each instance (see [`Builder::pool_size`]).
        fn pool_size(size: u32);
        /// The name announced on every instance (see [`Builder::client_name`]).
        fn client_name(name: impl Into<String>);
        /// Adds an event handler (see [`Builder::event_handler`]): it hears the Redlock's
        /// acquisitions, waits, releases and lost leases (of the primitives' kinds), and the
        /// instances' clients' own clean-ups.
        fn event_handler(handler: impl EventHandler);
    }

    fn with_client(self, change: impl FnOnce(Builder) -> Builder) -> Self {
        RedlockBuilder {
            client: change(self.client),
            ..self
        }
    }

    /// Makes a client per URL with these settings, and the Redlock over them. Connects to
    /// nothing.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::Config`](crate::ErrorKind::Config) when a setting is out of range (as for
    /// [`Builder::open`], and a per-instance timeout of zero or not below the default
    /// lease), a URL cannot be parsed, no URL is given or two reach the same server.
    pub fn open<I>(self, urls: I) -> Result<Redlock>
    where
        I: IntoIterator,
        I::Item: IntoAddress,
    {
        let clients = urls
            .into_iter()
            .map(|url| self.client.clone().open(url))
            .collect::<Result<Vec<Client>>>()?;
        let redlock = Redlock::new(clients)?;
        match self.instance_timeout {
            Some(timeout) => redlock.instance_timeout(timeout),
            None => Ok(redlock),
        }
    }
}

/// The first setting on which two clients disagree, said in words.
pub(super) fn first_conflict(clients: &[Client]) -> Option<Error> {
    let first = clients.first()?;
    clients.iter().skip(1).find_map(|other| {
        let (what, x, y) = first
            .context()
            .config
            .lease_difference(&other.context().config)?;
        Some(Error::config(format!(
            "the clients of a Redlock must agree on the {what}: {} has {x}, {} has {y} \
             (build them from one Builder, or use Redlock::builder)",
            first.connections().describe(),
            other.connections().describe(),
        )))
    })
}
