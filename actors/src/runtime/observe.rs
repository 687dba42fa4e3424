//! What the runtime tells an embedding host's metrics as it works: how long each group commit
//! took and why the supervisor refused a spawn. The host gives an observer in
//! [`RuntimeConfig::observer`](super::RuntimeConfig::observer) (`keel serve` exports them on
//! `/metrics`); without one the runtime only skips the calls.

use crate::message::Refusal;
use std::time::Duration;

/// A sink for the runtime's measurements. Called on the runtime's own threads (the store writer,
/// the supervisor's actor): an implementation must be quick and must not block.
pub trait RuntimeObserver: Send + Sync + std::fmt::Debug {
    /// A group commit ended (`durable` false when it failed) after `latency` on the store writer
    /// thread (the write transaction and its fsync).
    fn commit_ended(&self, latency: Duration, durable: bool);

    /// The supervisor refused a spawn, for the reason named by [`refusal_reason`].
    fn spawn_refused(&self, reason: &'static str);
}

/// A refusal's stable name, for a metric's label: `concurrency`, `depth`, `budget`, `rate`,
/// `unknown_run`, `no_agent`.
pub fn refusal_reason(refusal: &Refusal) -> &'static str {
    match refusal {
        Refusal::Concurrency { .. } => "concurrency",
        Refusal::Depth { .. } => "depth",
        Refusal::Budget { .. } => "budget",
        Refusal::Rate { .. } => "rate",
        Refusal::UnknownRun => "unknown_run",
        Refusal::NoAgent { .. } => "no_agent",
    }
}
