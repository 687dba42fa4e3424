//! From keel.toml and the command line to a running node: the agents the supervisor may assign, the
//! harnesses that run them, the accounts they bill to, and the built-in scripted model server used
//! when nothing else is configured.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use keel_actors::runtime::{HarnessSet, Runtime, RuntimeConfig};
use keel_harness::cli::{CliConfig, CliHarness};
use keel_harness::messages_api::{MessagesApiConfig, MessagesApiHarness};
use keel_harness::scripted::{Script, ScriptedHarness};
use keel_harness::server::{ModelServer, ModelServerConfig};
use keel_harness::{Account, Credential, HarnessKind};
use keel_store::{AgentLimits, AgentProfile, Durability, RunId, Store, Task, WriteBatch};

use crate::config::{AgentSection, Config};
use crate::hook::bridge::PolicyBridge;

/// The agent profile of the built-in scripted model.
pub(crate) const SCRIPTED_AGENT: &str = "scripted";
/// The account the built-in scripted model bills to (a local endpoint, no key).
pub(crate) const SCRIPTED_ACCOUNT: &str = "scripted-local";
/// The model name the scripted model answers as.
pub(crate) const SCRIPTED_MODEL: &str = "keel-scripted-1";

/// The harness choices on the command line.
#[derive(Debug, Clone, Default)]
pub(crate) struct HarnessChoice {
    /// `--agent NAME`: only this profile of keel.toml.
    pub(crate) agent: Option<String>,
    /// `--harness KIND`: one profile on this harness.
    pub(crate) harness: Option<HarnessKind>,
    /// `--model NAME` for `--harness`.
    pub(crate) model: Option<String>,
    /// `--model-server URL`: the scripted model served by another process (`keel model-server`).
    pub(crate) model_server: Option<String>,
}

/// What a node needs besides the store.
pub(crate) struct NodeSetup {
    pub(crate) harnesses: HarnessSet,
    pub(crate) config: RuntimeConfig,
    /// Whether runs use the scripted model (so briefs get the scripted survey plan).
    pub(crate) scripted: bool,
    /// The in-process model server, kept alive for the node's life.
    pub(crate) _server: Option<ModelServer>,
    /// The hook bridge's endpoint when keel.toml configures a policy: every session then gets the
    /// pre-tool gate. Attach the runtime's audit writer with [`attach_policy`] once it runs.
    pub(crate) policy: Option<PolicyBridge>,
    /// Where this node's MCP endpoint serves keel's session tools (127.0.0.1): a worker node
    /// announces it, since the sessions it hosts call it. `None` on a node where no session runs
    /// (a cluster's coordinator-only node), which starts no endpoint.
    pub(crate) session_tools_url: Option<String>,
    /// Whether sessions of this node's runs run on other nodes (a coordinator-only node: its
    /// workers each serve keel's session tools to the sessions they host).
    sessions_elsewhere: bool,
}

/// Who decides the tool calls of the sessions a node hosts.
#[derive(Debug, Clone)]
pub(crate) enum PolicySource {
    /// This node's keel.toml, with this node's store (`keel run`, `keel serve`, a coordinator).
    KeelToml,
    /// The coordinator node's policy, asked over the cluster (a worker-only node, which has no
    /// store): the worker's own keel.toml policy is not used.
    Coordinator(Arc<keel_cluster::RemotePolicy>),
}

/// Where the sessions of a node's runs run, which decides whether it serves keel's session tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SessionsHost {
    /// Here (`keel run`, `keel serve`, a worker or an `all` node): the node starts its MCP
    /// endpoint on 127.0.0.1 for them.
    ThisNode,
    /// On worker nodes only (a coordinator-only node): no endpoint here; each worker serves its own.
    Workers,
}

/// Lets the policy bridge record decisions through `runtime` (until then every call is denied).
pub(crate) fn attach_policy(
    policy: &Option<PolicyBridge>,
    runtime: &keel_actors::runtime::Runtime,
) {
    if let Some(bridge) = policy {
        bridge.attach(runtime.audit_writer(), runtime.approval_desk());
    }
}

fn profile(a: &AgentSection) -> AgentProfile {
    let mut limits = AgentLimits::default();
    if let Some(t) = a.max_turns {
        limits.turns_max = t.get();
    }
    AgentProfile {
        name: a.name.clone(),
        description: a.description.clone(),
        harness: a.harness.as_str().into(),
        model: a.model.clone(),
        account: a.account_name().to_owned(),
        tools: a.tools.clone(),
        system_prompt: a.system_prompt.clone(),
        limits,
    }
}

fn scripted_profile() -> AgentProfile {
    AgentProfile {
        name: SCRIPTED_AGENT.into(),
        description:
            "keel's built-in scripted model, driving the native agent loop with real tools".into(),
        harness: HarnessKind::MessagesApi.as_str().into(),
        model: SCRIPTED_MODEL.into(),
        account: SCRIPTED_ACCOUNT.into(),
        tools: Vec::new(),
        system_prompt: String::new(),
        limits: AgentLimits::default(),
    }
}

/// The environment variables keel reads credentials from: Anthropic's, then OpenAI's. Their values
/// are registered with every scrubber keel runs (issue 16).
pub(crate) const CREDENTIAL_ENV: [&str; 2] = ["ANTHROPIC_API_KEY", "OPENAI_API_KEY"];

/// The environment variable a harness's sessions read their key from when their agent names no
/// `[[accounts]]` entry (`None` for the scripted model): one place for the runs and for `keel
/// doctor`'s checks.
pub(crate) fn credential_env(kind: HarnessKind) -> Option<&'static str> {
    kind.provider().map(keel_harness::Provider::default_key_env)
}

/// The account of an agent that names no `[[accounts]]` entry: its provider's key variable and
/// base-URL variable.
fn account_for(kind: HarnessKind, id: &str) -> Account {
    let credential = match credential_env(kind) {
        Some(var) => Credential::ApiKeyEnv(var.into()),
        None => Credential::None,
    };
    let base_url = kind
        .provider()
        .and_then(|p| std::env::var(p.base_url_env()).ok());
    Account {
        id: id.into(),
        base_url,
        credential,
    }
}

fn harness_for(kind: HarnessKind) -> anyhow::Result<Arc<dyn keel_harness::Harness>> {
    Ok(match kind {
        HarnessKind::ClaudeCode => Arc::new(CliHarness::new(
            keel_harness::cli::claude::ClaudeCode,
            CliConfig::default(),
        )),
        HarnessKind::Codex => Arc::new(CliHarness::new(
            keel_harness::cli::codex::Codex,
            CliConfig::default(),
        )),
        HarnessKind::Opencode => Arc::new(CliHarness::new(
            keel_harness::cli::opencode::Opencode,
            CliConfig::default(),
        )),
        HarnessKind::Pi => Arc::new(keel_harness::cli::pi::PiHarness::pi()),
        HarnessKind::MessagesApi => Arc::new(
            MessagesApiHarness::new(MessagesApiConfig::default())
                .context("building the messages-api client")?,
        ),
        HarnessKind::Scripted => Arc::new(ScriptedHarness::new(Script::rules())),
    })
}

impl NodeSetup {
    /// Whether a lead session can run for this node's runs: the lead is a session of the first
    /// agent (or the chosen one), and it needs keel's session tools, which pi sessions do not get.
    /// On a coordinator-only node the lead runs on a worker, which serves the tools itself.
    pub(crate) fn lead_capable(&self) -> bool {
        self.config.supervisor.agents.iter().any(|a| {
            HarnessKind::parse(&a.harness).is_some_and(|k| {
                self.harnesses.serves_session_tools(k)
                    || (self.sessions_elsewhere && k != HarnessKind::Pi)
            })
        })
    }
}

/// Build a node whose sessions run here ([`node_setup_for`] with [`SessionsHost::ThisNode`]).
pub(crate) async fn node_setup(
    config: &Config,
    choice: &HarnessChoice,
    work_dir: &Path,
    kept: Option<AgentProfile>,
) -> anyhow::Result<NodeSetup> {
    node_setup_for(
        config,
        choice,
        work_dir,
        kept,
        SessionsHost::ThisNode,
        PolicySource::KeelToml,
    )
    .await
}

/// Build the node: agents from keel.toml (narrowed by `--agent`), or one profile on `--harness`, or
/// the built-in scripted model over the native agent loop on a local model server; then `kept`, a
/// profile a run was hosted with ([`kept_profile`]), in place of any profile of the same name, with
/// its harness and account. keel's MCP endpoint starts only when `sessions` run on this node; the
/// sessions' tool calls are decided by `policy`.
pub(crate) async fn node_setup_for(
    config: &Config,
    choice: &HarnessChoice,
    work_dir: &Path,
    kept: Option<AgentProfile>,
    sessions: SessionsHost,
    policy: PolicySource,
) -> anyhow::Result<NodeSetup> {
    let mut rc = RuntimeConfig::default();
    let sup = &config.supervisor;
    rc.supervisor.specialists_max = sup.max_concurrent_specialists.get();
    rc.supervisor.depth_max = sup.max_depth;
    rc.supervisor.spawn_burst = sup.spawn_burst.get();
    rc.supervisor.spawn_interval_ms = 60_000 / u64::from(sup.spawns_per_minute.get()).max(1);
    rc.supervisor.subtask_timeout_ms = u64::from(sup.subtask_timeout_s.get()) * 1000;
    rc.specialist.working_dir = work_dir.to_path_buf();
    // The preamble caps of keel.toml's [context]; `keel context` reads the same section.
    rc.specialist.context = config.context.context_config();
    // The credentials keel reads, whether or not an agent uses them: a session that prints one
    // leaves none in the store (the runtime adds every account's own).
    for name in CREDENTIAL_ENV {
        if let Ok(value) = std::env::var(name) {
            // Shorter than six characters is not a credential: nothing to register.
            let _ = rc.specialist.scrubber.register_secret(&value);
        }
    }
    rc.stop_grace_ms = 5_000;

    let mut harnesses = HarnessSet::new();
    let mut server = None;
    let mut scripted = false;
    let mut agents: Vec<AgentProfile> = Vec::new();
    if let Some(kind) = choice.harness {
        let name = kind.as_str().to_string();
        let model = choice.model.clone().unwrap_or_else(|| match kind {
            HarnessKind::Scripted => SCRIPTED_MODEL.into(),
            HarnessKind::Codex | HarnessKind::Opencode | HarnessKind::Pi => "gpt-5".into(),
            _ => "claude-sonnet-4-5".into(),
        });
        agents.push(AgentProfile {
            name: name.clone(),
            description: format!("every task on {kind}"),
            harness: kind.as_str().into(),
            model,
            account: name.clone(),
            tools: Vec::new(),
            system_prompt: String::new(),
            limits: AgentLimits::default(),
        });
        harnesses = harnesses
            .with(kind, harness_for(kind)?)
            .with_account(account_for(kind, &name));
        scripted = kind == HarnessKind::Scripted;
    } else if !config.agents.is_empty() {
        for a in &config.agents {
            if choice.agent.as_ref().is_some_and(|n| n != &a.name) {
                continue;
            }
            let kind = a.harness;
            agents.push(profile(a));
            if harnesses.get(kind).is_none() {
                harnesses = harnesses.with(kind, harness_for(kind)?);
            }
            if config.account(a.account_name()).is_none() {
                harnesses = harnesses.with_account(account_for(kind, a.account_name()));
            }
        }
        if let Some(n) = &choice.agent
            && agents.is_empty()
        {
            bail!("no agent named {n:?} in keel.toml");
        }
        scripted = agents
            .iter()
            .all(|a| a.harness == HarnessKind::Scripted.as_str());
    }
    // A kept profile of the built-in scripted model needs its server, whatever is configured now.
    let kept_scripted = kept.as_ref().is_some_and(|p| p.account == SCRIPTED_ACCOUNT);
    let nothing_configured = agents.is_empty();
    if nothing_configured || kept_scripted {
        // Nothing configured: the scripted model, served over real HTTP on 127.0.0.1 to keel's own
        // agent loop, which runs real tools in the working directory.
        let base_url = match &choice.model_server {
            Some(url) => url.clone(),
            None => {
                let s = ModelServer::start(ModelServerConfig::new(Script::rules()))
                    .await
                    .context("starting the built-in scripted model server on 127.0.0.1")?;
                let url = s.base_url();
                server = Some(s);
                url
            }
        };
        agents.push(scripted_profile());
        harnesses = harnesses
            .with(
                HarnessKind::MessagesApi,
                harness_for(HarnessKind::MessagesApi)?,
            )
            .with_account(Account {
                id: SCRIPTED_ACCOUNT.into(),
                base_url: Some(base_url),
                credential: Credential::None,
            });
        scripted = scripted || nothing_configured;
    }
    if let Some(profile) = kept {
        let Some(kind) = HarnessKind::parse(&profile.harness) else {
            bail!(
                "the run's agent {:?} runs on harness {:?}, which this keel does not know",
                profile.name,
                profile.harness
            );
        };
        if harnesses.get(kind).is_none() {
            harnesses = harnesses.with(kind, harness_for(kind)?);
        }
        if !kept_scripted && config.account(&profile.account).is_none() {
            harnesses = harnesses.with_account(account_for(kind, &profile.account));
        }
        agents.retain(|a| a.name != profile.name);
        agents.push(profile);
    }
    rc.supervisor.agents = agents;
    // Every account of keel.toml, whether or not an agent names it: a rate-limited task moves to
    // another account of its provider (the supervisor's switch), and every account's key is
    // registered with the scrubbers below and by the runtime (issue 16).
    for account in &config.accounts {
        harnesses = harnesses.with_account(account.account());
    }
    rc.supervisor.accounts = config
        .accounts
        .iter()
        .map(|a| keel_actors::AccountRoute {
            name: a.name.clone(),
            provider: a.provider,
        })
        .collect();
    // keel's session tools for every session of a harness with an MCP client (issue 11), where
    // sessions run. Its answers and error bodies are scrubbed with the credentials this node
    // knows (issue 16).
    let session_tools_url = match sessions {
        SessionsHost::ThisNode => {
            let mut endpoint_config = keel_mcp::EndpointConfig {
                scrubber: rc.specialist.scrubber.clone(),
                ..keel_mcp::EndpointConfig::default()
            };
            for value in harnesses.credential_values() {
                let _ = endpoint_config.scrubber.register_secret(&value);
            }
            let endpoint = keel_mcp::McpEndpoint::start(endpoint_config)
                .await
                .context("starting keel's MCP endpoint on 127.0.0.1")?;
            let url = endpoint.url().to_string();
            harnesses = harnesses.with_session_endpoint(Arc::new(endpoint));
            Some(url)
        }
        SessionsHost::Workers => None,
    };
    // The report check of every session: keel's own loop runs it in process, a CLI with a Stop hook
    // runs `keel hook --report-for ...` (docs/HARNESSES.md says which can).
    let exe = std::env::current_exe().context("locating the keel executable for the hooks")?;
    harnesses = harnesses.with_service(Arc::new(crate::hook::stop::StopHookService {
        keel_exe: exe.clone(),
    }));
    // A policy in keel.toml turns the gate on for every session of this node: keel's own loop asks
    // the runtime's policy in process before and after every tool call, and each CLI's native hook
    // asks this node through `keel hook`, which calls the same policy.
    let local = config.policy().context("the policy in keel.toml")?;
    let policy = match policy {
        PolicySource::KeelToml if local.is_empty() => None,
        PolicySource::KeelToml => {
            let host = keel_actors::runtime::PolicyHost::new(local);
            harnesses = harnesses.with_service(host.service());
            let bridge = PolicyBridge::start(host, &exe).await?;
            harnesses = harnesses.with_service(bridge.service());
            Some(bridge)
        }
        // A worker: every session the coordinator's policy gates asks it, in process for keel's
        // own loop and through this node's bridge for a CLI.
        PolicySource::Coordinator(remote) => {
            if !local.is_empty() {
                tracing::warn!(
                    "this worker's keel.toml has a policy: it is not used, the coordinator node's policy decides the tool calls of the sessions hosted here"
                );
            }
            let decider: Arc<dyn keel_actors::runtime::PolicyDecider> = remote;
            harnesses =
                harnesses.with_service(keel_actors::runtime::guard_service(Arc::clone(&decider)));
            let bridge = PolicyBridge::start_for(decider, &exe).await?;
            harnesses = harnesses.with_service(bridge.service());
            Some(bridge)
        }
    };
    Ok(NodeSetup {
        harnesses,
        config: rc,
        scripted,
        _server: server,
        policy,
        session_tools_url,
        sessions_elsewhere: sessions == SessionsHost::Workers,
    })
}

/// The profile `task`'s assignee had in the run that holds it, as [`record_profiles`] stored it:
/// a follow-up on the task goes to that profile (its harness and its model; never the parent's
/// model). `None` when the task has no assignee or the run kept no profile of that name (a run
/// stored before runs kept their profiles).
///
/// # Errors
/// A failed read other than "not there".
pub(crate) fn kept_profile(store: &Store, task: &Task) -> anyhow::Result<Option<AgentProfile>> {
    let Some(name) = task.assignee.as_deref() else {
        return Ok(None);
    };
    match store.run(task.run_id).agent(name) {
        Ok(profile) => Ok(Some(profile)),
        Err(keel_store::ReadError::NotFound { .. }) => Ok(None),
        Err(e) => {
            Err(e).with_context(|| format!("reading agent profile {name:?} of run {}", task.run_id))
        }
    }
}

/// Store `profiles` with `run` (replacing any of the same name), durably, so that a follow-up or
/// a resume in another process finds each task's assignee with the harness and model it ran on,
/// an ad-hoc `--harness`/`--model` profile included. A failure is logged, not returned: the run
/// goes on, and a later follow-up without `--agent` then uses this home's profile of that name.
pub(crate) fn record_profiles(rt: &Runtime, run: RunId, profiles: &[AgentProfile]) {
    let store = match rt.store() {
        Ok(store) => store,
        Err(e) => {
            tracing::warn!(%run, "could not store the run's agent profiles: {e}");
            return;
        }
    };
    let scope = store.run(run);
    let mut batch = WriteBatch::new();
    for p in profiles {
        match scope.stage_put_agent(p.clone()) {
            Ok(write) => {
                batch.push(write);
            }
            Err(e) => tracing::warn!(%run, agent = %p.name, "not storing the agent profile: {e}"),
        }
    }
    if let Err(e) = store.commit_group(batch, Durability::Immediate) {
        tracing::warn!(%run, "could not store the run's agent profiles: {e}");
    }
}

/// The working directory specialists run in: the current directory, made absolute.
pub(crate) fn work_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::current_dir().context("reading the current directory")?;
    dir.canonicalize()
        .with_context(|| format!("resolving {}", dir.display()))
}
