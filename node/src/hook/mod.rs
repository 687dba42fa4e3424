//! The hook bridge (docs/DESIGN.md §9): `keel hook`, the command every session's pre-tool gate runs
//! (a Claude Code command hook, a Codex hook, the opencode plugin, the pi extension, keel's own loop),
//! and the node's endpoint it asks ([`bridge`]). The command decides nothing: it forwards the CLI's
//! payload with the session's token and turns the node's answer into the gate's exit code (0 allows,
//! 2 denies with the reason on stderr). Anything that goes wrong denies. With `--post-for HARNESS` it
//! is that CLI's `PostToolUse` hook: it hands the node the call's result (a success meets a
//! prerequisite or issues a token; `PostToolUse` hooks may rewrite or withhold it) and prints the
//! CLI's answer for a changed result (keel_harness::cli::post_tool); anything that goes wrong
//! withholds the result. With `--event-for HARNESS` it is that CLI's session-event hook
//! (`PreCompact`): the node runs the event's hooks and the command answers the CLI's way (a veto
//! blocks the compaction, a note goes into its instructions; keel_harness::cli::session_event);
//! anything that goes wrong vetoes. With `--report-for` it is a CLI's Stop hook instead ([`stop`]:
//! the report check, run in the hook's own process).

pub(crate) mod bridge;
pub(crate) mod stop;

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use keel_harness::cli::{post_tool, session_event};
use keel_harness::{HarnessKind, ToolOutput};
use keel_policy::{Decision, HookEvent};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The environment variable holding a session's hook token (set by the bridge for each session; the
/// token is never written to a spec that is persisted).
pub(crate) const HOOK_TOKEN_ENV: &str = "KEEL_HOOK_TOKEN";
/// The endpoint's path.
pub(crate) const HOOK_PATH: &str = "/v1/hook";
/// The largest payload forwarded: a tool input is bounded by the model's output.
pub(crate) const PAYLOAD_BYTES_MAX: usize = 1024 * 1024;
/// The largest `PostToolUse` payload: it carries the tool's result twice (the CLI's own and as
/// text). A larger one is withheld (fail closed).
pub(crate) const POST_PAYLOAD_BYTES_MAX: usize = 16 * 1024 * 1024;
/// How long `keel hook` waits for the node at most (an `ask` may wait a day for a human); the gate
/// wrapper's own timeout, which counts the policy's ask timeout, is shorter and wins.
const ANSWER_WAIT_MS_MAX: u64 = 25 * 60 * 60 * 1000;
/// The gate contract's exit codes.
const EXIT_ALLOW: u8 = 0;
const EXIT_DENY: u8 = 2;

/// The node's answer to one hook call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HookAnswer {
    /// Allow or deny (an ask is resolved in the node before it answers).
    pub(crate) decision: Decision,
    /// Why; what the model is told on a denial.
    pub(crate) reason: String,
    /// For a `PostToolUse` call: the result the model is to see (the policy's hooks may have
    /// rewritten or withheld it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) output: Option<ToolOutput>,
    /// For a session event that goes on: the hooks' notes, to carry into it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) context: Option<String>,
}

/// `keel hook --url URL`: forward stdin to the node and exit 0 (allow) or 2 (deny, reason on
/// stderr).
pub(crate) fn run(url: &str) -> ExitCode {
    match ask_node(url) {
        Ok(HookAnswer {
            decision: Decision::Allow,
            ..
        }) => ExitCode::from(EXIT_ALLOW),
        Ok(HookAnswer { reason, .. }) => deny(&reason),
        Err(e) => deny(&format!("keel hook failed, so the call is denied: {e:#}")),
    }
}

fn deny(reason: &str) -> ExitCode {
    eprintln!("{reason}");
    ExitCode::from(EXIT_DENY)
}

fn ask_node(url: &str) -> anyhow::Result<HookAnswer> {
    let payload = read_stdin(PAYLOAD_BYTES_MAX)?;
    post_to_node(url, &payload)
}

/// stdin, at most `max` bytes.
fn read_stdin(max: usize) -> anyhow::Result<Vec<u8>> {
    let mut payload = Vec::new();
    std::io::stdin()
        .take(max as u64 + 1)
        .read_to_end(&mut payload)?;
    if payload.len() > max {
        anyhow::bail!("the hook payload is over {max} bytes");
    }
    Ok(payload)
}

/// `keel hook --url URL --post-for HARNESS`: hand the node the result in the CLI's `PostToolUse`
/// payload on stdin and print the CLI's answer when the result the model sees changed. Always
/// exits 0: the answer is on stdout, and anything that goes wrong prints the answer that withholds
/// the result ([`post_tool::failed_closed_answer`]).
pub(crate) fn run_post(url: &str, harness: HarnessKind) -> ExitCode {
    match post_answer(url, harness) {
        Ok(Some(answer)) => println!("{answer}"),
        Ok(None) => {}
        Err(e) => {
            eprintln!("keel hook: {e:#}");
            println!("{}", post_tool::failed_closed_answer(harness));
        }
    }
    ExitCode::SUCCESS
}

fn post_answer(url: &str, harness: HarnessKind) -> anyhow::Result<Option<String>> {
    let bytes = read_stdin(POST_PAYLOAD_BYTES_MAX)?;
    let mut payload: Value = serde_json::from_slice(&bytes)?;
    if payload.get("hook_event_name").and_then(Value::as_str) == Some(post_tool::BATCH_EVENT) {
        // Claude Code's batch end: the node says whether a failed call's changed result stops the
        // session (a refusal or no answer stops it: the caller prints the fail-closed stop).
        let answer = post_to_node(url, &bytes)?;
        return Ok(match answer.decision {
            Decision::Allow => None,
            _ => Some(post_tool::batch_stop_answer(&answer.reason)),
        });
    }
    let original = post_tool::tool_output_for(harness, &payload)
        .ok_or_else(|| anyhow::anyhow!("the PostToolUse payload holds no tool result"))?;
    // Claude Code's PostToolUseFailure: the same policy, whose changed result stops the session.
    let failure = post_tool::is_failure(&payload);
    let obj = payload
        .as_object_mut()
        .ok_or_else(|| anyhow::anyhow!("the PostToolUse payload is not a JSON object"))?;
    // The node reads the result as text; the CLI's own payload goes along for the hooks.
    obj.insert(
        post_tool::TOOL_OUTPUT_KEY.into(),
        serde_json::to_value(&original)?,
    );
    obj.insert("hook_event_name".into(), "PostToolUse".into());
    if failure {
        obj.insert(post_tool::FAILURE_KEY.into(), true.into());
    }
    let answer = post_to_node(url, &serde_json::to_vec(&payload)?)?;
    let output = answer.output.ok_or_else(|| {
        anyhow::anyhow!("the node did not hand back the result: {}", answer.reason)
    })?;
    if failure {
        return Ok(post_tool::failure_answer(&original, &output));
    }
    Ok(post_tool::answer_for(harness, &payload, &original, &output))
}

/// `keel hook --url URL --event-for HARNESS`: hand the node the session event in the CLI's payload
/// on stdin (`PreCompact`) and answer the CLI's way ([`session_event::reply_for`]). Anything that
/// goes wrong vetoes the event (fail closed: keel could not record a decision).
pub(crate) fn run_event(url: &str, harness: HarnessKind) -> ExitCode {
    let (veto, note) = match event_answer(url, harness) {
        Ok(HookAnswer {
            decision: Decision::Allow,
            context,
            ..
        }) => (None, context),
        Ok(HookAnswer { reason, .. }) => (Some(reason), None),
        Err(e) => (
            Some(format!(
                "keel hook failed, so the session event is refused: {e:#}"
            )),
            None,
        ),
    };
    let reply = session_event::reply_for(harness, veto.as_deref(), note.as_deref());
    if let Some(out) = &reply.stdout {
        println!("{out}");
    }
    if let Some(err) = &reply.stderr {
        eprintln!("{err}");
    }
    ExitCode::from(reply.exit_code)
}

fn event_answer(url: &str, harness: HarnessKind) -> anyhow::Result<HookAnswer> {
    let bytes = read_stdin(PAYLOAD_BYTES_MAX)?;
    let mut payload: Value = serde_json::from_slice(&bytes)?;
    let event = payload
        .get("hook_event_name")
        .and_then(Value::as_str)
        .unwrap_or_default();
    if event != HookEvent::PreCompact.as_str() {
        anyhow::bail!("keel bridges no session event {event:?} (only PreCompact)");
    }
    let obj = payload
        .as_object_mut()
        .ok_or_else(|| anyhow::anyhow!("the hook payload is not a JSON object"))?;
    obj.insert("harness".into(), harness.as_str().into());
    post_to_node(url, &serde_json::to_vec(&payload)?)
}

/// One request to the node's hook endpoint with the session's token; its answer.
fn post_to_node(url: &str, payload: &[u8]) -> anyhow::Result<HookAnswer> {
    let token = std::env::var(HOOK_TOKEN_ENV)
        .map_err(|_| anyhow::anyhow!("{HOOK_TOKEN_ENV} is not set: not a keel session"))?;
    let endpoint = Endpoint::parse(url)?;
    let request = request_bytes(&endpoint, &token, payload)?;
    let mut stream = std::net::TcpStream::connect(endpoint.authority)?;
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(Duration::from_millis(ANSWER_WAIT_MS_MAX)))?;
    stream.write_all(&request)?;
    let mut response = Vec::new();
    stream
        .take(RESPONSE_BYTES_MAX as u64 + 1)
        .read_to_end(&mut response)?;
    if response.len() > RESPONSE_BYTES_MAX {
        anyhow::bail!("the node's answer is over {RESPONSE_BYTES_MAX} bytes");
    }
    // A refusal (unknown token, bad payload) still carries a deny answer with its reason.
    let body = response_body(&response)?;
    Ok(serde_json::from_slice(body)?)
}

/// The largest answer read from the node: a decision and its reason, or a `PostToolUse` result.
const RESPONSE_BYTES_MAX: usize = POST_PAYLOAD_BYTES_MAX + 64 * 1024;

/// Where the node's hook endpoint is: `http://HOST:PORT/PATH` (the bridge hands out a 127.0.0.1
/// address; TLS is never needed on loopback).
#[derive(Debug, PartialEq, Eq)]
struct Endpoint<'a> {
    authority: &'a str,
    path: &'a str,
}

impl<'a> Endpoint<'a> {
    fn parse(url: &'a str) -> anyhow::Result<Endpoint<'a>> {
        let rest = url
            .strip_prefix("http://")
            .ok_or_else(|| anyhow::anyhow!("the hook endpoint {url} is not an http:// URL"))?;
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, "/"),
        };
        if authority.is_empty() || !path.bytes().all(|b| b.is_ascii_graphic()) {
            anyhow::bail!("the hook endpoint {url} is not a plain http://HOST:PORT/PATH");
        }
        Ok(Endpoint { authority, path })
    }
}

/// One HTTP/1.1 request, closed after its answer. `keel hook` runs once per tool call, so it speaks
/// the few bytes of HTTP itself rather than start an async runtime and an HTTP client with TLS,
/// which cost more than the rest of the round trip (docs/PERFORMANCE.md, the hook bridge).
fn request_bytes(endpoint: &Endpoint<'_>, token: &str, payload: &[u8]) -> anyhow::Result<Vec<u8>> {
    if token.is_empty() || !token.bytes().all(|b| b.is_ascii_graphic()) {
        anyhow::bail!("{HOOK_TOKEN_ENV} is not a token");
    }
    let mut request = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        endpoint.path,
        endpoint.authority,
        payload.len()
    )
    .into_bytes();
    request.extend_from_slice(payload);
    Ok(request)
}

/// The body of a whole HTTP/1.1 response read to its end: after the blank line, cut to its
/// `Content-Length` when given. A chunked body is refused (the bridge's answers have a length).
fn response_body(response: &[u8]) -> anyhow::Result<&[u8]> {
    let head_end = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| anyhow::anyhow!("the node's answer is not HTTP"))?;
    let head = std::str::from_utf8(&response[..head_end])?;
    let body = &response[head_end + 4..];
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap_or_default();
    if !status.starts_with("HTTP/1.") {
        anyhow::bail!("the node's answer is not HTTP/1.x: {status}");
    }
    let mut length = None;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(value.trim().parse::<usize>()?);
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            anyhow::bail!("the node's answer is {}-encoded", value.trim());
        }
    }
    match length {
        Some(n) if n <= body.len() => Ok(&body[..n]),
        Some(n) => anyhow::bail!("the node's answer ended after {} of {n} bytes", body.len()),
        None => Ok(body),
    }
}

/// `Some(URL)` when the arguments after `hook` are exactly `--url URL` (what every gate runs): the
/// command's fast path, which skips the command line parser and everything the other commands set
/// up first.
pub(crate) fn gate_url(args_after_hook: &[std::ffi::OsString]) -> Option<&str> {
    match args_after_hook {
        [flag, url] if flag == "--url" => url.to_str(),
        _ => None,
    }
}

/// `Some((URL, HARNESS))` when the arguments after `hook` are exactly `--url URL --post-for
/// HARNESS` (what every CLI's `PostToolUse` hook runs): the same fast path as [`gate_url`].
pub(crate) fn post_args(args_after_hook: &[std::ffi::OsString]) -> Option<(&str, HarnessKind)> {
    match args_after_hook {
        [flag, url, post, harness] if flag == "--url" && post == post_tool::POST_FOR_ARG => {
            Some((url.to_str()?, HarnessKind::parse(harness.to_str()?)?))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_endpoint_is_read_from_the_gate_url() {
        assert_eq!(
            Endpoint::parse("http://127.0.0.1:4100/v1/hook").unwrap_or_else(|e| panic!("{e}")),
            Endpoint {
                authority: "127.0.0.1:4100",
                path: "/v1/hook"
            }
        );
        assert!(Endpoint::parse("https://127.0.0.1:4100/v1/hook").is_err());
        assert!(Endpoint::parse("http:///v1/hook").is_err());
        assert!(Endpoint::parse("http://127.0.0.1:1/a b").is_err());
    }

    #[test]
    fn the_request_carries_the_token_and_the_payload_and_refuses_a_header_in_the_token() {
        let endpoint = Endpoint {
            authority: "127.0.0.1:9",
            path: "/v1/hook",
        };
        let bytes = request_bytes(&endpoint, "abc123", b"{}").unwrap_or_default();
        let text = String::from_utf8(bytes).unwrap_or_default();
        assert!(
            text.starts_with("POST /v1/hook HTTP/1.1\r\nHost: 127.0.0.1:9\r\n"),
            "{text}"
        );
        assert!(
            text.contains("\r\nAuthorization: Bearer abc123\r\n"),
            "{text}"
        );
        assert!(
            text.ends_with("Content-Length: 2\r\nConnection: close\r\n\r\n{}"),
            "{text}"
        );
        assert!(request_bytes(&endpoint, "abc\r\nX-Evil: 1", b"{}").is_err());
        assert!(request_bytes(&endpoint, "", b"{}").is_err());
    }

    #[test]
    fn the_answer_body_is_cut_to_its_length_and_anything_else_is_an_error() {
        let ok =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 4\r\n\r\n{}{}";
        assert_eq!(response_body(ok).ok(), Some(&b"{}{}"[..]));
        let cut = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}xx";
        assert_eq!(response_body(cut).ok(), Some(&b"{}"[..]));
        let to_eof = b"HTTP/1.1 401 Unauthorized\r\n\r\n{\"a\":1}";
        assert_eq!(response_body(to_eof).ok(), Some(&b"{\"a\":1}"[..]));
        assert!(response_body(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}").is_err());
        assert!(
            response_body(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{}").is_err()
        );
        assert!(response_body(b"SSH-2.0\r\n\r\n").is_err());
        assert!(response_body(b"HTTP/1.1 200 OK").is_err());
    }

    #[test]
    fn only_the_exact_gate_arguments_take_the_fast_path() {
        let args = |a: &[&str]| a.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        assert_eq!(gate_url(&args(&["--url", "http://x/"])), Some("http://x/"));
        assert_eq!(gate_url(&args(&["--report-for", "T"])), None);
        assert_eq!(gate_url(&args(&["--url", "http://x/", "--json"])), None);
        assert_eq!(gate_url(&args(&[])), None);
    }

    #[test]
    fn only_the_exact_post_tool_use_arguments_take_the_post_fast_path() {
        let args = |a: &[&str]| a.iter().map(std::ffi::OsString::from).collect::<Vec<_>>();
        assert_eq!(
            post_args(&args(&["--url", "http://x/", "--post-for", "codex"])),
            Some(("http://x/", HarnessKind::Codex))
        );
        assert_eq!(
            post_args(&args(&["--url", "http://x/", "--post-for", "nope"])),
            None
        );
        assert_eq!(post_args(&args(&["--url", "http://x/"])), None);
        assert_eq!(
            gate_url(&args(&["--url", "http://x/", "--post-for", "pi"])),
            None
        );
    }

    /// The whole client against a real HTTP server (axum, as the node's bridge) on 127.0.0.1.
    #[test]
    fn the_client_gets_the_decision_from_a_real_server() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("{e}"));
        let listener = rt
            .block_on(tokio::net::TcpListener::bind(("127.0.0.1", 0)))
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let app = axum::Router::new().route(
            HOOK_PATH,
            axum::routing::post(
                |headers: axum::http::HeaderMap, body: axum::body::Bytes| async move {
                    let auth = headers
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_owned();
                    let reason = format!("{auth} {}", String::from_utf8_lossy(&body));
                    serde_json::to_string(&HookAnswer {
                        decision: Decision::Deny,
                        reason,
                        output: None,
                        context: None,
                    })
                    .unwrap_or_default()
                },
            ),
        );
        let server = std::thread::spawn(move || {
            rt.block_on(async move {
                let _ = axum::serve(listener, app).await;
            })
        });
        let endpoint = format!("http://{addr}{HOOK_PATH}");
        let endpoint = Endpoint::parse(&endpoint).unwrap_or_else(|e| panic!("{e}"));
        let request = request_bytes(&endpoint, "tok", br#"{"tool_name":"Bash"}"#)
            .unwrap_or_else(|e| panic!("{e}"));
        let mut stream =
            std::net::TcpStream::connect(endpoint.authority).unwrap_or_else(|e| panic!("{e}"));
        stream.write_all(&request).unwrap_or_else(|e| panic!("{e}"));
        let mut response = Vec::new();
        stream
            .read_to_end(&mut response)
            .unwrap_or_else(|e| panic!("{e}"));
        let answer: HookAnswer =
            serde_json::from_slice(response_body(&response).unwrap_or_else(|e| panic!("{e}")))
                .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(answer.decision, Decision::Deny);
        assert_eq!(answer.reason, r#"Bearer tok {"tool_name":"Bash"}"#);
        drop(server); // the server thread ends with the test process
    }
}
