//! Scripted harness sessions: what a session of each [`HarnessBehaviour`] emits, as keel-harness's
//! normalized [`HarnessEvent`]s with their delays. The world feeds them to the specialist that started
//! the session, one event per agenda entry, so a crash or a cancel can land between any two of them.
//!
//! Reports are a pure function of the plan step (not of the attempt, the time or the harness), so a run
//! that crashed and recovered can be compared report for report with one that did not.

use keel_actors::session_tool::{SessionAnswer, SessionRequest, SessionToolCall};
use keel_actors::{DelegationCall, Finding, ReportStatus, StepOutcome, SubagentReport};
use keel_harness::{
    ErrorCategory, HarnessError, HarnessEvent, StopReason, TokenCounts, UsageReport, UsageScope,
};
use keel_store::TaskId;

use crate::profile::HarnessBehaviour;

/// A secret planted in what harnesses print (session text, tool results) so the checker can see that
/// no preamble ever carries it onward (docs/DESIGN.md §12, invariant 4). Shaped like an Anthropic API key so
/// the scrubber's pattern, not a registration, has to catch it.
pub const PLANTED_SECRET: &str = "sk-ant-api03-Zq7vN1xR9tLm4Kp2Wc8Yh6Jd3Fs5Gb0AeUiOo7PqRsTuVwXyZ12";

/// How many tool round trips a saturating session makes before it is killed: enough rows that a resume
/// preamble must cut them (the preamble keeps at most 50 session steps).
pub const SATURATION_ROUND_TRIPS: u32 = 80;

/// Retry-after a scripted 429 asks for.
pub const RATE_LIMIT_RETRY_AFTER_MS: u64 = 30_000;

/// The report every successful session of `step` returns for `task`.
pub fn report_for(step: &str, task: TaskId) -> SubagentReport {
    SubagentReport {
        subtask_id: task,
        status: ReportStatus::Complete,
        findings: vec![Finding {
            claim: format!("step {step} holds"),
            source: format!("sim://{step}/evidence"),
            document: None,
            page: None,
            confidence_permille: 900,
            retrieved_by: "sim".into(),
            retrieved_at_ms: 0,
        }],
        gaps: Vec::new(),
        summary: format!("{step}: done"),
    }
}

/// The text of a successful session's final answer: the report as JSON, the form specialists parse.
pub fn report_text(step: &str, task: TaskId) -> String {
    serde_json::to_string(&report_for(step, task)).unwrap_or_default()
}

/// A session-total usage report; the cost is left to the specialist's price per token, as a CLI that
/// reports only tokens would.
fn usage(input: u64, output: u64) -> HarnessEvent {
    HarnessEvent::Usage(UsageReport {
        scope: UsageScope::SessionTotal,
        counts: TokenCounts {
            input_tokens: input,
            output_tokens: output,
            ..TokenCounts::default()
        },
    })
}

/// The events of one session, each with the delay after the previous one, in milliseconds. A `Hang`
/// session stops after `Started`; only a cancel or a deadline ends it.
pub fn script(
    behaviour: HarnessBehaviour,
    step: &str,
    task: TaskId,
    native_session_id: String,
    now_ms: u64,
) -> Vec<(u64, HarnessEvent)> {
    let mut out = vec![(
        5,
        HarnessEvent::Started {
            native_session_id: Some(native_session_id),
            model: None,
        },
    )];
    let text = |t: String| HarnessEvent::Text { text: t };
    match behaviour {
        HarnessBehaviour::Success => {
            out.push((
                200,
                text(format!(
                    "working on {step}; the key in the env is {PLANTED_SECRET}"
                )),
            ));
            out.push((10, usage(1_000, 200)));
            out.push((
                50,
                HarnessEvent::Finished {
                    stop_reason: StopReason::EndTurn,
                    final_text: report_text(step, task),
                },
            ));
        }
        HarnessBehaviour::ToolRoundTrip => {
            out.push((
                100,
                HarnessEvent::tool_use("toolu_sim_1", "Bash", r#"{"command":"ls"}"#),
            ));
            out.push((
                300,
                HarnessEvent::tool_result(
                    "toolu_sim_1",
                    false,
                    format!("README.md\n.env: {PLANTED_SECRET}"),
                ),
            ));
            out.push((200, text(format!("read the listing for {step}"))));
            out.push((10, usage(2_000, 300)));
            out.push((
                50,
                HarnessEvent::Finished {
                    stop_reason: StopReason::EndTurn,
                    final_text: report_text(step, task),
                },
            ));
        }
        HarnessBehaviour::RateLimited => {
            out.push((100, text(format!("starting {step}"))));
            out.push((
                50,
                HarnessEvent::Failed(HarnessError::rate_limited(
                    "429 rate_limit_error: usage limit reached",
                    Some(now_ms + 300_000),
                    Some(RATE_LIMIT_RETRY_AFTER_MS),
                )),
            ));
        }
        HarnessBehaviour::ServerError => {
            out.push((100, text(format!("starting {step}"))));
            out.push((
                50,
                HarnessEvent::Failed(HarnessError::from_http_status(
                    500,
                    "internal server error",
                    None,
                    None,
                )),
            ));
        }
        HarnessBehaviour::ContextSaturated => {
            for i in 0..SATURATION_ROUND_TRIPS {
                let id = format!("toolu_sim_{i}");
                out.push((
                    20,
                    HarnessEvent::tool_use(&id, "Read", format!(r#"{{"path":"src/file_{i}.rs"}}"#)),
                ));
                out.push((
                    20,
                    HarnessEvent::tool_result(
                        &id,
                        false,
                        format!("contents of file {i} ({PLANTED_SECRET})"),
                    ),
                ));
            }
            out.push((10, usage(190_000, 4_000)));
            out.push((
                50,
                HarnessEvent::Failed(HarnessError::new(
                    ErrorCategory::ContextOverflow,
                    "process exited with status 143 (SIGTERM): context window saturated",
                )),
            ));
        }
        HarnessBehaviour::SessionNotFound => {
            out.push((
                20,
                HarnessEvent::Failed(
                    HarnessError::new(
                        ErrorCategory::System,
                        "No conversation found with session ID",
                    )
                    .with_retryable(true),
                ),
            ));
        }
        HarnessBehaviour::Malformed => {
            out.push((100, text("partial output".into())));
            out.push((
                50,
                HarnessEvent::Finished {
                    stop_reason: StopReason::EndTurn,
                    final_text: "{\"summary\": oops not json".into(),
                },
            ));
        }
        HarnessBehaviour::Hang => {}
    }
    out
}

/// The prefix of keel's MCP tools as a session names them (server `keel`).
pub const KEEL_TOOL_PREFIX: &str = "mcp__keel__";

/// The name of the coordination tool a simulated lead calls (what keel's MCP server exposes).
pub const DELEGATE_TOOL: &str = "mcp__keel__delegate";

/// How long the node's endpoint waits for a tool's answer before it answers the session with a
/// tool error (keel-mcp's `call_timeout`); a `delegate` call waits [`DELEGATE_ANSWER_TIMEOUT_MS`].
pub const TOOL_ANSWER_TIMEOUT_MS: u64 = 60_000;
/// How long the endpoint waits for a `delegate` call's answer (keel-mcp's `delegate_timeout`).
pub const DELEGATE_ANSWER_TIMEOUT_MS: u64 = 4 * 3_600_000;

/// A session that calls keel's tools through the node's MCP endpoint: its segments, each after the
/// first released once the call that ends the one before it is answered (the host answers from the
/// specialist's `AnswerTool` effect, or with a tool error at the endpoint's timeout), and those
/// calls, one per segment but the last. Each call's `tool_use` event is the last event of its
/// segment, as a CLI prints it; the call itself reaches the specialist as
/// `SpecialistInput::ToolCall`, as the endpoint delivers it.
#[derive(Debug, Default)]
pub struct ToolSession {
    /// The segments of events, each with the delay after the previous event.
    pub segments: Vec<Vec<(u64, HarnessEvent)>>,
    /// The call that ends segment `i`.
    pub calls: Vec<SessionToolCall>,
}

impl ToolSession {
    fn new(native_session_id: String, opening: String) -> Self {
        Self {
            segments: vec![vec![
                (
                    5,
                    HarnessEvent::Started {
                        native_session_id: Some(native_session_id),
                        model: None,
                    },
                ),
                (100, HarnessEvent::Text { text: opening }),
            ]],
            calls: Vec::new(),
        }
    }

    /// End the current segment with a call of keel's `request` as tool-use `call_id`.
    fn call(&mut self, call_id: String, request: SessionRequest, input: serde_json::Value) {
        let name = format!("{KEEL_TOOL_PREFIX}{}", request.tool());
        if let Some(last) = self.segments.last_mut() {
            last.push((
                50,
                HarnessEvent::tool_use(call_id.clone(), name, input.to_string()),
            ));
        }
        self.calls.push(SessionToolCall { call_id, request });
        self.segments.push(Vec::new());
    }

    /// The last segment: usage, then the final report of `step`.
    fn finish(mut self, step: &str, task: TaskId, usage_in: u64, usage_out: u64) -> Self {
        if let Some(last) = self.segments.last_mut() {
            last.push((10, usage(usage_in, usage_out)));
            last.push((
                50,
                HarnessEvent::Finished {
                    stop_reason: StopReason::EndTurn,
                    final_text: report_text(step, task),
                },
            ));
        }
        self
    }
}

/// The tool-use id of a lead's delegation turn `turn` (from 1).
pub fn delegate_tool_id(turn: u32) -> String {
    format!("toolu_sim_delegate_{turn}")
}

/// The calls of a lead's delegation turn `turn`: `calls` subtasks, each with a call id unique within
/// the attempt.
pub fn delegation_calls(turn: u32, calls: u32) -> Vec<DelegationCall> {
    (0..calls)
        .map(|i| DelegationCall {
            call_id: format!("call-{turn}-{i}"),
            brief: format!(
                "Investigate part {i} of turn {turn} and report what holds, with sources."
            ),
            goal: format!("A sourced account of part {i} of turn {turn}"),
            quality_criteria: vec!["every claim has a source".into()],
            output_schema: None,
            assignee: None,
        })
        .collect()
}

/// The session of a lead that delegates: one `delegate` call per turn (`turns[t]` subtasks in turn
/// `t + 1`), each answered with the turn's outcomes, then the lead's final report.
pub fn lead_script(task: TaskId, native_session_id: String, turns: &[u32]) -> ToolSession {
    let mut session = ToolSession::new(
        native_session_id,
        format!("planning the work; the key in the env is {PLANTED_SECRET}"),
    );
    for (t, &calls) in turns.iter().enumerate() {
        let turn = u32::try_from(t).unwrap_or(u32::MAX).saturating_add(1);
        let calls = delegation_calls(turn, calls);
        let input = serde_json::json!({ "subtasks": calls });
        session.call(
            delegate_tool_id(turn),
            SessionRequest::Delegate { calls },
            input,
        );
    }
    session.finish(keel_actors::coordinator::LEAD_STEP_KEY, task, 3_000, 500)
}

/// The claim of the findings a session of `step` reports through `report_findings` with call
/// `call_id` (the checker looks for it in the store).
pub fn reported_claim(step: &str, call_id: &str) -> String {
    format!("step {step} noted {call_id}")
}

/// The claim of a `report_findings` call that arrives after its session ended (it must be refused,
/// and never recorded).
pub fn late_claim(step: &str) -> String {
    format!("late finding of step {step}")
}

/// The tool-use id of a specialist's MCP tool call `n` (from 1).
pub fn tool_call_id(n: u32) -> String {
    format!("toolu_sim_mcp_{n}")
}

/// A findings report of one claim, as a session sends it.
pub fn findings_request(claim: String, step: &str) -> SessionRequest {
    SessionRequest::ReportFindings {
        findings: vec![Finding {
            claim,
            source: format!("sim://{step}/notes"),
            document: None,
            page: None,
            confidence_permille: 700,
            retrieved_by: "sim".into(),
            retrieved_at_ms: 0,
        }],
    }
}

/// What a tool-calling session does after its findings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ThenAsk {
    /// `get_task_details` of this task (its own, or one of another run, which must be refused).
    Details(TaskId),
    /// `escalate`: the task pauses until a human answers; the session is stopped.
    Human,
}

/// The question a simulated session asks a human, and its options.
pub const ESCALATION_QUESTION: &str = "Which of the two readings of the brief holds?";
/// The options of [`ESCALATION_QUESTION`]; the simulated human answers the first.
pub const ESCALATION_OPTIONS: [&str; 2] = ["the first", "the second"];

/// A working session that uses keel's tools on the way: a progress note, findings, then
/// `get_task_details` or `escalate` (`then`), then its report, as [`script`]'s `Success` would.
pub fn tool_calling_script(
    step: &str,
    task: TaskId,
    native_session_id: String,
    then: ThenAsk,
) -> ToolSession {
    let mut session = ToolSession::new(
        native_session_id,
        format!("working on {step}; the key in the env is {PLANTED_SECRET}"),
    );
    let note = format!("half of {step} done");
    session.call(
        tool_call_id(1),
        SessionRequest::ReportProgress { note: note.clone() },
        serde_json::json!({ "note": note }),
    );
    let claim = reported_claim(step, &tool_call_id(2));
    session.call(
        tool_call_id(2),
        findings_request(claim.clone(), step),
        serde_json::json!({"findings": [{"claim": claim, "source": format!("sim://{step}/notes")}]}),
    );
    match then {
        ThenAsk::Details(task) => session.call(
            tool_call_id(3),
            SessionRequest::GetTaskDetails { task },
            serde_json::json!({ "task_id": task.to_string() }),
        ),
        ThenAsk::Human => {
            let reason = format!("the brief of {step} reads two ways");
            let options: Vec<String> = ESCALATION_OPTIONS.iter().map(|o| (*o).to_owned()).collect();
            session.call(
                tool_call_id(3),
                SessionRequest::Escalate {
                    reason: reason.clone(),
                    question: ESCALATION_QUESTION.to_owned(),
                    options: options.clone(),
                },
                serde_json::json!({"reason": reason, "question": ESCALATION_QUESTION, "options": options}),
            );
        }
    }
    session.finish(step, task, 1_500, 250)
}

/// The tool result a session gets for its call `call_id`: the answer's text, an error when refused.
pub fn tool_answer(call_id: &str, answer: &SessionAnswer) -> HarnessEvent {
    HarnessEvent::tool_result(call_id, answer.is_error(), answer.text())
}

/// The tool result a session gets when the endpoint gave up waiting for its call's answer.
pub fn tool_timed_out(call_id: &str) -> HarnessEvent {
    HarnessEvent::tool_result(call_id, true, "keel did not answer in time".to_owned())
}

/// The tool result a host gives a lead for its delegation turn `turn` without an endpoint (a
/// `…delegate` tool-use event taken as the turn): the outcomes as JSON.
pub fn delegation_answer(turn: u32, results: &[(String, StepOutcome)]) -> HarnessEvent {
    let failed = results
        .iter()
        .any(|(_, o)| !matches!(o, StepOutcome::Report(_)));
    HarnessEvent::tool_result(
        delegate_tool_id(turn),
        failed,
        serde_json::to_string(results).unwrap_or_default(),
    )
}
