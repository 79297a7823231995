//! The connection pool (lazy slots, whose connections their callers make) on a real
//! `redis-server`: connections made only when needed and never more than the pool size,
//! idle ones closed after `idle_timeout`, and a restart survived.

mod support;

use std::time::Duration;

use redmutex::Client;
use support::{eventually, RedisServer};

/// The clients connected to `server`, this test's own inspection connection included.
fn connected(server: &RedisServer) -> u64 {
    server.info_number("clients", "connected_clients")
}

#[test]
fn connections_are_made_when_needed_bounded_by_the_pool_and_closed_when_idle() {
    let server = RedisServer::start();
    let base = connected(&server);
    let client = Client::builder()
        .pool_size(3)
        .idle_timeout(Some(Duration::from_secs(1)))
        .open(server.url())
        .unwrap();
    assert_eq!(connected(&server), base, "open made a connection");
    // Eight threads, each locking its own name over and over: at most three connections.
    let threads: Vec<_> = (0..8)
        .map(|i| {
            let m = client.mutex(format!("pool-{i}"));
            std::thread::spawn(move || {
                for _ in 0..50 {
                    m.lock().unwrap().unlock().unwrap();
                }
            })
        })
        .collect();
    let mut most = 0;
    while !threads.iter().all(|t| t.is_finished()) {
        most = most.max(connected(&server) - base);
        std::thread::sleep(Duration::from_millis(5));
    }
    for t in threads {
        t.join().unwrap();
    }
    assert!(most <= 3, "{most} connections for a pool of 3");
    assert!(connected(&server) > base, "no connection kept for reuse");
    // Idle past the idle timeout: closed by the pool's helper thread (which looks every 30 s). The
    // renewal thread uses one now and then (the client's announcement), which may be open.
    assert!(
        eventually(Duration::from_secs(75), || connected(&server) <= base + 1),
        "idle connections still open: {}",
        connected(&server) - base
    );
    // Calls go on, connecting again where they need to.
    let threads: Vec<_> = (0..3)
        .map(|i| {
            let m = client.mutex(format!("pool-{i}"));
            std::thread::spawn(move || m.lock().unwrap().unlock().unwrap())
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(connected(&server) - base <= 3);
}

#[test]
fn a_restart_retires_every_pooled_connection_and_calls_go_on() {
    let mut server = RedisServer::start();
    let client = Client::builder().pool_size(4).open(server.url()).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let m = client.mutex(format!("r-{i}"));
            std::thread::spawn(move || {
                for _ in 0..20 {
                    m.lock().unwrap().unlock().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    server.restart();
    // Every pooled connection is dead: the first call may see its own dropped (and is
    // retried on a fresh connection where safe), none after it sees a dead one.
    let m = client.mutex("r-0");
    let first = m.lock().map(|g| g.unlock());
    for _ in 0..20 {
        m.lock().unwrap().unlock().unwrap();
    }
    drop(first);
}
