//! The examples run as a user would run them, each against its own `redis-server`, and
//! check themselves: the stock demo sells out with nothing oversold, the fleet's job runs
//! exactly once, no ID is handed out twice, and a killed scheduler's leadership moves on.

use std::path::PathBuf;
use std::process::Command;

/// The built example `name`, built (or found up to date) by `cargo build --example` first, so
/// that a binary left by an earlier build of other code is never the one run.
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary");
    let dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("target directory")
        .join("examples");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    let mut build = Command::new(cargo);
    build.args(["build", "--example", name]);
    if cfg!(feature = "metrics") {
        build.args(["--features", "metrics"]);
    }
    let status = build.status().expect("cargo build");
    assert!(status.success(), "cannot build example {name}");
    dir.join(name)
}

fn run(name: &str, args: &[&str], ok_line: &str) {
    let out = Command::new(example(name))
        .args(args)
        .env_remove("REDIS_URL")
        .output()
        .expect("run the example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{name} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains(ok_line), "{name} printed:\n{stdout}");
}

#[test]
fn the_stock_demo_sells_out_without_overselling() {
    run(
        "stock",
        &["--processes", "3", "--threads", "3", "--stock", "300"],
        "OK: sold out, nothing oversold",
    );
}

#[test]
fn the_schedulers_leader_is_replaced_when_killed() {
    run("scheduler", &[], "OK: another instance took over");
}

#[test]
fn the_fleets_job_runs_exactly_once() {
    run(
        "run_once",
        &["--instances", "6"],
        "OK: the job ran exactly once",
    );
}

#[test]
fn the_id_allocator_never_hands_out_an_id_twice() {
    run(
        "id_allocator",
        &["--processes", "3", "--ids", "500"],
        "OK: no ID twice",
    );
}

#[test]
fn the_catalogue_loses_no_edit_between_readers_editors_and_the_lock() {
    run(
        "catalogue",
        &["--readers", "2", "--editors", "3", "--edits", "100"],
        "OK: every edit and repricing is in the catalogue",
    );
}

#[cfg(feature = "metrics")]
#[test]
fn the_prometheus_example_prints_the_lock_metrics() {
    run(
        "prometheus",
        &[],
        "redmutex_acquisitions_total{kind=\"Mutex\",lock=\"orders:42\"} 100",
    );
}
