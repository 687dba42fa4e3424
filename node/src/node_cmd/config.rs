//! `[node]` of keel.toml: how `keel node` joins a cluster when its flags leave something out.

use std::net::SocketAddr;
use std::num::NonZeroU32;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// What a `keel node` process is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub(crate) enum NodeRole {
    /// Owns the store and every run's machines; places specialists on workers.
    Coordinator,
    /// Stateless: hosts specialists the coordinator places on it; never opens the store.
    Worker,
    /// A coordinator with a worker inside the same process.
    All,
}

impl NodeRole {
    /// Whether the node hosts the coordinator (and opens the store).
    pub(crate) fn coordinates(self) -> bool {
        matches!(self, NodeRole::Coordinator | NodeRole::All)
    }

    /// Whether the node hosts specialists.
    pub(crate) fn works(self) -> bool {
        matches!(self, NodeRole::Worker | NodeRole::All)
    }

    /// Its name in logs and output.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            NodeRole::Coordinator => "coordinator",
            NodeRole::Worker => "worker",
            NodeRole::All => "all",
        }
    }
}

/// `[node]`: every key optional; a flag of `keel node` wins over its key.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub(crate) struct NodeSection {
    /// `role`: coordinator, worker or all.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) role: Option<NodeRole>,
    /// `listen`: the address the cluster port binds (an IP and a port; nothing binds every
    /// interface unless this says `0.0.0.0` or `[::]`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) listen: Option<SocketAddr>,
    /// `join`: the coordinator node's cluster address (workers).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) join: Option<SocketAddr>,
    /// `cookie_file`: the shared secret's file (mode 600 or stricter), relative to the keel home
    /// unless absolute.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) cookie_file: Option<PathBuf>,
    /// `name`: this node's name in the cluster.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) name: Option<String>,
    /// `capacity`: most specialists a worker hosts at once.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) capacity: Option<NonZeroU32>,
    /// `lease_ms`: how long a worker's heartbeat keeps it alive at the coordinator.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) lease_ms: Option<NonZeroU32>,
    /// `tls_cert`: this node's certificate chain (PEM); with `tls_key` and `tls_ca`, sessions
    /// between nodes use mutual TLS. Relative to the keel home unless absolute.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// `tls_key`: this node's private key (PEM, mode 600 or stricter).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tls_key: Option<PathBuf>,
    /// `tls_ca`: the CA certificates (PEM) that sign the cluster's nodes' certificates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tls_ca: Option<PathBuf>,
}
