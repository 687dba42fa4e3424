//! `keel serve` has its home's store alone (one fsync a commit): no other process opens the file
//! while it runs, so the read commands on that home go through it and print what they print
//! locally; once it is killed, the same reads work on the file again. A store held with no server
//! that answers is a clear error naming the holder, never redb's lock message, after a few seconds
//! of retries (a read started while a server starts or stops answers once the store is free);
//! `keel serve` started beside a read waits for it. Real processes, 127.0.0.1.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use std::path::Path;
use std::time::Duration;

use keel_store::{
    Durability, Escalation, EscalationId, EscalationResolution, EscalationTrigger, EscalationWait,
    OpenError, RunId, Store, StoreConfig, TaskId,
};
use keel_tests::serve::{Server, quiet_survey, survey_files};
use keel_tests::{Reaped, keel, keel_json_list, run_to_end};

/// How long one command may take (a cold binary on a loaded machine).
const WAIT: Duration = Duration::from_secs(180);
/// A task id no store holds.
const UNKNOWN_TASK: &str = "01ZZZZZZZZZZZZZZZZZZZZZZZZ";

/// `keel ARGS` in `dir` without `--server`: (exit code, stdout, stderr).
fn local(dir: &Path, args: &[&str]) -> (i32, String, String) {
    run_to_end(keel(dir).unwrap().args(args), WAIT).unwrap()
}

/// The reads of the brief, on `run` and its first `task`, the escalations of `escalated` (a run
/// with some, `run` has none), empty pages, and one of a task no store holds (last).
fn reads<'a>(run: &'a str, task: &'a str, escalated: &'a str) -> Vec<Vec<&'a str>> {
    vec![
        vec!["runs"],
        vec!["--json", "runs"],
        vec!["tree"],
        vec!["tree", run],
        vec!["--json", "tree", run],
        vec!["tasks"],
        vec!["tasks", "--run", run],
        vec!["show", task],
        vec!["--json", "show", task],
        vec!["logs", task],
        vec!["status"],
        vec!["--json", "status", run],
        vec!["audit", run],
        vec!["escalations"],
        vec!["escalations", "--all"],
        vec!["escalations", "--all", "--limit", "1"],
        vec!["escalations", escalated],
        vec!["escalations", run],
        vec!["--json", "escalations", "--all"],
        vec!["runs", "--limit", "0"],
        vec!["logs", task, "--tail", "0"],
        vec!["context", task],
        vec!["show", UNKNOWN_TASK],
    ]
}

/// Three escalations on `run` of the store at `path` (open on `task` with options; answered,
/// with an amount and no task; expired), written as a runtime writes them.
fn escalate(path: &Path, run: RunId, task: TaskId) {
    let store = Store::open(path).unwrap();
    let raised = |id: u128, trigger, resolution| Escalation {
        id: EscalationId(0x0190_0000_0000_0000_0000_0000_0000_0100 + id),
        ts_ms: 1_700_000_000_000 + u64::try_from(id).unwrap(),
        task_id: None,
        trigger,
        account: "acct-1".into(),
        asked: format!("question {id}?"),
        attempted: format!("tried {id}"),
        diagnosis: format!("why {id}"),
        amount_micros: None,
        recommended_action: format!("do {id}"),
        options: Vec::new(),
        waiting: EscalationWait::Nothing,
        resolution,
    };
    let open = Escalation {
        task_id: Some(task),
        options: vec!["json".into(), "toml".into()],
        waiting: EscalationWait::Task,
        ..raised(1, EscalationTrigger::HumanRequested, None)
    };
    let answered = Escalation {
        amount_micros: Some(2_500_000),
        ..raised(
            2,
            EscalationTrigger::PolicyGap,
            Some(EscalationResolution::Answered {
                ts_ms: 1_700_000_000_100,
                text: "allow".into(),
            }),
        )
    };
    let expired = raised(
        3,
        EscalationTrigger::NoProgress,
        Some(EscalationResolution::Expired {
            ts_ms: 1_700_000_000_200,
        }),
    );
    let scope = store.run(run);
    for e in [open, answered, expired] {
        store
            .commit_one(
                scope.stage_append_escalation(e).unwrap(),
                Durability::Immediate,
            )
            .unwrap();
    }
}

#[test]
fn a_served_home_is_read_through_its_server_and_on_the_file_once_the_server_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    survey_files(dir.path());
    let home = dir.path();
    let store_path = home.join(".keel/keel.redb");
    let summary = quiet_survey(keel(home).unwrap(), home);
    assert!(summary.contains("failures: none"), "{summary}");
    let first = keel_json_list(home, &["runs"], "runs", WAIT).unwrap()[0]["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let first_task =
        keel_json_list(home, &["tasks", "--run", &first], "tasks", WAIT).unwrap()[0]["id"]
            .as_str()
            .unwrap()
            .parse()
            .unwrap();
    escalate(&store_path, first.parse().unwrap(), first_task);

    let server = Server::start(home);
    // The server has the file alone: a read-only open from another process is refused.
    match Store::open_read_only(&store_path, StoreConfig::default()) {
        Err(OpenError::Locked) => {}
        Err(e) => panic!("a read-only open beside `keel serve` failed otherwise: {e}"),
        Ok(_) => panic!(
            "a read-only open succeeded beside `keel serve`: it does not hold the store alone"
        ),
    }
    // A run the server hosts, submitted from the home (it goes to the server).
    let again = quiet_survey(keel(home).unwrap(), home);
    assert_eq!(again, summary);

    let runs = keel_json_list(home, &["runs"], "runs", WAIT).unwrap();
    assert_eq!(runs.len(), 2, "{runs:?}");
    let run = runs[0]["id"].as_str().unwrap().to_owned();
    let tasks = keel_json_list(home, &["tasks", "--run", &run], "tasks", WAIT).unwrap();
    let task = tasks
        .iter()
        .find(|t| t["kind"] != "Root")
        .unwrap_or(&tasks[0])["id"]
        .as_str()
        .unwrap()
        .to_owned();

    // Each read without `--server` prints what it prints through `--server`, with its exit code.
    assert_ne!(run, first);
    let reads = reads(&run, &task, &first);
    let mut served = Vec::new();
    for args in &reads {
        let (code, out, err) = local(home, args);
        let there = run_to_end(server.keel(home).args(args), WAIT).unwrap();
        assert_eq!((code, &out), (there.0, &there.1), "keel {args:?}: {err}");
        assert!(!err.contains("held by"), "keel {args:?}: {err}");
        served.push((code, out));
    }
    // The escalations are printed in full (what was tried, the amount, the options, how each
    // ended), as the local command prints them.
    let printed = |args: &[&str]| &served[reads.iter().position(|r| r == args).unwrap()].1;
    let all = printed(&["escalations", "--all"]);
    for line in [
        "  tried:       tried 1",
        "  options:     json | toml",
        "  amount:      2500000 micro-dollars",
        &format!("  run {first}  task {first_task}"),
    ] {
        assert!(all.contains(line), "{line:?} in {all}");
    }
    assert!(all.contains(&format!("  run {first}\n")), "{all}");
    assert_eq!(all.matches("escalation ").count(), 3, "{all}");
    assert!(
        printed(&["escalations", "--all", "--limit", "1"])
            .contains("(more escalations: raise --limit)")
    );
    assert_eq!(
        printed(&["escalations", &run]).trim(),
        format!("run {run} has no open escalations")
    );
    assert_eq!(printed(&["escalations"]).matches("escalation ").count(), 1);
    assert!(
        served[..served.len() - 1]
            .iter()
            .all(|(code, _)| *code == 0),
        "{served:?}"
    );
    assert_eq!(served.last().unwrap().0, 3, "an unknown task is exit 3");
    assert!(served[0].1.contains(&run), "{}", served[0].1);

    // The home's server is asked with the home's token, not an environment's token meant for
    // another server; a token it refuses is an error that says why the server was asked.
    let (code, out, err) = run_to_end(
        keel(home)
            .unwrap()
            .env("KEEL_API_TOKEN", "a-token-for-another-server-0123456789")
            .arg("runs"),
        WAIT,
    )
    .unwrap();
    assert_eq!((code, &out), (0, &served[0].1), "{err}");
    let wrong = dir.path().join("wrong-token");
    std::fs::write(&wrong, "not-this-servers-token-0123456789\n").unwrap();
    std::fs::set_permissions(&wrong, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let (code, out, err) = run_to_end(
        keel(home)
            .unwrap()
            .arg("--token-file")
            .arg(&wrong)
            .arg("runs"),
        WAIT,
    )
    .unwrap();
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains(&format!("held by the keel server at {}", server.url)),
        "{err}"
    );

    // A command that needs the file itself says which server holds it and what to do.
    let (code, _, err) = local(home, &["store", "compact"]);
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains(&format!("keel server at {}", server.url)),
        "{err}"
    );
    assert!(
        !err.to_lowercase().contains("database already open"),
        "{err}"
    );

    // Killed, the server leaves its `server.json` behind but not its lock: the same reads work on
    // the file and print the same.
    server.process.kill();
    assert!(home.join(".keel/server.json").is_file());
    for (args, (code, out)) in reads.iter().zip(&served) {
        let (here, text, err) = local(home, args);
        assert_eq!(
            (here, &text),
            (*code, out),
            "keel {args:?} after the kill: {err}"
        );
    }
    Store::open_read_only(&store_path, StoreConfig::default()).unwrap();
}

#[test]
fn a_held_store_with_no_server_that_answers_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    survey_files(dir.path());
    let home = dir.path();
    quiet_survey(keel(home).unwrap(), home);
    let store_path = home.join(".keel/keel.redb");

    // `keel serve` started while another process reads the store waits for that read to end
    // (it needs the file alone), and says so, rather than failing.
    let reading = Store::open_read_only(&store_path, StoreConfig::default()).unwrap();
    let mut serve = keel(home).unwrap();
    serve.args(["serve", "--listen", "127.0.0.1:0"]);
    let mut serve = Reaped::spawn(serve).unwrap();
    serve.stderr_line_containing("waiting up to", WAIT).unwrap();
    drop(reading);
    let line = serve.line_containing("listening on", WAIT).unwrap();
    let url = line
        .split("listening on ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap()
        .to_owned();
    // The server wrote its token file; it goes away.
    serve.kill();

    // This process holds the store alone, as a `keel serve` does.
    let held = Store::open(&store_path).unwrap();
    for args in [
        vec!["runs"],
        vec!["status"],
        vec!["store", "backup", "copy.redb"],
    ] {
        let (code, out, err) = local(home, &args);
        assert_eq!(code, 1, "keel {args:?}: {out}{err}");
        assert!(err.contains("held by another keel process"), "{err}");
        assert!(err.contains("--server"), "{err}");
        assert!(!err.to_lowercase().contains("database"), "{err}");
    }

    // A home that announces a live process whose server does not answer: the read says which
    // server holds the store and that it did not answer.
    let announced = serde_json::json!({"url": url, "pid": std::process::id()});
    std::fs::write(home.join(".keel/server.json"), announced.to_string()).unwrap();
    let (code, out, err) = local(home, &["runs"]);
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        err.contains(&format!("held by the keel server at {url}")),
        "{err}"
    );
    assert!(err.contains("cannot reach the keel server"), "{err}");

    // A store held with no server announced (a server starting, or stopping) is tried again for a
    // few seconds: a read started while it is held answers once it is released.
    std::fs::remove_file(home.join(".keel/server.json")).unwrap();
    let mut runs = keel(home).unwrap();
    runs.arg("runs");
    let runs = Reaped::spawn(runs).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    drop(held);
    let (status, out, err) = runs.wait_output(WAIT).unwrap();
    assert_eq!(status.code(), Some(0), "{out}{err}");
    assert!(out.contains("survey this folder"), "{out}");

    // Released, the file is read here again, whatever `server.json` says.
    let (code, out, err) = local(home, &["runs"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("survey this folder"), "{out}");
}
