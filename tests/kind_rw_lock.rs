//! `RwLock` on a real `redis-server`: readers share, a writer excludes everyone, writers are
//! not starved, a dead reader's hold expires alone, downgrade and refused upgrade, wake-ups
//! and bad input.

mod support;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use redmutex::{Client, ErrorKind};
use support::{eventually, within, RedisServer};

const LIMIT: Duration = Duration::from_secs(60);
const ENTRY: &str = "rw_lock_worker_entry";

/// The entry point of the worker processes; does nothing in a normal test run.
#[test]
fn rw_lock_worker_entry() {
    let Some((role, url, _)) = support::worker_role() else {
        return;
    };
    match role.as_str() {
        "mixed" => read_and_write(&url),
        "reader" => read_until_killed(&url),
        other => panic!("unknown role {other}"),
    }
}

/// Four threads that read three times for every write, checking in Redis (outside the lock)
/// that no writer overlaps anyone; prints the most readers it saw at once.
fn read_and_write(url: &str) {
    let client = client_at(url);
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let lock = client.rwlock("checked");
            let url = url.to_owned();
            std::thread::spawn(move || {
                let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
                let mut most = 0i64;
                let mut cmd =
                    |c: &str, k: &str| -> i64 { redis::cmd(c).arg(k).query(&mut conn).unwrap() };
                for i in 0..12 {
                    if (t + i) % 4 == 0 {
                        let g = lock.write().unwrap();
                        if cmd("INCR", "writers") != 1 || cmd("GET", "readers") != 0 {
                            cmd("INCR", "violations");
                        }
                        std::thread::sleep(Duration::from_millis(2));
                        cmd("DECR", "writers");
                        g.unlock().unwrap();
                    } else {
                        let g = lock.read().unwrap();
                        most = most.max(cmd("INCR", "readers"));
                        if cmd("GET", "writers") != 0 {
                            cmd("INCR", "violations");
                        }
                        std::thread::sleep(Duration::from_millis(5));
                        cmd("DECR", "readers");
                        g.unlock().unwrap();
                    }
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
    println!("MOST_READERS {most}");
}

fn read_until_killed(url: &str) {
    let client = client_at(url);
    let g = client.rwlock("killed").read().unwrap();
    println!("READING {}", g.is_lost());
    std::thread::sleep(Duration::from_secs(120));
}

fn client_at(url: &str) -> Client {
    Client::builder()
        .default_lease(Duration::from_secs(2))
        .renewal_interval(Duration::from_millis(300))
        .backoff(Duration::from_millis(1), Duration::from_millis(20))
        .open(url)
        .unwrap()
}

#[test]
fn four_processes_of_four_threads_never_see_a_writer_overlap() {
    let server = RedisServer::start();
    for key in ["readers", "writers", "violations"] {
        let _: () = redis::cmd("SET")
            .arg(key)
            .arg(0)
            .query(&mut server.conn())
            .unwrap();
    }
    let mut workers: Vec<_> = (0..4)
        .map(|_| support::spawn_worker(ENTRY, "mixed", &server.url(), ""))
        .collect();
    let most: Vec<i64> = workers
        .iter_mut()
        .map(|w| support::read_marker(w, "MOST_READERS").parse().unwrap())
        .collect();
    for mut w in workers {
        assert!(within(LIMIT, move || w.wait().unwrap()).success());
    }
    let violations: i64 = redis::cmd("GET")
        .arg("violations")
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(violations, 0, "a writer overlapped another holder");
    assert!(
        most.iter().any(|&m| m > 1),
        "readers never overlapped: {most:?}"
    );
}

#[test]
fn a_reader_killed_with_sigkill_stops_blocking_writers_after_its_lease() {
    let server = RedisServer::start();
    let mut reader = support::spawn_worker(ENTRY, "reader", &server.url(), "");
    support::read_marker(&mut reader, "READING");
    let writer = client(&server);
    assert!(writer.rwlock("killed").try_write().unwrap().is_none());
    reader.kill().unwrap();
    reader.wait().unwrap();
    let got = writer
        .rwlock("killed")
        .try_write_for(Duration::from_secs(20))
        .unwrap();
    assert!(
        got.is_some(),
        "the killed reader blocked the writer for good"
    );
}

fn client(server: &RedisServer) -> Client {
    Client::builder()
        .default_lease(Duration::from_secs(2))
        .renewal_interval(Duration::from_millis(300))
        .open(server.url())
        .unwrap()
}

#[test]
fn readers_share_and_a_writer_excludes_everyone() {
    let server = RedisServer::start();
    let clients = [client(&server), client(&server)];
    let readers = Arc::new(AtomicUsize::new(0));
    let writing = Arc::new(AtomicBool::new(false));
    let most_readers = Arc::new(AtomicUsize::new(0));
    let violations = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let lock = clients[t % 2].rwlock("shared");
            let (readers, writing, most, violations) = (
                Arc::clone(&readers),
                Arc::clone(&writing),
                Arc::clone(&most_readers),
                Arc::clone(&violations),
            );
            std::thread::spawn(move || {
                for i in 0..12 {
                    if (t + i) % 4 == 0 {
                        let g = lock.write().unwrap();
                        if writing.swap(true, Ordering::SeqCst)
                            || readers.load(Ordering::SeqCst) > 0
                        {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                        std::thread::sleep(Duration::from_millis(3));
                        writing.store(false, Ordering::SeqCst);
                        g.unlock().unwrap();
                    } else {
                        let g = lock.read().unwrap();
                        let now = readers.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        if writing.load(Ordering::SeqCst) {
                            violations.fetch_add(1, Ordering::SeqCst);
                        }
                        std::thread::sleep(Duration::from_millis(10));
                        readers.fetch_sub(1, Ordering::SeqCst);
                        g.unlock().unwrap();
                    }
                }
            })
        })
        .collect();
    for t in threads {
        within(LIMIT, move || t.join().unwrap());
    }
    assert_eq!(violations.load(Ordering::SeqCst), 0);
    assert!(
        most_readers.load(Ordering::SeqCst) > 1,
        "readers never overlapped"
    );
}

#[test]
fn a_writer_gets_in_under_continuous_readers() {
    let server = RedisServer::start();
    let readers = client(&server);
    let stop = Arc::new(AtomicBool::new(false));
    // Four readers, each holding 40 ms and coming back at once, started 10 ms apart: at
    // every moment some of them hold it, so without the writer's claim it would never be
    // free of readers.
    let threads: Vec<_> = (0..4u64)
        .map(|i| {
            let lock = readers.rwlock("busy");
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(10 * i));
                while !stop.load(Ordering::SeqCst) {
                    let g = lock.read().unwrap();
                    std::thread::sleep(Duration::from_millis(40));
                    drop(g);
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let writer = client(&server);
    let started = Instant::now();
    let got = writer
        .rwlock("busy")
        .try_write_for(Duration::from_secs(10))
        .unwrap();
    let waited = started.elapsed();
    assert!(got.is_some(), "the writer was starved");
    drop(got);
    stop.store(true, Ordering::SeqCst);
    for t in threads {
        within(LIMIT, move || t.join().unwrap());
    }
    eprintln!("the writer waited {waited:?} under 4 continuous readers");
}

#[test]
fn a_dead_readers_hold_expires_by_itself() {
    let server = RedisServer::start();
    let reader = client(&server);
    let other_reader = client(&server);
    let g = reader.rwlock("r").read().unwrap();
    let kept = other_reader.rwlock("r").read().unwrap();
    // The first reader's process stops: nothing renews or releases its hold.
    std::mem::forget(g);
    reader.shutdown();
    drop(kept);
    let writer = client(&server);
    let started = Instant::now();
    let w = writer
        .rwlock("r")
        .try_write_for(Duration::from_secs(20))
        .unwrap();
    assert!(w.is_some(), "the dead reader blocked the writer for good");
    // It waited for the dead reader's lease (2 s), not for ever.
    assert!(started.elapsed() > Duration::from_millis(500));
}

#[test]
fn a_writer_may_downgrade_and_a_reader_may_not_upgrade() {
    let server = RedisServer::start();
    let c = client(&server);
    let lock = c.rwlock("grade");
    let w = lock.write().unwrap();
    let r = lock.read().unwrap(); // downgrade
    assert_eq!((lock.write_count(), lock.read_count()), (1, 1));
    w.unlock().unwrap();
    // Still read-held: another writer cannot get in, another reader can.
    let other = client(&server);
    assert!(other.rwlock("grade").try_write().unwrap().is_none());
    assert!(other.rwlock("grade").try_read().unwrap().is_some());
    // A reader asking for write is refused at once.
    let started = Instant::now();
    let err = lock.write().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(started.elapsed() < Duration::from_secs(1));
    // Re-entry: read in read.
    let again = lock.read().unwrap();
    assert_eq!(lock.read_count(), 2);
    drop(again);
    r.unlock().unwrap();
    assert!(other.rwlock("grade").try_write().unwrap().is_some());
}

#[test]
fn a_try_write_leaves_no_claim_and_a_writer_that_gives_up_withdraws_it() {
    let server = RedisServer::start();
    let c = client(&server);
    let other = client(&server);
    let r = c.rwlock("claims").read().unwrap();
    assert!(other.rwlock("claims").try_write().unwrap().is_none());
    assert!(other.rwlock("claims").try_read().unwrap().is_some());
    let gave_up = other
        .rwlock("claims")
        .try_write_for(Duration::from_millis(300))
        .unwrap();
    assert!(gave_up.is_none());
    let exists: bool = redis::cmd("EXISTS")
        .arg("redmutex:{claims}:writer-waiting")
        .query(&mut server.conn())
        .unwrap();
    assert!(!exists, "the claim of a writer that gave up stayed");
    assert!(c.rwlock("claims").try_read().unwrap().is_some());
    drop(r);
}

#[test]
fn a_write_release_wakes_the_waiting_readers() {
    let server = RedisServer::start();
    let c = client(&server);
    let waiting = client(&server);
    let w = c.rwlock("woken").write().unwrap();
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let lock = waiting.rwlock("woken");
            std::thread::spawn(move || lock.try_read_for(LIMIT).map(|g| g.is_some()))
        })
        .collect();
    assert!(eventually(LIMIT, || waiting.stats().contended >= 1));
    std::thread::sleep(Duration::from_millis(300));
    w.unlock().unwrap();
    for t in threads {
        assert!(within(LIMIT, move || t.join().unwrap()).unwrap());
    }
    assert!(waiting.stats().notifications >= 1, "no release was heard");
}

#[test]
fn bad_input_is_a_clear_error_and_changes_nothing() {
    let server = RedisServer::start();
    let c = client(&server);
    let _: () = redis::cmd("SET")
        .arg("redmutex:{typed}:readers")
        .arg("not a set")
        .query(&mut server.conn())
        .unwrap();
    let err = c.rwlock("typed").read().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WrongType, "{err}");
    let err = c.rwlock("typed").try_write().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WrongType, "{err}");
    let value: String = redis::cmd("GET")
        .arg("redmutex:{typed}:readers")
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(value, "not a set");
    let err = c.rwlock("").read().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
}

#[test]
fn idle_readers_and_writers_cost_redis_almost_nothing() {
    let server = RedisServer::start();
    // Default settings: a 30 s lease, renewed (and re-checked by waiters) every 10 s.
    let holder = Client::open(server.url()).unwrap();
    let waiter = Client::open(server.url()).unwrap();
    let w = holder.rwlock("idle").write().unwrap();
    let threads: Vec<_> = (0..10)
        .map(|i| {
            let lock = waiter.rwlock("idle");
            std::thread::spawn(move || {
                if i % 2 == 0 {
                    lock.try_read_for(LIMIT).map(|g| g.is_some())
                } else {
                    lock.try_write_for(LIMIT).map(|g| g.is_some())
                }
            })
        })
        .collect();
    assert!(eventually(LIMIT, || waiter.stats().contended >= 2));
    std::thread::sleep(Duration::from_secs(1));
    let before = server.info_number("stats", "total_commands_processed");
    std::thread::sleep(Duration::from_secs(10));
    let spent = server.info_number("stats", "total_commands_processed") - before;
    eprintln!("ten idle readers and writers: {spent} commands in 10 s");
    assert!(spent < 100, "{spent} commands in 10 s");
    drop(w);
    for t in threads {
        assert!(within(LIMIT, move || t.join().unwrap()).unwrap());
    }
}

#[test]
fn a_read_hold_is_renewed_past_its_lease() {
    let server = RedisServer::start();
    let c = client(&server);
    let r = c.rwlock("renewed").read().unwrap();
    // Past the 2 s lease: the renewal thread keeps this reader's own entry alive.
    std::thread::sleep(Duration::from_millis(2600));
    assert!(!r.is_lost());
    let other = client(&server);
    assert!(other.rwlock("renewed").try_write().unwrap().is_none());
    r.unlock().unwrap();
    assert!(other.rwlock("renewed").try_write().unwrap().is_some());
}

#[test]
fn a_fixed_lease_is_not_renewed_and_a_writer_may_extend_it() {
    let server = RedisServer::start();
    let client = Client::builder()
        .renewal_interval(Duration::from_millis(200))
        .open(server.url())
        .unwrap();
    let rw = client
        .rwlock("fixed")
        .with_fixed_lease(Duration::from_millis(1500));
    let w = rw.write().unwrap();
    let ttl = |server: &RedisServer| -> i64 {
        redis::cmd("PTTL")
            .arg("redmutex:{fixed}")
            .query(&mut server.conn())
            .unwrap()
    };
    assert!(ttl(&server) <= 1500);
    // Not renewed: still at most the fixed lease after several renewal periods.
    std::thread::sleep(Duration::from_millis(700));
    assert!(ttl(&server) <= 800, "renewed: {}", ttl(&server));
    w.extend(Duration::from_secs(30)).unwrap();
    assert!(ttl(&server) > 29_000);
    w.set_lease(Duration::from_millis(300)).unwrap();
    assert!(ttl(&server) <= 300);
    // Runs out: the hold is lost and someone else writes.
    assert!(eventually(Duration::from_secs(30), || w.is_lost()));
    let other = Client::open(server.url()).unwrap();
    assert!(other.rwlock("fixed").try_write().unwrap().is_some());
    assert_eq!(w.unlock().unwrap_err().kind(), ErrorKind::LockLost);
}

#[test]
fn a_read_guard_offers_the_lease_methods_of_a_mutex_guard() {
    let server = RedisServer::start();
    let c = client(&server);
    let lock = c.rwlock("leased").with_fixed_lease(Duration::from_secs(5));
    let r = lock.read().unwrap();
    assert!(r.verify().unwrap() <= Duration::from_secs(5));
    r.extend(Duration::from_secs(100)).unwrap();
    assert!(r.verify().unwrap() > Duration::from_secs(60));
    let pttl: i64 = redis::cmd("PTTL")
        .arg("redmutex:{leased}:readers")
        .query(&mut server.conn())
        .unwrap();
    assert!(pttl > 60_000, "the readers' key did not follow: {pttl}");
    r.set_lease(Duration::from_secs(10)).unwrap();
    assert!(r.verify().unwrap() <= Duration::from_secs(10));
    // Taken away: verify and extend say so.
    assert!(lock.force_unlock().unwrap());
    assert!(r.verify().unwrap_err().is_lock_lost());
    assert!(r.extend(Duration::from_secs(1)).unwrap_err().is_lock_lost());
    assert!(r.is_lost());
}
