//! keel's own cost per model turn in the agent loop, with the model answering in process (so the
//! number is the loop's bookkeeping alone: request building, usage, events, pairing, one trivial
//! tool call). Compare it with a real model turn (hundreds of milliseconds) to see the overhead.
//!
//! Run: `cargo bench -p keel-harness --bench agent_loop`.
#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use keel_harness::messages_api::agent::LoopConfig;
use keel_harness::messages_api::wire::ToolDefinition;
use keel_harness::scripted::{Script, ScriptToolCall, ScriptTurn, ScriptedHarness};
use keel_harness::session::BoxFuture;
use keel_harness::tools::{Tool, ToolContext, ToolError, ToolRegistry};
use keel_harness::{Harness, HarnessEvent, SessionSpec};
use serde_json::{Value, json};

const TURNS: u64 = 20;

/// A tool that does nothing, so the measurement is the loop, not the tool.
struct Noop;

impl Tool for Noop {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition {
            name: "noop".into(),
            description: "does nothing".into(),
            input_schema: json!({"type": "object"}),
        }
    }

    fn call<'a>(
        &'a self,
        input: Value,
        _ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move { Ok(format!("ok {input}")) })
    }
}

fn script() -> Script {
    let mut turns: Vec<ScriptTurn> = (0..TURNS - 1)
        .map(|i| ScriptTurn {
            text: Some(format!("step {i}")),
            tool_calls: vec![ScriptToolCall {
                name: Some("noop".into()),
                input: Some(json!({"i": i})),
                shell: None,
            }],
            ..ScriptTurn::default()
        })
        .collect();
    turns.push(ScriptTurn {
        text: Some("done".into()),
        ..ScriptTurn::default()
    });
    Script::from_turns(turns)
}

fn bench(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut tools = ToolRegistry::new();
    tools.register(Arc::new(Noop)).unwrap();
    let mut group = c.benchmark_group("agent_loop");
    group.throughput(Throughput::Elements(TURNS));
    group.sample_size(30);
    group.bench_function("scripted_session_20_turns", |b| {
        b.iter(|| {
            runtime.block_on(async {
                let harness = ScriptedHarness::new(script())
                    .with_tools(tools.clone())
                    .with_loop_config(LoopConfig::default());
                let mut spec = SessionSpec::new("go", "m", dir.path());
                spec.limits.turns_max = 100;
                let events = harness
                    .start(spec)
                    .await
                    .unwrap()
                    .collect(Duration::from_secs(30))
                    .await;
                assert!(matches!(events.last(), Some(HarnessEvent::Finished { .. })));
                events.len()
            })
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
