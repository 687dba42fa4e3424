//! A keel cluster's setup shared by the cluster tests (`tests/tests/cluster*.rs`) and the cluster
//! benchmark (`examples/cluster_bench.rs`): a working folder with a keel home, a fan-out plan and a
//! private cookie file, and the wait for workers to join a coordinator.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Test helpers: a panic is the failure report.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use keel_cluster::{COORDINATOR_GROUP, ClusterMsg, NodeName};

use crate::Reaped;

/// A node's log filter for tests: keel's cluster and node lines at info, everything else at error.
pub const NODE_LOG: &str = "error,keel_cluster=info,keel::node_cmd=info";

/// The cookie every node of a test cluster reads.
pub const COOKIE: &str = "keel-test-cookie-0123456789abcdef";

/// Write `text` to the cookie file `path` with `mode` (0o600 for one `keel node` accepts).
///
/// # Panics
/// When the file cannot be written.
pub fn write_cookie(path: &Path, text: &str, mode: u32) {
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A free TCP port of 127.0.0.1 (free when asked; bind it soon).
///
/// # Panics
/// When no port can be bound.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A temporary folder holding a working folder (`work`, with a keel home) and a private cookie
/// file (`cookie`, [`COOKIE`]).
pub struct ClusterHome {
    /// The temporary folder (removed when dropped).
    pub dir: tempfile::TempDir,
    /// The working folder: `.keel/` and `plan.json`.
    pub work: PathBuf,
    /// The cookie file, mode 0600.
    pub cookie: PathBuf,
}

impl ClusterHome {
    /// A home whose keel.toml is `keel_toml` and whose `plan.json` is a fan-out of `steps` parts,
    /// part `i` running `command(i)` ([`crate::fan_out::prepare`]).
    ///
    /// # Panics
    /// When a file cannot be written or `keel init` fails.
    pub fn new(keel_toml: &str, steps: usize, command: impl Fn(usize) -> String) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        crate::fan_out::prepare(&work, keel_toml, steps, command);
        let cookie = dir.path().join("cookie");
        write_cookie(&cookie, COOKIE, 0o600);
        ClusterHome { dir, work, cookie }
    }
}

/// Wait until the coordinator `coordinator` logged `workers` workers joined.
///
/// # Panics
/// When they have not within `wait`.
pub fn wait_joined(coordinator: &Reaped, workers: usize, wait: Duration) {
    let deadline = Instant::now() + wait;
    while coordinator.stderr_so_far().matches("worker joined").count() < workers {
        assert!(Instant::now() < deadline, "workers did not join");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Make this process a node named `name` of the cluster whose coordinator listens at `cluster`
/// (with [`COOKIE`]) and return the coordinator's endpoint, to send it frames directly. Call it
/// inside a tokio runtime; the node lives as long as that runtime.
///
/// # Panics
/// When the node cannot start or the coordinator's group is not reachable within `wait`.
pub async fn join_coordinator(
    name: &NodeName,
    cluster: &str,
    wait: Duration,
) -> ractor::ActorRef<ClusterMsg> {
    let (server, _) =
        keel_cluster::start_node_server(name, COOKIE.into(), "127.0.0.1:0".parse().unwrap(), None)
            .await
            .unwrap();
    tokio::spawn(keel_cluster::join_with_backoff(
        server,
        cluster.parse().unwrap(),
        None,
    ));
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let members = ractor::pg::get_members(&COORDINATOR_GROUP.to_string());
        if let Some(m) = members.into_iter().find(|m| !m.get_id().is_local()) {
            return ractor::ActorRef::<ClusterMsg>::from(m);
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "could not join {cluster}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
