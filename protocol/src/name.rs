//! A node's name: how keel addresses a node on the wire and in logs (never ractor's per-session ids).

use serde::{Deserialize, Serialize};
use std::fmt;

/// Most bytes of a node name.
pub const NODE_NAME_BYTES_MAX: usize = 64;

/// A node's name, as given by `--name` or `[node] name`: 1 to 64 ASCII letters, digits, `.`, `_`
/// or `-`. A decoded name is checked like a parsed one, so a peer cannot smuggle another shape in.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(try_from = "String")]
pub struct NodeName(String);

/// As a string, by reference: the same bytes `into = "String"` gave, without the copy of the name
/// every frame's encoding made.
impl Serialize for NodeName {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

/// Why a string is not a node name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeNameError {
    /// Empty.
    #[error("a node name cannot be empty")]
    Empty,
    /// Longer than [`NODE_NAME_BYTES_MAX`].
    #[error("a node name has at most {NODE_NAME_BYTES_MAX} bytes, this one has {0}")]
    TooLong(usize),
    /// A character outside the allowed set.
    #[error("a node name is made of ASCII letters, digits, '.', '_' and '-'; {0:?} is not allowed")]
    Character(char),
}

impl NodeName {
    /// Check and wrap a name.
    ///
    /// # Errors
    /// [`NodeNameError`] naming what is wrong.
    pub fn new(name: impl Into<String>) -> Result<Self, NodeNameError> {
        let name = name.into();
        if name.is_empty() {
            return Err(NodeNameError::Empty);
        }
        if name.len() > NODE_NAME_BYTES_MAX {
            return Err(NodeNameError::TooLong(name.len()));
        }
        if let Some(c) = name
            .chars()
            .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))
        {
            return Err(NodeNameError::Character(c));
        }
        Ok(Self(name))
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for NodeName {
    type Error = NodeNameError;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

impl From<NodeName> for String {
    fn from(value: NodeName) -> Self {
        value.0
    }
}

impl std::str::FromStr for NodeName {
    type Err = NodeNameError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The process group the coordinator node's endpoint joins (one coordinator per cluster today).
pub const COORDINATOR_GROUP: &str = "keel.coordinator";

/// The process group every worker endpoint joins (its members are discovered through it).
pub const WORKERS_GROUP: &str = "keel.workers";

/// The process group of one worker's endpoint, so the coordinator addresses a worker by its name.
pub fn worker_group(name: &NodeName) -> String {
    format!("keel.worker.{name}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_checked() {
        assert!(NodeName::new("worker-1.eu_west").is_ok());
        assert_eq!(NodeName::new(""), Err(NodeNameError::Empty));
        assert_eq!(NodeName::new("a b"), Err(NodeNameError::Character(' ')));
        assert_eq!(
            NodeName::new("x".repeat(65)),
            Err(NodeNameError::TooLong(65))
        );
    }
}
