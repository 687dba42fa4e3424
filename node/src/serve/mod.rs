//! `keel serve`: one process hosts keel's runtime on a home and answers the HTTP API
//! (docs/API.md, docs/openapi.yaml) on an explicit address: submit a run, read runs, task trees,
//! tasks and logs, cancel, resume, follow up, stream a run's events (server-sent events), health,
//! readiness and Prometheus metrics. Every route but `/healthz` and `/readyz` needs a bearer token
//! from the token file keel.toml names.
//!
//! Files: `auth.rs` (tokens), `wire.rs` (the JSON), `hub.rs` (the runtime's events, per run),
//! `routes.rs` (the handlers), `error.rs` (4xx/5xx bodies), `metrics.rs` (`/metrics`),
//! `discovery.rs` (`server.json`, how local commands find the server of their home).
//!
//! Another host of the runtime (a cluster's coordinator node) serves the same API with
//! [`ApiMetrics`] (its observer in the runtime's config), [`Hosted`] and [`ApiServer`].
//!
//! The store: `keel serve` opens it alone ([`crate::run::SERVED`], one fdatasync a commit instead
//! of two), so no other process opens the file while it runs; the read commands on its home come
//! here instead (`dispatch.rs`, through `server.json`). A coordinator daemon (`keel node` with its
//! API) opens it the same way, unless `--share-store` asks it to share the file with readers.
//!
//! Shutdown: SIGINT or SIGTERM refuses new work, pauses every run as `keel run` does on a signal,
//! tells the open event streams (`event: paused`: a `keel --server` client ends as a paused local
//! run does, exit 6), then stops answering; `keel resume RUN` (or `POST /v1/runs/{run}/resume` on the next
//! server) continues them.

pub(crate) mod auth;
pub(crate) mod discovery;
mod error;
mod escalations;
mod hub;
mod metrics;
mod routes;
mod tls;
pub(crate) mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use std::future::{Future, IntoFuture};
use std::path::PathBuf;

use anyhow::Context;
use keel_actors::runtime::{PauseSummary, Runtime, RuntimeConfig, RuntimeEvent, RuntimeObserver};
use tokio::sync::{Semaphore, mpsc};

use crate::config::{Config, LogFormat};
use crate::home::Home;
use crate::run::setup::{HarnessChoice, node_setup, work_dir};
use crate::run::{PAUSE_WAIT, init_logs, node_store, submission, tokio_runtime};
use crate::stdout::outln;

/// How long open connections get to finish once the server begins to stop.
const DRAIN_WAIT: Duration = Duration::from_secs(5);

/// `keel serve`'s arguments.
#[derive(Debug, Clone)]
pub(crate) struct ServeArgs {
    /// `--listen ADDR`, over `[server] listen`.
    pub(crate) listen: Option<SocketAddr>,
    /// Which agents and harnesses the server's runs use.
    pub(crate) choice: HarnessChoice,
    /// `--log-format`, over `[log] format`.
    pub(crate) log_format: Option<LogFormat>,
}

/// What [`ApiServer::bind`] needs from the process that hosts the runtime (`keel serve`, or a
/// cluster's coordinator node): the runtime, started with [`ApiMetrics::observer`] in its config,
/// and the event receiver [`Runtime::start`] returned (the API becomes its only reader).
pub(crate) struct Hosted<'a> {
    /// The started runtime.
    pub(crate) rt: Arc<Runtime>,
    /// Its events.
    pub(crate) events: mpsc::Receiver<RuntimeEvent>,
    /// The metrics its observer feeds.
    pub(crate) metrics: ApiMetrics,
    /// The home it hosts.
    pub(crate) home: &'a Home,
    /// The home's configuration (`[server]`, the budget, the snapshot stored with each run).
    pub(crate) config: &'a Config,
    /// Whether runs use the built-in scripted model (a brief then gets the survey plan).
    pub(crate) scripted: bool,
    /// Whether a brief without a plan runs as a lead session, as under `keel run`
    /// ([`crate::run::setup::NodeSetup::lead_capable`]).
    pub(crate) lead_capable: bool,
    /// Where sessions work.
    pub(crate) work_dir: PathBuf,
    /// The agent profiles of the runtime's supervisor (a request may name one).
    pub(crate) agents: Vec<String>,
    /// The runtime's `runs_in_flight_max`: more runs at once are refused with 503.
    pub(crate) runs_in_flight_max: u32,
    /// The accepted tokens.
    pub(crate) tokens: auth::Tokens,
}

/// The API's metrics, created before the runtime so its observer can be in the runtime's config.
#[derive(Debug, Clone)]
pub(crate) struct ApiMetrics(metrics::Metrics);

impl ApiMetrics {
    /// Every metric, registered.
    ///
    /// # Errors
    /// A metric definition is invalid (never for these).
    pub(crate) fn new() -> anyhow::Result<Self> {
        Ok(Self(metrics::Metrics::new()?))
    }

    /// The runtime's observer: put it in `RuntimeConfig::observer`.
    pub(crate) fn observer(&self) -> Arc<dyn RuntimeObserver> {
        Arc::new(self.0.clone())
    }

    /// What a cluster's coordinator endpoint tells its measurements
    /// (`keel_remote_dispatch_seconds`, `keel_cluster_frames_total`).
    pub(crate) fn endpoint_observer(&self) -> Arc<dyn keel_cluster::EndpointObserver> {
        Arc::new(self.0.clone())
    }
}

/// The API bound to its address, not yet answering.
pub(crate) struct ApiServer {
    app: Arc<routes::App>,
    listener: Listening,
    addr: SocketAddr,
}

/// What the API answers on: plain HTTP, or TLS when keel.toml names a certificate.
enum Listening {
    Plain(tokio::net::TcpListener),
    Tls(tls::TlsListener),
}

impl ApiServer {
    /// Bind `listen` and prepare the API over `hosted`, over TLS when its `[server]` names a
    /// certificate and key; the API starts reading the runtime's events at once.
    ///
    /// # Errors
    /// When the address cannot be bound, or the TLS files are unusable.
    pub(crate) async fn bind(hosted: Hosted<'_>, listen: SocketAddr) -> anyhow::Result<Self> {
        let server = &hosted.config.server;
        let in_home = |p: &PathBuf| hosted.home.dir().join(p);
        let acceptor = match (&server.tls_cert, &server.tls_key) {
            (Some(cert), Some(key)) => Some(tls::acceptor(&in_home(cert), &in_home(key))?),
            (None, None) => None,
            _ => anyhow::bail!("[server] needs tls_cert and tls_key together (or neither)"),
        };
        let tcp = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("listening on {listen}"))?;
        let addr = tcp.local_addr()?;
        let listener = match acceptor {
            Some(acceptor) => Listening::Tls(tls::TlsListener::new(tcp, acceptor)?),
            None => Listening::Plain(tcp),
        };
        let hub = hub::Hub::with_metrics(hosted.metrics.0.clone());
        tokio::spawn(hub.clone().pump(hosted.events));
        let (budget_micros, snapshot) = submission(hosted.config);
        let app = Arc::new(routes::App {
            rt: hosted.rt,
            home: hosted.home.clone(),
            hub,
            metrics: hosted.metrics.0,
            tokens: hosted.tokens,
            launch: routes::Launch {
                scripted: hosted.scripted,
                lead_capable: hosted.lead_capable,
                budget_micros,
                snapshot,
                agents: hosted.agents,
                work_dir: hosted.work_dir,
            },
            slots: Arc::new(Semaphore::new(hosted.runs_in_flight_max.max(1) as usize)),
            follow_ups: std::sync::Mutex::default(),
            ready: AtomicBool::new(true),
            body_bytes_max: hosted.config.server.body_bytes_max as usize,
        });
        Ok(Self {
            app,
            listener,
            addr,
        })
    }

    /// As [`ApiServer::run`], as the server of `home`: announced in its `server.json` (so local
    /// commands on the home submit here) once `banner` printed the URL, withdrawn when it stops.
    ///
    /// # Errors
    /// When the announcement cannot be written, `banner` fails, or serving fails.
    pub(crate) async fn serve_announced(
        self,
        home: &Home,
        shutdown: impl Future<Output = ()>,
        banner: impl FnOnce(&str) -> std::io::Result<()>,
    ) -> anyhow::Result<PauseSummary> {
        let tls = matches!(self.listener, Listening::Tls(_));
        discovery::write(home, self.addr, tls)?;
        let url = discovery::local_url(self.addr, tls);
        let served = async {
            banner(&url)?;
            {
                use std::io::Write;
                let _ = crate::stdout::lock().flush();
            }
            self.run(shutdown).await
        }
        .await;
        discovery::remove(home);
        served
    }

    /// Answer until `shutdown` resolves; then refuse new work (`/readyz` and run requests answer
    /// 503), pause every run as `keel run` does on a signal, tell each open event stream of a
    /// paused run so (`event: paused`), end the streams, and give open requests [`DRAIN_WAIT`]
    /// to finish. Returns what the pause did; stopping the runtime is the caller's.
    ///
    /// # Errors
    /// When serving fails.
    pub(crate) async fn run(
        self,
        shutdown: impl Future<Output = ()>,
    ) -> anyhow::Result<PauseSummary> {
        let ApiServer { app, listener, .. } = self;
        match listener {
            Listening::Plain(listener) => answer(app, listener, shutdown).await,
            Listening::Tls(listener) => answer(app, listener, shutdown).await,
        }
    }
}

/// [`ApiServer::run`] on one kind of listener.
async fn answer<L>(
    app: Arc<routes::App>,
    listener: L,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<PauseSummary>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug,
{
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let server = axum::serve(listener, routes::router(Arc::clone(&app))).with_graceful_shutdown(
        async move {
            let mut stopped = stopped;
            let _ = stopped.wait_for(|s| *s).await;
        },
    );
    let server = server.into_future();
    tokio::pin!(server);
    tokio::select! {
        r = &mut server => {
            r.context("serving the API")?;
            return Ok(app.rt.pause(PAUSE_WAIT).await);
        }
        () = shutdown => {}
    }
    app.ready.store(false, Ordering::Release);
    let paused = app.rt.pause(PAUSE_WAIT).await;
    for run in &paused.runs {
        app.hub.paused(
            *run,
            format!(
                "the keel server stopped ({} open tasks marked paused)",
                paused.tasks_paused
            ),
        );
    }
    app.hub.close();
    let _ = stop.send(true);
    // Requests still open after the wait (a long summary wait) are dropped.
    if let Ok(r) = tokio::time::timeout(DRAIN_WAIT, server).await {
        r.context("serving the API")?;
    }
    Ok(paused)
}

/// The agent profiles a request may name: those of the runtime's supervisor.
pub(crate) fn agent_names(config: &RuntimeConfig) -> Vec<String> {
    config
        .supervisor
        .agents
        .iter()
        .map(|a| a.name.clone())
        .collect()
}

/// SIGINT or SIGTERM.
///
/// # Errors
/// When the signal handlers cannot be installed.
pub(crate) async fn signalled() -> anyhow::Result<impl Future<Output = ()>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}

/// `keel serve`: host the runtime on `home` and answer the API until SIGINT or SIGTERM.
pub(crate) fn serve(home: &Home, args: ServeArgs, json: bool) -> anyhow::Result<()> {
    let config = home.config()?;
    init_logs(&config.log, args.log_format);
    let token_path = home.dir().join(&config.server.token_file);
    let (tokens, created) = auth::Tokens::load_or_create(&token_path)?;
    tokio_runtime()?.block_on(async {
        let store = node_store(home, crate::run::SERVED)?;
        let work = work_dir()?;
        let setup = node_setup(&config, &args.choice, &work, None).await?;
        let metrics = ApiMetrics::new()?;
        let mut runtime_config = setup.config.clone();
        runtime_config.observer = Some(metrics.observer());
        let agents = agent_names(&runtime_config);
        let runs_in_flight_max = runtime_config.runs_in_flight_max;
        let (rt, events) =
            Runtime::start(store, setup.harnesses.clone(), runtime_config).await?;
        crate::run::setup::attach_policy(&setup.policy, &rt);
        let rt = Arc::new(rt);
        let hosted = Hosted {
            rt: Arc::clone(&rt),
            events,
            metrics,
            home,
            config: &config,
            scripted: setup.scripted,
            lead_capable: setup.lead_capable(),
            work_dir: work,
            agents,
            runs_in_flight_max,
            tokens,
        };
        let server = ApiServer::bind(hosted, args.listen.unwrap_or(config.server.listen)).await?;
        let paused = server
            .serve_announced(home, signalled().await?, |url| {
                if json {
                    outln!(
                        "{}",
                        serde_json::json!({"url": url, "home": home.dir(), "token_file": token_path, "token_file_created": created, "pid": std::process::id()})
                    )
                } else {
                    if created {
                        outln!("created a token file {} (mode 0600)", token_path.display())?;
                    }
                    outln!(
                        "keel serve: listening on {url} (home {}, token file {})",
                        home.dir().display(),
                        token_path.display()
                    )
                }
            })
            .await?;
        if !paused.runs.is_empty() {
            outln!(
                "paused {} runs ({} open tasks marked paused); continue with `keel resume RUN` or on the next `keel serve`",
                paused.runs.len(),
                paused.tasks_paused
            )?;
        }
        if let Ok(rt) = Arc::try_unwrap(rt) {
            rt.shutdown().await;
        }
        drop(setup);
        Ok(())
    })
}
