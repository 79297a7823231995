//! `Shared<T>` beside `Mutex`: what carrying a value with the lock costs.
//!
//! 1. Lock + change one field + unlock of a `Shared<Order>` (an order of about 1 KiB), and
//!    of a `Shared<u64>`, beside a `Mutex` lock + unlock on the same connection pool, in
//!    interleaved turns: cycles per second and their ratios, per round.
//! 2. The codecs on the same value: the `Shared` cycle with MessagePack and with JSON, in
//!    interleaved turns, and the bytes each stores.
//!
//! `cargo bench --bench shared` measures and writes `target/bench-results/shared.json`. Run
//! by `cargo test --benches`, it does a short smoke run instead.

#[path = "../tests/support/mod.rs"]
mod support;

mod common;

use std::time::Duration;

use common::{interleaved_rates, spread, Cycle, Json};
use redmutex::{Client, Codec};
use serde::{Deserialize, Serialize};
use support::RedisServer;

/// One line of an order.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Line {
    sku: String,
    quantity: u32,
    price_cents: u64,
    note: String,
}

/// An order of about 1 KiB encoded.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct Order {
    id: u64,
    customer: String,
    status: String,
    updates: u64,
    lines: Vec<Line>,
}

fn order() -> Order {
    Order {
        id: 42,
        customer: "customer-0042@example.com, Somewhere Street 12".into(),
        status: "packing".into(),
        updates: 0,
        lines: (0..12)
            .map(|i| Line {
                sku: format!("SKU-{i:08}"),
                quantity: i + 1,
                price_cents: 1999 + u64::from(i),
                note: "gift wrap, deliver after six".into(),
            })
            .collect(),
    }
}

fn shared_cycle(client: &Client, name: &'static str, codec: Codec) -> Cycle<'static> {
    let value = client.shared_or(name, order()).with_codec(codec);
    Box::new(move || {
        let mut o = value.lock().expect("lock");
        o.updates += 1;
        o.unlock().expect("unlock");
    })
}

fn small_cycle(client: &Client) -> Cycle<'static> {
    let value = client.shared::<u64>("counter");
    Box::new(move || {
        let mut v = value.lock().expect("lock");
        *v += 1;
        v.unlock().expect("unlock");
    })
}

fn mutex_cycle(client: &Client) -> Cycle<'static> {
    let m = client.mutex("bench-mutex");
    Box::new(move || m.lock().expect("lock").unlock().expect("unlock"))
}

fn stored_len(server: &RedisServer, name: &str) -> f64 {
    let len: u64 = redis::cmd("STRLEN")
        .arg(format!("redmutex:{{{name}}}:value"))
        .query(&mut server.conn())
        .expect("STRLEN");
    len as f64
}

fn main() {
    let measuring = common::measuring();
    let (rounds, time) = if measuring {
        (5, Duration::from_secs(3))
    } else {
        (1, Duration::from_millis(200))
    };
    let server = RedisServer::start();
    let client = Client::open(server.url()).expect("client");
    let mut json = Json::default();
    json.text("benchmark", "shared");

    // 1. Shared<Order> beside Mutex.
    let (mut shared, mut mutex, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    let (mut small, mut small_ratio) = (Vec::new(), Vec::new());
    for _ in 0..rounds {
        let rates = interleaved_rates(
            time,
            &mut [
                shared_cycle(&client, "order", Codec::MessagePack),
                mutex_cycle(&client),
                small_cycle(&client),
            ],
        );
        shared.push(rates[0]);
        mutex.push(rates[1]);
        small.push(rates[2]);
        ratio.push(rates[0] / rates[1]);
        small_ratio.push(rates[2] / rates[1]);
    }
    let bytes = stored_len(&server, "order");
    println!("1 thread, {rounds} rounds of {time:?}; the order is {bytes} bytes stored");
    common::print_rate(
        "Shared<Order> lock + change + unlock",
        spread(shared.clone()),
    );
    common::print_rate("Mutex lock + unlock", spread(mutex.clone()));
    common::print_rate("Shared<u64> lock + add + unlock", spread(small.clone()));
    common::print_ratio("Shared<Order> / Mutex", spread(ratio.clone()));
    common::print_ratio("Shared<u64> / Mutex", spread(small_ratio.clone()));
    json.spread("shared_per_sec", spread(shared))
        .spread("mutex_per_sec", spread(mutex))
        .spread("shared_to_mutex", spread(ratio))
        .spread("small_per_sec", spread(small))
        .spread("small_to_mutex", spread(small_ratio));

    // 2. The codecs.
    let (mut mp, mut js, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..rounds {
        let rates = interleaved_rates(
            time,
            &mut [
                shared_cycle(&client, "order-msgpack", Codec::MessagePack),
                shared_cycle(&client, "order-json", Codec::Json),
            ],
        );
        mp.push(rates[0]);
        js.push(rates[1]);
        ratio.push(rates[0] / rates[1]);
    }
    let (mp_bytes, js_bytes) = (
        stored_len(&server, "order-msgpack"),
        stored_len(&server, "order-json"),
    );
    println!("stored: MessagePack {mp_bytes} bytes, JSON {js_bytes} bytes");
    common::print_rate("MessagePack cycle", spread(mp.clone()));
    common::print_rate("JSON cycle", spread(js.clone()));
    common::print_ratio("MessagePack / JSON", spread(ratio.clone()));
    json.num("order_bytes_msgpack", mp_bytes)
        .num("order_bytes_json", js_bytes)
        .spread("msgpack_per_sec", spread(mp))
        .spread("json_per_sec", spread(js))
        .spread("msgpack_to_json", spread(ratio));
    common::write_results("shared", &json);
}
