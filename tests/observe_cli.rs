//! The `redmutex` command against a real `redis-server`, with locks held by another process:
//! `list`, `show`, `watch`, `unlock` (with and without confirmation), `leader`, `--json`, and
//! the exit status of each failure.

#![cfg(feature = "cli")]

mod support;

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use redmutex::Client;
use support::RedisServer;

const ENTRY: &str = "cli_holder_entry";

/// A process that holds `orders:42` (and reads `config`) until its standard input closes,
/// announcing itself as `billing-worker`.
#[test]
fn cli_holder_entry() {
    let Some((_, url, _)) = support::worker_role() else {
        return;
    };
    let client = Client::builder()
        .client_name("billing-worker")
        .open(url.as_str())
        .unwrap();
    let held = client.mutex("orders:42").lock().unwrap();
    let read = client.rwlock("config").read().unwrap();
    println!("HOLDING {}", held.fencing_token());
    std::thread::sleep(Duration::from_secs(60));
    drop((held, read));
}

fn redmutex(server: &RedisServer, args: &[&str], stdin: &str) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_redmutex"))
        .arg("--url")
        .arg(server.url())
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(mut input) = child.stdin.take() {
        input.write_all(stdin.as_bytes()).unwrap();
    }
    child.wait_with_output().unwrap()
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn a_held_lock_is_listed_shown_and_unlocked_with_its_holder_named() {
    let server = RedisServer::start();
    let mut holder = support::spawn_worker(ENTRY, "holder", &server.url(), "");
    let fence: u64 = support::read_marker(&mut holder, "HOLDING")
        .parse()
        .unwrap();
    let pid = holder.id();
    // The holder announces itself within half a second of its first lock.
    let observer = Client::open(server.url()).unwrap();
    assert!(support::eventually(Duration::from_secs(30), || {
        let info = observer.lock_info("orders:42").unwrap();
        info.holder.and_then(|h| h.client).is_some()
    }));

    let list = redmutex(&server, &["list"], "");
    assert!(list.status.success(), "{list:?}");
    let table = text(&list);
    println!("{table}");
    let row = table
        .lines()
        .find(|l| l.starts_with("orders:42"))
        .unwrap_or_else(|| panic!("no row for orders:42 in\n{table}"));
    assert!(row.contains("billing-worker"), "{row}");
    assert!(row.contains(&format!("pid {pid}")), "{row}");
    assert!(row.contains(&fence.to_string()), "{row}");
    assert!(table.lines().any(|l| l.starts_with("config")), "{table}");

    let show = redmutex(&server, &["--json", "show", "orders:42"], "");
    assert!(show.status.success(), "{show:?}");
    let json: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(json["holder"]["client"]["name"], "billing-worker");
    assert_eq!(json["holder"]["client"]["pid"], pid);
    assert_eq!(json["fencing_counter"], fence);
    assert!(json["holder"]["lease_left_ms"].as_u64().unwrap() > 0);

    // Not confirmed: nothing happens.
    let no = redmutex(&server, &["unlock", "orders:42"], "n\n");
    assert_eq!(no.status.code(), Some(5), "{no:?}");
    assert!(String::from_utf8_lossy(&no.stderr).contains("billing-worker"));
    let other = Client::open(server.url()).unwrap();
    assert!(other.mutex("orders:42").try_lock().unwrap().is_none());
    // No answer at all (standard input is not a terminal): it says how to confirm.
    let silent = redmutex(&server, &["unlock", "orders:42"], "");
    assert_eq!(silent.status.code(), Some(5), "{silent:?}");
    let said = String::from_utf8_lossy(&silent.stderr);
    assert!(said.contains("--yes"), "{said}");
    assert!(other.mutex("orders:42").try_lock().unwrap().is_none());

    // Confirmed: unlocked, and it says who held it.
    let yes = redmutex(&server, &["unlock", "orders:42", "--yes"], "");
    assert!(yes.status.success(), "{yes:?}");
    assert!(text(&yes).contains("billing-worker"), "{}", text(&yes));
    assert!(other.mutex("orders:42").try_lock().unwrap().is_some());

    // Nothing left to unlock; readers are not unlocked.
    let again = redmutex(&server, &["unlock", "orders:42", "--yes"], "");
    assert_eq!(again.status.code(), Some(4), "{again:?}");
    let readers = redmutex(&server, &["unlock", "config", "--yes"], "");
    assert_eq!(readers.status.code(), Some(4), "{readers:?}");
    drop(holder.stdin.take());
    let _ = holder.kill();
    let _ = holder.wait();
}

#[test]
fn watch_prints_acquires_and_releases_as_they_happen() {
    let server = RedisServer::start();
    let url = server.url();
    let taker = std::thread::spawn(move || {
        let client = Client::builder()
            .client_name("nightly-report")
            .open(url.as_str())
            .unwrap();
        // Its first lock makes it announce itself, within half a second.
        drop(client.mutex("warm-up").lock().unwrap());
        std::thread::sleep(Duration::from_millis(1200));
        let g = client.mutex("reports").lock().unwrap();
        std::thread::sleep(Duration::from_millis(800));
        g.unlock().unwrap();
    });
    let out = redmutex(&server, &["watch", "reports", "--for", "4"], "");
    taker.join().unwrap();
    assert!(out.status.success(), "{out:?}");
    let lines = text(&out);
    let acquired = lines.find("acquired: by nightly-report");
    let released = lines.find("released");
    assert!(
        acquired.is_some() && released > acquired,
        "watch printed:\n{lines}"
    );
}

#[test]
fn failures_have_their_own_exit_status_and_never_print_the_password() {
    let server = RedisServer::start();
    let bad = redmutex(&server, &["frobnicate"], "");
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    let port = support::free_port();
    let out = Command::new(env!("CARGO_BIN_EXE_redmutex"))
        .args([
            "--url",
            &format!("redis://user:s3cret-pw@127.0.0.1:{port}/"),
            "list",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    let all = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!all.contains("s3cret-pw"), "{all}");
    assert!(!all.is_empty());
}

#[test]
fn help_and_version_go_to_stdout_and_usage_errors_exit_2() {
    let server = RedisServer::start();
    for flag in ["--help", "help", "--version"] {
        let out = redmutex(&server, &[flag], "");
        assert!(out.status.success(), "{flag}: {out:?}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("redmutex"), "{flag}: {text}");
    }
    let version = redmutex(&server, &["--version"], "");
    let text = String::from_utf8_lossy(&version.stdout);
    assert!(text.contains(env!("CARGO_PKG_VERSION")), "{text}");
    let help = redmutex(&server, &["--help"], "");
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(
        text.contains("unlock") && text.contains("Exit status"),
        "{text}"
    );
    // An empty name is bad usage (2), not "Redis unreachable" (3).
    let empty = redmutex(&server, &["show", ""], "");
    assert_eq!(empty.status.code(), Some(2), "{empty:?}");
    assert!(String::from_utf8_lossy(&empty.stderr).contains("must not be empty"));
    let unknown = redmutex(&server, &["--frobnicate", "list"], "");
    assert_eq!(unknown.status.code(), Some(2), "{unknown:?}");
    // A lock Redis has never seen is said in words.
    let none = redmutex(&server, &["show", "no-such"], "");
    assert!(none.status.success(), "{none:?}");
    let text = String::from_utf8_lossy(&none.stdout);
    assert!(text.contains("not held"), "{text}");
}

#[test]
fn show_labels_a_semaphore_s_permits_held_and_in_all() {
    let server = RedisServer::start();
    let client = Client::open(server.url()).unwrap();
    let exports = client.semaphore("exports", 5);
    let _two = exports.acquire_many(2).unwrap();
    let _one = exports.acquire().unwrap();
    let show = redmutex(&server, &["show", "exports"], "");
    assert!(show.status.success(), "{show:?}");
    let text = text(&show);
    assert!(text.contains("holds       2 permits"), "{text}");
    assert!(text.contains("permits     3 of 5 held"), "{text}");
    assert_eq!(
        text.lines()
            .filter(|l| l.trim_start().starts_with("permits"))
            .count(),
        1,
        "{text}"
    );
}

#[test]
fn leader_names_who_leads_and_watch_prints_each_change() {
    let server = RedisServer::start();
    let out = redmutex(&server, &["leader", "scheduler"], "");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(text(&out).trim(), "scheduler: nobody leads");

    // A leader in a thread of its own (a leadership stays on the thread that campaigned),
    // until told to resign.
    let (led, resign) = (std::sync::mpsc::channel(), std::sync::mpsc::channel::<()>());
    let url = server.url();
    let first = std::thread::spawn(move || {
        let client = Client::builder()
            .client_name("scheduler-a")
            .open(url.as_str())
            .unwrap();
        let leadership = client
            .election("scheduler")
            .campaign("10.0.0.7:8080")
            .unwrap();
        led.0.send(leadership.term()).unwrap();
        let _ = resign.1.recv();
        leadership.resign().unwrap();
    });
    let term = led.1.recv().unwrap();
    // The client announces its name within half a second of its first lock.
    let started = std::time::Instant::now();
    let shown = loop {
        let shown = text(&redmutex(&server, &["leader", "scheduler"], ""));
        if shown.contains("held by scheduler-a on ") || started.elapsed().as_secs() > 30 {
            break shown;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        shown.contains(&format!("10.0.0.7:8080 leads, term {term}")),
        "{shown}"
    );
    assert!(shown.contains("held by scheduler-a on "), "{shown}");
    let out = redmutex(&server, &["--json", "leader", "scheduler"], "");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["leader"]["term"], term);
    assert_eq!(v["leader"]["value"], "10.0.0.7:8080");

    // The leader resigns while `--watch` runs, and another takes over.
    let url = server.url();
    let next = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(800));
        resign.0.send(()).unwrap();
        first.join().unwrap();
        let client = Client::open(url.as_str()).unwrap();
        let leadership = client
            .election("scheduler")
            .campaign("10.0.0.8:8080")
            .unwrap();
        std::thread::sleep(Duration::from_millis(800));
        leadership.term()
    });
    let out = redmutex(
        &server,
        &["leader", "scheduler", "--watch", "--for", "3"],
        "",
    );
    let next_term = next.join().unwrap();
    let lines = text(&out);
    let first = lines.find(&format!("elected: 10.0.0.7:8080 (term {term})"));
    let vacant = lines.find(&format!("vacant: the term {term} ended"));
    let second = lines.find(&format!("elected: 10.0.0.8:8080 (term {next_term})"));
    assert!(
        first.is_some() && vacant > first && second > vacant,
        "watch printed:\n{lines}"
    );
}
