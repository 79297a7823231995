//! Taking a free lock without a script: `SET lock token NX PX lease GET` and `INCR` of the
//! lock's fencing counter, pipelined in one round trip. On Redis 7.0 a script call costs
//! several times the server time of the two plain commands it would run (its set-up, and the
//! translation of each `redis.call` and its reply), and under load that time is the lock's
//! throughput; the protocol's acquire script still settles every case the two cannot, on the
//! same connection: a lock held by someone else when the caller waits (the script registers
//! it among the waiting), a lock that holds this very token (an attempt sent again after its
//! reply was lost), a key of the wrong type, a fencing counter that is not an integer or has
//! not started from the server's clock yet (`lua/fence.lua`).
//!
//! The `INCR` runs whether or not the `SET` took the lock: an attempt that finds the lock held
//! counts on the fencing counter too. Tokens still only grow, and each holder's is above
//! every earlier holder's: its `INCR` runs after its `SET` took the lock and before its
//! release can be sent, and the two go out in one write, which Redis reads and runs in order
//! before it serves another client (were they ever read apart, a lease would have to run out
//! between them for a later holder to come between, and the guard, whose lease counts from
//! the send, would be lost when returned). The counter may run ahead of the latest holder's
//! token.
//!
//! A counter that is missing (the name's first use, or Redis lost its data) must start from
//! the server's clock, which only the script can do; an attempt that finds it so costs a
//! second round trip. So the plain commands are sent only for a lock whose counter this
//! client saw started ([`SeededCounters`]): the first take of a name by a client is one script
//! call, as before, and a name taken once per process (a job's id) never costs two.
//!
//! A fair lock's queue comes first: for a `FairMutex` the same pipeline reads the head of the
//! queue after the `SET`, and a lock the `SET` took while someone queued (the holder's lease
//! ran out, or a waiter's claim did) is handed to the queue's head at once with the release
//! script, as if released on the spot; the attempt then goes on as one that found the lock
//! held. Waiters keep their order.
//!
//! A value kept under the lock (a `Shared<T>`'s) comes with it: the same pipeline reads the
//! value after the `SET` (`Protocol::plain_payload`). Once the `SET` took the lock no
//! holder's write lands, each being checked against the lock's token, so what it reads is the
//! latest; a read that fails (a key of the wrong type) gives the lock back at once, and the
//! script tells the error.
//!
//! Redis before 7.0 refuses `NX` with `GET` (`ERR syntax error`): the first plain take on a
//! server sends the `SET` without the `INCR` (a probe that counts nothing on the counter), and
//! its reply tells the server apart ([`ServerFeatures`](crate::connection::ServerFeatures)).
//! That attempt is settled by the script; later ones send both commands where the server took
//! the `SET`, and go to the script at once where it refused it.

use std::cell::Cell;
use std::hash::Hasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use redis::{ConnectionLike, Value};

use crate::connection::{each_reply, millis, Conn, Packed, ScriptCall, ServerFeatures, SetNxGet};
use crate::fast_hash::FxHasher;
use crate::keys::LockKeys;
use crate::lease::reply::AcquireReply;

/// The lowest fencing token a counter started from the server's clock gives (2^40; see
/// `lua/fence.lua`): below it, the acquire script starts the counter.
const SEEDED_FENCE: i64 = 1 << 40;

/// The fencing counters this client saw started from the server's clock (a token it took
/// from one was at least [`SEEDED_FENCE`]), by their key: a table of 4,096 hashes in buckets
/// of four, written and read without a lock. A counter goes to an
/// empty place of its bucket, or over a random one when the bucket is full: a name that
/// another evicted, or that never fit, is taken with the script. A table with one place per
/// hash sent about a tenth of the takes of 1,000 names to the script, as two names whose hashes
/// met evicted each other at every take; buckets of four keep some thousands of names
/// without an eviction. Only a hint: a counter it names that Redis lost since costs one round
/// trip more, and is started again by the script.
pub(crate) struct SeededCounters {
    slots: Box<[AtomicU64]>,
}

const SLOTS: usize = 4096;
const WAYS: usize = 4;

impl SeededCounters {
    pub(crate) fn new() -> Self {
        SeededCounters {
            slots: (0..SLOTS).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The counter's hash (never 0, the empty place) and its bucket.
    fn bucket(&self, counter: &str) -> (u64, &[AtomicU64]) {
        let mut hasher = FxHasher::default();
        hasher.write(counter.as_bytes());
        let hash = hasher.finish() | 1;
        // The high bits: the Fx hash mixes them best.
        let first = (hash >> 52) as usize % (SLOTS / WAYS) * WAYS;
        (hash, &self.slots[first..first + WAYS])
    }

    pub(crate) fn contains(&self, counter: &str) -> bool {
        let (hash, bucket) = self.bucket(counter);
        Self::holds(bucket, hash)
    }

    fn holds(bucket: &[AtomicU64], hash: u64) -> bool {
        bucket.iter().any(|s| s.load(Ordering::Relaxed) == hash)
    }

    /// Notes that a token taken from `counter` was `fencing_token`.
    pub(crate) fn saw(&self, counter: &str, fencing_token: u64) {
        let (hash, bucket) = self.bucket(counter);
        if fencing_token < SEEDED_FENCE as u64 || Self::holds(bucket, hash) {
            return;
        }
        let empty = bucket.iter().find(|slot| {
            slot.compare_exchange(0, hash, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        });
        if empty.is_none() {
            bucket[fastrand::usize(..WAYS)].store(hash, Ordering::Relaxed);
        }
    }
}

/// What an attempt's plain commands do beside taking the lock.
pub(crate) struct Beside<'a> {
    /// Whether the caller waits when the lock is held (only the script registers a waiter).
    /// For a caller that does not, the `SET`'s reply (another token) settles a held lock in
    /// the one round trip, without the time left: such a first attempt's caller gives up, or
    /// listens for the release and attempts again with the script, which reads it.
    pub(crate) waits: bool,
    /// A fair lock's queue, whose waiters come before a lock taken here.
    pub(crate) queue: Option<&'a str>,
    /// The key of a value kept under the lock (a shared value), read after the `SET`: a
    /// lock taken comes with it, as the acquire script's reply does.
    pub(crate) payload: Option<&'a str>,
    /// How many replicas must acknowledge the writes, and how long they are waited for:
    /// `WAIT` goes in the same round trip.
    pub(crate) replicas: Option<(u32, Duration)>,
}

/// What the plain commands settled.
enum Plain {
    /// The reply, as the acquire script would have given it.
    Settled(AcquireReply),
    /// The lock holds the token, without a fencing token yet: the script finishes the take.
    Ours,
    /// The lock holds the token, but is given back at once: waiters queue for it (it goes
    /// to them), or the value kept under it could not be read; the script then settles the
    /// attempt.
    GiveBack,
    /// Only the script can tell; `held`: the `SET` found another client's token there.
    Unsettled { held: bool },
}

/// The reply to an attempt, with how many replicas acknowledged its writes when some were
/// asked to (`WAIT`).
pub(crate) type Acknowledged = (AcquireReply, Option<i64>);

/// One acquire attempt: the plain commands, then `script` (which sends the protocol's acquire
/// script on the connection given, and `WAIT` when replicas are asked) when they did not
/// settle it. When the plain `SET` took the lock but the script then did not (Redis ran out
/// of memory between the two), `release` gives the lock back before the reply is returned.
/// `took` is set when the plain `SET` took the lock and the script was sent to finish the
/// take: if an error is returned then, the lock may hold the token. `held` is set when the
/// `SET` found the lock held by another client.
///
/// `beside`: what the plain commands also do.
pub(crate) fn acquire(
    c: &mut Conn,
    (keys, token, lease_ms): (&LockKeys, &str, u64),
    beside: &Beside<'_>,
    (script, release): (
        impl Fn(&mut Conn) -> redis::RedisResult<Acknowledged>,
        impl FnOnce() -> ScriptCall,
    ),
    took: &Cell<bool>,
    held: &Cell<bool>,
) -> redis::RedisResult<Acknowledged> {
    // Until the server is known to take `SET … NX … GET`, the `SET` goes alone (a probe):
    // a server that refuses it (Redis 6.2) then counts nothing on the fencing counter, and
    // one that takes it leaves the counter to the script this once.
    let probing = match c.features().set_nx_get() {
        SetNxGet::Refused => return script(c),
        SetNxGet::Untried => true,
        SetNxGet::Taken => false,
    };
    let lock = (keys, token, lease_ms);
    match plain(c, lock, beside, probing)? {
        (Plain::Settled(reply), acks) => Ok((reply, acks)),
        (Plain::Unsettled { held: found }, _) => {
            held.set(found);
            script(c)
        }
        (Plain::GiveBack, _) => {
            took.set(true);
            release().invoke::<i64>(c)?;
            took.set(false);
            script(c)
        }
        (Plain::Ours, _) => {
            took.set(true);
            let (reply, acks) = script(c)?;
            if reply.taken != 1 {
                release().invoke::<i64>(c)?;
            }
            Ok((reply, acks))
        }
    }
}

/// The plain commands of an attempt whose replies are read later (a Redlock's, written to
/// every instance before any reply is read): `SET … NX PX … GET` and, on a server known to
/// take that form, `INCR` of the fencing counter; the packed pipeline and how many commands
/// it holds. `None` on a server that refuses the form. On a server not tried yet the `SET`
/// goes alone (a probe: [`saw`] records what its reply tells).
pub(crate) fn packed(
    features: &ServerFeatures,
    (keys, token, lease_ms): (&LockKeys, &str, u64),
) -> Option<(Vec<u8>, usize)> {
    let probing = match features.set_nx_get() {
        SetNxGet::Refused => return None,
        SetNxGet::Untried => true,
        SetNxGet::Taken => false,
    };
    let packed = take_commands((keys, token, lease_ms), probing);
    let commands = packed.len();
    Some((packed.into_bytes(), commands))
}

/// `SET lock token NX PX lease GET` and, unless `probing`, `INCR` of the fencing counter.
fn take_commands((keys, token, lease_ms): (&LockKeys, &str, u64), probing: bool) -> Packed {
    // Room for the commands that go with these (a `Shared<T>`'s `GET`, a fair lock's
    // `LINDEX`, a `WAIT`): growing the buffer would copy it.
    let mut packed = Packed::with_capacity(512);
    packed
        .command(7)
        .bulk(b"SET")
        .bulk(keys.lock.as_bytes())
        .bulk(token.as_bytes())
        .bulk(b"NX")
        .bulk(b"PX")
        .number(lease_ms)
        .bulk(b"GET");
    if !probing {
        packed.command_of(&[b"INCR", keys.fence.as_bytes()]);
    }
    packed
}

/// Records what the replies to [`packed`]'s commands tell of the server.
pub(crate) fn saw(features: &ServerFeatures, replies: &[Value]) {
    if let [set] = replies {
        features.saw_set_nx_get(&Ok(set.clone()));
    }
}

/// The fencing token of a lock that [`packed`]'s commands took, from their replies, when the
/// counter had started from the server's clock; `None` when only the acquire script can tell
/// (the lock was held, the counter had not started, a command was refused).
pub(crate) fn taken(replies: &[Value]) -> Option<u64> {
    match replies {
        [Value::Nil, Value::Int(fence)] if *fence >= SEEDED_FENCE => u64::try_from(*fence).ok(),
        _ => None,
    }
}

/// The plain commands' outcome, and the replicas that acknowledged their writes (when asked).
fn plain(
    c: &mut Conn,
    (keys, token, lease_ms): (&LockKeys, &str, u64),
    beside: &Beside<'_>,
    probing: bool,
) -> redis::RedisResult<(Plain, Option<i64>)> {
    let mut packed = take_commands((keys, token, lease_ms), probing);
    if let Some(key) = beside.payload {
        packed.command_of(&[b"GET", key.as_bytes()]);
    }
    if let Some(queue) = beside.queue {
        packed.command_of(&[b"LINDEX", queue.as_bytes(), b"0"]);
    }
    if let Some((replicas, timeout)) = beside.replicas {
        packed
            .command(3)
            .bulk(b"WAIT")
            .number(u64::from(replicas))
            .number(millis(timeout));
    }
    // Each reply on its own: an error reply (a key of the wrong type, a server that refuses
    // the `SET`'s form) leaves the attempt to the script.
    let replies = c.req_packed_commands(packed.as_bytes(), 0, packed.len())?;
    let mut replies = each_reply(replies);
    let acks = match beside.replicas {
        Some(_) => match replies.pop() {
            Some(Ok(Value::Int(acks))) => Some(acks),
            // No count: as if none acknowledged.
            _ => Some(0),
        },
        None => None,
    };
    let mut replies = replies.into_iter();
    let set = replies.next();
    if let (true, Some(set)) = (probing, &set) {
        c.features().saw_set_nx_get(set);
    }
    let fence = match probing {
        true => None,
        false => replies.next(),
    };
    // The value (`Err` when its read failed: the script tells).
    let payload = match beside.payload {
        None => Ok(None),
        Some(_) => payload(replies.next()),
    };
    // Whether someone queues (an error reply: the script tells).
    let queued = match beside.queue.map(|_| replies.next()) {
        None | Some(Some(Ok(Value::Nil))) => false,
        Some(_) => true,
    };
    let plain = match (set, fence) {
        (Some(Ok(Value::Nil)), _) if queued => Plain::GiveBack,
        (Some(Ok(Value::Nil)), Some(Ok(Value::Int(fence)))) if fence >= SEEDED_FENCE => {
            match payload {
                Ok(payload) => Plain::Settled(AcquireReply {
                    payload,
                    ..AcquireReply::taken(fence)
                }),
                Err(()) => Plain::GiveBack,
            }
        }
        (Some(Ok(Value::Nil)), _) => Plain::Ours,
        (Some(Ok(Value::BulkString(holder))), _) if holder.as_slice() != token.as_bytes() => {
            match beside.waits {
                false => Plain::Settled(AcquireReply::held_time_unread(lease_ms)),
                true => Plain::Unsettled {
                    held: !same_client(&holder, token),
                },
            }
        }
        _ => Plain::Unsettled { held: false },
    };
    Ok((plain, acks))
}

/// Whether `holder` is a token of the client whose token is `token` (the client id and a
/// colon start both): a sibling thread's hold, which says nothing of other clients.
fn same_client(holder: &[u8], token: &str) -> bool {
    token
        .find(':')
        .is_some_and(|end| holder.starts_with(&token.as_bytes()[..=end]))
}

/// A value kept under a lock from the reply of its `GET` (`None` when there is none); `Err`
/// when the `GET` failed (a key of the wrong type), which the script reports.
fn payload(value: Option<redis::RedisResult<Value>>) -> Result<Option<Vec<u8>>, ()> {
    match value {
        Some(Ok(Value::Nil)) => Ok(None),
        Some(Ok(Value::BulkString(bytes))) => Ok(Some(bytes)),
        _ => Err(()),
    }
}

#[cfg(test)]
mod tests {
    use super::{same_client, SeededCounters, SEEDED_FENCE};

    #[test]
    fn a_sibling_threads_token_is_of_the_same_client() {
        let token = "0123abcd:7-2";
        assert!(same_client(b"0123abcd:9-1", token));
        assert!(same_client(b"0123abcd:h:1099511627777", token));
        assert!(!same_client(b"4567ef01:7-2", token));
        assert!(!same_client(b"0123abc", token));
        assert!(!same_client(b"a bare token", token));
    }

    #[test]
    fn a_thousand_counters_seen_are_all_kept() {
        let seeded = SeededCounters::new();
        let names: Vec<String> = (0..1000).map(|i| format!("fence:{{name:{i}}}")).collect();
        for name in &names {
            seeded.saw(name, SEEDED_FENCE as u64 + 1);
        }
        let kept = names.iter().filter(|n| seeded.contains(n)).count();
        // Buckets of four hold 1,000 hashes spread over 1,024 buckets with hardly an eviction
        // (a table with one place per hash kept 943 of these).
        assert!(kept >= 995, "kept {kept} of 1000");
    }

    #[test]
    fn a_counter_not_started_from_the_clock_is_not_kept() {
        let seeded = SeededCounters::new();
        seeded.saw("fence:{a}", 7);
        assert!(!seeded.contains("fence:{a}"));
        seeded.saw("fence:{a}", SEEDED_FENCE as u64);
        assert!(seeded.contains("fence:{a}"));
        assert!(!seeded.contains("fence:{b}"));
    }
}
