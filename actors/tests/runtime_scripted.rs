//! The ractor runtime end to end on a real redb file: a fan-out plan runs on the in-process scripted
//! model through keel's agent loop with real tools, reports become durable, the run completes with a
//! synthesis, and a run resumed from its store after a pause does not run acknowledged work again.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use keel_actors::runtime::{HarnessSet, Runtime, RuntimeConfig, RuntimeEvent, scripted};
use keel_actors::{RunMode, Synthesis};
use keel_harness::HarnessKind;
use keel_harness::scripted::{Script, ScriptedHarness};
use keel_store::{AgentProfile, RunStatus, Sharing, Store, StoreConfig, TaskKind, TaskStatus};
use std::sync::Arc;
use std::time::Duration;

fn config(work: &std::path::Path) -> RuntimeConfig {
    let mut c = RuntimeConfig::default();
    c.supervisor.agents = vec![AgentProfile {
        name: "scripted".into(),
        description: "the built-in scripted model".into(),
        harness: "scripted".into(),
        model: "scripted-1".into(),
        account: "local".into(),
        tools: Vec::new(),
        system_prompt: String::new(),
        limits: Default::default(),
    }];
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fan_out_runs_real_tools_and_completes_with_a_synthesis() {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    for i in 0..3 {
        std::fs::write(work.join(format!("f{i}.txt")), "hello").unwrap();
    }
    let store = open(dir.path());
    let (rt, mut events) = Runtime::start(store.clone(), harnesses(), config(&work))
        .await
        .unwrap();
    let plan =
        scripted::fan_out_plan(4, |i| format!("echo part {i} sees $(ls | wc -l) files")).unwrap();
    let handle = rt
        .submit("survey".into(), RunMode::Plan(plan), None, "test".into())
        .await
        .unwrap();
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
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let store = open(dir.path());
    // Two quick steps and two that wait for a file the test creates after the pause.
    let gate = work.join("gate");
    let plan = scripted::fan_out_plan(4, |i| {
        if i < 2 {
            format!("echo quick {i}")
        } else {
            format!(
                "for n in $(seq 1 300); do [ -e {} ] && break; sleep 0.05; done; echo slow {i}",
                gate.display()
            )
        }
    })
    .unwrap();
    let (rt, mut events) = Runtime::start(store.clone(), harnesses(), config(&work))
        .await
        .unwrap();
    let handle = rt
        .submit("pause me".into(), RunMode::Plan(plan), None, "test".into())
        .await
        .unwrap();
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
    let (rt, _events) = Runtime::start(store.clone(), harnesses(), config(&work))
        .await
        .unwrap();
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
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let store = open(dir.path());
    let mut cfg = config(&work);
    cfg.supervisor.restart_backoff_ms = 10;
    let (rt, mut events) = Runtime::start(store.clone(), harnesses(), cfg)
        .await
        .unwrap();
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
    let handle = rt
        .submit("crash".into(), RunMode::Plan(plan), None, "test".into())
        .await
        .unwrap();
    let mut killed: Option<keel_actors::AttemptId> = None;
    let mut restarted = false;
    let outcome = loop {
        let event = tokio::time::timeout(Duration::from_secs(60), events.recv())
            .await
            .expect("an event")
            .expect("the channel stays open");
        match event {
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
    assert_eq!(outcome.status, RunStatus::Completed, "{}", outcome.outcome);
    let synthesis: Synthesis = serde_json::from_str(&outcome.outcome).unwrap();
    let claims: Vec<&str> = synthesis
        .findings
        .iter()
        .map(|f| f.finding.claim.as_str())
        .collect();
    assert!(claims.contains(&"restarted"), "{claims:?}");
    assert_eq!(rt.sessions_started(), 3);
    drop(handle);
    rt.shutdown().await;
}
