//! keel's MCP endpoint (docs/DESIGN.md §10): the coordination tools a harness session calls
//! (`get_task_details`, `report_progress`, `report_findings`, `delegate`, `escalate`), served over MCP
//! streamable HTTP on 127.0.0.1 with `rmcp`, the official Rust SDK.
//!
//! A session is opened when its harness starts ([`keel_actors::SessionEndpoint::open`]): a bearer token
//! is minted for exactly that attempt (its run, task and attempt number) and handed to the harness in
//! its environment. Every request without a live token is refused with HTTP 401 before MCP sees it; a
//! tool call's arguments are checked ([`keel_actors::session_tool::parse_request`]) and a bad one is
//! answered with an MCP `invalid_params` error naming the field, having done nothing. A good call gets a
//! call id, goes to the attempt's specialist through the deliver function the host gave at open, and
//! waits (bounded) for the answer the host hands back ([`keel_actors::SessionEndpoint::answer`]).
//! Closing the session revokes the token and answers its waiting calls as ended.
//!
//! The scope of a call comes from its token only, never from its arguments: a session can name any
//! task id, but its call reaches its own run's coordinator, which knows only its own run's tasks.

mod registry;
mod server;

pub use registry::{SessionRegistry, TokenError};
pub use server::{EndpointConfig, EndpointError, McpEndpoint, TOKEN_ENV};
