//! keel's actors as pure state machines, their context builders, and their runtime (docs/DESIGN.md §3, §4, §6).
//!
//! Start at [`Machine`]: every actor (the [`Coordinator`], each [`Specialist`], the [`Supervisor`], the
//! [`CheckpointWriter`]) is a value that takes inputs and pushes effects, with time and randomness
//! injected. Hosts (the ractor runtime, the simulator) execute effects and feed completions back.

pub mod checkpoint;
pub mod context;
pub mod coordinator;
pub mod effect;
pub mod escalation;
pub mod host;
pub mod ids;
pub mod machine;
pub mod message;
pub mod persist;
pub mod plan;
pub mod report;
pub mod routing;
#[cfg(feature = "runtime")]
pub mod runtime;
pub mod session_tool;
pub mod specialist;
pub mod supervisor;

pub use checkpoint::{CheckpointConfig, CheckpointWriter};
pub use coordinator::{
    Coordinator, CoordinatorConfig, Coverage, CoverageStatus, StepStatus, Synthesis,
};
pub use effect::{Effect, Envelope, SpecialistEffect, TimerKey};
pub use ids::{AttemptId, IdempotencyKey, ReplyTarget, ReplyTo};
pub use machine::{Entropy, Machine, Millis, SplitMix64};
pub use message::*;
pub use persist::{CommitBatch, CommitId, PersistOp, Stage, StageOwner};
pub use plan::{Plan, PlanError, PlanStep, ValidatedPlan};
pub use report::*;
pub use session_tool::{
    SessionAnswer, SessionEndpoint, SessionRequest, SessionToolCall, TaskDetails, ToolRefusal,
};
pub use specialist::{SessionToolPath, Specialist, SpecialistConfig};
pub use supervisor::{AccountRoute, Supervisor, SupervisorConfig};
