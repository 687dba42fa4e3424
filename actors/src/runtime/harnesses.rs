//! The harnesses a node can start sessions on, and the host-side facts a session spec needs that the
//! machines deliberately do not carry: an account's endpoint and credential (secrets and endpoints
//! are node configuration, not persisted task data), and the environment a session sees.

use crate::ids::AttemptId;
use keel_harness::{Account, Harness, HarnessKind, SessionSpec};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Environment variable a session's tools see holding its subtask id (the id its report must name).
pub const SUBTASK_ID_ENV: &str = "KEEL_SUBTASK_ID";
/// Environment variable holding the run id.
pub const RUN_ID_ENV: &str = "KEEL_RUN_ID";
/// Environment variable holding the attempt number.
pub const ATTEMPT_ENV: &str = "KEEL_ATTEMPT";

/// The harnesses of a node, by kind, with its accounts.
#[derive(Clone, Default)]
pub struct HarnessSet {
    harnesses: BTreeMap<HarnessKind, Arc<dyn Harness>>,
    accounts: BTreeMap<String, Account>,
    env: BTreeMap<String, String>,
}

impl std::fmt::Debug for HarnessSet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HarnessSet")
            .field("kinds", &self.harnesses.keys().collect::<Vec<_>>())
            .field("accounts", &self.accounts.keys().collect::<Vec<_>>())
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
        spec
    }
}
