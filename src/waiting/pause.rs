//! The pause between two acquire attempts of a waiter: until the release announcement wakes
//! it, or a recheck (announcements live) or backoff (not live) delay passes, never past the
//! lock's remaining lease nor the caller's deadline.

use std::time::{Duration, Instant};

use super::backoff::Backoff;
use super::subscriber::{Note, Subscription};
use super::Release;
use crate::config::Config;

/// At most how many re-check periods a waiter far back among the waiting clients waits in
/// silence (see [`Pause::wait`]). The client first in line re-checks every period and so
/// keeps the lock's waiting clients alive (their record lives a lease past the holder's from
/// each attempt); this bounds how long a waiter further back can miss a free lock whose
/// announcement went astray when the clients ahead of it are gone too.
const MOST_PERIODS_BEHIND: u32 = 8;

pub(crate) struct Pause {
    subscription: Option<Subscription>,
    backoff: Backoff,
    recheck: Duration,
    /// The last wait was for announcements for a whole re-check period or more (not cut
    /// short by the lock's expiry, a client's short turn, a backoff or the deadline).
    whole_period: bool,
}

impl Pause {
    pub(crate) fn new(subscription: Option<Subscription>, config: &Config) -> Self {
        Pause {
            subscription,
            backoff: Backoff::new(config.backoff_base, config.backoff_cap),
            // While announcements are live, a waiter re-checks the lock only in case one went
            // astray, as often as holders renew: each attempt refreshes the client's place
            // among the waiting for a lease, so it cannot lapse between two re-checks.
            recheck: config.backoff_cap.max(config.renewal_interval),
            whole_period: false,
        }
    }

    /// The subscription, taken out (to hand it to the next leading waiter).
    pub(crate) fn take_subscription(&mut self) -> Option<Subscription> {
        self.subscription.take()
    }

    /// The signal that wakes this waiter, when it listens for announcements.
    pub(crate) fn signal(&self) -> Option<std::sync::Arc<super::Signal>> {
        self.subscription.as_ref().map(Subscription::signal)
    }

    /// The note of the last announcement that came with one (a lock handed over), taken out.
    pub(crate) fn take_note(&self) -> Option<Note> {
        self.subscription.as_ref().and_then(Subscription::take_note)
    }

    /// Waits for the subscription to be confirmed by Redis, at most until `by`.
    pub(crate) fn confirm(&self, by: Instant) {
        if let Some(sub) = &self.subscription {
            sub.wait_confirmed(by);
        }
    }

    /// Whether the last [`wait`](Self::wait) was for a whole re-check period or more: when no
    /// announcement came in it, the next attempt is a re-check.
    pub(crate) fn waited_whole_period(&self) -> bool {
        self.whole_period
    }

    /// The wake-up count to take before an attempt and pass to [`wait`](Self::wait) after it,
    /// so that an announcement between the two is not missed.
    pub(crate) fn seen(&self) -> u64 {
        self.subscription.as_ref().map_or(0, Subscription::seen)
    }

    /// Whether a note came for the client within `within` (see
    /// [`Subscription::noted_within`]).
    pub(crate) fn noted_within(&self, within: Duration) -> bool {
        self.subscription
            .as_ref()
            .is_some_and(|s| s.noted_within(within))
    }

    /// Delivers a note popped from the client's list as an announcement's (see
    /// [`Subscription::deliver_note`]): whether it was kept (`false` without a subscription
    /// to keep it, or for a note taken out already).
    pub(crate) fn deliver_note(&self, note: &str) -> bool {
        self.subscription
            .as_ref()
            .is_some_and(|s| s.deliver_note(note))
    }

    /// Whether announcements reach this waiter now.
    pub(crate) fn is_live(&self) -> bool {
        self.subscription
            .as_ref()
            .is_some_and(Subscription::is_live)
    }

    /// For a waiter that leaves re-checks to another thread: waits for a wake-up after `seen`
    /// for at most one re-check period, locally (nothing is sent). `Some(true)` when woken,
    /// `Some(false)` when `deadline` passed, `None` when the period passed in silence.
    pub(crate) fn wait_woken(&self, seen: u64, deadline: Option<Instant>) -> Option<bool> {
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return Some(false);
        }
        let mut until = now + self.recheck;
        if let Some(d) = deadline {
            until = until.min(d);
        }
        let sub = self.subscription.as_ref()?;
        if sub.wait(seen, until) {
            return Some(true);
        }
        match deadline {
            Some(d) if Instant::now() >= d => Some(false),
            _ => None,
        }
    }

    /// Waits after an attempt that found the lock held for up to `hint`: for an announcement
    /// or a re-check period while announcements are live and the holder's release is
    /// announced, else for the next backoff delay (the holder is not a redmutex client, or
    /// announcements do not reach this waiter). Returns `false` without waiting when
    /// `deadline` has passed.
    ///
    /// A waiter whose client has `n` waiting clients named before it
    /// ([`Release::Behind`]) waits `n + 1` periods (at most [`MOST_PERIODS_BEHIND`]), past
    /// the holder's lease: a release announces its turn, the client first in line re-checks
    /// every period and at the end of the lease, and takes a lock whose holder died; the
    /// re-checks of 64 waiting processes add up to those of about 10 that re-check every
    /// period.
    pub(crate) fn wait(
        &mut self,
        seen: u64,
        hint: Duration,
        release: Release,
        deadline: Option<Instant>,
    ) -> bool {
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return false;
        }
        let hint = hint.max(Duration::from_millis(1));
        let announced = self.is_live() && release != Release::Unannounced;
        let mut delay = match release {
            _ if !announced => self.backoff.next_delay().min(hint),
            Release::Behind(ahead) if ahead > 0 => self
                .recheck
                .saturating_mul(ahead.saturating_add(1).min(MOST_PERIODS_BEHIND)),
            _ => self.recheck.min(hint),
        };
        if let Some(deadline) = deadline {
            delay = delay.min(deadline - now);
        }
        self.whole_period = announced && delay >= self.recheck;
        match &self.subscription {
            Some(sub) => {
                sub.wait(seen, now + delay);
            }
            None => std::thread::sleep(delay),
        }
        true
    }
}
