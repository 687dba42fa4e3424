//! keel's loop calling tools of an MCP endpoint (streamable HTTP) on 127.0.0.1: initialize with a
//! session id, paginated tools/list, tools/call answered as JSON and as SSE, tool errors as
//! structured results, and a typed start error when the endpoint is down.
#![cfg(feature = "io")]
// Sessions, servers and processes: the IO half of the crate.

// Test helpers panic on setup failure by design: a broken fixture must fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::Response;
use keel_harness::messages_api::agent::LoopConfig;
use keel_harness::messages_api::{MessagesApiConfig, MessagesApiHarness};
use keel_harness::scripted::Script;
use keel_harness::server::{ModelServer, ModelServerConfig};
use keel_harness::{Harness, HarnessEvent, McpEndpoint, SessionSpec, StartError, StopReason};
use serde_json::{Value, json};

type Seen = Arc<Mutex<Vec<(String, Option<String>, Option<String>)>>>;

fn json_response(v: Value) -> Response {
    let mut r = Response::new(Body::from(v.to_string()));
    r.headers_mut()
        .insert("content-type", HeaderValue::from_static("application/json"));
    r
}

async fn mcp(State(seen): State<Seen>, request: Request) -> Response {
    let (session, auth) = {
        let header = |n: &str| {
            request
                .headers()
                .get(n)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        (header("mcp-session-id"), header("authorization"))
    };
    let body = axum::body::to_bytes(request.into_body(), 1 << 20)
        .await
        .unwrap();
    let msg: Value = serde_json::from_slice(&body).unwrap();
    let method = msg["method"].as_str().unwrap().to_owned();
    seen.lock().unwrap().push((method.clone(), session, auth));
    let id = msg["id"].clone();
    match method.as_str() {
        "initialize" => {
            let mut r = json_response(
                json!({"jsonrpc": "2.0", "id": id, "result": {"protocolVersion": "2025-06-18",
                "capabilities": {"tools": {}}, "serverInfo": {"name": "test", "version": "1"}}}),
            );
            r.headers_mut()
                .insert("mcp-session-id", HeaderValue::from_static("sess-1"));
            r
        }
        "notifications/initialized" => {
            let mut r = Response::new(Body::empty());
            *r.status_mut() = StatusCode::ACCEPTED;
            r
        }
        "tools/list" if msg["params"]["cursor"] == "p2" => {
            json_response(json!({"jsonrpc": "2.0", "id": id, "result": {"tools": [
            {"name": "fail_tool", "description": "always fails", "inputSchema": {"type": "object"}}]}}))
        }
        "tools/list" => json_response(json!({"jsonrpc": "2.0", "id": id, "result": {"tools": [
            {"name": "report_progress", "description": "record progress", "inputSchema": {"type": "object", "properties": {"note": {"type": "string"}}}}],
            "nextCursor": "p2"}})),
        "tools/call" => {
            let result = if msg["params"]["name"] == "fail_tool" {
                json!({"content": [{"type": "text", "text": "nope"}], "isError": true})
            } else {
                json!({"content": [{"type": "text", "text": format!("progress noted: {}", msg["params"]["arguments"])}]})
            };
            // Answer as an SSE stream with a notification first, as streamable HTTP allows.
            let stream = format!(
                "event: message\ndata: {}\n\nevent: message\ndata: {}\n\n",
                json!({"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}),
                json!({"jsonrpc": "2.0", "id": id, "result": result})
            );
            let mut r = Response::new(Body::from(stream));
            r.headers_mut().insert(
                "content-type",
                HeaderValue::from_static("text/event-stream"),
            );
            r
        }
        _ => json_response(
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "no such method"}}),
        ),
    }
}

async fn mcp_server() -> (String, Seen, tokio::task::JoinHandle<()>) {
    let seen: Seen = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let app = Router::new().fallback(mcp).with_state(seen.clone());
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (format!("http://{addr}/mcp"), seen, task)
}

#[tokio::test]
async fn the_loop_calls_mcp_tools_with_the_session_and_token() {
    let (url, seen, mcp_task) = mcp_server().await;
    let script = Script::from_json_str(
        r#"{"turns": [
        {"tool_calls": [{"name": "mcp__keel__report_progress", "input": {"note": "half"}},
                        {"name": "mcp__keel__fail_tool", "input": {}}]},
        {"text": "done"}]}"#,
    )
    .unwrap();
    let model = ModelServer::start(ModelServerConfig::new(script))
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut spec = SessionSpec::new("report progress", "m", dir.path());
    spec.account.base_url = Some(model.base_url());
    spec.mcp_endpoint = Some(McpEndpoint {
        server_name: "keel".into(),
        url,
        bearer_token_env: Some("KEEL_MCP_TOKEN".into()),
    });
    spec.env
        .insert("KEEL_MCP_TOKEN".into(), "mcp-secret".into());
    let harness = MessagesApiHarness::new(MessagesApiConfig {
        loop_config: LoopConfig::default(),
        ..MessagesApiConfig::default()
    })
    .unwrap();
    let events = harness
        .start(spec)
        .await
        .unwrap()
        .collect(Duration::from_secs(30))
        .await;
    assert!(
        matches!(
            events.last(),
            Some(HarnessEvent::Finished {
                stop_reason: StopReason::EndTurn,
                ..
            })
        ),
        "{events:?}"
    );
    let results: Vec<(bool, String)> = events
        .iter()
        .filter_map(|e| {
            if let HarnessEvent::ToolResult {
                is_error, content, ..
            } = e
            {
                Some((*is_error, content.text.clone()))
            } else {
                None
            }
        })
        .collect();
    assert_eq!(
        results[0],
        (false, "progress noted: {\"note\":\"half\"}".to_owned())
    );
    assert!(results[1].0);
    let payload: Value = serde_json::from_str(&results[1].1).unwrap();
    assert_eq!(payload["message"], "nope");
    assert_eq!(payload["error_category"], "business_rule");

    let offered: Vec<String> = model.requests()[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        offered.contains(&"mcp__keel__report_progress".to_owned())
            && offered.contains(&"mcp__keel__fail_tool".to_owned()),
        "{offered:?}"
    );
    let seen = seen.lock().unwrap().clone();
    let methods: Vec<&str> = seen.iter().map(|(m, _, _)| m.as_str()).collect();
    assert_eq!(
        methods,
        [
            "initialize",
            "notifications/initialized",
            "tools/list",
            "tools/list",
            "tools/call",
            "tools/call"
        ]
    );
    assert_eq!(seen[0].1, None);
    assert!(seen[1..].iter().all(
        |(_, s, a)| s.as_deref() == Some("sess-1") && a.as_deref() == Some("Bearer mcp-secret")
    ));
    model.shutdown().await.unwrap();
    mcp_task.abort();
}

#[tokio::test]
async fn an_unreachable_endpoint_refuses_the_start() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let dir = tempfile::tempdir().unwrap();
    let mut spec = SessionSpec::new("hi", "m", dir.path());
    spec.account.base_url = Some("http://127.0.0.1:9".into());
    spec.mcp_endpoint = Some(McpEndpoint {
        server_name: "keel".into(),
        url: format!("http://{addr}/mcp"),
        bearer_token_env: None,
    });
    let harness = MessagesApiHarness::new(MessagesApiConfig::default()).unwrap();
    assert!(
        matches!(harness.start(spec).await, Err(StartError::Unavailable(m)) if m.contains("MCP endpoint"))
    );
}
