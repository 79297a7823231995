//! `Semaphore` on a real `redis-server`: never more holders than permits, all-or-nothing
//! `acquire_many`, a dead holder's permits coming back after its lease, a release waking few
//! waiters (and every waiting thread a freed permit lets in), the stored permit count, and bad
//! input.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redmutex::{Client, ErrorKind};
use support::{eventually, within, RedisServer};

const LIMIT: Duration = Duration::from_secs(60);
const ENTRY: &str = "semaphore_worker_entry";

/// The entry point of the worker processes; does nothing in a normal test run.
#[test]
fn semaphore_worker_entry() {
    let Some((role, url, _)) = support::worker_role() else {
        return;
    };
    if role == "fair-waiter" {
        let client = client_of(&url);
        println!("WAITING");
        let _ = client.fair_semaphore("dead", 1).acquire();
        return;
    }
    assert!(role == "holders" || role == "fair-holders", "{role}");
    let client = Client::builder()
        .backoff(Duration::from_millis(1), Duration::from_millis(20))
        .open(url.as_str())
        .unwrap();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let sem = match role.as_str() {
                "fair-holders" => client.fair_semaphore("fleet", 3),
                _ => client.semaphore("fleet", 3),
            };
            let url = url.clone();
            std::thread::spawn(move || {
                let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
                let mut most = 0i64;
                for _ in 0..10 {
                    let permit = sem.acquire().unwrap();
                    let now: i64 = redis::cmd("INCR").arg("inside").query(&mut conn).unwrap();
                    most = most.max(now);
                    std::thread::sleep(Duration::from_millis(3));
                    let _: i64 = redis::cmd("DECR").arg("inside").query(&mut conn).unwrap();
                    permit.unlock().unwrap();
                }
                most
            })
        })
        .collect();
    let most = threads
        .into_iter()
        .map(|t| t.join().unwrap())
        .max()
        .unwrap_or(0);
    println!("MOST_HOLDERS {most}");
}

#[test]
fn four_processes_of_four_threads_never_hold_more_than_the_permits() {
    processes_never_hold_more_than_the_permits("holders");
}

#[test]
fn four_processes_of_four_threads_never_hold_more_than_fair_permits() {
    processes_never_hold_more_than_the_permits("fair-holders");
}

fn processes_never_hold_more_than_the_permits(role: &str) {
    let server = RedisServer::start();
    let mut workers: Vec<_> = (0..4)
        .map(|_| support::spawn_worker(ENTRY, role, &server.url(), ""))
        .collect();
    let most: Vec<i64> = workers
        .iter_mut()
        .map(|w| support::read_marker(w, "MOST_HOLDERS").parse().unwrap())
        .collect();
    for mut w in workers {
        assert!(within(LIMIT, move || w.wait().unwrap()).success());
    }
    assert!(
        most.iter().all(|&m| m <= 3),
        "more holders than permits: {most:?}"
    );
    assert!(
        most.iter().any(|&m| m > 1),
        "holders never overlapped: {most:?}"
    );
}

fn client(server: &RedisServer) -> Client {
    client_of(&server.url())
}

fn client_of(url: &str) -> Client {
    Client::builder()
        .default_lease(Duration::from_secs(2))
        .renewal_interval(Duration::from_millis(300))
        .open(url)
        .unwrap()
}

#[test]
fn never_more_holders_than_permits() {
    let server = RedisServer::start();
    let clients = [client(&server), client(&server)];
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let sem = clients[t % 2].semaphore("pool", 3);
            let (inside, most) = (Arc::clone(&inside), Arc::clone(&most));
            std::thread::spawn(move || {
                for _ in 0..10 {
                    let permit = sem.acquire().unwrap();
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(5));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    permit.unlock().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        within(LIMIT, move || t.join().unwrap());
    }
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 3, "{most} holders at once with 3 permits");
    assert!(most > 1, "holders never overlapped");
    assert_eq!(clients[0].semaphore("pool", 3).available().unwrap(), 3);
}

#[test]
fn acquire_many_takes_all_or_nothing() {
    let server = RedisServer::start();
    let c = client(&server);
    let sem = c.semaphore("five", 5);
    let three = sem.acquire_many(3).unwrap();
    assert_eq!(three.permits(), 3);
    assert!(sem.try_acquire_many(3).unwrap().is_none());
    assert_eq!(sem.available().unwrap(), 2, "a failed attempt took permits");
    let two = sem.acquire_many(2).unwrap();
    assert_eq!(sem.available().unwrap(), 0);
    // Not re-entrant: the same thread takes another hold, which must wait.
    assert!(sem.try_acquire().unwrap().is_none());
    drop(three);
    assert_eq!(sem.available().unwrap(), 3);
    two.unlock().unwrap();
    assert_eq!(sem.available().unwrap(), 5);
}

#[test]
fn a_dead_holders_permits_come_back_after_its_lease() {
    let server = RedisServer::start();
    let dying = client(&server);
    let permit = dying.semaphore("lease", 3).acquire_many(2).unwrap();
    // Its process stops: nothing renews or gives back its permits.
    std::mem::forget(permit);
    dying.shutdown();
    let other = client(&server);
    let sem = other.semaphore("lease", 3);
    assert_eq!(sem.available().unwrap(), 1);
    let all = sem.acquire_many(3);
    assert!(all.is_ok(), "{all:?}");
}

#[test]
fn counts_left_without_their_holders_are_no_ones() {
    let server = RedisServer::start();
    let dying = client(&server);
    let permit = dying.semaphore("orphans", 3).acquire_many(2).unwrap();
    std::mem::forget(permit);
    dying.shutdown();
    let holders = "redmutex:semaphore:{orphans}:holders";
    let held = "redmutex:semaphore:{orphans}:held";
    let mut conn = server.conn();
    if !support::server_version().redis_before(7, 0) {
        // The holders and their counts end at one instant, never a millisecond apart.
        let ends: Vec<i64> = redis::cmd("EVAL")
            .arg("return {redis.call('PEXPIRETIME', KEYS[1]), redis.call('PEXPIRETIME', KEYS[2])}")
            .arg(2)
            .arg(holders)
            .arg(held)
            .query(&mut conn)
            .unwrap();
        assert!(ends[0] > 0 && ends[0] == ends[1], "{ends:?}");
    }
    // The holders' key goes on its own (evicted, or deleted by hand): the counts are no one's.
    let _: i64 = redis::cmd("DEL").arg(holders).query(&mut conn).unwrap();
    let other = client(&server);
    let all = other.semaphore("orphans", 3).try_acquire_many(3);
    assert!(matches!(all, Ok(Some(_))), "{all:?}");
}

#[test]
fn a_fair_semaphore_drops_counts_left_without_their_holders() {
    let server = RedisServer::start();
    // A lease far past the wait below: only dropping the counts lets the waiter in.
    let long = |url: &str| {
        Client::builder()
            .default_lease(Duration::from_secs(60))
            .open(url)
            .unwrap()
    };
    let dying = long(&server.url());
    let permit = dying.fair_semaphore("orphans", 3).acquire_many(2).unwrap();
    std::mem::forget(permit);
    dying.shutdown();
    let _: i64 = redis::cmd("DEL")
        .arg("redmutex:semaphore:{orphans}:holders")
        .query(&mut server.conn())
        .unwrap();
    let other = long(&server.url());
    let all = other
        .fair_semaphore("orphans", 3)
        .try_acquire_many_for(3, Duration::from_secs(20));
    assert!(matches!(all, Ok(Some(_))), "{all:?}");
}

#[test]
fn a_release_of_one_permit_wakes_one_waiter_not_all() {
    let server = RedisServer::start();
    let holder = client(&server);
    let waiter = client(&server);
    let held = holder.semaphore("one", 1).acquire().unwrap();
    let got = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let sem = waiter.semaphore("one", 1);
            let got = Arc::clone(&got);
            std::thread::spawn(move || {
                let permit = sem.try_acquire_for(Duration::from_secs(5)).unwrap();
                if permit.is_some() {
                    got.fetch_add(1, Ordering::SeqCst);
                    // Keep it past the others' deadline.
                    std::thread::sleep(Duration::from_secs(6));
                }
            })
        })
        .collect();
    assert!(eventually(LIMIT, || waiter.stats().contended >= 1));
    std::thread::sleep(Duration::from_millis(500));
    let before = waiter.stats().attempts;
    held.unlock().unwrap();
    assert!(eventually(LIMIT, || got.load(Ordering::SeqCst) == 1));
    std::thread::sleep(Duration::from_millis(300));
    let attempts = waiter.stats().attempts - before;
    // The winner's attempt, and at most the next waiter's, which finds none free: not one
    // attempt per waiting thread.
    assert!(attempts <= 2, "{attempts} attempts for one freed permit");
    for t in threads {
        within(LIMIT, move || t.join().unwrap());
    }
    assert_eq!(got.load(Ordering::SeqCst), 1);
}

#[test]
fn threads_of_one_client_take_every_permit_a_release_frees() {
    let server = RedisServer::start();
    let holder = client(&server);
    // Re-checks once a minute: only the release and the waiters' own attempts can let them in.
    let waiter = Client::builder()
        .default_lease(Duration::from_secs(180))
        .renewal_interval(Duration::from_secs(60))
        .open(server.url())
        .unwrap();
    let held = holder.semaphore("pair", 2).acquire_many(2).unwrap();
    let got = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let sem = waiter.semaphore("pair", 2);
            let got = Arc::clone(&got);
            std::thread::spawn(move || {
                let permit = sem.try_acquire_for(LIMIT).unwrap().expect("a permit");
                got.fetch_add(1, Ordering::SeqCst);
                // Held until both have one.
                std::thread::sleep(Duration::from_secs(1));
                drop(permit);
            })
        })
        .collect();
    assert!(eventually(LIMIT, || waiter.stats().contended >= 2));
    held.unlock().unwrap();
    // Both permits freed at once: the thread that took the first leaves the next waiting
    // thread to attempt at once (not to wait for another release, or a re-check a minute on).
    let both = || got.load(Ordering::SeqCst) == 2;
    assert!(eventually(Duration::from_secs(20), both));
    for t in threads {
        within(LIMIT, move || t.join().unwrap());
    }
}

#[test]
fn the_stored_count_wins_until_set_permits_changes_it() {
    let server = RedisServer::start();
    let c = client(&server);
    let first = c.semaphore("count", 2);
    assert_eq!(first.available().unwrap(), 2);
    let other = c.semaphore("count", 5);
    assert_eq!(
        other.available().unwrap(),
        2,
        "a handle's own count overrode the stored one"
    );
    let p = other.acquire_many(2).unwrap();
    assert!(other.try_acquire().unwrap().is_none());
    other.set_permits(5).unwrap();
    assert_eq!(first.available().unwrap(), 3);
    drop(p);
    assert_eq!(first.available().unwrap(), 5);
}

#[test]
fn bad_input_is_a_clear_error_and_changes_nothing() {
    let server = RedisServer::start();
    let c = client(&server);
    let err = c.semaphore("zero", 0).acquire().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let err = c.semaphore("huge", u32::MAX).available().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let sem = c.semaphore("three", 3);
    let err = sem.acquire_many(0).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let err = sem.acquire_many(4).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert_eq!(sem.available().unwrap(), 3);
    let _: () = redis::cmd("SET")
        .arg("redmutex:semaphore:{typed}:holders")
        .arg("not a set")
        .query(&mut server.conn())
        .unwrap();
    let err = c.semaphore("typed", 2).acquire().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WrongType, "{err}");
    let value: String = redis::cmd("GET")
        .arg("redmutex:semaphore:{typed}:holders")
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(value, "not a set");
    let err = c.semaphore("", 2).acquire().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
}

#[test]
fn a_semaphore_and_a_mutex_of_the_same_name_do_not_mix() {
    let server = RedisServer::start();
    let c = client(&server);
    let other = client(&server);
    let permit = c.semaphore("shared-name", 1).acquire().unwrap();
    // A Mutex of that name is another lock.
    let m = other.mutex("shared-name").try_lock().unwrap();
    assert!(m.is_some(), "the semaphore's permit held the Mutex");
    drop(m);
    drop(permit);
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("redmutex:semaphore:*")
        .query(&mut server.conn())
        .unwrap();
    // Its keys, its waiters flag and its channel are its own, apart from the Mutex's.
    assert!(
        keys.contains(&"redmutex:semaphore:{shared-name}:permits".to_owned()),
        "{keys:?}"
    );
    let exists: bool = redis::cmd("EXISTS")
        .arg("redmutex:{shared-name}:permits")
        .query(&mut server.conn())
        .unwrap();
    assert!(!exists);
}

#[test]
fn permits_are_renewed_past_their_lease() {
    let server = RedisServer::start();
    let c = client(&server);
    let sem = c.semaphore("renewed", 1);
    let permit = sem.acquire().unwrap();
    // Past the 2 s lease: the renewal thread keeps the holder's entry alive.
    std::thread::sleep(Duration::from_millis(2600));
    assert!(!permit.is_lost());
    assert_eq!(sem.available().unwrap(), 0);
    permit.unlock().unwrap();
    assert_eq!(sem.available().unwrap(), 1);
}

/// How many waiters the queue of fair semaphore `name` holds.
fn queued(server: &RedisServer, name: &str) -> usize {
    redis::cmd("LLEN")
        .arg(format!("redmutex:semaphore:{{{name}}}:queue"))
        .query(&mut server.conn())
        .unwrap()
}

#[test]
fn a_fair_semaphore_grants_permits_in_the_order_asked_for() {
    let server = RedisServer::start();
    let c = client(&server);
    let sem = c.fair_semaphore("fifo", 2);
    let first = sem.acquire().unwrap();
    let second = sem.acquire().unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    // "big" asks for both permits and queues first; "small" asks for one and queues behind.
    let waiter = |label: &'static str, n: u32| {
        let sem = client(&server).fair_semaphore("fifo", 2);
        let order = Arc::clone(&order);
        std::thread::spawn(move || {
            let permit = sem.acquire_many(n).unwrap();
            order.lock().unwrap().push(label);
            std::thread::sleep(Duration::from_millis(100));
            permit.unlock().unwrap();
        })
    };
    let big = waiter("big", 2);
    assert!(eventually(LIMIT, || queued(&server, "fifo") == 1));
    let small = waiter("small", 1);
    assert!(eventually(LIMIT, || queued(&server, "fifo") == 2));
    // One permit comes back: enough for "small", but "big" is ahead of it and nobody
    // overtakes. Unfair, "small" would take it now.
    first.unlock().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        order.lock().unwrap().is_empty(),
        "{:?}",
        order.lock().unwrap()
    );
    assert!(c.fair_semaphore("fifo", 2).try_acquire().unwrap().is_none());
    second.unlock().unwrap();
    within(LIMIT, move || big.join().unwrap());
    within(LIMIT, move || small.join().unwrap());
    assert_eq!(*order.lock().unwrap(), ["big", "small"]);
    // Nobody waits: the queue's keys are gone.
    assert_eq!(queued(&server, "fifo"), 0);
    assert_eq!(sem.available().unwrap(), 2);
}

#[test]
fn a_fair_release_of_one_permit_wakes_one_waiter_of_four_processes() {
    let server = RedisServer::start();
    let holder = client(&server);
    let held = holder.fair_semaphore("one", 1).acquire().unwrap();
    let got = Arc::new(AtomicUsize::new(0));
    // Four waiters, each in a client of its own, as in four processes: an unfair semaphore
    // wakes one waiter per client.
    let waiters: Vec<_> = (0..4).map(|_| client(&server)).collect();
    let threads: Vec<_> = waiters
        .iter()
        .map(|w| {
            let sem = w.fair_semaphore("one", 1);
            let got = Arc::clone(&got);
            std::thread::spawn(move || {
                let permit = sem.try_acquire_for(Duration::from_secs(5)).unwrap();
                if permit.is_some() {
                    got.fetch_add(1, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_secs(6));
                }
            })
        })
        .collect();
    assert!(eventually(LIMIT, || queued(&server, "one") == 4));
    let attempts = || waiters.iter().map(|w| w.stats().attempts).sum::<u64>();
    let before = attempts();
    held.unlock().unwrap();
    assert!(eventually(LIMIT, || got.load(Ordering::SeqCst) == 1));
    std::thread::sleep(Duration::from_millis(300));
    let after = attempts() - before;
    // The winner's attempt, and at most one re-check: not one attempt per waiting process.
    assert!(after <= 2, "{after} attempts for one freed permit");
    for t in threads {
        within(LIMIT, move || t.join().unwrap());
    }
    assert_eq!(got.load(Ordering::SeqCst), 1);
    // The waiters that timed out left the queue.
    assert_eq!(queued(&server, "one"), 0);
}

#[test]
fn a_fair_release_of_k_permits_lets_in_the_k_waiters_at_the_head() {
    let server = RedisServer::start();
    let c = client(&server);
    let held = c.fair_semaphore("k", 3).acquire_many(3).unwrap();
    let got = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..5).map(|_| client(&server)).collect();
    let mut threads = Vec::new();
    for (i, w) in clients.iter().enumerate() {
        let sem = w.fair_semaphore("k", 3);
        let got = Arc::clone(&got);
        threads.push(std::thread::spawn(move || {
            let permit = sem.try_acquire_for(Duration::from_secs(8)).unwrap();
            if permit.is_some() {
                got.fetch_add(1, Ordering::SeqCst);
                std::thread::sleep(Duration::from_secs(9));
            }
        }));
        assert!(eventually(LIMIT, || queued(&server, "k") == i + 1));
    }
    held.unlock().unwrap();
    assert!(eventually(LIMIT, || got.load(Ordering::SeqCst) == 3));
    // The two behind stay queued: the three permits went to the three ahead of them.
    assert_eq!(queued(&server, "k"), 2);
    for t in threads {
        within(LIMIT, move || t.join().unwrap());
    }
    assert_eq!(got.load(Ordering::SeqCst), 3);
}

#[test]
fn a_killed_fair_waiter_is_skipped_after_its_timeout() {
    let server = RedisServer::start();
    let c = client(&server);
    let held = c.fair_semaphore("dead", 1).acquire().unwrap();
    // A waiter in another process, killed while it waits at the head of the queue.
    let mut dead = support::spawn_worker(ENTRY, "fair-waiter", &server.url(), "");
    support::read_marker(&mut dead, "WAITING");
    assert!(eventually(LIMIT, || queued(&server, "dead") == 1));
    let live = {
        let sem = client(&server).fair_semaphore("dead", 1);
        std::thread::spawn(move || sem.acquire().map(|p| p.permits()))
    };
    assert!(eventually(LIMIT, || queued(&server, "dead") == 2));
    dead.kill().unwrap();
    dead.wait().unwrap();
    // The release wakes the dead head, which never comes; once its timeout (one 2 s lease
    // after its last heartbeat) passes, the live waiter behind it takes the permit.
    held.unlock().unwrap();
    assert_eq!(within(LIMIT, move || live.join().unwrap()).unwrap(), 1);
    assert_eq!(queued(&server, "dead"), 0);
}

#[test]
fn raising_the_count_wakes_the_fair_waiters_it_lets_in() {
    let server = RedisServer::start();
    // Waiters whose own re-check is 20 s away: only the announcement lets them in sooner.
    let slow = || {
        Client::builder()
            .default_lease(Duration::from_secs(60))
            .renewal_interval(Duration::from_secs(20))
            .backoff(Duration::from_millis(10), Duration::from_secs(20))
            .open(server.url())
            .unwrap()
    };
    let c = slow();
    let sem = c.fair_semaphore("raise", 1);
    let held = sem.acquire().unwrap();
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let sem = slow().fair_semaphore("raise", 1);
            std::thread::spawn(move || {
                let permit = sem.try_acquire_for(Duration::from_secs(15)).unwrap();
                permit.is_some()
            })
        })
        .collect();
    assert!(eventually(LIMIT, || queued(&server, "raise") == 2));
    std::thread::sleep(Duration::from_millis(300));
    sem.set_permits(3).unwrap();
    let started = std::time::Instant::now();
    for w in waiters {
        let got = within(LIMIT, move || w.join().unwrap());
        assert!(got, "a waiter timed out although permits were added");
    }
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the waiters waited for their re-check, not the announcement"
    );
    drop(held);
}

#[test]
fn several_permits_are_waited_for_within_a_timeout() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let other = Client::open(server.url()).unwrap();
    let slots = client.semaphore("slots", 4);
    // Another thread holds three of the four for a while.
    let (held, released) = (
        std::sync::mpsc::channel::<()>(),
        std::sync::mpsc::channel::<()>(),
    );
    let holder = std::thread::spawn(move || {
        let permit = other
            .semaphore("slots", 4)
            .try_acquire_many(3)
            .unwrap()
            .unwrap();
        held.0.send(()).unwrap();
        released.1.recv().unwrap();
        drop(permit);
    });
    held.1.recv().unwrap();
    // Two of four with three held: not within 300 ms.
    let started = std::time::Instant::now();
    assert!(slots
        .try_acquire_many_for(2, Duration::from_millis(300))
        .unwrap()
        .is_none());
    assert!(started.elapsed() >= Duration::from_millis(300));
    // Freed while it waits: taken within the timeout.
    let free_soon = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        released.0.send(()).unwrap();
    });
    let got = slots
        .try_acquire_many_for(2, Duration::from_secs(30))
        .unwrap()
        .expect("two permits after the release");
    assert_eq!(got.permits(), 2);
    free_soon.join().unwrap();
    holder.join().unwrap();
    // More than exist: refused at once.
    let err = slots
        .try_acquire_many_until(5, std::time::Instant::now() + Duration::from_secs(30))
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

#[test]
fn a_permit_offers_the_lease_methods_of_a_mutex_guard() {
    let server = RedisServer::start();
    let c = client(&server);
    let permit = c.semaphore("leased", 2).acquire().unwrap();
    let left = permit.verify().unwrap();
    assert!(left <= Duration::from_secs(2), "{left:?}");
    permit.extend(Duration::from_secs(100)).unwrap();
    assert!(permit.verify().unwrap() > Duration::from_secs(60));
    // The keys follow the longest lease.
    let pttl: i64 = redis::cmd("PTTL")
        .arg("redmutex:semaphore:{leased}:holders")
        .query(&mut server.conn())
        .unwrap();
    assert!(pttl > 60_000, "{pttl}");
    permit.set_lease(Duration::from_secs(5)).unwrap();
    assert!(permit.verify().unwrap() <= Duration::from_secs(5));
    // Gone from Redis: verify and extend say so, and nothing is re-created.
    let _: () = redis::cmd("DEL")
        .arg("redmutex:semaphore:{leased}:holders")
        .arg("redmutex:semaphore:{leased}:held")
        .query(&mut server.conn())
        .unwrap();
    assert!(permit.verify().unwrap_err().is_lock_lost());
    assert!(permit.is_lost());
    assert!(permit
        .extend(Duration::from_secs(1))
        .unwrap_err()
        .is_lock_lost());
    let exists: bool = redis::cmd("EXISTS")
        .arg("redmutex:semaphore:{leased}:holders")
        .query(&mut server.conn())
        .unwrap();
    assert!(!exists);
    drop(permit);
}
