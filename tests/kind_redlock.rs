//! Redlock over 3 and 5 independent `redis-server`s that the tests start, kill, restart and
//! pause: quorum, rollback, renewal while instances restart, ordered fencing tokens across
//! instances, waiting, and bad input. Cases follow the peers' suites (node-redlock, redsync)
//! and redis.io's analysis.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use redmutex::{Client, ErrorKind, Redlock};
use support::{
    eventually, redlock_client as client, redlock_over as redlock, servers, within, RedisServer,
};

const LIMIT: Duration = Duration::from_secs(60);

fn get(server: &RedisServer, key: &str) -> Option<String> {
    redis::cmd("GET")
        .arg(key)
        .query(&mut server.conn())
        .unwrap()
}

fn set(server: &RedisServer, key: &str, value: &str) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .arg("PX")
        .arg(60_000)
        .query(&mut server.conn())
        .unwrap();
}

#[test]
fn a_lock_is_taken_on_every_instance_and_released_on_every_instance() {
    let s = servers(3);
    let redlock = redlock(&s);
    assert_eq!((redlock.instances(), redlock.quorum()), (3, 2));
    let m = redlock.mutex("orders:42");
    let g = m.lock().unwrap();
    let token: Vec<Option<String>> = s.iter().map(|s| get(s, "redmutex:{orders:42}")).collect();
    assert!(
        token.iter().all(|t| t.is_some() && *t == token[0]),
        "{token:?}"
    );
    assert!(m.is_locked().unwrap());
    assert!(g.verify().unwrap() > Duration::ZERO);
    // Re-entry on the same thread.
    let inner = m.lock().unwrap();
    assert_eq!(m.hold_count(), 2);
    drop(inner);
    assert!(m.is_held_by_current_thread());
    g.unlock().unwrap();
    assert!(s.iter().all(|s| get(s, "redmutex:{orders:42}").is_none()));
    assert!(!m.is_locked().unwrap());
    assert_eq!(m.hold_count(), 0);
}

#[test]
fn a_minority_held_by_someone_else_does_not_stop_the_lock_and_is_left_alone() {
    let s = servers(3);
    set(&s[0], "redmutex:{m}", "foreign");
    let redlock = redlock(&s);
    let g = redlock
        .mutex("m")
        .try_lock()
        .unwrap()
        .expect("a majority was free");
    assert_eq!(get(&s[0], "redmutex:{m}").as_deref(), Some("foreign"));
    g.unlock().unwrap();
    assert_eq!(get(&s[0], "redmutex:{m}").as_deref(), Some("foreign"));
    assert!(get(&s[1], "redmutex:{m}").is_none());
}

#[test]
fn a_majority_held_by_someone_else_fails_the_attempt_and_rolls_back() {
    let s = servers(5);
    for server in &s[..3] {
        set(server, "redmutex:{m}", "foreign");
    }
    let redlock = redlock(&s);
    assert_eq!(redlock.quorum(), 3);
    assert!(redlock.mutex("m").try_lock().unwrap().is_none());
    // What the attempt took on the two free instances was given back, by each instance's
    // renewal thread, off the caller's path.
    assert!(support::eventually(Duration::from_secs(30), || {
        get(&s[3], "redmutex:{m}").is_none() && get(&s[4], "redmutex:{m}").is_none()
    }));
    assert!(s[..3]
        .iter()
        .all(|s| get(s, "redmutex:{m}").as_deref() == Some("foreign")));
    // A waiter with a deadline gives up in time.
    let started = Instant::now();
    let got = redlock
        .mutex("m")
        .try_lock_for(Duration::from_millis(300))
        .unwrap();
    assert!(got.is_none());
    assert!(started.elapsed() < Duration::from_secs(5));
}

#[test]
fn one_instance_down_is_tolerated_and_two_of_three_are_a_clear_error_in_time() {
    let mut s = servers(3);
    let redlock = redlock(&s);
    let m = redlock.mutex("down");
    drop(m.lock().unwrap()); // connections are warm
    s[0].kill();
    let g = m.lock().unwrap();
    g.unlock().unwrap();
    s[1].kill();
    let started = Instant::now();
    let m2 = m.clone();
    let err = within(LIMIT, move || {
        m2.try_lock_for(Duration::from_secs(1)).map(drop)
    })
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(err.to_string().contains("1 of 3"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5));
    // lock() without a deadline fails too, after the outage patience (2 s), instead of
    // hanging.
    let m3 = m.clone();
    let err = within(LIMIT, move || m3.lock().map(drop)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(redlock.stats().outage_retries > 0);
}

/// A blocking `lock()` rides through a majority of instances going away and coming back
/// once the Redlock has reached a majority, as a client's does through an outage; a Redlock
/// that never reached one fails at once.
#[test]
fn a_blocking_lock_rides_through_a_majority_restart_once_a_majority_was_reached() {
    let mut s = servers(3);
    let patient = Redlock::builder()
        .default_lease(Duration::from_secs(2))
        .outage_patience(LIMIT)
        .open(s.iter().map(|s| s.url()))
        .unwrap();
    let m = patient.mutex("through");
    drop(m.lock().unwrap()); // a majority was reached
    s[0].kill();
    s[1].kill();
    let (done, outcome) = std::sync::mpsc::channel();
    let waiter = m.clone();
    std::thread::spawn(move || {
        let _ = done.send(waiter.lock().map(|g| g.fencing_token()));
    });
    assert!(
        outcome.recv_timeout(Duration::from_secs(1)).is_err(),
        "lock() gave up while the majority was away"
    );
    s[0].restart();
    s[1].restart();
    let token = outcome.recv_timeout(LIMIT).expect("lock() never returned");
    assert!(token.is_ok(), "{token:?}");
    assert!(patient.stats().outage_retries > 0);

    let refused: Vec<String> = (0..3)
        .map(|_| format!("redis://127.0.0.1:{}/", support::free_port()))
        .collect();
    let never = Redlock::builder()
        .outage_patience(LIMIT)
        .open(refused)
        .unwrap();
    let started = Instant::now();
    let err = within(LIMIT, move || never.mutex("never").lock().map(drop)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(
        started.elapsed() < LIMIT / 2,
        "a Redlock that never reached its instances waited {:?}",
        started.elapsed()
    );
}

#[test]
fn a_paused_instance_does_not_count_and_its_late_grant_is_cleaned_up() {
    let s = servers(3);
    let redlock = redlock(&s)
        .instance_timeout(Duration::from_millis(50))
        .unwrap();
    let m = redlock.mutex("paused");
    drop(m.lock().unwrap()); // connections are warm
    s[2].pause();
    let started = Instant::now();
    let g = m.lock().unwrap();
    // Well within the lease: the paused instance cost its timeout, not more.
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "{:?}",
        started.elapsed()
    );
    assert!(!g.is_lost());
    let unlocked = g.unlock();
    s[2].resume();
    // The two live instances released it; the paused one ran our acquire late, and its copy
    // is removed by the clean-up (or expires with the lease).
    assert!(unlocked.is_ok(), "{unlocked:?}");
    assert!(eventually(LIMIT, || get(&s[2], "redmutex:{paused}").is_none()));
    assert!(get(&s[0], "redmutex:{paused}").is_none());
}

#[test]
fn a_holder_keeps_its_lock_while_one_instance_restarts_and_is_told_when_the_majority_goes() {
    let mut s = servers(3);
    let redlock = redlock(&s);
    let g = redlock.mutex("kept").lock().unwrap();
    let watch = g.lease_watch();
    s[0].restart(); // without data
                    // Past the 2 s lease: renewal on the two others keeps it.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(!g.is_lost(), "lost with a majority still holding it");
    assert!(g.verify().is_ok());
    s[1].restart();
    assert!(
        watch.wait_timeout(LIMIT),
        "the loss of the majority was never told"
    );
    assert!(g.is_lost());
    // Lost is final: the thread cannot enter the lost hold again.
    let err = redlock.mutex("kept").lock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    assert_eq!(redlock.mutex("kept").hold_count(), 1);
    let err = g.unlock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    // A new acquire takes a new hold.
    let again = redlock.mutex("kept").lock().unwrap();
    assert!(!again.is_lost());
}

#[test]
fn fencing_tokens_are_ordered_across_instances_whose_counters_differ() {
    let mut s = servers(3);
    // Instance 0's counter is far ahead of the others.
    let ahead: u64 = 9_000_000_000_000_000;
    set(&s[0], "redmutex:{fenced}:fence", &ahead.to_string());
    let _: () = redis::cmd("PERSIST")
        .arg("redmutex:{fenced}:fence")
        .query(&mut s[0].conn())
        .unwrap();
    let first = {
        let redlock = redlock(&s);
        let m = redlock.mutex("fenced");
        drop(m.lock().unwrap()); // warm
        s[2].kill();
        let g = m.lock().unwrap(); // on instances 0 and 1
        let token = g.fencing_token();
        g.unlock().unwrap();
        token
    };
    assert!(first > ahead, "{first}");
    // Another process's Redlock, on instances 1 and 2 only: instance 1's counter was raised.
    s[2].restart();
    s[0].kill();
    let other = redlock(&s);
    let g = other.mutex("fenced").lock().unwrap();
    assert!(
        g.fencing_token() > first,
        "{} after {first}",
        g.fencing_token()
    );
}

/// A free lock whose counters were started is taken with plain commands on every instance
/// (no acquire script), and its tokens keep growing when instances lose their data: with one
/// counter lost, the others still make a majority of started counters; with two, the script
/// round starts them again from the server's clock.
#[test]
fn a_free_lock_taken_before_costs_no_acquire_script_and_its_tokens_keep_growing() {
    let s = servers(3);
    let redlock = redlock(&s);
    let m = redlock.mutex("plain");
    // Each take's token is above the one before.
    let mut last = 0;
    let mut cycle = || {
        let g = m.lock().unwrap();
        let token = g.fencing_token();
        assert!(token > last, "{token} after {last}");
        last = token;
        g.unlock().unwrap();
    };
    // The first take starts the counters, by the script; the second tries the plain `SET`'s
    // form on each server (alone, leaving the take to the script).
    cycle();
    cycle();
    let scripts =
        |s: &[RedisServer]| -> Vec<u64> { s.iter().map(|s| s.command_calls("evalsha")).collect() };
    let before = scripts(&s);
    for _ in 0..5 {
        cycle();
    }
    let spent: Vec<u64> = scripts(&s)
        .iter()
        .zip(&before)
        .map(|(a, b)| a - b)
        .collect();
    // The releases only: one script call on each instance per cycle (and the acquires on
    // Redis 6.2, which refuses `SET … NX … GET`).
    let per_cycle = match support::server_version().redis_before(7, 0) {
        true => 2,
        false => 1,
    };
    assert_eq!(spent, [5 * per_cycle; 3]);
    for lost in 1..=2 {
        for server in &s[..lost] {
            let _: () = redis::cmd("FLUSHALL").query(&mut server.conn()).unwrap();
        }
        cycle();
    }
}

#[test]
fn threads_of_two_redlocks_exclude_each_other_and_get_increasing_tokens() {
    let s = servers(3);
    let counter = RedisServer::start();
    let a = redlock(&s);
    let b = redlock(&s);
    let overlaps = Arc::new(AtomicUsize::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let barrier = Arc::new(Barrier::new(4));
    let tokens = Arc::new(shared::Tokens::default());
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let redlock = if t % 2 == 0 { a.clone() } else { b.clone() };
            let (overlaps, inside, barrier, tokens) = (
                Arc::clone(&overlaps),
                Arc::clone(&inside),
                Arc::clone(&barrier),
                Arc::clone(&tokens),
            );
            let url = counter.url();
            std::thread::spawn(move || {
                let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
                barrier.wait();
                for _ in 0..15 {
                    let g = redlock.mutex("shared").lock().unwrap();
                    if inside.fetch_add(1, Ordering::SeqCst) != 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    tokens.push(g.fencing_token());
                    let _: i64 = redis::cmd("INCR").arg("count").query(&mut conn).unwrap();
                    inside.fetch_sub(1, Ordering::SeqCst);
                    g.unlock().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        within(LIMIT, move || t.join().unwrap());
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    let count: i64 = redis::cmd("GET")
        .arg("count")
        .query(&mut counter.conn())
        .unwrap();
    assert_eq!(count, 60);
    // Tokens in the order the holds happened strictly increase.
    let tokens = tokens.take();
    assert_eq!(tokens.len(), 60);
    assert!(tokens.windows(2).all(|w| w[0] < w[1]), "{tokens:?}");
}

#[test]
fn a_waiter_is_woken_by_a_release_on_any_instance() {
    let s = servers(3);
    let redlock = redlock(&s);
    let clients: Vec<Client> = s.iter().map(client).collect();
    let waiting = Redlock::new(clients.clone()).unwrap();
    let g = redlock.mutex("woken").lock().unwrap();
    let t = std::thread::spawn(move || {
        let started = Instant::now();
        let got = waiting
            .mutex("woken")
            .try_lock_for(LIMIT)
            .unwrap()
            .is_some();
        (got, started.elapsed())
    });
    std::thread::sleep(Duration::from_millis(500));
    g.unlock().unwrap();
    let (got, _) = within(LIMIT, move || t.join().unwrap());
    assert!(got);
    let heard: u64 = clients.iter().map(|c| c.stats().notifications).sum();
    assert!(heard >= 1, "no release was heard");
}

#[test]
fn bad_input_is_a_clear_error() {
    let none: [Client; 0] = [];
    let err = Redlock::new(none).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let s = servers(4);
    // An even number is allowed: 3 of 4.
    let even = redlock(&s);
    assert_eq!(even.quorum(), 3);
    drop(even.mutex("even").lock().unwrap());
    // The same server twice.
    let err = Redlock::new([client(&s[0]), client(&s[0]), client(&s[1])]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    // A per-instance timeout not below the lease.
    let err = redlock(&s[..3])
        .instance_timeout(Duration::from_secs(2))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let err = redlock(&s[..3])
        .instance_timeout(Duration::ZERO)
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let err = Redlock::builder()
        .default_lease(Duration::from_secs(1))
        .instance_timeout(Duration::from_secs(1))
        .open(s[..3].iter().map(|s| s.url()))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    // A builder setting out of range, and no URL.
    let err = Redlock::builder()
        .renewal_interval(Duration::from_secs(40))
        .open(s[..3].iter().map(|s| s.url()))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let err = Redlock::builder().open(Vec::<String>::new()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    // A fixed lease not above it.
    let r = redlock(&s[..3])
        .instance_timeout(Duration::from_millis(100))
        .unwrap();
    let err = r
        .mutex("short")
        .with_fixed_lease(Duration::from_millis(50))
        .try_lock()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    // An empty name.
    let err = r.mutex("").try_lock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
}

#[test]
fn clients_that_disagree_on_a_redlock_setting_are_refused_by_name() {
    let s = servers(3);
    let other = |lease: u64, renewal: u64, cap: u64, server: &RedisServer| {
        Client::builder()
            .default_lease(Duration::from_millis(lease))
            .renewal_interval(Duration::from_millis(renewal))
            .backoff(Duration::from_millis(10), Duration::from_millis(cap))
            .open(server.url())
            .unwrap()
    };
    for (lease, renewal, cap, setting) in [
        (3000, 300, 500, "default lease"),
        (2000, 400, 500, "renewal interval"),
        (2000, 300, 900, "backoff"),
    ] {
        let clients = [
            other(2000, 300, 500, &s[0]),
            other(2000, 300, 500, &s[1]),
            other(lease, renewal, cap, &s[2]),
        ];
        let err = Redlock::new(clients).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        assert!(err.to_string().contains(setting), "{setting}: {err}");
        assert!(err.to_string().contains(&s[2].port().to_string()), "{err}");
    }
    // The same settings on every client are accepted.
    let same = [0, 1, 2].map(|i| other(2000, 300, 500, &s[i]));
    assert!(Redlock::new(same).is_ok());
}

#[test]
fn the_builder_sets_the_lease_of_every_instance_and_the_guard_tells_its_validity() {
    let s = servers(3);
    let redlock = Redlock::builder()
        .default_lease(Duration::from_secs(4))
        .renewal_interval(Duration::from_secs(1))
        .instance_timeout(Duration::from_millis(200))
        .key_prefix("built")
        .open(s.iter().map(|s| s.url()))
        .unwrap();
    let g = redlock.mutex("configured").lock().unwrap();
    for server in &s {
        let pttl: i64 = redis::cmd("PTTL")
            .arg("built:{configured}")
            .query(&mut server.conn())
            .unwrap();
        assert!((2000..=4000).contains(&pttl), "PTTL {pttl}");
    }
    // The validity left is below the lease less the drift allowance (40 ms + 2 ms), and is
    // kept up by renewal.
    let validity = g.validity_left();
    assert!(validity <= Duration::from_millis(3958), "{validity:?}");
    assert!(validity > Duration::from_secs(2), "{validity:?}");
    std::thread::sleep(Duration::from_millis(2500));
    assert!(g.validity_left() > Duration::from_secs(2), "not renewed");
    g.unlock().unwrap();
    // A fixed lease is not renewed: its validity runs down to zero, and the loss is told.
    let fixed = redlock
        .mutex("fixed")
        .with_fixed_lease(Duration::from_millis(800))
        .lock()
        .unwrap();
    assert!(fixed.validity_left() <= Duration::from_millis(800));
    let watch = fixed.lease_watch();
    assert!(watch.wait_timeout(LIMIT), "the lease's end was never told");
    assert_eq!(fixed.validity_left(), Duration::ZERO);
}

#[test]
fn an_instance_killed_while_locks_are_taken_and_released_costs_no_call_an_error() {
    let mut s = servers(5);
    let redlock = Redlock::builder()
        .default_lease(Duration::from_secs(5))
        .instance_timeout(Duration::from_millis(250))
        .connect_timeout(Duration::from_millis(500))
        .open(s.iter().map(|s| s.url()))
        .unwrap();
    let m = redlock.mutex("kill-during-unlock");
    drop(m.lock().unwrap()); // connections are warm
    let mut victim = s.remove(0);
    let killed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let told = Arc::clone(&killed);
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(150));
        victim.kill();
        told.store(true, Ordering::SeqCst);
        victim
    });
    let (mut rounds, mut after_kill) = (0, 0);
    let started = Instant::now();
    while after_kill < 30 && started.elapsed() < LIMIT {
        let dead = killed.load(Ordering::SeqCst);
        let g = m.lock().unwrap_or_else(|e| panic!("lock {rounds}: {e}"));
        if let Err(e) = g.unlock() {
            panic!("unlock {rounds} with 4 of 5 instances up: {e}");
        }
        rounds += 1;
        after_kill += usize::from(dead);
    }
    let _victim = killer.join().unwrap();
    assert_eq!(after_kill, 30, "only {rounds} rounds in the time");
    // Every live instance is free again.
    for server in &s {
        assert!(get(server, "redmutex:{kill-during-unlock}").is_none());
    }
}

mod shared {
    //! A list of tokens shared by threads.

    #[derive(Default)]
    pub struct Tokens(std::sync::Mutex<Vec<u64>>);

    impl Tokens {
        pub fn push(&self, token: u64) {
            self.0.lock().unwrap().push(token);
        }

        pub fn take(&self) -> Vec<u64> {
            std::mem::take(&mut *self.0.lock().unwrap())
        }
    }
}

#[test]
fn a_panic_while_holding_releases_the_lock_and_leaves_a_poison_record() {
    let s = servers(3);
    let redlock = redlock(&s);
    let r = redlock.clone();
    let panicked = std::thread::spawn(move || {
        let _g = r.mutex("poisoned").lock().unwrap();
        panic!("holder dies mid-way");
    })
    .join();
    assert!(panicked.is_err());
    // Released at once (not after the lease), and the record is on the instances.
    let g = redlock
        .mutex("poisoned")
        .try_lock()
        .unwrap()
        .expect("released by the panicking holder");
    let poison = g.poison().unwrap().expect("a poison record");
    assert!(!poison.to_string().is_empty());
    assert!(s
        .iter()
        .all(|s| get(s, "redmutex:{poisoned}:poison").is_some()));
    assert!(g.clear_poison().unwrap());
    assert!(g.poison().unwrap().is_none());
    assert!(!g.clear_poison().unwrap());
}

/// Five instances, four workers (each its own Redlock, as separate processes would be)
/// taking and releasing one lock, while instances are killed and restarted one at a time
/// (a majority always up), some kills landing during an unlock round: every unlock that a
/// majority could confirm is `Ok`, and no lock is held by two workers at once.
#[test]
fn unlock_with_a_majority_up_succeeds_while_instances_are_killed_and_restarted() {
    let servers = Arc::new(std::sync::Mutex::new(servers(5)));
    let urls: Vec<String> = servers.lock().unwrap().iter().map(|s| s.url()).collect();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let inside = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (urls, stop, inside) = (urls.clone(), Arc::clone(&stop), Arc::clone(&inside));
            std::thread::spawn(move || {
                let redlock = Redlock::builder()
                    .default_lease(Duration::from_secs(2))
                    .instance_timeout(Duration::from_millis(200))
                    .connect_timeout(Duration::from_millis(200))
                    .open(urls.iter().map(String::as_str))
                    .unwrap();
                let m = redlock.mutex("majority-up");
                let (mut unlocks, mut errors) = (0u32, Vec::new());
                while !stop.load(Ordering::SeqCst) {
                    let Ok(Some(g)) = m.try_lock_for(Duration::from_millis(500)) else {
                        continue;
                    };
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    inside.fetch_sub(1, Ordering::SeqCst);
                    unlocks += 1;
                    if let Err(e) = g.unlock() {
                        errors.push(e.to_string());
                    }
                }
                (unlocks, errors)
            })
        })
        .collect();
    let started = Instant::now();
    let mut kills = 0;
    while started.elapsed() < Duration::from_secs(20) {
        let i = kills % 5;
        std::thread::sleep(Duration::from_millis(150));
        servers.lock().unwrap()[i].kill();
        std::thread::sleep(Duration::from_millis(250));
        servers.lock().unwrap()[i].restart();
        kills += 1;
    }
    stop.store(true, Ordering::SeqCst);
    let (mut unlocks, mut errors) = (0, Vec::new());
    for w in workers {
        let (n, e) = within(LIMIT, move || w.join().unwrap());
        unlocks += n;
        errors.extend(e);
    }
    assert!(unlocks >= 100, "only {unlocks} unlocks in 20 s");
    assert!(
        errors.is_empty(),
        "{} of {unlocks} unlocks failed with a majority up ({kills} kills): {errors:#?}",
        errors.len()
    );
}
