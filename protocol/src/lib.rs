//! The protocol between keel nodes, as pure values (docs/DESIGN.md §10): no tokio, no ractor, so the
//! simulator can speak the same messages, encoding and membership rules that keel-cluster carries
//! over ractor_cluster.
//!
//! - `wire.rs`: typed messages, a bincode 2 encoding behind a protocol version, a total decoder.
//! - `name.rs`: node names and the process groups they join.
//! - `membership.rs`: the coordinator's view of its workers (time as an argument): leases renewed by
//!   heartbeats, placement by capability and load, spawn acknowledgements, what a lost worker's
//!   attempts become.

pub mod membership;
pub mod name;
pub mod wire;

pub use membership::{Membership, MembershipConfig};
pub use name::{COORDINATOR_GROUP, NodeName, NodeNameError, WORKERS_GROUP, worker_group};
pub use wire::{
    Envelope, PROTOCOL_VERSION, PolicyAnswer, PolicyQuestion, PolicyScope, PolicyTerms,
    ToCoordinator, ToWorker, WireError, WorkerStatus,
};
