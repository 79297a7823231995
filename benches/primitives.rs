//! The other primitives under load.
//!
//! 1. `RwLock` beside `Mutex` on the same load: 4 processes x 4 threads, 95% of the holds
//!    reads and 5% writes (a `Mutex` takes every hold exclusively), each hold 200 µs of
//!    waiting on I/O; holds per second, in alternating rounds.
//! 2. `Semaphore`: round trips per acquire and per release, from Redis's own count of the
//!    script calls (`EVALSHA`) one thread's cycles cost.
//! 3. `Election`, with a 2 s lease: how long a resignation takes to hand over (from the
//!    `resign` call to the return of a waiting candidate's `campaign`, in another client),
//!    and how long after a SIGKILL of the leader's process another leads.
//!
//! `cargo bench --bench primitives` measures and writes `target/bench-results/primitives.json`.
//! Run by `cargo test --benches`, it does a short smoke run instead.

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{spread, Json};
use redmutex::Client;
use support::RedisServer;

const PROCESSES: usize = 4;
const THREADS: usize = 4;
/// How long each hold lasts (sleeping, as for I/O).
const HOLD: Duration = Duration::from_micros(200);

/// A worker process: `THREADS` threads hold the lock for `run`, 95% of the holds reads;
/// prints how many holds it made.
fn worker(args: &[String]) {
    let (url, kind) = (&args[0], args[1].as_str());
    let run = Duration::from_millis(args[2].parse().expect("run ms"));
    let client = Client::open(url.as_str()).expect("client");
    let start = Instant::now();
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let client = client.clone();
            let kind = kind.to_owned();
            std::thread::spawn(move || {
                let mut holds = 0u64;
                let mut rng = fastrand::Rng::with_seed(t as u64);
                while start.elapsed() < run {
                    let write = rng.u32(0..100) < 5;
                    match (kind.as_str(), write) {
                        ("rwlock", false) => {
                            let g = client.rwlock("shared").read().expect("read");
                            std::thread::sleep(HOLD);
                            g.unlock().expect("unlock");
                        }
                        ("rwlock", true) => {
                            let g = client.rwlock("shared").write().expect("write");
                            std::thread::sleep(HOLD);
                            g.unlock().expect("unlock");
                        }
                        _ => {
                            let g = client.mutex("shared").lock().expect("lock");
                            std::thread::sleep(HOLD);
                            g.unlock().expect("unlock");
                        }
                    }
                    holds += 1;
                }
                holds
            })
        })
        .collect();
    let holds: u64 = threads.into_iter().map(|t| t.join().expect("thread")).sum();
    println!("HOLDS {holds}");
}

/// Holds per second of all the worker processes with `kind` ("rwlock" or "mutex").
fn round(server: &RedisServer, kind: &str, run: Duration) -> f64 {
    let exe = std::env::current_exe().expect("bench binary");
    let started = Instant::now();
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            Command::new(&exe)
                .arg("worker")
                .arg(server.url())
                .arg(kind)
                .arg(run.as_millis().to_string())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn worker")
        })
        .collect();
    let mut holds = 0u64;
    for mut child in children {
        let stdout = child.stdout.take().expect("stdout");
        for line in BufReader::new(stdout).lines() {
            let line = line.expect("worker output");
            if let Some(n) = line.strip_prefix("HOLDS ") {
                holds += n.trim().parse::<u64>().expect("number");
            }
        }
        assert!(child.wait().expect("wait").success(), "a worker failed");
    }
    holds as f64 / started.elapsed().as_secs_f64()
}

/// Script calls (`EVALSHA`) Redis ran so far.
fn script_calls(server: &RedisServer) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut server.conn())
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix("cmdstat_evalsha:calls="))
        .and_then(|rest| rest.split(',').next()?.parse().ok())
        .unwrap_or(0)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("worker") {
        return worker(&args[2..]);
    }
    if args.get(1).map(String::as_str) == Some("leader") {
        return leader(&args[2..]);
    }
    let measuring = common::measuring();
    let (rounds, run) = if measuring {
        (5, Duration::from_secs(3))
    } else {
        (1, Duration::from_millis(200))
    };
    let server = RedisServer::start();
    let mut json = Json::default();
    json.text("benchmark", "primitives");

    // 1. RwLock beside Mutex, 95% reads, alternating rounds.
    let (mut rw, mut mx, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let r = round(&server, "rwlock", run);
        let m = round(&server, "mutex", run);
        rw.push(r);
        mx.push(m);
        ratios.push(r / m);
    }
    let (rw, mx, ratio) = (spread(rw), spread(mx), spread(ratios));
    println!(
        "{PROCESSES} processes x {THREADS} threads, 95% reads, holds of {HOLD:?}, {rounds} rounds of {run:?}"
    );
    common::print_rate("RwLock holds", rw);
    common::print_rate("Mutex holds", mx);
    common::print_ratio("RwLock / Mutex", ratio);
    json.spread("rwlock_holds_per_sec", rw)
        .spread("mutex_holds_per_sec", mx)
        .spread("rwlock_to_mutex", ratio);

    // 2. Semaphore round trips, uncontended.
    let client = Client::open(server.url()).expect("client");
    let sem = client.semaphore("permits", 4);
    drop(sem.acquire().expect("warm up"));
    let cycles = if measuring { 5000 } else { 200 };
    let before = script_calls(&server);
    let mut acquires = 0u64;
    for _ in 0..cycles {
        let permit = sem.acquire().expect("acquire");
        acquires += 1;
        permit.unlock().expect("release");
    }
    let calls = script_calls(&server) - before;
    let per_cycle = calls as f64 / acquires as f64;
    println!("  Semaphore acquire + release: {per_cycle:.2} script calls (round trips) per cycle");
    json.num("semaphore_round_trips_per_cycle", per_cycle);

    // 3. Election: hand-over at a resignation, and after the leader's process is killed.
    let (resigns, kills) = if measuring { (30, 5) } else { (2, 1) };
    let handover = spread(resign_handovers(&server, resigns));
    let replaced = spread(kill_replacements(&server, kills));
    println!(
        "Election, lease {} ms: {resigns} resignations, {kills} leaders killed",
        ELECTION_LEASE.as_millis()
    );
    println!(
        "  resignation to the next leader {:>8.1} ms  [{:.1} .. {:.1}]",
        handover.median, handover.min, handover.max
    );
    println!(
        "  SIGKILL to the next leader    {:>8.0} ms  [{:.0} .. {:.0}]",
        replaced.median, replaced.min, replaced.max
    );
    json.num("election_lease_ms", ELECTION_LEASE.as_millis() as f64)
        .spread("election_resign_handover_ms", handover)
        .spread("election_kill_replaced_ms", replaced);
    common::write_results("primitives", &json);
}

/// The lease of the election's leaders and candidates.
const ELECTION_LEASE: Duration = Duration::from_secs(2);

fn election_client(server_url: &str) -> Client {
    Client::builder()
        .default_lease(ELECTION_LEASE)
        .open(server_url)
        .expect("client")
}

/// A leader process: campaigns for `args[1]` on `args[0]`, prints `LEADING`, and leads until
/// it is killed.
fn leader(args: &[String]) {
    let client = election_client(&args[0]);
    let leadership = client
        .election(&args[1])
        .campaign("bench")
        .expect("campaign");
    println!("LEADING {}", leadership.term());
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

/// A candidate of a client for an election, campaigning on a thread; once elected, it
/// resigns.
struct Candidate {
    elected: std::sync::mpsc::Receiver<Instant>,
    thread: std::thread::JoinHandle<()>,
}

impl Candidate {
    fn start(client: &Client, name: &str) -> Candidate {
        let (tx, elected) = std::sync::mpsc::channel();
        let election = client.election(name);
        let thread = std::thread::spawn(move || {
            let leadership = election.campaign("candidate").expect("campaign");
            let _ = tx.send(Instant::now());
            leadership.resign().expect("resign");
        });
        Candidate { elected, thread }
    }

    /// Milliseconds from `since` until the candidate's campaign returned; waits until it has
    /// resigned again.
    fn elected_after(self, since: Instant, limit: Duration) -> f64 {
        let at = self
            .elected
            .recv_timeout(limit)
            .expect("the candidate leads");
        self.thread.join().expect("the candidate resigns");
        at.duration_since(since).as_secs_f64() * 1000.0
    }
}

/// Waits until `client` has a contended wait under way (its candidate waits for the lock).
fn waits(client: &Client) {
    let started = Instant::now();
    while client.stats().contended == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "no candidate waits"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Milliseconds from a leader's `resign` to the return of another client's `campaign`.
fn resign_handovers(server: &RedisServer, rounds: usize) -> Vec<f64> {
    let leaders = election_client(&server.url());
    (0..rounds)
        .map(|_| {
            let candidates = election_client(&server.url());
            let leadership = leaders
                .election("handover")
                .campaign("leader")
                .expect("lead");
            let candidate = Candidate::start(&candidates, "handover");
            waits(&candidates);
            // The candidate attempted and sleeps until it is named.
            std::thread::sleep(Duration::from_millis(20));
            let resigned = Instant::now();
            leadership.resign().expect("resign");
            candidate.elected_after(resigned, Duration::from_secs(30))
        })
        .collect()
}

/// Milliseconds from a SIGKILL of the leader's process to the return of a waiting
/// candidate's `campaign`.
fn kill_replacements(server: &RedisServer, rounds: usize) -> Vec<f64> {
    let exe = std::env::current_exe().expect("bench binary");
    (0..rounds)
        .map(|round| {
            let name = format!("killed-{round}");
            let mut child = Command::new(&exe)
                .arg("leader")
                .arg(server.url())
                .arg(&name)
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn a leader");
            let stdout = child.stdout.take().expect("stdout");
            let mut lines = BufReader::new(stdout).lines();
            let leading = lines.next().and_then(|l| l.ok()).unwrap_or_default();
            assert!(
                leading.starts_with("LEADING"),
                "the leader said {leading:?}"
            );
            let candidates = election_client(&server.url());
            let candidate = Candidate::start(&candidates, &name);
            waits(&candidates);
            std::thread::sleep(Duration::from_millis(200));
            let killed = Instant::now();
            child.kill().expect("SIGKILL the leader");
            let _ = child.wait();
            candidate.elected_after(killed, Duration::from_secs(60))
        })
        .collect()
}
