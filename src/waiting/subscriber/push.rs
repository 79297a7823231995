//! The frames a subscriber connection reads and the commands it writes, in either flavour of
//! pub/sub: sharded (`SSUBSCRIBE`, Redis 7 and later: in a Cluster a message stays in its
//! slot's shard) or classic (`SUBSCRIBE`, before Redis 7).

use redis::{Connection, RedisResult};

/// Which pub/sub commands a connection uses; the scripts choose the same by the server's
/// version (`lease/lua/announce.lua`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Flavour {
    Sharded,
    Classic,
}

impl Flavour {
    pub(super) fn publish(self) -> &'static str {
        match self {
            Flavour::Sharded => "SPUBLISH",
            Flavour::Classic => "PUBLISH",
        }
    }

    fn subscribe(self) -> &'static str {
        match self {
            Flavour::Sharded => "SSUBSCRIBE",
            Flavour::Classic => "SUBSCRIBE",
        }
    }

    fn unsubscribe(self) -> &'static str {
        match self {
            Flavour::Sharded => "SUNSUBSCRIBE",
            Flavour::Classic => "UNSUBSCRIBE",
        }
    }

    /// Writes the subscription of channels `ch` without reading the confirmations (they come
    /// as pushes). Sharded channels take one command each: the channels of one `SSUBSCRIBE`
    /// must share a slot.
    pub(super) fn subscribe_to(self, conn: &mut Connection, ch: &[String]) -> RedisResult<()> {
        send(conn, self.subscribe(), self, ch)
    }

    /// Writes the unsubscription of channels `ch`, as [`subscribe_to`](Self::subscribe_to).
    pub(super) fn unsubscribe_from(self, conn: &mut Connection, ch: &[String]) -> RedisResult<()> {
        send(conn, self.unsubscribe(), self, ch)
    }
}

fn send(
    conn: &mut redis::Connection,
    command: &str,
    flavour: Flavour,
    channels: &[String],
) -> redis::RedisResult<()> {
    if channels.is_empty() {
        return Ok(());
    }
    let mut packed = Vec::new();
    match flavour {
        Flavour::Sharded => {
            for channel in channels {
                packed.extend(redis::cmd(command).arg(channel).get_packed_command());
            }
        }
        Flavour::Classic => packed = redis::cmd(command).arg(channels).get_packed_command(),
    }
    conn.send_packed_command(&packed)
}

/// A frame the subscriber acts on.
pub(super) enum Push {
    /// A message: the channel and the payload.
    Message(String, String),
    /// Redis confirmed a subscription.
    Subscribed(String),
    /// Redis confirmed an unsubscription, or dropped a subscription by itself (a sharded
    /// channel whose slot moved to another node).
    Unsubscribed(String),
    /// An error reply: a command of ours was refused.
    Refused(String),
}

impl Push {
    /// Reads one frame, waiting at most the connection's read timeout. `Ok(None)` when
    /// nothing came, or something that is not for us. A read interrupted by a signal (the
    /// process was stopped and continued, say: a read with a timeout is not restarted) is
    /// taken up again like one that timed out: the parser keeps what it had read.
    pub(super) fn read(conn: &mut redis::Connection) -> redis::RedisResult<Option<Push>> {
        match conn.recv_response() {
            Ok(redis::Value::Push { kind, data }) => Ok(Push::parse(kind, data)),
            Ok(redis::Value::ServerError(e)) => Ok(Some(Push::Refused(format!("{e:?}")))),
            Ok(_) => Ok(None),
            Err(e) if e.is_timeout() || was_interrupted(&e) => Ok(None),
            Err(e) if e.code().is_some() => Ok(Some(Push::Refused(e.to_string()))),
            Err(e) => Err(e),
        }
    }

    fn parse(kind: redis::PushKind, data: Vec<redis::Value>) -> Option<Push> {
        use redis::PushKind as K;
        let text = |v: &redis::Value| redis::from_redis_value_ref::<String>(v).ok();
        let channel = data.first().and_then(text)?;
        match kind {
            K::Message | K::SMessage => Some(Push::Message(channel, data.get(1).and_then(text)?)),
            K::Subscribe | K::SSubscribe => Some(Push::Subscribed(channel)),
            K::Unsubscribe | K::SUnsubscribe => Some(Push::Unsubscribed(channel)),
            _ => None,
        }
    }
}

/// Whether a read failed only because a signal interrupted it (`EINTR`).
fn was_interrupted(err: &redis::RedisError) -> bool {
    use std::error::Error as _;
    use std::io;
    let Some(source) = err.source() else {
        return false;
    };
    let io_error = source.downcast_ref::<io::Error>().or_else(|| {
        source
            .downcast_ref::<std::sync::Arc<dyn std::error::Error + Send + Sync>>()
            .and_then(|inner| inner.downcast_ref::<io::Error>())
    });
    io_error.is_some_and(|e| e.kind() == io::ErrorKind::Interrupted)
}

#[cfg(test)]
mod tests {
    use super::was_interrupted;

    #[test]
    fn an_interrupted_read_is_told_from_a_broken_connection() {
        let io = |kind| redis::RedisError::from(std::io::Error::from(kind));
        assert!(was_interrupted(&io(std::io::ErrorKind::Interrupted)));
        assert!(!was_interrupted(&io(std::io::ErrorKind::ConnectionReset)));
        assert!(!was_interrupted(&io(std::io::ErrorKind::UnexpectedEof)));
    }
}
