//! The fenced resource: a second Redis, never faulted, that accepts a write only when its
//! fencing token is at least the highest it has accepted, and keeps the run's history.
//!
//! Every event of every worker and of the driver is appended to one list by a script, so the
//! history is in the resource's own total order and needs no clocks.

use std::time::Duration;

use super::AnyResult;

/// Accepts a write (`W`) only if its token is not below the highest accepted (returns 1 or
/// 0); records every event (any other returns the history's length, its line's number plus
/// one). Tokens are compared as decimal strings, by length first, so no precision is lost.
const EVENT_LUA: &str = r#"
local kind = ARGV[1]
if kind == 'W' then
  local token = ARGV[2]
  local max = redis.call('GET', KEYS[2])
  local ok = (not max) or #token > #max or (#token == #max and token >= max)
  if ok then redis.call('SET', KEYS[2], token) end
  redis.call('RPUSH', KEYS[1], 'W ' .. token .. ' ' .. ARGV[3] .. ' ' .. (ok and '1' or '0'))
  return ok and 1 or 0
end
if kind == 'B' then redis.call('SET', KEYS[3], ARGV[4]) end
if kind == 'E' then redis.call('DEL', KEYS[3]) end
return redis.call('RPUSH', KEYS[1], table.concat(ARGV, ' '))
"#;

/// The keys of one run in the resource server.
#[derive(Clone)]
pub struct ResourceKeys {
    log: String,
    max: String,
    holder: String,
}

impl ResourceKeys {
    pub fn new(run: &str) -> Self {
        ResourceKeys {
            log: format!("faults:{run}:history"),
            max: format!("faults:{run}:max-token"),
            holder: format!("faults:{run}:holder-pid"),
        }
    }
}

/// One connection to the resource.
pub struct Resource {
    conn: redis::Connection,
    keys: ResourceKeys,
    script: redis::Script,
}

impl Resource {
    pub fn connect(url: &str, keys: ResourceKeys) -> AnyResult<Resource> {
        // No read or write timeout: a socket call with one fails with `EINTR` when the
        // process is stopped and continued (a holder-stop fault), and the resource server is
        // never faulted.
        let conn =
            redis::Client::open(url)?.get_connection_with_timeout(Duration::from_secs(10))?;
        Ok(Resource {
            conn,
            keys,
            script: redis::Script::new(EVENT_LUA),
        })
    }

    /// Records an event; what the script returns.
    fn event(&mut self, fields: &[&str]) -> AnyResult<i64> {
        let returned: i64 = self
            .script
            .key(&self.keys.log)
            .key(&self.keys.max)
            .key(&self.keys.holder)
            .arg(fields)
            .invoke(&mut self.conn)?;
        Ok(returned)
    }

    /// A fenced write; returns whether the resource accepted it.
    pub fn write(&mut self, token: u64, worker: &str) -> AnyResult<bool> {
        Ok(self.event(&["W", &token.to_string(), worker])? == 1)
    }

    /// The start of a hold (sent after the acquire returned).
    pub fn begin(&mut self, token: u64, worker: &str) -> AnyResult<()> {
        let pid = std::process::id().to_string();
        self.event(&["B", &token.to_string(), worker, &pid])
            .map(drop)
    }

    /// The value a hold of the shared value read with the lock (it writes one more).
    pub fn read(&mut self, token: u64, worker: &str, value: u64) -> AnyResult<()> {
        self.event(&["V", &token.to_string(), worker, &value.to_string()])
            .map(drop)
    }

    /// The end of a hold (sent before the unlock).
    pub fn end(&mut self, token: u64, worker: &str) -> AnyResult<()> {
        self.event(&["E", &token.to_string(), worker]).map(drop)
    }

    /// What the holder learnt: whether it saw the lease lost, and what `unlock()` said.
    pub fn outcome(&mut self, token: u64, worker: &str, lost: bool, unlock: &str) -> AnyResult<()> {
        let lost = if lost { "1" } else { "0" };
        self.event(&["R", &token.to_string(), worker, lost, unlock])
            .map(drop)
    }

    /// Any other event: `A` (acquire error), `D` (thread done), `F` (fault), `Q` (quiet from
    /// here), `Z` (the shared value at the end).
    pub fn note(&mut self, fields: &[&str]) -> AnyResult<()> {
        self.event(fields).map(drop)
    }

    /// Like [`note`](Self::note); returns the number of the event's line in the history.
    pub fn mark(&mut self, fields: &[&str]) -> AnyResult<usize> {
        let length = self.event(fields)?;
        Ok(usize::try_from(length - 1)?)
    }

    /// The lines of the history from line `from` (counted from 0) on.
    pub fn lines_from(&mut self, from: usize) -> AnyResult<Vec<String>> {
        let lines: Vec<String> = redis::cmd("LRANGE")
            .arg(&self.keys.log)
            .arg(from)
            .arg(-1)
            .query(&mut self.conn)?;
        Ok(lines)
    }

    /// Lines `from..=to` of the history.
    pub fn lines(&mut self, from: usize, to: usize) -> AnyResult<Vec<String>> {
        let lines: Vec<String> = redis::cmd("LRANGE")
            .arg(&self.keys.log)
            .arg(from)
            .arg(to)
            .query(&mut self.conn)?;
        Ok(lines)
    }

    /// The pid of the process that sent the last `B` not yet followed by an `E`.
    pub fn holder_pid(&mut self) -> AnyResult<Option<u32>> {
        let pid: Option<u32> = redis::cmd("GET")
            .arg(&self.keys.holder)
            .query(&mut self.conn)?;
        Ok(pid)
    }

    /// The whole history, in order.
    pub fn history(&mut self) -> AnyResult<Vec<String>> {
        let lines: Vec<String> = redis::cmd("LRANGE")
            .arg(&self.keys.log)
            .arg(0)
            .arg(-1)
            .query(&mut self.conn)?;
        Ok(lines)
    }
}
