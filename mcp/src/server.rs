//! The HTTP side: rmcp's streamable HTTP service behind a bearer check, on 127.0.0.1.

use crate::registry::{CallError, SessionRegistry};
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use keel_actors::AttemptId;
use keel_actors::context::Scrubber;
use keel_actors::session_tool::{
    self, DeliverToolCall, EndpointUnavailable, SESSION_TOOLS, SessionAccess, SessionAnswer,
    SessionEndpoint, SessionRequest,
};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ErrorData,
    InitializeResult, ListToolsResult, PaginatedRequestParams, ServerCapabilities, Tool,
};
use rmcp::service::{MaybeSendFuture, RequestContext};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{RoleServer, ServerHandler};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// The environment variable a session's token is passed in (its name is in the session's spec, the
/// value only in the process environment).
pub const TOKEN_ENV: &str = "KEEL_MCP_TOKEN";
/// The path the endpoint serves MCP on.
pub const MCP_PATH: &str = "/mcp";

/// How the endpoint is set up.
#[derive(Clone, Debug)]
pub struct EndpointConfig {
    /// Where to listen: 127.0.0.1 and a free port unless a caller needs a fixed one.
    pub bind: SocketAddr,
    /// Longest wait for an answer to any call but `delegate`.
    pub call_timeout: Duration,
    /// Longest wait for a `delegate` call (its subtasks run to their end first).
    pub delegate_timeout: Duration,
    /// What every answer and error body passes on its way out (issue 16): the node's scrubber, with
    /// the credentials it knows registered; the caller's own token is added per call.
    pub scrubber: Scrubber,
}

impl Default for EndpointConfig {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            call_timeout: Duration::from_secs(60),
            delegate_timeout: Duration::from_secs(4 * 3600),
            scrubber: Scrubber::new(),
        }
    }
}

/// The endpoint could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EndpointError {
    /// Only loopback addresses are served: sessions reach the endpoint on their own machine.
    #[error("the MCP endpoint listens on loopback only, not on {0}")]
    NotLoopback(SocketAddr),
    /// The address could not be bound.
    #[error("could not listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
}

/// keel's MCP endpoint on this node. Stops serving when dropped.
pub struct McpEndpoint {
    registry: Arc<SessionRegistry>,
    addr: SocketAddr,
    url: String,
    stop: CancellationToken,
}

impl std::fmt::Debug for McpEndpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpEndpoint")
            .field("url", &self.url)
            .field("registry", &self.registry)
            .finish()
    }
}

#[derive(Clone)]
struct Shared {
    registry: Arc<SessionRegistry>,
    config: EndpointConfig,
}

impl McpEndpoint {
    /// Binds and serves in the background (on the current tokio runtime).
    ///
    /// # Errors
    /// [`EndpointError`] when the address is not loopback or cannot be bound.
    pub async fn start(config: EndpointConfig) -> Result<McpEndpoint, EndpointError> {
        if !config.bind.ip().is_loopback() {
            return Err(EndpointError::NotLoopback(config.bind));
        }
        let listener = tokio::net::TcpListener::bind(config.bind)
            .await
            .map_err(|source| EndpointError::Bind {
                addr: config.bind,
                source,
            })?;
        let addr = listener
            .local_addr()
            .map_err(|source| EndpointError::Bind {
                addr: config.bind,
                source,
            })?;
        let registry = Arc::new(SessionRegistry::default());
        let stop = CancellationToken::new();
        let shared = Shared {
            registry: Arc::clone(&registry),
            config,
        };
        let mut http_config = StreamableHttpServerConfig::default();
        http_config.cancellation_token = stop.child_token();
        let tools = shared.clone();
        let service = StreamableHttpService::new(
            move || Ok(KeelTools(tools.clone())),
            Arc::new(LocalSessionManager::default()),
            http_config,
        );
        let app = axum::Router::new()
            .route_service(MCP_PATH, service)
            .layer(axum::middleware::from_fn_with_state(shared, require_token));
        let stopped = stop.clone();
        tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move { stopped.cancelled().await })
                .await;
            if let Err(e) = served {
                tracing::error!(error = %e, "the MCP endpoint stopped");
            }
        });
        Ok(McpEndpoint {
            registry,
            addr,
            url: format!("http://{addr}{MCP_PATH}"),
            stop,
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its MCP URL.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The open sessions (tests and diagnostics).
    pub fn registry(&self) -> &SessionRegistry {
        &self.registry
    }
}

impl Drop for McpEndpoint {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl SessionEndpoint for McpEndpoint {
    fn open(
        &self,
        attempt: AttemptId,
        deliver: DeliverToolCall,
    ) -> Result<SessionAccess, EndpointUnavailable> {
        let token = self
            .registry
            .open(attempt, deliver)
            .map_err(|e| EndpointUnavailable(e.to_string()))?;
        Ok(SessionAccess {
            url: self.url.clone(),
            token,
        })
    }

    fn close(&self, attempt: AttemptId) {
        self.registry.close(attempt);
    }

    fn answer(&self, attempt: AttemptId, call_id: &str, answer: SessionAnswer) {
        self.registry.answer(attempt, call_id, answer);
    }
}

/// The bearer token of a request, if it has one.
fn bearer(headers: &http::HeaderMap) -> Option<&str> {
    headers
        .get(http::header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

/// Refuses (401) every request without the token of an open session, before MCP sees it.
async fn require_token(State(shared): State<Shared>, request: Request, next: Next) -> Response {
    let live = bearer(request.headers()).is_some_and(|t| shared.registry.attempt_of(t).is_some());
    if !live {
        return (
            http::StatusCode::UNAUTHORIZED,
            [(http::header::WWW_AUTHENTICATE, "Bearer")],
            "a valid session token is required",
        )
            .into_response();
    }
    next.run(request).await
}

/// The bearer token of a call's HTTP request.
fn bearer_of(context: &RequestContext<RoleServer>) -> Option<String> {
    context
        .extensions
        .get::<http::request::Parts>()
        .and_then(|parts| bearer(&parts.headers).map(str::to_owned))
}

/// The MCP server handler: lists keel's tools and runs their calls.
#[derive(Clone)]
struct KeelTools(Shared);

fn tool_list() -> Vec<Tool> {
    SESSION_TOOLS
        .iter()
        .filter_map(|name| {
            let schema = session_tool::input_schema(name)?;
            let serde_json::Value::Object(schema) = schema else {
                return None;
            };
            Some(Tool::new(
                *name,
                session_tool::description(name),
                Arc::new(schema),
            ))
        })
        .collect()
}

impl KeelTools {
    async fn run(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let token = bearer_of(&context);
        // Every way out is scrubbed, the caller's own token included (issue 16).
        let mut scrubber = self.0.config.scrubber.clone();
        if let Some(t) = &token {
            let _ = scrubber.register_secret(t);
        }
        self.answer(request, token, &scrubber)
            .await
            .map_err(|mut e| {
                e.message = scrubber.scrub(&e.message).text.into_owned().into();
                e
            })
    }

    async fn answer(
        &self,
        request: CallToolRequestParams,
        token: Option<String>,
        scrubber: &Scrubber,
    ) -> Result<CallToolResponse, ErrorData> {
        let token = token.ok_or_else(|| ErrorData::invalid_request("no session token", None))?;
        let args = serde_json::Value::Object(request.arguments.unwrap_or_default());
        let parsed = session_tool::parse_request(&request.name, &args).map_err(|e| {
            let field = scrubber.scrub(&e.field).text.into_owned();
            ErrorData::invalid_params(e.to_string(), Some(serde_json::json!({ "field": field })))
        })?;
        let timeout = match parsed {
            SessionRequest::Delegate { .. } => self.0.config.delegate_timeout,
            _ => self.0.config.call_timeout,
        };
        let answer = self
            .0
            .registry
            .call(&token, parsed, timeout)
            .await
            .map_err(|e| match e {
                CallError::Revoked => ErrorData::invalid_request(e.to_string(), None),
                CallError::TimedOut(_) => ErrorData::internal_error(e.to_string(), None),
            })?;
        let content = vec![ContentBlock::text(
            scrubber.scrub(&answer.text()).text.into_owned(),
        )];
        let result = if answer.is_error() {
            CallToolResult::error(content)
        } else {
            CallToolResult::success(content)
        };
        Ok(result.into())
    }
}

impl ServerHandler for KeelTools {
    fn get_info(&self) -> InitializeResult {
        let mut info = InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_instructions(
                "keel's coordination tools: read your thread's tasks, report progress and findings, delegate (leads), ask a human.",
            );
        info.server_info.name = "keel".into();
        info.server_info.version = env!("CARGO_PKG_VERSION").into();
        info
    }

    fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<ListToolsResult, ErrorData>> + MaybeSendFuture + '_ {
        std::future::ready(Ok(ListToolsResult::with_all_items(tool_list())))
    }

    fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> impl Future<Output = Result<CallToolResponse, ErrorData>> + MaybeSendFuture + '_ {
        self.run(request, context)
    }
}
