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

// Issue 17: a run's state under pause, crash, cancel and follow-up, as the simulator draws them.

/// A calm world of one run: "a" (its first sessions scripted by `a_sessions`) and "b" in
/// parallel, then "c" after both.
fn held_world(seed: u64, a_sessions: &[HarnessBehaviour]) -> WorldConfig {
    let plan = Plan {
        steps: vec![
            step("a", &[], None, 1_000),
            step("b", &[], None, 1_000),
            step("c", &["a", "b"], None, 1_000),
        ],
        constraints: vec!["cite sources".into()],
    };
    let mut config = WorldConfig::calm(seed, vec![run_spec(rid(1), "state", plan, None)]);
    for (n, behaviour) in a_sessions.iter().enumerate() {
        let n = u32::try_from(n).expect("few sessions") + 1;
        config.harness_script.insert(("a".into(), n), *behaviour);
    }
    config
}

fn task_cancel(at_ms: u64, step: &str) -> (u64, Intervention) {
    (
        at_ms,
        Intervention::CancelTask {
            run: rid(1),
            step: step.into(),
            reason: "not needed".into(),
        },
    )
}

#[test]
fn a_cancelled_step_ends_and_its_run_goes_on_without_it() {
    // Hosted: the coordinator is told while "a" hangs; "b" reports, "c" (after "a") is skipped.
    let mut config = held_world(208, &[HarnessBehaviour::Hang]);
    config.interventions.push(task_cancel(500, "a"));
    let report = run(config);
    clean(&report);
    assert_eq!(
        report.observed.step_cancels,
        vec![(rid(1), "a".to_string())]
    );
    assert_eq!(report.observed.sessions_of("a").len(), 1);
    assert!(report.observed.sessions_of("c").is_empty());
    // The run is not cancelled: it ends with a synthesis over what it has ("b").
    assert_eq!(status(&report), RunStatus::Completed);

    // Not hosted: the node is paused, the step's task is cancelled in the store, and the resume
    // does not run it again.
    let mut config = held_world(209, &[HarnessBehaviour::Hang]);
    config
        .interventions
        .push((400, Intervention::Pause { down_ms: 2_000 }));
    config.interventions.push(task_cancel(1_000, "a"));
    let report = run(config);
    clean(&report);
    assert_eq!(report.observed.pauses, 1);
    assert_eq!(
        report.observed.step_cancels,
        vec![(rid(1), "a".to_string())]
    );
    assert_eq!(report.observed.sessions_of("a").len(), 1);
    assert_eq!(status(&report), RunStatus::Completed);
}

#[test]
fn a_stale_cancel_of_an_ended_run_changes_nothing_and_a_later_follow_up_completes() {
    for pause_first in [false, true] {
        // The follow-up comes at 30 s, after the cancel.
        let mut config = reopen_world(210);
        if pause_first {
            // The ended run is not hosted any more: the cancel goes to the store, which refuses.
            config
                .interventions
                .push((20_000, Intervention::Pause { down_ms: 1_000 }));
        }
        config.interventions.push((
            25_000,
            Intervention::Cancel {
                run: rid(1),
                reason: "stale".into(),
            },
        ));
        let report = run(config);
        clean(&report);
        assert!(
            report.observed.cancels.is_empty(),
            "pause first: {pause_first}"
        );
        if pause_first {
            assert!(
                report
                    .observed
                    .operator_refusals
                    .iter()
                    .any(|(run, why)| *run == rid(1) && why.contains("already Completed")),
                "{:?}",
                report.observed.operator_refusals
            );
        }
        assert_eq!(report.observed.reopens, vec![rid(1)]);
        assert_eq!(status(&report), RunStatus::Completed);
        assert_eq!(report.observed.sessions_of("f1").len(), 1);
    }
}

#[test]
fn pauses_that_outnumber_a_steps_retries_do_not_use_them_up() {
    // Six pauses, each while "a" hangs (more than its five retries), then "a" reports.
    let mut config = held_world(211, &[HarnessBehaviour::Hang; 6]);
    assert_eq!(config.coordinator.attempts_per_step_max, 5);
    for i in 0..6 {
        config
            .interventions
            .push((1_000 + i * 3_000, Intervention::Pause { down_ms: 500 }));
    }
    let report = run(config);
    clean(&report);
    assert_eq!(report.observed.pauses, 6);
    assert_eq!(report.observed.sessions_of("a").len(), 7);
    assert!(report.observed.parked_for_retries.is_empty());
    assert_eq!(status(&report), RunStatus::Completed);
    assert!(report.observed.sessions_of("c").len() == 1);
}

fn crash_after_follow_up(at_ms: u64, step: &str) -> (u64, Intervention) {
    (
        at_ms,
        Intervention::CrashAfterFollowUp {
            run: rid(1),
            step: Some(step.into()),
            brief: "Follow-up: and the edge case?".into(),
            down_ms: 1_000,
        },
    )
}

#[test]
fn a_crash_right_after_a_follow_up_is_announced_loses_nothing() {
    // Joined to the running run (while "c" waits for "a" and "b"), and reopening it once ended.
    for (seed, at_ms) in [(212, 150), (213, 30_000)] {
        let mut config = chain_world(seed);
        config.interventions.push(crash_after_follow_up(at_ms, "a"));
        let report = run(config);
        clean(&report);
        assert_eq!(
            report.observed.follow_ups_announced.len(),
            1,
            "at {at_ms} ms"
        );
        assert_eq!(report.observed.coordinator_crashes, 1);
        assert_eq!(report.observed.sessions_of("f1").len(), 1, "at {at_ms} ms");
        assert_eq!(status(&report), RunStatus::Completed);
    }
}
