//! `Observer`: every change of an election's leader, in order, without polling.

use std::collections::VecDeque;
use std::fmt;
use std::time::{Duration, Instant, UNIX_EPOCH};

use super::{parse_number, Election, Leader, Led};
use crate::error::Result;
use crate::waiting::{Notes, Subscription};

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
///
/// Over a [`Redlock`](crate::Redlock), each instance keeps a copy of the log: the observer
/// reads every copy, and tells each change once, in the order of terms (and of the changes
/// within a term), whichever copy had it first.
pub struct Observer {
    election: Election,
    subscription: Option<Subscription>,
    /// The id of the last change read from each copy of the log.
    last_ids: Vec<String>,
    /// The place of the last change told: its term, and which change of the term it was.
    told: Place,
    /// Who leads, as far as the events told so far say.
    leader: Option<Leader>,
    pending: VecDeque<LeaderEvent>,
    recheck: Duration,
}

impl Observer {
    pub(super) fn new(election: Election, led: Option<Led>, last_ids: Vec<String>) -> Observer {
        let ctx = election.ctx();
        let recheck = ctx.config.renewal_interval;
        let subscription = election
            .channel()
            .ok()
            .and_then(|channel| ctx.subscriber.subscribe(&channel, (None, Notes::Waiter)));
        let mut pending = VecDeque::new();
        if let Some(led) = &led {
            pending.push_back(LeaderEvent::Elected(led.leader.clone()));
        }
        let told = led.as_ref().map_or((0, 0), |led| (led.leader.term, led.n));
        let leader = led.map(|led| led.leader);
        Observer {
            election,
            subscription,
            last_ids,
            told,
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

    /// Reads the log's changes after the last one read from each copy into `pending`: those
    /// after the last one told, in order, each once.
    fn read_changes(&mut self) -> Result<()> {
        let mut changes: Vec<(Place, LeaderEvent)> = Vec::new();
        for (copy, read) in self
            .election
            .changes(&self.last_ids)?
            .into_iter()
            .enumerate()
        {
            for (id, fields) in read.unwrap_or_default() {
                changes.extend(parse_change(&fields)?);
                if let Some(last_id) = self.last_ids.get_mut(copy) {
                    *last_id = id;
                }
            }
        }
        changes.sort_by_key(|(place, _)| *place);
        changes.dedup_by_key(|(place, _)| *place);
        for (place, event) in changes {
            self.record(place, event);
        }
        Ok(())
    }

    /// Tells a vacancy when the leader that the events told of no longer counts (its lease
    /// ran out with nobody in its place, or a new leader has not logged its term yet).
    fn check_vacancy(&mut self) -> Result<()> {
        let Some(term) = self.leader.as_ref().map(|l| l.term) else {
            return Ok(());
        };
        let (now, _) = self.election.read_leader()?;
        if now.is_none_or(|led| led.leader.term != term) {
            // A new leader's change is in the log: read it in order, after the vacancy.
            self.record((term, VACANT), LeaderEvent::Vacant { term });
        }
        Ok(())
    }

    /// Tells `event`, at `place`, when it comes after the last change told.
    fn record(&mut self, place: Place, event: LeaderEvent) {
        if place <= self.told {
            return;
        }
        self.told = place;
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

/// Where a change stands among an election's: its term, then which change of the term it is
/// (0 the election, 1, 2, … each proclamation, [`VACANT`] the end).
type Place = (u64, u64);

/// The place of a term's end among its changes: after every other.
const VACANT: u64 = u64::MAX;

/// A logged change's place and event; `None` for an entry that is not one.
fn parse_change(fields: &[(String, String)]) -> Result<Option<(Place, LeaderEvent)>> {
    let field = |name: &str| {
        fields
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    };
    let Some(term) = field("term") else {
        return Ok(None);
    };
    let term = parse_number(term)?;
    let n = field("n").map_or(Ok(0), parse_number)?;
    let leader = |value: &str| -> Result<Leader> {
        Ok(Leader {
            term,
            value: value.to_owned(),
            since: UNIX_EPOCH + Duration::from_millis(parse_number(field("since").unwrap_or("0"))?),
            client_id: field("client").unwrap_or_default().to_owned(),
        })
    };
    Ok(match (field("event"), field("value")) {
        (Some("elected"), Some(value)) => Some(((term, 0), LeaderEvent::Elected(leader(value)?))),
        (Some("proclaimed"), Some(value)) => {
            Some(((term, n.max(1)), LeaderEvent::Proclaimed(leader(value)?)))
        }
        (Some("vacant"), _) => Some(((term, VACANT), LeaderEvent::Vacant { term })),
        _ => None,
    })
}

impl fmt::Debug for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observer")
            .field("election", &self.election.name())
            .field("leader", &self.leader)
            .finish_non_exhaustive()
    }
}
