//! `RawLock`: one named lock of one protocol, and everything about taking it that every kind
//! of lock shares — re-entry, the attempt and its round trip, unknown outcomes, replica
//! acknowledgement, renewal registration, and the choice of waiting loop.

use std::borrow::Cow;
use std::cell::Cell;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::validate_lease;
use crate::connection::ScriptCall;
use crate::error::{Doing, Error, ErrorKind, Result};
use crate::events::{Acquired, Failed, TimedOut, Waiting};
use crate::keys::LockKeys;
use crate::lease::cleanup::{CleanUpLater, Cleanup};
use crate::lease::context::{Handle, LockContext};
use crate::lease::guard::LeaseGuard;
use crate::lease::hold::{HandOff, Hold, LeaseTerms};
use crate::lease::lessor::{Attempted, Attempting, Contact, HoldCall, Popped, Site};
use crate::lease::protocol::{AcquireCall, Protocol, WaitStyle, HAND_OFF_CLAIM};
use crate::lease::reentrancy;
use crate::lease::renewal::{LeaseLength, Registration};
use crate::lease::state::LeaseState;
use crate::stats::Counters;
use crate::waiting::{
    self, Attempt, Cohort, Contending, Early, GatePass, Handed, HoldsBegun, Note, Notes, Outage,
    Passed, Queued, Subscription, Taker, Turn,
};

/// The fencing token and the claim's end (server ms) of a note of a lock handed over
/// (`<fencing token> <claim end>`, what follows the waiter's id or token in the message).
fn parse_note(note: &str) -> Option<(u64, i64)> {
    let mut fields = note.split(' ');
    Some((fields.next()?.parse().ok()?, fields.next()?.parse().ok()?))
}

/// The prefix of a protocol's keys: the client's (borrowed: a handle is often made per
/// operation), plus the protocol's namespace if it has one.
fn key_prefix<'a>(ctx: &'a LockContext, protocol: &dyn Protocol) -> Cow<'a, str> {
    match protocol.namespace() {
        None => Cow::Borrowed(&ctx.config.key_prefix),
        Some(ns) => Cow::Owned(format!("{}:{ns}", ctx.config.key_prefix)),
    }
}

/// What the failed attempts of one wait reported, for what the waiter later takes.
#[derive(Default)]
struct Told {
    /// The server's clock at a queued waiter's last attempt that carried it.
    contact: Cell<Option<Contact>>,
    /// The highest score of a place the attempts made while the caller's own client held
    /// the lock (0: none): the release of the hold the waiter then takes gives it up
    /// (`mutex/take.lua`).
    own_place: Cell<u64>,
    /// The note a pop behind an attempt took out (see [`Turn::pop`]), not delivered yet.
    popped: Cell<Option<String>>,
}

impl Told {
    fn heard(&self, contact: Option<Contact>, own_place: Option<u64>) {
        if contact.is_some() {
            self.contact.set(contact);
        }
        if let Some(score) = own_place {
            self.own_place.set(self.own_place.get().max(score));
        }
    }

    fn own_place(&self) -> u64 {
        self.own_place.get()
    }
}

/// A named lock of one protocol, made from one client. Cheap to clone.
#[derive(Clone)]
pub(crate) struct RawLock {
    pub(crate) ctx: Arc<LockContext>,
    /// Keeps the client's background threads running while the lock's handle lives.
    _handle: Handle,
    protocol: &'static dyn Protocol,
    name: Arc<str>,
    /// The keys, or why the name is invalid (reported by every operation).
    keys: std::result::Result<Arc<LockKeys>, Error>,
    /// The lock's main key: its place in the re-entry map and its route.
    lock_key: Arc<str>,
    /// The lease of its holds, and whether it is renewed.
    lease_terms: LeaseTerms,
    /// How many units a hold takes, and how many exist (a semaphore's permits).
    units: u32,
    capacity: u32,
    /// How its holds pass between threads of the client, for a kind whose holds may.
    hand_off: Option<&'static dyn HandOff>,
}

impl RawLock {
    pub(crate) fn new(ctx: Arc<LockContext>, protocol: &'static dyn Protocol, name: &str) -> Self {
        let keys = LockKeys::new(&key_prefix(&ctx, protocol), name).map(Arc::new);
        let lock_key: Arc<str> = match &keys {
            Ok(k) => Arc::from(k.lock.as_str()),
            Err(_) => Arc::from(""),
        };
        RawLock {
            _handle: Handle::new(&ctx),
            ctx,
            protocol,
            name: Arc::from(name),
            keys,
            lock_key,
            lease_terms: LeaseTerms::ClientDefault,
            units: 1,
            capacity: 1,
            hand_off: None,
        }
    }

    /// This lock, whose holds one thread may pass to another of the client as `hand_off`
    /// says (lock cohorting), where its holds live on one deployment.
    pub(crate) fn with_hand_off(mut self, hand_off: &'static dyn HandOff) -> Self {
        self.hand_off = Some(hand_off);
        self
    }

    /// This lock, whose holds take `units` of the `capacity` that exist.
    pub(crate) fn with_units(mut self, units: u32, capacity: u32) -> Self {
        self.units = units;
        self.capacity = capacity;
        self
    }

    /// This lock kept at its name itself rather than at `P:{name}` (see `LockKeys::bare`).
    pub(crate) fn with_bare_key(mut self) -> Self {
        let prefix = key_prefix(&self.ctx, self.protocol);
        self.keys = LockKeys::bare(&prefix, &self.name).map(Arc::new);
        self.lock_key = match &self.keys {
            Ok(k) => Arc::from(k.lock.as_str()),
            Err(_) => Arc::from(""),
        };
        self
    }

    /// This lock, with its holds known in the re-entry map by its main key and `suffix` (a
    /// lock with holds of two kinds on the same keys, such as a read-write lock's readers
    /// and writer, names one kind apart, so that re-entry never mistakes one for the other).
    /// The name keeps the lock's hash tag, so it routes as the lock does.
    pub(crate) fn with_hold_suffix(mut self, suffix: &str) -> Self {
        if let Ok(k) = &self.keys {
            self.lock_key = Arc::from(format!("{}{suffix}", k.lock));
        }
        self
    }

    /// This lock with a fixed lease (no renewal); checked by the first operation.
    pub(crate) fn with_fixed_lease(mut self, lease: Duration) -> Self {
        self.lease_terms = LeaseTerms::Fixed(lease);
        self
    }

    /// This lock with a lease of its own that the renewal thread renews (in place of the
    /// client's default lease); checked by the first operation.
    pub(crate) fn with_renewed_lease(mut self, lease: Duration) -> Self {
        self.lease_terms = LeaseTerms::Renewed(lease);
        self
    }

    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// Whether the lock's holds live on one deployment (not on a quorum of instances).
    pub(crate) fn on_one_deployment(&self) -> bool {
        self.ctx.lessor.one_deployment().is_some()
    }

    pub(crate) fn fixed_lease(&self) -> Option<Duration> {
        match self.lease_terms {
            LeaseTerms::Fixed(lease) => Some(lease),
            _ => None,
        }
    }

    pub(crate) fn kind(&self) -> &'static str {
        self.protocol.kind().name
    }

    #[inline]
    pub(crate) fn keys(&self) -> Result<&Arc<LockKeys>> {
        self.keys.as_ref().map_err(Clone::clone)
    }

    #[inline]
    fn lease(&self) -> Result<Duration> {
        match self.lease_terms {
            LeaseTerms::ClientDefault => Ok(self.ctx.renewal.lease()),
            LeaseTerms::Renewed(lease) | LeaseTerms::Fixed(lease) => {
                validate_lease(lease).map(|()| lease)
            }
        }
    }

    fn is_fixed(&self) -> bool {
        matches!(self.lease_terms, LeaseTerms::Fixed(_))
    }

    pub(crate) fn doing(&self, action: &'static str) -> Doing<'_> {
        Doing::lock(action, &self.name)
    }

    /// `call` on this lock's keys `keys`, `doing` what it says.
    fn at<'a>(&self, keys: &'a LockKeys, call: &'a ScriptCall, doing: Doing<'a>) -> HoldCall<'a> {
        let site = Site {
            route: &keys.lock,
            capacity: self.capacity,
        };
        HoldCall { site, call, doing }
    }

    /// Whether anyone holds the lock now. One round trip. A key of another type than a
    /// lock's is a `WrongType` error, as the acquire says.
    pub(crate) fn is_locked(&self) -> Result<bool> {
        let keys = self.keys()?;
        self.ctx.ensure_open()?;
        let kind = self
            .ctx
            .lessor
            .key_type(&keys.lock, self.doing("checking"))?;
        match kind.as_str() {
            "none" => Ok(false),
            "string" => Ok(true),
            other => Err(Error::new(
                ErrorKind::WrongType,
                format!(
                    "checking lock {:?}: its key {} holds a {other}, not a lock",
                    self.name, keys.lock
                ),
            )),
        }
    }

    /// How many guards of this lock the calling thread holds now. Local.
    pub(crate) fn hold_count(&self) -> usize {
        if self.keys.is_err() {
            return 0;
        }
        reentrancy::count(self.ctx.id, &self.lock_key)
    }

    /// Releases the lock whoever holds it. Returns whether a lock was there.
    pub(crate) fn force_unlock(&self) -> Result<bool> {
        let keys = self.keys()?;
        self.ctx.ensure_open()?;
        let call = self.protocol.force_release(keys);
        let doing = self.doing("force-unlocking");
        self.ctx.lessor.found(self.at(keys, &call, doing))
    }

    /// How many units of the lock are free: `call` replies a count (see `Lessor::count`).
    pub(crate) fn count(&self, call: &ScriptCall, doing: Doing<'_>) -> Result<u64> {
        let keys = self.keys()?;
        self.ctx.ensure_open()?;
        self.ctx.lessor.count(self.at(keys, call, doing))
    }

    /// Re-entry, else one attempt, else the protocol's waiting loop until `deadline` (`None`:
    /// forever; a deadline that has passed: one attempt).
    #[inline]
    pub(crate) fn acquire(&self, deadline: Option<Instant>) -> Result<Option<LeaseGuard>> {
        let keys = self.keys()?;
        let lease = self.lease()?;
        if let Some(guard) = self.reenter()? {
            return Ok(Some(guard));
        }
        let may_wait = deadline.is_none_or(|d| d > Instant::now());
        let observed = self.ctx.counters.events.on().then(Instant::now);
        let mut result = self.acquire_once(keys, lease, deadline, may_wait);
        if may_wait && matches!(&result, Err(e) if e.is_transient()) {
            result = self.ride_through(keys, lease, deadline, result);
        }
        if let Some(started) = observed {
            self.report(&result, started.elapsed());
        }
        result
    }

    /// One acquire, with a new token: an attempt, and the protocol's waiting loop when the
    /// caller may wait.
    #[inline]
    fn acquire_once(
        &self,
        keys: &Arc<LockKeys>,
        lease: Duration,
        deadline: Option<Instant>,
        may_wait: bool,
    ) -> Result<Option<LeaseGuard>> {
        let token: Arc<str> = self.ctx.tokens.next();
        match self.protocol.kind().waits {
            WaitStyle::Contend => self.acquire_contending(keys, lease, deadline, may_wait, &token),
            WaitStyle::Queue => self.acquire_queued(keys, lease, deadline, may_wait, token),
        }
    }

    /// A blocking acquire through an outage (see `Builder::outage_patience`): after an error
    /// that may pass (a connection refused, a time-out, `CLUSTERDOWN`…), the acquire starts
    /// again after a backoff step, with a new token (what the failed one may have left is
    /// cleaned up by the renewal thread), until it ends otherwise, the deadline comes, or the
    /// patience since the first error is spent: then the last error. A client that never
    /// reached its deployment has no outage to ride through: its first error is returned.
    #[cold]
    fn ride_through(
        &self,
        keys: &Arc<LockKeys>,
        lease: Duration,
        deadline: Option<Instant>,
        result: Result<Option<LeaseGuard>>,
    ) -> Result<Option<LeaseGuard>> {
        let ctx = &self.ctx;
        Outage::new(&ctx.config, ctx.lessor.reached(), &ctx.counters).ride_through(
            deadline,
            result,
            || self.acquire_once(keys, lease, deadline, true),
        )
    }

    /// Tells the client's event handlers how an acquire ended.
    #[cold]
    fn report(&self, result: &Result<Option<LeaseGuard>>, waited: Duration) {
        let (name, kind) = (&*self.name, self.protocol.kind().name);
        self.ctx.counters.events.emit(|h| match result {
            Ok(Some(_)) => h.acquired(&Acquired { name, kind, waited }),
            Ok(None) => h.timed_out(&TimedOut { name, kind, waited }),
            Err(e) => h.failed(&Failed {
                name,
                kind,
                error: e.kind(),
            }),
        });
    }

    /// Runs a waiting loop, telling the client's event handlers when it starts and stops.
    fn waiting<T>(&self, wait: impl FnOnce() -> T) -> T {
        let events = &self.ctx.counters.events;
        if !events.on() {
            return wait();
        }
        let (name, kind) = (&*self.name, self.protocol.kind().name);
        events.emit(|h| {
            h.waiting(&Waiting {
                name,
                kind,
                started: true,
            })
        });
        let result = wait();
        events.emit(|h| {
            h.waiting(&Waiting {
                name,
                kind,
                started: false,
            })
        });
        result
    }

    #[inline]
    fn reenter(&self) -> Result<Option<LeaseGuard>> {
        if !self.protocol.reentrant() {
            return Ok(None);
        }
        let hold = match reentrancy::reenter(self.ctx.id, &self.lock_key) {
            Ok(Some(hold)) => hold,
            Ok(None) => return Ok(None),
            Err(reason) => {
                return Err(Error::new(
                    ErrorKind::LockLost,
                    format!(
                        "cannot re-enter lock {:?}: {}",
                        self.name,
                        reason.describe()
                    ),
                ))
            }
        };
        Counters::add(&self.ctx.counters.reentries, 1);
        Ok(Some(LeaseGuard::new(Arc::clone(&self.ctx), hold)))
    }

    /// Contending: a blocking acquire queues behind this client's other waiters for the lock
    /// instead of trying first (they found it held, and one of them contends in Redis
    /// already); when this client listens to the lock's announcements already, joining in
    /// before the attempt lets a failed attempt go straight to waiting.
    fn acquire_contending(
        &self,
        keys: &Arc<LockKeys>,
        lease: Duration,
        deadline: Option<Instant>,
        may_wait: bool,
        token: &Arc<str>,
    ) -> Result<Option<LeaseGuard>> {
        let ctx = &self.ctx;
        let client_id = ctx.tokens.client_uuid();
        let channel = self.protocol.wake_channel(keys, client_id);
        let filter = self.protocol.wake_filter(client_id);
        let told = Told::default();
        let attempt = |turn| self.attempt(keys, lease, token, (may_wait, turn, false), Some(&told));
        let take_over = |passed| self.take_passed(keys, passed, told.own_place());
        let taker = Taker {
            lease,
            fixed: self.is_fixed(),
            kind: self.protocol.kind().name,
        };
        // Behind this client's other waiters, no attempt first; else the attempt counts as
        // coming, for a thread of this client that gives up meanwhile.
        let coming = match may_wait {
            true => ctx.gates.attempt_first(&self.lock_key),
            false => None,
        };
        let early = match !may_wait || coming.is_some() {
            false => None,
            true => {
                let begun = coming.as_ref().map_or(HoldsBegun::default(), |c| c.begun);
                // A pop behind the attempt for a thread that comes alone (see `first_pop`).
                let pop_until = coming.as_ref().is_some_and(|c| c.alone).then_some(deadline);
                let first = (keys, lease, token, may_wait);
                match self.first_attempt(first, (&channel, &filter), (begun, pop_until), &told)? {
                    ControlFlow::Break(won) => return Ok(won),
                    ControlFlow::Continue(early) => early,
                }
            }
        };
        let notes_key = self.notes_key(keys, client_id);
        let pop = |timeout: Duration| self.pop_note(notes_key.as_deref()?, timeout);
        self.waiting(|| {
            let contending = Contending {
                lock_key: &self.lock_key,
                channel: &channel,
                filter,
                deadline,
                coming,
                early,
                taker,
                notes: notes_key.is_some().then_some(&pop as waiting::PopNote<'_>),
            };
            let handed = |note: &Note| self.take_named(keys, note, &told);
            let give_up = |pass: &GatePass<'_>| self.give_up(pass, (keys, token), &told, &channel);
            let (attempt, end) = (attempt, (take_over, handed, give_up));
            waiting::contend(ctx.waiting(), contending, attempt, end)
        })
    }

    /// The first attempt of a contending acquire, outside the gate, listening already when
    /// the client's subscription to `channel` is live: `Break` with what it won (a guard, or
    /// nothing for a caller that does not wait), else what a leader that comes straight from
    /// it need not attempt again. `pop_until`: given to a thread that comes alone, with the
    /// acquire's deadline: a pop behind the attempt may wait for the client's note (see
    /// [`waiting::first_pop`]); a note it took out goes to the subscription, whose leader
    /// takes it.
    fn first_attempt(
        &self,
        (keys, lease, token, may_wait): (&Arc<LockKeys>, Duration, &Arc<str>, bool),
        (channel, filter): (&Arc<str>, &Option<Arc<str>>),
        (begun, pop_until): (HoldsBegun, Option<Option<Instant>>),
        told: &Told,
    ) -> Result<ControlFlow<Option<LeaseGuard>, Option<Early>>> {
        let ctx = &self.ctx;
        let live = match may_wait {
            true => ctx
                .subscriber
                .subscribe_if_live(channel, (filter.clone(), Notes::Client)),
            false => None,
        };
        let seen = live.as_ref().map_or(0, Subscription::seen);
        // Where a release names one client and may hand it the lock, the client is placed
        // among the waiting only once it listens: a note published before its subscription
        // would be lost, and the lock held for it until the claim ran out (its attempts do not
        // take a claim). Not listening yet, the first attempt only tries; the leader's attempt
        // after subscribing places the client.
        let places = may_wait && (filter.is_none() || live.is_some());
        let pop = match (&live, pop_until) {
            (Some(live), Some(deadline)) if places && !ctx.pop_refused.load(Ordering::Relaxed) => {
                waiting::first_pop(&ctx.config, deadline, live)
            }
            _ => None,
        };
        let turn = Turn {
            likely_held: live.as_ref().is_some_and(Subscription::named_before),
            pop,
            ..Turn::default()
        };
        let first = (places, turn, true);
        Ok(match self.attempt(keys, lease, token, first, Some(told))? {
            Attempt::Acquired(guard) => {
                if let Some(live) = live {
                    live.end_unneeded(pop.is_some());
                }
                ControlFlow::Break(Some(guard))
            }
            Attempt::Held(..) if !may_wait => {
                ctx.counters.gave_up_at_once();
                ControlFlow::Break(None)
            }
            Attempt::Held(remaining, release) => {
                if let (Some(note), Some(live)) = (told.popped.take(), &live) {
                    live.deliver_note(&note);
                }
                ControlFlow::Continue(live.map(|subscription| Early {
                    subscription,
                    seen,
                    held: (remaining, release),
                    begun,
                }))
            }
        })
    }

    /// The list in which releases that hand this lock to the client `client_id` leave it the
    /// note (`mutex/waiters.lua`), when they do.
    fn notes_key(&self, keys: &LockKeys, client_id: &str) -> Option<String> {
        self.passes_on()
            .then(|| format!("{}:{client_id}", keys.waiting))
    }

    /// Pops the note of a lock handed to this client from its list `key` (`mutex/waiters.lua`),
    /// waiting for it up to `timeout`: `BLPOP`, whose timeout Redis reads in seconds with
    /// decimals. `None` when none came, or the pop failed (the waiter then waits for the
    /// announcement); a refusal (an ACL without `+blpop`) is told once, and no waiter of the
    /// client pops again.
    fn pop_note(&self, key: &str, timeout: Duration) -> Option<String> {
        let ctx = &self.ctx;
        if ctx.pop_refused.load(Ordering::Relaxed) {
            return None;
        }
        let connections = ctx.lessor.one_deployment()?;
        let seconds = format!("{:.3}", timeout.as_secs_f64());
        let popped = connections.call(key, self.doing("waiting for"), |c| {
            redis::cmd("BLPOP")
                .arg(key)
                .arg(&seconds)
                .query::<Option<(String, String)>>(c)
        });
        match popped {
            // An empty value is an attempt's mark (`mutex/acquire.lua`), not a note.
            Ok(popped) => {
                let note = popped.map(|(_, note)| note).filter(|note| !note.is_empty());
                if note.is_some() {
                    ctx.pops_answered.store(true, Ordering::Relaxed);
                }
                note
            }
            Err(e) if e.kind() == ErrorKind::Auth => {
                self.refuse_pops(&e);
                None
            }
            Err(e) => {
                log::debug!("redmutex: {e}");
                None
            }
        }
    }

    /// Redis refused a blocking pop (`e`): no waiter of the client pops again, and the first
    /// refusal is told.
    fn refuse_pops(&self, e: &dyn std::fmt::Display) {
        if !self.ctx.pop_refused.swap(true, Ordering::Relaxed) {
            log::warn!(
                "redmutex: {e}; waiters are woken through the subscriber thread alone (the \
                 ACL user needs +blpop)"
            );
        }
    }

    /// A contending wait ends without the lock while the thread is still in its gate (`pass`):
    /// the last waiter of its client withdraws it, after the releases on their way that keep
    /// its place.
    fn give_up(
        &self,
        pass: &GatePass<'_>,
        (keys, token): (&LockKeys, &str),
        told: &Told,
        channel: &str,
    ) {
        let ctx = &self.ctx;
        if !pass.others_wait() {
            let settle = || ctx.lessor.settle_unread();
            pass.await_kept_places(ctx.config.response_timeout, settle);
        }
        let others_wait = pass.gives_up(told.own_place());
        self.withdraw(keys, token, others_wait, channel);
    }

    /// A contending wait ends without the lock: withdraws what its attempts claimed, its
    /// reply awaited while the thread is still in its gate (best effort: a claim left behind
    /// expires with its lease). A lock a release handed to the client goes to the next
    /// waiting client; a note of it that comes later (on `channel`) is not relied on.
    fn withdraw(&self, keys: &LockKeys, token: &str, others_wait: bool, channel: &str) {
        let hand_over = self.passes_on().then_some(HAND_OFF_CLAIM);
        if let Some(call) = self.protocol.withdraw(keys, token, others_wait, hand_over) {
            let doing = self.doing("giving up the wait for");
            if let Err(e) = self.ctx.lessor.send(self.at(keys, &call, doing)) {
                log::debug!("redmutex: {e}");
            }
            self.ctx.subscriber.withdrew(channel);
        }
    }

    /// What a contending leader makes of the `note` of a lock a release handed to its client
    /// (`mutex/waiters.lua`): its fencing token and when its claim ends by the server's clock.
    /// A `Mutex`'s leader takes it without a round trip (its token is the claim,
    /// `<client>:h:<fencing token>`), when the claim surely lasts long enough (see
    /// [`claim_held_until`](Self::claim_held_until)) and no withdrawal of the client may have
    /// given it up since; else its next attempt names the fencing token. `None`: not a note.
    fn take_named(
        &self,
        keys: &Arc<LockKeys>,
        note: &Note,
        told: &Told,
    ) -> Option<Handed<LeaseGuard>> {
        let (fencing_token, claim_end) = parse_note(&note.text)?;
        let withdrawn = note
            .withdrawn_at
            .is_some_and(|at| at.elapsed() < HAND_OFF_CLAIM);
        let held_until = match self.passes_on() && !withdrawn {
            true => self.claim_held_until(claim_end, told.contact.get()),
            false => None,
        };
        let Some(held_until) = held_until else {
            return Some(Handed::Attempt(fencing_token));
        };
        let claim = format!("{}:h:{fencing_token}", self.ctx.tokens.client_uuid());
        let at = (fencing_token, held_until);
        // Taken after a wait: the attempts of the wait may have left the client a place among
        // the waiting, which the hold's release sets right, as after a winning attempt.
        let cohort = Some((Cohort::start(), true));
        let taken = self.acquired(
            keys,
            &Arc::from(claim),
            at,
            cohort,
            (told.own_place(), true),
        );
        Some(Handed::Taken(
            taken.map(|guard| self.handed_over(guard, held_until)),
        ))
    }

    /// Queued: one try without queueing, then (when the caller may wait) the queue, with one
    /// token for the whole wait. When this client listens on its wake channel of the lock
    /// already, the first attempt queues at once.
    fn acquire_queued(
        &self,
        keys: &Arc<LockKeys>,
        lease: Duration,
        deadline: Option<Instant>,
        may_wait: bool,
        token: Arc<str>,
    ) -> Result<Option<LeaseGuard>> {
        let ctx = &self.ctx;
        let channel = self.protocol.wake_channel(keys, ctx.tokens.client_uuid());
        if may_wait {
            if let Some(sub) = ctx
                .subscriber
                .subscribe_if_live(&channel, (Some(Arc::clone(&token)), Notes::Waiter))
            {
                return self.wait_in_queue(keys, lease, deadline, &token, Some(sub), false);
            }
        }
        match self.attempt(keys, lease, &token, (false, Turn::default(), true), None)? {
            Attempt::Acquired(guard) => Ok(Some(guard)),
            Attempt::Held(..) if !may_wait => {
                ctx.counters.gave_up_at_once();
                Ok(None)
            }
            Attempt::Held(..) => {
                let filter = (Some(Arc::clone(&token)), Notes::Waiter);
                let sub = ctx.subscriber.subscribe(&channel, filter);
                self.wait_in_queue(keys, lease, deadline, &token, sub, true)
            }
        }
    }

    #[cold]
    fn wait_in_queue(
        &self,
        keys: &Arc<LockKeys>,
        lease: Duration,
        deadline: Option<Instant>,
        token: &Arc<str>,
        subscription: Option<Subscription>,
        confirm: bool,
    ) -> Result<Option<LeaseGuard>> {
        let ctx = &self.ctx;
        let dropped = Arc::new(AtomicBool::new(false));
        let heartbeat = ctx.renewal.register(Registration::Waiter {
            protocol: self.protocol,
            keys: Arc::clone(keys),
            token: Arc::clone(token),
            dropped: Arc::clone(&dropped),
        })?;
        let told = Told::default();
        let result = self.waiting(|| {
            let queued = Queued {
                lock_key: &self.lock_key,
                subscription,
                confirm,
                deadline,
                dropped: &dropped,
            };
            waiting::queue(
                ctx.waiting(),
                queued,
                (
                    || {
                        self.attempt(
                            keys,
                            lease,
                            token,
                            (true, Turn::default(), false),
                            Some(&told),
                        )
                    },
                    |note| self.take_handed(keys, token, note, told.contact.get()),
                ),
                || self.leave(keys, token),
            )
        });
        ctx.renewal.cancel(heartbeat);
        result
    }

    /// Leaves the queue: one try now, then the renewal thread's clean-up (a waiter that
    /// cannot leave at all is dropped when its heartbeat stops).
    fn leave(&self, keys: &LockKeys, token: &str) {
        let call = self.protocol.abandon(keys, token);
        let doing = self.doing("leaving the queue of");
        if let Err(e) = self.ctx.lessor.send(self.at(keys, &call, doing)) {
            log::debug!("redmutex: {e}; retrying in the background");
            self.clean_up_later(keys, token, Instant::now() + self.ctx.renewal.lease());
        }
    }

    /// One acquire attempt with `token`, sent through the lessor (which resends, cleans up
    /// and checks replica acknowledgements as its deployment needs). On success the lease is
    /// registered for renewal (when it is not fixed) before the guard is returned.
    ///
    /// `queue`: whether a failed attempt waits (in the queue, for a queue-style protocol);
    /// `turn`: how a contending leader's attempt stands (see [`Turn`]); `first`: the first
    /// attempt of an acquire, which expects a free lock, so that the lessor may take it
    /// without a script (`plain_take`; an attempt after a wait is the script, which registers
    /// the waiter again in the same round trip when someone else took the lock meanwhile). A
    /// wait's `told` records what each failed attempt reports.
    fn attempt(
        &self,
        keys: &Arc<LockKeys>,
        lease: Duration,
        token: &Arc<str>,
        (queue, turn, first): (bool, Turn, bool),
        told: Option<&Told>,
    ) -> Result<Attempt<LeaseGuard>> {
        let ctx = &self.ctx;
        ctx.ensure_open()?;
        let notes = turn
            .pop
            .and_then(|timeout| Some((self.notes_key(keys, ctx.tokens.client_uuid())?, timeout)));
        let call = AcquireCall {
            keys,
            token,
            lease,
            queue,
            waiter_timeout: ctx.renewal.lease(),
            units: self.units,
            capacity: self.capacity,
            more: turn.more,
            after: turn.after,
            overdue: turn.overdue,
            recheck: turn.recheck,
            claim: turn.claim,
            likely_held: turn.likely_held,
            pop: notes
                .as_ref()
                .map(|(key, timeout)| (key.as_str(), *timeout)),
            pop_recorded: ctx.pops_answered.load(Ordering::Relaxed),
        };
        let attempting = Attempting {
            protocol: self.protocol,
            call: &call,
            name: &self.name,
            lock_key: &self.lock_key,
            first,
        };
        Counters::add(&ctx.counters.attempts, 1);
        match ctx.lessor.attempt(&attempting, &ctx.renewal)? {
            Attempted::Taken {
                fencing_token,
                held_until,
                payload,
            } => {
                // Won after a wait: the attempts may have left the client a place among the
                // lock's waiting clients, which its release sets right.
                let cohort = self.passes_on().then(|| (Cohort::start(), !first));
                let own_place = told.map_or(0, Told::own_place);
                let at = (fencing_token, held_until);
                let guard = self.acquired(keys, token, at, cohort, (own_place, !first))?;
                Ok(Attempt::Acquired(guard.with_payload(payload)))
            }
            Attempted::Held {
                wait,
                release,
                contact,
                own_place,
                popped,
            } => {
                if let Some(told) = told {
                    told.heard(contact, own_place);
                }
                match popped {
                    // Only a first attempt, which is told, pops.
                    Popped::Note(note) => {
                        ctx.pops_answered.store(true, Ordering::Relaxed);
                        if let Some(told) = told {
                            told.popped.set(Some(note));
                        }
                    }
                    Popped::Refused(e) => self.refuse_pops(&e),
                    Popped::Nothing => {}
                }
                Ok(Attempt::Held(wait, release))
            }
        }
    }

    /// The guard of a lock taken with `token`, surely held until `expires_at`, registered for
    /// renewal when its lease is not fixed; a lock that cannot be renewed is given back.
    /// `cohort`: for a hold that may be passed on, its run, and whether it was taken after a
    /// wait (see [`Gates::hold_begins`](crate::waiting::Gates::hold_begins)); `own_place`
    /// (see [`Hold::own_place`]) and whether it was taken after a wait.
    fn acquired(
        &self,
        keys: &Arc<LockKeys>,
        token: &Arc<str>,
        (fencing_token, expires_at): (u64, Instant),
        cohort: Option<(Cohort, bool)>,
        (own_place, after_wait): (u64, bool),
    ) -> Result<LeaseGuard> {
        let ctx = &self.ctx;
        let token = Arc::clone(token);
        let lease_state = LeaseState::new(expires_at);
        // Checked by every caller before it took the lock.
        let lease = self.lease()?;
        let renewal_id = match self.is_fixed() {
            true => None,
            false => {
                let registration = Registration::Lease {
                    protocol: self.protocol,
                    capacity: self.capacity,
                    name: Arc::clone(&self.name),
                    keys: Arc::clone(keys),
                    token: Arc::clone(&token),
                    state: Arc::clone(&lease_state),
                    lease: LeaseLength::of(lease),
                };
                match ctx.renewal.register(registration) {
                    Ok(id) => std::num::NonZeroU64::new(id),
                    Err(e) => {
                        self.roll_back(keys, &token, expires_at);
                        return Err(e);
                    }
                }
            }
        };
        Counters::add(&ctx.counters.acquisitions, 1);
        let hold = Arc::new(Hold {
            protocol: self.protocol,
            keys: Arc::clone(keys),
            name: Arc::clone(&self.name),
            lock_key: Arc::clone(&self.lock_key),
            token,
            fencing_token,
            capacity: self.capacity,
            lease_ns: Hold::nanos(lease),
            fixed: self.is_fixed(),
            renewal_id,
            lease: lease_state,
            acquired_at: ctx.counters.events.on().then(Instant::now),
            cohort: cohort.map(|(run, _)| run),
            hand_off: self.hand_off.filter(|_| cohort.is_some()),
            own_place,
            after_wait,
        });
        if self.protocol.reentrant() {
            reentrancy::enter(ctx.id, &self.lock_key, Arc::clone(&hold));
        }
        if let Some((_, placed)) = cohort {
            ctx.gates.hold_begins(&self.lock_key, placed);
        }
        Ok(LeaseGuard::new(Arc::clone(ctx), hold))
    }

    /// The guard of a lock that a release handed to this queued waiter, with the `note` that
    /// came with it: the fencing token, and when the claim ends by the server's clock. The
    /// renewal thread renews the claim to the lease halfway to its end (unless the guard is
    /// released before). `None` when the waiter attempts instead, which takes the lock if the
    /// claim still holds its token: when less than half of the claim is surely ahead, when the
    /// lease is fixed (only an attempt sets it), or when replicas must acknowledge the
    /// acquire.
    fn take_handed(
        &self,
        keys: &Arc<LockKeys>,
        token: &Arc<str>,
        note: &str,
        contact: Option<Contact>,
    ) -> Option<LeaseGuard> {
        let (fencing_token, claim_end) = parse_note(note)?;
        let held_until = self.claim_held_until(claim_end, contact)?;
        let guard = self
            .acquired(keys, token, (fencing_token, held_until), None, (0, true))
            .ok()?;
        Some(self.handed_over(guard, held_until))
    }

    /// Until when a claim that ends at `claim_end` by the server's clock surely holds, read
    /// with `contact` (an attempt's reading of that clock); `None` when it cannot be relied
    /// on: less than half of the claim is surely ahead, the lease is fixed (only an attempt
    /// sets it), or replicas must acknowledge the acquire.
    fn claim_held_until(&self, claim_end: i64, contact: Option<Contact>) -> Option<Instant> {
        let contact = contact?;
        if self.is_fixed() || self.ctx.config.replica_acks.is_some() {
            return None;
        }
        let ahead = u64::try_from(claim_end.checked_sub(contact.server_ms)?).ok()?;
        let ahead = Duration::from_millis(ahead);
        // The two clocks may run apart a little over a long wait: 0.1 % of it is allowed.
        let held_until = contact.sent_at + ahead - ahead / 1000;
        (Instant::now() + HAND_OFF_CLAIM / 2 <= held_until).then_some(held_until)
    }

    /// A guard taken by the note of a lock handed over, whose claim holds until `held_until`:
    /// the renewal thread renews the claim to the lease halfway to its end (a short hold is
    /// released before and costs no renewal, and a long one is renewed with half the claim
    /// to spare).
    fn handed_over(&self, guard: LeaseGuard, held_until: Instant) -> LeaseGuard {
        Counters::add(&self.ctx.counters.handed_over, 1);
        if let Some(id) = guard.renewal_id() {
            let now = Instant::now();
            self.ctx.renewal.renew_at(id, now + (held_until - now) / 2);
        }
        guard
    }

    /// The keys, lease and a new token for an attempt that a script taking several locks at
    /// once makes for this lock; or why it cannot be taken.
    pub(crate) fn prepare_elsewhere(&self) -> Result<(&Arc<LockKeys>, Duration, Arc<str>)> {
        let keys = self.keys()?;
        let lease = self.lease()?;
        Ok((keys, lease, self.ctx.tokens.next()))
    }

    /// The guard of this lock, taken with `token` by a script that took several locks at once
    /// (the attempt sent at `sent_at`, with the lease of
    /// [`prepare_elsewhere`](Self::prepare_elsewhere)).
    pub(crate) fn adopt(
        &self,
        token: &str,
        fencing_token: u64,
        sent_at: Instant,
    ) -> Result<LeaseGuard> {
        let keys = self.keys()?;
        let lease = self.lease()?;
        let held_until = sent_at + self.ctx.counted(lease);
        self.acquired(
            keys,
            &Arc::from(token),
            (fencing_token, held_until),
            None,
            (0, false),
        )
    }

    /// Whether holds of this lock taken by one thread may be passed to another thread of
    /// the client (a `Mutex`'s; the protocol knows how).
    fn passes_on(&self) -> bool {
        self.hand_off.is_some()
            && self.protocol.kind().waits == WaitStyle::Contend
            && self.ctx.lessor.one_deployment().is_some()
    }

    /// The guard of a lock that a holder of this client passed to this waiter (`take_over`
    /// of the contending wait): no round trip.
    /// `own_place`: the score of a place this waiter's attempts made while a sibling held
    /// (0: none), which its release gives up.
    fn take_passed(
        &self,
        keys: &Arc<LockKeys>,
        passed: Passed,
        own_place: u64,
    ) -> Result<LeaseGuard> {
        let guard = self.acquired(
            keys,
            &passed.token,
            (passed.fencing_token, passed.expires_at),
            Some((passed.cohort, true)),
            (own_place, true),
        )?;
        Counters::add(&self.ctx.counters.passed_on, 1);
        Ok(guard)
    }

    /// Has the renewal thread give back this lock, taken with `token` by a script that took
    /// several at once but not kept (or whose outcome is unknown).
    pub(crate) fn give_back_later(&self, token: &str, sent_at: Instant) {
        if let (Ok(keys), Ok(lease)) = (self.keys(), self.lease()) {
            self.clean_up_later(keys, token, sent_at + lease);
        }
    }

    /// Gives back a lock that was taken but cannot be kept (too few replica acknowledgements,
    /// no renewal thread): one try now, then the renewal thread's clean-up.
    #[cold]
    fn roll_back(&self, keys: &LockKeys, token: &str, give_up_at: Instant) {
        let call = self.protocol.abandon(keys, token);
        let doing = self.doing("rolling back");
        if let Err(e) = self.ctx.lessor.send(self.at(keys, &call, doing)) {
            log::debug!("redmutex: {e}; retrying in the background");
            self.clean_up_later(keys, token, give_up_at);
        }
    }

    /// Has the renewal thread remove what an acquire with `token` may have left, until Redis
    /// answers or `give_up_at`, when the lease it asked for has passed.
    #[cold]
    fn clean_up_later(&self, keys: &LockKeys, token: &str, give_up_at: Instant) {
        self.ctx.renewal.clean_up_later(
            &self.lock_key,
            Cleanup {
                name: Arc::clone(&self.name),
                call: self.protocol.abandon(keys, token),
                give_up_at: give_up_at + self.ctx.config.response_timeout,
            },
        );
    }
}
