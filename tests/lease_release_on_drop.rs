//! A guard's drop writes the release and returns without waiting for its reply: the reply is
//! read by the connection's next user (or the renewal thread), checked there, and a release
//! that got no answer is finished in the background, as any release of unknown outcome.

mod support;

use std::sync::Arc;
use std::time::{Duration, Instant};

use redmutex::Client;
use support::{eventually, RedisServer};

#[test]
fn the_same_thread_finds_the_lock_free_right_after_a_drop() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let other = Client::open(server.url()).unwrap();
    let (mine, theirs) = (client.mutex("order"), other.mutex("order"));
    for _ in 0..300 {
        drop(mine.lock().unwrap());
        // Over the same client: written behind the release on the same connection.
        assert!(!mine.is_locked().unwrap());
        drop(mine.try_lock().unwrap().expect("free after my own drop"));
    }
    // Another client, over another connection, sees every release too.
    let released = eventually(Duration::from_secs(10), || !theirs.is_locked().unwrap());
    assert!(released);
    assert!(theirs.try_lock().unwrap().is_some());
    // Every release was answered: the replies were read and counted.
    assert!(eventually(Duration::from_secs(10), || {
        let _ = mine.is_locked();
        client.stats().releases == 600
    }));
    assert_eq!(client.stats().lost, 0);
}

#[test]
fn a_connection_never_hands_a_reply_to_another_caller() {
    let server = RedisServer::start();
    // One connection for eight threads: every call follows someone's unread release.
    let client = Arc::new(Client::builder().pool_size(1).open(server.url()).unwrap());
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let client = Arc::clone(&client);
            std::thread::spawn(move || {
                let m = client.mutex(format!("name-{t}"));
                for i in 0..150 {
                    let g = m.lock().unwrap();
                    assert!(g.fencing_token() > 0);
                    drop(g);
                    // A reply read by the wrong caller would be an integer where a
                    // boolean or a fencing token belongs, or the wrong one.
                    assert!(!m.is_locked().unwrap(), "thread {t}, cycle {i}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(eventually(Duration::from_secs(10), || {
        let _ = client.mutex("name-0").is_locked();
        client.stats().releases == 8 * 150
    }));
}

#[test]
fn a_release_that_finds_the_lease_lost_is_counted_and_frees_nothing() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let other = Client::open(server.url()).unwrap();
    let m = client.mutex("job");
    // Warm the connection so that the drop writes without waiting.
    drop(m.lock().unwrap());
    let g = client
        .mutex("job")
        .with_fixed_lease(Duration::from_millis(200))
        .lock()
        .unwrap();
    assert!(eventually(Duration::from_secs(10), || !other
        .mutex("job")
        .is_locked()
        .unwrap()));
    let theirs = other.mutex("job").lock().unwrap();
    drop(g);
    // The reply is read with the next call on that connection.
    assert!(m.is_locked().unwrap(), "the newer holder keeps the lock");
    assert!(eventually(Duration::from_secs(10), || {
        let _ = m.is_locked();
        client.stats().lost == 1
    }));
    theirs.unlock().unwrap();
}

#[test]
fn a_release_whose_reply_never_came_is_finished_in_the_background() {
    // Persistence, so that the lock outlives a restart of the server.
    let mut server = RedisServer::start_with(&["--appendonly", "yes", "--appendfsync", "always"]);
    let client = Client::builder()
        .response_timeout(Duration::from_secs(5))
        .default_lease(Duration::from_secs(120))
        .renewal_interval(Duration::from_secs(1))
        .open(server.url())
        .unwrap();
    let m = client.mutex("batch");
    drop(m.lock().unwrap());
    let g = m.lock().unwrap();
    server.pause();
    // The release is written to a stopped server: the drop does not wait for its reply.
    let started = Instant::now();
    drop(g);
    let dropped = started.elapsed();
    assert!(
        dropped < Duration::from_secs(5),
        "the drop waited {dropped:?}, as long as a response timeout"
    );
    // The server dies without having read it; the lock survives in its append-only file.
    server.restart();
    let mut conn = server.conn();
    let held: bool = redis::cmd("EXISTS")
        .arg("redmutex:{batch}")
        .query(&mut conn)
        .unwrap();
    assert!(held, "the release never ran, and the lock is still there");
    // Reading the reply fails; the release goes to the renewal thread, which sends it
    // again, long before the 120 s lease would have freed the lock.
    assert!(eventually(Duration::from_secs(30), || {
        let _ = m.is_locked();
        !redis::cmd("EXISTS")
            .arg("redmutex:{batch}")
            .query::<bool>(&mut conn)
            .unwrap()
    }));
}
