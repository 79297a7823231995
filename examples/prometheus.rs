//! Lock metrics in Prometheus's text format: a client with the `metrics` feature records
//! through the `metrics` facade, and the application installs the exporter's recorder (here
//! `metrics-exporter-prometheus`, without its HTTP listener) and prints what it would serve.
//!
//! ```text
//! cargo run --features metrics --example prometheus      # starts its own redis-server
//! ```

#[path = "support/local_redis.rs"]
mod local_redis;

use std::time::Duration;

use metrics_exporter_prometheus::PrometheusBuilder;
use redmutex::events::MetricsEvents;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let prometheus = PrometheusBuilder::new().install_recorder()?;
    let (url, _server) = local_redis::url_or_start()?;
    let client = redmutex::Client::builder()
        .metrics(Some(MetricsEvents::new().with_lock_names()))
        .open(url.as_str())?;
    // Some work: four threads share one lock, and one gives up waiting.
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let client = client.clone();
            std::thread::spawn(move || -> redmutex::Result<()> {
                for _ in 0..25 {
                    let guard = client.mutex("orders:42").lock()?;
                    std::thread::sleep(Duration::from_millis(1));
                    guard.unlock()?;
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "a thread panicked")??;
    }
    let held = client.mutex("report").lock()?;
    let other = client.clone();
    let gave_up = std::thread::spawn(move || {
        other
            .mutex("report")
            .try_lock_for(Duration::from_millis(100))
            .map(|g| g.is_none())
    })
    .join()
    .map_err(|_| "a thread panicked")??;
    drop(held);
    println!("# gave up waiting for \"report\": {gave_up}");
    print!("{}", prometheus.render());
    client.shutdown();
    Ok(())
}
