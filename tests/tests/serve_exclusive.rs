//! `keel serve` has its home's store alone (one fsync a commit): no other process opens the file
//! while it runs, so the read commands on that home go through it and print what they print
//! locally; once it is killed, the same reads work on the file again. A store held with no server
//! that answers is a clear error naming the holder, never redb's lock message. Real processes,
//! 127.0.0.1.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use std::path::Path;
use std::time::Duration;

use keel_store::{OpenError, Store, StoreConfig};
use keel_tests::serve::{Server, quiet_survey, survey_files};
use keel_tests::{keel, keel_json_list, run_to_end};

/// How long one command may take (a cold binary on a loaded machine).
const WAIT: Duration = Duration::from_secs(180);
/// A task id no store holds.
const UNKNOWN_TASK: &str = "01ZZZZZZZZZZZZZZZZZZZZZZZZ";

/// `keel ARGS` in `dir` without `--server`: (exit code, stdout, stderr).
fn local(dir: &Path, args: &[&str]) -> (i32, String, String) {
    run_to_end(keel(dir).unwrap().args(args), WAIT).unwrap()
}

/// The reads of the brief, on `run` and its first `task`, and one of a task no store holds.
fn reads<'a>(run: &'a str, task: &'a str) -> Vec<Vec<&'a str>> {
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
        vec!["escalations", "--all"],
        vec!["context", task],
        vec!["show", UNKNOWN_TASK],
    ]
}

#[test]
fn a_served_home_is_read_through_its_server_and_on_the_file_once_the_server_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    survey_files(dir.path());
    let home = dir.path();
    let store_path = home.join(".keel/keel.redb");
    let summary = quiet_survey(keel(home).unwrap(), home);
    assert!(summary.contains("failures: none"), "{summary}");

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
    let reads = reads(&run, &task);
    let mut served = Vec::new();
    for args in &reads {
        let (code, out, err) = local(home, args);
        let there = run_to_end(server.keel(home).args(args), WAIT).unwrap();
        assert_eq!((code, &out), (there.0, &there.1), "keel {args:?}: {err}");
        assert!(!err.contains("held by"), "keel {args:?}: {err}");
        served.push((code, out));
    }
    assert!(
        served[..served.len() - 1]
            .iter()
            .all(|(code, _)| *code == 0),
        "{served:?}"
    );
    assert_eq!(served.last().unwrap().0, 3, "an unknown task is exit 3");
    assert!(served[0].1.contains(&run), "{}", served[0].1);

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
    // A server that wrote its token file and went away.
    let server = Server::start(home);
    let url = server.url.clone();
    server.process.kill();

    // This process holds the store alone, as a `keel serve` does.
    let held = Store::open(home.join(".keel/keel.redb")).unwrap();
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
    drop(held);

    // Released, the file is read here again, whatever `server.json` says.
    let (code, out, err) = local(home, &["runs"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("survey this folder"), "{out}");
}
