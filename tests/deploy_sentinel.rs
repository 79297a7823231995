//! Redis Sentinel: locks through the sentinels, across a failover, with a sentinel down, and
//! clear errors for bad addresses. Every deployment is real processes the test starts.

mod support;

use std::time::{Duration, Instant};

use redmutex::{Client, ErrorKind};
use support::sentinel::SentinelDeployment;
use support::{eventually, within};

const LIMIT: Duration = Duration::from_secs(90);

fn client(deployment: &SentinelDeployment) -> Client {
    Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .default_lease(Duration::from_secs(4))
        .renewal_interval(Duration::from_millis(500))
        .open(deployment.url())
        .expect("client")
}

#[test]
fn threads_take_turns_through_the_sentinels() {
    let deployment = SentinelDeployment::start();
    let client = client(&deployment);
    assert_eq!(support::overlaps_of_four_threads(&client, "counter"), 0);
    assert_eq!(client.stats().acquisitions, 80);
    // The lock lives on the master the sentinels name.
    let g = client.mutex("where").lock().unwrap();
    let exists: bool = redis::cmd("EXISTS")
        .arg("redmutex:{where}")
        .query(&mut deployment.master().conn())
        .unwrap();
    assert!(exists);
    drop(g);
}

#[test]
fn a_lock_acknowledged_by_every_replica_is_kept_across_a_failover() {
    let deployment = SentinelDeployment::start();
    let client = Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .default_lease(Duration::from_secs(6))
        .renewal_interval(Duration::from_millis(500))
        // Every replica: then whichever one is promoted has the lock.
        .replica_acks(2, Duration::from_secs(1))
        .open(deployment.url())
        .unwrap();
    let g = client.mutex("kept").lock().unwrap();
    let token = g.fencing_token();
    let old = deployment.master().port();
    let new = deployment.failover();
    assert_ne!(old, new);
    // Renewal goes on, on the new master.
    let renewals = client.stats().renewals;
    assert!(eventually(LIMIT, || client.stats().renewals >= renewals + 4));
    if g.is_lost() {
        panic!("the lease was lost across the failover: {:?}", g.verify());
    }
    assert!(g.verify().is_ok());
    let held: bool = redis::cmd("EXISTS")
        .arg("redmutex:{kept}")
        .query(&mut deployment.node(new).conn())
        .unwrap();
    assert!(held, "the new master does not have the lock");
    g.unlock().unwrap();
    // Fencing tokens keep growing on the new master (once both replicas follow it, since
    // every acquire waits for both).
    assert!(eventually(LIMIT, || deployment.settled()));
    let next = client.mutex("kept").lock().unwrap();
    assert!(next.fencing_token() > token);
}

#[test]
fn waiters_acquire_after_a_failover() {
    let deployment = SentinelDeployment::start();
    let holder = client(&deployment);
    let waiters = client(&deployment);
    let g = holder.mutex("queue").lock().unwrap();
    let threads: Vec<_> = (0..3)
        .map(|_| {
            let c = waiters.clone();
            std::thread::spawn(move || {
                c.mutex("queue")
                    .try_lock_for(LIMIT)
                    .map(|g| g.map(|g| g.fencing_token()))
            })
        })
        .collect();
    assert!(eventually(LIMIT, || waiters.stats().contended >= 3));
    deployment.failover();
    // The holder's release (or, had the new master missed the lock, its expiry) frees it.
    drop(g);
    let started = Instant::now();
    for t in threads {
        let got = within(LIMIT, move || t.join().unwrap());
        assert!(matches!(got, Ok(Some(_))), "{got:?}");
    }
    assert!(started.elapsed() < LIMIT);
}

#[test]
fn a_dead_sentinel_is_skipped() {
    let mut deployment = SentinelDeployment::start();
    deployment.sentinels[0].kill();
    let client = client(&deployment);
    let g = within(LIMIT, move || {
        client.mutex("skip").lock().map(|g| g.fencing_token())
    });
    assert!(g.is_ok(), "{g:?}");
}

#[test]
fn an_unknown_master_name_is_a_config_error() {
    let deployment = SentinelDeployment::start();
    let url = deployment.url().replace("/mymaster", "/nosuchmaster");
    let client = Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .open(url)
        .unwrap();
    let c = client.clone();
    let err = within(LIMIT, move || c.check()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    let err = within(LIMIT, move || client.mutex("x").try_lock().map(drop)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.to_string().contains("nosuchmaster"), "{err}");
    // The right name passes the start-up check (the master is found and answers).
    let good = Client::open(deployment.url()).unwrap();
    within(LIMIT, move || good.check()).unwrap();
}

/// With one sentinel down, the others still say the name is unknown: a blocking `lock()`
/// (default outage patience, 20 s) fails at once with `Config`, not as an outage.
#[test]
fn an_unknown_master_name_fails_a_blocking_lock_at_once_with_a_sentinel_down() {
    let mut deployment = SentinelDeployment::start();
    deployment.sentinels[2].kill();
    let url = deployment.url().replace("/mymaster", "/nosuchmaster");
    let client = Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .open(url)
        .unwrap();
    let started = Instant::now();
    let err = within(LIMIT, move || client.mutex("x").lock().map(drop)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Config, "{err}");
    assert!(err.to_string().contains("nosuchmaster"), "{err}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}: rode through as an outage",
        started.elapsed()
    );
}

#[test]
fn no_reachable_sentinel_is_a_connection_error_within_the_connect_timeout() {
    let ports: Vec<u16> = (0..2).map(|_| support::free_port()).collect();
    let url = format!(
        "redis+sentinel://127.0.0.1:{},127.0.0.1:{}/mymaster",
        ports[0], ports[1]
    );
    let client = Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .open(url)
        .unwrap();
    let started = Instant::now();
    let err = within(LIMIT, move || client.mutex("x").try_lock().map(drop)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[test]
fn a_sentinel_url_without_a_master_name_is_refused_at_once() {
    let err = Client::open("redis+sentinel://127.0.0.1:26379/").unwrap_err();
    assert!(err.is_config(), "{err}");
}

#[test]
fn after_a_failover_new_locks_go_to_the_new_master_not_the_demoted_one() {
    let deployment = SentinelDeployment::start();
    let client = client(&deployment);
    drop(client.mutex("before").lock().unwrap()); // connected to the old master
    let old = deployment.master().port();
    let new = deployment.failover();
    // The demoted master stays writable for seconds after `SENTINEL FAILOVER`; only the
    // sentinels' `+switch-master` tells the client to move before it is reconfigured.
    std::thread::sleep(Duration::from_secs(1));
    let g = client.mutex("after").lock().unwrap();
    let exists = |port: u16| -> bool {
        redis::cmd("EXISTS")
            .arg("redmutex:{after}")
            .query(&mut deployment.node(port).conn())
            .unwrap()
    };
    let (on_new, on_old) = (exists(new), exists(old));
    assert!(
        !on_old,
        "the lock was written to the demoted master (on the new: {on_new})"
    );
    assert!(on_new, "the lock is not on the new master");
    g.unlock().unwrap();
}

const ENTRY: &str = "sentinel_worker_entry";

/// Worker processes: 4 threads add 1 to a plain counter on the master 25 times each, under a
/// lock taken through the sentinels (a read-modify-write made safe only by the lock).
#[test]
fn sentinel_worker_entry() {
    let Some((role, url, master_url)) = support::worker_role() else {
        return;
    };
    assert_eq!(role, "counter");
    let client = Client::open(url.as_str()).unwrap();
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (client, master_url) = (client.clone(), master_url.clone());
            std::thread::spawn(move || {
                let mut conn = redis::Client::open(master_url.as_str())
                    .unwrap()
                    .get_connection()
                    .unwrap();
                for _ in 0..25 {
                    let _g = client.mutex("counter-lock").lock().unwrap();
                    let n: Option<u64> = redis::cmd("GET").arg("counter").query(&mut conn).unwrap();
                    std::thread::sleep(Duration::from_millis(1));
                    let _: () = redis::cmd("SET")
                        .arg("counter")
                        .arg(n.unwrap_or(0) + 1)
                        .query(&mut conn)
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    println!("DONE");
}

#[test]
fn four_processes_of_four_threads_lose_no_increment_through_the_sentinels() {
    let deployment = SentinelDeployment::start();
    let master_url = deployment.master().url();
    let mut workers: Vec<_> = (0..4)
        .map(|_| support::spawn_worker(ENTRY, "counter", &deployment.url(), &master_url))
        .collect();
    for w in &mut workers {
        support::read_marker(w, "DONE");
    }
    for mut w in workers {
        assert!(w.wait().unwrap().success());
    }
    let n: u64 = redis::cmd("GET")
        .arg("counter")
        .query(&mut deployment.master().conn())
        .unwrap();
    assert_eq!(n, 4 * 4 * 25);
}

#[test]
fn the_builder_form_names_the_sentinels_and_the_master() {
    let deployment = SentinelDeployment::start();
    let sentinels: Vec<String> = deployment
        .sentinels
        .iter()
        .map(|s| format!("127.0.0.1:{}", s.port()))
        .collect();
    let client = Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .sentinel(support::sentinel::MASTER_NAME, &sentinels)
        .unwrap();
    let g = within(LIMIT, move || {
        client.mutex("built").lock().map(|g| g.fencing_token())
    });
    assert!(g.is_ok(), "{g:?}");
    let err = Client::builder().sentinel("", &sentinels).unwrap_err();
    assert!(err.is_config(), "{err}");
    let none: [&str; 0] = [];
    assert!(Client::builder()
        .sentinel("mymaster", none)
        .unwrap_err()
        .is_config());
}

#[test]
fn a_lock_the_new_master_lacks_is_reported_lost_never_silently() {
    let deployment = SentinelDeployment::start();
    let client = client(&deployment);
    let g = client.mutex("forgotten").lock().unwrap();
    let watch = g.lease_watch();
    let new = deployment.failover();
    // As if the promoted replica had not received the lock before the failover.
    let _: () = redis::cmd("DEL")
        .arg("redmutex:{forgotten}")
        .query(&mut deployment.node(new).conn())
        .unwrap();
    assert!(watch.wait_timeout(LIMIT), "the loss was never reported");
    assert!(g.is_lost());
    assert!(g.unlock().unwrap_err().is_lock_lost());
}

/// A sentinel that listens with TLS (and plainly, for the test) and reaches the master over
/// TLS; killed when dropped.
#[cfg(feature = "tls")]
struct TlsSentinel {
    child: std::process::Child,
    plain: u16,
    tls: u16,
    dir: std::path::PathBuf,
}

#[cfg(feature = "tls")]
fn read_log(dir: &std::path::Path) -> String {
    std::fs::read_to_string(dir.join("sentinel.log")).unwrap_or_else(|e| e.to_string())
}

#[cfg(feature = "tls")]
impl TlsSentinel {
    /// Starts the sentinel on two free ports, and again on others if it does not answer on
    /// both (a port found free can be taken by another test before the sentinel binds it).
    fn start(master: &support::tls::TlsRedisServer) -> TlsSentinel {
        let dir = support::scratch_dir("tls-sentinel");
        let file = |f: &str| master.certs.path(f).display().to_string();
        for _ in 0..20 {
            let (plain, tls) = (support::free_port(), support::free_port());
            let conf = dir.join("sentinel.conf");
            std::fs::write(
                &conf,
                format!(
                    "port {plain}\nbind 127.0.0.1\ndir {}\nlogfile sentinel.log\n\
                     tls-port {tls}\ntls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n\
                     tls-auth-clients no\ntls-replication yes\n\
                     sentinel monitor tlsmaster 127.0.0.1 {} 1\n",
                    dir.display(),
                    file("server.crt"),
                    file("server.key"),
                    file("ca.crt"),
                    master.tls_port()
                ),
            )
            .unwrap();
            let child = std::process::Command::new("redis-server")
                .arg(&conf)
                .arg("--sentinel")
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("start a sentinel");
            let sentinel = TlsSentinel {
                child,
                plain,
                tls,
                dir: dir.clone(),
            };
            if eventually(Duration::from_secs(20), || sentinel.listens()) {
                return sentinel;
            }
            // Dropping it kills it; the next try takes other ports.
        }
        panic!("a TLS sentinel did not start: {}", read_log(&dir));
    }

    /// Whether the sentinel answers `PING` on its plain port and accepts connections on its
    /// TLS port.
    fn listens(&self) -> bool {
        let pong = redis::Client::open(format!("redis://127.0.0.1:{}/", self.plain))
            .ok()
            .and_then(|c| c.get_connection_with_timeout(Duration::from_secs(2)).ok())
            .is_some_and(|mut conn| redis::cmd("PING").query::<String>(&mut conn).is_ok());
        pong && std::net::TcpStream::connect(("127.0.0.1", self.tls)).is_ok()
    }

    /// The sentinel's log, for a failure's message.
    fn log(&self) -> String {
        read_log(&self.dir)
    }

    /// Whether the sentinel has heard from the master lately and finds it healthy (from
    /// `SENTINEL MASTER`, over its plain port).
    fn sees_master(&self) -> bool {
        self.master_fields().is_some_and(|f| {
            f.get("flags").map(String::as_str) == Some("master")
                && f.get("info-refresh")
                    .and_then(|v| v.parse::<u64>().ok())
                    .is_some_and(|ms| ms < 5000)
        })
    }

    fn master_fields(&self) -> Option<std::collections::HashMap<String, String>> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.plain)).ok()?;
        let mut conn = client
            .get_connection_with_timeout(Duration::from_secs(2))
            .ok()?;
        redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg("tlsmaster")
            .query(&mut conn)
            .ok()
    }
}

#[cfg(feature = "tls")]
impl Drop for TlsSentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `rediss+sentinel://`: TLS to the sentinel, and to the master it names.
#[cfg(feature = "tls")]
#[test]
fn a_sentinel_deployment_over_tls() {
    use support::tls::{ClientAuth, TlsRedisServer};
    let master = TlsRedisServer::start(ClientAuth::Off, &[]);
    let sentinel = TlsSentinel::start(&master);
    // The sentinel reaches the master over TLS and finds it healthy.
    assert!(
        eventually(LIMIT, || sentinel.sees_master()),
        "the sentinel never saw the master healthy: {:?}\n{}",
        sentinel.master_fields(),
        sentinel.log()
    );
    let url = format!("rediss+sentinel://127.0.0.1:{}/tlsmaster", sentinel.tls);
    let client = Client::builder()
        .tls_ca_certificates(master.certs.ca())
        .connect_timeout(Duration::from_secs(5))
        .open(url.as_str())
        .unwrap();
    let g = client.mutex("over-tls").lock().unwrap();
    let exists: bool = redis::cmd("EXISTS")
        .arg("redmutex:{over-tls}")
        .query(&mut master.server.conn())
        .unwrap();
    assert!(exists, "the lock is not on the master");
    // A waiter of another client (a thread of the same client would be passed the lock
    // without a release), over its own TLS subscriber connection, hears the release.
    let waiter = Client::builder()
        .tls_ca_certificates(master.certs.ca())
        .connect_timeout(Duration::from_secs(5))
        .open(url.as_str())
        .unwrap();
    let listener = waiter.clone();
    let t = std::thread::spawn(move || {
        listener
            .mutex("over-tls")
            .try_lock_for(LIMIT)
            .map(|g| g.is_some())
    });
    assert!(eventually(LIMIT, || waiter.stats().contended >= 1));
    std::thread::sleep(Duration::from_millis(200));
    g.unlock().unwrap();
    assert!(within(LIMIT, move || t.join().unwrap()).unwrap());
    assert!(
        waiter.stats().notifications >= 1,
        "the release was not heard"
    );
    // Without the CA, the sentinel's certificate is refused: a connection error, in time.
    let untrusting = Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .open(url.as_str())
        .unwrap();
    let started = Instant::now();
    let err = untrusting.mutex("over-tls").try_lock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(started.elapsed() < Duration::from_secs(15));
}

/// Optimistic updates through the failover of a killed master: updates go on on the new
/// master, and the only errors are those of a write whose outcome is unknown.
#[test]
fn updates_go_on_through_the_failover_of_a_killed_master() {
    let mut deployment = SentinelDeployment::start();
    let client = client(&deployment);
    let counter = client.shared::<u64>("optimistic");
    counter.update(|n| *n += 1).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (c, stopped) = (counter.clone(), std::sync::Arc::clone(&stop));
    let worker = std::thread::spawn(move || -> redmutex::Result<(u64, u64)> {
        let (mut written, mut unknown) = (1, 0);
        while !stopped.load(std::sync::atomic::Ordering::SeqCst) {
            match c.update_for(LIMIT, |n| *n += 1) {
                Ok(()) => written += 1,
                Err(e) if matches!(e.kind(), ErrorKind::Timeout | ErrorKind::Connection) => {
                    unknown += 1
                }
                Err(e) => return Err(e),
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok((written, unknown))
    });
    std::thread::sleep(Duration::from_millis(300));
    let old = deployment.master().port();
    deployment.node_mut(old).kill();
    let new = deployment.wait_for_new_master(old);
    assert_ne!(old, new);
    let at_switch = client.stats().updates;
    assert!(eventually(LIMIT, || client.stats().updates > at_switch + 5));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (written, unknown) = within(LIMIT, move || worker.join().unwrap())
        .unwrap_or_else(|e| panic!("an update failed during the failover: {e}"));
    // Writes not yet on the promoted replica are lost with the old master; none is applied
    // twice.
    let value = counter.get().unwrap();
    assert!(
        value <= written + unknown,
        "{value} > {written} + {unknown}"
    );
    assert!(value > 5);
}

#[test]
fn lock_rides_through_the_failover_of_a_killed_master() {
    let mut deployment = SentinelDeployment::start();
    let client = client(&deployment);
    drop(client.mutex("busy").lock().unwrap());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (c, stopped) = (client.clone(), std::sync::Arc::clone(&stop));
    // A thread takes the lock again and again: no `lock()` may fail while the deployment
    // fails over (a release may: it is finished in the background).
    let worker = std::thread::spawn(move || -> redmutex::Result<u32> {
        let mut taken = 0;
        while !stopped.load(std::sync::atomic::Ordering::SeqCst) {
            let g = c.mutex("busy").lock()?;
            taken += 1;
            drop(g);
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(taken)
    });
    std::thread::sleep(Duration::from_millis(300));
    let old = deployment.master().port();
    deployment.node_mut(old).kill();
    let new = deployment.wait_for_new_master(old);
    assert_ne!(old, new);
    let taken_at_switch = client.stats().acquisitions;
    assert!(eventually(LIMIT, || client.stats().acquisitions > taken_at_switch + 5));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let taken = within(LIMIT, move || worker.join().unwrap())
        .unwrap_or_else(|e| panic!("lock() failed during the failover: {e}"));
    assert!(taken > 5);
    assert!(client.stats().outage_retries >= 1, "{:?}", client.stats());
}

#[test]
fn acknowledged_locks_are_still_granted_with_a_replica_dead() {
    let mut deployment = SentinelDeployment::start();
    let client = Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .replica_acks(2, Duration::from_millis(500))
        .open(deployment.url())
        .unwrap();
    drop(client.mutex("warm").lock().unwrap());
    let master = deployment.master().port();
    let replicas: Vec<usize> = (0..deployment.nodes.len())
        .filter(|&i| deployment.nodes[i].port() != master)
        .collect();
    deployment.nodes[replicas[0]].kill();
    // Until the sentinels count the dead replica down, acquires cannot be acknowledged by
    // both, and blocked ones keep trying; then the live replica's acknowledgement is enough.
    for i in 0..20 {
        let name = format!("acked-{i}");
        let g = client
            .mutex(&name)
            .lock()
            .unwrap_or_else(|e| panic!("acquire {i} with one replica dead: {e}"));
        let on_replica: bool = redis::cmd("EXISTS")
            .arg(format!("redmutex:{{{name}}}"))
            .query(&mut deployment.nodes[replicas[1]].conn())
            .unwrap();
        assert!(on_replica, "acquire {i} is not on the live replica");
        g.unlock().unwrap();
    }
    // A one-shot acquire is granted too, now that the sentinels count the replica down.
    assert!(client.mutex("one-shot").try_lock().unwrap().is_some());
    // The replica comes back: it is asked again (it must acknowledge once it is synced).
    deployment.nodes[replicas[0]].restart();
    let back = deployment.nodes[replicas[0]].port();
    let mut conn = deployment.nodes[replicas[0]].conn();
    let _: () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(master)
        .query(&mut conn)
        .unwrap();
    assert!(eventually(LIMIT, || deployment.settled()));
    let g = client.mutex("both-again").lock().unwrap();
    let on_returned: bool = redis::cmd("EXISTS")
        .arg("redmutex:{both-again}")
        .query(&mut deployment.node(back).conn())
        .unwrap();
    assert!(on_returned, "the returned replica did not acknowledge");
    drop(g);
}

#[test]
fn a_sentinel_client_waits_for_one_replica_by_default_and_can_be_told_not_to() {
    let deployment = SentinelDeployment::start();
    let master = deployment.master();
    let client = Client::open(deployment.url()).unwrap();
    let before = master.command_calls("wait");
    for _ in 0..5 {
        client.mutex("acked").lock().unwrap().unlock().unwrap();
    }
    let waited = master.command_calls("wait") - before;
    assert!(waited >= 5, "{waited} WAIT commands for 5 acquires");
    // An acknowledged acquire is on a replica when it returns.
    let g = client.mutex("on-replica").lock().unwrap();
    let on_replicas = deployment
        .nodes
        .iter()
        .filter(|node| node.port() != master.port())
        .filter(|node| {
            redis::cmd("EXISTS")
                .arg("redmutex:{on-replica}")
                .query::<bool>(&mut node.conn())
                .unwrap_or(false)
        })
        .count();
    assert!(on_replicas >= 1, "no replica had the lock");
    drop(g);

    let unacked = Client::builder()
        .no_replica_acks()
        .open(deployment.url())
        .unwrap();
    let before = master.command_calls("wait");
    for _ in 0..5 {
        unacked.mutex("unacked").lock().unwrap().unlock().unwrap();
    }
    assert_eq!(master.command_calls("wait"), before);
}
