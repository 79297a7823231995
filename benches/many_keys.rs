//! Many threads, many keys: 16 threads lock and unlock random names out of 1,000 through one
//! client (a pool of 16 connections), beside a raw redis-rs loop doing the same two commands
//! (`SET NX PX`, `EVALSHA` compare-and-delete) from 16 threads on 16 connections. Each round
//! interleaves the two in short slices (the host's speed drifts over seconds, and a slice of
//! each, back to back, meets the same drift), and the ratio is taken within each round. The
//! raw loop's connections are made once, before the first round, as the client's pool is.
//!
//! `cargo bench --bench many_keys` measures and writes `target/bench-results/many_keys.json`.

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use common::{spread, Json};
use redmutex::Client;
use support::RedisServer;

const THREADS: usize = 16;
const NAMES: u32 = 1000;

/// Runs `THREADS` threads of `body` for `time`; returns cycles per second. `body` gets the
/// thread's number and a stop flag, and returns how many cycles it did.
fn run_threads<F>(time: Duration, body: F) -> f64
where
    F: Fn(usize, &AtomicBool) -> u64 + Send + Sync + 'static,
{
    let body = Arc::new(body);
    let stop = Arc::new(AtomicBool::new(false));
    let start = Arc::new(Barrier::new(THREADS + 1));
    let total = Arc::new(AtomicU64::new(0));
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let (body, stop, start, total) =
                (body.clone(), stop.clone(), start.clone(), total.clone());
            std::thread::spawn(move || {
                start.wait();
                total.fetch_add(body(t, &stop), Ordering::Relaxed);
            })
        })
        .collect();
    start.wait();
    let began = Instant::now();
    std::thread::sleep(time);
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().expect("bench thread");
    }
    total.load(Ordering::Relaxed) as f64 / began.elapsed().as_secs_f64()
}

/// The raw loop's connections, one per thread, made once.
type RawConns = Arc<Vec<Mutex<redis::Connection>>>;

fn raw_connections(url: &str) -> RawConns {
    let client = redis::Client::open(url).expect("url");
    Arc::new(
        (0..THREADS)
            .map(|_| Mutex::new(client.get_connection().expect("connect")))
            .collect(),
    )
}

fn raw_round(conns: &RawConns, time: Duration) -> f64 {
    let conns = Arc::clone(conns);
    run_threads(time, move |t, stop| {
        let mut conn = conns[t].lock().expect("raw connection");
        let conn = &mut *conn;
        let release = redis::Script::new(common::RAW_RELEASE_LUA);
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let key = format!("raw:{}", fastrand::u32(0..NAMES));
            let token = format!("{t}:{n}");
            let set: Option<String> = redis::cmd("SET")
                .arg(&key)
                .arg(&token)
                .arg("NX")
                .arg("PX")
                .arg(30_000)
                .query(conn)
                .expect("SET");
            if set.is_none() {
                continue; // another thread holds this name: pick another
            }
            let _: i64 = release.key(&key).arg(&token).invoke(conn).expect("EVALSHA");
            n += 1;
        }
        n
    })
}

fn mutex_round(client: &Client, time: Duration) -> f64 {
    let client = client.clone();
    run_threads(time, move |_, stop| {
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            let m = client.mutex(format!("name:{}", fastrand::u32(0..NAMES)));
            let g = m.lock().expect("lock");
            g.unlock().expect("unlock");
            n += 1;
        }
        n
    })
}

fn main() {
    let measuring = common::measuring();
    // Each round: `slices` slices of each loop, in turns (which starts alternates), of
    // `time / slices` each.
    let (rounds, time, slices) = if measuring {
        (7, Duration::from_secs(3), 6)
    } else {
        (1, Duration::from_millis(200), 1)
    };
    let server = RedisServer::start();
    let client = Client::builder()
        .pool_size(THREADS as u32)
        .open(server.url())
        .expect("client");
    let (mut raw, mut ours, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    let server_pid = server.pid().map(|p| p.to_string()).unwrap_or_default();
    let conns = raw_connections(&server.url());
    let slice = time / slices;
    // CPU microseconds per operation of this process and of redis-server, per variant.
    let mut cpu = [[0.0f64; 2]; 2];
    let mut ops = [0.0f64; 2];
    let mut measure = |variant: usize| {
        let (c0, s0) = (
            common::cpu_seconds(),
            common::process_cpu_seconds(&server_pid),
        );
        let rate = if variant == 0 {
            raw_round(&conns, slice)
        } else {
            mutex_round(&client, slice)
        };
        cpu[variant][0] += common::cpu_seconds() - c0;
        cpu[variant][1] += common::process_cpu_seconds(&server_pid) - s0;
        ops[variant] += rate * slice.as_secs_f64();
        rate
    };
    for round in 0..rounds {
        let mut sums = [0.0f64; 2];
        for turn in 0..2 * slices {
            let variant = (round + turn as usize) % 2;
            sums[variant] += measure(variant);
        }
        let (r, o) = (sums[0] / f64::from(slices), sums[1] / f64::from(slices));
        raw.push(r);
        ours.push(o);
        ratios.push(o / r);
    }
    let per_op = |v: usize, who: usize| 1e6 * cpu[v][who] / ops[v].max(1.0);
    let (raw, ours, ratio) = (spread(raw), spread(ours), spread(ratios));
    let stats = client.stats();
    println!(
        "many keys: {THREADS} threads over {NAMES} names, {rounds} rounds of {slices} slices \
         of {slice:?} each"
    );
    println!(
        "  raw SET NX PX + EVALSHA CAD   {:>10.0} /s  [{:.0} .. {:.0}]",
        raw.median, raw.min, raw.max
    );
    println!(
        "  Mutex lock + unlock           {:>10.0} /s  [{:.0} .. {:.0}]",
        ours.median, ours.min, ours.max
    );
    println!(
        "  ratio to raw (same round)     {:>10.3}     [{:.3} .. {:.3}]",
        ratio.median, ratio.min, ratio.max
    );
    println!(
        "  CPU per op: client {:.1} us, redis {:.1} us (raw: client {:.1} us, redis {:.1} us)",
        per_op(1, 0),
        per_op(1, 1),
        per_op(0, 0),
        per_op(0, 1)
    );
    println!(
        "  contended acquires            {:>10.2} %",
        100.0 * stats.contended as f64 / stats.acquisitions.max(1) as f64
    );
    let mut json = Json::default();
    json.text("benchmark", "many_keys")
        .num("threads", THREADS as f64)
        .num("names", f64::from(NAMES))
        .num("rounds", rounds as f64)
        .num("round_seconds", time.as_secs_f64())
        .num("slices_per_round", f64::from(slices))
        .spread("raw_ops_per_sec", raw)
        .spread("mutex_ops_per_sec", ours)
        .spread("ratio_to_raw", ratio)
        .num("mutex_client_cpu_us_per_op", per_op(1, 0))
        .num("mutex_redis_cpu_us_per_op", per_op(1, 1))
        .num("raw_client_cpu_us_per_op", per_op(0, 0))
        .num("raw_redis_cpu_us_per_op", per_op(0, 1));
    common::write_results("many_keys", &json);
}
