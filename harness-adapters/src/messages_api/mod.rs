//! keel's own agent loop against an Anthropic-compatible Messages endpoint (DESIGN.md §7).

pub mod backoff;
pub mod client;
pub mod http;
pub mod sse;
pub mod stream;
pub mod wire;
