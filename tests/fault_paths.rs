//! Failure paths keep their promises: no orphan lock after a stall, the caller's deadline is
//! the deadline, a refused connection is reported at once, errors say what failed where, and
//! a shut-down client is closed for every clone.

mod support;

use std::error::Error as _;
use std::net::TcpListener;
use std::time::{Duration, Instant};

use redmutex::{Client, ErrorKind};
use support::{eventually, within, RedisServer};

const LIMIT: Duration = Duration::from_secs(60);

/// A response timeout of 1 s and a connect timeout of 5 s: a call that waited for both
/// would take 6 s.
/// A client whose blocking calls return the first error (no outage patience): these tests
/// look at what one failed call leaves behind.
fn client(url: &str) -> Client {
    Client::builder()
        .response_timeout(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(5))
        .outage_patience(Duration::ZERO)
        .open(url)
        .expect("client")
}

fn fence_exists(server: &RedisServer, name: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(format!("redmutex:{{{name}}}:fence"))
        .query(&mut server.conn())
        .unwrap()
}

#[test]
fn an_acquire_that_timed_out_in_a_stall_leaves_no_orphan_after_the_resume() {
    let server = RedisServer::start();
    let client = client(&server.url());
    drop(client.mutex("warm").lock().unwrap()); // a pooled connection exists
    server.pause();
    let c = client.clone();
    let (err, took) = within(LIMIT, move || {
        let started = Instant::now();
        let err = c.mutex("orders:42").lock().map(drop).unwrap_err();
        (err, started.elapsed())
    });
    // The caller's deadline is the response timeout, not the response timeout plus a
    // clean-up's connect timeout.
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    println!("lock() against a paused redis failed after {took:?}");
    assert!(took < Duration::from_secs(4), "lock() took {took:?}");
    assert!(client.stats().pending_cleanups >= 1);
    std::thread::sleep(Duration::from_millis(300));
    server.resume();
    let resumed = Instant::now();
    // The buffered acquire ran when Redis resumed (it counted a fencing token) ...
    assert!(eventually(LIMIT, || fence_exists(&server, "orders:42")));
    // ... and the renewal thread removed what it took, long before its 30 s lease.
    assert!(eventually(Duration::from_secs(10), || {
        client.stats().pending_cleanups == 0
    }));
    println!(
        "the orphan was removed {:?} after the resume",
        resumed.elapsed()
    );
    let other = Client::open(server.url()).unwrap();
    assert!(
        !other.mutex("orders:42").is_locked().unwrap(),
        "orphan lock"
    );
    let got = other
        .mutex("orders:42")
        .try_lock_for(Duration::from_secs(2))
        .unwrap();
    assert!(got.is_some());
}

#[test]
fn a_fair_acquire_that_timed_out_in_a_stall_leaves_no_orphan_either() {
    let server = RedisServer::start();
    let client = client(&server.url());
    drop(client.fair_mutex("warm").lock().unwrap());
    server.pause();
    let c = client.clone();
    let err = within(LIMIT, move || c.fair_mutex("fair-orphan").lock().map(drop)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    std::thread::sleep(Duration::from_millis(300));
    server.resume();
    assert!(eventually(Duration::from_secs(10), || {
        client.stats().pending_cleanups == 0
    }));
    let other = Client::open(server.url()).unwrap();
    assert!(!other.fair_mutex("fair-orphan").is_locked().unwrap());
    assert!(other
        .fair_mutex("fair-orphan")
        .try_lock()
        .unwrap()
        .is_some());
}

#[test]
fn a_release_that_timed_out_is_finished_in_the_background() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let g = client.mutex("release-me").lock().unwrap();
    server.pause();
    // The guard is not `Send`: unlock here (every call has its deadline anyway).
    let started = Instant::now();
    let err = g.unlock().unwrap_err();
    let took = started.elapsed();
    // The original time-out, not a connection error from a clean-up's new connection.
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    println!("unlock() against a paused redis failed after {took:?}");
    assert!(took < Duration::from_secs(4), "unlock() took {took:?}");
    server.resume();
    assert!(eventually(Duration::from_secs(10), || {
        client.stats().pending_cleanups == 0
    }));
    let other = Client::open(server.url()).unwrap();
    assert!(!other.mutex("release-me").is_locked().unwrap());
}

#[test]
fn a_refused_connection_is_reported_at_once() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let client = Client::builder()
        .connect_timeout(Duration::from_secs(30))
        .open(format!("redis://127.0.0.1:{port}/"))
        .unwrap();
    let (err, took) = within(LIMIT, move || {
        let started = Instant::now();
        // One attempt: a blocking `lock()` would try again for its outage patience.
        let err = client.mutex("x").try_lock().map(drop).unwrap_err();
        (err, started.elapsed())
    });
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    println!("a refused connection was reported after {took:?}: {err}");
    assert!(took < Duration::from_secs(10), "refusal took {took:?}");
    let message = err.to_string();
    assert!(message.contains("refused"), "{message}");
    assert!(message.contains(&format!("127.0.0.1:{port}")), "{message}");
    assert!(message.contains("lock \"x\""), "{message}");
}

#[test]
fn a_silent_server_fails_within_the_connect_timeout() {
    // Accepts connections (the kernel does) but never answers.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let client = Client::builder()
        .connect_timeout(Duration::from_secs(1))
        .response_timeout(Duration::from_secs(1))
        .open(format!("redis://127.0.0.1:{port}/"))
        .unwrap();
    let err = within(LIMIT, move || client.mutex("x").try_lock().map(drop)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    drop(listener);
}

#[test]
fn a_timeout_says_what_timed_out_where_and_after_how_long() {
    let server = RedisServer::start();
    let client = client(&server.url());
    drop(client.mutex("orders:42").lock().unwrap());
    server.pause();
    let err = within(LIMIT, move || client.mutex("orders:42").lock().map(drop)).unwrap_err();
    server.resume();
    assert_eq!(
        err.to_string(),
        format!(
            "timed out: redis at 127.0.0.1:{} did not answer within 1 s while acquiring lock \
             \"orders:42\"",
            server.port()
        )
    );
    assert!(
        err.source().is_some(),
        "the redis error is kept as the source"
    );
}

#[test]
fn extend_adds_and_set_lease_replaces() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let fixed = client
        .mutex("fixed")
        .with_fixed_lease(Duration::from_secs(5))
        .lock()
        .unwrap();
    fixed.extend(Duration::from_secs(20)).unwrap();
    let left = fixed.verify().unwrap();
    assert!(left > Duration::from_secs(20), "extend replaced: {left:?}");
    fixed.set_lease(Duration::from_secs(3)).unwrap();
    let left = fixed.verify().unwrap();
    assert!(left <= Duration::from_secs(3), "set_lease added: {left:?}");
}

#[test]
fn an_extension_of_a_renewed_lock_outlives_the_next_renewals() {
    let server = RedisServer::start();
    let client = Client::builder()
        .default_lease(Duration::from_millis(1500))
        .renewal_interval(Duration::from_millis(250))
        .open(server.url())
        .unwrap();
    let g = client.mutex("renewed").lock().unwrap();
    g.extend(Duration::from_secs(30)).unwrap();
    let renewals = client.stats().renewals;
    assert!(eventually(LIMIT, || client.stats().renewals >= renewals + 3));
    let left = g.verify().unwrap();
    assert!(
        left > Duration::from_secs(25),
        "renewal undid the extension: {left:?} left"
    );
    assert!(!g.is_lost());
    g.unlock().unwrap();
}

#[test]
fn shutdown_closes_every_clone_at_once_and_guards_still_release() {
    let server = RedisServer::start();
    let holder = Client::open(server.url()).unwrap();
    let client = Client::open(server.url()).unwrap();
    let clone = client.clone();
    let held = client.mutex("mine").lock().unwrap();
    let blocker = holder.mutex("theirs").lock().unwrap();
    let c = client.clone();
    let waiter = std::thread::spawn(move || c.mutex("theirs").lock().map(drop));
    assert!(eventually(LIMIT, || client.stats().contended >= 1));
    client.shutdown();
    let err = within(LIMIT, move || waiter.join().unwrap()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Shutdown, "{err}");
    let err = clone.mutex("other").try_lock().map(drop).unwrap_err();
    assert!(err.is_shutdown(), "{err}");
    assert!(clone.mutex("other").is_locked().unwrap_err().is_shutdown());
    // What is held is still released.
    held.unlock().unwrap();
    assert!(!holder.mutex("mine").is_locked().unwrap());
    drop(blocker);
}
