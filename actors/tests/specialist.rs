//! The specialist: session start, harness events to log rows, typed report or typed failure, resends.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use keel_actors::context::RowSet;
use keel_actors::*;
use keel_harness::{ErrorCategory, HarnessError, HarnessEvent, HarnessKind, StopReason};
use keel_store::{LogKind, RunId, Task, TaskId, TaskKind, TaskStatus};

const TASK: TaskId = TaskId(0x01AB_CDEF);

fn start(continuity: Continuity) -> SpecialistStart {
    // A ReplyTo can only be minted inside the crate; the supervisor's spawn is the way to get one.
    let mut sup = Supervisor::new(SupervisorConfig {
        agents: vec![keel_store::AgentProfile {
            name: "alpha".into(),
            description: String::new(),
            harness: "claude-code".into(),
            model: "model-a".into(),
            account: "acct".into(),
            tools: Vec::new(),
            system_prompt: String::new(),
            limits: Default::default(),
        }],
        ..SupervisorConfig::default()
    });
    let mut out = Vec::new();
    let mut rng = SplitMix64(0);
    sup.handle(
        SupervisorInput::Msg(SupervisorMsg::OpenRun {
            run: RunId(1),
            budget: Default::default(),
        }),
        0,
        &mut rng,
        &mut out,
    );
    sup.handle(
        SupervisorInput::Msg(SupervisorMsg::Admit(Box::new(SpawnRequest {
            attempt: AttemptId {
                run: RunId(1),
                task: TASK,
                attempt: 1,
            },
            depth: 1,
            kind: TaskKind::Subtask,
            agent: None,
            account: None,
            estimate_micros: 0,
            brief: SubtaskBrief {
                step: "s".into(),
                task: TASK,
                brief: "Summarise the design.".into(),
                goal: "a summary".into(),
                quality_criteria: vec!["cite sections".into()],
                prior_findings: Vec::new(),
                output_schema: None,
                constraints: vec!["read-only".into()],
                known_gaps: Vec::new(),
                aliases: vec![TaskId(42)],
            },
            continuity,
        }))),
        0,
        &mut rng,
        &mut out,
    );
    out.into_iter()
        .find_map(|e| match e {
            Effect::SpawnSpecialist(s) => Some(*s),
            _ => None,
        })
        .unwrap()
}

fn report(id: TaskId) -> String {
    format!(
        "```json\n{{\"subtask_id\":\"{id}\",\"status\":\"complete\",\"findings\":[{{\"claim\":\"c\",\"source\":\"DESIGN.md#3\",\"confidence_permille\":900}}],\"gaps\":[],\"summary\":\"s\"}}\n```"
    )
}

/// Feed inputs to a fresh fresh-context specialist; return it and all effects, in order.
fn check(inputs: Vec<SpecialistInput>) -> (Specialist, Vec<SpecialistEffect>) {
    let mut s = Specialist::new(start(Continuity::Fresh), SpecialistConfig::default());
    let mut out = Vec::new();
    for (i, input) in inputs.into_iter().enumerate() {
        s.handle(input, 1000 + i as u64, &mut SplitMix64(0), &mut out);
    }
    (s, out)
}

fn finished(out: &[SpecialistEffect]) -> Vec<&AttemptResult> {
    out.iter()
        .filter_map(|e| match e {
            SpecialistEffect::Reply(_, SpecialistReply::Finished(r)) => Some(r),
            _ => None,
        })
        .collect()
}

fn logs(out: &[SpecialistEffect]) -> Vec<(u32, LogKind)> {
    out.iter()
        .filter_map(|e| match e {
            SpecialistEffect::Reply(_, SpecialistReply::Logs { rows }) => {
                Some(rows.iter().map(|(n, r)| (*n, r.kind)).collect::<Vec<_>>())
            }
            _ => None,
        })
        .flatten()
        .collect()
}

#[test]
fn a_fresh_attempt_starts_its_session_with_only_its_brief() {
    let (_, out) = check(vec![SpecialistInput::Begin]);
    assert!(matches!(
        out[0],
        SpecialistEffect::Emit(LifecycleEvent::SubagentStart { .. })
    ));
    let SpecialistEffect::StartHarness { key, spec } = &out[1] else {
        panic!("{out:?}")
    };
    assert_eq!(key.0, format!("start/{}/{}/1", RunId(1), TASK));
    assert_eq!(spec.model, "model-a");
    assert!(spec.prompt.starts_with("Summarise the design."));
    assert!(spec.prompt.contains("- cite sections") && spec.prompt.contains("- read-only"));
    assert!(spec.prompt.contains(&TASK.to_string()));
}

#[test]
fn harness_events_become_numbered_log_rows_and_a_report_ends_it() {
    let (_, out) = check(vec![
        SpecialistInput::Begin,
        SpecialistInput::Harness(HarnessEvent::Started {
            native_session_id: Some("n".into()),
            model: None,
        }),
        SpecialistInput::Harness(HarnessEvent::tool_use(
            "t1",
            "Read",
            "{\"path\":\"DESIGN.md\"}",
        )),
        SpecialistInput::Harness(HarnessEvent::tool_result("t1", false, "text")),
        SpecialistInput::Harness(HarnessEvent::Finished {
            stop_reason: StopReason::EndTurn,
            final_text: report(TASK),
        }),
        SpecialistInput::Harness(HarnessEvent::Text {
            text: "after the end".into(),
        }),
    ]);
    assert_eq!(
        logs(&out),
        vec![
            (1, LogKind::Lifecycle),
            (2, LogKind::ToolUse),
            (3, LogKind::ToolResult),
            (4, LogKind::Lifecycle)
        ]
    );
    let results = finished(&out);
    assert_eq!(results.len(), 1);
    let r = results[0].outcome.as_ref().unwrap();
    assert_eq!(
        (r.subtask_id, r.status, r.findings.len()),
        (TASK, ReportStatus::Complete, 1)
    );
    assert!(out.iter().any(|e| matches!(
        e,
        SpecialistEffect::Emit(LifecycleEvent::SubagentStop { .. })
    )));
    assert!(
        out.iter()
            .any(|e| matches!(e, SpecialistEffect::SetTimer { .. }))
    );
}

#[test]
fn a_report_under_an_earlier_task_id_is_accepted_as_this_task() {
    let (_, out) = check(vec![
        SpecialistInput::Begin,
        SpecialistInput::Harness(HarnessEvent::Finished {
            stop_reason: StopReason::EndTurn,
            final_text: report(TaskId(42)),
        }),
    ]);
    assert_eq!(finished(&out)[0].outcome.as_ref().unwrap().subtask_id, TASK);
}

/// The failure kind and retryability that a session's end produces.
fn check_failure(end: HarnessEvent, kind: FailureKind, retryable: bool) {
    let (_, out) = check(vec![SpecialistInput::Begin, SpecialistInput::Harness(end)]);
    let f = finished(&out)[0].outcome.clone().unwrap_err();
    assert_eq!((f.kind, f.retryable), (kind, retryable), "{f:?}");
    assert!(out.iter().any(|e| matches!(
        e,
        SpecialistEffect::Emit(LifecycleEvent::SubagentError { .. })
    )));
    assert!(!out.iter().any(|e| matches!(
        e,
        SpecialistEffect::Emit(LifecycleEvent::SubagentStop { .. })
    )));
}

#[test]
fn every_non_success_is_a_typed_failure() {
    let end = |r: StopReason, t: &str| HarnessEvent::Finished {
        stop_reason: r,
        final_text: t.into(),
    };
    check_failure(
        end(StopReason::EndTurn, "no report here"),
        FailureKind::MalformedReport,
        true,
    );
    check_failure(
        end(
            StopReason::EndTurn,
            "{\"subtask_id\":\"01ARZ3NDEKTSV4RRFFQ69G5FAV\",\"status\":\"complete\",\"findings\":[],\"summary\":\"x\"}",
        ),
        FailureKind::MalformedReport,
        true,
    );
    check_failure(
        end(StopReason::MaxTokens, &report(TASK)),
        FailureKind::NotSuccess,
        true,
    );
    check_failure(end(StopReason::Refusal, ""), FailureKind::NotSuccess, false);
    check_failure(
        end(StopReason::ModelContextWindowExceeded, ""),
        FailureKind::Harness(ErrorCategory::ContextOverflow),
        true,
    );
    check_failure(
        HarnessEvent::Failed(HarnessError::new(
            ErrorCategory::ContextOverflow,
            "SIGTERM 143",
        )),
        FailureKind::Harness(ErrorCategory::ContextOverflow),
        true,
    );
    check_failure(
        HarnessEvent::Failed(HarnessError::new(ErrorCategory::Auth, "401")),
        FailureKind::Harness(ErrorCategory::Auth),
        false,
    );
    let empty = "{\"subtask_id\":\"TASK\",\"status\":\"complete\",\"findings\":[],\"gaps\":[],\"summary\":\"\"}".replace("TASK", &TASK.to_string());
    check_failure(
        end(StopReason::EndTurn, &empty),
        FailureKind::MalformedReport,
        true,
    );
}

#[test]
fn a_rate_limit_carries_when_to_retry() {
    let (_, out) = check(vec![
        SpecialistInput::Begin,
        SpecialistInput::Harness(HarnessEvent::Failed(HarnessError::rate_limited(
            "429",
            Some(61_001),
            None,
        ))),
    ]);
    let f = finished(&out)[0].outcome.clone().unwrap_err();
    assert_eq!(f.retry_after_ms, Some(60_000), "reset time minus now");
}

#[test]
fn the_result_is_resent_until_acknowledged_then_it_exits() {
    let (s, out) = check(vec![
        SpecialistInput::Begin,
        SpecialistInput::Harness(HarnessEvent::Finished {
            stop_reason: StopReason::EndTurn,
            final_text: report(TASK),
        }),
        SpecialistInput::Timer(SpecialistTimer::ResendResult(0)),
        SpecialistInput::Timer(SpecialistTimer::ResendResult(0)), // stale: ignored
        SpecialistInput::Msg(SpecialistMsg::Ack),
    ]);
    assert_eq!(finished(&out).len(), 2);
    assert!(matches!(out.last(), Some(SpecialistEffect::Exit)));
    assert!(s.is_done());
}

#[test]
fn a_cancel_stops_the_session_and_reports_a_cancellation_once() {
    let (s, out) = check(vec![
        SpecialistInput::Begin,
        SpecialistInput::Msg(SpecialistMsg::Cancel {
            reason: "deadline".into(),
        }),
    ]);
    assert!(
        out.iter()
            .any(|e| matches!(e, SpecialistEffect::CancelHarness))
    );
    assert_eq!(
        finished(&out)[0].outcome.clone().unwrap_err().kind,
        FailureKind::Cancelled
    );
    assert!(s.is_done());
}

#[test]
fn spend_is_reported_from_usage() {
    let usage = keel_harness::UsageReport {
        scope: keel_harness::UsageScope::SessionTotal,
        counts: keel_harness::TokenCounts {
            input_tokens: 1_000_000,
            ..Default::default()
        },
    };
    let (_, out) = check(vec![
        SpecialistInput::Begin,
        SpecialistInput::Harness(HarnessEvent::Usage(usage)),
    ]);
    assert!(out.iter().any(|e| matches!(
        e,
        SpecialistEffect::Reply(
            _,
            SpecialistReply::Spend {
                spent_micros: 3_000_000
            }
        )
    )));
}

#[test]
fn a_resumed_attempt_loads_its_rows_and_gets_a_resume_preamble() {
    let mut s = Specialist::new(
        start(Continuity::Resume { from: TASK }),
        SpecialistConfig::default(),
    );
    let mut out = Vec::new();
    s.handle(SpecialistInput::Begin, 0, &mut SplitMix64(0), &mut out);
    let Some(SpecialistEffect::LoadContext(req)) = out.get(1) else {
        panic!("{out:?}")
    };
    assert_eq!(req.task, TASK);
    let mut rows = RowSet::default();
    rows.put_task(Task {
        id: TASK,
        run_id: RunId(1),
        parent: None,
        depth: 1,
        kind: TaskKind::Subtask,
        brief: "Summarise the design. (verbatim brief)".into(),
        goal: "g".into(),
        quality_criteria: Vec::new(),
        output_schema: None,
        assignee: Some("alpha".into()),
        model: Some("model-a".into()),
        observed: None,
        status: TaskStatus::Failed,
        attempt: 1,
        idempotency_key: None,
        outcome: None,
        attachments: Vec::new(),
        progress_notes: Vec::new(),
        created_ms: 0,
        updated_ms: 0,
    });
    for i in 0..200 {
        rows.append_log(
            TASK,
            keel_store::SessionLogRow {
                ts_ms: i,
                kind: LogKind::ToolUse,
                summary: format!("Read file{i} {}", "x".repeat(300)),
                detail: String::new(),
                redactions: Vec::new(),
            },
        );
    }
    out.clear();
    s.handle(
        SpecialistInput::ContextLoaded(Ok(rows)),
        1,
        &mut SplitMix64(0),
        &mut out,
    );
    let spec = out.iter().find_map(|e| match e {
        SpecialistEffect::StartHarness { spec, .. } => Some(spec),
        _ => None,
    });
    let spec = spec.expect("a session starts");
    assert!(
        spec.prompt.contains("(verbatim brief)"),
        "the brief is carried verbatim"
    );
    assert!(spec.prompt.contains("file199"), "the newest steps are kept");
    assert!(!spec.prompt.contains("file100 "), "older steps are cut");
    assert!(
        spec.prompt.chars().count() <= 16_000 + 200,
        "bounded by the resume cap"
    );
    assert_eq!(spec.model, "model-a");
    let _ = HarnessKind::ClaudeCode;
}

// Scrubbing at ingest (issue 16): what a harness produces passes the scrubber before it becomes a
// row, a report or a failure; the rows count what was removed.

#[path = "../../tests/src/secrets.rs"]
#[allow(dead_code)]
mod secrets;

fn scrubbing_specialist() -> Specialist {
    let mut config = SpecialistConfig::default();
    config
        .scrubber
        .register_secret(&secrets::registered_key())
        .unwrap();
    Specialist::new(start(Continuity::Fresh), config)
}

#[test]
fn the_corpus_is_scrubbed_and_the_look_alikes_survive() {
    let mut scrubber = context::Scrubber::new();
    scrubber
        .register_secret(&secrets::registered_key())
        .unwrap();
    let printed = secrets::printed();
    let out = scrubber.scrub(&printed);
    assert_eq!(secrets::leaked(out.text.as_bytes()), Vec::<&str>::new());
    assert_eq!(secrets::lost(out.text.as_bytes()), Vec::<&str>::new());
    let kinds = out.redactions.iter().count();
    assert!(kinds >= 15, "{} kinds: {}", kinds, out.redactions);
    assert!(out.redactions.total() >= 20, "{}", out.redactions);
    // Each secret alone is found too (not only as a neighbour of another).
    for s in secrets::corpus() {
        let alone = scrubber.scrub(&s.line);
        assert!(
            !secrets::contains(alone.text.as_bytes(), s.value.as_bytes()),
            "{}: {}",
            s.name,
            alone.text
        );
    }
}

#[test]
fn everything_a_session_produces_is_scrubbed_before_it_leaves_the_specialist() {
    let printed = secrets::printed();
    let corpus = secrets::corpus();
    let claim = corpus[4].line.clone(); // a GitHub token, in a finding
    let report = format!(
        "{{\"subtask_id\":\"{TASK}\",\"status\":\"partial\",\"findings\":[{{\"claim\":\"found {claim}\",\"source\":\"{}\",\"confidence_permille\":900}}],\"gaps\":[\"{}\"],\"summary\":\"{}\"}}",
        corpus[0].line,
        corpus[1].line,
        secrets::registered_key()
    );
    let mut s = scrubbing_specialist();
    let mut out = Vec::new();
    for (i, input) in [
        SpecialistInput::Begin,
        SpecialistInput::Harness(HarnessEvent::Started {
            native_session_id: Some(corpus[2].line.clone()),
            model: None,
        }),
        SpecialistInput::Harness(HarnessEvent::tool_use(
            "t1",
            "Bash",
            serde_json::json!({ "command": format!("echo {}", corpus[3].line) }).to_string(),
        )),
        SpecialistInput::Harness(HarnessEvent::tool_result("t1", false, printed.clone())),
        SpecialistInput::Harness(HarnessEvent::Text {
            text: printed.clone(),
        }),
        SpecialistInput::Harness(HarnessEvent::Finished {
            stop_reason: StopReason::EndTurn,
            final_text: report,
        }),
    ]
    .into_iter()
    .enumerate()
    {
        s.handle(input, 1000 + i as u64, &mut SplitMix64(0), &mut out);
    }
    let everything = format!("{out:?}");
    assert_eq!(
        secrets::leaked(everything.as_bytes()),
        Vec::<&str>::new(),
        "{everything}"
    );
    let rows: Vec<keel_store::SessionLogRow> = out
        .iter()
        .filter_map(|e| match e {
            SpecialistEffect::Reply(_, SpecialistReply::Logs { rows }) => {
                Some(rows.iter().map(|(_, r)| r.clone()))
            }
            _ => None,
        })
        .flatten()
        .collect();
    let counted = |kind: LogKind| {
        rows.iter()
            .filter(|r| r.kind == kind)
            .map(|r| context::Redactions::from_records(&r.redactions).total())
            .sum::<u32>()
    };
    assert_eq!(counted(LogKind::ToolUse), 1, "{rows:?}");
    assert!(counted(LogKind::ToolResult) >= 20, "{rows:?}");
    assert!(counted(LogKind::Text) >= 20, "{rows:?}");
    // The started row (a native id in a key's shape: 1) and the end row (the report's four) count too.
    assert_eq!(counted(LogKind::Lifecycle), 5, "{rows:?}");
    let result = finished(&out)[0].outcome.clone().unwrap();
    assert_eq!(result.findings[0].claim, "found [REDACTED:github-token]");
    assert_eq!(result.summary, "[REDACTED:registered-secret]");
    // What was not secret is kept: the look-alikes in the stored tool result.
    let stored: String = rows.iter().map(|r| r.detail.clone()).collect();
    assert_eq!(secrets::lost(stored.as_bytes()), Vec::<&str>::new());
}

#[test]
fn a_failure_is_scrubbed_too() {
    let key = secrets::corpus()[0].line.clone();
    let mut s = scrubbing_specialist();
    let mut out = Vec::new();
    for input in [
        SpecialistInput::Begin,
        SpecialistInput::Harness(HarnessEvent::Failed(HarnessError::new(
            ErrorCategory::Auth,
            format!("invalid x-api-key {key}"),
        ))),
    ] {
        s.handle(input, 1000, &mut SplitMix64(0), &mut out);
    }
    let f = finished(&out)[0].outcome.clone().unwrap_err();
    assert_eq!(f.detail, "invalid x-api-key [REDACTED:anthropic-key]");
    assert!(!format!("{out:?}").contains(&key));
}

#[test]
fn a_report_written_slightly_off_is_accepted_and_the_normalisation_is_logged() {
    let text = format!(
        "Here it is:\n{{\"subtask_id\":\"{TASK}\",\"status\":\"complete\",\"findings\":[{{\"claim\":\"c\",\"source\":\"DESIGN.md#3\",\"confidence\":0.9}}],\"summary\":\"s\"}}"
    );
    let (_, out) = check(vec![
        SpecialistInput::Begin,
        SpecialistInput::Harness(HarnessEvent::Finished {
            stop_reason: StopReason::EndTurn,
            final_text: text,
        }),
    ]);
    let report = finished(&out)[0].outcome.clone().unwrap();
    assert_eq!(report.findings[0].confidence_permille, 900);
    let said: Vec<String> = out
        .iter()
        .filter_map(|e| match e {
            SpecialistEffect::Reply(_, SpecialistReply::Logs { rows }) => Some(rows),
            _ => None,
        })
        .flatten()
        .map(|(_, row)| row.summary.clone())
        .filter(|s| s.starts_with("report normalised"))
        .collect();
    assert_eq!(said.len(), 1, "{said:?}");
    assert!(
        said[0].contains("finding 0: confidence 0.9 read as 900 per mille"),
        "{said:?}"
    );
}
