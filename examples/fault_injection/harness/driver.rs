//! The driver: starts the two Redis servers and the worker processes, injects faults, stops
//! everything and hands the history to the checker.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::deployment::LockDeployment;
use super::faults::{signal, Fault};
use super::history::{self, Findings};
use super::resource::{Resource, ResourceKeys};
use super::servers::RedisProcess;
use super::worker::WorkerSpec;
use super::{AnyResult, Config, LockKind};

/// How a worker process ended.
#[derive(Debug)]
pub struct ProcessEnd {
    pub index: usize,
    /// Killed by the driver as a fault.
    pub killed: bool,
    /// `None` when it exited with success; otherwise what went wrong.
    pub failure: Option<String>,
}

/// Everything a run produced.
#[derive(Debug)]
pub struct Outcome {
    pub findings: Findings,
    pub processes: Vec<ProcessEnd>,
    /// Faults aimed at a holder that found the lock held, of those aimed.
    pub holder_faults_on_a_hold: u64,
    pub elapsed: Duration,
}

struct WorkerProcess {
    index: usize,
    child: Child,
    killed: bool,
}

/// The worker processes; any still running are resumed and killed when dropped.
struct Workers<'a> {
    spawn: &'a dyn Fn() -> Command,
    spec: WorkerSpec,
    list: Vec<WorkerProcess>,
}

impl Workers<'_> {
    fn start_one(&mut self) -> AnyResult<()> {
        let index = self.list.len();
        self.spec.index = index;
        let mut cmd = (self.spawn)();
        self.spec.apply(&mut cmd);
        let child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?;
        self.list.push(WorkerProcess {
            index,
            child,
            killed: false,
        });
        Ok(())
    }

    /// The live process with this pid, else a random live one; and whether it was the pid.
    fn pick(&mut self, pid: Option<u32>) -> Option<(&mut WorkerProcess, bool)> {
        let live: Vec<usize> = (0..self.list.len())
            .filter(|&i| !self.list[i].killed)
            .collect();
        let holder = live
            .iter()
            .copied()
            .find(|&i| Some(self.list[i].child.id()) == pid);
        let chosen = holder.or_else(|| live.get(fastrand::usize(..live.len().max(1))).copied())?;
        Some((&mut self.list[chosen], holder.is_some()))
    }

    /// Closes every live worker's standard input and waits for it to exit.
    fn stop(&mut self, limit: Duration) -> Vec<ProcessEnd> {
        for w in &mut self.list {
            drop(w.child.stdin.take());
        }
        let deadline = Instant::now() + limit;
        let mut ends = Vec::new();
        for w in &mut self.list {
            let failure = if w.killed {
                None
            } else {
                wait_until(&mut w.child, deadline)
            };
            ends.push(ProcessEnd {
                index: w.index,
                killed: w.killed,
                failure,
            });
        }
        ends
    }
}

fn wait_until(child: &mut Child, deadline: Instant) -> Option<String> {
    loop {
        match child.try_wait() {
            Ok(Some(status)) if status.success() => return None,
            Ok(Some(status)) => return Some(format!("exited with {status}")),
            Ok(None) if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Some("hung: did not exit after being told to stop".to_owned());
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Some(format!("could not wait for it: {e}")),
        }
    }
}

impl Drop for Workers<'_> {
    fn drop(&mut self) {
        for w in &mut self.list {
            if let Ok(None) = w.child.try_wait() {
                let _ = signal(w.child.id(), libc::SIGCONT);
                let _ = w.child.kill();
                let _ = w.child.wait();
            }
        }
    }
}

/// Runs the whole thing. `spawn` makes the command that starts a worker process (this program
/// again, which must call [`run_if_worker`](super::worker::run_if_worker) first thing).
pub fn run(config: &Config, spawn: &dyn Fn() -> Command) -> AnyResult<Outcome> {
    let started = Instant::now();
    let mut lock_redis = LockDeployment::start(config.topology)?;
    let resource_redis = RedisProcess::start("resource")?;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let keys = ResourceKeys::new(&run);
    let mut resource = Resource::connect(&resource_redis.url(), keys)?;
    let mut workers = Workers {
        spawn,
        spec: WorkerSpec {
            index: 0,
            lock_url: lock_redis.url(),
            replica_acks: lock_redis.replica_acks(),
            redlock: config.topology == super::Topology::Redlock,
            resource_url: resource_redis.url(),
            run,
            threads: config.threads,
            kind: config.kind,
            lease: config.lease,
        },
        list: Vec::new(),
    };
    for _ in 0..config.processes {
        workers.start_one()?;
    }
    (config.progress)(&format!(
        "{} processes x {} threads on one {} with a {:?} lease, on {}",
        config.processes,
        config.threads,
        match (config.topology, config.kind) {
            (super::Topology::Redlock, _) => "Redlock",
            (_, LockKind::FairMutex) => "FairMutex",
            (_, LockKind::Shared) => "Shared<u64>",
            (_, LockKind::Mutex) => "Mutex",
        },
        config.lease,
        config.topology.name()
    ));
    wait_for_first_hold(&mut resource)?;
    std::thread::sleep(config.gap);

    let mut on_a_hold = 0;
    for round in 0..config.rounds {
        let mut order = config.faults.to_vec();
        fastrand::shuffle(&mut order);
        for fault in order {
            let detail = inject(fault, config, &mut lock_redis, &mut workers, &mut resource)?;
            on_a_hold += u64::from(detail.contains("holding"));
            (config.progress)(&format!("round {}: {} {detail}", round + 1, fault.name()));
            std::thread::sleep(config.gap);
        }
    }
    resource.note(&["Q"])?;
    (config.progress)(&format!("no more faults; {:?} of quiet", config.quiet));
    std::thread::sleep(config.quiet);

    let processes = workers.stop(Duration::from_secs(60));
    if config.kind == LockKind::Shared && config.topology != super::Topology::Redlock {
        // The value as it ended, read under the lock: the last link of the chain.
        let value = super::worker::final_shared_value(&lock_redis.url(), config.lease)?;
        resource.note(&["Z", &value.to_string()])?;
    }
    let findings = history::check(&resource.history()?);
    Ok(Outcome {
        findings,
        processes,
        holder_faults_on_a_hold: on_a_hold,
        elapsed: started.elapsed(),
    })
}

fn wait_for_first_hold(resource: &mut Resource) -> AnyResult<()> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while resource.history()?.is_empty() {
        if Instant::now() > deadline {
            return Err("no worker took the lock within 60 s".into());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Injects one fault, recording its start and end in the history. Returns what it did.
fn inject(
    fault: Fault,
    config: &Config,
    lock_redis: &mut LockDeployment,
    workers: &mut Workers<'_>,
    resource: &mut Resource,
) -> AnyResult<String> {
    let name = fault.name();
    let holder = match fault {
        Fault::KillHolder | Fault::StopHolder => resource.holder_pid()?,
        _ => None,
    };
    resource.note(&["F", "start", name])?;
    let detail = match fault {
        Fault::KillHolder => {
            let Some((w, holding)) = workers.pick(holder) else {
                return Err("no live worker to kill".into());
            };
            w.child.kill()?;
            w.child.wait()?;
            w.killed = true;
            let detail = describe(w.index, holding);
            workers.start_one()?;
            detail
        }
        Fault::StopHolder => {
            let Some((w, holding)) = workers.pick(holder) else {
                return Err("no live worker to stop".into());
            };
            let pid = w.child.id();
            let detail = describe(w.index, holding);
            signal(pid, libc::SIGSTOP)?;
            std::thread::sleep(config.lease * 5 / 2);
            signal(pid, libc::SIGCONT)?;
            detail
        }
        Fault::LoseMaster => lock_redis.lose_master(config.lease, config.delayed_restart)?,
        Fault::KillConnections => {
            let mut conn = lock_redis.master()?.connection(Duration::from_secs(10))?;
            let normal: i64 = redis::cmd("CLIENT")
                .arg(&["KILL", "TYPE", "normal"])
                .query(&mut conn)?;
            let pubsub: i64 = redis::cmd("CLIENT")
                .arg(&["KILL", "TYPE", "pubsub"])
                .query(&mut conn)?;
            format!("{normal} connections and {pubsub} subscribers killed")
        }
        Fault::SleepRedis => {
            let mut conn = lock_redis.master()?.connection(config.lease * 10)?;
            let seconds = (config.lease * 3 / 2).as_secs_f64();
            redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg(seconds)
                .query::<()>(&mut conn)?;
            format!("lock server slept {seconds} s")
        }
    };
    resource.note(&["F", "end", name])?;
    Ok(detail)
}

fn describe(index: usize, holding: bool) -> String {
    if holding {
        format!("process {index} (holding the lock)")
    } else {
        format!("process {index} (the lock was free; picked at random)")
    }
}
