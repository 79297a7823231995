//! The instances of a Redlock and the fan-out: one call per instance, all written before any
//! reply is read, so that a round over N instances costs about one round trip.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::connection::{Connections, ScriptCall, ServerFeatures};
use crate::error::{Doing, Error, ErrorKind, Result};
use crate::lease::context::{Handle, LockContext};

/// One independent Redis master of a Redlock: the client that reaches it.
#[derive(Clone)]
pub(crate) struct Instance {
    pub(crate) ctx: Arc<LockContext>,
    pub(crate) connections: Arc<Connections>,
    /// Keeps the instance client's background threads running while the Redlock lives.
    pub(crate) _handle: Handle,
}

/// One instance's reply in a round: `None` when nothing was sent to it.
pub(crate) type Reply = Option<Result<redis::Value>>;

/// Sends `calls[i]` to instance `i` (skipping `None`) at `route` (a lock's keys are the same
/// on every instance), then reads every reply, each within `timeout` of the start of its
/// reading. A call that could not be written fails at once; the others still run.
pub(crate) fn fan_out(
    instances: &[Instance],
    route: &str,
    calls: &[Option<&ScriptCall>],
    timeout: Duration,
    doing: Doing<'_>,
) -> Vec<Reply> {
    let sent: Vec<Option<Result<_>>> = instances
        .iter()
        .zip(calls)
        .map(|(instance, call)| {
            let call = call.as_ref()?;
            Some(
                instance
                    .ctx
                    .ensure_open()
                    .and_then(|()| instance.connections.send(route, call, doing, timeout)),
            )
        })
        .collect();
    read_each(sent, timeout, |call, within| call.read(within, doing))
}

/// The replies of one instance to plain commands: `None` when nothing was sent to it.
pub(crate) type Replies = Option<Result<Vec<redis::Value>>>;

/// Sends to each instance the plain commands `build` packs, knowing what that instance
/// accepts (none: nothing is sent to it), at `route`; then reads every reply, as [`fan_out`]
/// does, showing each instance's to `seen` with what that instance accepts.
pub(crate) fn fan_out_commands(
    instances: &[Instance],
    route: &str,
    (timeout, doing): (Duration, Doing<'_>),
    build: impl Fn(&ServerFeatures) -> Option<(Vec<u8>, usize)>,
    seen: impl Fn(&ServerFeatures, &[redis::Value]),
) -> Vec<Replies> {
    let sent: Vec<Option<Result<_>>> = instances
        .iter()
        .map(|instance| {
            let sent = instance.ctx.ensure_open().and_then(|()| {
                instance
                    .connections
                    .send_commands(route, doing, timeout, &build)
            });
            sent.transpose()
        })
        .collect();
    read_each(sent, timeout, |commands, within| {
        commands.read(within, doing, &seen)
    })
}

/// Reads the reply of each call `sent` (`read` reads one within the time given). One
/// deadline for every reply: instances that do not answer cost the round about one `timeout`
/// in all, not one each. While most of it is left, a read gets the whole `timeout` (a
/// connection keeps its read timeout, so an unchanged one costs no system call); once an
/// instance has taken more than a quarter of it, what is left.
fn read_each<S, R>(
    sent: Vec<Option<Result<S>>>,
    timeout: Duration,
    read: impl Fn(S, Duration) -> Result<R>,
) -> Vec<Option<Result<R>>> {
    let deadline = Instant::now() + timeout;
    let slack = timeout / 4;
    let read_timeout = move || {
        let left = deadline.saturating_duration_since(Instant::now());
        match left + slack >= timeout {
            true => timeout,
            false => left,
        }
    };
    sent.into_iter()
        .map(|s| s.map(|s| s.and_then(|call| read(call, read_timeout()))))
        .collect()
}

/// The error of a round in which too few instances answered: how many did, and why the
/// others did not (the first reason).
pub(crate) fn too_few_answered(answered: usize, of: usize, doing: Doing<'_>, why: &Error) -> Error {
    Error::new(
        why.kind(),
        format!("{doing}: only {answered} of {of} Redlock instances answered: {why}"),
    )
}

/// An error for a reply of the wrong shape.
pub(crate) fn unexpected(doing: Doing<'_>, reply: &redis::Value) -> Error {
    Error::new(
        ErrorKind::Server,
        format!("{doing}: unexpected reply {reply:?} from a Redlock instance"),
    )
}
