//! Waiting without polling: waiters are woken by the release's announcement, survive the loss
//! of the subscriber connection, and cost Redis almost nothing while they wait.

mod support;

use std::sync::{Arc, Barrier};
use std::time::Duration;

use redmutex::Client;
use support::{eventually, within, RedisServer};

const LIMIT: Duration = Duration::from_secs(60);

/// A client whose backoff alone would take 10 s to notice a release.
fn slow_backoff_client(server: &RedisServer) -> Client {
    Client::builder()
        .backoff(Duration::from_secs(10), Duration::from_secs(10))
        .open(server.url())
        .unwrap()
}

fn commands_processed(server: &RedisServer) -> u64 {
    server.info_number("stats", "total_commands_processed")
}

#[test]
fn a_waiter_is_woken_by_the_release_not_by_its_backoff() {
    let server = RedisServer::start();
    let holder = slow_backoff_client(&server);
    let waiter = slow_backoff_client(&server);
    let g = holder.mutex("w").lock().unwrap();
    let w = waiter.clone();
    let t = std::thread::spawn(move || {
        // Far less than one backoff step: only an announcement can wake it in time.
        w.mutex("w")
            .try_lock_for(Duration::from_secs(4))
            .map(|g| g.is_some())
    });
    assert!(eventually(LIMIT, || waiter.stats().contended == 1));
    std::thread::sleep(Duration::from_millis(300));
    g.unlock().unwrap();
    assert!(t.join().unwrap().unwrap(), "waiter missed the release");
    let stats = waiter.stats();
    assert!(stats.notifications >= 1, "{stats:?}");
    assert!(stats.attempts <= 4, "{stats:?}");
}

#[test]
fn waiters_survive_a_killed_subscriber_connection() {
    let server = RedisServer::start();
    let holder = slow_backoff_client(&server);
    let client = Client::builder()
        .backoff(Duration::from_millis(50), Duration::from_millis(200))
        .open(server.url())
        .unwrap();
    let g = holder.mutex("k").lock().unwrap();
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let c = client.clone();
            std::thread::spawn(move || {
                let m = c.mutex("k");
                let g = m.try_lock_for(Duration::from_secs(40)).unwrap();
                g.is_some()
            })
        })
        .collect();
    assert!(eventually(LIMIT, || client.stats().contended >= 4));
    std::thread::sleep(Duration::from_millis(200));
    let killed: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("pubsub")
        .query(&mut server.conn())
        .unwrap();
    assert!(killed >= 1, "no subscriber connection to kill");
    g.unlock().unwrap();
    for w in waiters {
        assert!(w.join().unwrap(), "a waiter never got the lock");
    }
    assert!(eventually(LIMIT, || client.stats().subscriber_reconnects >= 1));
    // The subscriber is back: a later release is announced again.
    let before = client.stats().notifications;
    let g = holder.mutex("k").lock().unwrap();
    let c = client.clone();
    let t = std::thread::spawn(move || c.mutex("k").lock().map(drop));
    assert!(eventually(LIMIT, || client.stats().contended >= 5));
    std::thread::sleep(Duration::from_millis(300));
    g.unlock().unwrap();
    within(LIMIT, move || t.join().unwrap()).unwrap();
    assert!(client.stats().notifications > before);
}

#[test]
fn a_hundred_idle_waiters_cost_redis_almost_nothing() {
    let server = RedisServer::start();
    let holder = Client::open(server.url()).unwrap();
    let client = Client::open(server.url()).unwrap();
    let g = holder.mutex("idle").lock().unwrap();
    let start = Arc::new(Barrier::new(101));
    let waiters: Vec<_> = (0..100)
        .map(|_| {
            let (c, start) = (client.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                c.mutex("idle").lock().map(drop)
            })
        })
        .collect();
    start.wait();
    assert!(eventually(LIMIT, || client.stats().contended >= 100));
    let before = commands_processed(&server);
    std::thread::sleep(Duration::from_secs(3));
    let during = commands_processed(&server) - before;
    // One leader rechecks now and then as a safety net; the rest wait in the process. 100
    // pollers would send hundreds of commands a second (each attempt counts the commands of
    // its script, and INFO itself counts).
    assert!(
        during <= 30,
        "{during} commands in 3 s from 100 idle waiters"
    );
    g.unlock().unwrap();
    for w in waiters {
        within(LIMIT, move || w.join().unwrap()).unwrap();
    }
    let stats = client.stats();
    assert_eq!(stats.acquisitions, 100);
    // Initial attempts (at most one each), the leaders' attempts after each hand-off, and the
    // few safety polls: far fewer than 100 pollers would make.
    assert!(stats.attempts <= 100 + 3 * 100, "{stats:?}");
}
