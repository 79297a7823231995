//! The fair (FIFO) lock: order across processes and threads, dead and timed-out waiters, and
//! no keys left behind.

mod support;

use std::process::Child;
use std::time::Duration;

use redis::Commands;
use redmutex::Client;
use support::{eventually, within, RedisServer};

const LIMIT: Duration = Duration::from_secs(60);
const ENTRY: &str = "fair_worker_entry";
const QUEUE: &str = "redmutex:{line}:queue";

/// Short leases, so that a dead waiter is skipped within about a second.
fn client(url: &str) -> Client {
    Client::builder()
        .default_lease(Duration::from_millis(1000))
        .renewal_interval(Duration::from_millis(250))
        .open(url)
        .unwrap()
}

/// The worker processes: queue for the fair lock, record their turn, hold briefly.
#[test]
fn fair_worker_entry() {
    let Some((role, url, id)) = support::worker_role() else {
        return;
    };
    assert_eq!(role, "fair-waiter");
    let client = client(&url);
    let g = client.fair_mutex("line").lock().unwrap();
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let _: () = conn.rpush("order", &id).unwrap();
    std::thread::sleep(Duration::from_millis(30));
    g.unlock().unwrap();
    println!("DONE {id}");
}

fn queue_len(server: &RedisServer) -> usize {
    server.conn().llen(QUEUE).unwrap()
}

/// Spawns waiters one at a time, each only after the previous one is in the queue.
fn queue_waiters(server: &RedisServer, ids: &[usize]) -> Vec<Child> {
    let mut children = Vec::new();
    for (n, id) in ids.iter().enumerate() {
        children.push(support::spawn_worker(
            ENTRY,
            "fair-waiter",
            &server.url(),
            &id.to_string(),
        ));
        assert!(
            eventually(LIMIT, || queue_len(server) == n + 1),
            "waiter {id} never queued"
        );
    }
    children
}

fn order(server: &RedisServer) -> Vec<usize> {
    let v: Vec<String> = server.conn().lrange("order", 0, -1).unwrap();
    v.iter().map(|s| s.parse().unwrap()).collect()
}

/// The keys of locks left in Redis (not the clients' announcements), but a fencing counter
/// that expires within a minute: a free lock's counter is kept that long, so that a lock
/// taken again soon counts on without seeding it from the clock.
fn keys_left(server: &RedisServer) -> Vec<String> {
    let mut conn = server.conn();
    let mut keys: Vec<String> = conn.keys("redmutex:{*").unwrap();
    keys.retain(|k| {
        let pttl: i64 = redis::cmd("PTTL").arg(k).query(&mut conn).unwrap();
        !(k.ends_with(":fence") && (1..=60_000).contains(&pttl))
    });
    keys.sort();
    keys
}

#[test]
fn processes_acquire_in_the_order_they_queued_and_leave_no_keys() {
    let server = RedisServer::start();
    let holder = client(&server.url());
    let g = holder.fair_mutex("line").lock().unwrap();
    let children = queue_waiters(&server, &[0, 1, 2, 3, 4]);
    g.unlock().unwrap();
    for mut c in children {
        support::read_marker(&mut c, "DONE ");
        assert!(c.wait().unwrap().success());
    }
    assert_eq!(order(&server), [0, 1, 2, 3, 4]);
    assert!(
        eventually(LIMIT, || keys_left(&server).is_empty()),
        "{:?}",
        keys_left(&server)
    );
}

#[test]
fn a_killed_waiter_is_skipped() {
    let server = RedisServer::start();
    let holder = client(&server.url());
    let g = holder.fair_mutex("line").lock().unwrap();
    let mut children = queue_waiters(&server, &[0, 1, 2]);
    let mut dead = children.remove(1);
    dead.kill().unwrap();
    dead.wait().unwrap();
    g.unlock().unwrap();
    for mut c in children {
        support::read_marker(&mut c, "DONE ");
        assert!(c.wait().unwrap().success());
    }
    assert_eq!(order(&server), [0, 2]);
    assert!(
        eventually(LIMIT, || keys_left(&server).is_empty()),
        "{:?}",
        keys_left(&server)
    );
}

#[test]
fn a_timed_out_waiter_leaves_the_queue_at_once() {
    let server = RedisServer::start();
    let holder = client(&server.url());
    let waiter = client(&server.url());
    let g = holder.fair_mutex("line").lock().unwrap();
    let w = waiter.clone();
    let got = within(LIMIT, move || {
        w.fair_mutex("line")
            .try_lock_for(Duration::from_millis(400))
            .map(|g| g.is_some())
    });
    assert!(!got.unwrap());
    assert_eq!(
        queue_len(&server),
        0,
        "the timed-out waiter is still queued"
    );
    let zcard: usize = server.conn().zcard("redmutex:{line}:timeouts").unwrap();
    assert_eq!(zcard, 0);
    g.unlock().unwrap();
    assert!(keys_left(&server).is_empty(), "{:?}", keys_left(&server));
}

#[test]
fn threads_acquire_in_queue_order_and_releases_wake_only_the_next() {
    let server = RedisServer::start();
    let holder = client(&server.url());
    let waiters = client(&server.url());
    let g = holder.fair_mutex("line").lock().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let mut threads = Vec::new();
    for id in 0..6usize {
        let (c, tx) = (waiters.clone(), tx.clone());
        threads.push(std::thread::spawn(move || {
            let g = c.fair_mutex("line").lock().unwrap();
            tx.send(id).unwrap();
            std::thread::sleep(Duration::from_millis(20));
            drop(g);
        }));
        assert!(eventually(LIMIT, || queue_len(&server) == id + 1));
    }
    let attempts_before = waiters.stats().attempts;
    g.unlock().unwrap();
    for t in threads {
        t.join().unwrap();
    }
    let got: Vec<usize> = rx.try_iter().collect();
    assert_eq!(got, [0, 1, 2, 3, 4, 5]);
    // Each release hands the lock to the next waiter, which owns it without an attempt.
    let stats = waiters.stats();
    let attempts = stats.attempts - attempts_before;
    assert!(attempts <= 3, "{attempts} attempts for 6 hand-offs");
    assert!(stats.handed_over >= 3, "{} hand-offs", stats.handed_over);
    assert!(keys_left(&server).is_empty(), "{:?}", keys_left(&server));
}

#[test]
fn fair_mutex_basics() {
    let server = RedisServer::start();
    let client = client(&server.url());
    let m = client.fair_mutex("basic");
    let g = m.lock().unwrap();
    let again = m.lock().unwrap();
    assert_eq!(m.hold_count(), 2);
    assert_eq!(again.fencing_token(), g.fencing_token());
    drop(again);
    let other = client.clone();
    let blocked =
        std::thread::spawn(move || other.fair_mutex("basic").try_lock().unwrap().is_none())
            .join()
            .unwrap();
    assert!(blocked);
    assert!(m.is_locked().unwrap());
    let token = g.fencing_token();
    g.unlock().unwrap();
    assert!(!m.is_locked().unwrap());
    let g2 = m.try_lock().unwrap().expect("free lock");
    assert!(g2.fencing_token() > token);
    assert!(m.force_unlock().unwrap());
    assert!(g2.unlock().unwrap_err().is_lock_lost());
    assert!(keys_left(&server).is_empty(), "{:?}", keys_left(&server));
}

#[test]
fn waiters_dropped_from_the_queue_join_again_while_the_lock_is_held() {
    let server = RedisServer::start();
    let holder = client(&server.url());
    let waiters = client(&server.url());
    let g = holder.fair_mutex("line").lock().unwrap();
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let c = waiters.clone();
            std::thread::spawn(move || {
                c.fair_mutex("line")
                    .try_lock_for(LIMIT)
                    .map(|g| g.is_some())
            })
        })
        .collect();
    let mut conn = server.conn();
    assert!(eventually(LIMIT, || conn.llen::<_, i64>(QUEUE).unwrap() == 3));
    // As if the waiting process had stalled past its waiters' timeout: every place is gone.
    let _: () = redis::cmd("DEL")
        .arg(QUEUE)
        .arg("redmutex:{line}:timeouts")
        .query(&mut conn)
        .unwrap();
    // Only one of the three re-checks the lock; the others learn from their heartbeat that
    // they were dropped, and join again while the lock is still held.
    assert!(
        eventually(Duration::from_secs(20), || conn
            .llen::<_, i64>(QUEUE)
            .unwrap()
            == 3),
        "dropped waiters did not join again"
    );
    g.unlock().unwrap();
    for t in threads {
        assert!(within(LIMIT, move || t.join().unwrap()).unwrap());
    }
}

/// Waiters with the default lease, so that their place outlives them by 30 s: one that only
/// waits (to be killed), and one that, once it has the lock, reports its fencing token and
/// whether another holder was inside (to be stopped and resumed).
#[test]
fn fair_long_waiter_entry() {
    let Some((role, url, _)) = support::worker_role() else {
        return;
    };
    let client = Client::open(url.as_str()).unwrap();
    println!("QUEUEING");
    let got = client
        .fair_mutex("line")
        .try_lock_for(Duration::from_secs(600))
        .unwrap();
    assert_eq!(role, "reporting-waiter");
    let g = got.expect("acquired");
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    let inside: bool = conn.exists("inside").unwrap();
    let report = format!(
        "{} {}",
        g.fencing_token(),
        if inside { "overlap" } else { "alone" }
    );
    let _: () = conn.rpush("report", report).unwrap();
    g.unlock().unwrap();
}

/// The lock's remaining lease in Redis, ms.
fn pttl(server: &RedisServer) -> i64 {
    server.conn().pttl("redmutex:{line}").unwrap()
}

/// Starts a thread of `client` that queues for the lock and returns the fencing token it
/// got, and whether its lease was then renewed past the hand-off's one-second claim.
fn queued_waiter(
    client: &Client,
    lease: Option<Duration>,
    server: &RedisServer,
) -> std::thread::JoinHandle<(u64, bool)> {
    let (client, url) = (client.clone(), server.url());
    std::thread::spawn(move || {
        let m = client.fair_mutex("line");
        let m = match lease {
            Some(lease) => m.with_fixed_lease(lease),
            None => m,
        };
        let g = m.try_lock_for(LIMIT).unwrap().expect("acquired");
        let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
        let renewed = eventually(LIMIT, || {
            conn.pttl::<_, i64>("redmutex:{line}").unwrap() > 1500
        });
        let fence = g.fencing_token();
        g.unlock().unwrap();
        (fence, renewed)
    })
}

#[test]
fn a_release_hands_the_lock_to_the_next_waiter_which_owns_it_without_an_attempt() {
    let server = RedisServer::start();
    let holder = Client::open(server.url()).unwrap();
    let waiter = Client::open(server.url()).unwrap();
    let g = holder.fair_mutex("line").lock().unwrap();
    let t = queued_waiter(&waiter, None, &server);
    assert!(eventually(LIMIT, || queue_len(&server) == 1));
    let before = waiter.stats();
    let fence = g.fencing_token();
    g.unlock().unwrap();
    let (handed, renewed) = within(LIMIT, move || t.join().unwrap());
    assert_eq!(handed, fence + 1);
    assert!(renewed, "the claim was not renewed to the lease");
    let after = waiter.stats();
    assert_eq!(
        after.attempts, before.attempts,
        "the waiter attempted again"
    );
    assert_eq!(after.handed_over, 1);
    assert!(keys_left(&server).is_empty(), "{:?}", keys_left(&server));
}

/// A release goes out behind a `TIME` (so that Redis writes the hand-off's announcement
/// before the releaser's reply) only when the hold was taken after a wait: a lock taken at
/// once, with nobody queued, is most likely released to nobody.
#[test]
fn only_a_hold_taken_after_a_wait_is_released_behind_a_time() {
    let server = RedisServer::start();
    let holder = Client::open(server.url()).unwrap();
    let waiter = Client::open(server.url()).unwrap();
    let m = holder.fair_mutex("line");
    drop(m.lock().unwrap()); // the fencing counter is started: later takes are plain
    let before = server.command_calls("time");
    for _ in 0..20 {
        m.lock().unwrap().unlock().unwrap();
    }
    let uncontended = server.command_calls("time") - before;
    // Before, each of the 20 releases sent one; a few may come from elsewhere (a script
    // reading the clock, the client's background work).
    assert!(uncontended < 10, "{uncontended} TIME calls for 20 releases");
    let g = m.lock().unwrap();
    let w = waiter.fair_mutex("line");
    let (taken, go) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
    let t = std::thread::spawn(move || {
        let handed = w.try_lock_for(LIMIT).unwrap().expect("handed over");
        taken.0.send(()).unwrap();
        go.1.recv_timeout(LIMIT).unwrap();
        handed.unlock().unwrap();
    });
    assert!(eventually(LIMIT, || queue_len(&server) == 1));
    g.unlock().unwrap();
    taken
        .1
        .recv_timeout(LIMIT)
        .expect("the waiter took the lock");
    let before = server.command_calls("time");
    go.0.send(()).unwrap();
    within(LIMIT, move || t.join().unwrap());
    assert!(server.command_calls("time") > before);
    assert!(keys_left(&server).is_empty(), "{:?}", keys_left(&server));
}

#[test]
fn a_waiter_with_a_fixed_lease_takes_a_handed_over_lock_with_one_attempt() {
    let server = RedisServer::start();
    let holder = Client::open(server.url()).unwrap();
    let waiter = Client::open(server.url()).unwrap();
    let g = holder.fair_mutex("line").lock().unwrap();
    let t = queued_waiter(&waiter, Some(Duration::from_secs(30)), &server);
    assert!(eventually(LIMIT, || queue_len(&server) == 1));
    let before = waiter.stats();
    let fence = g.fencing_token();
    g.unlock().unwrap();
    let (taken, renewed) = within(LIMIT, move || t.join().unwrap());
    // Only an attempt sets a fixed lease: it finds the claim holding its token.
    assert!(taken > fence);
    assert!(renewed, "the fixed lease was not set");
    let after = waiter.stats();
    assert_eq!(after.attempts, before.attempts + 1);
    assert_eq!(after.handed_over, 0);
    assert!(keys_left(&server).is_empty(), "{:?}", keys_left(&server));
}

#[test]
fn a_waiter_killed_just_before_its_turn_holds_the_next_one_up_for_the_claim_only() {
    let server = RedisServer::start();
    let holder = Client::open(server.url()).unwrap();
    let g = holder.fair_mutex("line").lock().unwrap();
    // The next in line: its place in the queue outlives it by the default 30 s.
    let mut doomed =
        support::spawn_worker("fair_long_waiter_entry", "idle-waiter", &server.url(), "");
    support::read_marker(&mut doomed, "QUEUEING");
    assert!(eventually(LIMIT, || queue_len(&server) == 1));
    // Behind it, a client that re-checks every second.
    let survivor = Client::builder()
        .renewal_interval(Duration::from_secs(1))
        .open(server.url())
        .unwrap();
    let t = queued_waiter(&survivor, None, &server);
    assert!(eventually(LIMIT, || queue_len(&server) == 2));
    // It dies at the worst moment: first in line, its place still alive, just before the
    // release hands it the lock.
    doomed.kill().unwrap();
    doomed.wait().unwrap();
    let fence = g.fencing_token();
    g.unlock().unwrap();
    let started = std::time::Instant::now();
    assert!(
        pttl(&server) <= 1000,
        "the dead waiter got more than the claim"
    );
    let (taken, renewed) = within(LIMIT, move || t.join().unwrap());
    // The release handed the lock to the dead waiter (one fencing token), whose claim ran
    // out; the survivor took it at its next re-check, long before the dead waiter's place
    // (30 s) or a lease would have run out.
    assert_eq!(taken, fence + 2);
    assert!(renewed);
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the survivor waited {:?}",
        started.elapsed()
    );
    assert!(keys_left(&server).is_empty(), "{:?}", keys_left(&server));
}

/// Whether the process is stopped (state `T` in `/proc/<pid>/stat`).
fn is_stopped(pid: libc::pid_t) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            let after_name = stat.rsplit_once(')')?.1;
            after_name
                .split_whitespace()
                .next()
                .map(|state| state == "T")
        })
        .unwrap_or(false)
}

#[test]
fn a_waiter_stalled_past_its_claim_does_not_take_the_lock_it_was_handed() {
    let server = RedisServer::start();
    let holder = Client::open(server.url()).unwrap();
    let g = holder.fair_mutex("line").lock().unwrap();
    let mut stalled = support::spawn_worker(
        "fair_long_waiter_entry",
        "reporting-waiter",
        &server.url(),
        "",
    );
    support::read_marker(&mut stalled, "QUEUEING");
    assert!(eventually(LIMIT, || queue_len(&server) == 1));
    // Behind it, a client that re-checks every second and holds the lock for 3 s, marked.
    let next = Client::builder()
        .renewal_interval(Duration::from_secs(1))
        .open(server.url())
        .unwrap();
    let url = server.url();
    let t = std::thread::spawn(move || {
        let g = next
            .fair_mutex("line")
            .try_lock_for(LIMIT)
            .unwrap()
            .expect("acquired");
        let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
        let _: () = conn.set("inside", 1).unwrap();
        std::thread::sleep(Duration::from_secs(3));
        let _: () = conn.del("inside").unwrap();
        let fence = g.fencing_token();
        g.unlock().unwrap();
        fence
    });
    assert!(eventually(LIMIT, || queue_len(&server) == 2));
    // The first in line stalls (a pause of its process), and the release hands it the lock.
    let pid = stalled.id() as libc::pid_t;
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    assert!(eventually(LIMIT, || is_stopped(pid)));
    let fence = g.fencing_token();
    g.unlock().unwrap();
    // Its claim runs out and the next waiter takes the lock; then the stalled one resumes and
    // reads the message that handed it the lock, too late to rely on it.
    let mut conn = server.conn();
    assert!(eventually(LIMIT, || conn
        .exists::<_, bool>("inside")
        .unwrap()));
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let next_fence = within(LIMIT, move || t.join().unwrap());
    assert_eq!(
        next_fence,
        fence + 2,
        "the release did not hand the lock over"
    );
    assert!(eventually(LIMIT, || conn
        .llen::<_, usize>("report")
        .unwrap()
        == 1));
    let report: String = conn.lpop("report", None).unwrap();
    let (stalled_fence, overlap) = report.split_once(' ').unwrap();
    assert_eq!(
        overlap, "alone",
        "the stalled waiter held the lock beside the next one"
    );
    assert!(stalled_fence.parse::<u64>().unwrap() > next_fence);
    assert!(within(LIMIT, move || stalled.wait().unwrap()).success());
}

/// A newcomer's first try takes a free lock without a script, but not ahead of the queue: a
/// lock left free while someone queues (its holder's lease ran out: here its key is deleted)
/// goes to the queue's head, and the newcomer is told it is held.
#[test]
fn a_newcomer_does_not_take_a_free_lock_ahead_of_the_queue() {
    let server = RedisServer::start();
    let url = server.url();
    let newcomer = client(&url);
    // Taken once before, so that the newcomer knows the fencing counter and takes plainly.
    drop(newcomer.fair_mutex("ahead").lock().unwrap());
    let plain_before = server.command_calls("set");
    drop(newcomer.fair_mutex("ahead").lock().unwrap());
    assert!(
        server.command_calls("set") > plain_before,
        "the newcomer did not take the free lock with a plain SET"
    );

    let holder = client(&url);
    let g = holder.fair_mutex("ahead").lock().unwrap();
    let waiter_client = client(&url);
    let waiter = std::thread::spawn(move || {
        let g = waiter_client.fair_mutex("ahead").lock().unwrap();
        let token = g.fencing_token();
        std::thread::sleep(Duration::from_millis(300));
        g.unlock().unwrap();
        token
    });
    assert!(
        eventually(LIMIT, || server
            .conn()
            .llen::<_, usize>("redmutex:{ahead}:queue")
            .unwrap()
            == 1),
        "the waiter did not queue"
    );
    // The holder's lease runs out (its key is gone) while the waiter queues.
    let _: () = server.conn().del("redmutex:{ahead}").unwrap();
    assert!(
        newcomer.fair_mutex("ahead").try_lock().unwrap().is_none(),
        "the newcomer took the lock ahead of the queued waiter"
    );
    let token = within(LIMIT, move || waiter.join().unwrap());
    assert!(token > g.fencing_token());
    assert!(g.unlock().unwrap_err().is_lock_lost());
}

/// A release whose hand-off finds the fencing counter broken gives the lock back and leaves
/// the next waiter at the head of the queue, woken: each waiter's attempt reports the broken
/// counter, the first in line first, and nothing is left holding the lock.
///
/// The order is read where it happens, from `MONITOR`: every take of the lock by the first
/// waiter (the release's hand-off, its own attempt) comes before any by the second. The order
/// in which the two threads return says nothing: the first, stalled on a loaded machine after
/// its error, may return after the second.
#[test]
fn a_hand_off_onto_a_broken_fencing_counter_leaves_each_waiter_an_error_in_turn() {
    let server = RedisServer::start();
    let url = server.url();
    let holder = client(&url);
    let g = holder.fair_mutex("broken").lock().unwrap();
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let mut waiters = Vec::new();
    for (n, name) in ["first", "second"].into_iter().enumerate() {
        let (c, done) = (client(&url), done_tx.clone());
        waiters.push(std::thread::spawn(move || {
            let outcome = c
                .fair_mutex("broken")
                .try_lock_for(LIMIT)
                .map(|g| g.is_some());
            done.send((name, outcome)).unwrap();
        }));
        assert!(
            eventually(LIMIT, || server
                .conn()
                .llen::<_, usize>("redmutex:{broken}:queue")
                .unwrap()
                == n + 1),
            "{name} did not queue"
        );
    }
    // Each waiter's token is its id in the queue: the first's is at its head.
    let queue: Vec<String> = server
        .conn()
        .lrange("redmutex:{broken}:queue", 0, -1)
        .unwrap();
    assert_eq!(queue.len(), 2, "{queue:?}");
    let mut monitor = server.conn();
    let _: () = redis::cmd("MONITOR").query(&mut monitor).unwrap();
    let _: () = server
        .conn()
        .set("redmutex:{broken}:fence", "not a number")
        .unwrap();
    g.unlock().unwrap();
    for _ in 0..2 {
        let (name, outcome) = done_rx.recv_timeout(LIMIT).expect("a waiter ended");
        let err = outcome.expect_err(name);
        assert!(err.is_wrong_type(), "{name}: {err}");
    }
    for t in waiters {
        t.join().unwrap();
    }
    // Who took the lock (and gave it back on the broken counter), in the server's order.
    monitor
        .set_read_timeout(Some(Duration::from_millis(500)))
        .unwrap();
    // Both waiters have returned: the lines of their attempts were sent before. Other
    // commands (renewals, re-checks) go on; two seconds of lines is plenty.
    let mut takers = Vec::new();
    let read_until = std::time::Instant::now() + Duration::from_secs(2);
    while std::time::Instant::now() < read_until {
        let Ok(redis::Value::SimpleString(line)) = monitor.recv_response() else {
            break;
        };
        let took =
            |token: &str| line.contains(&format!("\"SET\" \"redmutex:{{broken}}\" \"{token}\""));
        match (took(&queue[0]), took(&queue[1])) {
            (true, _) => takers.push("first"),
            (_, true) => takers.push("second"),
            _ => {}
        }
    }
    let first_takes = takers.iter().rposition(|&t| t == "first");
    let second_takes = takers.iter().position(|&t| t == "second");
    assert!(
        first_takes.is_some() && second_takes.is_some() && first_takes < second_takes,
        "the first in line was not told first: takes in order {takers:?}"
    );
    let fence: String = server.conn().get("redmutex:{broken}:fence").unwrap();
    assert_eq!(fence, "not a number");
    let held: bool = server.conn().exists("redmutex:{broken}").unwrap();
    assert!(!held, "the lock key was left behind");
}
