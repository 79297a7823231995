//! The subscribers a lease stack's waiters listen with: its client's own, or one per instance
//! of a quorum, where an announcement from any instance wakes a waiter and a subscription is
//! live while a majority of its instances' are.

use std::sync::Arc;

use super::{Notes, Signal, Subscriber, Subscription};

/// Which messages of a channel wake a waiter: all, or those equal to this (see
/// [`Subscriber::subscribe`]); and where the notes that come with them are kept.
type Filter = (Option<Arc<str>>, Notes);

/// One subscriber, or those of a quorum's instances.
pub(crate) struct Subscribers {
    members: Vec<Subscriber>,
    /// How many members' subscriptions must be live for a subscription to be.
    needed: usize,
    /// The members belong to this stack, which stops them (a quorum's belong to its
    /// instances' clients).
    own: bool,
}

impl Subscribers {
    /// A client's own subscriber.
    pub(crate) fn own(subscriber: Subscriber) -> Self {
        Subscribers {
            members: vec![subscriber],
            needed: 1,
            own: true,
        }
    }

    /// The subscribers of a quorum's instances (each instance client's own), of which
    /// `needed` must listen.
    pub(crate) fn of_quorum<'a>(
        instances: impl Iterator<Item = &'a Subscribers>,
        needed: usize,
    ) -> Self {
        Subscribers {
            members: instances.flat_map(|s| s.members.iter().cloned()).collect(),
            needed,
            own: false,
        }
    }

    /// Interest in `channel` on every member (see [`Subscriber::subscribe`]), one signal for
    /// all.
    pub(crate) fn subscribe(&self, channel: &Arc<str>, filter: Filter) -> Option<Subscription> {
        self.join(false, |m, signal| {
            m.subscribe(channel, filter.clone(), signal)
        })
    }

    /// Interest in `channel` only where it is live already, and only if it is on as many
    /// members as a subscription needs (see [`Subscriber::subscribe_if_live`]).
    pub(crate) fn subscribe_if_live(&self, ch: &Arc<str>, filter: Filter) -> Option<Subscription> {
        self.join(true, |m, signal| {
            m.subscribe_if_live(ch, filter.clone(), signal)
        })
    }

    /// One subscription of what `each` member gives, sharing one signal; with `only_live`,
    /// none unless as many members gave one as a subscription needs.
    fn join(
        &self,
        only_live: bool,
        each: impl Fn(&Subscriber, Arc<Signal>) -> Option<Subscription>,
    ) -> Option<Subscription> {
        let signal: Arc<Signal> = Arc::default();
        if let [one] = self.members.as_slice() {
            return each(one, signal);
        }
        let parts: Vec<Subscription> = self
            .members
            .iter()
            .filter_map(|m| each(m, Arc::clone(&signal)))
            .collect();
        if only_live && parts.len() < self.needed {
            return None;
        }
        Subscription::joined(parts, self.needed)
    }

    /// The client withdrew from the waiting clients of the lock whose wake channel for it is
    /// `channel` (see [`Subscriber::withdrew`]).
    pub(crate) fn withdrew(&self, channel: &str) {
        for member in &self.members {
            member.withdrew(channel);
        }
    }

    /// Messages received and reconnections so far, over every member.
    pub(crate) fn counters(&self) -> (u64, u64) {
        self.members.iter().fold((0, 0), |(m, r), s| {
            let (messages, reconnects) = s.counters();
            (m + messages, r + reconnects)
        })
    }

    /// Stops the subscriber threads, when they are this stack's own.
    pub(crate) fn shutdown(&self, wait: bool) {
        if self.own {
            for member in &self.members {
                member.shutdown(wait);
            }
        }
    }
}
