//! `LeaseGuard`: proof of holding a lock of any kind. It releases the lock when dropped, and
//! answers everything about the held lease: its fencing token, whether it was lost, renewal
//! aside extensions, poisoning. The public guards wrap it.

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use crate::config::validate_lease;
use crate::connection::ScriptCall;
use crate::error::{Doing, Error, ErrorKind, Result};
use crate::events::Released;
use crate::keys::LockKeys;
use crate::lease::cleanup::{CleanUpLater, Cleanup};
use crate::lease::context::LockContext;
use crate::lease::hold::Hold;
use crate::lease::poison::PoisonInfo;
use crate::lease::protocol::HAND_OFF_CLAIM;
use crate::lease::reentrancy;
use crate::lease::scripts;
use crate::lease::state::{LeaseWatch, LostReason};
use crate::stats::Counters;
use crate::waiting::{Keeping, Place};

/// A held lock (see the public guards for what each method promises). Not `Send`: it belongs
/// to the thread that locked.
pub struct LeaseGuard {
    ctx: Arc<LockContext>,
    hold: Arc<Hold>,
    released: bool,
    /// What a kind that keeps a value under its lock carries (a shared value); `None` for a
    /// plain lock, which so pays one word for it.
    value: Option<Box<ValueIo>>,
    /// Set at the release of a hold that may be passed on: what the release does with the
    /// client's place among the lock's waiting clients.
    place: std::cell::Cell<Place>,
    _not_send: PhantomData<*const ()>,
}

impl LeaseGuard {
    pub(crate) fn new(ctx: Arc<LockContext>, hold: Arc<Hold>) -> Self {
        LeaseGuard {
            ctx,
            hold,
            released: false,
            value: None,
            place: std::cell::Cell::new(Place::GiveUp { given: 0 }),
            _not_send: PhantomData,
        }
    }

    /// The id of this hold's registration with the renewal thread (none for a fixed lease).
    pub(crate) fn renewal_id(&self) -> Option<u64> {
        self.hold.renewal_id()
    }

    pub(crate) fn fencing_token(&self) -> u64 {
        self.hold.fencing_token
    }

    pub(crate) fn name(&self) -> &str {
        &self.hold.name
    }

    pub(crate) fn fixed_lease(&self) -> Option<Duration> {
        self.hold.fixed_lease()
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.hold.lease.is_lost()
    }

    /// How long the lease surely still runs by this machine's clock; zero once lost or
    /// released.
    pub(crate) fn validity_left(&self) -> Duration {
        let lease = &self.hold.lease;
        if self.released || lease.is_lost() {
            return Duration::ZERO;
        }
        lease.expires_at().saturating_duration_since(Instant::now())
    }

    pub(crate) fn lease_watch(&self) -> LeaseWatch {
        LeaseWatch::new(Arc::clone(&self.hold.lease))
    }

    pub(crate) fn verify(&self) -> Result<Duration> {
        let hold = &self.hold;
        let call = hold.protocol.check(&hold.keys, &hold.token);
        let remaining = self
            .ctx
            .lessor
            .remaining(hold.call(&call, self.doing("verifying")))?;
        remaining.ok_or_else(|| self.lost(LostReason::Taken))
    }

    pub(crate) fn extend(&self, additional: Duration) -> Result<()> {
        self.change_lease(additional, "add")
    }

    pub(crate) fn set_lease(&self, remaining: Duration) -> Result<()> {
        self.change_lease(remaining, "set")
    }

    /// Adds `by` to the remaining lease (`add`) or replaces it (`set`), if still held.
    fn change_lease(&self, by: Duration, how: &'static str) -> Result<()> {
        validate_lease(by)?;
        if let Some(reason) = self.hold.lease.lost_reason() {
            return Err(self.lost(reason));
        }
        let hold = &self.hold;
        let call = hold.protocol.change_lease(&hold.keys, &hold.token, by, how);
        let doing = self.doing("extending the lease of");
        match self.ctx.lessor.change_lease(hold.call(&call, doing))? {
            Some(held_until) => {
                hold.lease.expires_at_set(held_until);
                Ok(())
            }
            None => Err(self.lost(LostReason::Taken)),
        }
    }

    pub(crate) fn unlock(mut self) -> Result<()> {
        self.release(Reply::Wait)
    }

    /// Stops renewing and leaves the lock in Redis until its lease runs out; returns how
    /// long that is, as Redis says (one round trip). An inner re-entrant guard only counts
    /// down (the outer one still holds and releases). The keep happens whatever Redis
    /// answers: on an error the lock still expires with its lease.
    pub(crate) fn keep_until_expiry(mut self) -> Result<Duration> {
        let remaining = self.verify();
        self.released = true;
        if reentrancy::exit(self.ctx.id, &self.hold.lock_key) {
            if self.hold.cohort.is_some() {
                // Nothing is released: a place kept is kept until the lease runs out.
                drop(self.ctx.gates.hold_ends(&self.hold.lock_key, false));
            }
            if let Some(id) = self.hold.renewal_id() {
                self.ctx.renewal.cancel(id);
            }
            self.hold.lease.mark_released();
        }
        remaining
    }

    pub(crate) fn poison(&self) -> Result<Option<PoisonInfo>> {
        let hold = &self.hold;
        let doing = self.doing("reading the poison record of");
        let stored = self
            .ctx
            .lessor
            .read(&hold.lock_key, hold.keys.poison(), doing)?;
        Ok(stored.map(|s| PoisonInfo::decode(&s)))
    }

    pub(crate) fn clear_poison(&self) -> Result<bool> {
        if let Some(reason) = self.hold.lease.lost_reason() {
            return Err(self.lost(reason));
        }
        let hold = &self.hold;
        let doing = self.doing("clearing the poison record of");
        self.ctx
            .lessor
            .delete(&hold.lock_key, hold.keys.poison(), doing)
    }

    /// Leaves the poison record on the way out of a panicking thread. Best effort: a failure
    /// is logged.
    #[cold]
    fn mark_poisoned(&self) {
        let keys = &self.hold.keys;
        let record = PoisonInfo::here(&self.hold.token).encode();
        let call = ScriptCall::new(&scripts::MARK_POISONED)
            .key(&keys.lock)
            .key(keys.poison())
            .arg(&*self.hold.token)
            .arg(&record);
        let doing = self.doing("recording a panic on");
        match self.ctx.lessor.acted(self.hold.call(&call, doing)) {
            Ok(true) => log::warn!(
                "redmutex: a thread panicked while holding lock {:?}; it is released and \
                 marked poisoned",
                self.hold.name
            ),
            // Readers and permit holders keep no token on the lock key: no record is made,
            // and none is claimed.
            Ok(false) => log::warn!(
                "redmutex: a thread panicked while holding lock {:?}; it is released (no \
                 poison record: the lock key does not hold this holder's token)",
                self.hold.name
            ),
            Err(e) => log::warn!(
                "redmutex: a thread panicked while holding lock {:?}, and marking it \
                 poisoned failed: {e}",
                self.hold.name
            ),
        }
    }

    /// Marks the lease lost (once) and makes the error that says so.
    fn lost(&self, reason: LostReason) -> Error {
        lost(&self.ctx, &self.hold, reason)
    }

    /// Counts one hold less; the outermost one records a panic, stops the renewal and
    /// releases in Redis, waiting for the reply or not.
    fn release(&mut self, reply: Reply) -> Result<()> {
        if self.released {
            return Ok(());
        }
        self.released = true;
        if !reentrancy::exit(self.ctx.id, &self.hold.lock_key) {
            return Ok(());
        }
        if std::thread::panicking() {
            // The value may be half-changed: it is not written.
            self.set_release_value(None);
            self.mark_poisoned();
        }
        // Read once: a lease lost before the release writes nothing (the holder was, or may
        // have been, told), and its release says `LockLost` (lost is final).
        let lost_before = self.hold.lease.lost_reason();
        if lost_before.is_some() {
            self.set_release_value(None);
        }
        if let Some(id) = self.hold.renewal_id() {
            self.ctx.renewal.cancel(id);
        }
        // A release that writes a value waits for its reply: the write may fail.
        let result = match self.pass_on_within_client(lost_before.is_some()) {
            Some(Ok(())) => Ok(()),
            passed => {
                let mut keeping = None;
                if let Some(cohort) = self.hold.cohort {
                    // A run of passes that reached its bound gives the lock up to the other
                    // waiting clients: this client's threads wait behind them.
                    let yielded = passed.is_none() && cohort.contested();
                    let (place, kept) = self.ctx.gates.hold_ends(&self.hold.lock_key, yielded);
                    self.place.set(place);
                    keeping = kept;
                }
                // A release that keeps its client's place holds `keeping` until it has run.
                match (passed, reply, self.written()) {
                    (Some(lost), _, _) => lost,
                    (None, Reply::Later, None) => self.release_unread(keeping, lost_before),
                    (None, ..) => self.release_in_redis(lost_before),
                }
            }
        };
        self.hold.lease.mark_released();
        if let Some(acquired_at) = self.hold.acquired_at {
            let lost = result.as_ref().is_err_and(Error::is_lock_lost);
            let (name, kind, held) = (
                &*self.hold.name,
                self.hold.protocol.kind().name,
                acquired_at.elapsed(),
            );
            self.ctx.counters.events.emit(|h| {
                h.released(&Released {
                    name,
                    kind,
                    held,
                    lost,
                })
            });
        }
        result
    }

    /// Passes the lock to another thread of the client instead of releasing it, when the
    /// kind hands off (see [`HandOff::pass_on`]) and the hold may: not when the release
    /// writes a value, nor from a panicking thread, nor when the lease was `lost` before the
    /// release. `None`: release in Redis instead.
    fn pass_on_within_client(&self, lost: bool) -> Option<Result<()>> {
        if lost || self.written().is_some() || std::thread::panicking() {
            return None;
        }
        self.hold.hand_off?.pass_on(&self.ctx, &self.hold)
    }

    /// The release; `lost_before`: the lease was lost before it (then it writes no value).
    /// After a dropped connection it is sent once more (it is idempotent); after a time-out
    /// the caller gets the error at once and the renewal thread sends it again until Redis
    /// answers or the lease has run out.
    fn release_in_redis(&self, lost_before: Option<LostReason>) -> Result<()> {
        let mut reply = self.send_release();
        if let Err(first) = &reply {
            if first.is_connection() && !first.is_checkout() {
                reply = match self.send_release() {
                    // The first one ran before its connection dropped; or it did not, and the
                    // lease ran out meanwhile. A release that writes a value tells them
                    // apart while its write was the last (it answers 1 again); past that, the
                    // write's outcome is unknown: the first error says so.
                    Ok(false) if lost_before.is_none() && self.written().is_none() => Ok(true),
                    Ok(false) if lost_before.is_none() => Err(first.clone()),
                    Ok(released) => Ok(released),
                    Err(_) => Err(first.clone()),
                };
            }
        }
        match reply {
            // Released, but a lease read as lost before stays lost (lost is final).
            Ok(true) => {
                Counters::add(&self.ctx.counters.releases, 1);
                lost_before.map_or(Ok(()), |reason| Err(self.lost(reason)))
            }
            Ok(false) => Err(self.lost(lost_before.unwrap_or(LostReason::Taken))),
            Err(e) => {
                if e.outcome_unknown() {
                    self.release_later();
                }
                // A lease read as lost before stays lost, whatever the release met.
                Err(lost_before.map_or(e, |reason| self.lost(reason)))
            }
        }
    }

    /// The release, written without waiting for its reply (a guard's drop): the lock is free
    /// as soon as Redis reads it, and the reply is checked by whoever reads it
    /// ([`settle_release`]). A release that could not be written is sent as `unlock` sends
    /// it, or left to the renewal thread when no connection could be had.
    fn release_unread(
        &self,
        keeping: Option<Keeping>,
        lost_before: Option<LostReason>,
    ) -> Result<()> {
        let (ctx, hold) = (Arc::downgrade(&self.ctx), Arc::clone(&self.hold));
        let call = self.release_call();
        // Until its reply is read; and, should the write fail, until the release sent after.
        let until_read = keeping.as_ref().map(Keeping::also);
        let sent = self.ctx.lessor.release_unread(
            self.hold.call(&call, self.doing("releasing")),
            Box::new(move |reply| {
                settle_release(&ctx, &hold, reply);
                drop(until_read);
            }),
        );
        match sent {
            Ok(true) => Ok(()),
            Ok(false) => self.release_in_redis(lost_before),
            Err(e) if e.is_checkout() => {
                self.release_later();
                Err(e)
            }
            Err(_) => self.release_in_redis(lost_before),
        }
    }

    fn release_call(&self) -> ScriptCall {
        match self.written() {
            Some(with) => with(&self.hold.keys, &self.hold.token),
            None => release_call_of(&self.ctx, &self.hold, self.place.get()),
        }
    }

    /// The release, sent once: whether the lock still held the token.
    fn send_release(&self) -> Result<bool> {
        let call = self.release_call();
        self.ctx
            .lessor
            .release(self.hold.call(&call, self.doing("releasing")))
    }

    /// Has the renewal thread finish a release whose outcome is unknown.
    #[cold]
    fn release_later(&self) {
        clean_up_release(&self.ctx, &self.hold, self.release_call());
    }

    fn doing(&self, action: &'static str) -> Doing<'_> {
        Doing::lock(action, &self.hold.name)
    }
}

/// What a protocol that keeps a value under its lock (a shared value) uses of a guard.
#[cfg_attr(not(feature = "serde"), allow(dead_code))]
impl LeaseGuard {
    /// This guard, carrying the bytes that came with the acquire.
    pub(crate) fn with_payload(mut self, payload: Option<Vec<u8>>) -> Self {
        if payload.is_some() {
            self.value.get_or_insert_with(Box::default).payload = payload;
        }
        self
    }

    /// The bytes that came with the acquire (once).
    pub(crate) fn take_payload(&mut self) -> Option<Vec<u8>> {
        self.value.as_mut().and_then(|v| v.payload.take())
    }

    /// Has the release be the kind's call `with` (which releases and writes, fenced by the
    /// holder's token); `None`: a plain release. A panicking thread's release never writes.
    pub(crate) fn set_release_value(&mut self, with: Option<ReleaseWith>) {
        match (&mut self.value, with) {
            (Some(value), with) => value.written = with,
            (None, None) => {}
            (None, Some(with)) => {
                self.value = Some(Box::new(ValueIo {
                    payload: None,
                    written: Some(with),
                }))
            }
        }
    }

    /// The release that writes the value, if one was set.
    fn written(&self) -> Option<&ReleaseWith> {
        self.value.as_ref().and_then(|v| v.written.as_ref())
    }

    /// Runs a script call of the protocol that acts only while the lock holds this guard's
    /// token (its reply: 1 when it did, 0 when the lock no longer held the token).
    ///
    /// # Errors
    ///
    /// [`ErrorKind::LockLost`] when the lease was lost; connection and timeout errors.
    pub(crate) fn run_while_held(&self, action: &'static str, call: &ScriptCall) -> Result<()> {
        if let Some(reason) = self.hold.lease.lost_reason() {
            return Err(self.lost(reason));
        }
        match self
            .ctx
            .lessor
            .acted(self.hold.call(call, self.doing(action)))?
        {
            true => Ok(()),
            false => Err(self.lost(LostReason::Taken)),
        }
    }

    /// Has the client give this hold up when it is shut down, before it closes, unless
    /// [`keep_at_shutdown`](Self::keep_at_shutdown) cancels it first: the lease is marked
    /// lost (`LostReason::ShutDown`), `first` runs (a call checked against the hold's token:
    /// a leader's record removed) and the lock is released in Redis. Returns the id that
    /// cancels it. A hold taken as the client shut down (its acquire got past the check that
    /// the client is open) is given up at once.
    pub(crate) fn give_up_at_shutdown(&self, first: ScriptCall) -> u64 {
        let hold = Arc::clone(&self.hold);
        let work = move |ctx: &LockContext| given_up_at_shutdown(ctx, &hold, &first);
        self.ctx.at_shutdown.add(Box::new(work), &self.ctx)
    }

    /// Cancels what [`give_up_at_shutdown`](Self::give_up_at_shutdown) registered as `id`.
    pub(crate) fn keep_at_shutdown(&self, id: u64) {
        self.ctx.at_shutdown.cancel(id);
    }

    /// Whether the hold was given up when its client was shut down.
    pub(crate) fn given_up_at_shutdown(&self) -> bool {
        matches!(self.hold.lease.lost_reason(), Some(LostReason::ShutDown))
    }

    /// The keys of this hold, for the protocol's calls.
    pub(crate) fn keys(&self) -> &crate::keys::LockKeys {
        &self.hold.keys
    }

    /// The token of this hold, for the protocol's calls.
    pub(crate) fn token(&self) -> &str {
        &self.hold.token
    }

    /// The id of the client that holds it, as tokens and `lock_info` name it.
    pub(crate) fn client_id(&self) -> &str {
        self.ctx.tokens.client_uuid()
    }

    /// How many guards of this hold the thread has now (re-entry counts each).
    pub(crate) fn holds(&self) -> usize {
        reentrancy::count(self.ctx.id, &self.hold.lock_key)
    }
}

/// What a guard of a kind that keeps a value under its lock carries.
#[derive(Default)]
struct ValueIo {
    /// Bytes that came with the acquire.
    payload: Option<Vec<u8>>,
    /// A release that writes under the lock: the kind's call. `None`: the plain release.
    written: Option<ReleaseWith>,
}

/// A kind's release that also writes under the lock (a shared value): the call for a lock's
/// keys and the holder's token. Reply as a release's: 1 when released, 0 when the lock did
/// not hold the token (then nothing is written).
pub(crate) type ReleaseWith = Box<dyn Fn(&LockKeys, &str) -> ScriptCall>;

/// Whether a release waits for Redis's reply.
#[derive(Clone, Copy)]
enum Reply {
    /// `unlock`: the caller gets the outcome.
    Wait,
    /// A drop: the reply is read by the connection's next user.
    Later,
}

/// Marks the lease of `hold` lost (once: the lease-lost event, `Stats::lost`) and makes the
/// error that says so.
pub(crate) fn lost(ctx: &LockContext, hold: &Hold, reason: LostReason) -> Error {
    if hold.lease.mark_lost(reason.clone()) {
        ctx.counters
            .lease_lost(&hold.name, hold.protocol.kind().name);
    }
    Error::new(
        ErrorKind::LockLost,
        format!("lock {:?}: {}", hold.name, reason.describe()),
    )
}

/// Gives `hold` up as its client shuts down (see `LeaseGuard::give_up_at_shutdown`): marked
/// lost first, so that its holder stops before anyone else can take the lock; then `first`
/// and the release, each sent once (a failure is logged: the lease runs out then).
fn given_up_at_shutdown(ctx: &LockContext, hold: &Hold, first: &ScriptCall) {
    if hold.lease.lost_reason().is_some() || !hold.lease.mark_lost(LostReason::ShutDown) {
        return;
    }
    if let Some(id) = hold.renewal_id() {
        ctx.renewal.cancel(id);
    }
    let doing = Doing::lock("giving up at shutdown", &hold.name);
    let release = hold.protocol.release(&hold.keys, &hold.token);
    let sent = ctx
        .lessor
        .acted(hold.call(first, doing))
        .and_then(|_| ctx.lessor.release(hold.call(&release, doing)));
    if let Err(e) = sent {
        log::warn!("redmutex: {e}; the lock is freed when its lease runs out");
    }
}

/// The release of `hold` without a value: for a hold that may have been passed on within
/// its client, the one that also sets the client's place among the waiting right, unless the
/// client never took one (`place`).
fn release_call_of(ctx: &LockContext, hold: &Hold, place: Place) -> ScriptCall {
    let given = match place {
        Place::GiveUp { given } => given,
        Place::Keep | Place::Never => 0,
    };
    match (hold.hand_off, hold.cohort, place) {
        (Some(hand_off), Some(_), Place::Keep | Place::GiveUp { .. }) => hand_off.release_held(
            &hold.keys,
            // Given up (unless more threads wait): places up to the hold's token (one its own
            // take made is for threads that waited then, gone now), and those that this
            // thread's own attempts or a sibling's that gave up made while a sibling held
            // (whose scores may be above the hold's token).
            (
                &hold.token,
                hold.fencing_token
                    .max(hold.own_place)
                    .max(given)
                    .saturating_add(1),
            ),
            (place == Place::Keep, ctx.renewal.lease() * 2),
            HAND_OFF_CLAIM,
        ),
        // A hold taken at a first attempt is most likely released to nobody.
        (Some(hand_off), Some(_), Place::Never) => hand_off
            .release(&hold.keys, &hold.token, HAND_OFF_CLAIM)
            .announcing_only_if(hold.after_wait),
        _ => hold
            .protocol
            .release(&hold.keys, &hold.token)
            .announcing_only_if(hold.after_wait),
    }
}

/// Releases in Redis the lock that `hold`'s release passed on when nobody takes it (its
/// waiter left); the renewal thread finishes a release that did not get an answer.
#[cold]
pub(crate) fn give_back(ctx: &LockContext, hold: &Hold) {
    let (place, _keeping) = ctx.gates.hold_ends(&hold.lock_key, false);
    let call = release_call_of(ctx, hold, place);
    let doing = Doing::lock("releasing", &hold.name);
    if let Err(e) = ctx.lessor.release(hold.call(&call, doing)) {
        log::debug!("redmutex: {e}");
        clean_up_release(ctx, hold, call);
    }
}

/// Has the renewal thread send `call`, the release of `hold`, until Redis answers or the lease
/// has passed.
#[cold]
fn clean_up_release(ctx: &LockContext, hold: &Hold, call: ScriptCall) {
    let give_up_at = hold.lease.expires_at() + ctx.config.response_timeout;
    ctx.renewal.clean_up_later(
        &hold.lock_key,
        Cleanup {
            name: Arc::clone(&hold.name),
            call,
            give_up_at,
        },
    );
}

/// Checks the reply to a release written by a guard's drop, when it is read: a lock that no
/// longer held the token is a lost lease (logged and counted); a release whose reply did not
/// come, or that Redis refused, goes to the renewal thread's clean-up, as a release with an
/// unknown outcome does.
fn settle_release(ctx: &Weak<LockContext>, hold: &Hold, reply: redis::RedisResult<redis::Value>) {
    let Some(ctx) = ctx.upgrade() else {
        return;
    };
    match reply {
        Ok(redis::Value::Int(1)) => Counters::add(&ctx.counters.releases, 1),
        Ok(redis::Value::Int(_)) => {
            let reason = hold.lease.lost_reason().unwrap_or(LostReason::Taken);
            if hold.lease.mark_lost_at_release(reason.clone()) {
                ctx.counters
                    .lease_lost(&hold.name, hold.protocol.kind().name);
            }
            log::warn!(
                "redmutex: releasing lock {:?} found it lost: {}",
                hold.name,
                reason.describe()
            );
        }
        other => {
            let why = match other {
                Err(e) => e.to_string(),
                Ok(value) => format!("{value:?}"),
            };
            log::warn!(
                "redmutex: the release of lock {:?} got no answer ({why}); retrying in the \
                 background",
                hold.name
            );
            clean_up_release(&ctx, hold, hold.protocol.release(&hold.keys, &hold.token));
        }
    }
}

impl Drop for LeaseGuard {
    fn drop(&mut self) {
        if let Err(e) = self.release(Reply::Later) {
            log::warn!("redmutex: releasing lock {:?} failed: {e}", self.hold.name);
        }
    }
}

impl fmt::Debug for LeaseGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeaseGuard")
            .field("name", &self.hold.name)
            .field("fencing_token", &self.hold.fencing_token)
            .field("fixed_lease", &self.hold.fixed_lease())
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}
