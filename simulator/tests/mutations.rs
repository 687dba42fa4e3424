//! The checker is shown to catch what it claims (issue 10): for every invariant the simulator checks,
//! a world with that invariant broken on purpose (a [`Mutation`] of the host) must end with a
//! violation of exactly that invariant, carrying the world's seed; and the same world without the
//! mutation must end clean, so it is the defect that is caught, not the scenario.

#![allow(clippy::expect_used)] // test helpers: a panic is the failure report
use keel_actors::Plan;
use keel_sim::profile::HarnessBehaviour;
use keel_sim::setup::{run_spec, step};
use keel_sim::soak::same_seed_same_trace;
use keel_sim::violation::Invariant;
use keel_sim::{Intervention, Mutation, WorldConfig, run};
use keel_store::RunId;

fn rid(n: u128) -> RunId {
    RunId((0x0190_0000_0000_u128 << 80) | n)
}

fn plan(steps: Vec<keel_actors::PlanStep>) -> Plan {
    Plan {
        steps,
        constraints: vec!["cite sources".into()],
    }
}

/// A calm world of one run with independent steps `keys`, each session scripted as `behaviour`.
fn steps_world(seed: u64, keys: &[&str], behaviour: HarnessBehaviour) -> WorldConfig {
    let steps = keys.iter().map(|k| step(k, &[], None, 1_000)).collect();
    let mut config = WorldConfig::calm(seed, vec![run_spec(rid(1), "mutants", plan(steps), None)]);
    for key in keys {
        for ordinal in 1..=4 {
            config
                .harness_script
                .insert(((*key).to_string(), ordinal), behaviour);
        }
    }
    config
}

/// A calm world whose run keeps a step hanging while a follow-up on step "thread" asks for
/// `agent` (and, with `second_run`, another run works beside it).
fn follow_up_world(seed: u64, agent: Option<&str>, second_run: bool) -> WorldConfig {
    let mut runs = vec![run_spec(
        rid(1),
        "threads",
        plan(vec![
            step("thread", &[], Some("claude-a"), 1_000),
            step("wait", &[], None, 1_000),
        ]),
        None,
    )];
    if second_run {
        runs.push(run_spec(
            rid(2),
            "neighbour",
            plan(vec![step("other", &[], None, 1_000)]),
            None,
        ));
    }
    let mut config = WorldConfig::calm(seed, runs);
    config
        .harness_script
        .insert(("wait".into(), 1), HarnessBehaviour::Hang);
    config.interventions.push((
        5_000,
        Intervention::FollowUp {
            run: rid(1),
            step: Some("thread".into()),
            brief: "Follow-up: also check the edge case.".into(),
            agent: agent.map(Into::into),
        },
    ));
    config
}

/// Runs `config` clean, then with `mutation`, and checks the mutant is caught as `invariant` (with
/// `detail` in the message) and the seed.
fn caught(mut config: WorldConfig, mutation: Mutation, invariant: Invariant, detail: &str) {
    let seed = config.seed;
    let clean = run(config.clone());
    assert!(
        clean.violation.is_none(),
        "the world without {mutation:?} must be clean: {}",
        clean.violation.map(|v| v.to_string()).unwrap_or_default()
    );
    config.mutation = Some(mutation);
    let report = run(config);
    let violation = report
        .violation
        .unwrap_or_else(|| panic!("{mutation:?} went unnoticed"));
    assert_eq!(
        violation.invariant, invariant,
        "{mutation:?} was reported as another invariant: {violation}"
    );
    assert_eq!(violation.seed, seed);
    assert!(
        violation.detail.contains(detail),
        "{mutation:?}: expected {detail:?} in: {violation}"
    );
    assert!(violation.to_string().contains(&format!("{seed:#018x}")));
}

#[test]
fn invariant_1_an_acknowledgement_before_the_result_is_durable_is_caught() {
    caught(
        steps_world(101, &["a"], HarnessBehaviour::Success),
        Mutation::AckBeforeDurable,
        Invariant::NoTaskLost,
        "acknowledged before durable",
    );
}

#[test]
fn invariant_1_a_task_left_open_in_a_finished_run_is_caught() {
    // Every session of the one step is malformed: the step fails for good, the run fails, and its
    // root task must end `Failed`.
    let mut config = steps_world(102, &["a"], HarnessBehaviour::Malformed);
    for ordinal in 1..=64 {
        config
            .harness_script
            .insert(("a".into(), ordinal), HarnessBehaviour::Malformed);
    }
    caught(
        config,
        Mutation::LoseTaskEnd,
        Invariant::NoTaskLost,
        "but its task",
    );
}

#[test]
fn invariant_18_a_frame_the_protocol_cannot_carry_is_caught() {
    caught(
        steps_world(118, &["a"], HarnessBehaviour::Success),
        Mutation::TruncateFrame,
        Invariant::WireCarries,
        "did not decode",
    );
}

#[test]
fn invariant_2_a_session_started_twice_for_one_key_is_caught() {
    caught(
        steps_world(103, &["a"], HarnessBehaviour::Success),
        Mutation::StartSessionTwice,
        Invariant::IdempotentOnce,
        "started twice",
    );
}

#[test]
fn invariant_2_a_step_accepted_twice_is_caught() {
    // Step "a" is accepted before the coordinator node crashes (step "wait" keeps the run open);
    // the mutant's recovery read forgets that, so "a" runs again and a second report is accepted.
    let mut config = follow_up_world(123, None, false);
    config.interventions = vec![(
        5_000,
        Intervention::Crash {
            node: keel_sim::net::NodeId::COORDINATOR,
            down_ms: 500,
        },
    )];
    caught(
        config,
        Mutation::ForgetDoneMarkers,
        Invariant::IdempotentOnce,
        "had reports of several attempts accepted",
    );
}

#[test]
fn invariant_3_a_tool_use_answered_twice_is_caught() {
    caught(
        steps_world(104, &["a"], HarnessBehaviour::ToolRoundTrip),
        Mutation::AnswerToolUseTwice,
        Invariant::ToolPairing,
        "a second time",
    );
}

#[test]
fn invariant_3_a_tool_use_left_unanswered_at_the_end_is_caught() {
    caught(
        steps_world(105, &["a"], HarnessBehaviour::Success),
        Mutation::LeaveToolUseUnanswered,
        Invariant::ToolPairing,
        "unanswered",
    );
}

#[test]
fn invariant_4_a_secret_in_a_prompt_is_caught() {
    caught(
        steps_world(106, &["a"], HarnessBehaviour::Success),
        Mutation::LeakSecretIntoPrompt,
        Invariant::PreambleBounds,
        "secret",
    );
}

#[test]
fn invariant_4_a_brief_line_missing_from_a_prompt_is_caught() {
    caught(
        steps_world(115, &["a"], HarnessBehaviour::Success),
        Mutation::CutBriefLine,
        Invariant::PreambleBounds,
        "is not intact",
    );
}

#[test]
fn invariant_4_a_preamble_over_its_cap_is_caught() {
    // The follow-up's session gets a standard preamble (its thread's context).
    caught(
        follow_up_world(116, None, false),
        Mutation::InflatePreamble,
        Invariant::PreambleBounds,
        "preamble of",
    );
}

/// A calm world of one step "a" whose first session fails with a server error, so its second
/// attempt resumes the task with a resume preamble.
fn resumed_world(seed: u64) -> WorldConfig {
    let mut config = steps_world(seed, &["a"], HarnessBehaviour::Success);
    config
        .harness_script
        .insert(("a".into(), 1), HarnessBehaviour::ServerError);
    config
}

#[test]
fn invariant_4_a_resumed_attempt_started_without_its_resume_preamble_is_caught() {
    caught(
        resumed_world(118),
        Mutation::ResumeAsFresh,
        Invariant::PreambleBounds,
        "wanted a resume preamble and got none",
    );
}

#[test]
fn invariant_4_a_fresh_attempt_given_a_preamble_is_caught() {
    caught(
        steps_world(119, &["a"], HarnessBehaviour::Success),
        Mutation::PreambleForFresh,
        Invariant::PreambleBounds,
        "starts fresh but got a resume preamble",
    );
}

#[test]
fn invariant_4_a_slash_skill_line_moved_off_line_one_is_caught() {
    let mut config = steps_world(120, &["a"], HarnessBehaviour::Success);
    let Some(runs) = config.runs.as_mut() else {
        panic!("a calm world names its runs");
    };
    let keel_actors::RunMode::Plan(plan) = &mut runs[0].mode else {
        panic!("a plan run");
    };
    plan.steps[0].brief = format!("/review the sources\n{}", plan.steps[0].brief);
    caught(
        config,
        Mutation::SlashLineNotFirst,
        Invariant::PreambleBounds,
        "is not on line one",
    );
}

#[test]
fn invariant_5_a_native_resume_flag_is_caught() {
    caught(
        steps_world(107, &["a"], HarnessBehaviour::Success),
        Mutation::PassResumeFlag,
        Invariant::NoNativeResume,
        "--resume",
    );
}

#[test]
fn invariant_6_a_follow_up_on_its_parents_model_is_caught() {
    caught(
        follow_up_world(108, Some("codex-a"), false),
        Mutation::InheritParentModel,
        Invariant::ModelFromAssignee,
        "codex-a",
    );
}

#[test]
fn invariant_7_a_reply_through_a_siblings_address_is_caught() {
    caught(
        steps_world(109, &["a", "b"], HarnessBehaviour::Success),
        Mutation::ReplyAsSibling,
        Invariant::NoSiblingAddress,
        "through the address of",
    );
}

#[test]
fn invariant_8_more_live_specialists_than_the_limit_is_caught() {
    let mut config = steps_world(
        110,
        &["a", "b", "c", "d", "e", "f"],
        HarnessBehaviour::Success,
    );
    config.supervisor.specialists_max = 2;
    caught(
        config,
        Mutation::ExceedConcurrency,
        Invariant::LimitsHold,
        "live specialists",
    );
}

#[test]
fn invariant_8_spawns_faster_than_the_rate_are_caught() {
    let mut config = steps_world(
        117,
        &["a", "b", "c", "d", "e", "f", "g", "h"],
        HarnessBehaviour::Success,
    );
    config.supervisor.spawn_burst = 2;
    config.supervisor.spawn_interval_ms = 1_000;
    caught(
        config,
        Mutation::LooseSpawnRate,
        Invariant::LimitsHold,
        "spawns admitted within",
    );
}

#[test]
fn invariant_8_an_admission_deeper_than_the_limit_is_caught() {
    // No nesting at all is allowed: every step (depth 1 under the run's root) is refused, and the
    // run fails cleanly; the mutant's supervisor admits them.
    let mut config = steps_world(121, &["a"], HarnessBehaviour::Success);
    config.supervisor.depth_max = 0;
    caught(
        config,
        Mutation::LooseDepth,
        Invariant::LimitsHold,
        "admitted at depth 1, limit 0",
    );
}

#[test]
fn invariant_8_an_admission_past_the_budget_is_caught() {
    // Six steps of 1,000 micro-dollars each under a limit of 2,500: at most two are admitted at a
    // time, and the run ends over budget; the mutant's ledger admits all six at once.
    let mut config = steps_world(
        122,
        &["a", "b", "c", "d", "e", "f"],
        HarnessBehaviour::Success,
    );
    if let Some(runs) = config.runs.as_mut() {
        runs[0].budget_limit_micros = Some(2_500);
    }
    caught(
        config,
        Mutation::LooseBudget,
        Invariant::LimitsHold,
        "over a limit of 2500",
    );
}

#[test]
fn invariant_8_an_admission_after_the_budget_tripped_is_caught() {
    // Steps estimated at one micro-dollar each, but a session spends 3,600 (1,200 tokens at the
    // specialists' price): the spend of the first sessions trips the run's limit of 5,000 while they
    // run, two at a time. The mutant host loses the trip on its way to the coordinator and rebuilds
    // the ledger without it, so the coordinator goes on dispatching and later steps are admitted.
    let keys = ["a", "b", "c", "d", "e", "f"];
    let steps = keys.iter().map(|k| step(k, &[], None, 1)).collect();
    let mut config = WorldConfig::calm(
        123,
        vec![run_spec(rid(1), "mutants", plan(steps), Some(5_000))],
    );
    config.supervisor.specialists_max = 2;
    for key in keys {
        for ordinal in 1..=4 {
            config
                .harness_script
                .insert((key.to_string(), ordinal), HarnessBehaviour::Success);
        }
    }
    caught(
        config,
        Mutation::ForgetBudgetTrip,
        Invariant::LimitsHold,
        "admitted after run",
    );
}

#[test]
fn invariant_9_a_row_written_under_another_run_is_caught() {
    caught(
        steps_world(111, &["a"], HarnessBehaviour::Success),
        Mutation::WriteAnotherRunsRow,
        Invariant::RunIsolation,
        "writes a row of run",
    );
}

#[test]
fn invariant_9_a_context_read_from_another_run_is_caught() {
    caught(
        follow_up_world(112, None, true),
        Mutation::ReadAnotherRunsScope,
        Invariant::RunIsolation,
        "was handed task",
    );
}

#[test]
fn invariant_10_a_failure_reported_as_an_empty_success_is_caught() {
    caught(
        steps_world(113, &["a", "b"], HarnessBehaviour::Malformed),
        Mutation::ReportEmptySuccess,
        Invariant::NoEmptySuccess,
        "unverified report",
    );
}

#[test]
fn invariant_11_state_kept_across_worlds_is_caught() {
    let mut config = steps_world(114, &["a"], HarnessBehaviour::Success);
    same_seed_same_trace(&config).expect("the clean world is deterministic");
    config.mutation = Some(Mutation::LeakProcessState);
    let violation = same_seed_same_trace(&config).expect_err("the leak went unnoticed");
    assert_eq!(violation.invariant, Invariant::SameSeedSameTrace);
    assert_eq!(violation.seed, 114);
}

// Issue 17's checks (docs/DESIGN.md §12: 14 for one step, 16, 17, and 1 for announced follow-ups).

/// One run of "a" (its first session hanging) and "b", with `interventions`.
fn state_world(seed: u64, a_hangs: u32, interventions: Vec<(u64, Intervention)>) -> WorldConfig {
    let steps = vec![step("a", &[], None, 1_000), step("b", &[], None, 1_000)];
    let mut config = WorldConfig::calm(seed, vec![run_spec(rid(1), "state", plan(steps), None)]);
    for n in 1..=a_hangs {
        config
            .harness_script
            .insert(("a".into(), n), HarnessBehaviour::Hang);
    }
    config.interventions = interventions;
    config
}

#[test]
fn invariant_14_a_step_cancel_the_coordinator_never_hears_of_is_caught() {
    // Cancelled in the store only: the coordinator's hung attempt times out and it retries "a".
    let cancel = Intervention::CancelTask {
        run: rid(1),
        step: "a".into(),
        reason: "not needed".into(),
    };
    caught(
        state_world(115, 1, vec![(500, cancel)]),
        Mutation::CancelAsIfNotHosted,
        Invariant::CancelStartsNothing,
        "step a",
    );
}

#[test]
fn invariant_16_a_stale_cancel_carried_out_on_an_ended_run_is_caught() {
    let cancel = Intervention::Cancel {
        run: rid(1),
        reason: "stale".into(),
    };
    caught(
        state_world(116, 0, vec![(30_000, cancel)]),
        Mutation::CancelEndedRun,
        Invariant::CancelKeepsOutcome,
        "ended Completed",
    );
}

#[test]
fn invariant_17_pauses_counted_against_a_steps_retries_are_caught() {
    let pauses = (0..6)
        .map(|i| (1_000 + i * 3_000, Intervention::Pause { down_ms: 500 }))
        .collect();
    caught(
        state_world(117, 6, pauses),
        Mutation::CountInterruptedAttempts,
        Invariant::RetriesCountFailures,
        "after 0 failed attempts",
    );
}

#[test]
fn invariant_1_a_follow_up_announced_before_it_is_durable_and_lost_in_a_crash_is_caught() {
    let follow_up = Intervention::CrashAfterFollowUp {
        run: rid(1),
        step: Some("b".into()),
        brief: "Follow-up: and the edge case?".into(),
        down_ms: 1_000,
    };
    caught(
        state_world(118, 1, vec![(500, follow_up)]),
        Mutation::AnnounceFollowUpBeforeDurable,
        Invariant::NoTaskLost,
        "was announced",
    );
}

/// A calm world of `runs` runs of independent steps `keys` (keys prefixed by the run's number for
/// the second and later), every working session calling keel's tools through the endpoint.
fn tool_world(seed: u64, runs: u128, keys: &[&str]) -> WorldConfig {
    let specs = (1..=runs)
        .map(|r| {
            let steps = keys
                .iter()
                .map(|k| step(&format!("{k}{r}"), &[], None, 1_000))
                .collect();
            run_spec(rid(r), "tools", plan(steps), None)
        })
        .collect();
    let mut config = WorldConfig::calm(seed, specs);
    config.tool_sessions_ppm = 1_000_000;
    config
}

#[test]
fn invariant_3_a_tool_use_left_unanswered_after_a_tool_call_is_caught() {
    // Every session calls keel's tools: its final event is in a later segment than its first.
    caught(
        tool_world(124, 1, &["a"]),
        Mutation::LeaveToolUseUnanswered,
        Invariant::ToolPairing,
        "unanswered",
    );
}

#[test]
fn invariant_1_findings_a_session_was_told_are_recorded_but_lost_are_caught() {
    caught(
        tool_world(125, 1, &["a", "b"]),
        Mutation::LoseReportedFindings,
        Invariant::NoTaskLost,
        "was told is recorded is not on the task's row",
    );
}

#[test]
fn invariant_2_a_delegated_subtask_delegated_twice_is_caught() {
    let mut config = WorldConfig::calm(
        126,
        vec![keel_sim::setup::lead_run_spec(rid(1), "lead", None, None)],
    );
    config.harness_script.insert(
        (keel_actors::coordinator::LEAD_STEP_KEY.to_string(), 1),
        HarnessBehaviour::Success,
    );
    caught(
        config,
        Mutation::RedeliverDelegateAsNew,
        Invariant::IdempotentOnce,
        "delegated twice",
    );
}

#[test]
fn invariant_9_a_token_that_reaches_another_run_is_caught() {
    caught(
        tool_world(127, 2, &["a", "b", "c"]),
        Mutation::TokenOfAnotherRun,
        Invariant::RunIsolation,
        "its token crossed runs",
    );
}

/// A calm world of one run whose sessions run a tool (`Bash`) through keel's policy.
fn gated_world(seed: u64) -> WorldConfig {
    let mut config = steps_world(
        seed,
        &["a", "b", "c", "d", "e", "f"],
        HarnessBehaviour::ToolRoundTrip,
    );
    config.hooks_ppm = 1_000_000;
    config
}

#[test]
fn invariant_12_a_tool_that_runs_before_its_decision_is_audited_is_caught() {
    caught(
        gated_world(128),
        Mutation::RunToolBeforeAudit,
        Invariant::HookAudited,
        "ran before its decision was audited",
    );
}

#[test]
fn invariant_12_a_mandatory_hooks_error_taken_as_allow_is_caught() {
    caught(
        gated_world(129),
        Mutation::MandatoryHookErrorAllows,
        Invariant::HookAudited,
        "although mandatory hook guard failed or timed out",
    );
}

#[test]
fn invariant_12_an_asked_tool_that_runs_without_an_approval_is_caught() {
    // Seed 236 draws three asks: one approved (its call runs after the durable approval), one
    // refused and one that expires (neither runs). Clean, the checker passes all three.
    let clean = run(gated_world(236));
    let asks = &clean.observed.hook_outcomes;
    for kind in ["ask_approved", "ask_refused", "ask_expired"] {
        assert!(
            asks.get(kind).copied().unwrap_or(0) >= 1,
            "{kind}: {asks:?}"
        );
    }
    caught(
        gated_world(236),
        Mutation::RunAskWithoutApproval,
        Invariant::HookAudited,
        "ran although it was asked about and no human was asked",
    );
}

#[test]
fn invariant_12_a_refused_or_expired_ask_that_runs_is_caught() {
    caught(
        gated_world(147),
        Mutation::RunRefusedAsk,
        Invariant::HookAudited,
        "no durable approval answers its escalation",
    );
}

#[test]
fn invariant_19_a_placement_on_a_worker_without_the_harness_is_caught() {
    // Four Claude Code steps at once: worker 2 has no Claude Code. Its heartbeats in the mutant
    // claim every harness, so the membership, spreading by load, places one there.
    let steps = ["a", "b", "c", "d"]
        .iter()
        .map(|k| step(k, &[], Some("claude-a"), 1_000))
        .collect();
    let config = WorldConfig::calm(119, vec![run_spec(rid(1), "placed", plan(steps), None)]);
    caught(
        config,
        Mutation::AdvertiseAllHarnesses,
        Invariant::PlacementFits,
        "which it does not have",
    );
}

#[test]
fn invariant_20_a_lost_workers_attempt_never_reported_down_is_caught() {
    // Step "a"'s first session hangs; every worker crashes at 2 s for 20 s. The leases expire at
    // about 5 s and the supervisor restarts "a" once a worker is back; the mutant never ticks its
    // membership, so the crashed worker's attempt stays live at the supervisor past the bound.
    let mut config = steps_world(120, &["a"], HarnessBehaviour::Success);
    config
        .harness_script
        .insert(("a".into(), 1), HarnessBehaviour::Hang);
    for node in 1..=config.workers {
        config.interventions.push((
            2_000,
            Intervention::Crash {
                node: keel_sim::net::NodeId(node),
                down_ms: 20_000,
            },
        ));
    }
    caught(
        config,
        Mutation::NeverExpireLeases,
        Invariant::LostWorkReplaced,
        "past the lease bound",
    );
}
