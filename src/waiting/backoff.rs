//! Delays between acquire attempts: exponential with full jitter, capped.

use std::time::Duration;

/// The delays of one contended acquire.
///
/// The n-th delay is uniform in `[0, min(cap, base * 2^n)]` ("full jitter"), which spreads
/// waiters of one lock over time instead of letting them retry in step.
#[derive(Debug, Clone)]
pub(crate) struct Backoff {
    base: Duration,
    cap: Duration,
    step: u32,
}

impl Backoff {
    pub(crate) fn new(base: Duration, cap: Duration) -> Self {
        Backoff { base, cap, step: 0 }
    }

    /// The ceiling of the next delay, before jitter.
    pub(crate) fn ceiling(&self) -> Duration {
        let factor = 1u32.checked_shl(self.step.min(31)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The next delay, from `base` now (a base that follows what is waited for: the time a
    /// try took); each call doubles the ceiling until it reaches the cap. Used by the
    /// optimistic updates of `Shared<T>` (the `serde` feature).
    #[cfg_attr(not(feature = "serde"), allow(dead_code))]
    pub(crate) fn next_delay_from(&mut self, base: Duration) -> Duration {
        self.base = base;
        self.next_delay()
    }

    /// The next delay; each call doubles the ceiling until it reaches the cap.
    pub(crate) fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling();
        self.step = self.step.saturating_add(1);
        let nanos = u64::try_from(ceiling.as_nanos()).unwrap_or(u64::MAX);
        Duration::from_nanos(fastrand::u64(0..=nanos))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceilings_double_up_to_the_cap() {
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_millis(70));
        let mut ceilings = Vec::new();
        for _ in 0..5 {
            ceilings.push(b.ceiling().as_millis());
            b.next_delay();
        }
        assert_eq!(ceilings, [10, 20, 40, 70, 70]);
    }

    #[test]
    fn delays_stay_under_the_ceiling() {
        let mut b = Backoff::new(Duration::from_millis(1), Duration::from_millis(50));
        for _ in 0..1000 {
            let ceiling = b.ceiling();
            assert!(b.next_delay() <= ceiling);
        }
    }

    #[test]
    fn a_base_given_per_delay_doubles_with_the_steps() {
        let mut b = Backoff::new(Duration::from_millis(10), Duration::from_millis(50));
        assert!(b.next_delay_from(Duration::from_micros(100)) <= Duration::from_micros(100));
        assert!(b.next_delay_from(Duration::from_micros(100)) <= Duration::from_micros(200));
        assert_eq!(b.ceiling(), Duration::from_micros(400));
        b.next_delay_from(Duration::from_millis(40));
        assert_eq!(b.ceiling(), Duration::from_millis(50));
    }

    #[test]
    fn many_steps_do_not_overflow() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(30));
        for _ in 0..200 {
            b.next_delay();
        }
        assert_eq!(b.ceiling(), Duration::from_secs(30));
    }
}
