//! `redmutex leader NAME [--watch]`: who leads an election (its value, term, since when, and
//! the process that holds the leadership), and every change of leader as it happens.

use std::io::Write;
use std::time::{Duration, Instant, SystemTime};

use redmutex::{Client, Leader, LeaderEvent};
use serde_json::{json, Value};

use crate::{clock, now_ms, render};

/// Prints who leads the election `name`; with `watch`, every change after, until `limit` (or
/// forever).
pub fn leader(
    client: &Client,
    name: &str,
    (watch, limit): (bool, Option<Duration>),
    json: bool,
) -> redmutex::Result<u8> {
    let election = client.election(name);
    if !watch {
        let leader = election.leader()?;
        let holder = client.lock_info(&format!("election:{name}"))?.holder;
        match json {
            true => println!(
                "{}",
                json!({
                    "election": name,
                    "leader": leader.as_ref().map(leader_json),
                    "holder": holder.as_ref().map(render::holder_json),
                })
            ),
            false => match (&leader, &holder) {
                (Some(l), Some(h)) => println!(
                    "{name}: {} leads, term {}, for {}, held by {}",
                    l.value,
                    l.term,
                    render::duration(since(l.since)),
                    render::who(h)
                ),
                (Some(l), None) => println!("{name}: {} leads, term {}", l.value, l.term),
                (None, _) => println!("{name}: nobody leads"),
            },
        }
        return Ok(0);
    }
    let mut observer = election.observe()?;
    if observer.leader().is_none() && !json {
        println!("{} {name}: nobody leads", clock());
    }
    let started = Instant::now();
    loop {
        let left = limit.map(|l| l.saturating_sub(started.elapsed()));
        if left == Some(Duration::ZERO) {
            return Ok(0);
        }
        let wait = left.map_or(Duration::from_secs(1), |l| l.min(Duration::from_secs(1)));
        if let Some(event) = observer.recv_timeout(wait)? {
            print_event(name, &event, json);
            let _ = std::io::stdout().flush();
        }
    }
}

fn print_event(name: &str, event: &LeaderEvent, json: bool) {
    let (kind, term, value) = match event {
        LeaderEvent::Elected(l) => ("elected", l.term, Some(&l.value)),
        LeaderEvent::Proclaimed(l) => ("proclaimed", l.term, Some(&l.value)),
        LeaderEvent::Vacant { term } => ("vacant", *term, None),
    };
    match (json, value) {
        (true, _) => println!(
            "{}",
            json!({"time_ms": now_ms(), "election": name, "event": kind, "term": term,
                   "value": value})
        ),
        (false, Some(value)) => println!("{} {name} {kind}: {value} (term {term})", clock()),
        (false, None) => println!("{} {name} {kind}: the term {term} ended", clock()),
    }
}

fn leader_json(l: &Leader) -> Value {
    json!({
        "value": l.value,
        "term": l.term,
        "since_ms": render::unix_ms(Some(l.since)),
        "client_id": l.client_id,
    })
}

/// How long ago `t` was (zero for a time ahead of this machine's clock).
fn since(t: SystemTime) -> Duration {
    SystemTime::now().duration_since(t).unwrap_or_default()
}
