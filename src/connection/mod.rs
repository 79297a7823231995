//! The connection seam: everything that talks to Redis goes through [`Connections`], which
//! asks a [`Deployment`] where a lock's keys live.
//!
//! The layers above ask for three things only:
//! - run a call for a lock on the server that owns its keys ([`Connections::call`]);
//! - run a batch of script calls (renewals, heartbeats, clean-ups) grouped by server, one
//!   pipelined round trip per server ([`Connections::call_batch`]);
//! - open the subscriber connection for a lock's channel
//!   ([`Connections::subscriber_connection`]).
//!
//! A lock is routed by its main key: every key of a lock shares its hash tag, so one route
//! names one server of any deployment. Adding a deployment is one implementation of
//! [`Deployment`].

mod address;
mod cluster;
mod conn;
mod handshake;
mod pool;
mod reply_reader;
mod resp;
mod script_call;
mod sentinel;
mod server_features;
mod split_call;
mod standalone;
#[cfg(feature = "tls")]
mod tls;
mod wire;
mod wiring;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use redis::ConnectionLike;

use crate::error::{Doing, Error, Result, Server};

pub use address::{Address, IntoAddress};
pub(crate) use address::{AddressKind, ClusterAddress, SentinelAddress};
pub(crate) use cluster::{slot_of, Cluster, ClusterSettings};
pub(crate) use conn::{Conn, OnReply};
pub(crate) use pool::{Checkout, Pool, PoolSettings};
pub(crate) use resp::{each_reply, Packed};
use script_call::is_noscript;
pub(crate) use script_call::ScriptCall;
pub(crate) use sentinel::{Sentinel, SentinelSettings};
pub(crate) use server_features::{ServerFeatures, SetNxGet};

/// Makes a redis-rs client for a data node at (host, port), with the data nodes' credentials
/// and TLS, speaking the protocol given.
pub(crate) type NodeClients =
    Box<dyn Fn(&str, u16, redis::ProtocolVersion) -> Result<redis::Client> + Send + Sync>;

/// A duration in whole milliseconds, as scripts and `WAIT` take it.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Where a call that a server redirected goes next.
pub(crate) enum Redirect {
    /// Route it again: the deployment's map changed (`MOVED`).
    Again,
    /// Send it once to this shard, after `ASKING` (`ASK`: a slot being migrated).
    Ask(usize),
    /// Route it again after a short pause (`TRYAGAIN`: the slot's keys are being moved),
    /// within the call's response timeout.
    Wait,
}

/// How many redirections one call follows at most.
const MAX_REDIRECTS: usize = 5;
pub(crate) use standalone::Standalone;
#[cfg(feature = "tls")]
pub(crate) use tls::{ClientCertificate, TlsSettings};
pub(crate) use wiring::{tcp_nodes, Reach, Wiring};

/// One deployment of Redis: which server ("shard") holds a route, and connections to it.
/// A subscriber's connection by `client`: connected within `connect`, each write within
/// `write`; or, with no server to connect to, why (`NotConnected`).
fn subscriber_of(
    client: std::result::Result<&redis::Client, String>,
    connect: Duration,
    write: Duration,
) -> redis::RedisResult<redis::Connection> {
    let client = client.map_err(|why| {
        redis::RedisError::from(std::io::Error::new(std::io::ErrorKind::NotConnected, why))
    })?;
    let conn = client.get_connection_with_timeout(connect)?;
    conn.set_write_timeout(Some(write))?;
    Ok(conn)
}

pub(crate) trait Deployment: Send + Sync {
    /// The shard whose server holds the keys of `route` (a lock's main key).
    fn shard_of(&self, route: &str) -> usize;

    /// A pooled connection to the server of `shard`, within the connect timeout, or within
    /// `by` when that is shorter (a Redlock round's per-instance timeout).
    fn checkout(&self, shard: usize, doing: Doing<'_>, by: Option<Duration>) -> Result<Checkout>;

    /// A new connection for a subscriber of `shard`'s channels, speaking RESP3 (so that
    /// messages and confirmations arrive as push frames), with the response timeout as its
    /// write timeout.
    fn subscriber_connection(&self, shard: usize) -> redis::RedisResult<redis::Connection>;

    /// The server of `shard`, as messages name it.
    fn server(&self, shard: usize) -> Server;

    /// The deployment in a few words, for `Debug` output, without a round trip and without
    /// credentials.
    fn describe(&self) -> String;

    /// Learns of a call to `shard` that failed: a deployment that follows failovers takes a
    /// `READONLY` reply or a dropped connection as a sign that the master moved.
    fn call_failed(&self, _shard: usize, _err: &Error) {}

    /// A number that changes whenever the servers behind the shards change (a failover): the
    /// subscriber connects again when it does.
    fn generation(&self) -> u64 {
        0
    }

    /// Stops what the deployment runs in the background, for good; with `wait`, waits for
    /// it to end.
    fn shutdown(&self, _wait: bool) {}

    /// Reads the map of routes to shards again, when the deployment has one (a Cluster's
    /// slot map); `generation` changes if it changed.
    fn refresh_routes(&self) {}

    /// Learns that fewer replicas acknowledged a write on `shard` than the deployment
    /// counts: a Cluster reads its map again soon (a replica may have failed).
    fn replicas_short(&self, _shard: usize) {}

    /// How many shards there are now (shards are `0..shards()`): one but for a Cluster.
    fn shards(&self) -> usize {
        1
    }

    /// Where a call that failed with `err` goes next, when the server redirected it (a
    /// Cluster's `MOVED` and `ASK`). Called after `call_failed`.
    fn redirect(&self, _err: &Error) -> Option<Redirect> {
        None
    }

    /// Reads the replies that idle pooled connections still carry: see
    /// [`Pool::settle_idle`].
    fn settle_unread(&self);

    /// Whether the deployment ever answered in a way that shows its address is right, short
    /// of a connection to the server that holds a lock: a Cluster node's slot map, a
    /// sentinel naming the master. A server that refuses connections then is an outage (a
    /// failover under way), not a wrong address.
    fn answered(&self) -> bool {
        false
    }
}

/// What the rest of the crate talks to Redis through.
pub(crate) struct Connections {
    deployment: Box<dyn Deployment>,
    /// Whether a connection to the deployment was ever made (its handshake answered): until
    /// then an error is a misconfiguration to report at once, not an outage to ride through.
    reached: AtomicBool,
}

/// One call of a batch: the route of its lock, and the script call.
pub(crate) type Routed<'a> = (&'a str, &'a ScriptCall);

/// How many replicas a batch's writes on a server must reach, and how long its `WAIT` waits
/// for them, asked of a connection to that server (`None`: none).
pub(crate) type AckRule<'a> = &'a dyn Fn(&mut Conn) -> redis::RedisResult<Option<(u32, Duration)>>;

/// A reply in a batch, with how many replicas acknowledged the batch of how many were asked
/// (`None` when none were).
pub(crate) type Acked = (redis::Value, Option<(i64, u32)>);

/// One server's replies to a batch, with how many replicas acknowledged it of how many were
/// asked.
type BatchReplies = (Vec<redis::Value>, Option<(i64, u32)>);

impl Connections {
    pub(crate) fn new(deployment: impl Deployment + 'static) -> Self {
        Connections {
            deployment: Box::new(deployment),
            reached: AtomicBool::new(false),
        }
    }

    /// Whether this client ever reached its deployment: made a connection whose handshake
    /// (`AUTH`, `SELECT`, a `PING`) was answered, or had the deployment say where its
    /// servers are (see [`Deployment::answered`]). A blocking call rides through an outage
    /// only after that; before, it fails as `Client::check` does.
    pub(crate) fn reached(&self) -> bool {
        self.reached.load(Ordering::Relaxed) || self.deployment.answered()
    }

    /// Runs one call for the lock routed by `route`, on the server that owns it, following a
    /// few redirections (`MOVED`, `ASK`: the call was not run, so it is sent again), without
    /// ever sleeping.
    #[inline]
    pub(crate) fn call<T>(
        &self,
        route: &str,
        doing: Doing<'_>,
        f: impl Fn(&mut Conn) -> redis::RedisResult<T>,
    ) -> Result<T> {
        let mut shard = self.deployment.shard_of(route);
        let mut asking = false;
        let mut redirects = 0;
        let mut waits: Option<(Instant, Duration)> = None;
        loop {
            let mut conn = match self.checkout(shard, doing) {
                Ok(conn) => conn,
                Err(e) => {
                    // A server that refuses or does not accept connections: a deployment
                    // that follows failovers looks for its successor.
                    self.deployment.call_failed(shard, &e);
                    return Err(e);
                }
            };
            let result = match asking {
                false => conn.call(doing, &f),
                true => conn.call(doing, |c| {
                    c.ask()?;
                    let result = f(c);
                    c.take_asking();
                    result
                }),
            };
            let Err(e) = &result else {
                return result;
            };
            self.deployment.call_failed(shard, e);
            redirects += 1;
            match self.deployment.redirect(e) {
                Some(Redirect::Again) if redirects <= MAX_REDIRECTS => {
                    shard = self.deployment.shard_of(route);
                    asking = false;
                }
                Some(Redirect::Ask(to)) if redirects <= MAX_REDIRECTS => {
                    shard = to;
                    asking = true;
                }
                Some(Redirect::Wait) => {
                    let timeout = self.deployment.server(shard).response_timeout;
                    let (until, pause) =
                        waits.get_or_insert((Instant::now() + timeout, Duration::from_millis(5)));
                    let now = Instant::now();
                    if now + *pause >= *until {
                        return result;
                    }
                    std::thread::sleep(*pause);
                    *pause = (*pause * 2).min(Duration::from_millis(100));
                    redirects = 0;
                    shard = self.deployment.shard_of(route);
                    asking = false;
                }
                _ => return result,
            }
        }
    }

    /// How many shards (servers holding keys) there are now.
    pub(crate) fn shards(&self) -> usize {
        self.deployment.shards()
    }

    /// Runs one call on the server of `shard` (a command about the server, not about one
    /// lock: `SCAN`), without redirections.
    pub(crate) fn call_shard<T>(
        &self,
        shard: usize,
        doing: Doing<'_>,
        f: impl Fn(&mut Conn) -> redis::RedisResult<T>,
    ) -> Result<T> {
        let result = self
            .checkout(shard, doing)
            .and_then(|mut conn| conn.call(doing, &f));
        if let Err(e) = &result {
            self.deployment.call_failed(shard, e);
        }
        result
    }

    /// Runs script calls grouped by server, one pipelined round trip per server, and returns
    /// one outcome per call, in order: Redis's reply (an error reply is a value too), or the
    /// error that kept its server's batch from being answered. Every call must be safe to
    /// run twice: a batch is sent once more after its connection dropped, and after loading
    /// the scripts that Redis reported missing (`NOSCRIPT`, after a restart or
    /// `SCRIPT FLUSH`). Also returns the number of round trips it took.
    pub(crate) fn call_batch(
        &self,
        calls: &[Routed<'_>],
        doing: Doing<'_>,
    ) -> (Vec<Result<redis::Value>>, u64) {
        let (outcomes, trips) = self.call_batch_acked(calls, doing, None);
        (
            outcomes.into_iter().map(|o| o.map(|(v, _)| v)).collect(),
            trips,
        )
    }

    /// Like [`call_batch`](Self::call_batch), with `WAIT` at the end of each server's
    /// pipeline for as many replicas as `acks` says for that server's connection (none
    /// without a rule): each reply comes with how many replicas acknowledged its batch, of
    /// how many were asked (`None` when none were).
    pub(crate) fn call_batch_acked(
        &self,
        calls: &[Routed<'_>],
        doing: Doing<'_>,
        acks: Option<AckRule<'_>>,
    ) -> (Vec<Result<Acked>>, u64) {
        let (mut outcomes, mut trips) = self.call_batch_once(calls, doing, acks);
        // Calls that a server redirected (`MOVED`: the deployment has read its map again, in
        // `call_failed`) did not run: send them once more, routed afresh.
        let moved: Vec<usize> = outcomes
            .iter()
            .enumerate()
            .filter(
                |(_, o)| matches!(o, Ok((redis::Value::ServerError(e), _)) if e.code() == "MOVED"),
            )
            .map(|(i, _)| i)
            .collect();
        if !moved.is_empty() {
            let again: Vec<Routed<'_>> = moved.iter().map(|&i| calls[i]).collect();
            let (replies, more) = self.call_batch_once(&again, doing, acks);
            trips += more;
            for (i, reply) in moved.into_iter().zip(replies) {
                outcomes[i] = reply;
            }
        }
        (outcomes, trips)
    }

    fn call_batch_once(
        &self,
        calls: &[Routed<'_>],
        doing: Doing<'_>,
        acks: Option<AckRule<'_>>,
    ) -> (Vec<Result<Acked>>, u64) {
        let mut trips = 0;
        let mut outcomes: Vec<Option<Result<Acked>>> = calls.iter().map(|_| None).collect();
        let mut by_shard: Vec<(usize, Vec<usize>)> = Vec::new();
        for (i, (route, _)) in calls.iter().enumerate() {
            let shard = self.deployment.shard_of(route);
            match by_shard.iter_mut().find(|(s, _)| *s == shard) {
                Some((_, members)) => members.push(i),
                None => by_shard.push((shard, vec![i])),
            }
        }
        for (shard, members) in by_shard {
            let batch: Vec<&ScriptCall> = members.iter().map(|&i| calls[i].1).collect();
            match self.send_batch(shard, &batch, doing, acks, &mut trips) {
                Ok((replies, acked)) => {
                    for (i, reply) in members.into_iter().zip(replies) {
                        outcomes[i] = Some(Ok((reply, acked)));
                    }
                }
                Err(e) => {
                    for i in members {
                        outcomes[i] = Some(Err(e.clone()));
                    }
                }
            }
        }
        let outcomes = outcomes
            .into_iter()
            .map(|o| o.unwrap_or_else(|| Err(Error::new(crate::ErrorKind::Server, "no reply"))))
            .collect();
        (outcomes, trips)
    }

    /// One server's batch (and its `WAIT`, when `acks` asks for replicas there): once more
    /// after a dropped connection.
    fn send_batch(
        &self,
        shard: usize,
        calls: &[&ScriptCall],
        doing: Doing<'_>,
        acks: Option<AckRule<'_>>,
        trips: &mut u64,
    ) -> Result<BatchReplies> {
        let mut once = || -> Result<BatchReplies> {
            let mut conn = self.checkout(shard, doing)?;
            let ask = match acks {
                Some(rule) => conn.call(doing, |c| rule(c))?,
                None => None,
            };
            *trips += 1;
            let mut packed = Packed::with_capacity(128 * calls.len() + 32);
            for call in calls {
                call.pack_into(&mut packed);
            }
            if let Some((replicas, timeout)) = ask {
                packed
                    .command(3)
                    .bulk(b"WAIT")
                    .number(u64::from(replicas))
                    .number(millis(timeout));
            }
            let query = |c: &mut Conn| c.req_packed_commands(packed.as_bytes(), 0, packed.len());
            let mut replies = conn.call(doing, query)?;
            if replies.iter().any(is_noscript) {
                // Redis lost its scripts: load each missing one, and send the batch once more.
                let mut loaded: Vec<&str> = Vec::new();
                for (call, reply) in calls.iter().zip(&replies) {
                    let hash = call.script.get_hash();
                    if is_noscript(reply) && !loaded.contains(&hash) {
                        *trips += 1;
                        conn.call(doing, |c| call.script.load(c))?;
                        loaded.push(hash);
                    }
                }
                *trips += 1;
                replies = conn.call(doing, query)?;
            }
            let acked = match ask {
                Some((replicas, _)) => {
                    let got = match replies.pop() {
                        Some(redis::Value::Int(got)) => got,
                        // `WAIT` refused (a replica cannot be waited on): none acknowledged.
                        _ => 0,
                    };
                    Some((got, replicas))
                }
                None => None,
            };
            Ok((replies, acked))
        };
        let result = match once() {
            Err(e) if e.is_connection() && !e.is_checkout() => {
                self.deployment.call_failed(shard, &e);
                once()
            }
            other => other,
        };
        match &result {
            Err(e) => self.deployment.call_failed(shard, e),
            // Error replies inside a batch tell the deployment as much as a failed call does
            // (`READONLY`: the master was demoted; `MOVED`: the slot map changed).
            Ok((replies, _)) => {
                if let Some(redis::Value::ServerError(e)) = replies.iter().find(|r| {
                    matches!(r, redis::Value::ServerError(e) if matches!(e.code(), "READONLY" | "MOVED"))
                }) {
                    let server = self.deployment.server(shard);
                    let err = Error::from_call(&server, doing, redis::RedisError::from(e.clone()));
                    self.deployment.call_failed(shard, &err);
                }
            }
        }
        result
    }

    /// The shard whose server holds the keys (and the sharded channels) of `route`.
    pub(crate) fn shard_of(&self, route: &str) -> usize {
        self.deployment.shard_of(route)
    }

    /// Tells the deployment of a call to `shard` that failed.
    fn report_failure(&self, shard: usize, err: &Error) {
        self.deployment.call_failed(shard, err);
    }

    /// A pooled connection to the server of `shard`.
    fn checkout(&self, shard: usize, doing: Doing<'_>) -> Result<Checkout> {
        self.checkout_made(self.deployment.checkout(shard, doing, None))
    }

    /// A pooled connection to the server of `shard`, made (if it must be) within `within`
    /// at most.
    fn checkout_within(
        &self,
        shard: usize,
        doing: Doing<'_>,
        within: Duration,
    ) -> Result<Checkout> {
        self.checkout_made(self.deployment.checkout(shard, doing, Some(within)))
    }

    /// Notes a checkout that succeeded: the deployment has been reached.
    #[inline]
    fn checkout_made(&self, checkout: Result<Checkout>) -> Result<Checkout> {
        if checkout.is_ok() && !self.reached.load(Ordering::Relaxed) {
            self.reached.store(true, Ordering::Relaxed);
        }
        checkout
    }

    /// A new subscriber connection to the server of `shard`.
    pub(crate) fn subscriber_connection(
        &self,
        shard: usize,
    ) -> redis::RedisResult<redis::Connection> {
        self.deployment.subscriber_connection(shard)
    }

    /// The server of `shard`, as messages name it.
    pub(crate) fn shard_server(&self, shard: usize) -> Server {
        self.deployment.server(shard)
    }

    /// Tells the deployment that a server said a route moved (a sharded subscription that the
    /// server dropped): see [`Deployment::refresh_routes`].
    pub(crate) fn routes_changed(&self) {
        self.deployment.refresh_routes();
    }

    /// Tells the deployment that fewer replicas acknowledged a write for `route` than it
    /// counts: see [`Deployment::replicas_short`].
    pub(crate) fn replicas_short(&self, route: &str) {
        let shard = self.deployment.shard_of(route);
        self.deployment.replicas_short(shard);
    }

    /// The deployment in a few words, for `Debug` output: see [`Deployment::describe`].
    pub(crate) fn describe(&self) -> String {
        self.deployment.describe()
    }

    /// Changes whenever the servers behind the shards change: see [`Deployment::generation`].
    pub(crate) fn generation(&self) -> u64 {
        self.deployment.generation()
    }

    /// Reads the replies that idle connections still carry, and hands each to its handler.
    pub(crate) fn settle_unread(&self) {
        self.deployment.settle_unread();
    }

    /// Stops the deployment's background work; with `wait`, waits for it to end.
    pub(crate) fn shutdown(&self, wait: bool) {
        self.deployment.shutdown(wait);
    }
}
