//! Replica acknowledgement: with `replica_acks`, an acquire stands only once a real replica
//! (`redis-server --replicaof`) acknowledged it, and is rolled back when none does in time.

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
