//! Every script loads into a real Redis: a syntax error fails here, not in production.
//! And the scripts' own cases that need an exact order of calls, which no client run can
//! force. And the models of the hand-off held to the scripts (`model_conformance` for the
//! `Mutex`, `fair_conformance` for the `FairMutex`).

mod fair_conformance;
mod model_conformance;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::Script;

/// A `redis-server` on a Unix socket of its own, killed on drop.
struct Server {
    child: Child,
    dir: std::path::PathBuf,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts a server (`what` names its directory) and connects to it.
fn start(what: &str) -> (Server, redis::Connection) {
    let dir = std::env::temp_dir().join(format!("redmutex-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let socket = dir.join("redis.sock");
    let binary = std::env::var("REDMUTEX_SERVER").unwrap_or_else(|_| "redis-server".into());
    let child = Command::new(binary)
        .args(["--port", "0", "--save", "", "--appendonly", "no"])
        .arg("--unixsocket")
        .arg(&socket)
        .arg("--dir")
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server (scripts/ensure-redis installs it)");
    let server = Server { child, dir };
    let url = format!("redis+unix://{}", socket.display());
    let client = redis::Client::open(url.as_str()).unwrap();
    let started = Instant::now();
    loop {
        match client.get_connection() {
            Ok(conn) => return (server, conn),
            Err(e) if started.elapsed() > Duration::from_secs(20) => panic!("{e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(20)),
        }
    }
}

#[test]
fn every_script_loads_into_redis() {
    let (server, mut conn) = start("scripts");
    let scripts = crate::lease::scripts::scripts()
        .into_iter()
        .chain(crate::lease::quorum_scripts())
        .chain(super::mutex::scripts())
        .chain(super::fair_mutex::scripts())
        .chain(super::rw_lock::scripts())
        .chain(super::semaphore::scripts())
        .chain(super::multi_lock::scripts())
        .chain(super::shared::scripts())
        .chain(super::election::scripts());
    let mut loaded = 0;
    for (name, script) in scripts {
        if let Err(e) = script.load(&mut conn) {
            panic!("script {name} does not load: {e}");
        }
        loaded += 1;
    }
    assert_eq!(loaded, 40);
    drop(server);
}

/// One random trace of `model` from its first state to a state where nothing can happen
/// (`seed` picks each step among those that can), on a Redis emptied first: `step` runs each
/// step's part in Redis and compares (the state before, the step, the state after, its
/// number). The trace must end `done`: with every thread idle.
fn random_trace<M>(
    conn: &mut redis::Connection,
    (model, seed): (&M, u64),
    mut step: impl FnMut(&mut redis::Connection, (&M::State, &M::State), M::Action, usize),
    done: impl Fn(&M::State) -> bool,
) where
    M: stateright::Model,
    M::Action: Copy,
{
    let _: () = redis::cmd("FLUSHALL").query(conn).unwrap();
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut s = model.init_states().remove(0);
    let mut actions = Vec::new();
    for n in 0.. {
        actions.clear();
        model.actions(&s, &mut actions);
        let mut next: Vec<(M::Action, M::State)> = actions
            .iter()
            .filter_map(|&a| model.next_state(&s, a).map(|n| (a, n)))
            .collect();
        if next.is_empty() {
            break;
        }
        let (action, after) = next.swap_remove(rng.usize(..next.len()));
        step(conn, (&s, &after), action, n);
        s = after;
    }
    assert!(done(&s), "trace {seed} stopped with a thread waiting");
}

/// Runs `script` with `keys` and `args`: its reply.
fn eval<T: redis::FromRedisValue>(
    conn: &mut redis::Connection,
    script: &Script,
    (keys, args): (&[&str], &[String]),
) -> T {
    let mut call = script.prepare_invoke();
    for key in keys {
        call.key(*key);
    }
    for arg in args {
        call.arg(arg);
    }
    call.invoke(conn).unwrap()
}

/// A `Mutex` script by name.
fn mutex_script(name: &str) -> &'static Script {
    super::mutex::scripts()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, script)| script)
        .unwrap()
}

/// How many announcements Redis has published so far (either flavour).
fn announcements(conn: &mut redis::Connection) -> u64 {
    let stats: String = redis::cmd("INFO").arg("commandstats").query(conn).unwrap();
    stats
        .lines()
        .filter(|l| l.starts_with("cmdstat_publish:") || l.starts_with("cmdstat_spublish:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// The keys of the lock of the replayed cases: its key, fencing counter and waiting set.
type Keys = (&'static str, &'static str, &'static str);

/// `mutex/acquire.lua` for `token` (`waits` as the script takes it); its reply.
fn acquire(conn: &mut redis::Connection, keys: Keys, token: &str, waits: &str) -> Vec<Option<i64>> {
    let (lock, fence, waiting) = keys;
    mutex_script("mutex/acquire")
        .key(lock)
        .key(fence)
        .key(waiting)
        .arg(token)
        .arg(30_000)
        .arg(waits)
        .invoke(conn)
        .unwrap()
}

/// `mutex/pass_on.lua` of the lock `token` holds: the new holder's fencing token.
fn pass_on(conn: &mut redis::Connection, keys: Keys, token: &str) -> i64 {
    let (lock, fence, waiting) = keys;
    let passed: Vec<i64> = mutex_script("mutex/pass_on")
        .key(lock)
        .key(fence)
        .key(waiting)
        .arg(token)
        .arg(1)
        .arg(30_000)
        .invoke(conn)
        .unwrap();
    passed[1]
}

/// `mutex/release_held.lua` of the lock `token` holds, giving up places below `bound`
/// (no other thread of the client waits); 1 when released.
fn release_held(conn: &mut redis::Connection, keys: Keys, token: &str, bound: i64) -> i64 {
    let (lock, fence, waiting) = keys;
    mutex_script("mutex/release_held")
        .key(lock)
        .key(waiting)
        .key(fence)
        .arg(token)
        .arg(format!("{lock}:ch"))
        .arg(bound)
        .arg("")
        .arg(60_000)
        .invoke(conn)
        .unwrap()
}

/// The clients left among the waiting.
fn waiting_clients(conn: &mut redis::Connection, keys: Keys) -> Vec<String> {
    redis::cmd("ZRANGE")
        .arg(keys.2)
        .arg(0)
        .arg(-1)
        .query(conn)
        .unwrap()
}

/// The place lost between a client's hold and its own next waiter (the counterexample of
/// `tests/wait_model.rs`, step by step): client A takes the lock with other threads of it
/// waiting, which places A with the take's token; the lock is passed within A, with a new
/// fencing token; then a thread of A comes back and attempts before the release of the
/// passed hold runs, and that release, which gives up a place from before its hold, must
/// not take away the place the thread now waits on: A is named.
#[test]
fn a_thread_that_waits_during_its_own_clients_hold_keeps_the_client_named() {
    let (server, mut conn) = start("lost-place");
    let keys = ("t:{p}", "t:{p}:fence", "t:{p}:waiting");
    let a = "0123456789abcdef0123456789abcdef";
    let (first, later) = (format!("{a}:1"), format!("{a}:3"));
    assert_eq!(acquire(&mut conn, keys, &first, "more")[0], Some(1));
    let passed_fence = pass_on(&mut conn, keys, &first);
    assert_eq!(acquire(&mut conn, keys, &later, "wait")[0], Some(0));
    let before = announcements(&mut conn);
    let released = release_held(&mut conn, keys, &first, passed_fence);
    assert_eq!(released, 1);
    assert_eq!(
        announcements(&mut conn) - before,
        1,
        "the release named nobody: the waiting thread's client lost its place"
    );
    let left = waiting_clients(&mut conn, keys);
    assert!(left.is_empty(), "{left:?}");
    drop(server);
}

/// The stale place (the second counterexample of `tests/wait_model.rs`): a sibling of
/// client A holds; A's waiting thread attempts after the lock was passed to it (the pass
/// reserved its token), so its place is not below that token; the thread then holds the
/// passed lock, and its release, with no other thread of A waiting, must give that place
/// up: client B, which waits, is named, not A.
#[test]
fn a_place_made_while_a_sibling_held_is_given_up_by_the_holds_release() {
    let (server, mut conn) = start("stale-place");
    let keys = ("t:{s}", "t:{s}:fence", "t:{s}:waiting");
    let (a, b) = (
        "00000000000000000000000000000000",
        "ffffffffffffffffffffffffffffffff",
    );
    let (sibling, waiter) = (format!("{a}:1"), format!("{a}:2"));
    assert_eq!(acquire(&mut conn, keys, &sibling, "wait")[0], Some(1));
    let passed_fence = pass_on(&mut conn, keys, &sibling);
    // The waiter's attempt reaches Redis after the pass: its client's own holds the lock.
    let told = acquire(&mut conn, keys, &waiter, "wait");
    assert_eq!(told[0], Some(0));
    let own_place = told
        .get(4)
        .copied()
        .flatten()
        .expect("the score of the place is told");
    assert!(own_place > passed_fence);
    // B waits too, placed after A.
    assert_eq!(
        acquire(&mut conn, keys, &format!("{b}:1"), "wait")[0],
        Some(0)
    );
    // The waiter holds the passed lock and releases with no sibling waiting.
    let bound = passed_fence.max(own_place + 1);
    let released = release_held(&mut conn, keys, &sibling, bound);
    assert_eq!(released, 1);
    let left = waiting_clients(&mut conn, keys);
    assert!(left.is_empty(), "A was named, B left waiting: {left:?}");
    drop(server);
}
