//! The harnesses a node can start sessions on, and the host-side facts a session spec needs that the
//! machines deliberately do not carry: an account's endpoint and credential (secrets and endpoints
//! are node configuration, not persisted task data), and the environment a session sees.

use crate::ids::AttemptId;
use crate::message::SessionSecret;
use crate::report::SubagentReport;
use crate::session_tool::{DeliverToolCall, SESSION_TOOL_SERVER, SessionEndpoint};
use keel_harness::{Account, Harness, HarnessKind, McpEndpoint, SessionSpec};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

/// Environment variable a session's tools see holding its subtask id (the id its report must name).
pub const SUBTASK_ID_ENV: &str = "KEEL_SUBTASK_ID";
/// Environment variable holding the run id.
pub const RUN_ID_ENV: &str = "KEEL_RUN_ID";
/// Environment variable holding the attempt number.
pub const ATTEMPT_ENV: &str = "KEEL_ATTEMPT";
/// Environment variable holding a session's token for the node's MCP endpoint (the spec names the
/// variable; the harness reads the value from its environment).
pub const MCP_TOKEN_ENV: &str = "KEEL_MCP_TOKEN";

/// A node-side service a session calls back into (the policy's `keel hook` bridge; the MCP
/// endpoint): it fills in what the session needs to reach it (a gate command, an endpoint, a
/// session-scoped token) just before the session starts, and hears when the session has ended so a
/// token never outlives its session.
pub trait SessionService: Send + Sync + 'static {
    /// Called with the spec of `attempt`'s session just before it starts, after the host's own
    /// preparation (account, environment).
    fn session_starting(&self, attempt: AttemptId, spec: &mut SessionSpec);
    /// Called once `attempt`'s session has ended (or failed to start).
    fn session_ended(&self, attempt: AttemptId);

    /// A specialist's start or its report (the policy's `SubagentStart` and `SubagentStop`
    /// hooks, docs/DESIGN.md §9): veto it or annotate it, with the decision durable before the
    /// answer. A start is asked before [`SessionService::session_starting`]. The default has no
    /// opinion.
    fn subagent_event<'a>(
        &'a self,
        attempt: AttemptId,
        event: SubagentEvent<'a>,
    ) -> ServiceFuture<'a, SubagentAnswer> {
        let _ = (attempt, event);
        Box::pin(std::future::ready(SubagentAnswer::default()))
    }
}

/// A future a [`SessionService`] answers with.
pub type ServiceFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A specialist's session event, as services see it.
#[derive(Clone, Copy, Debug)]
pub enum SubagentEvent<'a> {
    /// The session is about to start on `brief` (its first message) as agent `agent`.
    Start {
        /// The agent profile it runs as.
        agent: &'a str,
        /// The session's first message: the brief (with its preamble).
        brief: &'a str,
    },
    /// The session's report came back.
    Stop {
        /// The agent profile it ran as.
        agent: &'a str,
        /// The report, verified.
        report: &'a SubagentReport,
    },
}

/// What the services answered about a [`SubagentEvent`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SubagentAnswer {
    /// The veto, if any: why the start or the report is refused.
    pub veto: Option<String>,
    /// A note to carry into the brief (a start) or the report's summary (a report).
    pub note: Option<String>,
}

/// The harnesses of a node, by kind, with its accounts.
#[derive(Clone, Default)]
pub struct HarnessSet {
    harnesses: BTreeMap<HarnessKind, Arc<dyn Harness>>,
    accounts: BTreeMap<String, Account>,
    env: BTreeMap<String, String>,
    /// The node's MCP endpoint, when it serves one (issue 11's session tools).
    session_endpoint: Option<Arc<dyn SessionEndpoint>>,
    services: Vec<Arc<dyn SessionService>>,
}

impl std::fmt::Debug for HarnessSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HarnessSet")
            .field("kinds", &self.harnesses.keys().collect::<Vec<_>>())
            .field("accounts", &self.accounts.keys().collect::<Vec<_>>())
            .field("session_endpoint", &self.session_endpoint.is_some())
            .field("services", &self.services.len())
            .finish_non_exhaustive()
    }
}

impl HarnessSet {
    /// No harnesses: every session fails to start with a typed system failure.
    pub fn new() -> Self {
        Self::default()
    }

    /// Add (or replace) the harness for `kind`.
    #[must_use]
    pub fn with(mut self, kind: HarnessKind, harness: Arc<dyn Harness>) -> Self {
        self.harnesses.insert(kind, harness);
        self
    }

    /// Add (or replace) an account: sessions billed to `account.id` get its endpoint and credential.
    #[must_use]
    pub fn with_account(mut self, account: Account) -> Self {
        self.accounts.insert(account.id.clone(), account);
        self
    }

    /// Add an environment variable every session sees.
    #[must_use]
    pub fn with_env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.insert(name.into(), value.into());
        self
    }

    /// Serve keel's session tools to every session of a harness with an MCP client through this
    /// endpoint (keel-mcp's, started by the node).
    #[must_use]
    pub fn with_session_endpoint(mut self, endpoint: Arc<dyn SessionEndpoint>) -> Self {
        self.session_endpoint = Some(endpoint);
        self
    }

    /// Whether sessions of `kind` get the session tools: the node serves an endpoint and the harness
    /// has an MCP client (pi has none).
    pub fn serves_session_tools(&self, kind: HarnessKind) -> bool {
        self.session_endpoint.is_some() && kind != HarnessKind::Pi
    }

    /// How a session of `kind` hosted with this set reaches its specialist's coordination tools:
    /// through the endpoint when it serves them (tool-use events are then only logged, or a
    /// `delegate` call would be taken twice), else as tool-use events. Every host of a specialist
    /// (the runtime's node, a cluster worker) configures it the same way.
    pub fn session_tool_path(&self, kind: HarnessKind) -> crate::SessionToolPath {
        if self.serves_session_tools(kind) {
            crate::SessionToolPath::Endpoint
        } else {
            crate::SessionToolPath::ToolEvents
        }
    }

    /// Opens the attempt's session on the endpoint (its token minted, its calls going to `deliver`)
    /// and names the endpoint in the spec, the token in its environment. Returns the token when the
    /// session got the tools, for the host to hand its specialist as a
    /// [`SpecialistInput::SessionSecret`](crate::SpecialistInput::SessionSecret) before the session
    /// starts (so an echo of it is scrubbed at ingest); without the tools (no endpoint, pi, no
    /// token) the spec is unchanged.
    pub fn open_session_tools(
        &self,
        spec: &mut SessionSpec,
        kind: HarnessKind,
        attempt: AttemptId,
        deliver: DeliverToolCall,
    ) -> Option<SessionSecret> {
        let endpoint = self
            .session_endpoint
            .as_ref()
            .filter(|_| self.serves_session_tools(kind))?;
        match endpoint.open(attempt, deliver) {
            Ok(access) => {
                spec.mcp_endpoint = Some(McpEndpoint {
                    server_name: SESSION_TOOL_SERVER.into(),
                    url: access.url,
                    bearer_token_env: Some(MCP_TOKEN_ENV.into()),
                });
                spec.env.insert(MCP_TOKEN_ENV.into(), access.token.clone());
                // A profile that narrows the tools still gets keel's own (names as MCP clients
                // offer them), or it could neither report nor delegate.
                if !spec.allowed_tools.is_empty() {
                    for tool in crate::session_tool::SESSION_TOOLS {
                        let name = format!("mcp__{SESSION_TOOL_SERVER}__{tool}");
                        if !spec.allowed_tools.contains(&name) {
                            spec.allowed_tools.push(name);
                        }
                    }
                }
                Some(SessionSecret(access.token))
            }
            Err(e) => {
                tracing::warn!(%attempt, error = %e, "the session runs without keel's tools");
                None
            }
        }
    }

    /// The node's MCP endpoint, if it serves one.
    pub fn session_endpoint(&self) -> Option<&Arc<dyn SessionEndpoint>> {
        self.session_endpoint.as_ref()
    }

    /// The values of every credential its accounts name (a variable read from the node's session
    /// environment first, then the process's, as adapters read it; a key file read now), so the
    /// scrubber can remove them literally from whatever a session prints, whatever their shape
    /// (issue 16). Missing ones are skipped (the session that needs one fails to start, naming
    /// it); each value once.
    pub fn credential_values(&self) -> Vec<String> {
        let mut values: Vec<String> = Vec::new();
        for account in self.accounts.values() {
            let found = account.credential.secret(|name| {
                self.env
                    .get(name)
                    .cloned()
                    .or_else(|| std::env::var(name).ok())
            });
            if let Ok(Some(v)) = found
                && !values.contains(&v)
            {
                values.push(v);
            }
        }
        values
    }

    /// Add a service every session is prepared for (in the order added) and whose end it hears.
    #[must_use]
    pub fn with_service(mut self, service: Arc<dyn SessionService>) -> Self {
        self.services.push(service);
        self
    }

    /// Asks every service about `attempt`'s start or report, in the order they were added: the
    /// first veto decides; the notes are kept in order.
    pub(crate) async fn subagent_event(
        &self,
        attempt: AttemptId,
        event: SubagentEvent<'_>,
    ) -> SubagentAnswer {
        let mut notes = Vec::new();
        for s in &self.services {
            let answer = s.subagent_event(attempt, event).await;
            if answer.veto.is_some() {
                return answer;
            }
            notes.extend(answer.note);
        }
        SubagentAnswer {
            veto: None,
            note: (!notes.is_empty()).then(|| notes.join("\n")),
        }
    }

    /// Tell every service that `attempt`'s session has ended (the hook bridge revokes its token).
    pub fn session_ended(&self, attempt: AttemptId) {
        for s in &self.services {
            s.session_ended(attempt);
        }
    }

    /// Ends everything a start opened for `attempt`'s session: the services' (the hook bridge's
    /// token) and keel's session tools on the node's endpoint (the MCP token). What a
    /// [`crate::runtime::SessionServices`] guard calls, so a session's tokens end with it also when
    /// its specialist's task is killed (a kill skips the role's `stopped`).
    pub fn end_session(&self, attempt: AttemptId) {
        self.session_ended(attempt);
        if let Some(endpoint) = &self.session_endpoint {
            endpoint.close(attempt);
        }
    }

    /// The harness for `kind`, if the node has one.
    pub fn get(&self, kind: HarnessKind) -> Option<Arc<dyn Harness>> {
        self.harnesses.get(&kind).cloned()
    }

    /// Fill in what the host knows: the account's endpoint and credential, the node's environment,
    /// and the attempt's identity for the session's tools.
    pub fn prepare(&self, mut spec: SessionSpec, attempt: AttemptId) -> SessionSpec {
        if let Some(account) = self.accounts.get(&spec.account.id) {
            spec.account.base_url = account.base_url.clone();
            spec.account.credential = account.credential.clone();
        }
        for (k, v) in &self.env {
            spec.env.entry(k.clone()).or_insert_with(|| v.clone());
        }
        spec.env
            .insert(SUBTASK_ID_ENV.into(), attempt.task.to_string());
        spec.env.insert(RUN_ID_ENV.into(), attempt.run.to_string());
        spec.env
            .insert(ATTEMPT_ENV.into(), attempt.attempt.to_string());
        if spec.stop_check.is_some() {
            // keel's own loop runs the report check in process; a CLI runs it from its Stop hook.
            spec.in_process.stop = Some(Arc::new(crate::report::ReportJudge));
        }
        for s in &self.services {
            s.session_starting(attempt, &mut spec);
        }
        spec
    }
}
