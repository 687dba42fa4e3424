//! Shared helpers for keel's cross-crate integration tests.
