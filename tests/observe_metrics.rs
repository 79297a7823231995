//! The `metrics` feature with a recording recorder on a real `redis-server`: counters,
//! histograms and the waiting gauge, labelled by kind, and by lock name only when asked.

#![cfg(feature = "metrics")]

mod support;

use std::sync::OnceLock;
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use redmutex::events::MetricsEvents;
use redmutex::Client;
use support::RedisServer;

/// The recorder of this test binary, installed once.
fn snapshotter() -> &'static Snapshotter {
    static SNAPSHOTTER: OnceLock<Snapshotter> = OnceLock::new();
    SNAPSHOTTER.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder.install().expect("install the recorder");
        snapshotter
    })
}

/// One snapshot of every metric: name, labels and value. (A snapshot drains histograms.)
type Metrics = Vec<(String, Vec<(String, String)>, DebugValue)>;

fn snapshot() -> Metrics {
    snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(key, _, _, value)| {
            let labels = key
                .key()
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            (key.key().name().to_owned(), labels, value)
        })
        .collect()
}

/// The metrics named `name`, of a snapshot.
fn metric<'a>(all: &'a Metrics, name: &str) -> Vec<(&'a [(String, String)], &'a DebugValue)> {
    all.iter()
        .filter(|(n, ..)| n == name)
        .map(|(_, labels, value)| (labels.as_slice(), value))
        .collect()
}

fn counter_with(all: &Metrics, name: &str, label: (&str, &str)) -> u64 {
    metric(all, name)
        .into_iter()
        .filter(|(labels, _)| labels.iter().any(|(k, v)| k == label.0 && v == label.1))
        .map(|(_, v)| match v {
            DebugValue::Counter(n) => *n,
            _ => 0,
        })
        .sum()
}

#[test]
fn locks_are_counted_and_timed_by_kind_and_by_name_when_asked() {
    snapshotter();
    let server = RedisServer::start();
    let plain = Client::open(server.url()).unwrap();
    let named = Client::builder()
        .metrics(Some(
            MetricsEvents::new().with_lock_name_map(|n| n.split(':').next().map(str::to_owned)),
        ))
        .open(server.url())
        .unwrap();
    for _ in 0..3 {
        plain.mutex("orders:1").lock().unwrap().unlock().unwrap();
    }
    named
        .fair_mutex("orders:2")
        .lock()
        .unwrap()
        .unlock()
        .unwrap();
    let held = plain.mutex("busy").lock().unwrap();
    assert!(named
        .mutex("busy")
        .try_lock_for(Duration::from_millis(200))
        .unwrap()
        .is_none());
    drop(held);
    // Optimistic updates of a shared value: one written, one that gave up on a held lock.
    let value = plain.shared::<u64>("stock");
    value.update(|n| *n += 1).unwrap();
    let holder = value.lock().unwrap();
    let v = value.clone();
    let gave_up = std::thread::spawn(move || v.update_for(Duration::from_millis(200), |n| *n += 1))
        .join()
        .unwrap();
    assert!(gave_up.is_err());
    drop(holder);

    let all = snapshot();
    assert_eq!(
        counter_with(&all, "redmutex_updates_total", ("outcome", "written")),
        1
    );
    assert_eq!(
        counter_with(&all, "redmutex_updates_total", ("outcome", "Conflict")),
        1
    );
    assert!(counter_with(&all, "redmutex_update_conflicts_total", ("kind", "Shared")) >= 1);
    assert!(counter_with(&all, "redmutex_acquisitions_total", ("kind", "Mutex")) >= 4);
    assert!(counter_with(&all, "redmutex_acquisitions_total", ("kind", "FairMutex")) >= 1);
    // Names only where asked, and mapped.
    assert!(counter_with(&all, "redmutex_acquisitions_total", ("lock", "orders")) >= 1);
    assert_eq!(
        counter_with(&all, "redmutex_acquisitions_total", ("lock", "orders:1")),
        0
    );
    assert!(counter_with(&all, "redmutex_acquire_timeouts_total", ("lock", "busy")) >= 1);
    let holds = metric(&all, "redmutex_hold_seconds");
    assert!(holds
        .iter()
        .any(|(_, v)| matches!(v, DebugValue::Histogram(h) if !h.is_empty())));
    // Every waiting thread stopped waiting.
    for (labels, value) in metric(&all, "redmutex_waiting_threads") {
        match value {
            DebugValue::Gauge(g) => assert_eq!(g.0, 0.0, "{labels:?}"),
            other => panic!("{other:?}"),
        }
    }
}
