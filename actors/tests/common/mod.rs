//! A small deterministic host for the machines in tests: one FIFO of inputs, a virtual clock, timers,
//! an in-memory store that applies committed batches, and scripted harness sessions. It wires the real
//! machines the way a runtime does, so end-to-end rules (batches, retries, recovery) can be checked
//! without the simulator crate.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use keel_actors::context::{ContextConfig, RowSet};
use keel_actors::specialist::context_rows;
use keel_actors::*;
use keel_harness::{HarnessEvent, SessionSpec, StopReason};
use keel_store::{
    AgentProfile, Checkpoint, DeadLetter, Escalation, IdempotencyRecord, ManifestEntry, Run, RunId,
    SessionLogRow, Task, TaskId,
};
use std::collections::{BTreeMap, BTreeSet, VecDeque};

pub fn agent(name: &str, harness: &str, model: &str) -> AgentProfile {
    AgentProfile {
        name: name.into(),
        description: String::new(),
        harness: harness.into(),
        model: model.into(),
        account: format!("acct-{name}"),
        tools: Vec::new(),
        system_prompt: String::new(),
        limits: Default::default(),
    }
}

pub fn step(key: &str, deps: &[&str]) -> PlanStep {
    PlanStep {
        key: key.into(),
        brief: format!("do {key}"),
        goal: format!("goal of {key}"),
        quality_criteria: vec!["cite sources".into()],
        output_schema: None,
        assignee: None,
        depends_on: deps.iter().map(|d| d.to_string()).collect(),
        estimate_micros: 0,
    }
}

pub fn report_json(task: TaskId, status: &str, claim: &str) -> String {
    let gaps = if status == "complete" {
        "[]"
    } else {
        "[\"missing part\"]"
    };
    format!(
        "Done.\n{{\"subtask_id\": \"{task}\", \"status\": \"{status}\", \"findings\": [{{\"claim\": \"{claim}\", \"source\": \"https://example.org/{claim}\", \"confidence_permille\": 800}}], \"gaps\": {gaps}, \"summary\": \"summary of {claim}\"}}"
    )
}

/// What a scripted session does, given the attempt, its spec, and how many sessions this task had.
pub type Script = Box<dyn FnMut(AttemptId, &SessionSpec) -> Vec<HarnessEvent>>;

pub fn ok_script() -> Script {
    Box::new(|a: AttemptId, _spec: &SessionSpec| {
        vec![
            HarnessEvent::Started {
                native_session_id: Some("native-1".into()),
                model: None,
            },
            HarnessEvent::tool_use("t1", "Read", "{\"path\":\"a\"}"),
            HarnessEvent::tool_result("t1", false, "contents"),
            HarnessEvent::Finished {
                stop_reason: StopReason::EndTurn,
                final_text: report_json(a.task, "complete", &format!("c{}", a.task.0 % 1000)),
            },
        ]
    })
}

#[derive(Default, Debug, Clone)]
pub struct MemStore {
    pub runs: BTreeMap<RunId, Run>,
    pub tasks: BTreeMap<TaskId, Task>,
    pub logs: BTreeMap<TaskId, Vec<(u64, SessionLogRow)>>,
    pub checkpoints: BTreeMap<RunId, Checkpoint>,
    pub idempotency: Vec<IdempotencyRecord>,
    /// Every idempotency key a durable task row carried (a task row is the record of the attempt
    /// it was last started for, written before that attempt's session).
    pub task_keys: std::collections::BTreeSet<String>,
    pub manifest: Vec<ManifestEntry>,
    pub dead_letters: Vec<DeadLetter>,
    pub escalations: Vec<Escalation>,
    pub commits: u64,
}

impl MemStore {
    pub fn apply(&mut self, batch: &CommitBatch) {
        self.commits += 1;
        for (_run, op) in batch.ops() {
            match op.clone() {
                PersistOp::CreateRun(r) => {
                    self.runs.insert(r.id, r);
                }
                // As the store does: an update without a plan keeps the one the run was created with.
                PersistOp::UpdateRun(mut r) => {
                    if r.plan.is_none() {
                        r.plan = self.runs.get(&r.id).and_then(|old| old.plan.clone());
                    }
                    self.runs.insert(r.id, r);
                }
                PersistOp::CreateTask(t) | PersistOp::UpdateTask(t) => {
                    if let Some(key) = &t.idempotency_key {
                        self.task_keys.insert(key.clone());
                    }
                    self.tasks.insert(t.id, t);
                }
                PersistOp::AppendLog { task, row } => {
                    let log = self.logs.entry(task).or_default();
                    let seq = log.last().map_or(1, |(s, _)| s + 1);
                    log.push((seq, row));
                }
                PersistOp::PutCheckpoint(c) => {
                    self.checkpoints.insert(c.run_id, c);
                }
                PersistOp::AppendManifest(m) => self.manifest.push(m),
                PersistOp::AppendDeadLetter(d) => self.dead_letters.push(d),
                PersistOp::RecordIdempotency(r) => self.idempotency.push(r),
                PersistOp::AppendAudit(_) | PersistOp::AppendGateMark(_) => {}
                PersistOp::AppendEscalation(e) => self.escalations.push(e),
                PersistOp::ResolveEscalation { id, resolution } => {
                    for e in self.escalations.iter_mut().filter(|e| e.id == id) {
                        e.resolution.get_or_insert(resolution.clone());
                    }
                }
            }
        }
    }

    pub fn rows(&self) -> RowSet {
        RowSet {
            tasks: self.tasks.clone(),
            logs: self.logs.clone(),
        }
    }

    pub fn recovered(&self, run: RunId) -> RecoveredRun {
        RecoveredRun {
            run: self.runs[&run].clone(),
            checkpoint: self.checkpoints.get(&run).cloned(),
            tasks: self
                .tasks
                .values()
                .filter(|t| t.run_id == run)
                .cloned()
                .collect(),
            idempotency: self.idempotency.clone(),
            escalations: self.escalations.clone(),
        }
    }
}

#[derive(Debug)]
pub enum Ev {
    Coord(CoordinatorInput),
    Sup(SupervisorInput),
    Ck(CheckpointInput),
    Spec(AttemptId, SpecialistInput),
}

pub struct World {
    pub now: Millis,
    pub rng: SplitMix64,
    pub run: RunId,
    pub coordinator: Coordinator,
    pub supervisor: Supervisor,
    pub checkpoint: CheckpointWriter,
    pub specialists: BTreeMap<AttemptId, Specialist>,
    pub queue: VecDeque<Ev>,
    pub timers: BTreeMap<(Millis, u64), Ev>,
    timer_seq: u64,
    pub store: MemStore,
    pub script: Script,
    pub started_keys: Vec<IdempotencyKey>,
    pub specs: Vec<(AttemptId, SessionSpec)>,
    pub events: Vec<LifecycleEvent>,
    pub effects_count: u64,
    pub fail_commits: u32,
    /// Commits still to answer as a refusal of this world's run's own write (a limit it passes).
    pub refuse_commits: u32,
    pub sup_config: SupervisorConfig,
    pub coord_config: CoordinatorConfig,
    pub max_live: usize,
    pub delivered_acks: BTreeSet<AttemptId>,
    /// Per-mille chance that a remote message (specialist <-> coordinator) is lost, and duplicated.
    pub drop_permille: u64,
    pub dup_permille: u64,
    pub chaos: SplitMix64,
    pub remote_dropped: u64,
    /// The configuration every specialist is created with.
    pub spec_config: SpecialistConfig,
    /// Answers to sessions' tool calls, in order: (attempt, call id, answer).
    pub tool_answers: Vec<(AttemptId, String, SessionAnswer)>,
}

impl World {
    pub fn new(sup_config: SupervisorConfig, script: Script) -> Self {
        Self {
            now: 1_000_000,
            rng: SplitMix64(7),
            run: RunId(0x0123_4567_89AB_CDEF),
            coordinator: Coordinator::new(CoordinatorConfig::default()),
            supervisor: Supervisor::new(sup_config.clone()),
            checkpoint: CheckpointWriter::new(CheckpointConfig::default()),
            specialists: BTreeMap::new(),
            queue: VecDeque::new(),
            timers: BTreeMap::new(),
            timer_seq: 0,
            store: MemStore::default(),
            script,
            started_keys: Vec::new(),
            specs: Vec::new(),
            events: Vec::new(),
            effects_count: 0,
            fail_commits: 0,
            refuse_commits: 0,
            sup_config,
            coord_config: CoordinatorConfig::default(),
            max_live: 0,
            delivered_acks: BTreeSet::new(),
            drop_permille: 0,
            dup_permille: 0,
            chaos: SplitMix64(99),
            remote_dropped: 0,
            spec_config: SpecialistConfig::default(),
            tool_answers: Vec::new(),
        }
    }

    pub fn default_agents() -> SupervisorConfig {
        SupervisorConfig {
            agents: vec![
                agent("alpha", "claude-code", "model-a"),
                agent("beta", "codex", "model-b"),
            ],
            spawn_burst: 100,
            spawn_interval_ms: 1,
            ..SupervisorConfig::default()
        }
    }

    pub fn submit(&mut self, mode: RunMode, budget: Option<u64>) {
        self.queue
            .push_back(Ev::Coord(CoordinatorInput::Msg(CoordinatorMsg::Accept(
                RunSpec {
                    run: self.run,
                    brief: "the run's brief".into(),
                    mode,
                    budget_limit_micros: budget,
                    config_snapshot: "test".into(),
                },
            ))));
    }

    /// Deliver a remote message: maybe lose it, maybe deliver it twice.
    fn remote(&mut self, ev: Ev, dup: impl Fn() -> Ev) {
        let roll = self.chaos.next_u64() % 1000;
        if roll < self.drop_permille {
            self.remote_dropped += 1;
            return;
        }
        self.queue.push_back(ev);
        if self.chaos.next_u64() % 1000 < self.dup_permille {
            self.queue.push_back(dup());
        }
    }

    fn timer(&mut self, at: Millis, ev: Ev) {
        self.timer_seq += 1;
        self.timers.insert((at.max(self.now), self.timer_seq), ev);
    }

    fn effects(&mut self, effects: Vec<Effect>) {
        for e in effects {
            self.effects_count += 1;
            match e {
                Effect::Send(Envelope::Coordinator { run, msg }) => {
                    assert_eq!(run, self.run, "a message for another run");
                    self.queue.push_back(Ev::Coord(CoordinatorInput::Msg(msg)));
                }
                Effect::Send(Envelope::Specialist { attempt, msg }) => {
                    if msg == SpecialistMsg::Ack {
                        self.delivered_acks.insert(attempt);
                    }
                    let again = msg.clone();
                    self.remote(Ev::Spec(attempt, SpecialistInput::Msg(msg)), || {
                        Ev::Spec(attempt, SpecialistInput::Msg(again.clone()))
                    });
                }
                Effect::Send(Envelope::Supervisor(m)) => {
                    self.queue.push_back(Ev::Sup(SupervisorInput::Msg(m)));
                }
                Effect::Send(Envelope::Checkpoint(m)) => {
                    self.queue.push_back(Ev::Ck(CheckpointInput::Msg(m)));
                }
                Effect::Send(Envelope::Host { .. }) => {
                    panic!("this host stages nothing of its own, so nothing answers it");
                }
                Effect::Persist(batch) => {
                    if self.refuse_commits > 0 {
                        self.refuse_commits -= 1;
                        self.queue.push_back(Ev::Ck(CheckpointInput::Refused {
                            id: batch.id,
                            run: self.run,
                            error: "checkpoint.state is over its limit".into(),
                        }));
                    } else if self.fail_commits > 0 {
                        self.fail_commits -= 1;
                        self.queue.push_back(Ev::Ck(CheckpointInput::CommitFailed {
                            id: batch.id,
                            error: "injected disk fault".into(),
                        }));
                    } else {
                        self.store.apply(&batch);
                        self.queue
                            .push_back(Ev::Ck(CheckpointInput::Committed(batch.id)));
                    }
                }
                Effect::SpawnSpecialist(start) => {
                    let attempt = start.attempt;
                    let s = Specialist::new(*start, self.spec_config.clone());
                    self.specialists.insert(attempt, s);
                    self.max_live = self.max_live.max(self.supervisor.live_count());
                    self.queue
                        .push_back(Ev::Spec(attempt, SpecialistInput::Begin));
                }
                Effect::StopSpecialist { attempt, reason } => {
                    self.queue.push_back(Ev::Spec(
                        attempt,
                        SpecialistInput::Msg(SpecialistMsg::Cancel { reason }),
                    ));
                }
                // Fired anyway: the machines must ignore a stale timer.
                Effect::CancelTimer { .. } => {}
                Effect::SetTimer { key, at } => {
                    let ev = match key {
                        TimerKey::Coordinator(_, t) => Ev::Coord(CoordinatorInput::Timer(t)),
                        TimerKey::Supervisor(t) => Ev::Sup(SupervisorInput::Timer(t)),
                        TimerKey::Checkpoint(t) => Ev::Ck(CheckpointInput::Timer(t)),
                    };
                    self.timer(at, ev);
                }
                Effect::Emit(ev) => self.events.push(ev),
            }
        }
    }

    fn specialist_effects(&mut self, attempt: AttemptId, effects: Vec<SpecialistEffect>) {
        for e in effects {
            self.effects_count += 1;
            match e {
                SpecialistEffect::LoadContext(req) => {
                    let rows = context_rows(&self.store.rows(), &req, &ContextConfig::default())
                        .map_err(|e| e.to_string());
                    self.queue
                        .push_back(Ev::Spec(attempt, SpecialistInput::ContextLoaded(rows)));
                }
                SpecialistEffect::StartHarness { key, spec } => {
                    assert!(
                        !self.started_keys.contains(&key),
                        "a session was started twice with idempotency key {key}"
                    );
                    assert!(
                        self.store.idempotency.iter().any(|r| r.key == key.0)
                            || self.store.task_keys.contains(&key.0),
                        "a session started before its idempotency key was durable"
                    );
                    self.started_keys.push(key);
                    let events = (self.script)(attempt, &spec);
                    self.specs.push((attempt, *spec));
                    for ev in events {
                        self.queue
                            .push_back(Ev::Spec(attempt, SpecialistInput::Harness(ev)));
                    }
                }
                SpecialistEffect::CancelHarness | SpecialistEffect::AnswerDelegation { .. } => {}
                SpecialistEffect::AnswerTool { call_id, answer } => {
                    self.tool_answers.push((attempt, call_id, answer));
                }
                SpecialistEffect::Reply(to, reply) => {
                    assert_eq!(
                        to.attempt(),
                        attempt,
                        "a specialist replied for another attempt"
                    );
                    let again = reply.clone();
                    let from = to.attempt();
                    self.remote(
                        Ev::Coord(CoordinatorInput::Msg(CoordinatorMsg::Specialist {
                            from,
                            reply,
                        })),
                        || {
                            Ev::Coord(CoordinatorInput::Msg(CoordinatorMsg::Specialist {
                                from,
                                reply: again.clone(),
                            }))
                        },
                    );
                }
                SpecialistEffect::SetTimer { timer, at } => {
                    self.timer(at, Ev::Spec(attempt, SpecialistInput::Timer(timer)));
                }
                SpecialistEffect::Emit(ev) => self.events.push(ev),
                SpecialistEffect::Exit => {
                    self.specialists.remove(&attempt);
                }
            }
        }
    }

    /// Handle one input; false when nothing is left.
    pub fn step(&mut self) -> bool {
        let ev = match self.queue.pop_front() {
            Some(ev) => ev,
            None => match self.timers.pop_first() {
                Some(((at, _), ev)) => {
                    self.now = self.now.max(at);
                    ev
                }
                None => return false,
            },
        };
        let mut out = Vec::new();
        match ev {
            Ev::Coord(i) => {
                self.coordinator
                    .handle(i, self.now, &mut self.rng, &mut out);
                self.effects(out);
            }
            Ev::Sup(i) => {
                self.supervisor.handle(i, self.now, &mut self.rng, &mut out);
                assert!(self.supervisor.live_count() <= self.sup_config.specialists_max as usize);
                self.effects(out);
            }
            Ev::Ck(i) => {
                self.checkpoint.handle(i, self.now, &mut self.rng, &mut out);
                self.effects(out);
            }
            Ev::Spec(a, i) => {
                let mut sout = Vec::new();
                if let Some(s) = self.specialists.get_mut(&a) {
                    s.handle(i, self.now, &mut self.rng, &mut sout);
                }
                self.specialist_effects(a, sout);
            }
        }
        true
    }

    /// Run until the run is terminal and nothing is queued, or `steps_max` inputs were handled.
    pub fn run(&mut self, steps_max: usize) -> usize {
        for n in 0..steps_max {
            if self.coordinator.is_terminal() && self.queue.is_empty() {
                return n;
            }
            if !self.step() {
                return n;
            }
        }
        steps_max
    }

    /// Lose everything in memory (machines, queued messages, timers); keep the store. Then recover.
    pub fn crash_and_recover(&mut self) {
        self.coordinator = Coordinator::new(self.coord_config.clone());
        self.supervisor = Supervisor::new(self.sup_config.clone());
        self.checkpoint = CheckpointWriter::new(CheckpointConfig::default());
        self.specialists.clear();
        self.queue.clear();
        self.timers.clear();
        if self.store.runs.contains_key(&self.run) {
            let rows = self.store.recovered(self.run);
            self.queue
                .push_back(Ev::Coord(CoordinatorInput::Recovered(Box::new(rows))));
        }
    }

    /// Lose everything in memory as a crash does, then reopen the stored run for `follow_up` the way
    /// the runtime does: mark the run running in the store, then send its rows with the follow-up.
    pub fn reopen(&mut self, follow_up: FollowUpRequest) {
        self.coordinator = Coordinator::new(self.coord_config.clone());
        self.supervisor = Supervisor::new(self.sup_config.clone());
        self.checkpoint = CheckpointWriter::new(CheckpointConfig::default());
        self.specialists.clear();
        self.queue.clear();
        self.timers.clear();
        if let Some(run) = self.store.runs.get_mut(&self.run) {
            run.status = keel_store::RunStatus::Running;
        }
        let rows = self.store.recovered(self.run);
        self.queue.push_back(Ev::Coord(CoordinatorInput::Reopened {
            rows: Box::new(rows),
            follow_up,
        }));
    }

    pub fn run_status(&self) -> Option<keel_store::RunStatus> {
        self.store.runs.get(&self.run).map(|r| r.status)
    }

    pub fn decisions(&self) -> Vec<String> {
        self.store
            .tasks
            .values()
            .filter(|t| t.kind == keel_store::TaskKind::Root)
            .flat_map(|t| self.store.logs.get(&t.id).cloned().unwrap_or_default())
            .map(|(_, r)| r.summary)
            .collect()
    }
}
