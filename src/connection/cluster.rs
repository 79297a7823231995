//! Redis Cluster: locks routed by hash slot to the master that owns them, one pool per
//! master, the slot map refreshed when a reply says it moved.
//!
//! Every key of a lock shares the hash tag of its name, so one slot, one master, serves a
//! lock. The slot map comes from `CLUSTER SLOTS` of the first seed (or known master) that
//! answers; `MOVED` refreshes it and sends the call again, `ASK` sends it once to the node
//! named, after `ASKING` (both within the caller's deadline: `Connections::call` follows at
//! most a few redirections and never sleeps). A call that timed out is never re-sent.
//! Releases are announced with sharded pub/sub on Redis 7 and later (`SPUBLISH`, heard with
//! `SSUBSCRIBE` on the master of the channel's slot), so no message crosses the cluster bus;
//! on Redis 6, with classic `PUBLISH`, which the bus carries to every node.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::{Mutex, RwLock};

use crate::connection::{Checkout, Deployment, NodeClients, Pool, PoolSettings, Redirect};
use crate::error::{Doing, Error, ErrorKind, Result, Server};

/// The number of hash slots of a Redis Cluster.
pub(crate) const SLOTS: usize = 16384;

/// The hash slot of `key`: CRC16 (XMODEM) of its hash tag (the part between the first `{`
/// and the next `}`, when not empty), else of the whole key, modulo 16384.
pub(crate) fn slot_of(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            rest.iter()
                .position(|&b| b == b'}')
                .filter(|&close| close > 0)
                .map(|close| &rest[..close])
        })
        .unwrap_or(key);
    crc16(tagged) % SLOTS as u16
}

fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The address of a node in a `CLUSTER SLOTS` entry (`[host, port, id, …]`); an empty host
/// is the node that answered (`answered`).
fn node_address(entry: &redis::Value, answered: &str) -> Option<(String, u16)> {
    let redis::Value::Array(fields) = entry else {
        return None;
    };
    let host = fields
        .first()
        .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| answered.to_owned());
    let port = fields
        .get(1)
        .and_then(|v| redis::from_redis_value_ref::<i64>(v).ok())
        .and_then(|p| u16::try_from(p).ok())?;
    Some((host, port))
}

/// How to reach a cluster.
pub(crate) struct ClusterSettings {
    /// Nodes to ask for the slot map first.
    pub(crate) seeds: Vec<(String, u16)>,
    pub(crate) nodes: NodeClients,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) pool: PoolSettings,
}

/// One master: its address, its pool and its subscriber client.
struct Shard {
    host: String,
    port: u16,
    pool: Pool,
    subscriber: redis::Client,
}

#[derive(Default)]
struct SlotMap {
    /// The shard of each slot (`u16::MAX`: no master serves it).
    owner: Vec<u16>,
    shards: Vec<Arc<Shard>>,
    /// Every node the map names, masters and replicas: where to read the next map from
    /// (a replica that is promoted knows the new map first).
    nodes: Vec<(String, u16)>,
    /// The replicas of each shard's master that the map names (`CLUSTER SLOTS` leaves out
    /// those the cluster counts as failed): those a failover may promote.
    replicas: Vec<u32>,
}

/// The shortest time between two refreshes of the map that a failed connection asks for: a
/// dead master fails every call for its slots until its replica is promoted, and each call
/// must not cost a `CLUSTER SLOTS`.
const MIN_REFRESH_GAP: Duration = Duration::from_millis(200);

/// How soon the map is read again after one that names a master without replicas, and the
/// longest gap it then grows to while nothing changes: `CLUSTER SLOTS` leaves out a replica
/// until the cluster has heard its replication offset, so a map read just after a replica
/// joined names none, and a client that believed it would ask no replica to acknowledge its
/// leases.
const UNREPLICATED_RECHECK: (Duration, Duration) =
    (Duration::from_secs(1), Duration::from_secs(60));

impl SlotMap {
    /// Whether both maps give every slot to the same master at the same index.
    fn same_as(&self, other: &SlotMap) -> bool {
        self.owner == other.owner
            && self.shards.len() == other.shards.len()
            && self
                .shards
                .iter()
                .zip(&other.shards)
                .all(|(a, b)| a.host == b.host && a.port == b.port)
    }
}

/// A cluster deployment: one shard per master.
pub(crate) struct Cluster {
    settings: ClusterSettings,
    map: RwLock<SlotMap>,
    refreshing: Mutex<()>,
    generation: AtomicU64,
    /// The error of the last failed refresh, for calls that find no map.
    last_error: Mutex<Option<Error>>,
    /// When the last refresh ended.
    refreshed_at: Mutex<Option<Instant>>,
    /// While the map names a master without replicas: when to read it again, in nanoseconds
    /// from `epoch` (0: no need), and the gap after that read if it still names none.
    recheck_at: AtomicU64,
    recheck_gap: Mutex<Duration>,
    epoch: Instant,
    /// A node ever answered with a slot map.
    answered: AtomicBool,
}

/// The shard index that stands for "no master known for this slot".
const UNKNOWN: usize = usize::MAX;

impl Cluster {
    pub(crate) fn new(settings: ClusterSettings) -> Self {
        Cluster {
            settings,
            map: RwLock::new(SlotMap::default()),
            refreshing: Mutex::new(()),
            generation: AtomicU64::new(0),
            last_error: Mutex::new(None),
            refreshed_at: Mutex::new(None),
            recheck_at: AtomicU64::new(0),
            recheck_gap: Mutex::new(UNREPLICATED_RECHECK.0),
            epoch: Instant::now(),
            answered: AtomicBool::new(false),
        }
    }

    /// Nanoseconds from `epoch` to now (never 0, which means "no recheck").
    fn now_nanos(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// Reads the map again when a recheck is due (a master had no replica in the last map):
    /// one thread does, the others go on with the map they have; a read that fails leaves
    /// the next recheck one gap later.
    fn recheck_if_due(&self) {
        let due = self.recheck_at.load(Ordering::Relaxed);
        if due == 0 {
            return;
        }
        let now = self.now_nanos();
        if now < due {
            return;
        }
        let gap = *self.recheck_gap.lock();
        let next = now.saturating_add(u64::try_from(gap.as_nanos()).unwrap_or(u64::MAX));
        if self
            .recheck_at
            .compare_exchange(due, next, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            self.refresh_soon(None);
        }
    }

    /// Plans the next recheck after a map was read: soon after a change, then ever more
    /// seldom while the same masters still have no replica; none when every master has one.
    fn plan_recheck(&self, unreplicated: bool, changed: bool) {
        let mut gap = self.recheck_gap.lock();
        if !unreplicated {
            *gap = UNREPLICATED_RECHECK.0;
            self.recheck_at.store(0, Ordering::Relaxed);
            return;
        }
        let planned = self.recheck_at.load(Ordering::Relaxed) != 0;
        *gap = if changed || !planned {
            UNREPLICATED_RECHECK.0
        } else {
            (*gap * 2).min(UNREPLICATED_RECHECK.1)
        };
        let at = self
            .now_nanos()
            .saturating_add(u64::try_from(gap.as_nanos()).unwrap_or(u64::MAX));
        self.recheck_at.store(at, Ordering::Relaxed);
    }

    /// Loads the slot map again, unless a refresh ended less than `MIN_REFRESH_GAP` ago (or
    /// one under way ends meanwhile): for signs that the map may be stale (a master that
    /// refuses connections or does not answer, `CLUSTERDOWN`), which every call to a dead
    /// master gives until its replica is promoted.
    fn refresh_soon(&self, suspect: Option<(&str, u16)>) {
        let recent = |at: &Option<Instant>| at.is_some_and(|at| at.elapsed() < MIN_REFRESH_GAP);
        if recent(&self.refreshed_at.lock()) {
            return;
        }
        let one_at_a_time = self.refreshing.lock();
        if recent(&self.refreshed_at.lock()) {
            return;
        }
        self.refresh_locked(suspect, one_at_a_time);
    }

    /// Loads the slot map again now (after `MOVED`: the map is surely stale).
    fn refresh(&self) {
        let one_at_a_time = self.refreshing.lock();
        self.refresh_locked(None, one_at_a_time);
    }

    /// Loads the slot map from the first node that answers: every node of the last map, then
    /// the seeds, and the `suspect` (the node whose call failed) last.
    fn refresh_locked(
        &self,
        suspect: Option<(&str, u16)>,
        _one_at_a_time: parking_lot::MutexGuard<'_, ()>,
    ) {
        let mut candidates: Vec<(String, u16)> = {
            let map = self.map.read();
            map.shards
                .iter()
                .map(|s| (s.host.clone(), s.port))
                .chain(map.nodes.iter().cloned())
                .collect()
        };
        candidates.extend(self.settings.seeds.iter().cloned());
        let mut seen: Vec<(String, u16)> = Vec::with_capacity(candidates.len());
        for c in candidates {
            if !seen.contains(&c) {
                seen.push(c);
            }
        }
        let mut candidates = seen;
        if let Some((host, port)) = suspect {
            if let Some(at) = candidates.iter().position(|(h, p)| h == host && *p == port) {
                let last = candidates.remove(at);
                candidates.push(last);
            }
        }
        self.first_map(candidates);
        *self.refreshed_at.lock() = Some(Instant::now());
    }

    fn first_map(&self, candidates: Vec<(String, u16)>) {
        let mut failures = Vec::new();
        for (host, port) in candidates {
            match self.slots_from(&host, port) {
                Ok(map) => {
                    for (shard, replicas) in map.shards.iter().zip(&map.replicas) {
                        shard
                            .pool
                            .features()
                            .set_promotable_replicas(Some(*replicas));
                    }
                    let unreplicated = map.replicas.contains(&0);
                    let (changed, replicas_changed) = {
                        let mut current = self.map.write();
                        let changed = !current.same_as(&map);
                        let replicas_changed = current.replicas != map.replicas;
                        *current = map;
                        (changed, replicas_changed)
                    };
                    self.plan_recheck(unreplicated, changed || replicas_changed);
                    self.answered.store(true, Ordering::Relaxed);
                    *self.last_error.lock() = None;
                    if changed {
                        self.generation.fetch_add(1, Ordering::AcqRel);
                    }
                    return;
                }
                Err(e) => failures.push(format!("{host}:{port}: {e}")),
            }
        }
        *self.last_error.lock() = Some(Error::new(
            ErrorKind::Connection,
            format!(
                "no node of the cluster answered CLUSTER SLOTS: {}",
                failures.join("; ")
            ),
        ));
    }

    fn slots_from(&self, host: &str, port: u16) -> Result<SlotMap> {
        let s = &self.settings;
        let server = self.server_at(host, port);
        let doing = Doing::work("reading the cluster's slot map");
        let client = (s.nodes)(host, port, redis::ProtocolVersion::RESP2)?;
        let ranges: Vec<redis::Value> = (|| {
            let mut conn = client.get_connection_with_timeout(s.connect_timeout)?;
            conn.set_read_timeout(Some(s.response_timeout))?;
            conn.set_write_timeout(Some(s.response_timeout))?;
            redis::cmd("CLUSTER").arg("SLOTS").query(&mut conn)
        })()
        .map_err(|e| Error::from_call(&server, doing, e))?;
        let old: Vec<Arc<Shard>> = self.map.read().shards.clone();
        let mut map = SlotMap {
            owner: vec![u16::MAX; SLOTS],
            shards: Vec::new(),
            nodes: Vec::new(),
            replicas: Vec::new(),
        };
        for range in ranges {
            let redis::Value::Array(parts) = range else {
                continue;
            };
            let int = |v: Option<&redis::Value>| {
                v.and_then(|v| redis::from_redis_value_ref::<i64>(v).ok())
            };
            let (Some(start), Some(end)) = (int(parts.first()), int(parts.get(1))) else {
                continue;
            };
            let Some((node_host, node_port)) = parts.get(2).and_then(|m| node_address(m, host))
            else {
                continue;
            };
            let index = match map
                .shards
                .iter()
                .position(|s| s.host == node_host && s.port == node_port)
            {
                Some(i) => i,
                None => {
                    let shard = match old
                        .iter()
                        .find(|s| s.host == node_host && s.port == node_port)
                    {
                        Some(kept) => Arc::clone(kept),
                        None => Arc::new(self.shard(&node_host, node_port)?),
                    };
                    map.shards.push(shard);
                    let replicas = parts
                        .iter()
                        .skip(3)
                        .filter(|p| matches!(p, redis::Value::Array(_)))
                        .count();
                    map.replicas
                        .push(u32::try_from(replicas).unwrap_or(u32::MAX));
                    map.shards.len() - 1
                }
            };
            for node in parts.iter().skip(2).filter_map(|n| node_address(n, host)) {
                if !map.nodes.contains(&node) {
                    map.nodes.push(node);
                }
            }
            let (start, end) = (start.max(0) as usize, (end as usize).min(SLOTS - 1));
            for slot in start..=end {
                map.owner[slot] = index as u16;
            }
        }
        if map.shards.is_empty() {
            return Err(Error::new(
                ErrorKind::Connection,
                format!("{host}:{port} reported no slots: is it a cluster node?"),
            ));
        }
        Ok(map)
    }

    fn shard(&self, host: &str, port: u16) -> Result<Shard> {
        let s = &self.settings;
        Ok(Shard {
            host: host.to_owned(),
            port,
            pool: Pool::new(
                (s.nodes)(host, port, redis::ProtocolVersion::RESP2)?,
                self.server_at(host, port),
                s.pool,
            ),
            subscriber: (s.nodes)(host, port, redis::ProtocolVersion::RESP3)?,
        })
    }

    fn server_at(&self, host: &str, port: u16) -> Server {
        Server {
            address: Arc::from(format!("{host}:{port}")),
            connect_timeout: self.settings.connect_timeout,
            response_timeout: self.settings.response_timeout,
        }
    }

    fn shard_at(&self, shard: usize) -> Option<Arc<Shard>> {
        self.map.read().shards.get(shard).cloned()
    }

    fn no_master(&self, doing: Doing<'_>) -> Error {
        match self.last_error.lock().clone() {
            Some(e) => e.at_checkout(),
            None => Error::new(
                ErrorKind::Server,
                format!("no master of the cluster serves the slot of this lock while {doing} (CLUSTERDOWN)"),
            )
            .at_checkout(),
        }
    }
}

impl Deployment for Cluster {
    fn shards(&self) -> usize {
        if self.map.read().shards.is_empty() {
            self.refresh_soon(None);
        }
        self.map.read().shards.len()
    }

    fn shard_of(&self, route: &str) -> usize {
        let slot = usize::from(slot_of(route.as_bytes()));
        if self.map.read().shards.is_empty() {
            self.refresh_soon(None);
        } else {
            self.recheck_if_due();
        }
        match self.map.read().owner.get(slot) {
            Some(&owner) if owner != u16::MAX => usize::from(owner),
            _ => UNKNOWN,
        }
    }

    fn checkout(&self, shard: usize, doing: Doing<'_>, by: Option<Duration>) -> Result<Checkout> {
        match self.shard_at(shard) {
            Some(s) => s.pool.get(doing, by),
            None => Err(self.no_master(doing)),
        }
    }

    fn subscriber_connection(&self, shard: usize) -> redis::RedisResult<redis::Connection> {
        let s = &self.settings;
        let master = self.shard_at(shard);
        let client = master
            .as_ref()
            .map(|m| &m.subscriber)
            .ok_or_else(|| "no master of the cluster serves this channel's slot".to_owned());
        super::subscriber_of(client, s.connect_timeout, s.response_timeout)
    }

    fn server(&self, shard: usize) -> Server {
        match self.shard_at(shard) {
            Some(s) => s.pool.server().clone(),
            None => Server {
                address: Arc::from("the cluster"),
                connect_timeout: self.settings.connect_timeout,
                response_timeout: self.settings.response_timeout,
            },
        }
    }

    fn describe(&self) -> String {
        let seeds: Vec<String> = self
            .settings
            .seeds
            .iter()
            .map(|(host, port)| format!("{host}:{port}"))
            .collect();
        format!("cluster seeded by {}", seeds.join(","))
    }

    fn call_failed(&self, shard: usize, err: &Error) {
        if err.is_server_code("MOVED") {
            self.refresh();
            return;
        }
        // A master that refuses connections, does not accept them in time or does not
        // answer may be dead: its replica is promoted, and the map says so, once the cluster
        // agrees. Until then every call to it fails and asks again, at most every
        // `MIN_REFRESH_GAP`.
        let stale = err.is_server_code("CLUSTERDOWN") || err.is_connection() || err.is_timeout();
        if stale {
            let suspect = self.shard_at(shard);
            self.refresh_soon(suspect.as_deref().map(|s| (s.host.as_str(), s.port)));
        }
    }

    fn redirect(&self, err: &Error) -> Option<Redirect> {
        if err.is_server_code("MOVED") {
            // The map was refreshed by `call_failed`: route again.
            return Some(Redirect::Again);
        }
        if err.is_server_code("TRYAGAIN") {
            return Some(Redirect::Wait);
        }
        if err.is_server_code("ASK") {
            let target = err.redirect_target()?;
            let (host, port) = target.rsplit_once(':')?;
            let port: u16 = port.parse().ok()?;
            let map = self.map.read();
            let shard = map
                .shards
                .iter()
                .position(|s| s.host == host && s.port == port)?;
            return Some(Redirect::Ask(shard));
        }
        None
    }

    fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn refresh_routes(&self) {
        self.refresh();
    }

    fn replicas_short(&self, shard: usize) {
        let suspect = self.shard_at(shard);
        self.refresh_soon(suspect.as_deref().map(|s| (s.host.as_str(), s.port)));
    }

    fn answered(&self) -> bool {
        self.answered.load(Ordering::Relaxed)
    }

    fn settle_unread(&self) {
        let shards = self.map.read().shards.clone();
        for shard in shards {
            shard.pool.settle_idle();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_follow_the_hash_tag_like_redis() {
        // Values from `CLUSTER KEYSLOT` on Redis 7.
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"123456789"), 12739);
        assert_eq!(slot_of(b"redmutex:{foo}"), slot_of(b"foo"));
        assert_eq!(slot_of(b"redmutex:{foo}:fence"), 12182);
        assert_eq!(slot_of(b"{}foo"), slot_of(b"{}foo"));
        assert_ne!(slot_of(b"{}foo"), slot_of(b"foo"));
    }
}
