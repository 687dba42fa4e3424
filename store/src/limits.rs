//! Size limits for everything the store accepts (TigerBeetle's "put a limit on everything").
//!
//! Oversize input is refused with a [`LimitError`] naming the field, its size and the limit; the one
//! exception is an attachment above [`Limits::inline_bytes_max`] but within
//! [`Limits::attachment_bytes_max`], which the store moves into the blob table and references from the
//! task row. Nothing is ever truncated silently.

use crate::model::{
    AgentProfile, Attachment, AttachmentBody, AuditEntry, Checkpoint, DeadLetter, Escalation,
    EscalationResolution, EscalationWait, GateMark, IdempotencyRecord, ManifestEntry,
    ManifestOutcome, Run, SessionLogRow, Task,
};

/// The ceilings the store enforces. Sizes are in bytes of UTF-8 (or raw bytes for blobs), counts in
/// items. Passed at open time so a host can tighten them; the defaults suit the CLI and the simulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most bytes in a brief (a run's or a task's), so one prompt cannot fill the database.
    pub brief_bytes_max: u64,
    /// Most bytes in an output kept in a row: a task's outcome, a dead letter's payload. Larger
    /// outputs belong in an attachment, which can live in the blob table.
    pub output_bytes_max: u64,
    /// Most bytes in a checkpoint's state (the coordinator's snapshot of its steps): a run of
    /// 1,024 steps (`PLAN_STEPS_MAX`) whose steps each carry their newest failure and a lead's
    /// delegated brief passes the 256 KiB of an output, and refusing its checkpoint fails the run.
    pub checkpoint_bytes_max: u64,
    /// Most bytes in a session log row's one-line summary (what a resume preamble shows).
    pub log_summary_bytes_max: u64,
    /// Most bytes in a session log row's detail.
    pub log_detail_bytes_max: u64,
    /// Most bytes in one attachment or blob; above this it is refused.
    pub attachment_bytes_max: u64,
    /// Attachments above this size are stored by reference in the blob table instead of in the row,
    /// so task rows stay small and reads of a task tree stay cheap.
    pub inline_bytes_max: u64,
    /// Most bytes in any other free-text field (goal, criteria, reasons, a system prompt).
    pub text_bytes_max: u64,
    /// Most bytes in a run's plan (its own row, written once): a plan of 1,024 steps with
    /// paragraph briefs fits; a plan of megabytes is refused, not stored.
    pub plan_bytes_max: u64,
    /// Most bytes in a name or key (idempotency key, agent name, attachment name, tool name).
    pub key_bytes_max: u64,
    /// Most items in any list field (criteria, attachments, notes, tools, verified outputs).
    pub list_items_max: u64,
    /// Most staged writes in one group commit, so one commit's transaction stays bounded.
    pub batch_items_max: u64,
    /// Most rows one read call may return.
    pub read_rows_max: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            brief_bytes_max: 64 * 1024,
            output_bytes_max: 256 * 1024,
            checkpoint_bytes_max: 4 * 1024 * 1024,
            log_summary_bytes_max: 512,
            log_detail_bytes_max: 16 * 1024,
            attachment_bytes_max: 16 * 1024 * 1024,
            inline_bytes_max: 8 * 1024,
            text_bytes_max: 64 * 1024,
            plan_bytes_max: 4 * 1024 * 1024,
            key_bytes_max: 256,
            list_items_max: 1024,
            batch_items_max: 4096,
            read_rows_max: 10_000,
        }
    }
}

/// An input was larger than its limit. Names the field so the caller can say what to shorten.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field} is {size} (bytes or items), over the limit of {limit}")]
pub struct LimitError {
    /// The field that was too large (`task.brief`, `session_log.summary`, ...).
    pub field: &'static str,
    /// Its size in bytes (or items for a list).
    pub size: u64,
    /// The limit it exceeded.
    pub limit: u64,
}

fn len_u64(len: usize) -> u64 {
    u64::try_from(len).unwrap_or(u64::MAX)
}

impl Limits {
    fn bytes(&self, field: &'static str, s: &str, limit: u64) -> Result<(), LimitError> {
        let size = len_u64(s.len());
        if size > limit {
            return Err(LimitError { field, size, limit });
        }
        Ok(())
    }

    fn text(&self, field: &'static str, s: &str) -> Result<(), LimitError> {
        self.bytes(field, s, self.text_bytes_max)
    }

    fn key(&self, field: &'static str, s: &str) -> Result<(), LimitError> {
        self.bytes(field, s, self.key_bytes_max)
    }

    fn items(&self, field: &'static str, n: usize) -> Result<(), LimitError> {
        let size = len_u64(n);
        if size > self.list_items_max {
            return Err(LimitError {
                field,
                size,
                limit: self.list_items_max,
            });
        }
        Ok(())
    }

    /// Checks a run row.
    pub fn check_run(&self, run: &Run) -> Result<(), LimitError> {
        self.bytes("run.brief", &run.brief, self.brief_bytes_max)?;
        if let Some(plan) = &run.plan {
            self.bytes("run.plan", plan, self.plan_bytes_max)?;
        }
        self.text("run.config_snapshot", &run.config_snapshot)?;
        if let Some(outcome) = &run.outcome {
            self.bytes("run.outcome", outcome, self.output_bytes_max)?;
        }
        Ok(())
    }

    /// Checks a task row, except the attachments' sizes against the inline threshold (those are moved
    /// to the blob table at commit); an attachment over [`Limits::attachment_bytes_max`] is refused here.
    pub fn check_task(&self, task: &Task) -> Result<(), LimitError> {
        self.bytes("task.brief", &task.brief, self.brief_bytes_max)?;
        self.text("task.goal", &task.goal)?;
        self.items("task.quality_criteria", task.quality_criteria.len())?;
        for c in &task.quality_criteria {
            self.text("task.quality_criteria[]", c)?;
        }
        if let Some(s) = &task.output_schema {
            self.text("task.output_schema", s)?;
        }
        if let Some(a) = &task.assignee {
            self.key("task.assignee", a)?;
        }
        if let Some(m) = &task.model {
            self.key("task.model", m)?;
        }
        if let Some(o) = &task.observed {
            self.key("task.observed.harness", &o.harness)?;
            self.key("task.observed.account", &o.account)?;
            self.key("task.observed.native_session_id", &o.native_session_id)?;
        }
        if let Some(k) = &task.idempotency_key {
            self.key("task.idempotency_key", k)?;
        }
        if let Some(o) = &task.outcome {
            self.bytes("task.outcome", o, self.output_bytes_max)?;
        }
        self.items("task.attachments", task.attachments.len())?;
        for a in &task.attachments {
            self.check_attachment(a)?;
        }
        self.items("task.progress_notes", task.progress_notes.len())?;
        for n in &task.progress_notes {
            self.text("task.progress_notes[]", n)?;
        }
        Ok(())
    }

    /// Checks one attachment against the attachment maximum (not the inline threshold).
    pub fn check_attachment(&self, a: &Attachment) -> Result<(), LimitError> {
        self.key("attachment.name", &a.name)?;
        let size = match &a.body {
            AttachmentBody::Inline(s) => len_u64(s.len()),
            AttachmentBody::Blob { len, .. } => *len,
        };
        self.check_blob_len(size)
    }

    /// Checks a blob's size against the attachment maximum.
    pub fn check_blob_len(&self, size: u64) -> Result<(), LimitError> {
        if size > self.attachment_bytes_max {
            return Err(LimitError {
                field: "attachment.body",
                size,
                limit: self.attachment_bytes_max,
            });
        }
        Ok(())
    }

    /// Checks a session log row: the summary and the detail have their own limits; the redaction
    /// counts hold each kind at most once.
    pub fn check_log_row(&self, row: &SessionLogRow) -> Result<(), LimitError> {
        self.bytes(
            "session_log.summary",
            &row.summary,
            self.log_summary_bytes_max,
        )?;
        self.bytes("session_log.detail", &row.detail, self.log_detail_bytes_max)?;
        // One entry per kind at most.
        let kinds = crate::SecretKind::ALL.len();
        if row.redactions.len() > kinds {
            return Err(LimitError {
                field: "session_log.redactions",
                size: len_u64(row.redactions.len()),
                limit: len_u64(kinds),
            });
        }
        Ok(())
    }

    /// Checks a checkpoint.
    pub fn check_checkpoint(&self, c: &Checkpoint) -> Result<(), LimitError> {
        if let Some(s) = &c.last_completed_step {
            self.key("checkpoint.last_completed_step", s)?;
        }
        self.items("checkpoint.verified_outputs", c.verified_outputs.len())?;
        self.items("checkpoint.pending_work", c.pending_work.len())?;
        self.key("checkpoint.correlation_id", &c.correlation_id)?;
        self.bytes("checkpoint.state", &c.state, self.checkpoint_bytes_max)
    }

    /// Checks a manifest entry.
    pub fn check_manifest(&self, m: &ManifestEntry) -> Result<(), LimitError> {
        self.text("manifest.item", &m.item)?;
        if let ManifestOutcome::Failed { reason } = &m.outcome {
            self.text("manifest.outcome.reason", reason)?;
        }
        Ok(())
    }

    /// Checks a dead letter.
    pub fn check_dead_letter(&self, d: &DeadLetter) -> Result<(), LimitError> {
        self.key("dead_letter.subject", &d.subject)?;
        self.bytes("dead_letter.payload", &d.payload, self.output_bytes_max)?;
        self.text("dead_letter.reason", &d.reason)
    }

    /// Checks an idempotency record.
    pub fn check_idempotency(&self, r: &IdempotencyRecord) -> Result<(), LimitError> {
        self.key("idempotency.key", &r.key)?;
        self.text("idempotency.effect", &r.effect)?;
        if let Some(res) = &r.result {
            self.bytes("idempotency.result", res, self.output_bytes_max)?;
        }
        Ok(())
    }

    /// Checks a gate mark.
    pub fn check_gate_mark(&self, m: &GateMark) -> Result<(), LimitError> {
        self.key("gate_mark.gate", &m.gate)
    }

    /// Checks an audit entry.
    pub fn check_audit(&self, a: &AuditEntry) -> Result<(), LimitError> {
        self.key("audit.hook", &a.hook)?;
        self.key("audit.tool", &a.tool)?;
        self.text("audit.reason", &a.reason)?;
        self.key("audit.input_digest", &a.input_digest)
    }

    /// Checks an escalation.
    pub fn check_escalation(&self, e: &Escalation) -> Result<(), LimitError> {
        self.key("escalation.account", &e.account)?;
        self.text("escalation.asked", &e.asked)?;
        self.text("escalation.attempted", &e.attempted)?;
        self.text("escalation.diagnosis", &e.diagnosis)?;
        self.text("escalation.recommended_action", &e.recommended_action)?;
        self.items("escalation.options", e.options.len())?;
        for option in &e.options {
            self.key("escalation.options[]", option)?;
        }
        if let EscalationWait::ToolCall { tool, .. } = &e.waiting {
            self.key("escalation.waiting.tool", tool)?;
        }
        if let Some(resolution) = &e.resolution {
            self.check_resolution(resolution)?;
        }
        Ok(())
    }

    /// Checks an escalation's resolution (a human's answer).
    pub fn check_resolution(&self, r: &EscalationResolution) -> Result<(), LimitError> {
        match r {
            EscalationResolution::Answered { text, .. } => self.text("escalation.answer", text),
            EscalationResolution::Expired { .. } => Ok(()),
        }
    }

    /// Checks an agent profile.
    pub fn check_agent(&self, p: &AgentProfile) -> Result<(), LimitError> {
        self.key("agent.name", &p.name)?;
        self.text("agent.description", &p.description)?;
        self.key("agent.harness", &p.harness)?;
        self.key("agent.model", &p.model)?;
        self.key("agent.account", &p.account)?;
        self.items("agent.tools", p.tools.len())?;
        for t in &p.tools {
            self.key("agent.tools[]", t)?;
        }
        self.text("agent.system_prompt", &p.system_prompt)
    }
}
