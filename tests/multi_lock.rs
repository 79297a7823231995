//! `MultiLock` on a real `redis-server`: all or nothing, no deadlock between overlapping sets
//! taken in opposite orders, exclusion against plain `Mutex`es, and bad input.

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
    let multi = c.multi_lock(["c", "a", "b"]).unwrap();
    assert_eq!(multi.names(), ["a", "b", "c"]);
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
                let multi = c.multi_lock(names).unwrap();
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
    let both = c.multi_lock(["m1", "m2"]).unwrap().lock().unwrap();
    assert!(other.mutex("m2").try_lock().unwrap().is_none());
    both.unlock().unwrap();
    let m1 = other.mutex("m1").lock().unwrap();
    assert!(c
        .multi_lock(["m1", "m2"])
        .unwrap()
        .try_lock()
        .unwrap()
        .is_none());
    drop(m1);
    assert!(c
        .multi_lock(["m1", "m2"])
        .unwrap()
        .try_lock()
        .unwrap()
        .is_some());
}

#[test]
fn bad_input_is_a_clear_error_and_takes_nothing() {
    let server = RedisServer::start();
    let c = Client::open(server.url()).unwrap();
    let none: [&str; 0] = [];
    let err = c.multi_lock(none).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let err = c.multi_lock(["a", "b", "a"]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let _: () = redis::cmd("HSET")
        .arg("redmutex:{q}")
        .arg("f")
        .arg("v")
        .query(&mut server.conn())
        .unwrap();
    let err = c.multi_lock(["p", "q"]).unwrap().try_lock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WrongType, "{err}");
    assert!(!exists(&server, "redmutex:{p}"), "a partial hold was left");
    let err = c.multi_lock(["ok", ""]).unwrap().lock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(!exists(&server, "redmutex:{ok}"), "a partial hold was left");
}
