//! The invariant checker: sees every effect the machines emit and every input they get, and keeps what
//! it saw (the [`Observed`] record) across crashes, because it stands for the outside world: a harness
//! session that was started stays started even if the node that asked for it forgot.
//!
//! Checks are made at the moment a rule could break (an effect about to run), plus after every event
//! (limits) and at the end (liveness). The first violation stops the run.

mod cluster;
mod hooks;
mod observed;
mod operator;
mod run_state;
mod session_tools;
mod tool_pairing;

pub use cluster::PlacementSeen;
pub use observed::{DelegationAnswer, Observed, SessionObs, SpawnObs};
pub use run_state::RETRY_BUDGET_SPENT;
use run_state::RunStateChecks;
use tool_pairing::{Pairing, tool_pairing};

use std::collections::{BTreeMap, BTreeSet};

use keel_actors::context::is_slash_skill_line;
use keel_actors::{
    AttemptId, Continuity, CoordinatorInput, CoordinatorMsg, Effect, Envelope, LifecycleEvent,
    SpecialistEffect, SpecialistMsg, SpecialistReply, SpecialistStart, Supervisor, SupervisorMsg,
};
use keel_store::{RunId, RunStatus, SessionLogRow, TaskId, TaskKind, TaskStatus};

use crate::config::WorldConfig;
use crate::harness::PLANTED_SECRET;
use crate::profile::HarnessBehaviour;
use crate::queue::SimMillis;
use crate::violation::{Invariant, Violation};

/// Flags and words that would make a harness resume its own session (docs/DESIGN.md §6).
pub const NATIVE_RESUME_MARKERS: [&str; 5] = [
    "--resume",
    "--continue",
    "resumeThread",
    "--session",
    "resume_thread",
];

/// Slack allowed around a preamble's cap for the framing the builders add (tag lines, the resume
/// instruction); the cap itself is the builders' to keep, this only catches growth.
pub const PREAMBLE_FRAMING_CHARS_MAX: usize = 512;

/// The checker of one seed.
#[derive(Debug)]
pub struct Checker {
    seed: u64,
    violation: Option<Violation>,
    observed: Observed,
    specialists_max: u32,
    depth_max: u8,
    resume_chars_max: usize,
    standard_chars_max: usize,
    runs: BTreeSet<RunId>,
    /// Tool pairing per attempt, advanced as its log rows arrive (invariant 3).
    pairings: BTreeMap<AttemptId, Pairing>,
    /// Each run's budget limit as submitted: what its ledger at the supervisor must keep to.
    budget_limits: BTreeMap<RunId, u64>,
    tripped: BTreeSet<RunId>,
    depths: BTreeMap<AttemptId, u8>,
    spawn_burst: u32,
    spawn_interval_ms: u64,
    admitted_at: std::collections::VecDeque<SimMillis>,
    /// Runs whose cancel took effect (invariant 14).
    cancelled: BTreeSet<RunId>,
    /// Runs reopened for a follow-up, with the run-finished events seen since (invariant 15).
    reopened: BTreeMap<RunId, u32>,
    /// Step cancels, failed attempts per step, announced follow-ups (issue 17).
    run_state: RunStateChecks,
    /// The calls sessions made to keel's tools (issue 11).
    tools: session_tools::ToolCalls,
    /// The hooks that ran for the sessions' tool calls (issue 13, invariant 12).
    hooks: hooks::HookCalls,
    /// Placement and leases between the nodes (issue 12, invariants 19 and 20).
    cluster: cluster::ClusterChecks,
}

/// The window over which the spawn rate is checked: a GCRA bucket admits at most its burst plus one
/// spawn per interval elapsed in any window.
pub const SPAWN_RATE_WINDOW_MS: SimMillis = 1_000;

impl Checker {
    /// A checker for a world of `config` running `runs`.
    pub fn new(seed: u64, config: &WorldConfig, runs: &[keel_actors::RunSpec]) -> Self {
        Self {
            seed,
            violation: None,
            observed: Observed::default(),
            specialists_max: config.supervisor.specialists_max,
            depth_max: config.supervisor.depth_max,
            resume_chars_max: config.specialist.context.resume_chars_max(),
            standard_chars_max: config.specialist.context.standard_chars_max(),
            runs: runs.iter().map(|r| r.run).collect(),
            pairings: BTreeMap::new(),
            budget_limits: runs
                .iter()
                .filter_map(|r| r.budget_limit_micros.map(|l| (r.run, l)))
                .collect(),
            tripped: BTreeSet::new(),
            depths: BTreeMap::new(),
            spawn_burst: config.supervisor.spawn_burst,
            spawn_interval_ms: config.supervisor.spawn_interval_ms.max(1),
            admitted_at: std::collections::VecDeque::new(),
            cancelled: BTreeSet::new(),
            reopened: BTreeMap::new(),
            run_state: RunStateChecks::new(config.coordinator.attempts_per_step_max),
            tools: session_tools::ToolCalls::default(),
            hooks: hooks::HookCalls::default(),
            cluster: cluster::ClusterChecks::default(),
        }
    }

    fn fail(&mut self, event: u64, invariant: Invariant, detail: String) {
        if self.violation.is_none() {
            self.violation = Some(Violation {
                seed: self.seed,
                event,
                invariant,
                detail,
            });
        }
    }

    /// The first violation, if any.
    pub fn violation(&self) -> Option<&Violation> {
        self.violation.as_ref()
    }

    /// What was seen so far.
    pub fn observed(&self) -> &Observed {
        &self.observed
    }

    /// What was seen.
    pub fn into_observed(self) -> Observed {
        self.observed
    }

    /// Invariant 18: a message between nodes that the wire protocol could not carry.
    pub fn fail_protocol(&mut self, event: u64, detail: String) {
        self.fail(event, Invariant::WireCarries, detail);
    }

    /// The world itself hit a bound.
    pub fn world_bound(&mut self, event: u64, detail: String) {
        self.fail(event, Invariant::WorldBound, detail);
    }

    /// The plan step an attempt works on.
    pub fn step_of(&self, attempt: AttemptId) -> Option<String> {
        self.observed.spawns.get(&attempt).map(|s| s.step.clone())
    }

    /// How many sessions were started for `step` so far (the one being started included).
    pub fn sessions_of_step(&self, step: &str) -> u32 {
        u32::try_from(
            self.observed
                .sessions
                .iter()
                .filter(|s| s.step == step)
                .count(),
        )
        .unwrap_or(u32::MAX)
    }

    /// Whether a run-finished event was seen for `run`.
    pub fn run_finished(&self, run: RunId) -> bool {
        self.observed.run_finished.contains_key(&run)
    }

    /// The coordinator node went down.
    pub fn coordinator_crashed(&mut self) {
        self.observed.coordinator_crashes += 1;
    }

    /// The coordinator node was paused (a graceful shutdown).
    pub fn coordinator_paused(&mut self) {
        self.observed.pauses += 1;
    }

    /// A session's scripted behaviour was chosen.
    pub fn session_behaviour(&mut self, attempt: AttemptId, behaviour: HarnessBehaviour) {
        self.observed.behaviours.insert(attempt, behaviour);
    }

    /// A commit was attempted on a full disk: `disk_full` is whether the store answered with its typed
    /// `DiskFull` (what the checkpoint writer's retry relies on), `synced` whether the disk synced
    /// during it (a commit that could not write must make nothing durable).
    pub fn full_disk_commit(&mut self, event: u64, disk_full: bool, synced: bool) {
        self.observed
            .full_disk_commits
            .push((event, disk_full, synced));
    }

    /// A coordinator acknowledges an attempt's result, which lets the specialist exit: the result must
    /// be durable by then (docs/DESIGN.md §12, invariant 1), so the attempt's task row must already be
    /// terminal in the store, or paused with the escalation it waits for durable (an attempt whose
    /// session escalated to a human ends that way: the human's answer starts the next attempt).
    /// `stored` is its status there (`None`: no row); `escalated` whether the store holds an
    /// escalation its task waits for.
    pub fn ack_durability(
        &mut self,
        event: u64,
        attempt: AttemptId,
        stored: Option<TaskStatus>,
        escalated: bool,
    ) {
        let paused_for_human = stored == Some(TaskStatus::Paused) && escalated;
        if paused_for_human {
            self.observed.acked_escalated.insert(attempt);
        }
        if !stored.is_some_and(TaskStatus::is_terminal) && !paused_for_human {
            self.fail(
                event,
                Invariant::NoTaskLost,
                format!(
                    "attempt {attempt} was acknowledged while its task is {stored:?} in the store (acknowledged before durable)"
                ),
            );
        }
    }

    /// Context rows are handed to a specialist: every task row must be of the attempt's own run
    /// (docs/DESIGN.md §12, invariant 9).
    pub fn context_loaded(
        &mut self,
        event: u64,
        attempt: AttemptId,
        rows: &Result<keel_actors::context::RowSet, String>,
    ) {
        let Ok(rows) = rows else { return };
        if let Some(task) = rows.tasks.values().find(|t| t.run_id != attempt.run) {
            self.fail(
                event,
                Invariant::RunIsolation,
                format!(
                    "attempt {attempt} of run {} was handed task {} of run {}",
                    attempt.run, task.id, task.run_id
                ),
            );
        }
    }

    /// A commit failed: only a disk fault may cause that; a staging error is a bug in the machines
    /// (a run mismatch is an isolation breach).
    pub fn commit_failed(&mut self, event: u64, error: &keel_actors::host::HostError) {
        use keel_actors::host::HostError;
        if let HostError::Stage { source, .. } = error {
            let invariant = if matches!(source, keel_store::StageError::RunMismatch { .. }) {
                Invariant::RunIsolation
            } else {
                Invariant::WorldBound
            };
            self.fail(
                event,
                invariant,
                format!("a persist op was refused at staging: {error}"),
            );
        }
    }

    /// Limits that must hold after every event (docs/DESIGN.md §12, invariant 8).
    pub fn after_event(&mut self, event: u64, now: SimMillis, supervisor: &Supervisor) {
        self.lost_attempts_down(event, now, supervisor);
        let live = supervisor.live_count();
        if live > self.specialists_max as usize {
            self.fail(
                event,
                Invariant::LimitsHold,
                format!("{live} live specialists, limit {}", self.specialists_max),
            );
        }
    }

    /// An input reaches a coordinator (several messages of one input: each in order).
    pub fn coordinator_input(&mut self, _event: u64, _run: RunId, input: &CoordinatorInput) {
        match input {
            CoordinatorInput::Msg(msg) => self.late_result(msg),
            CoordinatorInput::Msgs(msgs) => msgs.iter().for_each(|m| self.late_result(m)),
            _ => {}
        }
    }

    /// A result for a step that accepted another attempt's report: a late one.
    fn late_result(&mut self, msg: &CoordinatorMsg) {
        if let CoordinatorMsg::Specialist {
            from,
            reply: SpecialistReply::Finished(_),
        } = msg
            && let Some(step) = self.step_of(*from)
            && let Some(accepted) = self.observed.accepted_reports.get(&(from.run, step))
            && !accepted.is_empty()
            && !accepted.contains(from)
        {
            self.observed.late_results.push(*from);
        }
    }

    /// An effect of a coordinator-node machine is about to run.
    pub fn coord_effect(
        &mut self,
        event: u64,
        now: SimMillis,
        from_run: Option<RunId>,
        effect: &Effect,
        supervisor: Option<&Supervisor>,
    ) {
        if let Effect::Send(Envelope::Coordinator {
            msg: CoordinatorMsg::Admission { answer: Ok(_), .. },
            ..
        }) = effect
        {
            self.spawn_rate(event, now);
        }
        match effect {
            Effect::Send(envelope) => {
                if let Some(from) = from_run {
                    let target = match envelope {
                        Envelope::Coordinator { run, .. } => Some(*run),
                        Envelope::Specialist { attempt, .. } => Some(attempt.run),
                        _ => None,
                    };
                    if let Some(target) = target
                        && target != from
                    {
                        self.fail(
                            event,
                            Invariant::RunIsolation,
                            format!("the coordinator of run {from} addressed run {target}"),
                        );
                    }
                }
                match envelope {
                    Envelope::Specialist {
                        attempt,
                        msg: SpecialistMsg::Ack,
                    } => self.acked(event, *attempt),
                    Envelope::Coordinator { run, msg } => {
                        self.coordinator_msg(event, *run, msg, supervisor)
                    }
                    Envelope::Supervisor(SupervisorMsg::Admit(request)) => {
                        self.depths.insert(request.attempt, request.depth);
                        self.admitted_step(request.attempt, &request.brief.step);
                    }
                    Envelope::Supervisor(msg) => {
                        if let Some(attempt) = Self::settles_failure(msg) {
                            self.failure_told(attempt);
                        }
                    }
                    _ => {}
                }
            }
            Effect::Persist(batch) => {
                for stage in batch.stages.iter() {
                    for op in stage.ops.iter() {
                        if let keel_actors::PersistOp::CreateTask(t) = op {
                            self.observed.tasks_created.insert(t.id, (t.kind, t.parent));
                        }
                        self.persisted(event, stage.run, op);
                        if let Some(other) = op_run(op)
                            && other != stage.run
                        {
                            self.fail(
                                event,
                                Invariant::RunIsolation,
                                format!(
                                    "a stage of run {} writes a row of run {other} ({})",
                                    stage.run,
                                    op.name()
                                ),
                            );
                        }
                    }
                }
            }
            Effect::SpawnSpecialist(start) => {
                self.spawn_after_cancel(
                    event,
                    start.attempt.run,
                    &format!("its coordinator spawned {}", start.attempt),
                );
                self.spawn_after_step_cancel(event, start.attempt, &start.brief.step);
                let profile_model = crate::setup::model_of(&start.assignment.agent);
                if profile_model != Some(start.assignment.model.as_str()) {
                    self.fail(
                        event,
                        Invariant::ModelFromAssignee,
                        format!(
                            "attempt {} of agent {} got model {} (profile: {:?})",
                            start.attempt,
                            start.assignment.agent,
                            start.assignment.model,
                            profile_model
                        ),
                    );
                }
            }
            Effect::StopSpecialist { attempt, .. } => self.observed.stops.push(*attempt),
            Effect::Emit(LifecycleEvent::RunFinished(keel_actors::RunOutcome {
                run,
                status,
                outcome,
            })) => {
                self.observed
                    .run_finished
                    .insert(*run, (*status, outcome.clone()));
                self.run_finished_after_reopen(event, *run);
            }
            _ => {}
        }
    }

    fn spawn_rate(&mut self, event: u64, now: SimMillis) {
        self.admitted_at.push_back(now);
        while self
            .admitted_at
            .front()
            .is_some_and(|t| *t + SPAWN_RATE_WINDOW_MS <= now)
        {
            self.admitted_at.pop_front();
        }
        let allowed = u64::from(self.spawn_burst) + SPAWN_RATE_WINDOW_MS / self.spawn_interval_ms;
        let seen = self.admitted_at.len() as u64;
        if seen > allowed {
            self.fail(
                event,
                Invariant::LimitsHold,
                format!("{seen} spawns admitted within {SPAWN_RATE_WINDOW_MS} ms, the rate allows {allowed}"),
            );
        }
    }

    fn coordinator_msg(
        &mut self,
        event: u64,
        run: RunId,
        msg: &CoordinatorMsg,
        supervisor: Option<&Supervisor>,
    ) {
        match msg {
            CoordinatorMsg::Admission { attempt, answer } => match answer {
                Ok(_) => {
                    self.observed.admissions += 1;
                    if let Some(depth) = self.depths.get(attempt)
                        && *depth > self.depth_max
                    {
                        self.fail(
                            event,
                            Invariant::LimitsHold,
                            format!(
                                "attempt {attempt} admitted at depth {depth}, limit {}",
                                self.depth_max
                            ),
                        );
                    }
                    if self.tripped.contains(&attempt.run) {
                        self.observed.admissions_after_trip += 1;
                        self.fail(
                            event,
                            Invariant::LimitsHold,
                            format!(
                                "attempt {attempt} admitted after run {}'s budget tripped",
                                attempt.run
                            ),
                        );
                    }
                    // Against the run's limit as submitted, not the ledger's own: a ledger
                    // opened with the wrong limit admits within it.
                    if let Some(ledger) = supervisor.and_then(|s| s.ledger(attempt.run))
                        && let Some(&limit) = self.budget_limits.get(&attempt.run)
                        && ledger.reserved_micros.saturating_add(ledger.spent_micros) > limit
                        && ledger.reserved_micros > 0
                    {
                        self.fail(
                            event,
                            Invariant::LimitsHold,
                            format!(
                                "attempt {attempt} admitted with {} reserved + {} spent over a limit of {limit}",
                                ledger.reserved_micros, ledger.spent_micros
                            ),
                        );
                    }
                }
                Err(refusal) => self.observed.refusals.push((*attempt, refusal.clone())),
            },
            CoordinatorMsg::Verdict { attempt, verdict } => {
                self.observed.verdicts.push((*attempt, verdict.clone()))
            }
            CoordinatorMsg::AttemptLost {
                attempt, verdict, ..
            } => {
                self.failure_told(*attempt);
                self.observed.lost.push(*attempt);
                self.observed.verdicts.push((*attempt, verdict.clone()));
            }
            CoordinatorMsg::BudgetTripped { .. } => self.budget_tripped(run),
            _ => {}
        }
    }

    fn acked(&mut self, event: u64, attempt: AttemptId) {
        self.observed.acked.insert(attempt);
        if self.observed.results.get(&attempt) == Some(&true)
            && !self.observed.acked_escalated.contains(&attempt)
        {
            let step = self.step_of(attempt).unwrap_or_default();
            let accepted = self
                .observed
                .accepted_reports
                .entry((attempt.run, step))
                .or_default();
            accepted.insert(attempt);
            if accepted.len() > 1 {
                let list: Vec<String> = accepted.iter().map(ToString::to_string).collect();
                self.fail(
                    event,
                    Invariant::IdempotentOnce,
                    format!(
                        "step {:?} of run {} had reports of several attempts accepted: {}",
                        self.step_of(attempt).unwrap_or_default(),
                        attempt.run,
                        list.join(", ")
                    ),
                );
            }
        }
    }

    /// A spawn request reached a worker: the specialist exists from now on.
    pub fn spawned(&mut self, event: u64, start: &SpecialistStart) {
        let obs = SpawnObs {
            run: start.attempt.run,
            step: start.brief.step.clone(),
            kind: start.kind,
            continuity: start.continuity,
            agent: start.assignment.agent.clone(),
            harness: start.assignment.harness.as_str().to_string(),
            model: start.assignment.model.clone(),
            brief: start.brief.brief.clone(),
        };
        if !self.runs.contains(&obs.run) {
            self.fail(
                event,
                Invariant::RunIsolation,
                format!("attempt {} belongs to no submitted run", start.attempt),
            );
        }
        let (step, brief) = (obs.step.clone(), obs.brief.clone());
        if self.observed.spawns.insert(start.attempt, obs).is_none() {
            self.delegated_spawn(event, start.attempt, &step, &brief);
        }
    }

    /// An effect of a specialist is about to run.
    pub fn spec_effect(
        &mut self,
        event: u64,
        _now: SimMillis,
        attempt: AttemptId,
        effect: &SpecialistEffect,
    ) {
        match effect {
            SpecialistEffect::Reply(to, reply) => {
                if to.attempt() != attempt {
                    self.fail(
                        event,
                        Invariant::NoSiblingAddress,
                        format!(
                            "specialist {attempt} replied through the address of {}",
                            to.attempt()
                        ),
                    );
                }
                match reply {
                    SpecialistReply::Finished(result) => self.finished(event, attempt, result),
                    SpecialistReply::Logs { rows } => self.logs(event, attempt, rows),
                    SpecialistReply::Delegate { turn, calls } => {
                        self.observed.delegations.push((
                            attempt,
                            *turn,
                            calls.iter().map(|c| c.call_id.clone()).collect(),
                        ));
                        self.delegation_asked(
                            attempt,
                            calls.iter().map(|c| c.brief.clone()).collect(),
                        );
                    }
                    _ => {}
                }
            }
            SpecialistEffect::StartHarness { key, spec } => {
                self.start(event, attempt, &key.0, spec)
            }
            SpecialistEffect::AnswerDelegation { turn, results } => {
                self.observed.delegation_answers.push((
                    attempt,
                    *turn,
                    results
                        .iter()
                        .map(|(id, o)| {
                            (id.clone(), matches!(o, keel_actors::StepOutcome::Report(_)))
                        })
                        .collect(),
                ));
            }
            _ => {}
        }
    }

    fn finished(&mut self, event: u64, attempt: AttemptId, result: &keel_actors::AttemptResult) {
        if result.attempt != attempt {
            self.fail(
                event,
                Invariant::NoSiblingAddress,
                format!(
                    "specialist {attempt} sent a result tagged {}",
                    result.attempt
                ),
            );
        }
        match &result.outcome {
            Ok(report) => {
                if let Err(e) = report.verify(attempt.task) {
                    self.fail(
                        event,
                        Invariant::NoEmptySuccess,
                        format!("attempt {attempt} sent an unverified report: {e}"),
                    );
                }
                if let Some(b) = self.observed.behaviours.get(&attempt)
                    && b.is_failure()
                {
                    self.fail(
                        event,
                        Invariant::NoEmptySuccess,
                        format!("attempt {attempt} reported success after a {b:?} session"),
                    );
                }
                self.observed.reports.insert(attempt, report.clone());
                self.observed.results.insert(attempt, true);
            }
            Err(_) => {
                self.observed.results.insert(attempt, false);
            }
        }
    }

    fn logs(&mut self, event: u64, attempt: AttemptId, rows: &[(u32, SessionLogRow)]) {
        let log = self.observed.logs.entry(attempt).or_default();
        for (seq, row) in rows {
            log.insert(*seq, row.clone());
        }
        // Tool pairing as far as the rows show it (docs/DESIGN.md §12, invariant 3): in sequence order, each
        // tool_use is answered by exactly one tool_result with its id, before any text row of the
        // model. Only a gapless prefix is checked, since rows may still be in flight.
        if let Err(detail) = tool_pairing(&mut self.pairings, attempt, log) {
            self.fail(event, Invariant::ToolPairing, detail);
        }
    }

    fn start(
        &mut self,
        event: u64,
        attempt: AttemptId,
        key: &str,
        spec: &keel_harness::SessionSpec,
    ) {
        // Invariant 2: one key, one session, across crashes and replays.
        if let Some(first) = self.observed.keys_started.get(key) {
            self.fail(
                event,
                Invariant::IdempotentOnce,
                format!("session key {key} started twice (first by {first})"),
            );
            return;
        }
        self.observed.keys_started.insert(key.to_string(), attempt);

        // Invariant 5: nothing that would resume a native session.
        let fields = [
            spec.prompt.as_str(),
            spec.append_system_prompt.as_deref().unwrap_or(""),
        ];
        let env = spec.env.iter().flat_map(|(k, v)| [k.as_str(), v.as_str()]);
        if let Some(m) = fields
            .into_iter()
            .chain(env)
            .find_map(|f| NATIVE_RESUME_MARKERS.iter().find(|m| f.contains(**m)))
        {
            self.observed.native_resume_calls += 1;
            self.fail(
                event,
                Invariant::NoNativeResume,
                format!("attempt {attempt}'s session spec carries {m:?}"),
            );
        }

        let Some(spawn) = self.observed.spawns.get(&attempt).cloned() else {
            self.fail(
                event,
                Invariant::WorldBound,
                format!("attempt {attempt} started a session without a spawn"),
            );
            return;
        };
        // Invariant 6: the model is the assignee's.
        let profile_model = crate::setup::model_of(&spawn.agent);
        if profile_model != Some(spec.model.as_str()) {
            self.fail(
                event,
                Invariant::ModelFromAssignee,
                format!(
                    "attempt {attempt} ({:?}) runs model {} but its assignee {} has {:?}",
                    spawn.kind, spec.model, spawn.agent, profile_model
                ),
            );
        }

        // Invariant 4: preamble bounds, brief intact, slash line first, no secret.
        let prompt = &spec.prompt;
        if prompt.contains(PLANTED_SECRET) {
            self.fail(
                event,
                Invariant::PreambleBounds,
                format!("attempt {attempt}'s prompt carries a secret"),
            );
        }
        let first_brief_line = spawn.brief.lines().next().unwrap_or("");
        if is_slash_skill_line(first_brief_line) && prompt.lines().next() != Some(first_brief_line)
        {
            self.fail(
                event,
                Invariant::PreambleBounds,
                format!(
                    "attempt {attempt}: the slash skill {first_brief_line:?} is not on line one"
                ),
            );
        }
        if let Some(line) = spawn
            .brief
            .lines()
            .find(|l| !l.trim().is_empty() && !prompt.contains(*l))
        {
            self.fail(
                event,
                Invariant::PreambleBounds,
                format!("attempt {attempt}: brief line {line:?} is not intact in the prompt"),
            );
        }
        let (kind, body) = preamble_of(prompt);
        let chars = body.map_or(0, |b| b.chars().count());
        let expected = match spawn.continuity {
            Continuity::Fresh => None,
            Continuity::Standard { .. } => Some(("standard", self.standard_chars_max)),
            Continuity::Resume { .. } => Some(("resume", self.resume_chars_max)),
        };
        match (expected, kind) {
            (Some((want, cap)), Some(got)) => {
                if want != got {
                    self.fail(
                        event,
                        Invariant::PreambleBounds,
                        format!("attempt {attempt} wanted a {want} preamble, got {got}"),
                    );
                }
                if chars > cap + PREAMBLE_FRAMING_CHARS_MAX {
                    self.fail(
                        event,
                        Invariant::PreambleBounds,
                        format!("attempt {attempt}: {got} preamble of {chars} chars, cap {cap}"),
                    );
                }
            }
            (Some((want, _)), None) => {
                self.fail(
                    event,
                    Invariant::PreambleBounds,
                    format!("attempt {attempt} wanted a {want} preamble and got none"),
                );
            }
            (None, Some(got)) => {
                self.fail(
                    event,
                    Invariant::PreambleBounds,
                    format!("attempt {attempt} starts fresh but got a {got} preamble"),
                );
            }
            (None, None) => {}
        }
        let prompt_chars = prompt.chars().count();
        self.observed.sessions.push(SessionObs {
            attempt,
            step: spawn.step.clone(),
            model: spec.model.clone(),
            preamble: kind.map(str::to_string),
            preamble_chars: chars,
            prompt_chars,
            preamble_truncated: body.is_some_and(|b| b.contains("[truncated")),
            preamble_lines: body.map_or(0, |b| b.lines().count()),
        });
    }

    /// A run's budget tripped at the supervisor (seen on its way to the run's coordinator).
    fn budget_tripped(&mut self, run: RunId) {
        self.tripped.insert(run);
        self.observed.budget_trips.push(run);
    }

    /// End of the world: every attempt that reported success answered each of its tool_uses
    /// (invariant 3); then, after the liveness phase, liveness of runs and of their tasks (DESIGN.md
    /// §12, invariant 1). `open_tasks` holds, for each run, its durable tasks that are not terminal.
    pub fn at_end(
        &mut self,
        event: u64,
        runs_final: &BTreeMap<RunId, (RunStatus, Option<String>)>,
        open_tasks: &BTreeMap<RunId, Vec<(TaskId, TaskStatus, TaskKind)>>,
        healed: bool,
    ) {
        if self.violation.is_some() {
            return;
        }
        let succeeded: Vec<AttemptId> = self
            .observed
            .results
            .iter()
            .filter(|(_, ok)| **ok)
            .map(|(a, _)| *a)
            .collect();
        for attempt in succeeded {
            let Some(log) = self.observed.logs.get(&attempt) else {
                continue;
            };
            match tool_pairing(&mut self.pairings, attempt, log) {
                Ok(open) if open.is_empty() => {}
                Ok(open) => {
                    let ids: Vec<String> = open.iter().cloned().collect();
                    self.fail(
                        event,
                        Invariant::ToolPairing,
                        format!(
                            "attempt {attempt} reported success with tool_use {} unanswered",
                            ids.join(", ")
                        ),
                    );
                }
                Err(detail) => self.fail(event, Invariant::ToolPairing, detail),
            }
        }
        if self.violation.is_some() || !healed {
            return;
        }
        self.reopened_runs_ended(event, |run| runs_final.get(&run).map(|(s, _)| *s));
        for run in self.runs.clone() {
            match runs_final.get(&run) {
                Some((status, _)) if status.is_terminal() => {}
                Some((status, _)) => {
                    self.fail(
                        event,
                        Invariant::NoTaskLost,
                        format!("run {run} ended the liveness phase {status:?}"),
                    );
                }
                None => self.fail(
                    event,
                    Invariant::NoTaskLost,
                    format!("run {run} was never made durable"),
                ),
            }
            if let Some((task, status, kind)) = open_tasks.get(&run).and_then(|t| t.first()) {
                self.fail(
                    event,
                    Invariant::NoTaskLost,
                    format!("run {run} ended but its task {task} ({kind:?}) is still {status:?}"),
                );
            }
        }
    }
}

/// The run a persisted row names, when it names one.
fn op_run(op: &keel_actors::PersistOp) -> Option<RunId> {
    use keel_actors::PersistOp;
    match op {
        PersistOp::CreateRun(r) | PersistOp::UpdateRun(r) => Some(r.id),
        PersistOp::CreateTask(t) | PersistOp::UpdateTask(t) => Some(t.run_id),
        PersistOp::PutCheckpoint(c) => Some(c.run_id),
        _ => None,
    }
}

/// The preamble inside a prompt: its kind and its text, tags included.
pub fn preamble_of(prompt: &str) -> (Option<&'static str>, Option<&str>) {
    let Some(start) = prompt.find("<keel-context") else {
        return (None, None);
    };
    let rest = &prompt[start..];
    let end = rest
        .find("</keel-context>")
        .map_or(rest.len(), |e| e + "</keel-context>".len());
    let body = &rest[..end];
    let kind = if body.starts_with("<keel-context kind=\"resume\"") {
        Some("resume")
    } else if body.starts_with("<keel-context kind=\"standard\"") {
        Some("standard")
    } else {
        Some("unknown")
    };
    (kind, Some(body))
}
