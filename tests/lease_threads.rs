//! The background threads' life: started lazily, ended when the last handle of their client
//! is dropped, joined by `shutdown`. (A file of its own: it counts this process's threads.)

mod support;

use std::time::Duration;

use redmutex::Client;
use support::{eventually, threads_named, RedisServer};

// Thread names are cut to 15 bytes by Linux.
const RENEWAL: &str = "redmutex-renew";
const NOTIFY: &str = "redmutex-notify";
const POOL: &str = "redmutex-pool";

/// Makes a waiter wait briefly, which starts the subscriber thread.
fn contend(client: &Client) {
    let g = client.mutex("contended").lock().unwrap();
    let c = client.clone();
    let got = std::thread::spawn(move || {
        c.mutex("contended")
            .try_lock_for(Duration::from_millis(200))
            .unwrap()
            .is_some()
    })
    .join()
    .unwrap();
    assert!(!got);
    drop(g);
}

#[test]
fn renewal_thread_starts_lazily_and_stops_with_the_client() {
    let server = RedisServer::start();
    assert_eq!(threads_named(RENEWAL), 0);

    let client = Client::open(server.url()).unwrap();
    assert_eq!(threads_named(RENEWAL), 0, "started before any lock");
    let m = client.mutex("t");
    let g = m.lock().unwrap();
    // A new thread names itself as it starts: give it a moment.
    assert!(eventually(Duration::from_secs(30), || threads_named(
        RENEWAL
    ) == 1));
    drop(g);
    assert_eq!(
        threads_named(NOTIFY),
        0,
        "subscriber started without a waiter"
    );
    contend(&client);
    assert_eq!(threads_named(NOTIFY), 1);

    // Dropping the last handle stops both.
    drop(m);
    drop(client);
    assert!(
        eventually(Duration::from_secs(30), || threads_named(RENEWAL) == 0),
        "renewal thread still running after the client was dropped"
    );
    assert!(
        eventually(Duration::from_secs(30), || threads_named(NOTIFY) == 0),
        "subscriber thread still running after the client was dropped"
    );
    assert!(
        eventually(Duration::from_secs(30), || threads_named(POOL) == 0),
        "pool thread still running after the client was dropped"
    );

    // shutdown() joins it at once.
    let client = Client::open(server.url()).unwrap();
    drop(client.mutex("t").lock().unwrap());
    assert!(eventually(Duration::from_secs(30), || threads_named(
        RENEWAL
    ) == 1));
    contend(&client);
    client.shutdown();
    assert_eq!(threads_named(RENEWAL), 0);
    assert_eq!(threads_named(NOTIFY), 0);
    assert!(eventually(Duration::from_secs(30), || threads_named(POOL) == 0));

    // One pool thread for every pool of the process: two clients of two servers (four
    // pools with a Redlock over both) add one thread, which ends with the last of them.
    let other = RedisServer::start();
    let (a, b) = (
        Client::open(server.url()).unwrap(),
        Client::open(other.url()).unwrap(),
    );
    let redlock = redmutex::Redlock::open([server.url(), other.url()]).unwrap();
    drop(a.mutex("a").lock().unwrap());
    drop(b.mutex("b").lock().unwrap());
    drop(redlock.mutex("r").lock().unwrap());
    assert!(eventually(Duration::from_secs(30), || threads_named(POOL) == 1));
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(threads_named(POOL), 1, "a pool thread per client or server");
    drop((a, b, redlock));
    assert!(
        eventually(Duration::from_secs(30), || threads_named(POOL) == 0),
        "pool thread still running after every client was dropped"
    );
}
