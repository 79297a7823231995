//! Helpers shared by the benchmarks: measuring or smoke mode, medians with their spread, and
//! the JSON figures that `scripts/perf-report` turns into docs/performance.md.

#![allow(dead_code)]

use std::fmt::Write as _;
use std::path::PathBuf;

/// The raw loops' release: the classic compare-and-delete.
pub const RAW_RELEASE_LUA: &str = r#"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"#;

/// Whether this is a real measurement (`cargo bench`, which passes `--bench`) rather than
/// the short smoke run of `cargo test --benches`.
pub fn measuring() -> bool {
    std::env::args().any(|a| a == "--bench")
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
    match std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, json.render())) {
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
