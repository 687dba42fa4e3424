//! `keel follow-up` with real processes: a thread started by `keel run` on the built-in scripted
//! model (keel's own messages-api loop, talking to `keel model-server` over 127.0.0.1, which records
//! every request) continues as a derived task served with keel's preamble, on the same harness and
//! on the real Claude Code CLI, and never as a resume.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use std::path::{Path, PathBuf};
use std::time::Duration;

use keel_harness::cli::CliFlavor;
use keel_tests::{Reaped, keel, recorded_bodies};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(120);

/// A folder with a few files to survey, and a recording model server started in it.
struct Fixture {
    dir: tempfile::TempDir,
    records: PathBuf,
    url: String,
    _server: Reaped,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("main.rs"),
            "// TODO: everything\nfn main() {}\n",
        )
        .unwrap();
        std::fs::write(dir.path().join("lib.rs"), "pub fn f() {}\n").unwrap();
        std::fs::write(dir.path().join("notes.md"), "# notes\n").unwrap();
        // The recordings live in keel's own folder, which the survey leaves out.
        let records = dir.path().join(".keel").join("records");
        std::fs::create_dir_all(&records).unwrap();
        let mut cmd = keel(dir.path()).unwrap();
        cmd.args(["model-server", "--record-dir"]).arg(&records);
        let mut server = Reaped::spawn(cmd).unwrap();
        let line = server
            .line_containing("listening on", Duration::from_secs(30))
            .unwrap();
        let url = line.split_whitespace().last().unwrap().to_string();
        Fixture {
            dir,
            records,
            url,
            _server: server,
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// `keel` in the fixture's folder.
    fn keel(&self) -> std::process::Command {
        keel(self.path()).unwrap()
    }

    /// Run `cmd` to its end; returns (exit code, stdout, stderr).
    fn output(&self, cmd: std::process::Command) -> (i32, String, String) {
        let (status, out, err) = Reaped::spawn(cmd).unwrap().wait_output(WAIT).unwrap();
        (status.code().unwrap_or(-1), out, err)
    }

    /// `keel run` of the survey on the scripted model; returns the run id.
    fn survey(&self) -> String {
        let mut cmd = self.keel();
        cmd.args(["run", "survey this folder", "--model-server", &self.url]);
        let (code, out, err) = self.output(cmd);
        assert_eq!(code, 0, "keel run failed\n{out}\n{err}");
        out.lines()
            .find_map(|l| l.strip_prefix("run ")?.split_whitespace().next())
            .unwrap()
            .to_string()
    }

    /// The task rows of a run, as `keel --json tasks` prints them.
    fn tasks(&self, run: &str) -> Vec<Value> {
        let out = self
            .keel()
            .args(["--json", "tasks", "--run", run])
            .output()
            .unwrap();
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        v.as_array()
            .or_else(|| v.get("tasks").and_then(Value::as_array))
            .cloned()
            .unwrap_or_else(|| panic!("unexpected tasks json: {v}"))
    }

    /// The task whose brief contains `needle`.
    fn task_with_brief(&self, run: &str, needle: &str) -> Value {
        self.tasks(run)
            .into_iter()
            .find(|t| t["brief"].as_str().is_some_and(|b| b.contains(needle)))
            .unwrap_or_else(|| panic!("no task with {needle:?} in its brief"))
    }

    /// One task as `keel --json show` prints it.
    fn show(&self, task: &str) -> Value {
        let out = self.keel().args(["--json", "show", task]).output().unwrap();
        serde_json::from_slice(&out.stdout).unwrap()
    }

    /// Every request body the model server received so far.
    fn bodies(&self) -> Vec<Value> {
        recorded_bodies(&self.records)
    }

    /// Add agent profiles to the home's keel.toml.
    fn add_agents(&self, toml: &str) {
        let path = self.path().join(".keel/keel.toml");
        let mut text = std::fs::read_to_string(&path).unwrap();
        text.push('\n');
        text.push_str(toml);
        std::fs::write(path, text).unwrap();
    }
}

/// The text blocks of a request's user turns, joined, in order.
fn user_text(body: &Value) -> String {
    let mut text = String::new();
    for m in body["messages"].as_array().into_iter().flatten() {
        if m["role"] != "user" {
            continue;
        }
        match &m["content"] {
            Value::String(s) => text.push_str(s),
            Value::Array(blocks) => {
                for b in blocks {
                    if let Some(t) = b["text"].as_str() {
                        text.push_str(t);
                        text.push('\n');
                    }
                }
            }
            _ => {}
        }
    }
    text
}

/// The roles of a request's conversation, in order.
fn roles(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["role"].as_str().map(str::to_string))
        .collect()
}

/// A follow-up message that keel's agent loop on the scripted model carries out itself: the model
/// calls the `bash` tool with the command on the `CALL_TOOL:` line, which prints a report naming the
/// session's own subtask id (from its environment) with `claim`.
fn scripted_follow_up(question: &str, claim: &str) -> String {
    let command = format!(
        "printf '{{\"subtask_id\":\"%s\",\"status\":\"complete\",\"findings\":[{{\"claim\":\"{claim}\",\"source\":\"ls\",\"confidence_permille\":900}}],\"gaps\":[],\"summary\":\"follow-up answer\"}}' \"$KEEL_SUBTASK_ID\" >&2"
    );
    format!(
        "{question}\nCALL_TOOL: bash {}",
        serde_json::json!({ "command": command })
    )
}

#[test]
fn a_follow_up_is_a_derived_task_served_with_the_parents_brief_and_outcome() {
    let fx = Fixture::new();
    let run = fx.survey();
    let parent = fx.task_with_brief(&run, "most common file extension");
    let parent_id = parent["id"].as_str().unwrap().to_string();
    let parent_claim = "most common extension: rs 2 files";
    assert!(
        parent["outcome"].as_str().unwrap().contains(parent_claim),
        "{parent}"
    );
    let before = fx.bodies().len();

    // 1. On the same harness, the supervisor's pick (the built-in scripted profile).
    let message = scripted_follow_up("Which language is this folder written in?", "rust");
    let mut cmd = fx.keel();
    cmd.args(["follow-up", &parent_id, &message, "--model-server", &fx.url]);
    let (code, out, err) = fx.output(cmd);
    assert_eq!(code, 0, "{out}\n{err}");
    let follow = out
        .lines()
        .find_map(|l| l.strip_prefix("follow-up ")?.split_whitespace().next())
        .unwrap()
        .to_string();
    assert!(
        out.contains(&format!(
            "follow-up {follow} on the thread of {parent_id} (reopened run {run})"
        )),
        "{out}"
    );
    assert!(
        out.contains(&format!(
            "follow-up {follow}: Complete (agent scripted, model keel-scripted-1, parent {parent_id})"
        )),
        "{out}"
    );
    assert!(out.contains(&format!("run {run}: Completed")), "{out}");
    let row = fx.show(&follow);
    assert_eq!(row["kind"], "FollowUp", "{row}");
    assert_eq!(row["parent"].as_str(), Some(parent_id.as_str()), "{row}");
    assert_eq!(row["run"].as_str(), Some(run.as_str()), "{row}");
    assert_eq!(row["status"], "Complete", "{row}");
    assert_eq!(row["assignee"], "scripted", "{row}");
    assert_eq!(
        row["model"], "keel-scripted-1",
        "from the assignee's profile"
    );
    assert!(
        row["outcome"].as_str().unwrap().contains("\"rust\""),
        "{row}"
    );

    // What the model server received: one new session, opened with the standard preamble (the
    // parent's brief and outcome) and then the message.
    let bodies = fx.bodies();
    let new = &bodies[before..];
    let openings: Vec<&Value> = new.iter().filter(|b| roles(b) == ["user"]).collect();
    assert_eq!(openings.len(), 1, "one session ran: {new:#?}");
    let first = user_text(openings[0]);
    assert!(
        first.starts_with(&format!(
            "<keel-context kind=\"standard\" task=\"{follow}\">"
        )),
        "{first}"
    );
    let preamble_end = first.find("</keel-context>").unwrap();
    let preamble = &first[..preamble_end];
    assert!(
        preamble.contains(&format!("## Parent task {parent_id} (subtask, complete)")),
        "{preamble}"
    );
    assert!(
        preamble.contains("Find the most common file extension in the working directory."),
        "the parent's brief: {preamble}"
    );
    assert!(
        preamble.contains("### Outcome") && preamble.contains(parent_claim),
        "the parent's outcome: {preamble}"
    );
    assert!(
        first[preamble_end..].contains("Which language is this folder written in?"),
        "the message follows the preamble: {first}"
    );
    assert_eq!(openings[0]["model"], "keel-scripted-1");

    // 2. On another profile: its model is that profile's, and the thread goes on from the newest
    // task (the first follow-up).
    fx.add_agents(
        "[[agents]]\nname = \"other\"\nharness = \"messages-api\"\nmodel = \"keel-scripted-2\"\n",
    );
    let before = fx.bodies().len();
    let mut cmd = fx.keel();
    cmd.args([
        "--json",
        "follow-up",
        &parent_id,
        &scripted_follow_up("And how big is it?", "small"),
        "--agent",
        "other",
    ])
    .env("ANTHROPIC_BASE_URL", &fx.url)
    .env("ANTHROPIC_API_KEY", "sk-local-test");
    let (code, out, err) = fx.output(cmd);
    assert_eq!(code, 0, "{out}\n{err}");
    let summary: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(summary["status"], "Complete", "{summary}");
    assert_eq!(summary["agent"], "other", "{summary}");
    assert_eq!(summary["model"], "keel-scripted-2", "{summary}");
    assert_eq!(
        summary["parent"].as_str(),
        Some(follow.as_str()),
        "{summary}"
    );
    assert_eq!(summary["run_status"], "Completed", "{summary}");
    let bodies = fx.bodies();
    let opening = bodies[before..]
        .iter()
        .find(|b| roles(b) == ["user"])
        .unwrap();
    assert_eq!(opening["model"], "keel-scripted-2");
    assert!(
        user_text(opening).contains(&format!("## Parent task {follow} (follow-up, complete)")),
        "{}",
        user_text(opening)
    );

    // 3. What cannot be served is refused, with the usual exit codes.
    let code = |args: &[&str]| {
        let out = fx.keel().args(args).output().unwrap();
        out.status.code().unwrap_or(-1)
    };
    assert_eq!(
        code(&["follow-up", "01ARZ3NDEKTSV4RRFFQ69G5FAV", "hello"]),
        3,
        "unknown task"
    );
    assert_eq!(code(&["follow-up", &parent_id, " "]), 2, "empty message");
    assert_eq!(
        code(&["follow-up", &parent_id, "hello", "--agent", "nobody"]),
        2,
        "unknown agent"
    );
    assert_eq!(code(&["follow-up", "not-a-ulid", "hello"]), 2, "bad id");
    let elsewhere = tempfile::tempdir().unwrap();
    let out = keel(elsewhere.path())
        .unwrap()
        .args(["follow-up", &parent_id, "hello"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "no keel home");
}

#[test]
fn a_follow_up_without_an_agent_keeps_the_runs_ad_hoc_harness_and_model() {
    let fx = Fixture::new();
    // An ad-hoc profile: every task on the in-process scripted harness, as model m1.
    let mut cmd = fx.keel();
    cmd.args([
        "run",
        "survey this folder",
        "--harness",
        "scripted",
        "--model",
        "m1",
    ]);
    let (code, out, err) = fx.output(cmd);
    assert_eq!(code, 0, "keel run failed\n{out}\n{err}");
    let run = out
        .lines()
        .find_map(|l| l.strip_prefix("run ")?.split_whitespace().next())
        .unwrap()
        .to_string();
    let parent = fx.task_with_brief(&run, "most common file extension");
    assert_eq!(parent["model"], "m1", "{parent}");
    let parent_id = parent["id"].as_str().unwrap().to_string();

    // Another process, no --agent and no --harness: the parent's assignee's profile as the run
    // kept it, so the same harness and model m1 (not the built-in scripted model's).
    let mut cmd = fx.keel();
    cmd.args([
        "--json",
        "follow-up",
        &parent_id,
        &scripted_follow_up("Which language is this folder written in?", "rust"),
    ]);
    let (code, out, err) = fx.output(cmd);
    assert_eq!(code, 0, "{out}\n{err}");
    let summary: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(summary["status"], "Complete", "{summary}");
    assert_eq!(summary["agent"], "scripted", "{summary}");
    assert_eq!(summary["model"], "m1", "{summary}");
    let follow = summary["task"].as_str().unwrap();
    let row = fx.show(follow);
    assert_eq!(row["kind"], "FollowUp", "{row}");
    assert_eq!(row["model"], "m1", "recorded with the task: {row}");
}

#[test]
fn a_follow_up_on_a_run_another_process_holds_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let plan =
        keel_actors::runtime::scripted::fan_out_plan(1, |_| "sleep 20; echo late".into()).unwrap();
    let out = keel_tests::run_detached(dir.path(), "hold the store", &plan).unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}");
    let run = text.split_whitespace().nth(1).unwrap().to_string();
    let task = keel_tests::wait_for(Duration::from_secs(60), "the run's subtask", || {
        let out = keel(dir.path())
            .unwrap()
            .args(["--json", "tasks", "--run", &run])
            .output()
            .ok()?;
        let v: Value = serde_json::from_slice(&out.stdout).ok()?;
        v.as_array()
            .or_else(|| v.get("tasks").and_then(Value::as_array))?
            .iter()
            .find(|t| t["kind"] == "Subtask")
            .and_then(|t| t["id"].as_str().map(str::to_string))
    })
    .unwrap();
    let out = keel(dir.path())
        .unwrap()
        .args(["follow-up", &task, "anything new?"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("held by another keel process"), "{err}");
    // Nothing was added to the run.
    let tasks = keel(dir.path())
        .unwrap()
        .args(["--json", "tasks", "--run", &run])
        .output()
        .unwrap();
    assert!(
        !String::from_utf8_lossy(&tasks.stdout).contains("FollowUp"),
        "no follow-up task was created"
    );
    let cancel = keel(dir.path())
        .unwrap()
        .args(["cancel", &run])
        .output()
        .unwrap();
    assert!(cancel.status.success());
    keel_tests::wait_cancelled(dir.path(), &run, Duration::from_secs(60)).unwrap();
}

/// The real Claude Code CLI, or `None` (with the reason printed) when `KEEL_SKIP_REAL_CLIS=1`.
fn claude_code() -> Option<PathBuf> {
    if std::env::var("KEEL_SKIP_REAL_CLIS").as_deref() == Ok("1") {
        eprintln!(
            "skipping the cross-harness follow-up on Claude Code: KEEL_SKIP_REAL_CLIS=1 is set"
        );
        return None;
    }
    match keel_harness::cli::claude::ClaudeCodeHarness::claude_code()
        .flavor()
        .binary()
        .locate()
    {
        Ok(path) => Some(path),
        Err(e) => panic!(
            "{e}\nthis test needs the real Claude Code CLI: run `{}`, or set KEEL_SKIP_REAL_CLIS=1 to skip",
            keel_harness::cli::INSTALL_COMMAND
        ),
    }
}

#[test]
fn a_thread_started_on_the_native_loop_continues_on_claude_code_without_a_resume() {
    let Some(claude) = claude_code() else {
        return;
    };
    let fx = Fixture::new();
    let run = fx.survey();
    let parent = fx.task_with_brief(&run, "most common file extension");
    let parent_id = parent["id"].as_str().unwrap().to_string();
    let first_session = fx.bodies();
    let before = first_session.len();
    // Tool call ids the first sessions' assistant turns used: none may reach Claude Code.
    let earlier_ids: Vec<String> = first_session
        .iter()
        .flat_map(|b| b["messages"].as_array().cloned().unwrap_or_default())
        .filter(|m| m["role"] == "assistant")
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter_map(|c| c["id"].as_str().map(str::to_string))
        .collect();
    assert!(!earlier_ids.is_empty(), "the first run made tool calls");

    // A launcher in front of the real CLI records its argv. Claude Code in keel's accept-edits mode
    // refuses shell commands with expansions, so the launcher (which sees the session's
    // environment) also writes the report naming the session's subtask id, and the model reads it
    // with `cat`: the report still travels through Claude Code's tool call and final answer.
    let launcher_dir = tempfile::tempdir().unwrap();
    let argv_log = launcher_dir.path().join("argv");
    let report = fx.path().join("report.json");
    let launcher = launcher_dir.path().join("claude");
    std::fs::write(
        &launcher,
        format!(
            "#!/bin/sh\nfor a in \"$@\"; do printf '%s\\0' \"$a\"; done >> '{argv}'\n\
             printf '{{\"subtask_id\":\"%s\",\"status\":\"complete\",\"findings\":[{{\"claim\":\"answered on claude code\",\"source\":\"report.json\",\"confidence_permille\":900}}],\"gaps\":[],\"summary\":\"cross-harness\"}}' \"$KEEL_SUBTASK_ID\" > '{report}'\n\
             exec '{claude}' \"$@\"\n",
            argv = argv_log.display(),
            report = report.display(),
            claude = claude.display(),
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &launcher,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    fx.add_agents(
        "[[agents]]\nname = \"claude\"\nharness = \"claude-code\"\nmodel = \"keel-claude-model\"\n",
    );

    let message = "What did the survey find, in one line?\nCALL_TOOL: Bash {\"command\": \"cat report.json\"}";
    let mut cmd = fx.keel();
    cmd.args([
        "--json",
        "follow-up",
        &parent_id,
        message,
        "--agent",
        "claude",
    ])
    .env("ANTHROPIC_BASE_URL", &fx.url)
    .env("ANTHROPIC_API_KEY", "sk-local-test")
    .env("KEEL_CLAUDE_BIN", &launcher);
    let (code, out, err) = fx.output(cmd);
    assert_eq!(code, 0, "{out}\n{err}");
    let summary: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(summary["status"], "Complete", "{summary}");
    assert_eq!(summary["agent"], "claude", "{summary}");
    assert_eq!(summary["model"], "keel-claude-model", "{summary}");
    assert_eq!(summary["parent"].as_str(), Some(parent_id.as_str()));
    let follow = summary["task"].as_str().unwrap().to_string();
    assert_eq!(fx.show(&follow)["kind"], "FollowUp");

    // Claude Code was started once, fresh: no resume or continue flag, keel's preamble as the prompt.
    let argv = std::fs::read_to_string(&argv_log).unwrap();
    let args: Vec<&str> = argv.split('\0').filter(|a| !a.is_empty()).collect();
    let dash = args.iter().position(|a| *a == "--").unwrap();
    for a in &args[..dash] {
        let flag = a.split('=').next().unwrap();
        assert!(
            !keel_harness::cli::RESUME_FLAGS.contains(&flag),
            "resume flag {a} in {args:?}"
        );
    }
    assert_eq!(args.len(), dash + 2, "one prompt after --: {args:?}");
    assert!(
        args[dash + 1].starts_with(&format!(
            "<keel-context kind=\"standard\" task=\"{follow}\">"
        )),
        "{}",
        args[dash + 1]
    );

    // What Claude Code sent: keel's preamble (the parent's brief and outcome) and the message, in a
    // conversation that starts with it: no assistant turn before it, nothing of the first sessions.
    let bodies = fx.bodies();
    let claude_requests: Vec<&Value> = bodies[before..]
        .iter()
        .filter(|b| user_text(b).contains("<keel-context kind=\"standard\""))
        .collect();
    assert!(!claude_requests.is_empty(), "{:#?}", &bodies[before..]);
    let opening = claude_requests[0];
    assert_eq!(opening["model"], "keel-claude-model");
    assert!(
        !roles(opening).iter().any(|r| r == "assistant"),
        "the conversation starts fresh: {:?}",
        roles(opening)
    );
    let text = user_text(opening);
    assert!(
        text.contains(&format!("## Parent task {parent_id} (subtask, complete)")),
        "{text}"
    );
    assert!(
        text.contains("Find the most common file extension in the working directory."),
        "{text}"
    );
    assert!(text.contains("most common extension: rs 2 files"), "{text}");
    assert!(
        text.contains("What did the survey find, in one line?"),
        "{text}"
    );
    for body in &claude_requests {
        let raw = body.to_string();
        for id in &earlier_ids {
            assert!(
                !raw.contains(id.as_str()),
                "a tool call of the first sessions ({id}) reached Claude Code"
            );
        }
    }
}
