//! A coordinator node as a daemon: `keel serve`'s HTTP API (the same routes and code,
//! `crate::serve`) over the runtime whose specialists run on workers, announced in the home's
//! `server.json`, until SIGINT or SIGTERM pauses its runs.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use keel_actors::runtime::{Runtime, RuntimeConfig, RuntimeEvent};
use tokio::sync::mpsc;

use crate::config::Config;
use crate::home::Home;
use crate::run::Ended;
use crate::run::setup::NodeSetup;
use crate::serve::{self, ApiMetrics, ApiServer, Hosted, auth};
use crate::stdout::outln;

/// What the daemon's API needs beyond the runtime.
pub(super) struct Api {
    /// The metrics the runtime's observer and the cluster endpoint feed.
    pub(super) metrics: ApiMetrics,
    /// The configuration the runtime started with (its agents, its run slots).
    pub(super) runtime_config: RuntimeConfig,
    /// Where the API listens.
    pub(super) listen: SocketAddr,
}

/// Resume the runs that were running when the node stopped, then answer the API until a signal;
/// the signal pauses every run (as `keel serve` does) and the node ends as paused.
#[allow(clippy::too_many_arguments)]
pub(super) async fn serve(
    home: &Home,
    config: &Config,
    setup: &NodeSetup,
    rt: &Arc<Runtime>,
    events: mpsc::Receiver<RuntimeEvent>,
    api: Api,
    work_dir: &Path,
    json: bool,
) -> anyhow::Result<Ended> {
    let token_path = home.dir().join(&config.server.token_file);
    let (tokens, created) = auth::Tokens::load_or_create(&token_path)?;
    let hosted = Hosted {
        rt: Arc::clone(rt),
        events,
        metrics: api.metrics,
        home,
        config,
        scripted: setup.scripted,
        // A brief without a plan runs a lead session, as under `keel run` and `keel serve`: the
        // lead is placed on a worker and calls keel's tools on that worker's endpoint.
        lead_capable: setup.lead_capable(),
        work_dir: work_dir.to_path_buf(),
        agents: serve::agent_names(&api.runtime_config),
        runs_in_flight_max: api.runtime_config.runs_in_flight_max,
        tokens,
    };
    // Bound (and reading the runtime's events) before any run resumes, so none of its events is
    // missed by the API's streams.
    let server = ApiServer::bind(hosted, api.listen).await?;
    for handle in super::resume_running(rt).await? {
        let run = handle.id();
        tokio::spawn(async move {
            match handle.finished().await {
                Ok(outcome) => tracing::info!(%run, status = ?outcome.status, "resumed run ended"),
                Err(e) => tracing::warn!(%run, error = %e, "resumed run not finished"),
            }
        });
    }
    let paused = server
        .serve_announced(home, serve::signalled().await?, |url| {
            if json {
                outln!(
                    "{}",
                    serde_json::json!({"api": url, "home": home.dir(), "token_file": token_path, "token_file_created": created})
                )
            } else {
                if created {
                    outln!("created a token file {} (mode 0600)", token_path.display())?;
                }
                outln!(
                    "keel node: HTTP API on {url} (token file {})",
                    token_path.display()
                )
            }
        })
        .await?;
    tracing::info!(
        runs = paused.runs.len(),
        tasks_paused = paused.tasks_paused,
        "coordinator paused"
    );
    Ok(Ended::Paused)
}
