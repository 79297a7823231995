//! Redis Sentinel: a master with replicas, found through the sentinels and followed across
//! failovers.
//!
//! The master's address comes from the first sentinel that answers
//! `SENTINEL GET-MASTER-ADDR-BY-NAME`, and is trusted only once the server itself says
//! `ROLE` master. Every sentinel call has the connect and response timeouts, so a dead
//! sentinel is skipped within them. The master is looked up again when a call gets `READONLY`
//! (a demoted master) or a dropped connection, and at once when a sentinel announces
//! `+switch-master`: a thread listens for it, because a master demoted by `SENTINEL FAILOVER`
//! stays writable for seconds, and writes to it then vanish. Connections to the old master
//! are retired with its pool; the subscriber follows the change (see `generation`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Mutex, RwLock};

use crate::connection::{Checkout, Deployment, NodeClients, Pool, PoolSettings};
use crate::error::{Doing, Error, ErrorKind, Result, Server};

/// How to reach a Sentinel deployment.
pub(crate) struct SentinelSettings {
    pub(crate) master_name: String,
    /// One client per sentinel, with the sentinels' credentials and TLS.
    pub(crate) sentinels: Vec<redis::Client>,
    pub(crate) nodes: NodeClients,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    pub(crate) pool: PoolSettings,
}

/// The master in use.
struct Master {
    pool: Pool,
    subscriber: redis::Client,
}

struct SentinelState {
    settings: SentinelSettings,
    master: RwLock<Option<Arc<Master>>>,
    /// One discovery at a time.
    discovering: Mutex<()>,
    /// Bumped whenever the master is dropped.
    generation: AtomicU64,
    /// The `+switch-master` listener.
    watcher: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Set by `shutdown`: the listener ends and is not started again.
    stopped: AtomicBool,
    /// A sentinel ever named the master.
    answered: AtomicBool,
}

/// A Sentinel deployment: one shard, the current master.
pub(crate) struct Sentinel {
    inner: Arc<SentinelState>,
}

/// The name the `+switch-master` listener carries.
const WATCHER_THREAD: &str = "redmutex-sentinel";

impl Sentinel {
    pub(crate) fn new(settings: SentinelSettings) -> Self {
        Sentinel {
            inner: Arc::new(SentinelState {
                settings,
                master: RwLock::new(None),
                discovering: Mutex::new(()),
                generation: AtomicU64::new(0),
                watcher: Mutex::new(None),
                stopped: AtomicBool::new(false),
                answered: AtomicBool::new(false),
            }),
        }
    }

    /// The master in use, found through the sentinels when there is none.
    fn master(&self, doing: Doing<'_>) -> Result<Arc<Master>> {
        if let Some(master) = self.inner.master.read().as_ref() {
            return Ok(Arc::clone(master));
        }
        let master = self.inner.discover(doing)?;
        self.watch();
        Ok(master)
    }

    /// Starts the `+switch-master` listener, once.
    fn watch(&self) {
        let mut watcher = self.inner.watcher.lock();
        if self.inner.stopped.load(Ordering::Acquire)
            || watcher.as_ref().is_some_and(|w| !w.is_finished())
        {
            return;
        }
        let weak = Arc::downgrade(&self.inner);
        match std::thread::Builder::new()
            .name(WATCHER_THREAD.to_owned())
            .spawn(move || listen_for_switches(&weak))
        {
            Ok(handle) => *watcher = Some(handle),
            Err(e) => log::warn!("redmutex: cannot start the sentinel listener: {e}"),
        }
    }
}

impl SentinelState {
    fn server(&self) -> Server {
        Server {
            address: Arc::from(format!("sentinel master {:?}", self.settings.master_name)),
            connect_timeout: self.settings.connect_timeout,
            response_timeout: self.settings.response_timeout,
        }
    }

    /// Drops the master in use: the next call finds it again through the sentinels.
    fn forget_master(&self) {
        if self.master.write().take().is_some() {
            self.generation.fetch_add(1, Ordering::AcqRel);
        }
    }

    /// Asks the sentinels, in turn, for the master, and checks it with `ROLE`.
    fn discover(&self, doing: Doing<'_>) -> Result<Arc<Master>> {
        let _one_at_a_time = self.discovering.lock();
        if let Some(master) = self.master.read().as_ref() {
            return Ok(Arc::clone(master));
        }
        let s = &self.settings;
        let (mut unknown, mut named) = (0, 0);
        let mut failures = Vec::new();
        for sentinel in &s.sentinels {
            let at = sentinel.get_connection_info().addr().to_string();
            match self.ask(sentinel) {
                Ok(Some((host, port))) => {
                    self.answered.store(true, Ordering::Relaxed);
                    match self.check_master(&host, port) {
                        Ok(master) => {
                            let master = Arc::new(master);
                            self.learn_replicas(&master);
                            *self.master.write() = Some(Arc::clone(&master));
                            return Ok(master);
                        }
                        Err(e) => {
                            named += 1;
                            failures.push(format!("{host}:{port} named by {at}: {e}"));
                        }
                    }
                }
                Ok(None) => unknown += 1,
                Err(e) => failures.push(format!("sentinel {at}: {e}")),
            }
        }
        // Every sentinel that answered says the name is unknown: a wrong name, not an outage
        // (the sentinels that did not answer are no reason to wait for it).
        if unknown > 0 && named == 0 {
            let silent = match failures.len() {
                0 => String::new(),
                n => format!("; {n} more did not answer: {}", failures.join("; ")),
            };
            return Err(Error::new(
                ErrorKind::Config,
                format!(
                    "the sentinels do not know a master named {:?}: {unknown} of {} said so \
                     while {doing}{silent}",
                    s.master_name,
                    s.sentinels.len(),
                ),
            )
            .at_checkout());
        }
        Err(Error::new(
            ErrorKind::Connection,
            format!(
                "no sentinel named a reachable master {:?} while {doing}: {}",
                s.master_name,
                failures.join("; ")
            ),
        )
        .at_checkout())
    }

    /// One sentinel's answer: the master's address, or `None` when it knows no such master.
    fn ask(&self, sentinel: &redis::Client) -> redis::RedisResult<Option<(String, u16)>> {
        let s = &self.settings;
        let mut conn = sentinel.get_connection_with_timeout(s.connect_timeout)?;
        conn.set_read_timeout(Some(s.response_timeout))?;
        conn.set_write_timeout(Some(s.response_timeout))?;
        redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&s.master_name)
            .query(&mut conn)
    }

    /// Tells the master's pool how many of its replicas a failover may promote: those that
    /// no sentinel that answered counts as down (`s_down`, `o_down`, `disconnected`), so
    /// that acquires waiting for replicas do not wait for a dead one. Not known (every
    /// replica is asked for) when no sentinel answers `SENTINEL REPLICAS`.
    fn learn_replicas(&self, master: &Master) {
        let s = &self.settings;
        let mut views: Vec<Vec<(String, bool)>> = Vec::new();
        for sentinel in &s.sentinels {
            let view = (|| -> redis::RedisResult<Vec<(String, bool)>> {
                let mut conn = sentinel.get_connection_with_timeout(s.connect_timeout)?;
                conn.set_read_timeout(Some(s.response_timeout))?;
                conn.set_write_timeout(Some(s.response_timeout))?;
                let replicas: Vec<std::collections::HashMap<String, String>> =
                    redis::cmd("SENTINEL")
                        .arg("REPLICAS")
                        .arg(&s.master_name)
                        .query(&mut conn)?;
                Ok(replicas
                    .into_iter()
                    .map(|r| {
                        let name = r.get("name").cloned().unwrap_or_default();
                        let flags = r.get("flags").map_or("", String::as_str);
                        let down = flags
                            .split(',')
                            .any(|f| matches!(f, "s_down" | "o_down" | "disconnected"));
                        (name, down)
                    })
                    .collect())
            })();
            match view {
                Ok(view) => views.push(view),
                Err(e) => log::debug!("redmutex: a sentinel did not list the replicas: {e}"),
            }
        }
        // Down only when every sentinel that answered says so (or does not list it).
        let mut names: Vec<&String> = views.iter().flatten().map(|(n, _)| n).collect();
        names.sort();
        names.dedup();
        let up = names
            .into_iter()
            .filter(|name| {
                views
                    .iter()
                    .any(|view| view.iter().any(|(listed, down)| listed == *name && !*down))
            })
            .count();
        // Only a majority of the sentinels may say how many replicas a failover can promote:
        // a client cut off with its master by a partition reaches only the sentinels on its
        // side, which count every replica down, and would then ask no replica at all while
        // the master it still reaches grants locks that the majority's failover forgets. The
        // count it had stays (or stays unknown) until a majority answers again.
        let majority = s.sentinels.len() / 2 + 1;
        if views.len() < majority {
            log::debug!(
                "redmutex: {} of {} sentinels listed the replicas: the count of replicas a \
                 failover may promote stays as it was",
                views.len(),
                s.sentinels.len()
            );
            return;
        }
        let promotable = u32::try_from(up).unwrap_or(u32::MAX);
        master
            .pool
            .features()
            .set_promotable_replicas(Some(promotable));
    }

    /// Learns again which replicas of the master in use a failover may promote (a sentinel
    /// announced a replica down, back, or new).
    fn replicas_changed(&self) {
        let master = self.master.read().clone();
        if let Some(master) = master {
            self.learn_replicas(&master);
        }
    }

    /// The node at (host, port), if it says it is a master.
    fn check_master(&self, host: &str, port: u16) -> Result<Master> {
        let s = &self.settings;
        let client = (s.nodes)(host, port, redis::ProtocolVersion::RESP2)?;
        let server = Server {
            address: Arc::from(format!("{host}:{port}")),
            connect_timeout: s.connect_timeout,
            response_timeout: s.response_timeout,
        };
        let doing = Doing::work("checking the master's role");
        let role: Vec<redis::Value> = (|| {
            let mut conn = client.get_connection_with_timeout(s.connect_timeout)?;
            conn.set_read_timeout(Some(s.response_timeout))?;
            conn.set_write_timeout(Some(s.response_timeout))?;
            redis::cmd("ROLE").query(&mut conn)
        })()
        .map_err(|e| Error::from_call(&server, doing, e))?;
        let is_master = role
            .first()
            .and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
            .is_some_and(|r| r == "master");
        if !is_master {
            return Err(Error::new(
                ErrorKind::Connection,
                format!("{} is not a master (ROLE)", server.address),
            ));
        }
        Ok(Master {
            subscriber: (s.nodes)(host, port, redis::ProtocolVersion::RESP3)?,
            pool: Pool::new(client, server, s.pool),
        })
    }
}

impl Deployment for Sentinel {
    #[inline]
    fn shard_of(&self, _route: &str) -> usize {
        0
    }

    fn checkout(&self, _shard: usize, doing: Doing<'_>, by: Option<Duration>) -> Result<Checkout> {
        self.master(doing)?.pool.get(doing, by)
    }

    fn subscriber_connection(&self, _shard: usize) -> redis::RedisResult<redis::Connection> {
        let s = &self.inner.settings;
        let master = self.master(Doing::work("connecting the subscriber"));
        let client = master
            .as_ref()
            .map(|m| &m.subscriber)
            .map_err(|e| e.to_string());
        super::subscriber_of(client, s.connect_timeout, s.response_timeout)
    }

    fn server(&self, _shard: usize) -> Server {
        match self.inner.master.read().as_ref() {
            Some(master) => master.pool.server().clone(),
            None => self.inner.server(),
        }
    }

    fn describe(&self) -> String {
        format!(
            "sentinel master {:?} via {} sentinels",
            self.inner.settings.master_name,
            self.inner.settings.sentinels.len()
        )
    }

    fn call_failed(&self, _shard: usize, err: &Error) {
        let demoted = err.is_server_code("READONLY");
        let dropped = err.is_connection() && !err.is_checkout();
        if demoted || dropped {
            log::debug!("redmutex: looking for the sentinel master again after: {err}");
            self.inner.forget_master();
        }
    }

    fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    fn shutdown(&self, wait: bool) {
        self.inner.stopped.store(true, Ordering::Release);
        if let Some(watcher) = self.inner.watcher.lock().take() {
            // It ends on its own once it sees `stopped`; not joined from itself.
            if wait && watcher.thread().id() != std::thread::current().id() {
                let _ = watcher.join();
            }
        }
    }

    fn answered(&self) -> bool {
        self.inner.answered.load(Ordering::Relaxed)
    }

    fn settle_unread(&self) {
        let master = self.inner.master.read().clone();
        if let Some(master) = master {
            master.pool.settle_idle();
        }
    }
}

/// The events that say a new master serves our name: `+promoted-slave` (from the sentinel that
/// leads the failover, as soon as the replica is promoted) and `+switch-master` (from every
/// sentinel, when the failover ends).
const SWITCH_EVENTS: [&str; 2] = ["+promoted-slave", "+switch-master"];

/// The events that say a replica went down, came back, or joined: which replicas a failover
/// may promote changed.
const REPLICA_EVENTS: [&str; 3] = ["+sdown", "-sdown", "+slave"];

/// Listens on every sentinel for a new master of our name, and drops the master in use when
/// one is announced. Ends when the deployment is gone or shut down.
fn listen_for_switches(inner: &Weak<SentinelState>) {
    let mut conns: Vec<Option<redis::Connection>> = Vec::new();
    let mut next_connect = std::time::Instant::now();
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        if strong.stopped.load(Ordering::Acquire) {
            return;
        }
        let s = &strong.settings;
        conns.resize_with(s.sentinels.len(), || None);
        if std::time::Instant::now() >= next_connect {
            for (sentinel, slot) in s.sentinels.iter().zip(conns.iter_mut()) {
                if slot.is_none() {
                    *slot = subscribe_to_events(sentinel, s.connect_timeout).ok();
                }
            }
            next_connect = std::time::Instant::now() + Duration::from_secs(1);
        }
        let mut listening = false;
        for slot in conns.iter_mut() {
            let Some(conn) = slot.as_mut() else {
                continue;
            };
            listening = true;
            match conn.recv_response() {
                Ok(redis::Value::Push {
                    kind: redis::PushKind::Message,
                    data,
                }) => {
                    let text = |v: Option<&redis::Value>| {
                        v.and_then(|v| redis::from_redis_value_ref::<String>(v).ok())
                    };
                    let channel = text(data.first()).unwrap_or_default();
                    if REPLICA_EVENTS.contains(&channel.as_str()) {
                        if text(data.get(1)).is_some_and(|p| strong.is_our_replica(&p)) {
                            strong.replicas_changed();
                        }
                    } else if let Some((host, port)) =
                        text(data.get(1)).and_then(|p| strong.new_master_in(&p))
                    {
                        log::debug!("redmutex: the sentinels announced a new master {host}:{port}");
                        strong.switch_to(&host, port);
                    }
                }
                Ok(_) => {}
                Err(e) if e.is_timeout() => {}
                Err(_) => *slot = None,
            }
        }
        drop(strong);
        if !listening {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// A RESP3 connection to a sentinel, subscribed to the switch events, read in short waits.
fn subscribe_to_events(
    sentinel: &redis::Client,
    connect_timeout: Duration,
) -> redis::RedisResult<redis::Connection> {
    let mut conn = sentinel.get_connection_with_timeout(connect_timeout)?;
    conn.set_read_timeout(Some(Duration::from_millis(100)))?;
    conn.set_write_timeout(Some(connect_timeout))?;
    conn.send_packed_command(
        &redis::cmd("SUBSCRIBE")
            .arg(&SWITCH_EVENTS[..])
            .arg(&REPLICA_EVENTS[..])
            .get_packed_command(),
    )?;
    Ok(conn)
}

impl SentinelState {
    /// Whether a replica event (`slave <name> <ip> <port> @ <master name> …`) is about a
    /// replica of our master.
    fn is_our_replica(&self, payload: &str) -> bool {
        let words: Vec<&str> = payload.split(' ').collect();
        matches!(words.as_slice(), ["slave", _, _, _, "@", name, ..] if *name == self.settings.master_name)
    }

    /// The new master's address in the payload of a switch event for our master, when it is
    /// not the master in use already.
    fn new_master_in(&self, payload: &str) -> Option<(String, u16)> {
        let words: Vec<&str> = payload.split(' ').collect();
        let (name, host, port) = match words.as_slice() {
            // +switch-master: <name> <old ip> <old port> <new ip> <new port>
            [name, _, _, host, port] => (*name, *host, *port),
            // +promoted-slave: slave <ip:port> <ip> <port> @ <name> <master ip> <master port>
            ["slave", _, host, port, "@", name, _, _] => (*name, *host, *port),
            _ => return None,
        };
        if name != self.settings.master_name {
            return None;
        }
        let address = format!("{host}:{port}");
        let port: u16 = port.parse().ok()?;
        let current = self.master.read();
        match current.as_ref() {
            Some(m) if *m.pool.server().address == *address => None,
            _ => Some((host.to_owned(), port)),
        }
    }

    /// Moves to the announced master at once (the sentinels may still name the old one for a
    /// while: they switch when the failover ends), once it says `ROLE` master; else drops
    /// the master in use, so that the next call asks the sentinels.
    fn switch_to(&self, host: &str, port: u16) {
        let _one_at_a_time = self.discovering.lock();
        match self.check_master(host, port) {
            Ok(master) => {
                self.learn_replicas(&master);
                *self.master.write() = Some(Arc::new(master));
                self.generation.fetch_add(1, Ordering::AcqRel);
            }
            Err(e) => {
                log::debug!("redmutex: the announced master is not usable yet: {e}");
                self.forget_master();
            }
        }
    }
}
