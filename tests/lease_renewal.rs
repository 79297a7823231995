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
        .with_fixed_lease(Duration::from_millis(400))
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

/// A handle's renewed lease of its own, shorter than the client's: renewed on a schedule of
/// its own (the client's ticks are 10 s apart), never longer than its length in Redis, and a
/// holder that dies frees the lock within that length, not the client's 30 s.
#[test]
fn a_handle_lease_of_its_own_is_renewed_at_its_own_pace() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let other = Client::open(server.url()).unwrap();
    let lease = Duration::from_millis(1500);
    let g = client.mutex("own").with_lease(lease).lock().unwrap();
    let default = client.mutex("default").lock().unwrap();
    for _ in 0..9 {
        std::thread::sleep(Duration::from_millis(500));
        assert!(other.mutex("own").try_lock().unwrap().is_none());
        let info = other.lock_info("own").unwrap();
        let left = info.holder.and_then(|h| h.lease_left).expect("a lease");
        assert!(left <= lease, "{left:?} left of a {lease:?} lease");
        assert!(!g.is_lost());
    }
    // 4.5 s: the own schedule renewed it about 9 times; no tick came yet.
    let stats = client.stats();
    assert!(stats.renewals >= 4, "{stats:?}");
    let default_left = other
        .lock_info("default")
        .unwrap()
        .holder
        .and_then(|h| h.lease_left);
    assert!(default_left.expect("a lease") > Duration::from_secs(20));
    // The holder dies: nothing renews either lock, nothing releases them.
    std::mem::forget(g);
    std::mem::forget(default);
    drop(client);
    let died = std::time::Instant::now();
    let taken = other
        .mutex("own")
        .try_lock_for(Duration::from_secs(60))
        .unwrap();
    assert!(taken.is_some());
    let after = died.elapsed();
    assert!(
        after < Duration::from_secs(15),
        "taken over after {after:?}"
    );
    assert!(other.mutex("default").try_lock().unwrap().is_none());
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

/// Lost is final: a renewal's reply that a proxy holds until after the lease ran out (the
/// server ran the renewal on time, so the lock stays in Redis and the reply says "renewed",
/// which would count the lease from the renewal's send time again). Once the lease read as
/// lost, every later read, the watch and `unlock()` agree, and the release still removes the
/// holder's key.
#[test]
fn a_lease_seen_lost_stays_lost_when_a_renewal_reply_arrives_late() {
    let server = RedisServer::start();
    let proxy = support::delay_proxy::DelayProxy::start(server.port());
    // Renewals every 450 ms of a 1 s lease: one renewal's reply held 700 ms comes 250 ms
    // after the lease counted from the renewal before it ran out, and 300 ms before the
    // lease it renewed in Redis runs out.
    let client = Client::builder()
        .default_lease(Duration::from_millis(1000))
        .renewal_interval(Duration::from_millis(450))
        .response_timeout(Duration::from_secs(20))
        .open(proxy.url())
        .expect("client");
    let g = client.mutex("late-reply").lock().unwrap();
    let watch = g.lease_watch();
    // The first renewal is answered on time (its connection made); the next one's reply is held.
    assert!(eventually(Duration::from_secs(20), || client
        .stats()
        .renewals
        >= 1));
    proxy.hold_replies(Duration::from_millis(700));
    assert!(eventually(Duration::from_secs(20), || g.is_lost()));
    proxy.hold_replies(Duration::ZERO);
    assert!(eventually(Duration::from_secs(20), || client
        .stats()
        .renewals
        >= 2));
    assert!(g.is_lost(), "the lost lease came back with the late reply");
    assert!(watch.is_lost(), "the watch says the lost lease came back");
    assert!(watch.wait_timeout(Duration::from_millis(1)));
    let mut c = server.conn();
    let holder: Option<String> = c.get("redmutex:{late-reply}").unwrap();
    assert!(holder.is_some(), "the lock ran out in Redis too");
    let err = g.unlock().unwrap_err();
    assert_eq!(err.kind(), redmutex::ErrorKind::LockLost, "{err}");
    let holder: Option<String> = c.get("redmutex:{late-reply}").unwrap();
    assert!(holder.is_none(), "unlock left the holder's key: {holder:?}");
}
