//! Replica acknowledgement: with `replica_acks`, an acquire stands only once a real replica
//! (`redis-server --replicaof`) acknowledged it, and is rolled back when none does in time;
//! a renewal or an extension that no replica acknowledged extends nothing.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redmutex::events::{EventHandler, Waiting};
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
        .with_fixed_lease(Duration::from_secs(20))
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

/// A free lock taken before is taken with plain commands (no acquire script) and `WAIT` in
/// the same round trip; a replica that does not acknowledge still fails it and rolls it back.
#[test]
fn an_acknowledged_take_of_a_lock_taken_before_sends_no_script() {
    let master = RedisServer::start();
    let replica = replica_of(&master);
    let client = Client::builder()
        .replica_acks(1, Duration::from_millis(500))
        .response_timeout(Duration::from_secs(3))
        .outage_patience(Duration::from_secs(1))
        .open(master.url())
        .unwrap();
    let m = client.mutex("acked");
    // The first take starts the fencing counter; the second tries the plain `SET`'s form.
    for _ in 0..2 {
        m.lock().unwrap().unlock().unwrap();
    }
    let (scripts, waited) = (master.command_calls("evalsha"), waits(&master));
    let mut last = 0;
    for _ in 0..5 {
        let g = m.lock().unwrap();
        assert!(g.fencing_token() > last);
        last = g.fencing_token();
        g.unlock().unwrap();
    }
    // Each acquire waited for the replica, and only the releases ran a script (Redis 6.2
    // refuses the plain `SET`'s form: there the acquires run the script too).
    let per_cycle = match support::server_version().redis_before(7, 0) {
        true => 2,
        false => 1,
    };
    assert_eq!(master.command_calls("evalsha") - scripts, 5 * per_cycle);
    assert_eq!(waits(&master) - waited, 5);

    replica.pause();
    let c = client.clone();
    let err = within(Duration::from_secs(60), move || {
        c.mutex("acked").lock().map(drop)
    })
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotReplicated, "{err}");
    let plain = Client::open(master.url()).unwrap();
    assert!(
        !plain.mutex("acked").is_locked().unwrap(),
        "the acquire was not rolled back"
    );
    replica.resume();
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

/// A lock passed between two threads of one client hands out new fencing tokens (a block of
/// them, reserved in Redis): that write must reach every replica an acquire's would, not the
/// fewer a renewal asks. Here one of two replicas leaves the master (as the replica being
/// promoted does in a planned failover); the master still has the other, and a pass that
/// only it acknowledged would hand out tokens that the replica which left never saw — tokens
/// its promotion would hand out again.
#[test]
fn a_pass_between_threads_hands_out_tokens_only_every_replica_acknowledged() {
    let master = RedisServer::start();
    let staying = replica_of(&master);
    let leaving = replica_of(&master);
    let waiting = Arc::new(WaitingThreads::default());
    let client = Client::builder()
        .replica_acks(2, Duration::from_millis(300))
        .outage_patience(Duration::from_secs(2))
        .event_handler(Arc::clone(&waiting))
        .open(master.url())
        .unwrap();
    let held = client.mutex("passed").lock().unwrap();
    let first = held.fencing_token();

    // The leaving replica stops following the master; the master keeps the other one.
    let _: () = redis::cmd("REPLICAOF")
        .arg("NO")
        .arg("ONE")
        .query(&mut leaving.conn())
        .unwrap();
    let attached = eventually(Duration::from_secs(30), || {
        master
            .info_field("replication", "connected_slaves")
            .as_deref()
            == Some("1")
    });
    assert!(attached, "the master still counts two replicas");

    // Another thread of the client waits; the holder's release passes the lock to it.
    let c = client.clone();
    let waiter = std::thread::spawn(move || {
        c.mutex("passed")
            .try_lock_for(Duration::from_secs(10))
            .map(|g| g.map(|g| g.fencing_token()))
    });
    assert!(
        eventually(Duration::from_secs(30), || waiting.0.load(Ordering::SeqCst)
            > 0),
        "the second thread never waited"
    );
    // It listens for a pass a moment after it begins to wait.
    std::thread::sleep(Duration::from_millis(500));
    drop(held);
    let got = waiter.join().unwrap();
    let on_leaving: Option<u64> = redis::cmd("GET")
        .arg("redmutex:{passed}:fence")
        .query(&mut leaving.conn())
        .unwrap();
    match got {
        Ok(None) => panic!("the waiter timed out instead of being refused"),
        Ok(Some(token)) => panic!(
            "token {token} (after {first}) was handed out with one replica's acknowledgement; \
             the replica that left has the counter at {on_leaving:?}"
        ),
        Err(e) => assert!(e.is_not_replicated(), "{e}"),
    }
    drop(staying);
}

/// Counts the threads that wait now.
#[derive(Default)]
struct WaitingThreads(AtomicUsize);

impl EventHandler for WaitingThreads {
    fn waiting(&self, event: &Waiting<'_>) {
        match event.started {
            true => self.0.fetch_add(1, Ordering::SeqCst),
            false => self.0.fetch_sub(1, Ordering::SeqCst),
        };
    }
}
