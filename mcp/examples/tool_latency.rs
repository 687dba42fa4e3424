//! Latency of one MCP tool call through keel's endpoint: keel's own MCP client (the one keel's agent
//! loop uses) calls `report_progress` over HTTP on 127.0.0.1; the endpoint checks the token and the
//! arguments, mints a call id, delivers the call and waits for its answer, which a task standing in
//! for the specialist hands back at once. So it measures the endpoint's whole HTTP and MCP path, not
//! the coordinator's hop or the store commit a real `report_progress` waits for (see
//! docs/PERFORMANCE.md for that figure's source).
//!
//! `cargo run --release -p keel-mcp --example tool_latency [CALLS]`
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::print_stdout)]

use keel_actors::AttemptId;
use keel_actors::session_tool::{DeliverToolCall, SessionAnswer, SessionEndpoint};
use keel_harness::tools::mcp::McpClient;
use keel_mcp::{EndpointConfig, McpEndpoint};
use keel_store::{RunId, TaskId};
use std::sync::Arc;
use std::time::Instant;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let calls: usize = std::env::args()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or(2_000);
    let endpoint = Arc::new(McpEndpoint::start(EndpointConfig::default()).await.unwrap());
    let attempt = AttemptId {
        run: RunId(1),
        task: TaskId(2),
        attempt: 1,
    };
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let deliver: DeliverToolCall = Box::new(move |call| tx.send(call).is_ok());
    let access = endpoint.open(attempt, deliver).unwrap();
    let answering = Arc::clone(&endpoint);
    tokio::spawn(async move {
        while let Some(call) = rx.recv().await {
            let answer = SessionAnswer::Recorded {
                what: "progress note".into(),
            };
            answering.answer(attempt, &call.call_id, answer);
        }
    });
    let http = keel_harness::messages_api::http::model_client().unwrap();
    let client = McpClient::connect(http, endpoint.url(), Some(access.token))
        .await
        .unwrap();
    let args = serde_json::json!({"note": "half way"});
    for _ in 0..100 {
        client
            .call_tool("report_progress", args.clone())
            .await
            .unwrap();
    }
    let mut micros = Vec::with_capacity(calls);
    for _ in 0..calls {
        let t = Instant::now();
        let (_, is_error) = client
            .call_tool("report_progress", args.clone())
            .await
            .unwrap();
        micros.push(t.elapsed().as_micros());
        assert!(!is_error);
    }
    micros.sort_unstable();
    let at = |q: f64| micros[((micros.len() as f64 - 1.0) * q).round() as usize];
    println!(
        "{calls} calls: median {} us, p99 {} us, max {} us",
        at(0.5),
        at(0.99),
        micros[micros.len() - 1]
    );
}
