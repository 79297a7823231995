//! Uncontended lock + unlock on one thread (`Mutex` and `FairMutex`), lock + drop (whose
//! release does not wait for its reply), and re-entrant re-lock, beside the physical limit measured in the same run: a raw
//! redis-rs loop of `SET NX PX` + `EVALSHA` compare-and-delete on one connection, waiting for
//! both replies.
//!
//! `cargo bench --bench uncontended` measures (rounds of the three loops, interleaved, median
//! and spread reported) and writes `target/bench-results/uncontended.json`. Run by
//! `cargo test --benches`, it does a short smoke run instead.

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use common::{crate_scripts_cycle, interleaved_rates, raw_cycle, Cycle};

use std::time::{Duration, Instant};

use redmutex::Client;
use support::RedisServer;

struct Mode {
    rounds: usize,
    round_time: Duration,
    /// A real measurement (not a smoke run), whose figures are written out.
    measuring: bool,
}

fn mode() -> Mode {
    if common::measuring() {
        Mode {
            rounds: 9,
            round_time: Duration::from_secs(3),
            measuring: true,
        }
    } else {
        Mode {
            rounds: 1,
            round_time: Duration::from_millis(100),
            measuring: false,
        }
    }
}

fn mutex_cycle(client: &Client) -> Cycle<'static> {
    let m = client.mutex("bench-lock");
    Box::new(move || {
        let g = m.lock().expect("lock");
        g.unlock().expect("unlock");
    })
}

fn fair_mutex_cycle(client: &Client) -> Cycle<'static> {
    let m = client.fair_mutex("bench-fair");
    Box::new(move || {
        let g = m.lock().expect("lock");
        g.unlock().expect("unlock");
    })
}

/// Lock + drop: the drop writes the release, and the next lock's request goes out before its
/// reply is read.
fn mutex_drop_cycle(client: &Client) -> Cycle<'static> {
    let m = client.mutex("bench-drop");
    Box::new(move || drop(m.lock().expect("lock")))
}

fn reentry_rate(client: &Client, time: Duration) -> f64 {
    let m = client.mutex("bench-reentry");
    let _outer = m.lock().expect("outer lock");
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed() < time {
        for _ in 0..1024 {
            let g = m.lock().expect("re-entry");
            drop(g);
        }
        n += 1024;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn median_and_spread(mut v: Vec<f64>) -> (f64, f64, f64) {
    v.sort_by(|a, b| a.total_cmp(b));
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

fn main() {
    let mode = mode();
    let server = RedisServer::start();
    let client = Client::builder()
        .pool_size(1)
        .open(server.url())
        .expect("client");

    let mut raw = Vec::new();
    let mut ours = Vec::new();
    let mut ratios = Vec::new();
    let mut scripts_only = Vec::new();
    let mut reentrant = Vec::new();
    let mut dropping = Vec::new();
    let mut drop_ratios = Vec::new();
    let mut fair = Vec::new();
    let mut fair_ratios = Vec::new();
    let fair_client = Client::builder()
        .pool_size(1)
        .open(server.url())
        .expect("client");
    let dropper = Client::builder()
        .pool_size(1)
        .open(server.url())
        .expect("client");
    let mut variants = vec![
        raw_cycle(server.conn(), "raw-lock"),
        mutex_cycle(&client),
        crate_scripts_cycle(server.conn(), "l"),
        mutex_drop_cycle(&dropper),
        fair_mutex_cycle(&fair_client),
    ];
    // With the `metrics` feature, `client` records metrics (with no recorder installed):
    // beside it, a client that records none, in the same turns.
    #[cfg(feature = "metrics")]
    let quiet = Client::builder()
        .pool_size(1)
        .metrics(None)
        .open(server.url())
        .expect("client");
    #[cfg(feature = "metrics")]
    variants.push(mutex_cycle(&quiet));
    let mut metrics_ratios = Vec::new();
    for _ in 0..mode.rounds {
        let rates = interleaved_rates(mode.round_time, &mut variants);
        raw.push(rates[0]);
        ours.push(rates[1]);
        ratios.push(rates[1] / rates[0]);
        scripts_only.push(rates[2]);
        dropping.push(rates[3]);
        drop_ratios.push(rates[3] / rates[0]);
        fair.push(rates[4]);
        fair_ratios.push(rates[4] / rates[0]);
        if let Some(without) = rates.get(5) {
            metrics_ratios.push(rates[1] / without);
        }
        reentrant.push(reentry_rate(&client, mode.round_time / 4));
    }
    let stats = client.stats();
    let trips_per_cycle = stats.attempts as f64 / stats.acquisitions.max(1) as f64;

    let (raw_med, raw_lo, raw_hi) = median_and_spread(raw);
    let (our_med, our_lo, our_hi) = median_and_spread(ours);
    let (ratio_med, ratio_lo, ratio_hi) = median_and_spread(ratios);
    let (re_med, re_lo, re_hi) = median_and_spread(reentrant);
    let (sc_med, sc_lo, sc_hi) = median_and_spread(scripts_only);
    let (dr_med, dr_lo, dr_hi) = median_and_spread(dropping);
    let (drr_med, drr_lo, drr_hi) = median_and_spread(drop_ratios);
    let (fa_med, fa_lo, fa_hi) = median_and_spread(fair);
    let (far_med, far_lo, far_hi) = median_and_spread(fair_ratios);

    println!(
        "uncontended, one thread, {} rounds of {:?}",
        mode.rounds, mode.round_time
    );
    println!("  raw SET NX PX + EVALSHA CAD   {raw_med:>12.0} /s  [{raw_lo:.0} .. {raw_hi:.0}]");
    println!("  Mutex lock + unlock           {our_med:>12.0} /s  [{our_lo:.0} .. {our_hi:.0}]");
    println!(
        "  ratio to raw (same round)     {ratio_med:>12.3}     [{ratio_lo:.3} .. {ratio_hi:.3}]"
    );
    println!("  raw loop with the crate's scripts {sc_med:>8.0} /s  [{sc_lo:.0} .. {sc_hi:.0}]");
    println!("  Mutex lock + drop             {dr_med:>12.0} /s  [{dr_lo:.0} .. {dr_hi:.0}]");
    println!("  lock + drop / raw (same round) {drr_med:>11.3}     [{drr_lo:.3} .. {drr_hi:.3}]");
    println!("  FairMutex lock + unlock       {fa_med:>12.0} /s  [{fa_lo:.0} .. {fa_hi:.0}]");
    println!("  FairMutex / raw (same round)  {far_med:>12.3}     [{far_lo:.3} .. {far_hi:.3}]");
    println!("  re-entrant lock + drop        {re_med:>12.0} /s  [{re_lo:.0} .. {re_hi:.0}]");
    println!("  acquire attempts per lock     {trips_per_cycle:>12.3}");
    let metrics_line = match metrics_ratios.is_empty() {
        true => String::new(),
        false => {
            let (m, lo, hi) = median_and_spread(metrics_ratios);
            println!("  metrics on (no recorder) / off {m:>11.3}     [{lo:.3} .. {hi:.3}]");
            format!(
                ",\n  \"metrics_on_to_off\": {{\"median\": {m:.4}, \"min\": {lo:.4}, \"max\": {hi:.4}}}"
            )
        }
    };

    let json = format!(
        concat!(
            "{{\n",
            "  \"benchmark\": \"uncontended\",\n",
            "  \"rounds\": {},\n",
            "  \"round_seconds\": {},\n",
            "  \"raw_ops_per_sec\": {{\"median\": {:.1}, \"min\": {:.1}, \"max\": {:.1}}},\n",
            "  \"mutex_ops_per_sec\": {{\"median\": {:.1}, \"min\": {:.1}, \"max\": {:.1}}},\n",
            "  \"ratio_to_raw\": {{\"median\": {:.4}, \"min\": {:.4}, \"max\": {:.4}}},\n",
            "  \"raw_with_crate_scripts_ops_per_sec\": {{\"median\": {:.1}, \"min\": {:.1}, \"max\": {:.1}}},\n",
            "  \"drop_ops_per_sec\": {{\"median\": {:.1}, \"min\": {:.1}, \"max\": {:.1}}},\n",
            "  \"drop_ratio_to_raw\": {{\"median\": {:.4}, \"min\": {:.4}, \"max\": {:.4}}},\n",
            "  \"fair_mutex_ops_per_sec\": {{\"median\": {:.1}, \"min\": {:.1}, \"max\": {:.1}}},\n",
            "  \"fair_ratio_to_raw\": {{\"median\": {:.4}, \"min\": {:.4}, \"max\": {:.4}}},\n",
            "  \"reentry_ops_per_sec\": {{\"median\": {:.1}, \"min\": {:.1}, \"max\": {:.1}}}{}\n",
            "}}\n"
        ),
        mode.rounds,
        mode.round_time.as_secs_f64(),
        raw_med,
        raw_lo,
        raw_hi,
        our_med,
        our_lo,
        our_hi,
        ratio_med,
        ratio_lo,
        ratio_hi,
        sc_med,
        sc_lo,
        sc_hi,
        dr_med,
        dr_lo,
        dr_hi,
        drr_med,
        drr_lo,
        drr_hi,
        fa_med,
        fa_lo,
        fa_hi,
        far_med,
        far_lo,
        far_hi,
        re_med,
        re_lo,
        re_hi,
        metrics_line
    );
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target/bench-results");
    if mode.measuring && std::fs::create_dir_all(&dir).is_ok() {
        let path = dir.join("uncontended.json");
        match std::fs::write(&path, common::with_host_steal(json)) {
            Ok(()) => println!("  figures written to {}", path.display()),
            Err(e) => eprintln!("  could not write {}: {e}", path.display()),
        }
    }
}
