//! `Leadership`: proof of leading an election; it resigns when dropped.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::{checked, WRITE};
use crate::connection::ScriptCall;
use crate::error::{Error, ErrorKind, Result};
use crate::keys::suffix;
use crate::lease::{LeaseGuard, LeaseWatch};
use crate::primitives::MutexGuard;

/// Leading an election: the leader's term, its announced value, and the signal that it no
/// longer leads. Dropping it resigns (a failure is logged); [`resign`](Leadership::resign)
/// says how it went. Like every guard, it belongs to the thread that campaigned (not `Send`).
///
/// [`Client::shutdown`](crate::Client::shutdown) resigns every leadership of the client at
/// once, from the thread that shuts down (as closing an etcd session revokes its lease): the
/// leadership reads as lost first ([`is_lost`](Leadership::is_lost), the
/// [`lease_watch`](Leadership::lease_watch)), so the leader's work stops, then the record is
/// removed and a waiting candidate is woken.
///
/// A thread that campaigns again while it leads gets a second `Leadership` of the same term
/// at once (re-entry, as with a [`Mutex`](crate::Mutex)); only the outermost one announces
/// its value and resigns.
///
/// It is a guard like the others: it implements [`Lease`](crate::Lease) (whose `unlock`
/// resigns, and whose `verify`, `extend` and `set_lease` act on the leader's lease) and
/// [`Fenced`](crate::Fenced) (whose token is the term).
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
    /// The resignation the client's shutdown makes (the outermost leadership's).
    at_shutdown: Option<u64>,
    /// How many proclamations this leadership sent: each change of a term has its number.
    proclaimed: u64,
}

impl Leadership {
    /// Announces the leader of the lock `guard` holds, with `value`.
    pub(super) fn begin(guard: MutexGuard, name: Arc<str>, value: String) -> Result<Leadership> {
        let outermost = guard.lease().holds() == 1;
        let at_shutdown = outermost.then(|| {
            let lease = guard.lease();
            lease.give_up_at_shutdown(write_call(lease, "vacant"))
        });
        let leadership = Leadership {
            guard: Some(guard),
            name,
            value,
            at_shutdown,
            proclaimed: 0,
        };
        if outermost {
            let announced = leadership.announce("elected", &leadership.value, 0);
            // Taken just as the client shut down (the acquire got past the check that it is
            // open): the leadership resigned at once, and the campaign says why.
            if leadership
                .lease()
                .is_some_and(LeaseGuard::given_up_at_shutdown)
            {
                return Err(Error::new(
                    ErrorKind::Shutdown,
                    "the client was shut down as this leadership began; it resigned at once",
                ));
            }
            announced?;
        }
        Ok(leadership)
    }

    fn lease(&self) -> Option<&LeaseGuard> {
        self.guard.as_ref().map(MutexGuard::lease)
    }

    /// The lease, while this leadership has not stepped down.
    fn held(&self) -> Result<&LeaseGuard> {
        self.lease()
            .ok_or_else(|| Error::new(ErrorKind::LockLost, "the leadership has ended"))
    }

    /// Runs `write.lua` with `event` and `value`, the term's `n`th change.
    fn announce(&self, event: &str, value: &str, n: u64) -> Result<()> {
        let Some(lease) = self.lease() else {
            return Ok(());
        };
        let call = write_call(lease, event)
            .arg(lease.client_id())
            .arg(value)
            .arg(n);
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
        // Numbered even when it fails: a write that reached some copies keeps its number.
        self.proclaimed += 1;
        self.announce("proclaimed", &value, self.proclaimed)?;
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
    /// before (not when it resigned as its client was shut down); connection and timeout
    /// errors (the lease then runs out by itself).
    pub fn resign(mut self) -> Result<()> {
        self.step_down()
    }

    /// How long the leader's lease surely still runs, by this machine's clock, without a
    /// round trip; zero once lost.
    pub fn validity_left(&self) -> Duration {
        self.lease()
            .map_or(Duration::ZERO, LeaseGuard::validity_left)
    }

    /// Asks Redis whether this process still leads; the lease left.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LockLost`] when it does not; connection and timeout errors.
    pub fn verify(&self) -> Result<Duration> {
        self.held()?.verify()
    }

    /// Adds `additional` to the leader's lease (for a lease the renewal thread does not
    /// renew); see [`MutexGuard::extend`].
    ///
    /// # Errors
    ///
    /// As for [`MutexGuard::extend`].
    pub fn extend(&self, additional: Duration) -> Result<()> {
        self.held()?.extend(additional)
    }

    /// Sets the leader's lease left to `remaining`; see [`MutexGuard::set_lease`].
    ///
    /// # Errors
    ///
    /// As for [`MutexGuard::set_lease`].
    pub fn set_lease(&self, remaining: Duration) -> Result<()> {
        self.held()?.set_lease(remaining)
    }

    /// Leads on, unrenewed, until the lease runs out: nothing resigns, and
    /// [`Election::leader`](crate::Election::leader) names this leader until then. Returns
    /// how long that is.
    ///
    /// # Errors
    ///
    /// As for [`MutexGuard::keep_until_expiry`].
    pub fn keep_until_expiry(mut self) -> Result<Duration> {
        let Some(guard) = self.guard.take() else {
            return Ok(Duration::ZERO);
        };
        if let Some(id) = self.at_shutdown.take() {
            guard.lease().keep_at_shutdown(id);
        }
        guard.keep_until_expiry()
    }

    /// Resigns: the name every guard gives its release ([`resign`](Leadership::resign)).
    ///
    /// # Errors
    ///
    /// As for [`resign`](Leadership::resign).
    pub fn unlock(self) -> Result<()> {
        self.resign()
    }

    /// The term, as every fenced guard names its token ([`term`](Leadership::term)).
    pub fn fencing_token(&self) -> u64 {
        self.term()
    }

    fn step_down(&mut self) -> Result<()> {
        let Some(guard) = self.guard.take() else {
            return Ok(());
        };
        let lease = guard.lease();
        if let Some(id) = self.at_shutdown.take() {
            lease.keep_at_shutdown(id);
        }
        if lease.given_up_at_shutdown() {
            // Resigned as the client shut down: the lock is free already.
            let _ = guard.unlock();
            return Ok(());
        }
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

crate::primitives::guard_traits::lease_by_own_methods!(fenced Leadership);

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
