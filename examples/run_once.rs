//! A job that must run once across a fleet: every instance tries to run tonight's invoice
//! job at the same moment; one runs it, the others skip it, and a late instance sees it done.
//!
//! Each instance takes the job's lock with `try_lock` and a fixed lease (no renewal: the job
//! must finish well within it), skips the job when the lock is held, checks the job's record,
//! and writes the record with its fencing token, in a script that refuses a token lower than
//! the one the record holds: an instance that overran its lease cannot overwrite a newer
//! run's record. The instance that ran it does not release the lock: it keeps it until its
//! lease ends (`keep_until_expiry`), so the lock itself says "done for this window" and a
//! late instance is turned away without reading the record.
//!
//! ```text
//! cargo run --example run_once                   # starts its own redis-server
//! cargo run --example run_once -- --instances 8
//! ```

#[path = "support/local_redis.rs"]
mod local_redis;

use std::process::{Command, Stdio};
use std::time::Duration;

use redmutex::redis::{self, Script};

type AnyResult<T> = Result<T, Box<dyn std::error::Error>>;

/// The job's lease: the longest a run may take, and the window in which nobody runs it
/// again.
const JOB_LEASE: Duration = Duration::from_secs(60);

/// Writes the job's record only with a fencing token not below the record's.
const RECORD_LUA: &str = r#"
local stored = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) < stored then
  return 0
end
redis.call('HSET', KEYS[1], 'fence', ARGV[1], 'status', ARGV[2], 'by', ARGV[3])
return 1
"#;

fn main() -> AnyResult<()> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("instance") {
        return instance(&args[2], &args[3]);
    }
    let instances: usize = match args.get(1).map(String::as_str) {
        Some("--instances") => args.get(2).ok_or("--instances needs a number")?.parse()?,
        _ => 4,
    };
    let (url, _server) = local_redis::url_or_start()?;
    let job = format!("nightly-invoices:{}", uuid::Uuid::new_v4().simple());
    println!("{instances} instances start job {job:?} at once");
    let exe = std::env::current_exe()?;
    let children = (0..instances)
        .map(|_| {
            Command::new(&exe)
                .args(["instance", &url, &job])
                .stdout(Stdio::piped())
                .spawn()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut ran = 0;
    for child in children {
        let out = child.wait_with_output()?;
        let text = String::from_utf8_lossy(&out.stdout);
        print!("{text}");
        if !out.status.success() {
            return Err("an instance failed".into());
        }
        ran += text.matches("ran the job").count();
    }
    // A late instance, after the others: the record says it is done.
    let late = Command::new(&exe).args(["instance", &url, &job]).output()?;
    let late_text = String::from_utf8_lossy(&late.stdout);
    print!("late: {late_text}");
    if !late_text.contains("in this window") {
        return Err("the late instance was not turned away by the kept lock".into());
    }
    ran += late_text.matches("ran the job").count();
    let mut conn = redis::Client::open(url.as_str())?.get_connection()?;
    let runs: u64 = redis::cmd("GET")
        .arg(format!("{job}:runs"))
        .query::<Option<u64>>(&mut conn)?
        .unwrap_or(0);
    let _: () = redis::cmd("DEL")
        .arg(format!("{job}:runs"))
        .arg(format!("{job}:record"))
        .query(&mut conn)?;
    // The lock was kept for the job's window; this demonstration ends it.
    redmutex::Client::open(url.as_str())?
        .mutex(format!("job:{job}"))
        .force_unlock()?;
    if ran == 1 && runs == 1 {
        println!("OK: the job ran exactly once");
        Ok(())
    } else {
        Err(format!("the job ran {ran} times ({runs} by the record)").into())
    }
}

/// One instance of the fleet.
fn instance(url: &str, job: &str) -> AnyResult<()> {
    let client = redmutex::Client::builder()
        .client_name("invoice-runner")
        .open(url)?;
    let me = format!("instance {}", std::process::id());
    let lock = client
        .mutex(format!("job:{job}"))
        .with_fixed_lease(JOB_LEASE);
    let Some(guard) = lock.try_lock()? else {
        println!("{me}: skipped, another instance runs it or ran it in this window");
        return Ok(());
    };
    let mut conn = redis::Client::open(url)?.get_connection()?;
    let record = format!("{job}:record");
    let status: Option<String> = redis::cmd("HGET")
        .arg(&record)
        .arg("status")
        .query(&mut conn)?;
    if status.as_deref() == Some("done") {
        println!("{me}: skipped, already done");
        return Ok(());
    }
    // The job itself: here, counting its runs.
    std::thread::sleep(Duration::from_millis(200));
    let _: u64 = redis::cmd("INCR")
        .arg(format!("{job}:runs"))
        .query(&mut conn)?;
    let token = guard.fencing_token();
    let written: i64 = Script::new(RECORD_LUA)
        .key(&record)
        .arg(token)
        .arg("done")
        .arg(&me)
        .invoke(&mut conn)?;
    if written == 0 || guard.is_lost() {
        return Err(format!("{me}: ran past its lease; its record was refused").into());
    }
    // Done for this window: the lock stays until its lease ends, and nobody runs it again
    // before then.
    let window = guard.keep_until_expiry()?;
    println!(
        "{me}: ran the job (fencing token {token}); the lock keeps it done for {}s more",
        window.as_secs()
    );
    client.shutdown();
    Ok(())
}
