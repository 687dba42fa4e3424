//! `keel demo`: a scripted scenario on this home's store, narrated as it happens. A worker is killed
//! mid-session and the supervisor restarts it through its ractor link; the node then stops gracefully
//! and a second node resumes the run from its checkpoint on another harness (the scripted model in
//! process first, then keel's messages-api loop against a scripted model server on 127.0.0.1), the
//! interrupted steps continuing with resume preambles. Every step runs a real command in a scratch
//! folder under the home.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow};
use keel_actors::RunMode;
use keel_actors::runtime::{HarnessSet, RuntimeConfig, RuntimeEvent, scripted};
use keel_harness::messages_api::{MessagesApiConfig, MessagesApiHarness};
use keel_harness::scripted::{Script, ScriptedHarness};
use keel_harness::server::{ModelServer, ModelServerConfig};
use keel_harness::{Account, Credential, HarnessKind};
use keel_store::{AgentLimits, AgentProfile, RunStatus};
use tokio::sync::mpsc;

use crate::home::Home;
use crate::stdout::outln;

/// Longest the demo waits for any one thing before it gives up.
const STEP_WAIT: Duration = Duration::from_secs(60);

fn agent(name: &str, harness: HarnessKind) -> AgentProfile {
    AgentProfile {
        name: name.into(),
        description: format!("demo agent on {harness}"),
        harness: harness.as_str().into(),
        model: "keel-scripted-1".into(),
        account: "demo".into(),
        tools: Vec::new(),
        system_prompt: String::new(),
        limits: AgentLimits::default(),
    }
}

fn say(line: &str) -> std::io::Result<()> {
    outln!("demo: {line}")
}

async fn next(events: &mut mpsc::Receiver<RuntimeEvent>) -> anyhow::Result<RuntimeEvent> {
    tokio::time::timeout(STEP_WAIT, events.recv())
        .await
        .map_err(|_| anyhow!("nothing happened for {STEP_WAIT:?}"))?
        .ok_or_else(|| anyhow!("the runtime stopped"))
}

/// `keel demo`.
pub(crate) fn demo(home: &Home) -> anyhow::Result<()> {
    let rt = super::tokio_runtime()?;
    rt.block_on(async {
        let store = super::open_writer(home)?;
        let scratch = home.dir().join("demo");
        crate::private::create_dir(&scratch)
            .with_context(|| format!("creating {}", scratch.display()))?;
        let scratch = scratch.canonicalize()?;
        let marker = scratch.join("crashed-once");
        let _ = std::fs::remove_file(&marker);
        let plan = scripted::fan_out_plan(4, |i| match i {
            0 => "echo the quick part is done".to_string(),
            1 => format!(
                "if [ -e {m} ]; then echo restarted after a crash; else touch {m}; sleep 30; fi",
                m = marker.display()
            ),
            _ => format!("sleep 2; echo slow part {i} finished"),
        })
        .map_err(|e| anyhow!("demo plan: {e}"))?;
        let mut config = RuntimeConfig::default();
        config.specialist.working_dir = scratch.clone();
        config.supervisor.restart_backoff_ms = 200;
        config.stop_grace_ms = 2_000;

        say("node A starts with agent `alpha` on the in-process scripted harness")?;
        let mut first = config.clone();
        first.supervisor.agents = vec![agent("alpha", HarnessKind::Scripted)];
        let harnesses_a = HarnessSet::new().with(
            HarnessKind::Scripted,
            Arc::new(ScriptedHarness::new(Script::rules())),
        );
        let (node_a, mut events) =
            keel_actors::runtime::Runtime::start(Arc::clone(&store), harnesses_a, first).await?;
        let handle = node_a
            .submit(
                "keel demo: crash, checkpoint, harness switch".into(),
                RunMode::Plan(plan),
                None,
                "keel demo".into(),
            )
            .await?;
        let run = handle.id();
        say(&format!("run {run} accepted: 4 steps, dispatched in parallel"))?;
        let mut killed = false;
        let mut reports = 0;
        while reports < 2 {
            match next(&mut events).await? {
                RuntimeEvent::TaskStarted {
                    attempt,
                    step,
                    agent,
                    harness,
                    ..
                } => {
                    say(&format!(
                        "{step}: attempt {} started as {agent} on {harness}",
                        attempt.attempt
                    ))?;
                    if step == "part-001" && !killed {
                        tokio::time::timeout(STEP_WAIT, async {
                            while !marker.exists() {
                                tokio::time::sleep(Duration::from_millis(20)).await;
                            }
                        })
                        .await
                        .map_err(|_| anyhow!("part-001 never started its command"))?;
                        say("part-001: killing its worker mid-session (SIGKILL of the actor)")?;
                        node_a.kill_attempt(attempt);
                        killed = true;
                        say("part-001: the supervisor sees the link break and restarts the step")?;
                    }
                }
                RuntimeEvent::TaskFailed { step, kind, .. } => {
                    say(&format!("{step}: failed ({kind}); the supervisor decides"))?;
                }
                RuntimeEvent::Report { step, report, .. } => {
                    reports += 1;
                    let claim = report.findings.first().map_or("", |f| f.claim.as_str());
                    say(&format!("{step}: report durable and acknowledged: {claim}"))?;
                }
                _ => {}
            }
        }
        say("node A stops gracefully: sessions cancelled, partial logs checkpointed, open tasks paused")?;
        let paused = node_a.pause(Duration::from_secs(10)).await;
        say(&format!(
            "checkpoint written: {} tasks paused",
            paused.tasks_paused
        ))?;
        drop(handle);
        node_a.shutdown().await;

        say("node B starts with agent `beta` on messages-api against a scripted model server on 127.0.0.1")?;
        let server = ModelServer::start(ModelServerConfig::new(Script::rules())).await?;
        let mut second = config;
        second.supervisor.agents = vec![agent("beta", HarnessKind::MessagesApi)];
        let harnesses_b = HarnessSet::new()
            .with(
                HarnessKind::MessagesApi,
                Arc::new(MessagesApiHarness::new(MessagesApiConfig::default())?),
            )
            .with_account(Account {
                id: "demo".into(),
                base_url: Some(server.base_url()),
                credential: Credential::None,
            });
        let (node_b, mut events) =
            keel_actors::runtime::Runtime::start(Arc::clone(&store), harnesses_b, second).await?;
        let handle = node_b.resume(run).await?;
        say("recovered from the checkpoint: acknowledged steps are kept, the rest run again")?;
        let outcome = loop {
            match next(&mut events).await? {
                RuntimeEvent::TaskStarted {
                    attempt,
                    step,
                    agent,
                    harness,
                    ..
                } => say(&format!(
                    "{step}: attempt {} started as {agent} on {harness}, with a resume preamble",
                    attempt.attempt
                ))?,
                RuntimeEvent::Report { step, report, .. } => {
                    let claim = report.findings.first().map_or("", |f| f.claim.as_str());
                    say(&format!("{step}: report durable and acknowledged: {claim}"))?;
                }
                RuntimeEvent::Finished(o) => break o,
                _ => {}
            }
        };
        drop(handle);
        say(&format!("run {run} finished: {:?}", outcome.status))?;
        say(&format!(
            "explore it: keel tree {run}   keel logs TASK   keel status {run}"
        ))?;
        node_b.shutdown().await;
        let _ = server.shutdown().await;
        if outcome.status == RunStatus::Completed {
            Ok(())
        } else {
            Err(anyhow!("the demo run ended {:?}", outcome.status))
        }
    })
}
