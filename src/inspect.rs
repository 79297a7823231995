//! Who holds what: the locks whose keys are in Redis, and each one's holders and waiters,
//! read without taking anything ([`Client::lock_names`](crate::Client::lock_names),
//! [`Client::lock_info`](crate::Client::lock_info)), for people and for the `redmutex`
//! command.
//!
//! Everything is read in one pipelined round trip per lock (its keys share a slot), and the
//! holders' clients in one more; listing uses `SCAN` on every server, never `KEYS`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::connection::Connections;
use crate::error::{Doing, Result};
use crate::identity::{self, FIELDS};
use crate::keys::{self, suffix, LockKeys};

/// Where a hold came from: the client that announced itself, when it still does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientInfo {
    /// The client's id, which starts every token it makes.
    pub id: String,
    /// The name it announced ([`Builder::client_name`](crate::Builder::client_name)).
    pub name: String,
    /// Its host name.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// When the client was built, by its host's clock.
    pub started: Option<SystemTime>,
}

/// One holder of a lock (the holder of a `Mutex`, one reader of an `RwLock`, one holder of
/// a semaphore's permits) or one queued waiter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HolderInfo {
    /// Its token (`<client id>:<thread>:<sequence>:<unix ms>`; a `Mutex` that a release handed
    /// to a waiting client, `<client id>:h:<fencing token>`).
    pub token: String,
    /// The number of its thread within its process (0 when the token does not tell: a lock
    /// handed over).
    pub thread: u64,
    /// When its acquire call began, by its client's clock (for a holder that waited, this
    /// includes the wait); `None` when the token does not tell.
    pub since: Option<SystemTime>,
    /// How much of its lease is left (for a waiter: until it counts as dead).
    pub lease_left: Option<Duration>,
    /// Permits it holds or asks for (a semaphore); 1 otherwise.
    pub units: u64,
    /// Its client's announcement, when the client still makes one.
    pub client: Option<ClientInfo>,
}

/// What a name's keys in Redis say about it, read at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LockInfo {
    /// The lock's name.
    pub name: String,
    /// What kinds of primitive its keys show, by the names events use
    /// ([`Acquired::kind`](crate::events::Acquired::kind)): `Mutex` (a held lock; a
    /// `FairMutex` that nobody waits for has the same keys), `FairMutex` (a queue), `RwLock`
    /// (readers or a writer's claim), `Shared` (a value), `Semaphore`. Empty when only the
    /// fencing counter is left (the name was used, and is free).
    pub kinds: Vec<&'static str>,
    /// The exclusive holder (a `Mutex`, `FairMutex`, `Shared` or `RwLock` writer).
    pub holder: Option<HolderInfo>,
    /// The readers of an `RwLock`, or the holders of a semaphore's permits.
    pub sharers: Vec<HolderInfo>,
    /// The fencing counter: the token of the latest acquisition, or more (a `Mutex` attempt
    /// that found the lock held may have counted on it too).
    pub fencing_counter: Option<u64>,
    /// Queued waiters (a `FairMutex`, a fair semaphore), first first.
    pub queue: Vec<HolderInfo>,
    /// Clients whose threads wait for a release announcement: each waiting client listens
    /// once, however many of its threads wait (a `Mutex`'s waiters do not queue, a fair
    /// lock's are in `queue` too).
    pub waiting_clients: u64,
    /// A writer that claimed the next turn of an `RwLock`.
    pub writer_waiting: Option<String>,
    /// A semaphore's permit count.
    pub permits: Option<u64>,
    /// The size of a `Shared` value, in bytes.
    pub value_bytes: Option<u64>,
    /// Whether a holder panicked and left a poison record.
    pub poisoned: bool,
}

impl LockInfo {
    /// Whether anyone holds the lock (exclusively or shared).
    pub fn is_held(&self) -> bool {
        self.holder.is_some() || !self.sharers.is_empty()
    }
}

/// The names of the locks whose keys match `pattern` (a `SCAN` glob over names: `*`, `?`,
/// `[…]`), sorted, on every server; names with only a fencing counter left are not listed.
pub(crate) fn lock_names(
    connections: &Connections,
    prefix: &str,
    pattern: &str,
) -> Result<Vec<String>> {
    let mut names: BTreeMap<String, bool> = BTreeMap::new();
    let doing = Doing::work("listing locks");
    for (space, suffixes) in [
        (prefix.to_owned(), &suffix::OF_LOCKS[..]),
        (keys::semaphore_space(prefix), &suffix::OF_SEMAPHORES[..]),
    ] {
        let matching = format!("{space}:{{{pattern}}}*");
        for shard in 0..connections.shards() {
            let mut cursor = 0u64;
            loop {
                let (next, keys): (u64, Vec<String>) =
                    connections.call_shard(shard, doing, |c| {
                        redis::cmd("SCAN")
                            .arg(cursor)
                            .arg("MATCH")
                            .arg(&matching)
                            .arg("COUNT")
                            .arg(1000)
                            .query(c)
                    })?;
                for key in keys {
                    if let Some((name, suffix)) = split_key(&key, &space, suffixes) {
                        let live = !suffix::LEFT_BEHIND.contains(&suffix);
                        *names.entry(name).or_default() |= live;
                    }
                }
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
    }
    Ok(names
        .into_iter()
        .filter(|(_, live)| *live)
        .map(|(name, _)| name)
        .collect())
}

/// The name and suffix of `key` under `space` (`P` or `P:semaphore`), if it is a lock's key.
fn split_key(key: &str, space: &str, suffixes: &[&'static str]) -> Option<(String, &'static str)> {
    let rest = key.strip_prefix(space)?.strip_prefix(":{")?;
    suffixes.iter().find_map(|&suffix| {
        let name = rest.strip_suffix(suffix)?.strip_suffix('}')?;
        (!name.is_empty()).then(|| (name.to_owned(), suffix))
    })
}

/// `ZRANGE key 0 -1 WITHSCORES`: a whole sorted set with its scores.
fn scored(key: impl redis::ToRedisArgs) -> redis::Cmd {
    let mut cmd = redis::cmd("ZRANGE");
    cmd.arg(key).arg(0).arg(-1).arg("WITHSCORES");
    cmd
}

/// `LRANGE key 0 -1`: a whole list.
fn whole_list(key: impl redis::ToRedisArgs) -> redis::Cmd {
    let mut cmd = redis::cmd("LRANGE");
    cmd.arg(key).arg(0).arg(-1);
    cmd
}

/// What one round trip reads of a name's keys.
struct Raw {
    now_ms: u64,
    holder: Option<String>,
    holder_ttl: i64,
    fence: Option<u64>,
    queue: Vec<String>,
    timeouts: Vec<(String, f64)>,
    readers: Vec<(String, f64)>,
    writer_waiting: Option<String>,
    waiting_clients: u64,
    value_bytes: u64,
    poisoned: bool,
    permits: Option<u64>,
    sem_holders: Vec<(String, f64)>,
    sem_held: BTreeMap<String, u64>,
    sem_queue: Vec<String>,
    sem_timeouts: Vec<(String, f64)>,
    sem_wants: BTreeMap<String, u64>,
}

/// Reads everything about lock `name`: one round trip for its keys, one for its semaphore's,
/// and one for the announcements of the clients involved.
pub(crate) fn lock_info(connections: &Connections, prefix: &str, name: &str) -> Result<LockInfo> {
    keys::validate_name(name)?;
    let lock = LockKeys::new(prefix, name)?;
    let sem = LockKeys::new(&keys::semaphore_space(prefix), name)?;
    let doing = Doing::lock("inspecting", name);
    let (lock_space, waiting_clients): (LockSpace, u64) =
        read_space(connections, &lock, &lock_space(&lock), doing)?;
    let (sem_space, sem_waiting): (SemaphoreSpace, u64) =
        read_space(connections, &sem, &semaphore_space(&sem), doing)?;
    let (
        (secs, micros),
        holder,
        holder_ttl,
        fence,
        queue,
        timeouts,
        readers,
        writer,
        value,
        poison,
    ) = lock_space;
    let (permits, sem_holders, sem_held, sem_queue, sem_timeouts, sem_wants) = sem_space;
    let raw = Raw {
        now_ms: secs * 1000 + micros / 1000,
        holder,
        holder_ttl,
        fence,
        queue,
        timeouts,
        readers,
        writer_waiting: writer,
        waiting_clients: waiting_clients + sem_waiting,
        value_bytes: value,
        poisoned: poison,
        permits,
        sem_holders,
        sem_held,
        sem_queue,
        sem_timeouts,
        sem_wants,
    };
    let clients = read_clients(connections, prefix, &raw)?;
    Ok(assemble(name, raw, &clients))
}

/// What one round trip reads of the keys under `P:{N}`: the server's time, the holder and
/// its lease, the fencing counter, the fair queue and its timeouts, the readers, the waiting
/// writer, the value's size and the poison record.
type LockSpace = (
    (u64, u64),
    Option<String>,
    i64,
    Option<u64>,
    Vec<String>,
    Vec<(String, f64)>,
    Vec<(String, f64)>,
    Option<String>,
    u64,
    bool,
);

/// What one round trip reads of a semaphore's keys: permits, holders, permits held, the fair
/// queue, its timeouts, and its waiters' wants.
type SemaphoreSpace = (
    Option<u64>,
    Vec<(String, f64)>,
    BTreeMap<String, u64>,
    Vec<String>,
    Vec<(String, f64)>,
    BTreeMap<String, u64>,
);

/// What `pipe` reads of the keys of `keys` (one round trip), and how many clients listen on
/// their channel.
fn read_space<T: redis::FromRedisValue>(
    connections: &Connections,
    keys: &LockKeys,
    pipe: &redis::Pipeline,
    doing: Doing<'_>,
) -> Result<(T, u64)> {
    connections.call(&keys.lock, doing, |c| {
        let space: T = pipe.query(c)?;
        Ok((space, listeners(c, keys)?))
    })
}

/// The reading of the keys under `P:{N}` (see [`LockSpace`]).
fn lock_space(lock: &LockKeys) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.cmd("TIME")
        .cmd("GET")
        .arg(&lock.lock)
        .cmd("PTTL")
        .arg(&lock.lock)
        .cmd("GET")
        .arg(&lock.fence)
        .add_command(whole_list(lock.queue()))
        .add_command(scored(lock.timeouts()))
        .add_command(scored(lock.beside(suffix::READERS)))
        .cmd("GET")
        .arg(lock.beside(suffix::WRITER_WAITING))
        .cmd("STRLEN")
        .arg(lock.beside(suffix::VALUE))
        .cmd("EXISTS")
        .arg(lock.poison());
    pipe
}

/// The reading of the keys under `P:semaphore:{N}` (see [`SemaphoreSpace`]).
fn semaphore_space(sem: &LockKeys) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.cmd("GET")
        .arg(sem.beside(suffix::PERMITS))
        .add_command(scored(sem.beside(suffix::HOLDERS)))
        .cmd("HGETALL")
        .arg(sem.beside(suffix::HELD))
        .add_command(whole_list(sem.queue()))
        .add_command(scored(sem.timeouts()))
        .cmd("HGETALL")
        .arg(sem.beside(suffix::WANTS));
    pipe
}

/// How many clients listen for the releases of `keys`: on the lock's channel (every waiter of
/// an `RwLock` or a semaphore), and on channels of their own (a `Mutex`'s or a fair lock's
/// waiting client, one channel each); sharded subscriptions on Redis 7 and later, classic ones
/// before.
fn listeners(c: &mut crate::connection::Conn, keys: &LockKeys) -> redis::RedisResult<u64> {
    let channel = &*keys.channel;
    let sharded: redis::RedisResult<(String, u64)> = redis::cmd("PUBSUB")
        .arg("SHARDNUMSUB")
        .arg(channel)
        .query(c);
    let classic: (String, u64) = redis::cmd("PUBSUB").arg("NUMSUB").arg(channel).query(c)?;
    let own = format!("{}*", glob_escaped(keys.waiter_channel_prefix()));
    let sharded_own: redis::RedisResult<Vec<String>> =
        redis::cmd("PUBSUB").arg("SHARDCHANNELS").arg(&own).query(c);
    let classic_own: Vec<String> = redis::cmd("PUBSUB").arg("CHANNELS").arg(&own).query(c)?;
    Ok(sharded.map_or(0, |(_, n)| n)
        + classic.1
        + sharded_own.map_or(0, |v| v.len() as u64)
        + classic_own.len() as u64)
}

/// `text` as a glob pattern that matches only itself.
fn glob_escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        if matches!(ch, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

/// Every token the raw reading names.
fn tokens(raw: &Raw) -> BTreeSet<&str> {
    let mut all: BTreeSet<&str> = BTreeSet::new();
    all.extend(raw.holder.as_deref());
    all.extend(raw.queue.iter().map(String::as_str));
    all.extend(raw.readers.iter().map(|(t, _)| t.as_str()));
    all.extend(raw.sem_holders.iter().map(|(t, _)| t.as_str()));
    all.extend(raw.sem_queue.iter().map(String::as_str));
    all
}

/// The announcements of the clients whose tokens the reading names, by client id.
fn read_clients(
    connections: &Connections,
    prefix: &str,
    raw: &Raw,
) -> Result<BTreeMap<String, ClientInfo>> {
    let ids: BTreeSet<&str> = tokens(raw)
        .into_iter()
        .map(identity::client_id_of)
        .collect();
    let mut clients = BTreeMap::new();
    for id in ids {
        let key = identity::key(prefix, id);
        let fields: Vec<Option<String>> =
            connections.call(&key, Doing::work("reading a client's announcement"), |c| {
                redis::cmd("HMGET").arg(&key).arg(&FIELDS[..]).query(c)
            })?;
        let field = |i: usize| fields.get(i).cloned().flatten();
        let Some(name) = field(0) else {
            continue;
        };
        clients.insert(
            id.to_owned(),
            ClientInfo {
                id: id.to_owned(),
                name,
                host: field(1).unwrap_or_default(),
                pid: field(2).and_then(|p| p.parse().ok()).unwrap_or(0),
                started: field(3)
                    .and_then(|ms| ms.parse().ok())
                    .map(|ms| UNIX_EPOCH + Duration::from_millis(ms)),
            },
        );
    }
    Ok(clients)
}

fn holder(
    token: &str,
    lease_left: Option<Duration>,
    units: u64,
    clients: &BTreeMap<String, ClientInfo>,
) -> HolderInfo {
    let mut fields = token.split(':');
    let id = fields.next().unwrap_or_default();
    let thread = fields.next().and_then(|t| t.parse().ok()).unwrap_or(0);
    let since = fields
        .nth(1)
        .and_then(|ms| ms.parse().ok())
        .map(|ms| UNIX_EPOCH + Duration::from_millis(ms));
    HolderInfo {
        token: token.to_owned(),
        thread,
        since,
        lease_left,
        units,
        client: clients.get(id).cloned(),
    }
}

/// Time left until `score` (server ms), from `now_ms`.
fn left(score: f64, now_ms: u64) -> Option<Duration> {
    let ms = score - now_ms as f64;
    (ms > 0.0).then(|| Duration::from_millis(ms as u64))
}

fn queued(
    tokens: &[String],
    timeouts: &[(String, f64)],
    wants: &BTreeMap<String, u64>,
    now_ms: u64,
    clients: &BTreeMap<String, ClientInfo>,
) -> Vec<HolderInfo> {
    tokens
        .iter()
        .map(|t| {
            let timeout = timeouts.iter().find(|(w, _)| w == t).map(|(_, s)| *s);
            let units = wants.get(t).copied().unwrap_or(1);
            holder(t, timeout.and_then(|s| left(s, now_ms)), units, clients)
        })
        .collect()
}

fn assemble(name: &str, raw: Raw, clients: &BTreeMap<String, ClientInfo>) -> LockInfo {
    let now = raw.now_ms;
    let holder_info = raw.holder.as_deref().map(|t| {
        let ttl = u64::try_from(raw.holder_ttl)
            .ok()
            .map(Duration::from_millis);
        holder(t, ttl, 1, clients)
    });
    let mut sharers: Vec<HolderInfo> = raw
        .readers
        .iter()
        .map(|(t, score)| holder(t, left(*score, now), 1, clients))
        .collect();
    sharers.extend(raw.sem_holders.iter().map(|(t, score)| {
        let units = raw.sem_held.get(t).copied().unwrap_or(1);
        holder(t, left(*score, now), units, clients)
    }));
    let no_wants = BTreeMap::new();
    let mut queue = queued(&raw.queue, &raw.timeouts, &no_wants, now, clients);
    queue.extend(queued(
        &raw.sem_queue,
        &raw.sem_timeouts,
        &raw.sem_wants,
        now,
        clients,
    ));
    let mut kinds = Vec::new();
    if !raw.readers.is_empty() || raw.writer_waiting.is_some() {
        kinds.push("RwLock");
    }
    if !raw.queue.is_empty() {
        kinds.push("FairMutex");
    }
    if raw.value_bytes > 0 {
        kinds.push("Shared");
    }
    if raw.holder.is_some() && kinds.is_empty() {
        // A `Mutex`, or a `FairMutex` that nobody waits for: the keys look alike.
        kinds.push("Mutex");
    }
    if raw.permits.is_some() || !raw.sem_holders.is_empty() {
        kinds.push("Semaphore");
    }
    LockInfo {
        name: name.to_owned(),
        kinds,
        holder: holder_info,
        sharers,
        fencing_counter: raw.fence,
        queue,
        waiting_clients: raw.waiting_clients,
        writer_waiting: raw.writer_waiting,
        permits: raw.permits,
        value_bytes: (raw.value_bytes > 0).then_some(raw.value_bytes),
        poisoned: raw.poisoned,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_split_into_name_and_suffix() {
        let s = &suffix::OF_LOCKS[..];
        assert_eq!(
            split_key("redmutex:{orders:42}", "redmutex", s),
            Some(("orders:42".to_owned(), ""))
        );
        assert_eq!(
            split_key("redmutex:{a}:fence", "redmutex", s),
            Some(("a".to_owned(), ":fence"))
        );
        assert_eq!(
            split_key("redmutex:{{order:42}:stock}:value", "redmutex", s),
            Some(("{order:42}:stock".to_owned(), ":value"))
        );
        assert_eq!(split_key("redmutex:client:abc", "redmutex", s), None);
        assert_eq!(split_key("other:{a}", "redmutex", s), None);
    }
}
