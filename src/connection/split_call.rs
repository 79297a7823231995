//! A call split in two: written now, its reply read later. Writing the calls to several
//! servers before reading any reply costs about one round trip in all, without a thread per
//! server (Redlock's fan-out). A call is a script, or a few plain commands.

use std::time::Duration;

use crate::connection::{Checkout, Connections, OnReply, ScriptCall, ServerFeatures};
use crate::error::{Doing, Error, Result, Server};

/// Plain commands written to their server, whose replies are still to be read.
pub(crate) struct SentCommands {
    checkout: Checkout,
    server: Server,
    count: usize,
}

/// A script call written to its server, whose reply is still to be read.
pub(crate) struct SentCall<'a> {
    checkout: Checkout,
    server: Server,
    call: &'a ScriptCall,
}

impl Connections {
    /// Writes `call` to the server of `route` and returns without reading its reply:
    /// `on_reply` gets the reply when the connection's next user (or the renewal thread)
    /// reads it, or an error when it never will be (the outcome is unknown then). Redis runs
    /// the call before anything written after it on the same connection.
    ///
    /// `Ok(false)`: nothing was written, because the connection did not see its server run
    /// the script yet (it may not have it); the caller makes a call that waits instead.
    pub(crate) fn send_unread(
        &self,
        route: &str,
        call: &ScriptCall,
        doing: Doing<'_>,
        on_reply: OnReply,
    ) -> Result<bool> {
        let shard = self.shard_of(route);
        let mut checkout = self.checkout(shard, doing)?;
        if !checkout.knows_script(call.script.get_hash()) {
            // The server may not have the script: `NOSCRIPT` would come too late to load it.
            return Ok(false);
        }
        let result = checkout.send_unread(doing, &call.packed(), on_reply);
        if let Err(e) = &result {
            self.report_failure(shard, e);
        }
        result.map(|()| true)
    }

    /// Writes `call` to the server of `route` without waiting for its reply; a connection
    /// that must be made first is made within `within`. A redirection (`MOVED`) is not
    /// followed: split calls are for standalone servers.
    pub(crate) fn send<'a>(
        &self,
        route: &str,
        call: &'a ScriptCall,
        doing: Doing<'_>,
        within: Duration,
    ) -> Result<SentCall<'a>> {
        let shard = self.shard_of(route);
        let server = self.shard_server(shard);
        let mut checkout = self.checkout_within(shard, doing, within)?;
        let packed = call.packed();
        checkout.write(doing, |c| c.send_packed_command(&packed))?;
        Ok(SentCall {
            checkout,
            server,
            call,
        })
    }
}

impl Connections {
    /// Writes the plain commands that `build` packs for the server of `route`, knowing what
    /// that server accepts, and returns without reading their replies; `Ok(None)` when
    /// `build` packs none (nothing is written). `build` gives the packed pipeline and how
    /// many commands it holds. A connection that must be made first is made within `within`;
    /// a redirection (`MOVED`) is not followed.
    pub(crate) fn send_commands(
        &self,
        route: &str,
        doing: Doing<'_>,
        within: Duration,
        build: impl FnOnce(&ServerFeatures) -> Option<(Vec<u8>, usize)>,
    ) -> Result<Option<SentCommands>> {
        let shard = self.shard_of(route);
        let server = self.shard_server(shard);
        let mut checkout = self.checkout_within(shard, doing, within)?;
        let Some((packed, count)) = build(checkout.features()) else {
            return Ok(None);
        };
        checkout.write(doing, |c| c.send_packed_command(&packed))?;
        Ok(Some(SentCommands {
            checkout,
            server,
            count,
        }))
    }
}

impl SentCommands {
    /// Reads every reply, waiting at most `timeout` for each (then the connection is thrown
    /// away and the outcome is unknown), and shows them to `seen` with what the server is
    /// known to accept (for what they tell of it). A command's error reply is a value
    /// (`Value::ServerError`) among the others.
    pub(crate) fn read(
        mut self,
        timeout: Duration,
        doing: Doing<'_>,
        seen: impl FnOnce(&ServerFeatures, &[redis::Value]),
    ) -> Result<Vec<redis::Value>> {
        let timeout = timeout.max(Duration::from_millis(1));
        let count = self.count;
        let replies: redis::RedisResult<Vec<redis::Value>> = self
            .checkout
            .call_within(timeout, |c| (0..count).map(|_| c.recv_response()).collect());
        if let Ok(replies) = &replies {
            seen(self.checkout.features(), replies);
        }
        replies.map_err(|e| {
            let server = Server {
                response_timeout: timeout,
                ..self.server.clone()
            };
            Error::from_call(&server, doing, e)
        })
    }
}

impl SentCall<'_> {
    /// Reads the reply, waiting at most `timeout` (then the connection is thrown away and
    /// the outcome is unknown). A script the server did not have (`NOSCRIPT`) is loaded and
    /// run once more, within the response timeout.
    ///
    /// The connection keeps `timeout` as its read timeout until a call wants another: calls
    /// with the same timeout cost no system call to set it.
    pub(crate) fn read(mut self, timeout: Duration, doing: Doing<'_>) -> Result<redis::Value> {
        let timeout = timeout.max(Duration::from_millis(1));
        let reply = self
            .checkout
            .call_within(timeout, |c| match c.recv_response()? {
                redis::Value::ServerError(e) => Err(redis::RedisError::from(e)),
                value => Ok(value),
            })
            .map_err(|e| {
                // A time-out says the time this read was given.
                let server = Server {
                    response_timeout: timeout,
                    ..self.server.clone()
                };
                Error::from_call(&server, doing, e)
            });
        match reply {
            Err(e) if e.is_server_code("NOSCRIPT") => {
                let call = self.call;
                self.checkout.call(doing, |c| call.invoke(c))
            }
            other => other,
        }
    }
}
