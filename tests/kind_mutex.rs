//! The Mutex against a real redis-server: exclusion, re-entry, release paths, timed acquires,
//! fencing tokens and bad input.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use redis::Commands;
use redmutex::{Client, ErrorKind};
use support::{within, RedisServer};

fn client(server: &RedisServer) -> Client {
    Client::builder()
        .backoff(Duration::from_millis(2), Duration::from_millis(50))
        .open(server.url())
        .expect("client")
}

#[test]
fn lock_and_release_leave_no_lock_key() {
    let server = RedisServer::start();
    let client = client(&server);
    let m = client.mutex("a");
    let g = m.lock().unwrap();
    assert!(m.is_locked().unwrap());
    let mut conn = server.conn();
    let value: String = conn.get("redmutex:{a}").unwrap();
    assert!(value.contains(':'), "token {value}");
    let ttl: i64 = conn.pttl("redmutex:{a}").unwrap();
    assert!(ttl > 0 && ttl <= 30_000, "ttl {ttl}");
    drop(g);
    assert!(!m.is_locked().unwrap());
    let exists: bool = conn.exists("redmutex:{a}").unwrap();
    assert!(!exists);
}

#[test]
fn another_thread_is_excluded_and_gets_it_after_release() {
    let server = RedisServer::start();
    let client = client(&server);
    let m = client.mutex("b");
    let g = m.lock().unwrap();
    let m2 = m.clone();
    let other = std::thread::spawn(move || {
        let attempt = m2.try_lock().unwrap().is_some();
        let later = m2.try_lock_for(Duration::from_secs(30)).unwrap();
        (attempt, later.is_some())
    });
    std::thread::sleep(Duration::from_millis(100));
    drop(g);
    let (first, later) = other.join().unwrap();
    assert!(!first, "another thread got a held lock");
    assert!(later, "another thread never got the released lock");
}

#[test]
fn reentry_counts_and_only_the_outermost_guard_releases() {
    let server = RedisServer::start();
    let client = client(&server);
    let m = client.mutex("re");
    let outer = m.lock().unwrap();
    let before = client.stats();
    let inner = m.lock().unwrap();
    let innermost = client.mutex("re").try_lock().unwrap().expect("re-entry");
    let after = client.stats();
    assert_eq!(
        after.attempts, before.attempts,
        "re-entry made a round trip"
    );
    assert_eq!(after.reentries, before.reentries + 2);
    assert_eq!(m.hold_count(), 3);
    assert_eq!(inner.fencing_token(), outer.fencing_token());
    assert_eq!(innermost.fencing_token(), outer.fencing_token());

    // Release out of order: the lock stays held until the last guard goes.
    drop(outer);
    assert_eq!(m.hold_count(), 2);
    assert!(m.is_locked().unwrap());
    innermost.unlock().unwrap();
    assert!(m.is_locked().unwrap());
    assert!(m.is_held_by_current_thread());
    drop(inner);
    assert_eq!(m.hold_count(), 0);
    assert!(!m.is_held_by_current_thread());
    assert!(!m.is_locked().unwrap());
}

#[test]
fn guards_release_from_drop_and_from_unlock() {
    let server = RedisServer::start();
    let client = client(&server);
    let m = client.mutex("rel");
    {
        let _g = m.lock().unwrap();
        assert!(m.is_locked().unwrap());
    }
    assert!(!m.is_locked().unwrap(), "drop did not release");
    let g = m.lock().unwrap();
    g.unlock().unwrap();
    assert!(!m.is_locked().unwrap(), "unlock did not release");
    let stats = client.stats();
    assert_eq!(stats.acquisitions, 2);
    assert_eq!(stats.releases, 2);
}

#[test]
fn different_clients_in_one_process_exclude_each_other() {
    let server = RedisServer::start();
    let a = client(&server);
    let b = client(&server);
    let _g = a.mutex("x").lock().unwrap();
    assert!(b.mutex("x").try_lock().unwrap().is_none());
    assert!(b.mutex("y").try_lock().unwrap().is_some());
}

#[test]
fn threads_of_one_process_are_mutually_exclusive() {
    let server = RedisServer::start();
    let client = client(&server);
    let inside = Arc::new(AtomicUsize::new(0));
    let total = Arc::new(AtomicUsize::new(0));
    let start = Arc::new(Barrier::new(8));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let m = client.mutex("shared");
            let (inside, total, start) = (inside.clone(), total.clone(), start.clone());
            std::thread::spawn(move || {
                start.wait();
                for _ in 0..20 {
                    let _g = m.lock().unwrap();
                    assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two holders");
                    std::thread::yield_now();
                    inside.fetch_sub(1, Ordering::SeqCst);
                    total.fetch_add(1, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(total.load(Ordering::SeqCst), 160);
    assert!(client.stats().contended > 0);
}

#[test]
fn try_lock_for_gives_up_within_its_deadline() {
    let server = RedisServer::start();
    let client = client(&server);
    let m = client.mutex("busy");
    let _g = m.lock().unwrap();
    let m2 = m.clone();
    let (got, waited) = within(Duration::from_secs(60), move || {
        let start = Instant::now();
        let got = m2.try_lock_for(Duration::from_millis(300)).unwrap();
        (got.is_some(), start.elapsed())
    });
    assert!(!got);
    assert!(
        waited >= Duration::from_millis(300),
        "gave up early: {waited:?}"
    );

    let m3 = m.clone();
    let got = within(Duration::from_secs(60), move || {
        let deadline = Instant::now() + Duration::from_millis(200);
        let got = m3.try_lock_until(deadline).unwrap().is_some();
        (got, Instant::now() >= deadline)
    });
    assert_eq!(got, (false, true));
}

#[test]
fn a_deadline_in_the_past_makes_one_attempt() {
    let server = RedisServer::start();
    let client = client(&server);
    let m = client.mutex("past");
    let past = Instant::now() - Duration::from_millis(1);
    let g = m.try_lock_until(past).unwrap();
    assert!(
        g.is_some(),
        "a free lock must be taken even with a past deadline"
    );
    let attempts = client.stats().attempts;
    let m2 = m.clone();
    std::thread::spawn(move || assert!(m2.try_lock_until(past).unwrap().is_none()))
        .join()
        .unwrap();
    assert_eq!(client.stats().attempts, attempts + 1);
}

#[test]
fn fencing_tokens_increase_across_clients() {
    let server = RedisServer::start();
    let a = client(&server);
    let b = client(&server);
    let mut last = 0;
    for i in 0..10 {
        let c = if i % 2 == 0 { &a } else { &b };
        let g = c.mutex("fenced").lock().unwrap();
        assert!(
            g.fencing_token() > last,
            "{} after {last}",
            g.fencing_token()
        );
        last = g.fencing_token();
    }
}

#[test]
fn fencing_tokens_do_not_go_back_after_data_loss() {
    let mut server = RedisServer::start();
    let client = client(&server);
    let first = client.mutex("f").lock().unwrap().fencing_token();
    let second = client.mutex("f").lock().unwrap().fencing_token();
    assert_eq!(second, first + 1);
    server.restart(); // no persistence: every key is gone
    let after = within(Duration::from_secs(60), move || {
        client.mutex("f").lock().map(|g| g.fencing_token())
    })
    .unwrap();
    assert!(after > second, "token went back from {second} to {after}");
}

/// The `SET`s Redis refused (a form it does not know among them) or that failed, from
/// `INFO commandstats` (Redis 6.2 and later count them).
fn refused_sets(server: &RedisServer) -> u64 {
    let stats = server
        .info_field("commandstats", "cmdstat_set")
        .unwrap_or_default();
    stats
        .split(',')
        .filter_map(|f| f.split_once('='))
        .filter(|(name, _)| *name == "rejected_calls" || *name == "failed_calls")
        .filter_map(|(_, n)| n.parse::<u64>().ok())
        .sum()
}

#[test]
fn a_server_that_refuses_the_plain_take_is_found_out_once_and_every_take_still_works() {
    let server = RedisServer::start();
    let client = client(&server);
    let m = client
        .mutex("versions")
        .with_fixed_lease(Duration::from_secs(300));
    // The scripts loaded (a first `EVALSHA` that Redis answers `NOSCRIPT` counts as a call).
    client.mutex("warm-up").lock().unwrap().unlock().unwrap();
    let scripts = server.command_calls("evalsha");
    let mut last = 0;
    for _ in 0..20 {
        let g = m.lock().unwrap();
        assert!(g.fencing_token() > last);
        last = g.fencing_token();
        g.unlock().unwrap();
    }
    // Redis 6.2 answers the plain take's `SET … NX … GET` with `ERR syntax error` once; every
    // later take on that server is the acquire script. Redis 7.0 and later, and Valkey, take
    // it plainly and refuse nothing.
    let refused = match support::server_version().redis_before(7, 0) {
        true => 1,
        false => 0,
    };
    assert_eq!(refused_sets(&server), refused, "refused SET commands");
    if refused == 1 {
        let calls = server.command_calls("evalsha") - scripts;
        assert_eq!(calls, 40, "20 takes and 20 releases");
    }
}

#[test]
fn a_lock_taken_before_is_taken_without_a_script_and_a_held_one_refused_with_one_trip() {
    if support::server_version().redis_before(7, 0) {
        eprintln!("skipped: Redis 6.2 refuses SET NX GET, so every take is a script there");
        return;
    }
    let server = RedisServer::start();
    let client = client(&server);
    // A fixed lease: no renewal runs a script meanwhile.
    let m = client
        .mutex("plain")
        .with_fixed_lease(Duration::from_secs(300));
    // The scripts loaded (a first `EVALSHA` that Redis answers `NOSCRIPT` counts as a call),
    // and the server found to take the plain commands (the first plain take sends the `SET`
    // alone, and leaves the fencing counter to the script).
    for _ in 0..2 {
        client.mutex("warm-up").lock().unwrap().unlock().unwrap();
    }
    let scripts = server.command_calls("evalsha");
    // The first take of a name starts its fencing counter from the server's clock: a script.
    let first = m.lock().unwrap();
    let first_token = first.fencing_token();
    assert_eq!(server.command_calls("evalsha"), scripts + 1);
    first.unlock().unwrap();
    assert_eq!(server.command_calls("evalsha"), scripts + 2);
    let (sets, incrs) = (server.command_calls("set"), server.command_calls("incr"));
    let g = m.lock().unwrap();
    assert!(g.fencing_token() > first_token);
    assert_eq!(
        server.command_calls("evalsha"),
        scripts + 2,
        "a lock whose counter this client saw started was taken with a script"
    );
    assert_eq!(server.command_calls("set"), sets + 1);
    assert_eq!(server.command_calls("incr"), incrs + 1);
    // Another thread finds it held: the `SET`'s reply tells it, in the one round trip (no
    // script, and no `PTTL`: a caller that gives up has no use for the time left).
    let pttls = server.command_calls("pttl");
    let sets = server.command_calls("set");
    let other = client.clone();
    let refused = std::thread::spawn(move || other.mutex("plain").try_lock().map(|g| g.is_none()))
        .join()
        .unwrap()
        .unwrap();
    assert!(refused, "a held lock was taken");
    assert_eq!(server.command_calls("evalsha"), scripts + 2);
    assert_eq!(server.command_calls("set"), sets + 1);
    assert_eq!(server.command_calls("pttl"), pttls);
    // The refused attempt counted on the fencing counter; the next holder's token is still
    // above every earlier one.
    g.unlock().unwrap();
    let after = m.lock().unwrap().fencing_token();
    assert!(after > first_token + 1, "{after} after {first_token}");
}

#[test]
fn a_counter_lost_since_the_client_saw_it_is_started_again_from_the_server_clock() {
    let server = RedisServer::start();
    let client = client(&server);
    let m = client.mutex("lost-counter");
    let before = m.lock().unwrap().fencing_token();
    let mut conn = server.conn();
    let _: () = conn.del("redmutex:{lost-counter}:fence").unwrap();
    let after = m.lock().unwrap().fencing_token();
    assert!(after > before, "token went back from {before} to {after}");
    // A counter that only refused attempts counted on is started as well.
    let _: () = conn.set("redmutex:{lost-counter}:fence", 7).unwrap();
    let again = m.lock().unwrap().fencing_token();
    assert!(again > after, "token went back from {after} to {again}");
}

#[test]
fn a_key_of_the_wrong_type_leaves_no_counter_behind_after_a_take_without_a_script() {
    let server = RedisServer::start();
    let client = client(&server);
    let m = client.mutex("replaced");
    drop(m.lock().unwrap());
    let mut conn = server.conn();
    // Someone else's data where the lock was, and the counter gone with Redis's data.
    let _: () = conn.del("redmutex:{replaced}:fence").unwrap();
    let _: () = conn.hset("redmutex:{replaced}", "f", "v").unwrap();
    let err = m.try_lock().unwrap_err();
    assert!(err.is_wrong_type(), "{err}");
    let err = m.try_lock_for(Duration::from_secs(5)).unwrap_err();
    assert!(err.is_wrong_type(), "{err}");
    let exists: bool = conn.exists("redmutex:{replaced}:fence").unwrap();
    assert!(!exists, "a fencing counter was left behind");
    let h: std::collections::HashMap<String, String> = conn.hgetall("redmutex:{replaced}").unwrap();
    assert_eq!(h.get("f").map(String::as_str), Some("v"));
}

#[test]
fn fixed_lease_expires_and_extend_keeps_it() {
    let server = RedisServer::start();
    let client = client(&server);
    let m = client
        .mutex("fixed")
        .with_fixed_lease(Duration::from_millis(300));
    let g = m.lock().unwrap();
    assert!(!g.is_lost());
    g.extend(Duration::from_secs(30)).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    assert!(!g.is_lost(), "extended lease reported lost");
    assert!(g.verify().unwrap() > Duration::from_secs(20));
    // `set_lease` replaces what remains, and may shorten it.
    g.set_lease(Duration::from_millis(200)).unwrap();
    assert!(support::eventually(Duration::from_secs(30), || g.is_lost()));
    // Someone else takes it; our guard must not release their lock.
    let other = client.clone();
    let theirs = std::thread::spawn(move || {
        let m = other.mutex("fixed");
        let g = m.lock().unwrap();
        let token = g.fencing_token();
        std::mem::forget(g); // keep it held in Redis
        token
    })
    .join()
    .unwrap();
    assert!(theirs > g.fencing_token());
    let err = g.unlock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockLost, "{err}");
    assert!(
        m.is_locked().unwrap(),
        "a stale guard released another holder's lock"
    );
}

#[test]
fn force_unlock_frees_the_lock_and_the_holder_finds_out() {
    let server = RedisServer::start();
    let client = client(&server);
    let m = client.mutex("forced");
    let g = m.lock().unwrap();
    assert!(m.force_unlock().unwrap());
    assert!(!m.force_unlock().unwrap());
    assert!(!m.is_locked().unwrap());
    assert!(g.verify().unwrap_err().is_lock_lost());
    assert!(g.is_lost());
    assert!(g.unlock().unwrap_err().is_lock_lost());
}

#[test]
fn wrong_type_keys_are_errors_not_waits_and_are_left_alone() {
    let server = RedisServer::start();
    let client = client(&server);
    let mut conn = server.conn();
    let _: () = conn.hset("redmutex:{h}", "f", "v").unwrap();
    let _: () = conn.rpush("redmutex:{l}", "v").unwrap();
    let _: () = conn.set("redmutex:{s}", "no expiry").unwrap();
    let _: () = conn.hset("redmutex:{fc}:fence", "f", "v").unwrap();
    let _: () = conn.set("redmutex:{fs}:fence", "not a number").unwrap();
    for name in ["h", "l", "s", "fc", "fs"] {
        let m = client.mutex(name);
        let err = within(Duration::from_secs(60), move || {
            m.try_lock_for(Duration::from_secs(5)).map(|g| g.is_some())
        })
        .unwrap_err();
        assert!(err.is_wrong_type(), "{name}: {err}");
    }
    let m = client.mutex("h");
    let err = within(Duration::from_secs(60), move || m.lock().map(drop)).unwrap_err();
    assert!(err.is_wrong_type(), "{err}");
    // Asking whether it is locked says the same as taking it.
    for name in ["h", "l"] {
        let err = client.mutex(name).is_locked().unwrap_err();
        assert!(err.is_wrong_type(), "{name}: {err}");
        let err = client.fair_mutex(name).is_locked().unwrap_err();
        assert!(err.is_wrong_type(), "fair {name}: {err}");
    }
    assert!(client.mutex("s").is_locked().unwrap());
    assert!(!client.mutex("free").is_locked().unwrap());
    assert!(client
        .mutex("h")
        .force_unlock()
        .unwrap_err()
        .is_wrong_type());
    // A fair lock reads the same keys: its acquire and release refuse them alike.
    for name in ["h", "l"] {
        let m = client.fair_mutex(name);
        let err = within(Duration::from_secs(60), move || {
            m.try_lock_for(Duration::from_secs(5)).map(|g| g.is_some())
        })
        .unwrap_err();
        assert!(err.is_wrong_type(), "fair {name}: {err}");
        assert!(
            err.to_string().contains("is not a lock"),
            "fair {name}: {err}"
        );
        let err = client.fair_mutex(name).force_unlock().unwrap_err();
        assert!(err.is_wrong_type(), "fair {name}: {err}");
    }
    // Nothing was changed or left behind.
    let h: std::collections::HashMap<String, String> = conn.hgetall("redmutex:{h}").unwrap();
    assert_eq!(h.get("f").map(String::as_str), Some("v"));
    let s: String = conn.get("redmutex:{s}").unwrap();
    assert_eq!(s, "no expiry");
    let fs: String = conn.get("redmutex:{fs}:fence").unwrap();
    assert_eq!(fs, "not a number");
    for name in ["fc", "fs"] {
        let exists: bool = conn.exists(format!("redmutex:{{{name}}}")).unwrap();
        assert!(!exists, "{name}: lock key left behind");
    }
}

#[test]
fn invalid_names_and_leases_are_rejected_before_any_round_trip() {
    let server = RedisServer::start();
    let client = client(&server);
    let long = "n".repeat(redmutex::MAX_NAME_LEN + 1);
    for m in [client.mutex(""), client.mutex(&long)] {
        assert!(m.lock().unwrap_err().is_invalid_argument());
        assert!(m.try_lock().unwrap_err().is_invalid_argument());
        assert!(m.is_locked().unwrap_err().is_invalid_argument());
        assert!(m.force_unlock().unwrap_err().is_invalid_argument());
        assert_eq!(m.hold_count(), 0);
    }
    for lease in [
        Duration::ZERO,
        Duration::from_micros(999),
        redmutex::MAX_LEASE * 2,
    ] {
        let m = client.mutex("lease").with_fixed_lease(lease);
        assert!(m.try_lock().unwrap_err().is_invalid_argument(), "{lease:?}");
    }
    let g = client.mutex("ok").lock().unwrap();
    assert!(g.extend(Duration::ZERO).unwrap_err().is_invalid_argument());
    assert_eq!(client.stats().attempts, 1);
    let keys: Vec<String> = server.conn().keys("*").unwrap();
    assert!(
        keys.iter()
            .all(|k| k.contains("{ok}") || k.starts_with("redmutex:client:")),
        "{keys:?}"
    );
}

#[test]
fn key_prefix_is_used() {
    let server = RedisServer::start();
    let client = Client::builder()
        .key_prefix("app:locks")
        .open(server.url())
        .unwrap();
    let _g = client.mutex("job").lock().unwrap();
    let exists: bool = server.conn().exists("app:locks:{job}").unwrap();
    assert!(exists);
}

#[test]
fn scripts_are_reloaded_after_script_flush() {
    let server = RedisServer::start();
    let client = client(&server);
    drop(client.mutex("sf").lock().unwrap());
    let _: () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut server.conn())
        .unwrap();
    let g = client.mutex("sf").lock().unwrap();
    g.unlock().unwrap();
}

#[test]
fn a_lock_kept_until_expiry_is_no_longer_renewed_and_frees_itself() {
    let server = RedisServer::start();
    let holder = Client::builder()
        .default_lease(Duration::from_secs(2))
        .renewal_interval(Duration::from_millis(300))
        .open(server.url())
        .unwrap();
    let other = Client::open(server.url()).unwrap();
    let g = holder.mutex("run-once").lock().unwrap();
    std::thread::sleep(Duration::from_millis(800)); // renewed meanwhile
    assert!(holder.stats().renewals >= 1);
    let left = g.keep_until_expiry().unwrap();
    assert!(
        left > Duration::ZERO && left <= Duration::from_secs(2),
        "{left:?}"
    );
    let kept_at = Instant::now();
    assert_eq!(holder.stats().renewed_leases, 0, "still renewed");
    // Nobody takes it before its lease is over, this thread included.
    assert!(other.mutex("run-once").try_lock().unwrap().is_none());
    assert!(holder.mutex("run-once").try_lock().unwrap().is_none());
    let pttl: i64 = server.conn().pttl("redmutex:{run-once}").unwrap();
    assert!(pttl > 0 && pttl <= 2000, "{pttl}");
    // Then it frees itself, and anyone (this thread too) takes it again.
    let again = within(Duration::from_secs(60), {
        let other = other.clone();
        move || other.mutex("run-once").lock().map(|g| g.fencing_token())
    });
    assert!(again.is_ok(), "{again:?}");
    assert!(
        kept_at.elapsed() + Duration::from_millis(200) >= left,
        "taken before it expired"
    );
    assert!(holder.mutex("run-once").lock().is_ok());
}
