//! keel's own agent loop against an Anthropic-compatible Messages endpoint (docs/DESIGN.md §7).
//!
//! - [`agent`]: the loop (stop reasons, pairing, parallel tools, retries, runaway guards).
//! - [`client`]: the [`client::ModelTransport`] seam and the HTTP transport with SSE streaming.
//! - [`sse`], [`stream`]: pure parsing of the stream into one assistant message.
//! - [`backoff`], [`gate`], [`wire`], [`http`]: retry policy, pre-tool gate, wire types, client setup.

pub mod agent;
pub mod backoff;
pub mod client;
pub mod gate;
pub mod http;
pub mod sse;
pub mod stream;
pub mod wire;

use std::sync::Arc;

use crate::error::StartError;
use crate::session::{BoxFuture, Harness, RunningSession, session_channel};
use crate::spec::{HarnessKind, SessionSpec};
use crate::tools::ToolRegistry;
use agent::{AgentLoop, LoopConfig};
use client::{Auth, HttpTransport};

/// The endpoint used when the account names none.
pub const DEFAULT_BASE_URL: &str = "https://api.anthropic.com";
/// Longest silence tolerated inside a stream (or before the response headers) before the attempt
/// counts as failed and is retried.
pub const STREAM_IDLE_MS_DEFAULT: u64 = 120_000;

/// How the native harness is set up.
#[derive(Debug, Clone)]
pub struct MessagesApiConfig {
    /// Base URL when the account has none.
    pub default_base_url: String,
    /// Idle timeout of a stream, in milliseconds.
    pub stream_idle_ms_max: u64,
    /// The loop's tuning.
    pub loop_config: LoopConfig,
    /// The tools offered (narrowed per session by the spec's allowed/disallowed lists).
    pub tools: ToolRegistry,
}

impl Default for MessagesApiConfig {
    fn default() -> Self {
        MessagesApiConfig {
            default_base_url: DEFAULT_BASE_URL.to_owned(),
            stream_idle_ms_max: STREAM_IDLE_MS_DEFAULT,
            loop_config: LoopConfig::default(),
            tools: ToolRegistry::with_builtins(),
        }
    }
}

/// keel's native harness: the agent loop over HTTP.
#[derive(Debug)]
pub struct MessagesApiHarness {
    config: MessagesApiConfig,
    client: reqwest::Client,
}

impl MessagesApiHarness {
    /// A harness with its own HTTP client.
    ///
    /// # Errors
    /// [`StartError::Unavailable`] if the HTTP client cannot be built.
    pub fn new(config: MessagesApiConfig) -> Result<Self, StartError> {
        let client = http::model_client().map_err(|e| StartError::Unavailable(e.message))?;
        Ok(MessagesApiHarness { config, client })
    }
}

/// Checks the spec and makes its working directory canonical, as the loop's tools require.
pub(crate) fn prepare_spec(mut spec: SessionSpec) -> Result<SessionSpec, StartError> {
    spec.validate()?;
    let canonical = spec.working_dir.canonicalize().map_err(|e| {
        StartError::InvalidSpec(format!("working_dir {}: {e}", spec.working_dir.display()))
    })?;
    if !canonical.is_dir() {
        return Err(StartError::InvalidSpec(
            "working_dir is not a directory".into(),
        ));
    }
    spec.working_dir = canonical;
    Ok(spec)
}

fn auth_for(spec: &SessionSpec) -> Result<Auth, StartError> {
    let credential = &spec.account.credential;
    let secret = credential
        .secret(|name| spec.env_var(name))
        .map_err(|e| StartError::MissingCredential(e.to_string()))?;
    Ok(match secret {
        None => Auth::None,
        Some(v) if credential.is_bearer() => Auth::Bearer(v),
        Some(v) => Auth::ApiKey(v),
    })
}

/// The session's tools: the configured registry plus, when the spec names an MCP endpoint, the
/// endpoint's tools. `http` is only called when an endpoint is set.
pub(crate) async fn session_tools(
    spec: &SessionSpec,
    base: &ToolRegistry,
    http: impl FnOnce() -> Result<reqwest::Client, StartError>,
) -> Result<ToolRegistry, StartError> {
    let mut tools = base.clone();
    if let Some(endpoint) = &spec.mcp_endpoint {
        let bearer = match &endpoint.bearer_token_env {
            Some(name) => Some(
                spec.env_var(name)
                    .ok_or_else(|| StartError::MissingCredential(name.clone()))?,
            ),
            None => None,
        };
        crate::tools::mcp::register_endpoint(&mut tools, endpoint, bearer, http()?)
            .await
            .map_err(|e| StartError::Unavailable(format!("MCP endpoint {}: {e}", endpoint.url)))?;
    }
    Ok(tools)
}

impl Harness for MessagesApiHarness {
    fn kind(&self) -> HarnessKind {
        HarnessKind::MessagesApi
    }

    fn start(&self, spec: SessionSpec) -> BoxFuture<'_, Result<RunningSession, StartError>> {
        Box::pin(async move {
            let spec = prepare_spec(spec)?;
            let auth = auth_for(&spec)?;
            let tools =
                session_tools(&spec, &self.config.tools, || Ok(self.client.clone())).await?;
            let base_url = spec
                .account
                .base_url
                .clone()
                .unwrap_or_else(|| self.config.default_base_url.clone());
            let transport = HttpTransport::new(
                self.client.clone(),
                &base_url,
                auth,
                self.config.stream_idle_ms_max,
            );
            let agent = AgentLoop::new(Arc::new(transport), tools, self.config.loop_config.clone());
            let (sink, cancel, session) = session_channel(HarnessKind::MessagesApi);
            // The session runs in the caller's span, so its log lines name the caller's task.
            tokio::spawn(tracing::Instrument::instrument(
                agent.run(spec, sink, cancel),
                tracing::Span::current(),
            ));
            Ok(session)
        })
    }
}
