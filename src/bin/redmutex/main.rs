//! `redmutex`: who holds what. Lists the locks in Redis with their holders (the client's name,
//! host, process and thread), how long they have held them, their leases, fencing counters
//! and waiters; shows one; watches one; unlocks one; tells who leads an election.
//!
//! Built with the `cli` feature: `cargo install redmutex --features cli`, or
//! `cargo run --features cli --bin redmutex -- list`.

mod args;
mod leader;
mod render;

use std::io::{BufRead, IsTerminal, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use args::{Args, Command};
use redmutex::{Client, ErrorKind, LockInfo};

/// Exit statuses.
const BAD_USAGE: u8 = 2;
const REDIS_FAILED: u8 = 3;
const NOTHING_TO_UNLOCK: u8 = 4;
const DECLINED: u8 = 5;

fn main() -> ExitCode {
    // Help and the version go to stdout with status 0; usage errors to stderr with 2.
    let args = <Args as clap::Parser>::parse().with_credentials();
    match run(&args) {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("redmutex: {e}");
            ExitCode::from(match e.kind() {
                // A name or setting Redis never saw: the command line's fault.
                ErrorKind::InvalidArgument | ErrorKind::Config => BAD_USAGE,
                _ => REDIS_FAILED,
            })
        }
    }
}

fn connect(args: &Args) -> redmutex::Result<Client> {
    let mut builder = Client::builder().client_name("redmutex-cli");
    if let Some(prefix) = &args.prefix {
        builder = builder.key_prefix(prefix.clone());
    }
    builder.open(args.url.as_str())
}

fn run(args: &Args) -> redmutex::Result<u8> {
    let client = connect(args)?;
    let code = match &args.command {
        Command::List { pattern } => {
            let mut infos = Vec::new();
            for name in client.lock_names(pattern)? {
                infos.push(client.lock_info(&name)?);
            }
            match args.json {
                true => println!(
                    "{}",
                    serde_json::Value::Array(infos.iter().map(render::lock_json).collect())
                ),
                false if infos.is_empty() => println!("no locks match {pattern:?}"),
                false => print!("{}", render::table(&infos)),
            }
            0
        }
        Command::Show { name } => {
            let info = client.lock_info(name)?;
            match args.json {
                true => println!("{}", render::lock_json(&info)),
                false => print!("{}", render::detail(&info)),
            }
            0
        }
        Command::Watch { name, limit } => watch(&client, name, *limit, args.json)?,
        Command::Leader { name, watch, limit } => {
            leader::leader(&client, name, (*watch, *limit), args.json)?
        }
        Command::Unlock { name, yes } => unlock(&client, name, *yes, args.json)?,
    };
    client.shutdown();
    Ok(code)
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Prints each change of the lock's holders and waiters, checking ten times a second, until
/// `limit` (or forever).
fn watch(client: &Client, name: &str, limit: Option<Duration>, json: bool) -> redmutex::Result<u8> {
    let started = Instant::now();
    let mut last: Option<LockInfo> = None;
    loop {
        let info = client.lock_info(name)?;
        for (event, detail) in changes(last.as_ref(), &info) {
            match json {
                true => println!(
                    "{}",
                    serde_json::json!({"time_ms": now_ms(), "event": event, "detail": detail,
                                       "lock": render::lock_json(&info)})
                ),
                false => println!("{} {name} {event}: {detail}", clock()),
            }
        }
        let _ = std::io::stdout().flush();
        last = Some(info);
        if limit.is_some_and(|l| started.elapsed() >= l) {
            return Ok(0);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `HH:MM:SS.mmm` (UTC).
fn clock() -> String {
    let ms = now_ms();
    let s = ms / 1000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        (s / 3600) % 24,
        (s / 60) % 60,
        s % 60,
        ms % 1000
    )
}

/// What changed between two readings, as (event, detail) pairs.
fn changes(before: Option<&LockInfo>, now: &LockInfo) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    let token = |i: Option<&LockInfo>| i.and_then(|i| i.holder.as_ref()).map(|h| h.token.clone());
    let (old, new) = (token(before), token(Some(now)));
    if old != new {
        if old.is_some() {
            out.push((
                "released",
                "the holder let go or its lease ran out".to_owned(),
            ));
        }
        if let Some(h) = &now.holder {
            let fence = now
                .fencing_counter
                .map_or(String::new(), |f| format!(", fencing token {f}"));
            out.push(("acquired", format!("by {}{fence}", render::who(h))));
        }
    }
    let sharers = |i: Option<&LockInfo>| i.map_or(0, |i| i.sharers.len());
    if sharers(before) != sharers(Some(now)) {
        out.push(("sharers", format!("{} now", now.sharers.len())));
    }
    let waiting = |i: Option<&LockInfo>| i.map(|i| (i.queue.len(), i.waiting_clients));
    if before.is_some() && waiting(before) != waiting(Some(now)) {
        out.push((
            "waiters",
            format!(
                "{} queued, {} clients listening",
                now.queue.len(),
                now.waiting_clients
            ),
        ));
    }
    if before.is_none() && out.is_empty() {
        out.push(("free", "nobody holds it".to_owned()));
    }
    out
}

/// Deletes the lock whoever holds it, after confirmation.
fn unlock(client: &Client, name: &str, yes: bool, json: bool) -> redmutex::Result<u8> {
    let info = client.lock_info(name)?;
    let Some(holder) = &info.holder else {
        let why = match info.sharers.is_empty() {
            true => "it is not held",
            false => "it is held by readers or permit holders only, whose leases end by themselves",
        };
        eprintln!("redmutex: nothing to unlock: {name:?}: {why}");
        return Ok(NOTHING_TO_UNLOCK);
    };
    let who = render::who(holder);
    if !yes {
        eprint!("unlock {name:?}, held by {who}? [y/N] ");
        let _ = std::io::stderr().flush();
        let mut answer = String::new();
        let read = std::io::stdin().lock().read_line(&mut answer);
        if !matches!(answer.trim(), "y" | "Y" | "yes") {
            let unanswered = matches!(read, Ok(0) | Err(_));
            match unanswered && !std::io::stdin().is_terminal() {
                true => eprintln!(
                    "\nredmutex: not unlocked: no answer (standard input is not a terminal); \
                     pass --yes to unlock without asking"
                ),
                false => eprintln!("redmutex: not unlocked (pass --yes to unlock without asking)"),
            }
            return Ok(DECLINED);
        }
    }
    let deleted = match info.kinds.contains(&"FairMutex") {
        true => client.fair_mutex(name).force_unlock()?,
        false => client.mutex(name).force_unlock()?,
    };
    if !deleted {
        eprintln!("redmutex: nothing to unlock: {name:?} was released meanwhile");
        return Ok(NOTHING_TO_UNLOCK);
    }
    match json {
        true => println!(
            "{}",
            serde_json::json!({"unlocked": name, "was_held_by": render::lock_json(&info)["holder"]})
        ),
        false => println!("unlocked {name:?}; it was held by {who}; its waiters are woken"),
    }
    Ok(0)
}
