//! Every call within its deadline against servers that misbehave, on real sockets and real
//! `redis-server`s: a silent server (it accepts connections and never answers) costs a call
//! one timeout, never two; a paused or silent Redlock instance costs each call at most the
//! per-instance timeout, `unlock` and a failed attempt's clean-up included.
//!
//! The bounds checked are the promised one plus a wide margin, and well below what a second
//! timeout would cost.

mod support;

use std::time::{Duration, Instant};

use redmutex::{Client, ErrorKind, Redlock};
use support::{silent_server, within, RedisServer};

const TIMEOUT: Duration = Duration::from_secs(2);
/// One timeout and a margin for a loaded machine; a second timeout would pass it.
const ONE_TIMEOUT: Duration = Duration::from_millis(3500);
const LIMIT: Duration = Duration::from_secs(60);

/// A call on a client, by name.
type Call = Box<dyn FnOnce(Client) -> redmutex::Result<()> + Send>;

fn timed<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> (Duration, T) {
    within(LIMIT, move || {
        let started = Instant::now();
        let out = f();
        (started.elapsed(), out)
    })
}

#[test]
fn a_silent_server_costs_every_call_one_timeout_never_two() {
    let port = silent_server();
    // Without and with credentials and a database: the handshake is bounded as a whole.
    for url in [
        format!("redis://127.0.0.1:{port}/"),
        format!("redis://locker:secret@127.0.0.1:{port}/3"),
    ] {
        // Each try of a blocking `lock()` costs one timeout; without patience it is one try
        // (with it, `lock()` tries again until the patience is spent: tests/fault_outages.rs).
        let client = Client::builder()
            .connect_timeout(TIMEOUT)
            .response_timeout(TIMEOUT)
            .outage_patience(Duration::ZERO)
            .open(url.as_str())
            .unwrap();
        let calls: Vec<(&str, Call)> = vec![
            ("lock", Box::new(|c| c.mutex("x").lock().map(drop))),
            ("try_lock", Box::new(|c| c.mutex("x").try_lock().map(drop))),
            ("lock_info", Box::new(|c| c.lock_info("x").map(drop))),
            ("lock_names", Box::new(|c| c.lock_names("*").map(drop))),
        ];
        for (what, call) in calls {
            let c = client.clone();
            let (took, result) = timed(move || call(c));
            let err = result.expect_err(what);
            assert!(
                matches!(err.kind(), ErrorKind::Timeout | ErrorKind::Connection),
                "{what}: {err}"
            );
            assert!(took < ONE_TIMEOUT, "{what} on {url}: {took:?} ({err})");
        }
    }
}

fn redlock_client(server: &RedisServer) -> Client {
    Client::builder()
        .connect_timeout(TIMEOUT)
        .response_timeout(TIMEOUT)
        .open(server.url())
        .unwrap()
}

#[test]
fn a_paused_redlock_instance_costs_each_call_the_instance_timeout_at_most() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let redlock = Redlock::new(servers.iter().map(redlock_client))
        .unwrap()
        .instance_timeout(Duration::from_millis(100))
        .unwrap();
    let m = redlock.mutex("paused");
    for _ in 0..3 {
        m.lock().unwrap().unlock().unwrap();
    }
    servers[0].pause();
    // Each call costs at most the per-instance timeout (100 ms), never the response timeout
    // (2 s): a lock, its unlock, and the next ones on the connections that timed out.
    let limit = Duration::from_millis(1500);
    for round in 0..3 {
        let m = m.clone();
        let (took_lock, (took_unlock, unlocked)) = timed(move || {
            let g = m.lock().unwrap();
            let started = Instant::now();
            let unlocked = g.unlock();
            (started.elapsed(), unlocked)
        });
        unlocked.unwrap();
        assert!(took_lock < limit, "round {round}: lock took {took_lock:?}");
        assert!(
            took_unlock < limit,
            "round {round}: unlock took {took_unlock:?}"
        );
    }
    // A majority paused: the attempt fails, its clean-up runs in the background.
    servers[1].pause();
    let attempt = m.clone();
    let (took, result) = timed(move || attempt.try_lock().map(|g| g.is_some()));
    assert!(took < limit, "a failed attempt took {took:?}: {result:?}");
    assert!(
        !matches!(result, Ok(true)),
        "taken with a majority paused: {result:?}"
    );
    servers[0].resume();
    servers[1].resume();
    // Nothing left behind: the lock is had again at once.
    let again = m.clone();
    assert!(within(LIMIT, move || again
        .try_lock_for(Duration::from_secs(20))
        .map(|g| g.is_some()))
    .unwrap());
}
