//! Scale: many held locks, and growth.
//!
//! 1. One client takes 10, 100, 1,000 and then 10,000 locks and holds them for several
//!    renewal periods. At each level: acquire latency (p50/p99 of the acquisitions that
//!    reached it), renewal round trips and time per renewal period, client CPU per period,
//!    client heap memory per held lock (a counting allocator), and the client's threads and
//!    Redis connections.
//! 2. Hand-off latency as the number of threads waiting for one lock grows from 2 to 64.
//!
//! `cargo bench --bench scale` measures and writes `target/bench-results/scale.json`.

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use common::{spread, Json, Spread};
use redmutex::Client;
use support::RedisServer;

/// Counts live heap bytes, to measure the client's memory per held lock exactly.
struct CountingAllocator;

static LIVE_BYTES: AtomicI64 = AtomicI64::new(0);

unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LIVE_BYTES.fetch_add(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        LIVE_BYTES.fetch_sub(layout.size() as i64, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LIVE_BYTES.fetch_add(new_size as i64 - layout.size() as i64, Ordering::Relaxed);
        // SAFETY: forwarded unchanged to the system allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize] as f64
}

struct Level {
    held: usize,
    acquire_p50_us: f64,
    acquire_p99_us: f64,
    trips_per_period: f64,
    renewal_ms_per_period: f64,
    cpu_ms_per_period: f64,
    heap_bytes_per_lock: f64,
    threads: usize,
    connections: u64,
}

fn held_locks(server: &RedisServer, levels: &[usize], periods: u32) -> Vec<Level> {
    let interval = Duration::from_millis(1000);
    let client = Client::builder()
        .default_lease(interval * 3)
        .renewal_interval(interval)
        .open(server.url())
        .expect("client");
    // Warm up: pool, scripts, renewal thread.
    drop(client.mutex("warm-up").lock().expect("lock"));
    let handles: Vec<_> = (0..10_000)
        .map(|i| client.mutex(format!("held:{i}")))
        .collect();
    let mut guards = Vec::new();
    let mut out = Vec::new();
    // Let the threads of earlier rounds' clients finish exiting before counting threads.
    std::thread::sleep(Duration::from_millis(1500));
    let heap_base = LIVE_BYTES.load(Ordering::Relaxed);
    for &level in levels {
        let mut latencies = Vec::new();
        while guards.len() < level {
            let m = &handles[guards.len()];
            let t = Instant::now();
            guards.push(m.lock().expect("lock"));
            latencies.push(t.elapsed().as_nanos() as u64);
        }
        latencies.sort_unstable();
        let heap = LIVE_BYTES.load(Ordering::Relaxed) - heap_base;
        let before = client.stats();
        let cpu_before = common::cpu_seconds();
        std::thread::sleep(interval * periods);
        let after = client.stats();
        let cpu = common::cpu_seconds() - cpu_before;
        let p = f64::from(periods);
        out.push(Level {
            held: level,
            acquire_p50_us: percentile(&latencies, 0.5) / 1000.0,
            acquire_p99_us: percentile(&latencies, 0.99) / 1000.0,
            trips_per_period: (after.renewal_round_trips - before.renewal_round_trips) as f64 / p,
            renewal_ms_per_period: (after.renewal_time - before.renewal_time).as_secs_f64()
                * 1000.0
                / p,
            cpu_ms_per_period: cpu * 1000.0 / p,
            heap_bytes_per_lock: heap as f64 / level as f64,
            threads: common::thread_count(),
            connections: server.info_number("clients", "connected_clients"),
        });
        assert!(guards.iter().all(|g| !g.is_lost()), "a lease was lost");
    }
    out
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// Median hand-off latency (us) among `threads` threads of one process taking one lock.
fn handoff_with_waiters(server: &RedisServer, threads: usize, run: Duration) -> f64 {
    let client = Client::open(server.url()).expect("client");
    let name = format!("handoff:{}", SEQ.fetch_add(1, Ordering::Relaxed));
    let start = Arc::new(Barrier::new(threads));
    let began = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let (client, name, start) = (client.clone(), name.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                let m = client.mutex(&name);
                let mut events = Vec::new();
                while began.elapsed() < run {
                    let g = m.lock().expect("lock");
                    let acquired = Instant::now();
                    std::thread::sleep(Duration::from_micros(200));
                    let release_start = Instant::now();
                    g.unlock().expect("unlock");
                    let released = release_start + release_start.elapsed() / 2;
                    events.push((acquired, released));
                }
                events
            })
        })
        .collect();
    let mut events: Vec<(Instant, Instant)> = handles
        .into_iter()
        .flat_map(|h| h.join().expect("thread"))
        .collect();
    events.sort_by_key(|e| e.0);
    let mut gaps: Vec<u64> = events
        .windows(2)
        .filter(|w| w[1].0 >= w[0].1)
        .map(|w| (w[1].0 - w[0].1).as_nanos() as u64)
        .collect();
    gaps.sort_unstable();
    percentile(&gaps, 0.5) / 1000.0
}

fn main() {
    let measuring = common::measuring();
    let server = RedisServer::start();
    let (levels, periods, rounds, run): (&[usize], u32, usize, Duration) = if measuring {
        (&[10, 100, 1000, 10_000], 5, 3, Duration::from_secs(3))
    } else {
        (&[10, 100], 1, 1, Duration::from_millis(300))
    };

    let runs: Vec<Vec<Level>> = (0..rounds)
        .map(|_| held_locks(&server, levels, periods))
        .collect();
    println!("held locks: renewal interval 1 s, {periods} periods per level, {rounds} rounds");
    println!(
        "  {:>6}  {:>12}  {:>12}  {:>12}  {:>14}  {:>11}  {:>12}  {:>7}  {:>5}",
        "held",
        "acq p50 us",
        "acq p99 us",
        "trips/period",
        "renew ms/period",
        "cpu ms/per.",
        "heap B/lock",
        "threads",
        "conns"
    );
    let mut json = Json::default();
    json.text("benchmark", "scale")
        .num("renewal_interval_ms", 1000.0)
        .num("periods", f64::from(periods))
        .num("rounds", rounds as f64);
    let mut series: [Vec<(f64, Spread)>; 6] = Default::default();
    for (i, &level) in levels.iter().enumerate() {
        let pick = |f: fn(&Level) -> f64| spread(runs.iter().map(|r| f(&r[i])).collect());
        let figures = [
            pick(|l| l.acquire_p50_us),
            pick(|l| l.acquire_p99_us),
            pick(|l| l.trips_per_period),
            pick(|l| l.renewal_ms_per_period),
            pick(|l| l.cpu_ms_per_period),
            pick(|l| l.heap_bytes_per_lock),
        ];
        let last = &runs[runs.len() - 1][i];
        println!(
            "  {:>6}  {:>12.1}  {:>12.1}  {:>12.1}  {:>14.2}  {:>11.2}  {:>12.0}  {:>7}  {:>5}",
            last.held,
            figures[0].median,
            figures[1].median,
            figures[2].median,
            figures[3].median,
            figures[4].median,
            figures[5].median,
            last.threads,
            last.connections
        );
        for (s, f) in series.iter_mut().zip(figures) {
            s.push((level as f64, f));
        }
        json.num(&format!("threads_at_{level}"), last.threads as f64)
            .num(&format!("connections_at_{level}"), last.connections as f64);
    }
    json.series("acquire_p50_us", &series[0])
        .series("acquire_p99_us", &series[1])
        .series("renewal_round_trips_per_period", &series[2])
        .series("renewal_ms_per_period", &series[3])
        .series("client_cpu_ms_per_period", &series[4])
        .series("heap_bytes_per_held_lock", &series[5]);

    let waiter_counts: &[usize] = if measuring {
        &[2, 4, 8, 16, 32, 64]
    } else {
        &[2, 4]
    };
    println!("hand-off latency by waiting threads (one process, hold 200 us):");
    let mut handoffs = Vec::new();
    for &n in waiter_counts {
        let s = spread(
            (0..rounds)
                .map(|_| handoff_with_waiters(&server, n, run))
                .collect(),
        );
        println!(
            "  {n:>3} threads: p50 {:.1} us  [{:.1} .. {:.1}]",
            s.median, s.min, s.max
        );
        handoffs.push((n as f64, s));
    }
    json.series("handoff_p50_us_by_threads", &handoffs);
    common::write_results("scale", &json);
}
