//! Scrubbing at ingest (issue 16): everything a harness produces passes the specialist's
//! [`Scrubber`] (the built-in shapes and the literal values of the credentials the host registered)
//! before anything is made of it, so no row, report, failure, delegation or coordinator decision that
//! comes from a session can hold a secret the scrubber knows, and nothing cut for a summary can leave
//! half of one behind. The specialist is the one place every session's output passes, in the runtime
//! and in the simulator alike; the counts of what was removed go with the row the event becomes
//! ([`SessionLogRow::redactions`](keel_store::SessionLogRow::redactions)).
//!
//! The session's tool calls through keel's MCP endpoint are harness-produced too: scrubbed as they
//! arrive ([`scrub_tool_call`]); what their answers carry from the store is scrubbed on its way out
//! ([`scrub_answer`]).
//!
//! A final report is parsed from the text as the harness gave it and its fields are scrubbed after
//! (a marker put inside JSON text could break the report's syntax; put inside a field it cannot).

use keel_harness::{HarnessEvent, UsageScope};

use super::Specialist;
use crate::context::{Redactions, Scrubber};
use crate::effect::SpecialistEffect;
use crate::machine::Millis;
use crate::report::{Finding, SubagentReport, SubtaskFailure};
use crate::session_tool::{SessionAnswer, SessionRequest, SessionToolCall};

/// Scrubs one string in place, adding what it removed to `found`.
pub(crate) fn scrub_string(scrubber: &Scrubber, text: &mut String, found: &mut Redactions) {
    let scrubbed = scrubber.scrub(text);
    if scrubbed.redactions.total() == 0 {
        return;
    }
    found.merge(&scrubbed.redactions);
    let clean = scrubbed.text.into_owned();
    *text = clean;
}

/// Scrubs every text of a harness event but a final report's (see [`scrub_outcome`]); answers the
/// event as keel keeps it and what was removed.
pub fn scrub_event(scrubber: &Scrubber, mut event: HarnessEvent) -> (HarnessEvent, Redactions) {
    let mut found = Redactions::default();
    let s = |text: &mut String, found: &mut Redactions| scrub_string(scrubber, text, found);
    match &mut event {
        HarnessEvent::Started {
            native_session_id,
            model,
        } => {
            for text in [native_session_id, model].into_iter().flatten() {
                s(text, &mut found);
            }
        }
        HarnessEvent::Text { text } | HarnessEvent::SentBack { reason: text } => {
            s(text, &mut found)
        }
        HarnessEvent::ToolUse {
            id,
            name,
            input_json,
        } => {
            s(id, &mut found);
            s(name, &mut found);
            s(&mut input_json.text, &mut found);
        }
        HarnessEvent::ToolResult { id, content, .. } => {
            s(id, &mut found);
            s(&mut content.text, &mut found);
        }
        HarnessEvent::Usage(report) => {
            if let UsageScope::Message(id) = &mut report.scope {
                s(id, &mut found);
            }
        }
        // Parsed first, scrubbed field by field after (scrub_outcome).
        HarnessEvent::Finished { .. } => {}
        HarnessEvent::Failed(error) => s(&mut error.message, &mut found),
    }
    (event, found)
}

fn scrub_finding(scrubber: &Scrubber, f: &mut Finding, found: &mut Redactions) {
    scrub_string(scrubber, &mut f.claim, found);
    scrub_string(scrubber, &mut f.source, found);
    if let Some(d) = &mut f.document {
        scrub_string(scrubber, d, found);
    }
    scrub_string(scrubber, &mut f.retrieved_by, found);
}

/// Scrubs every text of an attempt's outcome: a report's summary, findings and gaps, or a failure's
/// account of what was attempted, its detail and its partial findings.
pub fn scrub_outcome(
    scrubber: &Scrubber,
    mut outcome: Result<SubagentReport, SubtaskFailure>,
) -> (Result<SubagentReport, SubtaskFailure>, Redactions) {
    let mut found = Redactions::default();
    match &mut outcome {
        Ok(report) => {
            scrub_string(scrubber, &mut report.summary, &mut found);
            for gap in &mut report.gaps {
                scrub_string(scrubber, gap, &mut found);
            }
            for f in &mut report.findings {
                scrub_finding(scrubber, f, &mut found);
            }
        }
        Err(failure) => {
            scrub_string(scrubber, &mut failure.attempted, &mut found);
            scrub_string(scrubber, &mut failure.detail, &mut found);
            for f in &mut failure.partial {
                scrub_finding(scrubber, f, &mut found);
            }
        }
    }
    (outcome, found)
}

/// Scrubs every text a session's tool call carries to keel (a progress note, findings, a lead's
/// delegation briefs, an escalation's reason, question and options) before the coordinator stores or
/// acts on it.
pub fn scrub_tool_call(scrubber: &Scrubber, mut call: SessionToolCall) -> SessionToolCall {
    let mut found = Redactions::default();
    let mut s = |text: &mut String| scrub_string(scrubber, text, &mut found);
    match &mut call.request {
        SessionRequest::GetTaskDetails { .. } => {}
        SessionRequest::ReportProgress { note } => s(note),
        SessionRequest::ReportFindings { findings } => {
            for f in findings {
                scrub_finding(scrubber, f, &mut Redactions::default());
            }
        }
        SessionRequest::Delegate { calls } => {
            for c in calls {
                s(&mut c.brief);
                s(&mut c.goal);
                for q in &mut c.quality_criteria {
                    s(q);
                }
                if let Some(schema) = &mut c.output_schema {
                    s(schema);
                }
            }
        }
        SessionRequest::Escalate {
            reason,
            question,
            options,
        } => {
            s(reason);
            s(question);
            for o in options {
                s(o);
            }
        }
    }
    call
}

/// Scrubs what a tool's answer hands a session from the store (a task's brief, kept as the user gave
/// it, its outcome, findings and notes): an answer goes to the model provider, a way out like a
/// preamble.
pub fn scrub_answer(scrubber: &Scrubber, mut answer: SessionAnswer) -> SessionAnswer {
    let mut found = Redactions::default();
    if let SessionAnswer::TaskDetails(details) = &mut answer {
        scrub_string(scrubber, &mut details.brief, &mut found);
        scrub_string(scrubber, &mut details.goal, &mut found);
        if let Some(o) = &mut details.outcome {
            scrub_string(scrubber, o, &mut found);
        }
        for f in &mut details.reported_findings {
            scrub_finding(scrubber, f, &mut found);
        }
        for n in &mut details.progress_notes {
            scrub_string(scrubber, n, &mut found);
        }
    }
    answer
}

impl Specialist {
    /// A harness event, scrubbed, then handled; the row it becomes records what was removed.
    pub(super) fn ingest(
        &mut self,
        event: HarnessEvent,
        now: Millis,
        out: &mut Vec<SpecialistEffect>,
    ) {
        let (event, found) = scrub_event(&self.scrubber, event);
        self.ingest_redactions = found;
        self.on_harness(event, now, out);
        // An event that became no row (past the row limit, or after the session ended) leaves nothing
        // to a later row.
        self.ingest_redactions = Redactions::default();
    }

    /// An attempt's outcome, scrubbed; what was removed goes to the row that announces it.
    pub(super) fn scrubbed_outcome(
        &mut self,
        outcome: Result<SubagentReport, SubtaskFailure>,
    ) -> Result<SubagentReport, SubtaskFailure> {
        let (outcome, found) = scrub_outcome(&self.scrubber, outcome);
        self.ingest_redactions.merge(&found);
        outcome
    }
}
