//! Real `redis-server` processes for tests and benchmarks: started on a free loopback port,
//! killed, restarted, paused and resumed on demand, and removed (process and directory) on
//! drop, also when a test fails.

#![allow(dead_code)]

pub mod cluster;
pub mod delay_proxy;
pub mod netns;
pub mod python;
pub mod sentinel;
pub mod tls;

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// A server that accepts connections and never answers (a hung host, a half-open load
/// balancer); it listens, and keeps every connection open, for as long as the test runs.
pub fn silent_server() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let mut open = Vec::new();
        for stream in listener.incoming() {
            open.push(stream);
        }
    });
    port
}

/// A `redis-server` owned by the test.
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
    extra_args: Vec<String>,
    binary: String,
}

/// The server binary that tests and benchmarks start: `$REDMUTEX_SERVER` (a path, which
/// `scripts/ensure-redis --server NAME` prints), else `redis-server` from the `PATH`. Its
/// `--sentinel` mode and `cluster-enabled yes` serve the Sentinel and Cluster tests too.
pub fn server_binary() -> String {
    std::env::var("REDMUTEX_SERVER")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis-server".to_owned())
}

/// What the server binary says of itself: its product and version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerVersion {
    /// `"Redis"` or `"Valkey"`.
    pub product: String,
    /// (major, minor, patch).
    pub version: (u32, u32, u32),
}

impl ServerVersion {
    /// Whether it is Redis (not Valkey) older than `major.minor`.
    pub fn redis_before(&self, major: u32, minor: u32) -> bool {
        self.product == "Redis" && (self.version.0, self.version.1) < (major, minor)
    }
}

/// The version of [`server_binary`], from its `--version` (`Redis server v=7.0.15 …`,
/// `Valkey server v=9.1.2 …`), read once.
pub fn server_version() -> ServerVersion {
    version_of(&server_binary())
}

/// The version of `binary`, from its `--version`, read once per binary.
pub fn version_of(binary: &str) -> ServerVersion {
    static VERSIONS: std::sync::Mutex<Vec<(String, ServerVersion)>> =
        std::sync::Mutex::new(Vec::new());
    let mut known = VERSIONS.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, v)) = known.iter().find(|(b, _)| b == binary) {
        return v.clone();
    }
    let out = Command::new(binary)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| panic!("running {binary} --version (is it installed?): {e}"));
    let text = String::from_utf8_lossy(&out.stdout);
    let product = text.split_whitespace().next().unwrap_or("Redis").to_owned();
    let number = text
        .split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .unwrap_or_else(|| panic!("no version in {binary} --version: {text}"));
    let mut parts = number.split('.').map(|p| p.parse::<u32>().unwrap_or(0));
    let mut next = || parts.next().unwrap_or(0);
    let version = ServerVersion {
        product,
        version: (next(), next(), next()),
    };
    known.push((binary.to_owned(), version.clone()));
    version
}

static NEXT_DIR: AtomicU64 = AtomicU64::new(0);

/// The ports this process handed out, and their bus ports: none is handed out twice. The
/// kernel offers a port that nobody uses again at once, so two tests that start servers at
/// the same moment could otherwise be given the same one, and the second server, failing to
/// bind, would seem to answer with the first.
static HANDED_OUT: std::sync::Mutex<BTreeSet<u16>> = std::sync::Mutex::new(BTreeSet::new());

/// A free loopback port whose port + 10000 is free too: a Cluster node listens there for its
/// bus, and under load the kernel hands out that port to outgoing connections as well (a
/// node whose bus port is taken exits at once, and the kernel would offer the same port
/// again). Never one that this process handed out before.
pub fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
        let port = listener.local_addr().expect("local addr").port();
        let Some(bus) = port.checked_add(10000) else {
            continue;
        };
        if TcpListener::bind(("127.0.0.1", bus)).is_err() {
            continue;
        }
        let mut handed_out = HANDED_OUT
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if !handed_out.contains(&port) && !handed_out.contains(&bus) {
            handed_out.extend([port, bus]);
            return port;
        }
    }
}

/// The process id of the server that answers on `port` (from `INFO server`), `None` when
/// none answers or it does not say (it wants a password).
pub fn process_on(port: u16) -> Option<u32> {
    let timeout = Duration::from_millis(500);
    let addr = format!("127.0.0.1:{port}").parse().ok()?;
    let mut stream = TcpStream::connect_timeout(&addr, timeout).ok()?;
    stream.set_read_timeout(Some(timeout)).ok()?;
    stream.set_write_timeout(Some(timeout)).ok()?;
    stream
        .write_all(b"*2\r\n$4\r\nINFO\r\n$6\r\nserver\r\n")
        .ok()?;
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let len: usize = line.trim_end().strip_prefix('$')?.parse().ok()?;
    let mut body = vec![0; len];
    reader.read_exact(&mut body).ok()?;
    String::from_utf8_lossy(&body)
        .lines()
        .find_map(|l| l.strip_prefix("process_id:"))
        .and_then(|pid| pid.trim().parse().ok())
}

/// `n` standalone servers, each on its own free port (a Redlock's instances).
pub fn servers(n: usize) -> Vec<RedisServer> {
    (0..n).map(|_| RedisServer::start()).collect()
}

/// Each of `clients` takes the `Mutex` `name` `each` times in a thread of its own, holding it
/// a millisecond (the others come to wait meanwhile, so that it passes between the clients),
/// and returns every fencing token taken, sorted.
pub fn take_turns(clients: &[redmutex::Client], name: &str, each: usize) -> Vec<u64> {
    let tokens = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let threads: Vec<_> = clients
        .iter()
        .map(|client| {
            let (m, tokens) = (client.mutex(name), std::sync::Arc::clone(&tokens));
            std::thread::spawn(move || {
                for _ in 0..each {
                    let g = m
                        .try_lock_for(Duration::from_secs(60))
                        .expect("lock")
                        .expect("acquired");
                    tokens.lock().expect("tokens").push(g.fencing_token());
                    std::thread::sleep(Duration::from_millis(1));
                    g.unlock().expect("unlock");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a thread taking turns");
    }
    let mut tokens = tokens.lock().expect("tokens").clone();
    tokens.sort_unstable();
    tokens
}

/// A client for a Redlock instance that fails fast (connect and response timeouts of 500 ms)
/// and holds short leases (2 s, renewed every 300 ms; an outage ridden for 2 s), so that a
/// test sees instances killed and restarted within seconds.
pub fn redlock_client(server: &RedisServer) -> redmutex::Client {
    redmutex::Client::builder()
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
        .default_lease(Duration::from_secs(2))
        .renewal_interval(Duration::from_millis(300))
        .outage_patience(Duration::from_secs(2))
        .open(server.url())
        .unwrap()
}

/// A Redlock over `servers`, with [`redlock_client`]s.
pub fn redlock_over(servers: &[RedisServer]) -> redmutex::Redlock {
    redmutex::Redlock::new(servers.iter().map(redlock_client)).unwrap()
}

/// Whether this is a benchmark's measuring run (`cargo bench` passes `--bench`; a test run of
/// the benchmarks, and every test, does not). The benchmarks ask the same
/// (`common::measuring`), so that servers are set up as a service for exactly the runs that
/// measure.
pub fn measuring() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// Makes the server run as a deployed one does, in a session of its own, and so in a
/// scheduling group of its own: Linux gives each session's processes together a fair share of
/// the CPU (autogroup), and a server in the benchmark's session competed with the
/// benchmark's threads as one of them, so that the client's CPU time was taken from the
/// server's share (16 client threads on two cores left it a seventeenth when all ran). The
/// server is killed when the thread that started it ends (the benchmark's main thread), as
/// it would have been by a Ctrl-C in the benchmark's session. A test keeps its servers in
/// its own session: a Ctrl-C stops them with it.
fn run_as_a_service(command: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: between `fork` and `exec` the closure calls only `setsid` and `prctl`, which
    // are async-signal-safe, and allocates nothing.
    unsafe {
        command.pre_exec(|| {
            if libc::setsid() < 0 || libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

impl RedisServer {
    /// Starts a server with no persistence on a free port.
    pub fn start() -> RedisServer {
        Self::start_with(&[])
    }

    /// Starts a server with extra `redis-server` arguments (`["--maxmemory", "1mb"]`…).
    pub fn start_with(extra: &[&str]) -> RedisServer {
        Self::start_binary(&server_binary(), extra)
    }

    /// Starts `binary` (a `redis-server` of another version) with extra arguments.
    pub fn start_binary(binary: &str, extra: &[&str]) -> RedisServer {
        let dir = std::env::temp_dir().join(format!(
            "redmutex-test-{}-{}",
            std::process::id(),
            NEXT_DIR.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).expect("create the server's directory");
        let mut last_err = String::new();
        for _ in 0..20 {
            let mut server = RedisServer {
                port: free_port(),
                dir: dir.clone(),
                child: None,
                extra_args: extra.iter().map(|s| s.to_string()).collect(),
                binary: binary.to_owned(),
            };
            match server.spawn() {
                Ok(()) => return server,
                Err(e) => {
                    last_err = e;
                    // Keep the directory for the next try; the failed child is reaped.
                    server.dir = PathBuf::new();
                }
            }
        }
        panic!("could not start redis-server: {last_err}");
    }

    fn spawn(&mut self) -> Result<(), String> {
        let mut command = Command::new(&self.binary);
        command
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(["--dir", self.dir.to_str().unwrap_or(".")])
            .args(["--logfile", "redis.log"]);
        // `DEBUG` is refused unless enabled, from Redis 7.0 on (6.2 has no such setting).
        if !version_of(&self.binary).redis_before(7, 0) {
            command.args(["--enable-debug-command", "yes"]);
        }
        if measuring() {
            run_as_a_service(&mut command);
        }
        let child = command
            .args(&self.extra_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawning {} (is it installed?): {e}", self.binary))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    self.child = None;
                    return Err(format!("redis-server exited with {status}"));
                }
            }
            // The server that answers must be this one: another process on the port (one
            // that took it first) would answer while this one fails to bind and exits.
            if self.ping() && process_on(self.port).is_none_or(|pid| Some(pid) == self.pid()) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        Err("redis-server did not answer PING within 20 s".into())
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The server's working directory (its log is `redis.log` in there).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the server answers (`+PONG`, or `-NOAUTH` when it wants a password), done
    /// loading its data: a server started again on its append-only file answers `-LOADING`
    /// to every command until it has read it.
    fn ping(&self) -> bool {
        matches!(
            self.try_cmd(&["PING"], Duration::from_millis(500)),
            Ok(r) if r.starts_with(['+', '-']) && !r.starts_with("-LOADING")
        )
    }

    /// Sends one command and returns the reply's first line (e.g. `+OK`, `:3`, `$5`).
    pub fn try_cmd(&self, args: &[&str], timeout: Duration) -> std::io::Result<String> {
        let mut stream = TcpStream::connect_timeout(
            &format!("127.0.0.1:{}", self.port).parse().expect("addr"),
            timeout,
        )?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{}\r\n", a.len(), a));
        }
        stream.write_all(req.as_bytes())?;
        let mut reader = BufReader::new(stream);
        let mut line = String::new();
        reader.read_line(&mut line)?;
        Ok(line.trim_end().to_owned())
    }

    /// A redis-rs connection to the server, for arranging and checking state.
    pub fn conn(&self) -> redis::Connection {
        let client = redis::Client::open(self.url()).expect("url");
        let conn = client
            .get_connection_with_timeout(Duration::from_secs(10))
            .expect("connect to the test server");
        conn.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("read timeout");
        conn
    }

    /// A field of `INFO <section>` as text, such as `master_link_status` in `replication`.
    pub fn info_field(&self, section: &str, field: &str) -> Option<String> {
        self.info_field_of("INFO", section, field)
    }

    /// A field of the `field:value` text that `command [arg]` answers (`INFO replication`,
    /// `CLUSTER INFO`).
    pub fn info_field_of(&self, command: &str, arg: &str, field: &str) -> Option<String> {
        let client = redis::Client::open(self.url()).ok()?;
        let mut conn = client
            .get_connection_with_timeout(Duration::from_secs(2))
            .ok()?;
        let info: String = redis::cmd(command).arg(arg).query(&mut conn).ok()?;
        let prefix = format!("{field}:");
        info.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .map(|v| v.trim().to_owned())
    }

    /// How many times the server ran `command` (lower case), scripts' calls included, from
    /// `INFO commandstats` (`evalsha`: one per script call).
    pub fn command_calls(&self, command: &str) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.conn())
            .expect("INFO commandstats");
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// A number from `INFO <section>`, such as `total_commands_processed` in `stats`.
    pub fn info_number(&self, section: &str, field: &str) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg(section)
            .query(&mut self.conn())
            .expect("INFO");
        let prefix = format!("{field}:");
        info.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no number {field} in INFO {section}"))
    }

    /// Kills the server with SIGKILL and waits for it to exit.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (with no data: nothing is persisted).
    pub fn restart(&mut self) {
        self.kill();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match self.spawn() {
                Ok(()) => return,
                Err(e) if Instant::now() >= deadline => panic!("restart failed: {e}"),
                // The port may linger for a moment after the kill.
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// Stops the server with SIGSTOP: it keeps its connections but answers nothing.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// Resumes a paused server with SIGCONT.
    pub fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, name: &str) {
        if let Some(pid) = self.pid() {
            let status = Command::new("kill")
                .arg(format!("-{name}"))
                .arg(pid.to_string())
                .status()
                .expect("run kill");
            assert!(status.success(), "kill -{name} {pid} failed");
        }
    }

    /// The server's log, for failure messages.
    pub fn log(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(self.dir.join("redis.log")) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // A paused server must be resumed to die cleanly under some kernels' job control.
        self.resume();
        self.kill();
        if !self.dir.as_os_str().is_empty() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A fresh directory under the system's temporary directory, named for `what`.
pub fn scratch_dir(what: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "redmutex-{what}-{}-{}",
        std::process::id(),
        NEXT_DIR.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create a scratch directory");
    dir
}

/// Runs `f` on another thread and fails the test if it does not finish within `limit`:
/// a hang becomes a failure instead of a stuck test run.
pub fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(limit) {
        Ok(v) => {
            let _ = handle.join();
            v
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("operation did not finish within {limit:?}")
        }
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => match handle.join() {
            Err(panic) => std::panic::resume_unwind(panic),
            Ok(()) => panic!("operation ended without a result"),
        },
    }
}

/// 4 threads take the lock `name` of `client` 20 times each, and count the times one of them
/// found another inside. Returns that count (0 when the lock excludes).
pub fn overlaps_of_four_threads(client: &redmutex::Client, name: &str) -> u64 {
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;
    let inside = Arc::new(AtomicU64::new(0));
    let overlaps = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (client, inside, overlaps) = (client.clone(), inside.clone(), overlaps.clone());
            let name = name.to_owned();
            std::thread::spawn(move || {
                for _ in 0..20 {
                    let g = client.mutex(&name).lock().expect("lock");
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    g.unlock().expect("unlock");
                }
            })
        })
        .collect();
    for t in threads {
        within(Duration::from_secs(120), move || t.join().expect("thread"));
    }
    overlaps.load(Ordering::SeqCst)
}

/// Polls `cond` until it holds or `limit` passes; returns whether it held.
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The number of threads of this process whose name starts with `prefix`.
pub fn threads_named(prefix: &str) -> usize {
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .filter_map(|t| t.ok())
        .filter_map(|t| std::fs::read_to_string(t.path().join("comm")).ok())
        .filter(|name| name.trim_end().starts_with(prefix))
        .count()
}

/// The environment variable that gives a worker process its role.
pub const ROLE: &str = "REDMUTEX_TEST_ROLE";
/// The environment variable that gives a worker process the Redis URL.
pub const URL: &str = "REDMUTEX_TEST_URL";
/// The environment variable that gives a worker process an argument of its role.
pub const ARG: &str = "REDMUTEX_TEST_ARG";

/// Runs this test binary again as a worker process: only the test named `entry` runs, and it
/// finds `role`, `url` and `arg` in its environment.
pub fn spawn_worker(entry: &str, role: &str, url: &str, arg: &str) -> Child {
    Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", entry, "--nocapture", "--test-threads", "1"])
        .env(ROLE, role)
        .env(URL, url)
        .env(ARG, arg)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn worker process")
}

/// The role, URL and argument of a worker process; `None` in a normal test run.
pub fn worker_role() -> Option<(String, String, String)> {
    let role = std::env::var(ROLE).ok()?;
    let url = std::env::var(URL).ok()?;
    Some((role, url, std::env::var(ARG).unwrap_or_default()))
}

/// Reads a worker's output until a line with `prefix`, and returns the rest of that line.
/// The worker's later output is drained, so that it finds its pipe open.
pub fn read_marker(child: &mut Child, prefix: &str) -> String {
    let stdout = child.stdout.take().expect("piped stdout");
    let prefix = prefix.to_owned();
    within(Duration::from_secs(120), move || {
        let mut lines = BufReader::new(stdout).lines();
        while let Some(line) = lines.next() {
            let line = line.expect("read worker output");
            // The test harness may print its own text before ours on the same line.
            if let Some(at) = line.find(&prefix) {
                std::thread::spawn(move || lines.for_each(drop));
                return line[at + prefix.len()..].trim().to_owned();
            }
        }
        panic!("worker ended without printing {prefix}");
    })
}
