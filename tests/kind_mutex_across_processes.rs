//! Exclusion across processes: worker processes are this test binary run again with a role
//! in the environment.

mod support;

use std::process::Child;
use std::time::Duration;

use redis::Commands;
use redmutex::Client;
use support::{within, RedisServer};

const PROCESSES: usize = 4;
const THREADS: usize = 4;
const INCREMENTS: usize = 25;

const ENTRY: &str = "worker_process_entry";

/// The entry point of the worker processes; does nothing in a normal test run.
#[test]
fn worker_process_entry() {
    let Some((role, url, _)) = support::worker_role() else {
        return;
    };
    match role.as_str() {
        "counter" => count_under_the_lock(&url),
        "holder" => hold_until_killed(&url),
        other => panic!("unknown role {other}"),
    }
}

fn spawn_worker(role: &str, url: &str) -> Child {
    support::spawn_worker(ENTRY, role, url, "")
}

/// A non-atomic read-modify-write of a shared counter, made safe only by the lock.
fn count_under_the_lock(url: &str) {
    let client = Client::builder()
        .backoff(Duration::from_millis(1), Duration::from_millis(20))
        .open(url)
        .unwrap();
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let client = client.clone();
            let url = url.to_owned();
            std::thread::spawn(move || {
                let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
                let m = client.mutex("counter-lock");
                for _ in 0..INCREMENTS {
                    let _g = m.lock().unwrap();
                    let n: u64 = conn.get::<_, Option<u64>>("counter").unwrap().unwrap_or(0);
                    std::thread::sleep(Duration::from_millis(1));
                    let _: () = conn.set("counter", n + 1).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    println!("CONTENDED {}", client.stats().contended);
}

fn hold_until_killed(url: &str) {
    let client = Client::builder()
        .default_lease(Duration::from_millis(1500))
        .renewal_interval(Duration::from_millis(300))
        .open(url)
        .unwrap();
    let g = client.mutex("held").lock().unwrap();
    println!("LOCKED {}", g.fencing_token());
    std::thread::sleep(Duration::from_secs(120));
}

#[test]
fn four_processes_of_four_threads_never_lose_an_increment() {
    let server = RedisServer::start();
    let mut workers: Vec<Child> = (0..PROCESSES)
        .map(|_| spawn_worker("counter", &server.url()))
        .collect();
    let mut contended = 0;
    for w in &mut workers {
        contended += support::read_marker(w, "CONTENDED ")
            .parse::<u64>()
            .unwrap();
    }
    for mut w in workers {
        let status = w.wait().unwrap();
        assert!(status.success(), "a worker failed: {status}");
    }
    let total: u64 = server.conn().get("counter").unwrap();
    assert_eq!(total, (PROCESSES * THREADS * INCREMENTS) as u64);
    assert!(
        contended > 0,
        "the workers never contended; the test proves nothing"
    );
}

#[test]
fn a_killed_holder_frees_the_lock_after_its_lease() {
    let server = RedisServer::start();
    let mut holder = spawn_worker("holder", &server.url());
    let token: u64 = support::read_marker(&mut holder, "LOCKED ")
        .parse()
        .unwrap();
    let client = Client::open(server.url()).unwrap();
    let m = client.mutex("held");
    // Held, and kept alive by the holder's renewal past its 1.5 s lease.
    assert!(m.try_lock().unwrap().is_none());
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        m.try_lock().unwrap().is_none(),
        "the holder's renewal did not keep it"
    );

    holder.kill().unwrap(); // SIGKILL: no release, no more renewal
    holder.wait().unwrap();
    assert!(
        m.is_locked().unwrap(),
        "the lock vanished before its lease ran out"
    );
    let got = within(Duration::from_secs(60), move || {
        m.try_lock_for(Duration::from_secs(30))
            .map(|g| g.map(|g| g.fencing_token()))
    });
    let new_token = got
        .unwrap()
        .expect("lock never freed after the holder died");
    assert!(new_token > token);
}
