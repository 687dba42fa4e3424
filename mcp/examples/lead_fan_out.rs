//! A lead fan-out of N subtasks against the same fan-out as a fixed plan, on keel's runtime with the
//! in-process scripted model (keel's own agent loop), a real redb file and keel's MCP endpoint over
//! HTTP on 127.0.0.1 (docs/PERFORMANCE.md).
//!
//! ```text
//! cargo run --release -p keel-mcp --example lead_fan_out -- [SUBTASKS] [RUNS]
//! ```
//!
//! The lead's session calls `delegate` once with every subtask (the scripted model's `CALL_TOOL:`
//! rule), waits for their reports and reports itself; the plan runs the same subtask briefs as its
//! steps. Each subtask is one shell command and two model turns. Runs one at a time; prints runs/s.
#![allow(clippy::print_stdout)] // An example prints what it measures.

use keel_actors::runtime::{HarnessSet, Runtime, RuntimeConfig};
use keel_actors::{Plan, PlanStep, RunMode};
use keel_harness::HarnessKind;
use keel_harness::scripted::{Script, ScriptedHarness};
use keel_mcp::{EndpointConfig, McpEndpoint};
use keel_store::{AgentProfile, RunStatus, Store, StoreConfig};
use serde_json::json;
use std::sync::Arc;
use std::time::Instant;

fn subtask_brief(i: usize) -> String {
    format!("Part {i}. REPORT_AFTER_TOOL\nRUN_TOOL: echo part {i} done ;;")
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().map_or(Ok(16), |a| a.parse())?;
    let runs: usize = args.next().map_or(Ok(10), |a| a.parse())?;
    let dir = tempfile::tempdir()?;
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work)?;
    let store = Arc::new(Store::open_with(
        dir.path().join("keel.redb"),
        StoreConfig::default(),
    )?);
    let endpoint = Arc::new(McpEndpoint::start(EndpointConfig::default()).await?);
    let harnesses = HarnessSet::new()
        .with(
            HarnessKind::Scripted,
            Arc::new(ScriptedHarness::new(Script::rules())),
        )
        .with_session_endpoint(endpoint);
    let mut config = RuntimeConfig::default();
    config.supervisor.agents = vec![AgentProfile {
        name: "scripted".into(),
        description: "the scripted model".into(),
        harness: "scripted".into(),
        model: "keel-scripted-1".into(),
        account: "local".into(),
        tools: Vec::new(),
        system_prompt: String::new(),
        limits: Default::default(),
    }];
    config.supervisor.specialists_max = 64;
    config.supervisor.spawn_burst = 1_000;
    config.supervisor.spawn_interval_ms = 1;
    config.specialist.working_dir = work;
    let (rt, _events) = Runtime::start(store, harnesses, config).await?;

    let subtasks: Vec<_> = (0..n)
        .map(|i| json!({"id": format!("part-{i}"), "brief": subtask_brief(i), "goal": format!("part {i}")}))
        .collect();
    let lead_brief = format!(
        "Lead the parts. REPORT_AFTER_TOOL\nCALL_TOOL: mcp__keel__delegate {}",
        json!({ "subtasks": subtasks })
    );
    let plan = Plan {
        steps: (0..n)
            .map(|i| PlanStep {
                key: format!("part-{i}"),
                brief: subtask_brief(i),
                goal: format!("part {i}"),
                quality_criteria: Vec::new(),
                output_schema: None,
                assignee: None,
                depends_on: Vec::new(),
                estimate_micros: 0,
            })
            .collect(),
        constraints: Vec::new(),
    };
    for (name, lead) in [("lead", true), ("plan", false)] {
        let started = Instant::now();
        for _ in 0..runs {
            let (brief, mode) = if lead {
                (
                    lead_brief.clone(),
                    RunMode::Lead {
                        agent: Some("scripted".into()),
                        constraints: Vec::new(),
                    },
                )
            } else {
                ("fan out".to_string(), RunMode::Plan(plan.clone()))
            };
            let handle = rt.submit(brief, mode, None, "bench".into()).await?;
            let outcome = handle.finished().await?;
            if outcome.status != RunStatus::Completed {
                return Err(format!(
                    "a {name} run ended {:?}: {}",
                    outcome.status, outcome.outcome
                )
                .into());
            }
        }
        let secs = started.elapsed().as_secs_f64();
        println!(
            "{name}: {runs} runs of {n} subtasks in {secs:.2} s: {:.2} runs/s, {:.1} ms/run",
            runs as f64 / secs,
            secs * 1000.0 / runs as f64
        );
    }
    rt.shutdown().await;
    Ok(())
}
