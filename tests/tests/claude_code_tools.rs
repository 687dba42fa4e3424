//! The real Claude Code (the pinned CLI, against the scripted model server) calling keel's MCP tools
//! through `keel run` and `keel follow-up` (issue 11):
//!
//! - as a lead, it calls `delegate` with three subtasks in one turn; the three specialists (Claude
//!   Code sessions too) run as one parallel turn; the lead gets the three reports and the run
//!   completes with its synthesis;
//! - as a follow-up, it calls `get_task_details` on the parent its preamble names and gets that
//!   task's brief and status;
//! - it calls `report_findings`: the findings are in the store before Claude Code's next request
//!   (which carries the answer), and still there after `keel run` is killed;
//! - it calls `escalate`: the task pauses, `keel answer` resumes it, and the new session's first
//!   request carries the human's answer.
//!
//! Skipped only with `KEEL_SKIP_REAL_CLIS=1` when Claude Code is not installed.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use keel_actors::session_tool::reported_findings;
use keel_actors::{Plan, PlanStep};
use keel_store::{RunId, RunStatus, TaskKind, TaskStatus};
use keel_tests::fan_out::{reader, subtasks};
use keel_tests::{Reaped, keel, recorded_bodies, wait_for};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(180);

struct Fixture {
    _dir: tempfile::TempDir,
    work: PathBuf,
    record: PathBuf,
    _server: Reaped,
    url: String,
}

impl Fixture {
    fn new() -> Fixture {
        Fixture::scripted(None)
    }

    /// A keel home with a model server following `script` first (then the prompt rules).
    fn scripted(script: Option<Value>) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        let record = dir.path().join("requests");
        std::fs::create_dir_all(&work).unwrap();
        std::fs::write(work.join("lib.rs"), "pub fn f() {}\n").unwrap();
        let init = keel(&work).unwrap().arg("init").output().unwrap();
        assert!(init.status.success(), "{init:?}");
        let script_file = dir.path().join("script.json");
        if let Some(script) = &script {
            std::fs::write(&script_file, script.to_string()).unwrap();
        }
        let (server, url) = keel_tests::model_server_with(
            &work,
            &record,
            script.is_some().then_some(&*script_file),
        )
        .unwrap();
        Fixture {
            _dir: dir,
            work,
            record,
            _server: server,
            url,
        }
    }

    /// An agent profile `claude` on Claude Code in keel.toml.
    fn add_claude(&self) {
        let config = self.work.join(".keel/keel.toml");
        let mut text = std::fs::read_to_string(&config).unwrap();
        text.push_str(
            "\n[[agents]]\nname = \"claude\"\nharness = \"claude-code\"\nmodel = \"keel-scripted-1\"\n",
        );
        std::fs::write(&config, text).unwrap();
    }

    /// `keel ARGS` with Claude Code pointed at the scripted model server.
    fn keel(&self, args: &[&str]) -> std::process::Command {
        let mut cmd = keel(&self.work).unwrap();
        cmd.args(args)
            .env("ANTHROPIC_BASE_URL", &self.url)
            .env("ANTHROPIC_API_KEY", "sk-claude-tools-test");
        cmd
    }

    fn finish(&self, cmd: std::process::Command) -> (i32, String, String) {
        let (status, out, err) = Reaped::spawn(cmd).unwrap().wait_output(WAIT).unwrap();
        (status.code().unwrap_or(-1), out, err)
    }

    /// `keel run` of a one-step plan whose step, on the `claude` profile, has `brief`; started.
    fn start_one_step(&self, brief: &str) -> Reaped {
        let plan = Plan {
            steps: vec![PlanStep {
                key: "step".into(),
                brief: brief.into(),
                goal: "the step's goal".into(),
                quality_criteria: Vec::new(),
                output_schema: None,
                assignee: Some("claude".into()),
                depends_on: Vec::new(),
                estimate_micros: 0,
            }],
            constraints: Vec::new(),
        };
        let file = self.work.join(".keel/plan.json");
        std::fs::write(&file, serde_json::to_string(&plan).unwrap()).unwrap();
        Reaped::spawn(self.keel(&[
            "run",
            "one step",
            "--quiet",
            "--plan",
            ".keel/plan.json",
            "--agent",
            "claude",
        ]))
        .unwrap()
    }

    /// `keel ARGS` in the home, run to its end.
    fn keel_here(&self, args: &[&str]) -> (i32, String, String) {
        let mut cmd = keel(&self.work).unwrap();
        cmd.args(args);
        self.finish(cmd)
    }
}

/// The text of every tool result in a recorded request (Anthropic's wire shape).
fn tool_results(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|c| c["type"] == "tool_result")
        .map(|c| match &c["content"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect()
}

/// A subtask the scripted model carries out on any harness: it runs `echo part N done` and then
/// reports with that line as its finding.
fn part(i: usize) -> Value {
    json!({
        "id": format!("part-{i}"),
        "brief": format!("Part {i}. REPORT_AFTER_TOOL\nRUN_TOOL: echo part {i} done ;;"),
        "goal": format!("part {i}"),
    })
}

#[test]
fn claude_code_as_a_lead_delegates_three_subtasks_in_one_call_and_ends_with_its_synthesis() {
    if !keel_tests::claude_code_installed() {
        return;
    }
    let fx = Fixture::new();
    fx.add_claude();
    let brief = format!(
        "Lead the three parts. REPORT_AFTER_TOOL\nCALL_TOOL: mcp__keel__delegate {}",
        json!({"subtasks": [part(1), part(2), part(3)]})
    );
    let (code, out, err) = fx.finish(fx.keel(&["run", &brief, "--agent", "claude"]));
    assert_eq!(code, 0, "{out}\n{err}");
    let run: RunId = out
        .lines()
        .find_map(|l| {
            l.strip_prefix("run ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap();
    let store = reader(&fx.work);
    let row = store.catalog().run(run).unwrap();
    assert_eq!(row.status, RunStatus::Completed, "{row:?}\n{out}\n{err}");
    // Three subtasks, each a Claude Code session that reported.
    let tasks = subtasks(&store, run);
    assert_eq!(tasks.len(), 3, "{tasks:#?}");
    for t in &tasks {
        assert_eq!(t.kind, TaskKind::Subtask);
        assert_eq!(t.status, TaskStatus::Complete, "{t:#?}");
        assert_eq!(t.assignee.as_deref(), Some("claude"));
    }
    // One delegation turn of three calls, dispatched together.
    let root = store
        .run(run)
        .tasks(None, 100)
        .unwrap()
        .items
        .into_iter()
        .find(|t| t.kind == TaskKind::Root)
        .unwrap();
    assert_eq!(root.status, TaskStatus::Complete);
    let log = store.run(run).last_log_rows(root.id, 500).unwrap();
    assert!(
        log.iter().any(|r| r
            .value
            .summary
            .contains("dispatch delegation turn 1: 3 calls in parallel")),
        "{log:#?}"
    );
    // The lead's delegate call was answered with the three reports, and the lead read them: the
    // model saw the answer in Claude Code's next request, and the lead's report is its synthesis.
    let bodies = recorded_bodies(&fx.record);
    let answer = bodies
        .iter()
        .flat_map(tool_results)
        .find(|r| r.contains("part-1") && r.contains("part-2") && r.contains("part-3"))
        .expect("the lead's delegate answer reached Claude Code");
    for i in 1..=3 {
        assert!(answer.contains(&format!("part {i} done")), "{answer}");
    }
    assert!(root.outcome.is_some(), "{root:#?}");
    let synthesis = row.outcome.clone().unwrap_or_default();
    for i in 1..=3 {
        assert!(
            synthesis.contains(&format!("part {i} done"))
                || out.contains(&format!("part {i} done")),
            "the synthesis covers part {i}: {synthesis}\n{out}"
        );
    }
}

/// The survey run on keel's own loop: the parent of the follow-ups; returns the run and the task
/// whose brief holds `needle`.
fn survey(fx: &Fixture, needle: &str) -> (RunId, keel_store::Task) {
    let (code, out, err) = fx.finish(fx.keel(&["run", "survey", "--model-server", &fx.url]));
    assert_eq!(code, 0, "{out}\n{err}");
    let run: RunId = out
        .lines()
        .find_map(|l| {
            l.strip_prefix("run ")?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .unwrap();
    let store = reader(&fx.work);
    let task = subtasks(&store, run)
        .into_iter()
        .find(|t| t.brief.contains(needle))
        .unwrap();
    (run, task)
}

fn follow_up(fx: &Fixture, parent: &str, message: &str) -> std::process::Command {
    fx.keel(&["follow-up", parent, message, "--agent", "claude"])
}

#[test]
fn claude_code_reads_an_ancestor_its_preamble_names_with_get_task_details() {
    if !keel_tests::claude_code_installed() {
        return;
    }
    let fx = Fixture::new();
    let (_run, parent) = survey(&fx, "most common file extension");
    fx.add_claude();
    let parent_id = parent.id.to_string();

    let message = format!(
        "Read the parent task. REPORT_AFTER_TOOL\nCALL_TOOL: mcp__keel__get_task_details {}",
        json!({ "task_id": parent_id })
    );
    let before = recorded_bodies(&fx.record).len();
    let (code, out, err) = fx.finish(follow_up(&fx, &parent_id, &message));
    assert_eq!(code, 0, "{out}\n{err}");
    let bodies = recorded_bodies(&fx.record);
    let new = &bodies[before..];
    let opening = new
        .iter()
        .find(|b| b.to_string().contains("kind=\\\"standard\\\""))
        .expect("the follow-up's session was recorded");
    assert!(
        opening
            .to_string()
            .contains(&format!("## Parent task {parent_id}")),
        "the preamble names the parent"
    );
    let details = new
        .iter()
        .flat_map(tool_results)
        .find(|r| r.contains(&parent_id))
        .expect("Claude Code got the answer of get_task_details");
    assert!(
        details.contains("most common file extension"),
        "the parent's brief: {details}"
    );
    assert!(details.contains("Complete"), "its status: {details}");
}

/// The task rows of the run's step (every task but the root).
fn step_tasks(work: &std::path::Path) -> Vec<keel_store::Task> {
    let store = reader(work);
    let runs = store.catalog().runs(10).unwrap().items;
    runs.iter().flat_map(|r| subtasks(&store, r.id)).collect()
}

#[test]
fn claude_code_reports_findings_that_are_durable_before_its_next_request_and_survive_a_sigkill() {
    if !keel_tests::claude_code_installed() {
        return;
    }
    // The first answer calls `report_findings`; the next request (the one carrying the tool's
    // answer) hangs, so the run is frozen right after Claude Code got the answer.
    let fx = Fixture::scripted(Some(json!({"turns": [
        {"tool_calls": [{"name": "mcp__keel__report_findings", "input": {"findings": [
            {"claim": "lib.rs defines f", "source": "lib.rs", "confidence_permille": 900},
            {"claim": "f takes no arguments", "source": "lib.rs:1"},
        ]}}]},
        {"failure": {"kind": "hang", "ms": 240_000}},
    ]})));
    fx.add_claude();
    let run = fx.start_one_step("Look at lib.rs and report what you find as you go.");
    let answer = wait_for(
        WAIT,
        "Claude Code's request carrying the tool's answer",
        || {
            recorded_bodies(&fx.record)
                .iter()
                .flat_map(tool_results)
                .find(|r| r.contains("findings"))
        },
    )
    .unwrap();
    assert!(answer.contains("recorded: 2 findings"), "{answer}");
    // The answer reached Claude Code only once the findings were durable: they are in the store
    // file now, while the session waits on the model.
    let tasks = step_tasks(&fx.work);
    assert_eq!(tasks.len(), 1, "{tasks:#?}");
    let findings = reported_findings(&tasks[0]);
    assert_eq!(findings.len(), 2, "{tasks:#?}");
    assert_eq!(findings[0].claim, "lib.rs defines f");
    assert_eq!(findings[0].source, "lib.rs");
    assert_eq!(findings[0].confidence_permille, 900);
    assert_eq!(findings[1].source, "lib.rs:1");
    // A session that dies after reporting keeps what it reported (the store, recovered after the
    // SIGKILL, still has them).
    run.kill();
    let store = keel_store::Store::open(fx.work.join(".keel/keel.redb")).unwrap();
    let task = store.run(tasks[0].run_id).task(tasks[0].id).unwrap();
    assert_eq!(reported_findings(&task).len(), 2, "{task:#?}");
}

#[test]
fn claude_code_escalates_and_keel_answer_resumes_the_task_with_the_answer_in_its_first_request() {
    if !keel_tests::claude_code_installed() {
        return;
    }
    const QUESTION: &str = "Which config format should the tool write?";
    let fx = Fixture::scripted(Some(json!({"turns": [{"tool_calls": [{
        "name": "mcp__keel__escalate",
        "input": {"reason": "the spec names two formats", "question": QUESTION, "options": ["json", "toml"]},
    }]}]})));
    fx.add_claude();
    let run = fx.start_one_step(
        "Write the config file. REPORT_AFTER_TOOL\nRUN_TOOL: echo resumed-after-answer ;;",
    );
    let open = wait_for(WAIT, "an open escalation", || {
        let (code, out, _) = fx.keel_here(&["--json", "escalations"]);
        let v: Value = serde_json::from_str(out.trim()).ok()?;
        let list = v["escalations"].as_array()?.clone();
        (code == 0 && !list.is_empty()).then_some(list)
    })
    .unwrap_or_else(|e| {
        let bodies: Vec<String> = recorded_bodies(&fx.record)
            .iter()
            .map(|b| b.to_string().chars().take(3000).collect())
            .collect();
        let (_, out, err) = fx.keel_here(&["--json", "escalations"]);
        panic!(
            "{e}\nrequests: {bodies:#?}\nescalations: {out}\n{err}\nrun: {}",
            run.stderr_so_far()
        )
    });
    assert_eq!(open.len(), 1, "{open:#?}");
    let e = &open[0];
    assert_eq!(e["trigger"], "human_requested");
    assert_eq!(e["asked"], QUESTION);
    assert_eq!(e["options"], json!(["json", "toml"]));
    let id = e["id"].as_str().unwrap().to_string();
    // Paused, durably, until the answer.
    let tasks = step_tasks(&fx.work);
    assert_eq!(tasks[0].status, TaskStatus::Paused, "{tasks:#?}");

    let (code, out, err) = fx.keel_here(&["answer", &id, "toml"]);
    assert_eq!(code, 0, "{out}{err}");
    let (status, out, err) = run.wait_output(WAIT).unwrap();
    assert_eq!(status.code(), Some(0), "the run completes\n{out}\n{err}");
    let tasks = step_tasks(&fx.work);
    assert!(
        tasks.iter().any(|t| t.status == TaskStatus::Complete),
        "{tasks:#?}"
    );

    // Two Claude Code sessions (requests without any tool result open a session): the second's
    // first request carries the human's answer and the question.
    let openings: Vec<String> = recorded_bodies(&fx.record)
        .iter()
        .filter(|b| b.get("messages").is_some() && tool_results(b).is_empty())
        .map(Value::to_string)
        .collect();
    assert_eq!(openings.len(), 2, "{openings:#?}");
    assert!(!openings[0].contains("The human answered"));
    assert!(
        openings[1].contains("The human answered: toml") && openings[1].contains(QUESTION),
        "{}",
        openings[1]
    );
}
