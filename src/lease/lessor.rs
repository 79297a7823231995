//! The lessor seam: where a hold lives. Everything the lease stack sends to Redis about a
//! hold goes through a [`Lessor`], which answers with outcomes (taken or not, held until
//! when, released or lost), not raw replies. Two implement it: a single deployment
//! (`single.rs`: one server, Sentinel or Cluster, with plain takes and replica
//! acknowledgements) and a quorum of independent instances (Redlock: rounds, validity, drift).
//! Everything above the seam — re-entry, guards, renewal, waiting, events — is the same for
//! both.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::connection::{Connections, OnReply, Routed, ScriptCall};
use crate::error::{Doing, Result};
use crate::lease::cleanup::CleanUpLater;
use crate::lease::protocol::{AcquireCall, Protocol};
use crate::waiting::Release;

/// One acquire attempt as the stack hands it to a lessor.
pub(crate) struct Attempting<'a> {
    pub(crate) protocol: &'static dyn Protocol,
    pub(crate) call: &'a AcquireCall<'a>,
    /// The lock's name, for messages and clean-ups.
    pub(crate) name: &'a Arc<str>,
    /// The hold's key in the re-entry map: its route and the key of its clean-ups.
    pub(crate) lock_key: &'a Arc<str>,
    /// The first attempt of its acquire, which expects a free lock (a lessor may take it with
    /// plain commands, see `plain_take`).
    pub(crate) first: bool,
}

/// When an attempt that did not take the lock was sent, by this machine's clock, and when it
/// ran, by the server's (a lessor that knows one server's clock tells it).
#[derive(Clone, Copy)]
pub(crate) struct Contact {
    pub(crate) sent_at: Instant,
    pub(crate) server_ms: i64,
}

/// Where a hold's calls go: the route of its lock's keys (in the re-entry map, its key), and
/// how many units of the lock exist (a quorum asks more of its instances to agree on a lock
/// that several may hold at once).
#[derive(Clone, Copy)]
pub(crate) struct Site<'a> {
    pub(crate) route: &'a str,
    pub(crate) capacity: u32,
}

/// One call about a hold: where it goes, the call, and what it is for (in messages).
#[derive(Clone, Copy)]
pub(crate) struct HoldCall<'a> {
    pub(crate) site: Site<'a>,
    pub(crate) call: &'a ScriptCall,
    pub(crate) doing: Doing<'a>,
}

/// Where a value kept under a lock is: the lock's route, the value's key and its version's.
#[derive(Clone, Copy)]
#[cfg_attr(not(feature = "serde"), allow(dead_code))]
pub(crate) struct ValueAt<'a> {
    pub(crate) route: &'a str,
    pub(crate) value: &'a str,
    pub(crate) version: &'a str,
}

/// One lease for the renewal to renew: where, and its `renew` call.
pub(crate) type Renewing<'a> = (Site<'a>, &'a ScriptCall);

/// What an attempt came to.
pub(crate) enum Attempted {
    /// Taken: the hold's fencing token, when its lease surely still runs, and the bytes that
    /// came with it (a shared value).
    Taken {
        fencing_token: u64,
        held_until: Instant,
        payload: Option<Vec<u8>>,
    },
    /// Held by someone else: how long to wait at most before trying again, whether the
    /// holder announces its release, the server's clock of the attempt, when known, the
    /// score of a place the attempt made while the caller's own client held, and what a pop
    /// behind the attempt gave (see `AcquireCall::pop`).
    Held {
        wait: Duration,
        release: Release,
        contact: Option<Contact>,
        own_place: Option<u64>,
        popped: Popped,
    },
}

/// What a blocking pop behind an attempt gave (see `AcquireCall::pop`).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Popped {
    /// None was asked for, none came in time, or the pop failed.
    Nothing,
    /// The note of a lock a release handed to the client.
    Note(String),
    /// Redis refused the pop (an ACL user without `+blpop`): its error.
    Refused(String),
}

/// Where the holds of a client (or of a Redlock) live, and how each operation on a hold is
/// carried out there. Every call is safe to run twice (scripts checked against the holder's
/// token); each method says what it answers.
pub(crate) trait Lessor: Send + Sync + 'static {
    /// Whether the lessor's servers answered once: only then does a blocking acquire ride
    /// through an outage (see `waiting::Outage`).
    fn reached(&self) -> bool;

    /// The single deployment's connections, for what is defined on one deployment only (a
    /// `Mutex`'s passes within its client, a handed-over claim, scripts over several locks,
    /// optimistic updates); `None` for a quorum.
    fn one_deployment(&self) -> Option<&Arc<Connections>>;

    /// One acquire attempt. What an attempt whose outcome is unknown may have left is handed
    /// to `later` (the stack's renewal thread), or to the instances' own.
    fn attempt(&self, attempting: &Attempting<'_>, later: &dyn CleanUpLater) -> Result<Attempted>;

    /// A token-checked release, its reply awaited: whether the lock still held the token
    /// (`false`: the lease was lost). Sent once.
    fn release(&self, c: HoldCall<'_>) -> Result<bool>;

    /// The release written without waiting for its reply, which `settle` gets when it is
    /// read. `Ok(false)`: not written (the caller releases with [`release`](Self::release)).
    fn release_unread(&self, c: HoldCall<'_>, settle: OnReply) -> Result<bool>;

    /// A call that tells how long a hold has left (milliseconds, or -1 when its token no
    /// longer holds): the remaining lease, or `None` when lost.
    fn remaining(&self, c: HoldCall<'_>) -> Result<Option<Duration>>;

    /// A call that replies a count of free units (a semaphore's free permits): for a quorum,
    /// the count that as many instances as a hold needs all have.
    fn count(&self, c: HoldCall<'_>) -> Result<u64>;

    /// A call that changes a hold's lease (replying as [`remaining`](Self::remaining)), sent
    /// at `sent_at`: when the new lease surely still runs, or `None` when lost.
    fn change_lease(&self, c: HoldCall<'_>) -> Result<Option<Instant>>;

    /// A token-checked call that replies 1 when it acted: whether it did (for a quorum, on a
    /// majority).
    fn acted(&self, c: HoldCall<'_>) -> Result<bool>;

    /// A call that replies 1 when it found something to act on, whoever's (a forced
    /// release): whether anything was found.
    fn found(&self, c: HoldCall<'_>) -> Result<bool>;

    /// A string key of the lock (a poison record): its value, if any.
    fn read(&self, lock_key: &str, key: &str, doing: Doing<'_>) -> Result<Option<String>>;

    /// A value kept under the lock (a shared value's bytes), read without the lock: a
    /// quorum's newest copy by its version (see `reply.rs`), read from a quorum.
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    fn read_value(&self, at: ValueAt<'_>, doing: Doing<'_>) -> Result<Option<Vec<u8>>>;

    /// How many copies a hold has (its servers) and how many of them must agree on what a
    /// read finds: 1 and 1 for a single deployment, a quorum's instances and its majority.
    fn copies(&self) -> (usize, usize);

    /// Reads on every copy (see [`copies`](Self::copies)) where the lock at `route` lives:
    /// `calls` has one call per copy, in order, and the replies come in the same order,
    /// `None` for a copy that did not answer. Fails when too few answered to agree.
    fn read_each(
        &self,
        route: &str,
        calls: &[ScriptCall],
        doing: Doing<'_>,
    ) -> Result<Vec<Option<redis::Value>>>;

    /// Deletes a key of the lock: whether it existed.
    fn delete(&self, lock_key: &str, key: &str, doing: Doing<'_>) -> Result<bool>;

    /// The type of the lock's main key (`none`, `string`, …).
    fn key_type(&self, lock_key: &str, doing: Doing<'_>) -> Result<String>;

    /// A call whose reply nobody needs (a withdrawal, a queue left), sent once.
    fn send(&self, c: HoldCall<'_>) -> Result<()>;

    /// Renews leases, each call at its route (`renew` scripts, replying 1 while held): for
    /// each, when its lease surely runs until now, or `None` when its token no longer holds;
    /// and how many round trips it took. A lease whose renewal failed is an error.
    fn renew(
        &self,
        leases: &[Renewing<'_>],
        lease: Duration,
    ) -> (Vec<Result<Option<Instant>>>, u64);

    /// Calls that the renewal thread sends (heartbeats, clean-ups), each at its route: their
    /// replies, and how many round trips they took.
    fn batch(&self, calls: &[Routed<'_>], doing: Doing<'_>) -> (Vec<Result<redis::Value>>, u64);

    /// Reads the replies to writes nobody waited for (releases written by guards' drops),
    /// as the renewal thread does each tick. Nothing by default.
    fn settle_unread(&self) {}

    /// Announces the client for `ttl` (`first`: written whole), as the renewal thread does
    /// each tick while it runs (`redmutex list` shows it). Nothing by default.
    fn announce(&self, _first: bool, _ttl: Duration) {}

    /// Withdraws the client's announcement as its renewal thread ends. Nothing by default.
    fn withdraw_announcement(&self) {}

    /// Stops what the lessor runs (connections, subscriber threads); with `wait`, waits.
    fn shutdown(&self, wait: bool);
}
