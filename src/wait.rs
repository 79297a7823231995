//! The pause between two acquire attempts of a waiter: until the release announcement wakes
//! it, or a recheck (announcements live) or backoff (not live) delay passes, never past the
//! lock's remaining lease nor the caller's deadline.

use std::time::{Duration, Instant};

use crate::backoff::Backoff;
use crate::client::Config;
use crate::notify::Subscription;

/// How often a waiter whose release announcements are live checks the lock anyway, in case
/// an announcement went astray (at least the backoff cap).
const NOTIFIED_RECHECK: Duration = Duration::from_secs(2);

pub(crate) struct Pause {
    subscription: Option<Subscription>,
    backoff: Backoff,
    recheck: Duration,
}

impl Pause {
    pub(crate) fn new(subscription: Option<Subscription>, config: &Config) -> Self {
        Pause {
            subscription,
            backoff: Backoff::new(config.backoff_base, config.backoff_cap),
            recheck: config.backoff_cap.max(NOTIFIED_RECHECK),
        }
    }

    /// Waits for the subscription to be confirmed by Redis, at most until `by`.
    pub(crate) fn confirm(&self, by: Instant) {
        if let Some(sub) = &self.subscription {
            sub.wait_confirmed(by);
        }
    }

    /// The wake-up count to take before an attempt and pass to [`wait`](Self::wait) after it,
    /// so that an announcement between the two is not missed.
    pub(crate) fn seen(&self) -> u64 {
        self.subscription.as_ref().map_or(0, Subscription::seen)
    }

    /// Waits after an attempt that found the lock held for up to `hint`. Returns `false`
    /// without waiting when `deadline` has passed.
    pub(crate) fn wait(&mut self, seen: u64, hint: Duration, deadline: Option<Instant>) -> bool {
        let now = Instant::now();
        if deadline.is_some_and(|d| now >= d) {
            return false;
        }
        let live = self
            .subscription
            .as_ref()
            .is_some_and(Subscription::is_live);
        let step = if live {
            self.recheck
        } else {
            self.backoff.next_delay()
        };
        let mut delay = step.min(hint.max(Duration::from_millis(1)));
        if let Some(deadline) = deadline {
            delay = delay.min(deadline - now);
        }
        match &self.subscription {
            Some(sub) => {
                sub.wait(seen, now + delay);
            }
            None => std::thread::sleep(delay),
        }
        true
    }
}
