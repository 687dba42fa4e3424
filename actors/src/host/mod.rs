//! The host's synchronous half: the effect execution that needs no async runtime, shared by every
//! host of the machines (the ractor runtime in [`crate::runtime`], and the simulator's world loop).
//!
//! The machines decide what to write; a host only carries it out. What can be carried out without
//! awaiting, spawning or reading the clock lives here, once, so the runtime and the simulator cannot
//! drift apart:
//! - [`store`]: a checkpoint machine's group commit in one write transaction
//!   ([`store::commit`]), the rows a restarted coordinator rebuilds from ([`store::recover_run`],
//!   [`store::open_runs`], [`store::recover_open_runs`]), and a specialist's context rows
//!   ([`store::load_context`]), with one error type, [`HostError`];
//! - [`decide`]: what a pause (SIGTERM), a cancel, a resume and a follow-up do to a run, as pure
//!   functions over its rows, answering the rows to write or a typed [`Refusal`];
//! - [`started`]: the in-process guard against two sessions with one key, which refuses rather
//!   than forgets when full.
//!
//! Nothing here awaits: an async host calls these on a blocking thread (the runtime's store writer,
//! `spawn_blocking`), the simulator calls them inline.

pub mod decide;
pub mod started;
pub mod store;

pub use decide::{FollowUpRoute, Marks, Refusal};
pub use started::{StartRefusal, StartedKeys};
pub use store::HostError;
