//! A fault-injection soak: worker processes take one lock and write to a fenced resource
//! while faults are injected — holders killed with SIGKILL, holders stopped with SIGSTOP for
//! longer than their lease, the lock's Redis restarted empty, its connections killed, and
//! Redis stalled with `DEBUG SLEEP`. A checker then reads the resource's history and fails the
//! run when a guarantee was broken: a write accepted out of token order, a token handed out
//! twice, two holders at once without the older one being told, a process that stopped
//! making progress, a thread that hung or panicked.
//!
//! It starts its own `redis-server`s: the lock's (one server, or with `--deployment`, a
//! Sentinel or Cluster deployment, where the lost master is a failover instead of a restart)
//! and the resource's.
//!
//! With `--partitions` (Sentinel or Cluster; needs root and iproute2), the lock's servers and
//! the workers run on three hosts, network namespaces on a bridge, and one more fault cuts the
//! host of the lock's master off from the other hosts — not from the resource, so workers cut
//! off with the master can still write to it — preferably while a worker there holds the
//! lock, until the other side failed over and another worker took the lock; then heals.
//! `--partitions-only` injects that fault alone.
//!
//! ```text
//! cargo run --release --example fault_injection                   # 20 rounds of 5 faults
//! cargo run --release --example fault_injection -- --fair --rounds 100 --processes 8
//! cargo run --release --example fault_injection -- --shared   # the value is the resource
//! cargo run --release --example fault_injection -- --deployment cluster   # or sentinel, redlock
//! cargo run --release --example fault_injection -- --deployment redlock --restart-at-once
//! cargo run --release --example fault_injection -- --deployment sentinel --partitions
//! cargo run --release --example fault_injection -- --deployment cluster --partitions-only
//! ```

mod harness;

use std::process::{Command, ExitCode};
use std::time::Duration;

use harness::faults::Fault;
use harness::{AnyResult, Config};

fn main() -> ExitCode {
    match harness::run_if_worker() {
        Ok(true) => return ExitCode::SUCCESS,
        Ok(false) => {}
        Err(e) => {
            eprintln!("worker failed: {e}");
            return ExitCode::FAILURE;
        }
    }
    match soak() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

fn soak() -> AnyResult<bool> {
    let config = parse_args(std::env::args().skip(1).collect())?;
    let spawn = || -> Command {
        let exe = std::env::current_exe().unwrap_or_else(|_| "fault_injection".into());
        Command::new(exe)
    };
    let outcome = harness::run(&config, &spawn)?;
    print!("\n{}", outcome.summary());
    let violations = outcome.violations(&config);
    if violations.is_empty() {
        println!("\nOK: every guarantee held");
        Ok(true)
    } else {
        println!("\nFAILED:");
        for v in violations {
            println!("  - {v}");
        }
        Ok(false)
    }
}

fn parse_args(args: Vec<String>) -> AnyResult<Config> {
    let mut config = Config {
        processes: 6,
        threads: 4,
        kind: harness::LockKind::Mutex,
        topology: harness::Topology::Standalone,
        faults: &Fault::ALL,
        delayed_restart: true,
        lease: Duration::from_secs(1),
        rounds: 20,
        gap: Duration::from_secs(2),
        quiet: Duration::from_secs(10),
        progress: &|line| println!("{line}"),
    };
    let mut it = args.into_iter();
    while let Some(flag) = it.next() {
        if flag == "--fair" {
            config.kind = harness::LockKind::FairMutex;
            continue;
        }
        if flag == "--shared" {
            config.kind = harness::LockKind::Shared;
            continue;
        }
        if flag == "--restart-at-once" {
            config.delayed_restart = false;
            continue;
        }
        if flag == "--partitions" {
            config.faults = &Fault::WITH_PARTITION;
            continue;
        }
        if flag == "--partitions-only" {
            config.faults = &[Fault::Partition];
            continue;
        }
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--deployment" => {
                config.topology = match value.as_str() {
                    "standalone" => harness::Topology::Standalone,
                    "sentinel" => harness::Topology::Sentinel,
                    "cluster" => harness::Topology::Cluster,
                    "redlock" => harness::Topology::Redlock,
                    other => return Err(format!("unknown deployment {other}").into()),
                }
            }
            "--processes" => config.processes = value.parse()?,
            "--threads" => config.threads = value.parse()?,
            "--rounds" => config.rounds = value.parse()?,
            "--lease-ms" => config.lease = Duration::from_millis(value.parse()?),
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    if config.processes < 2 || config.threads == 0 {
        return Err("--processes must be at least 2 and --threads at least 1".into());
    }
    if config.kind != harness::LockKind::Mutex && config.topology == harness::Topology::Redlock {
        return Err("--fair and --shared do not apply to a Redlock".into());
    }
    if config.faults.contains(&Fault::Partition)
        && !matches!(
            config.topology,
            harness::Topology::Sentinel | harness::Topology::Cluster
        )
    {
        return Err("--partitions needs --deployment sentinel or cluster".into());
    }
    if config.lease < Duration::from_millis(100) {
        return Err("--lease-ms must be at least 100".into());
    }
    Ok(config)
}
