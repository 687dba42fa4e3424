//! The commands that run work: `keel run`, `keel resume`, `keel cancel`, `keel status`,
//! `keel model-server`. Each hosts keel's machines in the ractor runtime (`keel_actors::runtime`) on
//! the home's store, which this process opens as the only writer (readers such as `keel tree` may
//! open it beside it).
//!
//! Shutdown: SIGINT or SIGTERM pauses every run cooperatively (sessions cancelled, partial logs
//! checkpointed, open tasks marked paused) and exits with [`Ended::Paused`]; `keel resume RUN`
//! continues with resume preambles. A SIGKILL loses nothing acknowledged: `keel resume RUN`
//! continues from the checkpoint.

pub(crate) mod bench;
pub(crate) mod bench_hook;
pub(crate) mod bench_scale;
pub(crate) mod control;
pub(crate) mod demo;
pub(crate) mod follow_up;
pub(crate) mod progress;
pub(crate) mod setup;
pub(crate) mod summary;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, anyhow, bail};
use keel_actors::runtime::{
    NodeStore, PauseReason, RunHandle, Runtime, SPAN_TARGET, WaitError, scripted,
};
use keel_actors::{Plan, PlanStep, RunMode};
use keel_harness::scripted::Script;
use keel_harness::server::{ModelServer, ModelServerConfig};
use keel_store::{RunId, RunStatus, Sharing, Store, StoreConfig};

use crate::config::{LogFormat, LogSection};
use crate::home::Home;
use crate::stdout::outln;
use setup::{HarnessChoice, node_setup, work_dir};
use std::io::IsTerminal;

/// How long a graceful shutdown waits for sessions to end before killing them.
pub(crate) const PAUSE_WAIT: Duration = Duration::from_secs(10);
/// How often a process hosting runs answers `keel cancel` requests (`control.rs`).
const CONTROL_POLL: Duration = Duration::from_millis(200);
/// Most bytes of a plan file.
const PLAN_BYTES_MAX: u64 = 4 * 1024 * 1024;
/// Environment variable naming a file the run's id is written to once it is submitted (for
/// `--detach` and for scripts that need the id before the run ends).
pub(crate) const ANNOUNCE_ENV: &str = "KEEL_RUN_ANNOUNCE";

/// How a command that hosts a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ended {
    /// The run completed with a synthesis.
    Completed,
    /// The run ended without a usable synthesis (failed, budget, cancelled).
    NotCompleted,
    /// A signal paused it; `keel resume` continues it.
    Paused,
}

/// `keel run`'s arguments.
#[derive(Debug, Clone)]
pub(crate) struct RunArgs {
    /// The brief, as typed.
    pub(crate) brief: String,
    /// `--plan FILE`: a fixed plan instead of the default one.
    pub(crate) plan: Option<PathBuf>,
    /// Which agents and harnesses run it.
    pub(crate) choice: HarnessChoice,
    /// `--quiet`: the summary only, no live view.
    pub(crate) quiet: bool,
    /// `--detach`: run in a background process and return.
    pub(crate) detach: bool,
    /// `--log-format`, over `[log] format`.
    pub(crate) log_format: Option<LogFormat>,
}

/// The async runtime every `keel` command runs on (a node, a server, a run, the benches). Its
/// workers leave one CPU to the store writer: that one thread executes every group commit, and
/// every run waits on its acknowledgements. With as many workers as CPUs it waited for a CPU
/// behind them (on two CPUs, a third of its time runnable and not running); with one CPU left to
/// it, that wait is gone and a specialist costs less CPU, fewer wake-ups crossing threads
/// (docs/PERFORMANCE.md, "A CPU for the store writer"). `TOKIO_WORKER_THREADS` sets the count.
pub(crate) fn tokio_runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let workers = worker_threads(std::env::var_os(WORKER_THREADS_ENV).as_deref(), cpus)?;
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .context("starting the async runtime")
}

/// The environment variable that sets the runtime's worker count (tokio's own name for it; keel
/// reads it itself so that a bad value is an error, not a panic).
const WORKER_THREADS_ENV: &str = "TOKIO_WORKER_THREADS";

/// How many runtime workers: `set` (the environment's value) when given, else one fewer than the
/// CPUs, at least one.
fn worker_threads(set: Option<&std::ffi::OsStr>, cpus: usize) -> anyhow::Result<usize> {
    let Some(set) = set else {
        return Ok(cpus.saturating_sub(1).max(1));
    };
    set.to_str()
        .and_then(|s| s.trim().parse::<usize>().ok())
        .filter(|n| (1..=WORKER_THREADS_MAX).contains(n))
        .ok_or_else(|| {
            anyhow!(
                "{WORKER_THREADS_ENV} must be a whole number from 1 to {WORKER_THREADS_MAX}, got {set:?}"
            )
        })
}

/// The most workers `TOKIO_WORKER_THREADS` may ask for (each is an OS thread with its own stack).
const WORKER_THREADS_MAX: usize = 1024;

/// Environment variables that set the log filter, in the order they are looked at; the first one
/// set wins over `[log] level`.
const LOG_FILTER_ENV: [&str; 2] = ["KEEL_LOG", "RUST_LOG"];

/// Install the process's `tracing` subscriber: log lines to stderr (above the live view's bars), in
/// `format` when `--log-format` gave one, else in `[log] format`; filtered by `KEEL_LOG`, else
/// `RUST_LOG`, else `[log] level`. The runtime's run and task spans are always enabled (they cost one
/// allocation per run and per attempt), so any line that passes the filter names its run and task.
pub(crate) fn init_logs(section: &LogSection, format: Option<LogFormat>) {
    use tracing_subscriber::Layer;
    use tracing_subscriber::filter::{EnvFilter, FilterExt, filter_fn};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let mut filter = None;
    for var in LOG_FILTER_ENV {
        let Ok(value) = std::env::var(var) else {
            continue;
        };
        match EnvFilter::builder().parse(&value) {
            Ok(f) => {
                filter = Some(f);
                break;
            }
            Err(e) => eprintln!("keel: ignoring {var}={value:?}: {e}"),
        }
    }
    // `[log] level` was checked when keel.toml was read.
    let filter = filter.unwrap_or_else(|| {
        EnvFilter::builder()
            .parse(&section.level)
            .unwrap_or_else(|_| EnvFilter::new(crate::config::LOG_LEVEL_DEFAULT))
    });
    let spans = filter_fn(|meta| meta.is_span() && meta.target() == SPAN_TARGET)
        .with_max_level_hint(tracing::Level::INFO);
    let filter = filter.or(spans);
    let registry = tracing_subscriber::registry();
    let _ = match format.unwrap_or(section.format) {
        LogFormat::Json => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_current_span(true)
                    .with_span_list(true)
                    .with_writer(progress::AboveBars)
                    .with_filter(filter),
            )
            .try_init(),
        LogFormat::Human => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_ansi(std::io::stderr().is_terminal())
                    .with_writer(progress::AboveBars)
                    .with_filter(filter),
            )
            .try_init(),
    };
}

/// How `keel run`, `resume`, `follow-up`, `cancel`, `answer`, `demo`, `keel node --run` and
/// `keel node --share-store` open the home's store as its writer: sharing it with readers, so that the read commands (`keel runs`,
/// `tree`, ...) open the file read-only beside them. The price: redb commits in two phases then,
/// two fdatasyncs a commit instead of one (docs/STORE.md, "Sharing").
pub(crate) const SHARED: Sharing = Sharing::WithReaders;

/// How `keel serve` and a coordinator daemon (`keel node` with its API) open the home's store: alone, with its journal (one fdatasync of one appended record a commit). No other process can
/// open the file then; the read commands on the home go through the server instead
/// (`server.json`, [`crate::serve::discovery`]).
pub(crate) const SERVED: Sharing = Sharing::Exclusive;

/// The configuration a writer opens the store with: alone, with the store's journal (a commit is
/// durable once its record is synced to `keel.redb.journal`, and the store file gets a durable
/// commit every few dozen commits); shared, without (readers in other processes read the file).
pub(crate) fn writer_config(sharing: Sharing) -> StoreConfig {
    StoreConfig {
        sharing,
        journal: sharing == Sharing::Exclusive,
        ..StoreConfig::default()
    }
}

/// Open the home's store as its only writer, sharing it with readers ([`SHARED`]).
pub(crate) fn open_writer(home: &Home) -> anyhow::Result<Arc<Store>> {
    open_writer_as(home, SHARED)
}

/// How long an open of the store alone ([`SERVED`]) waits for the other processes that have it
/// open to close it: a read command, `keel store backup`, `keel doctor` hold it for moments.
const EXCLUSIVE_OPEN_WAIT: Duration = Duration::from_secs(10);
/// How often it tries again.
const EXCLUSIVE_OPEN_EVERY: Duration = Duration::from_millis(100);

/// Open the home's store as its only writer, shared or alone. Alone, a store another process has
/// open is tried again for [`EXCLUSIVE_OPEN_WAIT`], saying so once on stderr.
fn open_writer_as(home: &Home, sharing: Sharing) -> anyhow::Result<Arc<Store>> {
    let path = home.store_path()?;
    if !path.is_file() {
        // First use: create the home (keel.toml and an empty store).
        home.init()?;
    }
    let started = std::time::Instant::now();
    let mut told = false;
    loop {
        match Store::open_with(&path, writer_config(sharing)) {
            Ok(store) => return Ok(Arc::new(store)),
            Err(keel_store::OpenError::Locked)
                if sharing == SERVED && started.elapsed() < EXCLUSIVE_OPEN_WAIT =>
            {
                if !told {
                    eprintln!(
                        "keel: the store at {} is open in another keel process (a read command, `keel store backup`, `keel doctor`, or a run writing it); waiting up to {} s for it to close",
                        path.display(),
                        EXCLUSIVE_OPEN_WAIT.as_secs()
                    );
                    told = true;
                }
                std::thread::sleep(EXCLUSIVE_OPEN_EVERY);
            }
            Err(reason) => return Err(home.open_failed(path, reason).into()),
        }
    }
}

/// The store a node hosting runs writes, shared with readers ([`SHARED`]: `keel run`, `resume`,
/// `follow-up`, `keel node --run`) or alone ([`SERVED`]: `keel serve`, a coordinator daemon): [`open_writer`]'s, opened again
/// from the same file, the same way, after a write fails on it (redb refuses a handle after one
/// failed write).
pub(crate) fn node_store(home: &Home, sharing: Sharing) -> anyhow::Result<NodeStore> {
    let store = open_writer_as(home, sharing)?;
    let path = home.store_path()?;
    Ok(NodeStore::reopenable(store, move || {
        Store::open_with(&path, writer_config(sharing))
    }))
}

pub(crate) fn read_plan(path: &Path) -> anyhow::Result<Plan> {
    let meta = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if meta.len() > PLAN_BYTES_MAX {
        bail!("{} is larger than {PLAN_BYTES_MAX} bytes", path.display());
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let plan: Plan = if path.extension().is_some_and(|e| e == "toml") {
        toml::from_str(&text).with_context(|| format!("{} is not a plan", path.display()))?
    } else {
        serde_json::from_str(&text).with_context(|| format!("{} is not a plan", path.display()))?
    };
    keel_actors::plan::validate(plan.clone()).map_err(|e| anyhow!("{}: {e}", path.display()))?;
    Ok(plan)
}

/// Write the run's id (and a follow-up's task id after it) where `--detach` (or a script) waits
/// for it, when asked to.
pub(crate) fn announce(run: RunId, task: Option<keel_store::TaskId>) -> anyhow::Result<()> {
    if let Some(path) = std::env::var_os(ANNOUNCE_ENV) {
        let text = match task {
            Some(task) => format!("{run} {task}"),
            None => run.to_string(),
        };
        crate::private::write_file(Path::new(&path), text.as_bytes())
            .with_context(|| format!("writing the run id to {}", PathBuf::from(&path).display()))?;
    }
    Ok(())
}

/// How hosting a run ended.
pub(crate) enum Hosted<T> {
    /// What was waited for (the run's end, a follow-up's outcome).
    Ended(T),
    /// SIGINT or SIGTERM: the caller pauses the node.
    Signal,
    /// The runtime paused the run by itself (a full disk): nothing more to do but say so.
    Paused(PauseReason),
}

/// Wait for `finished` while hosting runs: `keel cancel` requests from other processes are
/// answered (`control.rs`), and `keel answer`'s answers passed to the runtime; SIGINT or SIGTERM
/// ends the wait with [`Hosted::Signal`] (the caller pauses the node).
pub(crate) async fn host_until<T>(
    home: &Home,
    rt: &Runtime,
    finished: impl std::future::Future<Output = Result<T, WaitError>>,
) -> anyhow::Result<Hosted<T>> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    tokio::pin!(finished);
    loop {
        tokio::select! {
            r = &mut finished => return match r {
                Ok(done) => Ok(Hosted::Ended(done)),
                Err(WaitError::Paused { reason, .. }) => Ok(Hosted::Paused(reason)),
                Err(e) => Err(e.into()),
            },
            _ = term.recv() => return Ok(Hosted::Signal),
            _ = int.recv() => return Ok(Hosted::Signal),
            () = tokio::time::sleep(CONTROL_POLL) => {
                control::serve_requests(home, rt).await;
                // `keel answer` from another terminal (docs/DESIGN.md §9).
                crate::escalations::take_answers(home, rt).await;
            }
        }
    }
}

/// What the live view counted, once it ended at the run's `Finished` event (bounded in case the
/// event was dropped).
pub(crate) async fn view_usage(
    rt: &Runtime,
    view: tokio::task::JoinHandle<progress::Totals>,
) -> summary::Usage {
    let totals = match tokio::time::timeout(Duration::from_secs(2), view).await {
        Ok(Ok(totals)) => Some(totals),
        _ => None,
    };
    summary::Usage {
        totals,
        events_dropped: rt.events_dropped(),
    }
}

/// Host one run until it ends, a signal pauses it, or `keel cancel` asks to cancel it.
pub(crate) async fn drive(
    home: &Home,
    rt: &Runtime,
    handle: RunHandle,
    view: tokio::task::JoinHandle<progress::Totals>,
    json: bool,
) -> anyhow::Result<Ended> {
    let run = handle.id();
    announce(run, None)?;
    let (outcome, view) = match host_until(home, rt, handle.finished()).await? {
        Hosted::Ended(outcome) => (outcome, view),
        Hosted::Signal => match pause(rt, run, view, json).await? {
            Stopped::Paused => return Ok(Ended::Paused),
            Stopped::RunEnded(outcome, view) => (outcome, view),
        },
        Hosted::Paused(reason) => return paused(run, view, &reason, json),
    };
    let usage = view_usage(rt, view).await;
    summary::print(home, &*rt.store()?, run, &outcome, &usage, json)?;
    Ok(if outcome.status == RunStatus::Completed {
        Ended::Completed
    } else {
        Ended::NotCompleted
    })
}

/// How a graceful stop ended.
pub(crate) enum Stopped {
    /// The run is paused (said on stdout); `keel resume` continues it.
    Paused,
    /// The run had ended (durably) when the signal came: nothing was paused, and the caller
    /// reports the end the store holds, with the live view's totals.
    RunEnded(
        keel_actors::runtime::RunOutcome,
        tokio::task::JoinHandle<progress::Totals>,
    ),
}

/// A graceful stop on SIGINT/SIGTERM: the runtime pauses the run (sessions cancelled, partial work
/// durable, tasks marked paused) so `keel resume` continues it with resume preambles. A run whose
/// end was already durable is not paused: the store's end is what the caller reports.
pub(crate) async fn pause(
    rt: &Runtime,
    run: RunId,
    view: tokio::task::JoinHandle<progress::Totals>,
    json: bool,
) -> anyhow::Result<Stopped> {
    let summary = rt.pause(PAUSE_WAIT).await;
    if !summary.runs.contains(&run) {
        let row = rt.store()?.catalog().run(run)?;
        if row.status.is_terminal() {
            let outcome = keel_actors::runtime::RunOutcome {
                run,
                status: row.status,
                outcome: row.outcome.unwrap_or_default(),
            };
            return Ok(Stopped::RunEnded(outcome, view));
        }
    }
    view.abort();
    if json {
        outln!(
            "{}",
            serde_json::json!({
                "run": run.to_string(),
                "status": "paused",
                "tasks_paused": summary.tasks_paused,
                "specialists_killed": summary.specialists_killed,
            })
        )?;
    } else {
        outln!(
            "paused run {run}: {} open tasks marked paused; continue with `keel resume {run}`",
            summary.tasks_paused
        )?;
    }
    Ok(Stopped::Paused)
}

/// The runtime paused the run by itself (a full disk): say why and how to go on, and end as a
/// paused run (exit 6).
pub(crate) fn paused(
    run: RunId,
    view: tokio::task::JoinHandle<progress::Totals>,
    reason: &PauseReason,
    json: bool,
) -> anyhow::Result<Ended> {
    view.abort();
    if json {
        outln!(
            "{}",
            serde_json::json!({
                "run": run.to_string(),
                "status": "paused",
                "reason": reason.to_string(),
            })
        )?;
    } else {
        outln!("paused run {run}: {reason}; continue with `keel resume {run}`")?;
    }
    Ok(Ended::Paused)
}

/// How long `keel run --detach` waits for the background process to announce its run.
const DETACH_WAIT: Duration = Duration::from_secs(30);

/// `keel run --detach` (and `keel follow-up --detach`, `what` naming it): start this same command
/// without `--detach` in its own process group, its output in a log file of the home, and return
/// once it has submitted its run.
fn detach(home: &Home, what: &str, json: bool) -> anyhow::Result<Ended> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("locating the keel binary")?;
    let args: Vec<std::ffi::OsString> = std::env::args_os()
        .skip(1)
        .filter(|a| a != "--detach")
        .collect();
    if !home.store_path()?.is_file() {
        home.init()?;
    }
    let pid = std::process::id();
    let logs = home.dir().join("logs");
    crate::private::create_dir(&logs).with_context(|| format!("creating {}", logs.display()))?;
    let log_path = logs.join(format!("run-{pid}.log"));
    let announce = logs.join(format!("run-{pid}.id"));
    let log = crate::private::create_file(&log_path)
        .with_context(|| format!("creating {}", log_path.display()))?;
    let mut child = std::process::Command::new(exe)
        .args(args)
        .env(ANNOUNCE_ENV, &announce)
        .stdin(std::process::Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own process group: a Ctrl-C at this terminal does not reach it.
        .process_group(0)
        .spawn()
        .with_context(|| format!("starting the background {what}"))?;
    let deadline = std::time::Instant::now() + DETACH_WAIT;
    let announced = || {
        std::fs::read_to_string(&announce)
            .ok()
            .filter(|text| !text.trim().is_empty())
    };
    let text = loop {
        if let Some(text) = announced() {
            break text;
        }
        if let Ok(Some(status)) = child.try_wait() {
            // It may have announced just before it ended.
            if let Some(text) = announced() {
                break text;
            }
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            bail!(
                "the background {what} ended before it started ({status}): {}",
                log.trim()
            );
        }
        if std::time::Instant::now() >= deadline {
            bail!(
                "the background {what} did not start within {DETACH_WAIT:?}; see {}",
                log_path.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let _ = std::fs::remove_file(&announce);
    // The announcement is the run's id, then (for a follow-up) its task's id.
    let mut ids = text.split_whitespace();
    let run = ids.next().unwrap_or_default().to_string();
    let task = ids.next().map(str::to_string);
    if json {
        outln!(
            "{}",
            serde_json::json!({"run": run, "task": task, "pid": child.id(), "log": log_path})
        )?;
    } else {
        // A follow-up is stopped by its task's id: `keel cancel RUN` would name the whole run.
        let (subject, stop) = match &task {
            Some(task) => (format!("{what} {task} on run {run}"), task.clone()),
            None => (format!("{what} {run}"), run.clone()),
        };
        outln!(
            "{subject} started in the background (pid {}); log {}\nfollow with `keel status {run}`, stop with `keel cancel {stop}`",
            child.id(),
            log_path.display()
        )?;
    }
    Ok(Ended::Completed)
}

/// What runs for a brief (`keel run` and the HTTP API's submit): the plan given, else the
/// scripted survey plan on the built-in scripted model, else a lead session on `agent` when
/// `lead_capable` (the node serves keel's session tools to that harness), else the brief as one
/// step on `agent`.
///
/// # Errors
/// When the built-in plan cannot be made for the brief.
pub(crate) fn run_mode(
    brief: &str,
    plan: Option<Plan>,
    scripted: bool,
    lead_capable: bool,
    agent: Option<String>,
) -> anyhow::Result<RunMode> {
    Ok(match plan {
        Some(plan) => RunMode::Plan(plan),
        None if scripted => {
            RunMode::Plan(scripted::survey_plan(brief).map_err(|e| anyhow!("built-in plan: {e}"))?)
        }
        // A real harness without a plan: a lead session decomposes the brief through the
        // `delegate` tool of the node's MCP endpoint.
        None if lead_capable => RunMode::Lead {
            agent,
            constraints: Vec::new(),
        },
        // Harnesses without an MCP client only (pi), or a caller that asks for no lead: the
        // brief is one step.
        None => RunMode::Plan(Plan {
            steps: vec![PlanStep {
                key: "brief".into(),
                brief: brief.to_owned(),
                goal: brief.to_owned(),
                quality_criteria: Vec::new(),
                output_schema: None,
                assignee: agent,
                depends_on: Vec::new(),
                estimate_micros: 0,
            }],
            constraints: Vec::new(),
        }),
    })
}

/// A run's budget in micro-dollars and the configuration snapshot it is submitted with.
pub(crate) fn submission(config: &crate::config::Config) -> (Option<u64>, String) {
    let budget = config
        .supervisor
        .run_budget_usd
        .map(|d| (d * 1_000_000.0).round() as u64);
    (budget, toml::to_string(config).unwrap_or_default())
}

/// `keel run "BRIEF"`.
pub(crate) fn run(home: &Home, args: RunArgs, json: bool) -> anyhow::Result<Ended> {
    if args.detach {
        return detach(home, "run", json);
    }
    let config = home.config()?;
    init_logs(&config.log, args.log_format);
    tokio_runtime()?.block_on(async {
        let store = node_store(home, SHARED)?;
        let work = work_dir()?;
        let setup = node_setup(&config, &args.choice, &work, None).await?;
        let plan = args.plan.as_deref().map(read_plan).transpose()?;
        let mode = run_mode(
            &args.brief,
            plan,
            setup.scripted,
            setup.lead_capable(),
            args.choice.agent.clone(),
        )?;
        let (budget, snapshot) = submission(&config);
        let agents = setup.config.supervisor.agents.clone();
        let (rt, events) = Runtime::start(store, setup.harnesses, setup.config).await?;
        setup::attach_policy(&setup.policy, &rt);
        let view = tokio::spawn(progress::show(events, args.quiet || json));
        let handle = rt
            .submit(args.brief.clone(), mode, budget, snapshot)
            .await?;
        setup::record_profiles(&rt, handle.id(), &agents);
        if !json && !args.quiet {
            outln!("run {} started in {}", handle.id(), work.display())?;
        }
        let ended = drive(home, &rt, handle, view, json).await;
        rt.shutdown().await;
        ended
    })
}

/// `keel resume RUN`.
pub(crate) fn resume(
    home: &Home,
    run: RunId,
    choice: HarnessChoice,
    quiet: bool,
    log_format: Option<LogFormat>,
    json: bool,
) -> anyhow::Result<Ended> {
    let config = home.config()?;
    init_logs(&config.log, log_format);
    tokio_runtime()?.block_on(async {
        let store = node_store(home, SHARED)?;
        let work = work_dir()?;
        let setup = node_setup(&config, &choice, &work, None).await?;
        let (rt, events) = Runtime::start(store, setup.harnesses, setup.config).await?;
        setup::attach_policy(&setup.policy, &rt);
        let view = tokio::spawn(progress::show(events, quiet || json));
        let handle = rt.resume(run).await?;
        if !json && !quiet {
            outln!("run {run} resumed in {}", work.display())?;
        }
        let ended = drive(home, &rt, handle, view, json).await;
        rt.shutdown().await;
        ended
    })
}

/// What `keel cancel ID` names, read from the store.
enum CancelTarget {
    /// A run.
    Run(keel_store::Run),
    /// A task (its step is cancelled; the root task names its run), the newest task of its
    /// re-dispatch chain (whose status is the step's), and its run.
    Task(keel_store::Task, keel_store::Task, keel_store::Run),
}

/// Why `keel cancel` refused before asking anyone.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CancelRefused {
    /// The id is neither a run nor a task of the store.
    #[error("no run or task {0} in the store")]
    Unknown(RunId),
    /// The run has ended: a cancel would change nothing (and never replaces a finished run's
    /// outcome).
    #[error("run {run} has already ended ({status:?}); nothing to cancel")]
    Ended {
        /// The run.
        run: RunId,
        /// How it ended.
        status: RunStatus,
    },
    /// The task's step has ended.
    #[error("task {task} has already ended ({status:?}); nothing to cancel")]
    TaskEnded {
        /// The task (the newest of its re-dispatch chain).
        task: keel_store::TaskId,
        /// How it ended.
        status: keel_store::TaskStatus,
    },
}

/// What `id` names in `store`: a run, else a task.
fn cancel_target(store: &Store, id: RunId) -> anyhow::Result<CancelTarget> {
    use keel_store::{ReadError, TaskKind};
    let catalog = store.catalog();
    match catalog.run(id) {
        Ok(run) => return Ok(CancelTarget::Run(run)),
        Err(ReadError::NotFound { .. }) => {}
        Err(e) => return Err(e.into()),
    }
    let task = match catalog.task(keel_store::TaskId(id.0)) {
        Ok(task) => task,
        Err(ReadError::NotFound { .. }) => return Err(CancelRefused::Unknown(id).into()),
        Err(e) => return Err(e.into()),
    };
    let run = catalog.run(task.run_id)?;
    let tasks = keel_actors::host::store::all_tasks(&store.run(run.id))?;
    let mut last = task.clone();
    // Bounded by the number of tasks: each step moves to a newer task.
    for _ in 0..tasks.len() {
        match tasks
            .iter()
            .filter(|t| t.kind == TaskKind::Redispatch && t.parent == Some(last.id))
            .max_by_key(|t| t.id)
        {
            Some(next) => last = next.clone(),
            None => break,
        }
    }
    Ok(CancelTarget::Task(task, last, run))
}

/// Refuse what has ended, before anyone is asked: a run that has ended, or a step whose newest
/// task has.
fn check_cancellable(target: &CancelTarget) -> Result<(), CancelRefused> {
    let run = match target {
        CancelTarget::Run(run) | CancelTarget::Task(_, _, run) => run,
    };
    if run.status.is_terminal() {
        return Err(CancelRefused::Ended {
            run: run.id,
            status: run.status,
        });
    }
    if let CancelTarget::Task(named, last, _) = target
        && named.parent.is_some()
        && last.status.is_terminal()
    {
        return Err(CancelRefused::TaskEnded {
            task: last.id,
            status: last.status,
        });
    }
    Ok(())
}

/// Refuse a cancel of `id` before anyone is asked: an id that is neither a run nor a task
/// ([`CancelRefused::Unknown`]), a run that has ended or a step whose newest task has. The HTTP
/// API's task cancel refuses with it as `keel cancel` does.
///
/// # Errors
/// [`CancelRefused`], or the store's read error.
pub(crate) fn check_cancel(store: &Store, id: RunId) -> anyhow::Result<()> {
    Ok(check_cancellable(&cancel_target(store, id)?)?)
}

/// `keel cancel ID`: a run (every open task, or, for a run reopened for follow-ups, those
/// follow-ups only) or a task (its step; a follow-up, most often). An unknown id and whatever has
/// ended are refused first, from a read-only open that works beside a running keel. Then: carried
/// out here when no process holds the store, else asked of the process that does, which answers
/// (`control.rs`); a request nobody takes is taken back, never left behind.
pub(crate) fn cancel(home: &Home, id: RunId, json: bool) -> anyhow::Result<()> {
    let reason = "cancelled by an operator";
    // A store a crash left needing repair cannot be read beside a writer: the writer path decides.
    let target = match home.open_existing() {
        Ok(store) => Some(cancel_target(&store, id)?),
        Err(e @ crate::home::HomeError::Missing { .. }) => return Err(e.into()),
        Err(_) => None,
    };
    if let Some(target) = &target {
        check_cancellable(target)?;
    }
    let rt = tokio_runtime()?;
    match open_writer(home) {
        Ok(store) => rt.block_on(async {
            let target = match target {
                Some(target) => target,
                None => {
                    let target = cancel_target(&store, id)?;
                    check_cancellable(&target)?;
                    target
                }
            };
            let (node, _events) = Runtime::start(
                store,
                keel_actors::runtime::HarnessSet::new(),
                keel_actors::runtime::RuntimeConfig::default(),
            )
            .await?;
            let result = match target {
                CancelTarget::Task(task, _, _) => node
                    .cancel_task(task.id, reason)
                    .await
                    .map(|done| match done {
                        keel_actors::runtime::TaskCancel::Stored { run, tasks } => {
                            (run, tasks, Some(task.id))
                        }
                        keel_actors::runtime::TaskCancel::Sent { run } => (run, 0, Some(task.id)),
                    }),
                CancelTarget::Run(_) => node.cancel_stored(id, reason).await.map(|t| (id, t, None)),
            };
            node.shutdown().await;
            let (run, tasks, task) = result?;
            if json {
                let mut value = serde_json::json!({"run": run.to_string(), "status": "cancelled", "tasks_cancelled": tasks});
                if let Some(task) = task {
                    value["task"] = task.to_string().into();
                }
                outln!("{value}")?;
            } else if let Some(task) = task {
                outln!("task {task} of run {run} cancelled")?;
            } else {
                outln!("run {run} cancelled ({tasks} open tasks cancelled)")?;
            }
            Ok(())
        }),
        Err(e) if is_locked(&e) => {
            // Another process holds the store: it carries the request out and answers.
            let answer = control::request(home, id, reason)?;
            if json {
                outln!(
                    "{}",
                    serde_json::json!({"id": id.to_string(), "run": answer.run, "status": answer.status, "tasks_cancelled": answer.tasks, "holder_pid": answer.holder})
                )?;
            } else {
                outln!("{}", answer.message)?;
            }
            Ok(())
        }
        Err(e) => Err(e),
    }
}

/// Whether opening the store failed because another process holds it for writing.
pub(crate) fn is_locked(e: &anyhow::Error) -> bool {
    matches!(
        e.downcast_ref::<crate::home::HomeError>(),
        Some(crate::home::HomeError::Held { .. })
    )
}

/// `keel model-server`: serve the scripted model on 127.0.0.1 until SIGINT or SIGTERM.
pub(crate) fn model_server(
    script: Option<PathBuf>,
    port: u16,
    record_dir: Option<PathBuf>,
) -> anyhow::Result<()> {
    let script = match script {
        Some(path) => Script::from_path(&path).map_err(|e| anyhow!("{}: {e}", path.display()))?,
        None => Script::rules(),
    };
    tokio_runtime()?.block_on(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut config = ModelServerConfig::new(script);
        config.bind.set_port(port);
        config.record_dir = record_dir;
        let server = ModelServer::start(config).await?;
        outln!("listening on {}", server.base_url())?;
        use std::io::Write;
        let _ = std::io::stdout().flush();
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        server.shutdown().await?;
        Ok(())
    })
}

#[cfg(test)]
mod runtime_tests {
    use super::worker_threads;
    use std::ffi::OsStr;

    #[test]
    fn the_workers_leave_the_store_writer_a_cpu() {
        assert_eq!(worker_threads(None, 1).ok(), Some(1));
        assert_eq!(worker_threads(None, 2).ok(), Some(1));
        assert_eq!(worker_threads(None, 16).ok(), Some(15));
    }

    #[test]
    fn the_environment_sets_the_count_and_a_bad_value_is_an_error() {
        assert_eq!(worker_threads(Some(OsStr::new("3")), 2).ok(), Some(3));
        assert_eq!(worker_threads(Some(OsStr::new(" 2 ")), 8).ok(), Some(2));
        for bad in ["0", "-1", "two", "", "1025"] {
            let e = worker_threads(Some(OsStr::new(bad)), 2)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default();
            assert!(e.contains("TOKIO_WORKER_THREADS"), "{bad:?}: {e}");
        }
    }
}
