//! Network partitions for tests: "hosts" are Linux network namespaces, each attached by a
//! veth pair to one bridge in the root namespace (which has an address on the bridge too, so
//! the test reaches every host). A host runs `redis-server`s, sentinels and client helper
//! processes (this test binary again, inside the namespace), and is cut off from every other
//! host and from the test by taking its link down.
//!
//! Needs root and iproute2 (`ip`); [`usable`] says whether the tests can run, and fails them
//! when `CI` is set. Names carry the process id and a counter, so tests of one binary and
//! several binaries at once do not collide; what a crashed run left behind (its process is
//! gone) is removed by the next run (`namespaces`, shared with the fault-injection soak). Everything a [`Net`] made is removed when
//! it is dropped, also when a test fails.
//!
//! A helper prints events on its stdout as `@@ev <kind> [<args>…] <t>`, `t` being
//! `CLOCK_MONOTONIC` in microseconds ([`now_us`]): the clock is the kernel's, shared by every
//! namespace, so events of different processes order on one clock.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[path = "../../examples/fault_injection/harness/namespaces.rs"]
mod namespaces;
use namespaces::{free_subnet, ip, kill_namespace_processes, next_id, remove_stale};

/// What a test prints when it cannot run here.
pub const SKIP: &str = "skipped: needs root and iproute2 for network namespaces";

/// Whether network namespaces can be made here (root, and `ip` installed). Prints why not
/// and returns `false`, except when `CI` is set: there it panics (CI runs as root).
pub fn usable() -> bool {
    let Err(missing) = namespaces::root_and_ip() else {
        return true;
    };
    let why = format!("{SKIP} ({missing})");
    if std::env::var_os("CI").is_some() {
        panic!("{why}; CI is set, where these tests must run");
    }
    eprintln!("{why}");
    false
}

/// `CLOCK_MONOTONIC` in microseconds: the same clock in every namespace and process of this
/// kernel.
pub fn now_us() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) failed");
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

fn ip_or_panic(args: &[&str]) {
    if let Err(e) = ip(args) {
        panic!("{e}");
    }
}

/// A bridge and the hosts attached to it. Dropping it kills every process in its hosts and
/// removes the namespaces, the veth pairs and the bridge.
pub struct Net {
    id: String,
    bridge: Option<String>,
    gateway: String,
    hosts: Vec<Host>,
    dir: PathBuf,
}

/// One host: a network namespace with one interface (`eth0`) on the bridge.
pub struct Host {
    label: String,
    ns: String,
    /// The root-namespace end of the veth pair, a port of the bridge.
    veth: String,
    ip: String,
    dir: PathBuf,
}

impl Net {
    /// Makes a bridge with `hosts` hosts on it, labelled `a`, `b`, `c`…, on a /24 of its own.
    pub fn new(hosts: usize) -> Net {
        assert!((1..=9).contains(&hosts), "1 to 9 hosts");
        remove_stale();
        let id = next_id();
        // Away from the soak's 60..100.
        let (x, y) = free_subnet(100..250).expect("a free 10.x.y.0/24 subnet");
        let mut net = Net {
            bridge: None,
            gateway: format!("10.{x}.{y}.1"),
            hosts: Vec::new(),
            dir: super::scratch_dir(&format!("netns-{id}")),
            id,
        };
        let bridge = format!("{}b", net.id);
        // The longest name made here is a veth's, `<id>v<i>`: at most 15 bytes (IFNAMSIZ).
        assert!(
            net.id.len() + 2 <= 15,
            "{} is too long for an interface name",
            net.id
        );
        ip_or_panic(&["link", "add", &bridge, "type", "bridge"]);
        net.bridge = Some(bridge.clone());
        ip_or_panic(&[
            "addr",
            "add",
            &format!("{}/24", net.gateway),
            "dev",
            &bridge,
        ]);
        ip_or_panic(&["link", "set", &bridge, "up"]);
        for i in 0..hosts {
            let label = ((b'a' + i as u8) as char).to_string();
            let host = Host {
                ns: format!("{}h{i}", net.id),
                veth: format!("{}v{i}", net.id),
                ip: format!("10.{x}.{y}.{}", 10 + i),
                dir: net.dir.join(&label),
                label,
            };
            std::fs::create_dir_all(&host.dir).expect("host directory");
            ip_or_panic(&["netns", "add", &host.ns]);
            let veth = host.veth.clone();
            let ns = host.ns.clone();
            // Pushed now: a failure below still removes it.
            net.hosts.push(host);
            ip_or_panic(&[
                "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ]);
            ip_or_panic(&["link", "set", &veth, "master", &bridge]);
            ip_or_panic(&["link", "set", &veth, "up"]);
            let ip_addr = format!("{}/24", net.hosts[i].ip);
            ip_or_panic(&["-n", &ns, "addr", "add", &ip_addr, "dev", "eth0"]);
            ip_or_panic(&["-n", &ns, "link", "set", "eth0", "up"]);
            ip_or_panic(&["-n", &ns, "link", "set", "lo", "up"]);
        }
        net
    }

    pub fn host(&self, i: usize) -> &Host {
        &self.hosts[i]
    }

    pub fn hosts(&self) -> &[Host] {
        &self.hosts
    }

    /// The root namespace's address on the bridge.
    pub fn gateway(&self) -> &str {
        &self.gateway
    }

    /// Where the servers' and helpers' files are (kept when a test fails).
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for host in &self.hosts {
            kill_namespace_processes(&host.ns);
            let _ = ip(&["link", "del", &host.veth]);
            let _ = ip(&["netns", "del", &host.ns]);
        }
        if let Some(bridge) = &self.bridge {
            let _ = ip(&["link", "del", bridge]);
        }
        if std::thread::panicking() {
            eprintln!(
                "netns {}: the servers' and helpers' files are kept in {}",
                self.id,
                self.dir.display()
            );
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

impl Host {
    /// `a`, `b`, `c`…
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The host's address on the bridge.
    pub fn ip(&self) -> &str {
        &self.ip
    }

    pub fn namespace(&self) -> &str {
        &self.ns
    }

    /// Cuts the host off: its bridge port (the root end of its veth pair) goes down, so the
    /// host's `eth0` loses its carrier. Packets either way are dropped silently (no reset,
    /// no unreachable), to every other host and to the root namespace, as when a cable is
    /// pulled; traffic inside the host goes on.
    pub fn partition(&self) {
        ip_or_panic(&["link", "set", &self.veth, "down"]);
    }

    /// Undoes [`partition`](Host::partition).
    pub fn heal(&self) {
        ip_or_panic(&["link", "set", &self.veth, "up"]);
    }

    /// `program` to be run inside this host: `ip netns exec NS program` (which execs it:
    /// the child's pid is the program's).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("ip");
        command.args(["netns", "exec", &self.ns]).arg(program);
        command
    }

    /// Starts [`super::server_binary`] on this host's address and `port`, without
    /// persistence, with extra arguments; waits until it answers `PING` from the test.
    pub fn start_redis(&self, port: u16, extra: &[&str]) -> NsServer {
        let dir = self.dir.join(format!("redis-{port}"));
        std::fs::create_dir_all(&dir).expect("server directory");
        let mut command = self.command(super::server_binary());
        command
            .args(["--port", &port.to_string()])
            .args(["--bind", &self.ip])
            .args(["--protected-mode", "no"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--dir", dir.to_str().expect("utf-8 path")])
            .args(["--logfile", "redis.log"])
            .args(extra);
        NsServer::spawn(self, port, dir, "redis.log", command)
    }

    /// Starts a sentinel on this host's address and `port`, with `settings` (lines of
    /// `sentinel.conf`, such as `sentinel monitor …`) after the address and files.
    pub fn start_sentinel(&self, port: u16, settings: &str) -> NsServer {
        let dir = self.dir.join(format!("sentinel-{port}"));
        std::fs::create_dir_all(&dir).expect("sentinel directory");
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind {}\nprotected-mode no\ndir {}\nlogfile sentinel.log\n{settings}\n",
                self.ip,
                dir.display()
            ),
        )
        .expect("write sentinel.conf");
        let mut command = self.command(super::server_binary());
        command.arg(&conf).arg("--sentinel");
        NsServer::spawn(self, port, dir, "sentinel.log", command)
    }

    /// Starts a client helper on this host: this test binary again, inside the namespace,
    /// running only the test `entry`, which calls [`serve_helper`]. `name` names it in
    /// messages (`c1`…). Waits until it says it is ready.
    pub fn spawn_helper(&self, entry: &str, name: &str, spec: &HelperSpec) -> Helper {
        let stderr_path = self.dir.join(format!("helper-{name}.stderr"));
        let stderr = std::fs::File::create(&stderr_path).expect("helper stderr file");
        let exe = std::env::current_exe().expect("the test binary");
        let mut child = self
            .command(exe)
            .args([entry, "--exact", "--nocapture", "--test-threads", "1"])
            .env(HELPER_ROLE, spec.role.as_str())
            .env(HELPER_URLS, spec.urls.join(" "))
            .env(HELPER_SETTINGS, spec.settings.encode())
            .env_remove(super::ROLE)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(stderr))
            .spawn()
            .expect("spawn a helper with ip netns exec");
        let stdout = child.stdout.take().expect("piped stdout");
        let stdin = child.stdin.take();
        let (tx, rx) = channel();
        let transcript = Arc::new(Mutex::new(Vec::new()));
        let lines = Arc::clone(&transcript);
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                lines
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(line.clone());
                // The test harness may print its own text before ours on the same line.
                if let Some(at) = line.find(EVENT_MARK) {
                    if let Some(event) = Event::parse(&line[at + EVENT_MARK.len()..]) {
                        if tx.send(event).is_err() {
                            break;
                        }
                    }
                }
            }
        });
        let mut helper = Helper {
            name: format!("{name} (on host {})", self.label),
            child,
            stdin,
            events: rx,
            seen: Vec::new(),
            transcript,
            stderr_path,
        };
        helper.expect("ready", Duration::from_secs(60));
        helper
    }
}

/// A `redis-server` or sentinel running in a host; killed when dropped.
pub struct NsServer {
    ip: String,
    port: u16,
    label: String,
    dir: PathBuf,
    logfile: &'static str,
    child: Option<Child>,
}

impl NsServer {
    fn spawn(
        host: &Host,
        port: u16,
        dir: PathBuf,
        logfile: &'static str,
        mut command: Command,
    ) -> NsServer {
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawning {command:?}: {e}"));
        let mut server = NsServer {
            ip: host.ip.clone(),
            port,
            label: format!("{}:{port}", host.label),
            dir,
            logfile,
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(Ok(Some(status))) = server.child.as_mut().map(Child::try_wait) {
                server.child = None;
                panic!(
                    "{} exited at start with {status}: {}",
                    server.label,
                    server.log_tail(20)
                );
            }
            if server.ping() {
                return server;
            }
            if Instant::now() > deadline {
                panic!(
                    "{} did not answer PING within 30 s: {}",
                    server.label,
                    server.log_tail(20)
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `a:6379`: the host's label and the port.
    pub fn label(&self) -> &str {
        &self.label
    }

    pub fn ip(&self) -> &str {
        &self.ip
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `10.x.y.z:port`
    pub fn addr(&self) -> String {
        format!("{}:{}", self.ip, self.port)
    }

    /// `redis://10.x.y.z:port/`
    pub fn url(&self) -> String {
        format!("redis://{}:{}/", self.ip, self.port)
    }

    /// A connection from the test (root namespace), with `timeout` to connect and per call.
    pub fn try_conn(&self, timeout: Duration) -> redis::RedisResult<redis::Connection> {
        let conn = redis::Client::open(self.url())?.get_connection_with_timeout(timeout)?;
        conn.set_read_timeout(Some(timeout))?;
        conn.set_write_timeout(Some(timeout))?;
        Ok(conn)
    }

    /// A connection from the test; panics when the server cannot be reached within 5 s.
    pub fn conn(&self) -> redis::Connection {
        self.try_conn(Duration::from_secs(5))
            .unwrap_or_else(|e| panic!("connecting to {}: {e}", self.label))
    }

    fn ping(&self) -> bool {
        let Ok(mut conn) = self.try_conn(Duration::from_millis(500)) else {
            return false;
        };
        redis::cmd("PING").query::<String>(&mut conn).is_ok()
    }

    /// A field of the `field:value` text that `command arg` answers (`INFO replication`,
    /// `CLUSTER INFO`); `None` when the server does not answer within 2 s.
    pub fn field_of(&self, command: &str, arg: &str, field: &str) -> Option<String> {
        let mut conn = self.try_conn(Duration::from_secs(2)).ok()?;
        let text: String = redis::cmd(command).arg(arg).query(&mut conn).ok()?;
        let prefix = format!("{field}:");
        text.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .map(|v| v.trim().to_owned())
    }

    /// A field of `INFO section`.
    pub fn info_field(&self, section: &str, field: &str) -> Option<String> {
        self.field_of("INFO", section, field)
    }

    /// Every string key whose value contains `needle`, as `key=value` (a cluster replica
    /// is read after `READONLY`).
    pub fn keys_holding(&self, needle: &str) -> redis::RedisResult<Vec<String>> {
        let mut conn = self.try_conn(Duration::from_secs(5))?;
        // Lets a cluster replica answer reads; an error elsewhere (no cluster) is fine.
        let _: redis::RedisResult<()> = redis::cmd("READONLY").query(&mut conn);
        let mut found = Vec::new();
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("COUNT")
                .arg(1000)
                .query(&mut conn)?;
            for key in keys {
                let kind: String = redis::cmd("TYPE").arg(&key).query(&mut conn)?;
                if kind != "string" {
                    continue;
                }
                let value: Option<String> = redis::cmd("GET").arg(&key).query(&mut conn)?;
                if let Some(value) = value.filter(|v| v.contains(needle)) {
                    found.push(format!("{key}={value}"));
                }
            }
            if next == 0 {
                return Ok(found);
            }
            cursor = next;
        }
    }

    /// `GET key` (after `READONLY`, for a cluster replica).
    pub fn get(&self, key: &str) -> redis::RedisResult<Option<String>> {
        let mut conn = self.try_conn(Duration::from_secs(5))?;
        let _: redis::RedisResult<()> = redis::cmd("READONLY").query(&mut conn);
        redis::cmd("GET").arg(key).query(&mut conn)
    }

    /// The last `lines` lines of the server's log.
    pub fn log_tail(&self, lines: usize) -> String {
        tail(&self.dir.join(self.logfile), lines)
    }
}

impl Drop for NsServer {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn tail(path: &Path, lines: usize) -> String {
    let mut text = String::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let _ = f.read_to_string(&mut text);
    }
    let all: Vec<&str> = text.lines().collect();
    let from = all.len().saturating_sub(lines);
    format!("\n--- {} ---\n{}", path.display(), all[from..].join("\n"))
}

// ---------------------------------------------------------------------------------------
// Client helpers

const EVENT_MARK: &str = "@@ev ";
/// The environment variables that make this test binary a helper.
pub const HELPER_ROLE: &str = "REDMUTEX_NETNS_ROLE";
pub const HELPER_URLS: &str = "REDMUTEX_NETNS_URLS";
pub const HELPER_SETTINGS: &str = "REDMUTEX_NETNS_SETTINGS";

/// What a helper's client is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A `redmutex::Client` over one URL (a Sentinel or Cluster URL, or one server).
    Client,
    /// A `redmutex::Redlock` over several servers' URLs.
    Redlock,
}

impl Role {
    fn as_str(self) -> &'static str {
        match self {
            Role::Client => "client",
            Role::Redlock => "redlock",
        }
    }
}

/// The client settings of a helper (milliseconds; `None` keeps the crate's default).
#[derive(Clone, Debug, Default)]
pub struct Settings {
    pub lease_ms: Option<u64>,
    pub renewal_ms: Option<u64>,
    pub connect_ms: Option<u64>,
    pub response_ms: Option<u64>,
    /// `replica_acks(n, timeout)`; `None` keeps the default (one replica under Sentinel and
    /// in a Cluster).
    pub replica_acks: Option<(u32, u64)>,
    /// `no_replica_acks()`.
    pub no_replica_acks: bool,
    pub outage_patience_ms: Option<u64>,
    /// Redlock's per-instance timeout.
    pub instance_ms: Option<u64>,
}

impl Settings {
    fn encode(&self) -> String {
        let mut parts = Vec::new();
        let mut put = |k: &str, v: Option<u64>| {
            if let Some(v) = v {
                parts.push(format!("{k}={v}"));
            }
        };
        put("lease", self.lease_ms);
        put("renewal", self.renewal_ms);
        put("connect", self.connect_ms);
        put("response", self.response_ms);
        put("patience", self.outage_patience_ms);
        put("instance", self.instance_ms);
        if let Some((n, ms)) = self.replica_acks {
            parts.push(format!("acks={n}/{ms}"));
        }
        if self.no_replica_acks {
            parts.push("noacks=1".to_owned());
        }
        parts.join(",")
    }

    fn decode(text: &str) -> Settings {
        let mut s = Settings::default();
        for part in text.split(',').filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').expect("key=value");
            let ms = || v.parse::<u64>().expect("a number");
            match k {
                "lease" => s.lease_ms = Some(ms()),
                "renewal" => s.renewal_ms = Some(ms()),
                "connect" => s.connect_ms = Some(ms()),
                "response" => s.response_ms = Some(ms()),
                "patience" => s.outage_patience_ms = Some(ms()),
                "instance" => s.instance_ms = Some(ms()),
                "noacks" => s.no_replica_acks = true,
                "acks" => {
                    let (n, t) = v.split_once('/').expect("n/ms");
                    s.replica_acks = Some((n.parse().expect("n"), t.parse().expect("ms")));
                }
                other => panic!("unknown helper setting {other}"),
            }
        }
        s
    }

    fn builder(&self) -> redmutex::Builder {
        let ms = Duration::from_millis;
        let mut b = redmutex::Client::builder();
        if let Some(v) = self.lease_ms {
            b = b.default_lease(ms(v));
        }
        if let Some(v) = self.renewal_ms {
            b = b.renewal_interval(ms(v));
        }
        if let Some(v) = self.connect_ms {
            b = b.connect_timeout(ms(v));
        }
        if let Some(v) = self.response_ms {
            b = b.response_timeout(ms(v));
        }
        if let Some(v) = self.outage_patience_ms {
            b = b.outage_patience(ms(v));
        }
        if let Some((n, t)) = self.replica_acks {
            b = b.replica_acks(n, ms(t));
        }
        if self.no_replica_acks {
            b = b.no_replica_acks();
        }
        b
    }
}

/// What a helper runs: its role, its URLs and its client settings.
#[derive(Clone, Debug)]
pub struct HelperSpec {
    pub role: Role,
    pub urls: Vec<String>,
    pub settings: Settings,
}

/// One event a helper printed.
#[derive(Clone, Debug)]
pub struct Event {
    /// `ready`, `opened`, `acquired`, `not-acquired`, `error`, `told`, `unlocked`,
    /// `unlock-error`…
    pub kind: String,
    /// The words between the kind and the time (`acquired`: the fencing token; errors: the
    /// operation, the error kind and the message).
    pub args: Vec<String>,
    /// `CLOCK_MONOTONIC` in microseconds, when it happened.
    pub t: u64,
}

impl Event {
    fn parse(text: &str) -> Option<Event> {
        let words: Vec<&str> = text.split_whitespace().collect();
        if words.len() < 2 {
            return None;
        }
        let t = words[words.len() - 1].parse().ok()?;
        Some(Event {
            kind: words[0].to_owned(),
            args: words[1..words.len() - 1]
                .iter()
                .map(|w| w.to_string())
                .collect(),
            t,
        })
    }

    /// The first argument as a number (`acquired`'s fencing token).
    pub fn number(&self) -> u64 {
        self.args
            .first()
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no number in {self:?}"))
    }
}

/// A client helper process running in a host; killed when dropped.
pub struct Helper {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    events: Receiver<Event>,
    /// Every event read so far, and whether a `next` returned it.
    seen: Vec<(Event, bool)>,
    transcript: Arc<Mutex<Vec<String>>>,
    stderr_path: PathBuf,
}

impl Helper {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Sends one command line: `open`, `lock NAME WAIT_MS`, `unlock`, `quit`.
    pub fn send(&mut self, command: &str) {
        let name = self.name.clone();
        let stdin = self.stdin.as_mut().expect("helper stdin");
        if let Err(e) = writeln!(stdin, "{command}").and_then(|()| stdin.flush()) {
            panic!("sending {command:?} to helper {name}: {e}");
        }
    }

    fn drain(&mut self) {
        while let Ok(e) = self.events.try_recv() {
            self.seen.push((e, false));
        }
    }

    /// The first event not returned before whose kind is one of `kinds`, waiting up to
    /// `timeout` for it.
    pub fn next(&mut self, kinds: &[&str], timeout: Duration) -> Option<Event> {
        let deadline = Instant::now() + timeout;
        loop {
            self.drain();
            if let Some((e, taken)) = self
                .seen
                .iter_mut()
                .find(|(e, taken)| !*taken && kinds.contains(&e.kind.as_str()))
            {
                *taken = true;
                return Some(e.clone());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            match self.events.recv_timeout(left) {
                Ok(e) => self.seen.push((e, false)),
                Err(RecvTimeoutError::Timeout) => return None,
                Err(RecvTimeoutError::Disconnected) => {
                    // The helper ended: nothing more will come.
                    self.drain();
                    if self
                        .seen
                        .iter()
                        .any(|(e, taken)| !*taken && kinds.contains(&e.kind.as_str()))
                    {
                        continue;
                    }
                    return None;
                }
            }
        }
    }

    /// Like [`next`](Helper::next) with one kind, but panics (with the helper's output) when
    /// it does not come.
    pub fn expect(&mut self, kind: &str, timeout: Duration) -> Event {
        match self.next(&[kind], timeout) {
            Some(e) => e,
            None => panic!(
                "helper {} did not say {kind:?} within {timeout:?}{}",
                self.name,
                self.report()
            ),
        }
    }

    /// Every event so far, in order.
    pub fn history(&mut self) -> Vec<Event> {
        self.drain();
        self.seen.iter().map(|(e, _)| e.clone()).collect()
    }

    /// The helper's output so far and the end of its stderr, for failure messages.
    pub fn report(&self) -> String {
        let lines = self
            .transcript
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let from = lines.len().saturating_sub(40);
        format!(
            "\n--- helper {} stdout ---\n{}{}",
            self.name,
            lines[from..].join("\n"),
            tail(&self.stderr_path, 20)
        )
    }
}

impl Drop for Helper {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// In a helper process: the role, URLs and settings from the environment; `None` in a
/// normal test run.
pub fn helper_spec() -> Option<HelperSpec> {
    let role = match std::env::var(HELPER_ROLE).ok()?.as_str() {
        "client" => Role::Client,
        "redlock" => Role::Redlock,
        other => panic!("unknown helper role {other}"),
    };
    Some(HelperSpec {
        role,
        urls: std::env::var(HELPER_URLS)
            .unwrap_or_default()
            .split_whitespace()
            .map(str::to_owned)
            .collect(),
        settings: Settings::decode(&std::env::var(HELPER_SETTINGS).unwrap_or_default()),
    })
}

/// Prints one event, stamped with [`now_us`] taken now.
fn emit(kind: &str, args: &str) {
    emit_at(kind, args, now_us());
}

fn emit_at(kind: &str, args: &str, t: u64) {
    // One `println!` is one line on the pipe (stdout is line-buffered and locked per call).
    let args = args.split_whitespace().collect::<Vec<_>>().join(" ");
    if args.is_empty() {
        println!("{EVENT_MARK}{kind} {t}");
    } else {
        println!("{EVENT_MARK}{kind} {args} {t}");
    }
}

enum Locker {
    Client(redmutex::Client),
    Redlock(redmutex::Redlock),
}

enum Held {
    Mutex(redmutex::MutexGuard),
    Redlock(redmutex::RedlockGuard),
    Leadership(redmutex::Leadership),
}

fn describe(e: &redmutex::Error) -> String {
    format!("{:?} {e}", e.kind())
}

/// The helper's side, in the test `entry` of a helper process: builds nothing until
/// `open`, then takes commands from stdin, one per line, and prints events:
///
/// - `open` → `opened` (the client is built; a Cluster or Sentinel client reads its
///   deployment on first use), or `error open …`;
/// - `lock NAME WAIT_MS` → `acquired TOKEN`, `not-acquired` or `error lock KIND MESSAGE`;
///   once acquired, a thread waits on the guard's `LeaseWatch` and prints `told` when it
///   says the lease is lost;
/// - `campaign NAME WAIT_MS`: the same for the election `NAME` (a client's only), the term
///   as the token;
/// - `unlock` → `unlocked` or `unlock-error KIND MESSAGE` (a leadership resigns);
/// - `quit`, or the end of stdin: the process exits at once, releasing nothing (as a
///   killed process would).
pub fn serve_helper(spec: HelperSpec) {
    let mut locker: Option<Locker> = None;
    let mut held: Option<Held> = None;
    emit("ready", "");
    let stdin = std::io::stdin();
    for line in stdin.lock().lines() {
        let Ok(line) = line else { break };
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["open"] => {
                let built = match spec.role {
                    Role::Client => spec
                        .settings
                        .builder()
                        .open(spec.urls[0].as_str())
                        .map(Locker::Client),
                    Role::Redlock => {
                        let ms = Duration::from_millis;
                        let mut b =
                            redmutex::Redlock::builder().client_settings(spec.settings.builder());
                        if let Some(v) = spec.settings.instance_ms {
                            b = b.instance_timeout(ms(v));
                        }
                        b.open(spec.urls.iter().map(String::as_str))
                            .map(Locker::Redlock)
                    }
                };
                match built {
                    Ok(l) => {
                        locker = Some(l);
                        emit("opened", "");
                    }
                    Err(e) => emit("error", &format!("open {}", describe(&e))),
                }
            }
            [verb @ ("lock" | "campaign"), name, wait_ms] => {
                let wait = Duration::from_millis(wait_ms.parse().expect("lock NAME WAIT_MS"));
                let Some(l) = locker.as_ref() else {
                    emit("error", "lock NotOpen: open first");
                    continue;
                };
                if held.is_some() {
                    emit("error", "lock AlreadyHeld: unlock first");
                    continue;
                }
                emit("locking", name);
                let (got, t) = match l {
                    Locker::Client(c) if *verb == "campaign" => {
                        let r = c.election(name).campaign_for(wait, "helper");
                        let t = now_us();
                        (r.map(|g| g.map(Held::Leadership)), t)
                    }
                    Locker::Client(c) => {
                        let r = c.mutex(name).try_lock_for(wait);
                        let t = now_us();
                        (r.map(|g| g.map(Held::Mutex)), t)
                    }
                    Locker::Redlock(_) if *verb == "campaign" => {
                        emit("error", "lock Unsupported: a Redlock has no election");
                        continue;
                    }
                    Locker::Redlock(r) => {
                        let r = r.mutex(name).try_lock_for(wait);
                        let t = now_us();
                        (r.map(|g| g.map(Held::Redlock)), t)
                    }
                };
                match got {
                    Ok(Some(guard)) => {
                        let (token, watch) = match &guard {
                            Held::Mutex(g) => (g.fencing_token(), g.lease_watch()),
                            Held::Redlock(g) => (g.fencing_token(), g.lease_watch()),
                            Held::Leadership(l) => (l.term(), l.lease_watch()),
                        };
                        emit_at("acquired", &token.to_string(), t);
                        std::thread::spawn(move || {
                            let lost = watch.wait();
                            let t = now_us();
                            if lost {
                                emit_at("told", "", t);
                            }
                        });
                        held = Some(guard);
                    }
                    Ok(None) => emit_at("not-acquired", "", t),
                    Err(e) => emit_at("error", &format!("lock {}", describe(&e)), t),
                }
            }
            ["unlock"] => {
                let result = match held.take() {
                    None => {
                        emit("unlock-error", "NotHeld nothing is held");
                        continue;
                    }
                    Some(Held::Mutex(g)) => g.unlock(),
                    Some(Held::Redlock(g)) => g.unlock(),
                    Some(Held::Leadership(l)) => l.resign(),
                };
                match result {
                    Ok(()) => emit("unlocked", ""),
                    Err(e) => emit("unlock-error", &describe(&e)),
                }
            }
            ["quit"] => break,
            _ => emit("error", &format!("command UnknownCommand {line}")),
        }
    }
    // Like a killed process: no release, no clean-up.
    std::process::exit(0);
}
