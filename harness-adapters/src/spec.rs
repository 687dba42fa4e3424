//! What a caller asks a harness to do: one session, fully described up front.
//!
//! A `SessionSpec` is plain data (serde, no tokio) so the actor core can build it in a pure state
//! machine, persist it, and send it to a worker node. It deliberately has no field for a native
//! session id or resume handle: continuity comes from keel's own store through the preamble already
//! placed in `prompt` (docs/DESIGN.md §6), never from a harness transcript.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::error::StartError;
use crate::stop::{InProcessHooks, StopCheck};

/// Upper bound on the prompt a spec may carry, so a runaway preamble builder cannot hand a harness a
/// prompt no model accepts (1 MiB is far above the preamble caps of docs/DESIGN.md §6).
pub const PROMPT_BYTES_MAX: usize = 1 << 20;

/// Which executor runs a session. The supervisor picks one per attempt and may pick a different one
/// for the next attempt of the same task, which is why nothing else in the spec is harness-specific.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HarnessKind {
    /// Anthropic's Claude Code CLI (`claude -p`).
    ClaudeCode,
    /// OpenAI's Codex CLI (`codex exec`).
    Codex,
    /// The opencode CLI (`opencode run`).
    Opencode,
    /// The pi coding agent (`pi -p --mode json`).
    Pi,
    /// keel's own agent loop against an Anthropic-compatible Messages endpoint.
    MessagesApi,
    /// The deterministic scripted model, for the simulator, tests and offline runs.
    Scripted,
}

impl HarnessKind {
    /// Every kind, in a fixed order, so configuration and docs can enumerate them without drift.
    pub const ALL: [HarnessKind; 6] = [
        HarnessKind::ClaudeCode,
        HarnessKind::Codex,
        HarnessKind::Opencode,
        HarnessKind::Pi,
        HarnessKind::MessagesApi,
        HarnessKind::Scripted,
    ];

    /// The stable name used in configuration files, logs and the store.
    pub fn as_str(self) -> &'static str {
        match self {
            HarnessKind::ClaudeCode => "claude-code",
            HarnessKind::Codex => "codex",
            HarnessKind::Opencode => "opencode",
            HarnessKind::Pi => "pi",
            HarnessKind::MessagesApi => "messages-api",
            HarnessKind::Scripted => "scripted",
        }
    }

    /// Parses the stable name; `None` for anything else so configuration errors stay typed.
    pub fn parse(name: &str) -> Option<HarnessKind> {
        HarnessKind::ALL.into_iter().find(|k| k.as_str() == name)
    }

    /// Whose API keys its sessions use, as keel's adapters configure it: Anthropic's for Claude
    /// Code and keel's own loop, OpenAI's (or an OpenAI-compatible endpoint's) for Codex, opencode
    /// and pi; `None` for the scripted model, which needs no key. Accounts of one provider are
    /// interchangeable for these harnesses, which is what lets the supervisor move a rate-limited
    /// task to another account.
    pub fn provider(self) -> Option<Provider> {
        match self {
            HarnessKind::ClaudeCode | HarnessKind::MessagesApi => Some(Provider::Anthropic),
            HarnessKind::Codex | HarnessKind::Opencode | HarnessKind::Pi => Some(Provider::OpenAi),
            HarnessKind::Scripted => None,
        }
    }
}

/// The API family an account's key belongs to. Several accounts of one provider can serve the same
/// agents; the supervisor moves a task between them when one hits a rate limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Provider {
    /// Anthropic's Messages API (or a compatible endpoint).
    #[serde(rename = "anthropic")]
    Anthropic,
    /// OpenAI's APIs (or a compatible endpoint).
    #[serde(rename = "openai")]
    OpenAi,
}

impl fmt::Display for HarnessKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How much a session may do without asking. keel runs unattended, so no mode ever prompts a human;
/// the modes differ in what is refused. Each adapter maps this onto its CLI's own flags.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PermissionMode {
    /// Reads and read-only commands only; writes are refused.
    ReadOnly,
    /// Edits inside the working directory are allowed; this is what a coding specialist needs.
    #[default]
    AcceptEdits,
    /// Everything is allowed (for sandboxed workers only, e.g. a container per session).
    Bypass,
}

/// Ceilings for one session. A stop at a ceiling is a checkpoint, not a failure (docs/DESIGN.md §7), so
/// the limits are always finite: a spec cannot ask for an unbounded session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SessionLimits {
    /// Most model turns (requests) the session may make.
    pub turns_max: u32,
    /// Most tokens (input + output, as counted by [`crate::usage::UsageAccumulator`]).
    pub tokens_max: u64,
    /// Most wall-clock time from start to the last event, in milliseconds.
    pub wall_clock_ms_max: u64,
}

impl Default for SessionLimits {
    fn default() -> Self {
        SessionLimits {
            turns_max: 50,
            tokens_max: 2_000_000,
            wall_clock_ms_max: 30 * 60 * 1000,
        }
    }
}

/// A command run before each tool call to allow or deny it (docs/DESIGN.md §9). The adapter installs it
/// the way its harness supports (settings hook, plugin, extension, or in-loop for messages-api).
/// Contract: the tool call is described as JSON on stdin; exit 0 allows, exit 2 denies with stderr as
/// the reason; any other outcome denies (a mandatory gate fails closed).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GateCommand {
    /// The program to run (absolute, or found on PATH).
    pub program: String,
    /// Arguments, passed without a shell.
    pub args: Vec<String>,
    /// How long one check may take before it counts as a deny.
    pub timeout_ms: u64,
}

/// The MCP endpoint on the coordinator node that harness sessions call back into (docs/DESIGN.md §10).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct McpEndpoint {
    /// Name the tools appear under (e.g. `keel` gives `mcp__keel__report_progress` in Claude Code).
    pub server_name: String,
    /// Streamable HTTP URL of the endpoint.
    pub url: String,
    /// Name of the environment variable holding the bearer token; the token itself never sits in a
    /// spec, because specs are persisted and logged.
    pub bearer_token_env: Option<String>,
}

/// How the account's secret is passed to the harness. Only variable *names* and file paths live
/// here: specs are persisted and sent across nodes, secrets are not. [`Credential::secret`] reads
/// the secret when a session starts.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Credential {
    /// No key: local endpoints such as the scripted model server, or a CLI's own stored login.
    #[default]
    None,
    /// An API key sent as `x-api-key` (Anthropic) or a bearer token (OpenAI-style), read from this
    /// environment variable (looked up in the spec's `env` first, then the process environment).
    ApiKeyEnv(String),
    /// An OAuth-style bearer token (`Authorization: Bearer`), read from this environment variable.
    BearerTokenEnv(String),
    /// An API key (sent as [`Credential::ApiKeyEnv`]'s is), read from the first line of this file
    /// when the session starts; the file must be private to its owner
    /// ([`crate::credential::read_key_file`]).
    ApiKeyFile(PathBuf),
}

/// The account a session bills to. Several accounts let the supervisor spread load and route around
/// one account's rate limit; the id is what rate-limit bookkeeping is keyed by.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct Account {
    /// Stable id from configuration (e.g. `anthropic-team-a`).
    pub id: String,
    /// Endpoint override (e.g. `http://127.0.0.1:PORT` for the scripted model server); `None` uses
    /// the harness's default endpoint.
    pub base_url: Option<String>,
    /// How the secret reaches the harness.
    pub credential: Credential,
}

/// Everything one harness session needs. Built by the caller with every decision already made: the
/// preamble is placed, the model is resolved from the assignee's profile (never copied from a
/// parent), and the limits are set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionSpec {
    /// The full user prompt, with keel's preamble already placed (after line one when the first line
    /// is a slash skill). Adapters pass it verbatim.
    pub prompt: String,
    /// Text appended to the harness's own system prompt (never replacing it, so the harness keeps its
    /// tool instructions).
    pub append_system_prompt: Option<String>,
    /// The model id, resolved by the caller. Adapters pass it through unchanged.
    pub model: String,
    /// Directory the session works in; tools are confined to it where the harness allows.
    pub working_dir: PathBuf,
    /// Tools the session may use; empty means the harness's default set.
    pub allowed_tools: Vec<String>,
    /// Tools removed from the session even if allowed.
    pub disallowed_tools: Vec<String>,
    /// What the session may do without asking.
    pub permission_mode: PermissionMode,
    /// Extra environment for the harness process (ordered, so argv/env recordings are reproducible).
    pub env: BTreeMap<String, String>,
    /// Ceilings on turns, tokens and wall-clock.
    pub limits: SessionLimits,
    /// Optional command that checks each tool call before it runs.
    pub pre_tool_gate: Option<GateCommand>,
    /// The command a CLI's native `PostToolUse` hook runs after each call (docs/HARNESSES.md,
    /// "Policy hooks"): the result goes to keel's policy (a success meets a prerequisite or issues a
    /// token; `PostToolUse` hooks may rewrite or withhold it). The adapter appends
    /// `--post-for <harness>` (`cli::post_tool::post_command`), so the command reads that CLI's
    /// payload and prints that CLI's answer. Set by the host only when the policy needs results;
    /// keel's own loop ignores it (it hands results to the policy in process).
    #[serde(default)]
    pub post_tool_hook: Option<GateCommand>,
    /// Optional MCP endpoint exposing keel's coordination tools to the session.
    pub mcp_endpoint: Option<McpEndpoint>,
    /// The account to bill and authenticate as.
    pub account: Account,
    /// The Stop hook's report check: what the final text must be before the session may end
    /// (docs/DESIGN.md §9); `None` ends it on whatever it says.
    #[serde(default)]
    pub stop_check: Option<StopCheck>,
    /// The command a CLI's native Stop hook runs for `stop_check` (the session's last message on
    /// stdin as `last_assistant_message`; it prints a `block` decision with the re-ask). Set by the
    /// host; harnesses without a Stop hook ignore it.
    #[serde(default)]
    pub stop_gate: Option<GateCommand>,
    /// The command a CLI's native session-event hooks run (docs/HARNESSES.md, "Policy hooks"):
    /// today `PreCompact`, a CLI about to compact its own context. The adapter appends
    /// `--event-for <harness>` (`cli::session_event::event_command`), so the command reads that
    /// CLI's payload and answers the CLI's way: a veto blocks the compaction, a note goes into its
    /// instructions. Set by the host only when the policy has hooks for such an event; harnesses
    /// without the event (and keel's own loop, which never compacts) ignore it.
    #[serde(default)]
    pub session_event_hook: Option<GateCommand>,
    /// The agent profile the session runs as (empty when none): whose rules the policy applies
    /// to its tool calls (docs/DESIGN.md §9). Harnesses ignore it.
    #[serde(default)]
    pub agent: String,
    /// What the host hands keel's own loop in process (the Stop hook's judge, the policy's tool
    /// guard). Never serialised.
    #[serde(skip)]
    pub in_process: InProcessHooks,
}

impl SessionSpec {
    /// A spec with defaults for everything but the essentials, for tests and simple embedders.
    pub fn new(
        prompt: impl Into<String>,
        model: impl Into<String>,
        working_dir: impl Into<PathBuf>,
    ) -> Self {
        SessionSpec {
            prompt: prompt.into(),
            append_system_prompt: None,
            model: model.into(),
            working_dir: working_dir.into(),
            allowed_tools: Vec::new(),
            disallowed_tools: Vec::new(),
            permission_mode: PermissionMode::default(),
            env: BTreeMap::new(),
            limits: SessionLimits::default(),
            pre_tool_gate: None,
            post_tool_hook: None,
            mcp_endpoint: None,
            account: Account::default(),
            stop_check: None,
            stop_gate: None,
            session_event_hook: None,
            agent: String::new(),
            in_process: InProcessHooks::default(),
        }
    }

    /// Checks what every adapter relies on, so a bad spec fails before any process or request.
    ///
    /// # Errors
    /// [`StartError::InvalidSpec`] naming the first problem found.
    pub fn validate(&self) -> Result<(), StartError> {
        let invalid = |why: &str| Err(StartError::InvalidSpec(why.to_owned()));
        if self.prompt.trim().is_empty() {
            return invalid("prompt is empty");
        }
        if self.prompt.len() > PROMPT_BYTES_MAX {
            return invalid("prompt exceeds PROMPT_BYTES_MAX");
        }
        if self.model.trim().is_empty() {
            return invalid("model is empty (the caller must resolve it)");
        }
        if !self.working_dir.is_absolute() {
            return invalid("working_dir must be absolute");
        }
        if self.limits.turns_max == 0
            || self.limits.tokens_max == 0
            || self.limits.wall_clock_ms_max == 0
        {
            return invalid("limits must all be positive");
        }
        if let Some(gate) = &self.pre_tool_gate
            && (gate.program.trim().is_empty() || gate.timeout_ms == 0)
        {
            return invalid("pre_tool_gate needs a program and a positive timeout");
        }
        if let Some(hook) = &self.post_tool_hook
            && (hook.program.trim().is_empty() || hook.timeout_ms == 0)
        {
            return invalid("post_tool_hook needs a program and a positive timeout");
        }
        if let Some(hook) = &self.session_event_hook
            && (hook.program.trim().is_empty() || hook.timeout_ms == 0)
        {
            return invalid("session_event_hook needs a program and a positive timeout");
        }
        Ok(())
    }

    /// Resolves an environment variable the way adapters must: the spec's `env` first, then the
    /// process environment. Keeps secret lookup in one place.
    pub fn env_var(&self, name: &str) -> Option<String> {
        self.env
            .get(name)
            .cloned()
            .or_else(|| std::env::var(name).ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kind_names_round_trip() {
        for kind in HarnessKind::ALL {
            assert_eq!(HarnessKind::parse(kind.as_str()), Some(kind));
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.as_str()));
        }
        assert_eq!(HarnessKind::parse("claude"), None);
    }

    #[test]
    fn validate_rejects_bad_specs() {
        let ok = SessionSpec::new("do it", "m", "/srv/example");
        assert!(ok.validate().is_ok());
        let mut s = ok.clone();
        s.prompt = "  ".into();
        assert!(s.validate().is_err());
        let mut s = ok.clone();
        s.model.clear();
        assert!(s.validate().is_err());
        let mut s = ok.clone();
        s.working_dir = "relative".into();
        assert!(s.validate().is_err());
        let mut s = ok.clone();
        s.limits.turns_max = 0;
        assert!(s.validate().is_err());
    }
}
