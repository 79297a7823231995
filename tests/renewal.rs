//! The renewal thread: leases kept alive past their length, batched renewals, and lost leases
//! detected and signalled.

mod support;

use std::time::Duration;

use redis::Commands;
use redmutex::Client;
use support::{eventually, RedisServer};

/// Short leases, so that tests see several renewal periods quickly; with room for a loaded
/// machine to be late by a second without losing a lease.
fn short_lease_client(server: &RedisServer) -> Client {
    Client::builder()
        .default_lease(Duration::from_millis(1500))
        .renewal_interval(Duration::from_millis(250))
        .open(server.url())
        .expect("client")
}

#[test]
fn a_lock_held_past_its_lease_stays_held_and_is_released_on_drop() {
    let server = RedisServer::start();
    let client = short_lease_client(&server);
    let other = short_lease_client(&server);
    let m = client.mutex("long-work");
    let g = m.lock().unwrap();
    // Hold it for several leases; every check from another client must find it taken.
    for _ in 0..12 {
        std::thread::sleep(Duration::from_millis(500));
        assert!(other.mutex("long-work").try_lock().unwrap().is_none());
        assert!(!g.is_lost());
    }
    let stats = client.stats();
    assert!(stats.renewals >= 5, "{stats:?}");
    drop(g);
    assert!(other.mutex("long-work").try_lock().unwrap().is_some());
    assert_eq!(client.stats().renewed_leases, 0);
}

#[test]
fn many_locks_are_renewed_in_few_round_trips() {
    let server = RedisServer::start();
    let client = short_lease_client(&server);
    let guards: Vec<_> = (0..1500)
        .map(|i| client.mutex(format!("many:{i}")).lock().unwrap())
        .collect();
    let before = client.stats();
    std::thread::sleep(Duration::from_millis(1200));
    let after = client.stats();
    let renewals = after.renewals - before.renewals;
    let trips = after.renewal_round_trips - before.renewal_round_trips;
    assert!(renewals >= 1500, "renewals {renewals}");
    // 1,500 leases need 2 round trips per period (batches of 1,000).
    assert!(
        trips * 1000 >= renewals && trips * 500 <= renewals,
        "{trips} round trips for {renewals} renewals"
    );
    assert!(guards.iter().all(|g| !g.is_lost()));
    let mut conn = server.conn();
    let ttl: i64 = conn.pttl("redmutex:{many:0}").unwrap();
    assert!(ttl > 0);
}

#[test]
fn a_deleted_lock_is_reported_lost_and_not_recreated() {
    let server = RedisServer::start();
    let client = short_lease_client(&server);
    let g = client.mutex("victim").lock().unwrap();
    let watch = g.lease_watch();
    let mut conn = server.conn();
    let _: () = conn.del("redmutex:{victim}").unwrap();
    assert!(
        watch.wait_timeout(Duration::from_secs(30)),
        "loss never signalled"
    );
    assert!(g.is_lost());
    let exists: bool = conn.exists("redmutex:{victim}").unwrap();
    assert!(!exists, "renewal re-created a deleted lock");
    assert!(g.unlock().unwrap_err().is_lock_lost());
    assert!(client.stats().lost >= 1);
}

#[test]
fn an_overwritten_lock_is_lost_and_the_new_holder_is_left_alone() {
    let server = RedisServer::start();
    let client = short_lease_client(&server);
    let g = client.mutex("stolen").lock().unwrap();
    let mut conn = server.conn();
    let _: () = redis::cmd("SET")
        .arg("redmutex:{stolen}")
        .arg("someone-else")
        .arg("PX")
        .arg(60_000)
        .query(&mut conn)
        .unwrap();
    assert!(eventually(Duration::from_secs(30), || g.is_lost()));
    drop(g);
    let value: String = conn.get("redmutex:{stolen}").unwrap();
    assert_eq!(value, "someone-else");
    let ttl: i64 = conn.pttl("redmutex:{stolen}").unwrap();
    assert!(
        ttl > 30_000,
        "renewal touched another holder's lease: {ttl}"
    );
}

#[test]
fn a_released_lease_reports_not_lost_to_its_watchers() {
    let server = RedisServer::start();
    let client = short_lease_client(&server);
    let g = client.mutex("watched").lock().unwrap();
    let watch = g.lease_watch();
    let waiter = std::thread::spawn(move || watch.wait());
    std::thread::sleep(Duration::from_millis(200));
    g.unlock().unwrap();
    assert!(!waiter.join().unwrap());
}

#[test]
fn a_fixed_lease_is_not_renewed() {
    let server = RedisServer::start();
    let client = short_lease_client(&server);
    let g = client
        .mutex("fixed")
        .with_lease(Duration::from_millis(400))
        .lock()
        .unwrap();
    assert_eq!(client.stats().renewed_leases, 0);
    let other = client.clone();
    assert!(eventually(Duration::from_secs(30), move || {
        let other = other.clone();
        std::thread::spawn(move || other.mutex("fixed").try_lock().unwrap().is_some())
            .join()
            .unwrap()
    }));
    assert!(g.is_lost());
}

#[test]
fn a_leaked_guard_stops_being_renewed_when_the_last_handle_goes() {
    let server = RedisServer::start();
    let client = Client::builder()
        .default_lease(Duration::from_secs(2))
        .open(server.url())
        .unwrap();
    let leaked = client.mutex("leaked").lock().unwrap();
    let kept = client.mutex("kept").lock().unwrap();
    let watch = kept.lease_watch();
    std::mem::forget(leaked);
    // A handle (the Mutex, a clone of the client) keeps the threads; guards do not.
    let handle = client.mutex("other");
    drop(client);
    std::thread::sleep(Duration::from_secs(3));
    let plain = Client::open(server.url()).unwrap();
    assert!(
        plain.mutex("leaked").is_locked().unwrap(),
        "renewal stopped while a handle was alive"
    );
    assert!(!watch.is_lost());
    drop(handle);
    // The last handle is gone: nothing renews the leaked lock any more, and it expires with
    // its lease; the guard still alive is told its lease ran out.
    assert!(
        eventually(Duration::from_secs(30), || !plain
            .mutex("leaked")
            .is_locked()
            .unwrap()),
        "a leaked guard's lock was still renewed after the last handle was dropped"
    );
    assert!(watch.wait_timeout(Duration::from_secs(30)));
    assert!(!plain.mutex("kept").is_locked().unwrap());
    let err = kept.unlock().unwrap_err();
    assert!(err.is_lock_lost(), "{err}");
}
