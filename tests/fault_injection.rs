//! The fault-injection suite: 6 processes x 4 threads take one lock and write to a fenced
//! resource while holders are killed and stopped, the lock's master is lost (a restart of one
//! server; a failover under Sentinel and in a Cluster), stalled, and its connections are
//! killed; a checker over the recorded history asserts the guarantees.
//!
//! Two more runs put the Sentinel deployment and the Cluster on three hosts (network
//! namespaces) and add a partition: the master's host cut off from the other hosts, with the
//! workers on it still writing to the resource. They need root and iproute2; elsewhere they
//! print that they were skipped, except when `CI` is set, where they fail.
//!
//! The same harness runs longer as `cargo run --release --example fault_injection`.

#[allow(dead_code)]
#[path = "../examples/fault_injection/harness/mod.rs"]
mod harness;

use std::process::Command;

use harness::faults::Fault;
use harness::LockKind;
use std::time::Duration;

const ENTRY: &str = "fault_injection_worker_entry";

/// The entry point of the worker processes; does nothing in a normal test run.
#[test]
fn fault_injection_worker_entry() {
    if let Err(e) = harness::run_if_worker() {
        panic!("worker failed: {e}");
    }
}

/// Runs of the two lock kinds, one at a time: each has 24 threads on a 2-core machine.
static ONE_RUN_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The faults on the lock's servers only, none on its holders.
const SERVER_FAULTS: &[Fault] = &[Fault::LoseMaster, Fault::KillConnections, Fault::SleepRedis];

fn run(kind: LockKind, topology: harness::Topology) -> harness::Outcome {
    let outcome = run_with(kind, topology, &Fault::ALL, true);
    let f = &outcome.findings;
    // The faults bit: a holder was killed or stopped while it held the lock, or some holder
    // learnt its lease was lost, had a write refused, or saw a release or an acquire fail
    // (Redis restarting refuses connections at once). A Redlock can take every server fault
    // without a client noticing (a majority of instances stays up), and the holder faults may
    // all find the lock free: only all of these together are never zero.
    let failed_calls: u64 = f
        .unlock_errors
        .values()
        .chain(f.acquire_errors.values())
        .sum();
    assert!(
        f.lost_before_write
            + f.unlock_lost
            + f.stale_writes_rejected
            + failed_calls
            + outcome.holder_faults_on_a_hold
            > 0,
        "no fault was ever noticed; the faults did not bite"
    );
    outcome
}

/// Runs the harness; asserts that the faults happened, that the workers worked through
/// them, and that no guarantee broke.
fn run_with(
    kind: LockKind,
    topology: harness::Topology,
    faults: &'static [Fault],
    delayed_restart: bool,
) -> harness::Outcome {
    let _one = ONE_RUN_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let config = harness::Config {
        processes: 6,
        threads: 4,
        kind,
        topology,
        faults,
        delayed_restart,
        lease: Duration::from_secs(1),
        rounds: 2,
        gap: Duration::from_millis(1500),
        quiet: Duration::from_secs(8),
        progress: &|line| eprintln!("{line}"),
    };
    let spawn = || {
        let mut cmd = Command::new(std::env::current_exe().expect("test binary"));
        cmd.args(["--exact", ENTRY, "--nocapture", "--test-threads", "1"]);
        cmd
    };
    let outcome = match harness::run(&config, &spawn) {
        Ok(outcome) => outcome,
        Err(e) => {
            // Without the panic hook's backtrace after it, and its first line again last, so
            // that the end of a long log names the cause.
            let e = e.to_string();
            eprintln!(
                "{e}\nthe run itself failed: {}",
                e.lines().next().unwrap_or("")
            );
            std::panic::resume_unwind(Box::new(e));
        }
    };
    eprintln!("{}", outcome.summary());
    let f = &outcome.findings;
    // The faults really happened and the workers really worked through them.
    let injected: u64 = f.faults.values().sum();
    assert_eq!(
        injected,
        (config.rounds * faults.len()) as u64,
        "{:?}",
        f.faults
    );
    assert!(f.acquisitions > 100, "only {} acquisitions", f.acquisitions);
    let violations = outcome.violations(&config);
    assert!(violations.is_empty(), "{violations:#?}");
    outcome
}

#[test]
fn mutex_keeps_its_guarantees_under_faults() {
    run(LockKind::Mutex, harness::Topology::Standalone);
}

#[test]
fn fair_mutex_keeps_its_guarantees_under_faults() {
    run(LockKind::FairMutex, harness::Topology::Standalone);
}

/// The value under a `Shared<u64>` is the fenced resource: every hold adds one, and the
/// chain of reads shows that no update was lost or applied twice beyond what a lost master
/// or a release of unknown outcome explains.
#[test]
fn shared_value_keeps_its_guarantees_under_faults() {
    let outcome = run(LockKind::Shared, harness::Topology::Standalone);
    let f = &outcome.findings;
    assert!(f.value_updates > 100, "{}", outcome.summary());
    assert_eq!(f.value_chain_breaks, 0, "{}", outcome.summary());
}

/// The same on a Cluster, where a failover may also lose the last writes.
#[test]
fn shared_value_keeps_its_guarantees_under_faults_on_a_cluster() {
    let outcome = run(LockKind::Shared, harness::Topology::Cluster);
    assert_eq!(
        outcome.findings.value_chain_breaks,
        0,
        "{}",
        outcome.summary()
    );
}

/// Failovers among the faults: the master of the lock is promoted away from.
#[test]
fn mutex_keeps_its_guarantees_under_faults_on_sentinel() {
    run(LockKind::Mutex, harness::Topology::Sentinel);
}

#[test]
fn mutex_keeps_its_guarantees_under_faults_on_a_cluster() {
    run(LockKind::Mutex, harness::Topology::Cluster);
}

/// Three independent instances; the lost master is one instance restarted empty after one
/// lease (the delayed-restart rule).
#[test]
fn redlock_keeps_its_guarantees_under_faults() {
    run(LockKind::Mutex, harness::Topology::Redlock);
}

/// Faults on the instances only (restarts after one lease, killed connections, stalls): a
/// minority is lost at a time, so no two holds overlap at all.
#[test]
fn redlock_with_delayed_restarts_never_overlaps() {
    let outcome = run_with(
        LockKind::Mutex,
        harness::Topology::Redlock,
        SERVER_FAULTS,
        true,
    );
    assert_eq!(
        outcome.findings.overlapping_pairs,
        0,
        "{}",
        outcome.summary()
    );
}

/// Two instances of three restarted empty at once break the delayed-restart rule: a second
/// holder can take a majority while the first still works. Every such overlap is caught by
/// the fencing check or told to its holder (the checker's rule).
#[test]
fn redlock_restarted_at_once_has_every_overlap_caught() {
    let outcome = run_with(
        LockKind::Mutex,
        harness::Topology::Redlock,
        SERVER_FAULTS,
        false,
    );
    let f = &outcome.findings;
    assert_eq!(
        f.stale_holds,
        f.stale_holds_detected,
        "{}",
        outcome.summary()
    );
}

/// Whether the partition runs can run here: prints why not and returns `false`, except when
/// `CI` is set, where it panics (CI runs as root).
fn partitions_usable() -> bool {
    let Some(why) = harness::netns::unavailable() else {
        return true;
    };
    if std::env::var_os("CI").is_some() {
        panic!("{why}; CI is set, where the partition runs must run");
    }
    eprintln!("skipped: {why}");
    false
}

/// Every fault and a partition, on three hosts; at least one partition cut a holder off with
/// the master, and every guarantee held.
fn run_with_partitions(topology: harness::Topology) {
    if !partitions_usable() {
        return;
    }
    let outcome = run_with(LockKind::Mutex, topology, &Fault::WITH_PARTITION, true);
    let f = &outcome.findings;
    assert_eq!(f.faults.get("partition"), Some(&2), "{}", outcome.summary());
    assert!(
        outcome.partitions_with_holder_cut_off >= 1,
        "no partition cut a holder off with the master{}",
        outcome.summary()
    );
}

/// The master and a sentinel on one host, a replica and a sentinel on each of two others;
/// the master's host is cut off, the other two fail over.
#[test]
fn mutex_keeps_its_guarantees_under_faults_and_partitions_on_sentinel() {
    run_with_partitions(harness::Topology::Sentinel);
}

/// A master on each of three hosts, each master's replica on the next host; the host of the
/// lock's master is cut off, the cluster promotes its replica.
#[test]
fn mutex_keeps_its_guarantees_under_faults_and_partitions_on_a_cluster() {
    run_with_partitions(harness::Topology::Cluster);
}
