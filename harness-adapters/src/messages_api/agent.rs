//! The agent loop: send, inspect `stop_reason`, execute, append (docs/DESIGN.md §7).
//!
//! - `end_turn` is the only success. `tool_use` runs every call (concurrently) and appends one user
//!   message with exactly one `tool_result` per `tool_use` id, in call order, before any text.
//! - `max_tokens` asks the model to continue (bounded), `pause_turn` re-sends (bounded),
//!   `stop_sequence` finishes without success, `refusal` and `model_context_window_exceeded` fail
//!   with their own categories, and an unknown value fails as a protocol error.
//! - Failed tools return structured `is_error` results (`error_category`, `is_retryable`).
//! - Model requests are retried with jittered exponential backoff up to an attempt cap, honouring
//!   `retry-after`; a long rate limit goes to the supervisor as `rate_limited` with its reset time.
//! - A Stop check in the spec (the report check) runs in process when the model ends its turn: a
//!   final text it refuses gets the session one more turn with the exact error (a `SentBack` event),
//!   at most `re_asks_max` times; then the session ends with whatever it said.
//! - Runaway guards: turn, token and wall-clock ceilings; the same calls with the same input twice in
//!   a row get an error result instead of running again, and a third time end the session; near a
//!   budget the loop asks for a summary without tools and finishes with a budget stop, which is a
//!   checkpoint, not a failure.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::time::Instant;

use super::backoff::{Jitter, RetryDecision, RetryPolicy};
use super::client::ModelTransport;
use super::gate;
use super::wire::{AssistantMessage, ContentBlock, Message, MessagesRequest, Role};
use crate::error::{ErrorCategory, HarnessError};
use crate::event::{BudgetKind, HarnessEvent, StopReason};
use crate::guard::{GuardedCall, ToolOutput};
use crate::session::{CancelToken, EventSink};
use crate::spec::{PermissionMode, SessionSpec};
use crate::tools::{ToolContext, ToolError, ToolErrorCategory, ToolRegistry};
use crate::usage::{TokenCounts, UsageAccumulator, UsageReport, UsageScope};

/// keel's base system prompt for its own loop; the spec's appended prompt follows it.
pub const BASE_SYSTEM_PROMPT: &str = "You are a coding agent run by keel. Work inside the working directory with the tools \
offered. When the task is done, answer with a short report of what you did and what remains.";

/// The user text that asks for a summary near a budget.
pub const BUDGET_NOTICE: &str = "[keel] The session budget is nearly used. Do not call any more tools. Reply now with a \
concise summary: what is done, what remains, and where the work stands.";

/// The user text that asks the model to continue after `max_tokens`.
pub const CONTINUE_NOTICE: &str =
    "[keel] Your answer was cut off at the output limit. Continue exactly where you stopped.";

/// How long cancelled tools get to wind down before the loop stops waiting for them.
pub const TOOL_GRACE_MS: u64 = 2_000;

/// Tuning of the loop. Every count and duration is finite.
#[derive(Debug, Clone)]
pub struct LoopConfig {
    /// `max_tokens` of each request.
    pub max_tokens_per_turn: u32,
    /// Retry policy for model requests.
    pub retry: RetryPolicy,
    /// Most time one tool call may take.
    pub tool_timeout_ms: u64,
    /// Most bytes of one tool result sent to the model.
    pub tool_output_bytes_max: usize,
    /// Base system prompt; the spec's appended prompt follows it.
    pub base_system_prompt: String,
    /// The fraction of a budget (percent) after which the loop asks for a summary.
    pub budget_warning_percent: u64,
    /// Continuations requested after `max_tokens` before the loop gives up.
    pub max_tokens_continuations_max: u32,
    /// `pause_turn` re-sends before the loop gives up.
    pub pause_turns_max: u32,
    /// Seed for backoff jitter (pass a fixed one for replayable tests).
    pub jitter_seed: u64,
}

impl Default for LoopConfig {
    fn default() -> Self {
        LoopConfig {
            max_tokens_per_turn: 8192,
            retry: RetryPolicy::default(),
            tool_timeout_ms: 120_000,
            tool_output_bytes_max: 64 * 1024,
            base_system_prompt: BASE_SYSTEM_PROMPT.to_owned(),
            budget_warning_percent: 90,
            max_tokens_continuations_max: 2,
            pause_turns_max: 8,
            jitter_seed: 0x6b65_656c,
        }
    }
}

/// Why the loop stopped early inside a step.
enum Stop {
    Deadline,
    Failed(HarnessError),
}

/// One session of keel's loop over any [`ModelTransport`].
pub struct AgentLoop {
    transport: Arc<dyn ModelTransport>,
    tools: ToolRegistry,
    config: LoopConfig,
}

impl AgentLoop {
    /// A loop over a transport with the given tools.
    pub fn new(
        transport: Arc<dyn ModelTransport>,
        tools: ToolRegistry,
        config: LoopConfig,
    ) -> Self {
        AgentLoop {
            transport,
            tools,
            config,
        }
    }

    /// Runs the session to its end, sending every event to `sink`; the last one is terminal. The
    /// working directory in `spec` must already be canonical.
    pub async fn run(self, spec: SessionSpec, sink: EventSink, cancel: CancelToken) {
        // A consumer that drops its session cancels it, so tools and requests stop promptly.
        let watcher = {
            let (sink, cancel) = (sink.clone(), cancel.clone());
            tokio::spawn(async move {
                sink.closed().await;
                cancel.cancel();
            })
        };
        let terminal = self.drive(&spec, &sink, &cancel).await;
        watcher.abort();
        sink.send_terminal(terminal).await;
    }

    async fn drive(
        &self,
        spec: &SessionSpec,
        sink: &EventSink,
        cancel: &CancelToken,
    ) -> HarnessEvent {
        let started = Instant::now();
        let wall = Duration::from_millis(spec.limits.wall_clock_ms_max);
        let deadline = started + wall;
        let mut tools = self
            .tools
            .filtered(&spec.allowed_tools, &spec.disallowed_tools);
        if spec.permission_mode == PermissionMode::ReadOnly {
            tools = tools.read_only();
        }
        let definitions = tools.definitions();
        let system = match &spec.append_system_prompt {
            Some(extra) if !extra.trim().is_empty() => {
                format!("{}\n\n{extra}", self.config.base_system_prompt)
            }
            _ => self.config.base_system_prompt.clone(),
        };
        let tool_cancel = CancelToken::new();
        let ctx = ToolContext {
            working_dir: spec.working_dir.clone(),
            timeout_ms: self.config.tool_timeout_ms,
            output_bytes_max: self.config.tool_output_bytes_max,
            env: spec.env.clone(),
            cancel: tool_cancel.clone(),
        };
        if !sink
            .send(HarnessEvent::Started {
                native_session_id: None,
                model: Some(spec.model.clone()),
            })
            .await
        {
            return HarnessEvent::Failed(HarnessError::cancelled());
        }
        let mut messages = vec![Message {
            role: Role::User,
            content: vec![ContentBlock::Text {
                text: spec.prompt.clone(),
            }],
        }];
        let mut usage = UsageAccumulator::new();
        let mut jitter = Jitter::new(self.config.jitter_seed);
        let mut turns = 0u32;
        let mut last_text = String::new();
        let mut summary_for: Option<BudgetKind> = None;
        let mut previous_calls: Vec<(String, String)> = Vec::new();
        let mut repeats = 0u32;
        let mut continuations = 0u32;
        let mut pauses = 0u32;
        let mut re_asks = 0u32;
        let finished = |stop_reason: StopReason, text: &str| HarnessEvent::Finished {
            stop_reason,
            final_text: text.to_owned(),
        };

        'session: loop {
            if cancel.is_cancelled() {
                return HarnessEvent::Failed(HarnessError::cancelled());
            }
            if Instant::now() >= deadline {
                return finished(StopReason::Budget(BudgetKind::WallClock), &last_text);
            }
            // The turn ceiling is never crossed, not even for the summary; the token ceiling may be
            // crossed by the one summary turn, which is what the warning threshold leaves room for.
            if turns >= spec.limits.turns_max {
                return finished(StopReason::Budget(BudgetKind::Turns), &last_text);
            }
            if summary_for.is_none() && usage.total().total_tokens() >= spec.limits.tokens_max {
                return finished(StopReason::Budget(BudgetKind::Tokens), &last_text);
            }
            // The conversation moves into the request and back out after the send, so a long
            // session is not copied once per turn.
            let request = MessagesRequest {
                model: spec.model.clone(),
                max_tokens: self.config.max_tokens_per_turn,
                system: Some(system.clone()),
                messages: std::mem::take(&mut messages),
                tools: definitions.clone(),
                tool_choice: summary_for.map(|_| json!({"type": "none"})),
                stream: true,
            };
            turns += 1;
            let sent = self
                .send_with_retry(&request, cancel, deadline, &mut jitter)
                .await;
            messages = request.messages;
            let message = match sent {
                Ok(m) => m,
                Err(Stop::Deadline) => {
                    return finished(StopReason::Budget(BudgetKind::WallClock), &last_text);
                }
                Err(Stop::Failed(e)) => return HarnessEvent::Failed(e),
            };
            let scope = if message.id.is_empty() {
                format!("turn-{turns}")
            } else {
                message.id.clone()
            };
            let report = UsageReport {
                scope: UsageScope::Message(scope),
                counts: TokenCounts {
                    input_tokens: message.usage.input_tokens,
                    output_tokens: message.usage.output_tokens,
                    cache_read_tokens: message.usage.cache_read_input_tokens,
                    cache_write_tokens: message.usage.cache_creation_input_tokens,
                    cost_micros: None,
                },
            };
            usage.record(&report);
            let mut events = vec![HarnessEvent::Usage(report)];
            for block in &message.content {
                match block {
                    ContentBlock::Text { text } if !text.is_empty() => {
                        events.push(HarnessEvent::Text { text: text.clone() })
                    }
                    ContentBlock::ToolUse { id, name, input } => events.push(
                        HarnessEvent::tool_use(id.clone(), name.clone(), input.to_string()),
                    ),
                    _ => {}
                }
            }
            for event in events {
                if !sink.send(event).await {
                    return HarnessEvent::Failed(HarnessError::cancelled());
                }
            }
            let text = message.text();
            if !text.is_empty() {
                last_text = text;
            }
            let calls: Vec<(String, String, Value)> = message
                .tool_uses()
                .into_iter()
                .map(|(id, name, input)| (id.to_owned(), name.to_owned(), input.clone()))
                .collect();
            let stop_raw = message.stop_reason.clone().unwrap_or_default();
            messages.push(Message {
                role: Role::Assistant,
                content: message.content,
            });
            if let Some(kind) = summary_for {
                // The summary turn: whatever it says is the checkpoint's text. Any tool call in it
                // still gets a (refused) result so every tool_use in the record stays paired.
                refuse_all(sink, &calls, "not run: the session budget is used up").await;
                return finished(StopReason::Budget(kind), &last_text);
            }
            let mut reply: Vec<ContentBlock> = Vec::new();
            // Every tool call of this turn must get exactly one result event, even when the turn
            // ends the session (docs/DESIGN.md §12, invariant 3): `answered` tracks whether it did.
            let mut answered = calls.is_empty();
            let terminal: Option<HarnessEvent> = 'turn: {
                match StopReason::from_wire(&stop_raw) {
                    StopReason::EndTurn => {
                        // The Stop hook's report check, in process: a final text that is not a
                        // report gets this session one more turn with the exact error (same
                        // session, so the same attempt: never a new start).
                        if let Some(text) = self.sent_back(spec, &calls, turns, re_asks, &last_text)
                        {
                            re_asks += 1;
                            if !sink
                                .send(HarnessEvent::SentBack {
                                    reason: text.clone(),
                                })
                                .await
                            {
                                break 'turn Some(HarnessEvent::Failed(HarnessError::cancelled()));
                            }
                            reply.push(ContentBlock::Text { text });
                            break 'turn None;
                        }
                        break 'turn Some(finished(StopReason::EndTurn, &last_text));
                    }
                    StopReason::ToolUse => {
                        if calls.is_empty() {
                            break 'turn Some(HarnessEvent::Failed(HarnessError::system(
                                "stop_reason tool_use without any tool_use block",
                            )));
                        }
                        let signature: Vec<(String, String)> = calls
                            .iter()
                            .map(|(_, n, i)| (n.clone(), i.to_string()))
                            .collect();
                        repeats = if signature == previous_calls {
                            repeats + 1
                        } else {
                            0
                        };
                        previous_calls = signature;
                        if repeats >= 2 {
                            break 'turn Some(finished(StopReason::DuplicateToolCall, &last_text));
                        }
                        let results = if repeats == 1 {
                            let refusal = ToolError::input(
                                "duplicate call: the same tool with the same input as your previous call; its result is above. Change the input or finish.",
                            );
                            calls.iter().map(|_| Err(refusal.clone())).collect()
                        } else {
                            match self
                                .execute(&calls, &tools, &ctx, spec, &tool_cancel, cancel, deadline)
                                .await
                            {
                                Ok(r) => r,
                                Err(Stop::Deadline) => {
                                    break 'turn Some(finished(
                                        StopReason::Budget(BudgetKind::WallClock),
                                        &last_text,
                                    ));
                                }
                                Err(Stop::Failed(e)) => break 'turn Some(HarnessEvent::Failed(e)),
                            }
                        };
                        answered = true;
                        for ((id, _, _), result) in calls.iter().zip(results) {
                            let (content, is_error) = match result {
                                Ok(text) => (text, false),
                                Err(e) => (e.to_payload(), true),
                            };
                            if !sink
                                .send(HarnessEvent::tool_result(
                                    id.clone(),
                                    is_error,
                                    content.clone(),
                                ))
                                .await
                            {
                                break 'turn Some(HarnessEvent::Failed(HarnessError::cancelled()));
                            }
                            reply.push(ContentBlock::ToolResult {
                                tool_use_id: id.clone(),
                                content,
                                is_error,
                            });
                        }
                    }
                    StopReason::MaxTokens => {
                        if continuations >= self.config.max_tokens_continuations_max {
                            break 'turn Some(finished(StopReason::MaxTokens, &last_text));
                        }
                        continuations += 1;
                        // A cut answer's tool calls may hold cut input: answer each with an error.
                        answered = true;
                        for (id, _, _) in &calls {
                            let e = ToolError::new(
                                ToolErrorCategory::Transient,
                                "the call was cut off at the output limit and did not run; send it again",
                            );
                            sink.send(HarnessEvent::tool_result(id.clone(), true, e.to_payload()))
                                .await;
                            reply.push(ContentBlock::ToolResult {
                                tool_use_id: id.clone(),
                                content: e.to_payload(),
                                is_error: true,
                            });
                        }
                        reply.push(ContentBlock::Text {
                            text: CONTINUE_NOTICE.to_owned(),
                        });
                    }
                    StopReason::PauseTurn => {
                        pauses += 1;
                        if pauses > self.config.pause_turns_max {
                            break 'turn Some(finished(StopReason::PauseTurn, &last_text));
                        }
                        if !calls.is_empty() {
                            break 'turn Some(HarnessEvent::Failed(HarnessError::system(
                                "pause_turn with client tool calls is not supported",
                            )));
                        }
                        // The paused assistant message is already in the history: re-sending continues it.
                        continue 'session;
                    }
                    StopReason::StopSequence => {
                        break 'turn Some(finished(StopReason::StopSequence, &last_text));
                    }
                    StopReason::Refusal => {
                        break 'turn Some(HarnessEvent::Failed(HarnessError::new(
                            ErrorCategory::BusinessRule,
                            "the model refused the request",
                        )));
                    }
                    StopReason::ModelContextWindowExceeded => {
                        break 'turn Some(HarnessEvent::Failed(HarnessError::new(
                            ErrorCategory::ContextOverflow,
                            "the conversation exceeds the model's context window",
                        )));
                    }
                    other => {
                        break 'turn Some(HarnessEvent::Failed(
                            HarnessError::system(format!(
                                "unknown stop_reason {:?}",
                                other.to_string()
                            ))
                            .with_retryable(false),
                        ));
                    }
                }
                None
            };
            if let Some(terminal) = terminal {
                if !answered {
                    refuse_all(sink, &calls, "not run: the session ended with this turn").await;
                }
                return terminal;
            }
            if let Some(kind) = self.near_budget(spec, turns, &usage, started.elapsed()) {
                summary_for = Some(kind);
                reply.push(ContentBlock::Text {
                    text: BUDGET_NOTICE.to_owned(),
                });
            }
            messages.push(Message {
                role: Role::User,
                content: reply,
            });
        }
    }

    /// The user text a session is sent back with at its end, when the spec's Stop check refuses its
    /// final text and it has a re-ask and a turn left; `None` lets it end.
    fn sent_back(
        &self,
        spec: &SessionSpec,
        calls: &[(String, String, Value)],
        turns: u32,
        re_asks: u32,
        final_text: &str,
    ) -> Option<String> {
        let check = spec.stop_check.as_ref()?;
        let judge = spec.in_process.stop.as_ref()?;
        if !calls.is_empty() || re_asks >= check.re_asks_max || turns >= spec.limits.turns_max {
            return None;
        }
        judge.judge(check, final_text).err()
    }

    fn near_budget(
        &self,
        spec: &SessionSpec,
        turns: u32,
        usage: &UsageAccumulator,
        elapsed: Duration,
    ) -> Option<BudgetKind> {
        let pct = self.config.budget_warning_percent;
        let limits = &spec.limits;
        if turns.saturating_add(1) >= limits.turns_max {
            return Some(BudgetKind::Turns);
        }
        if u128::from(usage.total().total_tokens()) * 100
            >= u128::from(limits.tokens_max) * u128::from(pct)
        {
            return Some(BudgetKind::Tokens);
        }
        if elapsed.as_millis() * 100 >= u128::from(limits.wall_clock_ms_max) * u128::from(pct) {
            return Some(BudgetKind::WallClock);
        }
        None
    }

    async fn send_with_retry(
        &self,
        request: &MessagesRequest,
        cancel: &CancelToken,
        deadline: Instant,
        jitter: &mut Jitter,
    ) -> Result<AssistantMessage, Stop> {
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let result = tokio::select! {
                r = self.transport.send(request, cancel) => r,
                _ = tokio::time::sleep_until(deadline) => return Err(Stop::Deadline),
            };
            let error = match result {
                Ok(message) => return Ok(message),
                Err(e) => e,
            };
            if error.category == ErrorCategory::Cancelled {
                return Err(Stop::Failed(error));
            }
            match self.config.retry.decide(attempt, &error, jitter.next_u64()) {
                RetryDecision::GiveUp => return Err(Stop::Failed(error)),
                RetryDecision::RetryAfterMs(ms) => {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_millis(ms)) => {}
                        _ = cancel.cancelled() => return Err(Stop::Failed(HarnessError::cancelled())),
                        _ = tokio::time::sleep_until(deadline) => return Err(Stop::Deadline),
                    }
                }
            }
        }
    }

    /// Runs every call concurrently; results come back in call order, one per call.
    #[allow(clippy::too_many_arguments)]
    async fn execute(
        &self,
        calls: &[(String, String, Value)],
        tools: &ToolRegistry,
        ctx: &ToolContext,
        spec: &SessionSpec,
        tool_cancel: &CancelToken,
        cancel: &CancelToken,
        deadline: Instant,
    ) -> Result<Vec<Result<String, ToolError>>, Stop> {
        let timeout = Duration::from_millis(self.config.tool_timeout_ms);
        let futures = calls.iter().map(|(id, name, input)| async move {
            let tool = tools
                .get(name)
                .ok_or_else(|| ToolError::input(format!("unknown tool {name}")))?;
            let guard = spec.in_process.tool.as_deref();
            let call = GuardedCall {
                tool_use_id: id,
                tool: name,
                input,
                cwd: &ctx.working_dir,
            };
            // The policy in process when the host gave one, else the gate command (if any).
            if let Some(guard) = guard {
                guard
                    .before_tool(call)
                    .await
                    .map_err(ToolError::permission)?;
            } else if let Some(g) = &spec.pre_tool_gate {
                gate::check(g, &spec.env, &ctx.working_dir, id, name, input).await?;
            }
            let result = match tokio::time::timeout(timeout, tool.call(input.clone(), ctx)).await {
                Ok(result) => result,
                Err(_) => Err(ToolError::new(
                    ToolErrorCategory::Transient,
                    format!("{name} timed out after {} ms", timeout.as_millis()),
                )),
            };
            let Some(guard) = guard else {
                return result;
            };
            // PostToolUse: the result the model sees is the one the policy hands back.
            match result {
                Ok(text) => {
                    let out = guard
                        .after_tool(
                            call,
                            ToolOutput {
                                is_error: false,
                                text,
                            },
                        )
                        .await;
                    if out.is_error {
                        Err(ToolError::permission(out.text))
                    } else {
                        Ok(out.text)
                    }
                }
                Err(e) => {
                    let out = guard
                        .after_tool(
                            call,
                            ToolOutput {
                                is_error: true,
                                text: e.message.clone(),
                            },
                        )
                        .await;
                    Err(ToolError {
                        message: out.text,
                        ..e
                    })
                }
            }
        });
        let mut all = Box::pin(futures_util::future::join_all(futures));
        let stop = tokio::select! {
            results = &mut all => return Ok(results),
            _ = cancel.cancelled() => Stop::Failed(HarnessError::cancelled()),
            _ = tokio::time::sleep_until(deadline) => Stop::Deadline,
        };
        // Let the tools kill what they started, within a grace period.
        tool_cancel.cancel();
        let _ = tokio::time::timeout(Duration::from_millis(TOOL_GRACE_MS), &mut all).await;
        Err(stop)
    }
}

/// Sends an error result for each call that will not run, so every `ToolUse` event is paired with
/// exactly one `ToolResult` even when the session ends right after it (docs/DESIGN.md §12, invariant 3).
async fn refuse_all(sink: &EventSink, calls: &[(String, String, Value)], reason: &str) {
    let payload = ToolError::input(reason).to_payload();
    for (id, _, _) in calls {
        sink.send(HarnessEvent::tool_result(id.clone(), true, payload.clone()))
            .await;
    }
}
