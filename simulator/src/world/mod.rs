//! The world: nodes, machines, network, disk and harness sessions, driven one event at a time from a
//! single agenda and a single seeded stream.
//!
//! Topology (docs/DESIGN.md §1, §10): node 0 is the coordinator node and owns the store (a real keel-store
//! on a [`keel_store::SimDisk`]) plus the coordinator of every run, the supervisor and the checkpoint
//! writer; nodes 1.. are stateless workers that host specialists and their harness sessions. Messages
//! between machines on the coordinator node are local (FIFO, never dropped while the node is up);
//! messages to and from workers cross the simulated network.
//!
//! Every effect a machine emits is executed here, and every one passes the [`crate::check::Checker`]
//! first, so an invariant is checked at the moment it could break.

mod cluster;
mod coordinator_node;
mod event;
mod faults;
mod frames;
mod hooks;
mod intervention;
mod mutate;
mod operator;
mod session_tools;
mod worker;

use std::collections::BTreeMap;

use keel_actors::{CoordinatorInput, CoordinatorMsg, Effect, Entropy, RunSpec, SpecialistEffect};
use keel_store::RunId;

use crate::check::Checker;
use crate::config::{Intervention, WorldConfig};
use crate::net::{NodeId, Route};
use crate::profile::{FaultCounts, FaultKind, FaultProfile};
use crate::queue::{EventQueue, SimMillis};
use crate::rng::SimRng;
use crate::sim_store::SimStore;
use crate::trace::Trace;
use crate::violation::{Invariant, Violation};

pub use cluster::ClusterCounts;
use coordinator_node::CoordinatorNode;
use event::Ev;
pub use frames::FrameCounts;
use worker::Worker;
pub use worker::{HOSTED_REMEMBERED_MAX, LEAD_CALLS_MAX, LEAD_TURNS_MAX};

impl Entropy for SimRng {
    fn next_u64(&mut self) -> u64 {
        SimRng::next_u64(self)
    }
}

/// Mixed into the seed for the stream that draws operator interventions.
pub const OPERATOR_STREAM: u64 = 0x6f70_6572_6174_6f72;
/// How long after the fault phase a drawn operator intervention may come (late ones find the runs
/// ended: a follow-up then reopens).
pub const OPERATOR_LATE_MS: u64 = 60_000;
/// Longest pause a seed draws.
pub const OPERATOR_PAUSE_MS_MAX: u64 = 5_000;

/// Most events one agenda holds at once.
pub const QUEUE_LEN_MAX: usize = 200_000;

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
    /// What crossed the network as frames of the wire protocol.
    pub frames: FrameCounts,
    /// What the cluster's membership did (heartbeats, leases, placements).
    pub cluster: ClusterCounts,
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
    /// What the cluster's membership did.
    cluster: ClusterCounts,
    stale_spawns_refused: u64,
    coord_effects: Vec<Effect>,
    /// What the coordinator-node machine's step being executed sent to machines that get one
    /// step's messages as one input, as the runtime delivers them (`coordinator_node.rs`).
    outbox: coordinator_node::Outbox,
    spec_effects: Vec<SpecialistEffect>,
    /// Host stages so far (the operator's marks, the asks' rows, the gated calls' audit rows): the
    /// next host ticket.
    host_stages: u64,
    /// Drawn operator interventions still on the agenda.
    operator_pending: u32,
    /// Follow-ups handed to a coordinator whose id is announced once they are durable.
    announcing: Vec<operator::Announcing>,
    /// The nodes' names on the wire and what crossed it.
    wire: frames::Wire,
    /// The policy gating the sessions' tools (issue 13), for the seeds that draw one.
    policy: Option<keel_policy::Policy>,
    /// Per run, the newest audit sequence number the world has read.
    audit_seen: BTreeMap<RunId, u64>,
    /// Gated calls waiting for the checkpoint writer's answer to their audit rows, by host ticket.
    gates: BTreeMap<u64, hooks::PendingGate>,
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

/// Mixed into the seed for the stream that decides whether a seed's tools are gated by a policy.
const POLICY_STREAM: u64 = 0x706f_6c69_6379_0012;

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
                    frames: FrameCounts::default(),
                    cluster: ClusterCounts::default(),
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
            cluster: ClusterCounts::default(),
            stale_spawns_refused: 0,
            coord_effects: Vec::new(),
            outbox: coordinator_node::Outbox::default(),
            spec_effects: Vec::new(),
            host_stages: 0,
            operator_pending: 0,
            announcing: Vec::new(),
            wire: frames::Wire::new(config.workers.into()).unwrap_or_default(),
            policy: None,
            audit_seen: BTreeMap::new(),
            gates: BTreeMap::new(),
            config,
        };
        // From a stream of its own, so a seed that draws no policy runs exactly as before.
        if SimRng::new(world.config.seed ^ POLICY_STREAM).chance(world.config.hooks_ppm) {
            world.policy = hooks::sim_policy().ok();
        }
        world.coord = Some(world.fresh_coordinator_node());
        for i in 1..=world.config.workers {
            world.schedule(
                0,
                Ev::Heartbeat {
                    node: NodeId(i),
                    inc: 0,
                },
            );
        }
        let submit_at =
            if world.config.mutation == Some(crate::mutation::Mutation::LeakProcessState) {
                crate::mutation::leaked_world_count()
            } else {
                0
            };
        for spec in runs {
            world.schedule(submit_at, Ev::Submit(Box::new(spec)));
        }
        if world.profile.fault_tick_ms > 0 && world.has_random_faults() {
            world.schedule(world.profile.fault_tick_ms, Ev::FaultTick);
        }
        for (at, i) in world.config.interventions.clone() {
            world.schedule(at, Ev::Intervene(Box::new(i)));
        }
        world.draw_operator();
        world.schedule(world.config.fault_phase_ms, Ev::Heal);
        Ok(world)
    }

    /// Draws at most one operator intervention for this seed, from a stream of its own (so a seed that
    /// draws none runs exactly as before): a pause, a cancel of the run or of one of its steps, a
    /// follow-up that joins or reopens (and one followed by a crash once its id is announced), a
    /// series of pauses that outnumbers a step's retries, or a cancel followed by a follow-up (late
    /// ones find the run ended: the cancel must change nothing).
    fn draw_operator(&mut self) {
        let mut draw = SimRng::new(self.config.seed ^ OPERATOR_STREAM);
        if self.submitted.is_empty() || !draw.chance(self.config.operator_ppm) {
            return;
        }
        let at = draw.range(1_000, self.config.fault_phase_ms + OPERATOR_LATE_MS);
        let spec = &self.submitted[draw.index(self.submitted.len())];
        let run = spec.run;
        let step = match &spec.mode {
            keel_actors::RunMode::Plan(plan) if !plan.steps.is_empty() => {
                Some(plan.steps[draw.index(plan.steps.len())].key.clone())
            }
            _ => None,
        };
        let follow_up = || Intervention::FollowUp {
            run,
            step: None,
            brief: "Follow-up: check the result once more.".into(),
            agent: None,
        };
        let cancel = || Intervention::Cancel {
            run,
            reason: "the operator cancelled it".into(),
        };
        let mut drawn = Vec::new();
        match draw.index(7) {
            0 => drawn.push((
                at,
                Intervention::Pause {
                    down_ms: draw.range(1, OPERATOR_PAUSE_MS_MAX),
                },
            )),
            1 => drawn.push((at, cancel())),
            2 => drawn.push((at, follow_up())),
            3 => drawn.push((
                // Early, while the run's steps are still open.
                draw.range(100, OPERATOR_PAUSE_MS_MAX),
                match step {
                    Some(step) => Intervention::CancelTask {
                        run,
                        step,
                        reason: "the operator cancelled this step".into(),
                    },
                    None => cancel(),
                },
            )),
            4 => {
                // More pauses than a step has retries, close enough together to catch one step.
                let gap_ms = draw.range(200, OPERATOR_PAUSE_MS_MAX);
                let pauses = self
                    .config
                    .coordinator
                    .attempts_per_step_max
                    .saturating_add(1);
                for i in 0..u64::from(pauses) {
                    let down_ms = draw.range(1, OPERATOR_PAUSE_MS_MAX / 4);
                    drawn.push((at + i * gap_ms, Intervention::Pause { down_ms }));
                }
            }
            5 => drawn.push((
                at,
                Intervention::CrashAfterFollowUp {
                    run,
                    step: None,
                    brief: "Follow-up: check the result once more.".into(),
                    down_ms: draw.range(1, OPERATOR_PAUSE_MS_MAX),
                },
            )),
            _ => {
                drawn.push((at, cancel()));
                drawn.push((at + draw.range(1, OPERATOR_PAUSE_MS_MAX), follow_up()));
            }
        }
        for (at, intervention) in drawn {
            self.operator_pending += 1;
            self.schedule(at, Ev::Operator(Box::new(intervention)));
        }
    }

    fn has_random_faults(&self) -> bool {
        let p = &self.profile;
        p.partition_ppm > 0 || p.crash_ppm > 0 || p.disk_fault_ppm > 0
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
            self.announce_durable_follow_ups();
            if let Some(coord) = &self.coord {
                self.checker
                    .after_event(self.event_no, self.now, &coord.supervisor);
            }
            if self.checker.violation().is_some() {
                break;
            }
            // Every run is terminal and durable: liveness holds, and what is left on the agenda (fault
            // ticks, resends to exited specialists) cannot change an outcome.
            if (self.healed || self.config.stop_when_terminal)
                && self.operator_pending == 0
                && self.all_runs_terminal()
            {
                break;
            }
            if self.now > self.config.fault_phase_ms + self.config.liveness_ms_max {
                break;
            }
        }
        let runs_final = self.runs_final();
        let open_tasks = self.open_tasks(&runs_final);
        let lost = self.announced_follow_ups_lost();
        self.checker.announced_follow_ups_kept(self.event_no, &lost);
        self.checker
            .at_end(self.event_no, &runs_final, &open_tasks, self.healed);
        self.check_reported_findings();
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
            frames: self.wire.counts(),
            cluster: self.cluster,
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

    /// The durable tasks that are not terminal, of every run that is (task liveness, invariant 1).
    fn open_tasks(
        &mut self,
        runs_final: &BTreeMap<RunId, (keel_store::RunStatus, Option<String>)>,
    ) -> BTreeMap<
        RunId,
        Vec<(
            keel_store::TaskId,
            keel_store::TaskStatus,
            keel_store::TaskKind,
        )>,
    > {
        let mut out = BTreeMap::new();
        for (run, (status, _)) in runs_final {
            if !status.is_terminal() {
                continue;
            }
            let scope = self.store.store().run(*run);
            match keel_actors::host::store::all_tasks(&scope) {
                Ok(tasks) => {
                    let open: Vec<_> = tasks
                        .into_iter()
                        .filter(|t| !t.status.is_terminal())
                        .map(|t| (t.id, t.status, t.kind))
                        .collect();
                    if !open.is_empty() {
                        out.insert(*run, open);
                    }
                }
                Err(e) => self.checker.world_bound(
                    self.event_no,
                    format!("the tasks of run {run} could not be read at the end: {e}"),
                ),
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
                self.deliver_coord(run, *input);
            }
            Ev::Sup { input, inc } => {
                if inc.is_some_and(|i| i != self.coord_inc) || self.coord.is_none() {
                    return;
                }
                self.deliver_sup(*input);
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
                self.deliver_spec(node, attempt, *input);
            }
            Ev::Frame { to, bytes, .. } => self.frame_arrives(to, &bytes),
            Ev::HumanAnswers { run, tries } => self.human_answers(run, tries),
            Ev::ToolTimeout {
                node,
                inc,
                attempt,
                session,
                call_id,
            } => self.tool_wait_over(node, inc, attempt, session, &call_id),
            Ev::HarnessNext {
                node,
                inc,
                attempt,
                session,
            } => self.harness_next(node, inc, attempt, session),
            Ev::Heartbeat { node, inc } => self.heartbeat(node, inc),
            Ev::MembershipTick { inc } => self.membership_tick(inc),
            Ev::FaultTick => self.fault_tick(),
            Ev::Intervene(i) => self.intervene(*i),
            Ev::Operator(i) => {
                self.operator_pending = self.operator_pending.saturating_sub(1);
                self.intervene(*i);
            }
            Ev::AuditWait { ticket } => self.gate_wait_over(ticket),
            Ev::Restart(node) => self.restart(node),
            Ev::Heal => self.heal(),
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
}
