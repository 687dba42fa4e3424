//! keel's own agent loop against an Anthropic-compatible Messages endpoint (DESIGN.md §7).

pub mod http;
