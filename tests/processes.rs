//! Exclusion across processes: worker processes are this test binary run again with a role
//! in the environment.

mod support;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use redis::Commands;
use redmutex::Client;
use support::{within, RedisServer};

const ROLE: &str = "REDMUTEX_TEST_ROLE";
const URL: &str = "REDMUTEX_TEST_URL";
const PROCESSES: usize = 4;
const THREADS: usize = 4;
const INCREMENTS: usize = 25;

/// The entry point of the worker processes; does nothing in a normal test run.
#[test]
fn worker_process_entry() {
    let (Ok(role), Ok(url)) = (std::env::var(ROLE), std::env::var(URL)) else {
        return;
    };
    match role.as_str() {
        "counter" => count_under_the_lock(&url),
        "holder" => hold_until_killed(&url),
        other => panic!("unknown role {other}"),
    }
}

fn spawn_worker(role: &str, url: &str) -> Child {
    Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "worker_process_entry",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(ROLE, role)
        .env(URL, url)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn worker process")
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

fn read_line_starting(child: &mut Child, prefix: &str) -> String {
    let stdout = child.stdout.take().expect("piped stdout");
    let prefix = prefix.to_owned();
    within(Duration::from_secs(120), move || {
        let mut lines = BufReader::new(stdout).lines();
        while let Some(line) = lines.next() {
            let line = line.expect("read worker output");
            // The test harness may print its own text before ours on the same line.
            if let Some(at) = line.find(&prefix) {
                // Keep reading, so that the worker's later output finds its pipe open.
                std::thread::spawn(move || lines.for_each(drop));
                return line[at + prefix.len()..].trim().to_owned();
            }
        }
        panic!("worker ended without printing {prefix}");
    })
}

#[test]
fn four_processes_of_four_threads_never_lose_an_increment() {
    let server = RedisServer::start();
    let mut workers: Vec<Child> = (0..PROCESSES)
        .map(|_| spawn_worker("counter", &server.url()))
        .collect();
    let mut contended = 0;
    for w in &mut workers {
        contended += read_line_starting(w, "CONTENDED ").parse::<u64>().unwrap();
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
    let token: u64 = read_line_starting(&mut holder, "LOCKED ").parse().unwrap();
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
