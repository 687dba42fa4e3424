//! A deterministic, seeded world for keel's actor state machines (docs/DESIGN.md §11).
//!
//! The world is single-threaded and discrete-event: a virtual clock, one agenda ordered by
//! `(time, seq)`, and one ChaCha8 stream per seed that decides every latency, loss, duplicate, partition,
//! crash, disk fault and harness behaviour. It hosts the very machines of `keel-actors` (not a model of
//! them), checks docs/DESIGN.md §12's invariants as effects run and after every event, and records a trace
//! whose hash must be the same every time a seed is run.
//!
//! Start at [`world::run`] with a [`config::WorldConfig`]; [`soak`] runs many seeds.

pub mod check;
pub mod config;
pub mod harness;
pub mod mutation;
pub mod net;
pub mod profile;
pub mod queue;
pub mod rng;
pub mod setup;
pub mod sim_store;
pub mod soak;
pub mod trace;
pub mod violation;
pub mod world;

pub use config::{DiskFault, Intervention, WorldConfig};
pub use mutation::Mutation;
pub use world::{RunReport, run};
