//! Tools for keel's own agent loop: a registry embedders extend, and the built-ins (read, write,
//! edit, list, grep, bash) confined to the session's working directory.
//!
//! A tool never panics and never hangs: it returns text, or a [`ToolError`] whose category and
//! retryability go back to the model as a structured `is_error` result (docs/DESIGN.md §7), and every
//! call runs under a timeout with an output cap.

pub mod builtin;
pub mod mcp;
pub mod path;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::messages_api::wire::ToolDefinition;
use crate::session::{BoxFuture, CancelToken};

/// Why a tool call failed, as the model and the audit log see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolErrorCategory {
    /// Try again later (timeout, busy resource).
    Transient,
    /// The input is wrong for the tool (missing file, ambiguous edit, bad argument).
    BusinessRule,
    /// Refused by policy (path outside the working directory, gate denial).
    Permission,
    /// The tool itself broke.
    System,
}

impl ToolErrorCategory {
    /// The stable name sent to the model as `error_category`.
    pub fn name(self) -> &'static str {
        match self {
            ToolErrorCategory::Transient => "transient",
            ToolErrorCategory::BusinessRule => "business_rule",
            ToolErrorCategory::Permission => "permission",
            ToolErrorCategory::System => "system",
        }
    }
}

/// A failed tool call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: {message}", category.name())]
pub struct ToolError {
    /// What kind of failure.
    pub category: ToolErrorCategory,
    /// Whether the same call may succeed if repeated.
    pub retryable: bool,
    /// Detail for the model.
    pub message: String,
}

impl ToolError {
    /// A failure with the category's usual retryability (only transient ones are retryable).
    pub fn new(category: ToolErrorCategory, message: impl Into<String>) -> Self {
        ToolError {
            retryable: category == ToolErrorCategory::Transient,
            category,
            message: message.into(),
        }
    }

    /// Bad input.
    pub fn input(message: impl Into<String>) -> Self {
        ToolError::new(ToolErrorCategory::BusinessRule, message)
    }

    /// Refused.
    pub fn permission(message: impl Into<String>) -> Self {
        ToolError::new(ToolErrorCategory::Permission, message)
    }

    /// The structured payload the model receives in an `is_error` tool result.
    pub fn to_payload(&self) -> String {
        json!({"error_category": self.category.name(), "is_retryable": self.retryable, "message": self.message}).to_string()
    }
}

/// What a tool call may touch and how long it may take.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The canonical working directory; file tools stay inside it.
    pub working_dir: PathBuf,
    /// Most time one call may take.
    pub timeout_ms: u64,
    /// Most bytes of output returned to the model.
    pub output_bytes_max: usize,
    /// Environment for processes a tool starts (the spec's `env`); the keel process's own
    /// environment, which may hold API keys, is not passed on.
    pub env: BTreeMap<String, String>,
    /// The session's cancel token.
    pub cancel: CancelToken,
}

/// A tool the loop can offer. Implement it to add domain tools (`Specialist` helpers, MCP bridges).
pub trait Tool: Send + Sync {
    /// Name, description and input schema offered to the model.
    fn definition(&self) -> ToolDefinition;

    /// Runs one call. The loop already enforces `ctx.timeout_ms` around this future; a tool that
    /// starts processes must also stop them when it is dropped.
    ///
    /// # Errors
    /// A [`ToolError`] that goes back to the model as a structured `is_error` result.
    fn call<'a>(
        &'a self,
        input: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>>;

    /// Whether the tool only reads. A `read_only` session offers only these; a tool that writes,
    /// runs commands or calls out must keep the default `false`.
    fn is_read_only(&self) -> bool {
        false
    }
}

/// Why a tool could not be registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    /// A tool of that name is already registered.
    #[error("a tool named {0} is already registered")]
    Duplicate(String),
    /// The name is not a valid Anthropic tool name (`^[a-zA-Z0-9_-]{1,64}$`).
    #[error("invalid tool name {0:?}")]
    InvalidName(String),
}

/// The tools a session offers, by name (ordered, so requests are reproducible).
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<dyn Tool>>,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.tools.keys()).finish()
    }
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new() -> Self {
        ToolRegistry::default()
    }

    /// A registry with the six built-in tools.
    pub fn with_builtins() -> Self {
        let mut r = ToolRegistry::new();
        for tool in builtin::all() {
            // Built-in names are fixed and distinct.
            let _ = r.register(tool);
        }
        r
    }

    /// Adds a tool.
    ///
    /// # Errors
    /// [`RegistryError`] for a duplicate or invalid name.
    pub fn register(&mut self, tool: Arc<dyn Tool>) -> Result<(), RegistryError> {
        let name = tool.definition().name;
        let valid = !name.is_empty()
            && name.len() <= 64
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid {
            return Err(RegistryError::InvalidName(name));
        }
        if self.tools.contains_key(&name) {
            return Err(RegistryError::Duplicate(name));
        }
        self.tools.insert(name, tool);
        Ok(())
    }

    /// The tool of that name.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.get(name)
    }

    /// Tool names, sorted.
    pub fn names(&self) -> Vec<String> {
        self.tools.keys().cloned().collect()
    }

    /// The registry narrowed to a spec's allowed (empty = all) minus disallowed tools.
    pub fn filtered(&self, allowed: &[String], disallowed: &[String]) -> ToolRegistry {
        let tools = self
            .tools
            .iter()
            .filter(|(n, _)| allowed.is_empty() || allowed.iter().any(|a| a == *n))
            .filter(|(n, _)| !disallowed.iter().any(|d| d == *n))
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect();
        ToolRegistry { tools }
    }

    /// The registry narrowed to tools that only read, for `PermissionMode::ReadOnly` sessions.
    pub fn read_only(&self) -> ToolRegistry {
        let tools = self
            .tools
            .iter()
            .filter(|(_, t)| t.is_read_only())
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect();
        ToolRegistry { tools }
    }

    /// The definitions offered to the model.
    pub fn definitions(&self) -> Vec<ToolDefinition> {
        self.tools.values().map(|t| t.definition()).collect()
    }
}
