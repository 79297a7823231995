//! The driver: starts the two Redis servers and the worker processes, injects faults, stops
//! everything and hands the history to the checker.
//!
//! With the partition fault, the lock's servers and the worker processes run on three hosts
//! (network namespaces on a bridge, see [`super::netns`]), the workers round-robin over them;
//! the fenced resource stays in the root namespace, on the bridge's address, which every host
//! reaches throughout.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::deployment::{LockDeployment, FAILOVER_LIMIT};
use super::faults::{signal, Fault};
use super::history::{self, Findings};
use super::netns::{self, Net};
use super::resource::{Resource, ResourceKeys};
use super::servers::{At, RedisProcess, Role};
use super::worker::WorkerSpec;
use super::{AnyResult, Config, LockKind, Topology};

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
    /// Partitions that cut a holder off with the master: a hold by a worker on the cut-off
    /// host was open (begun, not ended, in the history) when the cut was in place.
    pub partitions_with_holder_cut_off: u64,
    /// Why the partition fault was left out of a run that asked for it.
    pub left_out: Option<String>,
    pub elapsed: Duration,
}

struct WorkerProcess {
    index: usize,
    child: Child,
    killed: bool,
    /// The host it runs on, with the partition fault.
    host: Option<usize>,
}

/// The worker processes; any still running are resumed and killed when dropped.
struct Workers<'a> {
    spawn: &'a dyn Fn() -> Command,
    spec: WorkerSpec,
    list: Vec<WorkerProcess>,
    net: Option<&'a Net>,
}

impl Workers<'_> {
    /// Starts one more worker process, on host `host` when there are hosts.
    fn start_one(&mut self, host: Option<usize>) -> AnyResult<()> {
        let index = self.list.len();
        self.spec.index = index;
        let mut cmd = (self.spawn)();
        self.spec.apply(&mut cmd);
        if let (Some(net), Some(host)) = (self.net, host) {
            cmd = net.wrap(host, &cmd);
        }
        let child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()?;
        self.list.push(WorkerProcess {
            index,
            child,
            killed: false,
            host,
        });
        Ok(())
    }

    /// The pids of the live workers on host `host`.
    fn pids_on(&self, host: usize) -> Vec<u32> {
        self.list
            .iter()
            .filter(|w| !w.killed && w.host == Some(host))
            .map(|w| w.child.id())
            .collect()
    }

    /// `process N (host H)` for the worker with this pid.
    fn describe_pid(&self, pid: u32) -> String {
        match self.list.iter().find(|w| w.child.id() == pid) {
            Some(WorkerProcess {
                index,
                host: Some(host),
                ..
            }) => format!("process {index} (host {host})"),
            Some(w) => format!("process {}", w.index),
            None => format!("pid {pid}"),
        }
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

/// What one injected fault did.
struct Injected {
    detail: String,
    /// A fault aimed at the holder found the lock held.
    on_a_hold: bool,
    /// A partition cut a holder off with the master.
    holder_cut_off: bool,
}

impl Injected {
    fn plain(detail: String) -> Injected {
        Injected {
            detail,
            on_a_hold: false,
            holder_cut_off: false,
        }
    }
}

/// Runs the whole thing. `spawn` makes the command that starts a worker process (this program
/// again, which must call [`run_if_worker`](super::worker::run_if_worker) first thing).
pub fn run(config: &Config, spawn: &dyn Fn() -> Command) -> AnyResult<Outcome> {
    let started = Instant::now();
    let mut faults = config.faults.to_vec();
    let mut left_out = None;
    // Declared first, dropped last: after every process in its hosts is gone.
    let net = if faults.contains(&Fault::Partition) {
        if !matches!(config.topology, Topology::Sentinel | Topology::Cluster) {
            return Err(format!(
                "the partition fault needs a Sentinel or Cluster deployment, not {}",
                config.topology.name()
            )
            .into());
        }
        match netns::unavailable() {
            Some(why) => {
                (config.progress)(&format!("NOTE: the partition fault is left out: {why}"));
                faults.retain(|&f| f != Fault::Partition);
                left_out = Some(why);
                None
            }
            None => Some(Net::new(3)?),
        }
    } else {
        None
    };
    let mut lock_redis = LockDeployment::start(config.topology, net.as_ref(), config.lease)?;
    let resource_redis = match &net {
        // On the bridge's address: every host reaches it, also while cut off from the others.
        Some(net) => RedisProcess::start_at(
            "resource",
            Role::Data(Vec::new()),
            At {
                ip: net.gateway().to_owned(),
                host: None,
                port: None,
            },
        )?,
        None => RedisProcess::start("resource")?,
    };
    if let Some(net) = &net {
        net.check(lock_redis.probe_port(), resource_redis.port())?;
    }
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
        net: net.as_ref(),
    };
    for i in 0..config.processes {
        workers.start_one(net.as_ref().map(|n| i % n.host_count()))?;
    }
    (config.progress)(&format!(
        "{} processes x {} threads on one {} with a {:?} lease, on {}{}",
        config.processes,
        config.threads,
        match (config.topology, config.kind) {
            (super::Topology::Redlock, _) => "Redlock",
            (_, LockKind::FairMutex) => "FairMutex",
            (_, LockKind::Shared) => "Shared<u64>",
            (_, LockKind::Mutex) => "Mutex",
        },
        config.lease,
        config.topology.name(),
        match &net {
            Some(net) => format!(
                ", across {} hosts (network namespaces; the resource on {})",
                net.host_count(),
                net.gateway()
            ),
            None => String::new(),
        }
    ));
    wait_for_first_hold(&mut resource)?;
    std::thread::sleep(config.gap);

    let mut on_a_hold = 0;
    let mut holder_cut_off = 0;
    let resource_port = resource_redis.port();
    for round in 0..config.rounds {
        let mut order = faults.clone();
        fastrand::shuffle(&mut order);
        for fault in order {
            let injected = inject(
                fault,
                config,
                &mut lock_redis,
                &mut workers,
                &mut resource,
                net.as_ref().map(|n| (n, resource_port)),
            )?;
            on_a_hold += u64::from(injected.on_a_hold);
            holder_cut_off += u64::from(injected.holder_cut_off);
            (config.progress)(&format!(
                "round {}: {} {}",
                round + 1,
                fault.name(),
                injected.detail
            ));
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
    let history = resource.history()?;
    // For digging into a run: the whole history, one event a line.
    if let Some(path) = std::env::var_os("REDMUTEX_FAULTS_HISTORY").filter(|p| !p.is_empty()) {
        std::fs::write(&path, history.join("\n") + "\n")?;
    }
    let findings = history::check(&history);
    Ok(Outcome {
        findings,
        processes,
        holder_faults_on_a_hold: on_a_hold,
        partitions_with_holder_cut_off: holder_cut_off,
        left_out,
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

/// Injects one fault, recording its start and end in the history. Returns what it did. On
/// hosts (`hosts`: the network and the resource's port), the deployment is whole again
/// before the fault ends.
fn inject(
    fault: Fault,
    config: &Config,
    lock_redis: &mut LockDeployment,
    workers: &mut Workers<'_>,
    resource: &mut Resource,
    hosts: Option<(&Net, u16)>,
) -> AnyResult<Injected> {
    let name = fault.name();
    let holder = match fault {
        Fault::KillHolder | Fault::StopHolder => resource.holder_pid()?,
        _ => None,
    };
    resource.note(&["F", "start", name])?;
    let mut injected = match fault {
        Fault::KillHolder => {
            let Some((w, holding)) = workers.pick(holder) else {
                return Err("no live worker to kill".into());
            };
            w.child.kill()?;
            w.child.wait()?;
            w.killed = true;
            let detail = describe(w.index, holding);
            // The new process takes its place, on the same host.
            let host = w.host;
            workers.start_one(host)?;
            Injected {
                detail,
                on_a_hold: holding,
                holder_cut_off: false,
            }
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
            Injected {
                detail,
                on_a_hold: holding,
                holder_cut_off: false,
            }
        }
        Fault::LoseMaster => {
            Injected::plain(lock_redis.lose_master(config.lease, config.delayed_restart)?)
        }
        Fault::KillConnections => {
            let mut conn = lock_redis.master()?.connection(Duration::from_secs(10))?;
            let normal: i64 = redis::cmd("CLIENT")
                .arg(&["KILL", "TYPE", "normal"])
                .query(&mut conn)?;
            let pubsub: i64 = redis::cmd("CLIENT")
                .arg(&["KILL", "TYPE", "pubsub"])
                .query(&mut conn)?;
            Injected::plain(format!(
                "{normal} connections and {pubsub} subscribers killed"
            ))
        }
        Fault::SleepRedis => {
            let mut conn = lock_redis.master()?.connection(config.lease * 10)?;
            let seconds = (config.lease * 3 / 2).as_secs_f64();
            redis::cmd("DEBUG")
                .arg("SLEEP")
                .arg(seconds)
                .query::<()>(&mut conn)?;
            Injected::plain(format!("lock server slept {seconds} s"))
        }
        Fault::Partition => {
            let (net, resource_port) =
                hosts.ok_or("the partition fault needs the servers on hosts")?;
            partition(config, lock_redis, workers, resource, net, resource_port)?
        }
    };
    if hosts.is_some() && fault != Fault::Partition {
        let handed_back = lock_redis.settle()?;
        if !handed_back.is_empty() {
            injected.detail += &format!(
                "; masters handed back (CLUSTER FAILOVER) to {}",
                handed_back.join(", ")
            );
        }
    }
    resource.note(&["F", "end", name])?;
    Ok(injected)
}

/// The partition fault: cuts the host of the lock's master off from the other hosts (not
/// from the resource), as soon as a worker on it begins a hold (waiting a few seconds at
/// most); keeps it cut until the other side has failed over, a worker there has taken the
/// lock and three leases have passed; heals and waits until the deployment is whole again.
fn partition(
    config: &Config,
    lock_redis: &mut LockDeployment,
    workers: &Workers<'_>,
    resource: &mut Resource,
    net: &Net,
    resource_port: u16,
) -> AnyResult<Injected> {
    let lease = config.lease;
    let master = lock_redis.master()?;
    let from = master.addr();
    let h = master
        .host()
        .ok_or_else(|| format!("the master {from} runs on no host"))?;
    let on_host = workers.pids_on(h);

    // A hold by a worker on the master's host begins: the resource's holder becomes one of
    // them.
    let wait_limit = (lease * 5).max(Duration::from_secs(5));
    let waited = Instant::now();
    let mut last = resource.holder_pid()?;
    let mut began = None;
    while waited.elapsed() < wait_limit {
        let now = resource.holder_pid()?;
        if now != last && now.is_some_and(|pid| on_host.contains(&pid)) {
            began = now;
            break;
        }
        last = now;
        std::thread::sleep(Duration::from_micros(200));
    }

    net.cut(h)?;
    let cut_at = Instant::now();
    lock_redis.set_cut(Some(h));
    let cut_line = resource.mark(&["F", "cut", "partition", &h.to_string()])?;
    // The holds open when the cut was in place, by workers on the cut-off host.
    let before = resource.lines(cut_line.saturating_sub(5000), cut_line)?;
    let cut_off: Vec<(String, u32)> = open_holds(&before)
        .into_iter()
        .filter(|(_, pid)| on_host.contains(pid))
        .collect();
    net.check(lock_redis.probe_port(), resource_port)?;

    // The other side fails over, and a worker there takes the lock.
    let take_limit = (lease * 10).max(Duration::from_secs(10));
    let mut promoted: Option<(Duration, String, usize)> = None;
    let mut taken: Option<(Duration, String)> = None;
    loop {
        if promoted.is_none() {
            if let Ok(to) = lock_redis.master_addr() {
                if to != from {
                    let line = resource.mark(&["F", "promoted", "partition", &to])?;
                    promoted = Some((cut_at.elapsed(), to, line));
                }
            }
        }
        if let (Some((_, _, line)), None) = (&promoted, &taken) {
            let after = resource.lines_from(*line)?;
            let other = after.iter().find_map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                let pid = match f.as_slice() {
                    ["B", _, _, pid] => pid.parse::<u32>().ok()?,
                    _ => return None,
                };
                (!on_host.contains(&pid)).then_some(pid)
            });
            if let Some(pid) = other {
                taken = Some((cut_at.elapsed(), workers.describe_pid(pid)));
            }
        }
        let elapsed = cut_at.elapsed();
        match (&promoted, &taken) {
            (Some(_), Some(_)) if elapsed >= lease * 3 => break,
            (Some((after, _, _)), None) if elapsed > *after + take_limit => break,
            (None, _) if elapsed > FAILOVER_LIMIT => {
                let _ = net.heal();
                lock_redis.set_cut(None);
                return Err(format!(
                    "no failover away from {from} within {FAILOVER_LIMIT:?} of cutting host {h} \
                     off"
                )
                .into());
            }
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
    let cut_for = cut_at.elapsed();
    net.heal()?;
    lock_redis.set_cut(None);
    resource.note(&["F", "heal", "partition", &h.to_string()])?;
    net.check(lock_redis.probe_port(), resource_port)?;
    // The old master follows the new one: the history records what it says of itself until
    // it does (its role, and how many replicas it has attached).
    let healed = Instant::now();
    let mut said = None;
    let demoted = loop {
        let now = lock_redis.role_of(&from);
        if now != said {
            let (role, replicas) = now.clone().unwrap_or_default();
            resource.note(&[
                "F",
                "old-master",
                "partition",
                &from,
                &format!("role={role},replicas={replicas}"),
            ])?;
            said = now;
        }
        match &said {
            Some((role, _)) if role == "slave" => break Some(healed.elapsed()),
            _ if healed.elapsed() > FAILOVER_LIMIT => break None,
            _ => std::thread::sleep(Duration::from_millis(10)),
        }
    };
    // And the deployment is whole again (a Cluster's masters handed back).
    let handed_back = lock_redis.settle()?;
    let whole = format!(
        "{}; whole again {:.1?} after the heal{}",
        match demoted {
            Some(after) => format!("the old master a replica {after:.1?} after the heal"),
            None => "the old master still no replica".to_owned(),
        },
        healed.elapsed(),
        match handed_back.is_empty() {
            true => String::new(),
            false => format!(
                ", masters handed back (CLUSTER FAILOVER) to {}",
                handed_back.join(", ")
            ),
        }
    );

    // What the cut-off holders wrote after the cut.
    let since = resource.lines_from(cut_line)?;
    let holder = match cut_off.first() {
        Some((key, pid)) => {
            let (mut accepted, mut refused) = (0, 0);
            for line in &since {
                if let Some(rest) = line.strip_prefix("W ") {
                    if let Some(outcome) = rest.strip_prefix(key.as_str()) {
                        match outcome {
                            " 1" => accepted += 1,
                            " 0" => refused += 1,
                            _ => {}
                        }
                    }
                }
            }
            format!(
                "a holder cut off: {}'s hold {key} (token, worker) was open at the cut, and \
                 {accepted} of its writes after the cut were accepted, {refused} refused",
                workers.describe_pid(*pid)
            )
        }
        None => match began {
            Some(pid) => format!(
                "no holder cut off: {} began a hold but ended it before the cut was in place",
                workers.describe_pid(pid)
            ),
            None => {
                format!("no holder cut off: no worker on it began a hold within {wait_limit:?}")
            }
        },
    };
    let failover = match &promoted {
        Some((after, to, _)) => format!("{to} promoted after {after:.1?}"),
        None => "no failover".to_owned(),
    };
    let taken = match &taken {
        Some((after, who)) => format!("{who} took the lock after {after:.1?}"),
        None => format!(
            "no worker on the other hosts took the lock within {take_limit:?} of the failover"
        ),
    };
    Ok(Injected {
        detail: format!(
            "host {h} (master {from}) cut off from the other hosts for {cut_for:.1?}; {holder}; \
             {failover}; {taken}; healed, {whole}"
        ),
        on_a_hold: false,
        holder_cut_off: !cut_off.is_empty(),
    })
}

/// The holds that `lines` (a stretch of the history) leaves open: begun (`B`) and not ended
/// (`E`), as `token worker` and the holder's pid.
fn open_holds(lines: &[String]) -> Vec<(String, u32)> {
    let mut open: HashMap<String, u32> = HashMap::new();
    for line in lines {
        let f: Vec<&str> = line.split(' ').collect();
        match f.as_slice() {
            ["B", token, worker, pid] => {
                if let Ok(pid) = pid.parse() {
                    open.insert(format!("{token} {worker}"), pid);
                }
            }
            ["E", token, worker] => {
                open.remove(&format!("{token} {worker}"));
            }
            _ => {}
        }
    }
    open.into_iter().collect()
}

fn describe(index: usize, holding: bool) -> String {
    if holding {
        format!("process {index} (holding the lock)")
    } else {
        format!("process {index} (the lock was free; picked at random)")
    }
}
