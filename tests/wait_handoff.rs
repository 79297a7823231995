//! Mutex hand-offs: a release names the client that has waited longest, and only that
//! client's leading waiter attempts; a client whose threads keep waiting keeps its place; a
//! client that gave up or died does not hold the others up for longer than the re-check of the
//! next in line. Within
//! one client, the lock is passed from thread to thread (at most a round trip each, a new
//! fencing token each), a bounded run at a time while other clients wait.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use redis::Commands;
use redmutex::Client;
use support::{eventually, RedisServer};

const LIMIT: Duration = Duration::from_secs(60);

fn client(server: &RedisServer) -> Client {
    Client::open(server.url()).unwrap()
}

/// The lock's waiting clients in Redis, first named first.
fn waiting_clients(server: &RedisServer, name: &str) -> Vec<String> {
    server
        .conn()
        .zrange(format!("redmutex:{{{name}}}:waiting"), 0, -1)
        .unwrap()
}

/// Starts a thread of `client` that waits for `name` and records `label` when it gets it.
fn waiter(
    client: &Client,
    name: &str,
    label: &'static str,
    order: &Arc<StdMutex<Vec<&'static str>>>,
) -> std::thread::JoinHandle<()> {
    let (m, order) = (client.mutex(name), Arc::clone(order));
    std::thread::spawn(move || {
        let g = m.try_lock_for(LIMIT).unwrap().expect("acquired");
        order.lock().unwrap().push(label);
        g.unlock().unwrap();
    })
}

#[test]
fn a_release_wakes_one_waiting_client_and_clients_take_turns_in_the_order_they_came() {
    let server = RedisServer::start();
    let holder = client(&server);
    let clients: Vec<Client> = (0..3).map(|_| client(&server)).collect();
    let order = Arc::new(StdMutex::new(Vec::new()));
    let g = holder.mutex("turns").lock().unwrap();
    let mut threads = Vec::new();
    for (c, label) in clients.iter().zip(["first", "second", "third"]) {
        threads.push(waiter(c, "turns", label, &order));
        // A new client attempts, subscribes, and attempts again so as to miss no release.
        assert!(eventually(LIMIT, || c.stats().attempts == 2));
        let n = threads.len();
        assert!(eventually(LIMIT, || waiting_clients(&server, "turns")
            .len()
            == n));
        // Clients are ordered by the hold during which they began to wait (those of one hold
        // in no particular order): as if the lock had changed hands before the next came.
        let _: i64 = server.conn().incr("redmutex:{turns}:fence", 1).unwrap();
    }
    g.unlock().unwrap();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), ["first", "second", "third"]);
    // Two attempts to wait, each, and the lock handed over by the release that named the
    // client (no attempt): no client attempted when another was named. And each heard one
    // announcement, its own: a release that names a client wakes no other (each listens on a
    // channel of its own).
    for c in &clients {
        assert_eq!(c.stats().attempts, 2, "{:?}", c.stats());
        assert_eq!(c.stats().handed_over, 1, "{:?}", c.stats());
        assert_eq!(c.stats().notifications, 1, "{:?}", c.stats());
    }
    assert!(waiting_clients(&server, "turns").is_empty());
}

#[test]
fn threads_of_one_client_take_turns_without_failed_attempts() {
    let server = RedisServer::start();
    let a = client(&server);
    let b = client(&server);
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = [&a, &a, &a, &a, &b, &b, &b, &b]
        .into_iter()
        .map(|c| {
            let (m, stop) = (c.mutex("busy"), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut taken = 0;
                while !stop.load(Ordering::Relaxed) || taken < 20 {
                    let g = m.try_lock_for(LIMIT).unwrap().expect("acquired");
                    std::thread::sleep(Duration::from_micros(fastrand::u64(0..1_500)));
                    g.unlock().unwrap();
                    taken += 1;
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    for c in [&a, &b] {
        let s = c.stats();
        // A lock passed on within the client took no attempt.
        let failed = s.attempts - (s.acquisitions - s.passed_on);
        // With every waiting thread of both clients attempting at each release, this was
        // more than one failed attempt per acquisition.
        assert!(
            failed * 4 <= s.acquisitions,
            "{failed} failed attempts for {} acquisitions",
            s.acquisitions
        );
        // Threads of one client pass the lock among themselves, a bounded run at a time.
        assert!(s.passed_on > 0, "{s:?}");
        assert!(s.passed_on < s.acquisitions, "{s:?}");
    }
}

#[test]
fn a_release_looks_at_its_clients_place_only_when_the_hold_came_after_a_wait() {
    let server = RedisServer::start();
    let (a, b) = (client(&server), client(&server));
    // The scripts loaded, the counter started, the server's form of `SET` known.
    for _ in 0..2 {
        a.mutex("place").lock().unwrap().unlock().unwrap();
    }
    let looks = server.command_calls("zscore");
    for _ in 0..10 {
        a.mutex("place").lock().unwrap().unlock().unwrap();
    }
    // Won at once, with no other thread of the client coming: the client has no place.
    assert_eq!(server.command_calls("zscore"), looks);
    // Won after a wait: the release gives up whatever place the waiting left.
    let g = b.mutex("place").lock().unwrap();
    let m = a.mutex("place");
    let t = std::thread::spawn(move || m.lock().map(|g| g.unlock()));
    assert!(eventually(LIMIT, || waiting_clients(&server, "place")
        .len()
        == 1));
    g.unlock().unwrap();
    t.join().unwrap().unwrap().unwrap();
    assert_eq!(server.command_calls("zscore"), looks + 1);
    assert!(waiting_clients(&server, "place").is_empty());
}

#[test]
fn a_hold_won_at_a_recheck_gives_its_place_up_and_names_the_next_client() {
    let server = RedisServer::start();
    let holder = client(&server);
    // `early` re-checks every second; `late` only every 20 s, so only a release that names
    // it wakes it sooner.
    let early = Client::builder()
        .renewal_interval(Duration::from_secs(1))
        .open(server.url())
        .unwrap();
    let late = Client::builder()
        .default_lease(Duration::from_secs(60))
        .renewal_interval(Duration::from_secs(20))
        .open(server.url())
        .unwrap();
    let g = holder.mutex("recheck").lock().unwrap();
    let m = early.mutex("recheck");
    let first = std::thread::spawn(move || m.lock().map(|g| g.unlock()));
    assert!(eventually(LIMIT, || waiting_clients(&server, "recheck")
        .len()
        == 1));
    let early_id = waiting_clients(&server, "recheck")[0].clone();
    let m = late.mutex("recheck");
    let second = std::thread::spawn(move || {
        let got = m.lock();
        (std::time::Instant::now(), got.map(|g| g.unlock()))
    });
    assert!(eventually(LIMIT, || waiting_clients(&server, "recheck")
        .len()
        == 2));
    // `early` first in line (both began to wait during the same hold), and the hold lost
    // without a release: nobody is named, and `early` takes the lock at its re-check.
    let waiting = "redmutex:{recheck}:waiting";
    let _: i64 = server.conn().zadd(waiting, &early_id, 0).unwrap();
    let _: i64 = server.conn().del("redmutex:{recheck}").unwrap();
    first.join().unwrap().unwrap().unwrap();
    let released = std::time::Instant::now();
    // Its release gave up its place and named `late`, which did not wait for its re-check.
    let (acquired, got) = second.join().unwrap();
    got.unwrap().unwrap();
    let after = acquired.saturating_duration_since(released);
    assert!(after < Duration::from_secs(10), "named after {after:?}");
    assert!(waiting_clients(&server, "recheck").is_empty());
    drop(g);
}

#[test]
fn a_client_whose_waiter_gave_up_leaves_the_waiting_clients() {
    let server = RedisServer::start();
    let holder = client(&server);
    let quitter = client(&server);
    let g = holder.mutex("quit").lock().unwrap();
    assert!(quitter
        .mutex("quit")
        .try_lock_for(Duration::from_millis(300))
        .unwrap()
        .is_none());
    assert!(waiting_clients(&server, "quit").is_empty());
    g.unlock().unwrap();
}

#[test]
fn a_named_client_that_died_holds_the_next_up_for_its_recheck_only() {
    if let Some((role, url, _)) = support::worker_role() {
        if role == "wait-forever" {
            let client = Client::open(url).unwrap();
            println!("WAITING");
            let _ = client.mutex("dead").try_lock_for(Duration::from_secs(600));
        }
        return;
    }
    let server = RedisServer::start();
    let holder = client(&server);
    let g = holder.mutex("dead").lock().unwrap();
    let mut doomed = support::spawn_worker(
        "a_named_client_that_died_holds_the_next_up_for_its_recheck_only",
        "wait-forever",
        &server.url(),
        "",
    );
    support::read_marker(&mut doomed, "WAITING");
    assert!(eventually(LIMIT, || waiting_clients(&server, "dead").len() == 1));
    // A client that re-checks every second waits behind it.
    let survivor = Client::builder()
        .renewal_interval(Duration::from_secs(1))
        .open(server.url())
        .unwrap();
    let order = Arc::new(StdMutex::new(Vec::new()));
    let t = waiter(&survivor, "dead", "survivor", &order);
    assert!(eventually(LIMIT, || waiting_clients(&server, "dead").len() == 2));
    // The first in line dies, and the release names it.
    doomed.kill().unwrap();
    doomed.wait().unwrap();
    g.unlock().unwrap();
    // The survivor takes the lock at its next re-check (every 2 s: one client ahead of it),
    // long before the holder's 30 s lease would have passed.
    let started = std::time::Instant::now();
    t.join().unwrap();
    assert_eq!(*order.lock().unwrap(), ["survivor"]);
    assert!(started.elapsed() < Duration::from_secs(15));
}

#[test]
fn a_waiters_flag_left_by_an_earlier_version_is_replaced_and_its_waiters_are_woken() {
    let server = RedisServer::start();
    let (holder, waiting) = (client(&server), "redmutex:{upgrade}:waiting");
    let channel = "redmutex:{upgrade}:ch";
    let mut conn = server.conn();
    // A waiter of an earlier version: its flag (a string), and its subscription, which takes
    // any message as a release.
    let g = holder.mutex("upgrade").lock().unwrap();
    let _: () = redis::cmd("SET")
        .arg(waiting)
        .arg("1")
        .arg("PX")
        .arg(30_000)
        .query(&mut conn)
        .unwrap();
    // Sharded pub/sub where the server has it (Redis 7.0 and later), classic before.
    let (subscribe, numsub) = match support::server_version().redis_before(7, 0) {
        true => ("SUBSCRIBE", "NUMSUB"),
        false => ("SSUBSCRIBE", "SHARDNUMSUB"),
    };
    let mut old = std::process::Command::new("redis-cli")
        .args(["-p", &server.port().to_string(), subscribe, channel])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    assert!(eventually(LIMIT, || {
        let n: (String, u64) = redis::cmd("PUBSUB")
            .arg(numsub)
            .arg(channel)
            .query(&mut server.conn())
            .unwrap();
        n.1 == 1
    }));
    g.unlock().unwrap();
    // The release found the flag, removed it, and woke the earlier version's waiter.
    support::read_marker(&mut old, "released");
    let _ = old.kill();
    let _ = old.wait();
    let exists: bool = conn.exists(waiting).unwrap();
    assert!(!exists);

    // A flag left while a waiter of this version waits is replaced by its next attempt.
    let g = holder.mutex("upgrade").lock().unwrap();
    let _: () = conn.set(waiting, "1").unwrap();
    let order = Arc::new(StdMutex::new(Vec::new()));
    let newer = client(&server);
    let t = waiter(&newer, "upgrade", "new", &order);
    assert!(eventually(LIMIT, || {
        let kind: String = redis::cmd("TYPE").arg(waiting).query(&mut conn).unwrap();
        kind == "zset"
    }));
    g.unlock().unwrap();
    t.join().unwrap();
    assert_eq!(*order.lock().unwrap(), ["new"]);
}

/// Threads of one client that take turns: every hand-off but the first of each run is passed
/// on without a release, at most one script call per pass, and every holder has a fencing
/// token above the one before.
#[test]
fn threads_of_one_client_pass_the_lock_on_with_growing_tokens() {
    let server = RedisServer::start();
    let a = client(&server);
    drop(a.mutex("relay").lock().unwrap()); // scripts loaded, counter seeded
    let tokens = Arc::new(StdMutex::new(Vec::new()));
    let before_scripts = server.command_calls("evalsha");
    let before = a.stats();
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let (m, tokens) = (a.mutex("relay"), Arc::clone(&tokens));
            std::thread::spawn(move || {
                for _ in 0..200 {
                    let g = m.try_lock_for(LIMIT).unwrap().expect("acquired");
                    tokens.lock().unwrap().push(g.fencing_token());
                    drop(g);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let tokens = tokens.lock().unwrap();
    assert_eq!(tokens.len(), 400);
    assert!(
        tokens.windows(2).all(|w| w[1] > w[0]),
        "fencing tokens did not grow from holder to holder"
    );
    let s = a.stats();
    let passed = s.passed_on - before.passed_on;
    assert!(
        passed >= 100,
        "only {passed} of 400 holds were passed on: {s:?}"
    );
    // A pass that asks Redis reserves tokens for the next ones, which need no round trip
    // (a hold that was not passed on costs a release and at most two acquire scripts: one
    // that found the lock held, one that took it; Redis 6.2 takes every lock with a script).
    let scripts = server.command_calls("evalsha") - before_scripts;
    assert!(
        scripts <= 3 * (400 - passed) + passed / 4,
        "{scripts} script calls for 400 holds of which {passed} were passed on"
    );
}

/// A hold passed to a thread whose handle asks for a lease of another length gets that lease
/// in Redis, also on a pass that needs no round trip (a renewal never shortens a lease, so it
/// must be set at the pass). Three threads: the first holds, the second (the client's lease)
/// takes it in a pass through Redis, the third (a short lease) from the second.
#[test]
fn a_hold_passed_to_a_handle_with_a_shorter_lease_gets_that_lease() {
    let server = RedisServer::start();
    let a = client(&server);
    let short = Duration::from_millis(1500);
    let left = |c: &Client| {
        c.lock_info("relay")
            .unwrap()
            .holder
            .and_then(|h| h.lease_left)
            .expect("a lease")
    };
    let held = a.mutex("relay").lock().unwrap();
    let second = a.mutex("relay");
    let (passed, inspect) = (a.clone(), a.clone());
    let second = std::thread::spawn(move || {
        let g = second.try_lock_for(LIMIT).unwrap().expect("acquired");
        // Hold until the third waits too.
        assert!(eventually(LIMIT, || passed.stats().contended >= 2));
        std::thread::sleep(Duration::from_millis(300));
        (g.fencing_token(), left(&passed))
    });
    // A thread waits behind a sibling's hold without an attempt: it counts as contended.
    assert!(eventually(LIMIT, || a.stats().contended >= 1));
    std::thread::sleep(Duration::from_millis(300));
    let first = held.fencing_token();
    drop(held);
    assert!(eventually(LIMIT, || a.stats().passed_on >= 1));
    let third = a.mutex("relay").with_lease(short);
    let third = std::thread::spawn(move || {
        let g = third.try_lock_for(LIMIT).unwrap().expect("acquired");
        let at_pass = left(&inspect);
        // Held past the short lease: renewed at its own pace, never to the client's 30 s.
        std::thread::sleep(Duration::from_millis(2000));
        assert!(!g.is_lost());
        (g.fencing_token(), at_pass, left(&inspect))
    });
    let (token_2, left_2) = second.join().unwrap();
    let (token_3, at_pass, later) = third.join().unwrap();
    assert!(first < token_2 && token_2 < token_3);
    assert_eq!(a.stats().passed_on, 2, "the lock was not passed on twice");
    assert!(left_2 > Duration::from_secs(20), "{left_2:?}");
    for left in [at_pass, later] {
        assert!(left <= short, "{left:?} left of a {short:?} lease");
    }
}

/// Two clients with two busy threads each: each client passes the lock among its threads a
/// bounded run at a time, then gives it up to the other, which therefore gets its share.
#[test]
fn a_client_passing_the_lock_among_its_threads_lets_another_client_in() {
    let server = RedisServer::start();
    // The default re-check period (10 s): a place lost or left stale would show as a client
    // starved for most of the run (tests/wait_model.rs checks the protocol for both).
    let clients = [client(&server), client(&server)];
    let stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let (m, stop) = (clients[i / 2].mutex("share"), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut taken = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    if m.try_lock_for(LIMIT).unwrap().is_some() {
                        taken += 1;
                    }
                }
                taken
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::Relaxed);
    let taken: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    let per_client = [taken[0] + taken[1], taken[2] + taken[3]];
    let total = per_client[0] + per_client[1];
    assert!(total > 100, "{taken:?}");
    // Without the bound one client kept the lock for the whole run (under 1 % for the
    // other). The shares are close on Redis 7 and Valkey; on Redis 6.2 one client has been
    // seen to get 7 holds for the other's 1, which is not starvation.
    assert!(
        per_client.iter().all(|&n| n * 20 >= total),
        "one client starved the other: {taken:?} {:?} {:?}",
        clients[0].stats(),
        clients[1].stats()
    );
    assert!(clients.iter().all(|c| c.stats().passed_on > 0));
}

/// A release hands the lock to the client it names: the lock holds that client's claim from
/// the release on, so a client that comes for it then (here a bare `SET NX`, as a barging
/// attempt would be) finds it taken, and the named client holds it without an attempt.
#[test]
fn a_release_hands_the_lock_to_the_client_it_names() {
    let server = RedisServer::start();
    let (holder, named) = (client(&server), client(&server));
    let lock = "redmutex:{handed}";
    let g = holder.mutex("handed").lock().unwrap();
    let m = named.mutex("handed");
    let (done, finish) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        let g = m.try_lock_for(LIMIT).unwrap().expect("acquired");
        let _ = finish.recv();
        g.fencing_token()
    });
    // A new client attempts, subscribes, and attempts again so as to miss no release.
    assert!(eventually(LIMIT, || named.stats().attempts == 2));
    let holder_token = g.fencing_token();
    g.unlock().unwrap();
    let mut conn = server.conn();
    assert!(
        !stand_in_takes(&mut conn, lock),
        "another client took the lock handed over"
    );
    assert!(eventually(LIMIT, || named.stats().handed_over == 1));
    // Its token is the claim the release wrote: the client's id, `h` and the fencing token.
    let held: String = conn.get(lock).unwrap();
    // Held on past half the claim, it is renewed to the client's lease.
    assert!(
        eventually(LIMIT, || conn.pttl::<_, i64>(lock).unwrap() > 1500),
        "the claim was not renewed to the lease"
    );
    drop(done);
    let named_token = t.join().unwrap();
    assert!(held.ends_with(&format!(":h:{named_token}")), "{held}");
    assert!(named_token > holder_token);
    assert_eq!(named.stats().attempts, 2, "{:?}", named.stats());
    assert!(waiting_clients(&server, "handed").is_empty());
}

/// While a lock passes between clients, each client's leading waiter waits for its note with
/// a blocking pop on the list the release leaves it in (`mutex/waiters.lua`), woken by its
/// own connection: every note is taken once (its announcement is not taken again), and the
/// lists go with their claims.
#[test]
fn a_lock_passing_between_clients_is_waited_for_with_a_blocking_pop() {
    let server = RedisServer::start();
    let clients = [client(&server), client(&server)];
    let mut tokens = support::take_turns(&clients, "popped", 200);
    tokens.dedup();
    assert_eq!(tokens.len(), 400, "a note was taken twice");
    let handed: u64 = clients.iter().map(|c| c.stats().handed_over).sum();
    assert!(handed > 0, "the lock was never handed between the clients");
    assert!(
        server.command_calls("blpop") > 0,
        "no waiter popped its note"
    );
    let lists = || -> Vec<String> { server.conn().keys("redmutex:{popped}:waiting:*").unwrap() };
    assert!(eventually(LIMIT, || lists().is_empty()), "{:?}", lists());
}

/// Two clients taking turns: a client wants the lock again while the other holds it, and
/// its first attempt, with a pop behind it, records that pop in Redis (`mutex/acquire.lua`);
/// the release that names it leaves the note to the pop and announces nothing
/// (`mutex/waiters.lua`), so that its subscriber thread is not woken for a note already
/// taken. Most hand-offs go unannounced, and every note is still taken once.
#[test]
fn a_note_left_to_a_waiting_pop_is_not_announced() {
    let server = RedisServer::start();
    let clients = [client(&server), client(&server)];
    let announcements = || server.command_calls("spublish") + server.command_calls("publish");
    let before = announcements();
    let mut tokens = support::take_turns(&clients, "quiet", 200);
    tokens.dedup();
    assert_eq!(tokens.len(), 400, "a note was taken twice");
    let handed: u64 = clients.iter().map(|c| c.stats().handed_over).sum();
    let announced = announcements() - before;
    assert!(
        handed >= 50,
        "the clients seldom took turns: {handed} hand-offs"
    );
    assert!(
        announced * 2 < handed,
        "{announced} of {handed} hand-offs were announced"
    );
}

/// The client that a release handed the lock wants it again, and finds it free every time:
/// the lock no longer passes between clients. After pops behind first attempts found it free
/// eight times, its first attempts go without a pop (`waiting::first_pop`), where without this
/// every acquire within a second of the note would have sent the acquire script and a pop.
#[test]
fn first_attempts_that_find_the_lock_free_stop_popping_for_notes() {
    let server = RedisServer::start();
    let (holder, named) = (client(&server), client(&server));
    handed_once(&server, (&holder, &named), "freed");
    let pops = server.command_calls("blpop");
    for _ in 0..30 {
        named.mutex("freed").lock().unwrap().unlock().unwrap();
    }
    assert_eq!(named.stats().handed_over, 1, "{:?}", named.stats());
    let popped = server.command_calls("blpop") - pops;
    assert!(
        popped <= 8,
        "{popped} of 30 free takes had a pop behind them"
    );
}

/// A client's channel for a lock that was contended once stays subscribed while its threads
/// wait, and lingers a while after; acquires that find the lock free do not keep it: it is
/// dropped after its linger time, however often the client takes the lock since.
#[test]
fn a_channel_that_only_free_takes_touch_is_dropped_after_its_linger() {
    let server = RedisServer::start();
    let (holder, named) = (client(&server), client(&server));
    handed_once(&server, (&holder, &named), "lingers");
    let kind = match support::server_version().redis_before(7, 0) {
        true => "CHANNELS",
        false => "SHARDCHANNELS",
    };
    let subscribed = || -> usize {
        redis::cmd("PUBSUB")
            .arg(kind)
            .arg("redmutex:{lingers}:ch*")
            .query::<Vec<String>>(&mut server.conn())
            .map_or(0, |channels| channels.len())
    };
    assert!(subscribed() > 0, "the waiting client was not subscribed");
    let m = named.mutex("lingers");
    let dropped = eventually(LIMIT, || {
        m.lock().unwrap().unlock().unwrap();
        std::thread::sleep(Duration::from_millis(20));
        subscribed() == 0
    });
    assert!(dropped, "free takes kept the channel subscribed");
    assert_eq!(named.stats().handed_over, 1, "{:?}", named.stats());
}

/// `named` waits for `name` while `holder` holds it, and is handed it by the release.
fn handed_once(server: &RedisServer, (holder, named): (&Client, &Client), name: &str) {
    // Taken once by a script: the client may take it with plain commands from now on.
    named.mutex(name).lock().unwrap().unlock().unwrap();
    let g = holder.mutex(name).lock().unwrap();
    let m = named.mutex(name);
    let t = std::thread::spawn(move || m.try_lock_for(LIMIT).unwrap().expect("handed").unlock());
    assert!(eventually(LIMIT, || !waiting_clients(server, name).is_empty()));
    g.unlock().unwrap();
    t.join().unwrap().unwrap();
    assert_eq!(named.stats().handed_over, 1, "{:?}", named.stats());
}

/// A client that a release handed the lock wants it again while another holds it: its first
/// attempt goes to the acquire script, which places it among the waiting in one round trip,
/// rather than plain commands that find the lock held and cost a second one.
#[test]
fn a_client_handed_the_lock_attempts_by_script_first() {
    if support::server_version().redis_before(7, 0) {
        eprintln!("skipped: Redis 6.2 refuses SET NX GET, so every take is a script there");
        return;
    }
    let server = RedisServer::start();
    let (holder, named) = (client(&server), client(&server));
    let m = named.mutex("passing");
    // Taken once by a script: the client has seen the lock's fencing counter started, and
    // may take it with plain commands from now on (see `lease/plain_take.rs`).
    drop(m.lock().unwrap());
    let g = holder.mutex("passing").lock().unwrap();
    let (released, go) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
    let t = std::thread::spawn(move || {
        drop(m.try_lock_for(LIMIT).unwrap().expect("handed the lock"));
        released.0.send(()).unwrap();
        // Held by the other client now: this first attempt finds it so.
        go.1.recv().unwrap();
        let again = m
            .try_lock_for(LIMIT)
            .unwrap()
            .expect("handed the lock again");
        again.fencing_token()
    });
    assert!(eventually(LIMIT, || named.stats().attempts == 3));
    g.unlock().unwrap();
    released.1.recv().unwrap();
    assert_eq!(named.stats().handed_over, 1, "{:?}", named.stats());
    let g = holder.mutex("passing").lock().unwrap();
    let sets = server.command_calls("set");
    assert!(waiting_clients(&server, "passing").is_empty());
    go.0.send(()).unwrap();
    // The attempt is counted before it is sent; the place it makes among the waiting clients
    // shows that Redis has run it (and any plain command sent before it).
    assert!(eventually(LIMIT, || !waiting_clients(&server, "passing").is_empty()));
    assert_eq!(named.stats().attempts, 4, "{:?}", named.stats());
    // The attempt was the script alone (its own `SET NX GET` found the lock held): no plain
    // `SET` came before it.
    assert_eq!(server.command_calls("set"), sets + 1);
    let holder_token = g.fencing_token();
    g.unlock().unwrap();
    assert!(t.join().unwrap() > holder_token);
    assert_eq!(named.stats().handed_over, 2, "{:?}", named.stats());
}

/// Whether a stand-in for another client takes `lock` now, as a barging attempt would: a
/// `SET NX` of a token that looks like a redmutex client's (whose release would be announced).
fn stand_in_takes(conn: &mut redis::Connection, lock: &str) -> bool {
    redis::cmd("SET")
        .arg(lock)
        .arg("0123456789abcdef0123456789abcdef:0:stand-in")
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .query::<Option<String>>(conn)
        .unwrap()
        .is_some()
}

/// A release that does not hand the lock over (a shared value's, whose waiter needs the value
/// the attempt reads) names the next client, which attempts: a client that takes the lock
/// before that attempt arrives makes the named client owed the next turn, which the next
/// release hands to it.
#[test]
fn a_named_client_beaten_to_the_lock_is_handed_the_next_turn() {
    let server = RedisServer::start();
    // The named client may take the lock before the stand-in below does (a busy machine):
    // then the case is tried again, on a lock of another name.
    let beaten = (0..20).any(|round| named_client_beaten(&server, &format!("owed-{round}")));
    assert!(beaten, "the named client was never beaten to the lock");
}

/// One try of the case above on the lock `name`: false when the named client was not beaten.
fn named_client_beaten(server: &RedisServer, name: &str) -> bool {
    let (barger, named) = (client(server), client(server));
    let (lock, waiting) = (
        format!("redmutex:{{{name}}}"),
        format!("redmutex:{{{name}}}:waiting"),
    );
    let mut conn = server.conn();
    let g = barger.shared::<u64>(name).lock().unwrap();
    let m = named.shared::<u64>(name);
    let (done, finish) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        let g = m.try_lock_for(LIMIT).unwrap().expect("acquired");
        let _ = finish.recv();
        g.fencing_token()
    });
    // A new client attempts, subscribes, and attempts again so as to miss no release.
    assert!(eventually(LIMIT, || named.stats().attempts == 2));
    // It has waited long: past the 10 ms under which barging is left alone.
    std::thread::sleep(Duration::from_millis(50));
    // The release names the waiting client; before its attempt arrives, another holder takes
    // the lock (one that looks like a redmutex client, whose release would be announced).
    g.unlock().unwrap();
    if !stand_in_takes(&mut conn, &lock) {
        drop(done);
        t.join().unwrap();
        return false;
    }
    // Its attempt found the lock taken: it waits first, owed the next turn.
    let mut owed = || -> Vec<(String, f64)> { conn.zrange_withscores(&waiting, 0, -1).unwrap() };
    assert!(eventually(
        LIMIT,
        || matches!(owed().as_slice(), [(_, s)] if *s < 0.0)
    ));
    // The stand-in leaves without a word; the barger takes the free lock at once, and its
    // release hands the lock to the named client: the barger cannot take it again.
    let _: () = server.conn().del(&lock).unwrap();
    let again = barger.shared::<u64>(name);
    let g = again.try_lock().unwrap().expect("the lock was free");
    let barger_token = g.fencing_token();
    g.unlock().unwrap();
    assert!(
        again.try_lock().unwrap().is_none(),
        "the barger took the named client's turn"
    );
    drop(done);
    let named_token = t.join().unwrap();
    assert!(named_token > barger_token);
    assert!(waiting_clients(server, name).is_empty());
    true
}

/// Threads of one client that give up at short deadlines, again and again, while a thread of
/// another client takes the lock in turn with them: a waiter that gives up withdraws its
/// client only when no sibling waits, comes, or counts on a release on its way, and hands
/// the place it leaves to a hold of its client, so the other client's waiter is always named
/// (the model of the hand-off with waiters that give up, `tests/wait_model.rs`). Both clients
/// re-check only every 60 s, and each of the other client's acquisitions must come well
/// before that: a forgotten waiter fails the test.
#[test]
fn waiters_that_give_up_leave_no_other_client_waiting_for_its_recheck() {
    let server = RedisServer::start();
    let slow_recheck = || {
        Client::builder()
            .default_lease(Duration::from_secs(180))
            .renewal_interval(Duration::from_secs(60))
            .open(server.url())
            .unwrap()
    };
    let (quitters, taker) = (slow_recheck(), slow_recheck());
    let done = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = (0..4u64)
        .map(|i| {
            let (m, done) = (quitters.mutex("give-up"), Arc::clone(&done));
            std::thread::spawn(move || {
                let mut rng = fastrand::Rng::with_seed(i);
                let (mut won, mut gave_up) = (0u32, 0u32);
                while !done.load(Ordering::Relaxed) {
                    let wait = Duration::from_micros(rng.u64(0..1_500));
                    match m.try_lock_for(wait).unwrap() {
                        Some(g) => {
                            won += 1;
                            std::thread::sleep(Duration::from_micros(rng.u64(0..500)));
                            drop(g);
                        }
                        None => gave_up += 1,
                    }
                }
                (won, gave_up)
            })
        })
        .collect();
    let m = taker.mutex("give-up");
    for _ in 0..3000 {
        let g = m.try_lock_for(Duration::from_secs(30)).unwrap();
        assert!(g.is_some(), "a waiter of the other client was forgotten");
        std::thread::sleep(Duration::from_micros(fastrand::u64(0..1_500)));
    }
    done.store(true, Ordering::Relaxed);
    let (mut won, mut gave_up) = (0, 0);
    for t in threads {
        let (w, g) = t.join().unwrap();
        won += w;
        gave_up += g;
    }
    // Both kinds of end were reached many times.
    assert!(won >= 10 && gave_up >= 10, "won {won}, gave up {gave_up}");
}
