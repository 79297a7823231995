//! What one server accepts, learned once per server from the first reply that tells, so that
//! the crate never sends a command a server refuses on every call.
//!
//! The one such feature today: `SET key value NX PX ms GET`, which the plain take of a free
//! `Mutex` lock sends (`lease::plain_take`). Redis 7.0 and later and Valkey accept it; Redis
//! 6.2 answers `ERR syntax error` (it has `GET`, but not together with `NX`). The scripts
//! tell the versions apart themselves (`redis.REDIS_VERSION_NUM` exists from 7.0 on), and
//! the subscriber learns sharded pub/sub from its first `SSUBSCRIBE`.

use std::sync::atomic::{AtomicI64, AtomicU8, Ordering};

/// Whether a server takes `SET … NX … GET`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SetNxGet {
    /// Not tried on this server yet.
    Untried,
    Taken,
    Refused,
}

/// The features of one server (one pool's), shared by its connections.
#[derive(Debug)]
pub(crate) struct ServerFeatures {
    /// A [`SetNxGet`] as a number: 0 untried, 1 taken, 2 refused.
    set_nx_get: AtomicU8,
    /// How many of this master's replicas a failover may promote, as the deployment says
    /// (a Cluster's slot map, the sentinels); negative: not known (one server).
    promotable: AtomicI64,
}

impl Default for ServerFeatures {
    fn default() -> Self {
        ServerFeatures {
            set_nx_get: AtomicU8::new(0),
            promotable: AtomicI64::new(-1),
        }
    }
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
    /// How many of this master's replicas a failover may promote, when the deployment knows.
    pub(crate) fn promotable_replicas(&self) -> Option<u32> {
        u32::try_from(self.promotable.load(Ordering::Relaxed)).ok()
    }

    /// Records what the deployment says of this master's replicas (`None`: not known).
    pub(crate) fn set_promotable_replicas(&self, replicas: Option<u32>) {
        let value = replicas.map_or(-1, i64::from);
        self.promotable.store(value, Ordering::Relaxed);
    }
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
