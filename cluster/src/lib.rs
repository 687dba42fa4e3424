//! keel on several machines (docs/DESIGN.md §10, docs/OPERATIONS.md): a coordinator node that owns the
//! store and the machines of every run, and stateless worker nodes that host specialists, over
//! ractor_cluster.
//!
//! - The protocol itself (messages, encoding, node names, membership rules) is the pure crate
//!   keel-protocol, re-exported here; the simulator speaks it too. `wire.rs` carries its frames over
//!   ractor_cluster.
//! - `cookie.rs`: the shared secret, read from a file nobody else may read. `tls.rs`: mutual TLS
//!   between nodes when certificates are configured.
//! - `net.rs`: the ractor_cluster node server (explicit bind address), joining a peer with backoff,
//!   session events in the log.
//! - `coordinator.rs`: the coordinator node's endpoint, the runtime's [`keel_actors::runtime::RemoteHosts`].
//! - `worker.rs`, `worker_role.rs`: a worker node's endpoint and how it hosts one specialist.
//! - `remote_policy.rs`: the policy of sessions hosted on workers, decided by the coordinator node.

pub mod cookie;
pub mod coordinator;
pub mod net;
pub mod remote_policy;
pub mod tls;
pub mod wire;
pub mod worker;
mod worker_role;

pub use keel_protocol::{membership, name};

pub use cookie::{CookieError, read_cookie};
pub use coordinator::{CoordinatorEndpoint, DispatchStats, EndpointObserver, FrameCounts};
pub use membership::{Membership, MembershipConfig};
pub use name::{COORDINATOR_GROUP, NodeName, NodeNameError, WORKERS_GROUP, worker_group};
pub use net::{NetError, NodeServerRef, join_with_backoff, start_node_server};
pub use remote_policy::RemotePolicy;
pub use tls::{NodeTls, TlsError, TlsFiles, server_identity};
pub use wire::{
    ClusterMsg, Envelope, PROTOCOL_VERSION, PolicyAnswer, PolicyQuestion, PolicyScope, PolicyTerms,
    ToCoordinator, ToWorker, WireError, WorkerStatus,
};
pub use worker::{WorkerConfig, WorkerEndpoint};
