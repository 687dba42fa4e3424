//! What happens to an attempt's result: a verified report is accepted once durable, a failure goes to
//! the supervisor for a verdict, and a step whose retries are spent is parked or skipped.

use super::staging::Then;
use super::step::{BackoffNext, encode_outcome, outcome_status};
use super::{Phase, RunState, STALE_LOGGED_MAX, StepStatus, bytes_max, one_line};
use crate::effect::Effect;
use crate::ids::AttemptId;
use crate::machine::{Entropy, Millis};
use crate::message::{SpecialistMsg, SpecialistReply, SupervisorMsg, Verdict};
use crate::persist::PersistOp;
use crate::report::{
    AttemptResult, FailureKind, StepOutcome, SubtaskFailure, TEXT_BYTES_MAX, bounded,
};
use keel_store::{DeadLetter, EscalationTrigger, ManifestEntry, ManifestOutcome, TaskStatus};

impl RunState {
    pub(super) fn skip(
        &mut self,
        index: usize,
        reason: String,
        now: Millis,
        out: &mut Vec<Effect>,
    ) {
        let key = self.steps[index].spec.key.clone();
        self.decide(now, format_args!("step {key} skipped: {reason}"));
        let outcome = StepOutcome::Skipped {
            reason: reason.clone(),
        };
        self.steps[index].outcome = Some(outcome.clone());
        self.steps[index].status = StepStatus::Committing;
        let ops = vec![PersistOp::AppendManifest(ManifestEntry {
            ts_ms: now,
            item: key,
            task_id: None,
            outcome: ManifestOutcome::Failed { reason },
        })];
        self.stage(
            ops,
            Then::Parked {
                step: index,
                outcome: Box::new(outcome),
            },
            true,
            now,
            out,
        );
    }

    /// Park a step whose retries are spent (or that was escalated): the task row says failed or
    /// escalated, the failure goes to the dead-letter table, the manifest records it.
    pub(super) fn park(
        &mut self,
        index: usize,
        failure: SubtaskFailure,
        reason: String,
        escalate: Option<(EscalationTrigger, keel_store::EscalationId)>,
        now: Millis,
        out: &mut Vec<Effect>,
    ) {
        let key = self.steps[index].spec.key.clone();
        let task = self.steps[index].current_task;
        let attempts = self.steps[index].attempts_total;
        let outcome = StepOutcome::Failed(failure.clone());
        let mut ops = Vec::new();
        if let Some(t) = task.and_then(|t| self.tasks.get_mut(&t)) {
            t.status = if escalate.is_some() {
                TaskStatus::Escalated
            } else {
                TaskStatus::Failed
            };
            t.outcome = Some(encode_outcome(&outcome));
            t.updated_ms = now;
            ops.push(PersistOp::UpdateTask(t.clone()));
        }
        let payload = bounded(
            serde_json::to_string(&failure).unwrap_or_default(),
            bytes_max(self.config.store_limits.output_bytes_max),
        );
        ops.push(PersistOp::AppendDeadLetter(DeadLetter {
            ts_ms: now,
            task_id: task,
            subject: format!("step {key}"),
            payload,
            reason: bounded(reason.clone(), TEXT_BYTES_MAX),
            attempts,
        }));
        if let Some((trigger, id)) = escalate {
            let account = self.steps[index]
                .assignment
                .as_ref()
                .map(|a| a.account.clone())
                .unwrap_or_default();
            let case = crate::escalation::NoProgressCase {
                step: key.clone(),
                brief: self.steps[index].spec.brief.clone(),
                failure: failure.clone(),
                reason: reason.clone(),
                attempts,
            };
            let mut escalation = crate::escalation::no_progress(id, now, task, account, case);
            escalation.trigger = trigger;
            ops.push(PersistOp::AppendEscalation(escalation));
        }
        ops.push(PersistOp::AppendManifest(ManifestEntry {
            ts_ms: now,
            item: key.clone(),
            task_id: task,
            outcome: ManifestOutcome::Failed {
                reason: bounded(reason.clone(), TEXT_BYTES_MAX),
            },
        }));
        let verb = if escalate.is_some() {
            "escalated"
        } else {
            "failed"
        };
        self.decide(
            now,
            format_args!("step {key} {verb} and parked in the dead-letter table: {reason}"),
        );
        self.steps[index].status = StepStatus::Committing;
        // The task row carries the parked outcome; recovery reads it there.
        self.stage(
            ops,
            Then::Parked {
                step: index,
                outcome: Box::new(outcome),
            },
            false,
            now,
            out,
        );
    }

    pub(super) fn on_result(
        &mut self,
        from: AttemptId,
        result: AttemptResult,
        now: Millis,
        out: &mut Vec<Effect>,
    ) {
        let Some(&index) = self.by_task.get(&from.task) else {
            return; // not a task of this run
        };
        let committing = self.steps[index].status == StepStatus::Committing
            && self.steps[index].current(self.id) == Some(from);
        if self.phase != Phase::Running && self.steps[index].accepted != Some(from) && !committing {
            // The run is ending (cancelled, budget, synthesis): nothing more is accepted.
            self.to_specialist(
                from,
                SpecialistMsg::Cancel {
                    reason: "the run has ended".into(),
                },
                out,
            );
            return;
        }
        let current = self.steps[index].current(self.id);
        let status = self.steps[index].status;
        if current == Some(from) && status == StepStatus::AwaitingHuman {
            // The escalated attempt ended (its session was stopped): settled, not judged.
            return self.on_escalated_attempt_end(index, from, result.spent_micros, now, out);
        }
        if current != Some(from)
            || !matches!(
                status,
                StepStatus::Admitting
                    | StepStatus::Running
                    | StepStatus::Committing
                    | StepStatus::Done
            )
        {
            if self.steps[index].accepted == Some(from) {
                self.to_specialist(from, SpecialistMsg::Ack, out);
                return;
            }
            if self.stale_logged.len() < STALE_LOGGED_MAX && self.stale_logged.insert(from) {
                let key = self.steps[index].spec.key.clone();
                self.decide(
                    now,
                    format_args!("step {key}: result of attempt {from} refused as stale (not the current attempt)"),
                );
            }
            self.to_specialist(
                from,
                SpecialistMsg::Cancel {
                    reason: "superseded by a newer attempt".into(),
                },
                out,
            );
            return;
        }
        match status {
            StepStatus::Committing => return, // a duplicate while its result is being made durable
            StepStatus::Done => {
                let msg = if self.steps[index].accepted == Some(from) {
                    SpecialistMsg::Ack
                } else {
                    // Ended without it (cancelled): the attempt stops resending.
                    SpecialistMsg::Cancel {
                        reason: "the step has ended".into(),
                    }
                };
                self.to_specialist(from, msg, out);
                return;
            }
            _ => {}
        }
        let key = self.steps[index].spec.key.clone();
        self.steps[index].spent_micros = self.steps[index].spent_micros.max(result.spent_micros);
        match result.outcome {
            Ok(report) => match report.verify(from.task) {
                Ok(()) => {
                    let (status, findings, gaps) =
                        (report.status, report.findings.len(), report.gaps.len());
                    let outcome = StepOutcome::Report(report);
                    let mut ops = Vec::new();
                    if let Some(t) = self.tasks.get_mut(&from.task) {
                        t.status = outcome_status(&outcome);
                        t.outcome = Some(encode_outcome(&outcome));
                        t.updated_ms = now;
                        ops.push(PersistOp::UpdateTask(t.clone()));
                    }
                    ops.push(PersistOp::AppendManifest(ManifestEntry {
                        ts_ms: now,
                        item: key.clone(),
                        task_id: Some(from.task),
                        outcome: ManifestOutcome::Processed,
                    }));
                    self.charge(index, now);
                    ops.push(PersistOp::UpdateRun(self.row.clone()));
                    self.decide(
                        now,
                        format_args!(
                            "step {key}: accepted a {status:?} report of attempt {from} ({findings} findings, {gaps} gaps)"
                        ),
                    );
                    self.steps[index].status = StepStatus::Committing;
                    // No checkpoint here: the task row (result and done-marker, one transaction) is
                    // what recovery reads; the next dispatch or the synthesis writes the checkpoint.
                    let then = Then::Accepted {
                        step: index,
                        attempt: from,
                        outcome: Box::new(outcome),
                    };
                    if self.results_expected() {
                        // Other steps still run: this result rides with theirs (or with the
                        // writer's linger bound), one commit for the batch's results.
                        self.stage_riding(ops, then, now, out);
                    } else {
                        self.stage(ops, then, false, now, out);
                        // The last result the run waited for: the run's end rides in its commit.
                        self.finish_if_decided(now, out);
                    }
                }
                Err(e) => {
                    let failure = SubtaskFailure {
                        kind: FailureKind::MalformedReport,
                        attempted: format!("attempt {from}"),
                        partial: report.findings,
                        retryable: true,
                        retry_after_ms: None,
                        detail: e.to_string(),
                    };
                    self.on_failure(index, from, failure, result.spent_micros, now, out);
                }
            },
            Err(failure) => self.on_failure(index, from, failure, result.spent_micros, now, out),
        }
    }

    pub(super) fn on_failure(
        &mut self,
        index: usize,
        from: AttemptId,
        failure: SubtaskFailure,
        spent_micros: u64,
        now: Millis,
        out: &mut Vec<Effect>,
    ) {
        let key = self.steps[index].spec.key.clone();
        if self.charge(index, now) {
            let ops = vec![PersistOp::UpdateRun(self.row.clone())];
            self.stage(ops, Then::Nothing, false, now, out);
        }
        self.decide(
            now,
            format_args!(
                "step {key}: attempt {from} failed ({}, retryable: {}): {}",
                failure.kind.name(),
                failure.retryable,
                one_line(&failure.detail)
            ),
        );
        self.steps[index].status = StepStatus::AwaitingVerdict;
        self.count_failure(index, failure.clone(), now, out);
        // The task row is left as it is, in memory as in the store: the decision the verdict leads to
        // ends it, with that decision's writes (a restart reopens it, a re-dispatch fails it beside its
        // replacement, a park fails or escalates it, a run's end cancels it).
        self.send(
            SupervisorMsg::Settle {
                attempt: from,
                spent_micros,
                outcome: Err(failure),
            },
            out,
        );
    }

    /// Add what the step's current attempt spent beyond what is already charged to the run
    /// row's budget; whether the row changed (the caller stages it). Every attempt's spend reaches
    /// the run's budget this way, whatever ends the attempt, so `run_budget_usd` holds across
    /// pauses, crashes and failures (a recovered run opens the supervisor's ledger at this sum).
    pub(super) fn charge(&mut self, index: usize, now: Millis) -> bool {
        let step = &mut self.steps[index];
        let delta = step.spent_micros.saturating_sub(step.charged_micros);
        if delta == 0 {
            return false;
        }
        step.charged_micros = step.spent_micros;
        self.row.budget.spent_micros = self.row.budget.spent_micros.saturating_add(delta);
        self.row.updated_ms = now;
        true
    }

    /// A failed attempt counts against the step's retry budget, and the failure is kept as the
    /// step's newest, both in the checkpoint at once: recovery restores them, so a crash neither
    /// forgets a failure nor turns an interrupted attempt into one.
    fn count_failure(
        &mut self,
        index: usize,
        failure: SubtaskFailure,
        now: Millis,
        out: &mut Vec<Effect>,
    ) {
        let step = &mut self.steps[index];
        step.failures = step.failures.saturating_add(1);
        step.last_failure = Some(failure);
        self.stage(Vec::new(), Then::Nothing, true, now, out);
    }

    /// The supervisor's verdict on a failed attempt, applied if it is still about the current attempt
    /// and the run is still running.
    pub(super) fn on_verdict(
        &mut self,
        attempt: AttemptId,
        verdict: Verdict,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        let Some(&index) = self.by_task.get(&attempt.task) else {
            return;
        };
        let s = &self.steps[index];
        if s.current(self.id) == Some(attempt)
            && s.status == StepStatus::AwaitingVerdict
            && self.phase == Phase::Running
        {
            self.apply_verdict(index, verdict, now, rng, out);
        }
    }

    /// The supervisor lost an attempt (its specialist died or timed out) and decided at once: log it
    /// and apply the verdict, if it is about the current attempt of a step still in flight.
    pub(super) fn on_attempt_lost(
        &mut self,
        attempt: AttemptId,
        failure: SubtaskFailure,
        verdict: Verdict,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        let Some(&index) = self.by_task.get(&attempt.task) else {
            return;
        };
        let s = &self.steps[index];
        if s.current(self.id) != Some(attempt)
            || !matches!(s.status, StepStatus::Admitting | StepStatus::Running)
            || self.phase != Phase::Running
        {
            return;
        }
        let key = s.spec.key.clone();
        self.decide(
            now,
            format_args!(
                "step {key}: attempt {attempt} lost ({}): {}",
                failure.kind.name(),
                one_line(&failure.detail)
            ),
        );
        self.count_failure(index, failure, now, out);
        self.apply_verdict(index, verdict, now, rng, out);
    }

    pub(super) fn apply_verdict(
        &mut self,
        index: usize,
        verdict: Verdict,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        let attempts_max = self.config.attempts_per_step_max;
        let key = self.steps[index].spec.key.clone();
        let failure = self.steps[index]
            .last_failure
            .clone()
            .unwrap_or(SubtaskFailure {
                kind: FailureKind::Crashed,
                attempted: String::new(),
                partial: Vec::new(),
                retryable: true,
                retry_after_ms: None,
                detail: "no failure recorded".into(),
            });
        let spent = self.steps[index].failures >= attempts_max;
        match verdict {
            Verdict::Restart { .. } | Verdict::Reroute { .. } | Verdict::SwitchAccount { .. }
                if spent =>
            {
                let reason = format!("retry budget spent after {attempts_max} failed attempts");
                self.park(index, failure, reason, None, now, out);
            }
            Verdict::Restart { after_ms } => {
                self.decide(
                    now,
                    format_args!("step {key}: restart after {after_ms} ms (supervisor)"),
                );
                self.backoff(
                    index,
                    BackoffNext::NewAttempt { reroute: None },
                    after_ms,
                    now,
                    rng,
                    out,
                );
            }
            Verdict::Reroute { agent, after_ms } => {
                self.decide(
                    now,
                    format_args!(
                        "step {key}: reroute to agent {agent} after {after_ms} ms (supervisor)"
                    ),
                );
                self.backoff(
                    index,
                    BackoffNext::NewAttempt {
                        reroute: Some(agent),
                    },
                    after_ms,
                    now,
                    rng,
                    out,
                );
            }
            Verdict::SwitchAccount { account, after_ms } => {
                let from = self.steps[index].assignment.as_ref().map_or_else(
                    || "its account".to_string(),
                    |a| format!("account {}", a.account),
                );
                self.decide(
                    now,
                    format_args!(
                        "step {key}: rate-limited on {from}; the next attempt bills to account {account} after {after_ms} ms (supervisor)"
                    ),
                );
                // Kept in the checkpoint the next attempt's stage writes, so a restart of the
                // node asks for this account too.
                self.steps[index].account = Some(account);
                self.backoff(
                    index,
                    BackoffNext::NewAttempt { reroute: None },
                    after_ms,
                    now,
                    rng,
                    out,
                );
            }
            Verdict::Escalate { reason } => {
                let trigger = if matches!(failure.kind, FailureKind::Harness(_))
                    && !reason.starts_with("no meaningful progress")
                {
                    EscalationTrigger::PolicyGap
                } else {
                    EscalationTrigger::NoProgress
                };
                let id = crate::escalation::mint_escalation_id(now, rng);
                self.park(index, failure, reason, Some((trigger, id)), now, out);
            }
            Verdict::GiveUp { reason } => self.park(index, failure, reason, None, now, out),
        }
    }

    pub(super) fn on_reply(
        &mut self,
        from: AttemptId,
        reply: SpecialistReply,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        if from.run != self.id {
            return;
        }
        match reply {
            SpecialistReply::Finished(result) => {
                // The attempt is the reply address's, never the payload's: a report cannot claim to be
                // from another attempt.
                let result = AttemptResult {
                    attempt: from,
                    ..result
                };
                self.on_result(from, result, now, out);
            }
            SpecialistReply::Logs { rows } => {
                let Some(&index) = self.by_task.get(&from.task) else {
                    return;
                };
                if self.steps[index].current(self.id) != Some(from) {
                    return;
                }
                let mut ops = Vec::new();
                for (seq, row) in rows
                    .into_iter()
                    .take(crate::specialist::LOG_ROWS_PER_REPLY_MAX)
                {
                    if seq > self.steps[index].log_seq {
                        self.steps[index].log_seq = seq;
                        ops.push(PersistOp::AppendLog {
                            task: from.task,
                            row,
                        });
                    }
                }
                // Each log row stands alone, so rows beyond one stage's bound go in more stages.
                if ops.len() > self.stage_ops_max() {
                    self.stage_independent(ops, out);
                } else if !ops.is_empty() {
                    self.stage_riding(ops, Then::Nothing, now, out);
                }
            }
            SpecialistReply::Spend { spent_micros } => {
                let Some(&index) = self.by_task.get(&from.task) else {
                    return;
                };
                if self.steps[index].current(self.id) == Some(from) {
                    let s = &mut self.steps[index];
                    s.spent_micros = s.spent_micros.max(spent_micros);
                    // Durable as it is reported: a pause or a crash does not take it back.
                    if self.charge(index, now) {
                        let ops = vec![PersistOp::UpdateRun(self.row.clone())];
                        self.stage(ops, Then::Nothing, false, now, out);
                    }
                    self.send(
                        SupervisorMsg::Spend {
                            attempt: from,
                            spent_micros,
                        },
                        out,
                    );
                }
            }
            SpecialistReply::Delegate { turn, calls } => {
                self.on_delegate(from, turn, calls, now, rng, out);
            }
            SpecialistReply::Tool { call_id, request } => {
                self.on_tool(from, call_id, request, now, rng, out);
            }
        }
    }
}
