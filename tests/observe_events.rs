//! Event handlers on a real `redis-server`: acquisitions with their waits, releases with
//! their hold times, time-outs, failures, lost leases, renewal rounds and waiting threads.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redmutex::events::{
    Acquired, EventHandler, Failed, LeaseLost, Released, Renewed, TimedOut, Waiting,
};
use redmutex::{Client, ErrorKind};
use support::{eventually, RedisServer};

const LIMIT: Duration = Duration::from_secs(30);

/// Keeps every event as a line of text; shared with the client as an `Arc`, which is a
/// handler too.
#[derive(Default)]
struct Recorder {
    lines: Mutex<Vec<String>>,
}

impl Recorder {
    fn push(&self, line: String) {
        self.lines.lock().unwrap().push(line);
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().unwrap().clone()
    }

    fn count(&self, prefix: &str) -> usize {
        self.lines()
            .iter()
            .filter(|l| l.starts_with(prefix))
            .count()
    }
}

impl EventHandler for Recorder {
    fn acquired(&self, e: &Acquired<'_>) {
        self.push(format!("acquired {} {} {:?}", e.kind, e.name, e.waited));
    }
    fn released(&self, e: &Released<'_>) {
        self.push(format!(
            "released {} {} lost={} {:?}",
            e.kind, e.name, e.lost, e.held
        ));
    }
    fn timed_out(&self, e: &TimedOut<'_>) {
        self.push(format!("timed_out {} {}", e.kind, e.name));
    }
    fn failed(&self, e: &Failed<'_>) {
        self.push(format!("failed {} {} {:?}", e.kind, e.name, e.error));
    }
    fn lease_lost(&self, e: &LeaseLost<'_>) {
        self.push(format!("lease_lost {} {}", e.kind, e.name));
    }
    fn renewed(&self, e: &Renewed) {
        self.push(format!("renewed {} {}", e.leases, e.round_trips));
    }
    fn waiting(&self, e: &Waiting<'_>) {
        self.push(format!("waiting {} {} {}", e.kind, e.name, e.started));
    }
}

fn client(server: &RedisServer, recorder: &Arc<Recorder>) -> Client {
    Client::builder()
        .default_lease(Duration::from_secs(2))
        .renewal_interval(Duration::from_millis(200))
        .event_handler(Arc::clone(recorder))
        .open(server.url())
        .unwrap()
}

#[test]
fn acquisitions_and_releases_are_told_with_their_times_and_reentries_are_not() {
    let server = RedisServer::start();
    let events = Arc::new(Recorder::default());
    let c = client(&server, &events);
    let m = c.mutex("ledger");
    let outer = m.lock().unwrap();
    let inner = m.lock().unwrap(); // re-entry: takes nothing from Redis, tells nothing
    std::thread::sleep(Duration::from_millis(50));
    drop(inner);
    outer.unlock().unwrap();
    let lines = events.lines();
    let of_ledger: Vec<_> = lines.iter().filter(|l| l.contains("ledger")).collect();
    assert_eq!(of_ledger.len(), 2, "{lines:?}");
    assert!(
        of_ledger[0].starts_with("acquired Mutex ledger"),
        "{lines:?}"
    );
    assert!(
        of_ledger[1].starts_with("released Mutex ledger lost=false"),
        "{lines:?}"
    );
    // The hold time covers the 50 ms the guard lived.
    let held = of_ledger[1].rsplit(' ').next().unwrap();
    assert!(!held.ends_with("ns") && !held.ends_with("µs"), "{held}");
}

#[test]
fn a_timed_out_wait_is_told_and_waiting_threads_are_balanced() {
    let server = RedisServer::start();
    let events = Arc::new(Recorder::default());
    let holder = Client::open(server.url()).unwrap();
    let c = client(&server, &events);
    let held = holder.mutex("busy").lock().unwrap();
    assert!(c
        .mutex("busy")
        .try_lock_for(Duration::from_millis(300))
        .unwrap()
        .is_none());
    assert!(c.fair_mutex("fair-busy").lock().is_ok());
    assert_eq!(
        events.count("timed_out Mutex busy"),
        1,
        "{:?}",
        events.lines()
    );
    assert_eq!(events.count("waiting Mutex busy true"), 1);
    assert_eq!(events.count("waiting Mutex busy false"), 1);
    drop(held);
}

#[test]
fn failures_and_lost_leases_are_told() {
    let server = RedisServer::start();
    let events = Arc::new(Recorder::default());
    let c = client(&server, &events);
    let _: () = redis::cmd("HSET")
        .arg("redmutex:{typed}")
        .arg("f")
        .arg("v")
        .query(&mut server.conn())
        .unwrap();
    assert!(c.mutex("typed").try_lock().is_err());
    assert_eq!(
        events.count("failed Mutex typed WrongType"),
        1,
        "{:?}",
        events.lines()
    );

    let g = c.mutex("taken").lock().unwrap();
    let other = Client::open(server.url()).unwrap();
    assert!(other.mutex("taken").force_unlock().unwrap());
    // The renewal thread finds the token gone.
    assert!(eventually(LIMIT, || events.count("lease_lost Mutex taken") == 1));
    assert!(g.is_lost());
    let err = g.unlock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockLost);
    assert_eq!(
        events.count("released Mutex taken lost=true"),
        1,
        "{:?}",
        events.lines()
    );
    // Renewal rounds were told, with the leases they renewed.
    assert!(events.lines().iter().any(|l| l.starts_with("renewed 1 ")));
}

/// A Redlock tells its handlers what a client tells of its locks, with the same kinds, and
/// counts it in `Redlock::stats`: an acquisition, a time-out of another Redlock's attempt,
/// the release, and a lease that renewal found gone from a majority.
#[test]
fn a_redlock_emits_the_events_and_stats_of_a_client() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let recorder = Arc::new(Recorder::default());
    let redlock = redmutex::Redlock::builder()
        .default_lease(Duration::from_secs(3))
        .renewal_interval(Duration::from_millis(200))
        .event_handler(Arc::clone(&recorder))
        .open(servers.iter().map(|s| s.url()))
        .unwrap();
    let other = redmutex::Redlock::open(servers.iter().map(|s| s.url())).unwrap();
    let g = redlock.mutex("ledger").lock().unwrap();
    assert!(redlock.mutex("ledger").try_lock().unwrap().is_some()); // re-entry
    assert!(other.mutex("ledger").try_lock().unwrap().is_none());
    let waited = redlock.mutex("ledger");
    let waiter = std::thread::spawn(move || {
        waited
            .try_lock_for(Duration::from_millis(300))
            .map(|g| g.is_none())
    });
    // Another thread of the same Redlock waits, and times out.
    assert_eq!(waiter.join().unwrap().ok(), Some(true));
    g.unlock().unwrap();
    assert!(eventually(LIMIT, || recorder
        .count("released Mutex ledger lost=false")
        == 1));
    assert_eq!(
        recorder.count("acquired Mutex ledger"),
        1,
        "{:?}",
        recorder.lines()
    );
    assert_eq!(
        recorder.count("timed_out Mutex ledger"),
        1,
        "{:?}",
        recorder.lines()
    );
    assert_eq!(
        recorder.count("waiting Mutex ledger"),
        2,
        "{:?}",
        recorder.lines()
    );

    // A lock taken from under its holder on a majority: renewal tells, once.
    let g = redlock.mutex("taken").lock().unwrap();
    for server in &servers[..2] {
        let _: () = redis::cmd("DEL")
            .arg("redmutex:{taken}")
            .query(&mut server.conn())
            .unwrap();
    }
    assert!(g.lease_watch().wait_timeout(LIMIT));
    assert_eq!(g.unlock().unwrap_err().kind(), ErrorKind::LockLost);
    // The holder is woken first; the renewal thread tells the handlers right after.
    assert!(
        eventually(LIMIT, || recorder.count("lease_lost Mutex taken") >= 1),
        "{:?}",
        recorder.lines()
    );
    assert_eq!(
        recorder.count("lease_lost Mutex taken"),
        1,
        "{:?}",
        recorder.lines()
    );
    assert_eq!(recorder.count("released Mutex taken lost=true"), 1);

    let stats = redlock.stats();
    assert_eq!(stats.acquisitions, 2, "{stats:?}");
    assert_eq!(stats.reentries, 1, "{stats:?}");
    assert_eq!(stats.releases, 1, "{stats:?}");
    assert_eq!(stats.lost, 1, "{stats:?}");
    assert_eq!((stats.contended, stats.gave_up), (1, 1), "{stats:?}");
    assert!(stats.renewals >= 1, "{stats:?}");
}
