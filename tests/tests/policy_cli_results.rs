//! The four real CLIs report their tool results to keel's policy (docs/HARNESSES.md, "Policy
//! hooks"): each CLI's native `PostToolUse` hook runs `keel hook --post-for HARNESS`, the node
//! records a success durably (a prerequisite met) and runs the configured `PostToolUse` hooks, and a
//! rewrite replaces what the model sees.
//!
//! Real processes: `keel model-server` (the scripted model on 127.0.0.1, recording every request),
//! `keel run` on a real CLI pointed at it (skipped only with `KEEL_SKIP_REAL_CLIS=1` when the CLIs
//! are not installed), the CLI's hooks, `keel hook` and the node's bridge, `keel --json audit`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use keel_harness::HarnessKind;
use keel_tests::policy::{
    PolicyHome, assert_kept_redacted, assert_redacted_everywhere, redact_hunter2_policy,
    rewrite_policy, shell_step,
};
use keel_tests::{audit_rows_by as rows_by, cli_installed, recorded_bodies};

/// A prerequisite gate: `deploy-now` only after a `build-ok` call succeeded in the run.
const BUILT_FIRST: &str = "\n[[gates]]\nname = \"built\"\nkind = \"prerequisite\"\nrule = \"*(*deploy-now*)\"\nafter = \"*(*build-ok*)\"\nper = \"run\"\n";

/// In one run on `harness`: a deploy before the build is denied (its file never appears), the
/// build succeeds and its result reaches keel through the CLI's `PostToolUse` hook, and the same
/// deploy then runs (its file appears); the denial and the allowance are audit rows of the gate.
fn prerequisite_met_through_post_tool_use(harness: HarnessKind) {
    let home = PolicyHome::new(BUILT_FIRST).unwrap();
    home.write_plan(vec![
        shell_step("early", "Deploy.", "echo deploy-now > early.txt", &[]),
        shell_step("build", "Build.", "echo build-ok", &["early"]),
        shell_step(
            "deploy",
            "Deploy.",
            "echo deploy-now > deployed.txt",
            &["build"],
        ),
    ])
    .unwrap();
    let (code, out, err) = home
        .run_to_end(&mut home.run_command(Some(harness)).unwrap())
        .unwrap();
    let rows = home.audit().unwrap();
    let context = format!("{harness}: exit {code}\n{out}\n{err}\n{rows:#?}");
    assert!(
        !home.path().join("early.txt").exists(),
        "the deploy ran before the build: {context}"
    );
    assert!(
        home.path().join("deployed.txt").exists(),
        "the deploy did not run after the build: {context}"
    );
    let denied = rows_by(&rows, "gate:built", "deny");
    assert_eq!(denied.len(), 1, "{context}");
    assert!(
        denied[0]["reason"]
            .as_str()
            .unwrap()
            .contains("a call matching *(*build-ok*) must succeed in this run"),
        "{context}"
    );
    assert_eq!(rows_by(&rows, "gate:built", "allow").len(), 1, "{context}");
}

#[test]
fn claude_code_meets_a_prerequisite_through_post_tool_use() {
    if cli_installed(HarnessKind::ClaudeCode) {
        prerequisite_met_through_post_tool_use(HarnessKind::ClaudeCode);
    }
}

#[test]
fn pi_meets_a_prerequisite_through_post_tool_use() {
    if cli_installed(HarnessKind::Pi) {
        prerequisite_met_through_post_tool_use(HarnessKind::Pi);
    }
}

/// A run on `harness` whose one step runs `command` (reading `secret.txt`, which holds
/// `pw-hunter2`) under a `PostToolUse` hook that redacts it: the home, the exit code, the audit
/// rows, the model requests and the context a failed assertion prints.
struct SecretRun {
    home: PolicyHome,
    code: i32,
    rows: Vec<serde_json::Value>,
    bodies: Vec<String>,
    context: String,
}

fn run_reading_the_secret(harness: HarnessKind, command: &str) -> SecretRun {
    let home = PolicyHome::new(&redact_hunter2_policy()).unwrap();
    std::fs::write(home.path().join("secret.txt"), "pw-hunter2\n").unwrap();
    home.write_plan(vec![shell_step("read", "Read the file.", command, &[])])
        .unwrap();
    let (code, out, err) = home
        .run_to_end(&mut home.run_command(Some(harness)).unwrap())
        .unwrap();
    let rows = home.audit().unwrap();
    let bodies: Vec<String> = recorded_bodies(&home.record_dir())
        .iter()
        .map(|b| b.to_string())
        .collect();
    let context = format!("{harness}: exit {code}\n{out}\n{err}\n{rows:#?}");
    SecretRun {
        home,
        code,
        rows,
        bodies,
        context,
    }
}

/// On `harness`, a `PostToolUse` hook in keel.toml redacts a secret the tool printed: no request
/// the model server received holds the secret, the model saw the redacted result, and the rewrite is
/// an audit row marked rewritten.
fn a_post_tool_use_hook_redacts_what_the_model_sees(harness: HarnessKind) {
    let SecretRun {
        home,
        code,
        rows,
        bodies,
        context,
    } = run_reading_the_secret(harness, "cat secret.txt");
    assert!(
        bodies.len() >= 2,
        "no request after the tool ran: {context}"
    );
    // What keel logged is what the policy handed back, not what the CLI's own stream said: no
    // log row and no resume preamble of a later attempt holds the secret.
    assert_redacted_everywhere(&bodies, &home.logs_and_preambles().unwrap(), &context);
    let rewritten = rows_by(&rows, "hook:redact", "allow");
    assert!(
        rewritten.iter().any(|r| r["rewritten"] == true),
        "{context}"
    );
    assert_eq!(code, 0, "{context}");
}

#[test]
fn claude_code_post_tool_use_redacts_what_the_model_sees() {
    if cli_installed(HarnessKind::ClaudeCode) {
        a_post_tool_use_hook_redacts_what_the_model_sees(HarnessKind::ClaudeCode);
    }
}

#[test]
fn codex_post_tool_use_redacts_what_the_model_sees() {
    if cli_installed(HarnessKind::Codex) {
        a_post_tool_use_hook_redacts_what_the_model_sees(HarnessKind::Codex);
    }
}

#[test]
fn opencode_post_tool_use_redacts_what_the_model_sees() {
    if cli_installed(HarnessKind::Opencode) {
        a_post_tool_use_hook_redacts_what_the_model_sees(HarnessKind::Opencode);
    }
}

#[test]
fn pi_post_tool_use_redacts_what_the_model_sees() {
    if cli_installed(HarnessKind::Pi) {
        a_post_tool_use_hook_redacts_what_the_model_sees(HarnessKind::Pi);
    }
}

/// On `harness`, a call that fails (a shell command exiting 3) printed a secret a `PostToolUse`
/// hook redacts: the failed result goes through keel's policy too (its rewrite is an audit row),
/// and the secret reaches neither the model (Claude Code, which cannot replace a failure's output,
/// is stopped before its next model request; opencode's shell tool reports a non-zero exit as its
/// result, which its plugin replaces) nor keel's log and resume preamble.
fn a_failed_calls_secret_never_reaches_the_model(harness: HarnessKind) {
    let SecretRun {
        home,
        rows,
        bodies,
        context,
        ..
    } = run_reading_the_secret(harness, "cat secret.txt; exit 3");
    assert!(!bodies.is_empty(), "no model request: {context}");
    assert!(
        bodies.iter().all(|b| !b.contains("hunter2")),
        "the failed call's secret reached the model: {context}\n{bodies:#?}"
    );
    assert!(
        rows_by(&rows, "hook:redact", "allow")
            .iter()
            .any(|r| r["rewritten"] == true),
        "the failed result was not rewritten by the policy: {context}"
    );
    assert_kept_redacted(&home.logs_and_preambles().unwrap(), &context);
}

#[test]
fn claude_code_stops_before_the_model_sees_a_failed_calls_withheld_result() {
    if cli_installed(HarnessKind::ClaudeCode) {
        a_failed_calls_secret_never_reaches_the_model(HarnessKind::ClaudeCode);
    }
}

/// The session keeps the failure wrapper from leaving its stop in the session's folder (a
/// directory where the file would go, as a full disk or a deleting loop would): the node's kept
/// decision still stops the session before the model sees the failure's secret.
#[test]
fn claude_code_stops_for_a_failed_call_even_without_its_stop_file() {
    if cli_installed(HarnessKind::ClaudeCode) {
        let SecretRun {
            bodies, context, ..
        } = run_reading_the_secret(
            HarnessKind::ClaudeCode,
            "mkdir -p \"$HOME/../keel-failure-stop.json\"; cat secret.txt; exit 3",
        );
        assert!(!bodies.is_empty(), "no model request: {context}");
        assert!(
            bodies.iter().all(|b| !b.contains("hunter2")),
            "the failed call's secret reached the model: {context}\n{bodies:#?}"
        );
    }
}

#[test]
fn opencode_redacts_a_failed_shell_commands_result() {
    if cli_installed(HarnessKind::Opencode) {
        a_failed_calls_secret_never_reaches_the_model(HarnessKind::Opencode);
    }
}

/// Codex's MCP calls: a `PostToolUse` hook rewrites the answer of keel's own `report_progress`
/// tool; the model gets the rewrite, and keel's log holds it too, not the original Codex's stream
/// printed (its MCP result is matched by its text, as a command's output).
#[test]
fn codex_logs_a_rewritten_mcp_result_as_the_model_saw_it() {
    if !cli_installed(HarnessKind::Codex) {
        return;
    }
    let home = PolicyHome::new(&rewrite_policy("recorded", "REWRITTEN")).unwrap();
    let mut step = shell_step("progress", "Say how far you are.", "true", &[]);
    step.brief = format!(
        "Say how far you are. {}\nCALL_TOOL: mcp__keel__report_progress {{\"note\": \"halfway\"}}",
        keel_harness::scripted::model::REPORT_AFTER_TOOL
    );
    home.write_plan(vec![step]).unwrap();
    let (code, out, err) = home
        .run_to_end(&mut home.run_command(Some(HarnessKind::Codex)).unwrap())
        .unwrap();
    let bodies: Vec<String> = recorded_bodies(&home.record_dir())
        .iter()
        .map(|b| b.to_string())
        .collect();
    let context = format!("exit {code}\n{out}\n{err}");
    assert!(
        bodies
            .iter()
            .any(|b| b.contains("REWRITTEN: progress note")),
        "the model never saw the rewritten result: {context}\n{bodies:#?}"
    );
    let logs = home.logs_and_preambles().unwrap();
    assert!(
        logs.iter()
            .any(|(_, t)| t.contains("REWRITTEN: progress note")),
        "{context}\n{logs:#?}"
    );
    for (what, text) in &logs {
        assert!(
            !text.contains("recorded: progress note"),
            "the original is in {what}: {context}\n{text}"
        );
    }
}
