//! The session tools on the runtime's real path: the ractor runtime on a real redb file, keel's own
//! agent loop (the in-process scripted model) calling keel's tools through this crate's endpoint
//! over HTTP on 127.0.0.1, the coordinator staging and answering.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use keel_actors::runtime::{HarnessSet, Runtime, RuntimeConfig, scripted};
use keel_actors::{Plan, RunMode};
use keel_harness::HarnessKind;
use keel_harness::scripted::{Script, ScriptToolCall, ScriptTurn, ScriptedHarness};
use keel_mcp::{EndpointConfig, McpEndpoint};
use keel_store::{LogKind, RunStatus, Sharing, Store, StoreConfig, TaskKind, TaskStatus};
use serde_json::json;
use std::sync::Arc;
use std::time::Duration;

fn config(work: &std::path::Path) -> RuntimeConfig {
    let mut c = RuntimeConfig::default();
    c.supervisor.agents = vec![keel_actors::runtime::scripted::scripted_agent()];
    c.supervisor.spawn_burst = 64;
    c.supervisor.spawn_interval_ms = 1;
    c.specialist.working_dir = work.to_path_buf();
    c.specialist.resend_interval_ms = 200;
    c.stop_grace_ms = 1_000;
    c
}

struct Node {
    _dir: tempfile::TempDir,
    store: Arc<Store>,
    endpoint: Arc<McpEndpoint>,
    rt: Runtime,
}

async fn node(script: Script) -> Node {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let store = Arc::new(
        Store::open_with(
            dir.path().join("keel.redb"),
            StoreConfig {
                sharing: Sharing::WithReaders,
                ..StoreConfig::default()
            },
        )
        .unwrap(),
    );
    let endpoint = Arc::new(McpEndpoint::start(EndpointConfig::default()).await.unwrap());
    let harnesses = HarnessSet::new()
        .with(
            HarnessKind::Scripted,
            Arc::new(ScriptedHarness::new(script)),
        )
        .with_session_endpoint(endpoint.clone());
    let (rt, _events) = Runtime::start(store.clone(), harnesses, config(&work))
        .await
        .unwrap();
    Node {
        _dir: dir,
        store,
        endpoint,
        rt,
    }
}

fn call(name: &str, input: serde_json::Value) -> ScriptTurn {
    ScriptTurn {
        tool_calls: vec![ScriptToolCall {
            name: Some(name.into()),
            input: Some(input),
            shell: None,
        }],
        ..ScriptTurn::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_reports_progress_through_the_endpoint_and_the_note_is_durable() {
    // Turn 1: keel's loop calls report_progress on the endpoint; turn 2 (by the prompt rules):
    // RUN_TOOL prints the step's report, which the model echoes as its answer.
    let script = Script::from_turns(vec![call(
        "mcp__keel__report_progress",
        json!({"note": "half way there"}),
    )]);
    let n = node(script).await;
    let step = scripted::step("noted", "Say hello.", "echo hello", "echo", &[]).unwrap();
    let plan = Plan {
        steps: vec![step],
        constraints: vec![],
    };
    let handle =
        n.rt.submit("progress".into(), RunMode::Plan(plan), None, "test".into())
            .await
            .unwrap();
    let run = handle.id();
    let outcome = tokio::time::timeout(Duration::from_secs(60), handle.finished())
        .await
        .expect("the run finishes")
        .unwrap();
    assert_eq!(outcome.status, RunStatus::Completed, "{}", outcome.outcome);
    let tasks = n.store.run(run).tasks(None, 100).unwrap().items;
    let task = tasks.iter().find(|t| t.kind != TaskKind::Root).unwrap();
    assert_eq!(task.progress_notes, vec!["half way there".to_string()]);
    let log = n.store.run(run).last_log_rows(task.id, 50).unwrap();
    assert!(
        log.iter().any(|r| r.value.kind == LogKind::ToolResult
            && r.value.summary.contains("recorded: progress note 1")),
        "the session got the coordinator's answer: {log:#?}"
    );
    assert_eq!(
        n.endpoint.registry().open_count(),
        0,
        "the session's token was revoked when it ended"
    );
    n.rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lead_delegates_three_subtasks_in_one_call_and_ends_with_their_reports() {
    let subtasks: Vec<serde_json::Value> = (1..=3)
        .map(|i| {
            let brief = scripted::report_brief(
                &format!("Part {i}."),
                &format!("echo part {i} done"),
                "echo",
                &format!("part {i}"),
            )
            .unwrap();
            json!({"id": format!("part-{i}"), "brief": brief, "goal": format!("part {i}")})
        })
        .collect();
    // Turn 1 is the lead's first request (it is the run's only session then): one delegate call
    // with three subtasks. Everything after follows the prompt rules: each subtask runs its
    // RUN_TOOL command; the lead, whose brief holds REPORT_AFTER_TOOL, reports once answered.
    let script = Script::from_turns(vec![call(
        "mcp__keel__delegate",
        json!({"subtasks": subtasks}),
    )]);
    let n = node(script).await;
    let handle =
        n.rt.submit(
            "Lead the three parts. REPORT_AFTER_TOOL".into(),
            RunMode::Lead {
                agent: Some("scripted".into()),
                constraints: vec![],
            },
            None,
            "test".into(),
        )
        .await
        .unwrap();
    let run = handle.id();
    let outcome = tokio::time::timeout(Duration::from_secs(90), handle.finished())
        .await
        .expect("the run finishes")
        .unwrap();
    assert_eq!(outcome.status, RunStatus::Completed, "{}", outcome.outcome);
    let tasks = n.store.run(run).tasks(None, 100).unwrap().items;
    let subtasks: Vec<_> = tasks
        .iter()
        .filter(|t| t.kind == TaskKind::Subtask)
        .collect();
    assert_eq!(subtasks.len(), 3, "{tasks:#?}");
    assert!(subtasks.iter().all(|t| t.status == TaskStatus::Complete));
    let root = tasks.iter().find(|t| t.kind == TaskKind::Root).unwrap();
    assert_eq!(root.status, TaskStatus::Complete);
    // The lead's delegate call was answered with the three reports, by the ids it gave.
    let log = n.store.run(run).last_log_rows(root.id, 200).unwrap();
    let answer = log
        .iter()
        .find(|r| r.value.kind == LogKind::ToolResult)
        .map(|r| r.value.detail.clone())
        .expect("the lead's delegate call has a result row");
    for i in 1..=3 {
        assert!(answer.contains(&format!("part-{i}")), "{answer}");
    }
    assert!(answer.contains("Report"), "{answer}");
    n.rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_echoes_its_mcp_token_leaves_it_nowhere_in_the_store() {
    // The step's command prints the session's own token (and keeps a copy for the test): the
    // specialist registered the token with its scrubber before the session started, so the tool
    // result, the report's finding and every row hold a redaction marker instead (issue 16).
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("token-copy");
    let command = format!(
        "printf %s \"$KEEL_MCP_TOKEN\" > {}; echo token=$KEEL_MCP_TOKEN",
        copy.display()
    );
    // Turn 1 runs the command; then the step's REPORT_AFTER_TOOL rule reports.
    let n = node(Script::from_turns(vec![ScriptTurn {
        tool_calls: vec![ScriptToolCall {
            name: None,
            input: None,
            shell: Some(command),
        }],
        ..ScriptTurn::default()
    }]))
    .await;
    let plan = Plan {
        steps: vec![keel_actors::PlanStep {
            key: "echo-token".into(),
            brief: "Print the token. REPORT_AFTER_TOOL".into(),
            goal: "print the token".into(),
            quality_criteria: Vec::new(),
            output_schema: None,
            assignee: None,
            depends_on: Vec::new(),
            estimate_micros: 0,
        }],
        constraints: vec![],
    };
    let handle =
        n.rt.submit("token".into(), RunMode::Plan(plan), None, "test".into())
            .await
            .unwrap();
    let run = handle.id();
    let outcome = tokio::time::timeout(Duration::from_secs(60), handle.finished())
        .await
        .expect("the run finishes")
        .unwrap();
    assert_eq!(outcome.status, RunStatus::Completed, "{}", outcome.outcome);
    let token = std::fs::read_to_string(&copy).unwrap();
    assert_eq!(token.len(), 64, "the session saw its token: {token:?}");
    let tasks = n.store.run(run).tasks(None, 100).unwrap().items;
    let task = tasks.iter().find(|t| t.kind != TaskKind::Root).unwrap();
    let outcome_text = task.outcome.clone().unwrap_or_default();
    assert!(!outcome_text.contains(&token), "{outcome_text}");
    let log = n.store.run(run).last_log_rows(task.id, 200).unwrap();
    assert!(
        log.iter().any(|r| r.value.kind == LogKind::ToolResult
            && r.value.detail.contains("token=[REDACTED:")
            && !r.value.redactions.is_empty()),
        "the tool result holds the marker and counts the redaction: {log:#?}"
    );
    n.rt.shutdown().await;
    drop(n.endpoint);
    let bytes = std::fs::read(n._dir.path().join("keel.redb")).unwrap();
    assert!(
        !bytes.windows(token.len()).any(|w| w == token.as_bytes()),
        "the token is in the store file"
    );
}
