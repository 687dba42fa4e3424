//! The coordinator's rules, checked end to end with the real supervisor, checkpoint writer and
//! specialists on a deterministic in-memory host.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use keel_actors::*;
use keel_harness::{HarnessError, HarnessEvent, StopReason};
use keel_store::{RunStatus, TaskId, TaskKind, TaskStatus};

struct Expect<'a> {
    status: RunStatus,
    coverage: &'a [(&'a str, &'a str)],
}

/// Run a plan to the end and compare the run's status and the synthesis' coverage table.
fn check(plan: Plan, script: Script, budget: Option<u64>, expect: Expect<'_>) -> World {
    let mut w = World::new(World::default_agents(), script);
    w.submit(RunMode::Plan(plan), budget);
    let steps = w.run(100_000);
    assert!(steps < 100_000, "the run did not settle");
    assert!(w.coordinator.is_terminal(), "the run is not terminal");
    assert_eq!(
        w.run_status(),
        Some(expect.status),
        "decisions: {:#?}",
        w.decisions()
    );
    if !expect.coverage.is_empty() {
        let outcome = w.store.runs[&w.run].outcome.clone().unwrap_or_default();
        let synthesis: Synthesis = serde_json::from_str(&outcome).expect("a synthesis");
        let got: Vec<(String, String)> = synthesis
            .coverage
            .iter()
            .map(|c| (c.step.clone(), c.status.to_string()))
            .collect();
        let want: Vec<(String, String)> = expect
            .coverage
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(got, want);
        assert_eq!(
            synthesis.partial_coverage,
            want.iter().any(|(_, s)| s != "complete")
        );
    }
    w
}

fn plan(steps: Vec<PlanStep>) -> Plan {
    Plan {
        steps,
        constraints: vec!["stay read-only".into()],
    }
}

#[test]
fn a_plan_runs_in_topological_batches_and_ends_with_a_synthesis() {
    let w = check(
        plan(vec![step("a", &[]), step("b", &[]), step("c", &["a", "b"])]),
        ok_script(),
        None,
        Expect {
            status: RunStatus::Completed,
            coverage: &[("a", "complete"), ("b", "complete"), ("c", "complete")],
        },
    );
    // a and b started before either finished; c started only after both were durable.
    let order: Vec<String> = w
        .specs
        .iter()
        .map(|(a, _)| {
            w.store.tasks[&a.task]
                .brief
                .lines()
                .next()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(order, vec!["do a", "do b", "do c"]);
    let decisions = w.decisions();
    assert!(
        decisions
            .iter()
            .any(|d| d.contains("plan accepted: 3 steps in 2 batches"))
    );
    assert!(
        decisions
            .iter()
            .any(|d| d.contains("dispatch batch 1 together: [a, b]"))
    );
    assert!(decisions.iter().any(|d| d.contains("synthesis")));
    // The batch's row names its first attempts, task and all: a and b write no row of their own;
    // c, alone in its batch, is named by that batch's row.
    let root_rows: Vec<keel_store::SessionLogRow> = w
        .store
        .tasks
        .values()
        .filter(|t| t.kind == keel_store::TaskKind::Root)
        .flat_map(|t| w.store.logs.get(&t.id).cloned().unwrap_or_default())
        .map(|(_, r)| r)
        .collect();
    let batch = root_rows
        .iter()
        .find(|r| r.summary.contains("dispatch batch 1 together"))
        .unwrap();
    for (a, _) in &w.specs {
        let key = w.store.tasks[&a.task].brief.lines().next().unwrap_or("")[3..].to_string();
        let line = format!("step {key}: attempt 1 of task {} (first attempt)", a.task);
        let batch_n = if key == "c" { 2 } else { 1 };
        let named_by = root_rows
            .iter()
            .find(|r| {
                r.summary
                    .contains(&format!("dispatch batch {batch_n} together"))
            })
            .unwrap();
        assert!(
            named_by.detail.lines().any(|l| l == line),
            "{line} in {named_by:?}"
        );
        assert!(
            !decisions.iter().any(|d| d.contains(&line)),
            "no own row: {line}"
        );
    }
    assert_eq!(batch.detail.lines().count(), 2);
    // Every acknowledged result was durable first: the ack set equals the set of accepted attempts.
    assert_eq!(w.delivered_acks.len(), 3);
    for a in &w.delivered_acks {
        assert_eq!(w.store.tasks[&a.task].status, TaskStatus::Complete);
    }
}

#[test]
fn a_dependent_step_gets_only_its_dependencies_findings_and_the_constraints() {
    let w = check(
        plan(vec![step("a", &[]), step("b", &[]), step("c", &["a"])]),
        ok_script(),
        None,
        Expect {
            status: RunStatus::Completed,
            coverage: &[],
        },
    );
    let (a, _) = &w.specs[0];
    let (_, c_spec) = w
        .specs
        .iter()
        .find(|(x, _)| w.store.tasks[&x.task].brief.starts_with("do c"))
        .unwrap();
    let a_claim = format!("c{}", a.task.0 % 1000);
    let b = &w.specs[1].0;
    let b_claim = format!("c{}", b.task.0 % 1000);
    assert!(c_spec.prompt.contains(&a_claim), "c must see a's finding");
    assert!(
        !c_spec.prompt.contains(&format!("\"{b_claim}\"")),
        "c must not see b's finding"
    );
    assert!(
        c_spec.prompt.contains("stay read-only"),
        "constraints are restated"
    );
    assert!(c_spec.prompt.contains("Goal: goal of c"));
}

#[test]
fn a_cyclic_plan_is_rejected_and_nothing_is_dispatched() {
    let w = check(
        plan(vec![step("a", &["b"]), step("b", &["a"])]),
        ok_script(),
        None,
        Expect {
            status: RunStatus::Failed,
            coverage: &[],
        },
    );
    assert!(w.specs.is_empty());
    assert!(
        w.store.runs[&w.run]
            .outcome
            .as_deref()
            .unwrap_or("")
            .contains("cycle")
    );
}

fn failing_once(kind: &'static str) -> Script {
    let mut seen = std::collections::BTreeSet::new();
    let mut ok = ok_script();
    Box::new(move |a: AttemptId, spec: &keel_harness::SessionSpec| {
        let first_of_step = spec.prompt.contains("do b") && seen.insert("b");
        if first_of_step {
            let err = match kind {
                "transient" => HarnessError::transient("500 from the endpoint"),
                "rate" => HarnessError::rate_limited("429", None, Some(1000)),
                "overflow" => {
                    HarnessError::new(keel_harness::ErrorCategory::ContextOverflow, "SIGTERM 143")
                }
                _ => HarnessError::new(keel_harness::ErrorCategory::BusinessRule, "bad request"),
            };
            vec![HarnessEvent::Failed(err)]
        } else {
            ok(a, spec)
        }
    })
}

#[test]
fn only_the_failed_step_is_retried() {
    let w = check(
        plan(vec![step("a", &[]), step("b", &[])]),
        failing_once("transient"),
        None,
        Expect {
            status: RunStatus::Completed,
            coverage: &[("a", "complete"), ("b", "complete")],
        },
    );
    // a ran once, b twice (same task, attempt 2, with a resume preamble).
    let a_runs = w
        .specs
        .iter()
        .filter(|(_, s)| s.prompt.contains("do a"))
        .count();
    assert_eq!(a_runs, 1);
    let b: Vec<&AttemptId> = w
        .specs
        .iter()
        .filter(|(_, s)| s.prompt.contains("do b"))
        .map(|(a, _)| a)
        .collect();
    assert_eq!(b.len(), 2);
    assert_eq!(b[0].task, b[1].task);
    assert_eq!((b[0].attempt, b[1].attempt), (1, 2));
    assert!(
        w.specs
            .last()
            .unwrap()
            .1
            .prompt
            .contains("Continue the task above")
    );
    assert!(w.decisions().iter().any(|d| d.contains("restart after")));
}

#[test]
fn a_rate_limit_moves_the_step_to_another_harness_with_the_new_assignees_model() {
    let w = check(
        plan(vec![step("b", &[])]),
        failing_once("rate"),
        None,
        Expect {
            status: RunStatus::Completed,
            coverage: &[("b", "complete")],
        },
    );
    assert_eq!(w.specs.len(), 2);
    let (first, first_spec) = &w.specs[0];
    let (second, second_spec) = &w.specs[1];
    assert_eq!(first_spec.model, "model-a");
    assert_eq!(
        second_spec.model, "model-b",
        "the model comes from the new assignee"
    );
    let redispatch = &w.store.tasks[&second.task];
    assert_eq!(redispatch.kind, TaskKind::Redispatch);
    assert_eq!(redispatch.parent, Some(first.task));
    assert_eq!(redispatch.model.as_deref(), Some("model-b"));
    assert!(
        second_spec.prompt.contains("Continue the task above"),
        "a resume preamble"
    );
}

/// The tasks of the world's run that the store does not hold as terminal.
fn open_tasks(w: &World) -> Vec<(TaskId, TaskKind, TaskStatus)> {
    w.store
        .tasks
        .values()
        .filter(|t| t.run_id == w.run && !t.status.is_terminal())
        .map(|t| (t.id, t.kind, t.status))
        .collect()
}

#[test]
fn a_task_replaced_by_a_redispatch_ends_failed_in_the_store_with_its_replacement() {
    let w = check(
        plan(vec![step("b", &[])]),
        failing_once("rate"),
        None,
        Expect {
            status: RunStatus::Completed,
            coverage: &[("b", "complete")],
        },
    );
    let (first, _) = &w.specs[0];
    let (second, _) = &w.specs[1];
    assert_ne!(first.task, second.task, "the step was re-dispatched");
    let replaced = &w.store.tasks[&first.task];
    assert_eq!(replaced.status, TaskStatus::Failed, "the replaced task");
    let outcome: StepOutcome =
        serde_json::from_str(replaced.outcome.as_deref().unwrap_or("")).expect("an outcome");
    assert!(
        matches!(
            &outcome,
            StepOutcome::Failed(f) if matches!(f.kind, FailureKind::Harness(keel_harness::ErrorCategory::RateLimited { .. }))
        ),
        "{outcome:?}"
    );
    assert_eq!(open_tasks(&w), vec![], "every task of a finished run ends");
}

#[test]
fn a_failed_attempt_waiting_for_its_verdict_is_cancelled_in_the_store_when_the_run_is() {
    let mut w = World::new(World::default_agents(), failing_once("transient"));
    w.submit(RunMode::Plan(plan(vec![step("b", &[])])), None);
    let awaiting = |w: &World| {
        w.coordinator
            .steps()
            .first()
            .is_some_and(|s| s.1 == StepStatus::AwaitingVerdict)
    };
    while !awaiting(&w) {
        assert!(w.step(), "the attempt never failed");
    }
    w.queue
        .push_front(Ev::Coord(CoordinatorInput::Msg(CoordinatorMsg::Cancel {
            reason: "operator".into(),
        })));
    w.run(100_000);
    assert_eq!(w.run_status(), Some(RunStatus::Cancelled));
    assert_eq!(open_tasks(&w), vec![], "every task of a cancelled run ends");
}

#[test]
fn context_overflow_is_redispatched_with_a_bounded_resume_preamble() {
    let w = check(
        plan(vec![step("b", &[])]),
        failing_once("overflow"),
        None,
        Expect {
            status: RunStatus::Completed,
            coverage: &[("b", "complete")],
        },
    );
    let (second, spec) = &w.specs[1];
    assert_eq!(w.store.tasks[&second.task].kind, TaskKind::Redispatch);
    assert!(
        spec.prompt.chars().count() <= 16_000 + 2_000,
        "bounded by the resume cap"
    );
}

#[test]
fn a_non_retryable_failure_is_a_failure_and_coverage_is_annotated() {
    let w = check(
        plan(vec![step("a", &[]), step("b", &[]), step("c", &["b"])]),
        failing_once("business"),
        None,
        Expect {
            status: RunStatus::Completed,
            coverage: &[("a", "complete"), ("b", "failed"), ("c", "skipped")],
        },
    );
    assert_eq!(w.store.dead_letters.len(), 1);
    let b = w
        .store
        .tasks
        .values()
        .find(|t| t.brief.starts_with("do b"))
        .unwrap();
    assert_eq!(b.status, TaskStatus::Failed);
    assert!(
        w.specs.iter().all(|(_, s)| !s.prompt.contains("do c")),
        "c never ran"
    );
}

#[test]
fn a_run_where_every_step_fails_is_a_failed_run_not_an_empty_success() {
    let script: Script = Box::new(|_a, _s| {
        vec![HarnessEvent::Finished {
            stop_reason: StopReason::EndTurn,
            final_text: "I could not do it, sorry.".into(),
        }]
    });
    let w = check(
        plan(vec![step("a", &[])]),
        script,
        None,
        Expect {
            status: RunStatus::Failed,
            coverage: &[],
        },
    );
    // Malformed output is retried up to the retry budget, then dead-lettered.
    assert_eq!(w.store.dead_letters.len(), 1);
    assert!(w.specs.len() >= 2);
}

#[test]
fn a_budget_trip_refuses_spawns_and_ends_the_run_with_a_budget_outcome() {
    let script: Script = Box::new(|a, _s| {
        vec![
            HarnessEvent::Usage(keel_harness::UsageReport {
                scope: keel_harness::UsageScope::SessionTotal,
                counts: keel_harness::TokenCounts {
                    cost_micros: Some(600),
                    ..Default::default()
                },
            }),
            HarnessEvent::Finished {
                stop_reason: StopReason::EndTurn,
                final_text: report_json(a.task, "complete", "x"),
            },
        ]
    });
    let w = check(
        plan(vec![step("a", &[]), step("b", &[]), step("c", &["a"])]),
        script,
        Some(1_000),
        Expect {
            status: RunStatus::BudgetExceeded,
            coverage: &[],
        },
    );
    assert!(
        w.specs.iter().all(|(_, s)| !s.prompt.contains("do c")),
        "no spawn after the trip"
    );
    assert!(w.events.iter().any(|e| matches!(
        e,
        LifecycleEvent::RunFinished(RunOutcome {
            status: RunStatus::BudgetExceeded,
            ..
        })
    )));
}

#[test]
fn recovery_after_a_crash_does_not_rerun_acknowledged_work() {
    let mut w = World::new(World::default_agents(), ok_script());
    w.submit(
        RunMode::Plan(plan(vec![
            step("a", &[]),
            step("b", &[]),
            step("c", &["a", "b"]),
        ])),
        None,
    );
    // Run until a and b are durable but c has not finished.
    let ab_done = |w: &World| {
        let steps = w.coordinator.steps();
        !steps.is_empty()
            && steps
                .iter()
                .filter(|s| s.0 != "c")
                .all(|s| s.1 == StepStatus::Done)
    };
    while !ab_done(&w) {
        assert!(w.step());
    }
    let before: Vec<AttemptId> = w.specs.iter().map(|(a, _)| *a).collect();
    w.crash_and_recover();
    w.run(100_000);
    assert_eq!(w.run_status(), Some(RunStatus::Completed));
    let after: Vec<AttemptId> = w.specs.iter().map(|(a, _)| *a).skip(before.len()).collect();
    // Only c ran after the crash (a and b are acknowledged).
    assert!(
        after
            .iter()
            .all(|a| w.store.tasks[&a.task].brief.starts_with("do c")),
        "{after:?}"
    );
    assert!(
        w.decisions()
            .iter()
            .any(|d| d.contains("recovered from checkpoint: 2 steps durable"))
    );
}

#[test]
fn a_crash_at_every_input_boundary_ends_with_the_same_reports() {
    let (reference, total_inputs) = {
        let mut w = World::new(World::default_agents(), ok_script());
        w.submit(
            RunMode::Plan(plan(vec![step("a", &[]), step("b", &["a"])])),
            None,
        );
        let n = w.run(100_000);
        (w, n)
    };
    assert!(
        total_inputs > 20,
        "the reference run is not trivial: {total_inputs} inputs"
    );
    // The durable reports, read back from the store: one per step, whatever crashed in between.
    let claims = |w: &World| -> Vec<String> {
        let mut v: Vec<String> = w
            .store
            .tasks
            .values()
            .filter(|t| t.kind != TaskKind::Root && t.status.is_terminal())
            .map(|t| {
                let step = t.brief.lines().next().unwrap_or("").to_string();
                match serde_json::from_str::<StepOutcome>(t.outcome.as_deref().unwrap_or("")) {
                    Ok(StepOutcome::Report(r)) => {
                        format!("{step}:{:?}:{}", r.status, r.findings.len())
                    }
                    other => format!("{step}:{other:?}"),
                }
            })
            .collect();
        v.sort();
        v
    };
    let want = claims(&reference);
    for crash_at in 1..=total_inputs {
        let mut w = World::new(World::default_agents(), ok_script());
        w.submit(
            RunMode::Plan(plan(vec![step("a", &[]), step("b", &["a"])])),
            None,
        );
        for _ in 0..crash_at {
            if !w.step() {
                break;
            }
        }
        w.crash_and_recover();
        w.run(100_000);
        if !w.store.runs.contains_key(&w.run) {
            continue; // crashed before the run row was durable: nothing was accepted
        }
        assert_eq!(
            w.run_status(),
            Some(RunStatus::Completed),
            "crash at {crash_at}"
        );
        assert_eq!(claims(&w), want, "crash at {crash_at}");
    }
}

#[test]
fn a_lead_agent_delegates_turns_and_gets_their_outcomes() {
    let mut turn_sent = false;
    let script: Script = Box::new(move |a, spec| {
        if spec.prompt.starts_with("the run's brief") && !turn_sent {
            turn_sent = true;
            vec![
                HarnessEvent::tool_use(
                    "d1",
                    "mcp__keel__delegate",
                    "{\"calls\":[{\"call_id\":\"x\",\"brief\":\"do x\",\"goal\":\"gx\",\"quality_criteria\":[],\"output_schema\":null,\"assignee\":null},{\"call_id\":\"y\",\"brief\":\"do y\",\"goal\":\"gy\",\"quality_criteria\":[],\"output_schema\":null,\"assignee\":null}]}",
                ),
                HarnessEvent::Finished {
                    stop_reason: StopReason::EndTurn,
                    final_text: report_json(a.task, "complete", "lead"),
                },
            ]
        } else {
            vec![HarnessEvent::Finished {
                stop_reason: StopReason::EndTurn,
                final_text: report_json(a.task, "complete", "sub"),
            }]
        }
    });
    let mut w = World::new(World::default_agents(), script);
    w.submit(
        RunMode::Lead {
            agent: Some("alpha".into()),
            constraints: vec![],
        },
        None,
    );
    w.run(100_000);
    assert_eq!(w.run_status(), Some(RunStatus::Completed));
    let steps = w.coordinator.steps();
    let keys: Vec<&str> = steps.iter().map(|s| s.0.as_str()).collect();
    assert_eq!(keys, vec!["lead", "t1.0", "t1.1"]);
    assert!(
        steps
            .iter()
            .all(|s| matches!(s.2, Some(StepOutcome::Report(_))))
    );
}

/// A lead's delegation of one call per turn, as its harness emits it.
fn delegate(turn: u32, call: &str) -> HarnessEvent {
    HarnessEvent::tool_use(
        format!("d{turn}"),
        "mcp__keel__delegate",
        format!(
            "{{\"calls\":[{{\"call_id\":\"{call}\",\"brief\":\"do {call}\",\"goal\":\"g{call}\",\"quality_criteria\":[],\"output_schema\":null,\"assignee\":null}}]}}"
        ),
    )
}

/// A lead run whose first session delegates `x` in its turn 1, a node crash once `x` is durable, and
/// the lead's second session (a new attempt on the root task) emitting `resumed` before it reports;
/// run to its end.
fn lead_restarted_after_turn_one(resumed: Vec<HarnessEvent>) -> World {
    let mut lead_task = None;
    let script: Script = Box::new(move |a, _spec| {
        // The first session is the lead's, on the run's root task; its restart keeps that task.
        let lead = *lead_task.get_or_insert(a.task) == a.task;
        if lead && a.attempt == 1 {
            vec![delegate(1, "x")]
        } else if lead {
            let mut events = resumed.clone();
            events.push(HarnessEvent::Finished {
                stop_reason: StopReason::EndTurn,
                final_text: report_json(a.task, "complete", "lead"),
            });
            events
        } else {
            vec![HarnessEvent::Finished {
                stop_reason: StopReason::EndTurn,
                final_text: report_json(a.task, "complete", "sub"),
            }]
        }
    });
    let mut w = World::new(World::default_agents(), script);
    w.submit(
        RunMode::Lead {
            agent: Some("alpha".into()),
            constraints: vec![],
        },
        None,
    );
    let turn_one_done = |w: &World| {
        w.coordinator
            .steps()
            .iter()
            .any(|s| s.0 == "t1.0" && s.1 == StepStatus::Done)
    };
    while !turn_one_done(&w) {
        assert!(w.step(), "turn 1 never finished");
    }
    w.crash_and_recover();
    w.run(100_000);
    w
}

/// Sessions other than the lead's whose prompt holds `what`.
fn sessions_with(w: &World, what: &str) -> usize {
    let lead = w.specs[0].0.task;
    w.specs
        .iter()
        .filter(|(a, s)| a.task != lead && s.prompt.contains(what))
        .count()
}

#[test]
fn a_lead_recovered_after_a_crash_keeps_the_turns_it_has_not_used() {
    // The resumed lead asks turn 1 again (it is answered again, not run twice) and then a new turn
    // 2, which must run: a recovered lead used to count every turn as taken.
    let w = lead_restarted_after_turn_one(vec![delegate(1, "x"), delegate(2, "y")]);
    assert_eq!(w.run_status(), Some(RunStatus::Completed));
    let keys: Vec<String> = w.coordinator.steps().into_iter().map(|s| s.0).collect();
    assert_eq!(keys, vec!["lead", "t1.0", "t2.0"], "{:#?}", w.decisions());
    assert_eq!(
        sessions_with(&w, "do x"),
        1,
        "turn 1 asked again is answered, not run again"
    );
}

#[test]
fn a_new_session_of_the_lead_is_not_taken_for_a_repeat_of_the_old_sessions_turns() {
    // The new session numbers its turns from 1 again: its turn 1 asks for z, a subtask nobody
    // delegated, so z must run (a turn number alone used to identify a delegation: z was answered
    // with x's outcome). Its turn 2 asks for x again, which an earlier session delegated and whose
    // report is durable: it is answered from that report, never run twice.
    let w = lead_restarted_after_turn_one(vec![delegate(1, "z"), delegate(2, "x")]);
    assert_eq!(w.run_status(), Some(RunStatus::Completed));
    let keys: Vec<String> = w.coordinator.steps().into_iter().map(|s| s.0).collect();
    assert_eq!(keys, vec!["lead", "t1.0", "t2.0"], "{:#?}", w.decisions());
    assert_eq!(sessions_with(&w, "do z"), 1, "the new session's turn 1 ran");
    assert_eq!(
        sessions_with(&w, "do x"),
        1,
        "x, asked again by the new session, ran once"
    );
}

#[test]
fn disk_faults_delay_the_run_but_lose_nothing() {
    let mut w = World::new(World::default_agents(), ok_script());
    // Every commit fails 6 times in a row at first: more than the checkpoint's own retries, so the
    // coordinator's restage path runs too.
    w.fail_commits = 12;
    w.submit(
        RunMode::Plan(plan(vec![step("a", &[]), step("b", &["a"])])),
        None,
    );
    w.run(100_000);
    assert_eq!(
        w.run_status(),
        Some(RunStatus::Completed),
        "{:#?}",
        w.decisions()
    );
    assert_eq!(w.specs.len(), 2, "no step ran twice");
}

#[test]
fn a_write_the_store_refuses_fails_the_run_at_once_and_once() {
    // A refusal of the run's own write is permanent: no restage (which would be refused again,
    // seconds of backoff each), one RunFinished, the store's reason in the outcome.
    let mut w = World::new(World::default_agents(), ok_script());
    w.submit(
        RunMode::Plan(plan(vec![step("a", &[]), step("b", &["a"])])),
        None,
    );
    while w.store.tasks.is_empty() {
        assert!(w.step());
    }
    w.refuse_commits = 1;
    w.run(100_000);
    assert!(w.coordinator.is_terminal(), "{:#?}", w.decisions());
    let finished: Vec<_> = w
        .events
        .iter()
        .filter_map(|e| match e {
            LifecycleEvent::RunFinished(done) => Some(done.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(finished.len(), 1, "{finished:#?}");
    assert_eq!(finished[0].status, RunStatus::Failed);
    assert!(
        finished[0]
            .outcome
            .contains("the store refused a write of this run: checkpoint.state"),
        "{:?}",
        finished[0].outcome
    );
}

#[test]
fn follow_ups_chain_on_their_thread_with_a_preamble_even_across_a_worker_restart() {
    let mut w = World::new(World::default_agents(), ok_script());
    w.submit(RunMode::Plan(plan(vec![step("a", &[])])), None);
    // Let the run be accepted (its root task is durable), then send 8 follow-ups on the root's thread.
    while w.store.tasks.is_empty() {
        assert!(w.step());
    }
    let root = *w.store.tasks.keys().next().unwrap();
    for i in 0..8 {
        w.queue
            .push_back(Ev::Coord(CoordinatorInput::Msg(CoordinatorMsg::FollowUp(
                FollowUpRequest {
                    parent: root,
                    brief: format!("follow-up number {i}"),
                    agent: Some("beta".into()),
                    task: None,
                },
            ))));
    }
    // Restart the worker of the fourth follow-up mid-session.
    let mut restarted = false;
    for _ in 0..100_000 {
        if !restarted
            && let Some((attempt, _)) = w.specialists.iter().find(|(a, _)| {
                w.store
                    .tasks
                    .get(&a.task)
                    .is_some_and(|t| t.brief.contains("follow-up number 3"))
                    && w.specs.iter().any(|(s, _)| s == *a)
            })
        {
            let attempt = *attempt;
            w.specialists.remove(&attempt);
            w.queue.push_back(Ev::Sup(SupervisorInput::Msg(
                SupervisorMsg::SpecialistDown {
                    attempt,
                    reason: "worker restarted".into(),
                    panicked: false,
                },
            )));
            restarted = true;
        }
        if !w.step() || (w.coordinator.is_terminal() && w.queue.is_empty()) {
            break;
        }
    }
    assert!(restarted);
    assert_eq!(w.run_status(), Some(RunStatus::Completed));
    let follow_ups: Vec<&keel_store::Task> = w
        .store
        .tasks
        .values()
        .filter(|t| t.kind == TaskKind::FollowUp)
        .collect();
    assert_eq!(follow_ups.len(), 8);
    let parents: std::collections::BTreeSet<_> = follow_ups.iter().map(|t| t.parent).collect();
    assert_eq!(parents.len(), 8, "each follow-up has a distinct parent");
    for t in &follow_ups {
        assert_eq!(t.status, TaskStatus::Complete);
        assert_eq!(
            t.model.as_deref(),
            Some("model-b"),
            "the model comes from the follow-up's assignee"
        );
    }
    // Every follow-up session got a preamble from keel's rows.
    let served: Vec<_> = w
        .specs
        .iter()
        .filter(|(_, s)| s.prompt.contains("follow-up number"))
        .collect();
    assert!(served.len() >= 9, "8 follow-ups plus the restarted one");
    assert!(
        served
            .iter()
            .all(|(_, s)| s.prompt.contains("<keel-context")),
        "every follow-up session has a preamble"
    );
}

#[test]
fn steps_beyond_the_concurrency_limit_wait_for_a_slot_without_flooding_the_log() {
    let sup = SupervisorConfig {
        specialists_max: 2,
        ..World::default_agents()
    };
    let mut w = World::new(sup, ok_script());
    let steps: Vec<PlanStep> = (0..6).map(|i| step(&format!("s{i}"), &[])).collect();
    w.submit(RunMode::Plan(plan(steps)), None);
    w.run(100_000);
    assert_eq!(w.run_status(), Some(RunStatus::Completed));
    assert!(w.max_live <= 2);
    let refusals = w
        .decisions()
        .iter()
        .filter(|d| d.contains("refused: Concurrency"))
        .count();
    assert!((1..=4).contains(&refusals), "{refusals} refusal rows");
}

#[test]
fn a_late_result_of_a_timed_out_attempt_is_refused_and_not_accepted_twice() {
    // The first session of the step hangs (a partition): the deadline fires, the step runs again, and
    // the old attempt's result arrives afterwards.
    let mut first = true;
    let script: Script = Box::new(move |a, spec| {
        if std::mem::take(&mut first) {
            return vec![];
        }
        ok_script()(a, spec)
    });
    let sup = SupervisorConfig {
        subtask_timeout_ms: 5_000,
        ..World::default_agents()
    };
    let mut w = World::new(sup, script);
    w.submit(RunMode::Plan(plan(vec![step("a", &[])])), None);
    w.run(100_000);
    assert_eq!(w.run_status(), Some(RunStatus::Completed));
    let (old, _) = w.specs[0].clone();
    let accepted = w.coordinator.accepted_attempts()[0].1;
    assert!(accepted.is_some() && accepted != Some(old));
    // The old attempt's report now arrives, twice.
    for _ in 0..2 {
        let late = AttemptResult {
            attempt: old,
            outcome: Ok(serde_json::from_str::<SubagentReport>(
                report_json(old.task, "complete", "late")
                    .rsplit_once("\n")
                    .unwrap()
                    .1,
            )
            .unwrap()),
            spent_micros: 0,
        };
        w.queue.push_back(Ev::Coord(CoordinatorInput::Msg(
            CoordinatorMsg::Specialist {
                from: old,
                reply: SpecialistReply::Finished(late),
            },
        )));
    }
    while w.step() {}
    assert_eq!(
        w.coordinator.accepted_attempts()[0].1,
        accepted,
        "the accepted attempt did not change"
    );
    let outcome = w.store.tasks[&accepted.unwrap().task]
        .outcome
        .clone()
        .unwrap();
    assert!(!outcome.contains("late"), "the late report was not written");
    assert!(w.decisions().iter().any(|d| d.contains("lost (timeout)")));
}

fn finding(step: &str, claim: &str, source: &str, page: Option<u32>) -> PriorFinding {
    PriorFinding {
        step: step.into(),
        finding: Finding {
            claim: claim.into(),
            source: source.into(),
            document: None,
            page,
            confidence_permille: 500,
            retrieved_by: String::new(),
            retrieved_at_ms: 0,
        },
    }
}

#[test]
fn steps_that_disagree_about_one_source_are_kept_as_a_conflict() {
    use keel_actors::coordinator::find_conflicts;
    let found = find_conflicts(&[
        finding("a", "the limit is 20", "DESIGN.md", Some(4)),
        finding("b", "the limit is 30", "DESIGN.md", Some(4)),
        finding("c", "The limit  is 20", "DESIGN.md", Some(4)), // the same claim as a: corroboration
        finding("a", "depth is 3", "DESIGN.md", Some(5)),
        finding("a", "x", "other", None),
        finding("a", "y", "other", None), // one step saying two things is not a conflict between steps
    ]);
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].location, "DESIGN.md#@4");
    assert_eq!(
        found[0].claims,
        vec![
            ("a".to_string(), "the limit is 20".to_string()),
            ("b".to_string(), "the limit is 30".to_string())
        ]
    );
}

#[test]
fn recovering_a_finished_run_runs_nothing() {
    let mut w = World::new(World::default_agents(), ok_script());
    w.submit(RunMode::Plan(plan(vec![step("a", &[])])), None);
    w.run(100_000);
    let sessions = w.specs.len();
    w.crash_and_recover();
    w.run(100_000);
    assert!(w.coordinator.is_terminal());
    assert_eq!(w.coordinator.status(), Some(RunStatus::Completed));
    assert_eq!(
        w.specs.len(),
        sessions,
        "no session started after recovering a finished run"
    );
}

/// The subtask task of step `key` (its brief starts with `do KEY`).
fn task_of(w: &World, key: &str) -> keel_store::Task {
    w.store
        .tasks
        .values()
        .find(|t| t.kind == TaskKind::Subtask && t.brief.starts_with(&format!("do {key}")))
        .cloned()
        .unwrap()
}

#[test]
fn a_finished_run_reopened_for_a_follow_up_runs_only_the_follow_up_and_ends_again() {
    let mut w = World::new(World::default_agents(), ok_script());
    w.submit(
        RunMode::Plan(plan(vec![step("a", &[]), step("b", &[])])),
        None,
    );
    w.run(100_000);
    assert_eq!(w.run_status(), Some(RunStatus::Completed));
    let sessions = w.specs.len();
    let a = task_of(&w, "a");
    let preset = TaskId(0x0192_0000_0000_0000_0000_0000_0000_0042);
    w.reopen(FollowUpRequest {
        parent: a.id,
        brief: "and what about the tests?".into(),
        agent: Some("beta".into()),
        task: Some(preset),
    });
    w.run(100_000);
    assert_eq!(
        w.run_status(),
        Some(RunStatus::Completed),
        "{:#?}",
        w.decisions()
    );
    assert_eq!(w.specs.len(), sessions + 1, "only the follow-up ran");
    let (attempt, spec) = w.specs.last().unwrap();
    assert_eq!(
        attempt.task, preset,
        "the follow-up took the host's task id"
    );
    assert!(spec.prompt.contains("<keel-context"), "{}", spec.prompt);
    assert!(
        spec.prompt.contains("do a"),
        "the preamble carries the parent's brief: {}",
        spec.prompt
    );
    let f = &w.store.tasks[&preset];
    assert_eq!(f.kind, TaskKind::FollowUp);
    assert_eq!(f.parent, Some(a.id));
    assert_eq!(f.status, TaskStatus::Complete);
    assert_eq!(f.model.as_deref(), Some("model-b"), "from the assignee");
    // The new synthesis covers the follow-up too.
    let outcome = w.store.runs[&w.run].outcome.clone().unwrap();
    let synthesis: keel_actors::Synthesis = serde_json::from_str(&outcome).unwrap();
    let steps: Vec<&str> = synthesis.coverage.iter().map(|c| c.step.as_str()).collect();
    assert_eq!(steps, vec!["a", "b", "f1"]);
}

#[test]
fn a_follow_up_on_a_task_the_run_does_not_know_is_refused_and_the_run_ends_again() {
    let mut w = World::new(World::default_agents(), ok_script());
    w.submit(RunMode::Plan(plan(vec![step("a", &[])])), None);
    w.run(100_000);
    let sessions = w.specs.len();
    w.reopen(FollowUpRequest {
        parent: TaskId(7),
        brief: "hello?".into(),
        agent: None,
        task: None,
    });
    w.run(100_000);
    assert_eq!(w.run_status(), Some(RunStatus::Completed));
    assert_eq!(w.specs.len(), sessions, "nothing ran");
    assert!(
        w.decisions().iter().any(|d| d.contains("refused")),
        "{:#?}",
        w.decisions()
    );
}

#[test]
fn rows_of_a_terminal_run_with_a_follow_up_give_a_terminal_coordinator_that_runs_nothing() {
    let mut w = World::new(World::default_agents(), ok_script());
    w.submit(RunMode::Plan(plan(vec![step("a", &[])])), None);
    w.run(100_000);
    let sessions = w.specs.len();
    let a = task_of(&w, "a");
    // The host did not mark the run running: the rows still say Completed.
    w.coordinator = Coordinator::new(CoordinatorConfig::default());
    let rows = w.store.recovered(w.run);
    w.queue.push_back(Ev::Coord(CoordinatorInput::Reopened {
        rows: Box::new(rows),
        follow_up: FollowUpRequest {
            parent: a.id,
            brief: "more".into(),
            agent: None,
            task: None,
        },
    }));
    w.run(100_000);
    assert!(w.coordinator.is_terminal());
    assert_eq!(w.specs.len(), sessions);
}

/// Every stage in `effects`, whether sent alone or coalesced.
fn stages_in(effects: &[Effect]) -> Vec<Stage> {
    let mut stages = Vec::new();
    for e in effects {
        match e {
            Effect::Send(Envelope::Checkpoint(CheckpointMsg::Stage(s))) => stages.push(s.clone()),
            Effect::Send(Envelope::Checkpoint(
                CheckpointMsg::Stages(ss) | CheckpointMsg::Riding(ss),
            )) => stages.extend(ss.iter().cloned()),
            _ => {}
        }
    }
    stages
}

/// Answer what a coordinator asked for: every stage is durable, every admission is granted. Returns
/// the stages it sent, and stops when it asks for nothing more.
fn settle(c: &mut Coordinator, first: Vec<Effect>, rng: &mut SplitMix64) -> Vec<Stage> {
    let mut all = Vec::new();
    let mut effects = first;
    for _ in 0..1_000 {
        let mut inputs = Vec::new();
        for s in stages_in(&effects) {
            inputs.push(CoordinatorMsg::Durable { ticket: s.ticket });
            all.push(s);
        }
        for e in &effects {
            if let Effect::Send(Envelope::Supervisor(SupervisorMsg::Admit(req))) = e {
                inputs.push(CoordinatorMsg::Admission {
                    attempt: req.attempt,
                    answer: Ok(Assignment {
                        agent: "scout".into(),
                        harness: keel_harness::HarnessKind::Scripted,
                        model: "m".into(),
                        tools: Vec::new(),
                        system_prompt: String::new(),
                        turns_max: None,
                        account: "a".into(),
                    }),
                });
            }
        }
        if inputs.is_empty() {
            return all;
        }
        effects = Vec::new();
        for msg in inputs {
            c.handle(CoordinatorInput::Msg(msg), 10, rng, &mut effects);
        }
    }
    panic!("the coordinator did not settle");
}

#[test]
fn a_run_ending_with_more_tasks_in_flight_than_one_stage_holds_cancels_every_one_and_ends() {
    // The end of a run used to be cut to the stage bound, which dropped its tail: the run row itself.
    let max = 6;
    let mut c = Coordinator::new(CoordinatorConfig {
        stage_ops_max: max,
        ..CoordinatorConfig::default()
    });
    let mut rng = SplitMix64(11);
    let keys: Vec<String> = (0..12).map(|i| format!("s{i}")).collect();
    let steps = keys.iter().map(|k| step(k, &[])).collect();
    let mut out = Vec::new();
    c.handle(
        CoordinatorInput::Msg(CoordinatorMsg::Accept(RunSpec {
            run: keel_store::RunId(42),
            brief: "twelve steps at once".into(),
            mode: RunMode::Plan(plan(steps)),
            budget_limit_micros: None,
            config_snapshot: String::new(),
        })),
        1,
        &mut rng,
        &mut out,
    );
    settle(&mut c, out, &mut rng);
    let running = c.current_attempts();
    assert_eq!(running.len(), 12, "every step is in flight");

    let mut out = Vec::new();
    c.handle(
        CoordinatorInput::Msg(CoordinatorMsg::Cancel {
            reason: "operator".into(),
        }),
        20,
        &mut rng,
        &mut out,
    );
    let stages = settle(&mut c, out, &mut rng);
    for s in &stages {
        assert!(s.ops.len() <= max, "a stage of {} ops", s.ops.len());
    }
    let cancelled: std::collections::BTreeSet<TaskId> = stages
        .iter()
        .flat_map(|s| s.ops.iter())
        .filter_map(|op| match op {
            PersistOp::UpdateTask(t) if t.status == TaskStatus::Cancelled => Some(t.id),
            _ => None,
        })
        .collect();
    for a in &running {
        assert!(
            cancelled.contains(&a.task),
            "task {} was not cancelled",
            a.task
        );
    }
    let last = stages.last().expect("the end was staged");
    assert!(
        last.ops.iter().any(|op| matches!(
            op,
            PersistOp::UpdateRun(r) if r.status == RunStatus::Cancelled
        )),
        "the run row ends in the last stage"
    );
    assert_eq!(c.status(), Some(RunStatus::Cancelled));
}

#[test]
fn a_recovered_step_keeps_its_failures_and_is_parked_with_its_last_failure() {
    // One attempt per step: b's first failure spends its retries. A crash once that failure is
    // durable (in the checkpoint) and before the step is parked: the recovered coordinator parks b
    // with the failure it had, not with an empty "no attempt".
    let mut w = World::new(World::default_agents(), failing_once("transient"));
    w.coord_config.attempts_per_step_max = 1;
    w.coordinator = Coordinator::new(w.coord_config.clone());
    w.submit(
        RunMode::Plan(plan(vec![step("a", &[]), step("b", &[])])),
        None,
    );
    let failures_of_b = |w: &World| -> u32 {
        let Some(checkpoint) = w.store.checkpoints.get(&w.run) else {
            return 0;
        };
        let snapshot: coordinator::Snapshot = serde_json::from_str(&checkpoint.state).unwrap();
        snapshot.steps.get(1).map_or(0, |s| s.failures)
    };
    while failures_of_b(&w) == 0 {
        assert!(w.step(), "b's failure never became durable");
    }
    assert!(w.store.dead_letters.is_empty(), "parked before the crash");
    w.crash_and_recover();
    w.run(100_000);
    assert_eq!(w.run_status(), Some(RunStatus::Completed));
    let letter = w
        .store
        .dead_letters
        .iter()
        .find(|d| d.subject == "step b")
        .expect("b is parked");
    assert!(
        letter
            .reason
            .contains("retry budget spent: 1 failed attempts"),
        "{letter:?}"
    );
    let failure: SubtaskFailure = serde_json::from_str(&letter.payload).unwrap();
    assert_ne!(failure.kind, FailureKind::Refused, "{failure:?}");
    assert_ne!(failure.attempted, "no attempt", "{failure:?}");
    assert!(
        failure.detail.contains("500 from the endpoint"),
        "{failure:?}"
    );
    // The task row says the same.
    let b = task_of(&w, "b");
    assert_eq!(b.status, TaskStatus::Failed);
    assert!(
        b.outcome
            .unwrap_or_default()
            .contains("500 from the endpoint")
    );
}

/// Whether `effects` send stages that need a commit (`Some(true)`), only riding ones
/// (`Some(false)`), or none.
fn urgent_stages(effects: &[Effect]) -> Option<bool> {
    let mut seen = None;
    for e in effects {
        match e {
            Effect::Send(Envelope::Checkpoint(
                CheckpointMsg::Stage(_) | CheckpointMsg::Stages(_),
            )) => return Some(true),
            Effect::Send(Envelope::Checkpoint(CheckpointMsg::Riding(_))) => seen = Some(false),
            _ => {}
        }
    }
    seen
}

/// A coordinator that accepted run `run`, a plan of `parts` independent steps, and what it did.
fn accept_parts(run: u128, parts: usize, rng: &mut SplitMix64) -> (Coordinator, Vec<Effect>) {
    let mut c = Coordinator::new(CoordinatorConfig::default());
    let keys: Vec<String> = (0..parts).map(|i| format!("s{i}")).collect();
    let mut out = Vec::new();
    c.handle(
        CoordinatorInput::Msg(CoordinatorMsg::Accept(RunSpec {
            run: keel_store::RunId(run),
            brief: format!("{parts} parts"),
            mode: RunMode::Plan(plan(keys.iter().map(|k| step(k, &[])).collect())),
            budget_limit_micros: None,
            config_snapshot: String::new(),
        })),
        1,
        rng,
        &mut out,
    );
    (c, out)
}

#[test]
fn a_batchs_results_ride_together_and_the_runs_end_rides_with_the_last() {
    let mut rng = SplitMix64(5);
    let (mut c, out) = accept_parts(43, 4, &mut rng);
    assert_eq!(
        urgent_stages(&out),
        Some(true),
        "the run's creation needs a commit"
    );
    // Every stage answered durable and every admission granted; the admissions' records ride.
    settle(&mut c, out, &mut rng);
    let attempts = c.current_attempts();
    assert_eq!(attempts.len(), 4);
    let mut staged = Vec::new();
    for (i, attempt) in attempts.iter().enumerate() {
        let report = serde_json::from_str::<SubagentReport>(
            report_json(attempt.task, "complete", "part")
                .rsplit_once("\n")
                .unwrap()
                .1,
        )
        .unwrap();
        let mut out = Vec::new();
        c.handle(
            CoordinatorInput::Msg(CoordinatorMsg::Specialist {
                from: *attempt,
                reply: SpecialistReply::Finished(AttemptResult {
                    attempt: *attempt,
                    outcome: Ok(report),
                    spent_micros: 0,
                }),
            }),
            20,
            &mut rng,
            &mut out,
        );
        let last = i == attempts.len() - 1;
        // The first three ride (others still run); the last needs a commit, and the run's end
        // is staged right behind it, before either is durable.
        assert_eq!(urgent_stages(&out), Some(last), "result {i}");
        let ends = stages_in(&out).iter().any(|s| {
            s.ops
                .iter()
                .any(|op| matches!(op, PersistOp::UpdateRun(r) if r.status == RunStatus::Completed))
        });
        assert_eq!(ends, last, "result {i}");
        assert!(
            !out.iter().any(|e| matches!(
                e,
                Effect::Send(Envelope::Specialist {
                    msg: SpecialistMsg::Ack,
                    ..
                })
            )),
            "nothing is acknowledged before it is durable"
        );
        staged.extend(stages_in(&out));
    }
    // One commit makes them all durable: every result is acknowledged before the run's end.
    let mut out = Vec::new();
    for s in &staged {
        c.handle(
            CoordinatorInput::Msg(CoordinatorMsg::Durable { ticket: s.ticket }),
            30,
            &mut rng,
            &mut out,
        );
    }
    let acks = out
        .iter()
        .filter(|e| {
            matches!(
                e,
                Effect::Send(Envelope::Specialist {
                    msg: SpecialistMsg::Ack,
                    ..
                })
            )
        })
        .count();
    assert_eq!(acks, 4);
    let finished = out
        .iter()
        .position(|e| matches!(e, Effect::Emit(LifecycleEvent::RunFinished(_))))
        .expect("the run ended");
    let last_ack = out
        .iter()
        .rposition(|e| {
            matches!(
                e,
                Effect::Send(Envelope::Specialist {
                    msg: SpecialistMsg::Ack,
                    ..
                })
            )
        })
        .unwrap();
    assert!(
        last_ack < finished,
        "acknowledgements precede the run's end"
    );
    assert_eq!(c.status(), Some(RunStatus::Completed));
}

/// The run's checkpoints among `stages`, in order.
fn checkpoints_in(stages: &[Stage]) -> Vec<keel_store::Checkpoint> {
    stages
        .iter()
        .flat_map(|s| s.ops.iter())
        .filter_map(|op| match op {
            PersistOp::PutCheckpoint(c) => Some(c.clone()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_dispatch_of_many_steps_writes_one_checkpoint_of_them_all_in_one_message() {
    let mut rng = SplitMix64(7);
    let (_, out) = accept_parts(44, 5, &mut rng);
    // The run's creation and its five attempts' records: one message to the checkpoint writer,
    // whose stages it commits together.
    let messages = out
        .iter()
        .filter(|e| matches!(e, Effect::Send(Envelope::Checkpoint(_))))
        .count();
    assert_eq!(messages, 1, "{out:#?}");
    let stages = stages_in(&out);
    assert!(stages.len() >= 6, "creation and five attempts: {stages:#?}");
    // One checkpoint, in the last stage that wanted one, naming every step's attempt.
    let checkpoints = checkpoints_in(&stages);
    assert_eq!(checkpoints.len(), 1);
    let snapshot: keel_actors::coordinator::Snapshot =
        serde_json::from_str(&checkpoints[0].state).unwrap();
    assert_eq!(snapshot.steps.len(), 5);
    assert!(
        snapshot
            .steps
            .iter()
            .all(|s| s.tasks.len() == 1 && s.attempt == 1)
    );
    assert_eq!(checkpoints[0].pending_work.len(), 5);
    let with = stages
        .iter()
        .rposition(|s| {
            s.ops
                .iter()
                .any(|op| matches!(op, PersistOp::PutCheckpoint(_)))
        })
        .unwrap();
    assert!(
        stages[with]
            .ops
            .iter()
            .any(|op| matches!(op, PersistOp::CreateTask(t) if t.attempt == 1 && t.idempotency_key.is_some())),
        "it rides in the last attempt's stage"
    );
    // An attempt's record is its task row (attempt and key), not an idempotency row beside it.
    assert!(
        stages
            .iter()
            .flat_map(|s| s.ops.iter())
            .all(|op| !matches!(op, PersistOp::RecordIdempotency(_))),
        "{stages:#?}"
    );
}
