//! `Election`: one leader among many processes. A candidate campaigns by taking a `Mutex`
//! (the lock `election:<name>`), so the leader has what every holder has (a renewed lease, a
//! fencing token as its term, a loss signal, acknowledged writes under Sentinel and Cluster);
//! while it holds the lock it keeps a record of who leads beside it, and every change of the
//! record goes to a log that observers read when the election's channel announces it. Scripts
//! are in `election/`.

mod leadership;
mod observer;

use std::fmt;
use std::sync::{Arc, LazyLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redis::Script;

pub use leadership::Leadership;
pub use observer::{LeaderEvent, Observer};

use crate::connection::ScriptCall;
use crate::error::{Doing, Error, ErrorKind, Result};
use crate::keys::{suffix, LockKeys};
use crate::lease::scripts::{compose, ANNOUNCE};
use crate::lease::LockContext;
use crate::primitives::{Mutex, MutexGuard};

/// The longest value a leader may announce, in bytes.
pub const MAX_LEADER_VALUE: usize = 64 * 1024;

/// What the lock of election `N` is called: `election:N`.
const LOCK_PREFIX: &str = "election:";

/// Writes (or removes) the leader's record and logs the change: see `election/write.lua`.
static WRITE: LazyLock<Script> =
    LazyLock::new(|| compose(&[ANNOUNCE, include_str!("election/write.lua")]));

/// Reads who leads, or the log's changes: see `election/read.lua`.
static READ: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("election/read.lua")));

crate::lease::scripts::listed! {
    "election/write" => WRITE, "election/read" => READ,
}

/// An election among every process that uses the same Redis and name: at most one of them
/// leads at a time, each new leader with a larger term.
///
/// Get one with [`Client::election`](crate::Client::election). A candidate
/// [`campaign`](Election::campaign)s with the value it announces while it leads (its address,
/// say), and gets a [`Leadership`] when it leads; anyone asks who leads with
/// [`leader`](Election::leader), or follows every change with [`observe`](Election::observe).
/// [`run_while_leader`](Election::run_while_leader) is the common case in one call.
///
/// The election is a [`Mutex`] named `election:<name>` (do not lock that mutex yourself): a
/// leader holds it with a lease that the client's renewal thread renews, its term is the
/// hold's fencing token, and a leader that dies is replaced when its lease runs out (the
/// client's [default lease](crate::Builder::default_lease), or the election's own:
/// [`with_lease`](Election::with_lease), a shorter one for a faster failover). A leader that
/// resigns, or drops its `Leadership`, hands over at once: the release names a waiting
/// candidate.
///
/// # Examples
///
/// ```no_run
/// # fn main() -> redmutex::Result<()> {
/// let client = redmutex::Client::open("redis://127.0.0.1/")?;
/// let election = client.election("scheduler");
/// let leadership = election.campaign("10.0.0.7:8080")?;
/// println!("leading with term {}", leadership.term());
/// while !leadership.is_lost() {
///     // ... one step of the leader's job, fenced with `leadership.term()` ...
/// #   break;
/// }
/// leadership.resign()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Election {
    lock: Mutex,
    name: Arc<str>,
}

/// One entry of an election's log: its id, and its fields.
type Change = (String, Vec<(String, String)>);

/// Where an election's log is read from at first.
const LOG_START: &str = "0-0";

/// Who leads, with which change of its term gave the value (0: the election; 1, 2, …: each
/// proclamation), which orders the changes of one term.
#[derive(Clone)]
struct Led {
    leader: Leader,
    n: u64,
}

/// Who leads an election, as [`Election::leader`] and [`Observer`] tell it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// The leader's term: the fencing token of its hold, larger than every earlier leader's.
    pub term: u64,
    /// What the leader announces (see [`Election::campaign`], [`Leadership::proclaim`]).
    pub value: String,
    /// When the term began, by the Redis server's clock.
    pub since: SystemTime,
    /// The id of the leading client, as [`Client::lock_info`](crate::Client::lock_info)
    /// names holders.
    pub client_id: String,
}

impl Election {
    pub(crate) fn new(ctx: Arc<LockContext>, name: &str) -> Election {
        Election {
            lock: Mutex::new(ctx, &format!("{LOCK_PREFIX}{name}")),
            name: Arc::from(name),
        }
    }

    /// This election, whose leaders hold a lease of `lease` (renewed while they lead) in
    /// place of the client's [default lease](crate::Builder::default_lease): a leader that
    /// dies is replaced within `lease`, while the client's other locks keep theirs. See
    /// [`Mutex::with_lease`].
    ///
    /// A lease of zero, under 1 ms or over [`MAX_LEASE`](crate::MAX_LEASE) is reported by the
    /// first campaign as an [`ErrorKind::InvalidArgument`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// use std::time::Duration;
    ///
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let election = client.election("scheduler").with_lease(Duration::from_secs(3));
    /// let leadership = election.campaign("10.0.0.7:8080")?; // replaced within 3 s if it dies
    /// # drop(leadership);
    /// # Ok(()) }
    /// ```
    pub fn with_lease(mut self, lease: Duration) -> Self {
        self.lock = self.lock.with_lease(lease);
        self
    }

    /// The election's name, as given to [`Client::election`](crate::Client::election).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Blocks until this process leads, then announces `value` and returns the
    /// [`Leadership`]. A thread that leads already through this client leads again at once
    /// (re-entry), with the same term.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`] for an empty name or a value over
    /// [`MAX_LEADER_VALUE`] bytes; the errors of [`Mutex::lock`];
    /// [`ErrorKind::LockLost`] when the lease was lost before the value was announced.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let leadership = client.election("compactor").campaign("worker-3")?;
    /// assert_eq!(leadership.value(), "worker-3");
    /// # Ok(()) }
    /// ```
    pub fn campaign(&self, value: impl Into<String>) -> Result<Leadership> {
        let led = self.campaign_with(value.into(), |lock| lock.lock().map(Some))?;
        led.ok_or_else(|| Error::new(ErrorKind::Connection, "the campaign ended unled"))
    }

    /// Leads if nobody does now (one attempt, no wait), announcing `value`.
    ///
    /// # Errors
    ///
    /// As for [`campaign`](Election::campaign).
    pub fn try_campaign(&self, value: impl Into<String>) -> Result<Option<Leadership>> {
        self.campaign_with(value.into(), Mutex::try_lock)
    }

    /// Campaigns for at most `timeout`; `None` when another process led all that time.
    ///
    /// # Errors
    ///
    /// As for [`campaign`](Election::campaign).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// use std::time::Duration;
    ///
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let election = client.election("scheduler");
    /// match election.campaign_for(Duration::from_secs(5), "standby-2")? {
    ///     Some(leadership) => println!("leading, term {}", leadership.term()),
    ///     None => println!("another process leads"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn campaign_for(
        &self,
        timeout: Duration,
        value: impl Into<String>,
    ) -> Result<Option<Leadership>> {
        match Instant::now().checked_add(timeout) {
            Some(deadline) => self.campaign_until(deadline, value),
            None => self.campaign(value).map(Some),
        }
    }

    /// Campaigns until `deadline`; `None` when another process led until then.
    ///
    /// # Errors
    ///
    /// As for [`campaign`](Election::campaign).
    pub fn campaign_until(
        &self,
        deadline: Instant,
        value: impl Into<String>,
    ) -> Result<Option<Leadership>> {
        self.campaign_with(value.into(), |lock| lock.try_lock_until(deadline))
    }

    /// Checks the name and `value`, takes the lock with `take`, and announces `value`.
    fn campaign_with(
        &self,
        value: String,
        take: impl FnOnce(&Mutex) -> Result<Option<MutexGuard>>,
    ) -> Result<Option<Leadership>> {
        self.keys()?;
        let value = checked(value)?;
        match take(&self.lock)? {
            Some(guard) => Leadership::begin(guard, Arc::clone(&self.name), value).map(Some),
            None => Ok(None),
        }
    }

    /// Who leads now, in one round trip; `None` when nobody does (or a new leader has not
    /// announced itself yet). A leader whose lease ran out does not count, even before anyone
    /// took its place.
    ///
    /// # Errors
    ///
    /// [`ErrorKind::InvalidArgument`] for an empty name; connection and timeout errors.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// match client.election("scheduler").leader()? {
    ///     Some(leader) => println!("{} leads (term {})", leader.value, leader.term),
    ///     None => println!("nobody leads"),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn leader(&self) -> Result<Option<Leader>> {
        Ok(self.read_leader()?.0.map(|led| led.leader))
    }

    /// Follows the election: every change of leader and of the value it announces, in order,
    /// without polling (see [`Observer`]). The first event tells who leads now, if anyone does.
    ///
    /// # Errors
    ///
    /// As for [`leader`](Election::leader).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// use std::time::Duration;
    /// use redmutex::LeaderEvent;
    ///
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let mut changes = client.election("scheduler").observe()?;
    /// while let Some(event) = changes.recv_timeout(Duration::from_secs(30))? {
    ///     match event {
    ///         LeaderEvent::Elected(leader) => println!("new leader at {}", leader.value),
    ///         LeaderEvent::Proclaimed(leader) => println!("leader now at {}", leader.value),
    ///         LeaderEvent::Vacant { term } => println!("the leader of term {term} is gone"),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    pub fn observe(&self) -> Result<Observer> {
        let (leader, last_ids) = self.read_leader()?;
        Ok(Observer::new(self.clone(), leader, last_ids))
    }

    /// Campaigns, runs `work` while leading, and resigns when it returns: its result. When
    /// the leadership was lost by then (its lease ran out: the process was stalled, or cut
    /// off from Redis), `work`'s result is dropped and the process campaigns again, and runs
    /// `work` again once it leads. Long work should check
    /// [`Leadership::is_lost`] and return early.
    ///
    /// When the client is [shut down](crate::Client::shutdown) (from another thread, on a
    /// termination signal say), the leader resigns at once and the leadership reads as lost:
    /// `work` returns at its next check, and this returns [`ErrorKind::Shutdown`].
    ///
    /// # Errors
    ///
    /// As for [`campaign`](Election::campaign) ([`ErrorKind::Shutdown`] once the client is
    /// shut down), and the resignation's errors.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn main() -> redmutex::Result<()> {
    /// let client = redmutex::Client::open("redis://127.0.0.1/")?;
    /// let done = client.election("nightly-report").run_while_leader("host-a", |leadership| {
    ///     // ... the job, fenced with leadership.term() ...
    ///     !leadership.is_lost()
    /// })?;
    /// # let _ = done;
    /// # Ok(()) }
    /// ```
    pub fn run_while_leader<R>(
        &self,
        value: impl Into<String>,
        mut work: impl FnMut(&Leadership) -> R,
    ) -> Result<R> {
        let value = checked(value.into())?;
        loop {
            let leadership = self.campaign(value.clone())?;
            let result = work(&leadership);
            if leadership.is_lost() {
                continue;
            }
            leadership.resign()?;
            return Ok(result);
        }
    }

    /// The lock's keys, or why the name is invalid (an empty one, or one too long).
    fn keys(&self) -> Result<&Arc<LockKeys>> {
        if self.name.is_empty() {
            return Err(Error::invalid_argument(
                "an election's name must not be empty",
            ));
        }
        self.lock.raw().keys()
    }

    fn ctx(&self) -> &Arc<LockContext> {
        &self.lock.raw().ctx
    }

    /// Runs `read.lua` for `what` on every copy of the election (one server, or each
    /// instance of a Redlock), with `arg(i)` for copy `i`: the replies, `None` for a copy that
    /// did not answer.
    fn read<'a>(
        &self,
        what: &str,
        arg: impl Fn(usize) -> &'a str,
        doing: &'static str,
    ) -> Result<Vec<Option<redis::Value>>> {
        let keys = self.keys()?;
        self.ctx().ensure_open()?;
        let (copies, _) = self.ctx().lessor.copies();
        let calls: Vec<ScriptCall> = (0..copies)
            .map(|i| {
                ScriptCall::new(&READ)
                    .key(&keys.lock)
                    .key(keys.beside(suffix::LEADER))
                    .key(keys.beside(suffix::LEADER_LOG))
                    .arg(what)
                    .arg(arg(i))
            })
            .collect();
        self.ctx()
            .lessor
            .read_each(&keys.lock, &calls, Doing::lock(doing, self.lock.name()))
    }

    /// Who leads now (as enough copies agree: on a Redlock, a majority of the instances name
    /// the term), and where each copy's log ends.
    fn read_leader(&self) -> Result<(Option<Led>, Vec<String>)> {
        let replies = self.read("leader", |_| "", "reading the leader of")?;
        let (_, needed) = self.ctx().lessor.copies();
        let mut named: Vec<Led> = Vec::new();
        let mut last_ids = Vec::with_capacity(replies.len());
        for reply in replies {
            let Some(reply) = reply else {
                // Read from the start: what was reported already is passed over.
                last_ids.push(LOG_START.to_owned());
                continue;
            };
            let (led, last_id) = parse_leader(reply)?;
            named.extend(led);
            last_ids.push(last_id);
        }
        let leader = named
            .iter()
            .filter(|led| {
                named
                    .iter()
                    .filter(|o| o.leader.term == led.leader.term)
                    .count()
                    >= needed
            })
            .max_by_key(|led| (led.leader.term, led.n))
            .cloned();
        Ok((leader, last_ids))
    }

    /// Each copy's changes after its `last_ids[i]`, oldest first (`None`: it did not answer).
    fn changes(&self, last_ids: &[String]) -> Result<Vec<Option<Vec<Change>>>> {
        let arg = |i: usize| last_ids.get(i).map_or(LOG_START, String::as_str);
        self.read("changes", arg, "reading the changes of")?
            .into_iter()
            .map(|reply| {
                reply
                    .map(|r| {
                        redis::from_redis_value(r).map_err(|e| {
                            Error::new(ErrorKind::Decode, format!("an election's log: {e}"))
                        })
                    })
                    .transpose()
            })
            .collect()
    }

    /// The election's channel, on which every change is announced.
    fn channel(&self) -> Result<Arc<str>> {
        Ok(Arc::from(self.keys()?.beside(suffix::LEADER_CHANNEL)))
    }
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// One copy's reply to `read.lua`'s `leader`: who it names, and where its log ends.
fn parse_leader(reply: redis::Value) -> Result<(Option<Led>, String)> {
    type Reply = (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
        String,
        Option<String>,
    );
    let (term, since, client_id, value, last_id, n): Reply = redis::from_redis_value(reply)
        .map_err(|e| Error::new(ErrorKind::Decode, format!("a leader record: {e}")))?;
    let led = match (term, since, client_id, value) {
        (Some(term), Some(since), Some(client_id), Some(value)) => Some(Led {
            leader: Leader {
                term: parse_number(&term)?,
                since: UNIX_EPOCH + Duration::from_millis(parse_number(&since)?),
                client_id,
                value,
            },
            n: n.as_deref().map_or(Ok(0), parse_number)?,
        }),
        _ => None,
    };
    Ok((led, last_id))
}

/// `value`, when a leader may announce it.
fn checked(value: String) -> Result<String> {
    match value.len() {
        0..=MAX_LEADER_VALUE => Ok(value),
        n => Err(Error::invalid_argument(format!(
            "a leader's value is at most {MAX_LEADER_VALUE} bytes, not {n}"
        ))),
    }
}

fn parse_number(text: &str) -> Result<u64> {
    text.parse()
        .map_err(|_| Error::new(ErrorKind::Decode, format!("{text:?} is not a number")))
}
