//! The scripted model as a [`Harness`]: keel's own agent loop with the model in process, so
//! `keel run` works offline and tests exercise the real loop and real tools without a socket.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;

use super::model::{Answer, ModelReply, ScriptedModel};
use super::request::{ModelRequest, WireApi};
use super::script::Script;
use crate::error::{HarnessError, StartError};
use crate::messages_api::agent::{AgentLoop, LoopConfig};
use crate::messages_api::client::ModelTransport;
use crate::messages_api::wire::{AssistantMessage, ContentBlock, MessagesRequest, WireUsage};
use crate::messages_api::{prepare_spec, session_tools};
use crate::session::{BoxFuture, CancelToken, Harness, RunningSession, session_channel};
use crate::spec::{HarnessKind, SessionSpec};
use crate::tools::ToolRegistry;

/// The longest a scripted hang or stall lasts in process: the HTTP transport's idle timeout plays
/// this role over a socket.
pub const IN_PROCESS_STALL_MS_MAX: u64 = 120_000;

/// A [`ModelTransport`] that asks a [`ScriptedModel`] directly.
#[derive(Debug, Clone)]
pub struct InProcessTransport {
    model: Arc<Mutex<ScriptedModel>>,
    stall_ms_max: u64,
}

impl InProcessTransport {
    /// A transport over a shared model (several sessions may share one script).
    pub fn new(model: Arc<Mutex<ScriptedModel>>) -> Self {
        InProcessTransport {
            model,
            stall_ms_max: IN_PROCESS_STALL_MS_MAX,
        }
    }

    /// Caps scripted hangs (tests use a short cap).
    pub fn with_stall_ms_max(mut self, ms: u64) -> Self {
        self.stall_ms_max = ms;
        self
    }
}

fn unix_now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Converts an answer into the message the HTTP stream would have produced.
fn to_message(answer: Answer, model: &str) -> Result<AssistantMessage, HarnessError> {
    let stop_reason = answer
        .stop_reason
        .ok_or_else(|| HarnessError::transient("stream ended without a stop_reason"))?;
    let mut content = Vec::new();
    if !answer.text.is_empty() {
        content.push(ContentBlock::Text { text: answer.text });
    }
    for call in answer.tool_calls {
        content.push(ContentBlock::ToolUse {
            id: format!("toolu_scripted_{:03}", call.call_seq),
            name: call.name,
            input: call.input,
        });
    }
    Ok(AssistantMessage {
        id: format!("msg_scripted_{:03}", answer.message_seq),
        model: model.to_owned(),
        content,
        stop_reason: Some(stop_reason),
        usage: WireUsage {
            input_tokens: answer.usage.input_tokens,
            output_tokens: answer.usage.output_tokens,
            ..WireUsage::default()
        },
    })
}

impl ModelTransport for InProcessTransport {
    fn send<'a>(
        &'a self,
        request: &'a MessagesRequest,
        cancel: &'a CancelToken,
    ) -> BoxFuture<'a, Result<AssistantMessage, HarnessError>> {
        Box::pin(async move {
            let body: Value = serde_json::to_value(request)
                .map_err(|e| HarnessError::system(format!("cannot encode the request: {e}")))?;
            let view = ModelRequest::from_body(WireApi::AnthropicMessages, &body);
            let reply = match self.model.lock() {
                Ok(mut m) => m.respond(&view),
                Err(poisoned) => poisoned.into_inner().respond(&view),
            };
            let stall = |ms: u64, what: &'static str| async move {
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(ms.min(self.stall_ms_max))) => Err(HarnessError::transient(what)),
                    _ = cancel.cancelled() => Err(HarnessError::cancelled()),
                }
            };
            match reply {
                ModelReply::Answer(answer) => to_message(answer, &request.model),
                ModelReply::HttpError {
                    status,
                    message,
                    retry_after_secs,
                    reset_after_secs,
                } => Err(HarnessError::from_http_status(
                    status,
                    message,
                    retry_after_secs.map(|s| s * 1000),
                    reset_after_secs.map(|s| unix_now_ms() + s * 1000),
                )),
                ModelReply::Hang { ms } => stall(ms, "no response (scripted hang)").await,
                ModelReply::StallMidStream { ms, .. } => {
                    stall(ms, "the stream stalled (scripted)").await
                }
                ModelReply::Malformed => {
                    Err(HarnessError::transient("malformed stream (scripted)"))
                }
                ModelReply::Disconnect => Err(HarnessError::transient(
                    "the stream broke (scripted disconnect)",
                )),
            }
        })
    }
}

/// The scripted harness: keel's loop, real tools, the scripted model in process.
#[derive(Debug, Clone)]
pub struct ScriptedHarness {
    transport: InProcessTransport,
    tools: ToolRegistry,
    config: LoopConfig,
}

impl ScriptedHarness {
    /// A harness whose sessions all follow one script (turns are shared across sessions, in
    /// request order).
    pub fn new(script: Script) -> Self {
        ScriptedHarness {
            transport: InProcessTransport::new(Arc::new(Mutex::new(ScriptedModel::new(script)))),
            tools: ToolRegistry::with_builtins(),
            config: LoopConfig::default(),
        }
    }

    /// Replaces the loop tuning (tests shorten backoff).
    pub fn with_loop_config(mut self, config: LoopConfig) -> Self {
        self.config = config;
        self
    }

    /// Replaces the tool registry.
    pub fn with_tools(mut self, tools: ToolRegistry) -> Self {
        self.tools = tools;
        self
    }

    /// Caps scripted hangs.
    pub fn with_stall_ms_max(mut self, ms: u64) -> Self {
        self.transport = self.transport.with_stall_ms_max(ms);
        self
    }
}

impl Harness for ScriptedHarness {
    fn kind(&self) -> HarnessKind {
        HarnessKind::Scripted
    }

    fn start(&self, spec: SessionSpec) -> BoxFuture<'_, Result<RunningSession, StartError>> {
        Box::pin(async move {
            let spec = prepare_spec(spec)?;
            let tools = session_tools(&spec, &self.tools, || {
                crate::messages_api::http::model_client()
                    .map_err(|e| StartError::Unavailable(e.message))
            })
            .await?;
            let agent =
                AgentLoop::new(Arc::new(self.transport.clone()), tools, self.config.clone());
            let (sink, cancel, session) = session_channel(HarnessKind::Scripted);
            // The session runs in the caller's span, so its log lines name the caller's task.
            tokio::spawn(tracing::Instrument::instrument(
                agent.run(spec, sink, cancel),
                tracing::Span::current(),
            ));
            Ok(session)
        })
    }
}
