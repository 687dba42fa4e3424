//! The specialist: one subtask attempt, one harness session (docs/DESIGN.md §4).
//!
//! It starts its session through an effect (after loading the rows its preamble needs, when it needs
//! one), turns each harness event into a session_log row sent to its coordinator, and ends with a
//! verified [`SubagentReport`] or a typed [`SubtaskFailure`], which it resends until the coordinator
//! acknowledges it. It holds exactly one address, its [`ReplyTo<Coordinator>`]: it cannot reach a
//! sibling (its effect type has no such variant).

use crate::context::{
    ContextConfig, LoadError, Redactions, RowSet, Scrubber, ThreadSource, collapse_whitespace,
    context_for_task, load_resume, load_thread,
};
use crate::coordinator::Coordinator;
use crate::effect::SpecialistEffect;
use crate::ids::{AttemptId, ReplyTo};
use crate::machine::{Entropy, Machine, Millis};
use crate::message::{
    Assignment, ContextRequest, DelegationCall, LifecycleEvent, SpecialistInput, SpecialistMsg,
    SpecialistReply, SpecialistStart, SpecialistTimer,
};
use crate::report::{
    AttemptResult, Continuity, FailureKind, Finding, SubagentReport, SubtaskBrief, SubtaskFailure,
    TEXT_BYTES_MAX, accept_report, bounded,
};
use crate::session_tool::{SessionAnswer, SessionRequest, SessionToolCall, ToolRefusal};
use keel_harness::{
    Account, ErrorCategory, HarnessError, HarnessEvent, RE_ASKS_MAX, SessionLimits, SessionSpec,
    StopCheck, StopReason, TokenCounts, UsageAccumulator,
};
use keel_store::{LogKind, SessionLogRow, TaskKind};
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

mod ingest;
pub use ingest::{scrub_answer, scrub_event, scrub_outcome, scrub_tool_call};

/// Most log rows in one `SpecialistReply::Logs`.
pub const LOG_ROWS_PER_REPLY_MAX: usize = 64;
/// Most bytes of a log row's one-line summary (the store's `log_summary_bytes_max`).
pub const LOG_SUMMARY_BYTES_MAX: usize = 512;
/// Most bytes of a log row's detail.
pub const LOG_DETAIL_BYTES_MAX: usize = 4 * 1024;
/// Most delegation turns one lead attempt may have answered (and remembered).
pub const DELEGATION_TURNS_MAX: usize = 64;
/// A tool whose name ends with this is the coordination tool a lead delegates with.
pub const DELEGATE_TOOL_SUFFIX: &str = "delegate";
/// What a lead session is told besides its brief: how to delegate through keel's tools.
pub const LEAD_INSTRUCTIONS: &str = "You are the lead of a keel run. Decompose the brief into \
independent subtasks and hand them to specialists with the `delegate` tool of the `keel` MCP server \
(several subtasks in one call run in parallel; the call answers with each subtask's report or \
failure). Use `get_task_details` to expand a task and `report_progress` to note progress. When the \
reports are in, write your synthesis as your final report.";
/// Most tool calls of one session waiting for their answers at once; past it a call is refused.
pub const TOOL_CALLS_PENDING_MAX: usize = 64;

/// How a session's coordination tools reach the specialist.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SessionToolPath {
    /// The host observes tool-use events only: a tool named `…delegate` in the session's event stream
    /// is a delegation turn, answered through `SpecialistEffect::AnswerDelegation` (the simulator's
    /// sessions, and hosts without an endpoint).
    #[default]
    ToolEvents,
    /// The host's MCP endpoint delivers each call as `SpecialistInput::ToolCall`; tool-use events are
    /// only logged (the same call would otherwise be taken twice).
    Endpoint,
}

/// Limits and environment of a specialist.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecialistConfig {
    /// The directory sessions work in (absolute, on the worker).
    pub working_dir: PathBuf,
    /// Ceilings of the harness session.
    pub session_limits: SessionLimits,
    /// How often an unacknowledged result is sent again.
    pub resend_interval_ms: Millis,
    /// How many times it is sent again before the specialist exits anyway (the supervisor's deadline
    /// then decides).
    pub resends_max: u32,
    /// Most log rows one attempt forwards; past it rows are counted, not sent (a resume preamble only
    /// ever needs the last 50).
    pub log_rows_max: u32,
    /// Price of a million tokens in micro-dollars, for harnesses that report tokens but not cost.
    pub micros_per_mtok: u64,
    /// The preamble builders' limits.
    pub context: ContextConfig,
    /// How the session's coordination tools arrive.
    pub session_tools: SessionToolPath,
    /// Scrubs everything the session produces before it becomes a row or a result, and the prompt;
    /// the host registers the credentials it knows in it (issue 16).
    pub scrubber: Scrubber,
}

impl Default for SpecialistConfig {
    fn default() -> Self {
        Self {
            working_dir: PathBuf::from("/srv/example/work"),
            session_limits: SessionLimits::default(),
            resend_interval_ms: 2_000,
            resends_max: 10,
            log_rows_max: 10_000,
            micros_per_mtok: 3_000_000,
            context: ContextConfig::default(),
            session_tools: SessionToolPath::default(),
            scrubber: Scrubber::new(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Phase {
    Created,
    Loading,
    Running,
    Reporting { resends: u32 },
    Done,
}

/// What a session's usage costs, in micro-dollars: the harness's own cost when it reports one, else
/// every billed token at `micros_per_mtok` per million. One function, so the budget the specialist
/// charges and the figure a progress view shows are the same number.
pub fn spend_micros(total: &TokenCounts, micros_per_mtok: u64) -> u64 {
    total.cost_micros.unwrap_or_else(|| {
        let t = u128::from(total.total_tokens());
        let micros = t * u128::from(micros_per_mtok) / 1_000_000;
        u64::try_from(micros).unwrap_or(u64::MAX)
    })
}

/// One specialist attempt. Created by the host from the supervisor's `SpecialistStart`, then given
/// `SpecialistInput::Begin`.
#[derive(Debug)]
pub struct Specialist {
    config: SpecialistConfig,
    attempt: AttemptId,
    reply_to: ReplyTo<Coordinator>,
    brief: SubtaskBrief,
    assignment: Assignment,
    continuity: Continuity,
    kind: TaskKind,
    phase: Phase,
    log_seq: u32,
    logs_dropped: u32,
    usage: UsageAccumulator,
    spent_micros: u64,
    result: Option<AttemptResult>,
    tools_used: u32,
    delegated_turns: BTreeSet<u32>,
    delegate_turn: u32,
    /// Tool calls sent to the coordinator and not answered yet.
    tool_calls: BTreeSet<String>,
    /// The `delegate` call behind each delegation turn taken through the endpoint and not answered
    /// yet.
    delegate_calls: BTreeMap<u32, String>,
    /// Every `delegate` call id that became a turn (at most `DELEGATION_TURNS_MAX`): the same call
    /// delivered again after its answer is not a new turn, so its subtasks are not delegated twice.
    delegate_call_ids: BTreeSet<String>,
    scrubber: Scrubber,
    /// What scrubbing the event being handled removed: recorded on the row it becomes.
    ingest_redactions: Redactions,
}

impl Specialist {
    /// A specialist for the attempt the supervisor admitted.
    pub fn new(start: SpecialistStart, config: SpecialistConfig) -> Self {
        Self {
            attempt: start.attempt,
            reply_to: start.reply_to,
            brief: start.brief,
            assignment: start.assignment,
            continuity: start.continuity,
            kind: start.kind,
            phase: Phase::Created,
            log_seq: 0,
            logs_dropped: 0,
            usage: UsageAccumulator::new(),
            spent_micros: 0,
            result: None,
            tools_used: 0,
            delegated_turns: BTreeSet::new(),
            delegate_turn: 0,
            tool_calls: BTreeSet::new(),
            delegate_calls: BTreeMap::new(),
            delegate_call_ids: BTreeSet::new(),
            scrubber: config.scrubber.clone(),
            ingest_redactions: Redactions::default(),
            config,
        }
    }

    /// The attempt this specialist is.
    pub fn attempt(&self) -> AttemptId {
        self.attempt
    }

    /// Its only address.
    pub fn reply_to(&self) -> ReplyTo<Coordinator> {
        self.reply_to
    }

    /// The session's usage so far, folded from the harness's reports without double counting, and
    /// what it costs ([`spend_micros`], never less than already charged to the budget).
    pub fn usage(&self) -> (TokenCounts, u64) {
        (self.usage.total(), self.spent_micros)
    }

    /// Whether it has exited.
    pub fn is_done(&self) -> bool {
        self.phase == Phase::Done
    }

    /// Why the task exists.
    pub fn kind(&self) -> TaskKind {
        self.kind
    }

    fn reply(&self, reply: SpecialistReply, out: &mut Vec<SpecialistEffect>) {
        out.push(SpecialistEffect::Reply(self.reply_to, reply));
    }

    fn log(
        &mut self,
        kind: LogKind,
        summary: String,
        detail: String,
        now: Millis,
        out: &mut Vec<SpecialistEffect>,
    ) {
        if self.log_seq >= self.config.log_rows_max {
            self.logs_dropped = self.logs_dropped.saturating_add(1);
            return;
        }
        self.log_seq += 1;
        let row = SessionLogRow {
            ts_ms: now,
            kind,
            summary: one_line(&summary, LOG_SUMMARY_BYTES_MAX),
            detail: bounded(detail, LOG_DETAIL_BYTES_MAX),
            redactions: std::mem::take(&mut self.ingest_redactions).to_records(),
        };
        self.reply(
            SpecialistReply::Logs {
                rows: vec![(self.log_seq, row)],
            },
            out,
        );
    }

    fn start_session(&mut self, prompt: String, out: &mut Vec<SpecialistEffect>) {
        let mut spec = SessionSpec::new(
            prompt,
            self.assignment.model.clone(),
            self.config.working_dir.clone(),
        );
        spec.limits = self.config.session_limits;
        // The agent profile's settings (docs/HARNESSES.md says what each harness does with them).
        if let Some(turns) = self.assignment.turns_max {
            spec.limits.turns_max = turns;
        }
        spec.allowed_tools = self.assignment.tools.clone();
        spec.agent = self.assignment.agent.clone();
        let mut system: Vec<&str> = Vec::new();
        if !self.assignment.system_prompt.trim().is_empty() {
            system.push(&self.assignment.system_prompt);
        }
        if self.config.session_tools == SessionToolPath::Endpoint
            && matches!(self.kind, TaskKind::Root | TaskKind::Redispatch)
            && self.brief.step == crate::coordinator::LEAD_STEP_KEY
        {
            system.push(LEAD_INSTRUCTIONS);
        }
        if !system.is_empty() {
            spec.append_system_prompt = Some(system.join("\n\n"));
        }
        spec.account = Account {
            id: self.assignment.account.clone(),
            ..Account::default()
        };
        // The Stop hook's report check: every session ends with a report for this task (or one of
        // the earlier tasks of its step), or gets one more turn with the error.
        let report_for = std::iter::once(self.attempt.task)
            .chain(self.brief.aliases.iter().copied())
            .map(|t| t.to_string())
            .collect();
        spec.stop_check = Some(StopCheck {
            report_for,
            re_asks_max: RE_ASKS_MAX,
        });
        self.phase = Phase::Running;
        out.push(SpecialistEffect::StartHarness {
            key: self.attempt.idempotency_key(),
            spec: Box::new(spec),
        });
    }

    fn finish(
        &mut self,
        outcome: Result<SubagentReport, SubtaskFailure>,
        now: Millis,
        out: &mut Vec<SpecialistEffect>,
    ) {
        let outcome = self.scrubbed_outcome(outcome);
        let event = match &outcome {
            Ok(_) => LifecycleEvent::SubagentStop {
                attempt: self.attempt,
            },
            Err(f) => LifecycleEvent::SubagentError {
                attempt: self.attempt,
                kind: f.kind,
            },
        };
        let summary = match &outcome {
            Ok(r) => format!(
                "finished: {:?} report, {} findings",
                r.status,
                r.findings.len()
            ),
            Err(f) => format!("failed: {} ({})", f.kind.name(), f.detail),
        };
        self.log(LogKind::Lifecycle, summary, String::new(), now, out);
        self.end_tool_calls(out);
        let result = AttemptResult {
            attempt: self.attempt,
            outcome,
            spent_micros: self.spent_micros,
        };
        self.reply(SpecialistReply::Finished(result.clone()), out);
        self.result = Some(result);
        out.push(SpecialistEffect::Emit(event));
        self.phase = Phase::Reporting { resends: 0 };
        out.push(SpecialistEffect::SetTimer {
            timer: SpecialistTimer::ResendResult(0),
            at: now.saturating_add(self.config.resend_interval_ms),
        });
    }

    fn failure(
        &self,
        kind: FailureKind,
        retryable: bool,
        retry_after_ms: Option<u64>,
        detail: String,
    ) -> SubtaskFailure {
        SubtaskFailure {
            kind,
            attempted: format!(
                "attempt {} as {} on {} ({}): {} log rows, {} tool calls",
                self.attempt.attempt,
                self.assignment.agent,
                self.assignment.harness,
                self.assignment.model,
                self.log_seq,
                self.tools_used
            ),
            partial: Vec::<Finding>::new(),
            retryable,
            retry_after_ms,
            detail: bounded(detail, TEXT_BYTES_MAX),
        }
    }

    fn on_harness(&mut self, event: HarnessEvent, now: Millis, out: &mut Vec<SpecialistEffect>) {
        if self.phase != Phase::Running {
            return; // events after the session ended (or before it started) change nothing
        }
        match event {
            HarnessEvent::Started {
                native_session_id,
                model,
            } => {
                // The native id is kept for the record only; keel never resumes through it.
                let detail = format!(
                    "native session {}; model {}",
                    native_session_id.as_deref().unwrap_or("-"),
                    model.as_deref().unwrap_or(&self.assignment.model)
                );
                // Which account the attempt billed to, for `keel logs` (a rate limit may have moved
                // the task to another account of the same provider).
                self.log(
                    LogKind::Lifecycle,
                    format!("session started on account {}", self.assignment.account),
                    detail,
                    now,
                    out,
                );
            }
            HarnessEvent::Text { text } => {
                self.log(LogKind::Text, text.clone(), text, now, out);
            }
            HarnessEvent::ToolUse {
                id,
                name,
                input_json,
            } => {
                self.tools_used = self.tools_used.saturating_add(1);
                let summary = format!("{name} {}", one_line(&input_json.text, 120));
                if self.config.session_tools == SessionToolPath::ToolEvents
                    && name.ends_with(DELEGATE_TOOL_SUFFIX)
                {
                    self.delegate(&input_json.text, out);
                }
                self.log(
                    LogKind::ToolUse,
                    summary,
                    format!("{id}: {}", input_json.text),
                    now,
                    out,
                );
            }
            HarnessEvent::ToolResult {
                id,
                is_error,
                content,
            } => {
                let verdict = if is_error { "error" } else { "ok" };
                let summary = format!("{verdict}: {}", one_line(&content.text, 160));
                self.log(
                    LogKind::ToolResult,
                    summary,
                    format!("{id}: {}", content.text),
                    now,
                    out,
                );
            }
            HarnessEvent::SentBack { reason } => {
                // The report check sent the session back once, in the same session (so the same
                // attempt and key): the durable record that it did, and why.
                self.log(
                    LogKind::Lifecycle,
                    format!("report check: sent back for one more turn: {reason}"),
                    reason,
                    now,
                    out,
                );
            }
            HarnessEvent::Usage(report) => {
                self.usage.record(&report);
                let total = self.usage.total();
                let spent = spend_micros(&total, self.config.micros_per_mtok);
                if spent > self.spent_micros {
                    self.spent_micros = spent;
                    self.reply(
                        SpecialistReply::Spend {
                            spent_micros: spent,
                        },
                        out,
                    );
                }
                // The row is the durable record of a session's usage (a task has no token fields):
                // the summary for people, the detail as the counts' JSON for tools.
                let summary = format!(
                    "usage: {} in / {} out tokens ({} billed), {} micros",
                    total.input_tokens,
                    total.output_tokens,
                    total.total_tokens(),
                    spent
                );
                let detail = serde_json::to_string(&total).unwrap_or_default();
                self.log(LogKind::Usage, summary, detail, now, out);
            }
            HarnessEvent::Finished {
                stop_reason,
                final_text,
            } => {
                let mut normalised = Vec::new();
                let outcome = self.outcome_of(stop_reason, &final_text, &mut normalised);
                if !normalised.is_empty() {
                    // The durable record of how a report written slightly off was read.
                    let detail = normalised.join("\n");
                    let summary = format!("report normalised: {}", normalised.join("; "));
                    self.log(LogKind::Lifecycle, summary, detail, now, out);
                }
                self.finish(outcome, now, out);
            }
            HarnessEvent::Failed(error) => {
                let failure = self.failure_of(&error, now);
                self.finish(Err(failure), now, out);
            }
        }
    }

    /// The attempt's result from the session's end; `normalised` gets what was changed to read a
    /// report written slightly off.
    fn outcome_of(
        &self,
        stop_reason: StopReason,
        final_text: &str,
        normalised: &mut Vec<String>,
    ) -> Result<SubagentReport, SubtaskFailure> {
        if !stop_reason.is_success() {
            let (kind, retryable) = match &stop_reason {
                StopReason::ModelContextWindowExceeded => {
                    (FailureKind::Harness(ErrorCategory::ContextOverflow), true)
                }
                StopReason::Refusal => (FailureKind::NotSuccess, false),
                _ => (FailureKind::NotSuccess, true),
            };
            return Err(self.failure(
                kind,
                retryable,
                None,
                format!("the session stopped with {stop_reason}, which is not a success"),
            ));
        }
        let read = accept_report(final_text, self.attempt.task, &self.brief.aliases)
            .map_err(|e| self.failure(FailureKind::MalformedReport, true, None, e))?;
        *normalised = read.normalised;
        Ok(read.report)
    }

    fn failure_of(&self, error: &HarnessError, now: Millis) -> SubtaskFailure {
        let mut retry_after = error.retry_after_ms;
        if let ErrorCategory::RateLimited {
            reset_at_unix_ms: Some(reset),
        } = error.category
        {
            retry_after = Some(retry_after.unwrap_or(0).max(reset.saturating_sub(now)));
        }
        // A saturated context is retried by a re-dispatch with a bounded preamble, never by resuming.
        let retryable = error.retryable || error.category == ErrorCategory::ContextOverflow;
        self.failure(
            FailureKind::Harness(error.category),
            retryable,
            retry_after,
            error.message.clone(),
        )
    }

    fn delegate(&mut self, input_json: &str, out: &mut Vec<SpecialistEffect>) {
        #[derive(serde::Deserialize)]
        struct Calls {
            calls: Vec<DelegationCall>,
        }
        if self.delegate_turn as usize >= DELEGATION_TURNS_MAX {
            return;
        }
        // A malformed delegate call is answered by the host's MCP layer as a tool error; here it
        // simply does not become a delegation.
        if let Ok(parsed) = serde_json::from_str::<Calls>(input_json) {
            self.delegate_turn += 1;
            self.reply(
                SpecialistReply::Delegate {
                    turn: self.delegate_turn,
                    calls: parsed.calls,
                },
                out,
            );
        }
    }
}

impl Specialist {
    /// A tool call of the session: `delegate` becomes a delegation turn, everything else goes to the
    /// coordinator; a call of a session that is not running is refused at once.
    fn on_tool_call(&mut self, call: SessionToolCall, out: &mut Vec<SpecialistEffect>) {
        let SessionToolCall { call_id, request } = call;
        let refuse = |refusal: ToolRefusal, out: &mut Vec<SpecialistEffect>| {
            out.push(SpecialistEffect::AnswerTool {
                call_id: call_id.clone(),
                answer: SessionAnswer::Refused(refusal),
            });
        };
        if self.phase != Phase::Running {
            return refuse(ToolRefusal::SessionEnded, out);
        }
        if self.tool_calls.contains(&call_id) || self.delegate_call_ids.contains(&call_id) {
            // A duplicate of a call in flight (its answer comes once), or of a delegation already
            // answered (a turn per call: its subtasks are never delegated again).
            return;
        }
        if self.tool_calls.len() + self.delegate_calls.len() >= TOOL_CALLS_PENDING_MAX {
            return refuse(
                ToolRefusal::OverLimit {
                    limit: format!("{TOOL_CALLS_PENDING_MAX} tool calls waiting at once"),
                },
                out,
            );
        }
        match request {
            SessionRequest::Delegate { calls } => {
                // The lead is the run's root task (or its re-dispatch); nobody else delegates.
                if !matches!(self.kind, TaskKind::Root | TaskKind::Redispatch) {
                    return refuse(ToolRefusal::NotALead, out);
                }
                if self.delegate_turn as usize >= DELEGATION_TURNS_MAX {
                    return refuse(
                        ToolRefusal::OverLimit {
                            limit: format!("{DELEGATION_TURNS_MAX} delegation turns"),
                        },
                        out,
                    );
                }
                self.delegate_turn += 1;
                self.delegate_call_ids.insert(call_id.clone());
                self.delegate_calls.insert(self.delegate_turn, call_id);
                self.reply(
                    SpecialistReply::Delegate {
                        turn: self.delegate_turn,
                        calls,
                    },
                    out,
                );
            }
            request => {
                self.tool_calls.insert(call_id.clone());
                self.reply(SpecialistReply::Tool { call_id, request }, out);
            }
        }
    }

    /// The session ended: every call still waiting is answered as ended, so none hangs.
    fn end_tool_calls(&mut self, out: &mut Vec<SpecialistEffect>) {
        let waiting = std::mem::take(&mut self.tool_calls)
            .into_iter()
            .chain(std::mem::take(&mut self.delegate_calls).into_values());
        for call_id in waiting {
            out.push(SpecialistEffect::AnswerTool {
                call_id,
                answer: SessionAnswer::Refused(ToolRefusal::SessionEnded),
            });
        }
    }
}

/// Collapse text to one bounded line (for log summaries).
fn one_line(text: &str, bytes_max: usize) -> String {
    bounded(collapse_whitespace(text, 256).into_owned(), bytes_max)
}

/// The rows a session's preamble is built from, read from any source (the store, or rows in memory)
/// with the context loaders' bounded walks. Hosts call this to answer `SpecialistEffect::LoadContext`.
///
/// # Errors
/// [`LoadError`] when the task is missing or the source fails.
pub fn context_rows<S: ThreadSource>(
    src: &S,
    request: &ContextRequest,
    config: &ContextConfig,
) -> Result<RowSet, LoadError> {
    let mut rows = RowSet::default();
    match request.start {
        // A fresh session loads nothing (the brief is its context); asked anyway, it gets the rows
        // of a standard one.
        Continuity::Fresh | Continuity::Standard { .. } => {
            let view = load_thread(src, request.task, config)?;
            rows.put_task(view.task);
            for t in view.ancestors {
                rows.put_task(t);
            }
        }
        Continuity::Resume { .. } => {
            let view = load_resume(src, request.task, config)?;
            rows.put_task(view.task);
            for t in view.earlier_attempts.into_iter().chain(view.delegated) {
                rows.put_task(t);
            }
            for entry in view.log {
                rows.logs
                    .entry(entry.task)
                    .or_default()
                    .push((entry.seq, entry.row));
            }
        }
    }
    Ok(rows)
}

impl Machine for Specialist {
    type Input = SpecialistInput;
    type Effect = SpecialistEffect;

    fn handle(
        &mut self,
        input: SpecialistInput,
        now: Millis,
        _rng: &mut dyn Entropy,
        out: &mut Vec<SpecialistEffect>,
    ) {
        match input {
            SpecialistInput::Begin => {
                if self.phase != Phase::Created {
                    return;
                }
                out.push(SpecialistEffect::Emit(LifecycleEvent::SubagentStart {
                    attempt: self.attempt,
                }));
                if self.continuity.loads_rows() {
                    self.phase = Phase::Loading;
                    out.push(SpecialistEffect::LoadContext(ContextRequest {
                        task: self.attempt.task,
                        start: self.continuity,
                    }));
                } else {
                    // Scrubbed in place: the rendered brief is the prompt unless a secret is cut.
                    let mut prompt = self.brief.render();
                    ingest::scrub_string(&self.scrubber, &mut prompt, &mut Redactions::default());
                    self.start_session(prompt, out);
                }
            }
            SpecialistInput::ContextLoaded(loaded) => {
                if self.phase != Phase::Loading {
                    return;
                }
                let built = loaded.and_then(|rows| {
                    context_for_task(
                        &rows,
                        self.attempt.task,
                        self.continuity,
                        &self.config.context,
                        &self.scrubber,
                    )
                    .map_err(|e| e.to_string())
                });
                match built {
                    Ok(report) => {
                        let detail = match &report.preamble {
                            Some(p) => {
                                format!("{} preamble, {} of {} chars", p.kind, p.chars, p.chars_max)
                            }
                            None => "no preamble".to_string(),
                        };
                        self.log(LogKind::Lifecycle, "context built".into(), detail, now, out);
                        self.start_session(report.prompt, out);
                    }
                    Err(e) => {
                        self.phase = Phase::Running;
                        let f = self.failure(
                            FailureKind::Harness(ErrorCategory::System),
                            true,
                            None,
                            format!("the context rows could not be loaded: {e}"),
                        );
                        self.finish(Err(f), now, out);
                    }
                }
            }
            SpecialistInput::Harness(event) => self.ingest(event, now, out),
            SpecialistInput::Msg(SpecialistMsg::Ack) => {
                if matches!(self.phase, Phase::Reporting { .. }) {
                    self.phase = Phase::Done;
                    out.push(SpecialistEffect::Exit);
                }
            }
            SpecialistInput::Msg(SpecialistMsg::Cancel { reason }) => match self.phase {
                Phase::Created | Phase::Loading => {
                    self.phase = Phase::Done;
                    out.push(SpecialistEffect::Emit(LifecycleEvent::SubagentError {
                        attempt: self.attempt,
                        kind: FailureKind::Cancelled,
                    }));
                    out.push(SpecialistEffect::Exit);
                }
                Phase::Running => {
                    out.push(SpecialistEffect::CancelHarness);
                    let f = self.failure(FailureKind::Cancelled, false, None, reason);
                    self.finish(Err(f), now, out);
                    // Nobody waits for a cancelled attempt's result: send it once and exit.
                    self.phase = Phase::Done;
                    out.push(SpecialistEffect::Exit);
                }
                Phase::Reporting { .. } => {
                    self.phase = Phase::Done;
                    out.push(SpecialistEffect::Exit);
                }
                Phase::Done => {}
            },
            SpecialistInput::Msg(SpecialistMsg::Delegated { turn, results }) => {
                if self.phase == Phase::Running
                    && turn <= self.delegate_turn
                    && self.delegated_turns.insert(turn)
                {
                    match self.delegate_calls.remove(&turn) {
                        Some(call_id) => out.push(SpecialistEffect::AnswerTool {
                            call_id,
                            answer: SessionAnswer::Delegated(results),
                        }),
                        None => out.push(SpecialistEffect::AnswerDelegation { turn, results }),
                    }
                }
            }
            SpecialistInput::Msg(SpecialistMsg::ToolAnswer { call_id, answer }) => {
                if self.tool_calls.remove(&call_id) {
                    let answer = ingest::scrub_answer(&self.scrubber, answer);
                    out.push(SpecialistEffect::AnswerTool { call_id, answer });
                }
            }
            SpecialistInput::SessionSecret(secret) => {
                // A value the scrubber refuses (too short) is no credential; nothing to register.
                let _ = self.scrubber.register_secret(&secret.0);
            }
            SpecialistInput::ToolCall(call) => {
                let call = ingest::scrub_tool_call(&self.scrubber, call);
                self.on_tool_call(call, out);
            }
            SpecialistInput::Timer(SpecialistTimer::ResendResult(n)) => {
                let Phase::Reporting { resends } = self.phase else {
                    return;
                };
                if n != resends {
                    return;
                }
                if resends >= self.config.resends_max {
                    self.phase = Phase::Done;
                    out.push(SpecialistEffect::Exit);
                    return;
                }
                if let Some(result) = self.result.clone() {
                    self.reply(SpecialistReply::Finished(result), out);
                }
                self.phase = Phase::Reporting {
                    resends: resends + 1,
                };
                out.push(SpecialistEffect::SetTimer {
                    timer: SpecialistTimer::ResendResult(resends + 1),
                    at: now.saturating_add(self.config.resend_interval_ms),
                });
            }
        }
    }
}
