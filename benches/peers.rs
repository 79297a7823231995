//! redmutex beside what a Rust user would pick instead today, the `redlock` crate, on the
//! same workloads in the same run:
//! - uncontended lock + unlock on one thread, on one `redis-server` (`Mutex` and the crate's
//!   `RedLock` over that one instance) and over 3 (`Redlock` and `RedLock`), interleaved;
//! - 4 clients (one thread each, as 4 processes would be) taking one lock in a loop and
//!   holding it 200 us, one library after the other, in alternating rounds: acquisitions per
//!   second and commands Redis ran per acquisition (script internals included).
//!
//! `cargo bench --bench peers` measures and writes `target/bench-results/peers.json`. Run by
//! `cargo test --benches`, it does a short smoke run instead.

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{interleaved_rates, spread, Cycle, Json, Spread};
use redmutex::{Client, Redlock};
use support::RedisServer;

const LEASE_MS: usize = 30_000;
const HOLD: Duration = Duration::from_micros(200);
const CLIENTS: usize = 4;

fn redmutex_cycle(client: &Client) -> Cycle<'static> {
    let m = client.mutex("peers-mutex");
    Box::new(move || m.lock().expect("lock").unlock().expect("unlock"))
}

fn redmutex_redlock_cycle(servers: &[RedisServer]) -> Cycle<'static> {
    let clients: Vec<Client> = servers
        .iter()
        .map(|s| {
            Client::builder()
                .pool_size(1)
                .open(s.url())
                .expect("client")
        })
        .collect();
    let redlock = Redlock::new(clients).expect("redlock");
    let m = redlock.mutex("peers-redlock");
    Box::new(move || {
        m.lock().expect("lock").unlock().expect("unlock");
    })
}

fn redlock_crate_cycle(servers: &[RedisServer], resource: &'static str) -> Cycle<'static> {
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let rl = redlock::RedLock::new(urls);
    Box::new(move || {
        let lock = rl
            .lock(resource.as_bytes(), LEASE_MS)
            .expect("redlock crate: lock")
            .expect("uncontended: taken");
        rl.unlock(&lock);
    })
}

/// Commands Redis ran so far, script internals included (the `INFO` calls that read it
/// aside).
fn commands_run(server: &RedisServer) -> u64 {
    server.info_number("stats", "total_commands_processed")
}

/// 4 clients, one thread each, take one lock for `time`, holding it `HOLD` each time;
/// `make` makes one client's acquire-hold-release loop body. Returns acquisitions per
/// second, commands run per acquisition, and Jain's fairness index over the clients'
/// acquisitions.
fn contended(
    server: &RedisServer,
    time: Duration,
    make: &dyn Fn(usize) -> Box<dyn FnMut() + Send>,
) -> (f64, f64, f64) {
    let stop = Arc::new(AtomicBool::new(false));
    let taken: Arc<Vec<AtomicU64>> = Arc::new((0..CLIENTS).map(|_| AtomicU64::new(0)).collect());
    let bodies: Vec<_> = (0..CLIENTS).map(make).collect();
    let before = commands_run(server);
    let start = Instant::now();
    let threads: Vec<_> = bodies
        .into_iter()
        .enumerate()
        .map(|(i, mut body)| {
            let (stop, taken) = (Arc::clone(&stop), Arc::clone(&taken));
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    body();
                    taken[i].fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    std::thread::sleep(time);
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("worker");
    }
    let elapsed = start.elapsed().as_secs_f64();
    let per_client: Vec<f64> = taken
        .iter()
        .map(|n| n.load(Ordering::Relaxed) as f64)
        .collect();
    let n = per_client.iter().sum::<f64>().max(1.0);
    let sum_sq: f64 = per_client.iter().map(|x| x * x).sum();
    let jain = n * n / (CLIENTS as f64 * sum_sq.max(1.0));
    // Two INFO calls of ours.
    let commands = commands_run(server).saturating_sub(before + 1) as f64;
    (n / elapsed, commands / n, jain)
}

fn redmutex_body(url: String) -> Box<dyn FnMut() + Send> {
    let client = Client::open(url).expect("client");
    Box::new(move || {
        let g = client.mutex("peers-contended").lock().expect("lock");
        std::thread::sleep(HOLD);
        g.unlock().expect("unlock");
    })
}

fn redlock_crate_body(url: String) -> Box<dyn FnMut() + Send> {
    let rl = redlock::RedLock::new(vec![url]);
    Box::new(move || {
        // What its documentation shows: try (with its own retries) until taken.
        let lock = loop {
            if let Some(lock) = rl
                .lock(b"peers-contended-crate", LEASE_MS)
                .expect("redlock crate: lock")
            {
                break lock;
            }
        };
        std::thread::sleep(HOLD);
        rl.unlock(&lock);
    })
}

fn main() {
    let measuring = common::measuring();
    let (rounds, round_time) = match measuring {
        true => (5, Duration::from_secs(2)),
        false => (1, Duration::from_millis(200)),
    };
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let one = &servers[..1];
    let client = Client::builder()
        .pool_size(1)
        .open(servers[0].url())
        .expect("client");
    let mut single = vec![
        redmutex_cycle(&client),
        redlock_crate_cycle(one, "peers-crate-1"),
    ];
    let mut triple = vec![
        redmutex_redlock_cycle(&servers),
        redlock_crate_cycle(&servers, "peers-crate-3"),
    ];
    let (mut s_ours, mut s_theirs, mut s_ratio) = (Vec::new(), Vec::new(), Vec::new());
    let (mut t_ours, mut t_theirs, mut t_ratio) = (Vec::new(), Vec::new(), Vec::new());
    let (mut c_ours, mut c_theirs, mut c_ratio) = (Vec::new(), Vec::new(), Vec::new());
    let (mut cmd_ours, mut cmd_theirs) = (Vec::new(), Vec::new());
    let (mut jain_ours, mut jain_theirs) = (Vec::new(), Vec::new());
    let url = servers[0].url();
    for round in 0..rounds {
        let r = interleaved_rates(round_time, &mut single);
        s_ours.push(r[0]);
        s_theirs.push(r[1]);
        s_ratio.push(r[0] / r[1]);
        let r = interleaved_rates(round_time, &mut triple);
        t_ours.push(r[0]);
        t_theirs.push(r[1]);
        t_ratio.push(r[0] / r[1]);
        let ours_first = round % 2 == 0;
        let run = |ours: bool| match ours {
            true => contended(&servers[0], round_time, &|_| redmutex_body(url.clone())),
            false => contended(&servers[0], round_time, &|_| {
                redlock_crate_body(url.clone())
            }),
        };
        let (a, b) = (run(ours_first), run(!ours_first));
        let (ours, theirs) = if ours_first { (a, b) } else { (b, a) };
        c_ours.push(ours.0);
        c_theirs.push(theirs.0);
        c_ratio.push(ours.0 / theirs.0);
        cmd_ours.push(ours.1);
        cmd_theirs.push(theirs.1);
        jain_ours.push(ours.2);
        jain_theirs.push(theirs.2);
    }
    let show = |label: &str, s: Spread| common::print_rate(label, s);
    println!("peers: redmutex beside the redlock crate, {rounds} rounds of {round_time:?}");
    println!(" uncontended lock + unlock, one instance");
    show("  redmutex Mutex", spread(s_ours.clone()));
    show("  redlock crate", spread(s_theirs.clone()));
    common::print_ratio("  redmutex / redlock crate", spread(s_ratio.clone()));
    println!(" uncontended lock + unlock, three instances");
    show("  redmutex Redlock", spread(t_ours.clone()));
    show("  redlock crate", spread(t_theirs.clone()));
    common::print_ratio("  redmutex / redlock crate", spread(t_ratio.clone()));
    println!(" {CLIENTS} clients on one lock, held {HOLD:?}");
    show("  redmutex Mutex acquisitions", spread(c_ours.clone()));
    show("  redlock crate acquisitions", spread(c_theirs.clone()));
    common::print_ratio("  redmutex / redlock crate", spread(c_ratio.clone()));
    common::print_ratio("  redmutex commands run / acq", spread(cmd_ours.clone()));
    common::print_ratio(
        "  redlock crate commands run / acq",
        spread(cmd_theirs.clone()),
    );
    common::print_ratio("  redmutex fairness (Jain)", spread(jain_ours.clone()));
    common::print_ratio(
        "  redlock crate fairness (Jain)",
        spread(jain_theirs.clone()),
    );
    let mut json = Json::default();
    json.text("benchmark", "peers")
        .num("rounds", rounds as f64)
        .num("round_seconds", round_time.as_secs_f64())
        .num("contending_clients", CLIENTS as f64)
        .num("hold_us", HOLD.as_micros() as f64)
        .spread("single_redmutex_ops_per_sec", spread(s_ours))
        .spread("single_crate_ops_per_sec", spread(s_theirs))
        .spread("single_ratio", spread(s_ratio))
        .spread("triple_redmutex_ops_per_sec", spread(t_ours))
        .spread("triple_crate_ops_per_sec", spread(t_theirs))
        .spread("triple_ratio", spread(t_ratio))
        .spread("contended_redmutex_per_sec", spread(c_ours))
        .spread("contended_crate_per_sec", spread(c_theirs))
        .spread("contended_ratio", spread(c_ratio))
        .spread("contended_redmutex_commands_per_acq", spread(cmd_ours))
        .spread("contended_crate_commands_per_acq", spread(cmd_theirs))
        .spread("contended_redmutex_jain", spread(jain_ours))
        .spread("contended_crate_jain", spread(jain_theirs));
    if measuring {
        common::write_results("peers", &json);
    }
}
