//! How a lock is printed: a table row, a detailed view, or JSON.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redmutex::{HolderInfo, LockInfo};
use serde_json::{json, Value};

/// `1.2 s`, `340 ms`, `2 min 5 s`.
pub fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        0..=999 => format!("{ms} ms"),
        1_000..=119_999 => format!("{:.1} s", d.as_secs_f64()),
        _ => format!("{} min {} s", d.as_secs() / 60, d.as_secs() % 60),
    }
}

fn since(t: Option<SystemTime>) -> Option<Duration> {
    t.and_then(|t| SystemTime::now().duration_since(t).ok())
}

pub fn unix_ms(t: Option<SystemTime>) -> Value {
    t.and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map_or(Value::Null, |d| json!(d.as_millis() as u64))
}

/// Who a holder is, in a few words.
pub fn who(h: &HolderInfo) -> String {
    match &h.client {
        Some(c) => format!(
            "{} on {}, pid {}, thread {}",
            c.name, c.host, c.pid, h.thread
        ),
        None => format!(
            "client {} (not announced), thread {}",
            h.token.split(':').next().unwrap_or_default(),
            h.thread
        ),
    }
}

pub fn holder_json(h: &HolderInfo) -> Value {
    json!({
        "token": h.token,
        "thread": h.thread,
        "since_ms": unix_ms(h.since),
        "held_for_ms": since(h.since).map(|d| d.as_millis() as u64),
        "lease_left_ms": h.lease_left.map(|d| d.as_millis() as u64),
        "units": h.units,
        "client": h.client.as_ref().map(|c| json!({
            "id": c.id,
            "name": c.name,
            "host": c.host,
            "pid": c.pid,
            "started_ms": unix_ms(c.started),
        })),
    })
}

/// One lock as JSON.
pub fn lock_json(info: &LockInfo) -> Value {
    json!({
        "name": info.name,
        "kinds": info.kinds,
        "held": info.is_held(),
        "holder": info.holder.as_ref().map(holder_json),
        "sharers": info.sharers.iter().map(holder_json).collect::<Vec<_>>(),
        "fencing_counter": info.fencing_counter,
        "queue": info.queue.iter().map(holder_json).collect::<Vec<_>>(),
        "waiting_clients": info.waiting_clients,
        "writer_waiting": info.writer_waiting,
        "permits": info.permits,
        "value_bytes": info.value_bytes,
        "poisoned": info.poisoned,
    })
}

fn kinds(info: &LockInfo) -> String {
    match info.kinds.is_empty() {
        true => "-".to_owned(),
        false => info.kinds.join("+"),
    }
}

fn waiters(info: &LockInfo) -> String {
    let mut parts = Vec::new();
    if !info.queue.is_empty() {
        parts.push(format!("{} queued", info.queue.len()));
    }
    if info.waiting_clients > 0 {
        let s = if info.waiting_clients == 1 { "" } else { "s" };
        parts.push(format!("{} client{s} listening", info.waiting_clients));
    }
    if info.writer_waiting.is_some() {
        parts.push("a writer".to_owned());
    }
    match parts.is_empty() {
        true => "none".to_owned(),
        false => parts.join(", "),
    }
}

/// Who shares a lock: readers, or holders of permits.
fn sharing(info: &LockInfo, sharers: &[HolderInfo]) -> String {
    let n = sharers.len();
    let s = if n == 1 { "" } else { "s" };
    match info.kinds.contains(&"Semaphore") {
        true => {
            let units: u64 = sharers.iter().map(|h| h.units).sum();
            format!("{units} permit(s) held by {n} holder{s}")
        }
        false => format!("{n} reader{s}"),
    }
}

/// The table of `list`.
pub fn table(infos: &[LockInfo]) -> String {
    let mut rows = vec![[
        "NAME".to_owned(),
        "KIND".to_owned(),
        "HOLDER".to_owned(),
        "HELD FOR".to_owned(),
        "LEASE LEFT".to_owned(),
        "FENCE".to_owned(),
        "WAITERS".to_owned(),
    ]];
    for info in infos {
        let (holder, held_for, left) = match (&info.holder, info.sharers.as_slice()) {
            (Some(h), _) => (
                who(h),
                since(h.since).map_or("-".into(), duration),
                h.lease_left.map_or("-".into(), duration),
            ),
            (None, []) => ("free".to_owned(), "-".into(), "-".into()),
            (None, sharers) => (sharing(info, sharers), "-".into(), "-".into()),
        };
        rows.push([
            info.name.clone(),
            kinds(info),
            holder,
            held_for,
            left,
            info.fencing_counter.map_or("-".into(), |f| f.to_string()),
            waiters(info),
        ]);
    }
    let widths: Vec<usize> = (0..7)
        .map(|i| rows.iter().map(|r| r[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn holder_lines(label: &str, h: &HolderInfo, out: &mut String) {
    out.push_str(&format!("  {label:<12}{}\n", who(h)));
    if let Some(d) = since(h.since) {
        out.push_str(&format!(
            "  {:<12}{} (since its acquire began)\n",
            "held for",
            duration(d)
        ));
    }
    if let Some(d) = h.lease_left {
        out.push_str(&format!("  {:<12}{}\n", "lease left", duration(d)));
    }
    if h.units > 1 {
        out.push_str(&format!("  {:<12}{} permits\n", "holds", h.units));
    }
    out.push_str(&format!("  {:<12}{}\n", "token", h.token));
}

/// The detailed view of `show`.
pub fn detail(info: &LockInfo) -> String {
    let unknown = info.kinds.is_empty()
        && info.holder.is_none()
        && info.sharers.is_empty()
        && info.queue.is_empty()
        && info.waiting_clients == 0;
    if unknown {
        let mut out = format!(
            "lock {:?}: not held, and nobody waits for it (Redis has no such lock now)\n",
            info.name
        );
        if let Some(f) = info.fencing_counter {
            out.push_str(&format!("  {:<12}{f} (it was held before)\n", "fencing"));
        }
        return out;
    }
    let mut out = format!("lock {:?} ({})\n", info.name, kinds(info));
    match &info.holder {
        Some(h) => holder_lines("holder", h, &mut out),
        None if info.sharers.is_empty() => out.push_str(&format!("  {:<12}free\n", "holder")),
        None => {}
    }
    for (i, h) in info.sharers.iter().enumerate() {
        holder_lines(&format!("sharer {}", i + 1), h, &mut out);
    }
    if let Some(f) = info.fencing_counter {
        out.push_str(&format!("  {:<12}{f}\n", "fencing"));
    }
    if let Some(p) = info.permits {
        let held: u64 = info.sharers.iter().map(|h| h.units.max(1)).sum();
        out.push_str(&format!("  {:<12}{held} of {p} held\n", "permits"));
    }
    if let Some(b) = info.value_bytes {
        out.push_str(&format!("  {:<12}{b} bytes\n", "value"));
    }
    out.push_str(&format!("  {:<12}{}\n", "waiting", waiters(info)));
    for (i, w) in info.queue.iter().enumerate() {
        out.push_str(&format!("  {:<12}{}\n", format!("queue {}", i + 1), who(w)));
    }
    if info.poisoned {
        out.push_str(&format!(
            "  {:<12}a holder panicked while holding it\n",
            "poisoned"
        ));
    }
    out
}
