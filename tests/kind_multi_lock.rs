//! `MultiLock` on a real `redis-server`: all or nothing, no deadlock between overlapping sets
//! taken in opposite orders, the names of one hash slot taken in one round trip, exclusion
//! against plain `Mutex`es, and bad input.

mod support;

use std::time::Duration;

use redmutex::{Client, ErrorKind};
use support::{within, RedisServer};

const LIMIT: Duration = Duration::from_secs(60);

fn exists(server: &RedisServer, key: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(key)
        .query(&mut server.conn())
        .unwrap()
}

#[test]
fn all_or_nothing_and_nothing_left_behind() {
    let server = RedisServer::start();
    let c = Client::open(server.url()).unwrap();
    let other = Client::open(server.url()).unwrap();
    let b = other.mutex("b").lock().unwrap();
    let multi = c.multi_lock(["c", "a", "b"]);
    // One order, whatever order the names were given in.
    let again = c.multi_lock(["b", "c", "a"]);
    assert_eq!(multi.names(), again.names());
    assert!(multi.try_lock().unwrap().is_none());
    assert!(multi
        .try_lock_for(Duration::from_millis(200))
        .unwrap()
        .is_none());
    assert!(!exists(&server, "redmutex:{a}"), "a partial hold was left");
    assert!(!exists(&server, "redmutex:{c}"), "a partial hold was left");
    drop(b);
    let all = multi.lock().unwrap();
    assert_eq!(all.guards().len(), 3);
    assert!(["a", "b", "c"]
        .iter()
        .all(|n| exists(&server, &format!("redmutex:{{{n}}}"))));
    all.unlock().unwrap();
    assert!(!exists(&server, "redmutex:{b}"));
}

#[test]
fn overlapping_sets_in_opposite_orders_never_deadlock() {
    let server = RedisServer::start();
    let threads: Vec<_> = [["x", "y", "z"], ["z", "y", "x"], ["y", "x", "w"]]
        .into_iter()
        .map(|names| {
            let c = Client::open(server.url()).unwrap();
            std::thread::spawn(move || {
                let multi = c.multi_lock(names);
                for _ in 0..20 {
                    let g = multi.lock().unwrap();
                    std::thread::sleep(Duration::from_millis(1));
                    g.unlock().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        within(LIMIT, move || t.join().unwrap());
    }
}

#[test]
fn a_multi_lock_and_plain_mutexes_exclude_each_other() {
    let server = RedisServer::start();
    let c = Client::open(server.url()).unwrap();
    let other = Client::open(server.url()).unwrap();
    let both = c.multi_lock(["m1", "m2"]).lock().unwrap();
    assert!(other.mutex("m2").try_lock().unwrap().is_none());
    both.unlock().unwrap();
    let m1 = other.mutex("m1").lock().unwrap();
    assert!(c.multi_lock(["m1", "m2"]).try_lock().unwrap().is_none());
    drop(m1);
    assert!(c.multi_lock(["m1", "m2"]).try_lock().unwrap().is_some());
}

#[test]
fn bad_input_is_a_clear_error_and_takes_nothing() {
    let server = RedisServer::start();
    let c = Client::open(server.url()).unwrap();
    let none: [&str; 0] = [];
    // Reported by the first acquire, of every form, as a bad name is by any handle.
    let err = c.multi_lock(none).lock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let twice = c.multi_lock(["a", "b", "a"]);
    for err in [
        twice.try_lock().unwrap_err(),
        twice.try_lock_for(Duration::from_secs(1)).unwrap_err(),
    ] {
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        assert!(err.to_string().contains("twice"), "{err}");
    }
    assert!(!exists(&server, "redmutex:{a}"), "a hold was taken");
    let _: () = redis::cmd("HSET")
        .arg("redmutex:{q}")
        .arg("f")
        .arg("v")
        .query(&mut server.conn())
        .unwrap();
    let err = c.multi_lock(["p", "q"]).try_lock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WrongType, "{err}");
    assert!(!exists(&server, "redmutex:{p}"), "a partial hold was left");
    let err = c.multi_lock(["ok", ""]).lock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(!exists(&server, "redmutex:{ok}"), "a partial hold was left");
}

/// The names of one hash tag: `{order:42}` for all of them.
const TAGGED: [&str; 3] = [
    "{order:42}:stock",
    "{order:42}:payment",
    "{order:42}:shipping",
];

fn key_of(name: &str) -> String {
    format!("redmutex:{{{name}}}")
}

#[test]
fn names_of_one_hash_tag_are_taken_in_one_round_trip() {
    let server = RedisServer::start();
    let c = Client::open(server.url()).unwrap();
    let other = Client::open(server.url()).unwrap();
    let multi = c.multi_lock(TAGGED);
    let before = c.stats().attempts;
    let all = multi.lock().unwrap();
    assert_eq!(
        c.stats().attempts - before,
        1,
        "one script for the three locks"
    );
    assert_eq!(all.guards().len(), 3);
    assert!(all.guards().iter().all(|g| g.fencing_token() > 0));
    for name in TAGGED {
        assert!(other.mutex(name).try_lock().unwrap().is_none(), "{name}");
    }
    all.unlock().unwrap();
    assert!(TAGGED.iter().all(|n| !exists(&server, &key_of(n))));
    // Re-entry: a thread that holds one of them takes the rest without the script.
    let held = c.mutex(TAGGED[1]).lock().unwrap();
    let all = multi
        .try_lock()
        .unwrap()
        .expect("free but for our own hold");
    drop(all);
    assert!(
        exists(&server, &key_of(TAGGED[1])),
        "the outer hold was released"
    );
    drop(held);
}

#[test]
fn a_held_name_of_the_tag_is_waited_for_and_nothing_is_left_behind() {
    let server = RedisServer::start();
    let c = Client::open(server.url()).unwrap();
    let other = Client::open(server.url()).unwrap();
    let multi = c.multi_lock(TAGGED);
    let order = multi.names();
    // The second in the order is held: the script takes the first, and stops there.
    let held = other.mutex(order[1]).lock().unwrap();
    assert!(multi.try_lock().unwrap().is_none());
    assert!(multi
        .try_lock_for(Duration::from_millis(300))
        .unwrap()
        .is_none());
    for name in [order[0], order[2]] {
        assert!(
            !exists(&server, &key_of(name)),
            "a partial hold of {name} was left"
        );
    }
    let waiter = std::thread::spawn(move || {
        let all = multi.try_lock_for(Duration::from_secs(30)).unwrap();
        all.map(|g| g.guards().len())
    });
    std::thread::sleep(Duration::from_millis(200));
    held.unlock().unwrap();
    assert_eq!(within(LIMIT, move || waiter.join().unwrap()), Some(3));
    assert!(TAGGED.iter().all(|n| !exists(&server, &key_of(n))));
}

#[test]
fn a_key_of_the_wrong_type_in_a_tag_takes_nothing() {
    let server = RedisServer::start();
    let c = Client::open(server.url()).unwrap();
    let multi = c.multi_lock(TAGGED);
    let last = multi.names()[2].to_owned();
    let _: () = redis::cmd("HSET")
        .arg(key_of(&last))
        .arg("f")
        .arg("v")
        .query(&mut server.conn())
        .unwrap();
    let err = multi.try_lock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WrongType, "{err}");
    // The two taken before it in the same script were given back by it.
    for name in &multi.names()[..2] {
        assert!(
            !exists(&server, &key_of(name)),
            "a partial hold of {name} was left"
        );
    }
    let kind: String = redis::cmd("TYPE")
        .arg(key_of(&last))
        .query(&mut server.conn())
        .unwrap();
    assert_eq!(kind, "hash");
}

#[test]
fn an_unlock_names_every_lock_that_was_lost() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let other = Client::open(server.url()).unwrap();
    let guard = client
        .multi_lock(["ledger", "payments", "refunds"])
        .lock()
        .unwrap();
    assert!(other.mutex("payments").force_unlock().unwrap());
    assert!(other.mutex("refunds").force_unlock().unwrap());
    let err = guard.unlock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    let text = err.to_string();
    assert!(
        text.contains("\"payments\"") && text.contains("\"refunds\""),
        "{text}"
    );
    assert!(!text.contains("\"ledger\""), "{text}");
    // The one still held was released.
    assert!(!client.mutex("ledger").is_locked().unwrap());
}
