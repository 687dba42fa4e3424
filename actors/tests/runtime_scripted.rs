//! The ractor runtime end to end on a real redb file: a fan-out plan runs on the in-process scripted
//! model through keel's agent loop with real tools, reports become durable, the run completes with a
//! synthesis, and a run resumed from its store after a pause does not run acknowledged work again.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use keel_actors::host::Refusal;
use keel_actors::runtime::{HarnessSet, RunHandle, Runtime, RuntimeConfig, RuntimeEvent, scripted};
use keel_actors::{Plan, RunMode, Synthesis};
use keel_harness::HarnessKind;
use keel_harness::scripted::{Script, ScriptedHarness};
use keel_store::{RunStatus, Sharing, Store, StoreConfig, TaskKind, TaskStatus};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

fn config(work: &std::path::Path) -> RuntimeConfig {
    let mut c = RuntimeConfig::default();
    c.supervisor.agents = vec![scripted::scripted_agent()];
    c.supervisor.spawn_burst = 64;
    c.supervisor.spawn_interval_ms = 1;
    c.specialist.working_dir = work.to_path_buf();
    c.specialist.resend_interval_ms = 200;
    c.stop_grace_ms = 1_000;
    c
}

fn open(dir: &std::path::Path) -> Arc<Store> {
    let cfg = StoreConfig {
        sharing: Sharing::WithReaders,
        ..StoreConfig::default()
    };
    Arc::new(Store::open_with(dir.join("keel.redb"), cfg).unwrap())
}

fn harnesses() -> HarnessSet {
    HarnessSet::new().with(
        HarnessKind::Scripted,
        Arc::new(ScriptedHarness::new(Script::rules())),
    )
}

/// A temporary directory holding a `work` directory for the sessions and a store opened on it. Keep
/// the directory alive for the test.
fn workspace() -> (tempfile::TempDir, PathBuf, Arc<Store>) {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let store = open(dir.path());
    (dir, work, store)
}

/// A runtime on `store` with the scripted harness and `cfg`, and its event channel.
async fn start(store: &Arc<Store>, cfg: RuntimeConfig) -> (Runtime, mpsc::Receiver<RuntimeEvent>) {
    Runtime::start(store.clone(), harnesses(), cfg)
        .await
        .unwrap()
}

/// Submit `plan` as a run with `brief`, no budget limit and a test config snapshot.
async fn submit(rt: &Runtime, brief: &str, plan: Plan) -> RunHandle {
    rt.submit(brief.into(), RunMode::Plan(plan), None, "test".into())
        .await
        .unwrap()
}

/// A shell command that looks for `gate` up to `tries` times, 50 ms apart, then echoes `then`.
fn after_gate(gate: &Path, tries: u32, then: &str) -> String {
    format!(
        "for n in $(seq 1 {tries}); do [ -e {} ] && break; sleep 0.05; done; echo {then}",
        gate.display()
    )
}

/// The claims of a run that completed (asserted) with a synthesis.
fn completed_claims(outcome: &keel_actors::runtime::RunOutcome) -> Vec<String> {
    assert_eq!(outcome.status, RunStatus::Completed, "{}", outcome.outcome);
    let synthesis: Synthesis = serde_json::from_str(&outcome.outcome).unwrap();
    synthesis
        .findings
        .into_iter()
        .map(|f| f.finding.claim)
        .collect()
}

/// The runtime's next event (within a minute).
async fn next_event(events: &mut mpsc::Receiver<RuntimeEvent>) -> RuntimeEvent {
    tokio::time::timeout(Duration::from_secs(60), events.recv())
        .await
        .expect("an event")
        .expect("the channel stays open")
}

/// Two parallel steps: one that echoes at once, one that waits for `gate` (see [`after_gate`]).
fn quick_and_gated(gate: &Path, tries: u32) -> Plan {
    scripted::fan_out_plan(2, |i| {
        if i == 0 {
            "echo quick".to_string()
        } else {
            after_gate(gate, tries, "slow")
        }
    })
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_runs_real_tools_and_completes_with_a_synthesis() {
    let (_dir, work, store) = workspace();
    for i in 0..3 {
        std::fs::write(work.join(format!("f{i}.txt")), "hello").unwrap();
    }
    let (rt, mut events) = start(&store, config(&work)).await;
    let plan =
        scripted::fan_out_plan(4, |i| format!("echo part {i} sees $(ls | wc -l) files")).unwrap();
    let handle = submit(&rt, "survey", plan).await;
    let run = handle.id();
    let outcome = tokio::time::timeout(Duration::from_secs(60), handle.finished())
        .await
        .expect("the run finishes")
        .unwrap();
    assert_eq!(outcome.status, RunStatus::Completed, "{}", outcome.outcome);
    let synthesis: Synthesis = serde_json::from_str(&outcome.outcome).unwrap();
    assert!(!synthesis.partial_coverage, "{synthesis:?}");
    let mut claims: Vec<String> = synthesis
        .findings
        .iter()
        .map(|f| f.finding.claim.clone())
        .collect();
    claims.sort();
    assert_eq!(
        claims,
        (0..4)
            .map(|i| format!("part {i} sees 3 files"))
            .collect::<Vec<_>>()
    );
    // Durable: every subtask complete, its log holds the real tool call.
    let tasks = store.run(run).tasks(None, 100).unwrap().items;
    let subtasks: Vec<_> = tasks.iter().filter(|t| t.kind != TaskKind::Root).collect();
    assert_eq!(subtasks.len(), 4);
    assert!(subtasks.iter().all(|t| t.status == TaskStatus::Complete));
    let log = store.run(run).last_log_rows(subtasks[0].id, 50).unwrap();
    assert!(
        log.iter().any(|r| r.value.summary.starts_with("bash")),
        "{log:?}"
    );
    // Events: four starts, four acknowledged reports, one finish.
    let mut started = 0;
    let mut reports = 0;
    let mut finished = 0;
    while let Ok(e) = events.try_recv() {
        match e {
            RuntimeEvent::TaskStarted { .. } => started += 1,
            RuntimeEvent::Report { .. } => reports += 1,
            RuntimeEvent::Finished(_) => finished += 1,
            _ => {}
        }
    }
    assert_eq!((started, reports, finished), (4, 4, 1));
    assert_eq!(rt.sessions_started(), 4);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_run_resumes_without_rerunning_acknowledged_steps() {
    let (_dir, work, store) = workspace();
    // Two quick steps and two that wait for a file the test creates after the pause.
    let gate = work.join("gate");
    let plan = scripted::fan_out_plan(4, |i| {
        if i < 2 {
            format!("echo quick {i}")
        } else {
            after_gate(&gate, 300, &format!("slow {i}"))
        }
    })
    .unwrap();
    let (rt, mut events) = start(&store, config(&work)).await;
    let handle = submit(&rt, "pause me", plan).await;
    let run = handle.id();
    // Wait for the two quick reports to be acknowledged (durable).
    let mut reports = 0;
    while reports < 2 {
        match tokio::time::timeout(Duration::from_secs(30), events.recv()).await {
            Ok(Some(RuntimeEvent::Report { .. })) => reports += 1,
            Ok(Some(_)) => {}
            other => panic!("no report: {other:?}"),
        }
    }
    let summary = rt.pause(Duration::from_secs(10)).await;
    assert_eq!(summary.runs, vec![run]);
    assert_eq!(summary.tasks_paused, 2, "{summary:?}");
    assert_eq!(store.catalog().run(run).unwrap().status, RunStatus::Paused);
    rt.shutdown().await;
    drop(handle);

    std::fs::write(&gate, "open").unwrap();
    let (rt, _events) = start(&store, config(&work)).await;
    let outcome = tokio::time::timeout(
        Duration::from_secs(60),
        rt.resume(run).await.unwrap().finished(),
    )
    .await
    .expect("the resumed run finishes")
    .unwrap();
    assert_eq!(outcome.status, RunStatus::Completed, "{}", outcome.outcome);
    // Only the two paused steps ran again, each as a second attempt with a resume preamble.
    assert_eq!(rt.sessions_started(), 2);
    let tasks = store.run(run).tasks(None, 100).unwrap().items;
    let mut attempts: Vec<u32> = tasks
        .iter()
        .filter(|t| t.kind != TaskKind::Root)
        .map(|t| t.attempt)
        .collect();
    attempts.sort();
    assert_eq!(attempts, vec![1, 1, 2, 2]);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_specialist_is_seen_through_its_link_and_restarted() {
    let (_dir, work, store) = workspace();
    let mut cfg = config(&work);
    cfg.supervisor.restart_backoff_ms = 10;
    let (rt, mut events) = start(&store, cfg).await;
    // The first attempt of part 1 waits long enough to be killed; the restart finds the marker.
    let marker = work.join("second-attempt");
    let plan = scripted::fan_out_plan(2, |i| {
        if i == 0 {
            "echo steady".to_string()
        } else {
            format!(
                "if [ -e {m} ]; then echo restarted; else touch {m}; sleep 20; echo slow; fi",
                m = marker.display()
            )
        }
    })
    .unwrap();
    let handle = submit(&rt, "crash", plan).await;
    let mut killed: Option<keel_actors::AttemptId> = None;
    let mut restarted = false;
    let outcome = loop {
        match next_event(&mut events).await {
            RuntimeEvent::TaskStarted { attempt, step, .. } if step == "part-001" => {
                if let Some(first) = killed {
                    assert_eq!(attempt.task, first.task);
                    assert!(attempt.attempt > first.attempt);
                    restarted = true;
                } else {
                    // Let the session start its command, then kill the worker.
                    while !marker.exists() {
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    assert!(rt.kill_attempt(attempt));
                    killed = Some(attempt);
                }
            }
            RuntimeEvent::Finished(o) => break o,
            _ => {}
        }
    };
    assert!(restarted, "the supervisor restarted the killed attempt");
    let claims = completed_claims(&outcome);
    assert!(claims.iter().any(|c| c == "restarted"), "{claims:?}");
    assert_eq!(rt.sessions_started(), 3);
    drop(handle);
    rt.shutdown().await;
}

/// A harness whose every session start panics (keel's adapter breaking).
struct Panics;

impl keel_harness::Harness for Panics {
    fn kind(&self) -> HarnessKind {
        HarnessKind::ClaudeCode
    }

    fn start(
        &self,
        _spec: keel_harness::SessionSpec,
    ) -> keel_harness::session::BoxFuture<
        '_,
        Result<keel_harness::RunningSession, keel_harness::StartError>,
    > {
        panic!("the adapter broke");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_specialist_that_panics_is_reported_down_as_its_harness_failing_and_the_run_goes_on() {
    let (_dir, work, store) = workspace();
    let mut cfg = config(&work);
    cfg.supervisor.restart_backoff_ms = 10;
    // One harness failure puts a harness in cooldown: the next attempt goes to the other one. A
    // specialist lost without a panic (a crashed host) would be restarted on the same harness.
    cfg.supervisor.harness_failures_max = 1;
    let mut broken = scripted::scripted_agent();
    broken.name = "broken".into();
    broken.harness = "claude-code".into();
    cfg.supervisor.agents.insert(0, broken);
    let harnesses = harnesses().with(HarnessKind::ClaudeCode, Arc::new(Panics));
    let (rt, mut events) = Runtime::start(store.clone(), harnesses, cfg).await.unwrap();
    let mut plan = scripted::fan_out_plan(1, |_| "echo survived".to_string()).unwrap();
    plan.steps[0].assignee = Some("broken".into());
    let handle = submit(&rt, "panic", plan).await;
    let mut started = Vec::new();
    let outcome = loop {
        match next_event(&mut events).await {
            RuntimeEvent::TaskStarted { attempt, agent, .. } => started.push((attempt, agent)),
            RuntimeEvent::Finished(o) => break o,
            _ => {}
        }
    };
    let agents: Vec<&str> = started.iter().map(|(_, a)| a.as_str()).collect();
    assert_eq!(agents, ["broken", "scripted"], "rerouted after the panic");
    assert!(
        !rt.kill_attempt(started[0].0),
        "the panicked attempt is gone"
    );
    assert_eq!(completed_claims(&outcome), ["survived"]);
    drop(handle);
    rt.shutdown().await;
}

/// A follow-up message the scripted model carries out with its own tool call (a `CALL_TOOL:` line is
/// looked for before any `RUN_TOOL:` line, so the parent's command in the preamble is not run): the
/// command prints a report naming the session's own subtask id.
fn follow_up_message(claim: &str) -> String {
    let command = format!(
        "printf '{{\"subtask_id\":\"%s\",\"status\":\"complete\",\"findings\":[{{\"claim\":\"{claim}\",\"source\":\"printf\",\"confidence_permille\":900}}],\"gaps\":[],\"summary\":\"follow-up\"}}' \"${}\" >&2",
        keel_actors::runtime::SUBTASK_ID_ENV
    );
    format!(
        "Now answer this too.\nCALL_TOOL: bash {}",
        serde_json::json!({ "command": command })
    )
}

/// Two scripted profiles with different models, so a derived task's model shows where it came from.
fn two_agents(work: &std::path::Path) -> RuntimeConfig {
    let mut c = config(work);
    let mut second = c.supervisor.agents[0].clone();
    second.name = "second".into();
    second.model = "scripted-2".into();
    c.supervisor.agents.push(second);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_run_takes_follow_ups_on_a_thread_and_ends_again() {
    let (_dir, work, store) = workspace();
    let (rt, _events) = start(&store, two_agents(&work)).await;
    let mut plan = scripted::fan_out_plan(1, |_| "echo first answer".to_string()).unwrap();
    plan.steps[0].assignee = Some("scripted".into());
    let handle = submit(&rt, "a thread", plan).await;
    let run = handle.id();
    let first = handle.finished().await.unwrap();
    assert_eq!(first.status, RunStatus::Completed, "{}", first.outcome);
    let origin = store
        .run(run)
        .tasks(None, 100)
        .unwrap()
        .items
        .into_iter()
        .find(|t| t.kind == TaskKind::Subtask)
        .unwrap();

    // The run is terminal and not hosted: the follow-up reopens it.
    let f1 = rt
        .follow_up(origin.id, &follow_up_message("one more thing"), None)
        .await
        .unwrap();
    assert!(f1.reopened());
    assert_eq!(f1.run(), run);
    let f1_task = f1.task();
    let done = tokio::time::timeout(Duration::from_secs(60), f1.finished())
        .await
        .expect("the follow-up finishes")
        .unwrap();
    assert!(done.completed(), "{done:?}");
    assert_eq!(done.task.id, f1_task);
    assert_eq!(done.task.kind, TaskKind::FollowUp);
    assert_eq!(done.task.parent, Some(origin.id));
    assert_eq!(done.run.status, RunStatus::Completed);
    assert_eq!(
        store.catalog().run(run).unwrap().status,
        RunStatus::Completed
    );

    // A second one on the same thread, on the other profile: its parent is the thread's newest task
    // (the first follow-up), its model is its assignee's.
    let f2 = rt
        .follow_up(origin.id, &follow_up_message("and another"), Some("second"))
        .await
        .unwrap();
    let done2 = tokio::time::timeout(Duration::from_secs(60), f2.finished())
        .await
        .expect("the second follow-up finishes")
        .unwrap();
    assert!(done2.completed(), "{done2:?}");
    assert_eq!(done2.task.parent, Some(f1_task));
    assert_eq!(done2.task.assignee.as_deref(), Some("second"));
    assert_eq!(done2.task.model.as_deref(), Some("scripted-2"));
    assert_eq!(origin.model.as_deref(), Some("scripted-1"));
    // Only the follow-ups ran: no acknowledged step ran again.
    assert_eq!(rt.sessions_started(), 3);
    // The run's new synthesis covers both follow-ups. (The scripted model acts on the first tool
    // instruction it reads, and the second follow-up's preamble carries the first one's brief, so
    // both report the first one's claim; each under its own subtask id, which the specialist
    // verified.)
    let synthesis: Synthesis = serde_json::from_str(&done2.run.outcome).unwrap();
    let coverage: Vec<(&str, &str)> = synthesis
        .coverage
        .iter()
        .map(|c| (c.step.as_str(), c.status.as_str()))
        .collect();
    assert_eq!(
        coverage,
        vec![
            ("part-000", "complete"),
            ("f1", "complete"),
            ("f2", "complete")
        ]
    );
    let claims: Vec<&str> = synthesis
        .findings
        .iter()
        .map(|f| f.finding.claim.as_str())
        .collect();
    assert!(claims.contains(&"one more thing"), "{claims:?}");
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_joins_a_run_this_runtime_hosts() {
    let (_dir, work, store) = workspace();
    let gate = work.join("gate");
    let plan = quick_and_gated(&gate, 300);
    let (rt, mut events) = start(&store, config(&work)).await;
    let handle = submit(&rt, "hosted", plan).await;
    let quick = loop {
        match tokio::time::timeout(Duration::from_secs(30), events.recv()).await {
            Ok(Some(RuntimeEvent::Report { attempt, step, .. })) if step == "part-000" => {
                break attempt.task;
            }
            Ok(Some(_)) => {}
            other => panic!("no report: {other:?}"),
        }
    };
    let follow = rt
        .follow_up(quick, &follow_up_message("while it runs"), None)
        .await
        .unwrap();
    assert!(!follow.reopened(), "the run is hosted here: it is joined");
    std::fs::write(&gate, "open").unwrap();
    let done = tokio::time::timeout(Duration::from_secs(60), follow.finished())
        .await
        .expect("the run ends")
        .unwrap();
    assert!(done.completed(), "{done:?}");
    assert_eq!(done.task.parent, Some(quick));
    let outcome = handle.finished().await.unwrap();
    assert_eq!(outcome.status, RunStatus::Completed);
    assert_eq!(rt.sessions_started(), 3);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follow_ups_that_cannot_be_served_are_refused_with_typed_errors() {
    use keel_actors::runtime::FollowUpError;
    let (_dir, work, store) = workspace();
    let gate = work.join("gate");
    let (rt, _events) = start(&store, config(&work)).await;
    let plan = scripted::fan_out_plan(1, |_| after_gate(&gate, 600, "late")).unwrap();
    let handle = submit(&rt, "held", plan).await;
    let run = handle.id();
    let root = keel_tests_wait_root(&store, run).await;
    let message = follow_up_message("x");

    let e = rt
        .follow_up(keel_store::TaskId(42), &message, None)
        .await
        .unwrap_err();
    assert!(matches!(e, FollowUpError::UnknownTask(_)), "{e}");
    let e = rt
        .follow_up(root, &message, Some("nobody"))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, FollowUpError::UnknownAgent { name, known } if name == "nobody" && known == &["scripted".to_string()]),
        "{e}"
    );
    let e = rt.follow_up(root, " \n\t", None).await.unwrap_err();
    assert!(matches!(e, FollowUpError::EmptyMessage), "{e}");
    let big = "x".repeat(keel_actors::FOLLOW_UP_BYTES_MAX + 1);
    let e = rt.follow_up(root, &big, None).await.unwrap_err();
    assert!(matches!(e, FollowUpError::MessageTooLarge { .. }), "{e}");

    // Another runtime on the same store does not host the run, which is still running.
    let (other, _e) = start(&store, config(&work)).await;
    let e = other.follow_up(root, &message, None).await.unwrap_err();
    assert!(
        matches!(
            e,
            FollowUpError::Refused(Refusal::NotHostedHere {
                status: RunStatus::Running,
                ..
            })
        ),
        "{e}"
    );

    // A cancelled run stays cancelled.
    assert!(rt.cancel(run, "test"));
    let outcome = handle.finished().await.unwrap();
    assert_eq!(outcome.status, RunStatus::Cancelled);
    std::fs::write(&gate, "open").unwrap();
    let e = other.follow_up(root, &message, None).await.unwrap_err();
    assert!(
        matches!(
            e,
            FollowUpError::Refused(Refusal::NotReopenable {
                status: RunStatus::Cancelled,
                ..
            })
        ),
        "{e}"
    );
    // Nothing was created for any of them, and the other runtime started nothing.
    let tasks = store.run(run).tasks(None, 100).unwrap().items;
    assert!(
        tasks.iter().all(|t| t.kind != TaskKind::FollowUp),
        "{tasks:?}"
    );
    assert_eq!(other.sessions_started(), 0);
    other.shutdown().await;
    rt.shutdown().await;
}

/// The root task of `run`, once it is durable.
async fn keel_tests_wait_root(store: &Store, run: keel_store::RunId) -> keel_store::TaskId {
    for _ in 0..600 {
        if let Ok(page) = store.run(run).tasks(None, 10)
            && let Some(root) = page.items.iter().find(|t| t.kind == TaskKind::Root)
        {
            return root.id;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no root task for {run}");
}

/// Waits (bounded) for the first specialist report among `events`.
async fn first_report(events: &mut mpsc::Receiver<RuntimeEvent>) {
    loop {
        match tokio::time::timeout(Duration::from_secs(30), events.recv()).await {
            Ok(Some(RuntimeEvent::Report { .. })) => return,
            Ok(Some(_)) => {}
            other => panic!("no report: {other:?}"),
        }
    }
}

/// A runtime on a store over a simulated disk, opened again from that disk after a failed write.
async fn start_on_disk(
    disk: &keel_store::SimDisk,
    cfg: RuntimeConfig,
) -> (Runtime, mpsc::Receiver<RuntimeEvent>) {
    let store = Store::open_backend(disk.clone(), StoreConfig::default()).unwrap();
    let again = disk.clone();
    let store = keel_actors::runtime::NodeStore::reopenable(Arc::new(store), move || {
        Store::open_backend(again.clone(), StoreConfig::default())
    });
    Runtime::start(store, harnesses(), cfg).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_pauses_the_run_at_once_and_it_resumes_once_space_is_free() {
    use keel_actors::runtime::{PauseReason, WaitError};
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().to_path_buf();
    let gate = work.join("gate");
    let disk = keel_store::SimDisk::new();
    let (rt, mut events) = start_on_disk(&disk, config(&work)).await;
    let plan = quick_and_gated(&gate, 600);
    let handle = submit(&rt, "fill the disk", plan).await;
    let run = handle.id();
    first_report(&mut events).await;
    // The disk is full from here on: the slow step's next rows cannot be written.
    disk.set_write_budget(Some(0));
    std::fs::write(&gate, "open").unwrap();
    let e = tokio::time::timeout(Duration::from_secs(60), handle.finished())
        .await
        .expect("the run's waiter hears of it")
        .unwrap_err();
    assert!(
        matches!(&e, WaitError::Paused { run: r, reason: PauseReason::DiskFull { .. } } if *r == run),
        "{e}"
    );
    assert!(
        e.to_string().contains("disk holding the store is full"),
        "{e}"
    );
    let mut paused = false;
    while let Ok(event) = events.try_recv() {
        paused |= matches!(event, RuntimeEvent::Paused { run: r, .. } if r == run);
    }
    assert!(paused, "observers hear that the run paused");

    // Space is free again: the store is opened again for the next use, and the same runtime resumes
    // the run; the quick step's acknowledged report is not run again.
    disk.set_write_budget(None);
    assert_eq!(rt.open_runs().await.unwrap(), vec![run]);
    let sessions = rt.sessions_started();
    let outcome = tokio::time::timeout(
        Duration::from_secs(60),
        rt.resume(run).await.unwrap().finished(),
    )
    .await
    .expect("the resumed run finishes")
    .unwrap();
    assert_eq!(outcome.status, RunStatus::Completed, "{}", outcome.outcome);
    assert_eq!(
        rt.sessions_started(),
        sessions + 1,
        "only the slow step runs again"
    );
    let store = rt.store().unwrap();
    let tasks = store.run(run).tasks(None, 100).unwrap().items;
    assert!(
        tasks
            .iter()
            .filter(|t| t.kind != TaskKind::Root)
            .all(|t| t.status == TaskStatus::Complete),
        "{tasks:?}"
    );
    drop(store);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reopen_waiting_for_a_run_slot_does_not_hold_up_a_follow_up_that_joins() {
    let (_dir, work, store) = workspace();
    let mut cfg = config(&work);
    cfg.runs_in_flight_max = 1;
    let (rt, _events) = start(&store, cfg).await;
    let rt = Arc::new(rt);
    // A finished run, whose follow-up must reopen it and so needs the only run slot...
    let ended = submit(
        &rt,
        "ended",
        scripted::fan_out_plan(1, |_| "echo done".to_string()).unwrap(),
    )
    .await;
    let ended_run = ended.id();
    assert_eq!(ended.finished().await.unwrap().status, RunStatus::Completed);
    let ended_root = keel_tests_wait_root(&store, ended_run).await;
    // ...which a hosted run holds until its gate opens.
    let gate = work.join("gate");
    let hosted = submit(&rt, "hosted", quick_and_gated(&gate, 600)).await;
    let hosted_root = keel_tests_wait_root(&store, hosted.id()).await;
    let waiting = {
        let rt = Arc::clone(&rt);
        let message = follow_up_message("reopened later");
        // A test may spawn: the reopen must wait for its slot while the test goes on.
        #[allow(clippy::disallowed_methods)]
        tokio::spawn(async move {
            let handle = rt.follow_up(ended_root, &message, None).await.unwrap();
            handle.finished().await.unwrap()
        })
    };
    // Let the reopen reach its wait for a slot.
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A follow-up that joins the hosted run needs no slot: it must not wait behind the reopen.
    let joined = tokio::time::timeout(
        Duration::from_secs(20),
        rt.follow_up(hosted_root, &follow_up_message("joined"), None),
    )
    .await
    .expect("a joining follow-up is not held up by a reopen waiting for a slot")
    .unwrap();
    assert!(!joined.reopened());
    std::fs::write(&gate, "open").unwrap();
    assert!(joined.finished().await.unwrap().completed());
    // The hosted run's handle holds its slot until dropped: then the reopen gets it.
    drop(hosted);
    let reopened = waiting.await.unwrap();
    assert!(reopened.completed(), "{reopened:?}");
    Arc::into_inner(rt).unwrap().shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_input_a_paused_runs_coordinator_gets_after_the_pause_writes_nothing_over_its_marks() {
    let (_dir, work, store) = workspace();
    let gate = work.join("gate");
    let plan = scripted::fan_out_plan(1, |_| after_gate(&gate, 600, "slow")).unwrap();
    let (rt, _events) = start(&store, config(&work)).await;
    let handle = submit(&rt, "pause me", plan).await;
    let run = handle.id();
    // The step's session is running.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let tasks = store.run(run).tasks(None, 100).unwrap().items;
        if tasks
            .iter()
            .any(|t| t.kind == TaskKind::Subtask && t.status == TaskStatus::Running)
        {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "the step never ran");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let summary = rt.pause(Duration::from_secs(10)).await;
    assert_eq!(summary.runs, vec![run]);
    assert_eq!(store.catalog().run(run).unwrap().status, RunStatus::Paused);
    // The run's coordinator lives until the runtime shuts down. An input it gets now (here a
    // cancel; a timer it had set, or a message already in its mailbox, alike) decides, but what it
    // stages is not written: the run stays paused, as its marks say.
    assert!(rt.cancel(run, "after the pause"));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let row = store.catalog().run(run).unwrap();
    assert_eq!(row.status, RunStatus::Paused, "{row:?}");
    rt.shutdown().await;
    drop(handle);
}

/// After `shutdown` the node lets go of its store while the async runtime lives on (an embedding
/// application goes on running): pending timers, which hold the node, are dropped with it, so the
/// store is closed with the caller's last handle. Before, a specialist's deadline held the node
/// (and the store open) for its whole timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_go_of_the_store_while_the_async_runtime_goes_on() {
    let (_dir, work, store) = workspace();
    let (rt, _events) = start(&store, config(&work)).await;
    let plan = scripted::fan_out_plan(3, |i| format!("echo part {i}")).unwrap();
    let handle = submit(&rt, "survey", plan).await;
    let outcome = tokio::time::timeout(Duration::from_secs(60), handle.finished())
        .await
        .expect("the run finishes")
        .unwrap();
    assert_eq!(outcome.status, RunStatus::Completed, "{}", outcome.outcome);
    rt.shutdown().await;
    let mut released = false;
    for _ in 0..250 {
        if Arc::strong_count(&store) == 1 {
            released = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        released,
        "the store is still held {} times after shutdown",
        Arc::strong_count(&store) - 1
    );
}

/// Counts the group commits that ended, and those that failed.
#[derive(Debug, Default)]
struct CommitCounter {
    ended: std::sync::atomic::AtomicU64,
    failed: std::sync::atomic::AtomicU64,
}

impl keel_actors::runtime::RuntimeObserver for CommitCounter {
    fn commit_ended(&self, _latency: Duration, durable: bool) {
        use std::sync::atomic::Ordering::Relaxed;
        self.ended.fetch_add(1, Relaxed);
        if !durable {
            self.failed.fetch_add(1, Relaxed);
        }
    }

    fn spawn_refused(&self, _reason: &'static str) {}
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_journal_sync_fails_its_commits_and_the_run_completes_on_their_retries() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().to_path_buf();
    let gate = work.join("gate");
    let (disk, journal) = (keel_store::SimDisk::new(), keel_store::SimDisk::new());
    let journaled = StoreConfig {
        journal: true,
        ..StoreConfig::default()
    };
    let open = {
        let (disk, journal) = (disk.clone(), journal.clone());
        move || Store::open_backend_journaled(disk.clone(), journal.clone(), journaled)
    };
    let store = keel_actors::runtime::NodeStore::reopenable(Arc::new(open().unwrap()), open);
    let counter = Arc::new(CommitCounter::default());
    let mut cfg = config(&work);
    cfg.observer = Some(counter.clone());
    let (rt, mut events) = Runtime::start(store, harnesses(), cfg).await.unwrap();
    let handle = submit(&rt, "sync fails", quick_and_gated(&gate, 600)).await;
    let run = handle.id();
    first_report(&mut events).await;
    // The journal's next sync fails: the commit it was for fails (its record voided) and is
    // retried on a store opened again.
    journal.fail_next_syncs(1);
    std::fs::write(&gate, "open").unwrap();
    let outcome = tokio::time::timeout(Duration::from_secs(60), handle.finished())
        .await
        .expect("the run finishes")
        .unwrap();
    assert_eq!(outcome.status, RunStatus::Completed, "{}", outcome.outcome);
    let failed = counter.failed.load(std::sync::atomic::Ordering::Relaxed);
    assert!(failed >= 1, "a commit failed with the sync");
    let store = rt.store().unwrap();
    let tasks = store.run(run).tasks(None, 100).unwrap().items;
    let specialists: Vec<_> = tasks.iter().filter(|t| t.kind != TaskKind::Root).collect();
    assert_eq!(specialists.len(), 2, "{tasks:?}");
    assert!(
        specialists.iter().all(|t| t.status == TaskStatus::Complete),
        "{tasks:?}"
    );
    drop(store);
    rt.shutdown().await;
    // What was acknowledged is what the disks hold: the run is complete after a crash too.
    let crashed = Store::open_backend_journaled(disk.crash(), journal.crash(), journaled).unwrap();
    assert_eq!(crashed.run(run).get().unwrap().status, RunStatus::Completed);
}
