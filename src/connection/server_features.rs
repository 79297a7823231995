//! What one server accepts, learned once per server from the first reply that tells, so that
//! the crate never sends a command a server refuses on every call.
//!
//! The one such feature today: `SET key value NX PX ms GET`, which the plain take of a free
//! `Mutex` lock sends (`lease::plain_take`). Redis 7.0 and later and Valkey accept it; Redis
//! 6.2 answers `ERR syntax error` (it has `GET`, but not together with `NX`). The scripts
//! tell the versions apart themselves (`redis.REDIS_VERSION_NUM` exists from 7.0 on), and
//! the subscriber learns sharded pub/sub from its first `SSUBSCRIBE`.

use std::sync::atomic::{AtomicU8, Ordering};

// 0: not tried yet.
const ACCEPTED: u8 = 1;
const REFUSED: u8 = 2;

/// The features of one server (one pool's), shared by its connections.
#[derive(Debug, Default)]
pub(crate) struct ServerFeatures {
    set_nx_get: AtomicU8,
}

impl ServerFeatures {
    /// Whether `SET … NX … GET` may be sent: accepted, or not tried yet.
    pub(crate) fn may_set_nx_get(&self) -> bool {
        self.set_nx_get.load(Ordering::Relaxed) != REFUSED
    }

    /// Whether the server is known to take `SET … NX … GET`.
    pub(crate) fn takes_set_nx_get(&self) -> bool {
        self.set_nx_get.load(Ordering::Relaxed) == ACCEPTED
    }

    /// Notes the server's reply to a `SET … NX … GET`.
    pub(crate) fn saw_set_nx_get(&self, reply: &redis::RedisResult<redis::Value>) {
        let seen = match reply {
            Ok(redis::Value::ServerError(e)) if is_syntax_error(e.code(), e.details()) => REFUSED,
            Err(e) if is_syntax_error(e.code().unwrap_or(""), e.detail()) => REFUSED,
            Ok(redis::Value::ServerError(_)) | Err(_) => return,
            Ok(_) => ACCEPTED,
        };
        if self.set_nx_get.load(Ordering::Relaxed) != seen {
            self.set_nx_get.store(seen, Ordering::Relaxed);
        }
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
        assert!(f.may_set_nx_get());
        f.saw_set_nx_get(&error("WRONGTYPE Operation against a key"));
        assert!(f.may_set_nx_get());
        f.saw_set_nx_get(&error("ERR syntax error"));
        assert!(!f.may_set_nx_get());
        assert!(!f.takes_set_nx_get());
        f.saw_set_nx_get(&Ok(redis::Value::Nil));
        assert!(f.may_set_nx_get());
        assert!(f.takes_set_nx_get());
    }
}
