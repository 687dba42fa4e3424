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
//! Shutdown: SIGINT or SIGTERM stops answering, ends every event stream, then pauses every run
//! as `keel run` does on a signal; `keel resume RUN` (or `POST /v1/runs/{run}/resume` on the next
//! server) continues them.

pub(crate) mod auth;
pub(crate) mod discovery;
mod error;
mod hub;
mod metrics;
mod routes;
pub(crate) mod wire;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use keel_actors::runtime::Runtime;
use tokio::sync::Semaphore;

use crate::config::LogFormat;
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

/// `keel serve`: host the runtime on `home` and answer the API until SIGINT or SIGTERM.
pub(crate) fn serve(home: &Home, args: ServeArgs, json: bool) -> anyhow::Result<()> {
    let config = home.config()?;
    init_logs(&config.log, args.log_format);
    let token_path = home.dir().join(&config.server.token_file);
    let (tokens, created) = auth::Tokens::load_or_create(&token_path)?;
    tokio_runtime()?.block_on(async {
        let store = node_store(home)?;
        let work = work_dir()?;
        let setup = node_setup(&config, &args.choice, &work).await?;
        let metrics = metrics::Metrics::new()?;
        let mut runtime_config = setup.config.clone();
        runtime_config.observer = Some(Arc::new(metrics.clone()));
        let slots = runtime_config.runs_in_flight_max.max(1) as usize;
        let agents = runtime_config
            .supervisor
            .agents
            .iter()
            .map(|a| a.name.clone())
            .collect();
        let (rt, events) =
            Runtime::start(store, setup.harnesses.clone(), runtime_config).await?;
        let rt = Arc::new(rt);
        let hub = hub::Hub::with_metrics(metrics.clone());
        tokio::spawn(hub.clone().pump(events));
        let listen = args.listen.unwrap_or(config.server.listen);
        let listener = tokio::net::TcpListener::bind(listen)
            .await
            .with_context(|| format!("listening on {listen}"))?;
        let addr = listener.local_addr()?;
        let (budget_micros, snapshot) = submission(&config);
        let app = Arc::new(routes::App {
            rt: Arc::clone(&rt),
            home: home.clone(),
            hub: hub.clone(),
            metrics,
            tokens,
            launch: routes::Launch {
                scripted: setup.scripted,
                budget_micros,
                snapshot,
                agents,
                work_dir: work.clone(),
            },
            slots: Arc::new(Semaphore::new(slots)),
            follow_ups: std::sync::Mutex::default(),
            ready: AtomicBool::new(true),
            body_bytes_max: config.server.body_bytes_max as usize,
        });
        discovery::write(home, addr)?;
        let url = discovery::local_url(addr);
        if json {
            outln!(
                "{}",
                serde_json::json!({"url": url, "home": home.dir(), "token_file": token_path, "token_file_created": created, "pid": std::process::id()})
            )?;
        } else {
            if created {
                outln!("created a token file {} (mode 0600)", token_path.display())?;
            }
            outln!(
                "keel serve: listening on {url} (home {}, token file {})",
                home.dir().display(),
                token_path.display()
            )?;
        }
        {
            use std::io::Write;
            let _ = crate::stdout::lock().flush();
        }
        let served = serve_until_signal(listener, routes::router(Arc::clone(&app)), &app).await;
        discovery::remove(home);
        drop(app);
        let paused = rt.pause(PAUSE_WAIT).await;
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
        served
    })
}

/// Serve until SIGINT or SIGTERM, then stop accepting, end the event streams, and give open
/// requests [`DRAIN_WAIT`] to finish.
async fn serve_until_signal(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    app: &routes::App,
) -> anyhow::Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let server = axum::serve(listener, router).with_graceful_shutdown(async move {
        let mut stopped = stopped;
        let _ = stopped.wait_for(|s| *s).await;
    });
    let server = server.into_future();
    tokio::pin!(server);
    tokio::select! {
        r = &mut server => return r.context("serving the API"),
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
    app.ready.store(false, Ordering::Release);
    app.hub.close();
    let _ = stop.send(true);
    match tokio::time::timeout(DRAIN_WAIT, server).await {
        Ok(r) => r.context("serving the API"),
        // Requests still open after the wait (a long summary wait) are dropped.
        Err(_) => Ok(()),
    }
}
