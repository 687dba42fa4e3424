//! keel-mcp's answers and error bodies pass the node's scrubber (issue 16): a credential the node
//! knows and the caller's own bearer token never come back in an MCP answer or error, over real
//! HTTP on 127.0.0.1.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use keel_actors::AttemptId;
use keel_actors::context::Scrubber;
use keel_actors::session_tool::{DeliverToolCall, SessionAnswer, SessionEndpoint, SessionRequest};
use keel_harness::tools::mcp::{McpClient, McpError};
use keel_mcp::{EndpointConfig, McpEndpoint};
use keel_store::{RunId, TaskId};
use serde_json::json;
use std::sync::Arc;

/// A credential of no built-in shape: only its registration can catch it.
const CREDENTIAL: &str = "plainword-credential-7h3k9q";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_and_error_bodies_never_carry_a_token_or_a_credential() {
    let mut scrubber = Scrubber::new();
    scrubber.register_secret(CREDENTIAL).unwrap();
    let endpoint = Arc::new(
        McpEndpoint::start(EndpointConfig {
            scrubber,
            ..EndpointConfig::default()
        })
        .await
        .unwrap(),
    );
    let a = AttemptId {
        run: RunId(0xA),
        task: TaskId(0xA1),
        attempt: 1,
    };
    // The "coordinator" echoes a progress note back in its answer, as a careless one could.
    let echo = Arc::clone(&endpoint);
    let deliver: DeliverToolCall = Box::new(move |call| {
        let answer = match call.request {
            SessionRequest::ReportProgress { note } => SessionAnswer::Recorded {
                what: format!("note {note}"),
            },
            _ => SessionAnswer::Recorded { what: "x".into() },
        };
        let (echo, call_id) = (Arc::clone(&echo), call.call_id.clone());
        tokio::spawn(async move { echo.answer(a, &call_id, answer) });
        true
    });
    let access = endpoint.open(a, deliver).unwrap();
    let token = access.token.clone();
    let http = keel_harness::messages_api::http::model_client().unwrap();
    let session = McpClient::connect(http, endpoint.url(), Some(token.clone()))
        .await
        .unwrap();

    let note = format!("my token is {token} and the key {CREDENTIAL}");
    let (text, is_error) = session
        .call_tool("report_progress", json!({ "note": note }))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    assert!(text.contains("note my token is"), "{text}");
    assert!(!text.contains(&token), "{text}");
    assert!(!text.contains(CREDENTIAL), "{text}");

    // An unknown tool's name is echoed in the error body: scrubbed too.
    for name in [CREDENTIAL.to_string(), token.clone()] {
        match session.call_tool(&name, json!({})).await {
            Err(McpError::Rpc { message, .. }) => {
                assert!(message.contains("keel has no tool"), "{message}");
                assert!(!message.contains(&token), "{message}");
                assert!(!message.contains(CREDENTIAL), "{message}");
            }
            other => panic!("an MCP error, not {other:?}"),
        }
    }
}
