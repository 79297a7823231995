//! Helpers shared by the benchmarks: measuring or smoke mode, medians with their spread, and
//! the JSON figures that `scripts/perf-report` turns into docs/performance.md.

#![allow(dead_code)]

pub mod latency;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The raw loops' release: the classic compare-and-delete.
pub const RAW_RELEASE_LUA: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

// The crate's own acquire and release scripts, read from their files.
pub const ACQUIRE_LUA: &str = concat!(
    include_str!("../../src/lease/lua/errors.lua"),
    include_str!("../../src/lease/lua/fence.lua"),
    include_str!("../../src/lease/lua/announce.lua"),
    include_str!("../../src/primitives/mutex/waiters.lua"),
    include_str!("../../src/primitives/mutex/take.lua"),
    include_str!("../../src/primitives/mutex/acquire.lua"),
);

pub const CRATE_RELEASE_LUA: &str = concat!(
    include_str!("../../src/primitives/mutex/release.lua"),
    include_str!("../../src/lease/lua/announce.lua"),
    include_str!("../../src/primitives/mutex/waiters.lua"),
    include_str!("../../src/primitives/mutex/release_to_waiting.lua"),
);

/// Whether this is a real measurement (`cargo bench`, which passes `--bench`) rather than
/// the short smoke run of `cargo test --benches`. Asked first thing by every benchmark, it
/// also marks the start of the run for [`host_steal_of_run`].
pub fn measuring() -> bool {
    RUN_START.get_or_init(HostTime::now);
    crate::support::measuring()
}

/// The machine's CPU time as Linux counts it (`/proc/stat`, all CPUs, in clock ticks): the
/// time the hypervisor gave to other guests while this one had work ("steal"), and all of
/// it. On a shared virtual machine a round that lost much CPU to other guests measures the
/// host as much as the code: the benchmarks report that share beside their figures.
#[derive(Clone, Copy, Debug)]
pub struct HostTime {
    steal: u64,
    total: u64,
}

static RUN_START: std::sync::OnceLock<Option<HostTime>> = std::sync::OnceLock::new();

impl HostTime {
    /// Now; `None` where `/proc/stat` cannot be read.
    pub fn now() -> Option<HostTime> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let line = stat.lines().next()?.strip_prefix("cpu ")?;
        let ticks: Vec<u64> = line
            .split_whitespace()
            .map(|v| v.parse().unwrap_or(0))
            .collect();
        // user nice system idle iowait irq softirq steal (guest time is within user).
        let total = ticks.iter().take(8).sum();
        Some(HostTime {
            steal: *ticks.get(7)?,
            total,
        })
    }

    /// The share of the machine's CPU time since `self` that the hypervisor gave to others.
    pub fn steal_share_since(&self) -> f64 {
        match HostTime::now() {
            Some(now) if now.total > self.total => {
                now.steal.saturating_sub(self.steal) as f64 / (now.total - self.total) as f64
            }
            _ => 0.0,
        }
    }
}

/// The share of the machine's CPU time the hypervisor gave to other guests since this
/// benchmark began (see [`HostTime`]).
pub fn host_steal_of_run() -> f64 {
    RUN_START
        .get()
        .copied()
        .flatten()
        .map_or(0.0, |start| start.steal_share_since())
}

/// A benchmark's JSON object with the share of CPU time other guests took during the run
/// ([`host_steal_of_run`]) as its last field.
pub fn with_host_steal(mut body: String) -> String {
    if let Some(end) = body.rfind("\n}") {
        let steal = host_steal_of_run();
        body.insert_str(end, &format!(",\n  \"host_steal\": {steal:.4}"));
    }
    body
}

/// A figure measured over several rounds.
#[derive(Debug, Clone, Copy)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

pub fn spread(mut v: Vec<f64>) -> Spread {
    v.sort_by(|a, b| a.total_cmp(b));
    if v.is_empty() {
        return Spread {
            median: 0.0,
            min: 0.0,
            max: 0.0,
        };
    }
    Spread {
        median: v[v.len() / 2],
        min: v[0],
        max: v[v.len() - 1],
    }
}

/// Prints a rate measured over rounds: `label  median /s  [min .. max]`.
pub fn print_rate(label: &str, s: Spread) {
    println!(
        "  {label:<30}{:>10.0} /s  [{:.0} .. {:.0}]",
        s.median, s.min, s.max
    );
}

/// Prints a ratio measured over rounds: `label  median  [min .. max]`.
pub fn print_ratio(label: &str, s: Spread) {
    println!(
        "  {label:<30}{:>10.3}     [{:.3} .. {:.3}]",
        s.median, s.min, s.max
    );
}

/// A flat JSON object built by hand (the benchmarks need no serde).
#[derive(Default)]
pub struct Json {
    fields: Vec<(String, String)>,
}

impl Json {
    pub fn num(&mut self, key: &str, value: f64) -> &mut Self {
        self.fields.push((key.to_owned(), format!("{value:.4}")));
        self
    }

    pub fn text(&mut self, key: &str, value: &str) -> &mut Self {
        self.fields.push((key.to_owned(), format!("{value:?}")));
        self
    }

    pub fn spread(&mut self, key: &str, s: Spread) -> &mut Self {
        self.fields.push((
            key.to_owned(),
            format!(
                "{{\"median\": {:.4}, \"min\": {:.4}, \"max\": {:.4}}}",
                s.median, s.min, s.max
            ),
        ));
        self
    }

    pub fn series(&mut self, key: &str, points: &[(f64, Spread)]) -> &mut Self {
        let mut out = String::from("[");
        for (i, (x, s)) in points.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            let _ = write!(
                out,
                "{{\"x\": {x}, \"median\": {:.4}, \"min\": {:.4}, \"max\": {:.4}}}",
                s.median, s.min, s.max
            );
        }
        out.push(']');
        self.fields.push((key.to_owned(), out));
        self
    }

    pub fn render(&self) -> String {
        let body: Vec<String> = self
            .fields
            .iter()
            .map(|(k, v)| format!("  {k:?}: {v}"))
            .collect();
        format!("{{\n{}\n}}\n", body.join(",\n"))
    }
}

/// Writes `target/bench-results/<name>.json` when measuring (a smoke run writes nothing).
pub fn write_results(name: &str, json: &Json) {
    if !measuring() {
        return;
    }
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/bench-results");
    let path = dir.join(format!("{name}.json"));
    let body = with_host_steal(json.render());
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, body)) {
        Ok(()) => println!("figures written to {}", path.display()),
        Err(e) => eprintln!("could not write {}: {e}", path.display()),
    }
}

/// This process's CPU time (user + system) so far, in seconds.
pub fn cpu_seconds() -> f64 {
    process_cpu_seconds("self")
}

/// The CPU time (user + system) of process `pid` ("self" for this one) so far, in seconds.
pub fn process_cpu_seconds(pid: &str) -> f64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0.0;
    };
    // Fields after the command name (which ends with ')'): utime is the 12th, stime the 13th.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0.0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (ticks(11) + ticks(12)) / 100.0
}

/// This process's resident memory, in bytes.
pub fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// The number of threads of this process.
pub fn thread_count() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

/// One variant of the measured cycle.
pub type Cycle<'a> = Box<dyn FnMut() + 'a>;

/// Runs the variants in turns of `CHUNK` cycles each until `time` has passed, and returns
/// each one's rate in cycles per second. Fine interleaving makes the ratios between variants
/// robust to the load of a shared machine drifting during the run.
pub fn interleaved_rates(time: Duration, variants: &mut [Cycle<'_>]) -> Vec<f64> {
    const CHUNK: u64 = 32;
    for v in variants.iter_mut() {
        for _ in 0..CHUNK {
            v(); // warm up: connections, script cache
        }
    }
    let mut spent = vec![Duration::ZERO; variants.len()];
    let mut cycles = 0u64;
    let start = Instant::now();
    let n = variants.len();
    let mut turn = 0;
    while start.elapsed() < time {
        // Rotate who goes first, so that no variant always follows the same one.
        for k in 0..n {
            let i = (turn + k) % n;
            let t = Instant::now();
            for _ in 0..CHUNK {
                variants[i]();
            }
            spent[i] += t.elapsed();
        }
        turn += 1;
        cycles += CHUNK;
    }
    spent
        .iter()
        .map(|d| cycles as f64 / d.as_secs_f64())
        .collect()
}

/// The raw limit: `SET key NX PX` then an `EVALSHA` compare-and-delete, on one connection.
pub fn raw_cycle(mut conn: redis::Connection, key: &'static str) -> Cycle<'static> {
    let release = redis::Script::new(RAW_RELEASE_LUA);
    let mut seq = 0u64;
    Box::new(move || {
        seq += 1;
        let token = format!("raw-token:{seq}");
        let ok: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query(&mut conn)
            .expect("SET NX PX");
        assert!(ok.is_some());
        release_raw(&release, &mut conn, key, &token);
    })
}

/// The raw loops' release: the `EVALSHA` compare-and-delete of `token`, which must hold.
fn release_raw(release: &redis::Script, conn: &mut redis::Connection, key: &str, token: &str) {
    let deleted: i64 = release.key(key).arg(token).invoke(conn).expect("EVALSHA");
    assert_eq!(deleted, 1);
}

/// How many of the floor loop's `WAIT 1` timed out with no replica's acknowledgement.
pub static UNACKNOWLEDGED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// The floor of an acknowledged lock: `SET key NX PX` and `WAIT 1` in one round trip (the
/// lock counts once a replica holds it), then the `EVALSHA` compare-and-delete, which waits
/// for no replica (a release lost in a failover only delays the next holder by the lease).
pub fn acked_raw_cycle(mut conn: redis::Connection, key: &'static str) -> Cycle<'static> {
    let release = redis::Script::new(RAW_RELEASE_LUA);
    // A replica that has just started may not be attached yet: wait for it (a minute at most).
    let attached = (0..60).any(|_| {
        redis::cmd("WAIT")
            .arg(1)
            .arg(1000)
            .query::<i64>(&mut conn)
            .is_ok_and(|n| n >= 1)
    });
    assert!(
        attached,
        "no replica attached to the master within a minute"
    );
    let mut seq = 0u64;
    Box::new(move || {
        seq += 1;
        let token = format!("raw-token:{seq}");
        let (ok, acked): (Option<String>, i64) = redis::pipe()
            .cmd("SET")
            .arg(key)
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .cmd("WAIT")
            .arg(1)
            .arg(500)
            .query(&mut conn)
            .expect("SET NX PX + WAIT");
        assert!(ok.is_some(), "SET NX found {key} held");
        if acked < 1 {
            UNACKNOWLEDGED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        release_raw(&release, &mut conn, key, &token);
    })
}

/// The same two round trips as a `Mutex`, with the crate's own scripts, on one connection,
/// over keys tagged `{tag}`: separates what the scripts cost Redis from what the client adds.
pub fn crate_scripts_cycle(mut conn: redis::Connection, tag: &str) -> Cycle<'static> {
    let acquire = redis::Script::new(ACQUIRE_LUA);
    let release = redis::Script::new(CRATE_RELEASE_LUA);
    let [lock, fence, waiting, channel] =
        ["", ":fence", ":waiting", ":ch"].map(|suffix| format!("rawc:{{{tag}}}{suffix}"));
    let mut seq = 0u64;
    Box::new(move || {
        seq += 1;
        let token = format!("raw-token:{seq}");
        let (ok, _fence): (i64, i64) = acquire
            .key(&lock)
            .key(&fence)
            .key(&waiting)
            .arg(&token)
            .arg(30_000)
            .arg("")
            .invoke(&mut conn)
            .expect("acquire");
        assert_eq!(ok, 1);
        let deleted: i64 = release
            .key(&lock)
            .key(&waiting)
            .arg(&token)
            .arg(&channel)
            .invoke(&mut conn)
            .expect("release");
        assert_eq!(deleted, 1);
    })
}

/// The output lines of worker processes, each read up to its `READY` line: every worker has
/// connected and warmed up when this returns.
pub fn ready_outputs(
    children: &mut [std::process::Child],
) -> Vec<std::io::Lines<std::io::BufReader<std::process::ChildStdout>>> {
    use std::io::BufRead;
    let mut outputs: Vec<_> = children
        .iter_mut()
        .map(|c| std::io::BufReader::new(c.stdout.take().expect("stdout")).lines())
        .collect();
    for lines in &mut outputs {
        for line in lines.by_ref() {
            if line.expect("worker output").trim() == "READY" {
                break;
            }
        }
    }
    outputs
}
