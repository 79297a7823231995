//! A worker process: `threads` threads that take one lock over and over and, while holding
//! it, write to the fenced resource. Even threads check `is_lost()` before every write; odd
//! threads are careless and rely on the fencing token alone. Every thread stops writing at the
//! first rejected write and records what `unlock()` says. Taking a `Shared<u64>`, each hold
//! also records the value it read and adds one to it, written with the release.
//!
//! The process runs until its standard input closes, so it never outlives the driver.

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redmutex::{Client, MutexGuard, Redlock, RedlockGuard, Shared, SharedGuard};

use super::resource::{Resource, ResourceKeys};
use super::{AnyResult, LockKind};

const ROLE: &str = "REDMUTEX_FAULTS_WORKER";
const LOCK_URL: &str = "REDMUTEX_FAULTS_LOCK_URL";
const RESOURCE_URL: &str = "REDMUTEX_FAULTS_RESOURCE_URL";
const RUN: &str = "REDMUTEX_FAULTS_RUN";
const THREADS: &str = "REDMUTEX_FAULTS_THREADS";
const KIND: &str = "REDMUTEX_FAULTS_KIND";
const LEASE_MS: &str = "REDMUTEX_FAULTS_LEASE_MS";
const REPLICA_ACKS: &str = "REDMUTEX_FAULTS_REPLICA_ACKS";
const REDLOCK: &str = "REDMUTEX_FAULTS_REDLOCK";

/// The name of the one lock every worker takes.
pub const LOCK_NAME: &str = "fenced-resource";
/// Writes per hold.
const WRITES_PER_HOLD: usize = 3;

/// What a worker process needs to know, passed in its environment.
pub struct WorkerSpec {
    pub index: usize,
    pub lock_url: String,
    pub resource_url: String,
    pub run: String,
    pub threads: usize,
    pub kind: LockKind,
    pub lease: Duration,
    /// Replicas that must acknowledge each acquire (0: none).
    pub replica_acks: u32,
    /// A `Redlock` over the instances whose URLs `lock_url` lists, separated by commas.
    pub redlock: bool,
}

impl WorkerSpec {
    /// Puts the spec into a command's environment.
    pub fn apply(&self, cmd: &mut std::process::Command) {
        cmd.env(ROLE, self.index.to_string())
            .env(LOCK_URL, &self.lock_url)
            .env(RESOURCE_URL, &self.resource_url)
            .env(RUN, &self.run)
            .env(THREADS, self.threads.to_string())
            .env(KIND, self.kind.name())
            .env(LEASE_MS, self.lease.as_millis().to_string())
            .env(REPLICA_ACKS, self.replica_acks.to_string())
            .env(REDLOCK, if self.redlock { "1" } else { "0" });
    }

    fn from_env() -> AnyResult<Option<WorkerSpec>> {
        let Ok(index) = std::env::var(ROLE) else {
            return Ok(None);
        };
        let var = |name: &str| std::env::var(name).map_err(|_| format!("{name} is not set"));
        Ok(Some(WorkerSpec {
            index: index.parse()?,
            lock_url: var(LOCK_URL)?,
            resource_url: var(RESOURCE_URL)?,
            run: var(RUN)?,
            threads: var(THREADS)?.parse()?,
            kind: LockKind::from_name(&var(KIND)?).ok_or("unknown lock kind")?,
            lease: Duration::from_millis(var(LEASE_MS)?.parse()?),
            replica_acks: var(REPLICA_ACKS)?.parse()?,
            redlock: var(REDLOCK)? == "1",
        }))
    }
}

/// Runs the worker when this process was started as one; returns `Ok(false)` otherwise.
pub fn run_if_worker() -> AnyResult<bool> {
    let Some(spec) = WorkerSpec::from_env()? else {
        return Ok(false);
    };
    run(spec)?;
    Ok(true)
}

enum Lock {
    Plain(redmutex::Mutex),
    Fair(redmutex::FairMutex),
    Redlock(redmutex::RedlockMutex),
    Shared(Shared<u64>),
}

/// A held lock of any kind.
enum Guard {
    Mutex(MutexGuard),
    Redlock(RedlockGuard),
    Shared(SharedGuard<u64>),
}

impl Lock {
    fn try_lock_for(&self, timeout: Duration) -> redmutex::Result<Option<Guard>> {
        Ok(match self {
            Lock::Plain(m) => m.try_lock_for(timeout)?.map(Guard::Mutex),
            Lock::Fair(m) => m.try_lock_for(timeout)?.map(Guard::Mutex),
            Lock::Redlock(m) => m.try_lock_for(timeout)?.map(Guard::Redlock),
            Lock::Shared(v) => v.try_lock_for(timeout)?.map(Guard::Shared),
        })
    }
}

impl Guard {
    fn fencing_token(&self) -> u64 {
        match self {
            Guard::Mutex(g) => g.fencing_token(),
            Guard::Redlock(g) => g.fencing_token(),
            Guard::Shared(g) => g.fencing_token(),
        }
    }

    fn is_lost(&self) -> bool {
        match self {
            Guard::Mutex(g) => g.is_lost(),
            Guard::Redlock(g) => g.is_lost(),
            Guard::Shared(g) => g.is_lost(),
        }
    }

    fn unlock(self) -> redmutex::Result<()> {
        match self {
            Guard::Mutex(g) => g.unlock(),
            Guard::Redlock(g) => g.unlock(),
            Guard::Shared(g) => g.unlock(),
        }
    }
}

fn run(spec: WorkerSpec) -> AnyResult<()> {
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            // Standard input closes when the driver ends or asks us to stop.
            let _ = std::io::stdin().read_to_end(&mut Vec::new());
            stop.store(true, Ordering::SeqCst);
        });
    }
    let mut builder = Client::builder()
        .default_lease(spec.lease)
        .connect_timeout(spec.lease)
        .response_timeout(spec.lease / 2)
        .backoff(Duration::from_millis(1), Duration::from_millis(50));
    if spec.replica_acks > 0 {
        builder = builder.replica_acks(spec.replica_acks, spec.lease / 4);
    }
    let (clients, redlock) = if spec.redlock {
        let clients = spec
            .lock_url
            .split(',')
            .map(|url| builder.clone().open(url))
            .collect::<redmutex::Result<Vec<_>>>()?;
        let redlock = Redlock::new(clients.clone())?;
        (clients, Some(redlock))
    } else {
        (vec![builder.open(spec.lock_url.as_str())?], None)
    };
    let client = &clients[0];
    let keys = ResourceKeys::new(&spec.run);
    let threads: Vec<_> = (0..spec.threads)
        .map(|t| {
            let worker = format!("{}.{t}", spec.index);
            let lock = match &redlock {
                Some(redlock) => Lock::Redlock(redlock.mutex(LOCK_NAME)),
                None => match spec.kind {
                    LockKind::FairMutex => Lock::Fair(client.fair_mutex(LOCK_NAME)),
                    LockKind::Shared => Lock::Shared(client.shared(LOCK_NAME)),
                    LockKind::Mutex => Lock::Plain(client.mutex(LOCK_NAME)),
                },
            };
            let resource = Resource::connect(&spec.resource_url, keys.clone());
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || -> Result<(), String> {
                let resource = resource.map_err(|e| e.to_string())?;
                let careful = t % 2 == 0;
                work(&worker, careful, &lock, resource, &stop).map_err(|e| format!("{worker}: {e}"))
            })
        })
        .collect();
    let mut failures = Vec::new();
    for t in threads {
        match t.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => failures.push(e),
            Err(_) => failures.push("a worker thread panicked".to_owned()),
        }
    }
    drop(redlock);
    for client in clients {
        client.shutdown();
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(failures.join("; ").into())
    }
}

fn work(
    worker: &str,
    careful: bool,
    lock: &Lock,
    mut resource: Resource,
    stop: &AtomicBool,
) -> AnyResult<()> {
    let mut holds = 0u64;
    while !stop.load(Ordering::SeqCst) {
        match lock.try_lock_for(Duration::from_secs(2)) {
            Ok(Some(guard)) => {
                hold(worker, careful, guard, &mut resource)?;
                holds += 1;
            }
            Ok(None) => {}
            Err(e) => {
                resource.note(&["A", worker, &format!("{:?}", e.kind())])?;
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        // Let the other threads of this process have a turn.
        std::thread::sleep(Duration::from_millis(fastrand::u64(0..3)));
    }
    resource.note(&["D", worker, &holds.to_string()])
}

/// One hold: begin, up to three fenced writes with a little work before each, end, unlock.
fn hold(worker: &str, careful: bool, mut guard: Guard, resource: &mut Resource) -> AnyResult<()> {
    let token = guard.fencing_token();
    resource.begin(token, worker)?;
    if let Guard::Shared(value) = &mut guard {
        resource.read(token, worker, **value)?;
        **value += 1;
    }
    let mut lost = false;
    for _ in 0..WRITES_PER_HOLD {
        std::thread::sleep(Duration::from_millis(fastrand::u64(1..4)));
        if careful && guard.is_lost() {
            lost = true;
            break;
        }
        if !resource.write(token, worker)? {
            break;
        }
    }
    resource.end(token, worker)?;
    let unlock = match guard.unlock() {
        Ok(()) => "ok".to_owned(),
        Err(e) if e.is_lock_lost() => "lost".to_owned(),
        Err(e) => format!("{:?}", e.kind()),
    };
    resource.outcome(token, worker, lost, &unlock)
}

/// The shared value as the run left it, read under its lock (the workers have stopped).
pub fn final_shared_value(lock_url: &str, lease: Duration) -> AnyResult<u64> {
    let client = Client::builder()
        .default_lease(lease)
        .connect_timeout(Duration::from_secs(5))
        .open(lock_url)?;
    let value = client
        .shared::<u64>(LOCK_NAME)
        .try_lock_for(Duration::from_secs(30))?
        .ok_or("the shared value stayed locked after the workers stopped")?;
    let read = *value;
    drop(value);
    client.shutdown();
    Ok(read)
}
