//! The ractor_cluster transport of a keel node: its node server on an explicit address (TCP, or
//! mutual TLS, `tls.rs`), joining a peer with backoff (and again whenever the peer is gone), and
//! session events in the log.

use crate::name::{COORDINATOR_GROUP, NodeName};
use crate::tls::NodeTls;
use ractor::{Actor, ActorRef};
use ractor_cluster::{
    NodeEventSubscription, NodeServer, NodeServerMessage,
    node::{NodeConnectionMode, NodeServerSessionInformation},
};
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// The address of a running node server.
pub type NodeServerRef = ActorRef<NodeServerMessage>;

/// First wait before joining again after a failure; it doubles up to [`JOIN_BACKOFF_MAX`].
pub const JOIN_BACKOFF_MIN: Duration = Duration::from_millis(200);
/// Longest wait between two attempts to join.
pub const JOIN_BACKOFF_MAX: Duration = Duration::from_secs(5);
/// How often a joined node checks that its peer is still there.
pub const JOIN_CHECK: Duration = Duration::from_millis(250);

/// Why the node could not start.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The listen address cannot be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The node server actor did not start.
    #[error("the cluster node server did not start: {0}")]
    Start(String),
}

/// Start this node's server on `listen` (never every interface unless asked: ractor_cluster binds
/// `[::]` by default), accepting only TLS sessions when `tls` is given. Port 0 picks a free port; the answer says which address is bound. Session
/// events are logged: a session that closes before authenticating is an error naming the peer (a
/// wrong cookie on one side, or not a keel node).
///
/// # Errors
/// [`NetError::Bind`] when the address is taken or not local, [`NetError::Start`].
pub async fn start_node_server(
    name: &NodeName,
    cookie: String,
    listen: SocketAddr,
    tls: Option<&NodeTls>,
) -> Result<(NodeServerRef, SocketAddr), NetError> {
    // Bind once ourselves: a clear error for a taken address, and the port when 0 was asked for.
    // (ractor_cluster binds again right after; another process could take the port in between.)
    let probe = std::net::TcpListener::bind(listen).map_err(|source| NetError::Bind {
        addr: listen,
        source,
    })?;
    let bound = probe.local_addr().map_err(|source| NetError::Bind {
        addr: listen,
        source,
    })?;
    drop(probe);
    let server = NodeServer::new(
        bound.port(),
        cookie,
        name.to_string(),
        bound.ip().to_string(),
        tls.map(NodeTls::incoming),
        Some(NodeConnectionMode::Isolated),
    )
    .with_listen_addr(bound.ip());
    let (server, _) = Actor::spawn(None, server, ())
        .await
        .map_err(|e| NetError::Start(e.to_string()))?;
    let _ = server.cast(NodeServerMessage::SubscribeToEvents {
        id: "keel-session-log".into(),
        subscription: Box::new(SessionLog::default()),
    });
    Ok((server, bound))
}

/// Logs session events; remembers which sessions authenticated, to tell a refused one apart.
#[derive(Default)]
struct SessionLog {
    authenticated: Arc<Mutex<BTreeSet<u64>>>,
}

impl NodeEventSubscription for SessionLog {
    fn node_session_opened(&self, ses: NodeServerSessionInformation) {
        tracing::debug!(peer = %ses.peer_addr, "cluster session opened");
    }

    fn node_session_disconnected(&self, ses: NodeServerSessionInformation) {
        let was_authenticated = self
            .authenticated
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&ses.node_id);
        let peer = ses
            .peer_name
            .as_ref()
            .map(|n| n.name.clone())
            .unwrap_or_default();
        if was_authenticated {
            tracing::warn!(peer = %ses.peer_addr, name = %peer, "lost the cluster session with a node");
        } else {
            tracing::error!(
                peer = %ses.peer_addr,
                "a cluster session closed before it authenticated: refused (a wrong cookie on one side, or not a keel node)"
            );
        }
    }

    fn node_session_authenticated(&self, ses: NodeServerSessionInformation) {
        self.authenticated
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(ses.node_id);
        let peer = ses
            .peer_name
            .as_ref()
            .map(|n| n.name.clone())
            .unwrap_or_default();
        tracing::info!(peer = %ses.peer_addr, name = %peer, "cluster session authenticated");
    }
}

/// Whether a coordinator endpoint is reachable (a member of its group, here or on a joined node).
pub fn coordinator_reachable() -> bool {
    !ractor::pg::get_members(&COORDINATOR_GROUP.to_string()).is_empty()
}

/// Open sessions of the node server (0 when it does not answer within a second).
async fn sessions(server: &NodeServerRef) -> usize {
    ractor::call_t!(server, NodeServerMessage::GetSessions, 1_000)
        .map(|s| s.len())
        .unwrap_or(0)
}

/// Keep this node joined to the coordinator node at `peer`: connect, and whenever no coordinator
/// endpoint is reachable, connect again after a backoff that doubles from [`JOIN_BACKOFF_MIN`] to
/// [`JOIN_BACKOFF_MAX`] (reset once joined); over TLS when `tls` is given (the peer's certificate
/// must name its IP address). Runs until the task is dropped.
pub async fn join_with_backoff(server: NodeServerRef, peer: SocketAddr, tls: Option<NodeTls>) {
    let mut backoff = JOIN_BACKOFF_MIN;
    let mut joined = false;
    loop {
        if coordinator_reachable() {
            if !joined {
                tracing::info!(%peer, "joined the coordinator node");
                joined = true;
            }
            backoff = JOIN_BACKOFF_MIN;
            tokio::time::sleep(JOIN_CHECK).await;
            continue;
        }
        if joined {
            tracing::warn!(%peer, "the coordinator node is gone; reconnecting");
            joined = false;
        }
        let connect = async {
            match &tls {
                Some(tls) => tls.connect(&server, peer).await,
                None => ractor_cluster::client_connect(&server, peer).await,
            }
        };
        match tokio::time::timeout(JOIN_BACKOFF_MAX, connect).await {
            Ok(Ok(())) => {
                // The session authenticates and syncs groups in the background: wait for the
                // coordinator's group while a session is open (a second connection to a node already
                // connected would only be refused), at most the longest backoff.
                tracing::debug!(%peer, "connected; waiting for the coordinator's group");
                let mut waited = Duration::ZERO;
                while waited < JOIN_BACKOFF_MAX
                    && !coordinator_reachable()
                    && sessions(&server).await > 0
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    waited += Duration::from_millis(50);
                }
            }
            Ok(Err(e)) => {
                tracing::warn!(%peer, error = %e, retry_in = ?backoff, "cannot reach the coordinator node")
            }
            Err(_) => {
                tracing::warn!(%peer, retry_in = ?backoff, "connecting to the coordinator node timed out")
            }
        }
        tokio::time::sleep(backoff).await;
        if !coordinator_reachable() {
            backoff = (backoff * 2).min(JOIN_BACKOFF_MAX);
        }
    }
}
