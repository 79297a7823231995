//! The reply of an acquire script: `{1, fencing token}` or `{0, milliseconds}`; after them,
//! for a protocol that keeps a value under its lock, the value's stored bytes (or nil) and
//! the fencing token of its writer, and for one whose releases hand the lock to a queued
//! waiter, the server's clock when a waiter queued; last, a `Mutex`'s place made while its
//! caller's own client held the lock.

use redis::{FromRedisValue, ParsingError, Value};

/// One acquire attempt's reply.
pub(crate) struct AcquireReply {
    /// 1 when taken, 0 when not.
    pub(crate) taken: i64,
    /// The fencing token when taken, else how long to wait at most.
    pub(crate) value: i64,
    /// The bytes that came with the lock (a shared value), when the protocol sends any and
    /// they exist.
    pub(crate) payload: Option<Vec<u8>>,
    /// The version of the payload across instances: the fencing token of the holder that
    /// wrote (or removed) it, and which of its writes (`(0, 0)` when not known).
    pub(crate) payload_version: (u64, u64),
    /// The server's clock (ms) when the attempt ran, when the protocol sends it.
    pub(crate) server_ms: Option<i64>,
    /// A failed attempt's place among the waiting, made while the caller's own client held
    /// the lock: its score, which the caller's own release gives up (`mutex/take.lua`).
    pub(crate) own_place: Option<u64>,
    /// A failed re-check's count of the waiting clients that a release names before the
    /// caller's (`mutex/take.lua`).
    pub(crate) ahead: Option<u32>,
}

impl AcquireReply {
    /// Taken, with this fencing token.
    pub(crate) fn taken(fencing_token: i64) -> Self {
        AcquireReply {
            taken: 1,
            value: fencing_token,
            payload: None,
            payload_version: (0, 0),
            server_ms: None,
            own_place: None,
            ahead: None,
        }
    }

    /// Held by someone else, the time left not read (a plain take's reply to a caller that
    /// does not wait, which has no use for it): at most `lease_ms`, the lease asked for, is
    /// the bound given, as a lock's holders mostly ask for the same lease.
    pub(crate) fn held_time_unread(lease_ms: u64) -> Self {
        AcquireReply {
            taken: 0,
            value: i64::try_from(lease_ms).unwrap_or(i64::MAX),
            payload: None,
            payload_version: (0, 0),
            server_ms: None,
            own_place: None,
            ahead: None,
        }
    }
}

impl FromRedisValue for AcquireReply {
    fn from_redis_value(v: Value) -> Result<Self, ParsingError> {
        let Value::Array(items) = v else {
            return Err(format!("an acquire reply is an array, not {v:?}").into());
        };
        let mut items = items.into_iter();
        let (Some(taken), Some(value)) = (items.next(), items.next()) else {
            return Err("an acquire reply has at least two items".into());
        };
        let (payload, server_ms) = match items.next() {
            None | Some(Value::Nil) => (None, None),
            Some(Value::Int(ms)) => (None, Some(ms)),
            Some(bytes) => (Some(Vec::<u8>::from_redis_value(bytes)?), None),
        };
        let payload_version = match items.next() {
            None | Some(Value::Nil) => (0, 0),
            // A version that is not one (written by hand) counts as the oldest.
            Some(version) => String::from_redis_value(version)
                .ok()
                .and_then(|text| parse_version(&text))
                .unwrap_or((0, 0)),
        };
        let own_place = match items.next() {
            Some(Value::Int(score)) => u64::try_from(score).ok(),
            _ => None,
        };
        let ahead = match items.next() {
            Some(Value::Int(n)) => Some(u32::try_from(n).unwrap_or(u32::MAX)),
            _ => None,
        };
        Ok(AcquireReply {
            taken: i64::from_redis_value(taken)?,
            value: i64::from_redis_value(value)?,
            payload,
            payload_version,
            server_ms,
            own_place,
            ahead,
        })
    }
}

/// A payload's version as stored, `T.n` (or `T`).
pub(crate) fn parse_version(text: &str) -> Option<(u64, u64)> {
    let (token, n) = text.split_once('.').unwrap_or((text, "0"));
    Some((token.parse().ok()?, n.parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_order_by_fencing_token_then_write() {
        assert_eq!(parse_version("12.3"), Some((12, 3)));
        assert_eq!(parse_version("12"), Some((12, 0)));
        assert_eq!(parse_version("x.1"), None);
        assert!(parse_version("12.1") > parse_version("11.9"));
        assert!(parse_version("12.2") > parse_version("12.1"));
    }
}
