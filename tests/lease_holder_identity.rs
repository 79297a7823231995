//! Holder identity on a real `redis-server`: a client announces its name, host, process and
//! start time under `P:client:<id>` (the id every token of it starts with), keeps it alive
//! with one `PEXPIRE` per renewal period, adds nothing to an acquire or a release, and its
//! announcement is gone within a lease after its process died.

mod support;

use std::time::Duration;

use redmutex::Client;
use support::{eventually, RedisServer};

const ENTRY: &str = "identity_worker_entry";
const LEASE: Duration = Duration::from_secs(2);

/// A process that holds a lock until it is killed.
#[test]
fn identity_worker_entry() {
    let Some((_, url, _)) = support::worker_role() else {
        return;
    };
    let client = client_of(&url, "doomed-worker");
    let _held = client.mutex("job").lock().unwrap();
    println!("HOLDING");
    std::thread::sleep(Duration::from_secs(120));
}

fn client_of(url: &str, name: &str) -> Client {
    Client::builder()
        .client_name(name)
        .default_lease(LEASE)
        .renewal_interval(Duration::from_millis(300))
        .open(url)
        .unwrap()
}

fn announcement(server: &RedisServer, client_id: &str) -> Vec<(String, String)> {
    redis::cmd("HGETALL")
        .arg(format!("redmutex:client:{client_id}"))
        .query(&mut server.conn())
        .unwrap()
}

/// The client id of the holder of lock `name`, once that client announced itself.
fn announced_holder(server: &RedisServer, name: &str) -> String {
    let token: String = redis::cmd("GET")
        .arg(format!("redmutex:{{{name}}}"))
        .query(&mut server.conn())
        .unwrap();
    let id = token.split(':').next().unwrap().to_owned();
    assert!(eventually(Duration::from_secs(10), || {
        !announcement(server, &id).is_empty()
    }));
    id
}

#[test]
fn a_client_announces_who_it_is_and_costs_acquires_nothing() {
    let server = RedisServer::start();
    let client = client_of(&server.url(), "billing-worker");
    let guard = client.mutex("orders:42").lock().unwrap();
    let id = announced_holder(&server, "orders:42");
    let fields = announcement(&server, &id);
    let get = |k: &str| fields.iter().find(|(f, _)| f == k).map(|(_, v)| v.clone());
    assert_eq!(get("name").as_deref(), Some("billing-worker"));
    assert_eq!(get("pid"), Some(std::process::id().to_string()));
    assert!(get("host").is_some_and(|h| !h.is_empty()));
    assert!(get("started_ms").is_some_and(|ms| ms.parse::<u64>().is_ok()));
    let ttl: i64 = redis::cmd("PTTL")
        .arg(format!("redmutex:client:{id}"))
        .query(&mut server.conn())
        .unwrap();
    assert!(ttl > 0 && ttl <= 2300, "{ttl}");
    drop(guard);

    // Acquires and releases write nothing of the announcement.
    let (hsets, expires) = (
        server.command_calls("hset"),
        server.command_calls("pexpire"),
    );
    for _ in 0..200 {
        client.mutex("orders:43").lock().unwrap().unlock().unwrap();
    }
    assert_eq!(server.command_calls("hset"), hsets);
    // Only the renewal thread's one PEXPIRE per 300 ms period, however many acquires.
    assert!(server.command_calls("pexpire") - expires < 50);

    // Kept alive past its lease while the client lives.
    std::thread::sleep(LEASE + Duration::from_millis(800));
    assert!(!announcement(&server, &id).is_empty());
}

#[test]
fn a_client_that_shuts_down_or_is_dropped_withdraws_its_announcement() {
    let server = RedisServer::start();
    for shut_down in [true, false] {
        // A lease of 20 s: the announcement would expire 20 s after the last renewal.
        let client = Client::builder()
            .client_name("short-lived")
            .default_lease(Duration::from_secs(20))
            .renewal_interval(Duration::from_millis(300))
            .open(server.url())
            .unwrap();
        let name = format!("brief-{shut_down}");
        let guard = client.mutex(&name).lock().unwrap();
        let id = announced_holder(&server, &name);
        drop(guard);
        match shut_down {
            true => client.shutdown(),
            false => drop(client),
        }
        // Gone at once, not a lease later.
        assert!(
            eventually(Duration::from_secs(10), || announcement(&server, &id)
                .is_empty()),
            "the announcement outlived a clean {}",
            if shut_down { "shutdown" } else { "drop" }
        );
    }
}

#[test]
fn a_dead_clients_announcement_is_gone_within_a_lease() {
    let server = RedisServer::start();
    let mut worker = support::spawn_worker(ENTRY, "holder", &server.url(), "");
    support::read_marker(&mut worker, "HOLDING");
    let id = announced_holder(&server, "job");
    let info = Client::open(server.url())
        .unwrap()
        .lock_info("job")
        .unwrap();
    let holder = info.holder.expect("held");
    let named = holder.client.expect("announced");
    assert_eq!(named.name, "doomed-worker");
    assert_eq!(named.pid, worker.id());
    worker.kill().unwrap();
    worker.wait().unwrap();
    // A lease plus a renewal period at most, with room for a loaded machine.
    assert!(eventually(Duration::from_secs(10), || announcement(
        &server, &id
    )
    .is_empty()));
}
