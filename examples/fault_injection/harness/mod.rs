//! A fault-injection run: worker processes take one lock and write to a fenced resource while
//! a driver kills, stops and disconnects them, restarts and stalls Redis and (on hosts made of
//! network namespaces) cuts the master's host off from the others; a checker then reads the
//! recorded history.

pub mod deployment;
pub mod driver;
pub mod faults;
pub mod history;
pub mod namespaces;
pub mod netns;
pub mod resource;
pub mod servers;
pub mod worker;

use std::time::Duration;

pub use deployment::Topology;
pub use driver::{run, Outcome};
pub use worker::run_if_worker;

/// The error type of the harness: anything, with a message.
pub type AnyResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// What the workers take (a `Redlock` topology always takes a `RedlockMutex`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockKind {
    Mutex,
    FairMutex,
    /// A `Shared<u64>` that every hold adds one to: the value is a fenced resource too.
    Shared,
}

impl LockKind {
    pub fn name(self) -> &'static str {
        match self {
            LockKind::Mutex => "mutex",
            LockKind::FairMutex => "fair",
            LockKind::Shared => "shared",
        }
    }

    pub fn from_name(name: &str) -> Option<LockKind> {
        [LockKind::Mutex, LockKind::FairMutex, LockKind::Shared]
            .into_iter()
            .find(|k| k.name() == name)
    }
}

/// The shape of a run.
pub struct Config {
    pub processes: usize,
    pub threads: usize,
    /// What the workers take.
    pub kind: LockKind,
    /// What the lock's Redis is.
    pub topology: Topology,
    /// The kinds of fault to inject (each round injects each once, in a random order). With
    /// [`Partition`](faults::Fault::Partition) (Sentinel and Cluster only), the lock's
    /// servers and the workers run on three hosts, network namespaces; where they cannot be
    /// made (no root, no iproute2), the partition is left out with a note.
    pub faults: &'static [faults::Fault],
    /// For a Redlock, the lost master is one instance restarted empty after one lease (the
    /// delayed-restart rule); `false`: two instances, a majority, restarted empty at once.
    pub delayed_restart: bool,
    /// The lease of every hold; faults are sized from it.
    pub lease: Duration,
    /// Rounds of faults; each round injects every kind once, in a random order.
    pub rounds: usize,
    /// The pause after each fault.
    pub gap: Duration,
    /// The time with no faults at the end, in which every live process must acquire.
    pub quiet: Duration,
    /// Called with a line of progress now and then.
    pub progress: &'static (dyn Fn(&str) + Sync),
}

impl Outcome {
    /// Everything that broke a guarantee; empty when the run passed.
    pub fn violations(&self, config: &Config) -> Vec<String> {
        let f = &self.findings;
        let mut v = Vec::new();
        if f.accepted_out_of_order > 0 {
            v.push(format!(
                "{} writes accepted out of order",
                f.accepted_out_of_order
            ));
        }
        if f.duplicate_tokens > 0 {
            v.push(format!(
                "{} fencing tokens handed out twice",
                f.duplicate_tokens
            ));
        }
        if f.stale_holds_detected < f.stale_holds {
            v.push(format!(
                "{} of {} stale holds went on without learning of it",
                f.stale_holds - f.stale_holds_detected,
                f.stale_holds
            ));
        }
        if f.value_chain_breaks > 0 {
            v.push(format!(
                "{} shared-value reads not explained by the updates before them: {:?}",
                f.value_chain_breaks, f.value_chain_examples
            ));
        }
        if f.fence_order_violations > 0 {
            v.push(format!(
                "{} holds got a token not above an earlier hold's",
                f.fence_order_violations
            ));
        }
        if !f.malformed.is_empty() {
            v.push(format!("unreadable history lines: {:?}", f.malformed));
        }
        for p in &self.processes {
            if let Some(failure) = &p.failure {
                v.push(format!("worker process {}: {failure}", p.index));
            }
            if p.killed {
                continue;
            }
            if f.quiet_acquisitions.get(&p.index).copied().unwrap_or(0) == 0 {
                v.push(format!(
                    "worker process {} made no progress after the faults",
                    p.index
                ));
            }
            let done = f.threads_done.get(&p.index).copied().unwrap_or(0);
            if done != config.threads as u64 {
                v.push(format!(
                    "worker process {}: {done} of {} threads finished",
                    p.index, config.threads
                ));
            }
        }
        v
    }

    /// A table of what happened, for people.
    pub fn summary(&self) -> String {
        let f = &self.findings;
        let faults: u64 = f.faults.values().sum();
        let killed = self.processes.iter().filter(|p| p.killed).count();
        let mut s = String::new();
        let mut line = |label: &str, value: String| s.push_str(&format!("{label:<44} {value}\n"));
        line("run time", format!("{:.1?}", self.elapsed));
        line(
            "worker processes (killed)",
            format!("{} ({killed})", self.processes.len()),
        );
        line("acquisitions", f.acquisitions.to_string());
        line("faults injected", format!("{faults} {:?}", f.faults));
        line(
            "holder faults that hit a hold",
            self.holder_faults_on_a_hold.to_string(),
        );
        if let Some(partitions) = f.faults.get(faults::Fault::Partition.name()) {
            line(
                "partitions that cut a holder off",
                format!("{} of {partitions}", self.partitions_with_holder_cut_off),
            );
        }
        if let Some(why) = &self.left_out {
            line("partition fault left out", why.clone());
        }
        line("fenced writes accepted", f.writes_accepted.to_string());
        line("stale writes rejected", f.stale_writes_rejected.to_string());
        line(
            "accepted out of order (must be 0)",
            f.accepted_out_of_order.to_string(),
        );
        line(
            "tokens handed out twice (must be 0)",
            f.duplicate_tokens.to_string(),
        );
        line(
            "stale holds: overlapped a newer (detected)",
            format!("{} ({})", f.stale_holds, f.stale_holds_detected),
        );
        line(
            "overlapping pairs of holds",
            f.overlapping_pairs.to_string(),
        );
        line("lost seen before a write", f.lost_before_write.to_string());
        line("unlock said LockLost", f.unlock_lost.to_string());
        line("unlock failed otherwise", format!("{:?}", f.unlock_errors));
        line("acquire errors", format!("{:?}", f.acquire_errors));
        line(
            "fence order violations (must be 0)",
            f.fence_order_violations.to_string(),
        );
        if f.value_reads > 0 {
            line(
                "shared value: reads, updates applied",
                format!("{}, {}", f.value_reads, f.value_updates),
            );
            line(
                "shared value: resets after a lost master",
                f.value_resets_explained.to_string(),
            );
            line(
                "shared value: reads unexplained (must be 0)",
                f.value_chain_breaks.to_string(),
            );
        }
        s
    }
}
