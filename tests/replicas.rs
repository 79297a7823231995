//! Replica acknowledgement: with `replica_acks`, an acquire stands only once a real replica
//! (`redis-server --replicaof`) acknowledged it, and is rolled back when none does in time;
//! a renewal or an extension that no replica acknowledged extends nothing.

mod support;

use std::time::Duration;

use redmutex::{Client, ErrorKind};
use support::{eventually, within, RedisServer};

fn replica_of(master: &RedisServer) -> RedisServer {
    let port = master.port().to_string();
    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port]);
    let up = eventually(Duration::from_secs(60), || {
        let info: String = redis::cmd("INFO")
            .arg("replication")
            .query(&mut replica.conn())
            .unwrap_or_default();
        info.contains("master_link_status:up")
    });
    assert!(up, "the replica never synchronised");
    replica
}

#[test]
fn acquires_wait_for_replicas_and_roll_back_without_them() {
    let master = RedisServer::start();
    let replica = replica_of(&master);
    // A blocked acquire keeps trying for its outage patience (each try rolled back), then
    // returns `NotReplicated`.
    let client = Client::builder()
        .replica_acks(1, Duration::from_millis(500))
        .response_timeout(Duration::from_secs(3))
        .outage_patience(Duration::from_secs(2))
        .open(master.url())
        .unwrap();

    // Acknowledged: the lock is on the replica too.
    let g = client.mutex("replicated").lock().unwrap();
    let on_replica: bool = redis::cmd("EXISTS")
        .arg("redmutex:{replicated}")
        .query(&mut replica.conn())
        .unwrap();
    assert!(on_replica, "the acquire returned before the replica had it");
    drop(g);

    // The replica stops answering: acquires fail after the timeout and leave no lock.
    replica.pause();
    let c = client.clone();
    let err = within(Duration::from_secs(60), move || {
        c.mutex("unreplicated").lock().map(drop)
    })
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotReplicated, "{err}");
    assert!(client.stats().outage_retries >= 1);
    let plain = Client::open(master.url()).unwrap();
    assert!(
        !plain.mutex("unreplicated").is_locked().unwrap(),
        "the acquire was not rolled back"
    );
    let err = within(Duration::from_secs(60), move || {
        client.fair_mutex("fair").lock().map(drop)
    })
    .unwrap_err();
    assert!(err.is_not_replicated(), "{err}");
    assert!(!plain.fair_mutex("fair").is_locked().unwrap());
    replica.resume();
}

#[test]
fn asking_more_replicas_than_exist_fails_every_acquire() {
    let master = RedisServer::start();
    let client = Client::builder()
        .replica_acks(1, Duration::from_millis(100))
        .open(master.url())
        .unwrap();
    let err = client.mutex("alone").try_lock().unwrap_err();
    assert!(err.is_not_replicated(), "{err}");
    assert!(!client.mutex("alone").is_locked().unwrap());
}

#[test]
fn renewals_no_replica_acknowledged_extend_nothing() {
    let master = RedisServer::start();
    let replica = replica_of(&master);
    let client = Client::builder()
        .replica_acks(1, Duration::from_millis(200))
        .default_lease(Duration::from_secs(3))
        .renewal_interval(Duration::from_millis(300))
        .open(master.url())
        .unwrap();
    let g = client.mutex("renewed").lock().unwrap();
    let watch = g.lease_watch();
    // Acknowledged renewals keep the lease for longer than a lease.
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        !watch.is_lost(),
        "acknowledged renewals did not keep the lease"
    );

    // The replica stops acknowledging: the master still takes every renewal, but none
    // counts, and the holder is told when the lease it counted runs out.
    replica.pause();
    let renewals = client.stats().renewals;
    assert!(
        watch.wait_timeout(Duration::from_secs(30)),
        "the lease was never counted lost"
    );
    assert!(client.stats().renewals > renewals, "no renewal was sent");
    assert!(g.is_lost());
    // Redis still has the lock (the unacknowledged renewals kept it there).
    let plain = Client::open(master.url()).unwrap();
    assert!(plain.mutex("renewed").is_locked().unwrap());
    replica.resume();
    drop(g);
}

#[test]
fn an_extension_no_replica_acknowledged_fails_and_changes_nothing() {
    let master = RedisServer::start();
    let replica = replica_of(&master);
    let client = Client::builder()
        .replica_acks(1, Duration::from_millis(200))
        .open(master.url())
        .unwrap();
    let g = client
        .mutex("extended")
        .with_lease(Duration::from_secs(20))
        .lock()
        .unwrap();
    g.extend(Duration::from_secs(10)).unwrap();
    let watch = g.lease_watch();
    replica.pause();
    let err = g.set_lease(Duration::from_secs(600)).unwrap_err();
    assert!(err.is_not_replicated(), "{err}");
    // The lease counted is still the acknowledged one (about 30 s), not 600 s: it is lost
    // within a minute, as nobody renews a fixed lease.
    assert!(!watch.is_lost());
    assert!(
        watch.wait_timeout(Duration::from_secs(60)),
        "the unacknowledged extension was counted"
    );
    replica.resume();
}

/// How many `WAIT` commands a server ran.
fn waits(server: &RedisServer) -> u64 {
    server.command_calls("wait")
}

#[test]
fn one_server_asks_no_replica_by_default() {
    let master = RedisServer::start();
    let _replica = replica_of(&master);
    let client = Client::open(master.url()).unwrap();
    for _ in 0..5 {
        client.mutex("plain").lock().unwrap().unlock().unwrap();
    }
    assert_eq!(
        waits(&master),
        0,
        "a client of one server waited for replicas"
    );
}
