//! How a world is set up: the seed, the topology, the machines' configurations, and (for the named
//! scenarios) the faults and harness behaviours to script instead of sampling.

use std::collections::BTreeMap;

use keel_protocol::MembershipConfig;

use keel_actors::{
    CheckpointConfig, CoordinatorConfig, RunSpec, SpecialistConfig, SupervisorConfig,
};

use crate::mutation::Mutation;
use crate::net::NodeId;
use crate::profile::{FaultProfile, HarnessBehaviour};
use crate::queue::SimMillis;
use crate::trace::TraceMode;

/// A disk fault armed for the next store commit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskFault {
    /// The commit's sync fails (an IO error): nothing of it becomes durable.
    FailedSync,
    /// The disk is full: the commit's first write fails with `StorageFull`, and space is free again
    /// after it (an operator or a cleanup freed some), so a retry can succeed.
    Full,
}

/// A fault placed by a scenario at a fixed time.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Intervention {
    /// Cut the link `a -> b` (and `b -> a` unless one-way) until `until_ms`.
    Partition {
        /// One end.
        a: NodeId,
        /// The other end.
        b: NodeId,
        /// Only `a -> b`.
        one_way: bool,
        /// When it heals.
        until_ms: SimMillis,
    },
    /// A user's follow-up message on the thread a plan step started, routed by
    /// `keel_actors::host::decide::follow_up`: joined to the run's coordinator
    /// (`CoordinatorMsg::FollowUp`) while it runs here, or reopening the run when it has ended
    /// (`CoordinatorInput::Reopened` to a fresh coordinator). The parent is the step's first task.
    FollowUp {
        /// The run.
        run: keel_store::RunId,
        /// The plan step whose task starts the thread; `None`: the run's first spawned task (and
        /// nothing happens if none was spawned yet).
        step: Option<String>,
        /// The message.
        brief: String,
        /// The agent to ask for.
        agent: Option<String>,
    },
    /// Crash a node for `down_ms`.
    Crash {
        /// The node.
        node: NodeId,
        /// How long it stays down.
        down_ms: u64,
    },
    /// Arm a disk fault for the next store commit.
    Disk(DiskFault),
    /// A graceful shutdown (SIGTERM) of the coordinator node: its specialists are cancelled, every
    /// run it hosts is marked paused (`host::decide::pause`), the node stops, and after `down_ms` it
    /// starts again and resumes the paused runs (`host::decide::resume`, then recovery).
    Pause {
        /// How long the node stays down before the resume.
        down_ms: u64,
    },
    /// An operator cancels a run (`keel cancel`): a hosted run gets `CoordinatorMsg::Cancel`; a run
    /// no coordinator has is cancelled in the store (`host::decide::cancel_stored`). A cancel of a
    /// run that has ended is refused and changes nothing (issue 17: a stale cancel request).
    Cancel {
        /// The run.
        run: keel_store::RunId,
        /// Why.
        reason: String,
    },
    /// An operator cancels one task's step (`keel cancel TASK`, most often a follow-up): a hosted
    /// run's coordinator gets `CoordinatorMsg::CancelTask`; for a run no coordinator has, the
    /// step's newest task is cancelled in the store (`host::decide::cancel_task_stored`). The task
    /// named is the first the step was dispatched as; nothing happens if none was yet.
    CancelTask {
        /// The run.
        run: keel_store::RunId,
        /// The plan step (or follow-up key, `f1`, ...) whose task is named.
        step: String,
        /// Why.
        reason: String,
    },
    /// A user's follow-up as [`Intervention::FollowUp`], then a crash of the coordinator node right
    /// after the follow-up's id is announced (issue 17: `keel follow-up` killed once it printed
    /// the id). The id is announced once the follow-up is durable, as `Runtime::follow_up` does.
    CrashAfterFollowUp {
        /// The run.
        run: keel_store::RunId,
        /// As in [`Intervention::FollowUp`].
        step: Option<String>,
        /// The message.
        brief: String,
        /// How long the coordinator node stays down.
        down_ms: u64,
    },
}

/// Everything that decides a world. Two worlds with equal configs produce equal traces.
#[derive(Debug, Clone)]
pub struct WorldConfig {
    /// The seed of the one random stream.
    pub seed: u64,
    /// Worker nodes (node ids 1..=workers).
    pub workers: u8,
    /// The runs to submit; `None` draws 1 to 3 random runs from the seed.
    pub runs: Option<Vec<RunSpec>>,
    /// The fault profile; `None` samples one from the seed (swarm testing).
    pub profile: Option<FaultProfile>,
    /// Faults stop and everything heals at this virtual time.
    pub fault_phase_ms: SimMillis,
    /// After healing, every run must be terminal within this much virtual time.
    pub liveness_ms_max: SimMillis,
    /// Most events one world may process.
    pub events_max: u64,
    /// How much of the trace to keep.
    pub trace: TraceMode,
    /// Scripted faults.
    pub interventions: Vec<(SimMillis, Intervention)>,
    /// Scripted harness behaviour by (plan step, n-th session of that step, from 1); a re-dispatch is a
    /// new task, so sessions are counted per step, not per attempt. Others are drawn from the profile.
    pub harness_script: BTreeMap<(String, u32), HarnessBehaviour>,
    /// Crash the coordinator node right after its machines' N-th executed effect (1-based).
    pub crash_after_coord_effect: Option<u64>,
    /// End the world as soon as every run is terminal and durable, even before the liveness phase (the
    /// sweep: saves the fault ticks of an idle world). Scenarios that wait for late messages after the
    /// end of a run keep the world going until it heals.
    pub stop_when_terminal: bool,
    /// How long a scripted crash keeps the coordinator node down.
    pub restart_after_ms: u64,
    /// How long a specialist's context load may take before the host fails it.
    pub context_timeout_ms: u64,
    /// The coordinator node's rules for its workers (keel-protocol's `Membership`, as `keel node`
    /// runs it): leases, spawn acknowledgements, how long an attempt waits for a worker.
    pub membership: MembershipConfig,
    /// How often a worker sends its heartbeat (well under the lease, as `keel node` does).
    pub heartbeat_ms: u64,
    /// Most specialists one worker hosts at once (it advertises this in its heartbeat).
    pub worker_capacity: u32,
    /// The coordinators' limits.
    pub coordinator: CoordinatorConfig,
    /// The supervisor's limits (its agent list is replaced by [`crate::setup::agents`]).
    pub supervisor: SupervisorConfig,
    /// The specialists' limits.
    pub specialist: SpecialistConfig,
    /// The checkpoint writer's limits.
    pub checkpoint: CheckpointConfig,
    /// Chance (parts per million) that a seed draws one operator intervention (a pause, a cancel or
    /// a follow-up that may reopen an ended run) from its own stream; 0 in scenarios.
    pub operator_ppm: u32,
    /// Chance (parts per million) that a working specialist's session calls keel's tools on the
    /// way (a progress note, findings, `get_task_details`) through the node's endpoint; only when
    /// `specialist.session_tools` is the endpoint path; 0 in scenarios unless a test sets it.
    pub tool_sessions_ppm: u32,
    /// Chance (parts per million) that a seed's sessions run their tools through keel's policy
    /// (issue 13): hooks whose outcomes the seed draws, the chain, durable audit rows; 0 in
    /// scenarios unless a test sets it.
    pub hooks_ppm: u32,
    /// A deliberate defect of the host, for the tests that show the checker catches it; `None`
    /// everywhere else.
    pub mutation: Option<Mutation>,
}

impl WorldConfig {
    /// The sweep's configuration for `seed`: sampled faults and runs, three workers, a short per-subtask
    /// deadline so hung sessions cost little virtual time.
    pub fn for_seed(seed: u64) -> Self {
        let supervisor = SupervisorConfig {
            subtask_timeout_ms: 120_000,
            ..SupervisorConfig::default()
        };
        Self {
            seed,
            workers: 3,
            runs: None,
            profile: None,
            fault_phase_ms: 60_000,
            liveness_ms_max: 3_600_000,
            events_max: 200_000,
            trace: TraceMode::HashOnly,
            interventions: Vec::new(),
            harness_script: BTreeMap::new(),
            crash_after_coord_effect: None,
            stop_when_terminal: true,
            restart_after_ms: 1_000,
            context_timeout_ms: 5_000,
            membership: MembershipConfig {
                lease_ms: 3_000,
                spawn_ack_ms: 3_000,
                placement_wait_ms: 30_000,
                ..MembershipConfig::default()
            },
            heartbeat_ms: 1_000,
            worker_capacity: 8,
            coordinator: CoordinatorConfig::default(),
            supervisor,
            // As the runtime hosts sessions of harnesses with an MCP client: their tool calls
            // (a lead's `delegate` included) arrive through the node's endpoint.
            specialist: SpecialistConfig {
                session_tools: keel_actors::SessionToolPath::Endpoint,
                ..SpecialistConfig::default()
            },
            checkpoint: CheckpointConfig::default(),
            operator_ppm: 250_000,
            tool_sessions_ppm: 500_000,
            hooks_ppm: 500_000,
            mutation: None,
        }
    }

    /// A calm world for a scenario: no sampled faults, the given runs.
    pub fn calm(seed: u64, runs: Vec<RunSpec>) -> Self {
        Self {
            runs: Some(runs),
            profile: Some(FaultProfile::calm()),
            stop_when_terminal: false,
            operator_ppm: 0,
            tool_sessions_ppm: 0,
            hooks_ppm: 0,
            ..Self::for_seed(seed)
        }
    }
}
