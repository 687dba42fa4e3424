//! Tools from an MCP endpoint (streamable HTTP), so keel's own loop can call the coordinator's
//! `get_task_details`, `report_progress`, `report_findings`, `delegate` and `escalate` the way the CLI
//! harnesses do through their MCP configuration (docs/DESIGN.md §10).
//!
//! A minimal client: `initialize` (+ `notifications/initialized`), `tools/list` (paginated, bounded)
//! and `tools/call`, each a JSON-RPC POST answered with JSON or an SSE stream. The session id the
//! server returns (`Mcp-Session-Id`) is sent back on every later request. Every request has a
//! timeout and a body cap. Tools appear as `mcp__<server>__<tool>`, the names Claude Code uses.

use std::sync::Arc;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::{Value, json};

use super::{Tool, ToolContext, ToolError, ToolErrorCategory, ToolRegistry};
use crate::messages_api::sse::{SseFrame, SseParser};
use crate::messages_api::wire::ToolDefinition;
use crate::session::BoxFuture;
use crate::spec::McpEndpoint;

/// The MCP protocol version keel speaks.
pub const MCP_PROTOCOL_VERSION: &str = "2025-06-18";
/// Most time one MCP request may take.
pub const MCP_REQUEST_TIMEOUT_MS: u64 = 30_000;
/// Most bytes of one MCP response.
pub const MCP_RESPONSE_BYTES_MAX: usize = 8 << 20;
/// Most `tools/list` pages read.
pub const MCP_LIST_PAGES_MAX: usize = 16;
/// Most tools taken from one endpoint.
pub const MCP_TOOLS_MAX: usize = 256;

/// Why talking to an MCP endpoint failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum McpError {
    /// The HTTP exchange failed (connect, timeout, status).
    #[error("MCP transport: {0}")]
    Transport(String),
    /// The answer is not the JSON-RPC it should be.
    #[error("MCP protocol: {0}")]
    Protocol(String),
    /// The server answered with a JSON-RPC error.
    #[error("MCP error {code}: {message}")]
    Rpc {
        /// JSON-RPC error code.
        code: i64,
        /// Its message.
        message: String,
    },
}

/// A connected MCP client.
#[derive(Debug)]
pub struct McpClient {
    http: reqwest::Client,
    url: String,
    bearer: Option<String>,
    session_id: Mutex<Option<String>>,
    next_id: AtomicU64,
}

/// One tool the endpoint offers.
#[derive(Debug, Clone, PartialEq)]
pub struct McpToolInfo {
    /// The tool's name on the server.
    pub name: String,
    /// Its description.
    pub description: String,
    /// Its JSON input schema.
    pub input_schema: Value,
}

impl McpClient {
    /// Connects: sends `initialize` and `notifications/initialized`.
    ///
    /// # Errors
    /// [`McpError`] when the endpoint is unreachable or answers wrongly.
    pub async fn connect(
        http: reqwest::Client,
        url: &str,
        bearer: Option<String>,
    ) -> Result<McpClient, McpError> {
        let client = McpClient {
            http,
            url: url.to_owned(),
            bearer,
            session_id: Mutex::new(None),
            next_id: AtomicU64::new(1),
        };
        let result = client
            .rpc("initialize", json!({"protocolVersion": MCP_PROTOCOL_VERSION, "capabilities": {},
                                      "clientInfo": {"name": "keel", "version": env!("CARGO_PKG_VERSION")}}))
            .await?;
        if result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .is_none()
        {
            return Err(McpError::Protocol(
                "initialize result has no protocolVersion".into(),
            ));
        }
        client.notify("notifications/initialized").await?;
        Ok(client)
    }

    /// Lists the endpoint's tools (all pages, bounded).
    ///
    /// # Errors
    /// [`McpError`].
    pub async fn list_tools(&self) -> Result<Vec<McpToolInfo>, McpError> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MCP_LIST_PAGES_MAX {
            let params = match &cursor {
                Some(c) => json!({"cursor": c}),
                None => json!({}),
            };
            let result = self.rpc("tools/list", params).await?;
            let page = result
                .get("tools")
                .and_then(Value::as_array)
                .ok_or_else(|| McpError::Protocol("tools/list without tools".into()))?;
            for t in page {
                let name = t
                    .get("name")
                    .and_then(Value::as_str)
                    .ok_or_else(|| McpError::Protocol("a tool without a name".into()))?;
                if tools.len() < MCP_TOOLS_MAX {
                    tools.push(McpToolInfo {
                        name: name.to_owned(),
                        description: t
                            .get("description")
                            .and_then(Value::as_str)
                            .unwrap_or("")
                            .to_owned(),
                        input_schema: t
                            .get("inputSchema")
                            .cloned()
                            .unwrap_or_else(|| json!({"type": "object"})),
                    });
                }
            }
            cursor = result
                .get("nextCursor")
                .and_then(Value::as_str)
                .map(str::to_owned);
            if cursor.is_none() {
                break;
            }
        }
        Ok(tools)
    }

    /// Calls a tool; returns its text content and whether the server flagged it an error.
    ///
    /// # Errors
    /// [`McpError`] for transport and protocol failures (a tool's own failure is `Ok((text, true))`).
    pub async fn call_tool(
        &self,
        name: &str,
        arguments: Value,
    ) -> Result<(String, bool), McpError> {
        let result = self
            .rpc("tools/call", json!({"name": name, "arguments": arguments}))
            .await?;
        let is_error = result
            .get("isError")
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let mut texts = Vec::new();
        for block in result
            .get("content")
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or(&[])
        {
            match block.get("type").and_then(Value::as_str) {
                Some("text") => texts.push(
                    block
                        .get("text")
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .to_owned(),
                ),
                _ => texts.push(block.to_string()),
            }
        }
        if texts.is_empty()
            && let Some(structured) = result.get("structuredContent")
        {
            texts.push(structured.to_string());
        }
        Ok((texts.join("\n"), is_error))
    }

    fn request(&self, body: &Value) -> reqwest::RequestBuilder {
        let mut req = self
            .http
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", MCP_PROTOCOL_VERSION)
            .json(body);
        if let Some(token) = &self.bearer {
            req = req.bearer_auth(token);
        }
        let session = self
            .session_id
            .lock()
            .map(|s| s.clone())
            .unwrap_or_else(|p| p.into_inner().clone());
        if let Some(id) = session {
            req = req.header("mcp-session-id", id);
        }
        req
    }

    async fn notify(&self, method: &str) -> Result<(), McpError> {
        let body = json!({"jsonrpc": "2.0", "method": method});
        let send = self.request(&body).send();
        let resp = tokio::time::timeout(Duration::from_millis(MCP_REQUEST_TIMEOUT_MS), send)
            .await
            .map_err(|_| McpError::Transport(format!("{method} timed out")))?
            .map_err(|e| McpError::Transport(e.to_string()))?;
        if !resp.status().is_success() {
            return Err(McpError::Transport(format!(
                "{method}: HTTP {}",
                resp.status()
            )));
        }
        Ok(())
    }

    async fn rpc(&self, method: &str, params: Value) -> Result<Value, McpError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let exchange = async {
            let mut resp = self
                .request(&body)
                .send()
                .await
                .map_err(|e| McpError::Transport(e.to_string()))?;
            if !resp.status().is_success() {
                return Err(McpError::Transport(format!(
                    "{method}: HTTP {}",
                    resp.status()
                )));
            }
            if let Some(sid) = resp
                .headers()
                .get("mcp-session-id")
                .and_then(|v| v.to_str().ok())
            {
                let mut slot = self
                    .session_id
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                *slot = Some(sid.to_owned());
            }
            let sse = resp
                .headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.starts_with("text/event-stream"));
            let mut parser = SseParser::new();
            let mut frames: Vec<SseFrame> = Vec::new();
            let mut body = Vec::new();
            while let Some(chunk) = resp
                .chunk()
                .await
                .map_err(|e| McpError::Transport(e.to_string()))?
            {
                if body.len() + chunk.len() > MCP_RESPONSE_BYTES_MAX {
                    return Err(McpError::Transport(
                        "response exceeds MCP_RESPONSE_BYTES_MAX".into(),
                    ));
                }
                if sse {
                    parser
                        .feed(&chunk, &mut frames)
                        .map_err(|e| McpError::Protocol(e.to_string()))?;
                    // The stream may carry notifications first; the answer is the message with our id.
                    for frame in frames.drain(..) {
                        if let Ok(v) = serde_json::from_str::<Value>(&frame.data)
                            && v.get("id").and_then(Value::as_u64) == Some(id)
                        {
                            return Ok(v);
                        }
                    }
                } else {
                    body.extend_from_slice(&chunk);
                }
            }
            if sse {
                return Err(McpError::Protocol(format!(
                    "{method}: the stream ended without an answer"
                )));
            }
            serde_json::from_slice::<Value>(&body)
                .map_err(|e| McpError::Protocol(format!("{method}: {e}")))
        };
        let message = tokio::time::timeout(Duration::from_millis(MCP_REQUEST_TIMEOUT_MS), exchange)
            .await
            .map_err(|_| McpError::Transport(format!("{method} timed out")))??;
        if let Some(err) = message.get("error") {
            return Err(McpError::Rpc {
                code: err.get("code").and_then(Value::as_i64).unwrap_or(0),
                message: err
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
            });
        }
        message
            .get("result")
            .cloned()
            .ok_or_else(|| McpError::Protocol(format!("{method}: no result")))
    }
}

/// One MCP tool offered to keel's loop.
pub struct McpTool {
    client: Arc<McpClient>,
    exposed_name: String,
    info: McpToolInfo,
}

impl Tool for McpTool {
    fn definition(&self) -> ToolDefinition {
        ToolDefinition {
            name: self.exposed_name.clone(),
            description: self.info.description.clone(),
            input_schema: self.info.input_schema.clone(),
        }
    }

    fn call<'a>(
        &'a self,
        input: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            match self.client.call_tool(&self.info.name, input).await {
                Ok((text, false)) => Ok(super::builtin::cap_output(text, ctx.output_bytes_max)),
                Ok((text, true)) => Err(ToolError::input(super::builtin::cap_output(
                    text,
                    ctx.output_bytes_max,
                ))),
                Err(McpError::Rpc { code, message }) => {
                    Err(ToolError::input(format!("MCP error {code}: {message}")))
                }
                Err(e) => Err(ToolError::new(ToolErrorCategory::Transient, e.to_string())),
            }
        })
    }
}

/// The name a tool of `server` gets in keel's loop: `mcp__<server>__<tool>`, cut to the 64
/// characters tool names may have.
pub fn exposed_name(server: &str, tool: &str) -> String {
    let raw = format!("mcp__{server}__{tool}");
    raw.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .take(64)
        .collect()
}

/// Connects to the endpoint and registers its tools. Returns how many were added.
///
/// # Errors
/// [`McpError`] when the endpoint cannot be reached or listed; tools whose names collide are
/// skipped, not fatal.
pub async fn register_endpoint(
    registry: &mut ToolRegistry,
    endpoint: &McpEndpoint,
    bearer: Option<String>,
    http: reqwest::Client,
) -> Result<usize, McpError> {
    let client = Arc::new(McpClient::connect(http, &endpoint.url, bearer).await?);
    let mut added = 0;
    for info in client.list_tools().await? {
        let tool = McpTool {
            client: client.clone(),
            exposed_name: exposed_name(&endpoint.server_name, &info.name),
            info,
        };
        if registry.register(Arc::new(tool)).is_ok() {
            added += 1;
        }
    }
    Ok(added)
}
