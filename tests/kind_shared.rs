//! `Shared<T>` on a real `redis-server`: exact counts from 4 processes x 4 threads, a stale
//! holder's write refused, panics, checkpoints, writes only when changed, and bad input.

mod support;

use std::time::Duration;

use redmutex::{Client, Codec, ErrorKind};
use serde::{Deserialize, Serialize};
use support::{within, RedisServer};

const LIMIT: Duration = Duration::from_secs(120);
const ENTRY: &str = "shared_worker_entry";

/// A struct kept as one shared value.
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
struct Ledger {
    entries: u64,
    last_writer: String,
}

/// Add-ones per thread, on each of the two values.
const ADDS: u64 = 1_000;

/// The entry point of the worker processes; does nothing in a normal test run.
#[test]
fn shared_worker_entry() {
    let Some((role, url, arg)) = support::worker_role() else {
        return;
    };
    let client = Client::builder()
        .default_lease(Duration::from_secs(2))
        .renewal_interval(Duration::from_millis(300))
        .open(url.as_str())
        .unwrap();
    match role.as_str() {
        "adders" => {
            let threads: Vec<_> = (0..4)
                .map(|t| {
                    let count = client.shared::<u64>("count");
                    let ledger = client.shared::<Ledger>("ledger");
                    std::thread::spawn(move || {
                        for _ in 0..ADDS {
                            *count.lock().unwrap() += 1;
                            let mut l = ledger.lock().unwrap();
                            l.entries += 1;
                            l.last_writer = format!("{}/{t}", std::process::id());
                        }
                    })
                })
                .collect();
            for t in threads {
                t.join().unwrap();
            }
            println!("ADDED");
        }
        "stalled-holder" => {
            let value = client.shared::<u64>("stalled");
            let mut held = value.lock().unwrap();
            println!("LOCKED {}", held.fencing_token());
            // Wait for the word to go on (a file, made after this process was stopped and
            // resumed).
            let dir = std::path::Path::new(&arg);
            let go = dir.join("go");
            let started = std::time::Instant::now();
            while !go.exists() && started.elapsed() < LIMIT {
                std::thread::sleep(Duration::from_millis(20));
            }
            *held = 999;
            let outcome = match held.unlock() {
                Ok(()) => "Ok".to_owned(),
                Err(e) => format!("{:?}", e.kind()),
            };
            std::fs::write(dir.join("outcome"), outcome).unwrap();
        }
        other => panic!("unknown role {other} ({arg})"),
    }
}

fn client(server: &RedisServer) -> Client {
    Client::builder()
        .default_lease(Duration::from_secs(2))
        .renewal_interval(Duration::from_millis(300))
        .open(server.url())
        .unwrap()
}

fn raw_get(server: &RedisServer, key: &str) -> Option<Vec<u8>> {
    redis::cmd("GET")
        .arg(key)
        .query(&mut server.conn())
        .unwrap()
}

fn raw_set(server: &RedisServer, key: &str, value: &[u8]) {
    let _: () = redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query(&mut server.conn())
        .unwrap();
}

#[test]
fn four_processes_of_four_threads_add_exactly() {
    let server = RedisServer::start();
    let mut workers: Vec<_> = (0..4)
        .map(|_| support::spawn_worker(ENTRY, "adders", &server.url(), ""))
        .collect();
    for w in &mut workers {
        support::read_marker(w, "ADDED");
    }
    for mut w in workers {
        assert!(within(LIMIT, move || w.wait().unwrap()).success());
    }
    let c = client(&server);
    let total = 4 * 4 * ADDS;
    assert_eq!(*c.shared::<u64>("count").lock().unwrap(), total);
    let ledger = c.shared::<Ledger>("ledger").lock().unwrap();
    assert_eq!(ledger.entries, total);
    assert!(!ledger.last_writer.is_empty());
}

#[test]
fn a_stalled_holders_write_is_refused_and_the_newer_value_stays() {
    let server = RedisServer::start();
    let c = client(&server);
    *c.shared::<u64>("stalled").lock().unwrap() = 1;
    let dir = support::scratch_dir("shared-stalled");
    let mut stalled = support::spawn_worker(
        ENTRY,
        "stalled-holder",
        &server.url(),
        dir.to_str().unwrap(),
    );
    let first_token: u64 = support::read_marker(&mut stalled, "LOCKED")
        .parse()
        .unwrap();
    let pid = stalled.id() as libc::pid_t;
    // Stopped past its 2 s lease: nothing renews it.
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let value = c.shared::<u64>("stalled");
    let mut newer = value
        .try_lock_for(Duration::from_secs(30))
        .unwrap()
        .expect("the stalled holder's lease did not run out");
    assert!(newer.fencing_token() > first_token);
    assert_eq!(*newer, 1);
    *newer = 7;
    newer.unlock().unwrap();
    unsafe { libc::kill(pid, libc::SIGCONT) };
    std::fs::write(dir.join("go"), b"go").unwrap();
    assert!(within(LIMIT, move || stalled.wait().unwrap()).success());
    let outcome = std::fs::read_to_string(dir.join("outcome")).unwrap();
    assert_eq!(outcome, "LockLost");
    assert_eq!(
        *value.lock().unwrap(),
        7,
        "the stale holder's write was applied"
    );
}

/// A lease seen lost writes nothing, even while Redis still holds the holder's token: a
/// renewal's reply held by a proxy past the lease (the server renewed on time) marks the
/// lease lost; `unlock()` then says `LockLost`, as `is_lost()` did, and the value stays as it
/// was, while the lock is released.
#[test]
fn a_lease_seen_lost_writes_nothing_though_the_token_is_still_in_redis() {
    let server = RedisServer::start();
    let plain = client(&server);
    *plain.shared::<u64>("seen-lost").lock().unwrap() = 5;
    let proxy = support::delay_proxy::DelayProxy::start(server.port());
    let c = Client::builder()
        .default_lease(Duration::from_millis(1000))
        .renewal_interval(Duration::from_millis(450))
        .response_timeout(Duration::from_secs(20))
        .open(proxy.url())
        .unwrap();
    let mut g = c.shared::<u64>("seen-lost").lock().unwrap();
    *g += 1;
    assert!(support::eventually(Duration::from_secs(20), || c
        .stats()
        .renewals
        >= 1));
    proxy.hold_replies(Duration::from_millis(700));
    assert!(support::eventually(Duration::from_secs(20), || g.is_lost()));
    proxy.hold_replies(Duration::ZERO);
    let holder = raw_get(&server, "redmutex:{seen-lost}");
    assert!(holder.is_some(), "the lock ran out in Redis too");
    let err = g.unlock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    assert_eq!(
        raw_get(&server, "redmutex:{seen-lost}"),
        None,
        "the lock was not released"
    );
    assert_eq!(
        *plain.shared::<u64>("seen-lost").lock().unwrap(),
        5,
        "a lease seen lost wrote its value"
    );
}

/// A release whose reply is lost (its connection closed after Redis ran it) is sent again;
/// the second finds the lock free, and tells by the value's version that the write was its
/// own: `unlock()` says it was written, and it was, once.
#[test]
fn a_release_whose_reply_was_lost_knows_its_write_was_made() {
    let server = RedisServer::start();
    let proxy = support::delay_proxy::DelayProxy::start(server.port());
    let c = Client::builder()
        .default_lease(Duration::from_secs(60))
        .open(proxy.url())
        .unwrap();
    let counter = c.shared::<u64>("reply-lost");
    *counter.lock().unwrap() = 1;
    let mut g = counter.lock().unwrap();
    *g += 1;
    proxy.cut_next_reply();
    g.unlock()
        .expect("the write was made, and the release knows it");
    assert_eq!(raw_get(&server, "redmutex:{reply-lost}"), None);
    assert_eq!(
        *client(&server).shared::<u64>("reply-lost").lock().unwrap(),
        2
    );
}

#[test]
fn a_panic_while_holding_writes_nothing_and_poisons() {
    let server = RedisServer::start();
    let c = client(&server);
    let value = c.shared::<u64>("panicky");
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
    assert!(g.clear_poison().unwrap());
}

#[test]
fn commit_writes_now_and_keeps_holding() {
    let server = RedisServer::start();
    let c = client(&server);
    let value = c.shared::<u64>("checkpoint").with_codec(Codec::Json);
    let mut g = value.lock().unwrap();
    *g = 41;
    g.commit().unwrap();
    assert_eq!(
        raw_get(&server, "redmutex:{checkpoint}:value").as_deref(),
        Some(&b"json:41"[..])
    );
    let other = client(&server);
    assert!(other
        .shared::<u64>("checkpoint")
        .with_codec(Codec::Json)
        .try_lock()
        .unwrap()
        .is_none());
    *g += 1;
    // Taken away while held: the checkpoint is refused, and so is the release's write.
    assert!(other.mutex("checkpoint").force_unlock().unwrap());
    let err = g.commit().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    let err = g.unlock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    assert_eq!(*value.lock().unwrap(), 41);
}

#[test]
fn a_shared_guard_offers_the_lease_methods_of_a_mutex_guard() {
    let server = RedisServer::start();
    let c = client(&server);
    let value = c
        .shared::<u64>("leased")
        .with_fixed_lease(Duration::from_secs(5));
    let mut g = value.lock().unwrap();
    let watch = g.lease_watch();
    assert!(!watch.is_lost());
    let left = g.verify().unwrap();
    assert!(left <= Duration::from_secs(5), "{left:?}");
    g.extend(Duration::from_secs(100)).unwrap();
    assert!(g.verify().unwrap() > Duration::from_secs(60));
    g.set_lease(Duration::from_secs(30)).unwrap();
    let left = g.verify().unwrap();
    assert!(left <= Duration::from_secs(30), "{left:?}");
    *g = 7;
    // Taken away: verify and extend say so, and the watch wakes.
    assert!(client(&server).mutex("leased").force_unlock().unwrap());
    assert!(g.verify().unwrap_err().is_lock_lost());
    assert!(g.extend(Duration::from_secs(1)).unwrap_err().is_lock_lost());
    assert!(watch.wait_timeout(Duration::from_secs(30)));
    assert!(g.unlock().unwrap_err().is_lock_lost());
}

#[test]
fn the_value_is_written_only_when_it_changed() {
    let server = RedisServer::start();
    let c = client(&server);
    let value = c.shared::<Ledger>("sparse");
    // The server found to take the plain commands (the first plain take on a server sends
    // the `SET` alone, and leaves the rest to the script, which sets the lock again).
    for _ in 0..2 {
        c.shared::<Ledger>("warm-up")
            .lock()
            .unwrap()
            .unlock()
            .unwrap();
    }
    {
        let mut g = value.lock().unwrap();
        g.entries = 3;
    }
    let writes = || (server.command_calls("set"), server.command_calls("mset"));
    // A lock that only reads writes nothing: its acquire's SET NX is the only SET.
    let before = writes();
    assert_eq!(value.lock().unwrap().entries, 3);
    assert_eq!((writes().0 - before.0, writes().1 - before.1), (1, 0));
    // Mutably borrowed, but the same bytes: nothing written either.
    let before = writes();
    {
        let mut g = value.lock().unwrap();
        g.entries += 0;
    }
    assert_eq!((writes().0 - before.0, writes().1 - before.1), (1, 0));
    // Changed: written with the release, with its version (the writer's fencing token), in
    // one MSET.
    let before = writes();
    value.lock().unwrap().entries = 4;
    assert_eq!((writes().0 - before.0, writes().1 - before.1), (1, 1));
    assert_eq!(value.lock().unwrap().entries, 4);
}

#[test]
fn a_second_lock_on_the_same_thread_is_refused_at_once() {
    let server = RedisServer::start();
    let c = client(&server);
    let value = c.shared::<u64>("once");
    let g = value.lock().unwrap();
    let err = value.try_lock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    drop(g);
    // A Mutex of the same name is the same lock.
    let m = c.mutex("once").lock().unwrap();
    let err = value.lock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(client(&server)
        .shared::<u64>("once")
        .try_lock()
        .unwrap()
        .is_none());
    drop(m);
    assert!(value.try_lock().unwrap().is_some());
}

#[test]
fn a_missing_value_is_the_default_the_initial_value_or_an_error() {
    let server = RedisServer::start();
    let c = client(&server);
    assert_eq!(*c.shared::<u64>("fresh").lock().unwrap(), 0);
    assert_eq!(*c.shared_or("fresh", 100u64).lock().unwrap(), 100);
    // Nothing was written by locks that only read.
    assert_eq!(raw_get(&server, "redmutex:{fresh}:value"), None);
    let err = c.shared_existing::<u64>("fresh").lock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NoValue, "{err}");
    // Released at once.
    assert!(c.mutex("fresh").try_lock().unwrap().is_some());
    *c.shared_or("fresh", 100u64).lock().unwrap() -= 1;
    assert_eq!(*c.shared_existing::<u64>("fresh").lock().unwrap(), 99);
    // Removed with the release: gone, and the lock free.
    c.shared::<u64>("fresh").lock().unwrap().remove().unwrap();
    assert_eq!(raw_get(&server, "redmutex:{fresh}:value"), None);
    // What stays (the fencing counter, the removal's version) does not make a name in use.
    assert!(raw_get(&server, "redmutex:{fresh}:value-fence").is_some());
    assert_eq!(c.lock_names("fresh").unwrap(), Vec::<String>::new());
    let err = c.shared_existing::<u64>("fresh").lock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NoValue, "{err}");
}

#[test]
fn bad_stored_values_are_typed_errors_and_nothing_is_overwritten() {
    let server = RedisServer::start();
    let c = client(&server);
    // Not decodable into the type.
    *c.shared::<String>("typed").lock().unwrap() = "not a number".into();
    let stored = raw_get(&server, "redmutex:{typed}:value");
    let err = c.shared::<u64>("typed").lock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Decode, "{err}");
    assert!(
        c.mutex("typed").try_lock().unwrap().is_some(),
        "lock left held"
    );
    assert_eq!(raw_get(&server, "redmutex:{typed}:value"), stored);
    // Written with another codec.
    let err = c
        .shared::<String>("typed")
        .with_codec(Codec::Json)
        .lock()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Decode, "{err}");
    assert!(err.to_string().contains("MessagePack"), "{err}");
    // Not written by this crate.
    raw_set(&server, "redmutex:{raw}:value", b"hello");
    let err = c.shared::<String>("raw").lock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Decode, "{err}");
    assert_eq!(raw_get(&server, "redmutex:{raw}:value").unwrap(), b"hello");
    // A key of the wrong type.
    let _: () = redis::cmd("HSET")
        .arg("redmutex:{hash}:value")
        .arg("f")
        .arg("v")
        .query(&mut server.conn())
        .unwrap();
    let err = c.shared::<u64>("hash").lock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WrongType, "{err}");
    assert!(
        c.mutex("hash").try_lock().unwrap().is_some(),
        "lock left held"
    );
}

#[test]
fn a_value_over_the_limit_is_refused_before_it_is_sent() {
    let server = RedisServer::start();
    let c = client(&server);
    let value = c.shared::<Vec<u8>>("big");
    value.lock().unwrap().push(1);
    let mut g = value.lock().unwrap();
    g.resize(redmutex::MAX_VALUE_LEN + 1, 7);
    let err = g.commit().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let err = g.unlock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    // Released without writing.
    assert_eq!(*value.try_lock().unwrap().expect("left held"), vec![1]);
}

/// A value of megabytes comes back whole, by a lock and by `get`, many reads of the socket
/// each, and the connection reads small replies as before afterwards.
#[test]
fn a_value_of_megabytes_is_written_and_read_back_whole() {
    let server = RedisServer::start();
    let c = Client::builder()
        .pool_size(1)
        .default_lease(Duration::from_secs(2))
        .renewal_interval(Duration::from_millis(300))
        .open(server.url())
        .unwrap();
    let value = c.shared::<Vec<u8>>("megabytes");
    let bytes: Vec<u8> = (0..5 * 1024 * 1024 + 7).map(|i| (i % 251) as u8).collect();
    *value.lock().unwrap() = bytes.clone();
    for _ in 0..3 {
        let g = value.lock().unwrap();
        assert!(*g == bytes, "the value read back under the lock differs");
        g.unlock().unwrap();
    }
    assert!(
        value.get().unwrap() == bytes,
        "the value read by get differs"
    );
    let small = c.shared::<u64>("small");
    for n in 1..=100 {
        *small.lock().unwrap() += 1;
        assert_eq!(small.get().unwrap(), n);
    }
    let stored = raw_get(&server, "redmutex:{megabytes}:value").expect("stored");
    assert!(stored.len() > bytes.len(), "{} bytes stored", stored.len());
}

#[test]
fn a_value_taken_before_comes_with_plain_commands_and_stays_the_latest() {
    if support::server_version().redis_before(7, 0) {
        eprintln!("skipped: Redis 6.2 refuses SET NX GET, so every take is a script there");
        return;
    }
    let server = RedisServer::start();
    let (c, other) = (client(&server), client(&server));
    // A fixed lease: no renewal runs a script meanwhile.
    let lease = Duration::from_secs(300);
    let value = c.shared::<u64>("plain").with_fixed_lease(lease);
    // The scripts loaded, the server found to take the plain commands, and the name's
    // fencing counter seen started by this client (its first take is the script).
    for _ in 0..2 {
        c.shared::<u64>("warm-up").lock().unwrap().unlock().unwrap();
    }
    *value.lock().unwrap() = 7;
    // Each release below is read before the next count (`unlock`, not a drop, whose release
    // may still be on its way).
    let taken_plainly = |expected: u64| {
        let scripts = server.command_calls("evalsha");
        let g = value.lock().unwrap();
        assert_eq!(
            server.command_calls("evalsha"),
            scripts,
            "a value whose lock this client took before was taken with a script"
        );
        assert_eq!(*g, expected);
        g.unlock().unwrap();
    };
    taken_plainly(7);
    // Another client's write is what the next plain take reads.
    let mut g = other.shared::<u64>("plain").lock().unwrap();
    *g = 9;
    g.unlock().unwrap();
    taken_plainly(9);
    // As is its removal.
    other
        .shared::<u64>("plain")
        .lock()
        .unwrap()
        .remove()
        .unwrap();
    let existing = c.shared_existing::<u64>("plain").with_fixed_lease(lease);
    let err = existing.lock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NoValue, "{err}");
    // Its release read: the lock is free again.
    other.mutex("plain").lock().unwrap().unlock().unwrap();
    taken_plainly(0);
    // A key of the wrong type found by the plain commands: the lock is given back at once,
    // and the script tells the error.
    let _: () = redis::cmd("HSET")
        .arg("redmutex:{plain}:value")
        .arg("f")
        .arg("v")
        .query(&mut server.conn())
        .unwrap();
    let err = value.lock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::WrongType, "{err}");
    assert!(
        other.mutex("plain").try_lock().unwrap().is_some(),
        "lock left held"
    );
}
