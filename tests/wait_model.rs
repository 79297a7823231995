//! The `Mutex`'s hand-off protocol between clients, as a model checked for every interleaving
//! (`stateright`): Redis's state for one lock (the holder's token, the fencing counter, the
//! waiting clients with their scores, the announcements on their way), each client's gate
//! (its leader, the threads inside, the baton, the lock passed within it, what it last did
//! with the lock) and each thread. Every script is one atomic step, and so is every decision
//! a client makes under its gate's lock; the steps of different threads and of Redis
//! interleave in every order.
//!
//! Besides the hand-off within a client and between clients, the model has the owed turn (a
//! client named and beaten to the lock is owed the next one, which the release after hands
//! to it for a moment), the yield (a client whose run of passes reached its bound gives the
//! lock up and waits behind the others), the first attempt's subscription (a waiter that
//! leads at once does not attempt again), and the short waits that end by themselves.
//!
//! Checked: exclusion, fencing tokens that rise with every holder, and that no waiter is
//! forgotten (a state in which nothing can happen any more while a thread still waits, so
//! that only a re-check period would wake it), whether its client is missing from the waiting
//! set (a lost place) or a release named another client that had nobody waiting (a stale
//! place). Twelve versions of the protocol ([`Fix`]): before the fix of the lost place, of the
//! stale place, of the early place, of the withdrawn place, of the place kept for nobody, of
//! the turn after a yield and of the place of a waiter that gave up, each of which the model
//! shows failing (its shortest counterexample); the protocol with those fixes; with the pass
//! to a leader about to begin; the protocol as the scripts and the client run it where a
//! release names a client without handing it the lock (`Fix::Barging`: its threads also take
//! a pass that waits for its leader as they come), which holds every property, with faults
//! and with waiters that give up; and the hand-off in the release (`Fix::HandedOver`), as a
//! `Mutex`'s release on one deployment runs it: a release hands the lock to the client it
//! names, whose leader takes it by the announcement's note without an attempt; it holds every
//! property too, and no client is ever owed a turn in it (a named client is never beaten to
//! the lock). And the note left to a pop (`Fix::PoppedNote`), what the scripts run now: a
//! release that names a client whose first attempt has a pop waiting behind it, recorded in
//! Redis, leaves the note to that pop and announces nothing; it holds every property, with
//! the client refusing a note that reaches it twice (from its list after its announcement),
//! and fails at once if the note left to the pop is lost. A follower gives up only behind a leader: one whose deadline passes while
//! nobody leads is promoted and decides first, as `Gates::lead` makes it.
//!
//! The `FairMutex`'s queue is a model of its own ([`fair`]), on the same lock key and fencing
//! counter: exclusion, rising tokens, first come first served, and no waiter forgotten.

#[allow(dead_code)]
#[path = "wait_model/fair.rs"]
mod fair;
#[allow(dead_code)]
#[path = "wait_model/model.rs"]
mod model;

use stateright::{Checker, HasDiscoveries, Model};

use fair::FairQueue;
use model::{Action, Fix, Handoff};

/// Every state of `model`, in which every property must hold.
fn assert_holds(model: Handoff) {
    let checker = model.checker().spawn_bfs().join();
    println!("states explored: {}", checker.unique_state_count());
    checker.assert_properties();
}

/// Every state of the version `fix` of the protocol, in each of `runs` (the threads of each
/// client, the acquisitions of each thread, faults, a waiter that gives up), in which every
/// property must hold.
fn assert_holds_in<const N: usize>(fix: Fix, runs: [(Vec<u8>, u8, bool, bool); N]) {
    for (threads, acquisitions, faults, give_up) in runs {
        assert_holds(Handoff {
            threads,
            acquisitions,
            fix,
            faults,
            give_up,
        });
    }
}

/// The version `fix` of the protocol, explored breadth first until `property` fails, which
/// must: its shortest counterexample. Exclusion and rising tokens hold in what was explored.
fn counterexample(fix: Fix, property: &'static str) -> Vec<Action> {
    let model = Handoff {
        threads: vec![2, 1],
        acquisitions: 2,
        fix,
        faults: false,
        give_up: false,
    };
    first_failure(model, property)
}

/// As [`counterexample`], with a waiter that gives up (two clients of two threads and one,
/// one acquisition each).
fn give_up_counterexample(fix: Fix, property: &'static str) -> Vec<Action> {
    let model = Handoff {
        threads: vec![2, 1],
        acquisitions: 1,
        fix,
        faults: false,
        give_up: true,
    };
    first_failure(model, property)
}

/// Where in `path` the first action that `which` picks is.
fn step(path: &[Action], which: impl Fn(&Action) -> bool) -> Option<usize> {
    path.iter().position(which)
}

/// `model` explored breadth first until `property` fails (see [`counterexample`]).
fn first_failure(model: Handoff, property: &'static str) -> Vec<Action> {
    let fix = model.fix;
    let checker = model
        .checker()
        .finish_when(HasDiscoveries::AnyOf([property].into()))
        .spawn_bfs()
        .join();
    for kept in ["exclusion", "fencing tokens rise"] {
        if let Some(path) = checker.discovery(kept) {
            panic!("{kept}: {:?}", path.into_actions());
        }
    }
    let Some(path) = checker.discovery(property) else {
        panic!("the model no longer sees what {property:?} found in {fix:?}");
    };
    path.into_actions()
}

#[test]
fn the_model_finds_the_lost_place_of_the_protocol_before_its_fix() {
    let path = counterexample(Fix::Before, "no waiter of a client missing from the set");
    println!("{path:?}");
}

#[test]
fn the_model_finds_the_stale_place_of_the_protocol_before_its_fix() {
    let path = counterexample(Fix::LostPlace, "no waiter behind a stale place");
    println!("{path:?}");
}

/// A thread whose first attempt (outside the gate) placed its client, and which then led the
/// gate without attempting again, while a hold its client began in between gave that place
/// up on release: nobody named the client.
#[test]
fn the_model_finds_the_early_place_of_the_protocol_before_its_fix() {
    let path = counterexample(
        Fix::StalePlace,
        "no waiter of a client missing from the set",
    );
    assert!(path
        .iter()
        .any(|a| matches!(a, Action::EnterGate(_, _, true))));
    println!("{path:?}");
}

/// The protocol as the scripts and the client run it, for two clients of two threads and
/// one, two acquisitions each: every property holds.
#[test]
fn the_handoff_keeps_exclusion_and_rising_tokens_and_forgets_no_waiter() {
    assert_holds(Handoff {
        threads: vec![2, 1],
        acquisitions: 2,
        fix: Fix::Barging,
        faults: false,
        give_up: false,
    });
}

/// The `FairMutex`'s queue: exclusion, rising tokens, first come first served, and no
/// waiter forgotten.
#[test]
fn the_fair_queue_serves_in_order_and_forgets_no_waiter() {
    let checker = FairQueue {
        threads: vec![2, 1],
        acquisitions: 2,
    }
    .checker()
    .spawn_bfs()
    .join();
    println!("states explored: {}", checker.unique_state_count());
    checker.assert_properties();
}

/// With the faults: a lease that runs out under its holder (stalled, or cut off from Redis)
/// and announcements lost on their way. A waiter may then be left to its re-check, as the
/// protocol intends; what must hold still is that at most one thread holds the lock while
/// its lease counts, and that the fencing tokens of the holds that count rise. The faults
/// multiply the states: two configurations, two clients of two threads and one with one
/// acquisition each, and two clients of one thread with two.
#[test]
fn the_handoff_keeps_exclusion_and_rising_tokens_under_faults() {
    for (threads, acquisitions) in [(vec![2, 1], 1), (vec![1, 1], 2)] {
        assert_holds(Handoff {
            threads,
            acquisitions,
            fix: Fix::Barging,
            faults: true,
            give_up: false,
        });
    }
}

/// A waiter may give up at its deadline (once in a run, to bound the states): it leaves its
/// client's gate and, when no other thread of its client waits, withdraws its client
/// (`mutex/withdraw.lua`). Before the fix of the withdrawn place it left the gate first and
/// did not count a sibling whose first attempt had failed and which had not entered the gate
/// yet: the withdrawal removed the place that sibling's attempt found (or made), and the
/// sibling, which then led straight from that attempt, waited for its re-check. (Checking
/// whether a hold began since the attempt does not cover it: the withdrawal could run after
/// the sibling's attempt whatever the sibling checked.)
#[test]
fn the_model_finds_the_withdrawn_place_of_the_protocol_before_its_fix() {
    let path = give_up_counterexample(
        Fix::EarlyPlace,
        "no waiter of a client missing from the set",
    );
    let withdrawn = step(&path, |a| matches!(a, Action::RunWithdraw(0, _)));
    let entered = path
        .iter()
        .rposition(|a| matches!(a, Action::EnterGate(0, _, _)));
    assert!(withdrawn < entered, "{path:?}");
    println!("{path:?}");
}

/// A holder decides that its release keeps its client's place (a sibling waits in the gate);
/// before Redis runs that release, the sibling gives up, finds nobody else of its client
/// waiting, and withdraws the client. Before the fix of the kept place, Redis could run the
/// withdrawal first (it found the lock held and changed nothing more), then the release,
/// which put the client back among the waiting and named it: nobody of it waited, and a
/// waiter of another client was left to its re-check. The two decisions were made in order
/// in the client, but travelled on different connections.
#[test]
fn the_model_finds_the_place_kept_for_nobody_before_its_fix() {
    let path = give_up_counterexample(Fix::WithdrawnPlace, "no waiter behind a stale place");
    let kept = step(&path, |a| matches!(a, Action::Release(0, _, false)));
    let gave_up = step(&path, |a| matches!(a, Action::GiveUp(0, _)));
    let withdrawn = step(&path, |a| matches!(a, Action::RunWithdraw(0, _)));
    let released = step(&path, |a| matches!(a, Action::RunRelease(0, _)));
    assert!(kept < gave_up && withdrawn < released, "{path:?}");
    println!("{path:?}");
}

/// A client gives the lock up to the other clients at the end of a run of passes (a yield),
/// and its release names it all the same (it waited longest); its last waiter then gives up.
/// Before the fix of the turn after a yield, a client that had just yielded counted as
/// waiting for that thread, which so left without withdrawing its client: nobody took the
/// lock its client was named for, and the other client's waiter was left to its re-check.
#[test]
fn the_model_finds_the_turn_after_a_yield_before_its_fix() {
    let path = give_up_counterexample(Fix::KeptPlace, "no waiter behind a stale place");
    assert!(path.contains(&Action::Release(0, 0, true)), "{path:?}");
    let withdrawn = step(&path, |a| matches!(a, Action::RunWithdraw(..)));
    assert!(withdrawn.is_none(), "{path:?}");
    println!("{path:?}");
}

/// A thread's attempt fails while a sibling holds, and makes its client a place that counts
/// from a new tick of the fencing counter (above the hold's token); the thread then gives
/// up, while the sibling still holds. Before the fix of the place of a waiter that gave up,
/// nobody gave that place up: the thread had no release of its own, and the sibling's release
/// gave up only places below its token, so it named the client with nobody waiting.
#[test]
fn the_model_finds_the_place_of_a_waiter_that_gave_up_before_its_fix() {
    let path = give_up_counterexample(Fix::YieldedTurn, "no waiter behind a stale place");
    let gave_up = step(&path, |a| matches!(a, Action::GiveUp(0, _)));
    let released = step(&path, |a| matches!(a, Action::Release(0, _, _)));
    assert!(gave_up < released, "{path:?}");
    println!("{path:?}");
}

/// The protocol as it runs, with a waiter that gives up at its deadline (once in a run): it
/// decides in its gate whether to withdraw its client, counting the siblings whose first
/// attempt is on its way, after any release on its way that keeps its client's place, and
/// leaves the gate once the withdrawal ran. Every property holds. Three configurations (a
/// give-up multiplies the states): two clients of two threads and one, three clients of
/// two, one and one, one acquisition each; two clients of one thread, two each.
#[test]
fn the_handoff_forgets_no_waiter_when_a_waiter_gives_up() {
    for (threads, acquisitions) in [(vec![2, 1], 1), (vec![2, 1, 1], 1), (vec![1, 1], 2)] {
        assert_holds(Handoff {
            threads,
            acquisitions,
            fix: Fix::Barging,
            faults: false,
            give_up: true,
        });
    }
}

/// The hand-off in the release (`Fix::HandedOver`, what a `Mutex`'s release runs): a release
/// that names a client hands it the lock, and the client's leader takes it by the note of the
/// announcement, without an attempt, unless the note is at or below a counter value an
/// attempt of its client read (the lock so handed was taken by that attempt, or is gone).
/// Every property holds, for the configurations of the protocol as it runs: without faults,
/// with them, and with a waiter that gives up.
#[test]
fn the_handoff_in_the_release_keeps_every_property() {
    let runs = [
        (vec![2, 1], 2, false, false),
        (vec![2, 1], 1, true, false),
        (vec![1, 1], 2, true, false),
        (vec![2, 1], 1, false, true),
        (vec![2, 1, 1], 1, false, true),
        (vec![1, 1], 2, false, true),
    ];
    assert_holds_in(Fix::HandedOver, runs);
}

/// The pop behind a first attempt carries the note (`Fix::PoppedNote`): a release that names
/// a client whose first attempt placed it with a pop behind it, recorded in Redis, leaves the
/// note to that pop and announces nothing. Every property holds in the configurations of
/// [`the_handoff_in_the_release_keeps_every_property`], with faults (a pop whose connection
/// drops leaves the record behind, and the note it was given is lost as an announcement
/// would be) and with waiters that give up.
#[test]
fn the_note_left_to_a_pop_keeps_every_property() {
    let runs = [
        (vec![1, 1], 2, false, false),
        (vec![1, 1, 1], 1, false, false),
        (vec![2, 1], 1, false, false),
        (vec![2, 1], 1, true, false),
        (vec![1, 1], 2, true, false),
        (vec![2, 1], 1, false, true),
        (vec![2, 1, 1], 1, false, true),
        (vec![1, 1], 2, false, true),
    ];
    assert_holds_in(Fix::PoppedNote, runs);
}
