//! Real request bodies captured from the four CLIs (scrubbed copies under `tests/wire_fixtures/`)
//! reduced by the scripted model: the rules must pick each CLI's own shell tool with the argument
//! shape its schema asks for, call custom and namespaced tools, and echo tool results with the
//! CLI's call id, on all three wire APIs. Each body is also replayed over HTTP.
#![cfg(feature = "io")]
// Sessions, servers and processes: the IO half of the crate.

// Test helpers panic on setup failure by design: a broken fixture must fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use keel_harness::scripted::{ModelReply, ModelRequest, Script, ScriptedModel, WireApi};
use keel_harness::server::{ModelServer, ModelServerConfig};
use serde_json::{Value, json};

fn fixture(name: &str) -> (String, Value) {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/wire_fixtures")
        .join(name);
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    (v["path"].as_str().unwrap().to_owned(), v["body"].clone())
}

fn wire_of(path: &str) -> WireApi {
    let route = path.split('?').next().unwrap();
    if route.ends_with("/messages") {
        WireApi::AnthropicMessages
    } else if route.ends_with("/responses") {
        WireApi::OpenAiResponses
    } else {
        WireApi::OpenAiChat
    }
}

enum Expect {
    Call {
        name: &'static str,
        input: Value,
        namespace: Option<&'static str>,
        custom: bool,
    },
    Final(&'static str),
}

fn check(name: &str, expect: Expect) {
    let (path, body) = fixture(name);
    let request = ModelRequest::from_body(wire_of(&path), &body);
    let ModelReply::Answer(answer) = ScriptedModel::new(Script::rules()).respond(&request) else {
        panic!("{name}: not an answer")
    };
    match expect {
        Expect::Call {
            name: tool,
            input,
            namespace,
            custom,
        } => {
            assert_eq!(answer.tool_calls.len(), 1, "{name}");
            let call = &answer.tool_calls[0];
            assert_eq!(call.name, tool, "{name}");
            assert_eq!(call.input, input, "{name}");
            assert_eq!(call.namespace.as_deref(), namespace, "{name}");
            assert_eq!(call.custom, custom, "{name}");
            assert_eq!(answer.stop_reason.as_deref(), Some("tool_use"), "{name}");
        }
        Expect::Final(text) => {
            assert!(answer.tool_calls.is_empty(), "{name}");
            assert_eq!(answer.text, text, "{name}");
            assert_eq!(answer.stop_reason.as_deref(), Some("end_turn"), "{name}");
        }
    }
}

const CMD: &str = "echo tool-ran > proof.txt && cat proof.txt";

#[test]
fn claude_code_requests() {
    check(
        "claude.tool-bash.request-1.json",
        Expect::Call {
            name: "Bash",
            input: json!({"command": CMD, "description": "run scripted command"}),
            namespace: None,
            custom: false,
        },
    );
    check(
        "claude.tool-bash.request-2-with-tool_result.json",
        Expect::Final("FINAL: tool toolu_fake_001 returned: tool-ran"),
    );
}

#[test]
fn codex_requests() {
    check(
        "codex.tool-exec_command.request-1.json",
        Expect::Call {
            name: "exec_command",
            input: json!({"cmd": CMD}),
            namespace: None,
            custom: false,
        },
    );
    check(
        "codex.tool-apply_patch.request-1-known-model-gpt-5.5.json",
        Expect::Call {
            name: "apply_patch",
            input: json!({"input": "*** Begin Patch\n*** Add File: hello.txt\n+hello from apply_patch\n*** End Patch\n"}),
            namespace: None,
            custom: true,
        },
    );
    check(
        "codex.mcp-tool.request-1.json",
        Expect::Call {
            name: "echo_tool",
            input: json!({"text": "hi mcp"}),
            namespace: Some("mcp__echo"),
            custom: false,
        },
    );
}

#[test]
fn opencode_and_pi_requests() {
    check(
        "opencode.tool-bash.request-2.json",
        Expect::Call {
            name: "bash",
            input: json!({"command": CMD}),
            namespace: None,
            custom: false,
        },
    );
    check(
        "pi.tool-bash.request-1.json",
        Expect::Call {
            name: "bash",
            input: json!({"command": CMD}),
            namespace: None,
            custom: false,
        },
    );
    check(
        "pi.api-anthropic-messages.request-2.json",
        Expect::Final("FINAL: tool toolu_fake_001 returned: tool-ran\n"),
    );
    check(
        "pi.api-openai-responses.request-2.json",
        Expect::Final("FINAL: tool call_fake_001 returned: tool-ran\n"),
    );
}

#[tokio::test]
async fn every_fixture_replays_over_http() {
    let server = ModelServer::start(ModelServerConfig::new(Script::rules()))
        .await
        .unwrap();
    let client = keel_harness::messages_api::http::model_client().unwrap();
    let names = [
        "claude.tool-bash.request-1.json",
        "codex.tool-apply_patch.request-1-known-model-gpt-5.5.json",
        "codex.mcp-tool.request-1.json",
        "opencode.tool-bash.request-2.json",
        "pi.api-openai-responses.request-2.json",
    ];
    for name in names {
        let (path, body) = fixture(name);
        let resp = client
            .post(format!("{}{path}", server.base_url()))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{name}");
        assert_eq!(
            resp.headers()["content-type"],
            "text/event-stream",
            "{name}"
        );
        let text = resp.text().await.unwrap();
        let finish = match wire_of(&path) {
            WireApi::AnthropicMessages => "event: message_stop",
            WireApi::OpenAiResponses => "event: response.completed",
            WireApi::OpenAiChat => "data: [DONE]",
        };
        assert!(text.contains(finish), "{name}: {text}");
    }
    assert_eq!(server.requests().len(), names.len());
    assert_eq!(
        server.requests()[2].body["model"],
        fixture(names[2]).1["model"]
    );
    server.shutdown().await.unwrap();
}

#[test]
fn the_prompt_line_skips_injected_context_blocks() {
    for (name, first) in [
        (
            "claude.tool-bash.request-1.json",
            "RUN_TOOL: echo tool-ran > proof.txt && cat proof.txt",
        ),
        (
            "codex.tool-exec_command.request-1.json",
            "RUN_TOOL: echo tool-ran > proof.txt && cat proof.txt",
        ),
        (
            "opencode.tool-bash.request-2.json",
            "RUN_TOOL: echo tool-ran > proof.txt && cat proof.txt",
        ),
        (
            "pi.tool-bash.request-1.json",
            "RUN_TOOL: echo tool-ran > proof.txt && cat proof.txt",
        ),
    ] {
        let (path, body) = fixture(name);
        assert_eq!(
            ModelRequest::from_body(wire_of(&path), &body).first_user_line,
            first,
            "{name}"
        );
    }
}
