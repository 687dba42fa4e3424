//! Scripted harness sessions: what a session of each [`HarnessBehaviour`] emits, as keel-harness's
//! normalized [`HarnessEvent`]s with their delays. The world feeds them to the specialist that started
//! the session, one event per agenda entry, so a crash or a cancel can land between any two of them.
//!
//! Reports are a pure function of the plan step (not of the attempt, the time or the harness), so a run
//! that crashed and recovered can be compared report for report with one that did not.

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

/// The name of the coordination tool a simulated lead calls (what keel's MCP server exposes; the
/// specialist recognizes it by its suffix).
pub const DELEGATE_TOOL: &str = "mcp__keel__delegate";

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

/// The session of a lead that delegates: one segment per delegation turn and a last one, each
/// segment after the first released by the answer to the turn that ends the one before it (the host
/// answers the pending `delegate` tool call; see [`delegation_answer`]). `turns[t]` is how many calls
/// turn `t + 1` makes. The last segment ends with the lead's final report.
pub fn lead_script(
    task: TaskId,
    native_session_id: String,
    turns: &[u32],
) -> Vec<Vec<(u64, HarnessEvent)>> {
    let mut segments = Vec::new();
    let mut current = vec![
        (
            5,
            HarnessEvent::Started {
                native_session_id: Some(native_session_id),
                model: None,
            },
        ),
        (
            100,
            HarnessEvent::Text {
                text: format!("planning the work; the key in the env is {PLANTED_SECRET}"),
            },
        ),
    ];
    for (t, &calls) in turns.iter().enumerate() {
        let turn = u32::try_from(t).unwrap_or(u32::MAX).saturating_add(1);
        let input = serde_json::json!({ "calls": delegation_calls(turn, calls) }).to_string();
        current.push((
            50,
            HarnessEvent::tool_use(delegate_tool_id(turn), DELEGATE_TOOL, input),
        ));
        segments.push(std::mem::take(&mut current));
    }
    current.push((10, usage(3_000, 500)));
    current.push((
        50,
        HarnessEvent::Finished {
            stop_reason: StopReason::EndTurn,
            final_text: report_text(keel_actors::coordinator::LEAD_STEP_KEY, task),
        },
    ));
    segments.push(current);
    segments
}

/// The tool result a host gives a lead for its delegation turn `turn`: the outcomes as JSON.
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
