//! Redis down, paused, restarted, connections killed, credentials wrong: every call ends
//! within its timeouts with a typed error, and the client recovers when Redis does.

mod support;

use std::net::TcpListener;
use std::time::Duration;

use redmutex::{Client, ErrorKind};
use support::{eventually, within, RedisServer};

const LIMIT: Duration = Duration::from_secs(60);

fn fast_failing_client(url: &str) -> Client {
    Client::builder()
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
        .backoff(Duration::from_millis(2), Duration::from_millis(50))
        .outage_patience(Duration::from_millis(300))
        .open(url)
        .expect("client")
}

#[test]
fn a_blocked_lock_rides_through_a_restart_of_the_server() {
    let mut server = RedisServer::start();
    let holder = Client::builder()
        .default_lease(Duration::from_secs(3))
        .open(server.url())
        .unwrap();
    let g = holder.mutex("blip").lock().unwrap();
    let waiter = Client::builder()
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
        .outage_patience(Duration::from_secs(30))
        .open(server.url())
        .unwrap();
    let w = waiter.clone();
    let waiting = std::thread::spawn(move || w.mutex("blip").lock().map(|g| g.fencing_token()));
    // The waiter is waiting in Redis before the server goes.
    assert!(eventually(LIMIT, || waiter.stats().contended >= 1));
    server.kill();
    std::thread::sleep(Duration::from_secs(2));
    server.restart(); // empty: the holder's lock is gone with the old process
    let got = within(LIMIT, move || waiting.join().unwrap());
    assert!(
        got.is_ok(),
        "the waiter failed instead of riding through: {got:?}"
    );
    assert!(waiter.stats().outage_retries >= 1, "{:?}", waiter.stats());
    // The holder is told that its lock is gone.
    assert!(g.lease_watch().wait_timeout(LIMIT));
}

/// A client that has never reached its deployment has no outage to ride through: with the
/// default patience (20 s), a blocking call fails as `check()` does.
#[test]
fn a_client_that_never_reached_its_server_fails_a_blocking_lock_at_once() {
    let refused = support::free_port();
    let client = Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .pool_size(4)
        .open(format!("redis://127.0.0.1:{refused}/"))
        .unwrap();
    let c = client.clone();
    let (took, errors) = within(LIMIT, move || {
        let started = std::time::Instant::now();
        let errors: Vec<redmutex::Error> = (0..10)
            .map(|_| c.mutex("never").lock().map(drop).unwrap_err())
            .chain([c
                .mutex("never")
                .try_lock_for(Duration::from_secs(30))
                .map(drop)
                .unwrap_err()])
            .collect();
        (started.elapsed(), errors)
    });
    for err in &errors {
        assert!(err.is_connection(), "{err}");
        assert!(err.to_string().contains("refused"), "{err}");
    }
    // Eleven calls at once each; riding through would take 20 s each.
    assert!(took < Duration::from_secs(10), "{took:?}");
    assert_eq!(client.stats().outage_retries, 0);
}

#[test]
fn a_client_that_never_reached_a_silent_server_fails_within_the_connect_timeout() {
    let port = support::silent_server();
    let client = Client::builder()
        .connect_timeout(Duration::from_secs(1))
        .open(format!("redis://127.0.0.1:{port}/"))
        .unwrap();
    let c = client.clone();
    let (took, err) = within(LIMIT, move || {
        let started = std::time::Instant::now();
        let err = c.mutex("silent").lock().map(drop).unwrap_err();
        (started.elapsed(), err)
    });
    assert!(
        matches!(err.kind(), ErrorKind::Connection | ErrorKind::Timeout),
        "{err}"
    );
    // One connect timeout and a wide margin; riding through would take 20 s.
    assert!(took < Duration::from_secs(8), "{took:?}: {err}");
    assert_eq!(client.stats().outage_retries, 0);
}

/// Once reached, the same client rides through: the patience applies from then on.
#[test]
fn a_client_that_reached_its_server_once_rides_through_a_restart_of_it() {
    let mut server = RedisServer::start();
    server.kill();
    let client = Client::builder()
        .connect_timeout(Duration::from_millis(500))
        .response_timeout(Duration::from_millis(500))
        .outage_patience(Duration::from_secs(30))
        .open(server.url())
        .unwrap();
    let c = client.clone();
    let err = within(LIMIT, move || c.mutex("later").lock().map(drop)).unwrap_err();
    assert!(err.is_connection(), "{err}");
    server.restart();
    drop(client.mutex("later").lock().unwrap());
    server.kill();
    let c = client.clone();
    let blocked = std::thread::spawn(move || c.mutex("later").lock().map(|g| g.fencing_token()));
    assert!(eventually(LIMIT, || client.stats().outage_retries >= 1));
    server.restart();
    let got = within(LIMIT, move || blocked.join().unwrap());
    assert!(got.is_ok(), "{got:?}");
}

#[test]
fn a_blocked_lock_returns_the_last_error_once_its_patience_is_spent_and_try_lock_at_once() {
    let mut server = RedisServer::start();
    let patience = Duration::from_millis(1500);
    let client = Client::builder()
        .connect_timeout(Duration::from_millis(300))
        .response_timeout(Duration::from_millis(300))
        .outage_patience(patience)
        .open(server.url())
        .unwrap();
    drop(client.mutex("gone").lock().unwrap());
    server.kill();
    let started = std::time::Instant::now();
    let c = client.clone();
    let err = within(LIMIT, move || c.mutex("gone").lock().map(drop)).unwrap_err();
    assert!(err.is_connection(), "{err}");
    assert!(
        err.to_string().contains(&server.port().to_string()),
        "{err}"
    );
    assert!(started.elapsed() >= patience, "gave up before its patience");
    let retries = client.stats().outage_retries;
    assert!(retries >= 2, "{retries}");
    // try_lock() is one attempt.
    let c = client.clone();
    let err = within(LIMIT, move || c.mutex("gone").try_lock().map(drop)).unwrap_err();
    assert!(err.is_connection(), "{err}");
    assert_eq!(client.stats().outage_retries, retries);
    // A deadline shorter than the patience ends the call first, with the error.
    let c = client.clone();
    let err = within(LIMIT, move || {
        c.mutex("gone")
            .try_lock_for(Duration::from_millis(200))
            .map(drop)
    })
    .unwrap_err();
    assert!(err.is_connection(), "{err}");
}

#[test]
fn redis_down_gives_a_connection_error_not_a_hang() {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    // Opening connects nothing, so it succeeds at once.
    let client = fast_failing_client(&format!("redis://127.0.0.1:{port}/"));
    let c = client.clone();
    let err = within(LIMIT, move || c.mutex("x").lock().map(drop)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    let c = client.clone();
    let err = within(LIMIT, move || c.mutex("x").try_lock().map(|g| g.is_some())).unwrap_err();
    assert!(err.is_connection(), "{err}");
    let err = within(LIMIT, move || client.mutex("x").is_locked()).unwrap_err();
    assert!(err.is_connection(), "{err}");
}

#[test]
fn a_paused_redis_gives_timeouts_and_the_client_recovers() {
    let server = RedisServer::start();
    let client = fast_failing_client(&server.url());
    drop(client.mutex("p").lock().unwrap()); // a pooled connection exists
    server.pause();
    let c = client.clone();
    let err = within(LIMIT, move || c.mutex("p").lock().map(drop)).unwrap_err();
    assert!(err.is_timeout() || err.is_connection(), "{err}");
    let c = client.clone();
    let err = within(LIMIT, move || {
        c.mutex("q")
            .try_lock_for(Duration::from_secs(1))
            .map(|g| g.is_some())
    })
    .unwrap_err();
    assert!(err.is_timeout() || err.is_connection(), "{err}");
    server.resume();
    // Orphans of the timed-out acquires were cleaned up or expire; the lock is usable again.
    let c = client.clone();
    let got = within(LIMIT, move || {
        c.mutex("p")
            .try_lock_for(Duration::from_secs(40))
            .map(|g| g.is_some())
    });
    assert!(got.unwrap());
}

#[test]
fn a_pause_longer_than_the_lease_is_reported_as_lost() {
    let server = RedisServer::start();
    let client = Client::builder()
        .response_timeout(Duration::from_millis(300))
        .default_lease(Duration::from_millis(900))
        .renewal_interval(Duration::from_millis(300))
        .open(server.url())
        .unwrap();
    let g = client.mutex("paused").lock().unwrap();
    let watch = g.lease_watch();
    server.pause();
    assert!(
        watch.wait_timeout(LIMIT),
        "loss not signalled during the pause"
    );
    assert!(g.is_lost());
    // The local clock reports the loss a little before Redis's own expiry (renewals are
    // timed from their sending): stay paused past a whole lease more.
    std::thread::sleep(Duration::from_millis(1500));
    server.resume();
    let err = g.unlock().unwrap_err();
    assert!(err.is_lock_lost(), "{err}");
}

#[test]
fn a_restart_loses_held_locks_visibly_and_new_locks_work() {
    let mut server = RedisServer::start();
    let client = Client::builder()
        .default_lease(Duration::from_millis(900))
        .renewal_interval(Duration::from_millis(300))
        .open(server.url())
        .unwrap();
    let g = client.mutex("r").lock().unwrap();
    let token = g.fencing_token();
    server.restart();
    assert!(eventually(LIMIT, || g.is_lost()), "restart went unnoticed");
    let c = client.clone();
    let (got, new_token) = within(LIMIT, move || {
        let g2 = c.mutex("r2").lock().unwrap();
        let m = c.mutex("r");
        let other = std::thread::spawn(move || m.lock().map(|g| g.fencing_token()));
        drop(g2);
        (true, other.join().unwrap())
    });
    assert!(got);
    assert!(new_token.unwrap() > token, "fencing token went backwards");
    assert!(g.unlock().unwrap_err().is_lock_lost());
}

#[test]
fn killed_connections_are_replaced_transparently() {
    let server = RedisServer::start();
    let client = fast_failing_client(&server.url());
    // Fill the pool with a few connections.
    let guards: Vec<_> = (0..4)
        .map(|i| client.mutex(format!("k{i}")).lock().unwrap())
        .collect();
    drop(guards);
    let _: i64 = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("TYPE")
        .arg("normal")
        .arg("SKIPME")
        .arg("yes")
        .query(&mut server.conn())
        .unwrap();
    for i in 0..4 {
        let m = client.mutex(format!("k{i}"));
        let g = m.lock().unwrap();
        assert!(m.is_locked().unwrap());
        g.unlock().unwrap();
    }
}

#[test]
fn a_fair_waiter_rides_out_a_killed_connection() {
    let server = RedisServer::start();
    let holder = fast_failing_client(&server.url());
    let waiter = Client::builder()
        .response_timeout(Duration::from_millis(500))
        .open(server.url())
        .unwrap();
    let g = holder.fair_mutex("f").lock().unwrap();
    let m = waiter.fair_mutex("f");
    let waiting = std::thread::spawn(move || m.try_lock_for(LIMIT).map(|g| g.is_some()));
    let mut conn = server.conn();
    assert!(
        eventually(LIMIT, || redis::cmd("LLEN")
            .arg("redmutex:{f}:queue")
            .query::<i64>(&mut conn)
            .unwrap()
            == 1),
        "the waiter never queued"
    );
    // Every idle pooled connection of the waiter dies; its subscriber stays.
    let _: i64 = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"])
        .query(&mut conn)
        .unwrap();
    g.unlock().unwrap();
    let got = within(LIMIT, move || waiting.join().unwrap());
    assert!(got.unwrap(), "the waiter gave up");
}

#[test]
fn wrong_or_missing_password_is_an_auth_error_without_the_password() {
    let server = RedisServer::start_with(&["--requirepass", "right-horse-battery"]);
    let wrong = format!("redis://:wrong-staple-99@127.0.0.1:{}/", server.port());
    let client = fast_failing_client(&wrong);
    let err = within(LIMIT, move || client.mutex("a").lock().map(drop)).unwrap_err();
    assert!(err.is_auth(), "{err}");
    for shown in [err.to_string(), format!("{err:?}")] {
        assert!(!shown.contains("wrong-staple-99"), "{shown}");
    }

    let none = fast_failing_client(&server.url());
    let err = within(LIMIT, move || none.mutex("a").lock().map(drop)).unwrap_err();
    assert!(err.is_auth(), "{err}");

    // A password sent to a server that has none: one sentence of ours, no reply text.
    let open = RedisServer::start();
    let given = format!("redis://:wrong-staple-99@127.0.0.1:{}/", open.port());
    for call in [
        Box::new(|c: Client| c.check()) as Box<dyn FnOnce(Client) -> redmutex::Result<()> + Send>,
        Box::new(|c: Client| c.mutex("a").lock().map(drop)),
    ] {
        let client = fast_failing_client(&given);
        let err = within(LIMIT, move || call(client)).unwrap_err();
        assert!(err.is_auth(), "{err}");
        let shown = err.to_string();
        assert!(shown.contains("has none set"), "{shown}");
        assert!(!shown.contains("wrong-staple-99"), "{shown}");
        assert!(!shown.contains("ResponseError"), "{shown}");
    }

    let right = format!("redis://:right-horse-battery@127.0.0.1:{}/", server.port());
    let client = fast_failing_client(&right);
    assert!(!format!("{client:?}").contains("right-horse-battery"));
    client.mutex("a").lock().unwrap().unlock().unwrap();
}

#[test]
fn the_start_up_check_tells_a_bad_database_a_wrong_password_and_a_closed_port_apart() {
    let server = RedisServer::start_with(&["--requirepass", "right-horse-battery"]);
    let port = server.port();
    let check = |url: String| {
        let client = fast_failing_client(&url);
        within(LIMIT, move || client.check())
    };
    check(format!("redis://:right-horse-battery@127.0.0.1:{port}/0")).unwrap();
    let err = check(format!("redis://:right-horse-battery@127.0.0.1:{port}/99")).unwrap_err();
    assert!(err.is_config(), "{err}");
    assert!(err.to_string().contains("database"), "{err}");
    let err = check(format!("redis://:wrong-staple-99@127.0.0.1:{port}/")).unwrap_err();
    assert!(err.is_auth(), "{err}");
    assert!(!err.to_string().contains("AuthenticationFailed"), "{err}");
    assert!(!err.to_string().contains("wrong-staple-99"), "{err}");
    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = check(format!("redis://127.0.0.1:{closed}/")).unwrap_err();
    assert!(err.is_connection(), "{err}");
    // Something that is not Redis answers on the port.
    let http = TcpListener::bind("127.0.0.1:0").unwrap();
    let http_port = http.local_addr().unwrap().port();
    std::thread::spawn(move || {
        use std::io::{Read, Write};
        for stream in http.incoming().take(4) {
            let Ok(mut stream) = stream else { continue };
            let mut buf = [0u8; 256];
            let _ = stream.read(&mut buf);
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        }
    });
    let err = check(format!("redis://127.0.0.1:{http_port}/")).unwrap_err();
    assert!(err.is_connection(), "{err}");
    assert!(
        err.to_string()
            .contains("does not speak the Redis protocol"),
        "{err}"
    );
    assert!(!err.to_string().contains('\n'), "{err}");
}
