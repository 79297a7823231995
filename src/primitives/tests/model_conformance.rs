//! The hand-off model (`tests/wait_model/model.rs`, checked for every interleaving there)
//! held to the scripts: random traces of the model run against a real Redis, each of the
//! model's Redis steps as the real script with the arguments the client gives it, and after
//! every step the keys Redis holds are compared with the ones the model predicts: the lock's
//! token, the fencing counter, the waiting clients with their scores, how many releases named
//! a client, and that every key left behind expires. A script that does what the model does
//! not know fails here; so does a model step that no script does.

#[allow(dead_code)]
#[path = "../../../tests/wait_model/model.rs"]
mod model;

use std::collections::BTreeMap;
use std::sync::LazyLock;

use self::model::{Action, Fix, Handoff, Place, State, Thread, Token, CLAIM, OWED};
use super::{announcements, eval, mutex_script, random_trace, start};
use crate::keys::LockKeys;

/// The lock's keys, as a `Mutex` named `c` has them.
static KEYS: LazyLock<LockKeys> = LazyLock::new(|| LockKeys::new("m", "c").unwrap());
/// Long enough that nothing expires during a trace.
const LEASE_MS: u64 = 600_000;

/// How many random traces, and the configuration they run: three clients (of two threads,
/// two and one), three acquisitions each.
const TRACES: u64 = 150;

/// A model client's id as the scripts read it: 32 hex digits, in the model's order.
fn client_id(c: u8) -> String {
    format!("{c:032x}")
}

/// A model client's list of notes (`mutex/waiters.lua`).
fn notes_key(c: u8) -> String {
    format!("{}:{}", KEYS.waiting.as_str(), client_id(c))
}

/// The record of a pop waiting on client `c`'s list (`mutex/acquire.lua`).
fn pop_record(c: u8) -> String {
    format!("{}:pop", notes_key(c))
}

/// The keys of an acquire and a pass: lock, fencing counter, waiting clients.
fn keys() -> [&'static str; 3] {
    [&KEYS.lock, &KEYS.fence, &KEYS.waiting]
}

/// A model token as the lock key holds it: a thread's token, or the claim of a lock a release
/// handed to a client (`<client>:h:<fencing token>`, `mutex/waiters.lua`).
fn token_text((c, t, left): Token, offset: Offset) -> String {
    match t {
        CLAIM => format!("{}:h:{}", client_id(c), offset.real(i64::from(left))),
        _ => format!("{}:{t}-{left}", client_id(c)),
    }
}

/// The arguments that a release which hands the lock over adds (`mutex/waiters.lua`): the
/// claim, long enough that nothing expires during a trace; none before `Fix::HandedOver`.
fn claim_args(model: &Handoff) -> Vec<String> {
    match model.fix >= Fix::HandedOver {
        true => vec![LEASE_MS.to_string()],
        false => Vec::new(),
    }
}

/// The fencing counter starts at the server's clock (`lease/lua/fence.lua`), the model's at
/// zero: counts and scores are compared past the offset the first take shows.
#[derive(Clone, Copy, Default)]
struct Offset(Option<i64>);

impl Offset {
    /// The model's count or score as Redis holds it (an owed score, or a score taken before
    /// the counter existed, as it is).
    fn real(self, model: i64) -> i64 {
        match self.0 {
            Some(offset) if model > 0 => model + offset,
            _ => model,
        }
    }
}

/// What each kind of step did over all traces, so that the test knows it covered them.
#[derive(Default, Debug)]
struct Covered {
    taken: u32,
    taken_with_more: u32,
    held: u32,
    placed_own: u32,
    short: u32,
    owed: u32,
    turns_taken: u32,
    turns_expired: u32,
    /// Attempts that found the lock handed to their own client (held by it, to them).
    claims_held: u32,
    /// Releases of a lock taken by the note of a claim.
    claims_released: u32,
    /// Attempts whose client waits to be named, which leave no mark.
    unmarked: u32,
    /// First attempts with a pop behind them (from `Fix::PoppedNote`), those whose pop took
    /// a note waiting in the list at once, releases that left their note to a pop, and
    /// notes a leader's own pop took.
    pops: u32,
    popped_at_once: u32,
    left_to_pops: u32,
    drained: u32,
    passed: u32,
    released: [u32; 3],
    named: u32,
    withdrawn: u32,
}

/// Runs the Redis step of `action` (the model went from `before` to `after`) as the real
/// script, and checks its reply against the model's.
fn run_step(
    conn: &mut redis::Connection,
    model: &Handoff,
    (before, after): (&State, &State),
    action: Action,
    (offset, covered): (&mut Offset, &mut Covered),
) {
    match action {
        Action::RunAttempt(c, t) => {
            run_attempt(conn, model, (before, after), (c, t), (offset, covered))
        }
        Action::RunRelease(c, t) => run_release(
            conn,
            (model, model.thread(before, (c, t))),
            (before, after),
            (offset, covered),
        ),
        Action::TurnExpires => {
            // Time passes: the turn runs out in Redis.
            let _: bool = redis::cmd("PEXPIRE")
                .arg(KEYS.lock.as_str())
                .arg(1)
                .query(conn)
                .unwrap();
            let started = std::time::Instant::now();
            while redis::cmd("EXISTS")
                .arg(KEYS.lock.as_str())
                .query::<bool>(conn)
                .unwrap()
            {
                assert!(started.elapsed().as_secs() < 10, "the turn does not expire");
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            covered.turns_expired += 1;
        }
        Action::PopEnds(c, _) => {
            // Time passes: the record of the pop runs out just before the pop does.
            redis::cmd("DEL").arg(pop_record(c)).exec(conn).unwrap();
        }
        Action::RunWithdraw(c, t) => {
            let Thread::Withdrawing { token } = *model.thread(before, (c, t)) else {
                panic!("a withdrawal from {:?}", model.thread(before, (c, t)));
            };
            let keys = [
                KEYS.lock.as_str(),
                KEYS.waiting.as_str(),
                KEYS.fence.as_str(),
            ];
            let mut args = vec![token_text(token, *offset), KEYS.channel.to_string()];
            args.extend(claim_args(model));
            let gives_turn = before.redis.turn.is_none() && after.redis.turn.is_some();
            let script = mutex_script("mutex/withdraw");
            assert_eq!(release(conn, script, (&keys, &args), gives_turn), 1);
            covered.withdrawn += 1;
        }
        // The client's own steps, and a delivery: nothing in Redis changes.
        _ => {}
    }
    if model.fix >= Fix::PoppedNote {
        pop_notes(conn, (before, after), action, *offset, covered);
    }
}

/// The pops the model's step made, on the real lists: a pop that took a note (at once, or
/// one a release left to it), and a note a pop took out of the list otherwise (a leader's
/// own, or one behind a winning attempt); each note popped is the one the model says. (A
/// release's script removes a list it spends itself.)
fn pop_notes(
    conn: &mut redis::Connection,
    (before, after): (&State, &State),
    action: Action,
    offset: Offset,
    covered: &mut Covered,
) {
    let clients = before.gates.len() as u8;
    for c in 0..clients {
        let popped = match after.redis.popped.get(&c) {
            Some(&note) if !before.redis.popped.contains_key(&c) => Some(note),
            _ => None,
        };
        let gone = before.redis.notes.get(&c).copied();
        let expected = match popped {
            Some(note) => note,
            None if gone.is_some()
                && !after.redis.notes.contains_key(&c)
                && matches!(action, Action::DrainNote(_) | Action::RunAttempt(..)) =>
            {
                covered.drained += 1;
                gone
            }
            None => continue,
        };
        let note: Option<String> = redis::cmd("LPOP").arg(notes_key(c)).query(conn).unwrap();
        let fence = note
            .as_deref()
            .and_then(|n| n.split(' ').next())
            .and_then(|f| f.parse::<i64>().ok());
        let expected = expected.map(|f| offset.real(i64::from(f)));
        assert_eq!(fence, expected, "the note popped for client {c}: {note:?}");
    }
    covered.left_to_pops += u32::from(after.redis.left_to_pops > before.redis.left_to_pops);
}

/// A list for the mark an attempt leaves when its client waits for no note (`mutex/acquire.lua`,
/// its fourth key), for an attempt that has no pop behind it in the model: not the client's
/// list of notes.
const MARKS: &str = "m:{c}:marks";

/// Whether the attempt just run left its mark in `list` (see [`MARKS`]; a client's own list
/// with a pop behind the attempt), which is taken away as the pop would take it.
fn take_mark(conn: &mut redis::Connection, list: &str) -> bool {
    let removed: i64 = redis::cmd("LREM")
        .arg(list)
        .arg(0)
        .arg("")
        .query(conn)
        .unwrap();
    assert!(removed <= 1, "{removed} marks");
    removed == 1
}

/// `mutex/acquire.lua` for thread `(c, t)`'s attempt, its reply checked against the model's,
/// and its mark: left when the attempt took the lock or left the client no place, never when
/// the client waits to be named.
fn run_attempt(
    conn: &mut redis::Connection,
    model: &Handoff,
    (before, after): (&State, &State),
    (c, t): (u8, u8),
    (offset, covered): (&mut Offset, &mut Covered),
) {
    let token = Handoff::token(before, (c, t));
    let (waits, pops) = match model.thread(before, (c, t)) {
        Thread::First { pops, .. } => ("wait", *pops),
        Thread::Attempting { ask, .. } => (ask.waits(), false),
        other => panic!("an attempt from {other:?}"),
    };
    // The model's attempts take no claim (only a note does, in the client): ARGV[4] is empty.
    // With a pop behind it, the client's list and how long the pop waits (no record runs out
    // during a trace but by the model's step).
    let mut args = vec![
        token_text(token, *offset),
        LEASE_MS.to_string(),
        waits.to_owned(),
        String::new(),
    ];
    let [lock, fence, waiting] = keys();
    let notes = notes_key(c);
    let list = match pops {
        true => {
            args.push(LEASE_MS.to_string());
            covered.pops += 1;
            notes.as_str()
        }
        false => MARKS,
    };
    let with_marks = [lock, fence, waiting, list];
    let reply: Vec<Option<i64>> = eval(conn, mutex_script("mutex/acquire"), (&with_marks, &args));
    // A note waiting in the list goes to the pop at once: no mark then.
    let at_once = pops && before.redis.notes.contains_key(&c);
    covered.popped_at_once += u32::from(at_once);
    let marked = take_mark(conn, list);
    assert!(!(at_once && marked), "a mark behind a note: {reply:?}");
    match model.thread(after, (c, t)) {
        Thread::Holding { fence, .. } => {
            assert_eq!(reply[0], Some(1), "{reply:?}");
            assert!(marked || at_once, "a lock taken leaves no mark");
            let fence = i64::from(*fence);
            let taken = reply[1].expect("a fencing token");
            offset.0.get_or_insert(taken - fence);
            assert_eq!(taken, offset.real(fence), "{reply:?}");
            covered.taken += 1;
            covered.taken_with_more += u32::from(waits.starts_with("more"));
            covered.turns_taken += u32::from(before.redis.turn == Some(c));
        }
        now => check_refused(
            &reply,
            now,
            (before, after),
            c,
            (marked, at_once),
            offset,
            covered,
        ),
    }
}

/// An attempt that found the lock held (`reply`), against the model's step to `now`: its
/// mark (`at_once`: its pop took a note waiting in the list), the place and the wait it was
/// told.
fn check_refused(
    reply: &[Option<i64>],
    now: &Thread,
    (before, after): (&State, &State),
    c: u8,
    (marked, at_once): (bool, bool),
    offset: &Offset,
    covered: &mut Covered,
) {
    assert_eq!(reply[0], Some(0), "{reply:?}");
    if !after.redis.waiting.contains_key(&c) && !at_once {
        assert!(
            marked,
            "a client left without a place is not marked: {reply:?}"
        );
    }
    // A waiter told the server's clock waits for a note.
    if reply.get(2).copied().flatten().is_some() {
        assert!(!marked, "a client waiting to be named is marked: {reply:?}");
        covered.unmarked += 1;
    }
    let placed = (after.redis.counter > before.redis.counter)
        .then(|| offset.real(i64::from(after.redis.counter)));
    assert_eq!(reply.get(4).copied().flatten(), placed, "{reply:?}");
    // A short wait: the 5 ms behind the others, or what is left of a turn.
    let short = matches!(
        now,
        Thread::Sleeping { short: true, .. }
            | Thread::FirstFailed { short: true, .. }
            | Thread::Popping { short: true, .. }
    );
    let hint = reply[1].unwrap_or(0).abs();
    let told = match (short, before.redis.turn.is_some()) {
        // What is left of a turn (held on by the test: see `hold_turn`).
        (true, true) => hint > 0,
        (true, false) => (1..=20).contains(&hint),
        (false, _) => hint > 20,
    };
    assert!(told, "{now:?} told {reply:?}");
    covered.held += 1;
    covered.placed_own += u32::from(placed.is_some());
    covered.short += u32::from(short);
    covered.claims_held += u32::from(matches!(before.redis.lock, Some((h, CLAIM, _)) if h == c));
    covered.owed += u32::from(
        after.redis.waiting.get(&c) == Some(&OWED) && before.redis.waiting.get(&c) != Some(&OWED),
    );
}

/// The pass or the release that `releasing` decided, its reply checked against the model's.
fn run_release(
    conn: &mut redis::Connection,
    (model, releasing): (&Handoff, &Thread),
    (before, after): (&State, &State),
    (offset, covered): (&mut Offset, &mut Covered),
) {
    match *releasing {
        Thread::Passing { token, .. } => {
            let args = [
                token_text(token, *offset),
                1.to_string(),
                LEASE_MS.to_string(),
            ];
            let reply: Vec<i64> = eval(conn, mutex_script("mutex/pass_on"), (&keys(), &args));
            let counter = offset.real(i64::from(after.redis.counter));
            assert_eq!(reply[..2], [1, counter], "{reply:?}");
            covered.passed += 1;
        }
        Thread::Releasing {
            token,
            fence,
            place,
        } => {
            let expected = i64::from(before.redis.lock == Some(token));
            covered.claims_released += u32::from(token.1 == CLAIM);
            let token = token_text(token, *offset);
            let (script, keys, mut args) = match place {
                Place::Never => (
                    "mutex/release",
                    vec![
                        KEYS.lock.as_str(),
                        KEYS.waiting.as_str(),
                        KEYS.fence.as_str(),
                    ],
                    vec![token, KEYS.channel.to_string()],
                ),
                Place::Keep | Place::GiveUp => (
                    "mutex/release_held",
                    vec![
                        KEYS.lock.as_str(),
                        KEYS.waiting.as_str(),
                        KEYS.fence.as_str(),
                    ],
                    vec![
                        token,
                        KEYS.channel.to_string(),
                        offset.real(i64::from(fence)).to_string(),
                        if place == Place::Keep { "more" } else { "" }.into(),
                        (2 * LEASE_MS).to_string(),
                    ],
                ),
            };
            args.extend(claim_args(model));
            let gives_turn = before.redis.turn.is_none() && after.redis.turn.is_some();
            let released = release(conn, mutex_script(script), (&keys, &args), gives_turn);
            assert_eq!(released, expected, "{place:?}");
            covered.released[place as usize] += 1;
        }
        ref other => panic!("a release from {other:?}"),
    }
}

/// Runs a release (or withdrawal) script; its reply. A release that gives a client its owed turn holds it
/// for 20 ms, and the model's time passes only in its steps: then the script runs in one
/// transaction with a look at the turn's expiry and a longer one, so that the turn stays
/// until the model lets it run out (`TurnExpires`).
fn release(
    conn: &mut redis::Connection,
    script: &redis::Script,
    (keys, args): (&[&str], &[String]),
    gives_turn: bool,
) -> i64 {
    if !gives_turn {
        return eval(conn, script, (keys, args));
    }
    let _: String = script.load(conn).unwrap();
    let (released, ttl, _): (i64, i64, bool) = redis::pipe()
        .atomic()
        .cmd("EVALSHA")
        .arg(script.get_hash())
        .arg(keys.len())
        .arg(keys)
        .arg(args)
        .cmd("PTTL")
        .arg(KEYS.lock.as_str())
        .cmd("PEXPIRE")
        .arg(KEYS.lock.as_str())
        .arg(LEASE_MS)
        .query(conn)
        .unwrap();
    assert!((1..=20).contains(&ttl), "a turn held for {ttl} ms");
    released
}

/// The keys Redis holds against the model's: the lock's token, the counter, the waiting
/// clients and their scores, an expiry on every key but the counter.
fn compare_keys(conn: &mut redis::Connection, s: &State, offset: Offset, step: usize) {
    let lock: Option<String> = redis::cmd("GET")
        .arg(KEYS.lock.as_str())
        .query(conn)
        .unwrap();
    let predicted = match (s.redis.lock, s.redis.turn) {
        (Some(token), None) => Some(token_text(token, offset)),
        (None, Some(c)) => Some(format!("{}:turn", client_id(c))),
        (None, None) => None,
        both => panic!("a lock with a token and a turn: {both:?}"),
    };
    assert_eq!(lock, predicted, "the lock, step {step}");
    let counter: Option<i64> = redis::cmd("GET")
        .arg(KEYS.fence.as_str())
        .query(conn)
        .unwrap();
    assert_eq!(
        counter.unwrap_or(0),
        offset.real(i64::from(s.redis.counter)),
        "the counter, step {step}"
    );
    let waiting: Vec<(String, i64)> = redis::cmd("ZRANGE")
        .arg(KEYS.waiting.as_str())
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(conn)
        .unwrap();
    let waiting: BTreeMap<u8, i64> = waiting
        .into_iter()
        .map(|(client, score)| (u8::from_str_radix(&client, 16).unwrap(), score))
        .collect();
    let predicted: BTreeMap<u8, i64> = s
        .redis
        .waiting
        .iter()
        .map(|(&c, &score)| (c, offset.real(score)))
        .collect();
    assert_eq!(waiting, predicted, "the waiting clients, step {step}");
    for key in [KEYS.lock.as_str(), KEYS.waiting.as_str()] {
        let ttl: i64 = redis::cmd("PTTL").arg(key).query(conn).unwrap();
        assert!(ttl == -2 || ttl > 0, "{key} does not expire (step {step})");
    }
}

/// The records of waiting pops and the notes in the clients' lists against the model's.
fn compare_pops(conn: &mut redis::Connection, s: &State, offset: Offset, step: usize) {
    for c in 0..s.gates.len() as u8 {
        let recorded: bool = redis::cmd("EXISTS").arg(pop_record(c)).query(conn).unwrap();
        let popping = s.redis.popping.contains(&c);
        assert_eq!(recorded, popping, "the pop of client {c}, step {step}");
        let notes: Vec<String> = redis::cmd("LRANGE")
            .arg(notes_key(c))
            .arg(0)
            .arg(-1)
            .query(conn)
            .unwrap();
        let fences: Vec<i64> = notes
            .iter()
            .filter_map(|n| n.split(' ').next()?.parse().ok())
            .collect();
        let predicted: Vec<i64> = s
            .redis
            .notes
            .get(&c)
            .map(|&f| offset.real(i64::from(f)))
            .into_iter()
            .collect();
        assert_eq!(
            fences, predicted,
            "the notes of client {c}, step {step}: {notes:?}"
        );
    }
}

/// One random trace (`seed`) to its end, every step compared.
fn run_trace(conn: &mut redis::Connection, model: &Handoff, seed: u64, covered: &mut Covered) {
    let mut offset = Offset::default();
    random_trace(
        conn,
        (model, seed),
        |conn, (s, after), action, step| {
            let published = announcements(conn);
            run_step(conn, model, (s, after), action, (&mut offset, covered));
            let named = after.redis.in_flight.len() > s.redis.in_flight.len();
            assert_eq!(
                announcements(conn) - published,
                u64::from(named),
                "announcements after {action:?}, step {step} of trace {seed}"
            );
            covered.named += u32::from(named);
            compare_keys(conn, after, offset, step);
            if model.fix >= Fix::PoppedNote {
                compare_pops(conn, after, offset, step);
            }
        },
        |s| s.threads.iter().flatten().all(|w| w.now == Thread::Idle),
    );
}

/// The traces of the model with `fix` run against the scripts: what each kind of step did.
fn conform(what: &str, fix: Fix) -> Covered {
    let (server, mut conn) = start(what);
    let model = Handoff {
        threads: vec![2, 2, 1],
        acquisitions: 3,
        fix,
        faults: false,
        give_up: true,
    };
    let mut covered = Covered::default();
    for seed in 0..TRACES {
        run_trace(&mut conn, &model, seed, &mut covered);
    }
    println!("{covered:?}");
    drop(server);
    covered
}

/// The scripts as a release runs them that names the next client without handing it the
/// lock (a shared value's, or one over several instances).
#[test]
fn the_scripts_do_what_the_handoff_model_predicts() {
    let covered = conform("model-conformance", Fix::Barging);
    // Every kind of step ran, many times.
    let c = &covered;
    let counts = [
        c.taken,
        c.taken_with_more,
        c.held,
        c.unmarked,
        c.placed_own,
        c.short,
        c.owed,
        c.turns_taken,
        c.turns_expired,
        c.passed,
        c.named,
        c.withdrawn,
    ];
    assert_each_ran(c, &counts);
}

/// Every kind of step in `counts`, and every kind of release, ran many times.
fn assert_each_ran(c: &Covered, counts: &[u32]) {
    assert!(counts.iter().chain(&c.released).all(|&n| n >= 10), "{c:?}");
}

/// The scripts as a `Mutex`'s release on one deployment runs them, handing the lock to the
/// client it names (`Fix::HandedOver`): nobody is owed a turn any more.
#[test]
fn the_scripts_that_hand_the_lock_over_do_what_the_model_predicts() {
    let covered = conform("model-conformance-handed", Fix::HandedOver);
    let c = &covered;
    // A take that keeps the client among the waiting (`more`) and the short wait behind the
    // clients a yield named are rare here: a client whose threads wait is named, and handed
    // the lock, before its leader can find it free.
    let counts = [
        c.taken,
        c.held,
        c.unmarked,
        c.placed_own,
        c.claims_held,
        c.claims_released,
        c.passed,
        c.named,
        c.withdrawn,
    ];
    assert_each_ran(c, &counts);
    assert_eq!(c.owed + c.turns_taken + c.turns_expired, 0, "{covered:?}");
}

/// The scripts as a `Mutex`'s first attempt with a pop behind it runs them, and the releases
/// that leave their note to such a pop, announcing nothing (`Fix::PoppedNote`).
#[test]
fn the_scripts_that_leave_a_note_to_a_pop_do_what_the_model_predicts() {
    let covered = conform("model-conformance-popped", Fix::PoppedNote);
    let c = &covered;
    let counts = [
        c.taken,
        c.held,
        c.unmarked,
        c.claims_held,
        c.claims_released,
        c.named,
        c.pops,
        c.popped_at_once,
        c.left_to_pops,
        c.drained,
    ];
    assert_each_ran(c, &counts);
}
