//! A Redis Sentinel deployment for tests: a master, two replicas and three sentinels, each a
//! real process on a free loopback port, with helpers to fail over, kill and stop them.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{free_port, RedisServer};

/// The name the sentinels monitor the master under.
pub const MASTER_NAME: &str = "mymaster";

/// One `redis-server --sentinel` process.
pub struct SentinelProcess {
    port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl SentinelProcess {
    fn start(master_port: u16, dir: PathBuf) -> SentinelProcess {
        std::fs::create_dir_all(&dir).expect("sentinel directory");
        let mut last_err = String::new();
        for _ in 0..20 {
            let port = free_port();
            let conf = dir.join("sentinel.conf");
            let text = format!(
                "port {port}\nbind 127.0.0.1\ndir {}\nlogfile sentinel.log\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} 2\n\
                 sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
                 sentinel failover-timeout {MASTER_NAME} 3000\n\
                 sentinel parallel-syncs {MASTER_NAME} 2\n",
                dir.display()
            );
            std::fs::write(&conf, text).expect("sentinel config");
            let child = Command::new(super::server_binary())
                .arg(&conf)
                .arg("--sentinel")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-server --sentinel");
            let mut sentinel = SentinelProcess {
                port,
                dir: dir.clone(),
                child: Some(child),
            };
            if super::eventually(Duration::from_secs(20), || sentinel.answers()) {
                return sentinel;
            }
            last_err = format!("sentinel on port {port} did not answer");
            sentinel.kill();
        }
        panic!("could not start a sentinel: {last_err}");
    }

    fn answers(&self) -> bool {
        let Ok(client) = redis::Client::open(self.url()) else {
            return false;
        };
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(500)) else {
            return false;
        };
        // The sentinel that answers must be this one, not another process on the port.
        redis::cmd("PING").query::<String>(&mut conn).is_ok()
            && super::process_on(self.port)
                .is_some_and(|pid| Some(pid) == self.child.as_ref().map(Child::id))
    }

    /// `redis://127.0.0.1:<port>/`
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A connection to this sentinel.
    pub fn conn(&self) -> redis::Connection {
        let client = redis::Client::open(self.url()).expect("url");
        let conn = client
            .get_connection_with_timeout(Duration::from_secs(10))
            .expect("connect to the sentinel");
        conn.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("read timeout");
        conn
    }

    /// The master's port as this sentinel sees it.
    pub fn master_port(&self) -> Option<u16> {
        let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(MASTER_NAME)
            .query(&mut self.conn())
            .ok()
            .flatten();
        addr.map(|(_, port)| port)
    }

    /// Kills this sentinel with SIGKILL.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for SentinelProcess {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A master, two replicas and three sentinels.
pub struct SentinelDeployment {
    /// The data nodes; `nodes[0]` starts as the master.
    pub nodes: Vec<RedisServer>,
    pub sentinels: Vec<SentinelProcess>,
}

impl SentinelDeployment {
    /// Starts the deployment and waits until every sentinel knows the master and both
    /// replicas, and both replicas are in sync.
    pub fn start() -> SentinelDeployment {
        let master = RedisServer::start_with(&["--repl-diskless-sync-delay", "0"]);
        let port = master.port().to_string();
        let replicas: Vec<RedisServer> = (0..2)
            .map(|_| {
                RedisServer::start_with(&[
                    "--repl-diskless-sync-delay",
                    "0",
                    "--replicaof",
                    "127.0.0.1",
                    &port,
                ])
            })
            .collect();
        let mut nodes = vec![master];
        nodes.extend(replicas);
        let sentinels: Vec<SentinelProcess> = (0..3)
            .map(|_| SentinelProcess::start(nodes[0].port(), super::scratch_dir("sentinel")))
            .collect();
        let deployment = SentinelDeployment { nodes, sentinels };
        assert!(
            super::eventually(Duration::from_secs(60), || deployment.settled()),
            "the sentinel deployment did not settle"
        );
        deployment
    }

    /// Every sentinel sees the same master with two replicas, and every replica is linked.
    pub fn settled(&self) -> bool {
        let Some(master) = self.sentinels[0].master_port() else {
            return false;
        };
        self.sentinels.iter().all(|s| {
            s.master_port() == Some(master) && {
                // Each replica known, healthy and recently heard from: only such a replica can
                // be promoted (else `SENTINEL FAILOVER` answers NOGOODSLAVE). And heard to say
                // it is a replica: a sentinel that still counts an old master turned replica
                // as a master turns it back at once if a failover promotes it before that
                // sentinel's next `INFO` of it, and the failover aborts (see the fault
                // harness's `SentinelView::replicas_heard`).
                let replicas: Vec<std::collections::HashMap<String, String>> =
                    redis::cmd("SENTINEL")
                        .arg("REPLICAS")
                        .arg(MASTER_NAME)
                        .query(&mut s.conn())
                        .unwrap_or_default();
                replicas.len() == 2
                    && replicas.iter().all(|r| {
                        r.get("flags").map(String::as_str) == Some("slave")
                            && r.get("role-reported").map(String::as_str) == Some("slave")
                            && r.get("master-link-status").map(String::as_str) == Some("ok")
                            && r.get("info-refresh")
                                .and_then(|v| v.parse::<u64>().ok())
                                .is_some_and(|ms| ms < 5000)
                    })
            }
        }) && self
            .nodes
            .iter()
            .filter(|n| n.port() != master)
            .all(|n| n.info_field("replication", "master_link_status").as_deref() == Some("up"))
    }

    /// `redis+sentinel://127.0.0.1:<p1>,127.0.0.1:<p2>,127.0.0.1:<p3>/mymaster`
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        format!("redis+sentinel://{}/{MASTER_NAME}", hosts.join(","))
    }

    /// The data node that the sentinels name as the master now.
    pub fn master(&self) -> &RedisServer {
        let port = self
            .sentinels
            .iter()
            .find_map(|s| s.master_port())
            .expect("a sentinel that names the master");
        self.node(port)
    }

    pub fn node(&self, port: u16) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| n.port() == port)
            .expect("a data node on that port")
    }

    pub fn node_mut(&mut self, port: u16) -> &mut RedisServer {
        self.nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .expect("a data node on that port")
    }

    /// Asks a sentinel to fail over, and waits until every sentinel names a new master.
    /// Returns the new master's port.
    pub fn failover(&self) -> u16 {
        let old = self.master().port();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let asked: redis::RedisResult<()> = redis::cmd("SENTINEL")
                .arg("FAILOVER")
                .arg(MASTER_NAME)
                .query(&mut self.sentinels[0].conn());
            match asked {
                Ok(()) => break,
                // A replica not heard from lately is not promoted: ask again shortly.
                Err(e) if Instant::now() < deadline && e.code() == Some("NOGOODSLAVE") => {
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!("SENTINEL FAILOVER: {e}"),
            }
        }
        self.wait_for_new_master(old)
    }

    /// Waits until every sentinel names a master other than `old`; returns its port.
    pub fn wait_for_new_master(&self, old: u16) -> u16 {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ports: Vec<Option<u16>> = self
                .sentinels
                .iter()
                .filter(|s| s.child.is_some())
                .map(|s| s.master_port())
                .collect();
            if let Some(Some(new)) = ports.first() {
                if *new != old && ports.iter().all(|p| *p == Some(*new)) {
                    return *new;
                }
            }
            assert!(
                Instant::now() < deadline,
                "no failover away from port {old}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}
