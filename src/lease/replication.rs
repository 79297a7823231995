//! What replicas must acknowledge before a lease counts: how many a write that sets a lease
//! waits for on one server (Redis `WAIT`, sent in the write's round trip), and how much of
//! the lease the client then counts. A holder counts its lease only from the last write
//! that reached them, so that when its master is cut off with it and a replica is promoted,
//! the lease it counts ends before the promoted copy of the lock expires.

use std::time::Duration;

use crate::config::ReplicaAcks;
use crate::connection::Conn;

/// Which write of a lease asks the replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LeaseWrite {
    /// An acquire (the lock is new on this server), or any write that hands out fencing
    /// tokens (a pass between the threads of a client reserves a block of them).
    Acquire,
    /// A renewal or a change of a lease that an acquire set.
    Renewal,
}

/// How many replicas a write of a lease on `c`'s server must reach, and how long it waits
/// for them; `None` when none need to (the client asks none, or none there).
///
/// Chosen by the user: the replicas asked for, or fewer when the deployment says fewer can
/// be promoted (the sentinels count one down; a Cluster's map names fewer for the master) —
/// then also every replica attached to the master now (`ROLE`, one more command only in
/// that case), so that a replica back from the dead is asked before the deployment counts
/// it again. A renewal asks at most the replicas attached now, and at least one where the
/// deployment names one (`ROLE`, one command per server and renewal period): a failover
/// promotes the replica furthest along, which holds every write that any replica
/// acknowledged, and a master promoted a moment ago still waits for its other replicas to
/// follow it; a renewal that waited for them would let the lease run out through a
/// failover that kept the lock.
///
/// The default: one where the deployment names a replica it can promote, none where it
/// names none, and one while it has not said (no majority of the sentinels answered yet),
/// with no command of its own.
pub(crate) fn replicas_to_ask(
    acks: Option<ReplicaAcks>,
    write: LeaseWrite,
    c: &mut Conn,
) -> redis::RedisResult<Option<(u32, Duration)>> {
    let Some(acks) = acks else {
        return Ok(None);
    };
    let promotable = c.features().promotable_replicas();
    // `ROLE` at most once per call, only when a rule below needs it.
    let mut now_attached: Option<u32> = None;
    let mut attached_now = |c: &mut Conn| -> redis::RedisResult<u32> {
        if let Some(n) = now_attached {
            return Ok(n);
        }
        let n = attached(c, acks.replicas)?;
        now_attached = Some(n);
        Ok(n)
    };
    let asked = match (acks.chosen, promotable) {
        // Not known yet (no majority of sentinels answered): one, to be safe.
        (false, promotable) => acks.replicas.min(promotable.unwrap_or(1)),
        (true, Some(promotable)) if promotable < acks.replicas => {
            acks.replicas.min(promotable.max(attached_now(c)?))
        }
        (true, _) => acks.replicas,
    };
    let asked = match (acks.chosen, write) {
        (true, LeaseWrite::Renewal) if asked > 1 => asked.min(attached_now(c)?.max(1)),
        _ => asked,
    };
    Ok((asked > 0).then_some((asked, acks.timeout)))
}

/// How many replicas the master on `c` has attached now (`ROLE`); `otherwise` when it does
/// not say.
fn attached(c: &mut Conn, otherwise: u32) -> redis::RedisResult<u32> {
    let role: Vec<redis::Value> = redis::cmd("ROLE").query(c)?;
    Ok(match role.get(2) {
        Some(redis::Value::Array(replicas)) => u32::try_from(replicas.len()).unwrap_or(u32::MAX),
        _ => otherwise,
    })
}

/// The part of a lease the client counts from the send of a write that set it: all of it,
/// or less the clock-drift allowance when replicas acknowledge lease writes (a promoted
/// replica expires its copy by its own clock).
pub(crate) fn counted(acks: Option<ReplicaAcks>, lease: Duration) -> Duration {
    match acks {
        Some(_) => ReplicaAcks::counted(lease),
        None => lease,
    }
}

/// Whether too few replicas acknowledged (`acks`: how many did, of how many had to).
pub(crate) fn too_few((got, asked): (i64, u32)) -> bool {
    got < i64::from(asked)
}

/// The error of a write that too few replicas acknowledged (`got` of `asked`, when `acks`
/// wanted more): `what` says which write, and what became of it ("the acquire …; it was
/// rolled back").
pub(crate) fn not_replicated(
    acks: Option<ReplicaAcks>,
    (got, asked): (i64, u32),
    what: &str,
) -> crate::error::Error {
    let wanted = acks.map_or(0, |a| a.replicas);
    let of = match asked < wanted {
        true => format!(
            "{asked} replicas (of the {wanted} asked for, those the deployment can promote \
             or that are attached)"
        ),
        false => format!("the {wanted} replicas asked for"),
    };
    crate::error::Error::new(
        crate::error::ErrorKind::NotReplicated,
        format!("{got} of {of} acknowledged {what} in time"),
    )
}
