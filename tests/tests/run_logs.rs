//! What `keel run` tells while it runs and at its end, on the built-in scripted model: log lines on
//! stderr (`--log-format json`: one JSON object a line, inside the run's and the task's spans), the
//! plain progress lines with each specialist's tokens and spend, and the run's totals in the summary.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use keel_tests::{Reaped, keel};
use serde_json::Value;
use std::collections::BTreeSet;
use std::time::Duration;

/// `keel run` in a fresh folder with `args` before the brief; returns (folder, stdout, stderr).
fn run_keel(log_filter: &str, args: &[&str]) -> (tempfile::TempDir, String, String) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("main.rs"), "// TODO: all\nfn main() {}\n").unwrap();
    let mut cmd = keel(dir.path()).unwrap();
    cmd.env("KEEL_LOG", log_filter).env_remove("RUST_LOG");
    cmd.args(args).args(["run", "survey this folder"]);
    let (status, out, err) = Reaped::spawn(cmd)
        .unwrap()
        .wait_output(Duration::from_secs(120))
        .unwrap();
    assert!(status.success(), "keel run failed: {status}\n{out}\n{err}");
    (dir, out, err)
}

/// The value of `field` in the span named `name` of a JSON log line's span list.
fn span_field<'a>(line: &'a Value, name: &str, field: &str) -> Option<&'a str> {
    line.get("spans")?
        .as_array()?
        .iter()
        .find(|s| s.get("name").and_then(Value::as_str) == Some(name))?
        .get(field)?
        .as_str()
}

/// The first number of `text` after `before` (thousands separators allowed).
fn number_after(text: &str, before: &str) -> u64 {
    let at = text
        .find(before)
        .unwrap_or_else(|| panic!("no {before:?} in {text:?}"));
    let digits: String = text[at + before.len()..]
        .chars()
        .take_while(|c| c.is_ascii_digit() || *c == ',')
        .filter(char::is_ascii_digit)
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("no number after {before:?} in {text:?}"))
}

/// (input, output) tokens of a usage phrase `N in / M out tokens`.
fn tokens_of(text: &str) -> (u64, u64) {
    let input = text
        .split(" in ")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .unwrap_or_else(|| panic!("no input tokens in {text:?}"));
    let input: u64 = input
        .replace(',', "")
        .parse()
        .unwrap_or_else(|_| panic!("no input tokens in {text:?}"));
    (input, number_after(text, "/ "))
}

#[test]
fn json_logs_are_one_object_a_line_inside_the_run_and_task_spans() {
    let (_dir, out, err) = run_keel("debug", &["--log-format", "json"]);
    let run = out
        .lines()
        .find_map(|l| l.strip_prefix("run ")?.split_whitespace().next())
        .unwrap_or_else(|| panic!("no run id in {out}"))
        .to_string();
    let mut lines = Vec::new();
    for line in err.lines().filter(|l| !l.trim().is_empty()) {
        let value: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("a stderr line is not JSON ({e}): {line}"));
        assert!(value.is_object(), "{line}");
        lines.push(value);
    }
    let message = |v: &Value| {
        v.pointer("/fields/message")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    // keel's own lines inside a task: every one names the run and its task.
    let mut tasks = BTreeSet::new();
    let mut inside = 0;
    for v in lines.iter().filter(|v| {
        matches!(
            message(v).as_str(),
            "specialist started"
                | "harness session started"
                | "harness session ended"
                | "attempt finished"
        )
    }) {
        inside += 1;
        assert_eq!(span_field(v, "run", "run"), Some(run.as_str()), "{v}");
        let task = span_field(v, "task", "task").unwrap_or_else(|| panic!("no task span: {v}"));
        assert_eq!(task.len(), 26, "a task id is a ULID string: {v}");
        assert_eq!(
            v.pointer("/span/name").and_then(Value::as_str),
            Some("task"),
            "{v}"
        );
        tasks.insert(task.to_string());
    }
    // Four steps, each started, run and finished.
    assert_eq!(tasks.len(), 4, "{err}");
    assert!(inside >= 16, "{inside} task lines in {err}");
    // The harness's own work (the agent loop's HTTP client) runs inside the task's span too.
    let client: Vec<&Value> = lines
        .iter()
        .filter(|v| v.get("target").and_then(Value::as_str) == Some("reqwest::connect"))
        .collect();
    assert!(!client.is_empty(), "no HTTP client line in {err}");
    for v in client {
        assert_eq!(span_field(v, "run", "run"), Some(run.as_str()), "{v}");
        assert!(span_field(v, "task", "task").is_some(), "{v}");
    }
    // The run's end is logged in the run's span alone.
    let finished = lines
        .iter()
        .find(|v| message(v) == "run finished")
        .unwrap_or_else(|| panic!("no run finished line in {err}"));
    assert_eq!(
        finished.pointer("/span/run").and_then(Value::as_str),
        Some(run.as_str())
    );
    assert_eq!(
        finished.pointer("/span/mode").and_then(Value::as_str),
        Some("plan")
    );
}

#[test]
fn plain_progress_shows_each_specialists_tokens_and_the_summary_their_totals() {
    let (dir, out, err) = run_keel("warn", &[]);
    assert!(err.trim().is_empty(), "nothing to warn about: {err}");
    // One closing line per specialist: its report, or (when the report event came after the run's
    // end) the line the view closes it with.
    let reports: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("report ") || l.starts_with("ended "))
        .collect();
    assert_eq!(reports.len(), 4, "{out}");
    let steps: BTreeSet<&str> = reports
        .iter()
        .filter_map(|l| l.split_whitespace().nth(1))
        .collect();
    assert_eq!(steps.len(), 4, "{out}");
    let (mut input, mut output) = (0, 0);
    for line in &reports {
        assert!(line.contains(" out tokens, $"), "{line}");
        let (i, o) = tokens_of(line);
        // The scripted server's usage numbers, through the agent loop's usage events.
        assert!(i > 0 && o > 0, "{line}");
        input += i;
        output += o;
    }
    let usage = out
        .lines()
        .find(|l| l.starts_with("usage: "))
        .unwrap_or_else(|| panic!("no usage line in {out}"));
    assert_eq!(tokens_of(usage), (input, output), "{usage}\n{out}");
    assert!(usage.ends_with("across 4 specialist attempts"), "{usage}");
    let finished = out
        .lines()
        .find(|l| l.starts_with("finished "))
        .unwrap_or_else(|| panic!("no finished line in {out}"));
    assert_eq!(tokens_of(finished), (input, output), "{finished}");

    // The store's record: each subtask's last usage row carries the same counts as JSON.
    let run = out
        .lines()
        .find_map(|l| l.strip_prefix("run ")?.split_whitespace().next())
        .unwrap()
        .to_string();
    let tasks = keel(dir.path())
        .unwrap()
        .args(["--json", "tasks", "--run", &run])
        .output()
        .unwrap();
    let tasks: Value = serde_json::from_slice(&tasks.stdout).unwrap();
    let ids: Vec<String> = tasks
        .as_array()
        .or_else(|| tasks.get("tasks").and_then(Value::as_array))
        .unwrap_or_else(|| panic!("unexpected tasks json: {tasks}"))
        .iter()
        .filter(|t| t.get("kind").and_then(Value::as_str) == Some("Subtask"))
        .filter_map(|t| t.get("id").and_then(Value::as_str).map(str::to_string))
        .collect();
    assert_eq!(ids.len(), 4, "{tasks}");
    let (mut stored_in, mut stored_out) = (0, 0);
    for id in ids {
        let logs = keel(dir.path())
            .unwrap()
            .args(["--json", "logs", &id])
            .output()
            .unwrap();
        let logs: Value = serde_json::from_slice(&logs.stdout).unwrap();
        let usage = logs["rows"]
            .as_array()
            .unwrap()
            .iter()
            .rev()
            .find(|r| r["kind"] == "usage")
            .unwrap_or_else(|| panic!("no usage row in {logs}"));
        let counts: Value = serde_json::from_str(usage["detail"].as_str().unwrap()).unwrap();
        stored_in += counts["input_tokens"].as_u64().unwrap();
        stored_out += counts["output_tokens"].as_u64().unwrap();
        let summary = usage["summary"].as_str().unwrap();
        assert!(summary.starts_with("usage: "), "{summary}");
    }
    assert_eq!((stored_in, stored_out), (input, output), "{out}");
}

#[test]
fn the_json_summary_carries_the_usage_totals() {
    let (_dir, out, _) = run_keel("warn", &["--json"]);
    let summary: Value = serde_json::from_str(out.trim())
        .unwrap_or_else(|e| panic!("the summary is not one JSON object ({e}): {out}"));
    let usage = &summary["usage"];
    assert!(usage["input_tokens"].as_u64().unwrap() > 0, "{summary}");
    assert!(usage["output_tokens"].as_u64().unwrap() > 0, "{summary}");
    assert!(usage["spent_micros"].as_u64().unwrap() > 0, "{summary}");
    assert_eq!(usage["attempts"], 4, "{summary}");
}

#[test]
fn a_bad_log_format_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = keel(dir.path())
        .unwrap()
        .args(["--log-format", "yaml", "run", "survey"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("yaml") && err.contains("json"), "{err}");
    // Nothing ran: no home was created.
    assert!(!dir.path().join(".keel").exists());
}
