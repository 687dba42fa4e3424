//! `keel.toml`: the configuration of one keel home. Every key is documented in `docs/CONFIG.md`.
//!
//! Parsing is strict: an unknown key is an error (a typo must not silently fall back to a default), and
//! every invalid value is refused by the type it is read into, so the error names the key, the file and
//! the line.

use std::num::NonZeroU32;
use std::path::{Path, PathBuf};

use keel_harness::{Credential, HarnessKind, Provider};
use serde::{Deserialize, Deserializer, Serialize};

/// The longest keel.toml read. A configuration is a few kilobytes; a larger file is a mistake.
const CONFIG_BYTES_MAX: u64 = 1024 * 1024;

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct Config {
    /// Where the store lives.
    pub(crate) store: StoreSection,
    /// How keel logs.
    pub(crate) log: LogSection,
    /// The supervisor's limits.
    pub(crate) supervisor: SupervisorSection,
    /// Agent profiles.
    pub(crate) agents: Vec<AgentSection>,
    /// `[[accounts]]`: the accounts sessions bill to, several per provider.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) accounts: Vec<AccountSection>,
    /// `[[hooks]]`: checks run before tool calls (keel-policy; docs/CONFIG.md).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) hooks: Vec<keel_policy::HookConfig>,
    /// `[permissions]`: deny, ask and allow rules and the permission mode.
    pub(crate) permissions: keel_policy::PermissionsConfig,
    /// `[[gates]]`: checks on allowed calls from the store (count, prerequisite, token, cap).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) gates: Vec<keel_policy::GateConfig>,
    /// The HTTP API of `keel serve`.
    pub(crate) server: ServerSection,
    /// `keel node`'s cluster settings.
    pub(crate) node: crate::node_cmd::NodeSection,
    /// `[context]`: the preamble budgets, the same for the runtime and `keel context`.
    pub(crate) context: ContextSection,
}

/// `[context]`: the caps of the two preambles (docs/DESIGN.md §6), in tokens of four characters.
/// The runtime's sessions and `keel context` read them from here, so what `keel context` prints is
/// what a session gets.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct ContextSection {
    /// Cap of the standard preamble (a follow-up's, a derived task's), in tokens.
    pub(crate) standard_tokens_max: u32,
    /// Cap of the resume preamble (a crashed, paused or retried task's), in tokens.
    pub(crate) resume_tokens_max: u32,
}

impl Default for ContextSection {
    fn default() -> Self {
        let d = keel_actors::context::ContextConfig::default();
        Self {
            standard_tokens_max: d.standard_tokens_max,
            resume_tokens_max: d.resume_tokens_max,
        }
    }
}

impl ContextSection {
    /// The builders' limits with these caps (every other limit at its default).
    pub(crate) fn context_config(&self) -> keel_actors::context::ContextConfig {
        keel_actors::context::ContextConfig {
            standard_tokens_max: self.standard_tokens_max,
            resume_tokens_max: self.resume_tokens_max,
            ..keel_actors::context::ContextConfig::default()
        }
    }
}

/// `[server]`: the HTTP API `keel serve` answers on (docs/API.md).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct ServerSection {
    /// The address to bind, `IP:PORT` (an explicit interface: never every interface unless told).
    pub(crate) listen: std::net::SocketAddr,
    /// The file of accepted bearer tokens (one a line), relative to the keel home unless absolute.
    /// It must not be readable or writable by group or others.
    pub(crate) token_file: PathBuf,
    /// The largest request body accepted, in bytes.
    #[serde(deserialize_with = "body_bytes")]
    pub(crate) body_bytes_max: u32,
    /// The API's certificate chain (PEM): with `tls_key`, the API answers TLS only (https).
    /// Relative to the keel home unless absolute.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The private key of `tls_cert` (PEM, mode 600 or stricter).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tls_key: Option<PathBuf>,
    /// The CA certificates (PEM) that local commands on this home trust when they reach the
    /// server over https (a private CA); `$KEEL_API_CA_FILE` wins. Without either, the
    /// platform's roots.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tls_ca: Option<PathBuf>,
}

/// The port `keel serve` listens on when keel.toml names none.
pub(crate) const SERVER_PORT_DEFAULT: u16 = 7777;
/// The token file's name in the home when keel.toml names none.
pub(crate) const TOKEN_FILE_DEFAULT: &str = "api-token";
/// The largest request body accepted by default: a brief (64 KiB) and a plan fit many times over.
const BODY_BYTES_DEFAULT: u32 = 1024 * 1024;
/// The largest `body_bytes_max` allowed: a request bigger than this is a mistake or an attack.
const BODY_BYTES_LIMIT: u32 = 64 * 1024 * 1024;

impl Default for ServerSection {
    fn default() -> Self {
        Self {
            listen: std::net::SocketAddr::from(([127, 0, 0, 1], SERVER_PORT_DEFAULT)),
            token_file: PathBuf::from(TOKEN_FILE_DEFAULT),
            body_bytes_max: BODY_BYTES_DEFAULT,
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
        }
    }
}

fn body_bytes<'de, D: Deserializer<'de>>(d: D) -> Result<u32, D::Error> {
    let v = u32::deserialize(d)?;
    if !(1024..=BODY_BYTES_LIMIT).contains(&v) {
        return Err(serde::de::Error::custom(format!(
            "body_bytes_max must be between 1024 and {BODY_BYTES_LIMIT}, not {v}"
        )));
    }
    Ok(v)
}

/// `[store]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct StoreSection {
    /// The redb file, relative to the keel home unless absolute.
    pub(crate) path: PathBuf,
}

impl Default for StoreSection {
    fn default() -> Self {
        Self {
            path: PathBuf::from(crate::home::STORE_FILE),
        }
    }
}

/// `[log]`.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct LogSection {
    /// Human-readable lines or one JSON object a line (`--log-format` overrides it).
    pub(crate) format: LogFormat,
    /// Which log lines are written, as a `tracing` filter (`warn`, `info`, `keel_actors=debug`);
    /// `KEEL_LOG` or `RUST_LOG` override it. Checked when the file is read.
    #[serde(deserialize_with = "log_filter")]
    pub(crate) level: String,
}

/// The filter keel logs with when nothing sets one: warnings and errors only, so the live view and
/// the summary are what a person reads.
pub(crate) const LOG_LEVEL_DEFAULT: &str = "warn";

impl Default for LogSection {
    fn default() -> Self {
        Self {
            format: LogFormat::default(),
            level: LOG_LEVEL_DEFAULT.to_owned(),
        }
    }
}

fn log_filter<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    let v = String::deserialize(d)?;
    tracing_subscriber::EnvFilter::builder()
        .parse(&v)
        .map_err(|e| serde::de::Error::custom(format!("level {v:?} is not a log filter: {e}")))?;
    Ok(v)
}

/// The log formats keel writes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LogFormat {
    /// For people at a terminal.
    #[default]
    Human,
    /// For log collectors.
    Json,
}

/// `[supervisor]`: the limits every spawn is admitted against (docs/DESIGN.md §4).
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct SupervisorSection {
    /// Most specialists running at once.
    pub(crate) max_concurrent_specialists: NonZeroU32,
    /// Deepest nesting of delegated tasks (a root is depth 0).
    #[serde(deserialize_with = "depth")]
    pub(crate) max_depth: u8,
    /// Spawns admitted per minute.
    pub(crate) spawns_per_minute: NonZeroU32,
    /// Spawns admitted at once before the rate applies.
    pub(crate) spawn_burst: NonZeroU32,
    /// One run's spend budget in US dollars; `None` means no budget.
    #[serde(deserialize_with = "dollars", skip_serializing_if = "Option::is_none")]
    pub(crate) run_budget_usd: Option<f64>,
    /// Per-subtask timeout in seconds.
    pub(crate) subtask_timeout_s: NonZeroU32,
}

impl Default for SupervisorSection {
    fn default() -> Self {
        Self {
            max_concurrent_specialists: NonZeroU32::new(20).unwrap_or(NonZeroU32::MIN),
            max_depth: 3,
            spawns_per_minute: NonZeroU32::new(120).unwrap_or(NonZeroU32::MIN),
            spawn_burst: NonZeroU32::new(20).unwrap_or(NonZeroU32::MIN),
            run_budget_usd: None,
            subtask_timeout_s: NonZeroU32::new(900).unwrap_or(NonZeroU32::MIN),
        }
    }
}

/// The deepest nesting keel accepts at all: deeper trees are a runaway, not a plan.
const DEPTH_MAX: u8 = 16;

fn depth<'de, D: Deserializer<'de>>(d: D) -> Result<u8, D::Error> {
    let v = u8::deserialize(d)?;
    if v == 0 || v > DEPTH_MAX {
        return Err(serde::de::Error::custom(format!(
            "max_depth must be between 1 and {DEPTH_MAX}, not {v}"
        )));
    }
    Ok(v)
}

fn dollars<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
    let v = f64::deserialize(d)?;
    if !v.is_finite() || v < 0.0 {
        return Err(serde::de::Error::custom(format!(
            "run_budget_usd must be a non-negative number of dollars, not {v}"
        )));
    }
    Ok(Some(v))
}

/// `[[agents]]`: who can be assigned a task. A derived task takes its model from its assignee's profile.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AgentSection {
    /// The name tasks are assigned to.
    pub(crate) name: String,
    /// What the agent is for (shown to a lead agent choosing whom to delegate to).
    #[serde(default)]
    pub(crate) description: String,
    /// Which harness runs its sessions, by its stable name (`claude-code`, `codex`, ...): the
    /// harness crate's own [`HarnessKind`], so configuration, the store and the adapters share one
    /// vocabulary.
    pub(crate) harness: HarnessKind,
    /// The model its sessions use.
    pub(crate) model: String,
    /// The `[[accounts]]` entry its sessions bill to; `None`: its harness's provider variable
    /// (`ANTHROPIC_API_KEY`, `OPENAI_API_KEY`) under the account name `default`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) account: Option<String>,
    /// The tools it may use (with a policy, a call of any other tool is denied by the chain).
    #[serde(default)]
    pub(crate) tools: Vec<String>,
    /// Its permission mode for the policy's chain, over `[permissions] mode` and the session's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) permission_mode: Option<keel_harness::PermissionMode>,
    /// Its own deny, ask and allow rules, after the policy's (`rules = { deny = [...] }`).
    #[serde(default, skip_serializing_if = "is_default_rules")]
    pub(crate) rules: keel_policy::RuleListsConfig,
    /// Appended to the harness's system prompt.
    #[serde(default)]
    pub(crate) system_prompt: String,
    /// Most model turns per session.
    #[serde(default)]
    pub(crate) max_turns: Option<NonZeroU32>,
}

fn is_default_rules(rules: &keel_policy::RuleListsConfig) -> bool {
    *rules == keel_policy::RuleListsConfig::default()
}

/// The N of a field named `prefixN]...` (`gates[2].rule`), 0 when unreadable.
fn table_index(field: &str, prefix: &str) -> usize {
    field[prefix.len()..]
        .split(']')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The account name of an agent that names none: its credential is its provider's variable.
pub(crate) const DEFAULT_ACCOUNT: &str = "default";

impl AgentSection {
    /// The account name its sessions bill to.
    pub(crate) fn account_name(&self) -> &str {
        self.account.as_deref().unwrap_or(DEFAULT_ACCOUNT)
    }
}

/// `[[accounts]]`: one account of a provider and where its key comes from. keel.toml holds only
/// the name of an environment variable or the path of a private file, never the key itself.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AccountSection {
    /// Its name: what agents name in `account`, and what logs and `keel show` say an attempt
    /// billed to.
    pub(crate) name: String,
    /// Whose API the key is for: `anthropic` (Claude Code, messages-api) or `openai` (Codex,
    /// opencode, pi).
    pub(crate) provider: Provider,
    /// The endpoint, when not the provider's default (a gateway, a proxy, the scripted model
    /// server); without it, `ANTHROPIC_BASE_URL` or `OPENAI_BASE_URL` when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) base_url: Option<String>,
    /// The environment variable holding the API key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) key_env: Option<String>,
    /// The environment variable holding a bearer token (gateways; Claude Code's
    /// `ANTHROPIC_AUTH_TOKEN`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) token_env: Option<String>,
    /// A file holding the API key on its first line, private to its owner (mode 600 or 400);
    /// relative to the keel home unless absolute.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) key_file: Option<PathBuf>,
}

/// The longest account name: it appears in log rows, task rows and escalations.
const ACCOUNT_NAME_CHARS_MAX: usize = 64;

impl AccountSection {
    /// Where its key comes from (a validated section names exactly one place).
    pub(crate) fn credential(&self) -> Credential {
        match (&self.key_env, &self.token_env, &self.key_file) {
            (Some(var), _, _) => Credential::ApiKeyEnv(var.clone()),
            (None, Some(var), _) => Credential::BearerTokenEnv(var.clone()),
            (None, None, Some(path)) => Credential::ApiKeyFile(path.clone()),
            (None, None, None) => Credential::None,
        }
    }

    /// The account as the harnesses take it: its endpoint (else the provider's `*_BASE_URL`
    /// variable, when set) and its credential.
    pub(crate) fn account(&self) -> keel_harness::Account {
        keel_harness::Account {
            id: self.name.clone(),
            base_url: self
                .base_url
                .clone()
                .or_else(|| std::env::var(self.provider.base_url_env()).ok()),
            credential: self.credential(),
        }
    }

    /// What is wrong with this section, as `(key, message)`: the message never repeats a value
    /// that could be a key written where a variable's name belongs.
    fn problem(&self) -> Option<(&'static str, String)> {
        let name_ok = !self.name.is_empty()
            && self.name.chars().count() <= ACCOUNT_NAME_CHARS_MAX
            && self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
        if !name_ok {
            return Some((
                "name",
                format!(
                    "must be 1 to {ACCOUNT_NAME_CHARS_MAX} ASCII letters, digits, '.', '_' or '-'"
                ),
            ));
        }
        let places = [
            self.key_env.is_some(),
            self.token_env.is_some(),
            self.key_file.is_some(),
        ];
        if places.iter().filter(|p| **p).count() != 1 {
            return Some((
                "key_env",
                "name exactly one of key_env, token_env or key_file: where the key is, never the \
                 key itself"
                    .into(),
            ));
        }
        for (key, var) in [("key_env", &self.key_env), ("token_env", &self.token_env)] {
            if let Some(var) = var
                && !is_env_name(var)
            {
                return Some((
                    key,
                    "is not an environment variable name (letters, digits and '_', not starting \
                     with a digit): name the variable that holds the key, never the key itself"
                        .into(),
                ));
            }
        }
        if self
            .key_file
            .as_ref()
            .is_some_and(|p| p.as_os_str().is_empty())
        {
            return Some(("key_file", "is empty".into()));
        }
        if let Some(url) = &self.base_url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Some((
                "base_url",
                format!("{url:?} is not an http:// or https:// URL"),
            ));
        }
        None
    }
}

fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Why keel.toml could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConfigError {
    /// The file could not be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// The file is larger than any real configuration.
    #[error("{} is {size} bytes; keel reads at most {CONFIG_BYTES_MAX}", path.display())]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        size: u64,
    },
    /// A key is unknown, a value invalid, or the TOML malformed. The message names the key and line.
    #[error("{}:{line}: {message}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The 1-based line of the offending key or value (0 when the parser gave no position).
        line: usize,
        /// What is wrong, as the parser said it.
        message: String,
    },
    /// A hook or permission rule is invalid; `field` names it (`hooks[1].timeout_ms`).
    #[error("{}:{line}: {source}", path.display())]
    Policy {
        /// The file.
        path: PathBuf,
        /// The line of the `[[hooks]]` table or `[permissions]` section concerned (0 if unknown).
        line: usize,
        /// The field and what is wrong with it.
        source: keel_policy::PolicyConfigError,
    },
    /// A preamble cap of `[context]` outside what the builders accept.
    #[error("{}:{line}: [context]: {source}", path.display())]
    Context {
        /// The file.
        path: PathBuf,
        /// The line of the `[context]` table.
        line: usize,
        /// Which cap, and its range.
        source: keel_actors::context::ContextConfigError,
    },
    /// An `[[accounts]]` entry, or an agent's `account`, is invalid; `field` names the key
    /// (`accounts[1].key_env`, `agents[0].account`).
    #[error("{}:{line}: {field}: {message}", path.display())]
    Account {
        /// The file.
        path: PathBuf,
        /// The line of the `[[accounts]]` or `[[agents]]` table concerned (0 if unknown).
        line: usize,
        /// The key, with the table's index.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// Two agent profiles share a name, so assignment would be ambiguous.
    #[error("{}:{line}: agent name {name:?} is used twice", path.display())]
    DuplicateAgent {
        /// The file.
        path: PathBuf,
        /// The line of the second profile.
        line: usize,
        /// The name.
        name: String,
    },
}

impl Config {
    /// Reads and validates a keel.toml. A missing file is the default configuration: `keel init`
    /// writes one, but a hand-made home without it still works.
    pub(crate) fn load(path: &Path) -> Result<Self, ConfigError> {
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(source) => {
                return Err(ConfigError::Read {
                    path: path.into(),
                    source,
                });
            }
        };
        if meta.len() > CONFIG_BYTES_MAX {
            return Err(ConfigError::TooLarge {
                path: path.into(),
                size: meta.len(),
            });
        }
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.into(),
            source,
        })?;
        let mut config = Self::parse(&text, path)?;
        // A relative key file is in the keel home, the folder of keel.toml.
        let home = path.parent().unwrap_or(Path::new("."));
        for account in &mut config.accounts {
            if let Some(file) = &mut account.key_file
                && file.is_relative()
            {
                *file = home.join(&*file);
            }
        }
        Ok(config)
    }

    /// The keys of the `[[accounts]]` that are set (from their variables or files), for the
    /// scrubbers; a missing one is left out (`keel doctor` names it).
    pub(crate) fn account_secrets(&self) -> Vec<String> {
        self.accounts
            .iter()
            .filter_map(|a| a.credential().secret(|var| std::env::var(var).ok()).ok())
            .flatten()
            .collect()
    }

    /// The `[[accounts]]` entry named `name`.
    pub(crate) fn account(&self, name: &str) -> Option<&AccountSection> {
        self.accounts.iter().find(|a| a.name == name)
    }

    /// Checks `[[accounts]]` and every agent's `account` against them.
    fn check_accounts(&self, text: &str, path: &Path) -> Result<(), ConfigError> {
        let bad = |table: &str, i: usize, key: &str, message: String| ConfigError::Account {
            path: path.into(),
            line: nth_line_starting(text, &format!("[[{table}]]"), i),
            field: format!("{table}[{i}].{key}"),
            message,
        };
        let mut seen = std::collections::BTreeSet::new();
        for (i, account) in self.accounts.iter().enumerate() {
            if let Some((key, message)) = account.problem() {
                return Err(bad("accounts", i, key, message));
            }
            if !seen.insert(account.name.as_str()) {
                let message = format!("{:?} is used twice", account.name);
                return Err(bad("accounts", i, "name", message));
            }
        }
        for (i, agent) in self.agents.iter().enumerate() {
            let Some(name) = &agent.account else {
                continue;
            };
            let Some(provider) = agent.harness.provider() else {
                let message = format!("harness {} uses no account; remove the key", agent.harness);
                return Err(bad("agents", i, "account", message));
            };
            let Some(account) = self.account(name) else {
                let message = format!(
                    "no [[accounts]] entry is named {name:?} (leave `account` out to use {})",
                    provider.default_key_env()
                );
                return Err(bad("agents", i, "account", message));
            };
            if account.provider != provider {
                let message = format!(
                    "account {name:?} is an {} account; harness {} needs an {provider} one",
                    account.provider, agent.harness
                );
                return Err(bad("agents", i, "account", message));
            }
        }
        Ok(())
    }

    /// Parses and validates keel.toml text; `path` is only for messages.
    pub(crate) fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|e| ConfigError::Invalid {
            path: path.into(),
            line: e.span().map_or(0, |s| line_of(text, s.start)),
            message: e.message().to_string(),
        })?;
        let mut seen = std::collections::BTreeSet::new();
        for agent in &config.agents {
            if !seen.insert(agent.name.as_str()) {
                let needle = format!("\"{}\"", agent.name);
                let line = text
                    .match_indices(&needle)
                    .nth(1)
                    .map_or(0, |(at, _)| line_of(text, at));
                return Err(ConfigError::DuplicateAgent {
                    path: path.into(),
                    line,
                    name: agent.name.clone(),
                });
            }
        }
        config.check_accounts(text, path)?;
        if let Err(source) = config.context.context_config().validate() {
            return Err(ConfigError::Context {
                path: path.into(),
                line: nth_line_starting(text, "[context]", 0),
                source,
            });
        }
        if let Err(source) = config.policy_config().build() {
            let line = match source.hook_index {
                Some(i) => nth_line_starting(text, "[[hooks]]", i),
                None if source.field.starts_with("gates[") => {
                    nth_line_starting(text, "[[gates]]", table_index(&source.field, "gates["))
                }
                None if source.field.starts_with("agents[") => {
                    nth_line_starting(text, "[[agents]]", table_index(&source.field, "agents["))
                }
                None => nth_line_starting(text, "[permissions]", 0),
            };
            return Err(ConfigError::Policy {
                path: path.into(),
                line,
                source,
            });
        }
        Ok(config)
    }

    /// The policy sections, as keel-policy reads them.
    pub(crate) fn policy_config(&self) -> keel_policy::PolicyConfig {
        keel_policy::PolicyConfig {
            hooks: self.hooks.clone(),
            permissions: self.permissions.clone(),
            gates: self.gates.clone(),
            agents: self
                .agents
                .iter()
                .map(|a| keel_policy::AgentRulesConfig {
                    name: a.name.clone(),
                    permission_mode: a.permission_mode,
                    rules: a.rules.clone(),
                })
                .collect(),
        }
    }

    /// The validated policy of this configuration (checked by [`Config::parse`]).
    ///
    /// # Errors
    /// The invalid field, for a configuration built other than by parsing.
    pub(crate) fn policy(&self) -> Result<keel_policy::Policy, keel_policy::PolicyConfigError> {
        self.policy_config().build()
    }
}

/// The 1-based line of the `n`th (0-based) line that starts with `header`, or 0.
fn nth_line_starting(text: &str, header: &str, n: usize) -> usize {
    text.lines()
        .enumerate()
        .filter(|(_, l)| l.trim_start().starts_with(header))
        .nth(n)
        .map_or(0, |(i, _)| i + 1)
}

fn line_of(text: &str, byte: usize) -> usize {
    let end = byte.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|b| **b == b'\n')
        .count()
        + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_err(text: &str, line: usize, needle: &str) {
        match Config::parse(text, Path::new("keel.toml")) {
            Ok(c) => panic!("accepted {text:?} as {c:?}"),
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    msg.starts_with(&format!("keel.toml:{line}: ")),
                    "wrong line in {msg:?}"
                );
                assert!(msg.contains(needle), "{msg:?} lacks {needle:?}");
            }
        }
    }

    #[test]
    fn the_template_written_by_init_parses_to_the_defaults() {
        let c = Config::parse(include_str!("keel.toml"), Path::new("keel.toml")).unwrap();
        assert_eq!(c, Config::default());
    }

    #[test]
    fn every_documented_key_parses() {
        let c = Config::parse(
            r#"
[store]
path = "elsewhere.redb"
[log]
format = "json"
level = "info,keel_actors=debug"
[supervisor]
max_concurrent_specialists = 4
max_depth = 2
spawns_per_minute = 10
spawn_burst = 2
run_budget_usd = 1.5
subtask_timeout_s = 60
[[agents]]
name = "reviewer"
description = "reviews diffs"
harness = "claude-code"
model = "claude-opus-4-8"
account = "team"
tools = ["Read"]
system_prompt = "be terse"
max_turns = 8
[[accounts]]
name = "team"
provider = "anthropic"
base_url = "https://gateway.example/anthropic"
key_env = "ANTHROPIC_KEY_TEAM"
[[accounts]]
name = "team-b"
provider = "anthropic"
key_file = "keys/team-b"
[[accounts]]
name = "openai-gw"
provider = "openai"
token_env = "GATEWAY_TOKEN"
[server]
listen = "127.0.0.1:9000"
token_file = "/etc/keel/token"
body_bytes_max = 65536
"#,
            Path::new("keel.toml"),
        )
        .unwrap();
        assert_eq!(c.log.format, LogFormat::Json);
        assert_eq!(c.log.level, "info,keel_actors=debug");
        assert_eq!(c.supervisor.max_depth, 2);
        assert_eq!(c.supervisor.run_budget_usd, Some(1.5));
        assert_eq!(c.agents[0].harness, HarnessKind::ClaudeCode);
        assert_eq!(c.agents[0].max_turns.map(NonZeroU32::get), Some(8));
        assert_eq!(c.agents[0].account_name(), "team");
        assert_eq!(c.accounts.len(), 3);
        assert_eq!(
            c.accounts[0].credential(),
            Credential::ApiKeyEnv("ANTHROPIC_KEY_TEAM".into())
        );
        assert_eq!(
            c.accounts[0].account().base_url.as_deref(),
            Some("https://gateway.example/anthropic")
        );
        assert_eq!(
            c.accounts[1].credential(),
            Credential::ApiKeyFile("keys/team-b".into())
        );
        assert_eq!(c.accounts[2].provider, Provider::OpenAi);
        assert_eq!(
            c.accounts[2].credential(),
            Credential::BearerTokenEnv("GATEWAY_TOKEN".into())
        );
        assert_eq!(c.server.listen.port(), 9000);
        assert_eq!(c.server.token_file, Path::new("/etc/keel/token"));
        assert_eq!(c.server.body_bytes_max, 65_536);
    }

    #[test]
    fn an_unknown_key_is_named_with_its_line() {
        check_err("[supervisor]\nmax_depth = 2\nmax_dept = 3\n", 3, "max_dept");
    }

    #[test]
    fn an_unknown_section_is_named_with_its_line() {
        check_err("\n\n[supervisr]\nmax_depth = 2\n", 3, "supervisr");
    }

    #[test]
    fn invalid_values_are_refused_with_their_line() {
        check_err(
            "[supervisor]\n\nmax_concurrent_specialists = 0\n",
            3,
            "nonzero",
        );
        check_err("[supervisor]\nmax_depth = 40\n", 2, "between 1 and 16");
        check_err("[supervisor]\nrun_budget_usd = -1.0\n", 2, "non-negative");
        check_err("[log]\nformat = \"yaml\"\n", 2, "yaml");
        check_err("[server]\nbody_bytes_max = 10\n", 2, "between 1024");
        check_err("[server]\nlisten = \"localhost\"\n", 2, "");
        check_err("[log]\nlevel = \"keel=loud\"\n", 2, "not a log filter");
        check_err(
            "[[agents]]\nname = \"a\"\nharness = \"gpt\"\nmodel = \"m\"\n",
            3,
            "gpt",
        );
    }

    #[test]
    fn an_agent_without_a_model_is_refused() {
        check_err("[[agents]]\nname = \"a\"\nharness = \"pi\"\n", 1, "model");
    }

    #[test]
    fn duplicate_agent_names_are_refused_at_the_second() {
        let text = "[[agents]]\nname = \"a\"\nharness = \"pi\"\nmodel = \"m\"\n\n[[agents]]\nname = \"a\"\nharness = \"codex\"\nmodel = \"m\"\n";
        check_err(text, 7, "used twice");
    }

    const ACCOUNT_A: &str =
        "[[accounts]]\nname = \"a\"\nprovider = \"anthropic\"\nkey_env = \"KEY_A\"\n";

    #[test]
    fn an_agent_names_an_account_of_its_provider() {
        let text = format!(
            "{ACCOUNT_A}\n[[agents]]\nname = \"x\"\nharness = \"claude-code\"\nmodel = \"m\"\naccount = \"a\"\n"
        );
        let c = Config::parse(&text, Path::new("keel.toml")).unwrap();
        assert_eq!(
            c.account("a").map(|a| a.provider),
            Some(Provider::Anthropic)
        );
        // Without `account` an agent keeps its provider's variable, under the name "default".
        let c = Config::parse(
            "[[agents]]\nname = \"x\"\nharness = \"codex\"\nmodel = \"m\"\n",
            Path::new("keel.toml"),
        )
        .unwrap();
        assert_eq!(c.agents[0].account_name(), DEFAULT_ACCOUNT);
    }

    #[test]
    fn invalid_accounts_are_refused_naming_the_key() {
        check_err(
            "[[accounts]]\nname = \"a\"\nprovider = \"azure\"\nkey_env = \"K\"\n",
            3,
            "azure",
        );
        check_err(
            "[[accounts]]\nname = \"a\"\nprovider = \"openai\"\nkey = \"K\"\n",
            4,
            "key",
        );
        check_err(
            "\n[[accounts]]\nname = \"a\"\nprovider = \"openai\"\n",
            2,
            "accounts[0].key_env: name exactly one of key_env, token_env or key_file",
        );
        check_err(
            "[[accounts]]\nname = \"a\"\nprovider = \"openai\"\nkey_env = \"K\"\nkey_file = \"f\"\n",
            1,
            "exactly one",
        );
        check_err(
            "[[accounts]]\nname = \"a b\"\nprovider = \"openai\"\nkey_env = \"K\"\n",
            1,
            "accounts[0].name: must be 1 to 64",
        );
        check_err(
            "[[accounts]]\nname = \"a\"\nprovider = \"openai\"\nkey_env = \"K\"\nbase_url = \"localhost:9\"\n",
            1,
            "accounts[0].base_url",
        );
        check_err(
            &format!("{ACCOUNT_A}\n{ACCOUNT_A}"),
            6,
            "accounts[1].name: \"a\" is used twice",
        );
    }

    #[test]
    fn a_key_written_where_its_variable_belongs_is_refused_without_repeating_it() {
        let key = "sk-ant-api03-abcdefghijklmnop";
        let text =
            format!("[[accounts]]\nname = \"a\"\nprovider = \"anthropic\"\nkey_env = \"{key}\"\n");
        check_err(
            &text,
            1,
            "accounts[0].key_env: is not an environment variable name",
        );
        let message = Config::parse(&text, Path::new("keel.toml"))
            .unwrap_err()
            .to_string();
        assert!(!message.contains(key), "{message}");
    }

    #[test]
    fn an_agents_policy_keys_reach_the_policy_and_bad_rules_name_the_agent() {
        let text = "[[agents]]\nname = \"a\"\nharness = \"pi\"\nmodel = \"m\"\n\n[[agents]]\nname = \"b\"\nharness = \"messages-api\"\nmodel = \"m\"\ntools = [\"read\"]\npermission_mode = \"read_only\"\nrules = { deny = [\"bash(rm *)\"] }\n";
        let c = Config::parse(text, Path::new("keel.toml")).unwrap_or_else(|e| panic!("{e}"));
        let policy = c.policy().unwrap_or_else(|e| panic!("{e}"));
        let b = policy
            .agent_rules("b")
            .unwrap_or_else(|| panic!("no rules for b"));
        assert_eq!(b.mode, Some(keel_harness::PermissionMode::ReadOnly));
        assert_eq!(b.deny[0].to_string(), "bash(rm *)");
        check_err(
            &text.replace("bash(rm *)", "bash(rm *"),
            6,
            "agents[1].rules.deny[0]",
        );
        check_err(
            &text.replace("read_only", "sometimes"),
            11,
            "unknown variant `sometimes`",
        );
    }

    #[test]
    fn an_agents_account_must_exist_and_serve_its_harness() {
        let agent = |harness: &str, account: &str| {
            format!(
                "{ACCOUNT_A}\n[[agents]]\nname = \"x\"\nharness = \"{harness}\"\nmodel = \"m\"\naccount = \"{account}\"\n"
            )
        };
        check_err(
            &agent("claude-code", "b"),
            6,
            "agents[0].account: no [[accounts]] entry is named \"b\"",
        );
        check_err(
            &agent("codex", "a"),
            6,
            "agents[0].account: account \"a\" is an anthropic account; harness codex needs an openai one",
        );
        check_err(
            &agent("scripted", "a"),
            6,
            "harness scripted uses no account",
        );
    }

    #[test]
    fn a_relative_key_file_is_in_the_keel_home() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keel.toml");
        std::fs::write(
            &path,
            "[[accounts]]\nname = \"f\"\nprovider = \"openai\"\nkey_file = \"keys/f.key\"\n",
        )
        .unwrap();
        let c = Config::load(&path).unwrap();
        assert_eq!(
            c.accounts[0].credential(),
            Credential::ApiKeyFile(dir.path().join("keys/f.key"))
        );
    }

    #[test]
    fn malformed_toml_is_a_clear_error() {
        check_err("[supervisor\nmax_depth = 2\n", 1, "");
    }
}
