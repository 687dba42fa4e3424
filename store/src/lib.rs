//! keel's durable model on redb (DESIGN.md §5).

pub mod model;

pub use model::*;
