//! A session's tool calls through the pure machines (issue 11): specialist -> coordinator -> store ->
//! answer, on the deterministic host of `common`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use keel_actors::session_tool::SessionToolCall;
use keel_actors::specialist::SessionToolPath;
use keel_actors::*;
use keel_harness::{HarnessError, HarnessEvent, SessionSpec, StopReason};
use keel_store::{RunStatus, TaskId};

fn plan(steps: Vec<PlanStep>) -> Plan {
    Plan {
        steps,
        constraints: vec![],
    }
}

/// Sessions whose prompt contains `marker` (or, for `LEAD`, a lead's session) start and stay open
/// (the test drives them); every other session reports at once.
fn open_script(marker: &'static str) -> Script {
    Box::new(move |a: AttemptId, spec: &SessionSpec| {
        let open = if marker == LEAD {
            spec.append_system_prompt.is_some()
        } else {
            spec.prompt.contains(marker)
        };
        if open {
            vec![HarnessEvent::Started {
                native_session_id: None,
                model: None,
            }]
        } else {
            vec![HarnessEvent::Finished {
                stop_reason: StopReason::EndTurn,
                final_text: report_json(a.task, "complete", &format!("c{}", a.task.0 % 1000)),
            }]
        }
    })
}

/// Run until nothing is queued (timers not fired): every effect of what was delivered is applied.
fn settle(w: &mut World) {
    for _ in 0..100_000 {
        if w.queue.is_empty() {
            return;
        }
        w.step();
    }
    panic!("the world did not settle");
}

/// Marks the lead's session in [`open_script`] and [`attempt_with_prompt`].
const LEAD: &str = "<lead>";

fn attempt_with_prompt(w: &World, marker: &str) -> AttemptId {
    w.specs
        .iter()
        .find(|(_, s)| {
            if marker == LEAD {
                s.append_system_prompt.is_some()
            } else {
                s.prompt.contains(marker)
            }
        })
        .map(|(a, _)| *a)
        .unwrap_or_else(|| panic!("no session with a prompt containing {marker:?}"))
}

fn call(w: &mut World, attempt: AttemptId, call_id: &str, request: SessionRequest) {
    w.queue.push_back(Ev::Spec(
        attempt,
        SpecialistInput::ToolCall(SessionToolCall {
            call_id: call_id.into(),
            request,
        }),
    ));
}

fn answers_to(w: &World, call_id: &str) -> Vec<SessionAnswer> {
    w.tool_answers
        .iter()
        .filter(|(_, c, _)| c == call_id)
        .map(|(_, _, a)| a.clone())
        .collect()
}

fn finish(w: &mut World, attempt: AttemptId) {
    w.queue.push_back(Ev::Spec(
        attempt,
        SpecialistInput::Harness(HarnessEvent::Finished {
            stop_reason: StopReason::EndTurn,
            final_text: report_json(attempt.task, "complete", "done"),
        }),
    ));
}

fn endpoint_world(script: Script) -> World {
    let mut w = World::new(World::default_agents(), script);
    w.spec_config.session_tools = SessionToolPath::Endpoint;
    w
}

#[test]
fn report_progress_is_durable_before_it_is_answered_and_a_repeat_is_not_written_twice() {
    let mut w = endpoint_world(open_script("do a"));
    w.submit(RunMode::Plan(plan(vec![step("a", &[])])), None);
    settle(&mut w);
    let a = attempt_with_prompt(&w, "do a");
    call(
        &mut w,
        a,
        "c1",
        SessionRequest::ReportProgress {
            note: "half way".into(),
        },
    );
    // Step by step: the answer must never exist before the note is in the store.
    for _ in 0..10_000 {
        if !answers_to(&w, "c1").is_empty() {
            break;
        }
        w.step();
        let answered = !answers_to(&w, "c1").is_empty();
        let durable = w.store.tasks[&a.task].progress_notes == vec!["half way".to_string()];
        assert!(!answered || durable, "answered before the note was durable");
    }
    assert!(matches!(
        answers_to(&w, "c1").as_slice(),
        [SessionAnswer::Recorded { .. }]
    ));
    // The same call again (a retry of the session's client): answered again, not written again.
    call(
        &mut w,
        a,
        "c1",
        SessionRequest::ReportProgress {
            note: "half way".into(),
        },
    );
    settle(&mut w);
    assert_eq!(w.store.tasks[&a.task].progress_notes.len(), 1);
    finish(&mut w, a);
    w.run(100_000);
    assert_eq!(w.run_status(), Some(RunStatus::Completed));
    assert_eq!(
        w.store.tasks[&a.task].progress_notes,
        vec!["half way".to_string()],
        "the note survives the task's end"
    );
}

#[test]
fn findings_reported_survive_a_session_that_dies_afterwards() {
    let mut w = endpoint_world(open_script("do a"));
    w.submit(RunMode::Plan(plan(vec![step("a", &[])])), None);
    settle(&mut w);
    let a = attempt_with_prompt(&w, "do a");
    let finding = Finding {
        claim: "the sky is blue".into(),
        source: "https://example.org/sky".into(),
        document: None,
        page: None,
        confidence_permille: 900,
        retrieved_by: String::new(),
        retrieved_at_ms: 0,
    };
    call(
        &mut w,
        a,
        "f1",
        SessionRequest::ReportFindings {
            findings: vec![finding.clone()],
        },
    );
    settle(&mut w);
    assert!(matches!(
        answers_to(&w, "f1").as_slice(),
        [SessionAnswer::Recorded { .. }]
    ));
    // The session dies; the attempt fails (and is retried), the reported findings stay on the task.
    w.queue.push_back(Ev::Spec(
        a,
        SpecialistInput::Harness(HarnessEvent::Failed(HarnessError::system("killed"))),
    ));
    settle(&mut w);
    let row = &w.store.tasks[&a.task];
    let kept: Vec<Finding> = row
        .attachments
        .iter()
        .filter(|x| {
            x.name
                .starts_with(keel_actors::session_tool::FINDINGS_ATTACHMENT_PREFIX)
        })
        .flat_map(|x| match &x.body {
            keel_store::AttachmentBody::Inline(b) => {
                serde_json::from_str::<Vec<Finding>>(b).unwrap()
            }
            keel_store::AttachmentBody::Blob { .. } => panic!("findings are inline"),
        })
        .collect();
    assert_eq!(kept, vec![finding]);
}

#[test]
fn get_task_details_reads_the_sessions_thread_and_nothing_else() {
    let mut w = endpoint_world(open_script("do b"));
    w.submit(
        RunMode::Plan(plan(vec![step("a", &[]), step("b", &["a"])])),
        None,
    );
    // Until b's session runs (a is done by then): no timer fires, so nothing times out.
    for _ in 0..100_000 {
        if w.specs.iter().any(|(_, s)| s.prompt.contains("do b")) {
            break;
        }
        assert!(w.step());
    }
    settle(&mut w);
    let b = attempt_with_prompt(&w, "do b");
    let a_task = w
        .store
        .tasks
        .values()
        .find(|t| t.brief.starts_with("do a"))
        .unwrap()
        .id;
    let root = w.store.tasks[&b.task].parent.unwrap();
    let elsewhere = TaskId(0x0999_0000_0000_0000_0000_0000_0000_0001);
    call(
        &mut w,
        b,
        "d1",
        SessionRequest::GetTaskDetails { task: a_task },
    );
    call(
        &mut w,
        b,
        "d2",
        SessionRequest::GetTaskDetails { task: root },
    );
    call(
        &mut w,
        b,
        "d3",
        SessionRequest::GetTaskDetails { task: elsewhere },
    );
    settle(&mut w);
    match answers_to(&w, "d1").as_slice() {
        [SessionAnswer::TaskDetails(d)] => {
            assert_eq!(d.task, a_task);
            assert!(d.brief.starts_with("do a"));
            assert!(
                d.outcome.as_deref().is_some_and(|o| o.contains("c")),
                "a dependency's outcome is shown: {d:?}"
            );
        }
        other => panic!("the dependency is readable: {other:?}"),
    }
    assert!(matches!(
        answers_to(&w, "d2").as_slice(),
        [SessionAnswer::TaskDetails(d)] if d.task == root
    ));
    assert_eq!(
        answers_to(&w, "d3"),
        vec![SessionAnswer::Refused(ToolRefusal::NotInThread {
            task: elsewhere
        })],
        "a task of another run (or none) is never read"
    );
}

#[test]
fn a_call_of_an_ended_session_is_refused_and_changes_nothing() {
    let mut w = endpoint_world(open_script("do a"));
    w.submit(RunMode::Plan(plan(vec![step("a", &[])])), None);
    settle(&mut w);
    let a = attempt_with_prompt(&w, "do a");
    finish(&mut w, a);
    settle(&mut w);
    let before = w.store.tasks[&a.task].clone();
    call(
        &mut w,
        a,
        "late",
        SessionRequest::ReportProgress {
            note: "too late".into(),
        },
    );
    settle(&mut w);
    // The specialist may be gone already (acknowledged): then nothing answers here, and the
    // endpoint's own close answers it; if it is still there it refuses.
    assert!(
        answers_to(&w, "late")
            .iter()
            .all(|x| *x == SessionAnswer::Refused(ToolRefusal::SessionEnded))
    );
    assert_eq!(w.store.tasks[&a.task].progress_notes, before.progress_notes);
}

#[test]
fn a_lead_delegates_three_subtasks_in_one_call_and_gets_their_three_reports() {
    let mut w = endpoint_world(open_script(LEAD));
    w.submit(
        RunMode::Lead {
            agent: Some("alpha".into()),
            constraints: vec![],
        },
        None,
    );
    settle(&mut w);
    let lead = attempt_with_prompt(&w, LEAD);
    let calls = || {
        ["x", "y", "z"]
            .iter()
            .map(|id| DelegationCall {
                call_id: (*id).into(),
                brief: format!("do {id}"),
                goal: format!("goal {id}"),
                quality_criteria: vec![],
                output_schema: None,
                assignee: None,
            })
            .collect()
    };
    call(
        &mut w,
        lead,
        "del",
        SessionRequest::Delegate { calls: calls() },
    );
    for _ in 0..100_000 {
        if !answers_to(&w, "del").is_empty() || !w.step() {
            break;
        }
    }
    match answers_to(&w, "del").as_slice() {
        [SessionAnswer::Delegated(results)] => {
            let ids: Vec<&str> = results.iter().map(|(id, _)| id.as_str()).collect();
            assert_eq!(ids, vec!["x", "y", "z"]);
            assert!(
                results
                    .iter()
                    .all(|(_, o)| matches!(o, StepOutcome::Report(_)))
            );
        }
        other => panic!("the lead's delegate call is answered with three reports: {other:?}"),
    }
    assert!(
        w.max_live >= 3,
        "the three subtasks ran in parallel with the lead"
    );
    // The same call delivered again after its answer (a late duplicate) delegates nothing more.
    call(
        &mut w,
        lead,
        "del",
        SessionRequest::Delegate { calls: calls() },
    );
    settle(&mut w);
    assert_eq!(w.coordinator.steps().len(), 4, "nothing delegated twice");
    finish(&mut w, lead);
    w.run(100_000);
    assert_eq!(w.run_status(), Some(RunStatus::Completed));
    let keys: Vec<String> = w.coordinator.steps().into_iter().map(|s| s.0).collect();
    assert_eq!(keys, vec!["lead", "t1.0", "t1.1", "t1.2"]);
}

#[test]
fn a_session_that_is_not_a_lead_cannot_delegate() {
    let mut w = endpoint_world(open_script("do a"));
    w.submit(RunMode::Plan(plan(vec![step("a", &[])])), None);
    settle(&mut w);
    let a = attempt_with_prompt(&w, "do a");
    call(
        &mut w,
        a,
        "del",
        SessionRequest::Delegate {
            calls: vec![DelegationCall {
                call_id: "x".into(),
                brief: "do x".into(),
                goal: "gx".into(),
                quality_criteria: vec![],
                output_schema: None,
                assignee: None,
            }],
        },
    );
    settle(&mut w);
    assert_eq!(
        answers_to(&w, "del"),
        vec![SessionAnswer::Refused(ToolRefusal::NotALead)]
    );
    assert_eq!(w.coordinator.steps().len(), 1, "nothing was delegated");
}

/// A run of one step whose session (attempt `a`, returned) has just called `escalate` as call `e1`
/// with `options`; nothing of the call is handled yet.
fn escalating_world(options: Vec<String>) -> (World, AttemptId) {
    let mut w = endpoint_world(open_script("do a"));
    w.submit(RunMode::Plan(plan(vec![step("a", &[])])), None);
    settle(&mut w);
    let a = attempt_with_prompt(&w, "do a");
    call(
        &mut w,
        a,
        "e1",
        SessionRequest::Escalate {
            reason: "two specs disagree".into(),
            question: "which spec wins?".into(),
            options,
        },
    );
    (w, a)
}

#[test]
fn escalate_records_a_self_contained_escalation_before_it_answers() {
    let (mut w, a) = escalating_world(vec!["v1".into(), "v2".into()]);
    settle(&mut w);
    assert!(matches!(
        answers_to(&w, "e1").as_slice(),
        [SessionAnswer::Recorded { .. }]
    ));
    let e = w
        .store
        .escalations
        .last()
        .expect("an escalation row")
        .clone();
    assert_eq!(e.task_id, Some(a.task));
    assert_eq!(e.asked, "which spec wins?");
    assert_eq!(e.options, vec!["v1".to_string(), "v2".to_string()]);
    assert_eq!(e.waiting, keel_store::EscalationWait::Task);
    assert!(
        e.recommended_action.contains("\"v1\", \"v2\""),
        "{}",
        e.recommended_action
    );
    // The task waits for the human, durably; its session was stopped and nothing else starts.
    assert_eq!(w.coordinator.steps()[0].1, StepStatus::AwaitingHuman);
    assert_eq!(
        w.store.tasks[&a.task].status,
        keel_store::TaskStatus::Paused
    );
    assert!(!w.specs.iter().any(|(x, _)| x.attempt > a.attempt));
    // A recovered coordinator keeps waiting instead of running the task again.
    let rows = w.store.recovered(a.run);
    let mut recovered = Coordinator::new(CoordinatorConfig::default());
    let mut out = Vec::new();
    recovered.handle(
        CoordinatorInput::Recovered(Box::new(rows)),
        1,
        &mut SplitMix64(9),
        &mut out,
    );
    assert_eq!(recovered.steps()[0].1, StepStatus::AwaitingHuman);
    // The answer (made durable by the host) starts the task's next attempt with a resume preamble.
    w.queue.push_back(Ev::Coord(CoordinatorInput::Msg(
        CoordinatorMsg::EscalationAnswered {
            escalation: e.id,
            task: a.task,
        },
    )));
    settle(&mut w);
    let next = w
        .specs
        .iter()
        .find(|(x, _)| x.task == a.task && x.attempt == a.attempt + 1)
        .expect("the task's next attempt started");
    assert!(
        next.1.prompt.contains("Resum") || next.1.prompt.contains("resum"),
        "{}",
        next.1.prompt
    );
    // Answering again changes nothing.
    w.queue.push_back(Ev::Coord(CoordinatorInput::Msg(
        CoordinatorMsg::EscalationAnswered {
            escalation: e.id,
            task: a.task,
        },
    )));
    settle(&mut w);
    assert!(
        !w.specs
            .iter()
            .any(|(x, _)| x.task == a.task && x.attempt > a.attempt + 1)
    );
}

#[test]
fn an_escalated_attempt_that_ends_before_its_escalation_is_durable_is_acknowledged_only_after() {
    let (mut w, a) = escalating_world(vec![]);
    // The session ends at once (its client gave up waiting for the answer): its result reaches the
    // coordinator right behind the call, before the escalation's commit.
    w.queue.push_back(Ev::Spec(
        a,
        SpecialistInput::Harness(HarnessEvent::Finished {
            stop_reason: StopReason::EndTurn,
            final_text: report_json(a.task, "complete", "done anyway"),
        }),
    ));
    for _ in 0..100_000 {
        if w.queue.is_empty() {
            break;
        }
        w.step();
        if w.delivered_acks.contains(&a) {
            // The acknowledgement lets the specialist exit: the escalation and the paused task
            // must be durable by then (docs/DESIGN.md §12, invariant 1).
            assert!(
                w.store
                    .escalations
                    .iter()
                    .any(|e| e.task_id == Some(a.task)),
                "acknowledged before the escalation was durable"
            );
            assert_eq!(
                w.store.tasks[&a.task].status,
                keel_store::TaskStatus::Paused
            );
        }
    }
    assert!(
        w.delivered_acks.contains(&a),
        "the attempt was acknowledged"
    );
    assert_eq!(w.coordinator.steps()[0].1, StepStatus::AwaitingHuman);
}
