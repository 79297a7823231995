//! Redis Cluster: locks routed to the master of their slot, on all three shards, across a
//! failover, and clear errors when a slot has no master or no node answers. Every node is a
//! real process the test starts.

mod support;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use redmutex::{Client, ErrorKind};
use support::cluster::ClusterDeployment;
use support::{eventually, within, RedisServer};

const LIMIT: Duration = Duration::from_secs(90);

/// One cluster (six servers) at a time: two cores cannot run several without nodes missing
/// each other's heartbeats.
static ONE_CLUSTER: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_cluster() -> std::sync::MutexGuard<'static, ()> {
    ONE_CLUSTER.lock().unwrap_or_else(|e| e.into_inner())
}

fn client(cluster: &ClusterDeployment) -> Client {
    Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .default_lease(Duration::from_secs(6))
        .renewal_interval(Duration::from_millis(500))
        .open(cluster.url())
        .expect("client")
}

#[test]
fn locks_live_on_the_master_of_their_slot_on_every_shard() {
    let _one = one_cluster();
    let cluster = ClusterDeployment::start();
    let client = client(&cluster);
    client.check().unwrap(); // every master answers
    let guards: Vec<_> = (0..30)
        .map(|i| client.mutex(format!("order:{i}")).lock().unwrap())
        .collect();
    let mut masters = BTreeSet::new();
    for i in 0..30 {
        let key = format!("redmutex:{{order:{i}}}");
        let master = cluster.master_of(&key);
        let exists: bool = redis::cmd("EXISTS")
            .arg(&key)
            .query(&mut master.conn())
            .unwrap();
        assert!(exists, "{key} is not on the master of its slot");
        masters.insert(master.port());
    }
    assert_eq!(
        masters.len(),
        3,
        "the locks did not spread over the three shards"
    );
    // Renewal goes on for all of them, one round trip per master per period.
    let before = client.stats();
    assert!(eventually(LIMIT, || client.stats().renewals >= before.renewals + 60));
    assert!(guards.iter().all(|g| !g.is_lost()));
    drop(guards);
    assert_eq!(client.stats().renewed_leases, 0);
}

#[test]
fn threads_take_turns_through_the_cluster_and_waiters_are_woken() {
    let _one = one_cluster();
    let cluster = ClusterDeployment::start();
    // The builder form, with seeds as host:port.
    let seeds: Vec<String> = cluster.nodes[..2]
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port()))
        .collect();
    let client = Client::builder().cluster(&seeds).unwrap();
    let none: [&str; 0] = [];
    assert!(Client::builder().cluster(none).unwrap_err().is_config());
    assert_eq!(support::overlaps_of_four_threads(&client, "counter"), 0);
    let stats = client.stats();
    assert_eq!(stats.acquisitions, 80);
    // Threads of one client are passed the lock by its holder, or woken by an announcement
    // when it was released in Redis: either way, not by their backoff.
    assert!(
        stats.notifications + stats.passed_on > 0,
        "no waiter was woken: {stats:?}"
    );
}

#[test]
fn a_lock_is_kept_across_a_cluster_failover() {
    let _one = one_cluster();
    let cluster = ClusterDeployment::start();
    let client = Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .default_lease(Duration::from_secs(6))
        .renewal_interval(Duration::from_millis(500))
        .replica_acks(1, Duration::from_secs(1))
        .open(cluster.url())
        .unwrap();
    let g = client.mutex("kept").lock().unwrap();
    let token = g.fencing_token();
    let master = cluster.master_of("redmutex:{kept}").port();
    let replica = cluster
        .replica_of(cluster.master_of("redmutex:{kept}"))
        .port();
    // A manual failover gives up when the master does not answer in time: ask again.
    let promoted = eventually(LIMIT, || {
        let node = cluster.nodes.iter().find(|n| n.port() == replica).unwrap();
        let _: redis::RedisResult<()> = redis::cmd("CLUSTER")
            .arg("FAILOVER")
            .query(&mut node.conn());
        eventually(Duration::from_secs(10), || {
            node.info_field("replication", "role").as_deref() == Some("master")
        })
    });
    assert!(promoted, "the replica was never promoted");
    let renewals = client.stats().renewals;
    assert!(eventually(LIMIT, || client.stats().renewals >= renewals + 4));
    if g.is_lost() {
        panic!("the lease was lost across the failover: {:?}", g.verify());
    }
    assert!(g.verify().is_ok());
    g.unlock().unwrap();
    assert_ne!(master, replica);
    assert!(eventually(LIMIT, || cluster.ok()));
    let next = client.mutex("kept").lock().unwrap();
    assert!(next.fencing_token() > token);
}

#[test]
fn a_slot_without_a_master_is_a_clear_error_within_the_deadline() {
    let _one = one_cluster();
    let mut cluster = ClusterDeployment::start();
    let client = client(&cluster);
    drop(client.mutex("lonely").lock().unwrap());
    let master = cluster.master_of("redmutex:{lonely}").port();
    let replica = cluster
        .replica_of(cluster.master_of("redmutex:{lonely}"))
        .port();
    for port in [replica, master] {
        cluster
            .nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .unwrap()
            .kill();
    }
    let started = Instant::now();
    let err = within(LIMIT, move || client.mutex("lonely").try_lock().map(drop)).unwrap_err();
    assert!(
        matches!(
            err.kind(),
            ErrorKind::Connection | ErrorKind::Timeout | ErrorKind::Server
        ),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
}

#[test]
fn seeds_where_no_node_answers_are_a_connection_error() {
    let ports: Vec<u16> = (0..2).map(|_| support::free_port()).collect();
    let client = Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .open(format!(
            "redis+cluster://127.0.0.1:{},127.0.0.1:{}",
            ports[0], ports[1]
        ))
        .unwrap();
    let started = Instant::now();
    let c = client.clone();
    let err = within(LIMIT, move || c.check()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    let err = within(LIMIT, move || client.mutex("x").try_lock().map(drop)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(Client::open("redis+cluster://").unwrap_err().is_config());
}

#[test]
fn a_lock_follows_its_slot_when_the_slot_migrates() {
    let _one = one_cluster();
    let cluster = ClusterDeployment::start();
    let holder = client(&cluster);
    let waiter = client(&cluster);
    let g = holder.mutex("moving").lock().unwrap();
    let from_port = cluster.master_of("redmutex:{moving}").port();
    let to_port = cluster.other_master_than_of("redmutex:{moving}").port();
    let w = waiter.clone();
    let t = std::thread::spawn(move || {
        w.mutex("moving")
            .try_lock_for(LIMIT)
            .map(|g| g.map(|g| g.fencing_token()))
    });
    assert!(eventually(LIMIT, || waiter.stats().contended >= 1));
    let to = cluster.nodes.iter().find(|n| n.port() == to_port).unwrap();
    cluster.migrate_slot_of("redmutex:{moving}", to);
    assert_eq!(cluster.master_of("redmutex:{moving}").port(), to_port);
    // Renewal follows the key to its new master: the lease outlives its length.
    std::thread::sleep(Duration::from_secs(7));
    if g.is_lost() {
        panic!("the lease was lost when its slot moved: {:?}", g.verify());
    }
    assert!(g.verify().is_ok());
    let token = g.fencing_token();
    // The waiter's sharded subscription followed the slot: the old master dropped it, and
    // the waiter subscribed again on the new one. (A classic subscription, on Redis 6.2,
    // stays where it is: the cluster bus brings it every announcement.)
    if sharded_pubsub() {
        // The waiting client's own channel, on which a release names it.
        let listens = |node: &RedisServer| {
            shard_channels(node)
                .iter()
                .any(|c| c.starts_with("redmutex:{moving}:ch:"))
        };
        assert!(eventually(LIMIT, || listens(to)));
        let from = cluster
            .nodes
            .iter()
            .find(|n| n.port() == from_port)
            .unwrap();
        assert!(!listens(from));
    }
    let heard = waiter.stats().notifications;
    g.unlock().unwrap();
    // The waiter gets it after the release, on the new master, woken by the announcement.
    let got = within(LIMIT, move || t.join().unwrap()).unwrap();
    assert!(got.is_some_and(|next| next > token), "{got:?}");
    assert!(
        waiter.stats().notifications > heard,
        "the release was not heard"
    );
    // The first holder takes it again on its new master: a first try through a stale slot
    // map is redirected, and goes again as the script; then the acquires run no script
    // there, only the releases do (on Redis 6.2, which refuses `SET … NX … GET`, both).
    let m = holder.mutex("moving");
    let mut last = got.unwrap_or(0);
    let mut cycle = || {
        let g = m.lock().unwrap();
        assert!(
            g.fencing_token() > last,
            "{} after {last}",
            g.fencing_token()
        );
        last = g.fencing_token();
        g.unlock().unwrap();
    };
    // The second also tries the `SET`'s form on the new master (alone).
    cycle();
    cycle();
    let scripts = to.command_calls("evalsha");
    for _ in 0..5 {
        cycle();
    }
    let per_cycle = match support::server_version().redis_before(7, 0) {
        true => 2,
        false => 1,
    };
    assert_eq!(to.command_calls("evalsha") - scripts, 5 * per_cycle);
}

#[test]
fn a_lock_taken_while_its_slot_migrates_waits_for_the_move_within_its_deadline() {
    let _one = one_cluster();
    let cluster = ClusterDeployment::start();
    let client = client(&cluster);
    drop(client.mutex("warm").lock().unwrap()); // the slot map is read
    let key = "redmutex:{asked}";
    let to_port = cluster.other_master_than_of(key).port();
    let to = cluster.nodes.iter().find(|n| n.port() == to_port).unwrap();
    cluster.start_migrating_slot_of(key, to);
    // None of the lock's keys is on the old master: it answers ASK, and the importing node
    // answers TRYAGAIN to a script over keys it does not have yet; the acquire waits for the
    // move (within its response timeout) and then follows MOVED to the new master.
    let c = client.clone();
    let taking = std::thread::spawn(move || c.mutex("asked").lock().map(|g| g.fencing_token()));
    std::thread::sleep(Duration::from_millis(300));
    cluster.migrate_slot_of(key, to);
    let token = within(LIMIT, move || taking.join().unwrap());
    assert!(token.is_ok(), "{token:?}");
    // The guard was released in its thread; its fencing counter stays where it was taken.
    let exists = |port: u16| -> bool {
        redis::cmd("EXISTS")
            .arg("redmutex:{asked}:fence")
            .query(
                &mut cluster
                    .nodes
                    .iter()
                    .find(|n| n.port() == port)
                    .unwrap()
                    .conn(),
            )
            .unwrap()
    };
    assert!(exists(to_port), "the lock was not taken on the new master");
}

/// A `FairMutex`'s release hands the lock on with an announcement, and goes out behind a
/// `TIME` (so that Redis writes the announcement first). While its slot migrates, the
/// release follows `ASK` to the importing node, where nothing may come between `ASKING` and
/// the script: the release still hands the lock to the waiter there.
#[test]
fn a_fair_release_follows_ask_while_its_slot_migrates() {
    let _one = one_cluster();
    let cluster = ClusterDeployment::start();
    let client = client(&cluster);
    let key = "redmutex:{asked-fair}";
    let queue = "redmutex:{asked-fair}:queue";
    let to_port = cluster.other_master_than_of(key).port();
    let to = cluster.nodes.iter().find(|n| n.port() == to_port).unwrap();
    let exists_on = |node: &RedisServer, key: &str, asking: bool| -> i64 {
        let mut pipe = redis::pipe();
        if asking {
            pipe.cmd("ASKING").ignore();
        }
        let (exists,): (i64,) = pipe
            .cmd("EXISTS")
            .arg(key)
            .query(&mut node.conn())
            .expect("EXISTS");
        exists
    };
    let guard = client.fair_mutex("asked-fair").lock().unwrap();
    // A waiter queues: every key the release script names exists (the importing node
    // refuses a script over keys of the slot that it lacks, TRYAGAIN).
    let c = client.clone();
    let waiter = std::thread::spawn(move || c.fair_mutex("asked-fair").lock().map(drop));
    let from = cluster.master_of(key);
    assert!(
        eventually(LIMIT, || exists_on(from, queue, false) == 1),
        "the waiter never queued"
    );
    // The lock's keys move to the importing node; the old master answers ASK for them.
    cluster.move_keys_of_slot_of(key, to);
    assert_eq!(exists_on(to, key, true), 1, "the lock did not move");
    // (A guard stays on its thread; the release has its response timeout per redirect.)
    let released = guard.unlock();
    assert!(released.is_ok(), "{released:?}");
    assert_eq!(
        (exists_on(to, key, true), exists_on(to, queue, true)),
        (1, 0),
        "the release did not hand the lock to the waiter"
    );
    cluster.finish_migrating_slot_of(key, to);
    let taken = within(LIMIT, move || waiter.join().unwrap());
    assert!(taken.is_ok(), "{taken:?}");
}

/// Whether the servers have sharded pub/sub (Redis 7.0 and later, Valkey); on Redis 6.2 the
/// crate announces with classic pub/sub, which the cluster bus carries to every node.
fn sharded_pubsub() -> bool {
    !support::server_version().redis_before(7, 0)
}

/// The channels that `node` has subscribers for: sharded ones where the servers have sharded
/// pub/sub, classic ones before.
fn shard_channels(node: &RedisServer) -> Vec<String> {
    let kind = match sharded_pubsub() {
        true => "SHARDCHANNELS",
        false => "CHANNELS",
    };
    redis::cmd("PUBSUB")
        .arg(kind)
        .query(&mut node.conn())
        .unwrap_or_else(|e| panic!("PUBSUB {kind}: {e}"))
}

/// Commands `node` ran for clients, script internals included: everything but the cluster's
/// and replication's own traffic and what the test asks.
fn client_commands(node: &RedisServer) -> u64 {
    const NOT_CLIENTS: [&str; 9] = [
        "info", "cluster", "replconf", "ping", "pubsub", "command", "client", "hello", "psync",
    ];
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut node.conn())
        .expect("INFO commandstats");
    info.lines()
        .filter_map(|l| l.strip_prefix("cmdstat_"))
        .filter_map(|l| l.split_once(":calls="))
        .filter(|(command, _)| !NOT_CLIENTS.iter().any(|n| command.starts_with(n)))
        .filter_map(|(_, rest)| rest.split(',').next()?.parse::<u64>().ok())
        .sum()
}

/// Messages of classic pub/sub that `node` broadcast over the cluster bus.
fn bus_publishes(node: &RedisServer) -> u64 {
    node.info_field_of("CLUSTER", "INFO", "cluster_stats_messages_publish_sent")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

#[test]
fn idle_waiters_on_every_shard_are_woken_within_their_shard_and_cost_little() {
    let _one = one_cluster();
    let cluster = ClusterDeployment::start();
    // Default leases: holders renew, and plain waiters re-check, every 10 s.
    let holder = Client::open(cluster.url()).unwrap();
    let waiter = Client::open(cluster.url()).unwrap();
    let mut names: Vec<(String, u16)> = Vec::new();
    for i in 0.. {
        let name = format!("shard-{i}");
        let port = cluster.master_of(&format!("redmutex:{{{name}}}")).port();
        if !names.iter().any(|(_, p)| *p == port) {
            names.push((name, port));
        }
        if names.len() == 3 {
            break;
        }
    }
    let guards: Vec<_> = names
        .iter()
        .map(|(name, _)| holder.mutex(name).lock().unwrap())
        .collect();
    let threads: Vec<_> = names
        .iter()
        .flat_map(|(name, _)| std::iter::repeat_n(name.clone(), 10))
        .map(|name| {
            let w = waiter.clone();
            std::thread::spawn(move || w.mutex(name).try_lock_for(LIMIT).map(|g| g.is_some()))
        })
        .collect();
    assert!(eventually(LIMIT, || waiter.stats().contended >= 30));
    // Each lock's channel (the waiting client's own) is subscribed on the master of its
    // slot, and there only.
    for (name, port) in &names {
        let channel = format!("redmutex:{{{name}}}:ch:");
        for master in cluster.masters() {
            let here = master.port() == *port;
            let listens = || {
                shard_channels(master)
                    .iter()
                    .any(|c| c.starts_with(&channel))
            };
            assert!(
                eventually(LIMIT, || listens() == here),
                "{channel} subscribed on the wrong master"
            );
        }
    }
    // Thirty idle waiters and three holders, over ten seconds.
    let count = || -> u64 { cluster.masters().into_iter().map(client_commands).sum() };
    let before = count();
    std::thread::sleep(Duration::from_secs(10));
    let spent = count() - before;
    eprintln!("thirty idle waiters over three shards: {spent} commands in 10 s");
    assert!(spent < 100, "{spent} commands in 10 s");
    // Every release wakes the waiters of its lock, in its shard.
    drop(guards);
    for t in threads {
        assert!(within(LIMIT, move || t.join().unwrap()).unwrap());
    }
    assert!(waiter.stats().notifications >= 3);
    let broadcast: u64 = cluster.nodes.iter().map(bus_publishes).sum();
    match sharded_pubsub() {
        true => assert_eq!(broadcast, 0, "an announcement crossed the cluster bus"),
        // Classic pub/sub: every announcement crosses the bus.
        false => assert!(
            broadcast >= 3,
            "{broadcast} announcements on the cluster bus"
        ),
    }
}

#[test]
fn every_primitive_works_with_names_on_every_shard() {
    let _one = one_cluster();
    let cluster = ClusterDeployment::start();
    let (client, other) = (client(&cluster), client(&cluster));
    // Names whose slots fall on the three masters.
    let mut names: Vec<(String, u16)> = Vec::new();
    for i in 0.. {
        let name = format!("p-{i}");
        let port = cluster.master_of(&format!("redmutex:{{{name}}}")).port();
        if !names.iter().any(|(_, p)| *p == port) {
            names.push((name, port));
        }
        if names.len() == 3 {
            break;
        }
    }
    let all: Vec<&str> = names.iter().map(|(n, _)| n.as_str()).collect();
    // A multi-lock over all three shards excludes a plain Mutex on each.
    let multi = client.multi_lock(&all).lock().unwrap();
    for name in &all {
        assert!(other.mutex(name).try_lock().unwrap().is_none());
    }
    multi.unlock().unwrap();
    // Names of one hash tag share a slot: one script takes them all on its master.
    for name in &all {
        let together = [format!("{{{name}}}:a"), format!("{{{name}}}:b")];
        let before = client.stats().attempts;
        let both = client.multi_lock(&together).lock().unwrap();
        assert_eq!(client.stats().attempts - before, 1, "{together:?}");
        assert!(other.mutex(&together[1]).try_lock().unwrap().is_none());
        both.unlock().unwrap();
    }
    // A read-write lock and a semaphore on each shard.
    for name in &all {
        let lock = client.rwlock(format!("rw-{name}"));
        let r = lock.read().unwrap();
        assert!(other
            .rwlock(format!("rw-{name}"))
            .try_read()
            .unwrap()
            .is_some());
        assert!(other
            .rwlock(format!("rw-{name}"))
            .try_write()
            .unwrap()
            .is_none());
        drop(r);
        let w = other.rwlock(format!("rw-{name}")).write().unwrap();
        assert!(w.fencing_token() > 0);
        drop(w);
        let sem = client.semaphore(format!("sem-{name}"), 2);
        let two = sem.acquire_many(2).unwrap();
        assert!(other
            .semaphore(format!("sem-{name}"), 2)
            .try_acquire()
            .unwrap()
            .is_none());
        drop(two);
        assert_eq!(sem.available().unwrap(), 2);
        // A bare key (shared with other lock clients) and its fencing counter share a slot.
        let bare = client
            .mutex(format!("bare-{name}"))
            .with_bare_key()
            .lock()
            .unwrap();
        assert!(other
            .mutex(format!("bare-{name}"))
            .with_bare_key()
            .try_lock()
            .unwrap()
            .is_none());
        assert!(bare.fencing_token() > 0);
        bare.unlock().unwrap();
        // A shared value lives in its lock's slot: both keys in one script.
        *client
            .shared::<u64>(format!("value-{name}"))
            .lock()
            .unwrap() += 5;
        let mut v = other.shared::<u64>(format!("value-{name}")).lock().unwrap();
        assert_eq!(*v, 5);
        *v += 1;
        v.commit().unwrap();
        v.unlock().unwrap();
        assert_eq!(
            *client
                .shared_existing::<u64>(format!("value-{name}"))
                .lock()
                .unwrap(),
            6
        );
        // Optimistic access: the value, its version and the lock read in one command, and
        // written in one script, all in the value's slot.
        let shared = other.shared::<u64>(format!("value-{name}"));
        assert_eq!(shared.get().unwrap(), 6);
        assert_eq!(
            shared
                .update(|n| {
                    *n += 1;
                    *n
                })
                .unwrap(),
            7
        );
        assert_eq!(
            client.shared::<u64>(format!("value-{name}")).get().unwrap(),
            7
        );
        // A fair semaphore's waiter is woken on its client's channel, on the name's shard.
        let one = client
            .fair_semaphore(format!("fair-{name}"), 1)
            .acquire()
            .unwrap();
        let sem = other.fair_semaphore(format!("fair-{name}"), 1);
        let waiter = std::thread::spawn(move || {
            let permit = sem.try_acquire_for(Duration::from_secs(30)).unwrap();
            permit.is_some()
        });
        std::thread::sleep(Duration::from_millis(200));
        drop(one);
        assert!(within(LIMIT, move || waiter.join().unwrap()));
    }
}

/// The remaining lease of `key` on `node`, in ms (negative: none).
fn pttl(node: &RedisServer, key: &str) -> i64 {
    redis::cmd("PTTL")
        .arg(key)
        .query(&mut node.conn())
        .unwrap_or(-3)
}

/// A lock name other than `name` whose keys share its slot.
fn same_slot_as(cluster: &ClusterDeployment, name: &str) -> String {
    let slot = cluster.slot_of(&format!("redmutex:{{{name}}}"));
    (0..)
        .map(|i| format!("{name}-{i}"))
        .find(|other| cluster.slot_of(&format!("redmutex:{{{other}}}")) == slot)
        .expect("a name in the same slot")
}

fn index_of(cluster: &ClusterDeployment, port: u16) -> usize {
    cluster
        .nodes
        .iter()
        .position(|n| n.port() == port)
        .expect("a node on that port")
}

fn wait_for_promotion(cluster: &ClusterDeployment, replica: usize) {
    assert!(
        eventually(LIMIT, || cluster.nodes[replica]
            .info_field("replication", "role")
            .as_deref()
            == Some("master")),
        "the replica was never promoted"
    );
}

#[test]
fn a_lock_is_kept_when_its_master_is_killed_and_blocked_calls_ride_through_the_failover() {
    let _one = one_cluster();
    let mut cluster = ClusterDeployment::start();
    let settings = || {
        Client::builder()
            .connect_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(1))
            .default_lease(Duration::from_secs(6))
            .renewal_interval(Duration::from_millis(500))
            .replica_acks(1, Duration::from_millis(500))
            .outage_patience(Duration::from_secs(60))
    };
    let key = "redmutex:{killed}";
    let other = same_slot_as(&cluster, "killed");
    let client = settings().open(cluster.url()).unwrap();
    let g = client.mutex("killed").lock().unwrap();
    let master = index_of(&cluster, cluster.master_of(key).port());
    let replica = index_of(&cluster, cluster.replica_of(&cluster.nodes[master]).port());
    // A waiter blocked in lock() on the held lock, from another client.
    let waiter = settings().open(cluster.url()).unwrap();
    let w = waiter.clone();
    let waiting = std::thread::spawn(move || w.mutex("killed").lock().map(|g| g.fencing_token()));
    assert!(eventually(LIMIT, || waiter.stats().contended >= 1));
    cluster.nodes[master].kill();
    // A client opened while the master is dead, locking another name of the same slot.
    let late = settings().open(cluster.url()).unwrap();
    let late_lock = std::thread::spawn(move || late.mutex(other).lock().map(|g| g.unlock()));
    wait_for_promotion(&cluster, replica);
    // The promoted master has no replica (its old master is dead): no replica can be
    // promoted in turn, so acquires stand without an acknowledgement.
    // Renewal reaches the promoted master: the lease there rises again (it only fell while
    // the master was down), and the guard was never told it was lost.
    assert!(
        eventually(LIMIT, || pttl(&cluster.nodes[replica], key) > 4500),
        "renewal never reached the promoted master (PTTL {})",
        pttl(&cluster.nodes[replica], key)
    );
    assert!(!g.is_lost(), "{:?}", g.verify());
    assert!(g.verify().is_ok());
    let late_result = within(LIMIT, move || late_lock.join().unwrap());
    assert!(
        matches!(late_result, Ok(Ok(()))),
        "a client opened during the failover: {late_result:?}"
    );
    let token = g.fencing_token();
    g.unlock().unwrap();
    let next = within(LIMIT, move || waiting.join().unwrap())
        .unwrap_or_else(|e| panic!("the blocked waiter failed during the failover: {e}"));
    assert!(next > token);
}

#[test]
fn a_holder_whose_lock_the_promoted_replica_never_got_is_told() {
    let _one = one_cluster();
    let mut cluster = ClusterDeployment::start();
    let key = "redmutex:{unreplicated}";
    let master = index_of(&cluster, cluster.master_of(key).port());
    let replica = index_of(&cluster, cluster.replica_of(&cluster.nodes[master]).port());
    let client = Client::builder()
        .connect_timeout(Duration::from_secs(1))
        .response_timeout(Duration::from_secs(1))
        .default_lease(Duration::from_secs(90))
        .renewal_interval(Duration::from_secs(1))
        // Without acknowledgements: with them, the acquire below is refused while the map
        // still names the cut-off replica (`NotReplicated`), and the lock never exists
        // without its copy; the case here is the one left when an operator turns them off.
        .no_replica_acks()
        .open(cluster.url())
        .unwrap();
    // The replica is cut off while the lock is taken: the master refuses its replication
    // (its user may no longer sync) and drops its link, so it never gets the write.
    let mut m = cluster.nodes[master].conn();
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "default", "-sync", "-psync"])
        .query(&mut m)
        .unwrap();
    let _: i64 = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "replica"])
        .query(&mut m)
        .unwrap();
    assert!(eventually(LIMIT, || cluster.nodes[replica]
        .info_field("replication", "master_link_status")
        .as_deref()
        == Some("down")));
    let g = client.mutex("unreplicated").lock().unwrap();
    let watch = g.lease_watch();
    cluster.nodes[master].kill();
    wait_for_promotion(&cluster, replica);
    // Told by renewal on the promoted master, long before its 90 s lease would run out on
    // its own clock (which is how it learnt of it when the map was never read again).
    assert!(
        watch.wait_timeout(Duration::from_secs(45)),
        "the holder was not told"
    );
    assert!(g.is_lost());
    assert_eq!(pttl(&cluster.nodes[replica], key), -2);
    assert_eq!(g.unlock().unwrap_err().kind(), ErrorKind::LockLost);
}

#[test]
fn a_release_right_after_a_slot_migration_reaches_the_next_waiter_in_every_run() {
    let _one = one_cluster();
    let cluster = ClusterDeployment::start();
    // Default leases and renewal: a waiter re-checks only every 10 s on its own, so only a
    // release it hears (or the re-check after its subscription moved) wakes it in time.
    let settings = || {
        Client::builder()
            .connect_timeout(Duration::from_secs(2))
            .response_timeout(Duration::from_secs(2))
            .open(cluster.url())
            .unwrap()
    };
    let (first, second) = (settings(), settings());
    let mut late = Vec::new();
    for run in 0..20 {
        let name = format!("ask-window-{run}");
        let key = format!("redmutex:{{{name}}}");
        let taken = first.mutex(&name).lock().unwrap();
        let waiting = second.clone();
        let n = name.clone();
        let waiter = std::thread::spawn(move || {
            let got = waiting.mutex(&n).lock();
            (Instant::now(), got.map(|g| g.fencing_token()))
        });
        let contended = second.stats().contended;
        assert!(eventually(LIMIT, || second.stats().contended > contended
            || waiter.is_finished()));
        if waiter.is_finished() {
            panic!("run {run}: the waiter did not wait: {:?}", waiter.join());
        }
        // The slot moves under the held lock: its keys go first (the ASK window), then the
        // slot (`SETSLOT … NODE`), and the old master drops the waiter's subscription.
        let to_port = cluster.other_master_than_of(&key).port();
        let to = cluster.nodes.iter().find(|n| n.port() == to_port).unwrap();
        cluster.move_keys_of_slot_of(&key, to);
        cluster.finish_migrating_slot_of(&key, to);
        std::thread::sleep(Duration::from_millis(100));
        let released = Instant::now();
        taken.unlock().unwrap();
        let (acquired, got) = within(LIMIT, move || waiter.join().unwrap());
        assert!(got.is_ok(), "run {run}: {got:?}");
        late.push(acquired.saturating_duration_since(released));
    }
    let slow: Vec<&Duration> = late
        .iter()
        .filter(|d| **d > Duration::from_secs(1))
        .collect();
    assert!(slow.is_empty(), "releases heard late: {late:?}");
}

#[test]
fn acknowledged_locks_are_still_granted_when_the_masters_replica_dies() {
    let _one = one_cluster();
    let mut cluster = ClusterDeployment::start();
    let client = Client::builder()
        .connect_timeout(Duration::from_secs(1))
        .response_timeout(Duration::from_secs(1))
        .replica_acks(1, Duration::from_millis(300))
        .outage_patience(Duration::from_secs(60))
        .open(cluster.url())
        .unwrap();
    let key = "redmutex:{lonely}";
    drop(client.mutex("lonely").lock().unwrap());
    let master = index_of(&cluster, cluster.master_of(key).port());
    let replica = index_of(&cluster, cluster.replica_of(&cluster.nodes[master]).port());
    cluster.nodes[replica].kill();
    // Once the cluster counts the replica failed, no replica of that master can be promoted:
    // acquires stand without an acknowledgement (blocked ones keep trying until then).
    for i in 0..5 {
        let g = client
            .mutex("lonely")
            .lock()
            .unwrap_or_else(|e| panic!("acquire {i} with the replica dead: {e}"));
        g.unlock().unwrap();
    }
    assert!(client.mutex("lonely").try_lock().unwrap().is_some());
}

/// Whether `master`'s own `CLUSTER SLOTS` names a replica for its ranges.
fn names_a_replica(master: &RedisServer) -> bool {
    let ranges: Vec<redis::Value> = redis::cmd("CLUSTER")
        .arg("SLOTS")
        .query(&mut master.conn())
        .unwrap_or_default();
    ranges.iter().any(|r| {
        let redis::Value::Array(parts) = r else {
            return false;
        };
        let port = |p: &redis::Value| match p {
            redis::Value::Array(node) => node
                .get(1)
                .and_then(|v| redis::from_redis_value_ref::<i64>(v).ok()),
            _ => None,
        };
        parts.get(2).and_then(port) == Some(i64::from(master.port()))
            && parts.iter().skip(3).any(|p| port(p).is_some())
    })
}

/// A client reads the slot map when it starts; a replica that joins a master later (or that
/// the map left out while the cluster had not heard its replication offset) must still be
/// asked to acknowledge leases by default, or a failover could promote a copy without the
/// lock while its holder believes it holds it.
#[test]
fn a_replica_that_joins_after_the_map_was_read_is_asked_to_acknowledge_by_default() {
    let _one = one_cluster();
    let mut cluster = ClusterDeployment::start_masters();
    let client = client(&cluster);
    let key = "redmutex:{joined}";
    drop(client.mutex("joined").lock().unwrap());
    let master = index_of(&cluster, cluster.master_of(key).port());
    assert_eq!(
        cluster.nodes[master].command_calls("wait"),
        0,
        "no replica yet, yet the client asked for acknowledgements"
    );

    let replica = RedisServer::start_with(&[
        "--cluster-enabled",
        "yes",
        "--cluster-config-file",
        "nodes.conf",
        "--cluster-node-timeout",
        "2000",
    ]);
    let master_port = cluster.nodes[master].port();
    let master_id = cluster.node_id(&cluster.nodes[master]);
    let _: () = redis::cmd("CLUSTER")
        .arg("MEET")
        .arg("127.0.0.1")
        .arg(master_port)
        .query(&mut replica.conn())
        .unwrap();
    assert!(
        eventually(LIMIT, || redis::cmd("CLUSTER")
            .arg("REPLICATE")
            .arg(&master_id)
            .query::<()>(&mut replica.conn())
            .is_ok()),
        "the new node did not learn of the master"
    );
    cluster.nodes.push(replica);
    assert!(
        eventually(LIMIT, || names_a_replica(&cluster.nodes[master])),
        "the master's slot map never named its new replica"
    );

    // The client's map still names none; it reads the map again on its own.
    let asked = eventually(Duration::from_secs(120), || {
        drop(client.mutex("joined").lock().unwrap());
        std::thread::sleep(Duration::from_millis(100));
        cluster.nodes[master].command_calls("wait") > 0
    });
    assert!(
        asked,
        "the client never asked the replica that joined to acknowledge its leases"
    );
}
