//! Contended hand-off across processes, and idle waiters.
//!
//! 1. Hand-off: 4 processes x 4 threads take one lock in a loop, each holding it briefly, for
//!    `Mutex` and for `FairMutex`. Reports hand-offs per second, the hand-off latency (from the
//!    middle of a holder's release call, when the lock becomes free in Redis, to the return of
//!    the next holder's acquire, p50/p99), the wait of each acquire (p50/p99), Redis commands
//!    per acquisition (those clients sent, and all Redis ran, script internals included, from
//!    `INFO commandstats`) and Jain's fairness index over the acquisitions per thread; beside
//!    a raw PING round trip measured in the same run.
//! 2. Idle waiters: Redis commands per second (script internals included) and script calls
//!    per second while waiters wait for a held lock: 100 threads of one process on a `Mutex`,
//!    the same on a `FairMutex`, 10 processes x 10 threads and 64 processes x 1 thread on a
//!    `Mutex`. Counted in the steady state: from a re-check period (10 s) after the waiters
//!    began, when each has re-checked once and knows how far back it waits, over 12 s for one
//!    process and 80 s (the longest re-check period, 8 of them) for many.
//! 3. Beside redis-py: N processes x T threads take one lock in a loop with an empty critical
//!    section (4 x 2, then 4 x 1), with a `Mutex`, a `FairMutex` and redis-py's `Lock` on its
//!    defaults (blocking `acquire`, polling every 0.1 s), interleaved within each round. Reports
//!    hand-offs per second, the wait of each acquire (p50/p99/p99.9), Redis commands per
//!    acquisition and the reads Redis made from client sockets per acquisition (one per round
//!    trip), the CPU time of the client processes and of Redis per acquisition, Jain's
//!    fairness index over the threads, and the share of hand-offs whose next holder runs in
//!    the same process as the previous one.
//!
//! 4. Contention as it grows: 1, 2, 4, 8 and 16 processes x 4 threads take one `Mutex` in a
//!    loop with an empty critical section, beside 4 x 2 in the same rounds (interleaved; 4 x 2
//!    and 16 x 4 back to back). Reports hand-offs per second, the wait of each acquire
//!    (p50/p99/p99.9), Jain's index over the threads and over the processes, the ratio of
//!    16 x 4 to 4 x 2 within each round, and the share of the machine's CPU time that other
//!    guests of the host took while those two ran.
//! 5. Over a network: the 4 x 1 shape of section 3, and 2 x 1 (two processes taking turns),
//!    with a `Mutex` and a `FairMutex`, their clients reaching Redis through a proxy that
//!    delays every byte 250 us each way, beside its floor: a bare token in a Redis list,
//!    taken with `BLPOP` and given back with `LPUSH` by the same processes through the same
//!    proxy (two one-way messages per hand-off and no lock's work), interleaved within each
//!    round. Reports the figures of section 3 and the `Mutex`'s hand-offs per second against
//!    each other's within each round.
//!
//! `cargo bench --bench contended` measures and writes
//! `target/bench-results/contended.json`; `cargo test --benches` runs a short smoke version.
//! `BENCH_SECTIONS` (a comma-separated list of `handoff`, `idle`, `peers`, `growth` and `network`) runs only those
//! sections; their figures then replace their own keys in an existing `contended.json`, and
//! the others are kept. `BENCH_GROWTH_THREADS` sets the threads per process of the growth
//! section (4), to tell what grows with the processes from what grows with their threads.
//! `BENCH_ROUNDS` sets the rounds of every section (3), for a figure whose rounds spread
//! widely on a busy host.

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::latency::LatencyProxy;
use redmutex::Client;
use support::RedisServer;

/// Who takes the lock in a hand-off run.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Contender {
    Mutex,
    FairMutex,
    /// redis-py's `Lock` on its defaults, in Python processes.
    RedisPy,
    /// No lock: one token in a Redis list, taken with `BLPOP` and given back with `LPUSH`, the
    /// fewest messages a hand-off through Redis can cost (one one-way message to Redis, one
    /// from it), with none of a lock's safety: the floor of a shape.
    Token,
}

impl Contender {
    const ALL: [Contender; 3] = [Contender::Mutex, Contender::FairMutex, Contender::RedisPy];

    fn key(self) -> &'static str {
        match self {
            Contender::Mutex => "mutex",
            Contender::FairMutex => "fair_mutex",
            Contender::RedisPy => "redis_py",
            Contender::Token => "token",
        }
    }

    /// What the name of the lock this contender takes in a shape ends with.
    fn lock_suffix(self) -> &'static str {
        match self {
            Contender::Mutex => "",
            Contender::FairMutex => "-fair",
            Contender::RedisPy => "-py",
            Contender::Token => "-token",
        }
    }

    fn label(self) -> &'static str {
        match self {
            Contender::Mutex => "Mutex",
            Contender::FairMutex => "FairMutex",
            Contender::RedisPy => "redis-py",
            Contender::Token => "bare token",
        }
    }
}

/// One hand-off run: `processes` x `threads` take the lock `name` in a loop for `run`, each
/// holding it for `hold` (none: an empty critical section).
struct Workload<'a> {
    name: &'a str,
    hold: Duration,
    processes: usize,
    threads: usize,
    run: Duration,
}

struct Mode {
    processes: usize,
    threads: usize,
    run: Duration,
    rounds: usize,
    idle_waiters: usize,
    idle_hold: Duration,
    /// Processes x threads of the idle case across processes.
    idle_processes: usize,
    idle_threads: usize,
    /// How long that case is measured: two re-check periods of the default settings.
    idle_processes_hold: Duration,
    /// How long waiters wait before the count starts (past their first re-check).
    idle_settle: Duration,
    /// Processes of one waiting thread each, in the idle case of many processes.
    idle_many_processes: usize,
    /// Processes x threads of the runs beside redis-py.
    peer_shapes: [(usize, usize); 2],
    /// Processes x threads of the runs over a network.
    network_shapes: &'static [(usize, usize)],
    /// The numbers of processes of the growth section, their threads each, and the shape it
    /// is compared with.
    growth_processes: &'static [usize],
    growth_threads: usize,
    growth_reference: (usize, usize),
    /// How long each of those runs is measured.
    peer_run: Duration,
    measuring: bool,
}

fn env_or(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn mode() -> Mode {
    let mode = mode_defaults();
    Mode {
        processes: env_or("BENCH_PROCESSES", mode.processes),
        threads: env_or("BENCH_THREADS", mode.threads),
        growth_threads: env_or("BENCH_GROWTH_THREADS", mode.growth_threads),
        rounds: env_or("BENCH_ROUNDS", mode.rounds),
        ..mode
    }
}

fn mode_defaults() -> Mode {
    if common::measuring() {
        Mode {
            processes: 4,
            threads: 4,
            run: Duration::from_secs(5),
            rounds: 3,
            idle_waiters: 100,
            idle_hold: Duration::from_secs(12),
            idle_processes: 10,
            idle_threads: 10,
            idle_processes_hold: Duration::from_secs(80),
            idle_settle: Duration::from_secs(11),
            idle_many_processes: 64,
            peer_shapes: [(4, 2), (4, 1)],
            network_shapes: &[(4, 1), (2, 1)],
            growth_processes: &[1, 2, 4, 8, 16],
            growth_threads: 4,
            growth_reference: (4, 2),
            peer_run: Duration::from_secs(4),
            measuring: true,
        }
    } else {
        Mode {
            processes: 2,
            threads: 2,
            run: Duration::from_millis(500),
            rounds: 1,
            idle_waiters: 10,
            idle_hold: Duration::from_millis(500),
            idle_processes: 2,
            idle_threads: 2,
            idle_processes_hold: Duration::from_millis(500),
            idle_settle: Duration::ZERO,
            idle_many_processes: 4,
            peer_shapes: [(2, 2), (2, 1)],
            network_shapes: &[(2, 1)],
            growth_processes: &[1, 2],
            growth_threads: 2,
            growth_reference: (2, 1),
            peer_run: Duration::from_millis(300),
            measuring: false,
        }
    }
}

/// Wall-clock nanoseconds: comparable across the processes of one machine.
fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
}

/// How long each holder keeps the lock (sleeping, as for I/O).
const HOLD: Duration = Duration::from_micros(200);

/// How long a worker takes the lock before the measured run: long enough for its pool's
/// connections, its subscription and its client announcement (half a second after its first
/// lock) to be made, so that the run counts what acquisitions cost, not what starting costs.
const WARM_UP: Duration = Duration::from_millis(800);

/// What one thread of a worker takes: a lock of the crate, or the bare token.
enum Taker {
    Lock { client: Client, fair: bool },
    Token(redis::Connection),
}

/// How long a thread waits for the bare token before it gives up: a hand-off takes about a
/// millisecond even over the network.
const TOKEN_DEADLINE_S: f64 = 10.0;

impl Taker {
    /// Takes `name` once and holds it for `hold`; returns when it was asked for and
    /// acquired, and the middle of its release.
    fn take_once(&mut self, name: &str, hold: Duration) -> (u64, u64, u64) {
        let asked = now_ns();
        match self {
            Taker::Lock { client, fair } => {
                let guard = if *fair {
                    client.fair_mutex(name).lock()
                } else {
                    client.mutex(name).lock()
                }
                .expect("lock");
                let acquired = now_ns();
                let release_start = held(hold);
                guard.unlock().expect("unlock");
                (asked, acquired, released(release_start))
            }
            Taker::Token(conn) => {
                let popped: Option<(String, String)> = redis::cmd("BLPOP")
                    .arg(name)
                    .arg(TOKEN_DEADLINE_S)
                    .query(conn)
                    .expect("take the token");
                let (_, token) = popped.expect("the token came back within its deadline");
                let acquired = now_ns();
                let release_start = held(hold);
                let _: () = redis::cmd("LPUSH")
                    .arg(name)
                    .arg(token)
                    .query(conn)
                    .expect("give the token back");
                (asked, acquired, released(release_start))
            }
        }
    }
}

/// Holds for `hold`, then returns when the release starts.
fn held(hold: Duration) -> u64 {
    // A brief critical section that waits on I/O, as most do: it leaves the CPU to others (a
    // busy loop here would measure the 2-core machine). None at all for an empty one.
    if !hold.is_zero() {
        std::thread::sleep(hold);
    }
    now_ns()
}

/// The middle of a release call that started at `release_start` and has just returned: when
/// the lock became free in Redis.
fn released(release_start: u64) -> u64 {
    release_start + (now_ns() - release_start) / 2
}

/// A worker process (arguments: URL, `fair`, `plain` or `token`, threads, run in ms, worker
/// id, lock name, hold in us): `threads` threads take the lock for the warm-up, then the
/// process prints `READY` and waits for a line on its input; then the threads take the lock
/// until `run` is over, and the process prints one line per acquisition: `EV <thread>
/// <asked_ns> <acquired_ns> <released_ns>`, then (for a lock of the crate) the client's
/// acquire attempts and acquisitions during the run, and of those the locks handed over by a
/// release or passed on within the client, both without an attempt: `ST <attempts>
/// <acquisitions> <without an attempt>`, its CPU time during the run in seconds (`CPU
/// <seconds>`), then `END`; it exits when its input closes.
fn worker(args: &[String]) {
    let url = &args[0];
    let kind = args[1].as_str();
    let threads: usize = args[2].parse().expect("threads");
    let run = Duration::from_millis(args[3].parse().expect("run ms"));
    let id: usize = args[4].parse().expect("worker id");
    let name: Arc<str> = Arc::from(args[5].as_str());
    let hold = Duration::from_micros(args[6].parse().expect("hold us"));
    let client = (kind != "token").then(|| Client::open(url.as_str()).expect("client"));
    let (warmed, go) = (
        Arc::new(Barrier::new(threads + 1)),
        Arc::new(Barrier::new(threads + 1)),
    );
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let mut taker = match &client {
                Some(client) => Taker::Lock {
                    client: client.clone(),
                    fair: kind == "fair",
                },
                None => Taker::Token(
                    redis::Client::open(url.as_str())
                        .and_then(|c| c.get_connection())
                        .expect("a connection for the token"),
                ),
            };
            let (warmed, go) = (Arc::clone(&warmed), Arc::clone(&go));
            let name = Arc::clone(&name);
            std::thread::spawn(move || {
                let warm_up = Instant::now();
                while warm_up.elapsed() < WARM_UP {
                    taker.take_once(&name, hold);
                }
                warmed.wait();
                go.wait();
                let start = Instant::now();
                let mut events = Vec::new();
                while start.elapsed() < run {
                    events.push(taker.take_once(&name, hold));
                }
                (t, events)
            })
        })
        .collect();
    warmed.wait();
    let before = client.as_ref().map(Client::stats);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let _ = writeln!(out, "READY");
    let _ = out.flush();
    let mut line = String::new();
    let stdin = std::io::stdin();
    let _ = stdin.read_line(&mut line);
    go.wait();
    let cpu = common::cpu_seconds();
    let mut runs = Vec::new();
    for h in handles {
        runs.push(h.join().expect("worker thread"));
    }
    let cpu = common::cpu_seconds() - cpu;
    for (t, events) in runs {
        for (asked, acquired, released) in events {
            let _ = writeln!(out, "EV {} {asked} {acquired} {released}", id * 1000 + t);
        }
    }
    if let (Some(client), Some(before)) = (&client, before) {
        let stats = client.stats();
        let _ = writeln!(
            out,
            "ST {} {} {}",
            stats.attempts - before.attempts,
            stats.acquisitions - before.acquisitions,
            (stats.handed_over + stats.passed_on) - (before.handed_over + before.passed_on)
        );
    }
    let _ = writeln!(out, "CPU {cpu}");
    let _ = writeln!(out, "END");
    let _ = out.flush();
    // Stay connected until the parent counted the commands.
    let _ = std::io::copy(&mut stdin.lock(), &mut std::io::sink());
}

/// A redis-py worker process, with the arguments and output of [`worker`] (no `ST` line): each
/// thread has its own `Lock` from `r.lock(name)`, on redis-py's defaults (no lease, a blocking
/// `acquire` that tries `SET NX` every 0.1 s), and its last argument is the warm-up in seconds.
const PY_WORKER: &str = r#"
import os, sys, threading, time
import redis

url, threads, run = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]) / 1e3
wid, name, hold, warm_up = int(sys.argv[4]), sys.argv[5], int(sys.argv[6]) / 1e6, float(sys.argv[7])

def die(args):
    sys.__excepthook__(args.exc_type, args.exc_value, args.exc_traceback)
    os._exit(1)

threading.excepthook = die
r = redis.Redis.from_url(url)
warmed, go = threading.Barrier(threads + 1), threading.Barrier(threads + 1)
events = [[] for _ in range(threads)]

def take_once(lock):
    asked = time.time_ns()
    lock.acquire()
    acquired = time.time_ns()
    if hold > 0:
        time.sleep(hold)
    release_start = time.time_ns()
    lock.release()
    return asked, acquired, release_start + (time.time_ns() - release_start) // 2

def body(t):
    lock = r.lock(name)
    start = time.monotonic()
    while time.monotonic() - start < warm_up:
        take_once(lock)
    warmed.wait()
    go.wait()
    start = time.monotonic()
    while time.monotonic() - start < run:
        events[t].append(take_once(lock))

handles = [threading.Thread(target=body, args=(t,)) for t in range(threads)]
for h in handles:
    h.start()
warmed.wait()
print("READY", flush=True)
sys.stdin.readline()
go.wait()
cpu = time.process_time()
for h in handles:
    h.join()
cpu = time.process_time() - cpu
out = ["EV %d %d %d %d" % (wid * 1000 + t, *e) for t in range(threads) for e in events[t]]
out.append("CPU %f" % cpu)
out.append("END")
sys.stdout.write("\n".join(out) + "\n")
sys.stdout.flush()
# Stay connected until the parent counted the commands.
sys.stdin.read()
"#;

/// Commands that only the crate's scripts run in this benchmark: counting them apart tells
/// the commands clients sent (one per round trip) from those their scripts executed.
#[rustfmt::skip]
const SCRIPT_INTERNAL: &[&str] = &[
    "get", "set", "del", "incr", "pttl", "publish", "spublish", "time", "lindex", "lpop", "zscore",
    "zrem", "zadd", "rpush", "pexpire", "llen", "exists", "lrem", "type", "zpopmin", "zmscore",
    "pexpireat",
];

/// What Redis ran so far, from `INFO commandstats`.
#[derive(Clone, Copy)]
struct Counts {
    /// Every command, script internals included.
    all: u64,
    /// The commands clients sent (one per round trip).
    sent: u64,
    /// Script calls (`EVALSHA`).
    scripts: u64,
    /// `SET` calls: script internals for the crate, sent by redis-py (whose release script
    /// runs only `GET` and `DEL`).
    set: u64,
    /// Reads Redis made from client sockets (`total_reads_processed`): one per round trip,
    /// whatever a round trip carried.
    reads: u64,
}

fn command_counts(server: &RedisServer) -> Counts {
    let mut conn = server.conn();
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(&mut conn)
        .expect("INFO");
    let stats: String = redis::cmd("INFO")
        .arg("stats")
        .query(&mut conn)
        .expect("INFO");
    let mut counts = Counts {
        all: 0,
        sent: 0,
        scripts: 0,
        set: 0,
        reads: stats
            .lines()
            .find_map(|l| l.strip_prefix("total_reads_processed:"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0),
    };
    for line in info.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((name, stats)) = rest.split_once(':') else {
            continue;
        };
        let calls: u64 = stats
            .split(',')
            .find_map(|kv| kv.strip_prefix("calls="))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        counts.all += calls;
        if !SCRIPT_INTERNAL.contains(&name) {
            counts.sent += calls;
        }
        if name == "evalsha" {
            counts.scripts += calls;
        }
        if name == "set" {
            counts.set += calls;
        }
    }
    counts
}

/// The median PING round trip: back to back (`pause` zero), or after the client slept for
/// `pause`, as a lock's waiter does between announcements (the machine's CPUs then idle, and
/// waking them is part of every round trip).
fn ping_rtt(server: &RedisServer, pause: Duration) -> Duration {
    median_ping(&mut server.conn(), 2000, pause)
}

/// The median of `count` PING round trips on `conn`, each after a sleep of `pause` (if any).
fn median_ping(conn: &mut redis::Connection, count: usize, pause: Duration) -> Duration {
    let mut samples: Vec<Duration> = (0..count)
        .map(|_| {
            if !pause.is_zero() {
                std::thread::sleep(pause);
            }
            let t = Instant::now();
            let _: String = redis::cmd("PING").query(conn).expect("PING");
            t.elapsed()
        })
        .collect();
    samples.sort();
    samples[samples.len() / 2]
}

/// The floor of a hand-off announced by pub/sub, without any lock: after a pause of `pause`,
/// one client publishes (its call's middle starts the clock, as a release's does); another
/// connection's reader thread gets the message and wakes a waiting thread through a condition
/// variable, which stops the clock. The median over 2000 hand-offs: what any lock whose
/// waiters sleep until a subscriber thread wakes them pays at least, on this machine.
fn pubsub_floor(server: &RedisServer, pause: Duration) -> Duration {
    use std::sync::{Condvar, Mutex};
    let woken = Arc::new((Mutex::new(None::<Instant>), Condvar::new()));
    let mut subscriber = server.conn();
    let mut publisher = server.conn();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let reader = {
        let woken = Arc::clone(&woken);
        std::thread::spawn(move || {
            let mut pubsub = subscriber.as_pubsub();
            pubsub.subscribe("floor").expect("SUBSCRIBE");
            ready_tx.send(()).expect("ready");
            loop {
                let msg = pubsub.get_message().expect("message");
                let stop = msg.get_payload::<String>().is_ok_and(|p| p == "stop");
                let (slot, cv) = &*woken;
                *slot.lock().expect("slot") = Some(Instant::now());
                cv.notify_one();
                if stop {
                    return;
                }
            }
        })
    };
    ready_rx.recv().expect("subscribed");
    let (waiter_tx, waiter_rx) = std::sync::mpsc::channel::<Instant>();
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let waiter = {
        let woken = Arc::clone(&woken);
        std::thread::spawn(move || {
            while go_rx.recv().is_ok() {
                let (slot, cv) = &*woken;
                let mut guard = slot.lock().expect("slot");
                while guard.is_none() {
                    guard = cv.wait(guard).expect("wait");
                }
                *guard = None;
                waiter_tx.send(Instant::now()).expect("woken");
            }
        })
    };
    let mut samples: Vec<Duration> = (0..2000)
        .map(|_| {
            go_tx.send(()).expect("go");
            std::thread::sleep(pause);
            let start = Instant::now();
            let _: i64 = redis::cmd("PUBLISH")
                .arg("floor")
                .arg("x")
                .query(&mut publisher)
                .expect("PUBLISH");
            let released = start + start.elapsed() / 2;
            waiter_rx
                .recv()
                .expect("woken")
                .saturating_duration_since(released)
        })
        .collect();
    drop(go_tx);
    let _: i64 = redis::cmd("PUBLISH")
        .arg("floor")
        .arg("stop")
        .query(&mut publisher)
        .expect("PUBLISH");
    let _ = reader.join();
    let _ = waiter.join();
    samples.sort();
    samples[samples.len() / 2]
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((sorted.len() - 1) as f64 * p).round() as usize;
    sorted[i]
}

struct HandoffResult {
    handoffs_per_sec: f64,
    handoff_p50_us: f64,
    handoff_p99_us: f64,
    wait_p50_us: f64,
    wait_p99_us: f64,
    wait_p999_us: f64,
    commands_per_acquisition: f64,
    sent_per_acquisition: f64,
    /// Reads Redis made from client sockets (one per round trip), per acquisition.
    reads_per_acquisition: f64,
    /// CPU time per acquisition of the client processes and of Redis, in microseconds (the
    /// two cores are shared: on loopback their sum bounds the hand-offs per second).
    client_cpu_us: f64,
    redis_cpu_us: f64,
    jain: f64,
    /// Jain's index over the processes (acquisitions per process).
    jain_processes: f64,
    acquisitions: usize,
    /// Acquire attempts that did not take the lock, per acquisition.
    failed_attempts_per_acquisition: f64,
    /// The share of hand-offs (consecutive acquisitions) whose next holder runs in the same
    /// process as the previous one.
    local_share: f64,
}

fn handoff_round(
    server: &RedisServer,
    url: &str,
    load: &Workload,
    contender: Contender,
) -> HandoffResult {
    let exe = std::env::current_exe().expect("bench binary");
    if contender == Contender::Token {
        let mut conn = server.conn();
        let _: () = redis::pipe()
            .del(load.name)
            .rpush(load.name, "token")
            .ignore()
            .query(&mut conn)
            .expect("lay the token down");
    }
    let mut children: Vec<_> = (0..load.processes)
        .map(|id| {
            let mut command = match contender {
                Contender::RedisPy => {
                    let mut c = Command::new("python3");
                    c.arg("-c")
                        .arg(PY_WORKER)
                        .env("PYTHONPATH", support::python::redis_py());
                    c
                }
                Contender::Mutex | Contender::FairMutex | Contender::Token => {
                    let mut c = Command::new(&exe);
                    c.arg("worker");
                    c
                }
            };
            command.arg(url);
            match contender {
                Contender::Mutex => command.arg("plain"),
                Contender::FairMutex => command.arg("fair"),
                Contender::Token => command.arg("token"),
                Contender::RedisPy => &mut command,
            };
            command
                .arg(load.threads.to_string())
                .arg(load.run.as_millis().to_string())
                .arg(id.to_string())
                .arg(load.name)
                .arg(load.hold.as_micros().to_string());
            if contender == Contender::RedisPy {
                command.arg(WARM_UP.as_secs_f64().to_string());
            }
            command
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn worker")
        })
        .collect();
    // Every worker connected and took the lock: count from here.
    let mut outputs = common::ready_outputs(&mut children);
    let before = command_counts(server);
    let server_cpu = || {
        server
            .pid()
            .map_or(0.0, |p| common::process_cpu_seconds(&p.to_string()))
    };
    let redis_cpu_before = server_cpu();
    let started = Instant::now();
    for child in &mut children {
        let stdin = child.stdin.as_mut().expect("stdin");
        writeln!(stdin, "GO").expect("start a worker");
        stdin.flush().expect("start a worker");
    }
    let mut events: Vec<(usize, u64, u64, u64)> = Vec::new();
    let (mut attempts, mut acquired, mut handed) = (0u64, 0u64, 0u64);
    let mut client_cpu = 0.0;
    for lines in &mut outputs {
        for line in lines.by_ref() {
            let line = line.expect("worker output");
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() == 5 && f[0] == "EV" {
                let n = |i: usize| f[i].parse::<u64>().expect("number");
                events.push((n(1) as usize, n(2), n(3), n(4)));
            }
            if f.len() == 4 && f[0] == "ST" {
                attempts += f[1].parse::<u64>().expect("attempts");
                acquired += f[2].parse::<u64>().expect("acquisitions");
                handed += f[3].parse::<u64>().expect("handed over");
            }
            if f.len() == 2 && f[0] == "CPU" {
                client_cpu += f[1].parse::<f64>().expect("CPU seconds");
            }
            if f.first() == Some(&"END") {
                break;
            }
        }
    }
    let elapsed = started.elapsed();
    let redis_cpu = server_cpu() - redis_cpu_before;
    let after = command_counts(server);
    let mut sent = after.sent - before.sent;
    if contender == Contender::RedisPy {
        // redis-py sends its `SET NX` itself; its release script runs no `SET`.
        sent += after.set - before.set;
    }
    let (commands, reads) = (after.all - before.all, after.reads - before.reads);
    for mut child in children {
        drop(child.stdin.take());
        assert!(child.wait().expect("wait").success(), "a worker failed");
    }

    events.sort_by_key(|e| e.2);
    let mut handoffs: Vec<u64> = events
        .windows(2)
        .filter(|w| w[1].2 >= w[0].3)
        .map(|w| w[1].2 - w[0].3)
        .collect();
    handoffs.sort_unstable();
    // Thread ids are `worker id * 1000 + thread`.
    let local = events
        .windows(2)
        .filter(|w| w[0].0 / 1000 == w[1].0 / 1000)
        .count();
    let mut waits: Vec<u64> = events.iter().map(|e| e.2.saturating_sub(e.1)).collect();
    waits.sort_unstable();
    let mut per_thread = std::collections::BTreeMap::<usize, f64>::new();
    let mut per_process = std::collections::BTreeMap::<usize, f64>::new();
    for e in &events {
        *per_thread.entry(e.0).or_default() += 1.0;
        *per_process.entry(e.0 / 1000).or_default() += 1.0;
    }
    // Threads (processes) that never took the lock count as zeroes.
    let n = (load.processes * load.threads) as f64;
    let sum: f64 = per_thread.values().sum();
    let sum_sq: f64 = per_thread.values().map(|x| x * x).sum();
    let process_sum_sq: f64 = per_process.values().map(|x| x * x).sum();
    let per_acquisition = |count: u64| count as f64 / events.len().max(1) as f64;
    HandoffResult {
        handoffs_per_sec: events.len() as f64 / elapsed.as_secs_f64(),
        handoff_p50_us: percentile(&handoffs, 0.5) as f64 / 1000.0,
        handoff_p99_us: percentile(&handoffs, 0.99) as f64 / 1000.0,
        wait_p50_us: percentile(&waits, 0.5) as f64 / 1000.0,
        wait_p99_us: percentile(&waits, 0.99) as f64 / 1000.0,
        wait_p999_us: percentile(&waits, 0.999) as f64 / 1000.0,
        commands_per_acquisition: per_acquisition(commands),
        sent_per_acquisition: per_acquisition(sent),
        reads_per_acquisition: per_acquisition(reads),
        client_cpu_us: client_cpu * 1e6 / events.len().max(1) as f64,
        redis_cpu_us: redis_cpu * 1e6 / events.len().max(1) as f64,
        jain: if sum_sq > 0.0 {
            sum * sum / (n * sum_sq)
        } else {
            0.0
        },
        jain_processes: if process_sum_sq > 0.0 {
            sum * sum / (load.processes as f64 * process_sum_sq)
        } else {
            0.0
        },
        acquisitions: events.len(),
        // An acquisition handed over by a release, or passed on within its client, took no
        // attempt of its own.
        failed_attempts_per_acquisition: attempts.saturating_sub(acquired - handed) as f64
            / acquired.max(1) as f64,
        local_share: local as f64 / events.len().saturating_sub(1).max(1) as f64,
    }
}

/// Redis commands and script calls per second over `window`.
struct IdleCost {
    commands_per_sec: f64,
    scripts_per_sec: f64,
}

fn idle_cost(server: &RedisServer, window: Duration) -> IdleCost {
    let before = command_counts(server);
    let t = Instant::now();
    std::thread::sleep(window);
    let after = command_counts(server);
    let secs = t.elapsed().as_secs_f64();
    IdleCost {
        commands_per_sec: (after.all - before.all) as f64 / secs,
        scripts_per_sec: (after.scripts - before.scripts) as f64 / secs,
    }
}

/// `mode.idle_waiters` threads of one process wait for a held `Mutex` or `FairMutex`.
fn idle_waiters(server: &RedisServer, mode: &Mode, fair: bool) -> IdleCost {
    let holder = Client::open(server.url()).expect("client");
    let client = Client::open(server.url()).expect("client");
    let lock = move |c: &Client| {
        if fair {
            c.fair_mutex("idle").lock()
        } else {
            c.mutex("idle").lock()
        }
    };
    let guard = lock(&holder).expect("hold");
    let start = Arc::new(Barrier::new(mode.idle_waiters + 1));
    let waiters: Vec<_> = (0..mode.idle_waiters)
        .map(|_| {
            let (c, start) = (client.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                lock(&c).map(drop)
            })
        })
        .collect();
    start.wait();
    // Let every waiter make its first attempt and settle.
    let settle = Instant::now();
    while client.stats().contended < mode.idle_waiters as u64
        && settle.elapsed() < Duration::from_secs(30)
    {
        std::thread::sleep(Duration::from_millis(10));
    }
    std::thread::sleep(Duration::from_millis(200) + mode.idle_settle);
    let cost = idle_cost(server, mode.idle_hold);
    drop(guard);
    for w in waiters {
        w.join().expect("waiter").expect("lock");
    }
    cost
}

/// An idle-waiter process: `threads` threads wait for the lock `idle`; prints `WAITING` once
/// they all found it held.
fn idle_worker(args: &[String]) {
    let client = Client::open(args[0].as_str()).expect("client");
    let threads: usize = args[1].parse().expect("threads");
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let c = client.clone();
            std::thread::spawn(move || c.mutex("idle").lock().map(drop))
        })
        .collect();
    while client.stats().contended < threads as u64 {
        std::thread::sleep(Duration::from_millis(10));
    }
    println!("WAITING");
    for h in handles {
        h.join().expect("waiter").expect("lock");
    }
}

/// `processes` processes of `threads` threads wait for a held `Mutex`, counted over `hold`
/// from `settle` after they all began.
fn idle_processes(
    server: &RedisServer,
    (processes, threads): (usize, usize),
    (settle, hold): (Duration, Duration),
) -> IdleCost {
    let holder = Client::open(server.url()).expect("client");
    let guard = holder.mutex("idle").lock().expect("hold");
    let exe = std::env::current_exe().expect("bench binary");
    let mut children: Vec<_> = (0..processes)
        .map(|_| {
            Command::new(&exe)
                .arg("idle-worker")
                .arg(server.url())
                .arg(threads.to_string())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn idle worker")
        })
        .collect();
    for child in &mut children {
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let waiting = lines.any(|l| l.is_ok_and(|l| l.contains("WAITING")));
        assert!(waiting, "an idle worker ended early");
        std::thread::spawn(move || lines.for_each(drop));
    }
    std::thread::sleep(Duration::from_millis(200) + settle);
    let cost = idle_cost(server, hold);
    drop(guard);
    for mut child in children {
        assert!(
            child.wait().expect("wait").success(),
            "an idle worker failed"
        );
    }
    cost
}

fn median(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// The sections to run, from `BENCH_SECTIONS` (all when it is not set).
struct Sections {
    handoff: bool,
    idle: bool,
    peers: bool,
    growth: bool,
    network: bool,
}

impl Sections {
    fn all(&self) -> bool {
        self.handoff && self.idle && self.peers && self.growth && self.network
    }
}

fn sections() -> Sections {
    let Ok(list) = std::env::var("BENCH_SECTIONS") else {
        return Sections {
            handoff: true,
            idle: true,
            peers: true,
            growth: true,
            network: true,
        };
    };
    let names: Vec<&str> = list
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .collect();
    for name in &names {
        assert!(
            ["handoff", "idle", "peers", "growth", "network"].contains(name),
            "BENCH_SECTIONS: unknown section {name:?} (handoff, idle, peers, growth, network)"
        );
    }
    Sections {
        handoff: names.contains(&"handoff"),
        idle: names.contains(&"idle"),
        peers: names.contains(&"peers"),
        growth: names.contains(&"growth"),
        network: names.contains(&"network"),
    }
}

/// The top-level entries of a `contended.json` this benchmark wrote: each starts on a line
/// indented by two spaces with its key; deeper lines continue it.
fn json_entries(text: &str) -> Vec<(String, String)> {
    let mut entries: Vec<(String, String)> = Vec::new();
    for line in text.lines() {
        if line == "{" || line == "}" {
            continue;
        }
        match line.strip_prefix("  \"").and_then(|l| l.split_once("\": ")) {
            Some((key, value)) => entries.push((key.to_owned(), value.to_owned())),
            None => {
                if let Some((_, value)) = entries.last_mut() {
                    value.push('\n');
                    value.push_str(line);
                }
            }
        }
    }
    for (_, value) in &mut entries {
        let trimmed = value.trim_end();
        *value = trimmed.strip_suffix(',').unwrap_or(trimmed).to_owned();
    }
    entries
}

fn json_text(entries: &[(String, String)]) -> String {
    let body: Vec<String> = entries
        .iter()
        .map(|(key, value)| format!("  \"{key}\": {value}"))
        .collect();
    format!("{{\n{}\n}}\n", body.join(",\n"))
}

/// Section 1: the hand-off of a lock held 200 us, `Mutex` and `FairMutex`.
fn handoff_section(server: &RedisServer, mode: &Mode, json: &mut Vec<(String, String)>) {
    let hot_rtt_us = ping_rtt(server, Duration::ZERO).as_secs_f64() * 1e6;
    let rtt_us = ping_rtt(server, HOLD).as_secs_f64() * 1e6;
    let floor = || pubsub_floor(server, HOLD).as_secs_f64() * 1e6;
    let first_floor_us = floor();
    // Each `FairMutex` round is set against a floor measured just before it, as every other
    // ratio of the benchmarks is taken within its round: the machine's wake-ups drift over
    // the tens of seconds between a floor measured once and the last round.
    let mut fair_floors_us = Vec::new();
    println!(
        "contended hand-off: {} processes x {} threads, hold {:?}, {} rounds of {:?}; \
         PING round trip {rtt_us:.1} us after a {HOLD:?} pause ({hot_rtt_us:.1} us back to back); \
         pub/sub wake-up floor {first_floor_us:.1} us ({:.2} round trips)",
        mode.processes,
        mode.threads,
        HOLD,
        mode.rounds,
        mode.run,
        first_floor_us / rtt_us
    );
    for (key, value) in [
        ("processes", mode.processes.to_string()),
        ("threads", mode.threads.to_string()),
        ("hold_us", HOLD.as_micros().to_string()),
        ("rounds", mode.rounds.to_string()),
        ("ping_rtt_us", format!("{rtt_us:.2}")),
        ("ping_rtt_back_to_back_us", format!("{hot_rtt_us:.2}")),
    ] {
        json.push((key.to_owned(), value));
    }
    let load = Workload {
        name: "handoff",
        hold: HOLD,
        processes: mode.processes,
        threads: mode.threads,
        run: mode.run,
    };
    for contender in [Contender::Mutex, Contender::FairMutex] {
        let label = contender.label();
        let results: Vec<HandoffResult> = (0..mode.rounds)
            .map(|_| {
                if contender == Contender::FairMutex {
                    fair_floors_us.push(floor());
                }
                handoff_round(server, &server.url(), &load, contender)
            })
            .collect();
        let pick = |f: fn(&HandoffResult) -> f64| median(results.iter().map(f).collect());
        let rate = pick(|r| r.handoffs_per_sec);
        let h50 = pick(|r| r.handoff_p50_us);
        let h99 = pick(|r| r.handoff_p99_us);
        let w50 = pick(|r| r.wait_p50_us);
        let w99 = pick(|r| r.wait_p99_us);
        let cmds = pick(|r| r.commands_per_acquisition);
        let sent = pick(|r| r.sent_per_acquisition);
        let jain = pick(|r| r.jain);
        let failed = pick(|r| r.failed_attempts_per_acquisition);
        let total: usize = results.iter().map(|r| r.acquisitions).sum();
        // The hand-off against the floor measured just before its round (`FairMutex`).
        let to_floor = (contender == Contender::FairMutex).then(|| {
            let ratios = results.iter().zip(&fair_floors_us);
            median(ratios.map(|(r, floor)| r.handoff_p50_us / floor).collect())
        });
        println!("  {label}: {total} acquisitions");
        println!(
            "    hand-offs/s            {:>10.0}  [{:.0} .. {:.0}]",
            rate.0, rate.1, rate.2
        );
        println!(
            "    hand-off p50 / p99     {:>10.1} / {:.1} us  ({:.2} / {:.2} round trips)",
            h50.0,
            h99.0,
            h50.0 / rtt_us,
            h99.0 / rtt_us
        );
        println!(
            "    wait p50 / p99         {:>10.1} / {:.1} us",
            w50.0, w99.0
        );
        println!(
            "    commands sent / acq.   {:>10.2}  [{:.2} .. {:.2}]",
            sent.0, sent.1, sent.2
        );
        println!(
            "    commands run / acq.    {:>10.2}  (script internals included)",
            cmds.0
        );
        println!(
            "    failed attempts / acq. {:>10.2}  [{:.2} .. {:.2}]",
            failed.0, failed.1, failed.2
        );
        println!(
            "    Jain fairness index    {:>10.4}  [{:.4} .. {:.4}]",
            jain.0, jain.1, jain.2
        );
        let to_floor_json = match to_floor {
            Some((m, lo, hi)) => {
                println!("    hand-off p50 / floor   {m:>10.2}x [{lo:.2} .. {hi:.2}] (each round's own floor)");
                format!(
                    ", \"handoff_to_floor\": {{\"median\": {m:.4}, \"min\": {lo:.4}, \"max\": {hi:.4}}}"
                )
            }
            None => String::new(),
        };
        json.push((
            contender.key().to_owned(),
            format!(
                "{{\"handoffs_per_sec\": {:.1}, \"handoff_p50_us\": {:.2}, \
                 \"handoff_p99_us\": {:.2}, \"handoff_p50_round_trips\": {:.3}, \
                 \"wait_p50_us\": {:.2}, \"wait_p99_us\": {:.2}, \
                 \"commands_sent_per_acquisition\": {:.3}, \
                 \"commands_run_per_acquisition\": {:.3}, \"jain_index\": {:.5}, \
                 \"failed_attempts_per_acquisition\": {:.3}, \
                 \"handoffs_per_sec_min\": {:.1}, \"handoffs_per_sec_max\": {:.1}{}}}",
                rate.0,
                h50.0,
                h99.0,
                h50.0 / rtt_us,
                w50.0,
                w99.0,
                sent.0,
                cmds.0,
                jain.0,
                failed.0,
                rate.1,
                rate.2,
                to_floor_json
            ),
        ));
    }
    // The floor: the median of those measured in the section (once before it, then before
    // each `FairMutex` round).
    fair_floors_us.push(first_floor_us);
    let (floor_us, _, _) = median(fair_floors_us);
    json.push(("pubsub_floor_us".to_owned(), format!("{floor_us:.2}")));
    json.push((
        "pubsub_floor_round_trips".to_owned(),
        format!("{:.3}", floor_us / rtt_us),
    ));
}

/// Section 2: what idle waiters cost Redis while a lock stays held.
fn idle_section(server: &RedisServer, mode: &Mode, json: &mut Vec<(String, String)>) {
    let idle_cases = [
        (
            "idle_mutex",
            format!("{} threads of one process, Mutex", mode.idle_waiters),
            idle_waiters(server, mode, false),
        ),
        (
            "idle_fair_mutex",
            format!("{} threads of one process, FairMutex", mode.idle_waiters),
            idle_waiters(server, mode, true),
        ),
        (
            "idle_processes",
            format!(
                "{} processes x {} threads, Mutex",
                mode.idle_processes, mode.idle_threads
            ),
            idle_processes(
                server,
                (mode.idle_processes, mode.idle_threads),
                (mode.idle_settle, mode.idle_processes_hold),
            ),
        ),
        (
            "idle_many_processes",
            format!("{} processes x 1 thread, Mutex", mode.idle_many_processes),
            idle_processes(
                server,
                (mode.idle_many_processes, 1),
                (mode.idle_settle, mode.idle_processes_hold),
            ),
        ),
    ];
    println!("idle waiters on a held lock (Redis commands/s, script internals included; script calls/s):");
    for (key, label, cost) in &idle_cases {
        println!(
            "  {label:<38} {:>7.2} commands/s  {:>6.2} script calls/s",
            cost.commands_per_sec, cost.scripts_per_sec
        );
        json.push((
            (*key).to_owned(),
            format!(
                "{{\"waiters\": \"{label}\", \"commands_per_sec\": {:.2}, \
                 \"script_calls_per_sec\": {:.2}}}",
                cost.commands_per_sec, cost.scripts_per_sec
            ),
        ));
    }
}

/// Section 4: `Mutex` hand-offs as the processes grow (`mode.growth_processes` x
/// `mode.growth_threads`), beside `mode.growth_reference`, every shape once in each round (in
/// an order that turns round by round), an empty critical section.
fn growth_section(server: &RedisServer, mode: &Mode, json: &mut Vec<(String, String)>) {
    let threads = mode.growth_threads;
    let mut shapes: Vec<(usize, usize)> = vec![mode.growth_reference];
    shapes.extend(mode.growth_processes.iter().map(|&p| (p, threads)));
    println!(
        "contention as it grows: Mutex, empty critical section, {} rounds of {:?}, shapes \
         interleaved; beside {} x {}, run back to back with the largest",
        mode.rounds, mode.peer_run, mode.growth_reference.0, mode.growth_reference.1
    );
    let mut results: Vec<Vec<HandoffResult>> = shapes.iter().map(|_| Vec::new()).collect();
    let last = shapes.len() - 1;
    // The steal of CPU time by other guests while the reference and the largest shape ran.
    let mut steals = Vec::new();
    for round in 0..mode.rounds {
        // The shapes between in turn, then the reference and the largest back to back (their
        // order alternating by round): their ratio compares two runs seconds apart, which
        // share the host's weather, not two runs as far apart as a whole round.
        let mut order: Vec<usize> = (1..last).collect();
        let turn = round % order.len().max(1);
        order.rotate_left(turn);
        let pair_from = order.len();
        match (last, round % 2) {
            (0, _) => order.push(0),
            (_, 0) => order.extend([0, last]),
            _ => order.extend([last, 0]),
        }
        let mut pair_host = None;
        for (i, &at) in order.iter().enumerate() {
            if i == pair_from {
                pair_host = common::HostTime::now();
            }
            let (processes, threads) = shapes[at];
            let load = Workload {
                name: "growth",
                hold: Duration::ZERO,
                processes,
                threads,
                run: mode.peer_run,
            };
            results[at].push(handoff_round(
                server,
                &server.url(),
                &load,
                Contender::Mutex,
            ));
        }
        steals.push(pair_host.map_or(0.0, |h| h.steal_share_since()));
    }
    let steal = common::spread(steals);
    let pick = |s: usize, f: fn(&HandoffResult) -> f64| median(results[s].iter().map(f).collect());
    println!(
        "  {:<10}{:>24}{:>18}{:>12}{:>12}{:>12}{:>8}{:>8}{:>8}",
        "shape",
        "hand-offs/s",
        "wait p50/p99 ms",
        "p99.9 ms",
        "Jain thr.",
        "Jain proc.",
        "local",
        "sent",
        "failed"
    );
    let mut rows = Vec::new();
    for (s, &(processes, threads)) in shapes.iter().enumerate() {
        let rate = pick(s, |r| r.handoffs_per_sec);
        let (p50, p99, p999) = (
            pick(s, |r| r.wait_p50_us).0 / 1e3,
            pick(s, |r| r.wait_p99_us).0 / 1e3,
            pick(s, |r| r.wait_p999_us).0 / 1e3,
        );
        let (jain, jain_processes) = (pick(s, |r| r.jain).0, pick(s, |r| r.jain_processes).0);
        let (local, sent, failed) = (
            pick(s, |r| r.local_share).0,
            pick(s, |r| r.sent_per_acquisition).0,
            pick(s, |r| r.failed_attempts_per_acquisition).0,
        );
        println!(
            "  {:<10}{:>24}{:>18}{:>12.2}{:>12.4}{:>12.4}{:>8.3}{:>8.3}{:>8.3}",
            format!("{processes} x {threads}"),
            format!("{:.0} [{:.0}..{:.0}]", rate.0, rate.1, rate.2),
            format!("{p50:.2} / {p99:.2}"),
            p999,
            jain,
            jain_processes,
            local,
            sent,
            failed
        );
        rows.push(format!(
            "{{\"processes\": {processes}, \"threads\": {threads}, \
             \"handoffs_per_sec\": {:.1}, \"handoffs_per_sec_min\": {:.1}, \
             \"handoffs_per_sec_max\": {:.1}, \"wait_p50_ms\": {p50:.3}, \
             \"wait_p99_ms\": {p99:.3}, \"wait_p999_ms\": {p999:.3}, \"jain_index\": {jain:.5}, \
             \"jain_processes\": {jain_processes:.5}}}",
            rate.0, rate.1, rate.2
        ));
    }
    // The largest shape against the reference, within each round.
    let ratio = median(
        results[last]
            .iter()
            .zip(&results[0])
            .map(|(big, reference)| {
                big.handoffs_per_sec / reference.handoffs_per_sec.max(f64::MIN_POSITIVE)
            })
            .collect(),
    );
    println!(
        "  {} x {} / {} x {} hand-offs/s: {:.3} [{:.3} .. {:.3}], measured back to back; \
         CPU time taken by other guests meanwhile {:.1} % [{:.1} .. {:.1}]",
        shapes[last].0,
        shapes[last].1,
        shapes[0].0,
        shapes[0].1,
        ratio.0,
        ratio.1,
        ratio.2,
        steal.median * 100.0,
        steal.min * 100.0,
        steal.max * 100.0
    );
    json.push((
        "growth".to_owned(),
        format!(
            "{{\n    \"reference\": {},\n    \"by_processes\": [\n      {}\n    ],\n    \
             \"largest_to_reference\": {{\"median\": {:.3}, \"min\": {:.3}, \"max\": {:.3}}},\n    \
             \"host_steal\": {{\"median\": {:.4}, \"min\": {:.4}, \"max\": {:.4}}}\n  }}",
            rows[0],
            rows[1..].join(",\n      "),
            ratio.0,
            ratio.1,
            ratio.2,
            steal.median,
            steal.min,
            steal.max
        ),
    ));
}

/// Section 3: an empty critical section taken in a loop by `Mutex`, `FairMutex` and
/// redis-py's `Lock`, interleaved within each round, for each shape of `mode.peer_shapes`.
fn peers_section(server: &RedisServer, mode: &Mode, json: &mut Vec<(String, String)>) {
    let mut shapes = Vec::new();
    for (processes, threads) in mode.peer_shapes {
        println!(
            "beside redis-py: {processes} processes x {threads} threads, empty critical section, \
             {} rounds of {:?}, contenders interleaved",
            mode.rounds, mode.peer_run
        );
        let url = server.url();
        let shape = (processes, threads);
        shapes.push(compare_contenders(
            server,
            (&url, "peers"),
            mode,
            shape,
            &Contender::ALL,
        ));
    }
    json.push((
        "peers".to_owned(),
        format!(
            "{{\n    \"hold_us\": 0,\n    \"run_ms\": {},\n    \"rounds\": {},\n{}\n  }}",
            mode.peer_run.as_millis(),
            mode.rounds,
            shapes.join(",\n")
        ),
    ));
}

/// How late a byte arrives over the network of section 5, each way.
const NETWORK_ONE_WAY: Duration = Duration::from_micros(250);

/// Section 5: the shapes of `mode.network_shapes` (4 x 1, the last shape beside redis-py, and
/// 2 x 1: two processes taking turns) with a `Mutex`, a `FairMutex` and the bare token (the
/// floor), whose clients reach Redis over a network ([`LatencyProxy`]: every byte arrives
/// [`NETWORK_ONE_WAY`] late each way), interleaved within each round; beside a PING round
/// trip through it. On loopback a wake-up costs what a round trip does,
/// and a hand-off's messages hardly show; here each round trip and each one-way message of a
/// hand-off does.
fn network_section(server: &RedisServer, mode: &Mode, json: &mut Vec<(String, String)>) {
    let proxy = LatencyProxy::start(server.port(), NETWORK_ONE_WAY);
    let url = proxy.url();
    let client = redis::Client::open(url.as_str()).expect("client through the proxy");
    let mut conn = client
        .get_connection()
        .expect("connection through the proxy");
    let ping = median_ping(&mut conn, 200, Duration::ZERO);
    let contenders = [Contender::Mutex, Contender::FairMutex, Contender::Token];
    let mut shapes = Vec::new();
    for &(processes, threads) in mode.network_shapes {
        println!(
            "over a network of {NETWORK_ONE_WAY:?} each way (a PING round trip {:.0} us): \
             {processes} processes x {threads} threads, empty critical section, {} rounds of \
             {:?}",
            ping.as_secs_f64() * 1e6,
            mode.rounds,
            mode.peer_run
        );
        let shape = (processes, threads);
        shapes.push(compare_contenders(
            server,
            (&url, "network"),
            mode,
            shape,
            &contenders,
        ));
    }
    json.push((
        "network".to_owned(),
        format!(
            "{{\n    \"one_way_us\": {},\n    \"ping_us\": {:.1},\n    \"run_ms\": {},\n    \
             \"rounds\": {},\n{}\n  }}",
            NETWORK_ONE_WAY.as_micros(),
            ping.as_secs_f64() * 1e6,
            mode.peer_run.as_millis(),
            mode.rounds,
            shapes.join(",\n"),
        ),
    ));
}

/// `processes` x `threads` take one lock in a loop with an empty critical section, for each
/// of `contenders` (the `Mutex` first) interleaved within each round, through `url` (on locks
/// named after `section`); prints
/// the figures of each and returns them as the JSON entry of the shape, with the `Mutex`'s
/// hand-offs/s against each other contender's, taken within each round.
fn compare_contenders(
    server: &RedisServer,
    (url, section): (&str, &str),
    mode: &Mode,
    (processes, threads): (usize, usize),
    contenders: &[Contender],
) -> String {
    let n = contenders.len();
    let mut results: Vec<Vec<HandoffResult>> = contenders.iter().map(|_| Vec::new()).collect();
    for round in 0..mode.rounds {
        for i in 0..n {
            let at = (i + round) % n;
            let contender = contenders[at];
            let name = format!("handoff-{section}{}", contender.lock_suffix());
            let load = Workload {
                name: &name,
                hold: Duration::ZERO,
                processes,
                threads,
                run: mode.peer_run,
            };
            results[at].push(handoff_round(server, url, &load, contender));
        }
    }
    let pick = |c: usize, f: fn(&HandoffResult) -> f64| median(results[c].iter().map(f).collect());
    let ratio = |other: usize| {
        median(
            results[0]
                .iter()
                .zip(&results[other])
                .map(|(m, o)| m.handoffs_per_sec / o.handoffs_per_sec.max(f64::MIN_POSITIVE))
                .collect(),
        )
    };
    let row = |label: &str, f: &dyn Fn(usize) -> String| {
        let cells: Vec<String> = (0..n).map(|c| format!("{:>22}", f(c))).collect();
        println!("  {label:<26}{}", cells.concat());
    };
    row("", &|c| contenders[c].label().to_owned());
    row("acquisitions", &|c| {
        results[c]
            .iter()
            .map(|r| r.acquisitions)
            .sum::<usize>()
            .to_string()
    });
    row("hand-offs/s", &|c| {
        let r = pick(c, |r| r.handoffs_per_sec);
        format!("{:.0} [{:.0}..{:.0}]", r.0, r.1, r.2)
    });
    row("hand-off p50 (us)", &|c| {
        format!("{:.1}", pick(c, |r| r.handoff_p50_us).0)
    });
    row("wait p50 / p99 (ms)", &|c| {
        format!(
            "{:.2} / {:.2}",
            pick(c, |r| r.wait_p50_us).0 / 1e3,
            pick(c, |r| r.wait_p99_us).0 / 1e3
        )
    });
    row("wait p99.9 (ms)", &|c| {
        format!("{:.2}", pick(c, |r| r.wait_p999_us).0 / 1e3)
    });
    row("commands sent / run", &|c| {
        format!(
            "{:.2} / {:.2}",
            pick(c, |r| r.sent_per_acquisition).0,
            pick(c, |r| r.commands_per_acquisition).0
        )
    });
    row("round trips / acq.", &|c| {
        format!("{:.2}", pick(c, |r| r.reads_per_acquisition).0)
    });
    row("CPU / acq. client, Redis", &|c| {
        format!(
            "{:.1} / {:.1} us",
            pick(c, |r| r.client_cpu_us).0,
            pick(c, |r| r.redis_cpu_us).0
        )
    });
    row("Jain fairness index", &|c| {
        format!("{:.4}", pick(c, |r| r.jain).0)
    });
    row("same-process hand-offs", &|c| {
        format!("{:.3}", pick(c, |r| r.local_share).0)
    });
    let ratios: Vec<String> = (1..n)
        .map(|c| {
            let r = ratio(c);
            format!(
                "Mutex / {} {:.2} [{:.2} .. {:.2}]",
                contenders[c].label(),
                r.0,
                r.1,
                r.2
            )
        })
        .collect();
    println!("  hand-offs/s: {}", ratios.join("; "));
    let mut entries = vec![
        format!("\"processes\": {processes}"),
        format!("\"threads\": {threads}"),
    ];
    for (c, contender) in contenders.iter().enumerate() {
        let rate = pick(c, |r| r.handoffs_per_sec);
        entries.push(format!(
            "\"{}\": {{\"handoffs_per_sec\": {:.1}, \"handoffs_per_sec_min\": {:.1}, \
             \"handoffs_per_sec_max\": {:.1}, \"handoff_p50_us\": {:.1}, \
             \"wait_p50_ms\": {:.3}, \
             \"wait_p99_ms\": {:.3}, \"wait_p999_ms\": {:.3}, \
             \"commands_sent_per_acquisition\": {:.3}, \
             \"commands_run_per_acquisition\": {:.3}, \
             \"round_trips_per_acquisition\": {:.3}, \
             \"client_cpu_us_per_acquisition\": {:.2}, \
             \"redis_cpu_us_per_acquisition\": {:.2}, \"jain_index\": {:.5}, \
             \"local_share\": {:.4}, \"acquisitions\": {}}}",
            contender.key(),
            rate.0,
            rate.1,
            rate.2,
            pick(c, |r| r.handoff_p50_us).0,
            pick(c, |r| r.wait_p50_us).0 / 1e3,
            pick(c, |r| r.wait_p99_us).0 / 1e3,
            pick(c, |r| r.wait_p999_us).0 / 1e3,
            pick(c, |r| r.sent_per_acquisition).0,
            pick(c, |r| r.commands_per_acquisition).0,
            pick(c, |r| r.reads_per_acquisition).0,
            pick(c, |r| r.client_cpu_us).0,
            pick(c, |r| r.redis_cpu_us).0,
            pick(c, |r| r.jain).0,
            pick(c, |r| r.local_share).0,
            results[c].iter().map(|r| r.acquisitions).sum::<usize>(),
        ));
    }
    for (c, contender) in contenders.iter().enumerate().skip(1) {
        let r = ratio(c);
        entries.push(format!(
            "\"mutex_to_{}\": {{\"median\": {:.3}, \"min\": {:.3}, \"max\": {:.3}}}",
            contender.key(),
            r.0,
            r.1,
            r.2
        ));
    }
    format!(
        "    \"{processes}x{threads}\": {{\n      {}\n    }}",
        entries.join(",\n      ")
    )
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("worker") => return worker(&args[2..]),
        Some("idle-worker") => return idle_worker(&args[2..]),
        _ => {}
    }
    let mode = mode();
    let sections = sections();
    let server = RedisServer::start();
    let mut json = vec![("benchmark".to_owned(), "\"contended\"".to_owned())];
    if sections.handoff {
        handoff_section(&server, &mode, &mut json);
    }
    if sections.idle {
        idle_section(&server, &mode, &mut json);
    }
    if sections.peers {
        peers_section(&server, &mode, &mut json);
    }
    if sections.growth {
        growth_section(&server, &mode, &mut json);
    }
    if sections.network {
        network_section(&server, &mode, &mut json);
    }
    if mode.measuring {
        // The share of CPU time other guests took during the sections run now.
        let steal = common::host_steal_of_run();
        json.push(("host_steal".to_owned(), format!("{steal:.4}")));
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-results");
        if std::fs::create_dir_all(&dir).is_ok() {
            let path = dir.join("contended.json");
            // A run of some sections keeps the figures of the others from the last run.
            if !sections.all() {
                if let Ok(old) = std::fs::read_to_string(&path) {
                    let mut merged = json_entries(&old);
                    for (key, value) in json {
                        match merged.iter_mut().find(|(k, _)| *k == key) {
                            Some(entry) => entry.1 = value,
                            None => merged.push((key, value)),
                        }
                    }
                    json = merged;
                }
            }
            match std::fs::write(&path, json_text(&json)) {
                Ok(()) => println!("figures written to {}", path.display()),
                Err(e) => eprintln!("could not write {}: {e}", path.display()),
            }
        }
    }
}
