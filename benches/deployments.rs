//! Deployments: a local Redis Cluster of three masters.
//!
//! 1. Uncontended lock + unlock on one thread, beside a raw redis-rs loop (`SET NX PX` +
//!    `EVALSHA` compare-and-delete) on a plain connection to the same master, interleaved in
//!    the same rounds.
//! 2. The renewal of 10,000 held locks whose names spread over the three masters: round trips
//!    per renewal period, against the bound of one per batch of 1,000 plus one per master.
//! 3. The same cluster with one replica per master, where every lease write waits for a
//!    replica's acknowledgement (`WAIT`, the default there): uncontended lock + unlock with
//!    and without acknowledgements beside the raw loop and beside the acknowledged floor (the
//!    raw loop with `WAIT 1` in the `SET`'s round trip), and the renewal of 10,000 held locks
//!    with acknowledgements.
//!
//! `cargo bench --bench deployments` measures and writes
//! `target/bench-results/deployments.json`. Run by `cargo test --benches`, it does a short
//! smoke run instead.

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use std::time::{Duration, Instant};

use common::{
    acked_raw_cycle, crate_scripts_cycle, interleaved_rates, raw_cycle, spread, Cycle, Json,
};
use redmutex::Client;
use support::cluster::ClusterDeployment;
use support::RedisServer;

/// How many renewals the client sends in one pipelined round trip (`lease/renewal.rs`).
const RENEWAL_BATCH: usize = 1000;

fn mutex_cycle(client: &Client) -> Cycle<'static> {
    let m = client.mutex("bench-lock");
    Box::new(move || {
        let g = m.lock().expect("lock");
        g.unlock().expect("unlock");
    })
}

fn main() {
    let measuring = common::measuring();
    let (rounds, round_time) = if measuring {
        (9, Duration::from_secs(3))
    } else {
        (1, Duration::from_millis(100))
    };
    let cluster = ClusterDeployment::start_masters();

    // 1. Uncontended, beside the raw loop on the lock's own master.
    let client = Client::builder()
        .pool_size(1)
        .open(cluster.url())
        .expect("client");
    let master = cluster.master_of("redmutex:{bench-lock}");
    // The same hash tag as the Mutex's keys: the same slot, the same master.
    let mut variants = [
        raw_cycle(master.conn(), "{bench-lock}:raw"),
        mutex_cycle(&client),
        crate_scripts_cycle(master.conn(), "bench-lock"),
    ];
    let (mut raw, mut ours, mut ratios, mut scripts) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let rates = interleaved_rates(round_time, &mut variants);
        raw.push(rates[0]);
        ours.push(rates[1]);
        ratios.push(rates[1] / rates[0]);
        scripts.push(rates[2] / rates[0]);
    }
    drop(variants);
    client.shutdown();
    let (raw, ours, ratio, scripts) = (spread(raw), spread(ours), spread(ratios), spread(scripts));
    println!("cluster of 3 masters, uncontended, one thread, {rounds} rounds of {round_time:?}");
    common::print_rate("raw SET NX PX + EVALSHA CAD", raw);
    common::print_rate("Mutex lock + unlock", ours);
    common::print_ratio("ratio to raw (same round)", ratio);
    common::print_ratio("raw loop, crate's scripts", scripts);

    // 2. Renewal of many locks over the three masters.
    let (held, interval, periods) = if measuring {
        (10_000usize, Duration::from_secs(2), 5)
    } else {
        (300, Duration::from_millis(300), 2)
    };
    let renewal = renew_held(&cluster, held, interval, periods);
    println!(
        "  {held} held locks over the masters {:?} (locks per master)",
        renewal.per_master
    );
    renewal.print();
    drop(cluster);

    // 3. With a replica per master: acknowledged lease writes.
    let cluster = ClusterDeployment::start();
    let acked = Client::builder()
        .pool_size(1)
        .open(cluster.url())
        .expect("client");
    let unacked = Client::builder()
        .pool_size(1)
        .no_replica_acks()
        .open(cluster.url())
        .expect("client");
    let master = cluster.master_of("redmutex:{bench-lock}");
    let mut variants = [
        raw_cycle(master.conn(), "{bench-lock}:raw"),
        mutex_cycle(&acked),
        mutex_cycle(&unacked),
        acked_raw_cycle(master.conn(), "{bench-lock}:raw-acked"),
    ];
    let (mut acked_ratios, mut unacked_ratios, mut acked_rates) =
        (Vec::new(), Vec::new(), Vec::new());
    let (mut floor_rates, mut floor_ratios) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let rates = interleaved_rates(round_time, &mut variants);
        acked_rates.push(rates[1]);
        acked_ratios.push(rates[1] / rates[0]);
        unacked_ratios.push(rates[2] / rates[0]);
        floor_rates.push(rates[3]);
        floor_ratios.push(rates[1] / rates[3]);
    }
    drop(variants);
    acked.shutdown();
    unacked.shutdown();
    let (acked_rate, acked_ratio, unacked_ratio) = (
        spread(acked_rates),
        spread(acked_ratios),
        spread(unacked_ratios),
    );
    let (floor_rate, floor_ratio) = (spread(floor_rates), spread(floor_ratios));
    println!("cluster of 3 masters and 3 replicas, uncontended, one thread");
    common::print_rate("Mutex, replica acks (default)", acked_rate);
    common::print_ratio("  ratio to raw (same round)", acked_ratio);
    common::print_rate("raw SET + WAIT 1, EVALSHA CAD", floor_rate);
    common::print_ratio("  Mutex with acks / this floor", floor_ratio);
    let unacknowledged = common::UNACKNOWLEDGED.load(std::sync::atomic::Ordering::Relaxed);
    println!("  floor cycles whose WAIT timed out: {unacknowledged}");
    common::print_ratio("Mutex, no_replica_acks: ratio", unacked_ratio);
    let acked_renewal = renew_held(&cluster, held, interval, periods);
    println!("  {held} held locks, every renewal batch acknowledged by a replica");
    acked_renewal.print();

    let mut json = Json::default();
    json.text("benchmark", "deployments")
        .num("rounds", rounds as f64)
        .spread("cluster_raw_ops_per_sec", raw)
        .spread("cluster_mutex_ops_per_sec", ours)
        .spread("cluster_ratio_to_raw", ratio)
        .spread("cluster_crate_scripts_ratio_to_raw", scripts)
        .num("held_locks", held as f64)
        .num("renewal_round_trips_per_period", renewal.trips)
        .num("renewal_round_trip_bound", renewal.bound as f64)
        .num("renewal_ms_per_period", renewal.time_ms)
        .spread("cluster_acked_mutex_ops_per_sec", acked_rate)
        .spread("cluster_acked_ratio_to_raw", acked_ratio)
        .spread("cluster_unacked_ratio_to_raw", unacked_ratio)
        .spread("cluster_acked_floor_ops_per_sec", floor_rate)
        .spread("cluster_acked_ratio_to_floor", floor_ratio)
        .num("acked_renewal_round_trips_per_period", acked_renewal.trips)
        .num("acked_renewal_round_trip_bound", acked_renewal.bound as f64)
        .num("acked_renewal_ms_per_period", acked_renewal.time_ms);
    for (i, n) in renewal.per_master.iter().enumerate() {
        json.num(&format!("locks_on_master_{i}"), *n as f64);
    }
    common::write_results("deployments", &json);
}

/// What renewing many held locks cost per renewal period.
struct Renewal {
    trips: f64,
    bound: usize,
    time_ms: f64,
    per_master: Vec<u64>,
}

impl Renewal {
    fn print(&self) {
        println!(
            "  renewal round trips / period  {:>10.2}     (bound {}); {:.1} ms per period",
            self.trips, self.bound, self.time_ms
        );
    }
}

/// Takes `held` locks spread over the cluster's masters with a client of its defaults, and
/// measures their renewal over `periods` periods of `interval`.
fn renew_held(
    cluster: &ClusterDeployment,
    held: usize,
    interval: Duration,
    periods: usize,
) -> Renewal {
    let client = Client::builder()
        .default_lease(Duration::from_secs(30))
        .renewal_interval(interval)
        .open(cluster.url())
        .expect("client");
    let guards: Vec<_> = (0..held)
        .map(|i| client.mutex(format!("held:{i}")).lock().expect("lock"))
        .collect();
    let per_master: Vec<u64> = cluster
        .masters()
        .into_iter()
        // Two keys per held lock: the lock and its fencing counter.
        .map(|m| dbsize(m) / 2)
        .collect();
    let deadline = Instant::now() + interval * (periods as u32 + 5) * 4;
    // The first period loads the renewal script on each master: measure from the second.
    while client.stats().renewals < held as u64 {
        assert!(Instant::now() < deadline, "renewal did not start");
        std::thread::sleep(interval / 10);
    }
    let before = client.stats();
    while client.stats().renewals < before.renewals + (held * periods) as u64 {
        assert!(Instant::now() < deadline, "renewal did not keep up");
        std::thread::sleep(interval / 10);
    }
    let after = client.stats();
    let renewed_periods = (after.renewals - before.renewals) as f64 / held as f64;
    let trips = (after.renewal_round_trips - before.renewal_round_trips) as f64 / renewed_periods;
    let time_ms = (after.renewal_time - before.renewal_time).as_secs_f64() * 1e3 / renewed_periods;
    assert!(guards.iter().all(|g| !g.is_lost()), "a lease was lost");
    drop(guards);
    client.shutdown();
    Renewal {
        trips,
        bound: held.div_ceil(RENEWAL_BATCH) + 3,
        time_ms,
        per_master,
    }
}

/// The number of keys of `node`.
fn dbsize(node: &RedisServer) -> u64 {
    redis::cmd("DBSIZE").query(&mut node.conn()).unwrap_or(0)
}
