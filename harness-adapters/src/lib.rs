//! keel's harness adapters: one interface over replaceable executors (DESIGN.md §7).
