//! `Observer`: every change of an election's leader, in order, without polling.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant, UNIX_EPOCH};

use super::{parse_number, Election, Leader};
use crate::error::Result;
use crate::waiting::Subscription;

/// A change of an election's leader.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaderEvent {
    /// A new leader, with a larger term than every earlier one.
    Elected(Leader),
    /// The leader announced another value, in the same term.
    Proclaimed(Leader),
    /// The leader of `term` resigned, or its lease ran out with nobody in its place yet.
    Vacant {
        /// The term that ended.
        term: u64,
    },
}

/// Follows an election (from [`Election::observe`]): [`recv_timeout`](Observer::recv_timeout)
/// returns its changes one by one, in the order they happened.
///
/// Every change is written to the election's log in Redis (its last 100 changes) and
/// announced on the election's channel; the observer reads the log when an announcement
/// comes, so an announcement lost on the way (the subscriber reconnected) loses no change:
/// the next read finds it. It also reads the log now and then (once per renewal interval)
/// in case every announcement went astray, and then checks that the leader still counts, which
/// is how it sees a leader whose lease ran out ([`LeaderEvent::Vacant`]). An observer more than
/// 100 changes behind skips to the oldest one kept.
pub struct Observer {
    election: Election,
    subscription: Option<Subscription>,
    /// The id of the last change read from the log.
    last_id: String,
    /// Who leads, as far as the events told so far say.
    leader: Option<Leader>,
    pending: VecDeque<LeaderEvent>,
    recheck: Duration,
}

impl Observer {
    pub(super) fn new(election: Election, leader: Option<Leader>, last_id: String) -> Observer {
        let ctx = election.ctx();
        let recheck = ctx.config.renewal_interval;
        let subscription = election
            .channel()
            .ok()
            .and_then(|channel| ctx.subscriber.subscribe(&channel, None));
        let mut pending = VecDeque::new();
        if let Some(leader) = &leader {
            pending.push_back(LeaderEvent::Elected(leader.clone()));
        }
        Observer {
            election,
            subscription,
            last_id,
            leader,
            pending,
            recheck,
        }
    }

    /// The next change, waiting for it at most `timeout`; `None` when none came.
    ///
    /// # Errors
    ///
    /// Connection and timeout errors of the reads (the observer can go on after them).
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Option<LeaderEvent>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(event) = self.pending.pop_front() {
                return Ok(Some(event));
            }
            let seen = self.subscription.as_ref().map(Subscription::seen);
            self.read_changes()?;
            if !self.pending.is_empty() {
                continue;
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            let until = deadline.min(now + self.recheck);
            let woken = match (&self.subscription, seen) {
                (Some(sub), Some(seen)) if sub.is_live() => sub.wait(seen, until),
                _ => {
                    std::thread::sleep(until - now);
                    false
                }
            };
            if !woken {
                self.check_vacancy()?;
            }
        }
    }

    /// Who leads, as far as the changes returned so far tell.
    pub fn leader(&self) -> Option<&Leader> {
        self.leader.as_ref()
    }

    /// Reads the log's changes after the last one read into `pending`.
    fn read_changes(&mut self) -> Result<()> {
        for (id, fields) in self.election.changes(&self.last_id)? {
            self.last_id = id;
            let field = |name: &str| {
                fields
                    .iter()
                    .find(|(k, _)| k == name)
                    .map(|(_, v)| v.as_str())
            };
            let term = match field("term") {
                Some(term) => parse_number(term)?,
                None => continue,
            };
            let leader = |value: &str| -> Result<Leader> {
                Ok(Leader {
                    term,
                    value: value.to_owned(),
                    since: UNIX_EPOCH
                        + Duration::from_millis(parse_number(field("since").unwrap_or("0"))?),
                    client_id: field("client").unwrap_or_default().to_owned(),
                })
            };
            let event = match (field("event"), field("value")) {
                (Some("elected"), Some(value)) => LeaderEvent::Elected(leader(value)?),
                (Some("proclaimed"), Some(value)) => LeaderEvent::Proclaimed(leader(value)?),
                (Some("vacant"), _) => LeaderEvent::Vacant { term },
                _ => continue,
            };
            self.record(event);
        }
        Ok(())
    }

    /// A leader whose lease ran out leaves no change in the log: seen by reading who leads.
    fn check_vacancy(&mut self) -> Result<()> {
        let Some(term) = self.leader.as_ref().map(|l| l.term) else {
            return Ok(());
        };
        let (now, _) = self.election.read_leader()?;
        if now.is_none_or(|l| l.term != term) {
            // A new leader's change is in the log: read it in order, after the vacancy.
            self.record(LeaderEvent::Vacant { term });
        }
        Ok(())
    }

    /// Queues `event`, unless it tells nothing new (a vacancy seen by reading, and then
    /// logged by the resignation that caused it).
    fn record(&mut self, event: LeaderEvent) {
        match &event {
            LeaderEvent::Elected(l) | LeaderEvent::Proclaimed(l) => {
                self.leader = Some(l.clone());
            }
            LeaderEvent::Vacant { term } => {
                if self.leader.as_ref().is_none_or(|l| l.term != *term) {
                    return;
                }
                self.leader = None;
            }
        }
        self.pending.push_back(event);
    }
}

impl fmt::Debug for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observer")
            .field("election", &self.election.name())
            .field("leader", &self.leader)
            .finish_non_exhaustive()
    }
}
