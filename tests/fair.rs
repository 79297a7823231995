//! The fair (FIFO) lock: order across processes and threads, dead and timed-out waiters, and
//! no keys left behind.

mod support;

use std::process::Child;
use std::time::Duration;

use redis::Commands;
use redmutex::Client;
use support::{eventually, within, RedisServer};

const LIMIT: Duration = Duration::from_secs(60);
const ENTRY: &str = "fair_worker_entry";
const QUEUE: &str = "redmutex:{line}:queue";

/// Short leases, so that a dead waiter is skipped within about a second.
fn client(url: &str) -> Client {
    Client::builder()
        .default_lease(Duration::from_millis(1000))
        .renewal_interval(Duration::from_millis(250))
        .open(url)
        .unwrap()
}

/// The worker processes: queue for the fair lock, record their turn, hold briefly.
#[test]
fn fair_worker_entry() {
    let Some((role, url, id)) = support::worker_role() else {
        return;
    };
    assert_eq!(role, "fair-waiter");
    let client = client(&url);
    let g = client.fair_mutex("line").lock().unwrap();
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = conn.rpush("order", &id).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    g.unlock().unwrap();
    println!("DONE {id}");
}

fn queue_len(server: &RedisServer) -> usize {
    server.conn().llen(QUEUE).unwrap()
}

/// Spawns waiters one at a time, each only after the previous one is in the queue.
fn queue_waiters(server: &RedisServer, ids: &[usize]) -> Vec<Child> {
    let mut children = Vec::new();
    for (n, id) in ids.iter().enumerate() {
        children.push(support::spawn_worker(
            ENTRY,
            "fair-waiter",
            &server.url(),
            &id.to_string(),
        ));
        assert!(
            eventually(LIMIT, || queue_len(server) == n + 1),
            "waiter {id} never queued"
        );
    }
    children
}

fn order(server: &RedisServer) -> Vec<usize> {
    let v: Vec<String> = server.conn().lrange("order", 0, -1).unwrap();
    v.iter().map(|s| s.parse().unwrap()).collect()
}

/// The keys of locks left in Redis (not the clients' announcements).
fn keys_left(server: &RedisServer) -> Vec<String> {
    let mut keys: Vec<String> = server.conn().keys("redmutex:{*").unwrap();
    keys.sort();
    keys
}

#[test]
fn processes_acquire_in_the_order_they_queued_and_leave_no_keys() {
    let server = RedisServer::start();
    let holder = client(&server.url());
    let g = holder.fair_mutex("line").lock().unwrap();
    let children = queue_waiters(&server, &[0, 1, 2, 3, 4]);
    g.unlock().unwrap();
    for mut c in children {
        support::read_marker(&mut c, "DONE ");
        assert!(c.wait().unwrap().success());
    }
    assert_eq!(order(&server), [0, 1, 2, 3, 4]);
    assert!(
        eventually(LIMIT, || keys_left(&server).is_empty()),
        "{:?}",
        keys_left(&server)
    );
}

#[test]
fn a_killed_waiter_is_skipped() {
    let server = RedisServer::start();
    let holder = client(&server.url());
    let g = holder.fair_mutex("line").lock().unwrap();
    let mut children = queue_waiters(&server, &[0, 1, 2]);
    let mut dead = children.remove(1);
    dead.kill().unwrap();
    dead.wait().unwrap();
    g.unlock().unwrap();
    for mut c in children {
        support::read_marker(&mut c, "DONE ");
        assert!(c.wait().unwrap().success());
    }
    assert_eq!(order(&server), [0, 2]);
    assert!(
        eventually(LIMIT, || keys_left(&server).is_empty()),
        "{:?}",
        keys_left(&server)
    );
}

#[test]
fn a_timed_out_waiter_leaves_the_queue_at_once() {
    let server = RedisServer::start();
    let holder = client(&server.url());
    let waiter = client(&server.url());
    let g = holder.fair_mutex("line").lock().unwrap();
    let w = waiter.clone();
    let got = within(LIMIT, move || {
        w.fair_mutex("line")
            .try_lock_for(Duration::from_millis(400))
            .map(|g| g.is_some())
    });
    assert!(!got.unwrap());
    assert_eq!(
        queue_len(&server),
        0,
        "the timed-out waiter is still queued"
    );
    let zcard: usize = server.conn().zcard("redmutex:{line}:timeouts").unwrap();
    assert_eq!(zcard, 0);
    g.unlock().unwrap();
    assert!(keys_left(&server).is_empty(), "{:?}", keys_left(&server));
}

#[test]
fn threads_acquire_in_queue_order_and_releases_wake_only_the_next() {
    let server = RedisServer::start();
    let holder = client(&server.url());
    let waiters = client(&server.url());
    let g = holder.fair_mutex("line").lock().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut threads = Vec::new();
    for id in 0..6usize {
        let (c, tx) = (waiters.clone(), tx.clone());
        threads.push(std::thread::spawn(move || {
            let g = c.fair_mutex("line").lock().unwrap();
            tx.send(id).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            drop(g);
        }));
        assert!(eventually(LIMIT, || queue_len(&server) == id + 1));
    }
    let attempts_before = waiters.stats().attempts;
    g.unlock().unwrap();
    for t in threads {
        t.join().unwrap();
    }
    let got: Vec<usize> = rx.try_iter().collect();
    assert_eq!(got, [0, 1, 2, 3, 4, 5]);
    // Each release wakes one waiter, which takes the lock at its first attempt.
    let attempts = waiters.stats().attempts - attempts_before;
    assert!(attempts <= 6 + 3, "{attempts} attempts for 6 hand-offs");
    assert!(keys_left(&server).is_empty(), "{:?}", keys_left(&server));
}

#[test]
fn fair_mutex_basics() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let m = client.fair_mutex("basic");
    let g = m.lock().unwrap();
    let again = m.lock().unwrap();
    assert_eq!(m.hold_count(), 2);
    assert_eq!(again.fencing_token(), g.fencing_token());
    drop(again);
    let other = client.clone();
    let blocked =
        std::thread::spawn(move || other.fair_mutex("basic").try_lock().unwrap().is_none())
            .join()
            .unwrap();
    assert!(blocked);
    assert!(m.is_locked().unwrap());
    let token = g.fencing_token();
    g.unlock().unwrap();
    assert!(!m.is_locked().unwrap());
    let g2 = m.try_lock().unwrap().expect("free lock");
    assert!(g2.fencing_token() > token);
    assert!(m.force_unlock().unwrap());
    assert!(g2.unlock().unwrap_err().is_lock_lost());
    assert!(keys_left(&server).is_empty(), "{:?}", keys_left(&server));
}

#[test]
fn waiters_dropped_from_the_queue_join_again_while_the_lock_is_held() {
    let server = RedisServer::start();
    let holder = client(&server.url());
    let waiters = client(&server.url());
    let g = holder.fair_mutex("line").lock().unwrap();
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let c = waiters.clone();
            std::thread::spawn(move || {
                c.fair_mutex("line")
                    .try_lock_for(LIMIT)
                    .map(|g| g.is_some())
            })
        })
        .collect();
    let mut conn = server.conn();
    assert!(eventually(LIMIT, || conn.llen::<_, i64>(QUEUE).unwrap() == 3));
    // As if the waiting process had stalled past its waiters' timeout: every place is gone.
    let _: () = redis::cmd("DEL")
        .arg(QUEUE)
        .arg("redmutex:{line}:timeouts")
        .query(&mut conn)
        .unwrap();
    // Only one of the three re-checks the lock; the others learn from their heartbeat that
    // they were dropped, and join again while the lock is still held.
    assert!(
        eventually(Duration::from_secs(20), || conn
            .llen::<_, i64>(QUEUE)
            .unwrap()
            == 3),
        "dropped waiters did not join again"
    );
    g.unlock().unwrap();
    for t in threads {
        assert!(within(LIMIT, move || t.join().unwrap()).unwrap());
    }
}
