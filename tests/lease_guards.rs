//! Every guard through the `Lease` trait (and `Fenced` where it carries a token), on real
//! servers: one generic function checks each kind's lease, its changes, `keep_until_expiry`
//! (the lock stays held in Redis, unrenewed, until its lease runs out) and `unlock`.

mod support;

use std::time::Duration;

use redmutex::{Client, Fenced, Lease, Redlock};
use support::RedisServer;

const LEASE: Duration = Duration::from_secs(30);

/// A guard's lease, seen and changed through the trait; then released.
fn lease_and_unlock(guard: impl Lease, name: &str) {
    assert_eq!(guard.name(), name);
    assert!(!guard.is_lost());
    assert!(!guard.lease_watch().is_lost());
    let left = guard.verify().unwrap();
    assert!(left > Duration::ZERO && left <= LEASE, "{name}: {left:?}");
    guard.set_lease(Duration::from_secs(5)).unwrap();
    let left = guard.verify().unwrap();
    assert!(
        left <= Duration::from_secs(5),
        "{name}: set_lease left {left:?}"
    );
    guard.extend(Duration::from_secs(60)).unwrap();
    let left = guard.verify().unwrap();
    assert!(
        left > Duration::from_secs(30),
        "{name}: extend left {left:?}"
    );
    let watch = guard.lease_watch();
    guard.unlock().unwrap();
    assert!(watch.is_released() && !watch.is_lost(), "{name}");
}

/// Kept until expiry: the lease left, and the watch says released (nothing lost).
fn keep(guard: impl Lease) -> Duration {
    let watch = guard.lease_watch();
    let left = guard.keep_until_expiry().unwrap();
    assert!(watch.is_released() && !watch.is_lost());
    left
}

fn token(guard: &impl Fenced) -> u64 {
    guard.fencing_token()
}

fn client(server: &RedisServer) -> Client {
    Client::builder()
        .default_lease(LEASE)
        .open(server.url())
        .unwrap()
}

#[test]
fn every_guard_of_one_server_has_the_lease_trait() {
    let server = RedisServer::start();
    let c = client(&server);
    lease_and_unlock(c.mutex("m").lock().unwrap(), "m");
    lease_and_unlock(c.fair_mutex("f").lock().unwrap(), "f");
    lease_and_unlock(c.rwlock("rw").read().unwrap(), "rw");
    lease_and_unlock(c.rwlock("rw").write().unwrap(), "rw");
    lease_and_unlock(c.semaphore("s", 3).acquire_many(2).unwrap(), "s");
    lease_and_unlock(c.shared::<u64>("v").lock().unwrap(), "v");
    // A multi-lock's name is that of the first lock it took (in its taking order).
    let multi = c.multi_lock(["a", "b"]).lock().unwrap();
    let first = multi.guards()[0].name().to_owned();
    assert!(first == "a" || first == "b");
    lease_and_unlock(multi, &first);
    let write = c.rwlock("rw").write().unwrap();
    let shared = c.shared::<u64>("v").lock().unwrap();
    assert!(token(&write) > 0 && token(&shared) > 0);
}

#[test]
fn every_guard_of_one_server_can_be_kept_until_its_lease_ends() {
    let server = RedisServer::start();
    let c = client(&server);
    let other = client(&server);
    assert!(keep(c.mutex("m").lock().unwrap()) > Duration::ZERO);
    assert!(other.mutex("m").try_lock().unwrap().is_none());
    assert!(keep(c.rwlock("r").read().unwrap()) > Duration::ZERO);
    assert!(other.rwlock("r").try_write().unwrap().is_none());
    assert!(keep(c.rwlock("w").write().unwrap()) > Duration::ZERO);
    assert!(other.rwlock("w").try_read().unwrap().is_none());
    assert!(keep(c.semaphore("s", 3).acquire_many(2).unwrap()) > Duration::ZERO);
    assert_eq!(other.semaphore("s", 3).available().unwrap(), 1);
    let mut done = c.shared::<u64>("v").lock().unwrap();
    *done = 7;
    assert!(keep(done) > Duration::ZERO);
    assert!(other.shared::<u64>("v").try_lock().unwrap().is_none());
    assert_eq!(other.shared::<u64>("v").get().unwrap(), 7);
    assert!(keep(c.multi_lock(["a", "b"]).lock().unwrap()) > Duration::ZERO);
    assert!(other.mutex("b").try_lock().unwrap().is_none());
    // Kept, not renewed: the client holds nothing to renew.
    assert_eq!(c.stats().renewed_leases, 0);
}

#[test]
fn a_redlock_guard_has_the_lease_trait_and_can_be_kept() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let redlock = Redlock::builder()
        .default_lease(LEASE)
        .open(servers.iter().map(|s| s.url()))
        .unwrap();
    let g = redlock.mutex("r").lock().unwrap();
    assert!(token(&g) > 0);
    lease_and_unlock(g, "r");
    assert!(keep(redlock.mutex("r").lock().unwrap()) > Duration::ZERO);
    let other = Redlock::open(servers.iter().map(|s| s.url())).unwrap();
    assert!(other.mutex("r").try_lock().unwrap().is_none());
}

/// A multi-lock's watch is lost when any of its locks is.
#[test]
fn a_multi_lock_watch_tells_the_loss_of_any_of_its_locks() {
    let server = RedisServer::start();
    let c = client(&server);
    let g = c.multi_lock(["x", "y"]).lock().unwrap();
    let watch = Lease::lease_watch(&g);
    let waiter = std::thread::spawn(move || watch.wait_timeout(Duration::from_secs(60)));
    // Someone deletes one of the locks; renewal finds it gone.
    let _: () = redis::cmd("DEL")
        .arg("redmutex:{y}")
        .query(&mut server.conn())
        .unwrap();
    assert!(waiter.join().unwrap(), "the watch never told the loss");
    assert!(g.is_lost());
}
