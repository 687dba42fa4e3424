//! `keel bench --hook-calls N`: the round trip of the `keel hook` bridge, measured on the real path.
//!
//! A runtime on a fresh store in a temporary folder hosts one run of one step whose session asks
//! its pre-tool gate N times in a row, exactly as keel's own loop does before each tool call
//! (`keel_harness::messages_api::gate::check`): a `keel hook` process is spawned with the call on
//! stdin and the session's token, it posts the call to the node's bridge on 127.0.0.1, the node runs
//! the permission chain and makes the decision's audit row durable through the checkpoint actor
//! (a redb commit), and only then answers; the process exits 0 and the gate returns. Each round trip
//! is timed from the gate's start to its answer; the policy is one deny rule that the calls do not
//! match, so every call is allowed and audited.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use keel_actors::runtime::{HarnessSet, Runtime, RuntimeConfig};

use super::bench::subtask_of;
use keel_actors::{Plan, PlanStep, RunMode};
use keel_harness::session::BoxFuture;
use keel_harness::{
    Harness, HarnessEvent, HarnessKind, RunningSession, SessionSpec, StartError, StopReason,
    session_channel,
};
use keel_store::{AgentLimits, AgentProfile, RunStatus, Store};

use crate::hook::bridge::PolicyBridge;
use crate::stdout::outln;

/// Most gate calls one measurement makes.
pub(crate) const HOOK_CALLS_MAX: u32 = 10_000;

/// A harness whose session asks its gate `calls` times, timing each, then reports.
struct GatedHarness {
    calls: u32,
    timings: Arc<Mutex<Vec<Duration>>>,
}

impl Harness for GatedHarness {
    fn kind(&self) -> HarnessKind {
        HarnessKind::Scripted
    }

    fn start(&self, spec: SessionSpec) -> BoxFuture<'_, Result<RunningSession, StartError>> {
        let (calls, timings) = (self.calls, Arc::clone(&self.timings));
        Box::pin(async move {
            let task = subtask_of(&spec)?;
            let gate = spec
                .pre_tool_gate
                .clone()
                .ok_or_else(|| StartError::InvalidSpec("the session has no gate".into()))?;
            let (sink, _cancel, session) = session_channel(HarnessKind::Scripted);
            tokio::spawn(async move {
                sink.send(HarnessEvent::Started {
                    native_session_id: None,
                    model: None,
                })
                .await;
                let input = serde_json::json!({"command": "echo bench"});
                let mut denied = None;
                for i in 0..calls {
                    #[allow(clippy::disallowed_methods)] // A benchmark reads the clock.
                    let t0 = Instant::now();
                    let answer = keel_harness::messages_api::gate::check(
                        &gate,
                        &spec.env,
                        &spec.working_dir,
                        &format!("call-{i}"),
                        "Bash",
                        &input,
                    )
                    .await;
                    let took = t0.elapsed();
                    if let Err(e) = answer {
                        denied = Some(e.message);
                        break;
                    }
                    timings
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(took);
                }
                let final_text = match denied {
                    Some(why) => format!("the gate denied a call: {why}"),
                    None => format!(
                        "{{\"subtask_id\":\"{task}\",\"status\":\"complete\",\"findings\":[{{\"claim\":\"{calls} calls allowed\",\"source\":\"bench\",\"confidence_permille\":900}}],\"gaps\":[],\"summary\":\"done\"}}"
                    ),
                };
                sink.send(HarnessEvent::Finished {
                    stop_reason: StopReason::EndTurn,
                    final_text,
                })
                .await;
            });
            Ok(session)
        })
    }
}

fn config(work: &std::path::Path) -> RuntimeConfig {
    let mut c = RuntimeConfig::default();
    c.supervisor.agents = vec![AgentProfile {
        name: "gated".into(),
        description: "asks its gate".into(),
        harness: HarnessKind::Scripted.as_str().into(),
        model: "gated".into(),
        account: "bench".into(),
        tools: Vec::new(),
        system_prompt: String::new(),
        limits: AgentLimits::default(),
    }];
    c.specialist.working_dir = work.to_path_buf();
    c
}

/// One run whose session makes `calls` gate calls; their round trips in order.
async fn measure(calls: u32) -> anyhow::Result<Vec<Duration>> {
    let dir = tempfile::tempdir().context("creating a temporary folder")?;
    // Opened as `keel run` and `keel node` open the home's store (two fsyncs a commit).
    let store = Arc::new(Store::open_with(
        dir.path().join("bench.redb"),
        super::writer_config(super::SHARED),
    )?);
    let policy: keel_policy::PolicyConfig =
        toml::from_str("[permissions]\ndeny = [\"Bash(rm *)\"]\n")?;
    let exe = std::env::current_exe().context("locating the keel executable")?;
    let bridge =
        PolicyBridge::start(keel_actors::runtime::PolicyHost::new(policy.build()?), &exe).await?;
    let timings = Arc::new(Mutex::new(Vec::new()));
    let harness = GatedHarness {
        calls,
        timings: Arc::clone(&timings),
    };
    let harnesses = HarnessSet::new()
        .with(HarnessKind::Scripted, Arc::new(harness))
        .with_service(bridge.service());
    let (rt, events) = Runtime::start(store, harnesses, config(dir.path())).await?;
    drop(events);
    bridge.attach(rt.audit_writer(), rt.approval_desk());
    let plan = Plan {
        steps: vec![PlanStep {
            key: "gated".into(),
            brief: "Ask the gate.".into(),
            goal: "ask the gate".into(),
            quality_criteria: Vec::new(),
            output_schema: None,
            assignee: None,
            depends_on: Vec::new(),
            estimate_micros: 0,
        }],
        constraints: Vec::new(),
    };
    let handle = rt
        .submit("bench".into(), RunMode::Plan(plan), None, String::new())
        .await?;
    let status = handle.finished().await?.status;
    rt.shutdown().await;
    if status != RunStatus::Completed {
        return Err(anyhow!("the bench run ended {status:?}"));
    }
    let timings = std::mem::take(&mut *timings.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(timings)
}

fn percentile(sorted: &[Duration], p: usize) -> Duration {
    let i = (sorted.len().saturating_sub(1) * p) / 100;
    sorted.get(i).copied().unwrap_or_default()
}

/// `keel bench --hook-calls N`: print the gate's round trip through the bridge (median, p90, p99,
/// mean) over `calls` calls, after a warm-up of a few.
pub(crate) fn bench_hook(calls: u32, json: bool) -> anyhow::Result<()> {
    if calls == 0 || calls > HOOK_CALLS_MAX {
        return Err(anyhow!("hook calls must be 1..={HOOK_CALLS_MAX}"));
    }
    let rt = super::tokio_runtime()?;
    let mut timings = rt.block_on(async {
        measure(3).await?; // warm-up, not counted
        measure(calls).await
    })?;
    timings.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    #[allow(clippy::cast_precision_loss)] // A count of calls far below 2^52.
    let mean = timings.iter().map(|d| ms(*d)).sum::<f64>() / timings.len().max(1) as f64;
    let (p50, p90, p99) = (
        ms(percentile(&timings, 50)),
        ms(percentile(&timings, 90)),
        ms(percentile(&timings, 99)),
    );
    if json {
        outln!(
            "{}",
            serde_json::json!({"calls": timings.len(), "p50_ms": p50, "p90_ms": p90, "p99_ms": p99, "mean_ms": mean})
        )?;
    } else {
        outln!(
            "keel hook round trip over {} calls: p50 {p50:.2} ms, p90 {p90:.2} ms, p99 {p99:.2} ms, mean {mean:.2} ms",
            timings.len()
        )?;
    }
    Ok(())
}
