//! A script call split in two: written now, its reply read later. Writing the calls to
//! several servers before reading any reply costs about one round trip in all, without a
//! thread per server (Redlock's fan-out).

use std::time::{Duration, Instant};

use crate::connection::{Checkout, Connections, ScriptCall};
use crate::error::{Doing, Result, Server};

/// A script call written to its server, whose reply is still to be read.
pub(crate) struct SentCall<'a> {
    checkout: Checkout,
    server: Server,
    call: &'a ScriptCall,
}

impl Connections {
    /// Writes `call` to the server of `route` without waiting for its reply. A redirection
    /// (`MOVED`) is not followed: split calls are for standalone servers.
    pub(crate) fn send<'a>(
        &self,
        route: &str,
        call: &'a ScriptCall,
        doing: Doing<'_>,
    ) -> Result<SentCall<'a>> {
        let shard = self.shard_of(route);
        let server = self.shard_server(shard);
        let mut checkout = self.checkout(shard, doing)?;
        let mut pipe = redis::pipe();
        pipe.invoke_script(&call.invocation);
        let packed = pipe.get_packed_pipeline();
        checkout.call(doing, |c| c.send_packed_command(&packed))?;
        Ok(SentCall {
            checkout,
            server,
            call,
        })
    }
}

impl SentCall<'_> {
    /// Reads the reply, waiting at most until `deadline` (then the connection is thrown away
    /// and the outcome is unknown). A script the server did not have (`NOSCRIPT`) is loaded
    /// and run once more, within the response timeout.
    pub(crate) fn read(mut self, deadline: Instant, doing: Doing<'_>) -> Result<redis::Value> {
        let wait = deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1));
        let timeout = self.server.response_timeout;
        let reply = self.checkout.call(doing, |c| {
            c.set_read_timeout(Some(wait))?;
            let reply = c.recv_response();
            c.set_read_timeout(Some(timeout))?;
            match reply? {
                redis::Value::ServerError(e) => Err(redis::RedisError::from(e)),
                value => Ok(value),
            }
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
