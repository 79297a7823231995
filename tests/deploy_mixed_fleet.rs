//! A mixed fleet on a real `redis-server`: redis-py's `Lock` (from PyPI, installed by this
//! test) and a redmutex `Mutex` with a bare key exclude each other in both directions, and a
//! redmutex waiter notices redis-py's release by re-checking.

mod support;

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use redmutex::{Client, ErrorKind};
use support::RedisServer;

const LIMIT: Duration = Duration::from_secs(60);

/// A redis-py driver: reads commands on stdin, answers one line each.
const DRIVER: &str = r#"
import sys, redis
r = redis.Redis.from_url(sys.argv[1])
lock = r.lock(sys.argv[2], timeout=30)
for line in sys.stdin:
    cmd = line.strip()
    if cmd == "try":
        print("yes" if lock.acquire(blocking=False) else "no", flush=True)
    elif cmd == "wait":
        print("yes" if lock.acquire(blocking_timeout=30) else "no", flush=True)
    elif cmd == "release":
        lock.release()
        print("released", flush=True)
    elif cmd == "locked":
        print("yes" if lock.locked() else "no", flush=True)
"#;

/// One redis-py process holding a `Lock` object on `key`.
struct PyLock {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl PyLock {
    fn new(server: &RedisServer, key: &str) -> PyLock {
        let mut child = Command::new("python3")
            .arg("-c")
            .arg(DRIVER)
            .arg(server.url())
            .arg(key)
            .env("PYTHONPATH", support::python::redis_py())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let input = child.stdin.take().expect("stdin");
        let output = BufReader::new(child.stdout.take().expect("stdout"));
        PyLock {
            child,
            input,
            output,
        }
    }

    fn ask(&mut self, command: &str) -> String {
        writeln!(self.input, "{command}").expect("write to python");
        let mut line = String::new();
        self.output.read_line(&mut line).expect("read from python");
        line.trim().to_owned()
    }
}

impl Drop for PyLock {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn client(server: &RedisServer) -> Client {
    Client::builder()
        .renewal_interval(Duration::from_millis(500))
        .backoff(Duration::from_millis(10), Duration::from_millis(200))
        .open(server.url())
        .unwrap()
}

#[test]
fn a_redis_py_lock_and_a_bare_mutex_exclude_each_other_both_ways() {
    let server = RedisServer::start();
    let c = client(&server);
    let mutex = c.mutex("nightly-export").with_bare_key();
    let mut py = PyLock::new(&server, "nightly-export");

    // redis-py holds: redmutex is kept out.
    assert_eq!(py.ask("try"), "yes");
    assert!(mutex.try_lock().unwrap().is_none());
    // A redmutex waiter notices redis-py's release (which announces nothing) by re-checking.
    let waiter = {
        let mutex = mutex.clone();
        std::thread::spawn(move || {
            let started = Instant::now();
            let got = mutex
                .try_lock_for(LIMIT)
                .unwrap()
                .map(|g| g.fencing_token());
            (got, started.elapsed())
        })
    };
    std::thread::sleep(Duration::from_millis(300));
    let released_at = Instant::now();
    assert_eq!(py.ask("release"), "released");
    let (token, _) = support::within(LIMIT, move || waiter.join().unwrap());
    let noticed = released_at.elapsed();
    assert!(
        token.is_some_and(|t| t > 0),
        "the waiter never got the lock"
    );
    println!("redmutex noticed redis-py's release after {noticed:?}");

    // redmutex holds: redis-py is kept out, and sees it locked.
    let guard = mutex.lock().unwrap();
    let value: String = redis::cmd("GET")
        .arg("nightly-export")
        .query(&mut server.conn())
        .unwrap();
    // The holder's token, as redis-py keeps its own: `<client id>:<thread>:<sequence>:<ms>`.
    assert_eq!(value.split(':').count(), 4, "{value}");
    assert_eq!(py.ask("locked"), "yes");
    assert_eq!(py.ask("try"), "no");
    // Held past its lease by renewal, still excluding redis-py.
    std::thread::sleep(Duration::from_millis(1200));
    assert_eq!(py.ask("try"), "no");
    guard.unlock().unwrap();
    assert_eq!(py.ask("try"), "yes");
    assert_eq!(py.ask("release"), "released");
    // Nothing left at the bare key.
    let exists: bool = redis::cmd("EXISTS")
        .arg("nightly-export")
        .query(&mut server.conn())
        .unwrap();
    assert!(!exists);
}

#[test]
fn a_redis_py_waiter_gets_the_lock_when_redmutex_releases() {
    let server = RedisServer::start();
    let c = client(&server);
    let guard = c.mutex("shared-job").with_bare_key().lock().unwrap();
    let mut py = PyLock::new(&server, "shared-job");
    let waiting = std::thread::spawn(move || {
        let got = py.ask("wait");
        (got, py)
    });
    std::thread::sleep(Duration::from_millis(500));
    guard.unlock().unwrap();
    let (got, mut py) = support::within(LIMIT, move || waiting.join().unwrap());
    assert_eq!(got, "yes");
    assert!(c
        .mutex("shared-job")
        .with_bare_key()
        .try_lock()
        .unwrap()
        .is_none());
    assert_eq!(py.ask("release"), "released");
}

#[test]
fn a_bare_key_with_a_brace_is_refused() {
    let server = RedisServer::start();
    let c = client(&server);
    let err = c.mutex("{tagged}:x").with_bare_key().lock().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
}

#[test]
fn a_waiter_notices_a_holder_that_announces_nothing_within_its_backoff() {
    let server = RedisServer::start();
    // Default lease and renewal (a re-check every 10 s while announcements are live), and
    // the default backoff cap of 500 ms.
    let client = Client::open(server.url()).unwrap();
    // Something that is not redmutex holds the key: a hand-written `SET NX PX`, as
    // node-redlock or any other lock would write it.
    let mut conn = server.conn();
    let _: () = redis::cmd("SET")
        .arg("foreign-job")
        .arg("a3f1c9e0b4d2")
        .arg("NX")
        .arg("PX")
        .arg(60_000)
        .query(&mut conn)
        .unwrap();
    let m = client.mutex("foreign-job").with_bare_key();
    let waiter = std::thread::spawn(move || {
        let g = m.lock().unwrap();
        let got = Instant::now();
        drop(g);
        got
    });
    // Let the waiter find it held, subscribe and settle into its wait.
    std::thread::sleep(Duration::from_secs(2));
    assert!(!waiter.is_finished(), "took a lock someone holds");
    let released = Instant::now();
    let _: () = redis::cmd("DEL")
        .arg("foreign-job")
        .query(&mut conn)
        .unwrap();
    let got = waiter.join().unwrap();
    let noticed = got.duration_since(released);
    // Within the backoff cap and a round trip, with room for a loaded machine; far below
    // the 10 s re-check period it would wait for an announcement.
    assert!(
        noticed < Duration::from_secs(4),
        "noticed after {noticed:?}"
    );
}
