//! The lock's deployment: one standalone server, a Sentinel deployment (a master, two
//! replicas, three sentinels), a Cluster (three masters with a replica each) or the three
//! independent servers of a Redlock, with what the driver needs of it: the URLs the workers
//! open, the server that serves the lock now, and the fault that takes it away (a restart
//! without data, or a failover).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::servers::{RedisProcess, Role};
use super::worker::LOCK_NAME;
use super::AnyResult;

/// The kind of deployment the lock lives on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    Standalone,
    Sentinel,
    Cluster,
    /// Three independent servers under a `Redlock`.
    Redlock,
}

impl Topology {
    pub fn name(self) -> &'static str {
        match self {
            Topology::Standalone => "standalone",
            Topology::Sentinel => "sentinel",
            Topology::Cluster => "cluster",
            Topology::Redlock => "redlock",
        }
    }
}

/// The name the sentinels monitor the master under.
const MASTER_NAME: &str = "faults";

/// How long a failover may take before the run gives up.
const FAILOVER_LIMIT: Duration = Duration::from_secs(60);

/// The lock's servers; every process is killed when dropped.
pub struct LockDeployment {
    topology: Topology,
    nodes: Vec<RedisProcess>,
    sentinels: Vec<RedisProcess>,
}

impl LockDeployment {
    pub fn start(topology: Topology) -> AnyResult<LockDeployment> {
        let data =
            |tag: &str, extra: &[String]| RedisProcess::start_as(tag, Role::Data(extra.to_vec()));
        let deployment = match topology {
            Topology::Standalone => LockDeployment {
                topology,
                nodes: vec![data("lock", &[])?],
                sentinels: Vec::new(),
            },
            Topology::Redlock => LockDeployment {
                topology,
                nodes: (0..3)
                    .map(|i| data(&format!("instance{i}"), &[]))
                    .collect::<AnyResult<Vec<_>>>()?,
                sentinels: Vec::new(),
            },
            Topology::Sentinel => {
                let master = data("master", &[])?;
                let replica_of = [
                    "--replicaof".to_owned(),
                    "127.0.0.1".to_owned(),
                    master.port().to_string(),
                ];
                let mut nodes = vec![master];
                for i in 0..2 {
                    nodes.push(data(&format!("replica{i}"), &replica_of)?);
                }
                let sentinels = (0..3)
                    .map(|i| {
                        RedisProcess::start_as(
                            &format!("sentinel{i}"),
                            Role::Sentinel {
                                master: MASTER_NAME.to_owned(),
                                master_port: nodes[0].port(),
                            },
                        )
                    })
                    .collect::<AnyResult<Vec<_>>>()?;
                LockDeployment {
                    topology,
                    nodes,
                    sentinels,
                }
            }
            Topology::Cluster => {
                let extra: Vec<String> = [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                ]
                .map(String::from)
                .to_vec();
                let nodes = (0..6)
                    .map(|i| data(&format!("node{i}"), &extra))
                    .collect::<AnyResult<Vec<_>>>()?;
                let status = Command::new("redis-cli")
                    .arg("--cluster")
                    .arg("create")
                    .args(nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())))
                    .args(["--cluster-replicas", "1", "--cluster-yes"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()?;
                if !status.success() {
                    return Err("redis-cli --cluster create failed".into());
                }
                LockDeployment {
                    topology,
                    nodes,
                    sentinels: Vec::new(),
                }
            }
        };
        deployment.wait_until_ready()?;
        Ok(deployment)
    }

    /// The URL the workers open (for a Redlock, one per instance, separated by commas).
    pub fn url(&self) -> String {
        let hosts = |list: &[RedisProcess]| {
            list.iter()
                .map(|n| format!("127.0.0.1:{}", n.port()))
                .collect::<Vec<_>>()
                .join(",")
        };
        match self.topology {
            Topology::Standalone => self.nodes[0].url(),
            Topology::Redlock => self
                .nodes
                .iter()
                .map(RedisProcess::url)
                .collect::<Vec<_>>()
                .join(","),
            Topology::Sentinel => {
                format!("redis+sentinel://{}/{MASTER_NAME}", hosts(&self.sentinels))
            }
            Topology::Cluster => format!("redis+cluster://{}", hosts(&self.nodes)),
        }
    }

    /// How many replicas must acknowledge each acquire: all that a failover may promote, so
    /// that a promoted replica always has every lock and fencing counter.
    pub fn replica_acks(&self) -> u32 {
        match self.topology {
            Topology::Standalone | Topology::Redlock => 0,
            Topology::Sentinel => 2,
            Topology::Cluster => 1,
        }
    }

    /// The server that serves the lock now.
    pub fn master(&self) -> AnyResult<&RedisProcess> {
        let port = self.master_port()?;
        self.nodes
            .iter()
            .find(|n| n.port() == port)
            .ok_or_else(|| format!("no node on port {port}").into())
    }

    /// Takes the lock's master away: a standalone server is killed and started again empty;
    /// under Sentinel its replica is promoted (`SENTINEL FAILOVER`); in a Cluster the master
    /// is killed, its replica promoted by the cluster, and the killed node started again; one Redlock instance is killed
    /// and started again empty after one `lease` (`delayed`: the delayed-restart rule), or
    /// two, a majority, at once. Returns what it did.
    pub fn lose_master(&mut self, lease: Duration, delayed: bool) -> AnyResult<String> {
        match self.topology {
            Topology::Standalone => {
                self.nodes[0].restart()?;
                Ok("lock server restarted empty".to_owned())
            }
            Topology::Redlock if delayed => {
                let node = &mut self.nodes[fastrand::usize(..3)];
                node.restart_after(lease)?;
                Ok(format!(
                    "instance on port {} restarted empty after one lease",
                    node.port()
                ))
            }
            Topology::Redlock => {
                let spared = fastrand::usize(..3);
                let mut ports = Vec::new();
                for (i, node) in self.nodes.iter_mut().enumerate() {
                    if i != spared {
                        node.restart()?;
                        ports.push(node.port());
                    }
                }
                Ok(format!(
                    "instances on ports {ports:?} restarted empty at once"
                ))
            }
            Topology::Cluster => {
                // The master dies (SIGKILL): the cluster must notice and promote its replica
                // on its own, and every client must find the new master without being told.
                let from = self.master_port()?;
                let master = self
                    .nodes
                    .iter_mut()
                    .find(|n| n.port() == from)
                    .ok_or_else(|| format!("no node on port {from}"))?;
                master.kill();
                let deadline = Instant::now() + FAILOVER_LIMIT;
                let to = loop {
                    match self.master_port() {
                        Ok(port) if port != from => break port,
                        _ if Instant::now() > deadline => {
                            return Err(format!("no replica of port {from} was promoted").into())
                        }
                        _ => std::thread::sleep(Duration::from_millis(100)),
                    }
                };
                // The killed node comes back (empty, with its `nodes.conf`) and follows the
                // new master before the next fault.
                if let Some(node) = self.nodes.iter_mut().find(|n| n.port() == from) {
                    node.restart()?;
                }
                self.wait_until_ready()?;
                Ok(format!(
                    "master on port {from} killed; its replica on port {to} took over"
                ))
            }
            Topology::Sentinel => {
                let from = self.master_port()?;
                let deadline = Instant::now() + FAILOVER_LIMIT;
                'ask: loop {
                    // Either refuses while the last failover settles (NOGOODSLAVE, a replica
                    // still syncing): ask again.
                    let _ = self.ask_for_failover();
                    let asked = Instant::now();
                    while asked.elapsed() < Duration::from_secs(10) {
                        if self.master_port().is_ok_and(|p| p != from) {
                            break 'ask;
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    if Instant::now() > deadline {
                        return Err(format!("no failover away from port {from}").into());
                    }
                }
                // The old master follows the new one before the next fault.
                self.wait_until_ready()?;
                let to = self.master_port()?;
                Ok(format!("failed over from port {from} to {to}"))
            }
        }
    }

    /// Asks the sentinels to fail the master over.
    fn ask_for_failover(&self) -> AnyResult<()> {
        let mut conn = self.sentinels[0].connection(Duration::from_secs(5))?;
        redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(MASTER_NAME)
            .query::<()>(&mut conn)?;
        Ok(())
    }

    /// The port of the server that serves the lock, as the deployment says now.
    fn master_port(&self) -> AnyResult<u16> {
        match self.topology {
            Topology::Standalone => Ok(self.nodes[0].port()),
            // One of the instances, at random.
            Topology::Redlock => Ok(self.nodes[fastrand::usize(..self.nodes.len())].port()),
            Topology::Sentinel => {
                let mut conn = self.sentinels[0].connection(Duration::from_secs(5))?;
                let (_, port): (String, u16) = redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(MASTER_NAME)
                    .query(&mut conn)?;
                Ok(port)
            }
            Topology::Cluster => {
                let key = format!("redmutex:{{{LOCK_NAME}}}");
                for node in &self.nodes {
                    let Ok(mut conn) = node.connection(Duration::from_secs(5)) else {
                        continue;
                    };
                    let slot: i64 = redis::cmd("CLUSTER")
                        .arg("KEYSLOT")
                        .arg(&key)
                        .query(&mut conn)?;
                    let ranges: Vec<Vec<redis::Value>> =
                        redis::cmd("CLUSTER").arg("SLOTS").query(&mut conn)?;
                    for range in ranges {
                        // [start, end, [host, port, id, …], replicas…]
                        let int = |v: Option<&redis::Value>| {
                            v.and_then(|v| redis::from_redis_value_ref::<i64>(v).ok())
                        };
                        let (Some(start), Some(end)) = (int(range.first()), int(range.get(1)))
                        else {
                            continue;
                        };
                        let Some(redis::Value::Array(master)) = range.get(2) else {
                            continue;
                        };
                        if (start..=end).contains(&slot) {
                            if let Some(port) = int(master.get(1)) {
                                return Ok(u16::try_from(port)?);
                            }
                        }
                    }
                }
                Err("no node knows the lock's slot".into())
            }
        }
    }

    fn wait_until_ready(&self) -> AnyResult<()> {
        let deadline = Instant::now() + FAILOVER_LIMIT;
        while !self.ready() {
            if Instant::now() > deadline {
                return Err(
                    format!("the {} deployment did not settle", self.topology.name()).into(),
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// Every replica's link to its master is up (and, in a Cluster, every node says the
    /// cluster is ok; under Sentinel, the sentinels know both replicas).
    fn ready(&self) -> bool {
        let field = |node: &RedisProcess, command: &[&str], name: &str| -> Option<String> {
            let mut conn = node.connection(Duration::from_secs(5)).ok()?;
            let text: String = redis::cmd(command[0])
                .arg(&command[1..])
                .query(&mut conn)
                .ok()?;
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{name}:")))
                .map(|v| v.trim().to_owned())
        };
        let links_up = self.nodes.iter().all(|n| {
            field(n, &["INFO", "replication"], "role").as_deref() != Some("slave")
                || field(n, &["INFO", "replication"], "master_link_status").as_deref() == Some("up")
        });
        let settled = match self.topology {
            Topology::Standalone | Topology::Redlock => true,
            Topology::Cluster => self
                .nodes
                .iter()
                .all(|n| field(n, &["CLUSTER", "INFO"], "cluster_state").as_deref() == Some("ok")),
            Topology::Sentinel => {
                let master = self.master().ok();
                master.is_some_and(|m| {
                    field(m, &["INFO", "replication"], "connected_slaves").as_deref() == Some("2")
                })
            }
        };
        links_up && settled
    }
}
