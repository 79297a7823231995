//! Idle waiters cost Redis almost nothing, however many threads and processes wait: fair
//! waiters share one heartbeat call and one re-checking thread per client and lock, and
//! plain waiters re-check as rarely as holders renew.

mod support;

use std::io::{BufRead, BufReader};
use std::process::Child;
use std::sync::mpsc::Receiver;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use redmutex::Client;
use support::{eventually, within, RedisServer};

const LIMIT: Duration = Duration::from_secs(120);
const ENTRY: &str = "idle_waiter_entry";

/// Commands Redis ran, script internals included.
fn commands(server: &RedisServer) -> u64 {
    server.info_number("stats", "total_commands_processed")
}

/// The lines a worker prints, as they come.
fn lines_of(child: &mut Child) -> Receiver<String> {
    let stdout = child.stdout.take().expect("piped stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Waits for a line that contains `marker` and returns what follows it.
fn expect_marker(lines: &Receiver<String>, marker: &str) -> String {
    loop {
        let line = lines
            .recv_timeout(LIMIT)
            .unwrap_or_else(|_| panic!("no {marker} from a worker"));
        if let Some(at) = line.find(marker) {
            return line[at + marker.len()..].trim().to_owned();
        }
    }
}

/// Worker processes: 10 threads that each take the lock once, then report.
#[test]
fn idle_waiter_entry() {
    let Some((role, url, _)) = support::worker_role() else {
        return;
    };
    assert_eq!(role, "waiters");
    let client = Client::open(url).unwrap();
    let threads: Vec<_> = (0..10)
        .map(|_| {
            let c = client.clone();
            std::thread::spawn(move || c.mutex("idle").lock().map(drop))
        })
        .collect();
    while client.stats().contended < 10 {
        std::thread::sleep(Duration::from_millis(20));
    }
    println!("WAITING");
    for t in threads {
        t.join().unwrap().unwrap();
    }
    println!("DONE {}", client.stats().notifications);
}

#[test]
fn a_hundred_idle_fair_waiters_in_one_process_cost_a_few_script_calls_a_second() {
    let server = RedisServer::start();
    // Short leases: heartbeats every 2 s, so that the window below sees several.
    let settings = || {
        Client::builder()
            .default_lease(Duration::from_secs(6))
            .renewal_interval(Duration::from_secs(2))
    };
    let holder = settings().open(server.url()).unwrap();
    let client = settings().open(server.url()).unwrap();
    let g = holder.fair_mutex("fair-idle").lock().unwrap();
    let start = Arc::new(Barrier::new(101));
    let waiters: Vec<_> = (0..100)
        .map(|_| {
            let (c, start) = (client.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                c.fair_mutex("fair-idle").lock().map(|g| g.fencing_token())
            })
        })
        .collect();
    start.wait();
    assert!(eventually(LIMIT, || client.stats().contended >= 100));
    std::thread::sleep(Duration::from_secs(1));
    let (scripts_before, at) = (server.command_calls("evalsha"), Instant::now());
    std::thread::sleep(Duration::from_secs(8));
    let scripts = server.command_calls("evalsha") - scripts_before;
    let per_second = scripts as f64 / at.elapsed().as_secs_f64();
    println!("100 idle fair waiters: {per_second:.2} script calls/s");
    // 100 threads each re-checking every 2 s and each sending its own heartbeat would make
    // about 100 script calls a second.
    assert!(
        per_second < 10.0,
        "{scripts} script calls in 8 s from 100 idle fair waiters"
    );
    g.unlock().unwrap();
    let mut tokens: Vec<u64> = waiters
        .into_iter()
        .map(|w| within(LIMIT, move || w.join().unwrap()).unwrap())
        .collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 100, "every waiter got the lock once");
}

#[test]
fn ten_processes_of_ten_idle_waiters_cost_under_ten_commands_a_second() {
    let server = RedisServer::start();
    let holder = Client::open(server.url()).unwrap();
    let g = holder.mutex("idle").lock().unwrap();
    let mut workers: Vec<Child> = (0..10)
        .map(|_| support::spawn_worker(ENTRY, "waiters", &server.url(), ""))
        .collect();
    let outputs: Vec<_> = workers.iter_mut().map(lines_of).collect();
    for lines in &outputs {
        expect_marker(lines, "WAITING");
    }
    // Two re-check periods of the default settings (a renewal interval, 10 s), measured.
    let (before, at) = (commands(&server), Instant::now());
    std::thread::sleep(Duration::from_secs(21));
    let during = commands(&server) - before;
    let per_second = during as f64 / at.elapsed().as_secs_f64();
    println!("10 x 10 idle waiters: {per_second:.2} commands/s");
    assert!(
        per_second < 10.0,
        "{during} commands in 21 s from 10 processes x 10 idle waiters"
    );
    // A release still wakes them: each thread of each process gets the lock in turn, woken by
    // announcements (re-checks alone would take minutes).
    let released = Instant::now();
    g.unlock().unwrap();
    for lines in &outputs {
        let notifications: u64 = expect_marker(lines, "DONE").parse().unwrap();
        assert!(notifications >= 1);
    }
    for mut w in workers {
        assert!(w.wait().unwrap().success());
    }
    assert!(
        released.elapsed() < Duration::from_secs(60),
        "100 hand-offs took {:?}",
        released.elapsed()
    );
}

/// Waiting clients far back in line re-check the less often: 16 clients waiting for a held
/// `Mutex` (a re-check period of 1 s) send a fraction of the 16 re-checks a second they
/// would send if each re-checked every period; and the first in line still takes the lock
/// when its holder dies without a release, the rest in turn.
#[test]
fn many_waiting_clients_recheck_the_less_often_the_further_back_they_wait() {
    let server = RedisServer::start();
    let settings = || {
        Client::builder()
            .default_lease(Duration::from_secs(3))
            .renewal_interval(Duration::from_secs(1))
    };
    let holder = settings().open(server.url()).unwrap();
    let g = holder.mutex("far-back").lock().unwrap();
    let clients: Vec<Client> = (0..16)
        .map(|_| settings().open(server.url()).unwrap())
        .collect();
    let waiters: Vec<_> = clients
        .iter()
        .map(|c| {
            let c = c.clone();
            std::thread::spawn(move || c.mutex("far-back").lock().map(|g| g.fencing_token()))
        })
        .collect();
    assert!(eventually(LIMIT, || clients
        .iter()
        .all(|c| c.stats().contended == 1)));
    // Past every waiter's first re-check, which tells it how far back it waits.
    std::thread::sleep(Duration::from_secs(2));
    let attempts = || clients.iter().map(|c| c.stats().attempts).sum::<u64>();
    let (before, at) = (attempts(), Instant::now());
    std::thread::sleep(Duration::from_secs(8));
    let rechecks = attempts() - before;
    let seconds = at.elapsed().as_secs_f64();
    println!("16 waiting clients: {rechecks} re-checks in {seconds:.1} s");
    // Each re-checking every period: 16 a second, 128 in 8 s. Spread by their place in line
    // (1, 1/2, ... 1/7 of a period, then 1/8): under 4 a second.
    assert!(
        (rechecks as f64) < 8.0 * seconds,
        "{rechecks} re-checks in {seconds:.1} s from 16 waiting clients"
    );
    // The holder dies: no release announces it; the first in line re-checks at the end of
    // the lease, takes the lock, and each release names the next.
    std::mem::forget(g);
    drop(holder);
    let mut tokens: Vec<u64> = waiters
        .into_iter()
        .map(|w| within(LIMIT, move || w.join().unwrap()).unwrap())
        .collect();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), 16, "every waiting client got the lock once");
}
