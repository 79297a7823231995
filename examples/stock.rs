//! Stock deduction: several worker processes, each with several threads, sell from one stock
//! until it is sold out. The stock is a `Shared<u64>`: it comes with the lock and is written
//! back with the release (`*left -= 1`), and the demo checks that nothing was oversold.
//!
//! ```text
//! cargo run --release --example stock                  # starts its own redis-server
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --release --example stock
//! cargo run --release --example stock -- --processes 6 --threads 8 --stock 5000
//! ```

#[path = "support/local_redis.rs"]
mod local_redis;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

/// The stock's name; each run adds its own suffix.
const STOCK_NAME: &str = "stock:sku-42";

struct Settings {
    processes: usize,
    threads: usize,
    stock: u64,
}

fn main() -> AnyResult<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("worker") {
        return worker(&args[2..]);
    }
    let settings = parse_settings(&args[1..])?;

    // Use REDIS_URL when given, else a private redis-server on a free port.
    let (url, _server) = local_redis::url_or_start()?;
    println!("redis: {url}");
    let client = redmutex::Client::open(url.as_str())?;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let name = format!("{STOCK_NAME}:{run}");
    *client.shared::<u64>(&name).lock()? = settings.stock;
    println!(
        "selling {} items with {} processes x {} threads from Shared<u64> {name:?}\n",
        settings.stock, settings.processes, settings.threads
    );

    let started = Instant::now();
    let exe = std::env::current_exe()?;
    let mut children: Vec<Child> = Vec::new();
    for id in 0..settings.processes {
        children.push(
            Command::new(&exe)
                .args(["worker", &id.to_string(), &settings.threads.to_string()])
                .env("REDIS_URL", &url)
                .env("DEMO_STOCK_NAME", &name)
                .stdout(Stdio::piped())
                .spawn()?,
        );
    }
    let mut reports = Vec::new();
    for (id, child) in children.iter_mut().enumerate() {
        let stdout = child.stdout.take().ok_or("worker without stdout")?;
        let mut report = None;
        for line in BufReader::new(stdout).lines() {
            let line = line?;
            if let Some(rest) = line.strip_prefix("REPORT ") {
                report = Some(WorkerReport::parse(rest)?);
            }
        }
        reports.push((id, report.ok_or(format!("worker {id} sent no report"))?));
    }
    for mut child in children {
        let status = child.wait()?;
        if !status.success() {
            return Err(format!("a worker failed: {status}").into());
        }
    }
    let elapsed = started.elapsed();
    let stock = client.shared_existing::<u64>(&name).lock()?;
    let left = *stock;
    stock.remove()?;

    println!("worker   sold  per thread            acquired  attempts  contended  avg wait");
    let mut total = WorkerReport::default();
    for (id, r) in &reports {
        let avg_wait = r.wait_ms / r.acquisitions.max(1) as f64;
        println!(
            "{id:>6} {:>6}  {:<20} {:>9} {:>9} {:>10} {:>7.2} ms",
            r.sold,
            format!("{:?}", r.per_thread),
            r.acquisitions,
            r.attempts,
            r.contended,
            avg_wait
        );
        total.add(r);
    }
    println!(
        "\ntotal sold {} of {} in {:.2?} ({:.0} sales/s); stock left {left}",
        total.sold,
        settings.stock,
        elapsed,
        total.sold as f64 / elapsed.as_secs_f64()
    );
    println!(
        "contention: {} acquisitions, {} attempts ({:.2} per acquisition), {} contended ({:.0}%), \
         mean wait {:.2} ms",
        total.acquisitions,
        total.attempts,
        total.attempts as f64 / total.acquisitions.max(1) as f64,
        total.contended,
        100.0 * total.contended as f64 / total.acquisitions.max(1) as f64,
        total.wait_ms / total.acquisitions.max(1) as f64,
    );
    if total.sold == settings.stock && left == 0 {
        println!("OK: sold out, nothing oversold");
        Ok(())
    } else {
        Err(format!(
            "OVERSOLD or lost sales: sold {} of {}, {left} left",
            total.sold, settings.stock
        )
        .into())
    }
}

fn parse_settings(args: &[String]) -> AnyResult<Settings> {
    let mut s = Settings {
        processes: 4,
        threads: 4,
        stock: 2000,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let value = it.next().ok_or(format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--processes" => s.processes = value.parse()?,
            "--threads" => s.threads = value.parse()?,
            "--stock" => s.stock = value.parse()?,
            other => return Err(format!("unknown option {other}").into()),
        }
    }
    if s.processes == 0 || s.threads == 0 {
        return Err("--processes and --threads must be at least 1".into());
    }
    Ok(s)
}

/// One worker process: `threads` threads selling until the stock is gone.
fn worker(args: &[String]) -> AnyResult<()> {
    let threads: usize = args.get(1).ok_or("missing thread count")?.parse()?;
    let url = std::env::var("REDIS_URL")?;
    let name = std::env::var("DEMO_STOCK_NAME")?;
    let client = redmutex::Client::open(url.as_str())?;
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let stock = client.shared_existing::<u64>(&name);
            std::thread::spawn(move || -> Result<u64, String> {
                sell_until_sold_out(&stock).map_err(|e| e.to_string())
            })
        })
        .collect();
    let mut per_thread = Vec::new();
    for h in handles {
        per_thread.push(h.join().map_err(|_| "a seller thread panicked")??);
    }
    let stats = client.stats();
    println!(
        "REPORT {} {} {} {} {:.3} {}",
        per_thread.iter().sum::<u64>(),
        stats.acquisitions,
        stats.attempts,
        stats.contended,
        stats.wait_time.as_secs_f64() * 1000.0,
        per_thread
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",")
    );
    client.shutdown();
    Ok(())
}

fn sell_until_sold_out(stock: &redmutex::Shared<u64>) -> AnyResult<u64> {
    let mut sold = 0;
    loop {
        let mut left = stock.lock()?; // the stock comes with the lock
        if *left == 0 {
            return Ok(sold);
        }
        *left -= 1;
        left.unlock()?; // written back with the release
        sold += 1;
    }
}

#[derive(Default)]
struct WorkerReport {
    sold: u64,
    acquisitions: u64,
    attempts: u64,
    contended: u64,
    wait_ms: f64,
    per_thread: Vec<u64>,
}

impl WorkerReport {
    fn parse(line: &str) -> AnyResult<Self> {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() != 6 {
            return Err(format!("bad report {line:?}").into());
        }
        Ok(WorkerReport {
            sold: f[0].parse()?,
            acquisitions: f[1].parse()?,
            attempts: f[2].parse()?,
            contended: f[3].parse()?,
            wait_ms: f[4].parse()?,
            per_thread: f[5].split(',').map(str::parse).collect::<Result<_, _>>()?,
        })
    }

    fn add(&mut self, r: &WorkerReport) {
        self.sold += r.sold;
        self.acquisitions += r.acquisitions;
        self.attempts += r.attempts;
        self.contended += r.contended;
        self.wait_ms += r.wait_ms;
    }
}
