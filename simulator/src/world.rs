//! The world: nodes, machines, network, disk and harness sessions, driven one event at a time from a
//! single agenda and a single seeded stream.
//!
//! Topology (DESIGN.md §1, §10): node 0 is the coordinator node and owns the store (a real keel-store
//! on a [`keel_store::SimDisk`]) plus the coordinator of every run, the supervisor and the checkpoint
//! writer; nodes 1.. are stateless workers that host specialists and their harness sessions. Messages
//! between machines on the coordinator node are local (FIFO, never dropped while the node is up);
//! messages to and from workers cross the simulated network.
//!
//! Every effect a machine emits is executed here, and every one passes the [`crate::check::Checker`]
//! first, so an invariant is checked at the moment it could break.

use std::collections::{BTreeMap, VecDeque};

use keel_actors::{
    AttemptId, CheckpointInput, CheckpointWriter, Coordinator, CoordinatorInput, CoordinatorMsg,
    Effect, Entropy, Envelope, Machine, RunSpec, Specialist, SpecialistEffect, SpecialistInput,
    SpecialistMsg, SpecialistStart, Supervisor, SupervisorInput, SupervisorMsg, TimerKey,
};
use keel_harness::{HarnessError, HarnessEvent};
use keel_store::RunId;

use crate::check::Checker;
use crate::config::{DiskFault, Intervention, WorldConfig};
use crate::harness;
use crate::net::{NodeId, Route};
use crate::profile::{FaultCounts, FaultKind, FaultProfile, HarnessBehaviour};
use crate::queue::{EventQueue, SimMillis};
use crate::rng::SimRng;
use crate::sim_store::SimStore;
use crate::trace::Trace;
use crate::violation::{Invariant, Violation};
use keel_actors::host::{self, HostError};

impl Entropy for SimRng {
    fn next_u64(&mut self) -> u64 {
        SimRng::next_u64(self)
    }
}

/// Most events one agenda holds at once.
pub const QUEUE_LEN_MAX: usize = 200_000;

/// Something that happens at a point of virtual time.
#[derive(Debug)]
enum Ev {
    /// A run is submitted to the coordinator node (the embedding host's submission API).
    Submit(Box<RunSpec>),
    /// An input for a run's coordinator. `inc` is the coordinator node's incarnation for local inputs
    /// (lost with the node), `None` for messages from the network (delivered to whoever is up).
    Coord {
        run: RunId,
        input: CoordinatorInput,
        inc: Option<u32>,
    },
    /// An input for the supervisor.
    Sup {
        input: SupervisorInput,
        inc: Option<u32>,
    },
    /// An input for the checkpoint writer.
    Ckpt { input: CheckpointInput, inc: u32 },
    /// An input for a specialist on a worker, valid only for the worker incarnation it was sent to
    /// (`None`: a network message, delivered if the attempt is hosted there now).
    Spec {
        node: NodeId,
        attempt: AttemptId,
        input: SpecialistInput,
        inc: Option<u32>,
    },
    /// A spawn request arrives at a worker.
    Spawn {
        node: NodeId,
        start: Box<SpecialistStart>,
        /// The worker's incarnation the spawn was addressed to (the attempt's epoch on that worker):
        /// a copy that arrives after the worker restarted is refused, since the restarted worker
        /// cannot know whether the attempt's first copy already started a session there.
        inc: u32,
    },
    /// A specialist's context request arrives at the coordinator node.
    ContextRequest {
        node: NodeId,
        attempt: AttemptId,
        request: keel_actors::ContextRequest,
    },
    /// The next scripted event of a harness session.
    HarnessNext {
        node: NodeId,
        inc: u32,
        attempt: AttemptId,
        session: u64,
    },
    /// Roll for partitions, crashes and disk faults.
    FaultTick,
    /// A scripted intervention of the scenario.
    Intervene(Intervention),
    /// A crashed node comes back.
    Restart(NodeId),
    /// The liveness phase begins: heal everything.
    Heal,
}

impl Ev {
    /// A compact, stable description for the trace (ids shortened, payloads named, not dumped).
    fn describe(&self, s: &mut String) {
        use std::fmt::Write as _;
        let _ = match self {
            Ev::Submit(spec) => write!(s, "submit run={}", short(spec.run.0)),
            Ev::Coord { run, input, .. } => {
                write!(s, "coord run={} {}", short(run.0), coord_input_name(input))
            }
            Ev::Sup { input, .. } => write!(s, "supervisor {}", sup_input_name(input)),
            Ev::Ckpt { input, .. } => write!(s, "checkpoint {}", ckpt_input_name(input)),
            Ev::Spec {
                node,
                attempt,
                input,
                ..
            } => {
                write!(
                    s,
                    "spec {node} {} {}",
                    attempt_short(attempt),
                    spec_input_name(input)
                )
            }
            Ev::Spawn { node, start, .. } => {
                write!(s, "spawn-arrives {node} {}", attempt_short(&start.attempt))
            }
            Ev::ContextRequest { node, attempt, .. } => {
                write!(s, "context-request from {node} {}", attempt_short(attempt))
            }
            Ev::HarnessNext { node, attempt, .. } => {
                write!(s, "harness {node} {}", attempt_short(attempt))
            }
            Ev::FaultTick => write!(s, "fault-tick"),
            Ev::Intervene(i) => write!(s, "intervene {i:?}"),
            Ev::Restart(node) => write!(s, "restart {node}"),
            Ev::Heal => write!(s, "heal"),
        };
    }
}

fn short(id: u128) -> String {
    format!("{:08x}", (id & 0xffff_ffff) as u32)
}

fn attempt_short(a: &AttemptId) -> String {
    format!("{}#{}", short(a.task.0), a.attempt)
}

fn coord_input_name(i: &CoordinatorInput) -> String {
    match i {
        CoordinatorInput::Msg(m) => match m {
            CoordinatorMsg::Accept(_) => "accept".into(),
            CoordinatorMsg::Specialist { from, reply } => {
                let what = match reply {
                    keel_actors::SpecialistReply::Logs { rows } => format!("logs({})", rows.len()),
                    keel_actors::SpecialistReply::Spend { spent_micros } => {
                        format!("spend({spent_micros})")
                    }
                    keel_actors::SpecialistReply::Finished(r) => {
                        format!(
                            "finished({})",
                            if r.outcome.is_ok() {
                                "report"
                            } else {
                                "failure"
                            }
                        )
                    }
                    keel_actors::SpecialistReply::Delegate { turn, .. } => {
                        format!("delegate({turn})")
                    }
                };
                format!("from {} {what}", attempt_short(from))
            }
            CoordinatorMsg::Durable { ticket } => format!("durable({ticket})"),
            CoordinatorMsg::PersistFailed { ticket, .. } => format!("persist-failed({ticket})"),
            CoordinatorMsg::Admission { attempt, answer } => {
                format!(
                    "admission {} {}",
                    attempt_short(attempt),
                    if answer.is_ok() { "ok" } else { "refused" }
                )
            }
            CoordinatorMsg::Verdict { attempt, verdict } => {
                format!("verdict {} {verdict:?}", attempt_short(attempt))
            }
            CoordinatorMsg::AttemptLost { attempt, .. } => {
                format!("attempt-lost {}", attempt_short(attempt))
            }
            CoordinatorMsg::BudgetTripped { .. } => "budget-tripped".into(),
            CoordinatorMsg::Cancel { .. } => "cancel".into(),
            CoordinatorMsg::FollowUp { parent, .. } => format!("follow-up on {}", short(parent.0)),
        },
        CoordinatorInput::Timer(t) => format!("timer {t:?}"),
        CoordinatorInput::Recovered(_) => "recovered".into(),
        CoordinatorInput::Reopened { follow_up, .. } => {
            format!("reopened for a follow-up on {}", short(follow_up.parent.0))
        }
    }
}

fn sup_input_name(i: &SupervisorInput) -> String {
    match i {
        SupervisorInput::Msg(m) => match m {
            SupervisorMsg::OpenRun { run, .. } => format!("open-run {}", short(run.0)),
            SupervisorMsg::Admit(r) => format!("admit {}", attempt_short(&r.attempt)),
            SupervisorMsg::Spend {
                attempt,
                spent_micros,
            } => format!("spend {} {spent_micros}", attempt_short(attempt)),
            SupervisorMsg::Settle {
                attempt, outcome, ..
            } => {
                format!(
                    "settle {} {}",
                    attempt_short(attempt),
                    if outcome.is_ok() { "ok" } else { "failed" }
                )
            }
            SupervisorMsg::SpecialistDown { attempt, .. } => {
                format!("down {}", attempt_short(attempt))
            }
            SupervisorMsg::CloseRun { run } => format!("close-run {}", short(run.0)),
        },
        SupervisorInput::Timer(t) => match t {
            keel_actors::SupervisorTimer::Deadline(a) => format!("deadline {}", attempt_short(a)),
        },
    }
}

fn ckpt_input_name(i: &CheckpointInput) -> String {
    match i {
        CheckpointInput::Msg(keel_actors::CheckpointMsg::Stage(s)) => {
            format!("stage {} #{}", short(s.run.0), s.ticket)
        }
        CheckpointInput::Msg(keel_actors::CheckpointMsg::Stages(stages)) => {
            let tickets: Vec<String> = stages.iter().map(|s| format!("#{}", s.ticket)).collect();
            let run = stages.first().map_or(0, |s| s.run.0);
            format!("stages {} {}", short(run), tickets.join(","))
        }
        CheckpointInput::Committed(id) => format!("committed {}", id.0),
        CheckpointInput::CommitFailed { id, .. } => format!("commit-failed {}", id.0),
        CheckpointInput::Timer(t) => format!("timer {t:?}"),
    }
}

fn spec_input_name(i: &SpecialistInput) -> String {
    match i {
        SpecialistInput::Begin => "begin".into(),
        SpecialistInput::Msg(SpecialistMsg::Ack) => "ack".into(),
        SpecialistInput::Msg(SpecialistMsg::Cancel { .. }) => "cancel".into(),
        SpecialistInput::Msg(SpecialistMsg::Delegated { turn, .. }) => format!("delegated {turn}"),
        SpecialistInput::ContextLoaded(r) => {
            format!("context-loaded {}", if r.is_ok() { "ok" } else { "err" })
        }
        SpecialistInput::Harness(e) => match e {
            HarnessEvent::Started { .. } => "harness started".into(),
            HarnessEvent::Text { .. } => "harness text".into(),
            HarnessEvent::ToolUse { id, .. } => format!("harness tool_use {id}"),
            HarnessEvent::ToolResult { id, .. } => format!("harness tool_result {id}"),
            HarnessEvent::Usage(_) => "harness usage".into(),
            HarnessEvent::Finished { stop_reason, .. } => format!("harness finished {stop_reason}"),
            HarnessEvent::Failed(e) => format!("harness failed {}", e.category),
        },
        SpecialistInput::Timer(t) => format!("timer {t:?}"),
    }
}

/// A harness session in progress on a worker.
#[derive(Debug)]
struct Session {
    id: u64,
    events: VecDeque<(u64, HarnessEvent)>,
    /// A lead's segments still to come: each is released by the answer to the delegation turn that
    /// ends the one before it (until then the session waits on its `delegate` tool call).
    after_answers: VecDeque<Vec<(u64, HarnessEvent)>>,
    /// Delegation turns of this session answered so far.
    answered: u32,
}

/// A specialist hosted on a worker.
#[derive(Debug)]
struct Hosted {
    machine: Specialist,
    session: Option<Session>,
    context_pending: bool,
}

/// A worker node.
#[derive(Debug, Default)]
struct Worker {
    up: bool,
    inc: u32,
    specialists: BTreeMap<AttemptId, Hosted>,
    /// Attempts this incarnation has hosted: a duplicated or late spawn of one of them is refused,
    /// as a worker's actor registry would (memory only: lost when the worker crashes).
    hosted_ever: std::collections::BTreeSet<AttemptId>,
}

/// Most delegation turns a simulated lead's session makes.
pub const LEAD_TURNS_MAX: u64 = 2;
/// Most calls in one of its turns.
pub const LEAD_CALLS_MAX: u64 = 4;

/// Most attempts a worker remembers having hosted.
pub const HOSTED_REMEMBERED_MAX: usize = 100_000;

/// The coordinator node's machines: everything here is lost in a crash; the store is not.
#[derive(Debug)]
struct CoordinatorNode {
    coordinators: BTreeMap<RunId, Coordinator>,
    supervisor: Supervisor,
    checkpoint: CheckpointWriter,
    /// Where each attempt was placed (host memory, lost in a crash like everything else).
    placement: BTreeMap<AttemptId, NodeId>,
}

/// The outcome of one seed.
#[derive(Debug, Clone)]
pub struct RunReport {
    /// The seed.
    pub seed: u64,
    /// Events processed.
    pub events: u64,
    /// Virtual time at the end.
    pub end_ms: SimMillis,
    /// The trace hash.
    pub trace_hash: u64,
    /// Faults injected, by kind.
    pub faults: FaultCounts,
    /// The first invariant broken, if any.
    pub violation: Option<Violation>,
    /// The fault profile the seed sampled (or the scenario fixed).
    pub profile: FaultProfile,
    /// What the checker saw (for scenario assertions).
    pub observed: crate::check::Observed,
    /// The trace lines, when recording.
    pub trace_lines: Vec<String>,
    /// Effects the coordinator node's machines executed (the boundaries a scripted crash can pick).
    pub coord_effects: u64,
    /// Each run's terminal status and outcome as the store holds it at the end.
    pub runs_final: BTreeMap<RunId, (keel_store::RunStatus, Option<String>)>,
    /// Store commits attempted (one write transaction each, failed ones included): the unit of the
    /// simulator's cost, reported next to events by the soak.
    pub commits: u64,
    /// Spawn messages refused because they were addressed to an earlier incarnation of their worker
    /// (a late copy reaching a restarted worker).
    pub stale_spawns_refused: u64,
    /// The runs that were led by an agent (`RunMode::Lead`).
    pub lead_runs: std::collections::BTreeSet<RunId>,
}

/// The simulated world of one seed.
pub struct World {
    config: WorldConfig,
    rng: SimRng,
    profile: FaultProfile,
    /// The profile the seed sampled (or the scenario fixed); `profile` becomes the healed one later.
    profile_sampled: FaultProfile,
    queue: EventQueue<Ev>,
    now: SimMillis,
    event_no: u64,
    trace: Trace,
    faults: FaultCounts,
    net: crate::net::Network,
    store: SimStore,
    coord: Option<CoordinatorNode>,
    coord_inc: u32,
    workers: Vec<Worker>,
    submitted: Vec<RunSpec>,
    checker: Checker,
    sessions_started: u64,
    effects_executed: u64,
    commits: u64,
    healed: bool,
    disk_fault_armed: Option<crate::config::DiskFault>,
    spawn_cursor: usize,
    stale_spawns_refused: u64,
    coord_effects: Vec<Effect>,
    spec_effects: Vec<SpecialistEffect>,
}

impl std::fmt::Debug for World {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("World")
            .field("seed", &self.config.seed)
            .field("now", &self.now)
            .finish_non_exhaustive()
    }
}

/// Runs one seed to its end and reports.
///
/// # Errors
/// Never for a seed: every problem is a [`Violation`] in the report. The store failing to initialise on
/// an empty in-memory disk is the only setup error, and it is reported as a world-bound violation.
pub fn run(config: WorldConfig) -> RunReport {
    match World::new(config) {
        Ok(world) => world.run_to_end(),
        Err(report) => *report,
    }
}

impl World {
    fn new(config: WorldConfig) -> Result<Self, Box<RunReport>> {
        let mut rng = SimRng::new(config.seed);
        let profile = match &config.profile {
            Some(p) => p.clone(),
            None => FaultProfile::sample(&mut rng),
        };
        let store = match SimStore::new() {
            Ok(s) => s,
            Err(e) => {
                return Err(Box::new(RunReport {
                    seed: config.seed,
                    events: 0,
                    end_ms: 0,
                    trace_hash: 0,
                    faults: FaultCounts::default(),
                    violation: Some(Violation {
                        seed: config.seed,
                        event: 0,
                        invariant: Invariant::WorldBound,
                        detail: format!("the store did not open: {e}"),
                    }),
                    profile,
                    observed: crate::check::Observed::default(),
                    trace_lines: Vec::new(),
                    coord_effects: 0,
                    runs_final: BTreeMap::new(),
                    commits: 0,
                    stale_spawns_refused: 0,
                    lead_runs: std::collections::BTreeSet::new(),
                }));
            }
        };
        let runs = match &config.runs {
            Some(r) => r.clone(),
            None => {
                let count = rng.range(1, crate::setup::RANDOM_RUNS_MAX);
                (0..count)
                    .map(|i| crate::setup::random_run(&mut rng, i))
                    .collect()
            }
        };
        let workers = (0..config.workers)
            .map(|_| Worker {
                up: true,
                ..Worker::default()
            })
            .collect();
        let checker = Checker::new(config.seed, &config, &runs);
        let mut world = Self {
            rng,
            profile_sampled: profile.clone(),
            profile,
            queue: EventQueue::new(QUEUE_LEN_MAX),
            now: 0,
            event_no: 0,
            trace: Trace::new(config.trace),
            faults: FaultCounts::default(),
            net: crate::net::Network::default(),
            store,
            coord: None,
            coord_inc: 0,
            workers,
            submitted: runs.clone(),
            checker,
            sessions_started: 0,
            effects_executed: 0,
            commits: 0,
            healed: false,
            disk_fault_armed: None,
            spawn_cursor: 0,
            stale_spawns_refused: 0,
            coord_effects: Vec::new(),
            spec_effects: Vec::new(),
            config,
        };
        world.coord = Some(world.fresh_coordinator_node());
        for spec in runs {
            world.schedule(0, Ev::Submit(Box::new(spec)));
        }
        if world.profile.fault_tick_ms > 0 && world.has_random_faults() {
            world.schedule(world.profile.fault_tick_ms, Ev::FaultTick);
        }
        for (at, i) in world.config.interventions.clone() {
            world.schedule(at, Ev::Intervene(i));
        }
        world.schedule(world.config.fault_phase_ms, Ev::Heal);
        Ok(world)
    }

    fn has_random_faults(&self) -> bool {
        let p = &self.profile;
        p.partition_ppm > 0 || p.crash_ppm > 0 || p.disk_fault_ppm > 0
    }

    fn fresh_coordinator_node(&self) -> CoordinatorNode {
        let mut sup = self.config.supervisor.clone();
        sup.agents = crate::setup::agents();
        CoordinatorNode {
            coordinators: BTreeMap::new(),
            supervisor: Supervisor::new(sup),
            checkpoint: CheckpointWriter::new(self.config.checkpoint.clone()),
            placement: BTreeMap::new(),
        }
    }

    fn schedule(&mut self, at: SimMillis, ev: Ev) {
        if let Err(e) = self.queue.push(at.max(self.now), ev) {
            self.checker.world_bound(self.event_no, format!("{e}"));
        }
    }

    fn run_to_end(mut self) -> RunReport {
        while let Some((at, ev)) = self.queue.pop() {
            self.now = at;
            self.event_no += 1;
            if self.event_no > self.config.events_max {
                self.checker.world_bound(
                    self.event_no,
                    format!("more than {} events", self.config.events_max),
                );
                break;
            }
            let (n, t) = (self.event_no, self.now);
            self.trace.line(n, t, |s| ev.describe(s));
            self.step(ev);
            if let Some(coord) = &self.coord {
                self.checker.after_event(self.event_no, &coord.supervisor);
            }
            if self.checker.violation().is_some() {
                break;
            }
            // Every run is terminal and durable: liveness holds, and what is left on the agenda (fault
            // ticks, resends to exited specialists) cannot change an outcome.
            if (self.healed || self.config.stop_when_terminal) && self.all_runs_terminal() {
                break;
            }
            if self.now > self.config.fault_phase_ms + self.config.liveness_ms_max {
                break;
            }
        }
        let runs_final = self.runs_final();
        self.checker.at_end(self.event_no, &runs_final, self.healed);
        RunReport {
            seed: self.config.seed,
            events: self.event_no,
            end_ms: self.now,
            trace_hash: self.trace.hash(),
            faults: self.faults,
            violation: self.checker.violation().cloned(),
            profile: self.profile_sampled.clone(),
            trace_lines: self.trace.lines().to_vec(),
            observed: self.checker.into_observed(),
            coord_effects: self.effects_executed,
            runs_final,
            commits: self.commits,
            stale_spawns_refused: self.stale_spawns_refused,
            lead_runs: self
                .submitted
                .iter()
                .filter(|r| matches!(r.mode, keel_actors::RunMode::Lead { .. }))
                .map(|r| r.run)
                .collect(),
        }
    }

    fn runs_final(&self) -> BTreeMap<RunId, (keel_store::RunStatus, Option<String>)> {
        let mut out = BTreeMap::new();
        for spec in &self.submitted {
            if let Ok(run) = self.store.store().run(spec.run).get() {
                out.insert(spec.run, (run.status, run.outcome));
            }
        }
        out
    }

    fn all_runs_terminal(&self) -> bool {
        self.submitted
            .iter()
            .all(|s| self.checker.run_finished(s.run))
            && self.submitted.iter().all(|s| {
                self.store
                    .store()
                    .run(s.run)
                    .get()
                    .is_ok_and(|r| r.status.is_terminal())
            })
    }

    fn step(&mut self, ev: Ev) {
        match ev {
            Ev::Submit(spec) => {
                let run = spec.run;
                if self.coord.is_some() {
                    self.ensure_coordinator(run);
                    self.deliver_coord(run, CoordinatorInput::Msg(CoordinatorMsg::Accept(*spec)));
                }
            }
            Ev::Coord { run, input, inc } => {
                if inc.is_some_and(|i| i != self.coord_inc) || self.coord.is_none() {
                    return;
                }
                self.deliver_coord(run, input);
            }
            Ev::Sup { input, inc } => {
                if inc.is_some_and(|i| i != self.coord_inc) || self.coord.is_none() {
                    return;
                }
                self.deliver_sup(input);
            }
            Ev::Ckpt { input, inc } => {
                if inc != self.coord_inc || self.coord.is_none() {
                    return;
                }
                self.deliver_ckpt(input);
            }
            Ev::Spec {
                node,
                attempt,
                input,
                inc,
            } => {
                let w = &self.workers[usize::from(node.0) - 1];
                if !w.up || inc.is_some_and(|i| i != w.inc) {
                    return;
                }
                self.deliver_spec(node, attempt, input);
            }
            Ev::Spawn { node, start, inc } => self.spawn_arrives(node, *start, inc),
            Ev::ContextRequest {
                node,
                attempt,
                request,
            } => self.context_request(node, attempt, request),
            Ev::HarnessNext {
                node,
                inc,
                attempt,
                session,
            } => self.harness_next(node, inc, attempt, session),
            Ev::FaultTick => self.fault_tick(),
            Ev::Intervene(i) => self.intervene(i),
            Ev::Restart(node) => self.restart(node),
            Ev::Heal => self.heal(),
        }
    }

    // ----- coordinator node -----

    fn ensure_coordinator(&mut self, run: RunId) {
        let config = self.config.coordinator.clone();
        if let Some(node) = &mut self.coord {
            node.coordinators
                .entry(run)
                .or_insert_with(|| Coordinator::new(config));
        }
    }

    fn deliver_coord(&mut self, run: RunId, input: CoordinatorInput) {
        let mut out = std::mem::take(&mut self.coord_effects);
        out.clear();
        {
            let Some(node) = &mut self.coord else { return };
            let Some(coordinator) = node.coordinators.get_mut(&run) else {
                self.coord_effects = out;
                return;
            };
            self.checker.coordinator_input(self.event_no, run, &input);
            coordinator.handle(input, self.now, &mut self.rng, &mut out);
        }
        for effect in out.drain(..) {
            self.coord_effect(Some(run), effect);
        }
        self.coord_effects = out;
    }

    fn deliver_sup(&mut self, input: SupervisorInput) {
        let mut out = Vec::new();
        {
            let Some(node) = &mut self.coord else { return };
            node.supervisor
                .handle(input, self.now, &mut self.rng, &mut out);
        }
        for effect in out {
            self.coord_effect(None, effect);
        }
    }

    fn deliver_ckpt(&mut self, input: CheckpointInput) {
        let mut out = Vec::new();
        {
            let Some(node) = &mut self.coord else { return };
            node.checkpoint
                .handle(input, self.now, &mut self.rng, &mut out);
        }
        for effect in out {
            self.coord_effect(None, effect);
        }
    }

    /// Executes one effect of a coordinator-node machine. `from_run` names the coordinator that
    /// emitted it (`None` for the supervisor and the checkpoint writer).
    fn coord_effect(&mut self, from_run: Option<RunId>, effect: Effect) {
        if self.coord.is_none() {
            // The node crashed in the middle of this effect list (a scripted crash at a boundary).
            return;
        }
        self.effects_executed += 1;
        let sup = self.coord.as_ref().map(|c| &c.supervisor);
        self.checker
            .coord_effect(self.event_no, self.now, from_run, &effect, sup);
        let inc = Some(self.coord_inc);
        match effect {
            Effect::Send(envelope) => match envelope {
                Envelope::Coordinator { run, msg } => self.schedule(
                    self.now,
                    Ev::Coord {
                        run,
                        input: CoordinatorInput::Msg(msg),
                        inc,
                    },
                ),
                Envelope::Supervisor(msg) => self.schedule(
                    self.now,
                    Ev::Sup {
                        input: SupervisorInput::Msg(msg),
                        inc,
                    },
                ),
                Envelope::Checkpoint(msg) => self.schedule(
                    self.now,
                    Ev::Ckpt {
                        input: CheckpointInput::Msg(msg),
                        inc: self.coord_inc,
                    },
                ),
                Envelope::Specialist { attempt, msg } => self.send_to_specialist(attempt, msg),
            },
            Effect::Persist(batch) => {
                let input = match self.commit(&batch) {
                    Ok(()) => CheckpointInput::Committed(batch.id),
                    Err(error) => CheckpointInput::CommitFailed {
                        id: batch.id,
                        error,
                    },
                };
                let at = self.now + self.rng.range(1, 3);
                self.schedule(
                    at,
                    Ev::Ckpt {
                        input,
                        inc: self.coord_inc,
                    },
                );
            }
            Effect::SpawnSpecialist(start) => {
                let node = self.pick_worker();
                if let Some(c) = &mut self.coord {
                    c.placement.insert(start.attempt, node);
                }
                // The coordinator node addresses the worker's current incarnation (a cluster node
                // event tells it of a crash at once).
                let inc = self.workers[usize::from(node.0) - 1].inc;
                if let Some((first, second)) = self.route(NodeId::COORDINATOR, node) {
                    self.schedule(
                        first,
                        Ev::Spawn {
                            node,
                            start: Box::new(start.clone()),
                            inc,
                        },
                    );
                    if let Some(second) = second {
                        self.schedule(
                            second,
                            Ev::Spawn {
                                node,
                                start: Box::new(start),
                                inc,
                            },
                        );
                    }
                }
            }
            Effect::StopSpecialist { attempt, reason } => {
                self.send_to_specialist(attempt, SpecialistMsg::Cancel { reason });
            }
            Effect::SetTimer { key, at } => match key {
                TimerKey::Coordinator(run, t) => self.schedule(
                    at,
                    Ev::Coord {
                        run,
                        input: CoordinatorInput::Timer(t),
                        inc,
                    },
                ),
                TimerKey::Supervisor(t) => self.schedule(
                    at,
                    Ev::Sup {
                        input: SupervisorInput::Timer(t),
                        inc,
                    },
                ),
                TimerKey::Checkpoint(t) => self.schedule(
                    at,
                    Ev::Ckpt {
                        input: CheckpointInput::Timer(t),
                        inc: self.coord_inc,
                    },
                ),
            },
            Effect::Emit(_) => {}
        }
        if self.config.crash_after_coord_effect == Some(self.effects_executed) {
            self.crash(NodeId::COORDINATOR, self.config.restart_after_ms);
        }
    }

    fn commit(&mut self, batch: &keel_actors::CommitBatch) -> Result<(), String> {
        self.commits += 1;
        let fault = self.disk_fault_armed.take();
        match fault {
            Some(DiskFault::FailedSync) => self.store.disk().fail_next_syncs(1),
            Some(DiskFault::Full) => self.store.disk().set_write_budget(Some(0)),
            None => {}
        }
        let syncs = self.store.disk().syncs();
        let outcome = host::store::commit(self.store.store(), batch);
        if fault == Some(DiskFault::Full) {
            let disk_full = matches!(
                outcome,
                Err(HostError::Commit(keel_store::CommitError::DiskFull(_)))
            );
            let synced = self.store.disk().syncs() != syncs;
            self.checker
                .full_disk_commit(self.event_no, disk_full, synced);
            // Space is free again: the retry of the checkpoint writer may succeed.
            self.store.disk().set_write_budget(None);
        }
        match outcome {
            Ok(()) => Ok(()),
            Err(e) => {
                self.checker.commit_failed(self.event_no, &e);
                // redb asks for a reopen after a failed commit; the durable image is what it reopens.
                if let Err(reopen) = self.store.crash_and_reopen() {
                    self.checker
                        .world_bound(self.event_no, format!("the store did not reopen: {reopen}"));
                }
                Err(e.to_string())
            }
        }
    }

    fn pick_worker(&mut self) -> NodeId {
        // Round robin, skipping workers the host knows are down; the host learns of a crash at once
        // (a cluster node event), but a spawn may still race one.
        let n = self.workers.len();
        for _ in 0..n {
            self.spawn_cursor = (self.spawn_cursor + 1) % n;
            if self.workers[self.spawn_cursor].up {
                break;
            }
        }
        NodeId(u8::try_from(self.spawn_cursor + 1).unwrap_or(1))
    }

    fn send_to_specialist(&mut self, attempt: AttemptId, msg: SpecialistMsg) {
        let Some(node) = self
            .coord
            .as_ref()
            .and_then(|c| c.placement.get(&attempt).copied())
        else {
            return;
        };
        if let Some((first, second)) = self.route(NodeId::COORDINATOR, node) {
            let input = SpecialistInput::Msg(msg);
            if let Some(second) = second {
                self.schedule(
                    second,
                    Ev::Spec {
                        node,
                        attempt,
                        input: input.clone(),
                        inc: None,
                    },
                );
            }
            self.schedule(
                first,
                Ev::Spec {
                    node,
                    attempt,
                    input,
                    inc: None,
                },
            );
        }
    }

    /// The network's decision for one message, with faults counted. `None`: lost.
    fn route(&mut self, from: NodeId, to: NodeId) -> Option<(SimMillis, Option<SimMillis>)> {
        match self
            .net
            .route(&mut self.rng, &self.profile, from, to, self.now)
        {
            Route::Lost(kind) => {
                if kind == FaultKind::MessageDropped {
                    self.faults.add(kind);
                }
                None
            }
            Route::Once(at) => Some((at, None)),
            Route::Twice(a, b) => {
                self.faults.add(FaultKind::MessageDuplicated);
                Some((a, Some(b)))
            }
        }
    }

    fn context_request(
        &mut self,
        node: NodeId,
        attempt: AttemptId,
        request: keel_actors::ContextRequest,
    ) {
        if self.coord.is_none() {
            return;
        }
        let rows = host::store::load_context(
            self.store.store(),
            attempt.run,
            &request,
            &self.config.specialist.context,
        );
        if let Some((first, second)) = self.route(NodeId::COORDINATOR, node) {
            let input = SpecialistInput::ContextLoaded(rows);
            if let Some(second) = second {
                self.schedule(
                    second,
                    Ev::Spec {
                        node,
                        attempt,
                        input: input.clone(),
                        inc: None,
                    },
                );
            }
            self.schedule(
                first,
                Ev::Spec {
                    node,
                    attempt,
                    input,
                    inc: None,
                },
            );
        }
    }

    // ----- workers -----

    fn spawn_arrives(&mut self, node: NodeId, start: SpecialistStart, inc: u32) {
        let w = &mut self.workers[usize::from(node.0) - 1];
        if w.up && inc != w.inc {
            // Addressed to an earlier incarnation of this worker: a late copy of a spawn the worker
            // may have hosted before it crashed (its memory of that is gone, the session may have
            // run). Refused: the supervisor's deadline or down-detection already took the attempt
            // over, and the coordinator runs the step again as a new attempt with a new key.
            self.stale_spawns_refused += 1;
            return;
        }
        if !w.up
            || w.hosted_ever.contains(&start.attempt)
            || w.hosted_ever.len() >= HOSTED_REMEMBERED_MAX
        {
            // A duplicate spawn message is ignored: one attempt, one specialist.
            return;
        }
        w.hosted_ever.insert(start.attempt);
        let attempt = start.attempt;
        self.checker.spawned(self.event_no, &start);
        let machine = Specialist::new(start, self.config.specialist.clone());
        w.specialists.insert(
            attempt,
            Hosted {
                machine,
                session: None,
                context_pending: false,
            },
        );
        let inc = w.inc;
        self.schedule(
            self.now,
            Ev::Spec {
                node,
                attempt,
                input: SpecialistInput::Begin,
                inc: Some(inc),
            },
        );
    }

    fn deliver_spec(&mut self, node: NodeId, attempt: AttemptId, input: SpecialistInput) {
        let mut out = std::mem::take(&mut self.spec_effects);
        out.clear();
        {
            let w = &mut self.workers[usize::from(node.0) - 1];
            let Some(hosted) = w.specialists.get_mut(&attempt) else {
                self.spec_effects = out;
                return;
            };
            if matches!(input, SpecialistInput::ContextLoaded(_)) {
                if !hosted.context_pending {
                    // A duplicate or late answer: the first one won.
                    self.spec_effects = out;
                    return;
                }
                hosted.context_pending = false;
            }
            hosted
                .machine
                .handle(input, self.now, &mut self.rng, &mut out);
        }
        for effect in out.drain(..) {
            self.spec_effect(node, attempt, effect);
        }
        self.spec_effects = out;
    }

    fn spec_effect(&mut self, node: NodeId, attempt: AttemptId, effect: SpecialistEffect) {
        self.checker
            .spec_effect(self.event_no, self.now, attempt, &effect);
        let inc = self.workers[usize::from(node.0) - 1].inc;
        match effect {
            SpecialistEffect::LoadContext(request) => {
                if let Some(h) = self.workers[usize::from(node.0) - 1]
                    .specialists
                    .get_mut(&attempt)
                {
                    h.context_pending = true;
                }
                if let Some((first, _)) = self.route(node, NodeId::COORDINATOR) {
                    self.schedule(
                        first,
                        Ev::ContextRequest {
                            node,
                            attempt,
                            request,
                        },
                    );
                }
                // Nothing may wait forever: if the answer is lost, the load fails after a bound.
                let at = self.now + self.config.context_timeout_ms;
                self.schedule(
                    at,
                    Ev::Spec {
                        node,
                        attempt,
                        input: SpecialistInput::ContextLoaded(Err(
                            "context rows unreachable (timed out)".into(),
                        )),
                        inc: Some(inc),
                    },
                );
            }
            SpecialistEffect::StartHarness { key: _, spec } => {
                let behaviour = self.pick_behaviour(attempt);
                self.checker.session_behaviour(attempt, behaviour);
                if let Some(kind) = FaultKind::of_harness(behaviour) {
                    self.faults.add(kind);
                }
                self.sessions_started += 1;
                let session = self.sessions_started;
                let step = self.checker.step_of(attempt).unwrap_or_default();
                let native = format!("native-{:016x}", self.rng.next_u64());
                let lead = step == keel_actors::coordinator::LEAD_STEP_KEY
                    && matches!(
                        behaviour,
                        HarnessBehaviour::Success | HarnessBehaviour::ToolRoundTrip
                    );
                let (events, after_answers) = if lead {
                    // A working lead delegates one or two turns of 1 to 4 calls, then reports.
                    let turns: Vec<u32> = (0..self.rng.range(1, LEAD_TURNS_MAX))
                        .map(|_| u32::try_from(self.rng.range(1, LEAD_CALLS_MAX)).unwrap_or(1))
                        .collect();
                    let mut segments: VecDeque<_> =
                        harness::lead_script(attempt.task, native, &turns).into();
                    let first = segments.pop_front().unwrap_or_default();
                    (first, segments)
                } else {
                    (
                        harness::script(behaviour, &step, attempt.task, native, self.now),
                        VecDeque::new(),
                    )
                };
                let _ = spec;
                if let Some(h) = self.workers[usize::from(node.0) - 1]
                    .specialists
                    .get_mut(&attempt)
                {
                    h.session = Some(Session {
                        id: session,
                        events: events.into(),
                        after_answers,
                        answered: 0,
                    });
                }
                self.next_harness_event(node, inc, attempt, session);
            }
            SpecialistEffect::AnswerDelegation { turn, results } => {
                // The host answers the session's pending `delegate` tool call with the turn's
                // outcomes and the session goes on; an answer to a turn the session is not waiting on
                // (it was cancelled, or its worker restarted) is dropped.
                let resumed = self.workers[usize::from(node.0) - 1]
                    .specialists
                    .get_mut(&attempt)
                    .and_then(|h| h.session.as_mut())
                    .and_then(|s| {
                        if !s.events.is_empty() || turn != s.answered + 1 {
                            return None;
                        }
                        let next = s.after_answers.pop_front()?;
                        s.answered = turn;
                        s.events
                            .push_back((5, harness::delegation_answer(turn, &results)));
                        s.events.extend(next);
                        Some(s.id)
                    });
                if let Some(session) = resumed {
                    self.next_harness_event(node, inc, attempt, session);
                }
            }
            SpecialistEffect::CancelHarness => {
                if let Some(h) = self.workers[usize::from(node.0) - 1]
                    .specialists
                    .get_mut(&attempt)
                    && let Some(session) = h.session.take()
                {
                    let _ = session;
                    self.schedule(
                        self.now + 1,
                        Ev::Spec {
                            node,
                            attempt,
                            input: SpecialistInput::Harness(HarnessEvent::Failed(
                                HarnessError::cancelled(),
                            )),
                            inc: Some(inc),
                        },
                    );
                }
            }
            SpecialistEffect::Reply(to, reply) => {
                let run = to.run();
                let from = to.attempt();
                if let Some((first, second)) = self.route(node, NodeId::COORDINATOR) {
                    let input = CoordinatorInput::Msg(CoordinatorMsg::Specialist { from, reply });
                    if let Some(second) = second {
                        self.schedule(
                            second,
                            Ev::Coord {
                                run,
                                input: input.clone(),
                                inc: None,
                            },
                        );
                    }
                    self.schedule(
                        first,
                        Ev::Coord {
                            run,
                            input,
                            inc: None,
                        },
                    );
                }
            }
            SpecialistEffect::SetTimer { timer, at } => {
                self.schedule(
                    at,
                    Ev::Spec {
                        node,
                        attempt,
                        input: SpecialistInput::Timer(timer),
                        inc: Some(inc),
                    },
                );
            }
            SpecialistEffect::Emit(_) => {}
            SpecialistEffect::Exit => {
                self.workers[usize::from(node.0) - 1]
                    .specialists
                    .remove(&attempt);
            }
        }
    }

    fn pick_behaviour(&mut self, attempt: AttemptId) -> HarnessBehaviour {
        if let Some(step) = self.checker.step_of(attempt) {
            let ordinal = self.checker.sessions_of_step(&step);
            if let Some(b) = self.config.harness_script.get(&(step, ordinal)) {
                return *b;
            }
        }
        let i = self.rng.weighted(&self.profile.harness_weights);
        HarnessBehaviour::ALL[i]
    }

    fn next_harness_event(&mut self, node: NodeId, inc: u32, attempt: AttemptId, session: u64) {
        let delay = self.workers[usize::from(node.0) - 1]
            .specialists
            .get(&attempt)
            .and_then(|h| h.session.as_ref())
            .filter(|s| s.id == session)
            .and_then(|s| s.events.front().map(|(d, _)| *d));
        if let Some(delay) = delay {
            self.schedule(
                self.now + delay,
                Ev::HarnessNext {
                    node,
                    inc,
                    attempt,
                    session,
                },
            );
        }
    }

    fn harness_next(&mut self, node: NodeId, inc: u32, attempt: AttemptId, session: u64) {
        let w = &mut self.workers[usize::from(node.0) - 1];
        if !w.up || w.inc != inc {
            return;
        }
        let Some(h) = w.specialists.get_mut(&attempt) else {
            return;
        };
        let Some(s) = h.session.as_mut().filter(|s| s.id == session) else {
            return;
        };
        let Some((_, event)) = s.events.pop_front() else {
            return;
        };
        if s.events.is_empty() && s.after_answers.is_empty() {
            h.session = None;
        }
        self.deliver_spec(node, attempt, SpecialistInput::Harness(event));
        self.next_harness_event(node, inc, attempt, session);
    }

    // ----- faults -----

    fn fault_tick(&mut self) {
        if self.healed {
            return;
        }
        let p = self.profile.clone();
        let nodes = self.workers.len() + 1;
        if self.rng.chance(p.partition_ppm) {
            let a = NodeId(u8::try_from(self.rng.index(nodes)).unwrap_or(0));
            let b = NodeId(u8::try_from(self.rng.index(nodes)).unwrap_or(0));
            if a != b {
                let one_way = self.rng.chance(p.partition_one_way_ppm);
                let until = self.now + self.rng.range(1, p.partition_ms_max);
                self.net.cut(a, b, one_way, until);
                self.faults.add(if one_way {
                    FaultKind::PartitionOneWay
                } else {
                    FaultKind::Partition
                });
            }
        }
        if self.rng.chance(p.crash_ppm) {
            let node = NodeId(u8::try_from(self.rng.index(nodes)).unwrap_or(0));
            let down_ms = self.rng.range(1, p.restart_ms_max.max(1));
            self.crash(node, down_ms);
        }
        if self.rng.chance(p.disk_fault_ppm) {
            // Half the disk faults are failed syncs, half a full disk on the next commit.
            let fault = if self.rng.chance(500_000) {
                DiskFault::Full
            } else {
                DiskFault::FailedSync
            };
            self.arm_disk_fault(fault);
        }
        self.schedule(self.now + p.fault_tick_ms, Ev::FaultTick);
    }

    fn arm_disk_fault(&mut self, fault: DiskFault) {
        self.disk_fault_armed = Some(fault);
        self.faults.add(match fault {
            DiskFault::FailedSync => FaultKind::DiskFault,
            DiskFault::Full => FaultKind::DiskFull,
        });
    }

    fn intervene(&mut self, i: Intervention) {
        match i {
            Intervention::Disk(fault) => self.arm_disk_fault(fault),
            Intervention::Partition {
                a,
                b,
                one_way,
                until_ms,
            } => {
                self.net.cut(a, b, one_way, until_ms);
                self.faults.add(if one_way {
                    FaultKind::PartitionOneWay
                } else {
                    FaultKind::Partition
                });
            }
            Intervention::Crash { node, down_ms } => self.crash(node, down_ms),
            Intervention::FollowUp {
                run,
                step,
                brief,
                agent,
            } => {
                // The thread starts at the first task the step was dispatched as.
                let parent = self
                    .checker
                    .observed()
                    .spawns
                    .iter()
                    .find(|(a, s)| a.run == run && s.step == step)
                    .map(|(a, _)| a.task);
                match parent {
                    Some(parent) => self.deliver_coord(
                        run,
                        CoordinatorInput::Msg(CoordinatorMsg::FollowUp {
                            parent,
                            brief,
                            agent,
                            task: None,
                        }),
                    ),
                    None => self.checker.world_bound(
                        self.event_no,
                        format!("no task of step {step} to follow up"),
                    ),
                }
            }
        }
    }

    fn crash(&mut self, node: NodeId, down_ms: u64) {
        if node == NodeId::COORDINATOR {
            let Some(c) = self.coord.take() else { return };
            self.faults.add(FaultKind::NodeCrash);
            drop(c);
            self.coord_inc += 1;
            self.checker.coordinator_crashed();
            if let Err(e) = self.store.crash_and_reopen() {
                self.checker.world_bound(
                    self.event_no,
                    format!("the store did not reopen after a crash: {e}"),
                );
            }
        } else {
            let w = &mut self.workers[usize::from(node.0) - 1];
            if !w.up {
                return;
            }
            self.faults.add(FaultKind::NodeCrash);
            w.up = false;
            w.inc += 1;
            w.hosted_ever.clear();
            let lost: Vec<AttemptId> = std::mem::take(&mut w.specialists).into_keys().collect();
            // The coordinator node sees the worker's session drop (a cluster node event) and reports
            // each of its specialists down to the supervisor.
            if self.coord.is_some() {
                let at = self.now + self.config.down_detect_ms;
                for attempt in lost {
                    let placed_here = self
                        .coord
                        .as_ref()
                        .is_some_and(|c| c.placement.get(&attempt) == Some(&node));
                    if placed_here {
                        let msg = SupervisorMsg::SpecialistDown {
                            attempt,
                            reason: format!("worker {node} went down"),
                        };
                        self.schedule(
                            at,
                            Ev::Sup {
                                input: SupervisorInput::Msg(msg),
                                inc: Some(self.coord_inc),
                            },
                        );
                    }
                }
            }
        }
        self.schedule(self.now + down_ms, Ev::Restart(node));
    }

    fn restart(&mut self, node: NodeId) {
        if node == NodeId::COORDINATOR {
            if self.coord.is_some() {
                return;
            }
            self.coord = Some(self.fresh_coordinator_node());
            let recovered = match host::store::recover_open_runs(self.store.store()) {
                Ok(r) => r,
                Err(e) => {
                    self.checker.world_bound(
                        self.event_no,
                        format!("recovery could not read the store: {e}"),
                    );
                    return;
                }
            };
            let known: Vec<RunId> = recovered.iter().map(|r| r.run.id).collect();
            for r in recovered {
                let run = r.run.id;
                self.ensure_coordinator(run);
                self.deliver_coord(run, CoordinatorInput::Recovered(Box::new(r)));
            }
            // A run whose row never became durable was never acknowledged: its submitter submits it
            // again (Accept is idempotent).
            for spec in self.submitted.clone() {
                let durable = self.store.store().run(spec.run).get().is_ok();
                if !durable && !known.contains(&spec.run) {
                    self.schedule(self.now, Ev::Submit(Box::new(spec)));
                }
            }
        } else {
            let w = &mut self.workers[usize::from(node.0) - 1];
            w.up = true;
        }
    }

    fn heal(&mut self) {
        self.healed = true;
        self.profile = self.profile.healed();
        self.net.heal_all();
        self.disk_fault_armed = None;
        if self.coord.is_none() {
            self.restart(NodeId::COORDINATOR);
        }
        for i in 0..self.workers.len() {
            if !self.workers[i].up {
                self.restart(NodeId(u8::try_from(i + 1).unwrap_or(1)));
            }
        }
    }
}
