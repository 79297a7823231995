//! The checker: reads the history the resource recorded and counts what happened and what
//! went wrong.
//!
//! A hold spans from its `B` event to its last `W` or `E` event, in the resource's order. Two
//! holds overlap when their spans interleave: the resource saw two holders at once.
//!
//! In a run on a `Shared<u64>`, a hold also records the value it read (`V`), and writes one
//! more with its release; the driver records the value left at the end (`Z`). A release that
//! succeeded held the lock throughout, so the reads of those holds form a chain: each reads
//! what the one before wrote, plus at most one for each hold in between whose release had an
//! unknown outcome. Only a lost master (a restart, a failover, a partition's failover) may
//! break the chain.

use std::collections::{BTreeMap, HashMap, HashSet};

/// One hold, as the resource saw it.
struct Hold {
    token: u64,
    begin: usize,
    last: usize,
    rejected: bool,
    lost: bool,
    /// What `unlock()` said: `ok`, `lost`, an error kind, or `None` when the process died.
    unlock: Option<String>,
    /// The shared value read with the lock, and where the `V` event is.
    read: Option<(usize, u64)>,
}

impl Hold {
    /// Whether the holder learnt that it might not hold the lock any more.
    fn detected(&self) -> bool {
        self.lost || self.rejected || self.unlock.as_deref().is_some_and(|u| u != "ok")
    }

    fn clean(&self) -> bool {
        !self.lost && !self.rejected && self.unlock.as_deref() == Some("ok")
    }
}

/// What the checker found in one history.
#[derive(Debug, Default)]
pub struct Findings {
    pub acquisitions: u64,
    pub writes_accepted: u64,
    /// Writes the resource refused because a higher token had been accepted before.
    pub stale_writes_rejected: u64,
    /// Accepted writes with a token below one accepted earlier (or equal, from another hold).
    pub accepted_out_of_order: u64,
    /// Acquires that returned a token another acquire had already returned.
    pub duplicate_tokens: u64,
    /// Pairs of holds whose spans interleave.
    pub overlapping_pairs: u64,
    /// Holds that overlapped a hold with a higher token: holders that went on after their
    /// lease was gone.
    pub stale_holds: u64,
    /// Stale holds whose holder learnt of it (lost lease, rejected write or failed unlock).
    pub stale_holds_detected: u64,
    /// Holds that ended without a lost or rejected signal but with a token not above every
    /// hold that had ended before they began.
    pub fence_order_violations: u64,
    /// Holds whose holder saw `is_lost()` before a write.
    pub lost_before_write: u64,
    /// Holds whose `unlock()` returned `LockLost`.
    pub unlock_lost: u64,
    /// Holds whose `unlock()` failed otherwise, by error kind.
    pub unlock_errors: BTreeMap<String, u64>,
    /// Failed acquires, by error kind.
    pub acquire_errors: BTreeMap<String, u64>,
    /// Faults injected, by kind.
    pub faults: BTreeMap<String, u64>,
    /// Acquisitions after the quiet window began, by process index.
    pub quiet_acquisitions: HashMap<usize, u64>,
    /// Threads that reported they were done, by process index.
    pub threads_done: HashMap<usize, u64>,
    /// Lines that could not be read.
    pub malformed: Vec<String>,
    /// Shared-value runs: holds that read the value.
    pub value_reads: u64,
    /// Shared-value runs: holds whose release (and so their update) certainly went through.
    pub value_updates: u64,
    /// Shared-value reads off the chain after a lost master: explained by the fault.
    pub value_resets_explained: u64,
    /// Shared-value reads (or the final value) off the chain with no fault to explain them:
    /// an update lost or applied twice.
    pub value_chain_breaks: u64,
    /// The first few breaks, for people.
    pub value_chain_examples: Vec<String>,
}

fn process_of(worker: &str) -> Option<usize> {
    worker.split('.').next()?.parse().ok()
}

/// Reads a history and checks it.
pub fn check(lines: &[String]) -> Findings {
    let mut f = Findings::default();
    let mut holds: Vec<Hold> = Vec::new();
    let mut by_key: HashMap<(u64, String), usize> = HashMap::new();
    let mut tokens: HashSet<u64> = HashSet::new();
    // The highest accepted token and the hold that wrote it.
    let mut max_accepted: Option<(u64, usize)> = None;
    let mut quiet_from: Option<usize> = None;

    for (i, line) in lines.iter().enumerate() {
        let fields: Vec<&str> = line.split(' ').collect();
        let token = fields.get(1).and_then(|t| t.parse::<u64>().ok());
        let key = |t: u64| (t, fields.get(2).copied().unwrap_or_default().to_owned());
        match (fields[0], token) {
            ("B", Some(t)) if fields.len() == 4 => {
                f.acquisitions += 1;
                if !tokens.insert(t) {
                    f.duplicate_tokens += 1;
                }
                by_key.insert(key(t), holds.len());
                holds.push(Hold {
                    token: t,
                    begin: i,
                    last: i,
                    rejected: false,
                    lost: false,
                    unlock: None,
                    read: None,
                });
                if let (Some(q), Some(p)) = (quiet_from, process_of(fields[2])) {
                    if i > q {
                        *f.quiet_acquisitions.entry(p).or_default() += 1;
                    }
                }
            }
            ("W", Some(t)) if fields.len() == 4 => {
                let Some(&h) = by_key.get(&key(t)) else {
                    f.malformed.push(line.clone());
                    continue;
                };
                holds[h].last = i;
                if fields[3] == "1" {
                    f.writes_accepted += 1;
                    let in_order = match max_accepted {
                        None => true,
                        Some((max, writer)) => t > max || (t == max && writer == h),
                    };
                    if in_order {
                        max_accepted = Some((t, h));
                    } else {
                        f.accepted_out_of_order += 1;
                    }
                } else {
                    f.stale_writes_rejected += 1;
                    holds[h].rejected = true;
                }
            }
            ("E", Some(t)) if fields.len() == 3 => match by_key.get(&key(t)) {
                Some(&h) => holds[h].last = i,
                None => f.malformed.push(line.clone()),
            },
            ("R", Some(t)) if fields.len() == 5 => {
                let Some(&h) = by_key.get(&key(t)) else {
                    f.malformed.push(line.clone());
                    continue;
                };
                holds[h].lost = fields[3] == "1";
                holds[h].unlock = Some(fields[4].to_owned());
                f.lost_before_write += u64::from(holds[h].lost);
                match fields[4] {
                    "ok" => {}
                    "lost" => f.unlock_lost += 1,
                    other => *f.unlock_errors.entry(other.to_owned()).or_default() += 1,
                }
            }
            ("V", Some(t)) if fields.len() == 4 => {
                match (by_key.get(&key(t)), fields[3].parse::<u64>()) {
                    (Some(&h), Ok(value)) => holds[h].read = Some((i, value)),
                    _ => f.malformed.push(line.clone()),
                }
            }
            ("Z", _) if fields.len() == 2 && fields[1].parse::<u64>().is_ok() => {}
            ("A", _) if fields.len() == 3 => {
                *f.acquire_errors.entry(fields[2].to_owned()).or_default() += 1;
            }
            ("D", _) if fields.len() == 3 => {
                if let Some(p) = process_of(fields[1]) {
                    *f.threads_done.entry(p).or_default() += 1;
                }
            }
            ("F", _) if fields.len() >= 3 => {
                if fields[1] == "start" {
                    *f.faults.entry(fields[2].to_owned()).or_default() += 1;
                }
            }
            ("Q", _) => quiet_from = Some(i),
            _ => f.malformed.push(line.clone()),
        }
    }

    check_overlaps(&holds, &mut f);
    check_fence_order(&holds, &mut f);
    check_value_chain(lines, &holds, &mut f);
    f
}

/// What became of a shared-value hold's update.
#[derive(Clone, Copy, PartialEq)]
enum Update {
    Applied,
    NotApplied,
    Unknown,
}

/// The chain of a shared value's reads (see the module's documentation).
fn check_value_chain(lines: &[String], holds: &[Hold], f: &mut Findings) {
    // The events that matter, in the resource's order: reads, lost masters, the end.
    enum Event {
        Read(u64, Update),
        LoseMaster { start: bool },
        Final(u64),
    }
    let mut events: Vec<(usize, Event)> = Vec::new();
    for hold in holds {
        if let Some((at, value)) = hold.read {
            let update = match hold.unlock.as_deref() {
                Some("ok") => Update::Applied,
                Some("lost") => Update::NotApplied,
                _ => Update::Unknown,
            };
            events.push((at, Event::Read(value, update)));
        }
    }
    for (i, line) in lines.iter().enumerate() {
        let fields: Vec<&str> = line.split(' ').collect();
        match fields.as_slice() {
            ["F", edge @ ("start" | "end"), "lose-master" | "partition", ..] => {
                events.push((
                    i,
                    Event::LoseMaster {
                        start: *edge == "start",
                    },
                ));
            }
            ["Z", value] => {
                if let Ok(v) = value.parse() {
                    events.push((i, Event::Final(v)));
                }
            }
            _ => {}
        }
    }
    if events.is_empty() {
        return;
    }
    events.sort_by_key(|(at, _)| *at);
    // What the last certain update wrote (the value starts absent: 0), how many updates of
    // unknown outcome came after it, and whether a master was lost since.
    let (mut last, mut unknown, mut reset, mut losing) = (0u64, 0u64, false, false);
    // Whether `value` is on the chain; off it, it is explained by a lost master or a break.
    let on_chain =
        |value: u64, at: usize, f: &mut Findings, (last, unknown, reset): (u64, u64, bool)| {
            if value >= last && value <= last + unknown {
                return;
            }
            if reset {
                f.value_resets_explained += 1;
            } else {
                f.value_chain_breaks += 1;
                if f.value_chain_examples.len() < 5 {
                    f.value_chain_examples.push(format!(
                        "line {at}: read {value}, expected {last}..={}",
                        last + unknown
                    ));
                }
            }
        };
    for (at, event) in events {
        match event {
            Event::LoseMaster { start } => {
                losing = start;
                reset = true;
            }
            Event::Read(value, update) => {
                f.value_reads += 1;
                match update {
                    Update::Applied => {
                        f.value_updates += 1;
                        on_chain(value, at, f, (last, unknown, reset));
                        (last, unknown) = (value + 1, 0);
                        reset = losing;
                    }
                    Update::Unknown => unknown += 1,
                    Update::NotApplied => {}
                }
            }
            Event::Final(value) => on_chain(value, at, f, (last, unknown, reset)),
        }
    }
}

/// Every pair of interleaving spans; the hold with the lower token of a pair is stale, and
/// its holder must have learnt of it.
fn check_overlaps(holds: &[Hold], f: &mut Findings) {
    let mut stale: HashSet<usize> = HashSet::new();
    // Holds are in order of their begin; keep those whose span reaches past the next begin.
    let mut open: Vec<usize> = Vec::new();
    for (b, hold) in holds.iter().enumerate() {
        open.retain(|&a| holds[a].last > hold.begin);
        for &a in &open {
            f.overlapping_pairs += 1;
            stale.insert(if holds[a].token < hold.token { a } else { b });
        }
        open.push(b);
    }
    f.stale_holds = stale.len() as u64;
    f.stale_holds_detected = stale.iter().filter(|&&h| holds[h].detected()).count() as u64;
}

/// A clean hold's token must be above the token of every hold that ended before it began.
fn check_fence_order(holds: &[Hold], f: &mut Findings) {
    let mut ends: Vec<(usize, u64)> = holds.iter().map(|h| (h.last, h.token)).collect();
    ends.sort_unstable();
    let mut ended = 0;
    let mut max_ended = 0u64;
    for hold in holds {
        while ended < ends.len() && ends[ended].0 < hold.begin {
            max_ended = max_ended.max(ends[ended].1);
            ended += 1;
        }
        if hold.clean() && hold.token <= max_ended {
            f.fence_order_violations += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(|l| l.trim().to_owned()).collect()
    }

    #[test]
    fn a_detected_overlap_and_a_rejected_stale_write() {
        let f = check(&lines(
            "B 5 0.0 1
             W 5 0.0 1
             B 6 1.0 2
             W 6 1.0 1
             W 5 0.0 0
             E 5 0.0
             R 5 0.0 0 lost
             E 6 1.0
             R 6 1.0 0 ok",
        ));
        assert_eq!(f.acquisitions, 2);
        assert_eq!(f.overlapping_pairs, 1);
        assert_eq!(f.stale_holds, 1);
        assert_eq!(f.stale_holds_detected, 1);
        assert_eq!(f.stale_writes_rejected, 1);
        assert_eq!(f.accepted_out_of_order, 0);
        assert_eq!(f.fence_order_violations, 0);
    }

    #[test]
    fn a_shared_values_chain_with_an_unknown_update_and_a_lost_master() {
        let f = check(&lines(
            "B 1 0.0 1
             V 1 0.0 0
             E 1 0.0
             R 1 0.0 0 ok
             B 2 1.0 2
             V 2 1.0 1
             E 2 1.0
             R 2 1.0 0 Timeout
             B 3 0.1 1
             V 3 0.1 2
             E 3 0.1
             R 3 0.1 0 ok
             F start lose-master master
             F end lose-master master
             B 4 1.1 2
             V 4 1.1 0
             E 4 1.1
             R 4 1.1 0 ok
             Z 1",
        ));
        assert_eq!(f.value_reads, 4);
        assert_eq!(f.value_updates, 3);
        assert_eq!(f.value_resets_explained, 1);
        assert_eq!(f.value_chain_breaks, 0);
    }

    #[test]
    fn a_partitions_failover_explains_a_reset_but_its_other_marks_do_not_end_it() {
        let f = check(&lines(
            "B 1 0.0 1
             V 1 0.0 0
             E 1 0.0
             R 1 0.0 0 ok
             F start partition
             F cut partition 0
             F promoted partition 10.60.0.11:6379
             B 2 1.0 2
             V 2 1.0 0
             E 2 1.0
             R 2 1.0 0 ok
             F heal partition 0
             F end partition
             B 3 1.1 2
             V 3 1.1 1
             E 3 1.1
             R 3 1.1 0 ok
             B 4 0.1 1
             V 4 0.1 7
             E 4 0.1
             R 4 0.1 0 ok",
        ));
        assert_eq!(f.faults.get("partition"), Some(&1));
        assert!(f.malformed.is_empty(), "{:?}", f.malformed);
        assert_eq!(f.value_resets_explained, 1);
        assert_eq!(f.value_chain_breaks, 1, "{:?}", f.value_chain_examples);
    }

    #[test]
    fn an_update_lost_or_applied_twice_breaks_the_chain() {
        let f = check(&lines(
            "B 1 0.0 1
             V 1 0.0 0
             E 1 0.0
             R 1 0.0 0 ok
             B 2 1.0 2
             V 2 1.0 0
             E 2 1.0
             R 2 1.0 0 ok
             Z 3",
        ));
        assert_eq!(f.value_chain_breaks, 2, "{:?}", f.value_chain_examples);
    }

    #[test]
    fn an_undetected_overlap_and_a_token_going_back_are_found() {
        let f = check(&lines(
            "B 7 0.0 1
             B 6 1.0 2
             W 7 0.0 1
             W 6 1.0 1
             E 7 0.0
             R 7 0.0 0 ok
             E 6 1.0
             R 6 1.0 0 ok
             B 3 2.0 3
             E 3 2.0
             R 3 2.0 0 ok",
        ));
        assert_eq!(f.stale_holds, 1);
        assert_eq!(f.stale_holds_detected, 0);
        assert_eq!(f.accepted_out_of_order, 1);
        assert_eq!(f.fence_order_violations, 1);
    }
}
