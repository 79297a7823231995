//! The lock's deployment: one standalone server, a Sentinel deployment (a master, two
//! replicas, three sentinels), a Cluster (three masters with a replica each) or the three
//! independent servers of a Redlock, with what the driver needs of it: the URLs the workers
//! open, the server that serves the lock now, and the fault that takes it away (a restart
//! without data, or a failover).
//!
//! For the partition fault, a Sentinel deployment or a Cluster runs on three hosts (network
//! namespaces, see [`super::netns`]): under Sentinel, the master and a sentinel on host 0 and
//! a replica and a sentinel on hosts 1 and 2; in a Cluster, one master on each host and its
//! replica on the next host. Failures are then detected in two leases (at least 1 s), which a
//! `DEBUG SLEEP` of 1.5 leases stays below.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::netns::Net;
use super::servers::{At, RedisProcess, Role};
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
pub const FAILOVER_LIMIT: Duration = Duration::from_secs(60);

/// The ports of the servers on hosts: a Sentinel deployment's data node and sentinel, a
/// Cluster's master and replica.
const HOST_DATA_PORT: u16 = 6379;
const HOST_SENTINEL_PORT: u16 = 26379;
const HOST_CLUSTER_PORTS: [u16; 2] = [7000, 7001];

/// The lock's servers; every process is killed when dropped.
pub struct LockDeployment {
    topology: Topology,
    nodes: Vec<RedisProcess>,
    sentinels: Vec<RedisProcess>,
    /// The servers run on hosts (network namespaces).
    on_hosts: bool,
    /// The host cut off now: who the master is, the other side says.
    cut: Option<usize>,
}

impl LockDeployment {
    /// Starts the deployment: on loopback ports, or, with `net`, on its hosts (Sentinel and
    /// Cluster only), with failure detection sized from `lease`.
    pub fn start(
        topology: Topology,
        net: Option<&Net>,
        lease: Duration,
    ) -> AnyResult<LockDeployment> {
        let deployment = match net {
            Some(net) => LockDeployment::start_on_hosts(topology, net, lease)?,
            None => LockDeployment::start_on_loopback(topology)?,
        };
        deployment.wait_until_ready()?;
        Ok(deployment)
    }

    fn start_on_loopback(topology: Topology) -> AnyResult<LockDeployment> {
        let data =
            |tag: &str, extra: &[String]| RedisProcess::start_as(tag, Role::Data(extra.to_vec()));
        let deployment = |nodes, sentinels| LockDeployment {
            topology,
            nodes,
            sentinels,
            on_hosts: false,
            cut: None,
        };
        Ok(match topology {
            Topology::Standalone => deployment(vec![data("lock", &[])?], Vec::new()),
            Topology::Redlock => deployment(
                (0..3)
                    .map(|i| data(&format!("instance{i}"), &[]))
                    .collect::<AnyResult<Vec<_>>>()?,
                Vec::new(),
            ),
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
                                master_host: "127.0.0.1".to_owned(),
                                master_port: nodes[0].port(),
                                settings: format!(
                                    "sentinel down-after-milliseconds {MASTER_NAME} 5000\n\
                                     sentinel failover-timeout {MASTER_NAME} 5000\n"
                                ),
                            },
                        )
                    })
                    .collect::<AnyResult<Vec<_>>>()?;
                deployment(nodes, sentinels)
            }
            Topology::Cluster => {
                // A replica's first sync starts at once (not after the default 5 s): a
                // master killed before its restarted replica synced leaves that replica
                // unable to take over ever ("disconnected from master for longer than
                // allowed": it never had a link to count its data's age from).
                let extra: Vec<String> = [
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                    "--repl-diskless-sync-delay",
                    "0",
                ]
                .map(String::from)
                .to_vec();
                let nodes = (0..6)
                    .map(|i| data(&format!("node{i}"), &extra))
                    .collect::<AnyResult<Vec<_>>>()?;
                let status = Command::new("redis-cli")
                    .arg("--cluster")
                    .arg("create")
                    .args(nodes.iter().map(RedisProcess::addr))
                    .args(["--cluster-replicas", "1", "--cluster-yes"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()?;
                if !status.success() {
                    return Err("redis-cli --cluster create failed".into());
                }
                deployment(nodes, Vec::new())
            }
        })
    }

    /// Sentinel: the master and a sentinel on host 0, a replica and a sentinel on hosts 1
    /// and 2. Cluster: masters 0, 1, 2 on hosts 0, 1, 2 (port 7000), and the replica of
    /// master `i` on host `i + 1` (port 7001).
    fn start_on_hosts(topology: Topology, net: &Net, lease: Duration) -> AnyResult<LockDeployment> {
        let at = |i: usize, port: u16| At {
            ip: net.ip(i).to_owned(),
            host: Some((i, net.namespace(i).to_owned())),
            port: Some(port),
        };
        // Failures are detected in two leases: a `DEBUG SLEEP` of 1.5 leases is no failure.
        let detect = (lease * 2).max(Duration::from_secs(1)).as_millis();
        let fast_sync = ["--repl-diskless-sync-delay", "0"].map(String::from);
        let (nodes, sentinels) = match topology {
            Topology::Sentinel => {
                let mut nodes = Vec::new();
                for i in 0..3 {
                    let mut args = fast_sync.to_vec();
                    if i > 0 {
                        args.extend([
                            "--replicaof".to_owned(),
                            net.ip(0).to_owned(),
                            HOST_DATA_PORT.to_string(),
                        ]);
                    }
                    nodes.push(RedisProcess::start_at(
                        &format!("host{i}-data"),
                        Role::Data(args),
                        at(i, HOST_DATA_PORT),
                    )?);
                }
                let failover_timeout = (lease * 3).max(Duration::from_secs(3)).as_millis();
                let settings = format!(
                    "sentinel down-after-milliseconds {MASTER_NAME} {detect}\n\
                     sentinel failover-timeout {MASTER_NAME} {failover_timeout}\n\
                     sentinel parallel-syncs {MASTER_NAME} 2\n"
                );
                let sentinels = (0..3)
                    .map(|i| {
                        RedisProcess::start_at(
                            &format!("host{i}-sentinel"),
                            Role::Sentinel {
                                master: MASTER_NAME.to_owned(),
                                master_host: net.ip(0).to_owned(),
                                master_port: HOST_DATA_PORT,
                                settings: settings.clone(),
                            },
                            at(i, HOST_SENTINEL_PORT),
                        )
                    })
                    .collect::<AnyResult<Vec<_>>>()?;
                (nodes, sentinels)
            }
            Topology::Cluster => {
                let args = |i: usize| -> Vec<String> {
                    let mut args: Vec<String> = [
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-announce-ip",
                        &net.ip(i),
                    ]
                    .map(String::from)
                    .to_vec();
                    args.extend(["--cluster-node-timeout".to_owned(), detect.to_string()]);
                    args.extend(fast_sync.iter().cloned());
                    args
                };
                let mut nodes = Vec::new();
                for i in 0..3 {
                    nodes.push(RedisProcess::start_at(
                        &format!("host{i}-master"),
                        Role::Data(args(i)),
                        at(i, HOST_CLUSTER_PORTS[0]),
                    )?);
                }
                for i in 0..3 {
                    let h = (i + 1) % 3;
                    nodes.push(RedisProcess::start_at(
                        &format!("host{h}-replica-of-{i}"),
                        Role::Data(args(h)),
                        at(h, HOST_CLUSTER_PORTS[1]),
                    )?);
                }
                let out = Command::new("redis-cli")
                    .args(["--cluster", "create"])
                    .args(nodes[..3].iter().map(RedisProcess::addr))
                    .args(["--cluster-replicas", "0", "--cluster-yes"])
                    .stdin(Stdio::null())
                    .output()?;
                if !out.status.success() {
                    return Err(format!(
                        "redis-cli --cluster create failed: {}{}",
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    )
                    .into());
                }
                // Each replica joins and follows its master, on the next host.
                for i in 0..3 {
                    let (master, replica) = (&nodes[i], &nodes[3 + i]);
                    let id: String = redis::cmd("CLUSTER")
                        .arg("MYID")
                        .query(&mut master.connection(Duration::from_secs(5))?)?;
                    redis::cmd("CLUSTER")
                        .arg("MEET")
                        .arg(net.ip(i))
                        .arg(master.port())
                        .query::<()>(&mut replica.connection(Duration::from_secs(5))?)?;
                    let deadline = Instant::now() + Duration::from_secs(30);
                    // Refused ("Unknown node") until the handshake is done.
                    while let Err(e) = redis::cmd("CLUSTER")
                        .arg("REPLICATE")
                        .arg(&id)
                        .query::<()>(&mut replica.connection(Duration::from_secs(5))?)
                    {
                        if Instant::now() > deadline {
                            return Err(format!(
                                "{} did not become a replica of {}: {e}",
                                replica.addr(),
                                master.addr()
                            )
                            .into());
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                }
                (nodes, Vec::new())
            }
            Topology::Standalone | Topology::Redlock => {
                return Err(format!(
                    "a {} deployment does not run on hosts (partitions need Sentinel or a \
                     Cluster)",
                    topology.name()
                )
                .into())
            }
        };
        Ok(LockDeployment {
            topology,
            nodes,
            sentinels,
            on_hosts: true,
            cut: None,
        })
    }

    /// The URL the workers open (for a Redlock, one per instance, separated by commas).
    pub fn url(&self) -> String {
        let hosts = |list: &[RedisProcess]| {
            list.iter()
                .map(RedisProcess::addr)
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

    /// A port every host has a data node on (for checking what the hosts reach).
    pub fn probe_port(&self) -> u16 {
        match self.topology {
            Topology::Cluster => HOST_CLUSTER_PORTS[0],
            _ => HOST_DATA_PORT,
        }
    }

    /// Which host is cut off now (`None`: none): who the master is, the other side says.
    pub fn set_cut(&mut self, host: Option<usize>) {
        self.cut = host;
    }

    /// The server that serves the lock now.
    pub fn master(&self) -> AnyResult<&RedisProcess> {
        let addr = self.master_addr()?;
        self.nodes
            .iter()
            .find(|n| n.addr() == addr)
            .ok_or_else(|| format!("no node at {addr}").into())
    }

    /// What the node at `addr` says of itself: its role, and how many replicas it has
    /// attached (`INFO replication`); `None` when it does not answer.
    pub fn role_of(&self, addr: &str) -> Option<(String, String)> {
        let node = self.nodes.iter().find(|n| n.addr() == addr)?;
        let role = field(node, &["INFO", "replication"], "role")?;
        let replicas =
            field(node, &["INFO", "replication"], "connected_slaves").unwrap_or_default();
        Some((role, replicas))
    }

    /// Takes the lock's master away: a standalone server is killed and started again empty;
    /// under Sentinel its replica is promoted (`SENTINEL FAILOVER`); in a Cluster the master
    /// is killed, its replica promoted by the cluster, and the killed node started again; one
    /// Redlock instance is killed and started again empty after one `lease` (`delayed`: the
    /// delayed-restart rule), or two, a majority, at once. Returns what it did.
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
                let from = self.master_addr()?;
                let master = self
                    .nodes
                    .iter_mut()
                    .find(|n| n.addr() == from)
                    .ok_or_else(|| format!("no node at {from}"))?;
                master.kill();
                let deadline = Instant::now() + FAILOVER_LIMIT;
                let to = loop {
                    match self.master_addr() {
                        Ok(addr) if addr != from => break addr,
                        _ if Instant::now() > deadline => {
                            return Err(format!(
                                "no replica of {from} was promoted\n{}",
                                self.cluster_report()
                            )
                            .into())
                        }
                        _ => std::thread::sleep(Duration::from_millis(100)),
                    }
                };
                // The killed node comes back (empty, with its `nodes.conf`) and follows the
                // new master before the next fault.
                if let Some(node) = self.nodes.iter_mut().find(|n| n.addr() == from) {
                    node.restart()?;
                }
                self.wait_until_ready()?;
                Ok(format!("master {from} killed; its replica {to} took over"))
            }
            Topology::Sentinel => {
                let from = self.master_addr()?;
                let deadline = Instant::now() + FAILOVER_LIMIT;
                // What each ask that did not take got, and what its sentinel logged after
                // it: the record of a failover that never came.
                let mut misses: Vec<String> = Vec::new();
                let sentinel = self
                    .sentinels
                    .iter()
                    .find(|s| self.cut.is_none() || s.host() != self.cut)
                    .ok_or("no sentinel to ask")?;
                'ask: loop {
                    // A refusal while the last failover settles (NOGOODSLAVE, a replica still
                    // syncing) is asked again, once the deployment is whole again; and every
                    // ask waits until each sentinel has heard the replicas say they are ones
                    // (see `SentinelView::replicas_heard`).
                    if !misses.is_empty() {
                        self.wait_until_ready()?;
                    }
                    self.wait_until_roles_heard()?;
                    let mark = sentinel.log_len();
                    let reply = match ask_for_failover(sentinel) {
                        Ok(()) => "OK".to_owned(),
                        Err(e) => e.to_string(),
                    };
                    let asked = Instant::now();
                    // Ten seconds for a failover that takes two, and longer while the asked
                    // sentinel still says one is in progress.
                    let failing_over =
                        || sentinel_view(sentinel).is_some_and(|v| !v.failover_state.is_empty());
                    while asked.elapsed() < Duration::from_secs(10)
                        || (Instant::now() < deadline && failing_over())
                    {
                        if self.master_addr().is_ok_and(|a| a != from) {
                            break 'ask;
                        }
                        std::thread::sleep(Duration::from_millis(100));
                    }
                    misses.push(format!(
                        "{} answered {reply}, then logged: [{}], and says of the master: {}",
                        sentinel.addr(),
                        sentinel.events_since(mark, 10),
                        sentinel_view(sentinel)
                            .map_or("no answer".to_owned(), |v| v.master_summary()),
                    ));
                    if Instant::now() > deadline {
                        return Err(format!(
                            "no failover away from {from} after {} asks; the last: {}\n\
                             every ask:\n{}\nthe asked sentinel's log ends:\n{}\n{}",
                            misses.len(),
                            misses.last().map_or("", String::as_str),
                            misses.join("\n"),
                            sentinel.log_tail(40),
                            self.replication_report(),
                        )
                        .into());
                    }
                }
                // The old master follows the new one before the next fault.
                self.wait_until_ready()?;
                let to = self.master_addr()?;
                let misses = if misses.is_empty() {
                    String::new()
                } else {
                    format!(
                        " after {} asks that did not take: {}",
                        misses.len(),
                        misses.join("; ")
                    )
                };
                Ok(format!("failed over from {from} to {to}{misses}"))
            }
        }
    }

    /// What every data node says of its replication and what the asked sentinel says of
    /// the replicas, for the error of a failover that never came.
    fn replication_report(&self) -> String {
        let mut report = String::new();
        for node in &self.nodes {
            let info = text_of(node, &["INFO", "replication"]);
            let info = info.map_or_else(|| "no answer".to_owned(), |i| i.replace("\r\n", " "));
            report.push_str(&format!("{}: {info}\n", node.addr()));
        }
        let replicas: Option<Vec<HashMap<String, String>>> = self
            .sentinels
            .first()
            .and_then(|s| s.connection(Duration::from_secs(2)).ok())
            .and_then(|mut c| {
                redis::cmd("SENTINEL")
                    .arg("REPLICAS")
                    .arg(MASTER_NAME)
                    .query(&mut c)
                    .ok()
            });
        report.push_str(&format!("the asked sentinel's replicas: {replicas:?}"));
        report
    }

    /// What the deployment says of itself, for the error of one that did not settle: every
    /// node's replication and, under Sentinel, every sentinel's view; a Cluster's nodes.
    fn settle_report(&self) -> String {
        match self.topology {
            Topology::Cluster => self.cluster_report(),
            Topology::Sentinel => {
                let mut report = self.replication_report();
                for sentinel in &self.sentinels {
                    report.push_str(&format!(
                        "\nsentinel {}: {:?}",
                        sentinel.addr(),
                        sentinel_view(sentinel)
                    ));
                }
                report
            }
            Topology::Standalone | Topology::Redlock => self.replication_report(),
        }
    }

    /// What every live node of a Cluster says of the cluster and where its log ends, for
    /// the error of a failover that never came.
    fn cluster_report(&self) -> String {
        let mut report = String::new();
        for node in &self.nodes {
            let nodes = text_of(node, &["CLUSTER", "NODES"]);
            report.push_str(&format!(
                "--- {} CLUSTER NODES:\n{}\n--- its log ends:\n{}\n",
                node.addr(),
                nodes.as_deref().unwrap_or("no answer"),
                node.log_tail(25)
            ));
        }
        report
    }

    /// The address (`ip:port`) of the server that serves the lock, as the deployment says
    /// now — while a host is cut off, as the servers on the other hosts say.
    pub fn master_addr(&self) -> AnyResult<String> {
        let outside_the_cut = |p: &&RedisProcess| self.cut.is_none() || p.host() != self.cut;
        match self.topology {
            Topology::Standalone => Ok(self.nodes[0].addr()),
            // One of the instances, at random.
            Topology::Redlock => Ok(self.nodes[fastrand::usize(..self.nodes.len())].addr()),
            Topology::Sentinel => {
                let mut last = None;
                for sentinel in self.sentinels.iter().filter(outside_the_cut) {
                    let asked = (|| -> AnyResult<String> {
                        let mut conn = sentinel.connection(Duration::from_secs(5))?;
                        let (ip, port): (String, u16) = redis::cmd("SENTINEL")
                            .arg("GET-MASTER-ADDR-BY-NAME")
                            .arg(MASTER_NAME)
                            .query(&mut conn)?;
                        Ok(format!("{ip}:{port}"))
                    })();
                    match asked {
                        Ok(addr) => return Ok(addr),
                        Err(e) => last = Some(e),
                    }
                }
                Err(last.unwrap_or_else(|| "no sentinel to ask".into()))
            }
            Topology::Cluster => {
                let key = format!("redmutex:{{{LOCK_NAME}}}");
                for node in self.nodes.iter().filter(outside_the_cut) {
                    let Ok(mut conn) = node.connection(Duration::from_secs(5)) else {
                        continue;
                    };
                    let Ok(slot) = redis::cmd("CLUSTER")
                        .arg("KEYSLOT")
                        .arg(&key)
                        .query::<i64>(&mut conn)
                    else {
                        continue;
                    };
                    let Ok(ranges) = redis::cmd("CLUSTER")
                        .arg("SLOTS")
                        .query::<Vec<Vec<redis::Value>>>(&mut conn)
                    else {
                        continue;
                    };
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
                            let ip = master
                                .first()
                                .and_then(|v| redis::from_redis_value_ref::<String>(v).ok());
                            if let (Some(ip), Some(port)) = (ip, int(master.get(1))) {
                                return Ok(format!("{ip}:{port}"));
                            }
                        }
                    }
                }
                Err("no node knows the lock's slot".into())
            }
        }
    }

    /// Waits until the deployment is whole again after a fault; on hosts, a Cluster's masters
    /// are also handed back to the nodes that started as masters, so that every host has one
    /// master again (a host with two would keep a majority of the masters when cut off, and
    /// nothing would fail over). Returns the masters handed back.
    pub fn settle(&self) -> AnyResult<Vec<String>> {
        self.wait_until_ready()?;
        if !(self.on_hosts && self.topology == Topology::Cluster) {
            return Ok(Vec::new());
        }
        let mut handed_back = Vec::new();
        for node in &self.nodes[..3] {
            let deadline = Instant::now() + FAILOVER_LIMIT;
            while field(node, &["INFO", "replication"], "role").as_deref() != Some("master") {
                if Instant::now() > deadline {
                    return Err(format!("{} did not take its slots back", node.addr()).into());
                }
                // A coordinated failover: the master stops, this replica catches up and takes
                // over. Refused while the replica is not in sync: ask again.
                let _ = node.connection(Duration::from_secs(5)).and_then(|mut c| {
                    Ok(redis::cmd("CLUSTER").arg("FAILOVER").query::<()>(&mut c)?)
                });
                let asked = Instant::now();
                while asked.elapsed() < Duration::from_secs(10)
                    && field(node, &["INFO", "replication"], "role").as_deref() != Some("master")
                {
                    std::thread::sleep(Duration::from_millis(100));
                }
                if field(node, &["INFO", "replication"], "role").as_deref() == Some("master") {
                    handed_back.push(node.addr());
                }
            }
        }
        if !handed_back.is_empty() {
            self.wait_until_ready()?;
        }
        Ok(handed_back)
    }

    fn wait_until_ready(&self) -> AnyResult<()> {
        self.wait_for("settle", || self.ready())
    }

    /// Waits up to [`FAILOVER_LIMIT`] until `done`; the error says what did not happen
    /// (`the … deployment did not <what>`) and what the deployment says of itself.
    fn wait_for(&self, what: &str, done: impl Fn() -> bool) -> AnyResult<()> {
        let deadline = Instant::now() + FAILOVER_LIMIT;
        while !done() {
            if Instant::now() > deadline {
                return Err(format!(
                    "the {} deployment did not {what} in {FAILOVER_LIMIT:?}\n{}",
                    self.topology.name(),
                    self.settle_report()
                )
                .into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// Every replica's link to its master is up (and a Cluster is whole, see
    /// [`cluster_whole`](Self::cluster_whole); under Sentinel, the sentinels know both
    /// replicas). On hosts, more: see [`ready_on_hosts`](Self::ready_on_hosts).
    fn ready(&self) -> bool {
        if self.on_hosts {
            return self.ready_on_hosts();
        }
        let links_up = self.nodes.iter().all(|n| {
            field(n, &["INFO", "replication"], "role").as_deref() != Some("slave")
                || field(n, &["INFO", "replication"], "master_link_status").as_deref() == Some("up")
        });
        let settled = match self.topology {
            Topology::Standalone | Topology::Redlock => true,
            Topology::Cluster => self.cluster_whole(),
            // The sentinels must see what the servers say, or a failover asked next finds
            // no replica it may promote.
            Topology::Sentinel => {
                let master = self.master().ok();
                master.is_some_and(|m| {
                    field(m, &["INFO", "replication"], "connected_slaves").as_deref() == Some("2")
                }) && self.sentinels_agree().is_some()
            }
        };
        links_up && settled
    }

    /// The master every sentinel names, when they all name the same one, see it up with
    /// the two other sentinels, and see every other data node as a replica that is up (flags
    /// `slave` alone: a failover promotes only such a replica); `None` otherwise.
    fn sentinels_agree(&self) -> Option<String> {
        let mut named: Option<String> = None;
        for sentinel in &self.sentinels {
            let view = sentinel_view(sentinel)?;
            if *named.get_or_insert_with(|| view.master.clone()) != view.master {
                return None;
            }
            let others: Vec<String> = self
                .nodes
                .iter()
                .map(RedisProcess::addr)
                .filter(|a| *a != view.master)
                .collect();
            if !(view.master_flags == "master"
                && view.other_sentinels == "2"
                && others.iter().all(|a| view.replicas_up.contains(a)))
            {
                return None;
            }
        }
        named
    }

    /// Waits until every sentinel has heard each replica of the master say it is a replica:
    /// before a forced failover (see [`SentinelView::replicas_heard`]).
    fn wait_until_roles_heard(&self) -> AnyResult<()> {
        self.wait_for("have every sentinel hear the replicas' roles", || {
            self.sentinels.iter().all(|s| {
                sentinel_view(s).is_some_and(|v| {
                    self.nodes
                        .iter()
                        .map(RedisProcess::addr)
                        .filter(|a| *a != v.master)
                        .all(|a| v.replicas_heard.contains(&a))
                })
            })
        })
    }

    /// Under Sentinel: every sentinel names the same master, sees it up with both replicas
    /// and the two other sentinels, and sees both replicas up; the master has both
    /// replicas and each follows it with its link up (an old master cut off and back is a
    /// replica again). A Cluster: [`cluster_whole`](Self::cluster_whole).
    fn ready_on_hosts(&self) -> bool {
        let info = |n: &RedisProcess, name: &str| field(n, &["INFO", "replication"], name);
        match self.topology {
            Topology::Sentinel => {
                let Some(master) = self.sentinels_agree() else {
                    return false;
                };
                self.nodes.iter().all(|n| {
                    if n.addr() == master {
                        info(n, "role").as_deref() == Some("master")
                            && info(n, "connected_slaves").as_deref() == Some("2")
                    } else {
                        info(n, "role").as_deref() == Some("slave")
                            && info(n, "master_link_status").as_deref() == Some("up")
                            && format!(
                                "{}:{}",
                                info(n, "master_host").unwrap_or_default(),
                                info(n, "master_port").unwrap_or_default()
                            ) == master
                    }
                })
            }
            Topology::Cluster => self.cluster_whole(),
            Topology::Standalone | Topology::Redlock => true,
        }
    }

    /// A Cluster is whole when every node says the cluster is ok and knows six connected
    /// nodes, three masters and three replicas, none failing, and is itself a master with
    /// its replica attached or a replica whose link is up (its first sync done). A killed
    /// master started again claims its old slots until it hears of the new master; only
    /// then does it follow, and sync: a deployment that counted it whole before would let
    /// the next fault kill the new master while its only replica has no data to take over
    /// with.
    fn cluster_whole(&self) -> bool {
        let info = |n: &RedisProcess, name: &str| field(n, &["INFO", "replication"], name);
        self.nodes.iter().all(|n| {
            if field(n, &["CLUSTER", "INFO"], "cluster_state").as_deref() != Some("ok") {
                return false;
            }
            let Some(text) = text_of(n, &["CLUSTER", "NODES"]) else {
                return false;
            };
            let lines: Vec<Vec<&str>> = text
                .lines()
                .map(|l| l.split_whitespace().collect())
                .collect();
            let has = |l: &Vec<&str>, flag: &str| {
                l.get(2).is_some_and(|f| f.split(',').any(|x| x == flag))
            };
            let itself = match info(n, "role").as_deref() {
                Some("master") => info(n, "connected_slaves").as_deref() == Some("1"),
                Some("slave") => info(n, "master_link_status").as_deref() == Some("up"),
                _ => false,
            };
            itself
                && lines.len() == 6
                && lines.iter().filter(|l| has(l, "master")).count() == 3
                && lines.iter().filter(|l| has(l, "slave")).count() == 3
                && lines.iter().all(|l| {
                    !["fail", "fail?", "handshake", "noaddr"]
                        .iter()
                        .any(|flag| has(l, flag))
                        && l.get(7) == Some(&"connected")
                })
        })
    }
}

/// A field of the `field:value` text that `command` answers (`INFO replication`, `CLUSTER
/// INFO`); `None` when the server does not answer.
fn field(node: &RedisProcess, command: &[&str], name: &str) -> Option<String> {
    text_of(node, command)?
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .map(|v| v.trim().to_owned())
}

/// The text that `command` answers (`INFO replication`, `CLUSTER NODES`); `None` when the
/// server does not answer.
fn text_of(node: &RedisProcess, command: &[&str]) -> Option<String> {
    let mut conn = node.connection(Duration::from_secs(5)).ok()?;
    redis::cmd(command[0])
        .arg(&command[1..])
        .query(&mut conn)
        .ok()
}

/// Asks `sentinel` to fail the master over (`SENTINEL FAILOVER`).
fn ask_for_failover(sentinel: &RedisProcess) -> AnyResult<()> {
    let mut conn = sentinel.connection(Duration::from_secs(5))?;
    redis::cmd("SENTINEL")
        .arg("FAILOVER")
        .arg(MASTER_NAME)
        .query::<()>(&mut conn)?;
    Ok(())
}

/// What one sentinel says of the master.
#[derive(Debug)]
struct SentinelView {
    /// `ip:port`
    master: String,
    master_flags: String,
    /// `failover-state` and `config-epoch` of `SENTINEL MASTER`.
    failover_state: String,
    config_epoch: String,
    other_sentinels: String,
    /// The replicas it sees up (flags `slave` only), as `ip:port`. (Whether their link is up,
    /// it learns from their `INFO` every 10 s; the replicas themselves say it sooner.)
    replicas_up: Vec<String>,
    /// Of those, the ones it has heard say they are replicas (`role-reported`).
    ///
    /// The role matters to a forced failover: an old master that a sentinel turned into a
    /// replica still counts as a master reporting the wrong role, to the sentinels, until
    /// each one's next `INFO` of it, up to 10 s later. Promote it before then, and such a
    /// sentinel's `INFO` finds it a master again, its role unchanged since long enough: it
    /// turns it back into a replica at once (`+convert-to-slave`), before the promoting
    /// sentinel has seen the promotion, which then aborts (`-failover-abort-slave-timeout`).
    /// Asked again every 10 s, in step with that sentinel's `INFO`, the failover was undone
    /// six times in a row once. A failover is asked only once every sentinel has heard each
    /// replica say it is one.
    replicas_heard: Vec<String>,
}

impl SentinelView {
    /// One line: the master's address, flags, failover state, configuration epoch, and the
    /// replicas seen up.
    fn master_summary(&self) -> String {
        format!(
            "{} flags {} failover-state {:?} config-epoch {} replicas up {:?}",
            self.master,
            self.master_flags,
            self.failover_state,
            self.config_epoch,
            self.replicas_up
        )
    }
}

fn sentinel_view(sentinel: &RedisProcess) -> Option<SentinelView> {
    let mut conn = sentinel.connection(Duration::from_secs(2)).ok()?;
    let (ip, port): (String, u16) = redis::cmd("SENTINEL")
        .arg("GET-MASTER-ADDR-BY-NAME")
        .arg(MASTER_NAME)
        .query(&mut conn)
        .ok()?;
    let master: HashMap<String, String> = redis::cmd("SENTINEL")
        .arg("MASTER")
        .arg(MASTER_NAME)
        .query(&mut conn)
        .ok()?;
    let replicas: Vec<HashMap<String, String>> = redis::cmd("SENTINEL")
        .arg("REPLICAS")
        .arg(MASTER_NAME)
        .query(&mut conn)
        .ok()?;
    let get = |m: &HashMap<String, String>, k: &str| m.get(k).cloned().unwrap_or_default();
    // The replicas whose fields have these values, as `ip:port`.
    let replicas_where = |fields: &[(&str, &str)]| -> Vec<String> {
        replicas
            .iter()
            .filter(|r| fields.iter().all(|(k, v)| get(r, k) == *v))
            .map(|r| format!("{}:{}", get(r, "ip"), get(r, "port")))
            .collect()
    };
    Some(SentinelView {
        master: format!("{ip}:{port}"),
        master_flags: get(&master, "flags"),
        failover_state: get(&master, "failover-state"),
        config_epoch: get(&master, "config-epoch"),
        other_sentinels: get(&master, "num-other-sentinels"),
        replicas_up: replicas_where(&[("flags", "slave")]),
        replicas_heard: replicas_where(&[("flags", "slave"), ("role-reported", "slave")]),
    })
}
