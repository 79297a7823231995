//! `Semaphore` on a real `redis-server`: never more holders than permits, all-or-nothing
//! `acquire_many`, a dead holder's permits coming back after its lease, a release waking few
//! waiters, the stored permit count, and bad input.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
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
    assert_eq!(role, "holders");
    let client = Client::builder()
        .backoff(Duration::from_millis(1), Duration::from_millis(20))
        .open(url.as_str())
        .unwrap();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let sem = client.semaphore("fleet", 3);
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
    let server = RedisServer::start();
    let mut workers: Vec<_> = (0..4)
        .map(|_| support::spawn_worker(ENTRY, "holders", &server.url(), ""))
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
    Client::builder()
        .default_lease(Duration::from_secs(2))
        .renewal_interval(Duration::from_millis(300))
        .open(server.url())
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
