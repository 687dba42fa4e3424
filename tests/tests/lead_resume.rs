//! A lead session killed with SIGKILL after two of its three delegated subtasks reported, then `keel
//! resume` (issue 11): only the third subtask runs again, the lead's new session gets a resume
//! preamble that lists the subtasks it delegated with their outcomes, its repeated `delegate` call is
//! answered from the durable reports (no subtask is delegated twice), and the run completes with
//! the lead's report.
//!
//! Real processes: `keel model-server` (the scripted model on 127.0.0.1, recording every request),
//! `keel run "BRIEF"` without a plan on keel's own agent loop (a lead session that calls `delegate`
//! on the node's MCP endpoint), SIGKILL, `keel resume`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use keel_actors::runtime::scripted;
use keel_store::{RunId, RunStatus, TaskKind, TaskStatus};
use keel_tests::fan_out::{count, reader, subtasks};
use keel_tests::{Reaped, keel, recorded_bodies, wait_for};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;

const RUN_WAIT: Duration = Duration::from_secs(90);

struct Scenario {
    _dir: tempfile::TempDir,
    work: PathBuf,
    record: PathBuf,
    marks: PathBuf,
    _server: Reaped,
    url: String,
}

fn scenario() -> Scenario {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let record = dir.path().join("requests");
    let marks = dir.path().join("marks");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::create_dir_all(&marks).unwrap();
    let init = keel(&work).unwrap().arg("init").output().unwrap();
    assert!(init.status.success(), "{init:?}");
    let (server, url) = keel_tests::model_server(&work, &record).unwrap();
    Scenario {
        _dir: dir,
        work,
        record,
        marks,
        _server: server,
        url,
    }
}

/// The lead's brief: by the scripted model's prompt rules its session calls `delegate` once with
/// three subtasks (each marks its start in `marks`; the third waits for `marks/go`), then reports
/// once the call is answered.
fn lead_brief(marks: &Path) -> String {
    let subtasks: Vec<serde_json::Value> = (1..=3)
        .map(|i| {
            let start = format!("echo started >> {}/part-{i}", marks.display());
            let command = if i == 3 {
                format!(
                    "{start}; while [ ! -f {}/go ]; do sleep 0.1; done; echo part {i} done",
                    marks.display()
                )
            } else {
                format!("{start}; echo part {i} done")
            };
            let brief =
                scripted::report_brief(&format!("Part {i}."), &command, "shell", "a part").unwrap();
            json!({"id": format!("part-{i}"), "brief": brief, "goal": format!("part {i}")})
        })
        .collect();
    format!(
        "Lead the three parts. REPORT_AFTER_TOOL\nCALL_TOOL: mcp__keel__delegate {}",
        json!({ "subtasks": subtasks })
    )
}

fn lead_command(s: &Scenario, args: &[&str]) -> std::process::Command {
    let mut cmd = keel(&s.work).unwrap();
    cmd.args(args)
        .args(["--harness", "messages-api", "--model", "keel-scripted-1"])
        .env("ANTHROPIC_BASE_URL", &s.url)
        .env("ANTHROPIC_API_KEY", "sk-lead-resume-test");
    cmd
}

fn starts(s: &Scenario, part: usize) -> usize {
    std::fs::read_to_string(s.marks.join(format!("part-{part}")))
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

#[test]
fn a_lead_killed_after_two_of_three_reports_resumes_and_only_the_third_runs() {
    let s = scenario();
    let brief = lead_brief(&s.marks);
    let mut proc_ = Reaped::spawn(lead_command(&s, &["run", &brief])).unwrap();
    let line = proc_
        .line_containing("started in", Duration::from_secs(60))
        .unwrap();
    let run: RunId = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    let store = reader(&s.work);
    wait_for(RUN_WAIT, "two reports and the third running", || {
        let tasks = subtasks(&store, run);
        (count(&tasks, TaskStatus::Complete) == 2 && starts(&s, 3) == 1).then_some(())
    })
    .unwrap();
    proc_.kill();
    let at_kill = subtasks(&store, run);
    assert_eq!(at_kill.len(), 3, "{at_kill:#?}");
    assert_eq!(count(&at_kill, TaskStatus::Complete), 2);
    drop(store);
    std::fs::write(s.marks.join("go"), "").unwrap();

    let (status, out, err) = Reaped::spawn(lead_command(&s, &["resume", &run.to_string()]))
        .unwrap()
        .wait_output(RUN_WAIT)
        .unwrap();
    assert!(status.success(), "resume failed: {status}\n{out}\n{err}");
    let store = reader(&s.work);
    assert_eq!(
        store.catalog().run(run).unwrap().status,
        RunStatus::Completed
    );
    // Only the third ran again; the resumed lead's repeated delegation made no new subtask.
    assert_eq!(starts(&s, 1), 1, "part 1 ran again");
    assert_eq!(starts(&s, 2), 1, "part 2 ran again");
    assert_eq!(starts(&s, 3), 2, "part 3 ran once more");
    let tasks = subtasks(&store, run);
    assert_eq!(
        tasks.iter().filter(|t| t.kind == TaskKind::Subtask).count(),
        3,
        "{tasks:#?}"
    );
    assert_eq!(count(&tasks, TaskStatus::Complete), 3, "{tasks:#?}");
    // The lead's new session opened with a resume preamble listing what it delegated and how each
    // ended: the two reports, and the third not ended yet.
    let bodies = recorded_bodies(&s.record);
    let opening = bodies
        .iter()
        .map(|b| b.to_string())
        .find(|b| b.contains("kind=\\\"resume\\\"") && b.contains("Lead the three parts"))
        .expect("the lead's resumed session was recorded");
    assert!(opening.contains("## Subtasks you delegated"), "{opening}");
    for id in at_kill.iter().map(|t| t.id.to_string()) {
        assert!(opening.contains(&id), "{id} not listed: {opening}");
    }
    assert_eq!(opening.matches("[complete] part ").count(), 2, "{opening}");
    assert!(opening.contains("not ended yet"), "{opening}");
}
