//! A Redis Cluster for tests: three masters and three replicas on free loopback ports,
//! created with `redis-cli --cluster create`, with helpers to find, fail over and kill nodes.

use std::process::{Command, Stdio};
use std::time::Duration;

use super::RedisServer;

/// Three masters, with one replica each unless started with [`start_masters`].
///
/// [`start_masters`]: ClusterDeployment::start_masters
pub struct ClusterDeployment {
    pub nodes: Vec<RedisServer>,
}

impl ClusterDeployment {
    /// Three masters with one replica each.
    pub fn start() -> ClusterDeployment {
        ClusterDeployment::start_with_replicas(1)
    }

    /// Three masters and no replica.
    pub fn start_masters() -> ClusterDeployment {
        ClusterDeployment::start_with_replicas(0)
    }

    fn start_with_replicas(replicas: usize) -> ClusterDeployment {
        let nodes: Vec<RedisServer> = (0..3 * (1 + replicas))
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                    "--repl-diskless-sync-delay",
                    "0",
                ])
            })
            .collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port()));
        }
        let status = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .expect("run redis-cli --cluster create");
        assert!(status.success(), "redis-cli --cluster create failed");
        let cluster = ClusterDeployment { nodes };
        assert!(
            super::eventually(Duration::from_secs(60), || cluster.ok()),
            "the cluster did not reach cluster_state:ok"
        );
        cluster
    }

    /// Every node says `cluster_state:ok`, and every replica's link is up.
    pub fn ok(&self) -> bool {
        self.nodes.iter().all(|n| {
            n.info_field_of("CLUSTER", "INFO", "cluster_state")
                .as_deref()
                == Some("ok")
        }) && self.nodes.iter().all(|n| {
            n.info_field("replication", "role").as_deref() != Some("slave")
                || n.info_field("replication", "master_link_status").as_deref() == Some("up")
        })
    }

    /// `redis+cluster://127.0.0.1:<p1>,127.0.0.1:<p2>`
    pub fn url(&self) -> String {
        format!(
            "redis+cluster://127.0.0.1:{},127.0.0.1:{}",
            self.nodes[0].port(),
            self.nodes[1].port()
        )
    }

    /// The masters.
    pub fn masters(&self) -> Vec<&RedisServer> {
        self.nodes
            .iter()
            .filter(|n| n.info_field("replication", "role").as_deref() == Some("master"))
            .collect()
    }

    /// The node that serves `key` as master now.
    pub fn master_of(&self, key: &str) -> &RedisServer {
        let slot = self.slot_of(key);
        self.masters()
            .into_iter()
            .find(|m| owns(m, slot))
            .expect("a master for the slot")
    }

    /// The replica of `master`.
    pub fn replica_of(&self, master: &RedisServer) -> &RedisServer {
        self.nodes
            .iter()
            .find(|n| {
                n.info_field("replication", "master_port").as_deref()
                    == Some(master.port().to_string().as_str())
            })
            .expect("a replica of that master")
    }
}

/// Whether `node` serves `slot` (from its own `CLUSTER SLOTS`).
fn owns(node: &RedisServer, slot: i64) -> bool {
    let ranges: Vec<redis::Value> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut node.conn())
        .unwrap_or_default();
    ranges.iter().any(|r| {
        let redis::Value::Array(parts) = r else {
            return false;
        };
        let int = |i: usize| {
            parts
                .get(i)
                .and_then(|v| redis::from_redis_value_ref::<i64>(v).ok())
        };
        let port = match parts.get(2) {
            Some(redis::Value::Array(m)) => m
                .get(1)
                .and_then(|v| redis::from_redis_value_ref::<i64>(v).ok()),
            _ => None,
        };
        matches!((int(0), int(1)), (Some(a), Some(b)) if a <= slot && slot <= b)
            && port == Some(i64::from(node.port()))
    })
}

impl ClusterDeployment {
    /// The node id of `node`.
    pub fn node_id(&self, node: &RedisServer) -> String {
        redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut node.conn())
            .expect("CLUSTER MYID")
    }

    /// The hash slot of `key`, as the cluster computes it.
    pub fn slot_of(&self, key: &str) -> i64 {
        redis::cmd("CLUSTER")
            .arg("KEYSLOT")
            .arg(key)
            .query(&mut self.nodes[0].conn())
            .expect("CLUSTER KEYSLOT")
    }

    /// A master other than the one that serves `key`.
    pub fn other_master_than_of(&self, key: &str) -> &RedisServer {
        let port = self.master_of(key).port();
        self.masters()
            .into_iter()
            .find(|m| m.port() != port)
            .expect("another master")
    }

    /// Starts moving the slot of `key` to `to` (IMPORTING / MIGRATING) without moving any key
    /// yet: a key missing from the old master is then answered with `ASK`.
    pub fn start_migrating_slot_of(&self, key: &str, to: &RedisServer) {
        let from = self.master_of(key);
        let slot = self.slot_of(key);
        let (from_id, to_id) = (self.node_id(from), self.node_id(to));
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("IMPORTING")
            .arg(&from_id)
            .query(&mut to.conn())
            .expect("SETSLOT IMPORTING");
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg("MIGRATING")
            .arg(&to_id)
            .query(&mut from.conn())
            .expect("SETSLOT MIGRATING");
    }

    /// Moves the slot of `key` (and every key in it) from its master to `to`, the way
    /// `redis-cli --cluster reshard` does: IMPORTING / MIGRATING, MIGRATE, then NODE.
    pub fn migrate_slot_of(&self, key: &str, to: &RedisServer) {
        self.move_keys_of_slot_of(key, to);
        self.finish_migrating_slot_of(key, to);
    }

    /// Marks the slot of `key` as moving to `to` and moves every key in it, without giving
    /// the slot to `to` yet: the old master then answers `ASK` for every key of the slot.
    pub fn move_keys_of_slot_of(&self, key: &str, to: &RedisServer) {
        let from = self.master_of(key);
        let slot = self.slot_of(key);
        // Idempotent: a slot already marked keeps its marks.
        self.start_migrating_slot_of(key, to);
        loop {
            let keys: Vec<String> = redis::cmd("CLUSTER")
                .arg("GETKEYSINSLOT")
                .arg(slot)
                .arg(100)
                .query(&mut from.conn())
                .expect("CLUSTER GETKEYSINSLOT");
            if keys.is_empty() {
                break;
            }
            let _: () = redis::cmd("MIGRATE")
                .arg("127.0.0.1")
                .arg(to.port())
                .arg("")
                .arg(0)
                .arg(5000)
                .arg("KEYS")
                .arg(&keys)
                .query(&mut from.conn())
                .expect("MIGRATE");
        }
    }

    /// Gives the slot of `key`, whose keys moved, to `to` on every master (`SETSLOT NODE`).
    pub fn finish_migrating_slot_of(&self, key: &str, to: &RedisServer) {
        let slot = self.slot_of(key);
        let to_id = self.node_id(to);
        for node in self.masters() {
            let _: () = redis::cmd("CLUSTER")
                .arg("SETSLOT")
                .arg(slot)
                .arg("NODE")
                .arg(&to_id)
                .query(&mut node.conn())
                .expect("CLUSTER SETSLOT NODE");
        }
    }
}
