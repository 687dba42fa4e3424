//! The host's side of [`crate::mutation::Mutation`]: where the world bends an effect, a session's
//! script or a context read on purpose, before the checker sees it. With no mutation configured every
//! function here returns its input unchanged and draws nothing from the stream.

use std::collections::VecDeque;

use keel_actors::context::RowSet;
use keel_actors::{
    AttemptResult, Effect, Envelope, PersistOp, RecoveredRun, ReportStatus, SpecialistEffect,
    SpecialistReply, SubagentReport, SupervisorMsg,
};
use keel_harness::HarnessEvent;
use keel_store::{RunId, TaskKind, TaskStatus};

use crate::mutation::Mutation;

use super::World;

/// The tool_use id [`Mutation::LeaveToolUseUnanswered`] leaves open.
pub const UNANSWERED_TOOL_ID: &str = "toolu_sim_unanswered";

impl World {
    /// An effect of a coordinator-node machine as the (possibly defective) host sees it.
    pub(super) fn mutate_coord_effect(&self, effect: Effect) -> Effect {
        let Some(mutation) = self.config.mutation else {
            return effect;
        };
        match (mutation, effect) {
            (Mutation::InheritParentModel, Effect::SpawnSpecialist(mut start))
                if start.kind != TaskKind::Root && start.kind != TaskKind::Subtask =>
            {
                if let Some(model) = self.parent_model(start.task) {
                    start.assignment.model = model;
                }
                Effect::SpawnSpecialist(start)
            }
            (Mutation::WriteAnotherRunsRow, Effect::Persist(mut batch)) => {
                let mut stages = batch.stages.to_vec();
                if let Some(PersistOp::UpdateTask(task)) = stages
                    .iter_mut()
                    .flat_map(|s| std::sync::Arc::make_mut(&mut s.ops).iter_mut())
                    .find(|op| matches!(op, PersistOp::UpdateTask(_)))
                {
                    task.run_id = RunId(task.run_id.0 ^ 1);
                }
                batch.stages = stages.into();
                Effect::Persist(batch)
            }
            (
                Mutation::LooseBudget,
                Effect::Send(Envelope::Supervisor(SupervisorMsg::OpenRun { run, mut budget })),
            ) => {
                budget.limit_micros = budget.limit_micros.map(|l| l.saturating_mul(100));
                Effect::Send(Envelope::Supervisor(SupervisorMsg::OpenRun { run, budget }))
            }
            (Mutation::LoseReportedFindings, Effect::Persist(mut batch)) => {
                let mut stages = batch.stages.to_vec();
                for op in stages
                    .iter_mut()
                    .flat_map(|s| std::sync::Arc::make_mut(&mut s.ops).iter_mut())
                {
                    if let PersistOp::UpdateTask(task) = op {
                        task.attachments.retain(|a| {
                            !a.name
                                .starts_with(keel_actors::session_tool::FINDINGS_ATTACHMENT_PREFIX)
                        });
                    }
                }
                batch.stages = stages.into();
                Effect::Persist(batch)
            }
            (Mutation::LoseTaskEnd, Effect::Persist(mut batch)) => {
                let mut stages = batch.stages.to_vec();
                for stage in &mut stages {
                    std::sync::Arc::make_mut(&mut stage.ops).retain(|op| {
                        !matches!(op, PersistOp::UpdateTask(t)
                            if matches!(t.status, TaskStatus::Failed | TaskStatus::Cancelled | TaskStatus::Escalated))
                    });
                }
                batch.stages = stages.into();
                Effect::Persist(batch)
            }
            (_, effect) => effect,
        }
    }

    /// The model of the task `task` was derived from, as its spawn carried it.
    fn parent_model(&self, task: keel_store::TaskId) -> Option<String> {
        let observed = self.checker.observed();
        let (_, parent) = observed.tasks_created.get(&task)?;
        let parent = (*parent)?;
        observed
            .spawns
            .iter()
            .find(|(a, _)| a.task == parent)
            .map(|(_, s)| s.model.clone())
    }

    /// An effect of a specialist as the (possibly defective) host carries it out.
    pub(super) fn mutate_spec_effect(
        &self,
        attempt: keel_actors::AttemptId,
        effect: SpecialistEffect,
    ) -> SpecialistEffect {
        let Some(mutation) = self.config.mutation else {
            return effect;
        };
        match (mutation, effect) {
            (Mutation::LeakSecretIntoPrompt, SpecialistEffect::StartHarness { key, mut spec }) => {
                spec.prompt.push_str("\nThe key is ");
                spec.prompt.push_str(crate::harness::PLANTED_SECRET);
                SpecialistEffect::StartHarness { key, spec }
            }
            (Mutation::CutBriefLine, SpecialistEffect::StartHarness { key, mut spec }) => {
                let brief = self
                    .checker
                    .observed()
                    .spawns
                    .get(&attempt)
                    .map(|s| s.brief.clone())
                    .unwrap_or_default();
                if let Some(line) = brief.lines().find(|l| !l.trim().is_empty()) {
                    spec.prompt = spec.prompt.replace(line, "");
                }
                SpecialistEffect::StartHarness { key, spec }
            }
            (Mutation::InflatePreamble, SpecialistEffect::StartHarness { key, mut spec }) => {
                if let Some(end) = spec.prompt.find("</keel-context>") {
                    let padding = "padding line of an oversized preamble\n".repeat(2_000);
                    spec.prompt.insert_str(end, &padding);
                }
                SpecialistEffect::StartHarness { key, spec }
            }
            (Mutation::ResumeAsFresh, SpecialistEffect::StartHarness { key, mut spec }) => {
                // The preamble's text stays (it carries the brief); only its frame goes, so the
                // session starts on plain text as a fresh one would.
                if let Some(start) = spec.prompt.find("<keel-context kind=\"resume\"")
                    && let Some(len) = spec.prompt[start..].find('>')
                {
                    spec.prompt.replace_range(start..=start + len, "");
                    spec.prompt = spec.prompt.replace("</keel-context>", "");
                }
                SpecialistEffect::StartHarness { key, spec }
            }
            (Mutation::PreambleForFresh, SpecialistEffect::StartHarness { key, mut spec })
                if !spec.prompt.contains("<keel-context") =>
            {
                spec.prompt.push_str(
                    "\n<keel-context kind=\"resume\">\nearlier work on this task\n</keel-context>\n",
                );
                SpecialistEffect::StartHarness { key, spec }
            }
            (Mutation::SlashLineNotFirst, SpecialistEffect::StartHarness { key, mut spec })
                if spec
                    .prompt
                    .lines()
                    .next()
                    .is_some_and(keel_actors::context::is_slash_skill_line) =>
            {
                spec.prompt.insert_str(0, "Read this first.\n");
                SpecialistEffect::StartHarness { key, spec }
            }
            (Mutation::PassResumeFlag, SpecialistEffect::StartHarness { key, mut spec }) => {
                spec.env
                    .insert("KEEL_HARNESS_ARGS".into(), "--resume native-1".into());
                SpecialistEffect::StartHarness { key, spec }
            }
            (Mutation::ReplyAsSibling, SpecialistEffect::Reply(to, reply)) => {
                let sibling = self
                    .workers
                    .iter()
                    .flat_map(|w| w.specialists.iter())
                    .find(|(a, _)| **a != attempt)
                    .map(|(_, h)| h.reply_to);
                SpecialistEffect::Reply(sibling.unwrap_or(to), reply)
            }
            (
                Mutation::ReportEmptySuccess,
                SpecialistEffect::Reply(to, SpecialistReply::Finished(result)),
            ) if result.outcome.is_err() => SpecialistEffect::Reply(
                to,
                SpecialistReply::Finished(AttemptResult {
                    outcome: Ok(SubagentReport {
                        subtask_id: attempt.task,
                        status: ReportStatus::Complete,
                        findings: Vec::new(),
                        gaps: Vec::new(),
                        summary: String::new(),
                    }),
                    ..result
                }),
            ),
            (_, effect) => effect,
        }
    }

    /// Whether the host starts this effect's session twice ([`Mutation::StartSessionTwice`]).
    pub(super) fn duplicates_session_start(&self, effect: &SpecialistEffect) -> bool {
        self.config.mutation == Some(Mutation::StartSessionTwice)
            && matches!(effect, SpecialistEffect::StartHarness { .. })
    }

    /// A session's scripted events as the (possibly defective) host's harness emits them.
    pub(super) fn mutate_session(
        &self,
        events: VecDeque<(u64, HarnessEvent)>,
    ) -> VecDeque<(u64, HarnessEvent)> {
        match self.config.mutation {
            Some(Mutation::AnswerToolUseTwice) => events
                .into_iter()
                .flat_map(|(delay, event)| {
                    let twice = matches!(event, HarnessEvent::ToolResult { .. });
                    let copy = twice.then(|| (1, event.clone()));
                    std::iter::once((delay, event)).chain(copy)
                })
                .collect(),
            Some(Mutation::LeaveToolUseUnanswered) => events
                .into_iter()
                .flat_map(|(delay, event)| {
                    let before = matches!(event, HarnessEvent::Finished { .. }).then(|| {
                        (
                            1,
                            HarnessEvent::tool_use(UNANSWERED_TOOL_ID, "Read", r#"{"path":"x"}"#),
                        )
                    });
                    before.into_iter().chain(std::iter::once((delay, event)))
                })
                .collect(),
            _ => events,
        }
    }

    /// A run's rows as the (possibly defective) host's recovery read returns them: with
    /// [`Mutation::ForgetDoneMarkers`], the tasks whose reports were accepted come back running.
    pub(super) fn mutate_recovered(&self, mut rows: RecoveredRun) -> RecoveredRun {
        if self.config.mutation == Some(Mutation::ForgetDoneMarkers) {
            for task in &mut rows.tasks {
                if task.kind != TaskKind::Root
                    && matches!(task.status, TaskStatus::Complete | TaskStatus::Partial)
                {
                    task.status = TaskStatus::Running;
                }
            }
        }
        if self.config.mutation == Some(Mutation::CountInterruptedAttempts)
            && let Some(checkpoint) = rows.checkpoint.as_mut()
            && let Ok(mut snapshot) =
                serde_json::from_str::<keel_actors::coordinator::Snapshot>(&checkpoint.state)
        {
            for step in &mut snapshot.steps {
                step.failures = step.failures.max(step.attempts_total);
            }
            if let Ok(state) = serde_json::to_string(&snapshot) {
                checkpoint.state = state;
            }
        }
        rows
    }

    /// A context read as the (possibly defective) host answers it: with
    /// [`Mutation::ReadAnotherRunsScope`], a task row of another submitted run is added.
    pub(super) fn mutate_context_rows(
        &self,
        run: RunId,
        rows: Result<RowSet, String>,
    ) -> Result<RowSet, String> {
        if self.config.mutation != Some(Mutation::ReadAnotherRunsScope) {
            return rows;
        }
        let mut rows = rows?;
        let foreign = self
            .submitted
            .iter()
            .filter(|s| s.run != run)
            .find_map(|s| {
                self.store
                    .store()
                    .run(s.run)
                    .tasks(None, 1)
                    .ok()
                    .and_then(|page| page.items.into_iter().next())
            });
        if let Some(task) = foreign {
            rows.put_task(task);
        }
        Ok(rows)
    }
}
