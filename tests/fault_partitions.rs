//! Network partitions: hosts are Linux network namespaces on one bridge (tests/support/netns.rs),
//! and a host is cut off by taking its link down, so that packets are dropped silently both
//! ways, as when a cable is pulled. Each test runs the old holder of a lock on the host that is
//! cut off, with a server it can still reach, and a new holder on the other side; every client
//! is a helper process inside its host, which stamps its events with CLOCK_MONOTONIC, so that
//! events of different processes order on one clock. Each test asserts that the old holder is
//! told its lease is lost before the new holder's acquire returns, that the new holder's
//! fencing token is larger, and that after the heal nothing of the old holder is left. On
//! Sentinel and Cluster the same holds for an election: the old leader is told before the
//! new leader's `campaign` returns, and its term is the smaller.
//!
//! Needs root and iproute2 (`ip`): elsewhere the tests print that they are skipped, except
//! when `CI` is set, where they fail.

mod support;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use support::eventually;
use support::netns::{self, now_us, Event, Helper, HelperSpec, Net, NsServer, Role, Settings};

/// The test that helper processes run.
const HELPER: &str = "partition_helper";

/// In a helper process (re-executed inside a namespace), the client helper; in a normal test
/// run, nothing.
#[test]
fn partition_helper() {
    if let Some(spec) = netns::helper_spec() {
        netns::serve_helper(spec);
    }
}

/// One deployment at a time: on two cores, several at once miss each other's heartbeats, and
/// these tests count failovers on them.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether replicas acknowledge lease writes.
#[derive(Clone, Copy)]
enum Acks {
    /// The crate's default: one replica under Sentinel and in a Cluster (for at most 500 ms
    /// with these timeouts), none for Redlock's single servers.
    Default,
    /// `no_replica_acks()`.
    Off,
}

/// A 3 s lease renewed every second, 1 s timeouts; blocked calls ride through the failover.
fn settings(acks: Acks) -> Settings {
    Settings {
        lease_ms: Some(3_000),
        renewal_ms: Some(1_000),
        connect_ms: Some(1_000),
        response_ms: Some(1_000),
        replica_acks: None,
        no_replica_acks: matches!(acks, Acks::Off),
        outage_patience_ms: Some(40_000),
        instance_ms: None,
    }
}

/// How long a helper may take to answer anything that is not a wait for a lock.
const ANSWER: Duration = Duration::from_secs(30);

fn open(helper: &mut Helper) {
    helper.send("open");
    match helper.next(&["opened", "error"], ANSWER) {
        Some(e) if e.kind == "opened" => {}
        other => panic!(
            "helper {} could not open its client: {other:?}{}",
            helper.name(),
            helper.report()
        ),
    }
}

/// Waits for the outcome of a `lock` sent before; panics unless it is `acquired`.
fn acquired(helper: &mut Helper, what: &str, limit: Duration) -> Event {
    match helper.next(&["acquired", "not-acquired", "error"], limit) {
        Some(e) if e.kind == "acquired" => e,
        Some(e) => panic!(
            "helper {} could not take {what}: {e:?}{}",
            helper.name(),
            helper.report()
        ),
        None => panic!(
            "helper {} said nothing about {what} within {limit:?}{}",
            helper.name(),
            helper.report()
        ),
    }
}

fn lock(helper: &mut Helper, name: &str, wait: Duration) -> Event {
    take(helper, Take::Lock, name, wait)
}

/// What a scenario's holders take: a `Mutex`, or the leadership of an election (a `Mutex`
/// of its own name, with the leader's record beside it).
#[derive(Clone, Copy)]
enum Take {
    Lock,
    Campaign,
}

impl Take {
    /// The helper's command.
    fn verb(self) -> &'static str {
        match self {
            Take::Lock => "lock",
            Take::Campaign => "campaign",
        }
    }

    /// The lock key of `name`.
    fn key(self, name: &str) -> String {
        match self {
            Take::Lock => format!("redmutex:{{{name}}}"),
            Take::Campaign => format!("redmutex:{{election:{name}}}"),
        }
    }
}

fn take(helper: &mut Helper, take: Take, name: &str, wait: Duration) -> Event {
    helper.send(&format!("{} {name} {}", take.verb(), wait.as_millis()));
    acquired(helper, name, wait + ANSWER)
}

fn unlock(helper: &mut Helper) {
    helper.send("unlock");
    helper.expect("unlocked", ANSWER);
}

/// The old holder's `unlock`, after the heal: it must fail with `LockLost` (it released
/// nothing of the new holder's).
fn unlock_is_lock_lost(helper: &mut Helper) {
    helper.send("unlock");
    match helper.next(&["unlocked", "unlock-error"], ANSWER) {
        Some(e)
            if e.kind == "unlock-error"
                && e.args.first().map(String::as_str) == Some("LockLost") => {}
        other => panic!(
            "the old holder's unlock after the heal should report the loss (LockLost), got \
             {other:?}{}",
            helper.report()
        ),
    }
}

/// Events on one clock, printed relative to the cut.
struct Timeline {
    cut: u64,
    entries: Vec<(u64, String)>,
}

impl Timeline {
    fn new(cut: u64) -> Timeline {
        Timeline {
            cut,
            entries: vec![(cut, "host a cut off".to_owned())],
        }
    }

    fn add(&mut self, t: u64, what: impl Into<String>) {
        self.entries.push((t, what.into()));
    }

    fn ms(&self, t: u64) -> f64 {
        (t as f64 - self.cut as f64) / 1000.0
    }
}

impl std::fmt::Display for Timeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut entries = self.entries.clone();
        entries.sort();
        let mut text = String::from("\ntimeline (CLOCK_MONOTONIC, ms from the cut):");
        for (t, what) in &entries {
            let _ = write!(text, "\n  {:>+10.1} ms  {what}", self.ms(*t));
        }
        f.write_str(&text)
    }
}

/// The old holder must have been told before the new holder's acquire returned.
fn assert_told_first(timeline: &Timeline, told: Option<&Event>, acquired: &Event) {
    let Some(told) = told else {
        panic!(
            "the old holder was never told that its lease was lost (not even after the heal), \
             while the new holder acquired at {} µs{timeline}",
            acquired.t
        );
    };
    assert!(
        told.t < acquired.t,
        "the old holder was told its lease was lost at t={} µs ({:+.1} ms from the cut), \
         {:.1} ms AFTER the new holder's acquire returned at t={} µs ({:+.1} ms): both \
         believed they held the lock meanwhile{timeline}",
        told.t,
        timeline.ms(told.t),
        (told.t - acquired.t) as f64 / 1000.0,
        acquired.t,
        timeline.ms(acquired.t),
    );
}

/// Keys on `nodes` (those that answer) whose value holds `token`, as `node: key=value`.
/// The keys of `nodes` whose value holds `token`, and the nodes that could not be read.
/// A node that refuses a read is asked again for up to 30 s first: after a heal, a Cluster
/// node answers `CLUSTERDOWN` for a moment while its view of the cluster settles (seen here
/// on the old master right after it had synced from the promoted one).
fn keys_holding(nodes: &[&NsServer], token: &str) -> Vec<String> {
    nodes
        .iter()
        .flat_map(|n| {
            let deadline = Instant::now() + Duration::from_secs(30);
            loop {
                match n.keys_holding(token) {
                    Ok(found) => {
                        break found
                            .into_iter()
                            .map(|k| format!("{}: {k}", n.label()))
                            .collect::<Vec<_>>()
                    }
                    Err(_) if Instant::now() < deadline => {
                        std::thread::sleep(Duration::from_millis(200))
                    }
                    Err(e) => break vec![format!("{}: unreadable ({e})", n.label())],
                }
            }
        })
        .collect()
}

fn value(node: &NsServer, key: &str) -> Option<String> {
    node.get(key).ok().flatten()
}

// ---------------------------------------------------------------------------------------
// Sentinel

const MASTER_NAME: &str = "mymaster";

fn sentinel_fields(sentinel: &NsServer, what: &str) -> Option<redis::Value> {
    let mut conn = sentinel.try_conn(Duration::from_secs(2)).ok()?;
    redis::cmd("SENTINEL")
        .arg(what)
        .arg(MASTER_NAME)
        .query(&mut conn)
        .ok()
}

/// Every sentinel sees the master at `master_ip`, both replicas linked and the two other
/// sentinels; both replicas are linked.
fn sentinels_settled(sentinels: &[NsServer], replicas: &[NsServer], master_ip: &str) -> bool {
    sentinels.iter().all(|s| {
        let Some(master) = sentinel_fields(s, "MASTER")
            .and_then(|v| redis::from_redis_value::<HashMap<String, String>>(v).ok())
        else {
            return false;
        };
        let Some(replicas) = sentinel_fields(s, "REPLICAS")
            .and_then(|v| redis::from_redis_value::<Vec<HashMap<String, String>>>(v).ok())
        else {
            return false;
        };
        let field = |m: &HashMap<String, String>, k: &str| m.get(k).cloned().unwrap_or_default();
        field(&master, "ip") == master_ip
            && field(&master, "flags") == "master"
            && field(&master, "num-other-sentinels") == "2"
            && replicas.len() == 2
            && replicas.iter().all(|r| {
                field(r, "flags") == "slave"
                    && field(r, "master-link-status") == "ok"
                    && field(r, "info-refresh")
                        .parse::<u64>()
                        .is_ok_and(|ms| ms < 5_000)
            })
    }) && replicas
        .iter()
        .all(|r| r.info_field("replication", "master_link_status").as_deref() == Some("up"))
}

/// Watches, from a thread, the sentinels at `addrs` until one names a master other than
/// `old_ip`; returns when (CLOCK_MONOTONIC µs) and its address.
fn watch_sentinel_failover(
    addrs: Vec<String>,
    old_ip: String,
) -> std::thread::JoinHandle<Option<(u64, String)>> {
    std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        while std::time::Instant::now() < deadline {
            for addr in &addrs {
                let named = (|| -> redis::RedisResult<Option<(String, u16)>> {
                    let client = redis::Client::open(format!("redis://{addr}/"))?;
                    let mut conn =
                        client.get_connection_with_timeout(Duration::from_millis(500))?;
                    conn.set_read_timeout(Some(Duration::from_millis(500)))?;
                    redis::cmd("SENTINEL")
                        .arg("GET-MASTER-ADDR-BY-NAME")
                        .arg(MASTER_NAME)
                        .query(&mut conn)
                })();
                if let Ok(Some((ip, _))) = named {
                    if ip != old_ip {
                        return Some((now_us(), ip));
                    }
                }
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    })
}

/// Sentinel split-brain: the master and a sentinel on host a, a replica and a sentinel on
/// each of b and c. The old holder runs on a, so it still reaches the old master after a is
/// cut off; the sentinels of b and c promote a replica, and a client on b takes the lock there.
/// Returns the timeline, when the old holder was told (if ever), the new holder's acquire and
/// when the cut was healed; `None` where network namespaces cannot be used.
fn sentinel_split_brain(
    settings: Settings,
    what: Take,
) -> Option<(Timeline, Option<Event>, Event, u64)> {
    if !netns::usable() {
        return None;
    }
    let _one = one_at_a_time();
    let net = Net::new(3);
    let (a, b, c) = (net.host(0), net.host(1), net.host(2));
    let master = a.start_redis(6379, &["--repl-diskless-sync-delay", "0"]);
    let follow = [
        "--repl-diskless-sync-delay",
        "0",
        "--replicaof",
        a.ip(),
        "6379",
    ];
    let replicas = [b.start_redis(6379, &follow), c.start_redis(6379, &follow)];
    let conf = format!(
        "sentinel monitor {MASTER_NAME} {} 6379 2\n\
         sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
         sentinel failover-timeout {MASTER_NAME} 3000\n\
         sentinel parallel-syncs {MASTER_NAME} 2",
        a.ip()
    );
    let sentinels: Vec<NsServer> = [a, b, c]
        .iter()
        .map(|h| h.start_sentinel(26379, &conf))
        .collect();
    assert!(
        eventually(Duration::from_secs(60), || sentinels_settled(
            &sentinels,
            &replicas,
            a.ip()
        )),
        "the sentinel deployment did not settle{}",
        sentinels[0].log_tail(30)
    );
    let addrs: Vec<String> = sentinels.iter().map(NsServer::addr).collect();
    let spec = HelperSpec {
        role: Role::Client,
        urls: vec![format!(
            "redis+sentinel://{}/{MASTER_NAME}",
            addrs.join(",")
        )],
        settings,
    };
    let mut old = a.spawn_helper(HELPER, "c1", &spec);
    let mut new = b.spawn_helper(HELPER, "c2", &spec);
    open(&mut old);
    open(&mut new);
    // The new holder knows the master and has connections to it before the cut.
    lock(&mut new, "warm", ANSWER);
    unlock(&mut new);

    let key = &*what.key("split");
    let first = take(&mut old, what, "split", ANSWER);
    let old_value = value(&master, key).expect("the lock is on the master");
    assert!(
        eventually(Duration::from_secs(20), || replicas.iter().all(|r| value(
            r, key
        )
        .as_deref()
            == Some(old_value.as_str()))),
        "the replicas did not get the lock"
    );

    let cut = now_us();
    a.partition();
    let mut timeline = Timeline::new(cut);
    timeline.add(
        first.t,
        format!("c1 (host a) acquired, token {}", first.number()),
    );
    let failover = watch_sentinel_failover(addrs[1..].to_vec(), a.ip().to_owned());
    new.send(&format!("{} split 30000", what.verb()));
    let second = acquired(&mut new, "split after the cut", Duration::from_secs(60));
    timeline.add(
        second.t,
        format!("c2 (host b) acquired, token {}", second.number()),
    );
    let (promoted_at, new_ip) = failover
        .join()
        .expect("watcher")
        .expect("the sentinels never named a new master");
    timeline.add(promoted_at, format!("sentinels name {new_ip} the master"));
    let new_master = replicas
        .iter()
        .find(|r| r.ip() == new_ip)
        .expect("the new master is a replica");
    let new_value = value(new_master, key).expect("the new holder's lock on the new master");
    // Still cut off: a told that comes late, but before the heal, shows here.
    let told_while_cut = old.next(&["told"], Duration::from_secs(5));

    let healed = now_us();
    a.heal();
    timeline.add(healed, "host a healed");
    let told = told_while_cut.or_else(|| old.next(&["told"], Duration::from_secs(40)));
    if let Some(t) = &told {
        timeline.add(t.t, "c1 told its lease is lost");
    }
    eprintln!("sentinel split-brain:{timeline}");

    // The old master becomes a replica of the new one, with the new holder's lock.
    let fence = format!("{key}:fence");
    let demoted = eventually(Duration::from_secs(60), || {
        master.info_field("replication", "role").as_deref() == Some("slave")
            && master.info_field("replication", "master_host").as_deref() == Some(new_ip.as_str())
            && master
                .info_field("replication", "master_link_status")
                .as_deref()
                == Some("up")
            && value(&master, key).as_deref() == Some(new_value.as_str())
            && value(&master, &fence) == value(new_master, &fence)
    });
    assert!(
        demoted,
        "the old master did not become a replica of {new_ip} holding the new lock (role \
         {:?}, master {:?}, lock {:?}){timeline}{}",
        master.info_field("replication", "role"),
        master.info_field("replication", "master_host"),
        value(&master, key),
        master.log_tail(20)
    );
    let nodes: Vec<&NsServer> = std::iter::once(&master).chain(&replicas).collect();
    let left = keys_holding(&nodes, &old_value);
    assert!(
        left.is_empty(),
        "the old holder's lock is left after the heal: {left:?}"
    );
    unlock_is_lock_lost(&mut old);
    assert_eq!(
        value(new_master, key).as_deref(),
        Some(new_value.as_str()),
        "the old holder's unlock touched the new holder's lock"
    );
    assert!(
        second.number() > first.number(),
        "the new holder's fencing token {} is not above the old holder's {}",
        second.number(),
        first.number()
    );
    Some((timeline, told, second, healed))
}

/// With replica acknowledgements (the default under Sentinel), the holder behind the cut-off
/// master counts its lease only from writes a replica acknowledged, and is told before the
/// promoted replica's copy expires and the new holder takes the lock there.
#[test]
fn sentinel_split_brain_the_holder_behind_the_cut_off_master_is_told_first() {
    let scenario = sentinel_split_brain(settings(Acks::Default), Take::Lock);
    let Some((timeline, told, acquired, _)) = scenario else {
        return;
    };
    assert_told_first(&timeline, told.as_ref(), &acquired);
}

/// An election's leader behind the cut-off master is told it lost before the candidate on
/// the other side, campaigning on the promoted replica, leads; its term is the smaller.
#[test]
fn sentinel_split_brain_the_leader_behind_the_cut_off_master_is_told_first() {
    let scenario = sentinel_split_brain(settings(Acks::Default), Take::Campaign);
    let Some((timeline, told, elected, _)) = scenario else {
        return;
    };
    assert_told_first(&timeline, told.as_ref(), &elected);
}

/// Without acknowledgements (`no_replica_acks`), the cut-off master keeps taking the old
/// holder's renewals and the old holder believes it holds the lock until the cut heals:
/// what docs/guarantees.md says is left without them.
#[test]
fn sentinel_split_brain_without_acknowledgements_the_holder_is_told_only_after_the_heal() {
    let scenario = sentinel_split_brain(settings(Acks::Off), Take::Lock);
    let Some((timeline, told, acquired, healed)) = scenario else {
        return;
    };
    let told = told.expect("the old holder was never told, even after the heal");
    assert!(
        told.t > acquired.t && told.t > healed,
        "without acknowledgements the old holder was told before the heal: renewals on the \
         cut-off master should have kept its lease{timeline}"
    );
    eprintln!(
        "without acknowledgements: {:.1} ms of two holders",
        (told.t - acquired.t) as f64 / 1000.0
    );
}

// ---------------------------------------------------------------------------------------
// Cluster

fn cluster_args(ip: &str) -> Vec<String> {
    [
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        "1000",
        "--cluster-announce-ip",
        ip,
        "--repl-diskless-sync-delay",
        "0",
    ]
    .map(str::to_owned)
    .to_vec()
}

fn start_cluster_node(host: &netns::Host, port: u16) -> NsServer {
    let args = cluster_args(host.ip());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    host.start_redis(port, &args)
}

/// Every node says `cluster_state:ok` and knows six connected nodes, three masters and three
/// replicas, none failing; every replica's link is up.
fn cluster_settled(nodes: &[&NsServer]) -> bool {
    nodes.iter().all(|n| {
        if n.field_of("CLUSTER", "INFO", "cluster_state").as_deref() != Some("ok") {
            return false;
        }
        let Ok(mut conn) = n.try_conn(Duration::from_secs(2)) else {
            return false;
        };
        let Ok(text) = redis::cmd("CLUSTER")
            .arg("NODES")
            .query::<String>(&mut conn)
        else {
            return false;
        };
        let lines: Vec<Vec<&str>> = text
            .lines()
            .map(|l| l.split_whitespace().collect())
            .collect();
        let role = |l: &Vec<&str>, r: &str| l.get(2).is_some_and(|f| f.split(',').any(|x| x == r));
        // Every node's slot map names a replica for every range: a replica that has not told
        // the cluster its replication offset yet is left out of `CLUSTER SLOTS`, and a client
        // that read the map then would count none and ask none to acknowledge its leases.
        let slots: Vec<redis::Value> = match redis::cmd("CLUSTER").arg("SLOTS").query(&mut conn) {
            Ok(slots) => slots,
            Err(_) => return false,
        };
        let replicas_named = !slots.is_empty()
            && slots
                .iter()
                .all(|range| matches!(range, redis::Value::Array(parts) if parts.len() >= 4));
        replicas_named
            && lines.len() == 6
            && lines.iter().filter(|l| role(l, "master")).count() == 3
            && lines.iter().filter(|l| role(l, "slave")).count() == 3
            && lines.iter().all(|l| {
                l.get(2).is_some_and(|f| {
                    !f.split(',')
                        .any(|x| matches!(x, "fail" | "fail?" | "handshake" | "noaddr"))
                }) && l.get(7) == Some(&"connected")
            })
            && (n.info_field("replication", "role").as_deref() != Some("slave")
                || n.info_field("replication", "master_link_status").as_deref() == Some("up"))
    })
}

/// The slot ranges that the master at `ip:port` serves, as `node` sees them.
fn slots_of(node: &NsServer, ip: &str, port: u16) -> Vec<(i64, i64)> {
    let ranges: Vec<redis::Value> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut node.conn())
        .expect("CLUSTER SLOTS");
    ranges
        .iter()
        .filter_map(|r| {
            let redis::Value::Array(parts) = r else {
                return None;
            };
            let int = |v: &redis::Value| redis::from_redis_value_ref::<i64>(v).ok();
            let redis::Value::Array(owner) = parts.get(2)? else {
                return None;
            };
            let owner_ip = redis::from_redis_value_ref::<String>(owner.first()?).ok()?;
            let owner_port = int(owner.get(1)?)?;
            (owner_ip == ip && owner_port == i64::from(port))
                .then_some((int(parts.first()?)?, int(parts.get(1)?)?))
        })
        .collect()
}

/// A name `<stem>-<i>` whose key (as `what` takes it) falls in `ranges`.
fn name_in(node: &NsServer, ranges: &[(i64, i64)], stem: &str, what: Take) -> String {
    let mut conn = node.conn();
    (0..10_000)
        .map(|i| format!("{stem}-{i}"))
        .find(|name| {
            let slot: i64 = redis::cmd("CLUSTER")
                .arg("KEYSLOT")
                .arg(what.key(name))
                .query(&mut conn)
                .expect("CLUSTER KEYSLOT");
            ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&slot))
        })
        .expect("a name in the master's slots")
}

/// Watches `node` from a thread until it says it is a master; returns when (CLOCK_MONOTONIC
/// µs).
fn watch_promotion(ip: String, port: u16) -> std::thread::JoinHandle<Option<u64>> {
    std::thread::spawn(move || {
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        while std::time::Instant::now() < deadline {
            let role = (|| -> redis::RedisResult<String> {
                let client = redis::Client::open(format!("redis://{ip}:{port}/"))?;
                let mut conn = client.get_connection_with_timeout(Duration::from_millis(500))?;
                conn.set_read_timeout(Some(Duration::from_millis(500)))?;
                redis::cmd("INFO").arg("replication").query(&mut conn)
            })();
            if role.is_ok_and(|text| text.lines().any(|l| l.trim() == "role:master")) {
                return Some(now_us());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    })
}

/// A Cluster of three masters on hosts a, b and c, each with its replica on the next host
/// (a's on b, b's on c, c's on a). The old holder runs on a and holds a lock of a's master;
/// a is cut off, the cluster promotes a's replica on b, and a client on c takes the lock
/// there. A client opened on c at the cut (its first slot map names a's master) takes a lock
/// of the same master within 20 s of the promotion.
#[test]
fn cluster_the_holder_behind_the_cut_off_master_is_told_before_its_replica_grants_the_lock() {
    cluster_cut_off_master(Take::Lock);
}

/// The same with an election: the leader behind the cut-off master is told it lost before
/// the candidate on c leads, with a larger term.
#[test]
fn cluster_the_leader_behind_the_cut_off_master_is_told_before_another_leads() {
    cluster_cut_off_master(Take::Campaign);
}

fn cluster_cut_off_master(what: Take) {
    if !netns::usable() {
        return;
    }
    let _one = one_at_a_time();
    let net = Net::new(3);
    let hosts = net.hosts();
    let masters: Vec<NsServer> = hosts.iter().map(|h| start_cluster_node(h, 7000)).collect();
    // replicas[i], on the next host, replicates masters[i].
    let replicas: Vec<NsServer> = (0..3)
        .map(|i| start_cluster_node(&hosts[(i + 1) % 3], 7001))
        .collect();
    let out = std::process::Command::new("redis-cli")
        .args(["--cluster", "create"])
        .args(masters.iter().map(NsServer::addr))
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .output()
        .expect("run redis-cli --cluster create");
    assert!(
        out.status.success(),
        "redis-cli --cluster create failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for (master, replica) in masters.iter().zip(&replicas) {
        let id: String = redis::cmd("CLUSTER")
            .arg("MYID")
            .query(&mut master.conn())
            .expect("CLUSTER MYID");
        let _: () = redis::cmd("CLUSTER")
            .arg("MEET")
            .arg(master.ip())
            .arg(master.port())
            .query(&mut replica.conn())
            .expect("CLUSTER MEET");
        // Refused ("Unknown node") until the handshake is done.
        assert!(
            eventually(Duration::from_secs(30), || redis::cmd("CLUSTER")
                .arg("REPLICATE")
                .arg(&id)
                .query::<()>(&mut replica.conn())
                .is_ok()),
            "{} never became a replica of {}",
            replica.label(),
            master.label()
        );
    }
    let all: Vec<&NsServer> = masters.iter().chain(&replicas).collect();
    assert!(
        eventually(Duration::from_secs(60), || cluster_settled(&all)),
        "the cluster did not settle{}",
        masters[0].log_tail(30)
    );

    let (a, b, c) = (&hosts[0], &hosts[1], &hosts[2]);
    let a_slots = slots_of(&masters[2], a.ip(), 7000);
    assert!(!a_slots.is_empty(), "a's master serves no slot");
    let name = name_in(&masters[2], &a_slots, "cut", what);
    let late_name = name_in(&masters[2], &a_slots, "late", Take::Lock);
    let key = what.key(&name);
    let seeds = |first: &netns::Host| {
        let mut order: Vec<&netns::Host> = vec![first];
        order.extend(hosts.iter().filter(|h| h.ip() != first.ip()));
        format!(
            "redis+cluster://{}",
            order
                .iter()
                .map(|h| format!("{}:7000", h.ip()))
                .collect::<Vec<_>>()
                .join(",")
        )
    };
    let spec = |first: &netns::Host| HelperSpec {
        role: Role::Client,
        urls: vec![seeds(first)],
        settings: settings(Acks::Default),
    };
    let mut old = a.spawn_helper(HELPER, "c1", &spec(a));
    let mut new = c.spawn_helper(HELPER, "c2", &spec(c));
    // Not opened until the cut: its first slot map, read from c, names a's master.
    let mut late = c.spawn_helper(HELPER, "c3", &spec(c));
    open(&mut old);
    open(&mut new);
    // The new holder knows the slot map and has connections to a's master before the cut.
    let warm = name_in(&masters[2], &a_slots, "warm", Take::Lock);
    lock(&mut new, &warm, ANSWER);
    unlock(&mut new);

    let first = take(&mut old, what, &name, ANSWER);
    let old_value = value(&masters[0], &key).expect("the lock is on a's master");
    assert!(
        eventually(Duration::from_secs(20), || value(&replicas[0], &key)
            .as_deref()
            == Some(old_value.as_str())),
        "a's replica did not get the lock"
    );

    let cut = now_us();
    a.partition();
    late.send("open");
    late.send(&format!("lock {late_name} 60000"));
    let mut timeline = Timeline::new(cut);
    timeline.add(
        first.t,
        format!("c1 (host a) acquired, token {}", first.number()),
    );
    let promotion = watch_promotion(replicas[0].ip().to_owned(), replicas[0].port());
    new.send(&format!("{} {name} 30000", what.verb()));
    let second = acquired(&mut new, "the lock after the cut", Duration::from_secs(60));
    timeline.add(
        second.t,
        format!("c2 (host c) acquired, token {}", second.number()),
    );
    let late_acquired = acquired(
        &mut late,
        "a lock of the cut-off master's slots, opened at the cut",
        Duration::from_secs(60),
    );
    timeline.add(late_acquired.t, "c3 (host c, opened at the cut) acquired");
    let promoted = promotion
        .join()
        .expect("watcher")
        .expect("a's replica on b was never promoted");
    timeline.add(promoted, "a's replica on b is a master");
    let new_value = value(&replicas[0], &key).expect("the new holder's lock on b");
    let told_while_cut = old.next(&["told"], Duration::from_secs(5));

    let healed = now_us();
    a.heal();
    timeline.add(healed, "host a healed");
    let told = told_while_cut.or_else(|| old.next(&["told"], Duration::from_secs(40)));
    if let Some(t) = &told {
        timeline.add(t.t, "c1 told its lease is lost");
    }
    eprintln!("cluster:{timeline}");

    assert!(
        late_acquired.t.saturating_sub(promoted) < 20_000_000,
        "a client opened at the cut took {:.1} s after the promotion to acquire{timeline}",
        late_acquired.t.saturating_sub(promoted) as f64 / 1e6
    );
    // The old master becomes a replica of the promoted one, with the new holder's lock.
    let fence = format!("{key}:fence");
    let demoted = eventually(Duration::from_secs(60), || {
        masters[0].info_field("replication", "role").as_deref() == Some("slave")
            && masters[0]
                .info_field("replication", "master_host")
                .as_deref()
                == Some(b.ip())
            && masters[0]
                .info_field("replication", "master_port")
                .as_deref()
                == Some("7001")
            && masters[0]
                .info_field("replication", "master_link_status")
                .as_deref()
                == Some("up")
            && value(&masters[0], &key).as_deref() == Some(new_value.as_str())
            && value(&masters[0], &fence) == value(&replicas[0], &fence)
    });
    assert!(
        demoted,
        "a's old master did not become a replica of b's holding the new lock (role {:?}, \
         master {:?}, lock {:?}){timeline}{}",
        masters[0].info_field("replication", "role"),
        masters[0].info_field("replication", "master_host"),
        value(&masters[0], &key),
        masters[0].log_tail(20)
    );
    let left = keys_holding(&all, &old_value);
    assert!(
        left.is_empty(),
        "the old holder's lock is left after the heal: {left:?}"
    );
    unlock_is_lock_lost(&mut old);
    assert_eq!(
        value(&replicas[0], &key).as_deref(),
        Some(new_value.as_str()),
        "the old holder's unlock touched the new holder's lock"
    );
    assert!(
        second.number() > first.number(),
        "the new holder's fencing token {} is not above the old holder's {}",
        second.number(),
        first.number()
    );
    assert_told_first(&timeline, told.as_ref(), &second);
}

// ---------------------------------------------------------------------------------------
// Redlock

/// Redlock over three standalone servers on hosts a, b and c. The old holder runs on a; a
/// is cut off, so the holder reaches one instance of three; a client on b takes the lock on
/// b and c once their copies expired.
#[test]
fn redlock_the_holder_cut_off_from_the_majority_is_told_first() {
    if !netns::usable() {
        return;
    }
    let _one = one_at_a_time();
    let net = Net::new(3);
    let hosts = net.hosts();
    let servers: Vec<NsServer> = hosts.iter().map(|h| h.start_redis(6379, &[])).collect();
    let spec = HelperSpec {
        role: Role::Redlock,
        urls: servers.iter().map(NsServer::url).collect(),
        settings: Settings {
            instance_ms: Some(200),
            ..settings(Acks::Default)
        },
    };
    let (a, b) = (&hosts[0], &hosts[1]);
    let mut old = a.spawn_helper(HELPER, "c1", &spec);
    let mut new = b.spawn_helper(HELPER, "c2", &spec);
    open(&mut old);
    open(&mut new);
    // The new holder has connections to every instance before the cut.
    lock(&mut new, "warm", ANSWER);
    unlock(&mut new);

    let key = "redmutex:{majority}";
    let first = lock(&mut old, "majority", ANSWER);
    let old_value = value(&servers[0], key).expect("the lock is on a");
    assert!(
        servers
            .iter()
            .all(|s| value(s, key).as_deref() == Some(old_value.as_str())),
        "the lock is not on every instance"
    );

    let cut = now_us();
    a.partition();
    let mut timeline = Timeline::new(cut);
    timeline.add(
        first.t,
        format!("c1 (host a) acquired, token {}", first.number()),
    );
    new.send("lock majority 30000");
    let second = acquired(&mut new, "the lock after the cut", Duration::from_secs(60));
    timeline.add(
        second.t,
        format!("c2 (host b) acquired, token {}", second.number()),
    );
    let new_value = value(&servers[1], key).expect("the new holder's lock on b");
    let told_while_cut = old.next(&["told"], Duration::from_secs(5));

    let healed = now_us();
    a.heal();
    timeline.add(healed, "host a healed");
    let told = told_while_cut.or_else(|| old.next(&["told"], Duration::from_secs(40)));
    if let Some(t) = &told {
        timeline.add(t.t, "c1 told its lease is lost");
    }
    eprintln!("redlock:{timeline}");

    // a's copy expires once the old holder stops renewing it.
    let all: Vec<&NsServer> = servers.iter().collect();
    let mut left = Vec::new();
    let gone = eventually(Duration::from_secs(20), || {
        left = keys_holding(&all, &old_value);
        left.is_empty()
    });
    assert!(
        gone,
        "the old holder's lock is left after the heal: {left:?}{timeline}"
    );
    unlock_is_lock_lost(&mut old);
    for s in &servers[1..] {
        assert_eq!(
            value(s, key).as_deref(),
            Some(new_value.as_str()),
            "the old holder's unlock touched the new holder's lock on {}",
            s.label()
        );
    }
    assert!(
        second.number() > first.number(),
        "the new holder's fencing token {} is not above the old holder's {}",
        second.number(),
        first.number()
    );
    assert_told_first(&timeline, told.as_ref(), &second);
}
