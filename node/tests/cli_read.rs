//! The read commands against a real store file: `keel init`, `tasks`, `show`, `logs`, `tree`, `runs`,
//! their `--json` output and their exit codes, run as a real process.

// Test helpers panic on purpose: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::{Command, Output};

use keel_store::{
    Attachment, AttachmentBody, Budget, Durability, LogKind, ObservedSession, Run, RunId,
    RunStatus, SessionLogRow, Store, Task, TaskId, TaskKind, TaskStatus, WriteBatch,
};

fn keel(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("KEEL_HOME")
        .output()
        .expect("keel runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn task(run: RunId, id: u128, parent: Option<u128>, depth: u8, brief: &str) -> Task {
    Task {
        id: TaskId(id),
        run_id: run,
        parent: parent.map(TaskId),
        depth,
        kind: if parent.is_some() {
            TaskKind::Subtask
        } else {
            TaskKind::Root
        },
        brief: brief.into(),
        goal: format!("goal of {brief}"),
        quality_criteria: vec!["cites sources".into()],
        output_schema: None,
        assignee: Some("researcher".into()),
        model: Some("claude-sonnet-4-5".into()),
        observed: Some(ObservedSession {
            harness: "scripted".into(),
            account: "default".into(),
            native_session_id: format!("native-{id}"),
        }),
        status: TaskStatus::Complete,
        attempt: 1,
        idempotency_key: None,
        outcome: Some(format!("done: {brief}")),
        attachments: vec![Attachment {
            name: "notes.md".into(),
            body: AttachmentBody::Inline("short".into()),
        }],
        progress_notes: vec![],
        created_ms: 1_700_000_000_000,
        updated_ms: 1_700_000_000_500,
    }
}

/// Writes one run with a root, two children and a grandchild, plus three log rows on the root.
fn populate(store_path: &Path) -> (RunId, TaskId) {
    let store = Store::open(store_path).unwrap();
    let run_id = RunId(0x0190_0000_0000_0000_0000_0000_0000_0001);
    let scope = store.run(run_id);
    let mut batch = WriteBatch::new();
    batch.push(
        scope
            .stage_create_run(Run {
                id: run_id,
                brief: "survey the parser crates".into(),
                plan: None,
                status: RunStatus::Completed,
                budget: Budget::default(),
                created_ms: 1_700_000_000_000,
                updated_ms: 1_700_000_001_000,
                config_snapshot: String::new(),
                outcome: Some("synthesis written".into()),
            })
            .unwrap(),
    );
    let root = 0x0190_0000_0000_0000_0000_0000_0000_0010u128;
    batch.push(
        scope
            .stage_create_task(task(run_id, root, None, 0, "root brief"))
            .unwrap(),
    );
    batch.push(
        scope
            .stage_create_task(task(run_id, root + 1, Some(root), 1, "child one"))
            .unwrap(),
    );
    batch.push(
        scope
            .stage_create_task(task(run_id, root + 2, Some(root), 1, "child two"))
            .unwrap(),
    );
    batch.push(
        scope
            .stage_create_task(task(run_id, root + 3, Some(root + 1), 2, "grandchild"))
            .unwrap(),
    );
    for (i, (kind, summary)) in [
        (LogKind::Lifecycle, "session started on scripted"),
        (LogKind::ToolUse, "bash: ls -la"),
        (LogKind::Text, "found three crates"),
    ]
    .into_iter()
    .enumerate()
    {
        batch.push(
            scope
                .stage_append_log(
                    TaskId(root),
                    SessionLogRow {
                        ts_ms: 1_700_000_000_000 + i as u64,
                        kind,
                        summary: summary.into(),
                        detail: String::new(),
                        redactions: Vec::new(),
                    },
                )
                .unwrap(),
        );
    }
    store.commit_group(batch, Durability::Immediate).unwrap();
    (run_id, TaskId(root))
}

#[test]
fn read_commands_on_a_missing_home_exit_4_and_say_how_to_fix_it() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("nowhere");
    for args in [
        &["tasks"][..],
        &["runs"],
        &["tree", "01ARZ3NDEKTSV4RRFFQ69G5FAV"],
    ] {
        let out = keel(&home, args);
        assert_eq!(out.status.code(), Some(4), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("keel init"));
    }
    assert!(!home.exists(), "a read command must not create a home");
}

#[test]
fn init_creates_store_and_config_and_is_idempotent() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join(".keel");
    let out = keel(&home, &["init", "--json"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["created_store"], true);
    assert_eq!(v["created_config"], true);
    assert!(home.join("keel.redb").is_file());
    let config = std::fs::read_to_string(home.join("keel.toml")).unwrap();
    assert!(config.contains("[supervisor]"));

    std::fs::write(home.join("keel.toml"), "# mine\n").unwrap();
    let again = keel(&home, &["init", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(v["created_store"], false);
    assert_eq!(v["created_config"], false);
    assert_eq!(
        std::fs::read_to_string(home.join("keel.toml")).unwrap(),
        "# mine\n",
        "init never overwrites a user's configuration"
    );
    let empty = keel(&home, &["tasks"]);
    assert_eq!(empty.status.code(), Some(0));
    assert_eq!(stdout(&empty).trim(), "no tasks yet");
}

#[test]
fn tasks_show_logs_and_tree_explain_a_populated_store() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join(".keel");
    assert_eq!(keel(&home, &["init"]).status.code(), Some(0));
    let (run, root) = populate(&home.join("keel.redb"));

    let tasks = keel(&home, &["tasks", "--json"]);
    assert_eq!(tasks.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&tasks.stdout).unwrap();
    let items = v["tasks"].as_array().unwrap();
    assert_eq!(items.len(), 4);
    assert_eq!(items[0]["id"], root.to_string());
    assert_eq!(items[0]["run"], run.to_string());
    assert_eq!(items[1]["parent"], root.to_string());

    let table = stdout(&keel(&home, &["tasks"]));
    assert!(
        table.contains(&root.to_string()) && table.contains("child two"),
        "{table}"
    );

    let show = stdout(&keel(&home, &["show", &root.to_string()]));
    assert!(show.contains("root brief"), "{show}");
    assert!(show.contains("native-"), "{show}");
    assert!(show.contains("never resumed"), "{show}");
    assert_eq!(show.matches("child       ").count(), 2, "{show}");

    let logs = keel(&home, &["logs", &root.to_string(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&logs.stdout).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let seqs: Vec<u64> = rows.iter().map(|r| r["seq"].as_u64().unwrap()).collect();
    assert_eq!(seqs, vec![1, 2, 3]);
    assert_eq!(rows[1]["kind"], "tool_use");
    let tail = keel(&home, &["logs", &root.to_string(), "--tail", "1", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&tail.stdout).unwrap();
    assert_eq!(v["rows"][0]["summary"], "found three crates");

    let tree = stdout(&keel(&home, &["tree", &run.to_string()]));
    let lines: Vec<&str> = tree.lines().collect();
    assert_eq!(lines.len(), 5, "{tree}");
    assert!(
        lines[1].starts_with("  ") && lines[1].contains("root brief"),
        "{tree}"
    );
    assert!(
        lines[2].starts_with("    ") && lines[2].contains("child one"),
        "{tree}"
    );
    assert!(
        lines[3].starts_with("      ") && lines[3].contains("grandchild"),
        "{tree}"
    );
    assert!(
        lines[4].starts_with("    ") && lines[4].contains("child two"),
        "{tree}"
    );

    let tree_json = keel(&home, &["tree", &run.to_string(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&tree_json.stdout).unwrap();
    let levels: Vec<u64> = v["tasks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["level"].as_u64().unwrap())
        .collect();
    assert_eq!(levels, vec![0, 1, 2, 1]);

    let runs = keel(&home, &["runs", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&runs.stdout).unwrap();
    assert_eq!(v["runs"][0]["status"], "Completed");
}

/// Writes `n` runs with ids 1..=n (so run n is the newest), each with its number in its brief.
fn runs_numbered(store_path: &Path, n: u128) {
    let store = Store::open(store_path).unwrap();
    let mut batch = WriteBatch::new();
    for r in 1..=n {
        let run = RunId(r);
        batch.push(
            store
                .run(run)
                .stage_create_run(Run {
                    id: run,
                    brief: format!("run number {r}"),
                    plan: None,
                    status: RunStatus::Completed,
                    budget: Budget::default(),
                    created_ms: 1_700_000_000_000 + r as u64,
                    updated_ms: 1_700_000_000_000 + r as u64,
                    config_snapshot: String::new(),
                    outcome: None,
                })
                .unwrap(),
        );
    }
    store.commit_group(batch, Durability::Immediate).unwrap();
}

#[test]
fn runs_are_listed_newest_first_a_page_at_a_time_saying_what_is_not_shown() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join(".keel");
    assert_eq!(keel(&home, &["init"]).status.code(), Some(0));
    runs_numbered(&home.join("keel.redb"), 250);
    let briefs = |v: &serde_json::Value| -> Vec<String> {
        v["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["brief"].as_str().unwrap().to_string())
            .collect()
    };

    // The first page: the newest runs, and how many older ones it leaves out.
    let out = keel(&home, &["runs", "--limit", "3", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        briefs(&v),
        ["run number 250", "run number 249", "run number 248"]
    );
    assert_eq!(v["older"], 247, "{v}");
    assert_eq!(v["more"], true);
    let last = RunId(248).to_string();
    assert_eq!(
        v["next"].as_str(),
        Some(format!("keel runs --before {last} --limit 3").as_str())
    );

    // The next page starts before the last run shown.
    let out = keel(
        &home,
        &["runs", "--limit", "3", "--before", &last, "--json"],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        briefs(&v),
        ["run number 247", "run number 246", "run number 245"]
    );
    assert_eq!(v["older"], 244);

    // The last page leaves nothing out.
    let out = keel(
        &home,
        &[
            "runs",
            "--limit",
            "3",
            "--before",
            &RunId(3).to_string(),
            "--json",
        ],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(briefs(&v), ["run number 2", "run number 1"]);
    assert_eq!(v["older"], 0);
    assert!(v["next"].is_null());

    // For people: the newest first, then the count of what is not shown and how to see it.
    let text = stdout(&keel(&home, &["runs"]));
    let newest = text.find("run number 250").unwrap();
    let older = text.find("run number 249").unwrap();
    assert!(newest < older, "{text}");
    assert!(
        !text.contains("run number 230"),
        "the default page is 20 runs: {text}"
    );
    assert!(
        text.contains(&format!(
            "230 older runs not shown: keel runs --before {} --limit 20",
            RunId(231)
        )),
        "{text}"
    );
}

#[test]
fn unknown_ids_exit_3_and_malformed_ids_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join(".keel");
    assert_eq!(keel(&home, &["init"]).status.code(), Some(0));
    populate(&home.join("keel.redb"));
    let missing = "01ARZ3NDEKTSV4RRFFQ69G5FAV";
    for args in [
        &["show", missing][..],
        &["logs", missing],
        &["tree", missing],
    ] {
        let out = keel(&home, args);
        assert_eq!(out.status.code(), Some(3), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
    }
    let bad = keel(&home, &["show", "not-an-id"]);
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn a_file_that_is_not_a_store_is_a_clear_error_and_is_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join(".keel");
    std::fs::create_dir_all(&home).unwrap();
    let junk = vec![0x5au8; 8192];
    std::fs::write(home.join("keel.redb"), &junk).unwrap();
    let out = keel(&home, &["tasks"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot open the store"));
    assert_eq!(std::fs::read(home.join("keel.redb")).unwrap(), junk);
}

#[test]
fn a_bad_keel_toml_is_refused_with_file_key_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join(".keel");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(
        home.join("keel.toml"),
        "[supervisor]\nmax_depth = 2\nmax_concurent_specialists = 4\n",
    )
    .unwrap();
    for args in [&["init"][..], &["config"], &["tasks"]] {
        let out = keel(&home, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("keel.toml:3:"), "{err}");
        assert!(err.contains("max_concurent_specialists"), "{err}");
    }
    assert!(
        !home.join("keel.redb").exists(),
        "nothing is created from a bad config"
    );
}

#[test]
fn the_store_path_of_keel_toml_is_honoured() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join(".keel");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(home.join("keel.toml"), "[store]\npath = \"other.redb\"\n").unwrap();
    assert_eq!(keel(&home, &["init"]).status.code(), Some(0));
    assert!(home.join("other.redb").is_file());
    assert!(!home.join("keel.redb").exists());
    populate(&home.join("other.redb"));
    let v: serde_json::Value =
        serde_json::from_slice(&keel(&home, &["tasks", "--json"]).stdout).unwrap();
    assert_eq!(v["tasks"].as_array().unwrap().len(), 4);
}

#[test]
fn read_commands_work_while_a_node_holds_the_store_open_for_readers() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join(".keel");
    assert_eq!(keel(&home, &["init"]).status.code(), Some(0));
    let (run, _) = populate(&home.join("keel.redb"));
    let writer = keel_store::Store::open_with(
        home.join("keel.redb"),
        keel_store::StoreConfig {
            sharing: keel_store::Sharing::WithReaders,
            ..Default::default()
        },
    )
    .unwrap();
    let out = keel(&home, &["tree", &run.to_string(), "--json"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["tasks"].as_array().unwrap().len(), 4);
    drop(writer);
}

#[test]
fn context_prints_the_preamble_a_new_session_gets_with_secrets_removed() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join(".keel");
    assert_eq!(keel(&home, &["init"]).status.code(), Some(0));
    let (_, root) = populate(&home.join("keel.redb"));
    let child = TaskId(root.0 + 1);

    // The child's standard preamble carries its parent inline; the parent's outcome mentions nothing
    // secret, so plant a key in the environment and in the child's own log to check both rules.
    let out = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(["--home"])
        .arg(&home)
        .args(["context", &child.to_string(), "--json"])
        .env("ANTHROPIC_API_KEY", "done: root brief")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let prompt = v["prompt"].as_str().unwrap();
    assert!(prompt.contains("root brief"), "{prompt}");
    assert!(
        !prompt.contains("done: root brief"),
        "a value registered as a credential must not appear: {prompt}"
    );
    assert!(prompt.contains("[REDACTED:registered-secret]"), "{prompt}");
    assert!(
        prompt.ends_with("child one"),
        "the brief follows the preamble: {prompt}"
    );
    assert!(v["prompt_chars"].as_u64().unwrap() <= 8_000 + "child one".len() as u64 + 2);

    let resume = keel(&home, &["context", &root.to_string(), "--resume"]);
    assert_eq!(resume.status.code(), Some(0));
    let text = stdout(&resume);
    assert!(text.contains("resume preamble"), "{text}");
    assert!(
        text.contains("root brief") && text.contains("bash: ls -la"),
        "{text}"
    );

    let missing = keel(&home, &["context", "01ARZ3NDEKTSV4RRFFQ69G5FAV"]);
    assert_eq!(missing.status.code(), Some(3));
}

/// Runs `keel` with its stdout a pipe whose reading end is already closed, as `keel ... | head -1`
/// leaves it once `head` has its line: every write keel makes fails with EPIPE.
fn keel_with_closed_stdout(home: &Path, args: &[&str]) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    Command::new(env!("CARGO_BIN_EXE_keel"))
        .arg("--home")
        .arg(home)
        .args(args)
        .env_remove("KEEL_HOME")
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .output()
        .expect("keel runs")
}

#[test]
fn a_closed_stdout_ends_a_read_command_quietly_with_its_own_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join(".keel");
    assert_eq!(keel(&home, &["init"]).status.code(), Some(0));
    let (run, root) = populate(&home.join("keel.redb"));
    let (run, root) = (run.to_string(), root.to_string());
    for args in [
        vec!["runs"],
        vec!["runs", "--json"],
        vec!["tasks"],
        vec!["status"],
        vec!["status", &run],
        vec!["status", &run, "--json"],
        vec!["tree", &run],
        vec!["show", &root],
        vec!["logs", &root],
        vec!["config"],
    ] {
        let out = keel_with_closed_stdout(&home, &args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "keel {args:?}: {err}");
        assert!(err.is_empty(), "keel {args:?} wrote to stderr: {err}");
    }
    // The exit code is still the command's own: a run that does not exist is 3.
    let missing = keel_with_closed_stdout(&home, &["status", "01M8RJ15G9E2NC6DPHK2J0X0KC"]);
    assert_eq!(missing.status.code(), Some(3));
}

#[test]
fn tree_and_status_without_a_run_id_show_the_latest_run() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join(".keel");
    assert_eq!(keel(&home, &["init"]).status.code(), Some(0));
    // A store without runs: nothing to show is "not found" (3), with what to do.
    for args in [["tree"], ["status"]] {
        let out = keel(&home, &args);
        assert_eq!(out.status.code(), Some(3), "keel {args:?}");
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("no runs in this store yet"),
            "{out:?}"
        );
    }
    let (older, _) = populate(&home.join("keel.redb"));
    // A newer run (a higher ULID), still running, with one task of its own.
    let latest = RunId(older.0 + 1);
    {
        let store = Store::open(home.join("keel.redb")).unwrap();
        let scope = store.run(latest);
        let mut batch = WriteBatch::new();
        batch.push(
            scope
                .stage_create_run(Run {
                    id: latest,
                    brief: "the newest run".into(),
                    plan: None,
                    status: RunStatus::Running,
                    budget: Budget::default(),
                    created_ms: 1_700_000_002_000,
                    updated_ms: 1_700_000_002_000,
                    config_snapshot: String::new(),
                    outcome: None,
                })
                .unwrap(),
        );
        batch.push(
            scope
                .stage_create_task(task(latest, 0x0290, None, 0, "newest root"))
                .unwrap(),
        );
        store.commit_group(batch, Durability::Immediate).unwrap();
    }
    let tree = keel(&home, &["tree", "--json"]);
    assert_eq!(tree.status.code(), Some(0), "{tree:?}");
    let v: serde_json::Value = serde_json::from_slice(&tree.stdout).unwrap();
    assert_eq!(v["run"]["id"], latest.to_string(), "{v}");
    let status = keel(&home, &["status", "--json"]);
    assert_eq!(status.status.code(), Some(0), "{status:?}");
    let v: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(v["run"], latest.to_string());
    assert_eq!(v["status"], "Running");
    assert_eq!(v["brief"], "the newest run");
    // Naming a run still shows that run.
    let named = keel(&home, &["status", &older.to_string(), "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&named.stdout).unwrap();
    assert_eq!(v["run"], older.to_string());
}

/// Writes a run with `status`, a root task and one child task per `(id, status, outcome)`.
fn run_with_tasks(
    store_path: &Path,
    run: u128,
    status: RunStatus,
    children: &[(u128, TaskStatus, Option<&str>)],
) -> RunId {
    let store = Store::open(store_path).unwrap();
    let run_id = RunId(run);
    let scope = store.run(run_id);
    let mut batch = WriteBatch::new();
    batch.push(
        scope
            .stage_create_run(Run {
                id: run_id,
                brief: format!("brief of run {run}"),
                plan: None,
                status,
                budget: Budget::default(),
                created_ms: 1_700_000_000_000,
                updated_ms: 1_700_000_001_000,
                config_snapshot: String::new(),
                outcome: None,
            })
            .unwrap(),
    );
    let root = run * 1_000;
    batch.push(
        scope
            .stage_create_task(task(run_id, root, None, 0, "root"))
            .unwrap(),
    );
    for (id, status, outcome) in children {
        let mut t = task(run_id, *id, Some(root), 1, "child");
        t.status = *status;
        t.outcome = outcome.map(str::to_owned);
        batch.push(scope.stage_create_task(t).unwrap());
    }
    store.commit_group(batch, Durability::Immediate).unwrap();
    run_id
}

/// A failure as the coordinator stores it on a task row.
const STORED_FAILURE: &str = r#"{"Failed":{"kind":{"harness":"system"},"attempted":"start a claude-code session","partial":[],"retryable":false,"retry_after_ms":null,"detail":"environment variable ANTHROPIC_API_KEY is not set"}}"#;

#[test]
fn status_shows_paused_and_escalated_runs_with_the_command_that_continues_each() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join(".keel");
    assert_eq!(keel(&home, &["init"]).status.code(), Some(0));
    let db = home.join("keel.redb");
    let paused = run_with_tasks(
        &db,
        1,
        RunStatus::Paused,
        &[(1_001, TaskStatus::Paused, None)],
    );
    let escalated = run_with_tasks(
        &db,
        2,
        RunStatus::Running,
        &[(2_001, TaskStatus::Escalated, Some(STORED_FAILURE))],
    );
    let latest = run_with_tasks(
        &db,
        3,
        RunStatus::Completed,
        &[(3_001, TaskStatus::Complete, None)],
    );

    let text = stdout(&keel(&home, &["status"]));
    assert!(
        text.starts_with(&format!("run {latest}: Completed")),
        "{text}"
    );
    assert!(text.contains("other open runs, newest first:"), "{text}");
    assert!(
        text.contains(&format!("continue with `keel resume {paused}`")),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "1 escalated task a human must look at: `keel show {}`",
            TaskId(2_001)
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!("stop with `keel cancel {escalated}`")),
        "{text}"
    );
    // Newest first: the escalated run (2) before the paused one (1).
    assert!(
        text.find(&escalated.to_string()) < text.find(&paused.to_string()),
        "{text}"
    );

    let v: serde_json::Value =
        serde_json::from_slice(&keel(&home, &["status", "--json"]).stdout).unwrap();
    let others = v["other_open_runs"].as_array().unwrap();
    assert_eq!(others.len(), 2, "{v}");
    assert_eq!(others[1]["run"], paused.to_string());
    assert_eq!(
        others[1]["next"],
        format!("continue with `keel resume {paused}`")
    );
    assert_eq!(others[0]["escalated_tasks"][0], TaskId(2_001).to_string());

    // A paused run named on its own says how to continue it.
    let text = stdout(&keel(&home, &["status", &paused.to_string()]));
    assert!(
        text.contains(&format!("continue with `keel resume {paused}`")),
        "{text}"
    );
}

#[test]
fn show_prints_a_failure_as_a_sentence_and_json_keeps_its_structure() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join(".keel");
    assert_eq!(keel(&home, &["init"]).status.code(), Some(0));
    run_with_tasks(
        &home.join("keel.redb"),
        4,
        RunStatus::Failed,
        &[(4_001, TaskStatus::Failed, Some(STORED_FAILURE))],
    );
    let task = TaskId(4_001).to_string();
    let text = stdout(&keel(&home, &["show", &task]));
    assert!(
        text.contains(
            "the harness could not run: environment variable ANTHROPIC_API_KEY is not set"
        ),
        "{text}"
    );
    assert!(
        text.contains("attempted: start a claude-code session"),
        "{text}"
    );
    assert!(
        !text.contains("{\"Failed\""),
        "raw JSON in the text: {text}"
    );
    let v: serde_json::Value =
        serde_json::from_slice(&keel(&home, &["show", &task, "--json"]).stdout).unwrap();
    let stored: serde_json::Value = serde_json::from_str(v["outcome"].as_str().unwrap()).unwrap();
    assert_eq!(stored["Failed"]["kind"]["harness"], "system", "{v}");
}
