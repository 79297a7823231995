//! Redlock, uncontended, over 3 and 5 local `redis-server`s: lock + unlock on one thread,
//! beside a raw loop that does what the algorithm must at the least — `SET NX PX` on every
//! instance in parallel (every request written, then every reply read), then the
//! compare-and-delete on every instance in parallel — interleaved in the same rounds.
//!
//! `cargo bench --bench redlock` measures and writes `target/bench-results/redlock.json`.
//! Run by `cargo test --benches`, it does a short smoke run instead.

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use std::time::{Duration, Instant};

use common::{interleaved_rates, spread, Cycle, Json};
use redmutex::{Client, Redlock};
use support::RedisServer;

/// Sends one command on every connection, then reads every reply.
fn parallel(conns: &mut [redis::Connection], cmds: &[redis::Cmd]) -> Vec<redis::Value> {
    for (conn, cmd) in conns.iter_mut().zip(cmds) {
        conn.send_packed_command(&cmd.get_packed_command())
            .expect("send");
    }
    conns
        .iter_mut()
        .map(|c| c.recv_response().expect("reply"))
        .collect()
}

fn raw_cycle(servers: &[RedisServer]) -> Cycle<'static> {
    let mut conns: Vec<redis::Connection> = servers.iter().map(RedisServer::conn).collect();
    let release = redis::Script::new(common::RAW_RELEASE_LUA);
    for c in &mut conns {
        release.load(c).expect("SCRIPT LOAD");
    }
    let hash = release.get_hash().to_owned();
    let mut seq = 0u64;
    Box::new(move || {
        seq += 1;
        let token = format!("raw-token:{seq}");
        let set = redis::cmd("SET")
            .arg("raw-lock")
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .clone();
        let n = conns.len();
        let taken = parallel(&mut conns, &vec![set; n]);
        assert!(taken.iter().all(|v| *v == redis::Value::Okay));
        let cad = redis::cmd("EVALSHA")
            .arg(&hash)
            .arg(1)
            .arg("raw-lock")
            .arg(&token)
            .clone();
        let deleted = parallel(&mut conns, &vec![cad; n]);
        assert!(deleted.iter().all(|v| *v == redis::Value::Int(1)));
    })
}

/// The same two phases with the crate's own acquire and release scripts: what the scripts
/// cost the instances, apart from what the client adds.
fn raw_cycle_with_crate_scripts(servers: &[RedisServer]) -> Cycle<'static> {
    let mut conns: Vec<redis::Connection> = servers.iter().map(RedisServer::conn).collect();
    let acquire = redis::Script::new(common::ACQUIRE_LUA);
    let release = redis::Script::new(common::CRATE_RELEASE_LUA);
    for c in &mut conns {
        acquire.load(c).expect("SCRIPT LOAD");
        release.load(c).expect("SCRIPT LOAD");
    }
    let (acquire, release) = (acquire.get_hash().to_owned(), release.get_hash().to_owned());
    let mut seq = 0u64;
    Box::new(move || {
        seq += 1;
        let token = format!("raw-token:{seq}");
        let take = redis::cmd("EVALSHA")
            .arg(&acquire)
            .arg(3)
            .arg(&["rawc:{l}", "rawc:{l}:fence", "rawc:{l}:waiting"][..])
            .arg(&token)
            .arg(30_000)
            .arg("")
            .clone();
        let n = conns.len();
        let taken = parallel(&mut conns, &vec![take; n]);
        assert!(
            taken.iter().all(
                |v| matches!(v, redis::Value::Array(a) if a.first() == Some(&redis::Value::Int(1)))
            ),
            "{taken:?}"
        );
        let give = redis::cmd("EVALSHA")
            .arg(&release)
            .arg(2)
            .arg(&["rawc:{l}", "rawc:{l}:waiting"][..])
            .arg(&token)
            .arg("rawc:{l}:ch")
            .clone();
        let deleted = parallel(&mut conns, &vec![give; n]);
        assert!(deleted.iter().all(|v| *v == redis::Value::Int(1)));
    })
}

fn redlock_cycle(redlock: &Redlock) -> Cycle<'static> {
    let m = redlock.mutex("bench-lock");
    Box::new(move || {
        let g = m.lock().expect("lock");
        g.unlock().expect("unlock");
    })
}

/// The median time of one PING round trip to `server`, in microseconds.
fn ping_us(server: &RedisServer) -> f64 {
    let mut conn = server.conn();
    let mut times: Vec<f64> = (0..2000)
        .map(|_| {
            let t = Instant::now();
            let _: String = redis::cmd("PING").query(&mut conn).expect("PING");
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

fn main() {
    let measuring = common::measuring();
    let (rounds, round_time) = if measuring {
        (9, Duration::from_secs(3))
    } else {
        (1, Duration::from_millis(100))
    };
    let mut json = Json::default();
    json.text("benchmark", "redlock")
        .num("rounds", rounds as f64);
    for n in [3usize, 5] {
        let servers: Vec<RedisServer> = (0..n).map(|_| RedisServer::start()).collect();
        let clients: Vec<Client> = servers
            .iter()
            .map(|s| {
                Client::builder()
                    .pool_size(1)
                    .open(s.url())
                    .expect("client")
            })
            .collect();
        let redlock = Redlock::new(clients.clone()).expect("redlock");
        let mut variants = [
            raw_cycle(&servers),
            redlock_cycle(&redlock),
            raw_cycle_with_crate_scripts(&servers),
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
        let rtt = ping_us(&servers[0]);
        let (raw, ours, ratio, scripts) =
            (spread(raw), spread(ours), spread(ratios), spread(scripts));
        let cycle_us = 1e6 / ours.median;
        println!("Redlock over {n} instances, uncontended, {rounds} rounds of {round_time:?}");
        common::print_rate("raw parallel SET NX PX + CAD", raw);
        common::print_rate("Redlock lock + unlock", ours);
        common::print_ratio("ratio to raw (same round)", ratio);
        common::print_ratio("raw loop, crate's scripts", scripts);
        println!(
            "  one cycle {cycle_us:.1} us = {:.2} PING round trips of {rtt:.1} us (two phases)",
            cycle_us / rtt
        );
        json.spread(&format!("raw_ops_per_sec_{n}"), raw)
            .spread(&format!("redlock_ops_per_sec_{n}"), ours)
            .spread(&format!("ratio_to_raw_{n}"), ratio)
            .spread(&format!("crate_scripts_ratio_to_raw_{n}"), scripts)
            .num(&format!("ping_rtt_us_{n}"), rtt)
            .num(&format!("cycle_round_trips_{n}"), cycle_us / rtt);
        for c in clients {
            c.shutdown();
        }
    }
    common::write_results("redlock", &json);
}
