//! Poisoning across processes: a holder whose thread panics releases the lock and leaves a
//! record that the next holder, in any process, can read and clear.

mod support;

use std::time::Duration;

use redmutex::Client;
use support::RedisServer;

const ENTRY: &str = "poison_worker_entry";

/// A worker process that panics while holding the lock.
#[test]
fn poison_worker_entry() {
    let Some((role, url, _)) = support::worker_role() else {
        return;
    };
    assert_eq!(role, "panic-while-holding");
    let client = Client::open(url.as_str()).unwrap();
    let _g = client.mutex("ledger").lock().unwrap();
    println!("LOCKED");
    panic!("simulated failure in the middle of the critical section");
}

#[test]
fn a_panicking_thread_releases_and_poisons_the_lock() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let c = client.clone();
    let outcome = std::thread::Builder::new()
        .name("poisoner".into())
        .spawn(move || {
            let m = c.mutex("ledger");
            let _outer = m.lock().unwrap();
            let inner = m.lock().unwrap(); // re-entry: only the outermost release counts
            drop(inner);
            panic!("simulated failure");
        })
        .unwrap()
        .join();
    assert!(outcome.is_err(), "the thread was meant to panic");

    // Released at once (no lease wait), and the record says who and when.
    let g = client
        .mutex("ledger")
        .try_lock()
        .unwrap()
        .expect("the panic left the lock held");
    let poison = g.poison().unwrap().expect("no poison record");
    assert_eq!(poison.process_id, std::process::id());
    assert_eq!(poison.thread, "poisoner");
    assert!(poison.poisoned_at.elapsed().unwrap_or_default() < Duration::from_secs(600));
    assert!(g.clear_poison().unwrap());
    assert!(g.poison().unwrap().is_none());
    assert!(!g.clear_poison().unwrap());
    drop(g);

    // An ordinary release leaves no record.
    drop(client.mutex("ledger").lock().unwrap());
    assert!(client
        .mutex("ledger")
        .lock()
        .unwrap()
        .poison()
        .unwrap()
        .is_none());
}

#[test]
fn another_process_sees_the_panic_of_a_holder() {
    let server = RedisServer::start();
    let mut child = support::spawn_worker(ENTRY, "panic-while-holding", &server.url(), "");
    let pid = child.id();
    support::read_marker(&mut child, "LOCKED");
    assert!(
        !child.wait().unwrap().success(),
        "the worker was meant to fail"
    );
    let client = Client::open(server.url()).unwrap();
    let g = client
        .mutex("ledger")
        .try_lock()
        .unwrap()
        .expect("the panicking process left the lock held");
    let poison = g.poison().unwrap().expect("no poison record");
    assert_eq!(poison.process_id, pid);
    assert!(poison.to_string().contains("panicked"));
}

#[test]
fn a_fair_lock_is_poisoned_and_released_too() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let c = client.clone();
    let outcome = std::thread::spawn(move || {
        let _g = c.fair_mutex("queue").lock().unwrap();
        panic!("simulated failure");
    })
    .join();
    assert!(outcome.is_err());
    let g = client
        .fair_mutex("queue")
        .try_lock()
        .unwrap()
        .expect("still held");
    assert!(g.poison().unwrap().is_some());
}

/// Readers and permit holders keep no token on the lock key: a panic while holding one
/// releases the hold at once and leaves no poison record (none is claimed), so the record a
/// writer or a `Mutex` of the same name reads is never a reader's.
#[test]
fn a_panicking_reader_or_permit_holder_releases_and_leaves_no_record() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let (reader, holder) = (client.clone(), client.clone());
    let read = std::thread::spawn(move || {
        let _r = reader.rwlock("catalog").read().unwrap();
        panic!("simulated failure of a reader");
    })
    .join();
    let permit = std::thread::spawn(move || {
        let _p = holder.semaphore("exports", 2).acquire_many(2).unwrap();
        panic!("simulated failure of a permit holder");
    })
    .join();
    assert!(
        read.is_err() && permit.is_err(),
        "the threads were meant to panic"
    );

    // Released at once, not after a lease.
    let writer = client
        .rwlock("catalog")
        .try_write()
        .unwrap()
        .expect("the panicking reader left its hold");
    drop(writer);
    assert_eq!(client.semaphore("exports", 2).available().unwrap(), 2);
    // No record anywhere.
    let records: Vec<String> = redis::cmd("KEYS")
        .arg("*poison*")
        .query(&mut server.conn())
        .unwrap();
    assert!(records.is_empty(), "{records:?}");
    assert!(client
        .mutex("catalog")
        .lock()
        .unwrap()
        .poison()
        .unwrap()
        .is_none());
}
