//! Security and hostile servers: `rediss://` with a private CA and with client certificates,
//! TLS failures, Redis ACL users with and without what a lock needs, passwords kept out of
//! `Debug`, errors and logs, and a Redis out of memory. Every failure is a typed error within
//! its deadline and leaves nothing behind.

mod support;

use std::collections::HashMap;
use std::sync::{Mutex as StdMutex, Once};
use std::time::{Duration, Instant};

use redmutex::{Builder, Client, Error, ErrorKind};
use support::{eventually, within, RedisServer};

const LIMIT: Duration = Duration::from_secs(60);

/// The password of the ACL users made here.
const ACL_PASSWORD: &str = "acl-pass-7f3e0b";
/// The `requirepass` of the server that has one.
const REQUIREPASS: &str = "requirepass-5d8a11";
/// A wrong guess.
const WRONG_PASSWORD: &str = "wrong-guess-91c2aa";
/// None of these may appear in anything the crate prints or logs.
const SECRETS: [&str; 3] = [ACL_PASSWORD, REQUIREPASS, WRONG_PASSWORD];

/// What an ACL user needs to use every feature of the crate, as docs/guide/tls-and-acl.md
/// lists it (`WAIT` only with `Builder::replica_acks`). Keys and channels: `~redmutex:*` and `&redmutex:*`
/// for the default key prefix. Redis 6.2 has no sharded pub/sub: there the classic commands,
/// as docs/guide/tls-and-acl.md says.
fn lock_commands() -> String {
    let pubsub = match support::server_version().redis_before(7, 0) {
        true => "+publish +subscribe +unsubscribe",
        false => "+spublish +ssubscribe +sunsubscribe",
    };
    format!(
        "+evalsha +script|load +get +set +del +exists +incr +incrby +pttl +pexpire +pexpireat +time \
         +type {pubsub} +lindex +llen +lpop +rpush +lrem +zadd +zrem +zscore +zmscore +zpopmin \
         +zcard +hset +blpop +wait"
    )
}

/// What the other kinds add to [`lock_commands`], as docs/guide/tls-and-acl.md lists it: an
/// `RwLock`, a semaphore, a `Shared<T>`, an election, and who holds what.
const OTHER_KIND_COMMANDS: &str = "+zrange +zrangebyscore +zremrangebyscore +hget +hmget +hdel \
     +hexists +hvals +hgetall +lrange +mget +mset +xadd +xrange +xrevrange +scan +strlen +pubsub";

// ---------------------------------------------------------------------------------------
// Log capture, for every test of this file: a logger that keeps every record at every level.
// ---------------------------------------------------------------------------------------

struct CapturedLogs {
    lines: StdMutex<Vec<String>>,
}

impl log::Log for CapturedLogs {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let line = format!("{} {}: {}", record.level(), record.target(), record.args());
        self.lines
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(line);
    }

    fn flush(&self) {}
}

static LOGS: CapturedLogs = CapturedLogs {
    lines: StdMutex::new(Vec::new()),
};

fn capture_logs() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        log::set_logger(&LOGS).expect("no other logger in this test binary");
        log::set_max_level(log::LevelFilter::Trace);
    });
}

fn captured_logs() -> String {
    LOGS.lines
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .join("\n")
}

fn assert_no_secret(what: &str, text: &str) {
    for secret in SECRETS {
        assert!(!text.contains(secret), "{what} shows a password: {text}");
    }
}

/// Checks the error's Display, Debug and every source's Display for passwords.
fn assert_error_hides_secrets(err: &Error) {
    assert_no_secret("error", &err.to_string());
    assert_no_secret("error Debug", &format!("{err:?}"));
    let mut source = std::error::Error::source(err);
    while let Some(s) = source {
        assert_no_secret("error source", &s.to_string());
        source = s.source();
    }
}

// ---------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------

fn builder() -> Builder {
    Client::builder()
        .connect_timeout(Duration::from_secs(5))
        .response_timeout(Duration::from_secs(5))
}

/// A client that gives up soon on a server that does not answer (and, since a refused
/// connection is retried until the connect timeout, on wrong credentials).
fn fast_failing() -> Builder {
    Client::builder()
        .connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
        .backoff(Duration::from_millis(2), Duration::from_millis(50))
}

fn try_lock_error(client: &Client, name: &str) -> Error {
    let (client, name) = (client.clone(), name.to_owned());
    within(LIMIT, move || {
        client.mutex(&name).try_lock().map(|g| g.is_some())
    })
    .expect_err("the acquire should have failed")
}

/// Every key in the server but the clients' announcements (`redmutex:client:…`), sorted.
fn all_keys(server: &RedisServer) -> Vec<String> {
    let mut keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut server.conn())
        .expect("KEYS");
    keys.retain(|k| !k.starts_with("redmutex:client:"));
    keys.sort();
    keys
}

/// Whether the lock `name` or its waiters flag exists (its fencing counter may stay).
fn lock_keys_exist(server: &RedisServer, name: &str) -> bool {
    redis::cmd("EXISTS")
        .arg(format!("redmutex:{{{name}}}"))
        .arg(format!("redmutex:{{{name}}}:waiting"))
        .query::<i64>(&mut server.conn())
        .expect("EXISTS")
        > 0
}

/// Checks that a correct client can take the lock `name` (nobody left it held) and release it.
fn assert_lock_usable(url: impl redmutex::IntoAddress, builder: Builder, name: &str) {
    let client = builder.open(url).expect("client");
    let name = name.to_owned();
    let taken = within(LIMIT, move || {
        let g = client.mutex(&name).try_lock()?;
        g.map(|g| g.unlock()).transpose().map(|r| r.is_some())
    });
    assert!(
        taken.expect("a correct client failed"),
        "the lock was left held"
    );
}

/// Waits until the one waiting thread of `waiter` failed its attempt made after subscribing
/// (a waiter subscribes after its first failed attempt, then tries again): from then on,
/// only the release's announcement, or a re-check seconds later, wakes it.
fn wait_until_subscribed_and_waiting(waiter: &Client) {
    assert!(eventually(LIMIT, || {
        let stats = waiter.stats();
        stats.contended == 1 && stats.attempts >= 2
    }));
}

/// Creates an ACL user with `ACL_PASSWORD` and `rules` (after `reset`).
fn acl_user(server: &RedisServer, name: &str, rules: &str) {
    let mut cmd = redis::cmd("ACL");
    cmd.arg("SETUSER")
        .arg(name)
        .arg("reset")
        // Redis 6.2 starts a user with every channel (`acl-pubsub-default allchannels`).
        .arg("resetchannels")
        .arg("on")
        .arg(format!(">{ACL_PASSWORD}"));
    for rule in rules.split_whitespace() {
        cmd.arg(rule);
    }
    cmd.query::<()>(&mut server.conn()).expect("ACL SETUSER");
}

fn acl_url(server: &RedisServer, user: &str) -> String {
    format!("redis://{user}:{ACL_PASSWORD}@127.0.0.1:{}/", server.port())
}

/// The refusals that are not the crate's: what redis-rs sends on its own and whose refusal it
/// ignores, `CLIENT SETINFO` on connect (which Redis 6.2's ACL LOG names without its
/// subcommand) and `PUNSUBSCRIBE` when it closes a subscriber connection.
const IGNORED_REFUSALS: [&str; 3] = [
    "command client|setinfo",
    "command client",
    "command punsubscribe",
];

/// What `ACL LOG` recorded as refused: `reason object` (e.g. `command get`).
fn acl_refusals(server: &RedisServer) -> Vec<String> {
    let entries: Vec<HashMap<String, redis::Value>> = redis::cmd("ACL")
        .arg("LOG")
        .query(&mut server.conn())
        .expect("ACL LOG");
    let text = |v: Option<&redis::Value>| match v {
        Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
        Some(redis::Value::SimpleString(s)) => s.clone(),
        other => format!("{other:?}"),
    };
    entries
        .iter()
        .map(|e| format!("{} {}", text(e.get("reason")), text(e.get("object"))))
        .collect()
}

/// What `ACL LOG` recorded as refused, but for [`IGNORED_REFUSALS`].
fn crate_refusals(server: &RedisServer) -> Vec<String> {
    let mut refusals = acl_refusals(server);
    refusals.retain(|r| !IGNORED_REFUSALS.contains(&r.as_str()));
    refusals
}

// ---------------------------------------------------------------------------------------
// ACL users
// ---------------------------------------------------------------------------------------

#[test]
fn an_acl_user_with_the_documented_lock_commands_can_use_every_feature_of_a_lock() {
    capture_logs();
    let server = RedisServer::start();
    acl_user(
        &server,
        "locker",
        &format!("~redmutex:* &redmutex:* {}", lock_commands()),
    );
    let url = acl_url(&server, "locker");
    let client = builder()
        .default_lease(Duration::from_secs(3))
        .renewal_interval(Duration::from_millis(500))
        .open(url.as_str())
        .unwrap();
    let waiter = builder()
        .default_lease(Duration::from_secs(3))
        .renewal_interval(Duration::from_millis(500))
        .backoff(Duration::from_secs(10), Duration::from_secs(10))
        .open(url.as_str())
        .unwrap();

    // The start-up check.
    client.check().unwrap();
    // Lock, re-check, extend, renewal across the lease, fencing.
    let m = client.mutex("acct");
    let g = m.lock().unwrap();
    assert!(m.is_locked().unwrap());
    g.extend(Duration::from_secs(3)).unwrap();
    let renewals = client.stats().renewals;
    assert!(eventually(LIMIT, || client.stats().renewals >= renewals + 3));
    g.verify().unwrap();
    let first = g.fencing_token();

    // A contended wake-up through the subscriber.
    let w = waiter.clone();
    let t = std::thread::spawn(move || {
        w.mutex("acct")
            .try_lock_for(LIMIT)
            .map(|g| g.map(|g| g.fencing_token()))
    });
    wait_until_subscribed_and_waiting(&waiter);
    g.unlock().unwrap();
    let second = t
        .join()
        .unwrap()
        .unwrap()
        .expect("the waiter never got the lock");
    assert!(second > first);
    assert!(eventually(LIMIT, || waiter.stats().notifications >= 1));
    // Idle channels (the waiting client's own) are unsubscribed after a while: sharded
    // ones on Redis 7 and later, classic ones before.
    let subscribed = |kind: &str| -> usize {
        redis::cmd("PUBSUB")
            .arg(kind)
            .arg("redmutex:{acct}:ch*")
            .query::<Vec<String>>(&mut server.conn())
            .map_or(0, |channels| channels.len())
    };
    assert!(eventually(LIMIT, || subscribed("CHANNELS")
        + subscribed("SHARDCHANNELS")
        == 0));

    // Force-unlock, and a poison record left by a panicking holder, read and cleared.
    let held = client.mutex("acct").lock().unwrap();
    assert!(waiter.mutex("acct").force_unlock().unwrap());
    assert!(held.unlock().unwrap_err().is_lock_lost());
    let c = client.clone();
    let panicked = std::thread::spawn(move || {
        let _g = c.mutex("ledger").lock().unwrap();
        panic!("a holder that panics, on purpose");
    })
    .join();
    assert!(panicked.is_err());
    let g = client
        .mutex("ledger")
        .try_lock()
        .unwrap()
        .expect("held after the panic");
    assert!(g.poison().unwrap().is_some());
    assert!(g.clear_poison().unwrap());
    g.unlock().unwrap();

    // A fair lock: contended, a waiter that times out and leaves, a waiter served in turn.
    let fair = client.fair_mutex("queue");
    let g = fair.lock().unwrap();
    let w = waiter.clone();
    let gave_up = std::thread::spawn(move || {
        w.fair_mutex("queue")
            .try_lock_for(Duration::from_millis(300))
            .map(|g| g.is_some())
    })
    .join()
    .unwrap();
    assert!(!gave_up.unwrap());
    let w = waiter.clone();
    let t = std::thread::spawn(move || {
        w.fair_mutex("queue")
            .try_lock_for(LIMIT)
            .map(|g| g.is_some())
    });
    assert!(eventually(LIMIT, || {
        redis::cmd("LLEN")
            .arg("redmutex:{queue}:queue")
            .query::<i64>(&mut server.conn())
            .unwrap()
            == 1
    }));
    // Past a few heartbeats of the waiter.
    let renewals = waiter.stats().renewals;
    assert!(eventually(LIMIT, || waiter.stats().renewals >= renewals + 2));
    g.unlock().unwrap();
    assert!(t.join().unwrap().unwrap());

    // Threads of one client passing the lock among themselves while another client waits.
    use_a_mutex_passed_between_threads(&client, &waiter);

    // Replica acknowledgements (WAIT): refused only for want of replicas.
    let acks = builder()
        .replica_acks(1, Duration::from_millis(100))
        .open(url.as_str())
        .unwrap();
    let err = acks.mutex("w").try_lock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotReplicated, "{err}");

    // Nothing was refused but what redis-rs sends on its own.
    let refused = crate_refusals(&server);
    assert!(refused.is_empty(), "refused: {refused:?}");
    assert_eq!(client.stats().subscriber_reconnects, 0);
    assert_eq!(waiter.stats().subscriber_reconnects, 0);
    assert!(!lock_keys_exist(&server, "acct"));
    assert!(!lock_keys_exist(&server, "ledger"));
    assert!(!lock_keys_exist(&server, "queue"));
    client.shutdown();
    waiter.shutdown();
}

#[test]
fn acl_users_lacking_what_a_lock_needs_get_auth_errors_and_write_nothing() {
    capture_logs();
    let server = RedisServer::start();
    let users = [
        // No scripts at all: EVALSHA is refused.
        ("no-scripting", "~* &* +@all -@scripting".to_owned()),
        ("no-evalsha", "~* &* +@all -evalsha".to_owned()),
        // Keys outside the crate's prefix only: EVALSHA's keys are refused.
        ("other-keys", "~other:* &* +@all".to_owned()),
        // A command refused inside the acquire script, before and after it took the lock.
        (
            "no-set",
            format!("~redmutex:* &redmutex:* {} -set", lock_commands()),
        ),
        (
            "no-incr",
            format!("~redmutex:* &redmutex:* {} -incr", lock_commands()),
        ),
    ];
    for (user, rules) in &users {
        acl_user(&server, user, rules);
        let client = fast_failing().open(acl_url(&server, user)).unwrap();
        let err = try_lock_error(&client, "guarded");
        assert_eq!(err.kind(), ErrorKind::Auth, "{user}: {err}");
        assert!(err.is_auth());
        assert!(err.to_string().contains("NOPERM"), "{user}: {err}");
        assert_error_hides_secrets(&err);
        // A blocking acquire gives up too, rather than retrying forever.
        let c = client.clone();
        let err = within(LIMIT, move || c.mutex("guarded").lock().map(drop)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Auth, "{user}: {err}");
        let c = client.clone();
        let err = within(LIMIT, move || c.fair_mutex("fair").lock().map(drop)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Auth, "{user}: {err}");
        assert!(
            all_keys(&server).is_empty(),
            "{user} left {:?}",
            all_keys(&server)
        );
    }
    // Redis refused what each test meant it to.
    let refusals = acl_refusals(&server);
    for refusal in [
        "command evalsha",
        "key redmutex:{guarded}",
        "command set",
        "command incr",
    ] {
        assert!(refusals.iter().any(|r| r == refusal), "{refusals:?}");
    }
    assert_lock_usable(server.url(), builder(), "guarded");
    assert_no_secret("logs", &captured_logs());
}

/// Two clients of an ACL user without `+blpop` (the rules documented before it) pass a lock
/// between them: their waiters wait for announcements alone, the refusal told once.
#[test]
fn an_acl_user_without_the_blocking_pop_is_woken_by_announcements_alone() {
    capture_logs();
    let server = RedisServer::start();
    acl_user(
        &server,
        "no-blpop",
        &format!("~redmutex:* &redmutex:* {} -blpop", lock_commands()),
    );
    let url = acl_url(&server, "no-blpop");
    let clients: Vec<Client> = (0..2)
        .map(|_| builder().open(url.as_str()).unwrap())
        .collect();
    let mut tokens = support::take_turns(&clients, "no-pop", 100);
    tokens.dedup();
    assert_eq!(tokens.len(), 200, "a fencing token was handed out twice");
    let handed: u64 = clients.iter().map(|c| c.stats().handed_over).sum();
    assert!(handed > 0, "the lock was never handed between the clients");
    assert!(
        acl_refusals(&server).iter().any(|r| r.contains("blpop")),
        "no pop was tried: {:?}",
        acl_refusals(&server)
    );
    let told = captured_logs().matches("the ACL user needs +blpop").count();
    assert!(
        (1..=2).contains(&told),
        "told {told} times, once per client"
    );
}

#[test]
fn a_lock_taken_without_a_script_whose_script_is_then_refused_is_given_back() {
    if support::server_version().redis_before(7, 0) {
        eprintln!("skipped: Redis 6.2 refuses SET NX GET, so every take is a script there");
        return;
    }
    capture_logs();
    let server = RedisServer::start();
    acl_user(
        &server,
        "revoked",
        &format!("~redmutex:* &redmutex:* {}", lock_commands()),
    );
    let client = fast_failing().open(acl_url(&server, "revoked")).unwrap();
    // A lease far past the test's limit: only the give-back frees the lock in time.
    let m = client
        .mutex("revoked")
        .with_fixed_lease(Duration::from_secs(3600));
    m.lock().unwrap().unlock().unwrap();
    // The counter is lost (the client saw it started, so it takes the lock with plain
    // commands) and scripts are refused: the plain `SET` takes the lock, the script that
    // must start the counter is refused.
    let mut conn = server.conn();
    let _: () = redis::cmd("DEL")
        .arg("redmutex:{revoked}:fence")
        .query(&mut conn)
        .unwrap();
    acl_user(
        &server,
        "revoked",
        &format!("~redmutex:* &redmutex:* {} -evalsha", lock_commands()),
    );
    let err = within(LIMIT, move || m.try_lock().map(|g| g.is_some())).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
    let held: bool = redis::cmd("EXISTS")
        .arg("redmutex:{revoked}")
        .query(&mut conn)
        .unwrap();
    assert!(held, "the plain take did not happen");
    // Scripts allowed again: the token-checked give-back goes through.
    acl_user(
        &server,
        "revoked",
        &format!("~redmutex:* &redmutex:* {}", lock_commands()),
    );
    assert!(eventually(LIMIT, || {
        !redis::cmd("EXISTS")
            .arg("redmutex:{revoked}")
            .query::<bool>(&mut conn)
            .unwrap()
    }));
    let fence = client.mutex("revoked").lock().unwrap().fencing_token();
    assert!(
        fence >= 1 << 40,
        "a token from a counter never started: {fence}"
    );
    assert_no_secret("logs", &captured_logs());
}

#[test]
fn wrong_acl_credentials_are_auth_errors_without_the_password() {
    capture_logs();
    let server = RedisServer::start();
    acl_user(
        &server,
        "locker",
        &format!("~redmutex:* &redmutex:* {}", lock_commands()),
    );
    for url in [
        format!(
            "redis://locker:{WRONG_PASSWORD}@127.0.0.1:{}/",
            server.port()
        ),
        format!("redis://nobody:{ACL_PASSWORD}@127.0.0.1:{}/", server.port()),
    ] {
        let client = fast_failing().open(url.as_str()).unwrap();
        assert_no_secret("client Debug", &format!("{client:?}"));
        let err = try_lock_error(&client, "a");
        assert_eq!(err.kind(), ErrorKind::Auth, "{err}");
        assert_error_hides_secrets(&err);
    }
    assert!(all_keys(&server).is_empty());
    let client = fast_failing().open(acl_url(&server, "locker")).unwrap();
    client.mutex("a").lock().unwrap().unlock().unwrap();
    assert_no_secret("logs", &captured_logs());
}

// ---------------------------------------------------------------------------------------
// TLS
// ---------------------------------------------------------------------------------------

#[cfg(feature = "tls")]
mod over_tls {
    use std::io::Read;
    use std::net::TcpListener;
    use std::sync::mpsc;

    use super::*;
    use support::tls::{ClientAuth, TestCerts, TlsRedisServer};

    /// A client of the TLS port that trusts the server's CA.
    fn tls_client(tls: &TlsRedisServer, credentials: &str) -> Client {
        builder()
            .tls_ca_certificates(tls.certs.ca())
            .open(tls.tls_url(credentials))
            .expect("client")
    }

    #[test]
    fn locks_fencing_renewal_and_wakeups_work_over_tls() {
        capture_logs();
        let tls = TlsRedisServer::start(ClientAuth::Off, &[]);
        let holder = builder()
            .tls_ca_certificates(tls.certs.ca())
            .default_lease(Duration::from_secs(3))
            .renewal_interval(Duration::from_millis(500))
            .open(tls.tls_url(""))
            .unwrap();
        // Backoff alone would take 10 s to notice a release: only the announcement is quick.
        let waiter = builder()
            .tls_ca_certificates(tls.certs.ca())
            .backoff(Duration::from_secs(10), Duration::from_secs(10))
            .open(tls.tls_url(""))
            .unwrap();

        let g = holder.mutex("orders").lock().unwrap();
        let first = g.fencing_token();
        assert!(holder.mutex("orders").is_locked().unwrap());
        // Renewed over TLS, past the lease.
        let since = Instant::now();
        let renewals = holder.stats().renewals;
        assert!(eventually(LIMIT, || {
            since.elapsed() > Duration::from_secs(4) && holder.stats().renewals >= renewals + 3
        }));
        g.verify().unwrap();

        let w = waiter.clone();
        let t = std::thread::spawn(move || {
            let g = w.mutex("orders").try_lock_for(LIMIT)?;
            Ok::<_, Error>(match g {
                Some(g) => {
                    let token = g.fencing_token();
                    g.unlock()?;
                    Some(token)
                }
                None => None,
            })
        });
        wait_until_subscribed_and_waiting(&waiter);
        g.unlock().unwrap();
        let second = t
            .join()
            .unwrap()
            .unwrap()
            .expect("the waiter never got the lock");
        assert!(second > first, "fencing tokens {first} then {second}");
        // The subscriber thread, over its own TLS connection, received the announcement.
        assert!(eventually(LIMIT, || waiter.stats().notifications >= 1));
        assert_eq!(waiter.stats().subscriber_reconnects, 0);

        assert!(!lock_keys_exist(&tls.server, "orders"));
        assert_eq!(
            all_keys(&tls.server),
            ["redmutex:{orders}:fence".to_owned()]
        );
        holder.shutdown();
        waiter.shutdown();
    }

    #[test]
    fn client_certificates_are_presented_when_the_server_requires_them() {
        capture_logs();
        let tls = TlsRedisServer::start(ClientAuth::Required, &[]);
        let without = fast_failing()
            .tls_ca_certificates(tls.certs.ca())
            .open(tls.tls_url(""))
            .unwrap();
        let err = try_lock_error(&without, "m");
        assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
        assert!(all_keys(&tls.server).is_empty());

        let with = builder()
            .tls_ca_certificates(tls.certs.ca())
            .tls_client_certificate(tls.certs.client_cert(), tls.certs.client_key())
            .open(tls.tls_url(""))
            .unwrap();
        let g = with.mutex("m").lock().unwrap();
        assert!(with.mutex("m").is_locked().unwrap());
        g.unlock().unwrap();
        assert!(!lock_keys_exist(&tls.server, "m"));
    }

    #[test]
    fn an_untrusted_server_certificate_is_a_connection_error() {
        capture_logs();
        let tls = TlsRedisServer::start(ClientAuth::Off, &[]);
        // No CA given: the system's trust store does not know the test CA.
        let system_roots = fast_failing().open(tls.tls_url("")).unwrap();
        let err = try_lock_error(&system_roots, "u");
        assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
        assert!(err.to_string().contains("certificate"), "{err}");

        // Another CA than the one that signed the server's certificate.
        let other = TestCerts::generate();
        let wrong_ca = fast_failing()
            .tls_ca_certificates(other.ca())
            .open(tls.tls_url(""))
            .unwrap();
        let err = try_lock_error(&wrong_ca, "u");
        assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
        assert!(err.to_string().contains("certificate"), "{err}");

        // A name the certificate does not carry (it is for 127.0.0.1 and localhost).
        let wrong_name = fast_failing()
            .tls_ca_certificates(tls.certs.ca())
            .open(format!("rediss://127.0.0.2:{}/", tls.tls_port()))
            .unwrap();
        let err = try_lock_error(&wrong_name, "u");
        assert_eq!(err.kind(), ErrorKind::Connection, "{err}");

        assert_nothing_written_and_tls_works(&tls, "u");
    }

    /// After a failed connection: no key was written, and a correct client takes `name`.
    fn assert_nothing_written_and_tls_works(tls: &TlsRedisServer, name: &str) {
        assert!(all_keys(&tls.server).is_empty());
        assert_lock_usable(
            tls.tls_url(""),
            builder().tls_ca_certificates(tls.certs.ca()),
            name,
        );
    }

    #[test]
    fn plain_and_tls_ports_mixed_up_fail_within_the_timeouts() {
        capture_logs();
        let tls = TlsRedisServer::start(ClientAuth::Off, &[]);
        // Plain text to the TLS port.
        let plain_to_tls = fast_failing()
            .open(format!("redis://127.0.0.1:{}/", tls.tls_port()))
            .unwrap();
        let err = try_lock_error(&plain_to_tls, "p");
        assert_eq!(err.kind(), ErrorKind::Connection, "{err}");

        // A TLS handshake to the plain port.
        let tls_to_plain = fast_failing()
            .tls_ca_certificates(tls.certs.ca())
            .open(format!("rediss://127.0.0.1:{}/", tls.server.port()))
            .unwrap();
        let err = try_lock_error(&tls_to_plain, "p");
        assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
        assert!(err.to_string().contains("is this a TLS port?"), "{err}");

        assert_nothing_written_and_tls_works(&tls, "p");
    }

    #[test]
    fn a_tls_handshake_that_gets_no_answer_ends_within_the_connect_timeout() {
        capture_logs();
        let certs = TestCerts::generate();
        // Accepts connections and never says a word; tells when the client closes its side.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let (closed_tx, closed_rx) = mpsc::channel();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else { return };
                let closed = closed_tx.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while matches!(stream.read(&mut buf), Ok(n) if n > 0) {}
                    let _ = closed.send(());
                });
            }
        });
        let client = fast_failing()
            .tls_ca_certificates(certs.ca())
            .open(format!("rediss://127.0.0.1:{port}/"))
            .unwrap();
        let err = try_lock_error(&client, "silent");
        assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
        let c = client.clone();
        let err = within(LIMIT, move || c.mutex("silent").lock().map(drop)).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
        // The connection attempt itself gave up (the client closed the socket) rather than
        // hanging on in the pool's background thread.
        closed_rx
            .recv_timeout(LIMIT)
            .expect("the client never gave up its silent connection");
    }

    #[test]
    fn bad_tls_settings_are_config_errors() {
        capture_logs();
        let certs = TestCerts::generate();
        let url = "rediss://127.0.0.1:6380/";
        let cases: Vec<(&str, Builder)> = vec![
            (
                "empty CA",
                Client::builder().tls_ca_certificates(Vec::new()),
            ),
            (
                "CA that is not PEM",
                Client::builder().tls_ca_certificates(b"not a certificate".to_vec()),
            ),
            (
                "client key as CA",
                Client::builder().tls_ca_certificates(certs.client_key()),
            ),
            (
                "a key that is not the certificate's",
                Client::builder().tls_client_certificate(certs.client_cert(), certs.read("ca.key")),
            ),
            (
                "a certificate as the key",
                Client::builder().tls_client_certificate(certs.client_cert(), certs.client_cert()),
            ),
            (
                "a key as the certificate",
                Client::builder().tls_client_certificate(certs.client_key(), certs.client_key()),
            ),
        ];
        let key_text = String::from_utf8(certs.client_key()).unwrap();
        let key_body = key_text.lines().nth(1).expect("a PEM body line");
        for (what, builder) in cases {
            let shown = format!("{builder:?}");
            assert!(
                !shown.contains(key_body),
                "{what}: Debug shows the key: {shown}"
            );
            let err = builder.open(url).expect_err(what);
            assert_eq!(err.kind(), ErrorKind::Config, "{what}: {err}");
            assert!(!err.to_string().contains(key_body), "{what}: {err}");
        }
        // TLS settings with a plain URL would silently not use them.
        let err = Client::builder()
            .tls_ca_certificates(certs.ca())
            .open("redis://127.0.0.1:6379/")
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Config, "{err}");
        // Good settings open (and connect to nothing yet).
        Client::builder()
            .tls_ca_certificates(certs.ca())
            .tls_client_certificate(certs.client_cert(), certs.client_key())
            .open(url)
            .unwrap();
    }

    #[test]
    fn passwords_stay_out_of_debug_errors_and_logs() {
        capture_logs();
        let tls = TlsRedisServer::start(ClientAuth::Off, &["--requirepass", REQUIREPASS]);
        let mut admin = redis::Client::open(format!(
            "redis://:{REQUIREPASS}@127.0.0.1:{}/",
            tls.server.port()
        ))
        .unwrap()
        .get_connection_with_timeout(LIMIT)
        .unwrap();
        redis::cmd("ACL")
            .arg("SETUSER")
            .arg("locker")
            .arg("on")
            .arg(format!(">{ACL_PASSWORD}"))
            .arg("~redmutex:*")
            .arg("&redmutex:*")
            .arg("+@all")
            .query::<()>(&mut admin)
            .unwrap();

        let mut errors = Vec::new();
        let good = [
            tls_client(&tls, &format!(":{REQUIREPASS}@")),
            tls_client(&tls, &format!("locker:{ACL_PASSWORD}@")),
        ];
        for client in &good {
            assert_no_secret("client Debug", &format!("{client:?}"));
            let g = client.mutex("s").lock().unwrap();
            assert_no_secret("guard Debug", &format!("{g:?}"));
            g.unlock().unwrap();
        }
        // A waiter (and so the subscriber thread) with the right password.
        let holder = good[0].mutex("s").lock().unwrap();
        let w = good[1].clone();
        let t = std::thread::spawn(move || w.mutex("s").try_lock_for(LIMIT).map(|g| g.is_some()));
        assert!(eventually(LIMIT, || good[1].stats().contended == 1));
        holder.unlock().unwrap();
        assert!(t.join().unwrap().unwrap());

        // Wrong passwords, over TLS (with room for slow handshakes on a loaded machine, so that
        // the refusal, not a timeout, is what is seen), and to a server that is not there.
        let bad = [
            builder()
                .tls_ca_certificates(tls.certs.ca())
                .open(tls.tls_url(&format!("locker:{WRONG_PASSWORD}@")))
                .unwrap(),
            builder()
                .tls_ca_certificates(tls.certs.ca())
                .open(tls.tls_url(&format!(":{WRONG_PASSWORD}@")))
                .unwrap(),
            fast_failing()
                .open(format!("redis://locker:{ACL_PASSWORD}@127.0.0.1:1/"))
                .unwrap(),
        ];
        for client in &bad {
            assert_no_secret("client Debug", &format!("{client:?}"));
            errors.push(try_lock_error(client, "s"));
        }
        assert_eq!(errors[0].kind(), ErrorKind::Auth, "{}", errors[0]);
        assert_eq!(errors[1].kind(), ErrorKind::Auth, "{}", errors[1]);
        assert_eq!(errors[2].kind(), ErrorKind::Connection, "{}", errors[2]);
        // An address that does not parse.
        errors.push(
            Client::open(format!(
                "rediss://locker:{ACL_PASSWORD}@127.0.0.1:notaport/"
            ))
            .unwrap_err(),
        );
        for err in &errors {
            assert_error_hides_secrets(err);
        }
        let logs = captured_logs();
        // The failed connections were logged (so this checks something), without a password.
        assert!(logs.contains("connecting to redis failed"), "{logs}");
        assert_no_secret("logs", &logs);
    }
}

// ---------------------------------------------------------------------------------------
// Out of memory
// ---------------------------------------------------------------------------------------

/// Fills the server with 4 MB of big values, then sets `maxmemory` 1 MB below what it uses,
/// so that Redis (with `noeviction`) refuses every write that may grow memory with `OOM`.
/// (Filling up to a `maxmemory` set beforehand leaves the server right at the limit, where
/// the freed buffer of the refused command lets the next small write in.)
fn fill_until_out_of_memory(server: &RedisServer) {
    let mut conn = server.conn();
    let value = vec![b'x'; 256 * 1024];
    for i in 0..16 {
        redis::cmd("SET")
            .arg(format!("filler:{i}"))
            .arg(&value)
            .query::<()>(&mut conn)
            .unwrap();
    }
    let used = server.info_number("memory", "used_memory");
    redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(used - 1024 * 1024)
        .query::<()>(&mut conn)
        .unwrap();
    assert!(is_out_of_memory(server), "Redis still takes writes");
}

fn is_out_of_memory(server: &RedisServer) -> bool {
    match redis::cmd("SET")
        .arg("filler:probe")
        .arg("x")
        .query::<()>(&mut server.conn())
    {
        Ok(()) => false,
        Err(e) => e.code() == Some("OOM"),
    }
}

#[test]
fn out_of_memory_refuses_new_locks_while_held_locks_renew_and_release() {
    capture_logs();
    let server = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let lease = Duration::from_secs(3);
    let client = builder()
        .default_lease(lease)
        .renewal_interval(Duration::from_millis(500))
        .open(server.url())
        .unwrap();
    let held = client.mutex("held").lock().unwrap();
    fill_until_out_of_memory(&server);
    let full_since = Instant::now();

    // A new lock: refused, with a message that says why, and nothing written.
    let err = try_lock_error(&client, "new");
    assert_eq!(err.kind(), ErrorKind::Server, "{err}");
    assert!(err.to_string().contains("out of memory"), "{err}");
    let c = client.clone();
    let err = within(LIMIT, move || c.mutex("new").lock().map(drop)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Server, "{err}");
    let c = client.clone();
    let err = within(LIMIT, move || c.fair_mutex("new-fair").lock().map(drop)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Server, "{err}");
    // A lock someone holds still reads as held, not as an error.
    let other = builder().open(server.url()).unwrap();
    assert!(other.mutex("held").try_lock().unwrap().is_none());
    let o = other.clone();
    let waited = within(LIMIT, move || {
        o.mutex("held")
            .try_lock_for(Duration::from_millis(300))
            .map(|g| g.is_some())
    });
    assert!(!waited.unwrap(), "took a held lock");
    let keys: Vec<String> = all_keys(&server)
        .into_iter()
        .filter(|k| !k.starts_with("filler:"))
        .collect();
    assert_eq!(keys, ["redmutex:{held}", "redmutex:{held}:fence"]);

    // The lock taken before keeps being renewed (PEXPIRE is allowed when out of memory),
    // past its whole lease.
    let renewals = client.stats().renewals;
    assert!(eventually(LIMIT, || {
        full_since.elapsed() > lease + Duration::from_secs(1)
            && client.stats().renewals >= renewals + 3
    }));
    assert!(!held.is_lost());
    held.verify().unwrap();
    assert!(is_out_of_memory(&server), "the test lost its premise");
    // And released cleanly (DEL too is allowed).
    held.unlock().unwrap();
    assert!(!lock_keys_exist(&server, "held"));
    assert_eq!(client.stats().lost, 0);

    // Memory back: locks work again. (`SYNC`: Valkey frees a flushed database lazily by
    // default, and the memory would still count for a moment.)
    redis::cmd("FLUSHALL")
        .arg("SYNC")
        .query::<()>(&mut server.conn())
        .unwrap();
    assert!(eventually(LIMIT, || !is_out_of_memory(&server)));
    client.mutex("new").lock().unwrap().unlock().unwrap();
    assert!(!lock_keys_exist(&server, "new"));
    client.shutdown();
}

/// A `Mutex` whose lock passes between threads of one client while another client waits
/// (the pass asks Redis for a block of fencing tokens).
fn use_a_mutex_passed_between_threads(client: &Client, waiter: &Client) {
    let threads: Vec<_> = (0..2)
        .map(|_| {
            let c = client.clone();
            std::thread::spawn(move || {
                for _ in 0..20 {
                    let g = c.mutex("passed").lock().unwrap();
                    std::thread::sleep(Duration::from_millis(1));
                    g.unlock().unwrap();
                }
            })
        })
        .collect();
    for _ in 0..10 {
        waiter.mutex("passed").lock().unwrap().unlock().unwrap();
    }
    for t in threads {
        t.join().unwrap();
    }
}

/// An `RwLock`: readers, then a writer of another client waiting for them.
fn use_an_rwlock(client: &Client, waiter: &Client) {
    let r = client.rwlock("catalog").read().unwrap();
    let r2 = client.rwlock("catalog").read().unwrap();
    let w = waiter.clone();
    let writer = std::thread::spawn(move || {
        w.rwlock("catalog")
            .try_write_for(LIMIT)
            .map(|g| g.map(|g| g.fencing_token()))
    });
    std::thread::sleep(Duration::from_millis(200));
    drop(r);
    r2.unlock().unwrap();
    assert!(writer.join().unwrap().unwrap().is_some());
    assert!(client.rwlock("catalog").force_unlock().is_ok());
}

/// Semaphores, plain and fair: every permit held, a waiter of another client served at the
/// release, the permits changed.
fn use_semaphores(client: &Client, waiter: &Client) {
    for fair in [false, true] {
        let sem = |c: &Client| match fair {
            false => c.semaphore("slots", 2),
            true => c.fair_semaphore("fair-slots", 2),
        };
        let all = sem(client).acquire_many(2).unwrap();
        assert_eq!(sem(client).available().unwrap(), 0);
        let w = waiter.clone();
        let t = std::thread::spawn(move || {
            let s = match fair {
                false => w.semaphore("slots", 2),
                true => w.fair_semaphore("fair-slots", 2),
            };
            s.try_acquire_for(LIMIT).map(|p| p.is_some())
        });
        std::thread::sleep(Duration::from_millis(200));
        all.unlock().unwrap();
        assert!(t.join().unwrap().unwrap());
        sem(client).set_permits(3).unwrap();
    }
}

/// A `MultiLock`, one of whose locks another client holds for a moment.
fn use_a_multi_lock(client: &Client, waiter: &Client) {
    let one = waiter.mutex("left").lock().unwrap();
    let c = client.clone();
    let both = std::thread::spawn(move || {
        c.multi_lock(["left", "right"])
            .try_lock_for(LIMIT)
            .map(|g| g.map(|g| g.unlock()))
    });
    std::thread::sleep(Duration::from_millis(200));
    one.unlock().unwrap();
    assert!(both.join().unwrap().unwrap().is_some());
}

/// A `Shared<T>`: locked, checkpointed, written back; read and updated without the lock;
/// removed.
fn use_a_shared_value(client: &Client, waiter: &Client) {
    let stock = client.shared::<u64>("stock");
    {
        let mut left = stock.lock().unwrap();
        *left = 5;
        left.commit().unwrap();
        *left = 4;
    }
    assert_eq!(waiter.shared::<u64>("stock").get().unwrap(), 4);
    let sold = waiter
        .shared::<u64>("stock")
        .update_for(LIMIT, |left| {
            *left -= 1;
            true
        })
        .unwrap();
    assert!(sold);
    stock.lock().unwrap().remove().unwrap();
}

/// An election: a leader, a candidate of another client waiting for it, an observer.
fn use_an_election(client: &Client, waiter: &Client) {
    let mut observer = waiter.election("jobs").observe().unwrap();
    let mut leadership = client.election("jobs").campaign("a").unwrap();
    leadership.proclaim("a2").unwrap();
    let w = waiter.clone();
    let next = std::thread::spawn(move || {
        w.election("jobs")
            .campaign_for(LIMIT, "b")
            .map(|l| l.map(|l| l.resign()))
    });
    assert!(client.election("jobs").leader().unwrap().is_some());
    std::thread::sleep(Duration::from_millis(200));
    leadership.resign().unwrap();
    assert!(next.join().unwrap().unwrap().is_some());
    assert!(observer.recv_timeout(LIMIT).unwrap().is_some());
}

/// Who holds what: the names in use, and what one lock's keys show.
fn use_who_holds_what(client: &Client, _waiter: &Client) {
    let held = client.mutex("inspected").lock().unwrap();
    assert!(!client.lock_names("*").unwrap().is_empty());
    assert!(client.lock_info("inspected").unwrap().holder.is_some());
    held.unlock().unwrap();
}

/// Uses one kind through the first client, with the second waiting for it.
type UseKind = fn(&Client, &Client);

/// Every kind but the locks (which the test of the lock commands uses), each through `client`
/// while `waiter` waits for it, so that each kind's contended path and wake-up run too.
const OTHER_KINDS: [(&str, UseKind); 6] = [
    ("rwlock", use_an_rwlock),
    ("semaphores", use_semaphores),
    ("multi_lock", use_a_multi_lock),
    ("shared", use_a_shared_value),
    ("election", use_an_election),
    ("who holds what", use_who_holds_what),
];

#[test]
fn an_acl_user_with_the_documented_commands_can_use_every_kind() {
    let server = RedisServer::start();
    acl_user(
        &server,
        "every-kind",
        &format!(
            "~redmutex:* &redmutex:* {} {OTHER_KIND_COMMANDS}",
            lock_commands()
        ),
    );
    let url = acl_url(&server, "every-kind");
    let open = || builder().open(url.as_str()).unwrap();
    let (client, waiter) = (open(), open());
    for (kind, use_it) in OTHER_KINDS {
        use_it(&client, &waiter);
        let refused = crate_refusals(&server);
        assert!(refused.is_empty(), "{kind}: refused {refused:?}");
    }
    client.shutdown();
    waiter.shutdown();
}
