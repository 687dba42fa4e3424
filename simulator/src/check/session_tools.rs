//! Checks of the calls sessions make to keel's tools (issue 11), under the invariants they belong
//! to (docs/DESIGN.md §12):
//!
//! - 1, nothing durable is lost: a finding a session was told is recorded is on its task's row at
//!   the end, whatever crashed in between;
//! - 2, a side effect at most once: a call that arrives after its session ended is refused and
//!   never recorded; a delegated subtask runs at most once per accepted delegation: it is one step
//!   of its run whichever session of the lead asks for it and however often the call is delivered,
//!   and no attempt of it starts once its report was accepted (with the checks of invariant 2 on
//!   session keys and accepted reports, which cover delegated steps as they cover plan steps);
//! - 9, run isolation, a session's token never crosses runs: what a session's call is answered
//!   with (`get_task_details` above all) never holds a task of another run than the session's.

use std::collections::{BTreeMap, BTreeSet};

use keel_actors::AttemptId;
use keel_actors::Finding;
use keel_actors::session_tool::{SessionAnswer, SessionRequest, SessionToolCall};
use keel_store::{RunId, TaskId};

use super::Checker;
use crate::violation::Invariant;

/// One call of keel's tools as the checker remembers it.
#[derive(Debug, Clone)]
struct CallObs {
    /// The attempt whose session made the call (whose token it carried).
    session: AttemptId,
    /// The tool.
    tool: &'static str,
    /// The claims of a findings report.
    claims: Vec<String>,
    /// Whether it came after its session ended.
    late: bool,
}

/// What the checker remembers of the calls sessions made.
#[derive(Debug, Default)]
pub(super) struct ToolCalls {
    /// Calls delivered to specialists, by the attempt they were delivered to and call id.
    calls: BTreeMap<(AttemptId, String), CallObs>,
    /// Claims a session was told are recorded, by run and task.
    recorded: BTreeMap<(RunId, TaskId), BTreeSet<String>>,
    /// Claims of calls after their session's end, by run and task.
    late: BTreeMap<(RunId, TaskId), BTreeSet<String>>,
    /// Subtasks leads delegated, by run and brief (a subtask is its brief in the simulator's
    /// scripts): the step that does it, once an attempt of it was spawned.
    delegated: BTreeMap<(RunId, String), Option<String>>,
}

impl Checker {
    /// The endpoint delivered `call`, made by the session of `session` (its token's attempt), to
    /// the specialist of `delivered` (`late`: after its session ended).
    pub fn tool_call(
        &mut self,
        event: u64,
        session: AttemptId,
        delivered: AttemptId,
        call: &SessionToolCall,
        late: bool,
    ) {
        if session.run != delivered.run {
            self.fail(
                event,
                Invariant::RunIsolation,
                format!(
                    "call {} of the session of attempt {session} (run {}) reached attempt {delivered} of run {}: its token crossed runs",
                    call.call_id, session.run, delivered.run
                ),
            );
        }
        let claims: Vec<String> = match &call.request {
            SessionRequest::ReportFindings { findings } => {
                findings.iter().map(|f| f.claim.clone()).collect()
            }
            _ => Vec::new(),
        };
        if late {
            self.tools
                .late
                .entry((session.run, session.task))
                .or_default()
                .extend(claims.iter().cloned());
        }
        let tool = call.request.tool();
        self.tools.calls.insert(
            (delivered, call.call_id.clone()),
            CallObs {
                session,
                tool,
                claims,
                late,
            },
        );
        let kind = if late { "late" } else { tool };
        *self.observed.tool_calls.entry(kind).or_default() += 1;
    }

    /// A lead's session asked for `briefs` through `delegate` (the specialist's delegation turn).
    pub(super) fn delegation_asked(&mut self, lead: AttemptId, briefs: Vec<String>) {
        for brief in briefs {
            self.tools.delegated.entry((lead.run, brief)).or_default();
        }
    }

    /// An attempt of step `step` of `attempt.run` with `brief` was spawned: if it is a delegated
    /// subtask, it must be the one step of that subtask, and its report must not have been
    /// accepted already (invariant 2: a delegated subtask runs at most once per accepted delegation).
    pub(super) fn delegated_spawn(
        &mut self,
        event: u64,
        attempt: AttemptId,
        step: &str,
        brief: &str,
    ) {
        let Some(known) = self
            .tools
            .delegated
            .get_mut(&(attempt.run, brief.to_owned()))
        else {
            return;
        };
        match known {
            None => *known = Some(step.to_owned()),
            Some(first) if first != step => {
                let detail = format!(
                    "run {}: the delegated subtask {brief:?} runs as a second step {step:?} (first {first:?}): delegated twice",
                    attempt.run
                );
                return self.fail(event, Invariant::IdempotentOnce, detail);
            }
            Some(_) => {}
        }
        let accepted = self
            .observed
            .accepted_reports
            .get(&(attempt.run, step.to_owned()))
            .and_then(|a| a.iter().find(|a| **a != attempt).copied());
        if let Some(accepted) = accepted {
            let detail = format!(
                "run {}: attempt {attempt} of delegated subtask {step:?} started after the report of {accepted} was accepted: it ran twice",
                attempt.run
            );
            self.fail(event, Invariant::IdempotentOnce, detail);
        }
    }

    /// `attempt`'s specialist answered call `call_id` with `answer`.
    pub fn tool_answered(
        &mut self,
        event: u64,
        attempt: AttemptId,
        call_id: &str,
        answer: &SessionAnswer,
    ) {
        let Some(CallObs {
            session,
            tool,
            claims,
            late,
        }) = self
            .tools
            .calls
            .get(&(attempt, call_id.to_owned()))
            .cloned()
        else {
            return;
        };
        match answer {
            SessionAnswer::Recorded { .. } if late => self.fail(
                event,
                Invariant::IdempotentOnce,
                format!(
                    "attempt {session}: {tool} call {call_id} after its session ended was recorded"
                ),
            ),
            SessionAnswer::Recorded { .. } => {
                self.tools
                    .recorded
                    .entry((session.run, session.task))
                    .or_default()
                    .extend(claims);
            }
            SessionAnswer::TaskDetails(details) => {
                let other = self
                    .observed
                    .spawns
                    .iter()
                    .find(|(a, _)| a.task == details.task && a.run != session.run);
                if let Some((owner, _)) = other {
                    self.fail(
                        event,
                        Invariant::RunIsolation,
                        format!(
                            "the session of attempt {session} (run {}) was answered task {} of run {} through get_task_details: its token crossed runs",
                            session.run, details.task, owner.run
                        ),
                    );
                }
            }
            SessionAnswer::Delegated(results) => {
                // The turn whose calls these are (a lead's calls are unique within its attempt).
                let ids: Vec<&String> = results.iter().map(|(id, _)| id).collect();
                let turn = self
                    .observed
                    .delegations
                    .iter()
                    .find(|(a, _, calls)| *a == attempt && calls.iter().collect::<Vec<_>>() == ids)
                    .map(|(_, turn, _)| *turn);
                if let Some(turn) = turn {
                    self.observed.delegation_answers.push((
                        attempt,
                        turn,
                        results
                            .iter()
                            .map(|(id, o)| {
                                (id.clone(), matches!(o, keel_actors::StepOutcome::Report(_)))
                            })
                            .collect(),
                    ));
                }
            }
            SessionAnswer::Refused(_) => {}
        }
        self.observed.tool_answers += 1;
    }

    /// A simulated human answered an escalation.
    pub fn escalation_answered(&mut self) {
        self.observed.escalations_answered += 1;
    }

    /// The endpoint delivered a call a second time.
    pub fn tool_duplicated(&mut self) {
        self.observed.tool_duplicates += 1;
    }

    /// A session's call went unanswered past the endpoint's timeout.
    pub fn tool_timed_out(&mut self) {
        self.observed.tool_timeouts += 1;
    }

    /// The tasks whose rows the end check reads: each with claims recorded or sent late.
    pub fn reported_tasks(&self) -> Vec<(RunId, TaskId)> {
        self.tools
            .recorded
            .keys()
            .chain(self.tools.late.keys())
            .copied()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    /// At the end: `rows` holds, for each task of [`Checker::reported_tasks`], the findings on its
    /// stored row (`None`: no row). Every recorded claim must be there; no late claim may be.
    pub fn reported_findings_kept(&mut self, event: u64, rows: &[(TaskId, Option<Vec<Finding>>)]) {
        if self.violation.is_some() {
            return;
        }
        let stored: BTreeMap<TaskId, BTreeSet<&str>> = rows
            .iter()
            .map(|(task, findings)| {
                let claims = findings
                    .iter()
                    .flatten()
                    .map(|f| f.claim.as_str())
                    .collect();
                (*task, claims)
            })
            .collect();
        let empty = BTreeSet::new();
        for ((run, task), claims) in &self.tools.recorded {
            let on_row = stored.get(task).unwrap_or(&empty);
            if let Some(lost) = claims.iter().find(|c| !on_row.contains(c.as_str())) {
                let detail = format!(
                    "run {run}: the finding {lost:?} a session of task {task} was told is recorded is not on the task's row"
                );
                return self.fail(event, Invariant::NoTaskLost, detail);
            }
        }
        for ((run, task), claims) in &self.tools.late {
            let on_row = stored.get(task).unwrap_or(&empty);
            if let Some(late) = claims.iter().find(|c| on_row.contains(c.as_str())) {
                let detail = format!(
                    "run {run}: the finding {late:?} of a call after its session ended is on task {task}'s row"
                );
                return self.fail(event, Invariant::IdempotentOnce, detail);
            }
        }
    }
}
