//! Optimistic access to a `Shared<T>` (`get` and `update`) beside the lock (`lock()` for every
//! operation), from 4 processes x 4 threads on one value of about 600 bytes.
//!
//! 1. Read-mostly: 95 % reads, 5 % writes (each write adds one to a field). Operations per
//!    second of each style, interleaved within each round, beside a raw loop in the same run
//!    (the same processes sending a plain `GET` of the value: the ceiling of any read).
//! 2. The write share: 5 %, 25 %, 50 % and 100 % writes, both styles: operations per second,
//!    and for the updates their conflicts (reads again) per update.
//! 3. Slow changes: 100 % writes, each change taking 1 ms of work between its read and its
//!    write (inside the closure, or while holding the lock).
//!
//! Every write is checked: the field's final value must be the number of writes made.
//!
//! `cargo bench --bench optimistic` measures and writes `target/bench-results/optimistic.json`;
//! `cargo test --benches` runs a short smoke version.

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{spread, Json, Spread};
use redmutex::Client;
use serde::{Deserialize, Serialize};
use support::RedisServer;

/// A catalogue entry read far more often than written.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Catalogue {
    writes: u64,
    items: Vec<(String, u64)>,
}

fn catalogue() -> Catalogue {
    Catalogue {
        writes: 0,
        items: (0..24)
            .map(|i| (format!("sku-{i:08}-colour-size"), 1000 + i))
            .collect(),
    }
}

/// How the workers reach the value.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Style {
    /// `get` to read, `update` to write.
    Optimistic,
    /// `lock()` for every operation.
    Lock,
    /// A plain `GET` of the value's key, for reads and writes alike (no write is made).
    Raw,
}

impl Style {
    fn arg(self) -> &'static str {
        match self {
            Style::Optimistic => "optimistic",
            Style::Lock => "lock",
            Style::Raw => "raw",
        }
    }

    fn parse(s: &str) -> Style {
        match s {
            "optimistic" => Style::Optimistic,
            "lock" => Style::Lock,
            _ => Style::Raw,
        }
    }
}

/// What one run's workers did.
#[derive(Default)]
struct Run {
    ops_per_sec: f64,
    writes: u64,
    conflicts: u64,
}

const NAME: &str = "catalogue";

/// A worker process: `threads` threads run the mix for `run_ms` after a line on stdin, then
/// print `DONE ops writes conflicts`.
fn worker(args: &[String]) {
    let (url, style, threads, run_ms, permille) = (
        &args[0],
        Style::parse(&args[1]),
        args[2].parse::<usize>().expect("threads"),
        args[3].parse::<u64>().expect("run ms"),
        args[4].parse::<u64>().expect("write share"),
    );
    let work = Duration::from_micros(args[5].parse::<u64>().expect("work"));
    let client = Client::open(url.as_str()).expect("client");
    let value = client.shared_or(NAME, catalogue());
    value.get().expect("warm-up read");
    println!("READY");
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).expect("go");
    let until = Instant::now() + Duration::from_millis(run_ms);
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let value = value.clone();
            let url = url.clone();
            std::thread::spawn(move || {
                let mut raw = redis::Client::open(url.as_str())
                    .and_then(|c| c.get_connection())
                    .expect("raw connection");
                let key = format!("redmutex:{{{NAME}}}:value");
                let (mut ops, mut writes) = (0u64, 0u64);
                while Instant::now() < until {
                    let write = fastrand::u64(0..1000) < permille;
                    match (style, write) {
                        (Style::Raw, _) => {
                            let _: Option<Vec<u8>> =
                                redis::cmd("GET").arg(&key).query(&mut raw).expect("GET");
                        }
                        (Style::Optimistic, false) => {
                            std::hint::black_box(value.get().expect("get").items.len());
                        }
                        (Style::Optimistic, true) => {
                            value
                                .update(|c| {
                                    busy(work);
                                    c.writes += 1;
                                })
                                .expect("update");
                            writes += 1;
                        }
                        (Style::Lock, false) => {
                            let g = value.lock().expect("lock");
                            std::hint::black_box(g.items.len());
                            g.unlock().expect("unlock");
                        }
                        (Style::Lock, true) => {
                            let mut g = value.lock().expect("lock");
                            busy(work);
                            g.writes += 1;
                            g.unlock().expect("unlock");
                            writes += 1;
                        }
                    }
                    ops += 1;
                }
                (ops, writes)
            })
        })
        .collect();
    let (mut ops, mut writes) = (0, 0);
    for h in handles {
        let (o, w) = h.join().expect("worker thread");
        ops += o;
        writes += w;
    }
    println!("DONE {ops} {writes} {}", client.stats().update_conflicts);
}

/// Work that takes `d` (a sleep: the machine's two cores stay for the others).
fn busy(d: Duration) {
    if !d.is_zero() {
        std::thread::sleep(d);
    }
}

/// One run of `processes` x `threads` workers in `style` for `time`, with `permille` writes
/// whose change takes `work`.
fn run(
    server: &RedisServer,
    style: Style,
    (processes, threads): (usize, usize),
    time: Duration,
    (permille, work): (u64, Duration),
) -> Run {
    let exe = std::env::current_exe().expect("bench binary");
    let mut children: Vec<_> = (0..processes)
        .map(|_| {
            Command::new(&exe)
                .arg("worker")
                .arg(server.url())
                .arg(style.arg())
                .arg(threads.to_string())
                .arg(time.as_millis().to_string())
                .arg(permille.to_string())
                .arg(work.as_micros().to_string())
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn worker")
        })
        .collect();
    let mut outputs = common::ready_outputs(&mut children);
    let started = Instant::now();
    for child in &mut children {
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(b"GO\n").expect("go");
    }
    let mut total = Run::default();
    let mut ops = 0u64;
    for lines in &mut outputs {
        for line in lines.by_ref() {
            let line = line.expect("worker output");
            let Some(rest) = line.trim().strip_prefix("DONE ") else {
                continue;
            };
            let n: Vec<u64> = rest.split(' ').map(|x| x.parse().expect("count")).collect();
            ops += n[0];
            total.writes += n[1];
            total.conflicts += n[2];
            break;
        }
    }
    let elapsed = started.elapsed().as_secs_f64().max(time.as_secs_f64());
    for mut child in children {
        assert!(child.wait().expect("worker").success(), "a worker failed");
    }
    total.ops_per_sec = ops as f64 / elapsed;
    total
}

/// The value's write count now.
fn writes_stored(client: &Client) -> u64 {
    client
        .shared_or(NAME, catalogue())
        .get()
        .expect("read")
        .writes
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("worker") {
        return worker(&args[2..]);
    }
    let measuring = common::measuring();
    let (rounds, time, shape) = if measuring {
        (3, Duration::from_secs(3), (4, 4))
    } else {
        (1, Duration::from_millis(300), (2, 2))
    };
    let server = RedisServer::start();
    let client = Client::open(server.url()).expect("client");
    let mut json = Json::default();
    json.text("benchmark", "optimistic");
    let mut made = 0u64;

    // 1. Read-mostly, beside the raw loop.
    let (mut opt, mut lock, mut raw, mut ratio, mut opt_raw, mut lock_raw) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        let mix = (50, Duration::ZERO);
        let r = run(&server, Style::Raw, shape, time, mix);
        let o = run(&server, Style::Optimistic, shape, time, mix);
        let l = run(&server, Style::Lock, shape, time, mix);
        made += o.writes + l.writes;
        raw.push(r.ops_per_sec);
        opt.push(o.ops_per_sec);
        lock.push(l.ops_per_sec);
        ratio.push(o.ops_per_sec / l.ops_per_sec);
        opt_raw.push(o.ops_per_sec / r.ops_per_sec);
        lock_raw.push(l.ops_per_sec / r.ops_per_sec);
    }
    let (p, t) = shape;
    println!("{p} processes x {t} threads, {rounds} rounds of {time:?}; 95 % reads, 5 % writes");
    common::print_rate("raw GET loop", spread(raw.clone()));
    common::print_rate("get + update", spread(opt.clone()));
    common::print_rate("lock() for every operation", spread(lock.clone()));
    common::print_ratio("get + update / lock()", spread(ratio.clone()));
    common::print_ratio("get + update / raw", spread(opt_raw.clone()));
    common::print_ratio("lock() / raw", spread(lock_raw.clone()));
    json.num("processes", p as f64)
        .num("threads", t as f64)
        .spread("read_mostly_raw_per_sec", spread(raw))
        .spread("read_mostly_optimistic_per_sec", spread(opt))
        .spread("read_mostly_lock_per_sec", spread(lock))
        .spread("read_mostly_optimistic_to_lock", spread(ratio))
        .spread("read_mostly_optimistic_to_raw", spread(opt_raw))
        .spread("read_mostly_lock_to_raw", spread(lock_raw));

    // 2. The write share.
    let shares = [50u64, 250, 500, 1000];
    let mut opt_series: Vec<(f64, Spread)> = Vec::new();
    let mut lock_series: Vec<(f64, Spread)> = Vec::new();
    let mut ratio_series: Vec<(f64, Spread)> = Vec::new();
    let mut conflict_series: Vec<(f64, Spread)> = Vec::new();
    for permille in shares {
        let (mut o_rates, mut l_rates, mut ratios, mut conflicts) =
            (vec![], vec![], vec![], vec![]);
        for _ in 0..rounds {
            let o = run(
                &server,
                Style::Optimistic,
                shape,
                time,
                (permille, Duration::ZERO),
            );
            let l = run(
                &server,
                Style::Lock,
                shape,
                time,
                (permille, Duration::ZERO),
            );
            made += o.writes + l.writes;
            o_rates.push(o.ops_per_sec);
            l_rates.push(l.ops_per_sec);
            ratios.push(o.ops_per_sec / l.ops_per_sec);
            conflicts.push(o.conflicts as f64 / (o.writes.max(1)) as f64);
        }
        let share = permille as f64 / 10.0;
        println!("{share} % writes:");
        common::print_rate("  get + update", spread(o_rates.clone()));
        common::print_rate("  lock()", spread(l_rates.clone()));
        common::print_ratio("  get + update / lock()", spread(ratios.clone()));
        common::print_ratio("  conflicts per update", spread(conflicts.clone()));
        opt_series.push((share, spread(o_rates)));
        lock_series.push((share, spread(l_rates)));
        ratio_series.push((share, spread(ratios)));
        conflict_series.push((share, spread(conflicts)));
    }
    json.series("share_optimistic_per_sec", &opt_series)
        .series("share_lock_per_sec", &lock_series)
        .series("share_optimistic_to_lock", &ratio_series)
        .series("share_conflicts_per_update", &conflict_series);

    // 3. Slow changes.
    let slow = (1000, Duration::from_millis(1));
    let (mut o_rates, mut l_rates, mut ratios, mut conflicts) = (vec![], vec![], vec![], vec![]);
    for _ in 0..rounds {
        let o = run(&server, Style::Optimistic, shape, time, slow);
        let l = run(&server, Style::Lock, shape, time, slow);
        made += o.writes + l.writes;
        o_rates.push(o.ops_per_sec);
        l_rates.push(l.ops_per_sec);
        ratios.push(o.ops_per_sec / l.ops_per_sec);
        conflicts.push(o.conflicts as f64 / (o.writes.max(1)) as f64);
    }
    println!("100 % writes, 1 ms of work in each change:");
    common::print_rate("  update", spread(o_rates.clone()));
    common::print_rate("  lock()", spread(l_rates.clone()));
    common::print_ratio("  update / lock()", spread(ratios.clone()));
    common::print_ratio("  conflicts per update", spread(conflicts.clone()));
    json.spread("slow_optimistic_per_sec", spread(o_rates))
        .spread("slow_lock_per_sec", spread(l_rates))
        .spread("slow_optimistic_to_lock", spread(ratios))
        .spread("slow_conflicts_per_update", spread(conflicts));

    // No write was lost or made twice.
    let stored = writes_stored(&client);
    assert_eq!(stored, made, "the value counts {stored} writes of {made}");
    println!("every one of the {made} writes is in the value");
    common::write_results("optimistic", &json);
}
