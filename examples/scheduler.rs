//! A scheduler that must run in exactly one instance: three instances campaign in one
//! election; the leader runs the schedule (a tick every 100 ms, written with its term, which
//! the store refuses from a leader that no longer leads) and announces its address. The
//! demonstration kills the leader (`SIGKILL`: it resigns nothing) and watches, through an
//! observer, another instance take over when the dead leader's lease runs out.
//!
//! ```text
//! cargo run --example scheduler                  # starts its own redis-server
//! ```

#[path = "support/local_redis.rs"]
mod local_redis;

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redmutex::redis::{self, Script};
use redmutex::LeaderEvent;

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

/// The leader's lease: how long a dead leader holds the others up at most.
const LEASE: Duration = Duration::from_secs(2);

/// Records a tick only from a term not below the last one recorded.
const TICK_LUA: &str = r#"
local term = tonumber(redis.call('HGET', KEYS[1], 'term') or '0')
if tonumber(ARGV[1]) < term then
  return 0
end
redis.call('HSET', KEYS[1], 'term', ARGV[1], 'by', ARGV[2])
redis.call('HINCRBY', KEYS[1], 'ticks', 1)
return 1
"#;

fn main() -> AnyResult<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("instance") {
        return instance(&args[2], &args[3], &args[4]);
    }
    let (url, _server) = local_redis::url_or_start()?;
    let name = format!("scheduler:{}", uuid::Uuid::new_v4().simple());
    let client = redmutex::Client::open(url.as_str())?;
    let mut observer = client.election(&name).observe()?;
    let exe = std::env::current_exe()?;
    let mut instances: Vec<(String, Child)> = (0..3)
        .map(|i| {
            let address = format!("10.0.0.{}:8080", i + 1);
            Command::new(&exe)
                .args(["instance", &url, &name, &address])
                .stdout(Stdio::null())
                .spawn()
                .map(|child| (address, child))
        })
        .collect::<Result<_, _>>()?;
    println!("3 instances campaign in election {name:?}");

    let first = next_leader(&mut observer)?;
    println!("{} leads (term {})", first.value, first.term);
    std::thread::sleep(Duration::from_millis(500));
    let killed_at = Instant::now();
    let at = instances
        .iter()
        .position(|(address, _)| *address == first.value)
        .ok_or("the leader is none of the instances")?;
    let (_, mut leader) = instances.remove(at);
    leader.kill()?;
    leader.wait()?;
    println!(
        "killed {} (no resignation: its lease runs out)",
        first.value
    );

    let second = next_leader(&mut observer)?;
    let after = killed_at.elapsed();
    println!(
        "{} took over (term {}) {} ms after the kill",
        second.value,
        second.term,
        after.as_millis()
    );
    // The new leader's first tick comes a round trip after its election: the instances are
    // stopped once it is recorded (or after ten seconds without it).
    let mut conn = redis::Client::open(url.as_str())?.get_connection()?;
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut by = ticks_by(&mut conn, &name)?;
    while by.as_deref() != Some(second.value.as_str()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        by = ticks_by(&mut conn, &name)?;
    }
    for (_, mut child) in instances {
        child.kill()?;
        child.wait()?;
    }
    let _: () = redis::cmd("DEL")
        .arg(format!("{name}:ticks"))
        .query(&mut conn)?;
    if second.term > first.term
        && second.value != first.value
        && by.as_deref() == Some(second.value.as_str())
    {
        println!("OK: another instance took over, with a larger term");
        Ok(())
    } else {
        Err(format!("no clean take-over: {first:?} then {second:?}, ticks by {by:?}").into())
    }
}

/// The instance whose tick was recorded last.
fn ticks_by(conn: &mut redis::Connection, name: &str) -> AnyResult<Option<String>> {
    Ok(redis::cmd("HGET")
        .arg(format!("{name}:ticks"))
        .arg("by")
        .query(conn)?)
}

/// The next leader the observer tells of.
fn next_leader(observer: &mut redmutex::Observer) -> AnyResult<redmutex::Leader> {
    let deadline = Instant::now() + Duration::from_secs(60);
    while let Some(event) = observer.recv_timeout(deadline - Instant::now())? {
        if let LeaderEvent::Elected(leader) = event {
            return Ok(leader);
        }
    }
    Err("no leader within a minute".into())
}

/// One instance: campaigns, and runs the schedule while it leads.
fn instance(url: &str, name: &str, address: &str) -> AnyResult<()> {
    let client = redmutex::Client::builder()
        .client_name("scheduler")
        .open(url)?;
    let mut conn = redis::Client::open(url)?.get_connection()?;
    let tick = Script::new(TICK_LUA);
    client
        .election(name)
        .with_lease(LEASE)
        .run_while_leader(address, |leadership| {
            while !leadership.is_lost() {
                let recorded: i64 = tick
                    .key(format!("{name}:ticks"))
                    .arg(leadership.term())
                    .arg(address)
                    .invoke(&mut conn)
                    .unwrap_or(0);
                if recorded == 0 {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        })?;
    Ok(())
}
