//! Fencing tokens over the whole range of a Redis counter, on a real `redis-server`: exact and
//! strictly increasing above 2^53 (where Lua's numbers, doubles, are not exact) on every
//! primitive and on Redlock, and a counter that cannot grow is a clear error that leaves no
//! lock behind.

mod support;

use std::time::Duration;

use redmutex::{Client, ErrorKind, Redlock};
use support::{within, RedisServer};

/// 10^18: far above 2^53, where doubles are 128 apart.
const BIG: u64 = 1_000_000_000_000_000_000;
const LIMIT: Duration = Duration::from_secs(30);

fn set_counter(server: &RedisServer, name: &str, value: u64) {
    let _: () = redis::cmd("SET")
        .arg(format!("redmutex:{{{name}}}:fence"))
        .arg(value)
        .query(&mut server.conn())
        .unwrap();
}

fn counter(server: &RedisServer, name: &str) -> u64 {
    redis::cmd("GET")
        .arg(format!("redmutex:{{{name}}}:fence"))
        .query(&mut server.conn())
        .unwrap()
}

#[test]
fn tokens_above_2_to_the_53_are_exact_on_every_primitive() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();

    // Mutex: the first take is the acquire script, the later ones the plain commands (where
    // the server takes them), each token one above the last and equal to the counter.
    set_counter(&server, "m", BIG);
    let tokens: Vec<u64> = (0..4)
        .map(|_| {
            let g = client.mutex("m").lock().unwrap();
            g.fencing_token()
        })
        .collect();
    assert_eq!(tokens, [BIG + 1, BIG + 2, BIG + 3, BIG + 4]);
    assert_eq!(counter(&server, "m"), BIG + 4);

    // Shared<T>, RwLock's writers, MultiLock: each through its own acquire script.
    set_counter(&server, "s", BIG + 7);
    let shared = client.shared::<u64>("s");
    assert_eq!(shared.lock().unwrap().fencing_token(), BIG + 8);
    assert_eq!(shared.lock().unwrap().fencing_token(), BIG + 9);

    set_counter(&server, "w", BIG + 1);
    let rw = client.rwlock("w");
    assert_eq!(rw.write().unwrap().fencing_token(), BIG + 2);
    assert_eq!(rw.write().unwrap().fencing_token(), BIG + 3);

    set_counter(&server, "{tag}:a", BIG + 100);
    set_counter(&server, "{tag}:b", BIG + 200);
    let both = client.multi_lock(["{tag}:a", "{tag}:b"]);
    let g = both.lock().unwrap();
    let mut got: Vec<u64> = g.guards().iter().map(|g| g.fencing_token()).collect();
    got.sort_unstable();
    assert_eq!(got, [BIG + 101, BIG + 201]);
    drop(g);

    // FairMutex: taken by an attempt, then handed to a waiter by the release, whose
    // announcement carries the token as text.
    set_counter(&server, "f", BIG + 41);
    let fair = client.fair_mutex("f");
    let first = fair.lock().unwrap();
    assert_eq!(first.fencing_token(), BIG + 42);
    let other = Client::open(server.url()).unwrap();
    let waiter = std::thread::spawn(move || {
        other
            .fair_mutex("f")
            .try_lock_for(LIMIT)
            .unwrap()
            .map(|g| g.fencing_token())
    });
    assert!(support::eventually(LIMIT, || {
        redis::cmd("LLEN")
            .arg("redmutex:{f}:queue")
            .query::<i64>(&mut server.conn())
            .unwrap()
            >= 1
    }));
    drop(first);
    assert_eq!(waiter.join().unwrap(), Some(BIG + 43));
}

#[test]
fn redlock_tokens_above_2_to_the_53_are_exact_and_raised_exactly() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    // Counters 10^18 + 0, + 10, + 5: doubles cannot tell any of them apart.
    for (server, offset) in servers.iter().zip([0, 10, 5]) {
        set_counter(server, "r", BIG + offset);
    }
    let redlock = Redlock::new(servers.iter().map(|s| Client::open(s.url()).unwrap())).unwrap();
    let m = redlock.mutex("r");
    let g = m.lock().unwrap();
    let first = g.fencing_token();
    // The largest counter of the majority that took it: + 11 when all three answered, at
    // least + 6 when two did.
    assert!(first == BIG + 11 || first == BIG + 6, "{first}");
    drop(g);
    // Every instance that took it was raised to that token, exactly, so that the next
    // token is above it everywhere a majority can meet.
    let at_or_above = servers.iter().filter(|s| counter(s, "r") >= first).count();
    assert!(at_or_above >= 2, "counters not raised to {first}");
    let second = m.lock().unwrap().fencing_token();
    assert!(second > first, "{second} after {first}");
}

#[test]
fn a_counter_that_cannot_grow_is_a_clear_error_and_leaves_no_lock() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    set_counter(&server, "full", i64::MAX as u64);
    let m = client.mutex("full");
    let err = within(LIMIT, move || m.try_lock().map(|g| g.is_some())).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Server, "{err}");
    assert!(err.to_string().contains("overflow"), "{err}");
    assert!(
        !client.mutex("full").is_locked().unwrap(),
        "a lock was left"
    );
    assert_eq!(counter(&server, "full"), i64::MAX as u64);
}
