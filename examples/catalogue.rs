//! A price catalogue read far more often than it is written: reader threads read it with
//! `get` (no lock, never blocked), editor threads change one price at a time with `update`
//! (written only if nobody wrote in between, else done again on the new value), and now and
//! then a repricing takes the lock for a change that must see the whole catalogue at once.
//! Both styles work on the same value; at the end the example checks that no edit was lost.
//!
//! ```text
//! cargo run --release --example catalogue              # starts its own redis-server
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --release --example catalogue
//! cargo run --release --example catalogue -- --readers 8 --editors 4 --edits 500
//! ```

#[path = "support/local_redis.rs"]
mod local_redis;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

/// The catalogue: prices in cents by SKU, and how many edits and repricings made it.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Catalogue {
    prices: BTreeMap<String, u64>,
    edits: u64,
    repricings: u64,
}

struct Settings {
    readers: usize,
    editors: usize,
    edits: u64,
}

fn main() -> AnyResult<()> {
    let s = parse_settings(&std::env::args().skip(1).collect::<Vec<_>>())?;
    let (url, _server) = local_redis::url_or_start()?;
    println!("redis: {url}");
    let client = redmutex::Client::open(url.as_str())?;
    let name = format!("catalogue:{}", uuid::Uuid::new_v4().simple());
    let catalogue = client.shared::<Catalogue>(&name);
    catalogue.update(|c| {
        c.prices = (0..20).map(|i| (format!("sku-{i:03}"), 1000)).collect();
    })?;

    let started = Instant::now();
    let done = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..s.readers)
        .map(|_| {
            let (catalogue, done, reads) = (catalogue.clone(), done.clone(), reads.clone());
            std::thread::spawn(move || -> redmutex::Result<()> {
                while !done.load(Ordering::Relaxed) {
                    let c = catalogue.get()?;
                    assert!(c.prices.values().all(|&p| p > 0), "a price fell to zero");
                    reads.fetch_add(1, Ordering::Relaxed);
                }
                Ok(())
            })
        })
        .collect();
    let editors: Vec<_> = (0..s.editors)
        .map(|e| {
            let catalogue = catalogue.clone();
            let edits = s.edits;
            std::thread::spawn(move || -> redmutex::Result<()> {
                for i in 0..edits {
                    let sku = format!("sku-{:03}", (e as u64 * 7 + i) % 20);
                    // A small change: a price up by one cent. `update_for` gives up with
                    // `Conflict` after 30 s of collisions; nothing is written then.
                    catalogue.update_for(Duration::from_secs(30), |c| {
                        *c.prices.entry(sku.clone()).or_insert(1000) += 1;
                        c.edits += 1;
                    })?;
                }
                Ok(())
            })
        })
        .collect();
    // A repricing sees and changes the whole catalogue at once: the lock. Edits wait for it
    // and then apply on top of what it wrote.
    let mut repricings = 0;
    for _ in 0..3 {
        std::thread::sleep(Duration::from_millis(50));
        let mut c = catalogue.lock()?;
        for price in c.prices.values_mut() {
            *price += 100;
        }
        c.repricings += 1;
        c.unlock()?;
        repricings += 1;
    }
    for editor in editors {
        editor.join().map_err(|_| "an editor panicked")??;
    }
    done.store(true, Ordering::Relaxed);
    for reader in readers {
        reader.join().map_err(|_| "a reader panicked")??;
    }

    let c = catalogue.get()?;
    let edits = s.editors as u64 * s.edits;
    let total: u64 = c.prices.values().sum();
    let expected_total = 20 * 1000 + edits + repricings * 20 * 100;
    let stats = client.stats();
    println!(
        "{} reads, {edits} edits ({} conflicts, each done again) and {repricings} repricings \
         in {:.2?}",
        reads.load(Ordering::Relaxed),
        stats.update_conflicts,
        started.elapsed()
    );
    println!(
        "catalogue: {} edits, {} repricings, prices summing to {total}",
        c.edits, c.repricings
    );
    if c.edits != edits || c.repricings != repricings || total != expected_total {
        return Err(
            format!("an edit was lost: expected prices summing to {expected_total}").into(),
        );
    }
    println!("OK: every edit and repricing is in the catalogue");
    Ok(())
}

fn parse_settings(args: &[String]) -> AnyResult<Settings> {
    let mut s = Settings {
        readers: 4,
        editors: 4,
        edits: 200,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--readers" => s.readers = value.parse()?,
            "--editors" => s.editors = value.parse()?,
            "--edits" => s.edits = value.parse()?,
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    Ok(s)
}
