//! A run's state under pause, crash, cancel and follow-up, with real `keel` processes on the
//! built-in scripted model and plans of timed shell steps (issue 17):
//!
//! - pauses (SIGTERM) and crashes (SIGKILL) do not use up a step's retries;
//! - the spend of interrupted attempts stays in the run's budget, so the limit holds on resume;
//! - a follow-up whose id was handed out survives a SIGKILL of its `keel follow-up`;
//! - cancelling a follow-up ends that follow-up, never the finished run's result;
//! - `keel cancel` refuses a finished or unknown run, and a request nobody takes does not outlive
//!   its command;
//! - a SIGTERM as a run completes reports what the store holds;
//! - `keel --server URL cancel TASK` ends a follow-up a `keel serve` hosts, and a coordinator
//!   `keel node` answers another process's `keel cancel TASK`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use keel_actors::runtime::scripted::fan_out_plan;
use keel_store::{
    LogKind, RunId, RunStatus, Store, StoreConfig, Task, TaskId, TaskKind, TaskStatus,
};
use keel_tests::fan_out::subtasks;
use keel_tests::{Reaped, keel, wait_for};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Every wait of these tests: each is far longer than the step it waits for.
const WAIT: Duration = Duration::from_secs(45);

/// A working folder with a keel home, and a gate file that the plan's step waits for.
struct Work {
    _dir: tempfile::TempDir,
    work: PathBuf,
    gate: PathBuf,
}

impl Work {
    /// A home whose keel.toml is `toml`, with a one-step plan in `plan.json` whose step waits for
    /// the gate, then prints `part 0 done`.
    fn new(toml: &str) -> Work {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        std::fs::create_dir_all(&work).unwrap();
        let gate = dir.path().join("gate");
        let init = keel(&work).unwrap().arg("init").output().unwrap();
        assert!(init.status.success(), "{init:?}");
        std::fs::write(work.join(".keel/keel.toml"), toml).unwrap();
        let command = format!(
            "for n in $(seq 1 900); do [ -e {} ] && break; sleep 0.05; done; echo part 0 done",
            gate.display()
        );
        let plan = fan_out_plan(1, |_| command.clone()).unwrap();
        std::fs::write(
            work.join("plan.json"),
            serde_json::to_string(&plan).unwrap(),
        )
        .unwrap();
        Work {
            _dir: dir,
            work,
            gate,
        }
    }

    fn keel(&self) -> std::process::Command {
        keel(&self.work).unwrap()
    }

    fn open_gate(&self) {
        std::fs::write(&self.gate, "open").unwrap();
    }

    /// `keel run` of the plan, started; returns the process and its run.
    fn start_run(&self) -> (Reaped, RunId) {
        let mut cmd = self.keel();
        cmd.args(["run", "state", "--plan", "plan.json"]);
        let mut proc_ = Reaped::spawn(cmd).unwrap();
        let line = proc_.line_containing("started in", WAIT).unwrap();
        (
            proc_,
            line.split_whitespace().nth(1).unwrap().parse().unwrap(),
        )
    }

    /// `keel resume RUN`, started.
    fn start_resume(&self, run: RunId) -> Reaped {
        let mut cmd = self.keel();
        cmd.args(["resume", &run.to_string()]);
        Reaped::spawn(cmd).unwrap()
    }

    /// Run `args` to their end: (exit code, stdout, stderr).
    fn output(&self, args: &[&str]) -> (i32, String, String) {
        let mut cmd = self.keel();
        cmd.args(args);
        let (status, out, err) = Reaped::spawn(cmd).unwrap().wait_output(WAIT).unwrap();
        (status.code().unwrap_or(-1), out, err)
    }

    /// The store, opened read-only once it can be (a store a SIGKILL left needs its next writer).
    fn reader(&self) -> Store {
        let path = self.work.join(".keel/keel.redb");
        wait_for(WAIT, "a read-only open of the store", || {
            Store::open_read_only(&path, StoreConfig::default()).ok()
        })
        .unwrap()
    }

    /// The control folder's files (where `keel cancel` asks the process holding the store).
    fn control_files(&self) -> Vec<String> {
        std::fs::read_dir(self.work.join(".keel/control"))
            .map(|rd| {
                rd.filter_map(|e| e.ok()?.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// The one subtask of `run`.
fn step_task(store: &Store, run: RunId) -> Option<Task> {
    subtasks(store, run)
        .into_iter()
        .find(|t| t.kind == TaskKind::Subtask)
}

/// Wait until attempt `attempt` of the run's step is in its session: running, with its tool call
/// (the gated shell step) logged.
fn wait_in_session(w: &Work, run: RunId, attempt: u32) -> TaskId {
    wait_for(WAIT, &format!("attempt {attempt} in its session"), || {
        let store = w.reader();
        let task = step_task(&store, run)?;
        if task.attempt != attempt || task.status != TaskStatus::Running {
            return None;
        }
        let rows = store.run(run).log_rows_after(task.id, 0, 1000).ok()?.items;
        // The attempt's own session started (one per attempt), and logged its usage and its tool
        // call since.
        let starts: Vec<usize> = (0..rows.len())
            .filter(|&i| {
                rows[i].value.kind == LogKind::Lifecycle
                    && rows[i].value.summary.starts_with("session started")
            })
            .collect();
        let last = *starts.last()?;
        let kinds: Vec<LogKind> = rows[last..].iter().map(|r| r.value.kind).collect();
        (starts.len() == attempt as usize
            && kinds.contains(&LogKind::ToolUse)
            && kinds.contains(&LogKind::Usage))
        .then_some(task.id)
    })
    .unwrap()
}

fn sigterm(p: &Reaped) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(p.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
}

/// SIGTERM, and the paused exit (6).
fn pause(p: Reaped) {
    sigterm(&p);
    let (status, out, err) = p.wait_output(WAIT).unwrap();
    assert_eq!(status.code(), Some(6), "paused exit code\n{out}\n{err}");
}

#[test]
fn pauses_and_crashes_do_not_use_up_a_steps_retries() {
    let w = Work::new("");
    let (mut proc_, run) = w.start_run();
    // Five interruptions (the default attempts_per_step_max), SIGTERM and SIGKILL in turn, each
    // while attempt n of the step is in its session.
    for attempt in 1..=5 {
        wait_in_session(&w, run, attempt);
        if attempt % 2 == 1 {
            pause(proc_);
        } else {
            proc_.kill();
        }
        proc_ = w.start_resume(run);
    }
    // Attempt 6 is not parked as "retry budget spent": it runs and completes.
    wait_in_session(&w, run, 6);
    w.open_gate();
    let (status, out, err) = proc_.wait_output(WAIT).unwrap();
    assert_eq!(status.code(), Some(0), "{out}\n{err}");
    assert!(out.contains(": Completed"), "{out}");
    let store = w.reader();
    let task = step_task(&store, run).unwrap();
    assert_eq!(task.status, TaskStatus::Complete, "{task:?}");
    assert_eq!(task.attempt, 6);
    assert!(
        store.run(run).dead_letters(0, 10).unwrap().items.is_empty(),
        "nothing was parked"
    );
}

#[test]
fn the_spend_of_paused_attempts_stays_in_the_runs_budget() {
    // 100 micro-dollars: the scripted model charges 45 for the first turn of a session (the tool
    // call), so two paused attempts leave 10, and a third session goes over.
    let w = Work::new("[supervisor]\nrun_budget_usd = 0.0001\n");
    let (proc_, run) = w.start_run();
    wait_in_session(&w, run, 1);
    pause(proc_);
    let proc_ = w.start_resume(run);
    wait_in_session(&w, run, 2);
    pause(proc_);
    let spent = w.reader().catalog().run(run).unwrap().budget.spent_micros;
    assert_eq!(spent, 90, "both paused attempts' spend is durable");
    // The third attempt goes over the limit, so the run ends over budget rather than completing
    // as if the paused attempts had cost nothing.
    w.open_gate();
    let (status, out, err) = w.start_resume(run).wait_output(WAIT).unwrap();
    assert_eq!(status.code(), Some(5), "{out}\n{err}");
    let row = w.reader().catalog().run(run).unwrap();
    assert_eq!(row.status, RunStatus::BudgetExceeded, "{row:?}");
    assert!(row.budget.spent_micros > 100, "{row:?}");
}

/// A follow-up message the scripted model carries out: a shell command that waits for `gate`,
/// then prints a report with `claim` naming the session's own task.
fn gated_follow_up(gate: &Path, claim: &str) -> String {
    let command = format!(
        "for n in $(seq 1 900); do [ -e {} ] && break; sleep 0.05; done; printf '{{\"subtask_id\":\"%s\",\"status\":\"complete\",\"findings\":[{{\"claim\":\"{claim}\",\"source\":\"printf\",\"confidence_permille\":900}}],\"gaps\":[],\"summary\":\"follow-up\"}}' \"$KEEL_SUBTASK_ID\" >&2",
        gate.display()
    );
    format!(
        "Answer this too.\nCALL_TOOL: bash {}",
        serde_json::json!({ "command": command })
    )
}

/// A run of the plan, completed (the gate open); returns the run and its step's task.
fn completed_run(w: &Work) -> (RunId, TaskId) {
    w.open_gate();
    let (proc_, run) = w.start_run();
    let (status, out, err) = proc_.wait_output(WAIT).unwrap();
    assert_eq!(status.code(), Some(0), "{out}\n{err}");
    let task = step_task(&w.reader(), run).unwrap().id;
    (run, task)
}

#[test]
fn a_follow_up_whose_id_was_announced_survives_a_sigkill() {
    let w = Work::new("");
    let (run, task) = completed_run(&w);
    let gate = w.work.join("follow-up-gate");
    let mut cmd = w.keel();
    cmd.args([
        "follow-up",
        &task.to_string(),
        &gated_follow_up(&gate, "followed up"),
    ]);
    let mut proc_ = Reaped::spawn(cmd).unwrap();
    let line = proc_.line_containing("follow-up ", WAIT).unwrap();
    proc_.kill();
    let follow = line.split_whitespace().nth(1).unwrap().to_string();
    // Its row is in the store: `keel show` finds it, and `keel resume` runs it.
    let (code, out, err) = w.output(&["--json", "show", &follow]);
    assert_eq!(
        code, 0,
        "the announced follow-up is in the store\n{out}\n{err}"
    );
    let row: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(row["kind"], "FollowUp", "{row}");
    std::fs::write(&gate, "open").unwrap();
    let (code, out, err) = w.output(&["resume", &run.to_string()]);
    assert_eq!(code, 0, "{out}\n{err}");
    let store = w.reader();
    let follow: TaskId = follow.parse().unwrap();
    let row = store.catalog().task(follow).unwrap();
    assert_eq!(row.status, TaskStatus::Complete, "{row:?}");
    assert!(row.outcome.unwrap().contains("followed up"));
}

/// `keel follow-up --detach` of a gated follow-up on `task`; returns the follow-up's task id and
/// the command it says stops it.
fn detached_follow_up(w: &Work, task: TaskId, gate: &Path) -> (TaskId, String) {
    let (code, out, err) = w.output(&[
        "follow-up",
        &task.to_string(),
        &gated_follow_up(gate, "never"),
        "--detach",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let follow: TaskId = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    let stop = out
        .split("stop with `")
        .nth(1)
        .and_then(|s| s.split('`').next())
        .unwrap()
        .to_string();
    // In its session.
    wait_for(WAIT, "the follow-up running", || {
        let t = w.reader().catalog().task(follow).ok()?;
        (t.status == TaskStatus::Running).then_some(())
    })
    .unwrap();
    (follow, stop)
}

/// Wait until the run is `Completed` again (its reopening process ended).
fn wait_completed(w: &Work, run: RunId) -> keel_store::Run {
    wait_for(WAIT, "the reopened run to end", || {
        let row = w.reader().catalog().run(run).ok()?;
        (row.status.is_terminal()).then_some(row)
    })
    .unwrap()
}

#[test]
fn cancelling_a_follow_up_ends_it_and_keeps_the_runs_result() {
    let w = Work::new("");
    let (run, task) = completed_run(&w);
    let gate = w.work.join("follow-up-gate");

    // 1. `keel cancel TASK`, as `--detach` says.
    let (follow, stop) = detached_follow_up(&w, task, &gate);
    assert_eq!(stop, format!("keel cancel {follow}"));
    let (code, out, err) = w.output(&["cancel", &follow.to_string()]);
    assert_eq!(code, 0, "{out}\n{err}");
    let row = wait_completed(&w, run);
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    assert!(
        row.outcome.as_deref().unwrap().contains("part 0 done"),
        "the synthesis keeps the run's result: {row:?}"
    );
    let store = w.reader();
    assert_eq!(
        store.catalog().task(follow).unwrap().status,
        TaskStatus::Cancelled
    );
    assert_eq!(
        store.catalog().task(task).unwrap().status,
        TaskStatus::Complete
    );
    drop(store);

    // 2. `keel cancel RUN` of the reopened run ends its follow-up, not the run's result.
    let (follow, _) = detached_follow_up(&w, task, &gate);
    let (code, out, err) = w.output(&["cancel", &run.to_string()]);
    assert_eq!(code, 0, "{out}\n{err}");
    let row = wait_completed(&w, run);
    assert_eq!(row.status, RunStatus::Completed, "{row:?}");
    assert!(
        row.outcome.as_deref().unwrap().contains("part 0 done"),
        "{row:?}"
    );
    assert_eq!(
        w.reader().catalog().task(follow).unwrap().status,
        TaskStatus::Cancelled
    );

    // 3. A later follow-up still runs.
    std::fs::write(&gate, "open").unwrap();
    let (code, out, err) = w.output(&[
        "follow-up",
        &task.to_string(),
        &gated_follow_up(&gate, "answered"),
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains(&format!("run {run}: Completed")), "{out}");
}

#[test]
fn a_cancel_refuses_what_has_ended_and_never_outlives_its_command() {
    let w = Work::new("");
    let (done, _) = completed_run(&w);
    // A paused run, to be cancelled later.
    std::fs::remove_file(&w.gate).unwrap();
    let (proc_, paused) = w.start_run();
    wait_in_session(&w, paused, 1);
    pause(proc_);
    // Another run holds the store.
    let (holder, held) = w.start_run();
    wait_in_session(&w, held, 1);

    // A finished run and an unknown id are refused, and nothing is left behind.
    let (code, _, err) = w.output(&["cancel", &done.to_string()]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("already ended (Completed)"), "{err}");
    let (code, _, err) = w.output(&["cancel", "01ARZ3NDEKTSV4RRFFQ69G5FAV"]);
    assert_eq!(code, 3, "{err}");
    assert_eq!(w.control_files(), Vec::<String>::new());

    // The process holding the store carries out a cancel of a run it does not host (the paused
    // one), and of the run it hosts.
    let (code, out, err) = w.output(&["cancel", &paused.to_string()]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains(&format!("run {paused} cancelled")), "{out}");
    let (code, out, err) = w.output(&["cancel", &held.to_string()]);
    assert_eq!(code, 0, "{out}\n{err}");
    let (status, out, err) = holder.wait_output(WAIT).unwrap();
    assert_eq!(status.code(), Some(5), "{out}\n{err}");
    let store = w.reader();
    assert_eq!(
        store.catalog().run(paused).unwrap().status,
        RunStatus::Cancelled
    );
    assert_eq!(
        store.catalog().run(held).unwrap().status,
        RunStatus::Cancelled
    );
    assert_eq!(
        store.catalog().run(done).unwrap().status,
        RunStatus::Completed
    );
    drop(store);
    assert_eq!(w.control_files(), Vec::<String>::new());

    // A writer that answers nothing (this test, holding the store): the request is taken back.
    let (proc_, other) = w.start_run();
    wait_in_session(&w, other, 1);
    pause(proc_);
    let writer = Store::open_with(
        w.work.join(".keel/keel.redb"),
        StoreConfig {
            sharing: keel_store::Sharing::WithReaders,
            ..StoreConfig::default()
        },
    )
    .unwrap();
    let (code, _, err) = w.output(&["cancel", &other.to_string()]);
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("nothing was cancelled"), "{err}");
    assert_eq!(w.control_files(), Vec::<String>::new());
    drop(writer);
    // So its next resume is not cancelled by a leftover request.
    w.open_gate();
    let (code, out, err) = w.output(&["resume", &other.to_string()]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains(": Completed"), "{out}");
}

#[test]
fn a_sigterm_as_the_run_completes_reports_what_the_store_holds() {
    let w = Work::new("");
    let (proc_, run) = w.start_run();
    wait_in_session(&w, run, 1);
    let store = w.reader();
    w.open_gate();
    // The signal follows the run's durable end as closely as the store shows it.
    wait_for(WAIT, "the run's end", || {
        store
            .catalog()
            .run(run)
            .ok()
            .filter(|r| r.status.is_terminal())
    })
    .unwrap();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(proc_.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    );
    let (status, out, err) = proc_.wait_output(WAIT).unwrap();
    assert_eq!(status.code(), Some(0), "{out}\n{err}");
    assert!(out.contains(&format!("run {run}: Completed")), "{out}");
    assert!(!out.contains("paused"), "{out}");
}

#[test]
fn keel_server_cancel_of_a_task_ends_that_follow_up_and_keeps_the_runs_result() {
    let w = Work::new("");
    let (run, task) = completed_run(&w);
    let server = keel_tests::serve::Server::start(&w.work);
    let remote = |args: &[&str]| -> (i32, String, String) {
        let mut cmd = server.keel(&w.work);
        cmd.args(args);
        let (status, out, err) = Reaped::spawn(cmd).unwrap().wait_output(WAIT).unwrap();
        (status.code().unwrap_or(-1), out, err)
    };
    // `keel serve` has the store alone: the test reads it through the server, as `keel` does.
    // Not found yet (exit 3: a follow-up just asked) is `None`; any other failure fails at once.
    let read = |args: &[&str]| -> Option<serde_json::Value> {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let (code, out, err) = remote(&all);
        if code == 3 {
            return None;
        }
        assert_eq!(code, 0, "keel {all:?}: {out}\n{err}");
        Some(serde_json::from_str(&out).unwrap_or_else(|e| panic!("keel {all:?}: {e}: {out}")))
    };
    let task_status = |id: TaskId| read(&["show", &id.to_string()]).map(|t| t["status"].clone());
    let run_row = || {
        read(&["runs"])?["runs"]
            .as_array()?
            .iter()
            .find(|r| r["id"] == run.to_string())
            .cloned()
    };
    let gate = w.work.join("follow-up-gate");
    let (code, out, err) = remote(&[
        "follow-up",
        &task.to_string(),
        &gated_follow_up(&gate, "never"),
        "--detach",
    ]);
    assert_eq!(code, 0, "{out}\n{err}");
    let follow: TaskId = out.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(
        out.contains(&format!("stop with `keel cancel {follow}`")),
        "{out}"
    );
    wait_for(WAIT, "the follow-up running", || {
        (task_status(follow)? == "Running").then_some(())
    })
    .unwrap();

    let (code, out, err) = remote(&["cancel", &follow.to_string()]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains(&format!("task {follow}")), "{out}");
    let row = wait_for(WAIT, "the reopened run to end", || {
        let row = run_row()?;
        let status: RunStatus = serde_json::from_value(row["status"].clone()).ok()?;
        status.is_terminal().then_some(row)
    })
    .unwrap();
    assert_eq!(row["status"], "Completed", "{row}");
    assert!(
        row["outcome"].to_string().contains("part 0 done"),
        "the synthesis keeps the run's result: {row}"
    );
    assert_eq!(task_status(follow).unwrap(), "Cancelled");
    assert_eq!(task_status(task).unwrap(), "Complete");

    // What has ended is refused (exit 1), an unknown id is not found (exit 3).
    let (code, out, err) = remote(&["cancel", &follow.to_string()]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(err.contains("nothing to cancel"), "{err}");
    let (code, out, err) = remote(&[
        "cancel",
        &RunId(0x0190_0000_0000_0000_0000_0000_0000_0042).to_string(),
    ]);
    assert_eq!(code, 3, "{out}\n{err}");
    assert_eq!(run_row().unwrap()["status"], "Completed");
}

#[test]
fn a_keel_node_answers_another_processs_cancel() {
    use std::os::unix::fs::PermissionsExt;
    let w = Work::new("");
    // A run killed in its step: the coordinator node resumes it at start and hosts it (its step
    // waits for a worker; none joins).
    let (proc_, run) = w.start_run();
    let task = wait_in_session(&w, run, 1);
    proc_.kill();
    let cookie = w.work.join("cookie");
    std::fs::write(&cookie, "keel-test-cookie-0123456789abcdef").unwrap();
    std::fs::set_permissions(&cookie, std::fs::Permissions::from_mode(0o600)).unwrap();
    let mut cmd = w.keel();
    cmd.env("KEEL_LOG", "error,keel::node_cmd=info").args([
        "node",
        "--role",
        "coordinator",
        "--listen",
        "127.0.0.1:0",
        "--api",
        "127.0.0.1:0",
        // The test reads the store file beside the daemon.
        "--share-store",
    ]);
    cmd.arg("--cookie-file").arg(&cookie);
    let mut node = Reaped::spawn(cmd).unwrap();
    node.stderr_line_containing("resuming a run", WAIT).unwrap();
    node.line_containing("HTTP API on", WAIT).unwrap();

    // `keel cancel TASK` in the node's home goes to the node, which ends that step; its run has
    // nothing else to do and ends.
    let (code, out, err) = w.output(&["cancel", &task.to_string()]);
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains(&format!("task {task}")), "{out}");
    let row = wait_for(WAIT, "the run ended", || {
        let row = w.reader().catalog().run(run).ok()?;
        row.status.is_terminal().then_some(row)
    })
    .unwrap();
    assert_ne!(row.status, RunStatus::Cancelled, "{row:?}");
    assert_eq!(
        w.reader().catalog().task(task).unwrap().status,
        TaskStatus::Cancelled
    );
    // A cancel of the ended run is refused, and nothing is left behind.
    let (code, out, err) = w.output(&["cancel", &run.to_string()]);
    assert_eq!(code, 1, "{out}\n{err}");
    assert!(w.control_files().is_empty(), "{:?}", w.control_files());
    sigterm(&node);
    let (status, out, err) = node.wait_output(WAIT).unwrap();
    assert!(status.code().is_some(), "{out}\n{err}");
}
