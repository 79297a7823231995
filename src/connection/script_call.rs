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
    /// The script hands something over and announces it (a release that hands the lock to
    /// the next waiter): see [`announcing`](Self::announcing).
    announces: bool,
}

impl ScriptCall {
    pub(crate) fn new(script: &'static Script) -> Self {
        Self::carrying(script, 0)
    }

    /// A call one of whose arguments is `bytes` long (a value a script writes): its
    /// arguments are packed into one buffer made large enough at once.
    pub(crate) fn carrying(script: &'static Script, bytes: usize) -> Self {
        ScriptCall {
            script,
            keys: Args::with_capacity(192),
            args: Args::with_capacity(160 + bytes),
            announces: false,
        }
    }

    /// Marks a call whose script announces a hand-off (pub/sub) to a waiter that is asleep
    /// until it hears of it: a call whose reply is awaited goes out behind a `TIME`, so that
    /// Redis writes the announcement before this call's reply.
    ///
    /// Redis writes the replies of one turn of its event loop newest client first: a script
    /// that publishes and then replies puts the caller's reply ahead of the announcement, and
    /// the caller, woken by it on the CPU that Redis runs on, takes that CPU before Redis has
    /// written the announcement (it sends its next command first, on a machine with few
    /// cores). The `TIME`'s reply, pending before the script runs, puts the caller behind
    /// the waiter; it is dropped. Any command would do: `TIME` is keyless, and one that the
    /// documented ACL rules allow already (docs/guide/tls-and-acl.md). It costs Redis one
    /// command in the same round trip; the waiter is woken about one scheduling delay sooner
    /// (docs/perf/notes.md).
    pub(crate) fn announcing(mut self) -> Self {
        self.announces = true;
        self
    }

    /// Keeps the [`announcing`](Self::announcing) mark only when the call `likely` hands
    /// something over: a release of a lock taken at once, with nobody waiting then, most
    /// likely hands nothing over, and its `TIME` would cost Redis a command and the caller a
    /// reply for nothing. When it does hand the lock on, the waiter is woken all the same,
    /// about one scheduling delay later.
    pub(crate) fn announcing_only_if(mut self, likely: bool) -> Self {
        self.announces &= likely;
        self
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

    /// The call to send and await on `c`: behind a `TIME` when it announces, unless the
    /// call must follow an `ASKING` at once. Gives how many replies come before the
    /// script's.
    fn packed_call(&self, c: &mut Conn) -> (Packed, usize) {
        // The command's header and the script's hash, its keys and arguments, and room for a
        // `TIME` before it and a `WAIT` after it.
        let mut packed = Packed::with_capacity(110 + self.keys.len() + self.args.len());
        let before = usize::from(self.announces && !c.take_asking());
        if before > 0 {
            packed.command(1).bulk(b"TIME");
        }
        self.pack_into(&mut packed);
        (packed, before)
    }

    /// Sends the packed call and reads the script's reply, after the `before` replies of the
    /// commands ahead of it.
    fn request(c: &mut Conn, (packed, before): &(Packed, usize)) -> redis::RedisResult<Value> {
        if *before == 0 {
            return c.req_packed_command(packed.as_bytes());
        }
        let mut replies = c.req_packed_commands(packed.as_bytes(), 0, before + 1)?;
        replies.pop().ok_or_else(|| {
            redis::RedisError::from((redis::ErrorKind::Parse, "a script call got no reply"))
        })
    }

    /// Runs the call (`EVALSHA`, and the script's load when Redis lost it).
    #[inline]
    pub(crate) fn invoke<T: redis::FromRedisValue>(&self, c: &mut Conn) -> redis::RedisResult<T> {
        let call = self.packed_call(c);
        let mut reply = ScriptCall::request(c, &call);
        if reply.as_ref().map_or_else(is_noscript_error, is_noscript) {
            // Redis lost its scripts: load this one, and send the call once more.
            self.script.load(c)?;
            reply = ScriptCall::request(c, &call);
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
        let (reply, acks) = self.invoke_then(c, "WAIT", |packed| {
            packed
                .command(3)
                .bulk(b"WAIT")
                .number(u64::from(replicas))
                .number(millis(timeout));
        })?;
        let acks = match acks {
            Value::ServerError(e) => return Err(e.into()),
            acks => redis::from_redis_value(acks)?,
        };
        Ok((redis::from_redis_value(reply)?, acks))
    }

    /// Runs the call and, behind it in the same round trip, `BLPOP key timeout` (which Redis
    /// reads in seconds with decimals): the call's reply, and the value the pop took (`None`
    /// when none came in time), or the error Redis gave the pop.
    pub(crate) fn invoke_then_pop<T: redis::FromRedisValue>(
        &self,
        c: &mut Conn,
        key: &str,
        timeout: Duration,
    ) -> redis::RedisResult<(T, redis::RedisResult<Option<String>>)> {
        let seconds = format!("{:.3}", timeout.as_secs_f64());
        let (reply, popped) = self.invoke_then(c, "BLPOP", |packed| {
            packed.command_of(&[b"BLPOP", key.as_bytes(), seconds.as_bytes()]);
        })?;
        let popped = match popped {
            Value::ServerError(e) => Err(e.into()),
            popped => redis::from_redis_value::<Option<(String, String)>>(popped)
                .map(|popped| popped.map(|(_, value)| value))
                .map_err(redis::RedisError::from),
        };
        Ok((redis::from_redis_value(reply)?, popped))
    }

    /// Runs the call with the one command that `behind` packs (`name`) behind it in the same
    /// round trip, the script loaded and both sent again when Redis lost it: the call's reply
    /// (an error reply is the error), and the command's, as it came.
    fn invoke_then(
        &self,
        c: &mut Conn,
        name: &str,
        behind: impl FnOnce(&mut Packed),
    ) -> redis::RedisResult<(Value, Value)> {
        let (mut packed, before) = self.packed_call(c);
        behind(&mut packed);
        let mut replies = c.req_packed_commands(packed.as_bytes(), 0, before + 2)?;
        if replies.get(before).is_some_and(is_noscript) {
            // Redis lost its scripts: load this one, and send both once more.
            self.script.load(c)?;
            replies = c.req_packed_commands(packed.as_bytes(), 0, before + 2)?;
        }
        let mut replies = replies.into_iter().skip(before);
        let (Some(reply), Some(next)) = (replies.next(), replies.next()) else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Parse,
                "a script call and the command behind it got fewer than two replies",
                name.to_owned(),
            )));
        };
        if let Value::ServerError(e) = reply {
            return Err(e.into());
        }
        c.saw_script(self.script.get_hash());
        Ok((reply, next))
    }

    /// The call as Redis reads it (`EVALSHA`), to write without waiting for its reply (never
    /// behind a `TIME`: one reply is read for it).
    pub(crate) fn packed(&self) -> Vec<u8> {
        let mut packed = Packed::with_capacity(96 + self.keys.len() + self.args.len());
        self.pack_into(&mut packed);
        packed.into_bytes()
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
