//! `keel node`: one process of a keel cluster over ractor_cluster (docs/OPERATIONS.md).
//!
//! - `--role coordinator` opens the home's store, hosts every run's machines (coordinators, the
//!   supervisor, the checkpoint writer) and places each specialist on a worker by capability and load;
//!   at start it resumes the runs that were running when it died. No session runs on it, so it
//!   starts no MCP endpoint; a brief without a plan still runs as a lead (on a worker).
//! - `--role worker` never opens the store: it hosts the specialists placed on it, runs their harness
//!   sessions here (with keel's session tools on its own MCP endpoint), and sends everything back as
//!   messages, which the coordinator makes durable before it acknowledges them.
//! - `--role all` is both in one process.
//!
//! The cookie comes from a file only its owner can read (`--cookie-file`), never from argv. The
//! cluster port binds exactly `--listen`. A coordinator serves `keel serve`'s HTTP API (the same
//! routes, `node/src/serve`) on `--api` (else `[server] listen`) and announces it in the home's
//! `server.json`, so `keel run --server URL` and local commands on its home submit to it
//! (`daemon.rs`); such a daemon holds the store alone, as `keel serve` does, so the home's read
//! commands go through its API too (`--share-store` lets other processes open the file instead).
//! `--run BRIEF` instead makes a coordinator submit one run once `--wait-workers` workers have
//! joined, print its summary as `keel run` does, and exit with its code (sharing the store: it has
//! no API to read through).

pub(crate) mod config;
mod daemon;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use keel_actors::runtime::Runtime;
use keel_cluster::{
    CoordinatorEndpoint, MembershipConfig, NodeName, NodeTls, TlsFiles, WorkerConfig,
    WorkerEndpoint, join_with_backoff, read_cookie, start_node_server,
};
use keel_store::RunStatus;

use crate::config::LogFormat;
use crate::home::Home;
use crate::run::setup::{
    HarnessChoice, PolicySource, SessionsHost, attach_policy, node_setup_for, work_dir,
};
use crate::run::{self, Ended};
use crate::serve::ApiMetrics;
use crate::stdout::outln;
pub(crate) use config::{NodeRole, NodeSection};

/// A worker's capacity when neither `--capacity` nor `[node] capacity` says.
const CAPACITY_DEFAULT: u32 = 8;
/// The lease when neither `--lease-ms` nor `[node] lease_ms` says.
const LEASE_MS_DEFAULT: u32 = 5_000;
/// Heartbeats per lease: a worker survives a few lost heartbeats before its lease expires.
const HEARTBEATS_PER_LEASE: u32 = 5;
/// How long a specialist on a worker waits for its preamble's rows.
const CONTEXT_WAIT: Duration = Duration::from_secs(30);
/// How long `--run` waits for `--wait-workers` workers.
const WORKERS_WAIT: Duration = Duration::from_secs(120);

/// `keel node`'s arguments (flags over `[node]`).
#[derive(Debug, Clone)]
pub(crate) struct NodeArgs {
    pub(crate) role: Option<NodeRole>,
    pub(crate) listen: Option<SocketAddr>,
    pub(crate) join: Option<SocketAddr>,
    pub(crate) cookie_file: Option<PathBuf>,
    pub(crate) name: Option<String>,
    pub(crate) capacity: Option<u32>,
    pub(crate) lease_ms: Option<u32>,
    /// `--tls-cert`, `--tls-key`, `--tls-ca` (all or none).
    pub(crate) tls: Option<TlsFiles>,
    /// `--api`: where a coordinator daemon serves the HTTP API (else `[server] listen`).
    pub(crate) api: Option<SocketAddr>,
    /// `--share-store`: a coordinator daemon opens the store shared with readers in other
    /// processes instead of alone.
    pub(crate) share_store: bool,
    pub(crate) choice: HarnessChoice,
    pub(crate) run: Option<String>,
    pub(crate) plan: Option<PathBuf>,
    pub(crate) wait_workers: u32,
    pub(crate) quiet: bool,
    pub(crate) log_format: Option<LogFormat>,
}

/// What the flags and `[node]` settle on.
struct Resolved {
    role: NodeRole,
    listen: SocketAddr,
    join: Option<SocketAddr>,
    cookie: String,
    name: NodeName,
    capacity: u32,
    lease_ms: u32,
    tls: Option<NodeTls>,
}

fn resolve(home: &Home, args: &NodeArgs, section: &NodeSection) -> anyhow::Result<Resolved> {
    let role = args.role.or(section.role).ok_or_else(|| {
        anyhow!("say which role this node has: --role coordinator|worker|all (or [node] role)")
    })?;
    let listen = args
        .listen
        .or(section.listen)
        .ok_or_else(|| anyhow!("say which address the cluster port binds: --listen IP:PORT (or [node] listen); 127.0.0.1:0 picks a free local port"))?;
    let join = args.join.or(section.join);
    if role == NodeRole::Worker && join.is_none() {
        bail!("a worker needs the coordinator node's address: --join IP:PORT (or [node] join)");
    }
    let cookie_file = args
        .cookie_file
        .clone()
        .or_else(|| section.cookie_file.as_ref().map(|p| home.dir().join(p)))
        .ok_or_else(|| anyhow!("say where the cluster cookie is: --cookie-file PATH (or [node] cookie_file); it is never taken from the command line"))?;
    let cookie = read_cookie(&cookie_file)?;
    let name = match args.name.clone().or_else(|| section.name.clone()) {
        Some(n) => n,
        None if role == NodeRole::Worker => {
            bail!("a worker needs a name: --name NAME (or [node] name)")
        }
        None => role.as_str().to_string(),
    };
    let name = NodeName::new(name).context("--name")?;
    let capacity = args
        .capacity
        .or(section.capacity.map(|c| c.get()))
        .unwrap_or(CAPACITY_DEFAULT)
        .max(1);
    let lease_ms = args
        .lease_ms
        .or(section.lease_ms.map(|l| l.get()))
        .unwrap_or(LEASE_MS_DEFAULT)
        .max(HEARTBEATS_PER_LEASE * 20);
    let in_home = |p: &PathBuf| home.dir().join(p);
    let tls = match (
        &args.tls,
        &section.tls_cert,
        &section.tls_key,
        &section.tls_ca,
    ) {
        (Some(files), ..) => Some(files.clone()),
        (None, Some(cert), Some(key), Some(ca)) => Some(TlsFiles {
            cert: in_home(cert),
            key: in_home(key),
            ca: in_home(ca),
        }),
        (None, None, None, None) => None,
        (None, ..) => bail!("[node] needs tls_cert, tls_key and tls_ca together (or none of them)"),
    };
    let tls = tls
        .map(|files| NodeTls::load(&files))
        .transpose()
        .context("TLS between nodes")?;
    Ok(Resolved {
        role,
        listen,
        join,
        cookie,
        name,
        capacity,
        lease_ms,
        tls,
    })
}

/// `keel node`.
pub(crate) fn node(home: &Home, args: NodeArgs, json: bool) -> anyhow::Result<Ended> {
    let config = home.config()?;
    let r = resolve(home, &args, &config.node)?;
    if args.run.is_some() && !r.role.coordinates() {
        bail!("--run needs a coordinator (--role coordinator or all)");
    }
    run::init_logs(&config.log, args.log_format);
    run::tokio_runtime()?.block_on(async {
        let work = work_dir()?;
        // Sessions run on workers: a coordinator-only node serves no session tools itself.
        let sessions = if r.role.works() {
            SessionsHost::ThisNode
        } else {
            SessionsHost::Workers
        };
        // A worker-only node has no store: the coordinator node's policy decides its sessions'
        // tool calls (an `all` node decides with its own, which is the coordinator's).
        let remote_policy = Arc::new(keel_cluster::RemotePolicy::new(r.name.clone()));
        let policy = if r.role.coordinates() {
            PolicySource::KeelToml
        } else {
            PolicySource::Coordinator(Arc::clone(&remote_policy))
        };
        let setup = node_setup_for(&config, &args.choice, &work, None, sessions, policy).await?;
        let (server, bound) = start_node_server(&r.name, r.cookie.clone(), r.listen, r.tls.as_ref()).await?;
        let mut coordinator = None;
        if r.role.coordinates() {
            // A daemon holds its store alone, as `keel serve` does (one fsync a commit instead of
            // two), and this home's read commands go through its API (`server.json`); `--run` has
            // no API, so the operator's reads open the file beside it, and `--share-store` asks
            // for that on a daemon too.
            let sharing = if args.run.is_none() && !args.share_store {
                run::SERVED
            } else {
                run::SHARED
            };
            let store = run::node_store(home, sharing)?;
            // A daemon serves the API; with --run the run's live view reads the events instead.
            let metrics = if args.run.is_none() {
                Some(ApiMetrics::new()?)
            } else {
                None
            };
            let mut runtime_config = setup.config.clone();
            runtime_config.observer = metrics.as_ref().map(ApiMetrics::observer);
            let (rt, events) =
                Runtime::start(store, setup.harnesses.clone(), runtime_config.clone()).await?;
            attach_policy(&setup.policy, &rt);
            let local_policy = setup.policy.as_ref().and_then(|b| b.local_host()).cloned();
            let membership = MembershipConfig {
                lease_ms: u64::from(r.lease_ms),
                ..MembershipConfig::default()
            };
            let endpoint = CoordinatorEndpoint::start(r.name.clone(), &rt, membership)
                .await
                .map_err(|e| anyhow!("the coordinator endpoint did not start: {e}"))?;
            if let Some(m) = &metrics {
                endpoint.observe(m.endpoint_observer());
            }
            // Sessions on workers are gated by this node's policy and ask it.
            if let Some(host) = local_policy {
                endpoint.serve_policy(host);
            }
            let api = metrics.map(|metrics| daemon::Api {
                metrics,
                runtime_config,
                listen: args.api.unwrap_or(config.server.listen),
            });
            coordinator = Some((Arc::new(rt), events, endpoint, api));
        }
        let worker = if r.role.works() {
            // The sessions this node hosts call keel's tools here, on their own machine; each
            // call crosses the cluster to the coordinator node as the specialist's reply.
            if let Some(url) = &setup.session_tools_url {
                tracing::info!(%url, "keel's MCP endpoint for the sessions hosted here");
            }
            Some(
                WorkerEndpoint::start(WorkerConfig {
                    name: r.name.clone(),
                    capacity: r.capacity,
                    harnesses: setup.harnesses.clone(),
                    specialist: setup.config.specialist.clone(),
                    heartbeat: Duration::from_millis(u64::from(r.lease_ms / HEARTBEATS_PER_LEASE)),
                    context_wait: CONTEXT_WAIT,
                    policy: remote_policy,
                })
                .await?,
            )
        } else {
            None
        };
        if let Some(peer) = r.join {
            tokio::spawn(join_with_backoff(server.clone(), peer, r.tls.clone()));
        }
        outln!(
            "keel node {} ({}) listening on {bound}",
            r.name,
            r.role.as_str()
        )?;
        if r.tls.is_some() {
            tracing::info!("sessions between nodes use mutual TLS");
        }
        {
            use std::io::Write;
            let _ = std::io::stdout().flush();
        }
        let ended = match coordinator {
            Some((rt, events, endpoint, api)) => {
                let ended = match api {
                    Some(api) => {
                        daemon::serve(home, &config, &setup, &rt, events, api, &work, json).await
                    }
                    None => {
                        coordinate(home, &rt, events, &endpoint, &args, &setup, &config, json)
                            .await
                    }
                };
                let stats = endpoint.dispatch_stats();
                let frames = endpoint.frame_counts();
                tracing::info!(
                    spawns = stats.count,
                    median_us = stats.median_us,
                    p99_us = stats.p99_us,
                    max_us = stats.max_us,
                    frames_received = frames.received,
                    frames_sent = frames.sent,
                    "remote dispatch latency (spawn handed over to the worker's acknowledgement)"
                );
                endpoint.stop();
                // Requests the API still answered hold the runtime: it stops with the process then.
                if let Ok(rt) = Arc::try_unwrap(rt) {
                    rt.shutdown().await;
                }
                ended
            }
            None => {
                wait_for_signal().await?;
                tracing::info!("stopping: sessions hosted here are cancelled; the coordinator re-places them when the lease expires");
                Ok(Ended::Paused)
            }
        };
        if let Some(w) = worker {
            w.stop();
        }
        server.stop(Some("node shutdown".into()));
        ended
    })
}

/// `--run`: resume what was running, submit the brief once `--wait-workers` workers joined, and
/// host until the run ends.
#[allow(clippy::too_many_arguments)]
async fn coordinate(
    home: &Home,
    rt: &Runtime,
    events: tokio::sync::mpsc::Receiver<keel_actors::runtime::RuntimeEvent>,
    endpoint: &CoordinatorEndpoint,
    args: &NodeArgs,
    setup: &run::setup::NodeSetup,
    config: &crate::config::Config,
    json: bool,
) -> anyhow::Result<Ended> {
    let Some(brief) = &args.run else {
        bail!("a coordinator without --run serves the API");
    };
    // Resumed runs end by themselves; the node exits when the submitted run ends.
    resume_running(rt).await?;
    let deadline = tokio::time::Instant::now() + WORKERS_WAIT;
    while endpoint.live_workers().len() < args.wait_workers as usize {
        if tokio::time::Instant::now() >= deadline {
            bail!(
                "only {} of {} workers joined within {WORKERS_WAIT:?}",
                endpoint.live_workers().len(),
                args.wait_workers
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let plan = args.plan.as_deref().map(run::read_plan).transpose()?;
    let mode = run::run_mode(
        brief,
        plan,
        setup.scripted,
        setup.lead_capable(),
        args.choice.agent.clone(),
    )?;
    let (budget, snapshot) = run::submission(config);
    let view = tokio::spawn(run::progress::show(events, args.quiet || json));
    let handle = rt.submit(brief.clone(), mode, budget, snapshot).await?;
    if !json && !args.quiet {
        outln!("run {} started on the cluster", handle.id())?;
    }
    run::drive(home, rt, handle, view, json).await
}

/// Resume every run that was running when this node stopped; their handles.
async fn resume_running(rt: &Runtime) -> anyhow::Result<Vec<keel_actors::runtime::RunHandle>> {
    let mut resumed = Vec::new();
    for id in rt.open_runs().await? {
        let status = rt.store()?.catalog().run(id)?.status;
        if status == RunStatus::Running {
            tracing::info!(run = %id, "resuming a run that was running when this node stopped");
            resumed.push(rt.resume(id).await?);
        }
    }
    Ok(resumed)
}

async fn wait_for_signal() -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    Ok(())
}
