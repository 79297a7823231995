//! What one server accepts, learned once per server from the first reply that tells, so that
//! the crate never sends a command a server refuses on every call.
//!
//! The one such feature today: `SET key value NX PX ms GET`, which the plain take of a free
//! `Mutex` lock sends (`lease::plain_take`). Redis 7.0 and later and Valkey accept it; Redis
//! 6.2 answers `ERR syntax error` (it has `GET`, but not together with `NX`). The scripts
//! tell the versions apart themselves (`redis.REDIS_VERSION_NUM` exists from 7.0 on), and
//! the subscriber learns sharded pub/sub from its first `SSUBSCRIBE`.

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// How long a count of a master's online replicas is used before it is read again.
const REPLICAS_FRESH_FOR: Duration = Duration::from_secs(1);

/// Whether a server takes `SET … NX … GET`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SetNxGet {
    /// Not tried on this server yet.
    Untried,
    Taken,
    Refused,
}

/// The features of one server (one pool's), shared by its connections.
#[derive(Debug, Default)]
pub(crate) struct ServerFeatures {
    /// A [`SetNxGet`] as a number: 0 untried, 1 taken, 2 refused.
    set_nx_get: AtomicU8,
    /// How many replicas the server reported online, and when (for replica acknowledgements).
    replicas: Mutex<Option<(u32, Instant)>>,
}

impl ServerFeatures {
    /// What is known of `SET … NX … GET` on this server.
    pub(crate) fn set_nx_get(&self) -> SetNxGet {
        match self.set_nx_get.load(Ordering::Relaxed) {
            0 => SetNxGet::Untried,
            1 => SetNxGet::Taken,
            _ => SetNxGet::Refused,
        }
    }

    /// Learns from the server's reply to a `SET … NX … GET`: a syntax error refuses it, any
    /// other reply but an error takes it, an error tells nothing.
    pub(crate) fn saw_set_nx_get(&self, reply: &redis::RedisResult<redis::Value>) {
        let seen = match reply {
            Ok(redis::Value::ServerError(e)) if is_syntax_error(e.code(), e.details()) => 2,
            Err(e) if is_syntax_error(e.code().unwrap_or(""), e.detail()) => 2,
            Ok(redis::Value::ServerError(_)) | Err(_) => return,
            Ok(_) => 1,
        };
        self.set_nx_get.store(seen, Ordering::Relaxed);
    }
}

impl ServerFeatures {
    /// The number of online replicas the server reported less than a second ago, if any.
    pub(crate) fn replicas_online(&self) -> Option<u32> {
        let known = *self.replicas.lock();
        known
            .filter(|(_, at)| at.elapsed() < REPLICAS_FRESH_FOR)
            .map(|(n, _)| n)
    }

    /// Reads the number of replicas online from the server (`INFO replication`: the
    /// replicas in state `online`, which are those that can acknowledge a write), and keeps
    /// it for a second.
    pub(crate) fn read_replicas_online(
        &self,
        c: &mut impl redis::ConnectionLike,
    ) -> redis::RedisResult<u32> {
        let info: String = redis::cmd("INFO").arg("replication").query(c)?;
        let online = count_online_replicas(&info);
        *self.replicas.lock() = Some((online, Instant::now()));
        Ok(online)
    }
}

/// The replicas in state `online` in an `INFO replication` text (`slave0:ip=…,state=online,…`).
fn count_online_replicas(info: &str) -> u32 {
    let online = info
        .lines()
        .filter(|l| {
            l.strip_prefix("slave")
                .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
        })
        .filter(|l| {
            l.split([':', ','])
                .any(|field| field.trim() == "state=online")
        })
        .count();
    u32::try_from(online).unwrap_or(u32::MAX)
}

/// `ERR syntax error`: the server does not know the command's form.
fn is_syntax_error(code: &str, details: Option<&str>) -> bool {
    code == "ERR" && details.is_some_and(|d| d.starts_with("syntax error"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn error(text: &str) -> redis::RedisResult<redis::Value> {
        redis::parse_redis_value(format!("-{text}\r\n").as_bytes())
    }

    #[test]
    fn online_replicas_are_counted_from_info_replication() {
        let info = "# Replication\r\nrole:master\r\nconnected_slaves:3\r\n\
            slave0:ip=127.0.0.1,port=7001,state=online,offset=100,lag=0\r\n\
            slave1:ip=127.0.0.1,port=7002,state=wait_bgsave,offset=0,lag=0\r\n\
            slave2:ip=127.0.0.1,port=7003,state=online,offset=100,lag=1\r\n\
            slave_read_repl_offset:100\r\nmaster_repl_offset:100\r\n";
        assert_eq!(count_online_replicas(info), 2);
        assert_eq!(count_online_replicas("# Replication\r\nrole:master\r\n"), 0);
    }

    #[test]
    fn a_syntax_error_refuses_and_other_replies_accept_or_tell_nothing() {
        let f = ServerFeatures::default();
        assert_eq!(f.set_nx_get(), SetNxGet::Untried);
        f.saw_set_nx_get(&error("WRONGTYPE Operation against a key"));
        assert_eq!(f.set_nx_get(), SetNxGet::Untried);
        f.saw_set_nx_get(&error("ERR syntax error"));
        assert_eq!(f.set_nx_get(), SetNxGet::Refused);
        f.saw_set_nx_get(&Ok(redis::Value::Nil));
        assert_eq!(f.set_nx_get(), SetNxGet::Taken);
    }
}
