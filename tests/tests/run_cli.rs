//! `keel run` as a newcomer meets it: a fresh folder, no configuration, no keys. The run completes on
//! the built-in scripted model (served over 127.0.0.1 to keel's own agent loop, which runs real tools
//! in the folder), and the store it leaves is explained by `keel tree`, `keel logs` and `keel status`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use keel_tests::{Reaped, keel};
use std::time::Duration;

#[test]
fn keel_run_in_a_fresh_folder_completes_and_the_store_explains_it() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("main.rs"),
        "// TODO: everything\nfn main() {}\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("lib.rs"), "pub fn f() {}\n").unwrap();
    std::fs::write(dir.path().join("notes.md"), "# notes\n").unwrap();

    let mut cmd = keel(dir.path()).unwrap();
    cmd.args(["run", "survey this folder"]);
    let (status, out, err) = Reaped::spawn(cmd)
        .unwrap()
        .wait_output(Duration::from_secs(120))
        .unwrap();
    assert!(status.success(), "keel run failed: {status}\n{out}\n{err}");
    assert!(out.contains(": Completed"), "{out}");
    assert!(out.contains("coverage: 4 of 4 steps complete"), "{out}");
    assert!(out.contains("failures: none"), "{out}");
    // What the tools really saw: three files, two of them .rs, one TODO.
    let run = out
        .lines()
        .find_map(|l| l.strip_prefix("run ")?.split_whitespace().next())
        .unwrap()
        .to_string();
    let synthesis =
        std::fs::read_to_string(dir.path().join(".keel/synthesis").join(format!("{run}.md")))
            .unwrap();
    assert!(synthesis.contains("files: 3"), "{synthesis}");
    assert!(
        synthesis.contains("most common extension: rs 2 files"),
        "{synthesis}"
    );
    assert!(synthesis.contains("todo markers: 1"), "{synthesis}");

    let tree = keel(dir.path())
        .unwrap()
        .args(["tree", &run])
        .output()
        .unwrap();
    let tree = String::from_utf8_lossy(&tree.stdout);
    assert_eq!(tree.matches("Subtask Complete").count(), 4, "{tree}");
    assert!(tree.contains("Root Complete"), "{tree}");

    let tasks = keel(dir.path())
        .unwrap()
        .args(["--json", "tasks", "--run", &run])
        .output()
        .unwrap();
    let tasks: serde_json::Value = serde_json::from_slice(&tasks.stdout).unwrap();
    let text = tasks.to_string();
    let subtask = tasks
        .as_array()
        .or_else(|| tasks.get("tasks").and_then(|i| i.as_array()))
        .unwrap_or_else(|| panic!("unexpected tasks json: {text}"))
        .iter()
        .find(|t| t.get("kind").and_then(|k| k.as_str()) == Some("Subtask"))
        .and_then(|t| t.get("id").and_then(|i| i.as_str()))
        .unwrap_or_else(|| panic!("no subtask in {text}"))
        .to_string();
    let logs = keel(dir.path())
        .unwrap()
        .args(["logs", &subtask])
        .output()
        .unwrap();
    let logs = String::from_utf8_lossy(&logs.stdout);
    assert!(logs.contains("session started"), "{logs}");
    assert!(
        logs.contains("bash"),
        "the real tool call is in the log: {logs}"
    );
    assert!(logs.contains("finished: Complete report"), "{logs}");

    let status = keel(dir.path())
        .unwrap()
        .args(["status", &run])
        .output()
        .unwrap();
    let status = String::from_utf8_lossy(&status.stdout);
    assert!(
        status.contains("Completed") && status.contains("4 Complete"),
        "{status}"
    );
}

#[test]
fn a_detached_run_is_cancelled_through_its_process() {
    let dir = tempfile::tempdir().unwrap();
    let plan =
        keel_actors::runtime::scripted::fan_out_plan(2, |i| format!("sleep 20; echo {i}")).unwrap();
    let out = keel_tests::run_detached(dir.path(), "wait", &plan).unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(out.status.success(), "{text}");
    let run = text
        .split_whitespace()
        .nth(1)
        .unwrap_or_else(|| panic!("{text}"))
        .to_string();
    // The background process holds the store, so the cancel goes through it, and it answers.
    let cancel = keel(dir.path())
        .unwrap()
        .args(["cancel", &run])
        .output()
        .unwrap();
    let cancel_text = String::from_utf8_lossy(&cancel.stdout).to_string();
    assert!(cancel.status.success(), "{cancel_text}");
    assert!(
        cancel_text.contains("cancel sent to the keel process hosting it"),
        "{cancel_text}"
    );
    keel_tests::wait_cancelled(dir.path(), &run, Duration::from_secs(60)).unwrap();
}

#[test]
fn keel_demo_narrates_a_crash_a_checkpoint_and_a_harness_switch() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = keel(dir.path()).unwrap();
    cmd.arg("demo");
    let (status, out, err) = Reaped::spawn(cmd)
        .unwrap()
        .wait_output(Duration::from_secs(120))
        .unwrap();
    assert!(status.success(), "{status}\n{out}\n{err}");
    assert!(
        out.contains("part-001: attempt 2 started as alpha on scripted"),
        "{out}"
    );
    assert!(out.contains("restarted after a crash"), "{out}");
    assert!(out.contains("tasks paused"), "{out}");
    assert!(
        out.contains("attempt 2 started as beta on messages-api, with a resume preamble"),
        "{out}"
    );
    assert!(out.contains("finished: Completed"), "{out}");
}

/// `git` in `dir`, which must succeed.
fn git(dir: &std::path::Path, args: &[&str]) {
    let out = std::process::Command::new("git")
        .args(["-c", "user.name=keel", "-c", "user.email=keel@localhost"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
}

#[test]
fn the_survey_of_a_git_repository_leaves_out_what_git_ignores() {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path();
    std::fs::write(repo.join("main.rs"), "// TODO: everything\nfn main() {}\n").unwrap();
    std::fs::write(repo.join("lib.rs"), "pub fn f() {}\n").unwrap();
    std::fs::write(repo.join(".gitignore"), "/target\n").unwrap();
    // Build output, as a fresh clone has it after `cargo build`: larger than anything tracked,
    // more numerous, and with a TODO of its own.
    let target = repo.join("target/release");
    std::fs::create_dir_all(&target).unwrap();
    std::fs::write(target.join("keel"), vec![b'x'; 100_000]).unwrap();
    for i in 0..5 {
        std::fs::write(target.join(format!("dep-{i}.json")), "{} // TODO\n").unwrap();
    }
    git(repo, &["init", "-q"]);
    git(repo, &["add", "main.rs", ".gitignore"]);
    git(repo, &["commit", "-q", "-m", "first"]);
    // lib.rs is untracked but not ignored: part of the repository's survey.

    let mut cmd = keel(repo).unwrap();
    cmd.args(["run", "survey this repository"]);
    let (status, out, err) = Reaped::spawn(cmd)
        .unwrap()
        .wait_output(Duration::from_secs(120))
        .unwrap();
    assert!(status.success(), "keel run failed: {status}\n{out}\n{err}");
    let run = out
        .lines()
        .find_map(|l| l.strip_prefix("run ")?.split_whitespace().next())
        .unwrap()
        .to_string();
    let synthesis =
        std::fs::read_to_string(repo.join(".keel/synthesis").join(format!("{run}.md"))).unwrap();
    // .gitignore, main.rs, lib.rs: not target/, not keel's own folder.
    assert!(synthesis.contains("files: 3"), "{synthesis}");
    assert!(
        synthesis.contains("most common extension: rs 2 files"),
        "{synthesis}"
    );
    assert!(synthesis.contains("largest: main.rs"), "{synthesis}");
    assert!(synthesis.contains("todo markers: 1"), "{synthesis}");
}

/// `keel run` of a plan of one step whose brief is `what` and has the scripted model run `command`
/// in the shell (and nothing else: the report is whatever the command prints).
fn run_one_step(
    dir: &std::path::Path,
    what: &str,
    command: &str,
) -> (std::process::ExitStatus, String, String) {
    let plan = keel_actors::Plan {
        steps: vec![keel_actors::PlanStep {
            key: "only".into(),
            brief: format!("{what}\nRUN_TOOL: {command} ;;"),
            goal: what.into(),
            quality_criteria: Vec::new(),
            output_schema: None,
            assignee: None,
            depends_on: Vec::new(),
            estimate_micros: 0,
        }],
        constraints: Vec::new(),
    };
    std::fs::write(dir.join("plan.json"), serde_json::to_string(&plan).unwrap()).unwrap();
    let mut cmd = keel(dir).unwrap();
    cmd.args(["run", what, "--plan", "plan.json"]);
    Reaped::spawn(cmd)
        .unwrap()
        .wait_output(Duration::from_secs(120))
        .unwrap()
}

#[test]
fn a_failed_step_ends_the_run_with_a_sentence_and_json_keeps_the_structure() {
    let dir = tempfile::tempdir().unwrap();
    // One step whose session answers with no report at all: every attempt fails as malformed.
    let (status, out, err) = run_one_step(
        dir.path(),
        "Say something that is not a report.",
        "echo nothing to report",
    );
    assert_eq!(status.code(), Some(5), "{out}\n{err}");
    let failures = out
        .split("failures:")
        .nth(1)
        .unwrap_or_else(|| panic!("no failures in {out}"));
    assert!(
        failures.contains("the session's report could not be read"),
        "{out}"
    );
    assert!(
        !out.contains("{\"Failed\""),
        "raw JSON at the end of a run: {out}"
    );

    // The structure stays for scripts: the task's stored failure, typed.
    let task = failures
        .lines()
        .find(|l| l.contains("the session's report could not be read"))
        .and_then(|l| l.trim().split(':').next())
        .unwrap()
        .to_string();
    let show = keel(dir.path())
        .unwrap()
        .args(["--json", "show", &task])
        .output()
        .unwrap();
    let show: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    let stored: serde_json::Value =
        serde_json::from_str(show["outcome"].as_str().unwrap()).unwrap();
    assert_eq!(stored["Failed"]["kind"], "malformed_report", "{show}");
}

#[test]
fn a_report_written_slightly_off_is_accepted_and_the_log_says_how_it_was_read() {
    let dir = tempfile::tempdir().unwrap();
    // The session's report as a model might write it: confidence as a fraction, no gaps, the
    // status capitalised.
    let report = r#"{\"subtask_id\":\"%s\",\"status\":\"Complete\",\"findings\":[{\"claim\":\"hello\",\"source\":\"shell\",\"confidence\":0.9}],\"summary\":\"said hello\"}"#;
    let (status, out, err) = run_one_step(
        dir.path(),
        "Say hello.",
        &format!("printf '{report}' \"$KEEL_SUBTASK_ID\" >&2"),
    );
    assert!(status.success(), "{out}\n{err}");
    assert!(out.contains("coverage: 1 of 1 steps complete"), "{out}");
    let tasks = keel(dir.path())
        .unwrap()
        .args(["--json", "tasks"])
        .output()
        .unwrap();
    let tasks: serde_json::Value = serde_json::from_slice(&tasks.stdout).unwrap();
    let step = tasks["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["kind"] == "Subtask")
        .unwrap();
    let logs = keel(dir.path())
        .unwrap()
        .args(["--json", "logs", step["id"].as_str().unwrap()])
        .output()
        .unwrap();
    let logs = String::from_utf8_lossy(&logs.stdout);
    assert!(logs.contains("report normalised"), "{logs}");
    assert!(
        logs.contains("confidence 0.9 read as 900 per mille"),
        "{logs}"
    );
}
