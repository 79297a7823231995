//! The other kinds over a Redlock of three `redis-server`s that the tests start, pause and
//! kill: an `RwLock`, a `Semaphore`, a `MultiLock` and a `Shared<T>` whose holds live on a
//! quorum, with the guards, re-entry, waiting, renewal, poison records, events and `Stats` of
//! a client's, and a shared value whose newest copy is read when an instance missed a write.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Duration;

use redmutex::events::{Acquired, EventHandler, Released, Renewed, Waiting};
use redmutex::{ErrorKind, Redlock};
use support::{eventually, redlock_over as redlock, servers, within, RedisServer};

const LIMIT: Duration = Duration::from_secs(60);

fn exists(server: &RedisServer, pattern: &str) -> bool {
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(pattern)
        .query(&mut server.conn())
        .unwrap();
    !keys.is_empty()
}

#[test]
fn readers_share_a_redlock_rwlock_and_a_writer_excludes_them() {
    let s = servers(3);
    let (a, b, c) = (redlock(&s), redlock(&s), redlock(&s));
    let (la, lb, lc) = (
        a.rwlock("catalog"),
        b.rwlock("catalog"),
        c.rwlock("catalog"),
    );
    let r1 = la.read().unwrap();
    let r2 = lb.try_read_for(Duration::from_secs(5)).unwrap();
    assert!(r2.is_some(), "a second reader was kept out");
    assert!(
        lc.try_write_for(Duration::from_millis(300))
            .unwrap()
            .is_none(),
        "a writer got in beside two readers"
    );
    // Re-entry on the same thread, local.
    let again = la.read().unwrap();
    assert_eq!(la.read_count(), 2);
    drop(again);
    drop((r1, r2));
    let w = lb
        .try_write_for(Duration::from_secs(10))
        .unwrap()
        .expect("no writer");
    assert!(
        s.iter()
            .filter(|s| exists(s, "redmutex:{catalog}*"))
            .count()
            >= 2
    );
    assert!(
        la.try_read_for(Duration::from_millis(300))
            .unwrap()
            .is_none(),
        "a reader got in beside the writer"
    );
    let first = w.fencing_token();
    assert!(w.validity_left() > Duration::ZERO);
    w.unlock().unwrap();
    let w = la.write().unwrap();
    assert!(w.fencing_token() > first, "fencing tokens did not grow");
}

#[test]
fn a_writer_waiting_on_a_redlock_rwlock_is_woken_by_the_readers_release() {
    let s = servers(3);
    let (a, b) = (redlock(&s), redlock(&s));
    let reader = a.rwlock("menu").read().unwrap();
    let taken = Arc::new(Barrier::new(2));
    let writer = {
        let (lock, taken) = (b.rwlock("menu"), Arc::clone(&taken));
        std::thread::spawn(move || {
            taken.wait();
            let g = lock.try_write_for(LIMIT).unwrap();
            g.map(|g| g.fencing_token())
        })
    };
    taken.wait();
    std::thread::sleep(Duration::from_millis(300));
    drop(reader);
    let token = within(LIMIT, move || writer.join().unwrap());
    assert!(token.is_some(), "the waiting writer never got the lock");
    assert!(b.stats().contended >= 1, "{:?}", b.stats());
}

#[test]
fn a_redlock_semaphore_lets_in_as_many_holders_as_it_has_permits() {
    let s = servers(3);
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let workers: Vec<_> = (0..4)
        .map(|_| {
            let (urls, inside, most) = (
                s.iter().map(RedisServer::url).collect::<Vec<_>>(),
                Arc::clone(&inside),
                Arc::clone(&most),
            );
            std::thread::spawn(move || {
                let redlock = Redlock::builder()
                    .default_lease(Duration::from_secs(2))
                    .open(urls.iter().map(String::as_str))
                    .unwrap();
                let slots = redlock.semaphore("exports", 2);
                for _ in 0..5 {
                    let permit = slots.try_acquire_for(LIMIT).unwrap().expect("no permit");
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(20));
                    inside.fetch_sub(1, Ordering::SeqCst);
                    permit.unlock().unwrap();
                }
            })
        })
        .collect();
    for w in workers {
        within(LIMIT, move || w.join().unwrap());
    }
    let most = most.load(Ordering::SeqCst);
    assert!(
        (1..=2).contains(&most),
        "{most} holders of 2 permits at once"
    );
    let mut s = s;
    let redlock = redlock(&s);
    let slots = redlock.semaphore("exports", 2);
    assert_eq!(slots.available().unwrap(), 2);
    let both = slots.acquire_many(2).unwrap();
    assert!(slots.try_acquire().unwrap().is_none(), "a third permit");
    assert_eq!(slots.available().unwrap(), 0);
    // The count is fixed over a Redlock: a permit's quorum depends on it.
    let err = slots.set_permits(3).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    drop(both);
    // A permit taken on one instance by hand: every permit still needs all three.
    let in_an_hour = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 3_600_000;
    redis::cmd("ZADD")
        .arg("redmutex:semaphore:{exports}:holders")
        .arg(in_an_hour as u64)
        .arg("by-hand")
        .query::<i64>(&mut s[0].conn())
        .unwrap();
    redis::cmd("HSET")
        .arg("redmutex:semaphore:{exports}:held")
        .arg("by-hand")
        .arg(1)
        .query::<i64>(&mut s[0].conn())
        .unwrap();
    assert_eq!(
        slots.available().unwrap(),
        1,
        "counted beside a full instance"
    );
    assert!(slots.try_acquire().unwrap().is_some());
    // Two permits over three instances need all three: with one down, no permit is given.
    s[2].kill();
    let err = slots.try_acquire().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(redlock.semaphore("one", 1).try_acquire().unwrap().is_some());
}

#[test]
fn a_redlock_semaphore_and_rwlock_keep_working_with_one_instance_down() {
    let mut s = servers(3);
    let redlock = redlock(&s);
    s[0].kill();
    let permit = redlock.semaphore("jobs", 1).acquire().unwrap();
    assert!(redlock
        .semaphore("jobs", 1)
        .try_acquire_for(Duration::from_millis(300))
        .unwrap()
        .is_none());
    // Held over renewals with the instance still down.
    std::thread::sleep(Duration::from_millis(2500));
    assert!(!permit.is_lost());
    permit.unlock().unwrap();
    let w = redlock.rwlock("state").write().unwrap();
    assert!(w.verify().unwrap() > Duration::ZERO);
    s[1].kill();
    // Two of three gone: the lease is lost within the lease, and told.
    assert!(
        w.lease_watch().wait_timeout(LIMIT),
        "the loss was never told"
    );
    let err = w.unlock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
}

#[test]
fn a_panicking_writer_leaves_a_poison_record_on_the_majority_and_a_reader_none() {
    let s = servers(3);
    let redlock = redlock(&s);
    let lock = redlock.rwlock("ledger");
    let writer = {
        let lock = lock.clone();
        std::thread::spawn(move || {
            let _w = lock.write().unwrap();
            panic!("a writer panics");
        })
    };
    assert!(writer.join().is_err());
    let w = lock.write().unwrap();
    let poison = w.poison().unwrap().expect("no poison record");
    assert_eq!(poison.process_id, std::process::id());
    assert!(s.iter().filter(|s| exists(s, "*poison*")).count() >= 2);
    assert!(w.clear_poison().unwrap());
    assert!(w.poison().unwrap().is_none());
    drop(w);
    let reader = {
        let lock = lock.clone();
        std::thread::spawn(move || {
            let _r = lock.read().unwrap();
            panic!("a reader panics");
        })
    };
    assert!(reader.join().is_err());
    assert!(
        s.iter().all(|s| !exists(s, "*poison*")),
        "a reader's panic left a record"
    );
    assert!(
        lock.try_write().unwrap().is_some(),
        "the reader's hold was kept"
    );
}

#[test]
fn a_redlock_multi_lock_takes_all_or_nothing_and_never_deadlocks() {
    let s = servers(3);
    let (a, b) = (redlock(&s), redlock(&s));
    let held = b.mutex("b").lock().unwrap();
    let multi = a.multi_lock(["c", "a", "b"]);
    assert!(multi
        .try_lock_for(Duration::from_millis(200))
        .unwrap()
        .is_none());
    assert!(
        s.iter()
            .all(|s| !exists(s, "redmutex:{a}") && !exists(s, "redmutex:{c}")),
        "a partial hold was left"
    );
    drop(held);
    let all = multi.lock().unwrap();
    assert_eq!(all.guards().len(), 3);
    assert!(all.validity_left() > Duration::ZERO);
    assert!(b.mutex("a").try_lock().unwrap().is_none());
    all.unlock().unwrap();
    // Overlapping sets taken in opposite orders by three Redlocks.
    let urls: Vec<String> = s.iter().map(RedisServer::url).collect();
    let threads: Vec<_> = [["x", "y", "z"], ["z", "y", "x"], ["y", "x", "w"]]
        .into_iter()
        .map(|names| {
            let urls = urls.clone();
            std::thread::spawn(move || {
                let redlock = Redlock::open(urls.iter().map(String::as_str)).unwrap();
                let multi = redlock.multi_lock(names);
                for _ in 0..10 {
                    multi.lock().unwrap().unlock().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        within(LIMIT, move || t.join().unwrap());
    }
}

/// Keeps every event as a line of text.
#[derive(Default)]
struct Recorder {
    lines: Mutex<Vec<String>>,
}

impl Recorder {
    fn count(&self, prefix: &str) -> usize {
        let lines = self.lines.lock().unwrap();
        lines.iter().filter(|l| l.starts_with(prefix)).count()
    }
}

impl EventHandler for Recorder {
    fn acquired(&self, e: &Acquired<'_>) {
        let line = format!("acquired {} {}", e.kind, e.name);
        self.lines.lock().unwrap().push(line);
    }
    fn released(&self, e: &Released<'_>) {
        let line = format!("released {} {} lost={}", e.kind, e.name, e.lost);
        self.lines.lock().unwrap().push(line);
    }
    fn renewed(&self, e: &Renewed) {
        let line = format!("renewed {} {}", e.leases, e.round_trips);
        self.lines.lock().unwrap().push(line);
    }
    fn waiting(&self, e: &Waiting<'_>) {
        let line = format!("waiting {} {} {}", e.kind, e.name, e.started);
        self.lines.lock().unwrap().push(line);
    }
}

#[test]
fn a_redlock_tells_the_events_and_counts_the_stats_of_a_client() {
    let s = servers(3);
    let events = Arc::new(Recorder::default());
    let redlock = Redlock::builder()
        .default_lease(Duration::from_secs(1))
        .renewal_interval(Duration::from_millis(200))
        .event_handler(Arc::clone(&events))
        .open(s.iter().map(RedisServer::url))
        .unwrap();
    let w = redlock.rwlock("report").write().unwrap();
    let r = redlock.semaphore("slots", 3).acquire().unwrap();
    assert!(eventually(LIMIT, || events.count("renewed 2") >= 1));
    let waiter = {
        let lock = redlock.rwlock("report");
        std::thread::spawn(move || lock.try_read_for(LIMIT).unwrap().is_some())
    };
    assert!(eventually(LIMIT, || events
        .count("waiting RwLock report true")
        == 1));
    drop(w);
    assert!(within(LIMIT, move || waiter.join().unwrap()));
    r.unlock().unwrap();
    assert_eq!(events.count("acquired RwLock report"), 2);
    assert_eq!(events.count("acquired Semaphore slots"), 1);
    assert_eq!(events.count("released RwLock report lost=false"), 2);
    assert_eq!(events.count("released Semaphore slots lost=false"), 1);
    assert_eq!(events.count("waiting RwLock report false"), 1);
    let stats = redlock.stats();
    assert_eq!((stats.acquisitions, stats.releases), (3, 3), "{stats:?}");
    assert_eq!(stats.contended, 1, "{stats:?}");
    assert!(
        stats.renewals >= 2 && stats.renewal_round_trips >= 3,
        "{stats:?}"
    );
    assert_eq!(stats.renewed_leases, 0, "{stats:?}");
}

/// A `Shared<u64>` over a Redlock of `servers`.
fn counter(servers: &[RedisServer], name: &str) -> redmutex::Shared<u64> {
    redlock(servers).shared::<u64>(name)
}

#[test]
fn a_redlock_shared_value_comes_with_the_lock_and_goes_with_the_release() {
    let s = servers(3);
    let (a, b) = (counter(&s, "stock"), counter(&s, "stock"));
    {
        let mut left = a.lock().unwrap();
        assert_eq!(*left, 0, "a missing value starts as the default");
        *left = 5;
    }
    assert_eq!(b.get().unwrap(), 5);
    let mut left = b.lock().unwrap();
    assert_eq!(*left, 5);
    assert!(
        a.try_lock_for(Duration::from_millis(300))
            .unwrap()
            .is_none(),
        "two holders of one value"
    );
    *left -= 1;
    left.commit().unwrap();
    assert_eq!(a.get().unwrap(), 4, "a commit is read at once");
    *left -= 1;
    left.unlock().unwrap();
    assert_eq!(*a.lock().unwrap(), 3);
    let written = s
        .iter()
        .filter(|s| exists(s, "redmutex:{stock}:value-fence"))
        .count();
    assert!(written >= 2, "the write reached {written} of 3 instances");
}

#[test]
fn redlock_updates_from_many_threads_add_up_exactly() {
    let s = servers(3);
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let value = counter(&s, "visits");
            std::thread::spawn(move || {
                for _ in 0..25 {
                    value.update(|n| *n += 1).unwrap();
                }
            })
        })
        .collect();
    within(LIMIT, move || {
        for t in threads {
            t.join().unwrap();
        }
    });
    assert_eq!(counter(&s, "visits").get().unwrap(), 100);
}

/// Writes `value` (through `write`) while `stale` is paused, so that only the other instances
/// take it; then resumes it and kills instance `dead`, so that the next reader's quorum is
/// the stale instance and one that took the write.
fn write_missing_one(s: &mut [RedisServer], (stale, dead): (usize, usize), write: impl FnOnce()) {
    s[stale].pause();
    write();
    s[stale].resume();
    s[dead].kill();
}

#[test]
fn a_redlock_reader_takes_the_newest_copy_when_an_instance_missed_a_write() {
    let mut s = servers(3);
    let value = counter(&s, "ledger");
    *value.lock().unwrap() = 1;
    // Instance 1 keeps 1; 0 and 2 take 2. Then 0 dies: the reader sees 1 (stale) and 2.
    write_missing_one(&mut s, (1, 0), || {
        let mut v = value.lock().unwrap();
        *v = 2;
        v.unlock().unwrap();
    });
    let reader = counter(&s, "ledger");
    assert_eq!(reader.get().unwrap(), 2, "get read a stale copy");
    // The stale instance still has the writer's lock until its lease ends; then the reader
    // takes instances 1 and 2.
    assert_eq!(*reader.lock().unwrap(), 2, "lock read a stale copy");
}

#[test]
fn a_holders_later_write_wins_over_its_commit_on_a_redlock() {
    let mut s = servers(3);
    let value = counter(&s, "ledger");
    let mut v = value.lock().unwrap();
    *v = 1;
    v.commit().unwrap();
    // The commit (1) is everywhere; the release (2) misses instance 1.
    write_missing_one(&mut s, (1, 0), move || {
        *v = 2;
        v.unlock().unwrap();
    });
    assert_eq!(*counter(&s, "ledger").lock().unwrap(), 2);
}

#[test]
fn a_value_removed_on_a_redlock_is_not_brought_back_by_a_stale_instance() {
    let mut s = servers(3);
    let value = counter(&s, "session");
    *value.lock().unwrap() = 7;
    write_missing_one(&mut s, (1, 0), || value.lock().unwrap().remove().unwrap());
    let reader = redlock(&s).shared_existing::<u64>("session");
    assert_eq!(
        reader.get().map_err(|e| e.kind()),
        Err(ErrorKind::NoValue),
        "get brought the removed value back"
    );
    assert_eq!(
        reader.lock().map(|v| *v).map_err(|e| e.kind()),
        Err(ErrorKind::NoValue),
        "lock brought the removed value back"
    );
}

/// The remaining lease of `key` on each instance, in milliseconds (negative: none).
fn pttls(servers: &[RedisServer], key: &str) -> Vec<i64> {
    servers
        .iter()
        .map(|s| redis::cmd("PTTL").arg(key).query(&mut s.conn()).unwrap())
        .collect()
}

#[test]
fn a_redlock_writer_may_downgrade_and_a_read_hold_is_renewed_past_its_lease() {
    let s = servers(3);
    let (a, b) = (redlock(&s), redlock(&s));
    let lock = a.rwlock("grade");
    let w = lock.write().unwrap();
    let r = lock.read().unwrap(); // downgrade
    w.unlock().unwrap();
    assert!(b.rwlock("grade").try_write().unwrap().is_none());
    let err = lock.write().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    // Past its 2 s lease, renewed on the instances.
    std::thread::sleep(Duration::from_millis(3000));
    assert!(!r.is_lost());
    assert!(r.verify().unwrap() > Duration::ZERO);
    assert!(b.rwlock("grade").try_write().unwrap().is_none());
    r.unlock().unwrap();
    assert!(b.rwlock("grade").try_write().unwrap().is_some());
}

#[test]
fn a_redlock_writer_that_gives_up_withdraws_its_claim_from_every_instance() {
    let s = servers(3);
    let (a, b) = (redlock(&s), redlock(&s));
    let r = a.rwlock("claims").read().unwrap();
    let gave_up = b
        .rwlock("claims")
        .try_write_for(Duration::from_millis(300))
        .unwrap();
    assert!(gave_up.is_none());
    assert!(
        s.iter()
            .all(|s| !exists(s, "redmutex:{claims}:writer-waiting")),
        "a claim was left behind"
    );
    assert!(b.rwlock("claims").try_read().unwrap().is_some());
    drop(r);
}

#[test]
fn a_fixed_redlock_lease_is_not_renewed_and_extend_and_set_lease_reach_the_instances() {
    let s = servers(3);
    let a = redlock(&s);
    let w = a
        .rwlock("fixed")
        .with_fixed_lease(Duration::from_millis(1500))
        .write()
        .unwrap();
    std::thread::sleep(Duration::from_millis(700));
    let left = pttls(&s, "redmutex:{fixed}");
    assert!(left.iter().all(|&ms| ms <= 800), "renewed: {left:?}");
    w.extend(Duration::from_secs(30)).unwrap();
    let left = pttls(&s, "redmutex:{fixed}");
    assert!(
        left.iter().filter(|&&ms| ms > 29_000).count() >= 2,
        "{left:?}"
    );
    w.set_lease(Duration::from_millis(300)).unwrap();
    assert!(eventually(LIMIT, || w.is_lost()));
    assert!(redlock(&s).rwlock("fixed").try_write().unwrap().is_some());
    assert_eq!(w.unlock().unwrap_err().kind(), ErrorKind::LockLost);
}

#[test]
fn redlock_permits_are_taken_all_or_none_renewed_and_kept_apart_from_a_mutex() {
    let s = servers(3);
    let (a, b) = (redlock(&s), redlock(&s));
    let slots = a.semaphore("jobs", 3);
    let two = slots.acquire_many(2).unwrap();
    assert!(
        b.semaphore("jobs", 3)
            .try_acquire_many(2)
            .unwrap()
            .is_none(),
        "two permits of the one left"
    );
    // A mutex of the same name is another lock.
    assert!(b.mutex("jobs").try_lock().unwrap().is_some());
    std::thread::sleep(Duration::from_millis(3000));
    assert!(!two.is_lost(), "not renewed past the 2 s lease");
    assert_eq!(slots.available().unwrap(), 1);
    two.unlock().unwrap();
    assert!(b
        .semaphore("jobs", 3)
        .try_acquire_many(3)
        .unwrap()
        .is_some());
}

#[test]
fn a_redlock_multi_lock_excludes_plain_mutexes_and_names_the_locks_it_lost() {
    let s = servers(3);
    let (a, b) = (redlock(&s), redlock(&s));
    let guard = a
        .multi_lock(["ledger", "payments", "refunds"])
        .lock()
        .unwrap();
    assert!(b.mutex("ledger").try_lock().unwrap().is_none());
    assert!(b.mutex("payments").force_unlock().unwrap());
    let err = guard.unlock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    let text = err.to_string();
    assert!(
        text.contains("\"payments\"") && !text.contains("\"ledger\""),
        "{text}"
    );
    assert!(!b.mutex("ledger").is_locked().unwrap());
}

#[test]
fn a_stale_redlock_holders_write_is_refused_and_the_newer_value_stays() {
    let s = servers(3);
    let value = counter(&s, "stalled");
    *value.lock().unwrap() = 1;
    let mut stale = value
        .clone()
        .with_fixed_lease(Duration::from_millis(500))
        .lock()
        .unwrap();
    std::thread::sleep(Duration::from_millis(800));
    let other = counter(&s, "stalled");
    let mut newer = other
        .try_lock_for(LIMIT)
        .unwrap()
        .expect("the stale holder's lease did not run out");
    assert!(newer.fencing_token() > stale.fencing_token());
    *newer = 7;
    newer.unlock().unwrap();
    *stale = 100;
    assert_eq!(stale.unlock().unwrap_err().kind(), ErrorKind::LockLost);
    assert_eq!(*other.lock().unwrap(), 7, "the stale write was applied");
}

#[test]
fn a_panic_over_a_redlock_value_writes_nothing_and_poisons_and_a_second_lock_is_refused() {
    let s = servers(3);
    let value = counter(&s, "panicky");
    *value.lock().unwrap() = 5;
    let v = value.clone();
    let outcome = std::thread::spawn(move || {
        let mut g = v.lock().unwrap();
        *g = 6;
        panic!("simulated failure halfway through");
    })
    .join();
    assert!(outcome.is_err());
    let g = value
        .try_lock()
        .unwrap()
        .expect("the panic left the lock held");
    assert_eq!(*g, 5, "the half-changed value was written");
    assert!(g.poison().unwrap().is_some(), "no poison record");
    let err = value.lock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(g.clear_poison().unwrap());
}

#[test]
fn a_redlock_value_of_another_type_is_a_decode_error_and_the_lock_is_released() {
    let s = servers(3);
    let r = redlock(&s);
    *r.shared::<String>("typed").lock().unwrap() = "not a number".into();
    let err = r.shared::<u64>("typed").lock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Decode, "{err}");
    assert!(r.mutex("typed").try_lock().unwrap().is_some(), "left held");
}
