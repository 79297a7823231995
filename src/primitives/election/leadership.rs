//! `Leadership`: proof of leading an election; it resigns when dropped.

use std::fmt;
use std::sync::Arc;

use super::{checked, WRITE};
use crate::connection::ScriptCall;
use crate::error::Result;
use crate::keys::suffix;
use crate::lease::{LeaseGuard, LeaseWatch};
use crate::primitives::MutexGuard;

/// Leading an election: the leader's term, its announced value, and the signal that it no
/// longer leads. Dropping it resigns (a failure is logged); [`resign`](Leadership::resign)
/// says how it went. Like every guard, it belongs to the thread that campaigned (not `Send`).
///
/// A thread that campaigns again while it leads gets a second `Leadership` of the same term
/// at once (re-entry, as with a [`Mutex`](crate::Mutex)); only the outermost one announces
/// its value and resigns.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> redmutex::Result<()> {
/// let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let mut leadership = client.election("gateway").campaign("10.0.0.7:8080")?;
/// // ... moved to another port ...
/// leadership.proclaim("10.0.0.7:9090")?;
/// let watch = leadership.lease_watch();
/// if watch.wait_timeout(std::time::Duration::from_secs(1)) {
///     eprintln!("no longer the leader");
/// }
/// # Ok(()) }
/// ```
#[must_use = "a leadership resigns when dropped"]
pub struct Leadership {
    guard: Option<MutexGuard>,
    name: Arc<str>,
    value: String,
}

impl Leadership {
    /// Announces the leader of the lock `guard` holds, with `value`.
    pub(super) fn begin(guard: MutexGuard, name: Arc<str>, value: String) -> Result<Leadership> {
        let outermost = guard.lease().holds() == 1;
        let leadership = Leadership {
            guard: Some(guard),
            name,
            value,
        };
        if outermost {
            leadership.announce("elected", &leadership.value)?;
        }
        Ok(leadership)
    }

    fn lease(&self) -> Option<&LeaseGuard> {
        self.guard.as_ref().map(MutexGuard::lease)
    }

    /// Runs `write.lua` with `event` and `value`.
    fn announce(&self, event: &str, value: &str) -> Result<()> {
        let Some(lease) = self.lease() else {
            return Ok(());
        };
        let call = write_call(lease, event).arg(lease.client_id()).arg(value);
        lease.run_while_held("announcing the leader of", &call)
    }

    /// The election's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The term: this leadership's fencing token, larger than every earlier leader's of the
    /// election. Pass it with the leader's writes, so that a resource can refuse a leader
    /// that no longer leads (see [`MutexGuard::fencing_token`]).
    pub fn term(&self) -> u64 {
        self.lease().map_or(0, LeaseGuard::fencing_token)
    }

    /// The value this leader announces.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// Whether this process no longer leads: its lease was lost (it ran out, or another
    /// holder took the lock). Local, no round trip; lost is final.
    pub fn is_lost(&self) -> bool {
        self.lease().is_none_or(LeaseGuard::is_lost)
    }

    /// A handle that tells when the leadership is lost, from any thread (see [`LeaseWatch`]).
    pub fn lease_watch(&self) -> LeaseWatch {
        LeaseWatch::any(self.lease().map(LeaseGuard::lease_watch))
    }

    /// Announces `value` instead, in the same term: observers see it as
    /// [`LeaderEvent::Proclaimed`](crate::LeaderEvent::Proclaimed).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LockLost`](crate::ErrorKind::LockLost) when no longer the leader (nothing
    /// is written); [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) for a
    /// value over [`MAX_LEADER_VALUE`](crate::MAX_LEADER_VALUE) bytes; connection and
    /// timeout errors.
    pub fn proclaim(&mut self, value: impl Into<String>) -> Result<()> {
        let value = checked(value.into())?;
        self.announce("proclaimed", &value)?;
        self.value = value;
        Ok(())
    }

    /// Steps down now: the record of this leader is removed (observers see
    /// [`LeaderEvent::Vacant`](crate::LeaderEvent::Vacant)) and the lock released, which
    /// wakes a waiting candidate at once.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LockLost`](crate::ErrorKind::LockLost) when the leadership was lost
    /// before; connection and timeout errors (the lease then runs out by itself).
    pub fn resign(mut self) -> Result<()> {
        self.step_down()
    }

    fn step_down(&mut self) -> Result<()> {
        let Some(guard) = self.guard.take() else {
            return Ok(());
        };
        let lease = guard.lease();
        if lease.holds() > 1 {
            // An inner leadership of a thread that leads: the outer one resigns.
            return guard.unlock();
        }
        let call = write_call(lease, "vacant");
        let resigned = lease.run_while_held("resigning from", &call);
        let released = guard.unlock();
        resigned.and(released)
    }
}

impl Drop for Leadership {
    fn drop(&mut self) {
        if let Err(e) = self.step_down() {
            log::warn!("redmutex: resigning from election {:?}: {e}", self.name);
        }
    }
}

/// A call of `write.lua` for the holder of `lease`, with `event` (the client's id and the
/// value follow, but for `vacant`).
fn write_call(lease: &LeaseGuard, event: &str) -> ScriptCall {
    let keys = lease.keys();
    ScriptCall::new(&WRITE)
        .key(&keys.lock)
        .key(keys.beside(suffix::LEADER))
        .key(keys.beside(suffix::LEADER_LOG))
        .arg(lease.token())
        .arg(event)
        .arg(lease.fencing_token())
        .arg(keys.beside(suffix::LEADER_CHANNEL))
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("name", &self.name)
            .field("term", &self.term())
            .field("value", &self.value)
            .field("lost", &self.is_lost())
            .finish()
    }
}
