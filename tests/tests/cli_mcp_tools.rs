//! The real Codex and opencode (the pinned CLIs, against the scripted model server) calling keel's
//! MCP endpoint through `keel run` (issue 11): each session gets the endpoint in its spec (Codex
//! as `mcp_servers.keel` with a bearer token variable, opencode as a remote `mcp.keel` server with
//! an `Authorization` header), and the model calls `report_findings` and `report_progress` the way
//! each CLI offers MCP tools (Codex: a function in the namespace `mcp__keel`; opencode:
//! `keel_<tool>`). The findings and the note are on the task rows, the answers reached the model,
//! and the run completes with each session's report.
//!
//! Skipped only with `KEEL_SKIP_REAL_CLIS=1` when the CLI is not installed.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use std::path::PathBuf;
use std::time::Duration;

use keel_actors::session_tool::reported_findings;
use keel_actors::{Plan, PlanStep};
use keel_harness::HarnessKind;
use keel_harness::cli::CliFlavor;
use keel_store::{RunStatus, TaskStatus};
use keel_tests::fan_out::{reader, subtasks};
use keel_tests::{Reaped, keel, recorded_bodies};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(240);

/// `None` when the CLI is missing and skipping was asked for; panics when it is missing otherwise.
fn installed(kind: HarnessKind) -> bool {
    let binary = match kind {
        HarnessKind::Codex => keel_harness::cli::codex::Codex.binary(),
        HarnessKind::Opencode => keel_harness::cli::opencode::Opencode.binary(),
        _ => return true,
    };
    match binary.locate() {
        Ok(_) => true,
        Err(e) if std::env::var("KEEL_SKIP_REAL_CLIS").as_deref() == Ok("1") => {
            eprintln!("skipping {kind} (KEEL_SKIP_REAL_CLIS=1): {e}");
            false
        }
        Err(e) => panic!(
            "{e}\nthis test needs the real CLI: run `{}`, or set KEEL_SKIP_REAL_CLIS=1",
            keel_harness::cli::INSTALL_COMMAND
        ),
    }
}

fn step(key: &str, brief: String) -> PlanStep {
    PlanStep {
        key: key.into(),
        brief,
        goal: format!("the {key} step"),
        quality_criteria: Vec::new(),
        output_schema: None,
        assignee: None,
        depends_on: Vec::new(),
        estimate_micros: 0,
    }
}

/// `keel run` of a plan of two independent steps on `kind`: one calls `report_findings`, the other
/// `report_progress`, each through the name `tool_prefix` + the tool's name; then both report.
fn mcp_tools_case(kind: HarnessKind, tool_prefix: &str) {
    if !installed(kind) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let record: PathBuf = dir.path().join("requests");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("lib.rs"), "pub fn f() {}\n").unwrap();
    let init = keel(&work).unwrap().arg("init").output().unwrap();
    assert!(init.status.success(), "{init:?}");
    let (_server, url) = keel_tests::model_server(&work, &record).unwrap();
    let findings = json!({"findings": [{"claim": "lib.rs defines f", "source": "lib.rs", "confidence_permille": 900}]});
    let note = json!({"note": "halfway through the survey"});
    let plan = Plan {
        steps: vec![
            step(
                "findings",
                format!(
                    "Report what lib.rs holds. REPORT_AFTER_TOOL\nCALL_TOOL: {tool_prefix}report_findings {findings}"
                ),
            ),
            step(
                "progress",
                format!(
                    "Say how far you are. REPORT_AFTER_TOOL\nCALL_TOOL: {tool_prefix}report_progress {note}"
                ),
            ),
        ],
        constraints: Vec::new(),
    };
    std::fs::write(
        work.join(".keel/plan.json"),
        serde_json::to_string(&plan).unwrap(),
    )
    .unwrap();
    let mut cmd = keel(&work).unwrap();
    cmd.args([
        "run",
        "report as you go",
        "--plan",
        ".keel/plan.json",
        "--harness",
        kind.as_str(),
        "--model",
        "keel-scripted-1",
    ])
    .env("OPENAI_BASE_URL", format!("{url}/v1"))
    .env("OPENAI_API_KEY", "sk-cli-mcp-test");
    let (status, out, err) = Reaped::spawn(cmd).unwrap().wait_output(WAIT).unwrap();
    let bodies: Vec<String> = recorded_bodies(&record)
        .iter()
        .map(Value::to_string)
        .collect();
    assert_eq!(
        status.code(),
        Some(0),
        "{kind}: {out}\n{err}\nrequests: {bodies:#?}"
    );
    // The endpoint's answers reached the model in the CLI's next request.
    assert!(
        bodies.iter().any(|b| b.contains("recorded: 1 findings")),
        "{kind}: no request carried report_findings' answer: {bodies:#?}"
    );
    assert!(
        bodies
            .iter()
            .any(|b| b.contains("recorded: progress note 1")),
        "{kind}: no request carried report_progress' answer: {bodies:#?}"
    );
    // The findings and the note are on the task rows.
    let store = reader(&work);
    let run = store.catalog().runs(1).unwrap().items[0].clone();
    assert_eq!(run.status, RunStatus::Completed, "{run:#?}");
    let tasks = subtasks(&store, run.id);
    assert_eq!(tasks.len(), 2, "{tasks:#?}");
    assert!(
        tasks.iter().all(|t| t.status == TaskStatus::Complete),
        "{tasks:#?}"
    );
    let reported: Vec<_> = tasks.iter().flat_map(reported_findings).collect();
    assert_eq!(reported.len(), 1, "{tasks:#?}");
    assert_eq!(reported[0].claim, "lib.rs defines f");
    assert_eq!(reported[0].source, "lib.rs");
    assert!(
        tasks
            .iter()
            .any(|t| t.progress_notes == vec!["halfway through the survey".to_string()]),
        "{tasks:#?}"
    );
}

#[test]
fn codex_calls_report_findings_and_report_progress_on_keels_endpoint() {
    mcp_tools_case(HarnessKind::Codex, "mcp__keel__");
}

#[test]
fn opencode_calls_report_findings_and_report_progress_on_keels_endpoint() {
    mcp_tools_case(HarnessKind::Opencode, "keel_");
}
