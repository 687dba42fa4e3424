//! A deterministic, seeded world for keel's actor state machines (DESIGN.md §11).
