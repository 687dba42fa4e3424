//! The tools a harness session calls back into keel with (docs/DESIGN.md §10): `get_task_details`,
//! `report_progress`, `report_findings`, `delegate` and `escalate`, as typed messages.
//!
//! A session's CLI calls them on an MCP endpoint on its own machine; the endpoint turns each call into
//! a [`SessionToolCall`] for the attempt's specialist (`SpecialistInput::ToolCall`), which passes it to
//! its coordinator (`SpecialistReply::Tool`); the coordinator's [`SessionAnswer`] comes back as
//! `SpecialistMsg::ToolAnswer` and leaves the specialist as `SpecialistEffect::AnswerTool`, which the
//! host hands to the endpoint's waiting call. No MCP type appears here: the messages travel the way a
//! specialist's replies already do, so a cluster carries them unchanged. Arguments are checked here,
//! once, by [`parse_request`], so the endpoint and any other host refuse the same inputs with an error
//! naming the field.

use crate::ids::AttemptId;
use crate::message::DelegationCall;
use crate::report::{Finding, StepOutcome};
use keel_store::{TaskId, TaskStatus};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The name the tools are served under (`mcp__keel__report_progress` in Claude Code).
pub const SESSION_TOOL_SERVER: &str = "keel";
/// Expands a task of the session's own thread.
pub const TOOL_GET_TASK_DETAILS: &str = "get_task_details";
/// A durable progress note.
pub const TOOL_REPORT_PROGRESS: &str = "report_progress";
/// Findings bound to sources, durable before the answer.
pub const TOOL_REPORT_FINDINGS: &str = "report_findings";
/// A lead's subtasks, run in parallel; answered with their outcomes.
pub const TOOL_DELEGATE: &str = "delegate";
/// A question for a human.
pub const TOOL_ESCALATE: &str = "escalate";
/// Every tool, in the order they are listed.
pub const SESSION_TOOLS: [&str; 5] = [
    TOOL_GET_TASK_DETAILS,
    TOOL_REPORT_PROGRESS,
    TOOL_REPORT_FINDINGS,
    TOOL_DELEGATE,
    TOOL_ESCALATE,
];

/// Most bytes of a progress note.
pub const NOTE_BYTES_MAX: usize = 2 * 1024;
/// Most progress notes kept on one task (the oldest go first).
pub const NOTES_PER_TASK_MAX: usize = 64;
/// Most findings in one `report_findings` call.
pub const FINDINGS_PER_CALL_MAX: usize = 32;
/// Most bytes of one call's findings as JSON: they are kept inline on the task row.
pub const FINDINGS_JSON_BYTES_MAX: usize = 8 * 1024;
/// Most `report_findings` calls kept on one task.
pub const FINDINGS_CALLS_PER_TASK_MAX: usize = 64;
/// Most subtasks in one `delegate` call.
pub const SUBTASKS_PER_CALL_MAX: usize = 16;
/// Most bytes of a subtask's brief.
pub const SUBTASK_BRIEF_BYTES_MAX: usize = 32 * 1024;
/// Most bytes of any other text argument (a goal, a criterion, a reason, a question, an option).
pub const ARG_TEXT_BYTES_MAX: usize = 4 * 1024;
/// Most items of a list argument other than findings and subtasks.
pub const ARG_ITEMS_MAX: usize = 16;
/// Most bytes of a call id.
pub const CALL_ID_BYTES_MAX: usize = 128;
/// Most characters of the text `get_task_details` answers with.
pub const DETAILS_CHARS_MAX: usize = 8_000;
/// The prefix of the task attachments that hold findings a session reported.
pub const FINDINGS_ATTACHMENT_PREFIX: &str = "reported-findings-";

/// The findings a task's sessions reported through `report_findings`, in the order they were
/// recorded, read from its row's attachments (what `get_task_details` shows and what a test or
/// the simulator checks against what a session was told).
pub fn reported_findings(row: &keel_store::Task) -> Vec<Finding> {
    row.attachments
        .iter()
        .filter(|a| a.name.starts_with(FINDINGS_ATTACHMENT_PREFIX))
        .filter_map(|a| match &a.body {
            keel_store::AttachmentBody::Inline(body) => {
                serde_json::from_str::<Vec<Finding>>(body).ok()
            }
            keel_store::AttachmentBody::Blob { .. } => None,
        })
        .flatten()
        .collect()
}

/// One tool call of a session, as its attempt's specialist receives it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionToolCall {
    /// Unique within the attempt (the endpoint mints it); a repeated id is a duplicate, answered
    /// again and never done twice.
    pub call_id: String,
    /// What the session asks.
    pub request: SessionRequest,
}

/// What a session asks of keel. Arguments are already checked ([`parse_request`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionRequest {
    /// Expand a task of the session's own thread (an ancestor, a dependency, a delegated subtask).
    GetTaskDetails {
        /// The task.
        task: TaskId,
    },
    /// A progress note, durable before the answer, shown live and read by the resume preamble.
    ReportProgress {
        /// The note.
        note: String,
    },
    /// Findings bound to sources, durable before the answer (a session that dies after reporting
    /// keeps them).
    ReportFindings {
        /// The findings.
        findings: Vec<Finding>,
    },
    /// A lead's subtasks, run in parallel; the answer is their outcomes once they all ended.
    Delegate {
        /// One call per subtask.
        calls: Vec<DelegationCall>,
    },
    /// A question for a human, recorded as an escalation with a self-contained payload.
    Escalate {
        /// Why a human is needed.
        reason: String,
        /// What to ask.
        question: String,
        /// The answers the session can act on, if it has a list.
        options: Vec<String>,
    },
}

impl SessionRequest {
    /// The tool's name.
    pub fn tool(&self) -> &'static str {
        match self {
            SessionRequest::GetTaskDetails { .. } => TOOL_GET_TASK_DETAILS,
            SessionRequest::ReportProgress { .. } => TOOL_REPORT_PROGRESS,
            SessionRequest::ReportFindings { .. } => TOOL_REPORT_FINDINGS,
            SessionRequest::Delegate { .. } => TOOL_DELEGATE,
            SessionRequest::Escalate { .. } => TOOL_ESCALATE,
        }
    }
}

/// A task as `get_task_details` shows it: scrubbed and bounded like a preamble.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskDetails {
    /// The task.
    pub task: TaskId,
    /// Its parent, if any.
    pub parent: Option<TaskId>,
    /// Where it stands.
    pub status: TaskStatus,
    /// Its brief (cut to fit, scrubbed).
    pub brief: String,
    /// Its goal.
    pub goal: String,
    /// Its outcome as stored (a report or a failure as JSON), cut to fit, once it has one.
    pub outcome: Option<String>,
    /// Findings its sessions reported through `report_findings`.
    pub reported_findings: Vec<Finding>,
    /// Its newest progress notes.
    pub progress_notes: Vec<String>,
}

/// Why keel did not do what a session asked: typed, so the model can act on it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[non_exhaustive]
pub enum ToolRefusal {
    /// The task is not one this session may read (another thread, another run, or no such task).
    #[error("task {task} is not a task of this session's thread")]
    NotInThread {
        /// The task asked for.
        task: TaskId,
    },
    /// Only a lead session may delegate.
    #[error("only a lead session may delegate")]
    NotALead,
    /// A limit of the task or the run (delegation turns, notes, findings, steps) is reached.
    #[error("over a limit: {limit}")]
    OverLimit {
        /// Which limit.
        limit: String,
    },
    /// The session's attempt is over (or was superseded): nothing it asks is done any more.
    #[error("the session's attempt has ended")]
    SessionEnded,
    /// The run is ending or ended.
    #[error("the run is no longer running")]
    RunEnded,
    /// The store did not take the write; nothing of it was written.
    #[error("not written: {why}")]
    NotWritten {
        /// Why.
        why: String,
    },
}

/// The answer to one [`SessionToolCall`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionAnswer {
    /// The task asked for.
    TaskDetails(Box<TaskDetails>),
    /// The note, findings or escalation is durable.
    Recorded {
        /// What was recorded, one line.
        what: String,
    },
    /// The subtasks of a `delegate` call ended: `(call id, outcome)` per subtask, in call order.
    Delegated(Vec<(String, StepOutcome)>),
    /// Not done, and why.
    Refused(ToolRefusal),
}

impl SessionAnswer {
    /// Whether the session should see it as a tool error.
    pub fn is_error(&self) -> bool {
        matches!(self, SessionAnswer::Refused(_))
    }

    /// The answer as the text a model reads (JSON for data, one sentence for a refusal).
    pub fn text(&self) -> String {
        match self {
            SessionAnswer::TaskDetails(d) => json_text(d),
            SessionAnswer::Recorded { what } => format!("recorded: {what}"),
            SessionAnswer::Delegated(results) => {
                let items: Vec<Value> = results
                    .iter()
                    .map(|(id, outcome)| serde_json::json!({"id": id, "outcome": outcome}))
                    .collect();
                json_text(&items)
            }
            SessionAnswer::Refused(r) => format!("refused: {r}"),
        }
    }
}

fn json_text<T: Serialize>(value: &T) -> String {
    // Plain data of strings and integers: serialising cannot fail; the fallback stays valid JSON.
    serde_json::to_string(value).unwrap_or_else(|_| "{}".into())
}

/// A tool's arguments are not what it takes: names the field, so the model can fix its call.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid argument `{field}`: {why}")]
pub struct ArgumentError {
    /// The field, as a path into the arguments (`subtasks[2].brief`).
    pub field: String,
    /// What is wrong with it.
    pub why: String,
}

impl ArgumentError {
    fn new(field: impl Into<String>, why: impl Into<String>) -> Self {
        ArgumentError {
            field: field.into(),
            why: why.into(),
        }
    }
}

/// The JSON input schema of a tool, as the endpoint lists it; `None` for a name keel does not serve.
pub fn input_schema(tool: &str) -> Option<Value> {
    use serde_json::json;
    let schema = match tool {
        TOOL_GET_TASK_DETAILS => json!({
            "type": "object",
            "properties": {"task_id": {"type": "string", "description": "The task's id (a ULID), as the preamble names it."}},
            "required": ["task_id"],
        }),
        TOOL_REPORT_PROGRESS => json!({
            "type": "object",
            "properties": {"note": {"type": "string", "description": "One short progress note."}},
            "required": ["note"],
        }),
        TOOL_REPORT_FINDINGS => json!({
            "type": "object",
            "properties": {"findings": {"type": "array", "items": {
                "type": "object",
                "properties": {
                    "claim": {"type": "string"},
                    "source": {"type": "string", "description": "A URL, a file path or a tool call id."},
                    "confidence_permille": {"type": "integer", "minimum": 0, "maximum": 1000},
                },
                "required": ["claim", "source"],
            }}},
            "required": ["findings"],
        }),
        TOOL_DELEGATE => json!({
            "type": "object",
            "properties": {"subtasks": {"type": "array", "items": {
                "type": "object",
                "properties": {
                    "id": {"type": "string", "description": "Your name for the subtask (answers carry it)."},
                    "brief": {"type": "string"},
                    "goal": {"type": "string"},
                    "quality_criteria": {"type": "array", "items": {"type": "string"}},
                    "assignee": {"type": "string", "description": "An agent profile's name."},
                },
                "required": ["brief"],
            }}},
            "required": ["subtasks"],
        }),
        TOOL_ESCALATE => json!({
            "type": "object",
            "properties": {
                "reason": {"type": "string"},
                "question": {"type": "string"},
                "options": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["reason", "question"],
        }),
        _ => return None,
    };
    Some(schema)
}

/// One line saying what a tool does, for the endpoint's tool list.
pub fn description(tool: &str) -> &'static str {
    match tool {
        TOOL_GET_TASK_DETAILS => {
            "Expand a task of your own thread (an ancestor or dependency your preamble names, or a subtask you delegated): brief, status, outcome, findings."
        }
        TOOL_REPORT_PROGRESS => {
            "Record a short progress note; it is durable and a later session of your task reads it."
        }
        TOOL_REPORT_FINDINGS => {
            "Record findings bound to their sources; they are durable before this answers and survive a crash of your session."
        }
        TOOL_DELEGATE => {
            "Lead sessions only: run subtasks in parallel; answers with each subtask's report or failure once all ended."
        }
        TOOL_ESCALATE => {
            "Ask a human: records an escalation with your reason, question and options."
        }
        _ => "",
    }
}

/// Checks a tool's arguments and turns them into a request. Nothing is done for a refused call.
///
/// # Errors
/// [`ArgumentError`] naming the first field that is missing, of the wrong type, empty or too large;
/// `field` is `name` for a tool keel does not serve.
pub fn parse_request(tool: &str, args: &Value) -> Result<SessionRequest, ArgumentError> {
    let obj = args
        .as_object()
        .ok_or_else(|| ArgumentError::new("arguments", "must be a JSON object"))?;
    match tool {
        TOOL_GET_TASK_DETAILS => {
            let raw = text(obj.get("task_id"), "task_id", CALL_ID_BYTES_MAX)?;
            let task = raw.parse::<TaskId>().map_err(|_| {
                ArgumentError::new("task_id", "is not a task id (a 26-character ULID)")
            })?;
            Ok(SessionRequest::GetTaskDetails { task })
        }
        TOOL_REPORT_PROGRESS => Ok(SessionRequest::ReportProgress {
            note: text(obj.get("note"), "note", NOTE_BYTES_MAX)?,
        }),
        TOOL_REPORT_FINDINGS => {
            let items = list(obj.get("findings"), "findings", FINDINGS_PER_CALL_MAX)?;
            let mut findings = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                findings.push(finding(item, &format!("findings[{i}]"))?);
            }
            if json_text(&findings).len() > FINDINGS_JSON_BYTES_MAX {
                return Err(ArgumentError::new(
                    "findings",
                    format!(
                        "more than {FINDINGS_JSON_BYTES_MAX} bytes in one call; report them in several calls"
                    ),
                ));
            }
            Ok(SessionRequest::ReportFindings { findings })
        }
        TOOL_DELEGATE => {
            let items = list(obj.get("subtasks"), "subtasks", SUBTASKS_PER_CALL_MAX)?;
            let mut calls: Vec<DelegationCall> = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let call = subtask(item, i)?;
                if calls.iter().any(|c| c.call_id == call.call_id) {
                    return Err(ArgumentError::new(
                        format!("subtasks[{i}].id"),
                        "repeats the id of an earlier subtask",
                    ));
                }
                calls.push(call);
            }
            Ok(SessionRequest::Delegate { calls })
        }
        TOOL_ESCALATE => {
            let options = match obj.get("options") {
                None | Some(Value::Null) => Vec::new(),
                v => strings(v, "options")?,
            };
            Ok(SessionRequest::Escalate {
                reason: text(obj.get("reason"), "reason", ARG_TEXT_BYTES_MAX)?,
                question: text(obj.get("question"), "question", ARG_TEXT_BYTES_MAX)?,
                options,
            })
        }
        other => Err(ArgumentError::new(
            "name",
            format!(
                "keel has no tool {:?}",
                other.chars().take(64).collect::<String>()
            ),
        )),
    }
}

/// A required, non-blank string of at most `bytes_max` bytes.
fn text(value: Option<&Value>, field: &str, bytes_max: usize) -> Result<String, ArgumentError> {
    let s = match value {
        None | Some(Value::Null) => return Err(ArgumentError::new(field, "is required")),
        Some(Value::String(s)) => s,
        Some(_) => return Err(ArgumentError::new(field, "must be a string")),
    };
    if s.trim().is_empty() {
        return Err(ArgumentError::new(field, "must not be blank"));
    }
    if s.len() > bytes_max {
        return Err(ArgumentError::new(
            field,
            format!("is {} bytes, over the limit of {bytes_max}", s.len()),
        ));
    }
    Ok(s.clone())
}

fn optional_text(
    value: Option<&Value>,
    field: &str,
    bytes_max: usize,
) -> Result<Option<String>, ArgumentError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        v => text(v, field, bytes_max).map(Some),
    }
}

/// A required, non-empty array of at most `items_max` items.
fn list<'a>(
    value: Option<&'a Value>,
    field: &str,
    items_max: usize,
) -> Result<&'a Vec<Value>, ArgumentError> {
    let items = match value {
        None | Some(Value::Null) => return Err(ArgumentError::new(field, "is required")),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(ArgumentError::new(field, "must be an array")),
    };
    if items.is_empty() {
        return Err(ArgumentError::new(field, "must not be empty"));
    }
    if items.len() > items_max {
        return Err(ArgumentError::new(
            field,
            format!("has {} items, over the limit of {items_max}", items.len()),
        ));
    }
    Ok(items)
}

fn strings(value: Option<&Value>, field: &str) -> Result<Vec<String>, ArgumentError> {
    let items = match value {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(items)) => items,
        Some(_) => return Err(ArgumentError::new(field, "must be an array of strings")),
    };
    if items.len() > ARG_ITEMS_MAX {
        return Err(ArgumentError::new(
            field,
            format!(
                "has {} items, over the limit of {ARG_ITEMS_MAX}",
                items.len()
            ),
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, v)| text(Some(v), &format!("{field}[{i}]"), ARG_TEXT_BYTES_MAX))
        .collect()
}

fn finding(item: &Value, field: &str) -> Result<Finding, ArgumentError> {
    let obj = item
        .as_object()
        .ok_or_else(|| ArgumentError::new(field, "must be an object"))?;
    let confidence = match obj.get("confidence_permille") {
        None | Some(Value::Null) => 500,
        Some(v) => v
            .as_u64()
            .filter(|c| *c <= 1000)
            .and_then(|c| u16::try_from(c).ok())
            .ok_or_else(|| {
                ArgumentError::new(
                    format!("{field}.confidence_permille"),
                    "must be an integer from 0 to 1000",
                )
            })?,
    };
    Ok(Finding {
        claim: text(
            obj.get("claim"),
            &format!("{field}.claim"),
            ARG_TEXT_BYTES_MAX,
        )?,
        source: text(
            obj.get("source"),
            &format!("{field}.source"),
            ARG_TEXT_BYTES_MAX,
        )?,
        document: optional_text(
            obj.get("document"),
            &format!("{field}.document"),
            ARG_TEXT_BYTES_MAX,
        )?,
        page: None,
        confidence_permille: confidence,
        retrieved_by: String::new(),
        retrieved_at_ms: 0,
    })
}

fn subtask(item: &Value, i: usize) -> Result<DelegationCall, ArgumentError> {
    let field = format!("subtasks[{i}]");
    let obj = item
        .as_object()
        .ok_or_else(|| ArgumentError::new(&field, "must be an object"))?;
    let brief = text(
        obj.get("brief"),
        &format!("{field}.brief"),
        SUBTASK_BRIEF_BYTES_MAX,
    )?;
    let goal = optional_text(
        obj.get("goal"),
        &format!("{field}.goal"),
        ARG_TEXT_BYTES_MAX,
    )?
    .unwrap_or_else(|| brief.chars().take(200).collect());
    Ok(DelegationCall {
        call_id: optional_text(obj.get("id"), &format!("{field}.id"), CALL_ID_BYTES_MAX)?
            .unwrap_or_else(|| format!("subtask-{}", i + 1)),
        brief,
        goal,
        quality_criteria: strings(
            obj.get("quality_criteria"),
            &format!("{field}.quality_criteria"),
        )?,
        output_schema: None,
        assignee: optional_text(
            obj.get("assignee"),
            &format!("{field}.assignee"),
            CALL_ID_BYTES_MAX,
        )?,
    })
}

/// What a host gives a session for the endpoint: where it is and the token that scopes it.
#[derive(Clone, PartialEq, Eq)]
pub struct SessionAccess {
    /// The endpoint's URL.
    pub url: String,
    /// The session's bearer token: valid for exactly this attempt until it is closed.
    pub token: String,
}

impl std::fmt::Debug for SessionAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // A token is a credential: never in a log line.
        f.debug_struct("SessionAccess")
            .field("url", &self.url)
            .field("token", &"<redacted>")
            .finish()
    }
}

/// Where an endpoint hands a session's tool calls: the attempt's specialist (a local cast today; a
/// cast over the cluster when the specialist runs elsewhere). Returns false when the specialist is
/// gone, and the endpoint answers the call as ended.
pub type DeliverToolCall = Box<dyn Fn(SessionToolCall) -> bool + Send + Sync>;

/// The endpoint as a host sees it: a session is opened when it starts (its token minted) and closed
/// when it ends (its token revoked, its waiting calls answered as ended); answers reach the call that
/// waits for them. keel-mcp implements it over MCP streamable HTTP; the runtime holds it as a trait
/// object, so keel-actors does not depend on the HTTP stack.
pub trait SessionEndpoint: Send + Sync + std::fmt::Debug {
    /// Mints a token for `attempt`, whose calls go to `deliver`. Opening an attempt again replaces
    /// its token.
    ///
    /// # Errors
    /// [`EndpointUnavailable`] when no token can be minted (the OS gave no randomness, or the
    /// endpoint stopped); the session then runs without the tools.
    fn open(
        &self,
        attempt: AttemptId,
        deliver: DeliverToolCall,
    ) -> Result<SessionAccess, EndpointUnavailable>;
    /// Revokes the attempt's token and answers its waiting calls as ended. Idempotent.
    fn close(&self, attempt: AttemptId);
    /// Hands an answer to the call waiting for it; an answer nobody waits for is dropped.
    fn answer(&self, attempt: AttemptId, call_id: &str, answer: SessionAnswer);
}

/// The endpoint could not open a session.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("the MCP endpoint cannot open a session: {0}")]
pub struct EndpointUnavailable(pub String);
