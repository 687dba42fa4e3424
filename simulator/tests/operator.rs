//! The operator's interventions as the simulator draws them (issue 10 §2): a pause (SIGTERM of the
//! coordinator node) resumes every run to the outcome it has without the pause; a cancelled run starts
//! no new session; a run reopened for a follow-up ends again with exactly one new synthesis. Each
//! invariant is also shown to catch its mutation of the host.

#![allow(clippy::expect_used)] // test helpers: a panic is the failure report
use keel_actors::Plan;
use keel_sim::profile::HarnessBehaviour;
use keel_sim::setup::{run_spec, step};
use keel_sim::soak::pause_resumes_same;
use keel_sim::violation::Invariant;
use keel_sim::{Intervention, Mutation, RunReport, WorldConfig, run};
use keel_store::{RunId, RunStatus};

fn rid(n: u128) -> RunId {
    RunId((0x0190_0000_0000_u128 << 80) | n)
}

/// A calm world of one run: "a" and "b" in parallel, then "c" after both, then "d" after "c".
fn chain_world(seed: u64) -> WorldConfig {
    let plan = Plan {
        steps: vec![
            step("a", &[], None, 1_000),
            step("b", &[], None, 1_000),
            step("c", &["a", "b"], None, 1_000),
            step("d", &["c"], None, 1_000),
        ],
        constraints: vec!["cite sources".into()],
    };
    let mut config = WorldConfig::calm(seed, vec![run_spec(rid(1), "operator", plan, None)]);
    for key in ["a", "b", "c", "d"] {
        config
            .harness_script
            .insert((key.into(), 1), HarnessBehaviour::ToolRoundTrip);
    }
    config
}

fn status(report: &RunReport) -> RunStatus {
    report
        .runs_final
        .get(&rid(1))
        .map(|(s, _)| *s)
        .expect("the run was made durable")
}

fn clean(report: &RunReport) {
    assert!(
        report.violation.is_none(),
        "{}",
        report
            .violation
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default()
    );
}

#[test]
fn a_run_paused_at_any_time_resumes_to_the_same_outcome() {
    let config = chain_world(201);
    let straight = run(config.clone());
    clean(&straight);
    assert_eq!(status(&straight), RunStatus::Completed);
    // Pauses all along the run, each for a while: every resumed run ends as the straight one did.
    let mut paused_total = 0;
    for at_ms in (20..straight.end_ms.min(4_000)).step_by(97) {
        let report = pause_resumes_same(&config, at_ms, 1_500)
            .unwrap_or_else(|v| panic!("pause at {at_ms} ms: {v}"));
        paused_total += report.observed.pauses;
    }
    assert!(paused_total > 10, "{paused_total} pauses happened");
}

#[test]
fn invariant_13_a_pause_that_ends_the_run_is_caught() {
    let mut config = chain_world(202);
    config.mutation = Some(Mutation::PauseCancelsRun);
    let mut caught = None;
    for at_ms in (20..3_000).step_by(97) {
        if let Err(v) = pause_resumes_same(&config, at_ms, 1_500) {
            caught = Some(v);
            break;
        }
    }
    let violation = caught.expect("PauseCancelsRun went unnoticed");
    assert_eq!(
        violation.invariant,
        Invariant::PauseResumesSame,
        "{violation}"
    );
    assert_eq!(violation.seed, 202);
}

#[test]
fn a_cancelled_run_ends_cancelled_and_starts_nothing() {
    // Hosted: the coordinator is told while "c" waits for "a" and "b".
    let mut config = chain_world(203);
    config.interventions.push((
        150,
        Intervention::Cancel {
            run: rid(1),
            reason: "not needed".into(),
        },
    ));
    let report = run(config);
    clean(&report);
    assert_eq!(status(&report), RunStatus::Cancelled);
    assert_eq!(report.observed.cancels, vec![rid(1)]);
    assert!(
        !report.observed.spawns.values().any(|s| s.step == "d"),
        "a step after the cancel was spawned"
    );

    // Not hosted: cancelled in the store while its node is paused; the restart resumes nothing.
    let mut config = chain_world(204);
    config
        .interventions
        .push((150, Intervention::Pause { down_ms: 5_000 }));
    config.interventions.push((
        1_000,
        Intervention::Cancel {
            run: rid(1),
            reason: "not needed".into(),
        },
    ));
    let report = run(config);
    clean(&report);
    assert_eq!(status(&report), RunStatus::Cancelled);
    assert_eq!(report.observed.pauses, 1);
    assert!(!report.observed.spawns.values().any(|s| s.step == "d"));
}

#[test]
fn invariant_14_a_cancel_the_coordinator_never_hears_of_is_caught() {
    let mut config = chain_world(205);
    config.interventions.push((
        150,
        Intervention::Cancel {
            run: rid(1),
            reason: "not needed".into(),
        },
    ));
    config.mutation = Some(Mutation::CancelAsIfNotHosted);
    let violation = run(config)
        .violation
        .expect("CancelAsIfNotHosted went unnoticed");
    assert_eq!(
        violation.invariant,
        Invariant::CancelStartsNothing,
        "{violation}"
    );
    assert_eq!(violation.seed, 205);
}

fn reopen_world(seed: u64) -> WorldConfig {
    let mut config = chain_world(seed);
    config.interventions.push((
        30_000,
        Intervention::FollowUp {
            run: rid(1),
            step: Some("c".into()),
            brief: "Follow-up: and the edge case?".into(),
            agent: None,
        },
    ));
    config
}

#[test]
fn a_reopened_run_ends_again_with_one_new_synthesis() {
    let straight = run(chain_world(206));
    let report = run(reopen_world(206));
    clean(&report);
    assert_eq!(report.observed.reopens, vec![rid(1)]);
    assert_eq!(status(&report), RunStatus::Completed);
    // The new synthesis is not the old one: it covers the follow-up too.
    let outcome = |r: &RunReport| r.runs_final.get(&rid(1)).and_then(|(_, o)| o.clone());
    assert_ne!(outcome(&report), outcome(&straight));
    assert!(report.observed.sessions.len() > straight.observed.sessions.len());
}

#[test]
fn invariant_15_a_reopen_without_a_coordinator_is_caught() {
    let mut config = reopen_world(207);
    config.mutation = Some(Mutation::ReopenWithoutCoordinator);
    let violation = run(config)
        .violation
        .expect("ReopenWithoutCoordinator went unnoticed");
    assert_eq!(
        violation.invariant,
        Invariant::ReopenEndsOnce,
        "{violation}"
    );
    assert_eq!(violation.seed, 207);
}
