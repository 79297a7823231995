//! The `FairMutex`'s queue model (`tests/wait_model/fair.rs`) held to its scripts, as
//! `model_conformance` holds the `Mutex`'s: random traces of the model against a real Redis,
//! each Redis step as the real script, and after every step the lock's token, the fencing
//! counter, the queue, the waiters' deadlines and the messages compared with the model's.

#[allow(dead_code)]
#[path = "../../../tests/wait_model/fair.rs"]
mod fair;

use std::sync::LazyLock;

use self::fair::{Action, FairQueue, State, Thread, Token};
use super::{announcements, eval, random_trace, start};
use crate::keys::LockKeys;

/// The lock's keys, as a `FairMutex` named `q` has them.
static KEYS: LazyLock<LockKeys> = LazyLock::new(|| LockKeys::new("f", "q").unwrap());
/// Long enough that no lease, claim or waiter's deadline runs out during a trace.
const LONG_MS: u64 = 600_000;
const TRACES: u64 = 150;

fn fair_script(name: &str) -> &'static redis::Script {
    super::super::fair_mutex::scripts()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, script)| script)
        .unwrap()
}

/// The keys of the fair scripts: lock, fencing counter, queue, deadlines.
fn keys() -> [&'static str; 4] {
    [&KEYS.lock, &KEYS.fence, KEYS.queue(), KEYS.timeouts()]
}

fn token_text((c, t, left): Token) -> String {
    format!("{c:032x}:{t}-{left}")
}

/// What the traces did, so that the test knows it covered each kind of step.
#[derive(Default, Debug)]
struct Covered {
    taken: u32,
    taken_handed: u32,
    queued: u32,
    tried: u32,
    handed_on: u32,
    freed: u32,
    /// A waiter told again that the lock is free and it is next: only after a waiter died
    /// or a claim ran out, which the model leaves out.
    told_again: u32,
}

/// The counter starts at the server's clock; the model's at zero.
fn real(model: u32, offset: Option<i64>) -> i64 {
    i64::from(model) + offset.unwrap_or(0)
}

/// Runs the Redis step of `action` as the real script and checks its reply.
fn run_step(
    conn: &mut redis::Connection,
    (before, after): (&State, &State),
    action: Action,
    (offset, covered): (&mut Option<i64>, &mut Covered),
) {
    match action {
        Action::RunAttempt(c, t) => {
            let token = FairQueue::token(before, (c, t));
            let queue = match FairQueue::worker(before, (c, t)).now {
                Thread::Trying { .. } => "try",
                Thread::Attempting { .. } => "wait",
                ref other => panic!("an attempt from {other:?}"),
            };
            let args = [
                token_text(token),
                LONG_MS.to_string(),
                LONG_MS.to_string(),
                queue.to_owned(),
                KEYS.waiter_channel_prefix().to_owned(),
            ];
            let reply: Vec<i64> = eval(conn, fair_script("fair_mutex/acquire"), (&keys(), &args));
            match FairQueue::worker(after, (c, t)).now {
                Thread::Holding { fence, .. } => {
                    assert_eq!(reply[0], 1, "{reply:?}");
                    offset.get_or_insert(reply[1] - i64::from(fence));
                    assert_eq!(reply[1], real(fence, *offset), "{reply:?}");
                    covered.taken += 1;
                    covered.taken_handed += u32::from(before.redis.lock == Some(token));
                }
                _ => {
                    assert_eq!(reply[0], 0, "{reply:?}");
                    assert!(reply[1] > 0, "{reply:?}");
                    covered.queued += u32::from(queue == "wait");
                    covered.tried += u32::from(queue == "try");
                }
            }
            let told = after.redis.in_flight.len() > before.redis.in_flight.len();
            covered.told_again += u32::from(told);
        }
        Action::RunRelease(c, t) => {
            let Thread::Releasing { token } = FairQueue::worker(before, (c, t)).now else {
                panic!("a release from {before:?}");
            };
            let args = [
                token_text(token),
                KEYS.waiter_channel_prefix().to_owned(),
                "release".to_owned(),
                LONG_MS.to_string(),
            ];
            let released: i64 = eval(conn, fair_script("fair_mutex/release"), (&keys(), &args));
            assert_eq!(released, i64::from(before.redis.lock == Some(token)));
            covered.handed_on += u32::from(after.redis.lock.is_some());
            covered.freed += u32::from(after.redis.lock.is_none());
        }
        // A thread's own steps, and a delivery: nothing in Redis changes.
        _ => {}
    }
}

/// The keys Redis holds against the model's.
fn compare_keys(conn: &mut redis::Connection, s: &State, offset: Option<i64>, step: usize) {
    let lock: Option<String> = redis::cmd("GET")
        .arg(KEYS.lock.as_str())
        .query(conn)
        .unwrap();
    assert_eq!(lock, s.redis.lock.map(token_text), "the lock, step {step}");
    if s.redis.counter > 0 {
        let counter: i64 = redis::cmd("GET")
            .arg(KEYS.fence.as_str())
            .query(conn)
            .unwrap();
        assert_eq!(
            counter,
            real(s.redis.counter, offset),
            "the counter, step {step}"
        );
    }
    let queue: Vec<String> = redis::cmd("LRANGE")
        .arg(KEYS.queue())
        .arg(0)
        .arg(-1)
        .query(conn)
        .unwrap();
    let predicted: Vec<String> = s.redis.queue.iter().copied().map(token_text).collect();
    assert_eq!(queue, predicted, "the queue, step {step}");
    let mut deadlines: Vec<String> = redis::cmd("ZRANGE")
        .arg(KEYS.timeouts())
        .arg(0)
        .arg(-1)
        .query(conn)
        .unwrap();
    let mut queued = predicted;
    deadlines.sort();
    queued.sort();
    assert_eq!(deadlines, queued, "the waiters' deadlines, step {step}");
    for key in [KEYS.lock.as_str(), KEYS.queue(), KEYS.timeouts()] {
        let ttl: i64 = redis::cmd("PTTL").arg(key).query(conn).unwrap();
        assert!(ttl == -2 || ttl > 0, "{key} does not expire (step {step})");
    }
}

fn run_trace(conn: &mut redis::Connection, model: &FairQueue, seed: u64, covered: &mut Covered) {
    let mut offset = None;
    random_trace(
        conn,
        (model, seed),
        |conn, (s, after), action, step| {
            let published = announcements(conn);
            run_step(conn, (s, after), action, (&mut offset, covered));
            let messages = after
                .redis
                .in_flight
                .len()
                .saturating_sub(s.redis.in_flight.len());
            assert_eq!(
                announcements(conn) - published,
                messages as u64,
                "messages after {action:?}, step {step} of trace {seed}"
            );
            compare_keys(conn, after, offset, step);
        },
        |s| s.threads.iter().flatten().all(|w| w.now == Thread::Idle),
    );
}

#[test]
fn the_fair_scripts_do_what_the_queue_model_predicts() {
    let mut covered = Covered::default();
    let (server, mut conn) = start("fair-conformance");
    let model = FairQueue {
        threads: vec![2, 2, 1],
        acquisitions: 3,
    };
    (0..TRACES).for_each(|seed| run_trace(&mut conn, &model, seed, &mut covered));
    // Every kind of step ran, many times.
    let c = &covered;
    let kinds = [
        ("takes", c.taken),
        ("takes of a lock handed over", c.taken_handed),
        ("waiters queued", c.queued),
        ("tries", c.tried),
        ("hand-overs", c.handed_on),
        ("releases of a free lock", c.freed),
    ];
    for (kind, n) in kinds {
        assert!(n >= 10, "{n} {kind}: {covered:?}");
    }
    drop(server);
}
