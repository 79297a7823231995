//! A call of one of the crate's scripts (`EVALSHA`), packed once as Redis reads it.

use std::time::Duration;

use redis::{ConnectionLike, Script, Value};

use super::resp::{Args, Packed};
use super::{millis, Conn};

/// A call of one of the crate's scripts: the script, and its keys and arguments.
pub(crate) struct ScriptCall {
    pub(super) script: &'static Script,
    keys: Args,
    args: Args,
}

impl ScriptCall {
    pub(crate) fn new(script: &'static Script) -> Self {
        ScriptCall {
            script,
            keys: Args::with_capacity(192),
            args: Args::with_capacity(160),
        }
    }

    pub(crate) fn key(mut self, key: impl redis::ToRedisArgs) -> Self {
        self.keys.push(key);
        self
    }

    pub(crate) fn arg(mut self, arg: impl redis::ToRedisArgs) -> Self {
        self.args.push(arg);
        self
    }

    /// Adds the call (`EVALSHA hash numkeys keys… args…`) to `packed`.
    pub(super) fn pack_into(&self, packed: &mut Packed) {
        let keys = self.keys.count();
        packed
            .command(3 + keys + self.args.count())
            .bulk(b"EVALSHA")
            .bulk(self.script.get_hash().as_bytes())
            .number(keys as u64)
            .args(&self.keys)
            .args(&self.args);
    }

    fn packed_call(&self) -> Packed {
        // The command's header and the script's hash, its keys and arguments, and room for a
        // `WAIT` after it.
        let mut packed = Packed::with_capacity(96 + self.keys.len() + self.args.len());
        self.pack_into(&mut packed);
        packed
    }

    /// Runs the call (`EVALSHA`, and the script's load when Redis lost it).
    #[inline]
    pub(crate) fn invoke<T: redis::FromRedisValue>(&self, c: &mut Conn) -> redis::RedisResult<T> {
        let packed = self.packed_call();
        let mut reply = c.req_packed_command(packed.as_bytes());
        if reply.as_ref().map_or_else(is_noscript_error, is_noscript) {
            // Redis lost its scripts: load this one, and send the call once more.
            self.script.load(c)?;
            reply = c.req_packed_command(packed.as_bytes());
        }
        // The script ran (its own error replies included): the server has it.
        let ran = match &reply {
            Ok(reply) => !is_noscript(reply),
            Err(e) => matches!(e.kind(), redis::ErrorKind::Server(kind)
                if kind != redis::ServerErrorKind::NoScript),
        };
        if ran {
            c.saw_script(self.script.get_hash());
        }
        Ok(redis::from_redis_value(reply?.extract_error()?)?)
    }

    /// Runs the call and, in the same round trip, `WAIT replicas timeout`: its reply, and
    /// how many replicas acknowledged the writes made on this connection so far (the call's
    /// among them). A call that failed to run waited for nothing worth counting.
    pub(crate) fn invoke_and_wait<T: redis::FromRedisValue>(
        &self,
        c: &mut Conn,
        replicas: u32,
        timeout: Duration,
    ) -> redis::RedisResult<(T, i64)> {
        let mut packed = self.packed_call();
        packed
            .command(3)
            .bulk(b"WAIT")
            .number(u64::from(replicas))
            .number(millis(timeout));
        let mut replies = c.req_packed_commands(packed.as_bytes(), 0, 2)?;
        if replies.first().is_some_and(is_noscript) {
            // Redis lost its scripts: load this one, and send both once more.
            self.script.load(c)?;
            replies = c.req_packed_commands(packed.as_bytes(), 0, 2)?;
        }
        let mut replies = replies.into_iter();
        let (Some(reply), Some(acks)) = (replies.next(), replies.next()) else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Parse,
                "a script call and WAIT got fewer than two replies",
            )));
        };
        if let Value::ServerError(e) = reply {
            return Err(e.into());
        }
        c.saw_script(self.script.get_hash());
        let acks = match acks {
            Value::ServerError(e) => return Err(e.into()),
            acks => redis::from_redis_value(acks)?,
        };
        Ok((redis::from_redis_value(reply)?, acks))
    }

    /// The call as Redis reads it (`EVALSHA`), to write without waiting for its reply.
    pub(crate) fn packed(&self) -> Vec<u8> {
        self.packed_call().into_bytes()
    }
}

/// Whether a reply says that the server does not have the script (`NOSCRIPT`).
pub(super) fn is_noscript(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(e) if e.code() == "NOSCRIPT")
}

fn is_noscript_error(err: &redis::RedisError) -> bool {
    err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

#[cfg(test)]
mod tests {
    use super::*;

    static SCRIPT: std::sync::LazyLock<Script> =
        std::sync::LazyLock::new(|| Script::new("return KEYS[1]"));

    #[test]
    fn packs_as_redis_rs_invokes() {
        let call = ScriptCall::new(&SCRIPT)
            .key("k1")
            .arg("a")
            .key("k2")
            .arg(7u64);
        let mut invocation = SCRIPT.prepare_invoke();
        invocation.key("k1").key("k2").arg("a").arg(7u64);
        let mut pipe = redis::pipe();
        pipe.invoke_script(&invocation);
        assert_eq!(call.packed(), pipe.get_packed_pipeline());
    }
}
