//! A pooled connection: its link to the server with the replies it still has to read.
//!
//! A connection may carry replies still to be read ([`Conn::send_unread`]: a guard's release,
//! written before the guard's drop returns). Its next user writes its own command first, then
//! reads those replies and hands each to its handler, then reads its own: the earlier reply
//! costs that user no round trip of its own, and no caller ever reads a reply that is not
//! its own. The renewal thread reads what idle connections still carry
//! ([`Pool::settle_idle`](super::Pool::settle_idle)); a connection thrown away with replies
//! unread tells their handlers that the outcome is unknown.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use super::wire::Link;
use super::ServerFeatures;

/// Whether an error leaves the connection in an unknown state (timed out mid-reply, closed,
/// garbled) rather than being an error reply from the server.
pub(super) fn is_transport_error(err: &redis::RedisError) -> bool {
    !matches!(
        err.kind(),
        redis::ErrorKind::Server(_) | redis::ErrorKind::Extension
    )
}

/// What to do with a reply read later: Redis's reply, or the error that kept it from being
/// read (the outcome is unknown then).
pub(crate) type OnReply = Box<dyn FnOnce(redis::RedisResult<redis::Value>) + Send>;

/// The most replies one connection carries unread; a send past it reads the oldest first.
const MAX_UNREAD: usize = 8;

/// A pooled connection, with the replies to commands written earlier that are still to be
/// read, oldest first.
pub(crate) struct Conn {
    inner: Link,
    unread: VecDeque<OnReply>,
    /// The hashes of the scripts that this connection saw its server run (so that a call
    /// written without waiting for its reply is not refused with `NOSCRIPT`).
    scripts: Vec<&'static str>,
    /// What its server accepts, shared with the other connections to it.
    features: Arc<ServerFeatures>,
    /// `ASKING` was sent for the next command (a Cluster slot being migrated): nothing may
    /// come between them.
    asking: bool,
}

impl Conn {
    pub(super) fn new(inner: Link, features: Arc<ServerFeatures>) -> Self {
        Conn {
            inner,
            unread: VecDeque::new(),
            scripts: Vec::new(),
            features,
            asking: false,
        }
    }

    /// Sends `ASKING`, so that the next command is served by a node that imports its slot.
    pub(crate) fn ask(&mut self) -> redis::RedisResult<()> {
        redis::cmd("ASKING").query::<()>(self)?;
        self.asking = true;
        Ok(())
    }

    /// Whether the next command must follow `ASKING` at once; true once, after [`ask`](Self::ask).
    pub(crate) fn take_asking(&mut self) -> bool {
        std::mem::take(&mut self.asking)
    }

    /// What the connection's server accepts.
    pub(crate) fn features(&self) -> &ServerFeatures {
        &self.features
    }

    /// Notes that the server ran (or has) the script of `hash`.
    pub(crate) fn saw_script(&mut self, hash: &'static str) {
        if !self.knows_script(hash) {
            self.scripts.push(hash);
        }
    }

    /// Whether the server ran the script of `hash` on this connection before.
    pub(crate) fn knows_script(&self, hash: &str) -> bool {
        // Each script's hash is one static string: its address finds it without comparing
        // 40 bytes with each hash seen before (every script call asks).
        let same =
            |seen: &&str| std::ptr::eq(seen.as_ptr(), hash.as_ptr()) && seen.len() == hash.len();
        self.scripts.iter().any(same) || self.scripts.contains(&hash)
    }

    /// Writes an already packed command without reading its reply; `on_reply` gets the reply
    /// when the connection's next user (or [`Pool::settle_idle`]) reads it.
    pub(crate) fn send_unread(
        &mut self,
        packed: &[u8],
        on_reply: OnReply,
    ) -> redis::RedisResult<()> {
        if self.unread.len() >= MAX_UNREAD {
            self.settle()?;
        }
        self.inner.send(packed)?;
        self.unread.push_back(on_reply);
        Ok(())
    }

    /// Writes an already packed command (its reply is read with
    /// [`recv_response`](Self::recv_response)), after reading what was unread.
    pub(crate) fn send_packed_command(&mut self, packed: &[u8]) -> redis::RedisResult<()> {
        self.settle()?;
        self.inner.send(packed)
    }

    /// Reads one reply.
    pub(crate) fn recv_response(&mut self) -> redis::RedisResult<redis::Value> {
        self.reply()
    }

    /// The next reply, past any RESP3 push frame (a RESP3 connection may carry one between
    /// replies; it answers no command).
    fn reply(&mut self) -> redis::RedisResult<redis::Value> {
        loop {
            match self.inner.recv()? {
                redis::Value::Push { .. } => continue,
                value => return Ok(value),
            }
        }
    }

    pub(super) fn set_read_timeout(&self, timeout: Duration) -> redis::RedisResult<()> {
        self.inner.set_read_timeout(Some(timeout))
    }

    /// Whether replies are still to be read.
    pub(super) fn has_unread(&self) -> bool {
        !self.unread.is_empty()
    }

    /// Reads every unread reply and hands each to its handler. After a transport error the
    /// rest are told that their outcome is unknown, and the error is returned.
    pub(super) fn settle(&mut self) -> redis::RedisResult<()> {
        while let Some(on_reply) = self.unread.pop_front() {
            let reply = self.reply();
            let failed = reply
                .as_ref()
                .err()
                .filter(|e| is_transport_error(e))
                .cloned();
            on_reply(reply);
            if let Some(err) = failed {
                self.abandon_unread(&err);
                return Err(err);
            }
        }
        Ok(())
    }

    /// Tells every handler still waiting that its reply will never be read.
    fn abandon_unread(&mut self, err: &redis::RedisError) {
        for on_reply in self.unread.drain(..) {
            on_reply(Err(err.clone()));
        }
    }
}

impl redis::ConnectionLike for Conn {
    fn req_packed_command(&mut self, cmd: &[u8]) -> redis::RedisResult<redis::Value> {
        // Ours goes out first, so that earlier replies cost no round trip of their own.
        self.inner.send(cmd)?;
        self.settle()?;
        self.reply()
    }

    fn req_packed_commands(
        &mut self,
        cmd: &[u8],
        offset: usize,
        count: usize,
    ) -> redis::RedisResult<Vec<redis::Value>> {
        // A pipeline goes out first too, as a single command does. Its replies are read here,
        // one by one, and the first read that fails (a time-out) ends the call: redis-rs would
        // go on and wait for every later reply in turn, so that a silent server would cost a
        // pipeline its length times the response timeout. A transaction's first `offset`
        // replies (`MULTI`, `QUEUED`) are passed over; the first error among them is the
        // call's, once every reply is read (the connection stays in step).
        self.inner.send(cmd)?;
        self.settle()?;
        let mut replies = Vec::with_capacity(count);
        let mut refused = None;
        for _ in 0..offset {
            if let redis::Value::ServerError(e) = self.reply()? {
                refused.get_or_insert(e);
            }
        }
        while replies.len() < count {
            replies.push(self.reply()?);
        }
        match refused {
            Some(e) => Err(e.into()),
            None => Ok(replies),
        }
    }

    fn get_db(&self) -> i64 {
        self.inner.db()
    }

    fn check_connection(&mut self) -> bool {
        self.settle().is_ok() && redis::cmd("PING").query::<String>(self).is_ok()
    }

    fn is_open(&self) -> bool {
        self.inner.is_open()
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        if self.has_unread() {
            let closed = redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::ConnectionAborted,
                "the connection was closed before the reply was read",
            ));
            self.abandon_unread(&closed);
        }
    }
}
