//! Hard kills and graceful stops of a real `keel run` process on a 16-specialist fan-out, against a
//! scripted model server in its own process whose request recordings count every session started.
//!
//! - SIGKILL after the first report, halfway, and just before synthesis: `keel resume` finishes with
//!   the same reports as an uninterrupted run, and no specialist whose result was acknowledged (its
//!   task durable as complete at the kill) runs a second session.
//! - SIGTERM: the run pauses (open tasks marked paused), and `keel resume` continues them as new
//!   attempts whose prompts carry keel's resume preamble.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use keel_actors::runtime::scripted::fan_out_plan;
use keel_store::{RunId, RunStatus, TaskStatus};
use keel_tests::fan_out::{claims, count, expected_claims, openings_of, part, reader, subtasks};
use keel_tests::{Reaped, keel, recorded_bodies, session_openings, wait_for};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

const STEPS: usize = 16;
const RUN_WAIT: Duration = Duration::from_secs(120);

struct Scenario {
    _dir: tempfile::TempDir,
    work: PathBuf,
    record: PathBuf,
    server: Reaped,
    url: String,
}

/// A working folder with a keel home (8 specialists at once), a plan file, and a model server.
fn scenario() -> Scenario {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    let record = dir.path().join("requests");
    std::fs::create_dir_all(&work).unwrap();
    let init = keel(&work).unwrap().arg("init").output().unwrap();
    assert!(init.status.success(), "{init:?}");
    std::fs::write(
        work.join(".keel/keel.toml"),
        "[supervisor]\nmax_concurrent_specialists = 8\n",
    )
    .unwrap();
    // The last part is slow, so there is a moment when 15 reports are durable and synthesis waits.
    let plan = fan_out_plan(STEPS, |i| {
        let secs = if i == STEPS - 1 { "1.5" } else { "0.2" };
        format!("sleep {secs}; echo part {i} done")
    })
    .unwrap();
    std::fs::write(
        work.join("plan.json"),
        serde_json::to_string(&plan).unwrap(),
    )
    .unwrap();
    let (server, url) = keel_tests::model_server(&work, &record).unwrap();
    Scenario {
        _dir: dir,
        work,
        record,
        server,
        url,
    }
}

fn start_run(s: &Scenario) -> (Reaped, RunId) {
    let mut cmd = keel(&s.work).unwrap();
    cmd.args([
        "run",
        "fan out",
        "--plan",
        "plan.json",
        "--model-server",
        &s.url,
    ]);
    let mut run = Reaped::spawn(cmd).unwrap();
    let line = run
        .line_containing("started in", Duration::from_secs(60))
        .unwrap();
    let id: RunId = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    (run, id)
}

fn resume(s: &Scenario, run: RunId) -> String {
    let mut cmd = keel(&s.work).unwrap();
    cmd.args(["resume", &run.to_string(), "--model-server", &s.url]);
    let (status, out, err) = Reaped::spawn(cmd).unwrap().wait_output(RUN_WAIT).unwrap();
    assert!(status.success(), "resume failed: {status}\n{out}\n{err}");
    out
}

/// Kill the run once `complete_min` reports are durable; resume; check reports and executions.
fn kill_and_resume(complete_min: usize) {
    let s = scenario();
    let (proc_, run) = start_run(&s);
    let store = reader(&s.work);
    wait_for(RUN_WAIT, "reports before the kill", || {
        (count(&subtasks(&store, run), TaskStatus::Complete) >= complete_min).then_some(())
    })
    .unwrap();
    proc_.kill();
    // The reader opened before the kill keeps reading the last commit (a fresh read-only open of a
    // store its writer left mid-flight is refused until a writer repairs it).
    let at_kill = subtasks(&store, run);
    let acked: BTreeSet<usize> = at_kill
        .iter()
        .filter(|t| t.status == TaskStatus::Complete)
        .map(part)
        .collect();
    assert!(acked.len() >= complete_min);
    let run_row = store.catalog().run(run).unwrap();
    assert!(
        !run_row.status.is_terminal(),
        "the kill came after the end: {:?}",
        run_row.status
    );
    // The open-runs index, written in the same commits as the run's row, lists it after the kill.
    let open = |store: &keel_store::Store| -> Vec<RunId> {
        let listing = store.catalog().open_runs(10).unwrap();
        listing.items.iter().map(|r| r.id).collect()
    };
    assert_eq!(open(&store), vec![run]);
    drop(store);

    let out = resume(&s, run);
    assert!(out.contains(": Completed"), "{out}");
    let store = reader(&s.work);
    assert!(
        open(&store).is_empty(),
        "the ended run is still indexed as open"
    );
    assert_eq!(claims(&store, run), expected_claims(STEPS));
    let openings = session_openings(&recorded_bodies(&s.record));
    for i in 0..STEPS {
        let n = openings_of(&openings, i);
        if acked.contains(&i) {
            assert_eq!(n, 1, "acknowledged part {i} ran {n} sessions");
        } else {
            assert!(n >= 1, "part {i} never ran");
        }
    }
    drop(s.server);
}

#[test]
fn an_uninterrupted_run_gives_the_reference_reports() {
    let s = scenario();
    let (proc_, run) = start_run(&s);
    let (status, out, err) = proc_.wait_output(RUN_WAIT).unwrap();
    assert!(status.success(), "{status}\n{out}\n{err}");
    let store = reader(&s.work);
    assert_eq!(
        store.catalog().run(run).unwrap().status,
        RunStatus::Completed
    );
    assert_eq!(claims(&store, run), expected_claims(STEPS));
    let openings = session_openings(&recorded_bodies(&s.record));
    assert_eq!(openings.len(), STEPS);
}

#[test]
fn sigkill_after_the_first_report_then_resume() {
    kill_and_resume(1);
}

#[test]
fn sigkill_halfway_then_resume() {
    kill_and_resume(STEPS / 2);
}

#[test]
fn sigkill_just_before_synthesis_then_resume() {
    kill_and_resume(STEPS - 1);
}

#[test]
fn sigterm_pauses_and_resume_uses_resume_preambles() {
    let s = scenario();
    let (proc_, run) = start_run(&s);
    let store = reader(&s.work);
    wait_for(RUN_WAIT, "reports and a running session", || {
        let tasks = subtasks(&store, run);
        (count(&tasks, TaskStatus::Complete) >= 4 && count(&tasks, TaskStatus::Running) >= 1)
            .then_some(())
    })
    .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(proc_.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let (status, out, err) = proc_.wait_output(RUN_WAIT).unwrap();
    assert_eq!(status.code(), Some(6), "paused exit code\n{out}\n{err}");
    assert!(out.contains("paused run"), "{out}");
    assert_eq!(store.catalog().run(run).unwrap().status, RunStatus::Paused);
    let at_pause = subtasks(&store, run);
    let paused: BTreeSet<usize> = at_pause
        .iter()
        .filter(|t| t.status == TaskStatus::Paused)
        .map(part)
        .collect();
    let acked: BTreeSet<usize> = at_pause
        .iter()
        .filter(|t| t.status == TaskStatus::Complete)
        .map(part)
        .collect();
    assert!(!paused.is_empty(), "nothing was paused: {at_pause:?}");
    drop(store);
    let before = session_openings(&recorded_bodies(&s.record)).len();

    let out = resume(&s, run);
    assert!(out.contains(": Completed"), "{out}");
    let store = reader(&s.work);
    assert_eq!(claims(&store, run), expected_claims(STEPS));
    let openings = session_openings(&recorded_bodies(&s.record));
    let after: Vec<&String> = openings[before..].iter().collect();
    for i in &paused {
        let marker = format!("Part {i} of the fan-out.");
        let resumed = after
            .iter()
            .find(|o| o.contains(&marker))
            .unwrap_or_else(|| panic!("paused part {i} did not run again"));
        assert!(
            resumed.contains(r#"kind=\"resume\""#),
            "part {i} resumed without a resume preamble: {resumed}"
        );
    }
    for i in &acked {
        assert_eq!(
            openings_of(&openings, *i),
            1,
            "acknowledged part {i} ran twice"
        );
    }
    let tasks = subtasks(&store, run);
    assert!(
        tasks
            .iter()
            .filter(|t| paused.contains(&part(t)))
            .all(|t| t.attempt >= 2)
    );
}
