//! Elections against a real redis-server: one leader at a time with rising terms, who leads
//! and what it announces, a resignation that hands over at once, a dead leader replaced, a
//! lost leadership told, and observers that see every change in order.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use redis::Commands;
use redmutex::{Client, ErrorKind, LeaderEvent, MAX_LEADER_VALUE};
use support::{read_marker, redlock_over, servers, spawn_worker, within, worker_role, RedisServer};

const ENTRY: &str = "election_worker_entry";

/// The lease of the workers' leaderships: how long a dead leader holds the others up.
const LEASE: Duration = Duration::from_secs(2);

const LIMIT: Duration = Duration::from_secs(60);

fn client(server: &RedisServer) -> Client {
    Client::builder()
        .backoff(Duration::from_millis(2), Duration::from_millis(50))
        .open(server.url())
        .expect("client")
}

/// A worker process. `cycle`: campaigns, leads 20 ms (counting the leaders in Redis, which
/// must be one, and logging its term) and resigns, 20 times. `lead`: leads until it loses the
/// leadership, then says so, with its term.
#[test]
fn election_worker_entry() {
    let Some((role, url, _)) = worker_role() else {
        return;
    };
    let client = Client::open(url.as_str()).unwrap();
    // The client's other locks keep the default lease (30 s); the election's is short.
    let election = client.election("processes").with_lease(LEASE);
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    match role.as_str() {
        "cycle" => {
            for _ in 0..20 {
                let leadership = election.campaign(std::process::id().to_string()).unwrap();
                let leaders: i64 = conn.incr("leaders", 1).unwrap();
                let _: () = conn.rpush("terms", leadership.term()).unwrap();
                std::thread::sleep(Duration::from_millis(20));
                let _: i64 = conn.decr("leaders", 1).unwrap();
                leadership.resign().unwrap();
                if leaders != 1 {
                    println!("OVERLAP {leaders}");
                }
            }
            println!("DONE");
        }
        _ => {
            let leadership = election.campaign("stalling").unwrap();
            println!("LEADING {}", leadership.term());
            let lost = leadership
                .lease_watch()
                .wait_timeout(Duration::from_secs(120));
            println!("LOST {lost} {}", leadership.term());
        }
    }
}

/// Four processes campaign, lead 20 ms and resign, 20 times each: never two leaders at once
/// (counted in Redis), and every term larger than the one before.
#[test]
fn four_processes_never_lead_at_once_and_terms_rise() {
    let server = RedisServer::start();
    let mut workers: Vec<_> = (0..4)
        .map(|_| spawn_worker(ENTRY, "cycle", &server.url(), ""))
        .collect();
    for worker in &mut workers {
        let done = read_marker(worker, "DONE");
        assert_eq!(done, "");
    }
    for mut worker in workers {
        assert!(worker.wait().unwrap().success());
    }
    let mut conn = server.conn();
    let terms: Vec<u64> = conn.lrange("terms", 0, -1).unwrap();
    assert_eq!(terms.len(), 80);
    assert!(terms.windows(2).all(|w| w[0] < w[1]), "{terms:?}");
}

/// A leader killed (`SIGKILL`: nothing resigns) is replaced when its lease runs out.
#[test]
fn a_killed_leader_is_replaced_when_its_lease_runs_out() {
    let server = RedisServer::start();
    let mut leader = spawn_worker(ENTRY, "lead", &server.url(), "");
    let term: u64 = read_marker(&mut leader, "LEADING").parse().unwrap();
    leader.kill().unwrap();
    let killed = Instant::now();
    let _ = leader.wait();
    let client = client(&server);
    let leadership = client.election("processes").campaign("next").unwrap();
    let after = killed.elapsed();
    assert!(leadership.term() > term);
    // Within the lease and a little (measured: the lease plus a few ms); generous here.
    assert!(
        after < LEASE + Duration::from_secs(5),
        "replaced after {after:?}"
    );
}

/// A leader stalled past its lease (`SIGSTOP`) is replaced; running again, it is told that it
/// lost, and its term is the smaller.
#[test]
fn a_stalled_leader_is_replaced_and_told_it_lost() {
    let server = RedisServer::start();
    let mut leader = spawn_worker(ENTRY, "lead", &server.url(), "");
    let stdout = leader.stdout.take().unwrap();
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    let mut next_line = move |prefix: &str| -> String {
        for line in lines.by_ref() {
            let line = line.unwrap();
            if let Some(at) = line.find(prefix) {
                return line[at + prefix.len()..].trim().to_owned();
            }
        }
        panic!("the worker ended without printing {prefix}");
    };
    let term: u64 = next_line("LEADING").parse().unwrap();
    let pid = leader.id() as libc::pid_t;
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    let client = client(&server);
    let leadership = client.election("processes").campaign("next").unwrap();
    assert!(leadership.term() > term);
    unsafe { libc::kill(pid, libc::SIGCONT) };
    let told = within(LIMIT, move || next_line("LOST"));
    assert_eq!(told, format!("true {term}"));
    let _ = leader.wait();
}

/// Four clients (four "processes", each with its own client id) campaign, lead 20 ms and
/// resign, 20 times each: never two leaders at once, and every term larger than the one
/// before.
#[test]
fn one_leader_at_a_time_with_rising_terms() {
    let server = RedisServer::start();
    let leading = Arc::new(AtomicUsize::new(0));
    let terms = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let start = Arc::new(Barrier::new(4));
    let threads: Vec<_> = (0..4)
        .map(|i| {
            let client = client(&server);
            let (leading, terms, start) = (leading.clone(), terms.clone(), start.clone());
            std::thread::spawn(move || {
                let election = client.election("leader");
                start.wait();
                for _ in 0..20 {
                    let leadership = election.campaign(format!("candidate-{i}")).unwrap();
                    assert_eq!(leading.fetch_add(1, Ordering::SeqCst), 0, "two leaders");
                    terms.lock().push(leadership.term());
                    std::thread::sleep(Duration::from_millis(20));
                    leading.fetch_sub(1, Ordering::SeqCst);
                    leadership.resign().unwrap();
                }
            })
        })
        .collect();
    within(LIMIT * 2, move || {
        for t in threads {
            t.join().unwrap();
        }
    });
    let terms = terms.lock();
    assert_eq!(terms.len(), 80);
    assert!(terms.windows(2).all(|w| w[0] < w[1]), "{terms:?}");
}

#[test]
fn the_leader_is_known_with_its_value_term_and_client() {
    let server = RedisServer::start();
    let (a, b) = (client(&server), client(&server));
    let election = a.election("gateway");
    assert_eq!(b.election("gateway").leader().unwrap(), None);
    let mut leadership = election.campaign("10.0.0.7:8080").unwrap();
    let leader = b.election("gateway").leader().unwrap().expect("a leader");
    assert_eq!(leader.value, "10.0.0.7:8080");
    assert_eq!(leader.term, leadership.term());
    assert!(leader.since <= std::time::SystemTime::now() + Duration::from_secs(5));
    let holder = a
        .lock_info("election:gateway")
        .unwrap()
        .holder
        .expect("a holder");
    assert!(holder.token.starts_with(&format!("{}:", leader.client_id)));

    leadership.proclaim("10.0.0.7:9090").unwrap();
    let moved = b.election("gateway").leader().unwrap().expect("a leader");
    assert_eq!(moved.value, "10.0.0.7:9090");
    assert_eq!((moved.term, moved.since), (leader.term, leader.since));

    leadership.resign().unwrap();
    assert_eq!(b.election("gateway").leader().unwrap(), None);
}

#[test]
fn a_resignation_hands_over_at_once() {
    let server = RedisServer::start();
    let (a, b) = (client(&server), client(&server));
    let leadership = a.election("handover").campaign("a").unwrap();
    let first = leadership.term();
    let waiting = std::thread::spawn(move || {
        let leadership = b.election("handover").campaign("b").unwrap();
        (Instant::now(), leadership.term())
    });
    // Let the candidate wait in Redis.
    std::thread::sleep(Duration::from_millis(300));
    let resigned = Instant::now();
    leadership.resign().unwrap();
    let (led, term) = within(LIMIT, move || waiting.join().unwrap());
    assert!(term > first);
    // Named by the release, not found by a re-check (10 s by default).
    let after = led.duration_since(resigned);
    assert!(
        after < Duration::from_secs(2),
        "handed over after {after:?}"
    );
}

#[test]
fn a_dead_leader_is_replaced_when_its_lease_runs_out() {
    let server = RedisServer::start();
    let dying = Client::open(server.url()).unwrap();
    let election = dying.election("dead").with_lease(Duration::from_secs(2));
    let leadership = election.campaign("a").unwrap();
    let first = leadership.term();
    // The process dies: nothing resigns, nothing renews (once no handle is left).
    std::mem::forget(leadership);
    drop(election);
    drop(dying);
    let other = client(&server);
    let taken = Instant::now();
    let leadership = other
        .election("dead")
        .campaign_for(LIMIT, "b")
        .unwrap()
        .expect("led within the limit");
    assert!(leadership.term() > first);
    assert!(taken.elapsed() < LIMIT);
    let leader = other.election("dead").leader().unwrap().expect("a leader");
    assert_eq!(
        (leader.value.as_str(), leader.term),
        ("b", leadership.term())
    );
}

#[test]
fn a_leader_whose_lock_was_taken_is_told_and_no_longer_counts() {
    let server = RedisServer::start();
    let client = Client::builder()
        .default_lease(Duration::from_secs(3))
        .renewal_interval(Duration::from_millis(200))
        .open(server.url())
        .unwrap();
    let leadership = client.election("taken").campaign("a").unwrap();
    let watch = leadership.lease_watch();
    assert!(client.mutex("election:taken").force_unlock().unwrap());
    // Who leads is read against the lock: the record left behind does not count.
    assert_eq!(client.election("taken").leader().unwrap(), None);
    assert!(watch.wait_timeout(LIMIT), "the loss was not told");
    assert!(leadership.is_lost());
    let err = leadership.resign().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockLost);
}

#[test]
fn an_observer_sees_every_leader_in_order() {
    let server = RedisServer::start();
    let (a, b, watcher) = (client(&server), client(&server), client(&server));
    let mut observer = watcher.election("watched").observe().unwrap();
    let mut terms = Vec::new();
    for round in 0..8 {
        let leader = if round % 2 == 0 { &a } else { &b };
        let leadership = leader
            .election("watched")
            .campaign(format!("r{round}"))
            .unwrap();
        terms.push(leadership.term());
        std::thread::sleep(Duration::from_millis(150));
        leadership.resign().unwrap();
    }
    let mut seen = Vec::new();
    while let Some(event) = observer.recv_timeout(Duration::from_secs(2)).unwrap() {
        seen.push(event);
        if seen.len() == 16 {
            break;
        }
    }
    let expected: Vec<(u64, bool)> = terms
        .iter()
        .flat_map(|&t| [(t, true), (t, false)])
        .collect();
    let got: Vec<(u64, bool)> = seen
        .iter()
        .map(|e| match e {
            LeaderEvent::Elected(l) => (l.term, true),
            LeaderEvent::Proclaimed(l) => panic!("nobody proclaimed: {l:?}"),
            LeaderEvent::Vacant { term } => (*term, false),
        })
        .collect();
    assert_eq!(got, expected);
    let values: Vec<&str> = seen
        .iter()
        .filter_map(|e| match e {
            LeaderEvent::Elected(l) => Some(l.value.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(values, ["r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7"]);
}

#[test]
fn an_observer_is_told_of_a_leader_whose_lease_ran_out() {
    let server = RedisServer::start();
    let watcher = Client::builder()
        .renewal_interval(Duration::from_millis(200))
        .open(server.url())
        .unwrap();
    let dying = Client::builder()
        .default_lease(Duration::from_secs(1))
        .open(server.url())
        .unwrap();
    let leadership = dying.election("expiring").campaign("a").unwrap();
    let term = leadership.term();
    let mut observer = watcher.election("expiring").observe().unwrap();
    match observer.recv_timeout(LIMIT).unwrap() {
        Some(LeaderEvent::Elected(l)) => assert_eq!(l.term, term),
        other => panic!("{other:?}"),
    }
    std::mem::forget(leadership);
    drop(dying);
    assert_eq!(
        observer.recv_timeout(LIMIT).unwrap(),
        Some(LeaderEvent::Vacant { term })
    );
}

#[test]
fn run_while_leader_returns_the_work_and_resigns() {
    let server = RedisServer::start();
    let client = client(&server);
    let election = client.election("job");
    let term = election
        .run_while_leader("worker", |leadership| {
            assert_eq!(leadership.value(), "worker");
            leadership.term()
        })
        .unwrap();
    assert!(term > 0);
    assert_eq!(election.leader().unwrap(), None);
}

/// A client shut down (on a termination signal, say) resigns its leaderships at once: the
/// work of `run_while_leader` sees the leadership lost and returns, the runner says the
/// client is shut down, and a waiting candidate leads at once rather than after the lease.
#[test]
fn a_shutdown_resigns_and_ends_run_while_leader() {
    let server = RedisServer::start();
    // The default lease, 30 s: a candidate that led sooner was handed the lock.
    let leading = client(&server);
    let (runner, steps) = (leading.clone(), Arc::new(AtomicUsize::new(0)));
    let counted = Arc::clone(&steps);
    let run = std::thread::spawn(move || {
        runner
            .election("service")
            .run_while_leader("a", |leadership| {
                while !leadership.is_lost() {
                    counted.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(5));
                }
                leadership.term()
            })
    });
    let other = client(&server);
    let reader = other.clone();
    let term_a = within(LIMIT, move || loop {
        if let Some(leader) = reader.election("service").leader().unwrap() {
            break leader.term;
        }
        std::thread::sleep(Duration::from_millis(10));
    });
    let candidate = other.clone();
    let next = std::thread::spawn(move || {
        let leadership = candidate.election("service").campaign("b").unwrap();
        (leadership.term(), Instant::now())
    });
    // The candidate waits for the lock before the leader's client shuts down.
    assert!(support::eventually(LIMIT, || other.stats().contended >= 1));
    let shut = Instant::now();
    leading.shutdown();
    let err = run.join().unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Shutdown);
    let (term_b, led_at) = next.join().unwrap();
    assert!(term_b > term_a);
    let after = led_at.duration_since(shut);
    assert!(
        after < Duration::from_secs(10),
        "led {after:?} after the shutdown"
    );
    assert!(steps.load(Ordering::Relaxed) > 0);
}

/// A leader whose work returns the moment its leadership is lost campaigns again at once: as
/// its client shuts down, that campaign fails with `Shutdown` and never takes the lock back
/// from the waiting candidate (the client stops taking locks before it resigns). Several
/// rounds, since the campaign races the resignation's round trips.
#[test]
fn a_leader_that_campaigns_again_at_shutdown_gets_shutdown_not_the_lock() {
    let server = RedisServer::start();
    for round in 0..8 {
        let name = format!("again-{round}");
        let leading = client(&server);
        let (runner, terms) = (leading.clone(), Arc::new(AtomicUsize::new(0)));
        let (counted, election) = (Arc::clone(&terms), name.clone());
        let run = std::thread::spawn(move || {
            runner
                .election(&election)
                .run_while_leader("a", |leadership| {
                    counted.fetch_add(1, Ordering::Relaxed);
                    leadership.lease_watch().wait_timeout(LIMIT)
                })
        });
        let other = client(&server);
        let reader = other.clone();
        let observed = name.clone();
        within(LIMIT, move || {
            while reader.election(&observed).leader().unwrap().is_none() {
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        let (candidate, election) = (other.clone(), name.clone());
        let next = std::thread::spawn(move || {
            let _led = candidate.election(&election).campaign("b").unwrap();
            Instant::now()
        });
        assert!(support::eventually(LIMIT, || other.stats().contended >= 1));
        let shut = Instant::now();
        leading.shutdown();
        let err = run.join().unwrap().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Shutdown, "round {round}: {err}");
        let after = next.join().unwrap().saturating_duration_since(shut);
        assert!(
            after < Duration::from_secs(10),
            "round {round}: led {after:?} after the shutdown"
        );
        assert_eq!(terms.load(Ordering::Relaxed), 1, "round {round}");
    }
}

/// A leadership resigned by its client's shutdown reads as lost, and its own resignation
/// afterwards has nothing left to do.
#[test]
fn a_leadership_resigned_at_shutdown_reads_lost_and_resigns_quietly() {
    let server = RedisServer::start();
    let leading = client(&server);
    let election = leading.election("quiet");
    let leadership = election.campaign("a").unwrap();
    let watch = leadership.lease_watch();
    let kept = leading.election("kept").campaign("k").unwrap();
    let kept_for = kept.keep_until_expiry().unwrap();
    assert!(kept_for > Duration::ZERO);
    leading.clone().shutdown();
    assert!(watch.is_lost());
    assert!(leadership.is_lost());
    leadership.resign().unwrap();
    let other = client(&server);
    assert_eq!(other.election("quiet").leader().unwrap(), None);
    // A leadership kept until its lease runs out is not resigned.
    let kept = other.election("kept").leader().unwrap().expect("kept");
    assert_eq!(kept.value, "k");
}

#[test]
fn bad_input_is_refused_before_anything_is_sent() {
    let server = RedisServer::start();
    let client = client(&server);
    let err = client.election("").campaign("a").unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    let too_long = "x".repeat(MAX_LEADER_VALUE + 1);
    let err = client.election("big").campaign(too_long).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(!client.mutex("election:big").is_locked().unwrap());
    let err = client.election("").leader().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

/// A leadership is a guard like the others: generic code over `Lease` and `Fenced` takes it.
#[test]
fn a_leadership_is_a_fenced_lease() {
    use redmutex::{Fenced, Lease};

    fn step_down<L: Lease + Fenced>(guard: L, term: u64) -> redmutex::Result<()> {
        assert_eq!(guard.fencing_token(), term);
        assert!(guard.verify()? > Duration::ZERO);
        guard.extend(Duration::from_secs(5))?;
        guard.unlock()
    }

    let server = RedisServer::start();
    let client = client(&server);
    let election = client.election("generic");
    let leadership = election.campaign("a").unwrap();
    let term = leadership.term();
    assert_eq!(Lease::name(&leadership), "generic");
    step_down(leadership, term).unwrap();
    assert_eq!(election.leader().unwrap(), None);
}

/// An election over a Redlock of three instances: one leader at a time with rising terms,
/// `leader()` named by a majority, an observer that tells each change once and in order
/// though every instance logs it, and one instance down changes none of it.
#[test]
fn an_election_over_a_redlock_keeps_its_promises_with_an_instance_down() {
    let mut s = servers(3);
    let (a, b) = (redlock_over(&s), redlock_over(&s));
    let mut changes = b.election("quorum").observe().unwrap();
    let mut led = a.election("quorum").campaign("a").unwrap();
    let term_a = led.term();
    let named = b.election("quorum").leader().unwrap().expect("a leader");
    assert_eq!((named.value.as_str(), named.term), ("a", term_a));
    let candidate = b.clone();
    let next = std::thread::spawn(move || {
        let leadership = candidate
            .election("quorum")
            .campaign_for(LIMIT, "b")
            .unwrap()
            .expect("led within the limit");
        let term = leadership.term();
        leadership.resign().unwrap();
        term
    });
    led.proclaim("a2").unwrap();
    led.resign().unwrap();
    let term_b = next.join().unwrap();
    assert!(term_b > term_a);
    let mut seen = Vec::new();
    while seen.len() < 5 {
        match changes.recv_timeout(LIMIT).unwrap() {
            Some(event) => seen.push(event),
            None => panic!("no change within the limit: {seen:?}"),
        }
    }
    let expected = |e: &LeaderEvent, i: usize| match (i, e) {
        (0, LeaderEvent::Elected(l)) => l.term == term_a && l.value == "a",
        (1, LeaderEvent::Proclaimed(l)) => l.term == term_a && l.value == "a2",
        (2, LeaderEvent::Vacant { term }) => *term == term_a,
        (3, LeaderEvent::Elected(l)) => l.term == term_b && l.value == "b",
        (4, LeaderEvent::Vacant { term }) => *term == term_b,
        _ => false,
    };
    assert!(
        seen.iter().enumerate().all(|(i, e)| expected(e, i)),
        "{seen:?}"
    );
    // Told once each, though three logs hold them.
    assert!(changes
        .recv_timeout(Duration::from_millis(300))
        .unwrap()
        .is_none());
    // One instance down: a majority still elects, names and logs.
    s[0].kill();
    let led = a.election("quorum").campaign("a3").unwrap();
    assert!(led.term() > term_b);
    let named = b.election("quorum").leader().unwrap().expect("a leader");
    assert_eq!((named.value.as_str(), named.term), ("a3", led.term()));
    match changes.recv_timeout(LIMIT).unwrap() {
        Some(LeaderEvent::Elected(l)) => assert_eq!(l.term, led.term()),
        other => panic!("{other:?}"),
    }
    // A record that one instance alone still backs (the lock gone from the other live one)
    // names nobody.
    let removed: i64 = redis::cmd("DEL")
        .arg("redmutex:{election:quorum}")
        .query(&mut s[1].conn())
        .unwrap();
    assert_eq!(removed, 1);
    assert_eq!(b.election("quorum").leader().unwrap(), None);
}
