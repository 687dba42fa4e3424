//! keel's actors as pure state machines, their context builders, and their runtime (DESIGN.md §3, §4, §6).

pub mod context;
