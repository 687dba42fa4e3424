//! keel's native agent loop end to end over real HTTP against the scripted model server on
//! 127.0.0.1: tool round trips with pairing, stop reasons, retries, rate limits, runaway guards,
//! budgets, the pre-tool gate and cancellation.
#![cfg(feature = "io")]
// Sessions, servers and processes: the IO half of the crate.

// Test helpers panic on setup failure by design: a broken fixture must fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::time::{Duration, Instant};

use keel_harness::messages_api::agent::{BUDGET_NOTICE, CONTINUE_NOTICE, LoopConfig};
use keel_harness::messages_api::backoff::RetryPolicy;
use keel_harness::messages_api::{MessagesApiConfig, MessagesApiHarness};
use keel_harness::scripted::Script;
use keel_harness::server::{ModelServer, ModelServerConfig, RecordedRequest};
use keel_harness::{
    BudgetKind, Credential, ErrorCategory, GateCommand, Harness, HarnessEvent, SessionSpec,
    StartError, StopReason, UsageAccumulator,
};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(30);

fn loop_config() -> LoopConfig {
    LoopConfig {
        retry: RetryPolicy {
            attempts_max: 4,
            base_ms: 10,
            cap_ms: 50,
            retry_after_wait_ms_max: 2_000,
        },
        tool_timeout_ms: 10_000,
        ..LoopConfig::default()
    }
}

struct Run {
    events: Vec<HarnessEvent>,
    requests: Vec<RecordedRequest>,
}

impl Run {
    fn terminal(&self) -> &HarnessEvent {
        self.events.last().unwrap()
    }

    fn finished(&self) -> (StopReason, String) {
        match self.terminal() {
            HarnessEvent::Finished {
                stop_reason,
                final_text,
            } => (stop_reason.clone(), final_text.clone()),
            other => panic!("expected Finished, got {other:?}"),
        }
    }

    fn failed(&self) -> keel_harness::HarnessError {
        match self.terminal() {
            HarnessEvent::Failed(e) => e.clone(),
            other => panic!("expected Failed, got {other:?}"),
        }
    }

    fn tool_results(&self) -> Vec<(String, bool, String)> {
        self.events
            .iter()
            .filter_map(|e| match e {
                HarnessEvent::ToolResult {
                    id,
                    is_error,
                    content,
                } => Some((id.clone(), *is_error, content.text.clone())),
                _ => None,
            })
            .collect()
    }

    /// Every ToolUse has exactly one ToolResult, after it (docs/DESIGN.md §12, invariant 3).
    fn assert_paired(&self) {
        let uses: Vec<&String> = self
            .events
            .iter()
            .filter_map(|e| {
                if let HarnessEvent::ToolUse { id, .. } = e {
                    Some(id)
                } else {
                    None
                }
            })
            .collect();
        let results = self.tool_results();
        assert_eq!(uses.len(), results.len(), "{:?}", self.events);
        for id in uses {
            assert_eq!(
                results.iter().filter(|(r, _, _)| r == id).count(),
                1,
                "{id}"
            );
        }
    }
}

async fn run_with(
    script: Script,
    dir: &Path,
    edit: impl FnOnce(&mut SessionSpec),
    config: MessagesApiConfig,
) -> Run {
    let server = ModelServer::start(ModelServerConfig::new(script))
        .await
        .unwrap();
    let mut spec = SessionSpec::new(
        "RUN_TOOL: echo tool-ran > proof.txt && cat proof.txt ;;",
        "claude-scripted-1",
        dir,
    );
    spec.account.base_url = Some(server.base_url());
    spec.account.credential = Credential::ApiKeyEnv("KEEL_TEST_KEY".into());
    spec.env
        .insert("KEEL_TEST_KEY".into(), "sk-test-key-0123456789".into());
    edit(&mut spec);
    let harness = MessagesApiHarness::new(config).unwrap();
    let session = harness.start(spec).await.unwrap();
    let events = session.collect(WAIT).await;
    let requests = server.requests();
    server.shutdown().await.unwrap();
    Run { events, requests }
}

fn config() -> MessagesApiConfig {
    MessagesApiConfig {
        loop_config: loop_config(),
        ..MessagesApiConfig::default()
    }
}

async fn run_script(script: Script, dir: &Path) -> Run {
    run_with(script, dir, |_| {}, config()).await
}

fn script(json: &str) -> Script {
    Script::from_json_str(json).unwrap()
}

fn last_user_content(request: &RecordedRequest) -> Vec<Value> {
    let messages = request.body["messages"].as_array().unwrap();
    let last = messages.last().unwrap();
    assert_eq!(last["role"], "user");
    last["content"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn shell_tool_round_trip_pairs_the_result_and_changes_the_file_system() {
    let dir = tempfile::tempdir().unwrap();
    let run = run_script(Script::rules(), dir.path()).await;
    let (stop, text) = run.finished();
    assert_eq!(stop, StopReason::EndTurn);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("proof.txt")).unwrap(),
        "tool-ran\n"
    );
    assert!(
        text.starts_with("FINAL: tool toolu_scripted_001 returned: exit_code: 0"),
        "{text}"
    );
    assert!(
        matches!(&run.events[0], HarnessEvent::Started { model: Some(m), native_session_id: None } if m == "claude-scripted-1")
    );
    run.assert_paired();

    assert_eq!(run.requests.len(), 2);
    for r in &run.requests {
        assert_eq!(r.route(), "/v1/messages");
        assert_eq!(r.body["model"], "claude-scripted-1");
        assert_eq!(r.body["stream"], true);
        assert_eq!(r.header("anthropic-version"), Some("2023-06-01"));
        assert!(r.header("x-api-key").unwrap().starts_with("sk-test-key-"));
    }
    let tools: Vec<&str> = run.requests[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["bash", "edit", "grep", "list", "read", "write"]);
    let reply = last_user_content(&run.requests[1]);
    assert_eq!(reply.len(), 1);
    assert_eq!(reply[0]["type"], "tool_result");
    assert_eq!(reply[0]["tool_use_id"], "toolu_scripted_001");

    let mut usage = UsageAccumulator::new();
    for e in &run.events {
        if let HarnessEvent::Usage(r) = e {
            usage.record(r);
        }
    }
    assert_eq!(
        usage.total().input_tokens,
        20,
        "two turns of 10 input tokens, each counted once"
    );
}

#[tokio::test]
async fn parallel_calls_get_one_result_each_in_order_before_any_text() {
    let dir = tempfile::tempdir().unwrap();
    let s = script(
        r#"{"turns": [
        {"text": "writing two files", "tool_calls": [
            {"name": "bash", "input": {"command": "touch a.txt; for i in $(seq 100); do [ -f b.txt ] && exit 0; sleep 0.05; done; exit 1"}},
            {"name": "bash", "input": {"command": "touch b.txt; for i in $(seq 100); do [ -f a.txt ] && exit 0; sleep 0.05; done; exit 1"}},
            {"name": "nope", "input": {}}]},
        {"text": "done"}]}"#,
    );
    // Each shell call waits (bounded) for the other's marker: both succeed only if they run at once.
    let run = run_script(s, dir.path()).await;
    assert_eq!(run.finished(), (StopReason::EndTurn, "done".into()));
    assert!(dir.path().join("a.txt").exists() && dir.path().join("b.txt").exists());
    run.assert_paired();
    let reply = last_user_content(&run.requests[1]);
    let ids: Vec<&str> = reply
        .iter()
        .map(|b| b["tool_use_id"].as_str().unwrap())
        .collect();
    assert_eq!(
        ids,
        [
            "toolu_scripted_001",
            "toolu_scripted_002",
            "toolu_scripted_003"
        ]
    );
    assert!(reply.iter().all(|b| b["type"] == "tool_result"));
    let unknown: Value = serde_json::from_str(reply[2]["content"].as_str().unwrap()).unwrap();
    assert_eq!(reply[2]["is_error"], true);
    assert_eq!(unknown["error_category"], "business_rule");
    assert_eq!(unknown["is_retryable"], false);
    assert!(
        reply[0].get("is_error").is_none(),
        "both shell calls succeeded, so they ran concurrently"
    );
    assert!(reply[1].get("is_error").is_none());
}

#[tokio::test]
async fn every_stop_reason_has_its_own_outcome() {
    let dir = tempfile::tempdir().unwrap();
    for (stop, expect_finished, expect_category) in [
        ("stop_sequence", Some(StopReason::StopSequence), None),
        ("refusal", None, Some(ErrorCategory::BusinessRule)),
        (
            "model_context_window_exceeded",
            None,
            Some(ErrorCategory::ContextOverflow),
        ),
        ("brand_new_reason", None, Some(ErrorCategory::System)),
    ] {
        let s = script(&format!(
            r#"{{"turns": [{{"text": "t", "stop_reason": "{stop}"}}], "rules_after_turns": false}}"#
        ));
        let run = run_script(s, dir.path()).await;
        match (expect_finished, expect_category) {
            (Some(reason), _) => assert_eq!(run.finished().0, reason, "{stop}"),
            (_, Some(category)) => {
                let e = run.failed();
                assert_eq!(e.category, category, "{stop}");
                assert!(!e.retryable, "{stop}");
            }
            _ => unreachable!(),
        }
        assert_eq!(run.requests.len(), 1, "{stop}");
    }
}

#[tokio::test]
async fn max_tokens_asks_to_continue_then_gives_up() {
    let dir = tempfile::tempdir().unwrap();
    let s = script(
        r#"{"turns": [
        {"failure": {"kind": "overlong_output", "bytes": 100}},
        {"text": "the rest", "stop_reason": "end_turn"}]}"#,
    );
    let run = run_script(s, dir.path()).await;
    assert_eq!(run.finished(), (StopReason::EndTurn, "the rest".into()));
    let reply = last_user_content(&run.requests[1]);
    assert_eq!(
        reply,
        vec![json!({"type": "text", "text": CONTINUE_NOTICE})]
    );

    let s = script(
        r#"{"turns": [
        {"failure": {"kind": "overlong_output", "bytes": 10}},
        {"failure": {"kind": "overlong_output", "bytes": 10}},
        {"failure": {"kind": "overlong_output", "bytes": 10}}], "rules_after_turns": false}"#,
    );
    let run = run_script(s, dir.path()).await;
    assert_eq!(run.finished().0, StopReason::MaxTokens);
    assert_eq!(run.requests.len(), 3, "two continuations, then stop");
}

#[tokio::test]
async fn pause_turn_resends_the_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let s = script(
        r#"{"turns": [{"text": "thinking", "stop_reason": "pause_turn"}, {"text": "answer"}]}"#,
    );
    let run = run_script(s, dir.path()).await;
    assert_eq!(run.finished(), (StopReason::EndTurn, "answer".into()));
    let second = run.requests[1].body["messages"].as_array().unwrap();
    assert_eq!(
        second.last().unwrap()["role"],
        "assistant",
        "the paused message is sent back as is"
    );
}

#[tokio::test]
async fn transient_failures_are_retried_with_a_cap() {
    let dir = tempfile::tempdir().unwrap();
    let s = script(
        r#"{"turns": [
        {"failure": {"kind": "http", "status": 500}},
        {"failure": {"kind": "malformed"}},
        {"failure": {"kind": "http", "status": 529}},
        {"text": "made it"}]}"#,
    );
    let run = run_script(s, dir.path()).await;
    assert_eq!(run.finished(), (StopReason::EndTurn, "made it".into()));
    assert_eq!(run.requests.len(), 4);

    let s = script(r#"{"turns": [], "rules_after_turns": false}"#);
    let run = run_script(s, dir.path()).await;
    let e = run.failed();
    assert_eq!(e.category, ErrorCategory::Transient);
    assert_eq!(run.requests.len(), 4, "attempts_max");
}

#[tokio::test]
async fn a_stalled_stream_is_cut_by_the_idle_timeout_and_retried() {
    let dir = tempfile::tempdir().unwrap();
    let s = script(
        r#"{"turns": [{"failure": {"kind": "hang_mid_stream", "ms": 60000}}, {"text": "after the stall"}]}"#,
    );
    let config = MessagesApiConfig {
        stream_idle_ms_max: 300,
        ..config()
    };
    let t0 = Instant::now();
    let run = run_with(s, dir.path(), |_| {}, config).await;
    assert_eq!(
        run.finished(),
        (StopReason::EndTurn, "after the stall".into())
    );
    assert!(t0.elapsed() < Duration::from_secs(20));
}

#[tokio::test]
async fn rate_limits_are_waited_out_when_short_and_surfaced_when_long() {
    let dir = tempfile::tempdir().unwrap();
    let s = script(
        r#"{"turns": [{"failure": {"kind": "rate_limited", "retry_after_secs": 1}}, {"text": "ok"}]}"#,
    );
    let t0 = Instant::now();
    let run = run_script(s, dir.path()).await;
    assert_eq!(run.finished(), (StopReason::EndTurn, "ok".into()));
    assert!(
        t0.elapsed() >= Duration::from_millis(1000),
        "retry-after is honoured"
    );

    let s = script(
        r#"{"turns": [{"failure": {"kind": "rate_limited", "retry_after_secs": 3600, "reset_after_secs": 3600}}]}"#,
    );
    let t0 = Instant::now();
    let run = run_script(s, dir.path()).await;
    let e = run.failed();
    let ErrorCategory::RateLimited {
        reset_at_unix_ms: Some(reset),
    } = e.category
    else {
        panic!("{e:?}")
    };
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert!(
        reset > now_ms + 3_500_000 && reset < now_ms + 3_700_000,
        "reset {reset} now {now_ms}"
    );
    assert_eq!(e.retry_after_ms, Some(3_600_000));
    assert!(e.retryable);
    assert_eq!(run.requests.len(), 1);
    assert!(t0.elapsed() < Duration::from_secs(10), "surfaced quickly");
}

#[tokio::test]
async fn duplicate_calls_are_refused_then_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let call = r#"{"tool_calls": [{"name": "bash", "input": {"command": "echo x >> log.txt"}}]}"#;
    let s = script(&format!(
        r#"{{"turns": [{call}, {call}, {call}, {{"text": "never"}}]}}"#
    ));
    let run = run_script(s, dir.path()).await;
    assert_eq!(run.finished().0, StopReason::DuplicateToolCall);
    assert_eq!(
        std::fs::read_to_string(dir.path().join("log.txt")).unwrap(),
        "x\n",
        "ran once"
    );
    run.assert_paired();
    let results = run.tool_results();
    assert!(!results[0].1 && results[1].1 && results[2].1);
    assert!(results[1].2.contains("duplicate call"));
    assert_eq!(run.requests.len(), 3);
}

#[tokio::test]
async fn near_the_turn_budget_the_loop_asks_for_a_summary_and_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let s = script(
        r#"{"turns": [
        {"tool_calls": [{"name": "bash", "input": {"command": "echo 1"}}]},
        {"tool_calls": [{"name": "bash", "input": {"command": "echo 2"}}]},
        {"text": "summary: two steps done, more remain"}]}"#,
    );
    let run = run_with(s, dir.path(), |spec| spec.limits.turns_max = 3, config()).await;
    assert_eq!(
        run.finished(),
        (
            StopReason::Budget(BudgetKind::Turns),
            "summary: two steps done, more remain".into()
        )
    );
    assert_eq!(run.requests.len(), 3);
    let last = &run.requests[2];
    assert_eq!(last.body["tool_choice"], json!({"type": "none"}));
    let reply = last_user_content(last);
    assert_eq!(
        reply[0]["type"], "tool_result",
        "results come before the notice"
    );
    assert_eq!(reply[1], json!({"type": "text", "text": BUDGET_NOTICE}));
    assert!(run.requests[1].body.get("tool_choice").is_none());
}

#[tokio::test]
async fn token_and_wall_clock_budgets_stop_as_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let s = script(
        r#"{"turns": [
        {"tool_calls": [{"name": "bash", "input": {"command": "echo 1"}}], "usage": {"input_tokens": 950, "output_tokens": 10}},
        {"tool_calls": [{"name": "bash", "input": {"command": "echo 2"}}]}]}"#,
    );
    let run = run_with(
        s,
        dir.path(),
        |spec| spec.limits.tokens_max = 1000,
        config(),
    )
    .await;
    assert_eq!(run.finished().0, StopReason::Budget(BudgetKind::Tokens));
    run.assert_paired();

    let s = script(r#"{"turns": [{"failure": {"kind": "hang", "ms": 60000}}]}"#);
    let t0 = Instant::now();
    let run = run_with(
        s,
        dir.path(),
        |spec| spec.limits.wall_clock_ms_max = 500,
        config(),
    )
    .await;
    assert_eq!(run.finished().0, StopReason::Budget(BudgetKind::WallClock));
    assert!(t0.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn the_pre_tool_gate_blocks_a_denied_call() {
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate.sh");
    std::fs::write(&gate, "#!/bin/bash\nif grep -q should-not-run; then echo 'BLOCKED by orchestrator policy' >&2; exit 2; fi\nexit 0\n").unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir(&work).unwrap();
    let s = script(
        r#"{"turns": [
        {"tool_calls": [{"name": "bash", "input": {"command": "echo should-not-run > blocked.txt"}},
                        {"name": "bash", "input": {"command": "echo fine > allowed.txt"}}]},
        {"text": "done"}]}"#,
    );
    let run = run_with(
        s,
        &work,
        |spec| {
            spec.pre_tool_gate = Some(GateCommand {
                program: "bash".into(),
                args: vec![gate.display().to_string()],
                timeout_ms: 5_000,
            })
        },
        config(),
    )
    .await;
    assert_eq!(run.finished().0, StopReason::EndTurn);
    assert!(
        !work.join("blocked.txt").exists(),
        "the denied command must not run"
    );
    assert!(work.join("allowed.txt").exists());
    let results = run.tool_results();
    assert!(results[0].1);
    let payload: Value = serde_json::from_str(&results[0].2).unwrap();
    assert_eq!(payload["error_category"], "permission");
    assert_eq!(payload["message"], "BLOCKED by orchestrator policy");
    assert!(!results[1].1);
}

#[tokio::test]
async fn cancel_ends_a_hung_session_promptly() {
    let dir = tempfile::tempdir().unwrap();
    let server = ModelServer::start(ModelServerConfig::new(script(
        r#"{"turns": [{"failure": {"kind": "hang", "ms": 60000}}]}"#,
    )))
    .await
    .unwrap();
    let mut spec = SessionSpec::new("hi", "m", dir.path());
    spec.account.base_url = Some(server.base_url());
    let session = MessagesApiHarness::new(config())
        .unwrap()
        .start(spec)
        .await
        .unwrap();
    assert!(server.wait_for_requests(1, WAIT).await);
    let cancel = session.cancel_token();
    let t0 = Instant::now();
    cancel.cancel();
    let events = session.collect(WAIT).await;
    assert!(
        matches!(events.last(), Some(HarnessEvent::Failed(e)) if e.category == ErrorCategory::Cancelled),
        "{events:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(5));
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_specs_and_missing_credentials_fail_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let harness = MessagesApiHarness::new(config()).unwrap();
    let mut spec = SessionSpec::new("hi", "m", dir.path());
    spec.account.credential = Credential::ApiKeyEnv("KEEL_SURELY_UNSET_VARIABLE".into());
    assert!(
        matches!(harness.start(spec).await, Err(StartError::MissingCredential(n)) if n == "environment variable KEEL_SURELY_UNSET_VARIABLE is not set")
    );
    let spec = SessionSpec::new("hi", "m", dir.path().join("missing"));
    assert!(matches!(
        harness.start(spec).await,
        Err(StartError::InvalidSpec(_))
    ));
}

#[tokio::test]
async fn the_spec_shapes_the_request_system_prompt_and_tool_set() {
    let dir = tempfile::tempdir().unwrap();
    let s = script(r#"{"turns": [{"text": "ok"}]}"#);
    let run = run_with(
        s,
        dir.path(),
        |spec| {
            spec.append_system_prompt = Some("EXTRA-INSTRUCTIONS".into());
            spec.allowed_tools = vec!["bash".into(), "read".into(), "grep".into()];
            spec.disallowed_tools = vec!["grep".into()];
        },
        config(),
    )
    .await;
    assert_eq!(run.finished().0, StopReason::EndTurn);
    let body = &run.requests[0].body;
    assert!(
        body["system"]
            .as_str()
            .unwrap()
            .ends_with("\n\nEXTRA-INSTRUCTIONS")
    );
    let tools: Vec<&str> = body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(tools, ["bash", "read"]);

    let s = script(r#"{"turns": [{"text": "ok"}]}"#);
    let run = run_with(
        s,
        dir.path(),
        |spec| spec.permission_mode = keel_harness::PermissionMode::ReadOnly,
        config(),
    )
    .await;
    let tools: Vec<&str> = run.requests[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        tools,
        ["grep", "list", "read"],
        "a read-only session offers no tool that writes or runs commands"
    );
}

#[tokio::test]
async fn tool_calls_cut_at_max_tokens_get_error_results_before_the_continue_notice() {
    let dir = tempfile::tempdir().unwrap();
    let s = script(
        r#"{"turns": [
        {"tool_calls": [{"name": "bash", "input": {"command": "echo cut > cut.txt"}}], "stop_reason": "max_tokens"},
        {"text": "continued"}]}"#,
    );
    let run = run_script(s, dir.path()).await;
    assert_eq!(run.finished(), (StopReason::EndTurn, "continued".into()));
    assert!(
        !dir.path().join("cut.txt").exists(),
        "a cut call never runs"
    );
    run.assert_paired();
    let reply = last_user_content(&run.requests[1]);
    assert_eq!(reply[0]["type"], "tool_result");
    assert_eq!(reply[0]["is_error"], true);
    assert_eq!(reply[1], json!({"type": "text", "text": CONTINUE_NOTICE}));
}

#[tokio::test]
async fn a_one_turn_budget_is_never_crossed_by_the_summary() {
    let dir = tempfile::tempdir().unwrap();
    let s = script(
        r#"{"turns": [{"tool_calls": [{"name": "bash", "input": {"command": "echo 1"}}]}, {"text": "never sent"}]}"#,
    );
    let run = run_with(s, dir.path(), |spec| spec.limits.turns_max = 1, config()).await;
    assert_eq!(run.finished().0, StopReason::Budget(BudgetKind::Turns));
    assert_eq!(run.requests.len(), 1);
    run.assert_paired();
}

#[tokio::test]
async fn calls_in_a_final_turn_still_get_exactly_one_result() {
    let dir = tempfile::tempdir().unwrap();
    for stop in [
        "end_turn",
        "refusal",
        "stop_sequence",
        "brand_new_reason",
        "model_context_window_exceeded",
    ] {
        let s = script(&format!(
            r#"{{"turns": [{{"text": "t", "tool_calls": [{{"name": "bash", "input": {{"command": "touch ran.txt"}}}}], "stop_reason": "{stop}"}}], "rules_after_turns": false}}"#
        ));
        let run = run_script(s, dir.path()).await;
        assert!(run.terminal().is_terminal(), "{stop}");
        run.assert_paired();
        assert!(run.tool_results()[0].1, "{stop}: the result is a refusal");
        assert!(
            !dir.path().join("ran.txt").exists(),
            "{stop}: the call never ran"
        );
    }
}

/// Whether a process whose command line contains `needle` is alive (reads /proc; Linux only).
fn process_alive(needle: &str) -> bool {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(Result::ok)
        .any(|e| {
            std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
                String::from_utf8_lossy(&c)
                    .replace('\0', " ")
                    .contains(needle)
            })
        })
}

#[tokio::test]
async fn cancel_during_a_tool_kills_its_process_group() {
    let dir = tempfile::tempdir().unwrap();
    // A backgrounded child in the same group too: both must go.
    let marker = "31.4159";
    let s = script(&format!(
        r#"{{"turns": [{{"tool_calls": [{{"name": "bash", "input": {{"command": "sleep {marker}0 & sleep {marker}"}}}}]}}]}}"#
    ));
    let server = ModelServer::start(ModelServerConfig::new(s)).await.unwrap();
    let mut spec = SessionSpec::new("go", "m", dir.path());
    spec.account.base_url = Some(server.base_url());
    let mut session = MessagesApiHarness::new(config())
        .unwrap()
        .start(spec)
        .await
        .unwrap();
    // Wait for the tool call to start.
    loop {
        match tokio::time::timeout(WAIT, session.next_event())
            .await
            .unwrap()
        {
            Some(HarnessEvent::ToolUse { .. }) => break,
            Some(_) => {}
            None => panic!("session ended early"),
        }
    }
    let t0 = Instant::now();
    for _ in 0..100 {
        if process_alive(&format!("sleep {marker}")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        process_alive(&format!("sleep {marker}")),
        "the tool's process started"
    );
    session.cancel();
    let events = session.collect(WAIT).await;
    assert!(
        matches!(events.last(), Some(HarnessEvent::Failed(e)) if e.category == ErrorCategory::Cancelled),
        "{events:?}"
    );
    assert!(t0.elapsed() < Duration::from_secs(10));
    let mut gone = false;
    for _ in 0..100 {
        if !process_alive(&format!("sleep {marker}")) {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gone, "no process of the cancelled tool is left");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn dropping_a_session_stops_its_tools() {
    let dir = tempfile::tempdir().unwrap();
    let marker = "27.1828";
    let s = script(&format!(
        r#"{{"turns": [{{"tool_calls": [{{"name": "bash", "input": {{"command": "sleep {marker}"}}}}]}}]}}"#
    ));
    let server = ModelServer::start(ModelServerConfig::new(s)).await.unwrap();
    let mut spec = SessionSpec::new("go", "m", dir.path());
    spec.account.base_url = Some(server.base_url());
    let mut session = MessagesApiHarness::new(config())
        .unwrap()
        .start(spec)
        .await
        .unwrap();
    loop {
        match tokio::time::timeout(WAIT, session.next_event())
            .await
            .unwrap()
        {
            Some(HarnessEvent::ToolUse { .. }) => break,
            Some(_) => {}
            None => panic!("session ended early"),
        }
    }
    // Up to 5 s for the tool's process to show: under a loaded machine (the whole suite at once)
    // 2 s was once not enough for bash to start it.
    for _ in 0..250 {
        if process_alive(&format!("sleep {marker}")) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(process_alive(&format!("sleep {marker}")));
    drop(session);
    let mut gone = false;
    for _ in 0..250 {
        if !process_alive(&format!("sleep {marker}")) {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(gone, "an abandoned session's tool is killed");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn pause_turns_are_capped() {
    let dir = tempfile::tempdir().unwrap();
    let pause = r#"{"text": "still going", "stop_reason": "pause_turn"}"#;
    let turns = [pause; 12].join(",");
    let s = script(&format!(
        r#"{{"turns": [{turns}], "rules_after_turns": false}}"#
    ));
    let run = run_script(s, dir.path()).await;
    assert_eq!(
        run.finished(),
        (StopReason::PauseTurn, "still going".into())
    );
    assert_eq!(
        run.requests.len(),
        9,
        "pause_turns_max re-sends after the first pause"
    );
}

/// A judge that accepts a final text containing "good", and says so otherwise.
struct WantsGood;

impl keel_harness::StopJudge for WantsGood {
    fn judge(&self, _check: &keel_harness::StopCheck, final_text: &str) -> Result<(), String> {
        if final_text.contains("good") {
            Ok(())
        } else {
            Err(format!(
                "{}: {final_text:?} is not good",
                keel_harness::RE_ASK_MARKER
            ))
        }
    }
}

fn judged(spec: &mut SessionSpec) {
    spec.stop_check = Some(keel_harness::StopCheck {
        report_for: vec!["task".into()],
        re_asks_max: keel_harness::RE_ASKS_MAX,
    });
    spec.in_process.stop = Some(std::sync::Arc::new(WantsGood));
}

#[tokio::test]
async fn the_stop_check_sends_a_refused_final_text_back_once_in_the_same_session() {
    let dir = tempfile::tempdir().unwrap();
    // Refused, then accepted: one more turn, with the exact error as its user text.
    let s = script(r#"{"turns": [{"text": "bad one"}, {"text": "a good one"}]}"#);
    let run = run_with(s, dir.path(), judged, config()).await;
    assert_eq!(run.finished(), (StopReason::EndTurn, "a good one".into()));
    let sent: Vec<&HarnessEvent> = run
        .events
        .iter()
        .filter(|e| matches!(e, HarnessEvent::SentBack { .. }))
        .collect();
    assert_eq!(sent.len(), 1, "{:?}", run.events);
    assert_eq!(run.requests.len(), 2);
    let re_ask = last_user_content(&run.requests[1]);
    assert_eq!(
        re_ask[0]["text"],
        format!("{}: \"bad one\" is not good", keel_harness::RE_ASK_MARKER)
    );
    // Refused twice: the session ends after its one re-ask with what it said.
    let s =
        script(r#"{"turns": [{"text": "bad one"}, {"text": "bad two"}, {"text": "a good one"}]}"#);
    let run = run_with(s, dir.path(), judged, config()).await;
    assert_eq!(run.finished(), (StopReason::EndTurn, "bad two".into()));
    assert_eq!(run.requests.len(), 2);
    // Without a judge the check is not run.
    let s = script(r#"{"turns": [{"text": "bad one"}, {"text": "a good one"}]}"#);
    let run = run_with(s, dir.path(), |_| {}, config()).await;
    assert_eq!(run.finished(), (StopReason::EndTurn, "bad one".into()));
}
