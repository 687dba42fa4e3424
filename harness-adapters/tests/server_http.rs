//! The scripted model server over real HTTP on 127.0.0.1: each wire API, streaming and JSON,
//! recording, failure injection and a bounded shutdown.
#![cfg(feature = "io")]
// Sessions, servers and processes: the IO half of the crate.

// Test helpers panic on setup failure by design: a broken fixture must fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use keel_harness::scripted::{Script, ScriptFailure, ScriptTurn};
use keel_harness::server::{ModelServer, ModelServerConfig};
use serde_json::{Value, json};

fn client() -> reqwest::Client {
    keel_harness::messages_api::http::model_client().unwrap()
}

/// Splits an SSE body into (event name, data JSON or raw) pairs.
fn sse(body: &str) -> Vec<(String, String)> {
    body.split("\n\n")
        .filter(|b| !b.trim().is_empty())
        .map(|block| {
            let mut name = String::new();
            let mut data = String::new();
            for line in block.lines() {
                if let Some(n) = line.strip_prefix("event: ") {
                    name = n.to_owned();
                } else if let Some(d) = line.strip_prefix("data: ") {
                    data.push_str(d);
                }
            }
            (name, data)
        })
        .collect()
}

async fn start(script: Script) -> ModelServer {
    ModelServer::start(ModelServerConfig::new(script))
        .await
        .unwrap()
}

#[tokio::test]
async fn anthropic_stream_calls_the_shell_tool_and_records_the_request() {
    let server = start(Script::rules()).await;
    let body = json!({
        "model": "claude-test-1", "stream": true, "max_tokens": 100,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "/skill arg\nRUN_TOOL: echo hi > proof.txt ;;"}]}],
        "tools": [{"name": "Bash", "input_schema": {"type": "object", "properties": {"command": {"type": "string"}}}}]
    });
    let resp = client()
        .post(format!("{}/v1/messages?beta=true", server.base_url()))
        .header("x-api-key", "sk-test-0123456789abcdef")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let events = sse(&resp.text().await.unwrap());
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert!(names.contains(&"content_block_stop"));
    assert_eq!(names.last(), Some(&"message_stop"));
    let input: String = events
        .iter()
        .filter_map(|(_, d)| serde_json::from_str::<Value>(d).ok())
        .filter_map(|v| v["delta"]["partial_json"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(
        serde_json::from_str::<Value>(&input).unwrap(),
        json!({"command": "echo hi > proof.txt"})
    );
    let start: Value = serde_json::from_str(&events[0].1).unwrap();
    assert_eq!(start["message"]["model"], "claude-test-1");

    let recorded = server.requests();
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].path, "/v1/messages?beta=true");
    assert_eq!(recorded[0].route(), "/v1/messages");
    assert_eq!(recorded[0].body["model"], "claude-test-1");
    let key = recorded[0].header("x-api-key").unwrap();
    assert!(
        key.ends_with("<redacted>") && !key.contains("abcdef"),
        "{key}"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn responses_stream_completes_with_a_function_call_then_echoes_the_output() {
    let server = start(Script::rules()).await;
    let tools = json!([{"type": "function", "name": "exec_command", "parameters": {"properties": {"cmd": {"type": "string"}}}}]);
    let first = json!({"model": "gpt-test", "stream": true,
        "input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": "RUN_TOOL: ls ;;"}]}],
        "tools": tools});
    let text = client()
        .post(format!("{}/responses", server.openai_base_url()))
        .json(&first)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let events = sse(&text);
    let done: Vec<Value> = events
        .iter()
        .filter(|(n, _)| n == "response.output_item.done")
        .map(|(_, d)| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(done.len(), 1);
    assert_eq!(done[0]["item"]["type"], "function_call");
    assert_eq!(done[0]["item"]["arguments"], "{\"cmd\":\"ls\"}");
    let call_id = done[0]["item"]["call_id"].as_str().unwrap().to_owned();
    let (last, data) = events.last().unwrap();
    assert_eq!(last, "response.completed");
    let completed: Value = serde_json::from_str(data).unwrap();
    assert_eq!(completed["response"]["usage"]["input_tokens"], 10);

    let second = json!({"model": "gpt-test", "stream": true, "tools": tools, "input": [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "RUN_TOOL: ls ;;"}]},
        {"type": "function_call", "call_id": call_id, "name": "exec_command", "arguments": "{}"},
        {"type": "function_call_output", "call_id": call_id, "output": "file-a\n"}]});
    let text = client()
        .post(format!("{}/responses", server.openai_base_url()))
        .json(&second)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains(&format!("FINAL: tool {call_id} returned: file-a")),
        "{text}"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn chat_stream_has_finish_reason_and_done_and_json_mode_works() {
    let server = start(Script::from_turns(vec![ScriptTurn {
        text: Some("scripted hello".into()),
        ..Default::default()
    }]))
    .await;
    let body = json!({"model": "fake/fake-model", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let text = client()
        .post(format!("{}/chat/completions", server.openai_base_url()))
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let events = sse(&text);
    assert_eq!(events.last().unwrap().1, "[DONE]");
    assert!(text.contains("\"finish_reason\":\"stop\""));
    assert!(text.contains("scripted hello"));
    // The script is used up: the next request falls back to the rules, as plain JSON.
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let v: Value = client()
        .post(format!("{}/chat/completions", server.openai_base_url()))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(
        v["choices"][0]["message"]["content"],
        "Hello from the scripted model."
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn injected_429_carries_retry_after_and_reset_headers() {
    let server = start(Script::rules()).await;
    server.inject_failure(ScriptFailure::RateLimited {
        retry_after_secs: 7,
        reset_after_secs: Some(60),
    });
    let body =
        json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let resp = client()
        .post(format!("{}/v1/messages", server.base_url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
    assert_eq!(resp.headers()["retry-after"], "7");
    let reset = resp.headers()["anthropic-ratelimit-requests-reset"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(
        keel_harness::rfc3339::parse_to_unix_ms(&reset).is_some(),
        "{reset}"
    );
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["type"], "rate_limit_error");
    // Only one request was affected.
    let resp = client()
        .post(format!("{}/v1/messages", server.base_url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn scripted_500_and_malformed_and_missing_finish() {
    let script = Script::from_json_str(
        r#"{"turns": [
        {"failure": {"kind": "http", "status": 529}},
        {"failure": {"kind": "malformed"}},
        {"failure": {"kind": "missing_finish_reason", "text": "no reason"}}]}"#,
    )
    .unwrap();
    let server = start(script).await;
    let body =
        json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]});
    let url = format!("{}/chat/completions", server.openai_base_url());
    let resp = client().post(&url).json(&body).send().await.unwrap();
    assert_eq!(resp.status(), 529);
    let text = client()
        .post(&url)
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(text.contains("<<not json>>"));
    let text = client()
        .post(&url)
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.contains("no reason")
            && !text.contains("finish_reason\":\"")
            && !text.contains("[DONE]"),
        "{text}"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_hung_request_does_not_block_shutdown() {
    let server = start(Script::rules()).await;
    server.inject_failure(ScriptFailure::Hang { ms: Some(60_000) });
    let url = format!("{}/v1/messages", server.base_url());
    let pending = tokio::spawn(async move {
        client()
            .post(url)
            .json(&json!({"model": "m", "messages": []}))
            .send()
            .await
            .map(|r| r.status())
    });
    assert!(server.wait_for_requests(1, Duration::from_secs(5)).await);
    let t0 = Instant::now();
    server.shutdown().await.unwrap();
    assert!(t0.elapsed() < Duration::from_secs(30));
    // The client sees the connection end instead of an answer.
    let outcome = tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .unwrap()
        .unwrap();
    if let Ok(status) = outcome {
        assert_eq!(
            status, 200,
            "a hang ends with a broken body, never a normal answer status"
        );
    }
}

#[tokio::test]
async fn requests_are_written_to_the_record_dir() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = ModelServerConfig::new(Script::rules());
    config.record_dir = Some(dir.path().join("requests"));
    let server = ModelServer::start(config).await.unwrap();
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    client()
        .post(format!("{}/v1/messages", server.base_url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    server.shutdown().await.unwrap();
    let files: Vec<String> = std::fs::read_dir(dir.path().join("requests"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(files, ["001-POST-v1_messages.json"]);
}

#[tokio::test]
async fn a_failure_mode_holds_until_cleared() {
    let server = start(Script::rules()).await;
    server.set_failure_mode(Some(ScriptFailure::Http {
        status: 500,
        message: None,
    }));
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let url = format!("{}/v1/messages", server.base_url());
    for _ in 0..3 {
        assert_eq!(
            client()
                .post(&url)
                .json(&body)
                .send()
                .await
                .unwrap()
                .status(),
            500
        );
    }
    server.set_failure_mode(None);
    assert_eq!(
        client()
            .post(&url)
            .json(&body)
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(server.requests_count(), 4);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn serve_script_file_runs_until_shutdown_and_reports_bad_scripts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("script.toml");
    std::fs::write(&path, "[[turns]]\ntext = \"from the file\"\n").unwrap();
    let (addr_tx, addr_rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let serving = tokio::spawn({
        let path = path.clone();
        async move {
            keel_harness::server::serve_script_file(
                &path,
                0,
                None,
                |addr| {
                    let _ = addr_tx.send(addr);
                },
                async {
                    let _ = stop_rx.await;
                },
            )
            .await
        }
    });
    let addr = addr_rx.await.unwrap();
    assert!(addr.ip().is_loopback());
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]});
    let v: Value = client()
        .post(format!("http://{addr}/v1/messages"))
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["content"][0]["text"], "from the file");
    stop_tx.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), serving)
        .await
        .unwrap()
        .unwrap()
        .unwrap();

    std::fs::write(&path, "turns = 3").unwrap();
    let bad = keel_harness::server::serve_script_file(&path, 0, None, |_| {}, async {}).await;
    assert!(matches!(
        bad,
        Err(keel_harness::server::ServerError::Script(_))
    ));
}

#[tokio::test]
async fn each_model_name_can_follow_its_own_script() {
    let text = |t: &str| ScriptTurn {
        text: Some(t.into()),
        ..Default::default()
    };
    let config = ModelServerConfig::new(Script::from_turns(vec![text("main-1"), text("main-2")]))
        .with_model_script("title-model", Script::from_turns(vec![text("a title")]));
    let server = ModelServer::start(config).await.unwrap();
    let url = format!("{}/chat/completions", server.openai_base_url());
    let ask = |model: &'static str| {
        let url = url.clone();
        async move {
            let body = json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
            let v: Value = client()
                .post(url)
                .json(&body)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            v["choices"][0]["message"]["content"]
                .as_str()
                .unwrap()
                .to_owned()
        }
    };
    assert_eq!(ask("main-model").await, "main-1");
    assert_eq!(ask("title-model").await, "a title");
    assert_eq!(
        ask("main-model").await,
        "main-2",
        "the title request did not use a main turn"
    );
    server.shutdown().await.unwrap();
}
