//! The coordinator's view of its workers: placement by capability and load, leases, spawn
//! acknowledgements, restarted workers and stale attempts.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{attempt, start};
use keel_harness::HarnessKind;
use keel_protocol::membership::Action;
use keel_protocol::{Membership, MembershipConfig, NodeName, WorkerStatus};

fn n(s: &str) -> NodeName {
    NodeName::new(s).unwrap()
}

fn config() -> MembershipConfig {
    MembershipConfig {
        lease_ms: 1_000,
        spawn_ack_ms: 500,
        placement_wait_ms: 3_000,
        waiting_max: 8,
    }
}

fn status(incarnation: u64, harnesses: &[HarnessKind], capacity: u32) -> WorkerStatus {
    WorkerStatus {
        incarnation,
        harnesses: harnesses.to_vec(),
        capacity,
        hosting: Vec::new(),
    }
}

fn spawned_on(out: &[Action]) -> Vec<(String, u128)> {
    out.iter()
        .filter_map(|a| match a {
            Action::Spawn { worker, start, .. } => Some((worker.to_string(), start.attempt.task.0)),
            _ => None,
        })
        .collect()
}

fn downs(out: &[Action]) -> Vec<u128> {
    out.iter()
        .filter_map(|a| match a {
            Action::Down { attempt, .. } => Some(attempt.task.0),
            _ => None,
        })
        .collect()
}

const API: HarnessKind = HarnessKind::MessagesApi;

#[test]
fn placement_spreads_by_load_for_capacity_and_needs_the_harness() {
    let mut m = Membership::new(config());
    let mut out = Vec::new();
    m.heartbeat(&n("a"), status(1, &[API], 2), 0, &mut out);
    m.heartbeat(
        &n("b"),
        status(2, &[API, HarnessKind::Codex], 4),
        0,
        &mut out,
    );
    out.clear();
    for task in 1..=6 {
        m.place(start(attempt(task, 1), API, "x"), 10, &mut out);
    }
    let placed = spawned_on(&out);
    assert_eq!(placed.len(), 6);
    assert_eq!(placed.iter().filter(|(w, _)| w == "a").count(), 2);
    assert_eq!(placed.iter().filter(|(w, _)| w == "b").count(), 4);
    // Both full: the next one waits; only b runs codex.
    out.clear();
    m.place(start(attempt(7, 1), API, "x"), 20, &mut out);
    assert!(spawned_on(&out).is_empty());
    assert_eq!(m.waiting(), 1);
    // An attempt ends on a: the waiting one goes there at once.
    out.clear();
    assert!(m.forget(&n("a"), attempt(1, 1), 30, &mut out));
    assert_eq!(spawned_on(&out), vec![("a".to_string(), 7)]);
    // Forgetting an attempt placed elsewhere does nothing.
    assert!(!m.forget(&n("a"), attempt(2, 1), 31, &mut out));
}

#[test]
fn an_attempt_no_worker_can_take_goes_down_after_the_wait() {
    let mut m = Membership::new(config());
    let mut out = Vec::new();
    m.heartbeat(&n("a"), status(1, &[API], 2), 0, &mut out);
    out.clear();
    m.place(
        start(attempt(1, 1), HarnessKind::ClaudeCode, "x"),
        0,
        &mut out,
    );
    assert!(out.is_empty());
    m.tick(2_999, &mut out);
    assert!(downs(&out).is_empty());
    m.tick(3_000, &mut out);
    assert_eq!(downs(&out), vec![1]);
}

#[test]
fn a_lost_lease_takes_its_attempts_down_and_a_late_return_cancels_them() {
    let mut m = Membership::new(config());
    let mut out = Vec::new();
    m.heartbeat(&n("a"), status(1, &[API], 8), 0, &mut out);
    m.heartbeat(&n("b"), status(2, &[API], 8), 0, &mut out);
    for task in 1..=4 {
        m.place(start(attempt(task, 1), API, "x"), 0, &mut out);
    }
    let on_a: Vec<u128> = spawned_on(&out)
        .into_iter()
        .filter(|(w, _)| w == "a")
        .map(|(_, t)| t)
        .collect();
    assert_eq!(on_a.len(), 2);
    for task in 1..=4 {
        let worker = m.worker_of(attempt(task, 1)).unwrap().clone();
        assert!(m.spawned(&worker, attempt(task, 1)).is_some());
    }
    // b keeps beating, a goes silent.
    out.clear();
    m.heartbeat(&n("b"), status(2, &[API], 8), 900, &mut out);
    m.tick(999, &mut out);
    assert!(downs(&out).is_empty());
    m.tick(1_000, &mut out);
    let mut down = downs(&out);
    down.sort_unstable();
    assert_eq!(down, on_a);
    assert!(
        out.iter()
            .any(|a| matches!(a, Action::Lost { attempts: 2, .. }))
    );
    assert_eq!(m.live_workers().cloned().collect::<Vec<_>>(), vec![n("b")]);
    // The re-run (attempt 2) goes to b.
    out.clear();
    m.place(start(attempt(on_a[0], 2), API, "x"), 1_100, &mut out);
    assert_eq!(spawned_on(&out), vec![("b".to_string(), on_a[0])]);
    // a comes back, same incarnation, still hosting attempt 1 of that task: told to cancel it.
    out.clear();
    let mut back = status(1, &[API], 8);
    back.hosting = vec![attempt(on_a[0], 1)];
    m.heartbeat(&n("a"), back, 1_200, &mut out);
    assert!(out.contains(&Action::Cancel {
        worker: n("a"),
        attempt: attempt(on_a[0], 1)
    }));
}

#[test]
fn a_restarted_worker_loses_its_attempts_at_once() {
    let mut m = Membership::new(config());
    let mut out = Vec::new();
    m.heartbeat(&n("a"), status(1, &[API], 8), 0, &mut out);
    m.place(start(attempt(1, 1), API, "x"), 0, &mut out);
    assert!(m.spawned(&n("a"), attempt(1, 1)).is_some());
    out.clear();
    m.heartbeat(&n("a"), status(99, &[API], 8), 100, &mut out);
    assert_eq!(downs(&out), vec![1]);
    assert!(out.iter().any(|a| matches!(a, Action::Joined { .. })));
}

#[test]
fn an_unacknowledged_spawn_goes_down_and_a_duplicate_place_is_one_spawn() {
    let mut m = Membership::new(config());
    let mut out = Vec::new();
    m.heartbeat(&n("a"), status(1, &[API], 8), 0, &mut out);
    out.clear();
    m.place(start(attempt(1, 1), API, "x"), 0, &mut out);
    m.place(start(attempt(1, 1), API, "x"), 1, &mut out);
    assert_eq!(spawned_on(&out).len(), 1);
    m.heartbeat(&n("a"), status(1, &[API], 8), 400, &mut out);
    out.clear();
    m.tick(499, &mut out);
    assert!(downs(&out).is_empty());
    m.tick(500, &mut out);
    assert_eq!(downs(&out), vec![1]);
    assert!(m.worker_of(attempt(1, 1)).is_none());
    // A spawn acknowledged by another worker than the one it was sent to does not count.
    m.place(start(attempt(2, 1), API, "x"), 600, &mut out);
    assert!(m.spawned(&n("zz"), attempt(2, 1)).is_none());
    assert!(m.spawned(&n("a"), attempt(2, 1)).is_some());
}

#[test]
fn a_cancel_for_a_waiting_attempt_withdraws_it() {
    let mut m = Membership::new(config());
    let mut out = Vec::new();
    m.place(start(attempt(1, 1), API, "x"), 0, &mut out);
    assert_eq!(m.waiting(), 1);
    assert!(m.withdraw(attempt(1, 1)));
    assert_eq!(m.waiting(), 0);
    m.heartbeat(&n("a"), status(1, &[API], 8), 10, &mut out);
    assert!(spawned_on(&out).is_empty());
}

#[test]
fn the_next_deadline_is_the_first_lease_ack_or_wait_to_run_out() {
    let mut m = Membership::new(config());
    let mut out = Vec::new();
    assert_eq!(m.next_deadline(), None);
    m.heartbeat(&n("a"), status(1, &[API], 1), 100, &mut out);
    assert_eq!(m.next_deadline(), Some(1_100), "a's lease");
    m.place(start(attempt(1, 1), API, "x"), 200, &mut out);
    assert_eq!(m.next_deadline(), Some(700), "the spawn's acknowledgement");
    m.place(start(attempt(2, 1), API, "x"), 300, &mut out);
    assert_eq!(m.spawned(&n("a"), attempt(1, 1)), Some(200));
    assert_eq!(
        m.next_deadline(),
        Some(1_100),
        "a's lease again: 2 waits until 3,300"
    );
    // Ticking at the deadline takes the worker down: then only the waiting attempt can run out.
    out.clear();
    m.tick(1_100, &mut out);
    assert_eq!(downs(&out), vec![1]);
    assert_eq!(m.next_deadline(), Some(3_300));
}
