//! An ID allocator: several processes hand out unique, increasing-per-segment IDs, taking
//! segments of 100 from one counter kept in a `Shared<u64>`, so that Redis is asked once per
//! hundred IDs rather than once per ID.
//!
//! Under the lock, an allocator reads the next free ID and moves it on by a segment, written
//! back with the release in the same round trip; a holder whose lease ran out cannot write,
//! so no segment is ever handed out twice.
//!
//! ```text
//! cargo run --example id_allocator                # starts its own redis-server
//! cargo run --example id_allocator -- --processes 6 --ids 5000
//! ```

#[path = "support/local_redis.rs"]
mod local_redis;

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::ops::Range;
use std::process::{Command, Stdio};

use redmutex::Shared;

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

/// How many IDs one trip to Redis takes.
const SEGMENT: u64 = 100;

/// Hands out IDs from segments of the shared counter.
struct Allocator {
    next_free: Shared<u64>,
    segment: Range<u64>,
}

impl Allocator {
    fn new(client: &redmutex::Client, name: &str) -> Self {
        Allocator {
            // IDs start at 1: a missing counter is 1.
            next_free: client.shared_or(name, 1u64),
            segment: 0..0,
        }
    }

    fn next_id(&mut self) -> redmutex::Result<u64> {
        if let Some(id) = self.segment.next() {
            return Ok(id);
        }
        let mut next_free = self.next_free.lock()?;
        let start = *next_free;
        *next_free += SEGMENT;
        next_free.unlock()?; // written with the release; fails (LockLost) rather than reuse
        self.segment = start + 1..start + SEGMENT;
        Ok(start)
    }
}

fn main() -> AnyResult<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("worker") {
        return worker(&args[2], &args[3], args[4].parse()?);
    }
    let (mut processes, mut ids) = (4usize, 2000u64);
    let mut it = args.iter().skip(1);
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--processes" => processes = value.parse()?,
            "--ids" => ids = value.parse()?,
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    let (url, _server) = local_redis::url_or_start()?;
    let name = format!("ids:{}", uuid::Uuid::new_v4().simple());
    println!("{processes} processes x 4 threads take {ids} IDs each from {name:?}");
    let exe = std::env::current_exe()?;
    let children = (0..processes)
        .map(|_| {
            Command::new(&exe)
                .args(["worker", &url, &name, &ids.to_string()])
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut seen = HashSet::new();
    let mut total = 0u64;
    for mut child in children {
        let stdout = child.stdout.take().ok_or("worker without stdout")?;
        for line in BufReader::new(stdout).lines() {
            let id: u64 = line?.parse()?;
            total += 1;
            if !seen.insert(id) {
                return Err(format!("ID {id} was handed out twice").into());
            }
        }
        if !child.wait()?.success() {
            return Err("a worker failed".into());
        }
    }
    let client = redmutex::Client::open(url.as_str())?;
    let counter = client.shared_existing::<u64>(&name).lock()?;
    let next_free = *counter;
    counter.remove()?;
    let expected = processes as u64 * 4 * ids;
    println!("{total} IDs handed out, all distinct; the counter stands at {next_free}");
    if total == expected && seen.iter().all(|&id| id < next_free) {
        println!("OK: no ID twice, none past the counter");
        Ok(())
    } else {
        Err(format!("{total} IDs of {expected}, or some past the counter").into())
    }
}

/// One process: four threads, each with its own allocator, print the IDs they got.
fn worker(url: &str, name: &str, ids: u64) -> AnyResult<()> {
    let client = redmutex::Client::builder()
        .client_name("id-allocator")
        .open(url)?;
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let mut allocator = Allocator::new(&client, name);
            std::thread::spawn(move || -> redmutex::Result<Vec<u64>> {
                (0..ids).map(|_| allocator.next_id()).collect()
            })
        })
        .collect();
    let mut out = String::new();
    for t in threads {
        for id in t.join().map_err(|_| "an allocator thread panicked")?? {
            out.push_str(&id.to_string());
            out.push('\n');
        }
    }
    print!("{out}");
    client.shutdown();
    Ok(())
}
