//! One acquisition of a lock: what its guards need to renew, extend, check and release it.

use std::fmt;
use std::num::NonZeroU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::connection::ScriptCall;
use crate::error::Doing;
use crate::error::Result;
use crate::keys::LockKeys;
use crate::lease::context::LockContext;
use crate::lease::lessor::{HoldCall, Site};
use crate::lease::protocol::Protocol;
use crate::lease::state::LeaseState;
use crate::waiting::Cohort;

/// The lease of a lock's holds, as its handle sets it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LeaseTerms {
    /// The client's default lease, renewed by its renewal thread.
    ClientDefault,
    /// A lease of the handle's own, renewed by the client's renewal thread.
    Renewed(Duration),
    /// A fixed lease: not renewed; the hold ends when it runs out unless extended.
    Fixed(Duration),
}

/// A lock held by one thread, shared by all of its (re-entrant) guards.
pub(crate) struct Hold {
    /// The kind of lock: how to release it.
    pub(crate) protocol: &'static dyn Protocol,
    pub(crate) keys: Arc<LockKeys>,
    /// The lock's name, for messages.
    pub(crate) name: Arc<str>,
    /// The key as the re-entry map and the renewal thread know it; also the lock's route.
    pub(crate) lock_key: Arc<str>,
    pub(crate) token: Arc<str>,
    pub(crate) fencing_token: u64,
    /// How many units of the lock exist (a semaphore's permits; 1 for a lock).
    pub(crate) capacity: u32,
    /// The length of its lease, in nanoseconds (saturated), so that the field is one word
    /// and a held lock small.
    pub(crate) lease_ns: NonZeroU64,
    /// Whether the lease is fixed (no renewal), else the renewal thread keeps it alive.
    pub(crate) fixed: bool,
    /// The renewal registration, for a renewed lease (ids start at 1: the niche keeps the
    /// field one word, and a held lock's memory small).
    pub(crate) renewal_id: Option<NonZeroU64>,
    pub(crate) lease: Arc<LeaseState>,
    /// When it was acquired, when the client's event handlers want hold times.
    pub(crate) acquired_at: Option<Instant>,
    /// The run of holds by this client's threads that it belongs to, when its release may
    /// pass the lock to another of them (a `Mutex` taken by one thread); `None`: it may not.
    pub(crate) cohort: Option<Cohort>,
    /// How the hold is passed on, and released, when it has a run.
    pub(crate) hand_off: Option<&'static dyn HandOff>,
    /// The score of a place among the waiting that the attempts of the thread made while a
    /// sibling held the lock (0: none): this hold's release gives it up (`mutex/take.lua`).
    pub(crate) own_place: u64,
    /// Taken after a wait (by an attempt after the first, or handed over in a queue): others
    /// wanted the lock then, and its release most likely hands it on.
    pub(crate) after_wait: bool,
}

impl Hold {
    /// A lease's length as the hold keeps it (a checked lease is at least 1 ms).
    pub(crate) fn nanos(lease: Duration) -> NonZeroU64 {
        NonZeroU64::new(u64::try_from(lease.as_nanos()).unwrap_or(u64::MAX))
            .unwrap_or(NonZeroU64::MIN)
    }

    /// The length of the hold's lease, renewed or fixed.
    pub(crate) fn lease_length(&self) -> Duration {
        Duration::from_nanos(self.lease_ns.get())
    }

    /// `Some` for a fixed lease (no renewal); `None` when the renewal thread keeps it alive.
    pub(crate) fn fixed_lease(&self) -> Option<Duration> {
        self.fixed.then(|| self.lease_length())
    }

    /// The id of the hold's registration with the renewal thread (none for a fixed lease).
    pub(crate) fn renewal_id(&self) -> Option<u64> {
        self.renewal_id.map(NonZeroU64::get)
    }

    /// Where the hold's calls go.
    pub(crate) fn site(&self) -> Site<'_> {
        Site {
            route: &self.lock_key,
            capacity: self.capacity,
        }
    }

    /// `call` about this hold, `doing` what it says.
    pub(crate) fn call<'a>(&'a self, call: &'a ScriptCall, doing: Doing<'a>) -> HoldCall<'a> {
        HoldCall {
            site: self.site(),
            call,
            doing,
        }
    }
}

impl fmt::Debug for Hold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hold")
            .field("kind", &self.protocol.kind().name)
            .field("name", &self.name)
            .field("fencing_token", &self.fencing_token)
            .finish_non_exhaustive()
    }
}

/// What a kind brings whose holds one thread may pass to another thread of the same client
/// without releasing them in Redis (a `Mutex`'s lock cohorting): the two calls the passing
/// makes. Given to the lock apart from its protocol (`RawLock::with_hand_off`).
pub(crate) trait HandOff: Send + Sync + 'static {
    /// Passes the lock `hold` holds to the leading waiter among its client's threads instead
    /// of releasing it, when the kind's bounds let it and a waiter listens: `Some(Ok)` when
    /// passed, `Some(Err)` when the pass found the lease lost, `None` to release in Redis
    /// instead. Called by the release of a hold that may pass (a live lease, no value to
    /// write, no panic).
    fn pass_on(&self, ctx: &Arc<LockContext>, hold: &Arc<Hold>) -> Option<Result<()>>;

    /// The release of a hold that may have been passed on within its client, which hands the
    /// lock to the waiting client it names, for a claim of `claim` (marked as announcing a
    /// hand-off: see [`ScriptCall::announcing`]).
    fn release(&self, keys: &LockKeys, token: &str, claim: Duration) -> ScriptCall;

    /// The same, which also sets the client's place among the lock's waiting clients right
    /// (`others_wait`: more of its threads wait; a place is kept `place_kept`).
    fn release_held(
        &self,
        keys: &LockKeys,
        hold: (&str, u64),
        place: (bool, Duration),
        claim: Duration,
    ) -> ScriptCall;
}
