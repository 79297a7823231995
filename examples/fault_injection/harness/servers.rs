//! `redis-server` processes of the run's own, with no persistence, so that a restart loses
//! every lock exactly as an unpersisted production server would: on free loopback ports, or,
//! for the partition fault, on a host's address inside its network namespace.

use std::net::{TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::AnyResult;

/// A `redis-server` owned by the run; killed and its directory removed when dropped.
pub struct RedisProcess {
    at: At,
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
    role: Role,
}

/// What a server is started as.
#[derive(Clone)]
pub enum Role {
    /// A data node, with these arguments besides the usual ones.
    Data(Vec<String>),
    /// A sentinel monitoring the master at this address under this name (quorum 2), with
    /// these lines of `sentinel.conf` besides (`sentinel down-after-milliseconds …`).
    Sentinel {
        master: String,
        master_host: String,
        master_port: u16,
        settings: String,
    },
}

/// Where a server runs: the address it binds (and is reached at), the host (network
/// namespace) it runs in, if any, and its port, if fixed.
#[derive(Clone)]
pub struct At {
    pub ip: String,
    /// The host's index and namespace.
    pub host: Option<(usize, String)>,
    pub port: Option<u16>,
}

impl At {
    /// A free port on 127.0.0.1, in the root namespace.
    pub fn loopback() -> At {
        At {
            ip: "127.0.0.1".to_owned(),
            host: None,
            port: None,
        }
    }
}

/// The server binary to start: `$REDMUTEX_SERVER` (a path), else `redis-server`.
fn server_binary() -> String {
    std::env::var("REDMUTEX_SERVER")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis-server".to_owned())
}

/// Whether the binary takes `--enable-debug-command` (Redis 7.0 and later, and Valkey; the
/// faults' `DEBUG SLEEP` needs it there, and Redis 6.2 allows `DEBUG` without it).
fn takes_debug_setting(binary: &str) -> bool {
    let Ok(out) = Command::new(binary).arg("--version").output() else {
        return true;
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let major = text
        .split_whitespace()
        .find_map(|w| w.strip_prefix("v="))
        .and_then(|v| v.split('.').next()?.parse::<u32>().ok());
    !text.starts_with("Redis") || major.is_none_or(|major| major >= 7)
}

impl RedisProcess {
    /// Starts a standalone server on a free loopback port; `tag` names its directory.
    pub fn start(tag: &str) -> AnyResult<RedisProcess> {
        RedisProcess::start_as(tag, Role::Data(Vec::new()))
    }

    /// Starts a server in `role` on a free loopback port; `tag` names its directory.
    pub fn start_as(tag: &str, role: Role) -> AnyResult<RedisProcess> {
        RedisProcess::start_at(tag, role, At::loopback())
    }

    /// Starts a server in `role` at `at` (on a free port of its address unless it names
    /// one); `tag` names its directory.
    pub fn start_at(tag: &str, role: Role, at: At) -> AnyResult<RedisProcess> {
        let dir = std::env::temp_dir().join(format!(
            "redmutex-faults-{}-{tag}-{}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir_all(&dir)?;
        let mut last = String::new();
        for _ in 0..10 {
            let port = match at.port {
                Some(port) => port,
                None => TcpListener::bind((at.ip.as_str(), 0))?.local_addr()?.port(),
            };
            let mut server = RedisProcess {
                at: at.clone(),
                port,
                dir: dir.clone(),
                child: None,
                role: role.clone(),
            };
            match server.spawn() {
                Ok(()) => return Ok(server),
                Err(e) => last = e.to_string(),
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        Err(format!("could not start redis-server: {last}").into())
    }

    fn spawn(&mut self) -> AnyResult<()> {
        let binary = server_binary();
        let mut command = match &self.at.host {
            // `ip netns exec` execs the server: the child's pid is the server's.
            Some((_, ns)) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", ns]).arg(&binary);
                command
            }
            None => Command::new(&binary),
        };
        // Off loopback, clients come from other addresses: no protected mode.
        let protected = if self.at.ip == "127.0.0.1" {
            ""
        } else {
            "protected-mode no\n"
        };
        match &self.role {
            Role::Data(extra) => {
                command
                    .args(["--port", &self.port.to_string(), "--bind", &self.at.ip])
                    .args(["--save", "", "--appendonly", "no"]);
                if !protected.is_empty() {
                    command.args(["--protected-mode", "no"]);
                }
                if takes_debug_setting(&binary) {
                    command.args(["--enable-debug-command", "yes"]);
                }
                command
                    .arg("--dir")
                    .arg(&self.dir)
                    .args(["--logfile", "redis.log"])
                    .args(extra);
            }
            Role::Sentinel {
                master,
                master_host,
                master_port,
                settings,
            } => {
                // A sentinel rewrites its configuration file: it needs one of its own.
                let conf = self.dir.join("sentinel.conf");
                std::fs::write(
                    &conf,
                    format!(
                        "port {}\nbind {}\n{protected}dir {}\nlogfile sentinel.log\n\
                         sentinel monitor {master} {master_host} {master_port} 2\n{settings}",
                        self.port,
                        self.at.ip,
                        self.dir.display()
                    ),
                )?;
                command.arg(&conf).arg("--sentinel");
            }
        }
        let child = command
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start {binary} (is it installed?): {e}"))?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Some(status) = child.try_wait()? {
                    self.child = None;
                    return Err(format!("redis-server exited at start: {status}").into());
                }
            }
            if TcpStream::connect((self.at.ip.as_str(), self.port)).is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                self.kill();
                return Err("redis-server did not start within 20 s".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The last `lines` lines of the server's log, for a report of what went wrong.
    pub fn log_tail(&self, lines: usize) -> String {
        let text = self.log_text();
        let all: Vec<&str> = text.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// How many lines the server's log has now: a mark for [`RedisProcess::events_since`].
    pub fn log_len(&self) -> usize {
        self.log_text().lines().count()
    }

    /// The warnings of the log (a sentinel's events: `+try-failover`, `-failover-abort-…`,
    /// `+tilt`, `+sdown`, …) after line `mark`, the last `most` of them, each as its time
    /// and its first words: short enough to name a fault's cause in one line of an error.
    pub fn events_since(&self, mark: usize, most: usize) -> String {
        let text = self.log_text();
        let events: Vec<String> = text
            .lines()
            .skip(mark)
            // `pid:X dd Mon yyyy hh:mm:ss.mmm # event`: warnings carry `#`.
            .filter_map(|line| {
                let (head, event) = line.split_once(" # ")?;
                let time = head.rsplit(' ').next().unwrap_or("");
                let event: Vec<&str> = event.split_whitespace().take(4).collect();
                Some(format!("{time} {}", event.join(" ")))
            })
            .collect();
        events[events.len().saturating_sub(most)..].join("; ")
    }

    fn log_text(&self) -> String {
        let name = match self.role {
            Role::Sentinel { .. } => "sentinel.log",
            Role::Data(_) => "redis.log",
        };
        std::fs::read_to_string(self.dir.join(name)).unwrap_or_default()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `ip:port`
    pub fn addr(&self) -> String {
        format!("{}:{}", self.at.ip, self.port)
    }

    /// The host (network namespace) it runs in, if any.
    pub fn host(&self) -> Option<usize> {
        self.at.host.as_ref().map(|(i, _)| *i)
    }

    /// `redis://<ip>:<port>/`
    pub fn url(&self) -> String {
        format!("redis://{}/", self.addr())
    }

    /// A plain connection with generous timeouts, for the driver.
    pub fn connection(&self, timeout: Duration) -> AnyResult<redis::Connection> {
        let conn = redis::Client::open(self.url())?.get_connection_with_timeout(timeout)?;
        conn.set_read_timeout(Some(timeout))?;
        conn.set_write_timeout(Some(timeout))?;
        Ok(conn)
    }

    /// Kills the server (SIGKILL) and starts it again on the same port, empty.
    pub fn restart(&mut self) -> AnyResult<()> {
        self.restart_after(Duration::ZERO)
    }

    /// Kills the server (SIGKILL) and starts it again on the same port, empty, `delay` later.
    pub fn restart_after(&mut self, delay: Duration) -> AnyResult<()> {
        self.kill();
        std::thread::sleep(delay);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match self.spawn() {
                Ok(()) => return Ok(()),
                // The port may take a moment to be free again.
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Kills the server (SIGKILL), leaving its directory (a cluster node's `nodes.conf`) for
    /// [`start_again`](Self::start_again).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for RedisProcess {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
