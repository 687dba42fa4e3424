//! The named scenarios of issue 3: each scripts its faults on a calm world and asserts its outcome.
//! Every run is also checked for every invariant after every event (a violation fails the test).

#![allow(clippy::expect_used)] // test helpers: a panic is the failure report
use keel_actors::{Continuity, Plan, Refusal, Verdict};
use keel_sim::net::NodeId;
use keel_sim::profile::FaultKind;
use keel_sim::profile::HarnessBehaviour;
use keel_sim::setup::{lead_run_spec, model_of, run_spec, step};
use keel_sim::{DiskFault, Intervention, RunReport, WorldConfig, run};
use keel_store::{RunId, RunStatus, TaskKind};

fn rid(n: u128) -> RunId {
    RunId((0x0190_0000_0000_u128 << 80) | n)
}

/// Runs a world and fails on any invariant violation, printing the reproduction.
fn check(config: WorldConfig) -> RunReport {
    let report = run(config);
    assert!(
        report.violation.is_none(),
        "{}",
        report
            .violation
            .as_ref()
            .map(ToString::to_string)
            .unwrap_or_default()
    );
    report
}

fn status(report: &RunReport, run: RunId) -> RunStatus {
    report
        .runs_final
        .get(&run)
        .map(|(s, _)| *s)
        .expect("the run was made durable")
}

fn plan(steps: Vec<keel_actors::PlanStep>) -> Plan {
    Plan {
        steps,
        constraints: vec!["cite sources".into()],
    }
}

#[test]
fn scenario_1_follow_ups_while_the_worker_restarts() {
    let run_id = rid(1);
    // "thread" is the parent thread; "wait" hangs once so the run stays open while follow-ups arrive.
    let spec = run_spec(
        run_id,
        "threads",
        plan(vec![
            step("thread", &[], None, 1_000),
            step("wait", &[], None, 1_000),
        ]),
        None,
    );
    let mut config = WorldConfig::calm(11, vec![spec]);
    config.workers = 2;
    config
        .harness_script
        .insert(("wait".into(), 1), HarnessBehaviour::Hang);
    for i in 0..8u64 {
        config.interventions.push((
            1_000 + i * 2_000,
            Intervention::FollowUp {
                run: run_id,
                step: Some("thread".into()),
                brief: format!("Follow-up {i}: also check case {i}."),
                agent: None,
            },
        ));
    }
    // Both workers restart in the middle of the thread.
    config.interventions.push((
        6_500,
        Intervention::Crash {
            node: NodeId(1),
            down_ms: 1_500,
        },
    ));
    config.interventions.push((
        6_500,
        Intervention::Crash {
            node: NodeId(2),
            down_ms: 1_500,
        },
    ));
    let report = check(config);
    let o = &report.observed;

    let follow_ups: Vec<_> = o
        .tasks_created
        .iter()
        .filter(|(_, (kind, _))| *kind == TaskKind::FollowUp)
        .collect();
    let tasks: std::collections::BTreeSet<_> = follow_ups.iter().map(|(t, _)| **t).collect();
    assert_eq!(tasks.len(), 8, "eight follow-up tasks: {follow_ups:#?}");
    let parents: std::collections::BTreeSet<_> = follow_ups
        .iter()
        .filter_map(|(_, (_, parent))| *parent)
        .collect();
    assert_eq!(parents.len(), 8, "each follow-up against a distinct parent");
    // A follow-up's first session gets the standard preamble of its thread.
    for (a, s) in o.spawns.iter().filter(|(a, _)| tasks.contains(&a.task)) {
        if a.attempt == 1 {
            assert!(
                matches!(s.continuity, Continuity::Standard { .. }),
                "{a}: {:?}",
                s.continuity
            );
        }
    }
    // Every session of a follow-up task (first or re-dispatched after the restart) had a preamble.
    for s in o
        .sessions
        .iter()
        .filter(|s| tasks.contains(&s.attempt.task))
    {
        assert!(
            s.preamble.is_some(),
            "follow-up session {} without a preamble",
            s.attempt
        );
    }
    // All eight were served: each follow-up step has an accepted report.
    let served = o
        .accepted_reports
        .iter()
        .filter(|((_, step), _)| {
            o.spawns
                .values()
                .any(|s| &s.step == step && s.kind == TaskKind::FollowUp)
        })
        .count();
    assert_eq!(
        served,
        8,
        "accepted: {:#?}",
        o.accepted_reports.keys().collect::<Vec<_>>()
    );
    assert_eq!(o.native_resume_calls, 0);
    assert!(report.faults.get(keel_sim::profile::FaultKind::NodeCrash) >= 2);
}

#[test]
fn scenario_2_harness_switch_on_rate_limit() {
    let run_id = rid(2);
    let spec = run_spec(
        run_id,
        "switch",
        plan(vec![step("a", &[], Some("claude-a"), 1_000)]),
        None,
    );
    let mut config = WorldConfig::calm(2, vec![spec]);
    config
        .harness_script
        .insert(("a".into(), 1), HarnessBehaviour::RateLimited);
    let report = check(config);
    let o = &report.observed;
    let sessions = o.sessions_of("a");
    assert!(
        sessions.len() >= 2,
        "a second session after the 429: {sessions:#?}"
    );
    let first = &o.spawns[&sessions[0].attempt];
    let second = &o.spawns[&sessions[1].attempt];
    assert_eq!(first.harness, "claude-code");
    assert_ne!(second.harness, first.harness, "moved to another harness");
    assert_eq!(second.kind, TaskKind::Redispatch);
    assert!(matches!(second.continuity, Continuity::Resume { .. }));
    assert_eq!(sessions[1].preamble.as_deref(), Some("resume"));
    assert_eq!(
        Some(sessions[1].model.as_str()),
        model_of(&second.agent),
        "model from the new assignee"
    );
    assert_ne!(sessions[1].model, sessions[0].model);
    assert!(
        o.verdicts
            .iter()
            .any(|(_, v)| matches!(v, Verdict::Reroute { .. }))
    );
    assert_eq!(status(&report, run_id), RunStatus::Completed);
}

#[test]
fn scenario_4_context_saturation_redispatches_with_a_bounded_resume_preamble() {
    let run_id = rid(4);
    let spec = run_spec(
        run_id,
        "saturate",
        plan(vec![step("a", &[], None, 1_000)]),
        None,
    );
    let mut config = WorldConfig::calm(4, vec![spec]);
    config
        .harness_script
        .insert(("a".into(), 1), HarnessBehaviour::ContextSaturated);
    config
        .harness_script
        .insert(("a".into(), 2), HarnessBehaviour::ContextSaturated);
    let cap = config.specialist.context.resume_chars_max();
    let report = check(config);
    let sessions = report.observed.sessions_of("a");
    assert!(sessions.len() >= 3, "{sessions:#?}");
    let history_rows = report
        .observed
        .logs
        .get(&sessions[0].attempt)
        .map_or(0, |l| l.len());
    assert!(
        history_rows >= 160,
        "the saturated session left {history_rows} rows"
    );
    for s in &sessions[1..] {
        assert_eq!(s.preamble.as_deref(), Some("resume"));
        assert!(s.preamble_chars <= cap, "{} > {cap}", s.preamble_chars);
        // At most 50 session steps plus framing, however long the history.
        assert!(s.preamble_lines <= 50 + 20, "{} lines", s.preamble_lines);
    }
    // Two saturated attempts of history do not make the third prompt grow past the second's.
    assert!(
        sessions[2].prompt_chars <= sessions[1].prompt_chars + 1_000,
        "{} vs {}",
        sessions[2].prompt_chars,
        sessions[1].prompt_chars
    );
    assert_eq!(status(&report, run_id), RunStatus::Completed);
}

#[test]
fn scenario_5_partition_between_coordinator_and_worker() {
    let run_id = rid(5);
    let spec = run_spec(
        run_id,
        "partition",
        plan(vec![step("a", &[], None, 1_000)]),
        None,
    );
    let mut config = WorldConfig::calm(5, vec![spec]);
    // Three workers: worker 2 has no Claude Code, so the replacement goes to worker 3.
    config.supervisor.subtask_timeout_ms = 10_000;
    // The old attempt keeps resending its result long enough to outlive the partition.
    config.specialist.resends_max = 100;
    // The first spawn goes to worker 1 (both idle: ties by name); cut it off from the coordinator
    // once it has started. Its lease expires at about 3 s; the cut heals just before the old
    // attempt's resend at 24,269 ms and before worker 1's next heartbeat (at 25 s), which would have
    // the coordinator cancel the attempt it no longer expects there.
    config.interventions.push((
        100,
        Intervention::Partition {
            a: NodeId::COORDINATOR,
            b: NodeId(1),
            one_way: false,
            until_ms: 24_200,
        },
    ));
    let report = check(config);
    let o = &report.observed;
    let sessions = o.sessions_of("a");
    assert!(sessions.len() >= 2, "{sessions:#?}");
    let old = sessions[0].attempt;
    assert!(
        o.lost.contains(&old),
        "the partitioned attempt was lost (its worker's lease expired)"
    );
    assert!(
        o.late_results.contains(&old),
        "the old attempt's result arrived late"
    );
    assert!(!o.acked.contains(&old), "the late result was not accepted");
    let accepted = &o.accepted_reports[&(run_id, "a".to_string())];
    assert_eq!(accepted.len(), 1);
    assert_ne!(accepted.first(), Some(&old));
    assert_eq!(status(&report, run_id), RunStatus::Completed);
    // Issue 12: the lease expired, the replacement resumed, and worker 1 rejoined after the cut
    // (three joins at the start, one after).
    assert!(report.cluster.leases_expired >= 1, "{:?}", report.cluster);
    assert!(report.cluster.joined >= 4, "{:?}", report.cluster);
    let replacement = accepted.first().copied().expect("one accepted");
    assert!(
        matches!(
            o.spawns.get(&replacement).map(|s| s.continuity),
            Some(Continuity::Resume { .. })
        ),
        "the replacement resumes: {:?}",
        o.spawns.get(&replacement)
    );
}

#[test]
fn scenario_6_budget_trip_in_a_child() {
    let run_id = rid(6);
    // Each session spends 3,600 micro-dollars; the reservations (1,000 each) fit the 5,000 limit, the
    // spend does not. "late" depends on the others, so it asks for admission after the trip.
    let steps = vec![
        step("a", &[], None, 1_000),
        step("b", &[], None, 1_000),
        step("c", &[], None, 1_000),
        step("late", &["a", "b", "c"], None, 1_000),
    ];
    let spec = run_spec(run_id, "budget", plan(steps), Some(5_000));
    let config = WorldConfig::calm(6, vec![spec]);
    let report = check(config);
    let o = &report.observed;
    assert_eq!(status(&report, run_id), RunStatus::BudgetExceeded);
    assert_eq!(o.budget_trips, vec![run_id]);
    assert_eq!(o.admissions_after_trip, 0);
    assert!(
        o.sessions_of("late").is_empty(),
        "no work started after the trip"
    );
    let finished = report.observed.run_finished.contains_key(&run_id);
    assert!(finished, "the run ended instead of hanging");
    // Background work stopped: every specialist still running when the budget tripped was stopped.
    let stopped_steps: std::collections::BTreeSet<String> = o
        .stops
        .iter()
        .filter_map(|a| o.spawns.get(a).map(|s| s.step.clone()))
        .collect();
    let running_at_trip: std::collections::BTreeSet<String> = ["a", "b", "c"]
        .iter()
        .filter(|s| {
            !o.accepted_reports
                .contains_key(&(run_id, (**s).to_string()))
        })
        .map(|s| (*s).to_string())
        .collect();
    assert!(!running_at_trip.is_empty());
    assert!(
        running_at_trip.is_subset(&stopped_steps),
        "running {running_at_trip:?}, stopped {stopped_steps:?}"
    );
    // No spawn was admitted after the trip: a refusal by the supervisor or no request at all.
    assert!(
        o.refusals
            .iter()
            .all(|(_, r)| matches!(r, Refusal::Budget { .. })),
        "{:?}",
        o.refusals
    );
}

#[test]
fn a_full_disk_fails_the_commit_typed_and_durably_empty_and_the_retry_completes_the_run() {
    let run_id = rid(7);
    let spec = run_spec(
        run_id,
        "full disk",
        plan(vec![
            step("a", &[], None, 1_000),
            step("b", &["a"], None, 1_000),
        ]),
        None,
    );
    let mut config = WorldConfig::calm(7, vec![spec]);
    // Armed before the first stage reaches the checkpoint writer: the commit creating the run hits a
    // full disk.
    config
        .interventions
        .push((0, Intervention::Disk(DiskFault::Full)));
    let report = check(config);
    assert_eq!(report.faults.get(FaultKind::DiskFull), 1);
    let full = &report.observed.full_disk_commits;
    assert_eq!(full.len(), 1, "{full:?}");
    let (_, disk_full, synced) = full[0];
    assert!(disk_full, "the store answered DiskFull");
    assert!(!synced, "the failed commit made nothing durable");
    // The checkpoint writer retried once space was free: both steps accepted once, the run done.
    for step in ["a", "b"] {
        assert_eq!(
            report.observed.accepted_reports[&(run_id, step.to_string())].len(),
            1
        );
    }
    assert_eq!(status(&report, run_id), RunStatus::Completed);
}

/// The canonical 16-specialist run, crash-free: the reference for scenario 3.
fn canonical(seed: u64) -> WorldConfig {
    let spec = keel_sim::setup::canonical_run(rid(3), 16);
    let mut config = WorldConfig::calm(seed, vec![spec]);
    config.restart_after_ms = 500;
    config
}

/// Crashes the coordinator node after every effect boundary in `part` of `parts` and compares.
fn crash_at_every_boundary(part: u64, parts: u64) {
    let reference = check(canonical(3));
    assert_eq!(status(&reference, rid(3)), RunStatus::Completed);
    let expected = reference.observed.accepted_report_contents();
    assert_eq!(expected.len(), 16);
    let boundaries = reference.coord_effects;
    assert!(boundaries > 16 * 4, "{boundaries} effects");
    eprintln!(
        "crash-free canonical run: {boundaries} effect boundaries; this part takes every {parts}th"
    );
    for k in (1..=boundaries).filter(|k| k % parts == part) {
        let mut config = canonical(3);
        config.crash_after_coord_effect = Some(k);
        let report = run(config);
        assert!(
            report.violation.is_none(),
            "crash after effect {k}: {}",
            report
                .violation
                .as_ref()
                .map(ToString::to_string)
                .unwrap_or_default()
        );
        assert_eq!(
            report.observed.coordinator_crashes, 1,
            "crash after effect {k}"
        );
        assert_eq!(
            status(&report, rid(3)),
            RunStatus::Completed,
            "crash after effect {k}"
        );
        // The run's synthesis is the undisturbed run's. Reports made durable before the crash
        // may never be acknowledged: the restarted node's membership does not expect their
        // attempts on the workers and cancels them (as `keel node` does), so only the reports
        // acknowledged are compared, each to the undisturbed run's.
        assert_eq!(
            report.runs_final.get(&rid(3)),
            reference.runs_final.get(&rid(3)),
            "crash after effect {k}"
        );
        for (step, reports) in report.observed.accepted_report_contents() {
            assert_eq!(
                Some(&reports),
                expected.get(&step),
                "crash after effect {k}: step {step:?}"
            );
        }
    }
}

#[test]
fn scenario_3_crash_at_every_effect_boundary_part_0() {
    crash_at_every_boundary(0, 4);
}

#[test]
fn scenario_3_crash_at_every_effect_boundary_part_1() {
    crash_at_every_boundary(1, 4);
}

#[test]
fn scenario_3_crash_at_every_effect_boundary_part_2() {
    crash_at_every_boundary(2, 4);
}

#[test]
fn scenario_3_crash_at_every_effect_boundary_part_3() {
    crash_at_every_boundary(3, 4);
}

/// A late copy of a spawn reaching a worker that crashed and restarted in between must not start a
/// second session of the attempt: the restarted worker has forgotten what it hosted, and the first
/// copy may already have started (or finished) a session with the attempt's idempotency key. Every
/// remote message is duplicated with a wide latency spread, and the one worker crashes for 1 ms at
/// a range of moments around the first spawn; the checker fails any key started twice (invariant 2),
/// and at least one of these worlds must actually deliver a stale copy to a restarted worker.
#[test]
fn late_duplicate_spawn_at_a_restarted_worker_starts_no_second_session() {
    let mut stale = 0;
    for crash_at in (20..400).step_by(20) {
        let run_id = rid(7);
        let spec = run_spec(
            run_id,
            "late spawn",
            plan(vec![step("a", &[], None, 1_000)]),
            None,
        );
        let mut config = WorldConfig::calm(7, vec![spec]);
        config.workers = 1;
        let mut profile = keel_sim::profile::FaultProfile::calm();
        profile.latency_ms_min = 1;
        profile.latency_ms_max = 400;
        profile.duplicate_ppm = keel_sim::rng::PPM_ONE;
        config.profile = Some(profile);
        config.interventions.push((
            crash_at,
            Intervention::Crash {
                node: NodeId(1),
                down_ms: 1,
            },
        ));
        let report = check(config);
        stale += report.stale_spawns_refused;
        assert_eq!(status(&report, run_id), RunStatus::Completed);
    }
    assert!(
        stale > 0,
        "no world delivered a late spawn to a restarted worker"
    );
}

/// A crash-free lead run: the lead's session delegates, waits for each turn's answer, then reports.
/// Every delegated call is dispatched as a step whose report is accepted exactly once, every turn is
/// answered once with a report for each of its calls, and the run completes.
#[test]
fn a_lead_run_delegates_and_completes() {
    for seed in 0..8u64 {
        let run_id = rid(40 + u128::from(seed));
        let spec = lead_run_spec(run_id, "A led investigation", None, None);
        let mut config = WorldConfig::calm(seed, vec![spec]);
        config.harness_script.insert(
            (keel_actors::coordinator::LEAD_STEP_KEY.into(), 1),
            HarnessBehaviour::Success,
        );
        let report = check(config);
        assert_eq!(status(&report, run_id), RunStatus::Completed, "seed {seed}");
        let o = &report.observed;
        // One lead attempt asked one or two turns of 1 to 4 calls.
        assert!(
            (1..=2).contains(&o.delegations.len()),
            "seed {seed}: {:?}",
            o.delegations
        );
        let mut calls = 0usize;
        for (attempt, turn, ids) in &o.delegations {
            assert!((1..=4).contains(&ids.len()), "seed {seed}: turn {turn}");
            // The turn was answered exactly once, with a report for each of its calls.
            let answers: Vec<_> = o
                .delegation_answers
                .iter()
                .filter(|(a, t, _)| a == attempt && t == turn)
                .collect();
            assert_eq!(answers.len(), 1, "seed {seed}: turn {turn}");
            let answered: Vec<&String> = answers[0].2.iter().map(|(id, _)| id).collect();
            assert_eq!(answered, ids.iter().collect::<Vec<_>>(), "seed {seed}");
            assert!(
                answers[0].2.iter().all(|(_, report)| *report),
                "seed {seed}"
            );
            // Each call became step `t{turn}.{i}`, accepted exactly once, its report present.
            for i in 0..ids.len() {
                let key = (run_id, format!("t{turn}.{i}"));
                let accepted = o
                    .accepted_reports
                    .get(&key)
                    .expect("delegated step accepted");
                assert_eq!(accepted.len(), 1, "seed {seed}: {key:?}");
                let a = accepted.iter().next().expect("one attempt");
                let r = o.reports.get(a).expect("the delegated step's report");
                assert_eq!(r.summary, format!("t{turn}.{i}: done"));
                calls += 1;
            }
        }
        // No other step ran: the lead plus its delegations.
        let steps: Vec<&(RunId, String)> = o.accepted_reports.keys().collect();
        assert_eq!(steps.len(), calls + 1, "seed {seed}: {steps:?}");
        assert_eq!(
            o.accepted_reports
                .get(&(run_id, keel_actors::coordinator::LEAD_STEP_KEY.into()))
                .map(|a| a.len()),
            Some(1)
        );
    }
}

/// A world whose six steps each run a tool that keel's policy gates (every seed's tools gated).
fn gated(seed: u64) -> WorldConfig {
    let keys = ["a", "b", "c", "d", "e", "f"];
    let steps = keys.iter().map(|k| step(k, &[], None, 1_000)).collect();
    let mut config = WorldConfig::calm(seed, vec![run_spec(rid(4), "gated", plan(steps), None)]);
    for key in keys {
        for ordinal in 1..=4 {
            config
                .harness_script
                .insert((key.to_string(), ordinal), HarnessBehaviour::ToolRoundTrip);
        }
    }
    config.hooks_ppm = 1_000_000;
    config
}

#[test]
fn a_gated_calls_audit_stage_lost_in_a_crash_denies_the_call_after_the_wait() {
    // Undisturbed, every gated call's rows are answered durable by the checkpoint writer.
    let reference = check(gated(128));
    let outcomes = &reference.observed.hook_outcomes;
    assert!(reference.observed.gated_runs > 0, "{outcomes:?}");
    assert_eq!(outcomes.get("audit_unanswered"), None, "{outcomes:?}");
    // The coordinator node crashes after each effect boundary in turn: a host stage in flight is
    // lost with the node, its answer never comes, and its call is denied after the wait, with
    // every invariant (12 among them) holding.
    let mut unanswered = 0;
    for k in 1..=reference.coord_effects {
        let mut config = gated(128);
        config.crash_after_coord_effect = Some(k);
        let report = check(config);
        unanswered += report
            .observed
            .hook_outcomes
            .get("audit_unanswered")
            .copied()
            .unwrap_or(0);
    }
    assert!(unanswered > 0, "no crash lost a gated call's audit stage");
}
