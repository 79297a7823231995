//! Optimistic access to a `Shared<T>`: `get` reads without the lock, `update` writes only if
//! nothing changed since its read, beside holders of the lock on the same value. Worker
//! processes are this test binary run again with a role in the environment.

mod support;

use std::process::Child;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redmutex::events::{EventHandler, Updated};
use redmutex::{Client, ErrorKind};
use support::{read_marker, within, RedisServer};

const ENTRY: &str = "optimistic_worker_entry";
const PROCESSES: usize = 4;
const THREADS: usize = 4;
const UPDATES: u64 = 500;

/// The entry point of the worker processes; does nothing in a normal test run.
#[test]
fn optimistic_worker_entry() {
    let Some((role, url, _)) = support::worker_role() else {
        return;
    };
    match role.as_str() {
        "updater" => add_one_many_times(&url),
        other => panic!("unknown role {other}"),
    }
}

/// `THREADS` threads, each adding one `UPDATES` times with an update.
fn add_one_many_times(url: &str) {
    let client = Client::open(url).unwrap();
    let threads: Vec<_> = (0..THREADS)
        .map(|_| {
            let counter = client.shared::<u64>("optimistic-counter");
            std::thread::spawn(move || {
                for _ in 0..UPDATES {
                    counter
                        .update_for(Duration::from_secs(120), |n| *n += 1)
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    println!("CONFLICTS {}", client.stats().update_conflicts);
}

#[test]
fn four_processes_of_four_threads_update_a_counter_exactly() {
    let server = RedisServer::start();
    let mut workers: Vec<Child> = (0..PROCESSES)
        .map(|_| support::spawn_worker(ENTRY, "updater", &server.url(), ""))
        .collect();
    let mut conflicts = 0;
    for w in &mut workers {
        conflicts += read_marker(w, "CONFLICTS ").parse::<u64>().unwrap();
    }
    for mut w in workers {
        assert!(w.wait().unwrap().success(), "a worker failed");
    }
    let client = Client::open(server.url()).unwrap();
    let total = (PROCESSES * THREADS) as u64 * UPDATES;
    assert_eq!(
        client.shared::<u64>("optimistic-counter").get().unwrap(),
        total
    );
    // Sixteen writers of one value collide: the count is exact because conflicts were
    // caught, not because there were none.
    assert!(conflicts > 0, "no update ever collided with another");
}

#[test]
fn get_reads_the_last_written_value_without_waiting_for_the_holder() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let value = client.shared::<u64>("read");
    assert_eq!(
        value.get().unwrap(),
        0,
        "a missing value reads as the default"
    );
    let missing = client.shared_existing::<u64>("read");
    assert_eq!(missing.get().unwrap_err().kind(), ErrorKind::NoValue);

    let mut g = value.lock().unwrap();
    *g = 7;
    g.commit().unwrap();
    *g = 8;
    // Held, with 8 not written yet: another thread reads 7 at once.
    let v = value.clone();
    assert_eq!(within(Duration::from_secs(30), move || v.get().unwrap()), 7);
    g.unlock().unwrap();
    assert_eq!(value.get().unwrap(), 8);
    assert_eq!(missing.get().unwrap(), 8);
}

#[test]
fn an_update_waits_for_the_holder_and_applies_on_top_of_its_write() {
    let server = RedisServer::start();
    let client = Client::builder()
        .backoff(Duration::from_millis(1), Duration::from_millis(20))
        .open(server.url())
        .unwrap();
    let value = client.shared::<u64>("held");
    let mut g = value.lock().unwrap();
    *g = 10;
    let released = Arc::new(AtomicBool::new(false));
    let updater = {
        let (value, released) = (value.clone(), Arc::clone(&released));
        std::thread::spawn(move || {
            let seen = value.update(|n| {
                *n += 1;
                *n
            });
            (seen, released.load(Ordering::SeqCst))
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    released.store(true, Ordering::SeqCst);
    g.unlock().unwrap();
    let (seen, after_release) = updater.join().unwrap();
    assert!(after_release, "the update wrote while the lock was held");
    assert_eq!(seen.unwrap(), 11);
    assert_eq!(value.get().unwrap(), 11);
    assert!(client.stats().update_conflicts > 0);
}

#[test]
fn a_holders_write_between_an_updates_read_and_write_sends_the_update_back_to_read() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let value = client.shared::<u64>("between");
    value.update(|n| *n = 1).unwrap();
    let runs = AtomicUsize::new(0);
    let out = value
        .update(|n| {
            if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                // Between this update's read and its write, a holder writes 100.
                let holder = value.clone();
                std::thread::spawn(move || {
                    let mut g = holder.lock().unwrap();
                    *g = 100;
                    g.unlock().unwrap();
                })
                .join()
                .unwrap();
            }
            *n += 1;
            *n
        })
        .unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        2,
        "the stale write was not refused"
    );
    assert_eq!(out, 101);
    assert_eq!(value.get().unwrap(), 101);
}

#[test]
fn a_hold_that_writes_nothing_between_an_updates_read_and_write_lets_it_write() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let value = client.shared::<u64>("read-between");
    value.update(|n| *n = 1).unwrap();
    let runs = AtomicUsize::new(0);
    let out = value
        .update(|n| {
            if runs.fetch_add(1, Ordering::SeqCst) == 0 {
                // Between this update's read and its write, a holder reads the value, and a
                // `Mutex` of the same name takes the lock: neither writes.
                let (holder, mutex) = (value.clone(), client.mutex("read-between"));
                std::thread::spawn(move || {
                    assert_eq!(*holder.lock().unwrap(), 1);
                    mutex.lock().unwrap().unlock().unwrap();
                })
                .join()
                .unwrap();
            }
            *n += 1;
            *n
        })
        .unwrap();
    // The value is still the one read: the update's one run is written.
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the update was sent back");
    assert_eq!(out, 2);
    assert_eq!(value.get().unwrap(), 2);
}

#[test]
fn a_holder_whose_lease_ran_out_loses_to_an_update() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let value = client.shared::<u64>("expired");
    let held = value.clone().with_fixed_lease(Duration::from_millis(300));
    let mut g = held.lock().unwrap();
    // The holder stalls past its lease; an update goes through meanwhile.
    std::thread::sleep(Duration::from_millis(600));
    let v = value.clone();
    within(Duration::from_secs(30), move || v.update(|n| *n += 5)).unwrap();
    *g = 100;
    let err = g.unlock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    assert_eq!(
        value.get().unwrap(),
        5,
        "the stale holder's write went over the update"
    );
}

#[test]
fn update_for_gives_up_with_conflict_while_the_lock_is_held() {
    let server = RedisServer::start();
    let updates = Arc::new(UpdateEvents::default());
    let client = Client::builder()
        .event_handler(Arc::clone(&updates))
        .open(server.url())
        .unwrap();
    let value = client.shared::<u64>("busy");
    value.update(|n| *n = 3).unwrap();
    let _g = value.lock().unwrap();
    let v = value.clone();
    let err = within(Duration::from_secs(30), move || {
        v.update_for(Duration::from_millis(300), |n| *n += 1)
    })
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Conflict, "{err}");
    assert_eq!(value.get().unwrap(), 3);
    let stats = client.stats();
    assert_eq!(stats.updates, 2);
    assert!(stats.update_conflicts >= 1);
    assert_eq!(updates.written.load(Ordering::SeqCst), 1);
    assert_eq!(updates.conflicted.load(Ordering::SeqCst), 1);
}

#[test]
fn an_unchanged_value_is_not_written_and_a_panic_writes_nothing() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let value = client.shared::<Vec<u32>>("unchanged");
    value.update(|v| v.push(1)).unwrap();
    let scripts = server.command_calls("evalsha") + server.command_calls("eval");
    let len = value.update(|v| v.len()).unwrap();
    assert_eq!(len, 1);
    assert_eq!(
        server.command_calls("evalsha") + server.command_calls("eval"),
        scripts,
        "an update that changed nothing wrote"
    );

    let v = value.clone();
    let panicked = std::thread::spawn(move || {
        v.update(|v| {
            v.push(2);
            panic!("the closure fails");
        })
    })
    .join();
    assert!(panicked.is_err());
    assert_eq!(value.get().unwrap(), vec![1]);
}

#[test]
fn bad_values_and_keys_are_typed_errors_that_write_nothing() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let mut conn = server.conn();
    let _: () = redis::cmd("SET")
        .arg("redmutex:{garbled}:value")
        .arg("not an encoded value")
        .query(&mut conn)
        .unwrap();
    let garbled = client.shared::<u64>("garbled");
    assert_eq!(garbled.get().unwrap_err().kind(), ErrorKind::Decode);
    let err = garbled.update(|n| *n += 1).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Decode, "{err}");
    let raw: String = redis::cmd("GET")
        .arg("redmutex:{garbled}:value")
        .query(&mut conn)
        .unwrap();
    assert_eq!(raw, "not an encoded value");

    let _: () = redis::cmd("HSET")
        .arg("redmutex:{hash}:value")
        .arg("f")
        .arg("v")
        .query(&mut conn)
        .unwrap();
    let hash = client.shared::<u64>("hash");
    assert_eq!(hash.get().unwrap_err().kind(), ErrorKind::WrongType);
    let err = hash.update(|n| *n += 1).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WrongType, "{err}");
    let kept: String = redis::cmd("HGET")
        .arg("redmutex:{hash}:value")
        .arg("f")
        .query(&mut conn)
        .unwrap();
    assert_eq!(kept, "v");

    // The value's version (who wrote it) of the wrong type: nothing written over it.
    let _: () = redis::cmd("RPUSH")
        .arg("redmutex:{listed}:value-fence")
        .arg("x")
        .query(&mut conn)
        .unwrap();
    let listed = client.shared::<u64>("listed");
    let err = listed.update(|n| *n += 1).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WrongType, "{err}");
    let value: Option<String> = redis::cmd("GET")
        .arg("redmutex:{listed}:value")
        .query(&mut conn)
        .unwrap();
    assert_eq!(value, None);

    let empty = client.shared::<u64>("");
    assert_eq!(empty.get().unwrap_err().kind(), ErrorKind::InvalidArgument);
    assert_eq!(
        empty.update(|n| *n += 1).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
}

/// Counts the updates that wrote and those that gave up on a conflict.
#[derive(Default)]
struct UpdateEvents {
    written: AtomicUsize,
    conflicted: AtomicUsize,
}

impl EventHandler for UpdateEvents {
    fn updated(&self, event: &Updated<'_>) {
        if event.written {
            self.written.fetch_add(1, Ordering::SeqCst);
        }
        if event.error == Some(ErrorKind::Conflict) {
            self.conflicted.fetch_add(1, Ordering::SeqCst);
        }
    }
}
