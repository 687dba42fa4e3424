//! Escalations (docs/DESIGN.md §9): a hand-off to a human with a self-contained payload (what was
//! asked, what was tried, why it stopped, the amount, a recommended action computed from the case),
//! for the three triggers: a session asking for a human (`escalate`), a policy gap (an `ask` rule
//! waiting for an approval) and no progress (a step parked after its retries). Pure: ids, times and
//! the case come in as arguments; the hosts (the coordinator machine, the runtime, the hook bridge)
//! decide when to raise one and what its answer resumes.

use crate::ids::mint_u128;
use crate::machine::{Entropy, Millis};
use crate::report::{FailureKind, SubtaskFailure, bounded};
use keel_harness::ErrorCategory;
use keel_store::{
    Escalation, EscalationId, EscalationResolution, EscalationTrigger, EscalationWait, LogKind,
    SessionLogRow, TaskId,
};

/// The answer that lets a call waiting for an approval run.
pub const APPROVE: &str = "allow";
/// The answer that refuses it.
pub const REFUSE: &str = "deny";
/// Most bytes of a human's answer (it goes into a preamble).
pub const ANSWER_BYTES_MAX: usize = 4 * 1024;
/// Most bytes of each text field of a payload.
pub const PAYLOAD_TEXT_BYTES_MAX: usize = 4 * 1024;

/// Mint an escalation id from the injected clock and stream (the coordinator's), or from the OS
/// through the runtime's entropy (the hook bridge's).
pub fn mint_escalation_id(now: Millis, rng: &mut dyn Entropy) -> EscalationId {
    EscalationId(mint_u128(now, rng))
}

/// A session asked for a human through `escalate(reason, question, options)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HumanRequest {
    /// The plan step the session works on.
    pub step: String,
    /// The attempt asking.
    pub attempt: u32,
    /// The session's reason.
    pub reason: String,
    /// Its question.
    pub question: String,
    /// The answers it can act on (empty: any text).
    pub options: Vec<String>,
    /// Progress notes the task has so far (what it did before asking).
    pub progress_notes: Vec<String>,
}

/// The escalation of a [`HumanRequest`]: the task pauses until a human answers, then resumes with
/// the answer in its preamble.
pub fn human_requested(
    id: EscalationId,
    now: Millis,
    task: TaskId,
    account: String,
    request: HumanRequest,
) -> Escalation {
    let tried = match request.progress_notes.last() {
        Some(note) => format!(
            "step {}, attempt {}: {} progress notes, the newest: {}",
            request.step,
            request.attempt,
            request.progress_notes.len(),
            note
        ),
        None => format!(
            "step {}, attempt {}: no progress notes before asking",
            request.step, request.attempt
        ),
    };
    let how = match request.options.as_slice() {
        [] => format!("keel answer {id} \"YOUR ANSWER\""),
        [only] => format!("keel answer {id} {:?}", only),
        options => format!(
            "keel answer {id} with one of: {}",
            options
                .iter()
                .map(|o| format!("{o:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    let action = format!(
        "Answer the question \"{}\" with {how}; task {task} stays paused until then and resumes in a new session that reads your answer.",
        one_line(&request.question, 300)
    );
    Escalation {
        id,
        ts_ms: now,
        task_id: Some(task),
        trigger: EscalationTrigger::HumanRequested,
        account,
        asked: bounded(request.question, PAYLOAD_TEXT_BYTES_MAX),
        attempted: bounded(tried, PAYLOAD_TEXT_BYTES_MAX),
        diagnosis: bounded(request.reason, PAYLOAD_TEXT_BYTES_MAX),
        amount_micros: None,
        recommended_action: bounded(action, PAYLOAD_TEXT_BYTES_MAX),
        options: request.options,
        waiting: EscalationWait::Task,
        resolution: None,
    }
}

/// A tool call an `ask` rule stopped for a human's approval.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApprovalCase {
    /// The tool, by its literal name.
    pub tool: String,
    /// The call as rules match it (`Bash(rm -rf build)`), cut to fit.
    pub subject: String,
    /// The rule or hook that asked, and its reason.
    pub asked_by: String,
    /// The amount the call moves, in micro-dollars, when its input names one.
    pub amount_micros: Option<u64>,
    /// When the call is denied if nobody answered.
    pub deadline_ms: Millis,
    /// The approvals this task already got for this tool.
    pub approved_before: u32,
}

/// The escalation of an [`ApprovalCase`] (the policy-gap trigger): the call waits for
/// [`APPROVE`] or [`REFUSE`].
pub fn approval(
    id: EscalationId,
    now: Millis,
    task: TaskId,
    account: String,
    case: ApprovalCase,
) -> Escalation {
    let wait_s = case.deadline_ms.saturating_sub(now) / 1000;
    let money = case
        .amount_micros
        .map(|m| format!(" It moves {}.", dollars(m)))
        .unwrap_or_default();
    let history = match case.approved_before {
        0 => String::from(" No earlier call of this tool was approved in this task."),
        n => format!(" {n} earlier calls of this tool were approved in this task."),
    };
    let action = format!(
        "Approve with `keel answer {id} {APPROVE}` if running {} is intended, else `keel answer {id} {REFUSE}`.{money}{history} Unanswered within {wait_s} s, the call is denied.",
        one_line(&case.subject, 300)
    );
    Escalation {
        id,
        ts_ms: now,
        task_id: Some(task),
        trigger: EscalationTrigger::PolicyGap,
        account,
        asked: bounded(
            format!("may the session run {}?", case.subject),
            PAYLOAD_TEXT_BYTES_MAX,
        ),
        attempted: bounded(
            format!("a call of tool {}", case.tool),
            PAYLOAD_TEXT_BYTES_MAX,
        ),
        diagnosis: bounded(case.asked_by, PAYLOAD_TEXT_BYTES_MAX),
        amount_micros: case.amount_micros,
        recommended_action: bounded(action, PAYLOAD_TEXT_BYTES_MAX),
        options: vec![APPROVE.into(), REFUSE.into()],
        waiting: EscalationWait::ToolCall {
            tool: case.tool,
            deadline_ms: case.deadline_ms,
        },
        resolution: None,
    }
}

/// A step that made no progress: parked after its retries (the supervisor's verdict).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoProgressCase {
    /// The plan step.
    pub step: String,
    /// Its brief.
    pub brief: String,
    /// Its newest failure.
    pub failure: SubtaskFailure,
    /// Why it was parked.
    pub reason: String,
    /// Attempts it got.
    pub attempts: u32,
}

/// The escalation of a [`NoProgressCase`]: nothing waits (the step is parked); the recommended
/// action follows from the kind of failure.
pub fn no_progress(
    id: EscalationId,
    now: Millis,
    task: Option<TaskId>,
    account: String,
    case: NoProgressCase,
) -> Escalation {
    let target = task.map_or_else(|| "the step".to_string(), |t| format!("task {t}"));
    let then = match task {
        Some(t) => format!("then `keel follow-up {t} \"MESSAGE\"` runs it again"),
        None => "then run the plan again".into(),
    };
    let fix = match &case.failure.kind {
        FailureKind::Harness(ErrorCategory::RateLimited { reset_at_unix_ms }) => {
            match reset_at_unix_ms {
                Some(at) => format!(
                    "The account is rate limited until {at} (Unix ms): wait for the reset or add an account to the agent's pool, {then}."
                ),
                None => format!(
                    "The account is rate limited: wait for its reset or add an account to the agent's pool, {then}."
                ),
            }
        }
        FailureKind::Harness(ErrorCategory::Auth) => {
            format!(
                "The account's credential was refused: renew it (keel doctor shows which), {then}."
            )
        }
        FailureKind::Harness(ErrorCategory::Permission) => format!(
            "The harness refused a permission: widen the agent's permission mode or rules if the step needs it, {then}."
        ),
        FailureKind::Harness(ErrorCategory::ContextOverflow) => format!(
            "The step does not fit the model's context: split its brief into smaller steps or assign an agent with a larger context, {then}."
        ),
        FailureKind::Timeout => format!(
            "Every attempt ran out of time: raise the agent's timeout_ms or narrow the brief, {then}."
        ),
        FailureKind::MalformedReport | FailureKind::NotSuccess => format!(
            "The agent never produced a usable report in {} attempts: read `keel logs {}` for where it stalls, sharpen the brief or the quality criteria, {then}.",
            case.attempts,
            task.map_or_else(|| "TASK".into(), |t| t.to_string())
        ),
        FailureKind::Refused => format!(
            "The supervisor refused the step ({}): raise the limit it names or the run's budget, {then}.",
            one_line(&case.failure.detail, 200)
        ),
        FailureKind::Crashed | FailureKind::Cancelled | FailureKind::Harness(_) => format!(
            "Read `keel logs` of {target} for the cause ({}), fix it, {then}.",
            case.failure.kind.name()
        ),
    };
    Escalation {
        id,
        ts_ms: now,
        task_id: task,
        trigger: EscalationTrigger::NoProgress,
        account,
        asked: bounded(case.brief, PAYLOAD_TEXT_BYTES_MAX),
        attempted: bounded(
            format!(
                "step {}: {} attempts; the last: {}",
                case.step, case.attempts, case.failure.attempted
            ),
            PAYLOAD_TEXT_BYTES_MAX,
        ),
        diagnosis: bounded(case.reason, PAYLOAD_TEXT_BYTES_MAX),
        amount_micros: None,
        recommended_action: bounded(fix, PAYLOAD_TEXT_BYTES_MAX),
        options: Vec::new(),
        waiting: EscalationWait::Nothing,
        resolution: None,
    }
}

/// Why an answer is not taken.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum AnswerRefusal {
    /// It was answered (or expired) before.
    #[error("escalation {id} is closed already ({how})")]
    Closed {
        /// The escalation.
        id: EscalationId,
        /// How it was closed.
        how: String,
    },
    /// A row written before escalations had ids cannot be named.
    #[error("this escalation predates answerable escalations")]
    NoId,
    /// Empty or blank.
    #[error("the answer is blank")]
    Blank,
    /// Over [`ANSWER_BYTES_MAX`].
    #[error("the answer is over {ANSWER_BYTES_MAX} bytes")]
    TooLong,
    /// Not one of the escalation's options.
    #[error("the answer must be one of: {}", .options.join(", "))]
    NotAnOption {
        /// The options.
        options: Vec<String>,
    },
}

/// Checks `text` as the answer to `escalation` and returns it as it is recorded: trimmed, and
/// spelled as the option it names when the escalation has options (matched ignoring case).
///
/// # Errors
/// [`AnswerRefusal`].
pub fn check_answer(escalation: &Escalation, text: &str) -> Result<String, AnswerRefusal> {
    if escalation.id.0 == 0 {
        return Err(AnswerRefusal::NoId);
    }
    if let Some(resolution) = &escalation.resolution {
        return Err(AnswerRefusal::Closed {
            id: escalation.id,
            how: describe(resolution),
        });
    }
    let text = text.trim();
    if text.is_empty() {
        return Err(AnswerRefusal::Blank);
    }
    if text.len() > ANSWER_BYTES_MAX {
        return Err(AnswerRefusal::TooLong);
    }
    if escalation.options.is_empty() {
        return Ok(text.to_string());
    }
    escalation
        .options
        .iter()
        .find(|o| o.trim().eq_ignore_ascii_case(text))
        .cloned()
        .ok_or_else(|| AnswerRefusal::NotAnOption {
            options: escalation.options.clone(),
        })
}

/// Whether a recorded answer approves the call it was asked for.
pub fn approves(answer: &str) -> bool {
    answer.trim().eq_ignore_ascii_case(APPROVE)
}

/// A resolution in a few words (`answered: ...`, `expired`).
pub fn describe(resolution: &EscalationResolution) -> String {
    match resolution {
        EscalationResolution::Answered { text, .. } => {
            format!("answered: {}", one_line(text, 80))
        }
        EscalationResolution::Expired { .. } => "expired unanswered".into(),
    }
}

/// The rows that record `answer` (already checked by [`check_answer`]) to `escalation`, in one
/// stage: its resolution and, for a task waiting on it, the steering row its next session reads.
/// The runtime and the simulator stage exactly these before they tell the run's coordinator.
pub fn answer_ops(escalation: &Escalation, answer: &str, now: Millis) -> Vec<crate::PersistOp> {
    let mut ops = vec![crate::PersistOp::ResolveEscalation {
        id: escalation.id,
        resolution: EscalationResolution::Answered {
            ts_ms: now,
            text: answer.to_owned(),
        },
    }];
    if let (EscalationWait::Task, Some(task)) = (&escalation.waiting, escalation.task_id) {
        ops.push(crate::PersistOp::AppendLog {
            task,
            row: answer_row(escalation, answer, now),
        });
    }
    ops
}

/// The steering row a task's log gets when a human answers its escalation: the resumed session's
/// preamble shows it among its steering messages.
pub fn answer_row(escalation: &Escalation, answer: &str, now: Millis) -> SessionLogRow {
    SessionLogRow {
        ts_ms: now,
        kind: LogKind::Steering,
        summary: bounded(
            format!("a human answered escalation {}", escalation.id),
            512,
        ),
        detail: bounded(
            format!(
                "You asked a human: \"{}\". The human answered: {}",
                one_line(&escalation.asked, 1000),
                answer
            ),
            ANSWER_BYTES_MAX + 1200,
        ),
        redactions: Vec::new(),
    }
}

/// Micro-dollars as dollars with cents.
fn dollars(micros: u64) -> String {
    format!(
        "${}.{:02}",
        micros / 1_000_000,
        (micros % 1_000_000) / 10_000
    )
}

fn one_line(text: &str, bytes_max: usize) -> String {
    bounded(
        crate::context::collapse_whitespace(text, usize::MAX).into_owned(),
        bytes_max,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(options: &[&str]) -> HumanRequest {
        HumanRequest {
            step: "s1".into(),
            attempt: 1,
            reason: "the spec is ambiguous".into(),
            question: "which format?".into(),
            options: options.iter().map(|o| o.to_string()).collect(),
            progress_notes: vec!["read the spec".into()],
        }
    }

    #[test]
    fn a_human_request_pauses_its_task_and_says_how_to_answer() {
        let e = human_requested(
            EscalationId(7),
            1,
            TaskId(3),
            "acct".into(),
            request(&["json", "toml"]),
        );
        assert_eq!(e.waiting, EscalationWait::Task);
        assert!(e.recommended_action.contains("\"json\", \"toml\""));
        assert!(e.attempted.contains("read the spec"));
        let free = human_requested(EscalationId(7), 1, TaskId(3), "a".into(), request(&[]));
        assert!(free.recommended_action.contains("YOUR ANSWER"));
        assert_ne!(free.recommended_action, e.recommended_action);
    }

    #[test]
    fn an_answer_must_be_an_option_and_is_spelled_as_one() {
        let e = human_requested(
            EscalationId(7),
            1,
            TaskId(3),
            "a".into(),
            request(&["JSON"]),
        );
        assert_eq!(check_answer(&e, " json ").unwrap(), "JSON");
        assert!(matches!(
            check_answer(&e, "yaml"),
            Err(AnswerRefusal::NotAnOption { .. })
        ));
        assert_eq!(check_answer(&e, "  "), Err(AnswerRefusal::Blank));
        let mut closed = e.clone();
        closed.resolution = Some(EscalationResolution::Expired { ts_ms: 2 });
        assert!(matches!(
            check_answer(&closed, "JSON"),
            Err(AnswerRefusal::Closed { .. })
        ));
        let mut old = e;
        old.id = EscalationId(0);
        assert_eq!(check_answer(&old, "JSON"), Err(AnswerRefusal::NoId));
    }

    #[test]
    fn an_approval_names_the_call_the_amount_and_the_deadline() {
        let case = ApprovalCase {
            tool: "Bash".into(),
            subject: "Bash(pay 12)".into(),
            asked_by: "ask rule Bash(pay *)".into(),
            amount_micros: Some(12_500_000),
            deadline_ms: 31_000,
            approved_before: 2,
        };
        let e = approval(EscalationId(9), 1_000, TaskId(1), "a".into(), case);
        assert!(e.recommended_action.contains("$12.50"));
        assert!(e.recommended_action.contains("30 s"));
        assert!(e.recommended_action.contains("2 earlier calls"));
        assert_eq!(e.options, vec![APPROVE, REFUSE]);
        assert!(approves("Allow"));
        assert!(!approves("deny"));
    }

    #[test]
    fn no_progress_recommends_by_the_kind_of_failure() {
        let failure = |kind| SubtaskFailure {
            kind,
            attempted: "x".into(),
            partial: Vec::new(),
            retryable: false,
            retry_after_ms: None,
            detail: String::new(),
        };
        let case = |kind| NoProgressCase {
            step: "s".into(),
            brief: "b".into(),
            failure: failure(kind),
            reason: "r".into(),
            attempts: 5,
        };
        let timeout = no_progress(
            EscalationId(1),
            1,
            Some(TaskId(2)),
            "a".into(),
            case(FailureKind::Timeout),
        );
        let overflow = no_progress(
            EscalationId(1),
            1,
            Some(TaskId(2)),
            "a".into(),
            case(FailureKind::Harness(ErrorCategory::ContextOverflow)),
        );
        assert!(timeout.recommended_action.contains("timeout_ms"));
        assert!(overflow.recommended_action.contains("split"));
        assert_eq!(timeout.waiting, EscalationWait::Nothing);
    }
}
