//! An embedding host's policy on the runtime's real path (docs/DESIGN.md §9): hooks registered in
//! code run in process in keel's own agent loop (the scripted model, real tools, a real redb file),
//! a `PreToolUse` hook's denial keeps a command from running, a `PostToolUse` hook redacts what the
//! model sees, and every decision is a durable audit row.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use keel_actors::runtime::{HarnessSet, PolicyHost, Runtime, RuntimeConfig, scripted};
use keel_actors::{RunMode, Synthesis};
use keel_harness::scripted::{Script, ScriptedHarness};
use keel_harness::{HarnessKind, ToolOutput};
use keel_policy::{
    CodeHook, HookEvent, HookResult, HookSpec, Policy, PostHookResult, ToolCall, ToolMatcher,
};
use keel_store::{AgentProfile, HookDecision, RunStatus, Sharing, Store, StoreConfig};
use std::sync::Arc;
use std::time::Duration;

/// Denies any command that mentions `forbidden`.
struct Guard;

impl CodeHook for Guard {
    fn before_tool(&self, call: &ToolCall) -> HookResult {
        match call.subject() {
            Some(s) if s.contains("forbidden") => HookResult::Deny {
                reason: "the embedder forbids it".into(),
            },
            _ => HookResult::NoOpinion,
        }
    }
}

/// Redacts the word `hunter2` from every result.
struct Redact;

impl CodeHook for Redact {
    fn after_tool(&self, _call: &ToolCall, output: &ToolOutput) -> PostHookResult {
        if output.text.contains("hunter2") {
            PostHookResult::Rewrite {
                text: output.text.replace("hunter2", "REDACTED"),
            }
        } else {
            PostHookResult::Keep
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hooks_registered_in_code_decide_and_redact_in_keels_own_loop() {
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
    let mut policy = Policy::default();
    policy
        .register_hook(HookSpec::code(
            "guard",
            HookEvent::PreToolUse,
            ToolMatcher::Any,
            Arc::new(Guard),
        ))
        .unwrap();
    policy
        .register_hook(HookSpec::code(
            "redact",
            HookEvent::PostToolUse,
            ToolMatcher::Tools(vec!["bash".into()]),
            Arc::new(Redact),
        ))
        .unwrap();
    let host = PolicyHost::new(policy);
    let harnesses = HarnessSet::new()
        .with(
            HarnessKind::Scripted,
            Arc::new(ScriptedHarness::new(Script::rules())),
        )
        .with_service(host.service());
    let mut config = RuntimeConfig::default();
    config.supervisor.agents = vec![AgentProfile {
        name: "scripted".into(),
        description: "the built-in scripted model".into(),
        harness: "scripted".into(),
        model: "scripted-1".into(),
        account: "local".into(),
        tools: Vec::new(),
        system_prompt: String::new(),
        limits: Default::default(),
    }];
    config.coordinator.attempts_per_step_max = 1;
    config.specialist.working_dir = work.clone();
    config.stop_grace_ms = 1_000;
    let (rt, _events) = Runtime::start(store.clone(), harnesses, config)
        .await
        .unwrap();
    host.attach(&rt);
    let plan = scripted::fan_out_plan(2, |i| {
        if i == 0 {
            "echo forbidden > made.txt; echo made".into()
        } else {
            "echo pw-hunter2".into()
        }
    })
    .unwrap();
    let handle = rt
        .submit("policy".into(), RunMode::Plan(plan), None, "test".into())
        .await
        .unwrap();
    let run = handle.id();
    let outcome = tokio::time::timeout(Duration::from_secs(120), handle.finished())
        .await
        .expect("the run finishes")
        .unwrap();
    assert!(!work.join("made.txt").exists(), "the denied command ran");
    assert_ne!(outcome.status, RunStatus::Running);
    // The redacted part reported what the model saw.
    if let Ok(synthesis) = serde_json::from_str::<Synthesis>(&outcome.outcome) {
        let claims: Vec<&str> = synthesis
            .findings
            .iter()
            .map(|f| f.finding.claim.as_str())
            .collect();
        assert!(claims.iter().all(|c| !c.contains("hunter2")), "{claims:?}");
        assert!(claims.contains(&"pw-REDACTED"), "{claims:?}");
    } else {
        panic!("no synthesis: {}", outcome.outcome);
    }
    let rows = store.run(run).audit(0, 1000).unwrap().items;
    let who = |hook: &str, decision: HookDecision| {
        rows.iter()
            .filter(|r| r.value.hook == hook && r.value.decision == decision)
            .count()
    };
    assert!(who("hook:guard", HookDecision::Deny) >= 1, "{rows:#?}");
    assert!(
        rows.iter()
            .any(|r| r.value.hook == "hook:redact" && r.value.rewritten),
        "{rows:#?}"
    );
    rt.shutdown().await;
}
