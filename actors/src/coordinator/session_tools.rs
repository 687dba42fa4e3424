//! A session's tool calls at its coordinator (docs/DESIGN.md §10): progress notes and findings are
//! staged durable before the answer, an escalation pauses the task until a human answers (then its
//! next attempt resumes with the answer), and `get_task_details` is answered
//! from the run's task rows, which the coordinator holds in full (only its own run's, so a session
//! can never read another run). `delegate` does not come here: the specialist turns it into a
//! delegation turn ([`super::lead`]).

use super::staging::Then;
use super::{Phase, RunState, StepStatus};
use crate::context::Scrubber;
use crate::effect::Effect;
use crate::escalation::{HumanRequest, human_requested, mint_escalation_id};
use crate::ids::AttemptId;
use crate::machine::{Entropy, Millis};
use crate::message::{SpecialistMsg, SupervisorMsg};
use crate::persist::PersistOp;
use crate::report::{Finding, bounded};
use crate::session_tool::{
    DETAILS_CHARS_MAX, FINDINGS_ATTACHMENT_PREFIX, FINDINGS_CALLS_PER_TASK_MAX, NOTE_BYTES_MAX,
    NOTES_PER_TASK_MAX, SessionAnswer, SessionRequest, TaskDetails, ToolRefusal,
};
use keel_store::{Attachment, AttachmentBody, EscalationId, Task, TaskId, TaskStatus};
use std::collections::{BTreeMap, BTreeSet};

/// Most answers remembered per run (a repeated call older than that is answered as ended).
pub const TOOL_ANSWERS_KEPT_MAX: usize = 4096;
/// Most ancestors walked to decide whether a task is in a session's thread.
const THREAD_WALK_MAX: usize = 64;
/// Most progress notes and findings shown by `get_task_details`.
const DETAILS_ITEMS_MAX: usize = 16;

/// Where the end of an escalated attempt is: its result is settled (charged, never judged) and
/// acknowledged only once the escalation and the paused task are durable, so a specialist never exits
/// while a crash could still lose the escalation (docs/DESIGN.md §12, invariant 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum EscalatedEnd {
    /// The attempt has not ended yet.
    Open,
    /// Its end is charged; the run-row stage that records it (behind the escalation's own, in
    /// ticket order) is on its way, and the acknowledgement goes out once it is durable.
    Settling,
    /// Its end is durable: a resent result is acknowledged again.
    Settled,
}

/// The session tool calls of one run: answered ones (so a repeat is answered again, never done twice)
/// and those whose writes are on their way to the store.
#[derive(Clone, Debug, Default)]
pub(super) struct SessionTools {
    answered: BTreeMap<(AttemptId, String), SessionAnswer>,
    in_flight: BTreeSet<(AttemptId, String)>,
}

impl RunState {
    /// A session's tool call from its specialist.
    pub(super) fn on_tool(
        &mut self,
        from: AttemptId,
        call_id: String,
        request: SessionRequest,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        let key = (from, call_id);
        if let Some(answer) = self.tools.answered.get(&key).cloned() {
            return self.answer_tool(from, key.1, answer, out);
        }
        if self.tools.in_flight.contains(&key) {
            return; // its answer goes out once its writes are durable
        }
        let (_, call_id) = key;
        let index = self.by_task.get(&from.task).copied();
        let live = index.is_some_and(|i| {
            self.steps[i].current(self.id) == Some(from)
                && self.steps[i].status == StepStatus::Running
        });
        if !live {
            return self.answer_tool(
                from,
                call_id,
                SessionAnswer::Refused(ToolRefusal::SessionEnded),
                out,
            );
        }
        if self.phase != Phase::Running {
            return self.answer_tool(
                from,
                call_id,
                SessionAnswer::Refused(ToolRefusal::RunEnded),
                out,
            );
        }
        match request {
            SessionRequest::GetTaskDetails { task } => {
                let answer = match self.details_for(from.task, index, task) {
                    Some(details) => SessionAnswer::TaskDetails(Box::new(details)),
                    None => SessionAnswer::Refused(ToolRefusal::NotInThread { task }),
                };
                self.remember(from, call_id.clone(), answer.clone());
                self.answer_tool(from, call_id, answer, out);
            }
            SessionRequest::ReportProgress { note } => {
                let Some(mut row) = self.tasks.get(&from.task).cloned() else {
                    return self.answer_tool(
                        from,
                        call_id,
                        SessionAnswer::Refused(ToolRefusal::SessionEnded),
                        out,
                    );
                };
                let note = bounded(note, NOTE_BYTES_MAX);
                row.progress_notes.push(note);
                let over = row.progress_notes.len().saturating_sub(NOTES_PER_TASK_MAX);
                row.progress_notes.drain(..over);
                row.updated_ms = now;
                let answer = SessionAnswer::Recorded {
                    what: format!("progress note {}", row.progress_notes.len()),
                };
                self.tasks.insert(row.id, row.clone());
                self.stage_tool(
                    from,
                    call_id,
                    vec![PersistOp::UpdateTask(row)],
                    answer,
                    now,
                    out,
                );
            }
            SessionRequest::ReportFindings { findings } => {
                let Some(mut row) = self.tasks.get(&from.task).cloned() else {
                    return self.answer_tool(
                        from,
                        call_id,
                        SessionAnswer::Refused(ToolRefusal::SessionEnded),
                        out,
                    );
                };
                let reported = row
                    .attachments
                    .iter()
                    .filter(|a| a.name.starts_with(FINDINGS_ATTACHMENT_PREFIX))
                    .count();
                if reported >= FINDINGS_CALLS_PER_TASK_MAX {
                    let limit =
                        format!("{FINDINGS_CALLS_PER_TASK_MAX} report_findings calls per task");
                    return self.answer_tool(
                        from,
                        call_id,
                        SessionAnswer::Refused(ToolRefusal::OverLimit { limit }),
                        out,
                    );
                }
                let count = findings.len();
                // Plain data of strings and integers: serialising cannot fail.
                let body = serde_json::to_string(&findings).unwrap_or_else(|_| "[]".into());
                row.attachments.push(Attachment {
                    name: format!("{FINDINGS_ATTACHMENT_PREFIX}{}", reported + 1),
                    body: AttachmentBody::Inline(body),
                });
                row.updated_ms = now;
                self.tasks.insert(row.id, row.clone());
                let answer = SessionAnswer::Recorded {
                    what: format!("{count} findings"),
                };
                self.stage_tool(
                    from,
                    call_id,
                    vec![PersistOp::UpdateTask(row)],
                    answer,
                    now,
                    out,
                );
            }
            SessionRequest::Escalate {
                reason,
                question,
                options,
            } => {
                let Some(index) = index else {
                    return self.answer_tool(
                        from,
                        call_id,
                        SessionAnswer::Refused(ToolRefusal::SessionEnded),
                        out,
                    );
                };
                let Some(mut row) = self.tasks.get(&from.task).cloned() else {
                    return self.answer_tool(
                        from,
                        call_id,
                        SessionAnswer::Refused(ToolRefusal::SessionEnded),
                        out,
                    );
                };
                let id = mint_escalation_id(now, rng);
                let account = self.steps[index]
                    .assignment
                    .as_ref()
                    .map(|a| a.account.clone())
                    .unwrap_or_default();
                let step = self.steps[index].spec.key.clone();
                let request = HumanRequest {
                    step: step.clone(),
                    attempt: from.attempt,
                    reason,
                    question,
                    options,
                    progress_notes: row.progress_notes.clone(),
                };
                let escalation = human_requested(id, now, from.task, account, request);
                // From here on the attempt's result is settled, never judged: the task waits for
                // the human whatever its session does before it is stopped.
                self.steps[index].status = StepStatus::AwaitingHuman;
                self.steps[index].awaiting = Some((id, EscalatedEnd::Open));
                row.status = TaskStatus::Paused;
                row.updated_ms = now;
                self.tasks.insert(row.id, row.clone());
                self.decide(
                    now,
                    format_args!(
                        "step {step}: its session escalated to a human (escalation {id}); task {} is paused until `keel answer {id}`",
                        from.task
                    ),
                );
                let answer = SessionAnswer::Recorded {
                    what: format!(
                        "escalation {id}: a human will answer. End your turn now: this session is stopped, and your task continues in a new session whose preamble has the answer"
                    ),
                };
                self.tools.in_flight.insert((from, call_id.clone()));
                self.stage(
                    vec![
                        PersistOp::AppendEscalation(escalation),
                        PersistOp::UpdateTask(row),
                    ],
                    Then::Escalated {
                        attempt: from,
                        call_id,
                        answer: Box::new(answer),
                    },
                    false,
                    now,
                    out,
                );
            }
            SessionRequest::Delegate { .. } => {
                // The specialist takes `delegate` as a delegation turn; one that reaches here is not
                // from a lead's session.
                self.answer_tool(
                    from,
                    call_id,
                    SessionAnswer::Refused(ToolRefusal::NotALead),
                    out,
                );
            }
        }
    }

    /// The writes of a call are durable: answer it.
    pub(super) fn on_tool_durable(
        &mut self,
        attempt: AttemptId,
        call_id: String,
        answer: SessionAnswer,
        out: &mut Vec<Effect>,
    ) {
        self.tools.in_flight.remove(&(attempt, call_id.clone()));
        self.remember(attempt, call_id.clone(), answer.clone());
        self.answer_tool(attempt, call_id, answer, out);
    }

    /// An `escalate` call's escalation and paused task are durable: answer the call, then stop the
    /// session (the answer goes first, so the model reads it; a session's end answers nothing more).
    pub(super) fn on_escalation_durable(
        &mut self,
        attempt: AttemptId,
        call_id: String,
        answer: SessionAnswer,
        out: &mut Vec<Effect>,
    ) {
        self.on_tool_durable(attempt, call_id, answer, out);
        self.to_specialist(
            attempt,
            SpecialistMsg::Cancel {
                reason: "the task waits for a human's answer to its escalation".into(),
            },
            out,
        );
    }

    /// The escalated attempt ended (stopped, or it finished first): its spend is settled with the
    /// supervisor once and its result is not judged; the step keeps waiting. The acknowledgement
    /// that lets the specialist exit goes out once the run row recording the end is durable, and so
    /// (stages commit in ticket order) the escalation and the paused task before it: the session may
    /// end before the escalation's commit did (the endpoint gave up waiting for its answer).
    pub(super) fn on_escalated_attempt_end(
        &mut self,
        index: usize,
        from: AttemptId,
        spent_micros: u64,
        now: Millis,
        out: &mut Vec<Effect>,
    ) {
        match self.steps[index].awaiting {
            Some((id, EscalatedEnd::Open)) => {
                self.steps[index].awaiting = Some((id, EscalatedEnd::Settling));
                let key = self.steps[index].spec.key.clone();
                self.send(
                    SupervisorMsg::Settle {
                        attempt: from,
                        spent_micros,
                        outcome: Ok(()),
                    },
                    out,
                );
                self.row.budget.spent_micros =
                    self.row.budget.spent_micros.saturating_add(spent_micros);
                self.row.updated_ms = now;
                self.decide(
                    now,
                    format_args!(
                        "step {key}: attempt {from} stopped; waiting for the answer to escalation {id}"
                    ),
                );
                let row = self.row.clone();
                self.stage(
                    vec![PersistOp::UpdateRun(row)],
                    Then::EscalatedEnded {
                        step: index,
                        attempt: from,
                    },
                    false,
                    now,
                    out,
                );
            }
            // A resend while its end is on its way to the store: the durable end acknowledges it.
            Some((_, EscalatedEnd::Settling)) => {}
            Some((_, EscalatedEnd::Settled)) | None => {
                self.to_specialist(from, SpecialistMsg::Ack, out);
            }
        }
    }

    /// The end of escalated attempt `attempt` of step `index` is durable, the escalation before it
    /// too: acknowledge it (its specialist exits).
    pub(super) fn on_escalated_end_durable(
        &mut self,
        index: usize,
        attempt: AttemptId,
        out: &mut Vec<Effect>,
    ) {
        if let Some((_, end @ EscalatedEnd::Settling)) = self.steps[index].awaiting.as_mut() {
            *end = EscalatedEnd::Settled;
        }
        self.to_specialist(attempt, SpecialistMsg::Ack, out);
    }

    /// A human answered escalation `id` of `task` (the host made the answer durable, with the
    /// steering row the next session reads): the task's next attempt starts with a resume preamble.
    /// An answer for a step that does not wait for it only leaves a decision row.
    pub(super) fn on_escalation_answered(
        &mut self,
        id: EscalationId,
        task: TaskId,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        let index = self.by_task.get(&task).copied();
        let waiting = index.filter(|&i| {
            self.steps[i].status == StepStatus::AwaitingHuman
                && self.steps[i].awaiting.is_some_and(|(a, _)| a == id)
                && self.steps[i].current_task == Some(task)
        });
        let Some(index) = waiting.filter(|_| self.phase == Phase::Running) else {
            self.decide(
                now,
                format_args!(
                    "escalation {id} of task {task} answered; nothing of this run waits for it"
                ),
            );
            return;
        };
        let key = self.steps[index].spec.key.clone();
        self.steps[index].awaiting = None;
        self.decide(
            now,
            format_args!(
                "step {key}: escalation {id} answered; task {task} resumes with the answer"
            ),
        );
        self.begin_attempt(index, None, now, rng, out);
    }

    fn stage_tool(
        &mut self,
        from: AttemptId,
        call_id: String,
        ops: Vec<PersistOp>,
        answer: SessionAnswer,
        now: Millis,
        out: &mut Vec<Effect>,
    ) {
        self.tools.in_flight.insert((from, call_id.clone()));
        let then = Then::ToolAnswer {
            attempt: from,
            call_id,
            answer: Box::new(answer),
        };
        self.stage(ops, then, false, now, out);
    }

    fn remember(&mut self, attempt: AttemptId, call_id: String, answer: SessionAnswer) {
        if self.tools.answered.len() >= TOOL_ANSWERS_KEPT_MAX {
            self.tools.answered.pop_first();
        }
        self.tools.answered.insert((attempt, call_id), answer);
    }

    fn answer_tool(
        &self,
        attempt: AttemptId,
        call_id: String,
        answer: SessionAnswer,
        out: &mut Vec<Effect>,
    ) {
        self.to_specialist(attempt, SpecialistMsg::ToolAnswer { call_id, answer }, out);
    }

    /// `task` as the session of `own` may see it, or `None` when it is not in that session's thread:
    /// the task itself, an ancestor, a descendant (a lead's delegated subtasks), an earlier task or a
    /// dependency of its step. Only this run's rows are here, so another run's task is never found.
    fn details_for(&self, own: TaskId, step: Option<usize>, task: TaskId) -> Option<TaskDetails> {
        let row = self.tasks.get(&task)?;
        let ancestors = |from: TaskId| {
            let mut chain = Vec::new();
            let mut at = self.tasks.get(&from).and_then(|t| t.parent);
            while let Some(id) = at {
                if chain.len() >= THREAD_WALK_MAX || chain.contains(&id) {
                    break;
                }
                chain.push(id);
                at = self.tasks.get(&id).and_then(|t| t.parent);
            }
            chain
        };
        let in_step = |i: usize| self.steps[i].task_history.contains(&task);
        let visible = task == own
            || ancestors(own).contains(&task)
            || ancestors(task).contains(&own)
            || step.is_some_and(|i| in_step(i) || self.steps[i].deps.iter().any(|&d| in_step(d)));
        visible.then(|| details_of(row))
    }
}

/// A task row as `get_task_details` shows it: scrubbed like a preamble, within
/// [`DETAILS_CHARS_MAX`] characters of text in all.
fn details_of(row: &Task) -> TaskDetails {
    let scrubber = Scrubber::new();
    // Scrubbed whole, then cut: a cut first could leave the head of a secret too short for its
    // pattern to recognise.
    let clean = |text: &str, chars_max: usize| -> String {
        scrubber.scrub(text).text.chars().take(chars_max).collect()
    };
    let reported_findings: Vec<Finding> = crate::session_tool::reported_findings(row)
        .into_iter()
        .take(DETAILS_ITEMS_MAX)
        .map(|f| Finding {
            claim: clean(&f.claim, 200),
            source: clean(&f.source, 200),
            ..f
        })
        .collect();
    let notes_from = row.progress_notes.len().saturating_sub(DETAILS_ITEMS_MAX);
    TaskDetails {
        task: row.id,
        parent: row.parent,
        status: row.status,
        brief: clean(&row.brief, DETAILS_CHARS_MAX / 2),
        goal: clean(&row.goal, 400),
        outcome: row
            .outcome
            .as_deref()
            .map(|o| clean(o, DETAILS_CHARS_MAX / 4)),
        reported_findings,
        progress_notes: row.progress_notes[notes_from..]
            .iter()
            .map(|n| clean(n, 200))
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session_tool::DETAILS_CHARS_MAX;
    use keel_store::{RunId, TaskId};

    #[test]
    fn a_secret_at_the_cut_of_a_long_brief_leaves_none_of_itself() {
        // The brief is cut at DETAILS_CHARS_MAX / 2 characters, ten characters into the token: a cut
        // before the scrub would leave the token's head, too short for its pattern.
        let token = ["ghp", "Zq3xT9vLm2Kp8RwYc4Nf6Hd1Gs5Bj7Ue0AoQ"].join("_");
        let brief = format!(
            "{} {token} and more",
            "x".repeat(DETAILS_CHARS_MAX / 2 - 11)
        );
        let row =
            super::super::lifecycle::root_task(TaskId(1), RunId(1), 0, brief, "a goal".into(), 0);
        let details = details_of(&row);
        assert!(details.brief.chars().count() <= DETAILS_CHARS_MAX / 2);
        assert!(
            !details.brief.contains(&token[..10]),
            "the head of the token survived: {}",
            &details.brief[details.brief.len() - 20..]
        );
    }
}
