//! `keel bench --scale-runs N`: keel at scale, measured on the real path.
//!
//! A keel home in a temporary folder gets N stored runs (4 specialists each, run for real by the
//! runtime with the instant harness, 8 in flight), then one run of `--scale-fan-out` specialists
//! (1,024 by default), timed. Memory per in-flight run is the growth of the process's resident set
//! while 8 runs of 16 specialists (then one run of the large fan-out) are held in flight, their
//! sessions started and waiting. That large run is then paused (as by SIGTERM) with every session
//! started, so the home holds one open run among N finished ones, and the bench times what a
//! restart pays: the store-wide scan for open runs with their rows (`recover_open_runs`), and
//! `Runtime::resume` of the large run (its rows read, the run marked running, its coordinator
//! rebuilt), then the resumed run to its end. Last, `keel runs` and `keel tree RUN` on the large
//! run are timed as processes of this very binary on that home, as a user runs them.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, anyhow};
use keel_actors::RunMode;
use keel_actors::runtime::{HarnessSet, Runtime};
use keel_harness::session::BoxFuture;
use keel_harness::{
    Harness, HarnessEvent, HarnessKind, RunningSession, SessionSpec, StartError, StopReason,
    session_channel,
};
use keel_store::{RunStatus, Store};
use tokio::sync::watch;

use super::bench::{config, plan, report, subtask_of};
use crate::stdout::outln;

/// Most stored runs the bench writes.
pub(crate) const SCALE_RUNS_MAX: u32 = 100_000;
/// Most specialists in the large run.
pub(crate) const SCALE_FAN_OUT_MAX: u32 = keel_actors::plan::PLAN_STEPS_MAX as u32;

/// Specialists per stored run.
const STORED_FAN_OUT: u32 = 4;
/// Runs held in flight for the memory figure, and their fan-out.
const HELD_RUNS: u32 = 8;
const HELD_FAN_OUT: u32 = 16;
/// How often each command is timed (the median is reported).
const COMMAND_REPEATS: usize = 5;

/// A harness whose sessions report at once, or, while the gate is closed, once it opens.
struct GatedInstantHarness {
    open: watch::Receiver<bool>,
    started: Arc<AtomicU64>,
}

impl Harness for GatedInstantHarness {
    fn kind(&self) -> HarnessKind {
        HarnessKind::Scripted
    }

    fn start(&self, spec: SessionSpec) -> BoxFuture<'_, Result<RunningSession, StartError>> {
        let mut open = self.open.clone();
        let started = Arc::clone(&self.started);
        Box::pin(async move {
            let task = subtask_of(&spec)?;
            let (sink, _cancel, session) = session_channel(HarnessKind::Scripted);
            tokio::spawn(async move {
                sink.send(HarnessEvent::Started {
                    native_session_id: None,
                    model: None,
                })
                .await;
                started.fetch_add(1, Ordering::Relaxed);
                // A closed sender (the runtime gone) ends the wait as well.
                let _ = open.wait_for(|o| *o).await;
                sink.send(HarnessEvent::Finished {
                    stop_reason: StopReason::EndTurn,
                    final_text: report(&task),
                })
                .await;
            });
            Ok(session)
        })
    }
}

/// The process's resident set in bytes (Linux `/proc/self/status`), 0 where it cannot be read.
fn resident_bytes() -> u64 {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return 0;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

#[allow(clippy::disallowed_methods)] // A benchmark reads the clock by definition.
fn now() -> Instant {
    Instant::now()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Wait until `started` reaches `n` sessions (bounded: a stuck run is an error, not a hang).
async fn wait_started(started: &AtomicU64, n: u64) -> anyhow::Result<()> {
    for _ in 0..60_000 {
        if started.load(Ordering::Relaxed) >= n {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Err(anyhow!(
        "only {} of {n} sessions started",
        started.load(Ordering::Relaxed)
    ))
}

fn open_store(path: &Path) -> anyhow::Result<Arc<Store>> {
    Ok(Arc::new(Store::open_with(
        path,
        super::writer_config(super::SHARED),
    )?))
}

/// What the bench measured.
#[derive(serde::Serialize)]
struct Scale {
    stored_runs: u32,
    fill_s: f64,
    fan_out: u32,
    large_run_ms: f64,
    held_run_bytes: f64,
    large_run_in_flight_bytes: f64,
    recover_open_runs_ms: f64,
    resume_ms: f64,
    resumed_to_end_ms: f64,
    keel_runs_ms: f64,
    keel_tree_ms: f64,
    store_bytes: u64,
}

/// The runtime, its gate and its count of started sessions.
struct Hosted {
    rt: Runtime,
    gate: watch::Sender<bool>,
    started: Arc<AtomicU64>,
}

async fn host(store: Arc<Store>, work: &Path, fan_out: u32) -> anyhow::Result<Hosted> {
    let (gate, open) = watch::channel(true);
    let started = Arc::new(AtomicU64::new(0));
    let harness = GatedInstantHarness {
        open,
        started: Arc::clone(&started),
    };
    let harnesses = HarnessSet::new().with(HarnessKind::Scripted, Arc::new(harness));
    let mut c = config(work, fan_out, HELD_RUNS);
    c.supervisor.specialists_max = fan_out.max(HELD_RUNS * HELD_FAN_OUT);
    let (rt, events) = Runtime::start(store, harnesses, c).await?;
    drop(events);
    Ok(Hosted { rt, gate, started })
}

async fn measure(home: &Path, stored_runs: u32, fan_out: u32) -> anyhow::Result<Scale> {
    let store_path = home.join(crate::home::STORE_FILE);
    let store = open_store(&store_path)?;
    let hosted = host(Arc::clone(&store), home, fan_out).await?;
    let rt = Arc::new(hosted.rt);

    // Memory first, while the allocator holds little freed memory to reuse.
    // Memory per in-flight run: 8 runs of 16 held with every session started.
    hosted.gate.send_replace(false);
    let before = resident_bytes();
    let base = hosted.started.load(Ordering::Relaxed);
    let mut held = Vec::new();
    for _ in 0..HELD_RUNS {
        let h = rt
            .submit(
                "held".into(),
                RunMode::Plan(plan(HELD_FAN_OUT)),
                None,
                String::new(),
            )
            .await?;
        held.push(tokio::spawn(h.finished()));
    }
    wait_started(&hosted.started, base + u64::from(HELD_RUNS * HELD_FAN_OUT)).await?;
    #[allow(clippy::cast_precision_loss)] // Byte counts far below 2^52.
    let held_run_bytes = resident_bytes().saturating_sub(before) as f64 / f64::from(HELD_RUNS);
    hosted.gate.send_replace(true);
    for h in held {
        completed(h.await??.status)?;
    }

    // The large run held in flight with every session started, then let go.
    hosted.gate.send_replace(false);
    let before = resident_bytes();
    let base = hosted.started.load(Ordering::Relaxed);
    let h = rt
        .submit(
            "held".into(),
            RunMode::Plan(plan(fan_out)),
            None,
            String::new(),
        )
        .await?;
    wait_started(&hosted.started, base + u64::from(fan_out)).await?;
    #[allow(clippy::cast_precision_loss)] // Byte counts far below 2^52.
    let large_run_in_flight_bytes = resident_bytes().saturating_sub(before) as f64;
    hosted.gate.send_replace(true);
    completed(h.finished().await?.status)?;

    // The stored runs, 8 in flight.
    let t = now();
    let mut handles = Vec::new();
    for _ in 0..stored_runs {
        let h = rt
            .submit(
                "stored".into(),
                RunMode::Plan(plan(STORED_FAN_OUT)),
                None,
                String::new(),
            )
            .await?;
        handles.push(tokio::spawn(h.finished()));
        if handles.len() >= 64 {
            for h in handles.drain(..) {
                completed(h.await??.status)?;
            }
        }
    }
    for h in handles {
        completed(h.await??.status)?;
    }
    let fill_s = t.elapsed().as_secs_f64();

    // One large run, timed from submission to its end.
    let t = now();
    let h = rt
        .submit(
            "large".into(),
            RunMode::Plan(plan(fan_out)),
            None,
            String::new(),
        )
        .await?;
    completed(h.finished().await?.status)?;
    let large_run_ms = ms(t.elapsed());

    // The large run held in flight again, then paused with every session started.
    hosted.gate.send_replace(false);
    let base = hosted.started.load(Ordering::Relaxed);
    let h = rt
        .submit(
            "paused".into(),
            RunMode::Plan(plan(fan_out)),
            None,
            String::new(),
        )
        .await?;
    let paused = h.id();
    wait_started(&hosted.started, base + u64::from(fan_out)).await?;
    rt.pause(Duration::from_secs(30)).await;
    drop(h);
    match Arc::try_unwrap(rt) {
        Ok(rt) => rt.shutdown().await,
        Err(_) => return Err(anyhow!("the runtime is still shared")),
    }

    // A restart: the store-wide scan for open runs, then the large run resumed by a new runtime
    // (on the same store handle: the old runtime's last timers may hold it a while longer).
    let t = now();
    let open = keel_actors::host::store::recover_open_runs(&store)?;
    let recover_open_runs_ms = ms(t.elapsed());
    if open.len() != 1 || open[0].run.id != paused {
        return Err(anyhow!(
            "expected the paused run alone open, found {}",
            open.len()
        ));
    }
    drop(open);
    let hosted = host(Arc::clone(&store), home, fan_out).await?;
    let t = now();
    let h = hosted.rt.resume(paused).await?;
    let resume_ms = ms(t.elapsed());
    completed(h.finished().await?.status)?;
    let resumed_to_end_ms = ms(t.elapsed());
    hosted.rt.shutdown().await;
    drop(hosted.gate);
    drop(store);

    let keel_runs_ms = command(home, &["runs"])?;
    let keel_tree_ms = command(home, &["tree", &paused.to_string()])?;
    Ok(Scale {
        stored_runs,
        fill_s,
        fan_out,
        large_run_ms,
        held_run_bytes,
        large_run_in_flight_bytes,
        recover_open_runs_ms,
        resume_ms,
        resumed_to_end_ms,
        keel_runs_ms,
        keel_tree_ms,
        store_bytes: std::fs::metadata(&store_path).map_or(0, |m| m.len()),
    })
}

/// The median wall time of `keel --home HOME ARGS...`, a process of this binary, over a few runs.
fn command(home: &Path, args: &[&str]) -> anyhow::Result<f64> {
    let exe = std::env::current_exe().context("locating the keel executable")?;
    let mut times = Vec::with_capacity(COMMAND_REPEATS);
    for _ in 0..COMMAND_REPEATS {
        let t = now();
        let status = std::process::Command::new(&exe)
            .arg("--home")
            .arg(home)
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .with_context(|| format!("running keel {}", args.join(" ")))?;
        times.push(ms(t.elapsed()));
        if !status.success() {
            return Err(anyhow!("keel {} failed: {status}", args.join(" ")));
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

fn completed(status: RunStatus) -> anyhow::Result<()> {
    if status == RunStatus::Completed {
        Ok(())
    } else {
        Err(anyhow!("a bench run ended {status:?}"))
    }
}

/// `keel bench --scale-runs N [--scale-fan-out M]`: print what keel costs with N stored runs and a
/// run of M specialists.
/// With `keep`, the home is built in that new folder and left there.
pub(crate) fn bench_scale(
    stored_runs: u32,
    fan_out: u32,
    keep: Option<&Path>,
    json: bool,
) -> anyhow::Result<()> {
    if stored_runs == 0
        || stored_runs > SCALE_RUNS_MAX
        || fan_out == 0
        || fan_out > SCALE_FAN_OUT_MAX
    {
        return Err(anyhow!(
            "scale runs must be 1..={SCALE_RUNS_MAX} and the fan-out 1..={SCALE_FAN_OUT_MAX}"
        ));
    }
    let dir = tempfile::tempdir().context("creating a temporary folder")?;
    let home_dir = match keep {
        Some(keep) => {
            if keep.exists() {
                return Err(anyhow!(
                    "{} exists: --scale-keep needs a new folder",
                    keep.display()
                ));
            }
            keep.to_path_buf()
        }
        None => dir.path().join("home"),
    };
    let home = crate::home::Home::locate(Some(home_dir))?;
    home.init()?;
    let rt = super::tokio_runtime()?;
    let s = rt.block_on(measure(home.dir(), stored_runs, fan_out))?;
    if json {
        outln!("{}", serde_json::to_string(&s)?)?;
        return Ok(());
    }
    let mib = |b: f64| b / (1024.0 * 1024.0);
    outln!(
        "{} stored runs of {STORED_FAN_OUT} specialists written in {:.1} s; store file {:.1} MiB",
        s.stored_runs,
        s.fill_s,
        {
            #[allow(clippy::cast_precision_loss)] // A file size far below 2^52.
            let b = s.store_bytes as f64;
            mib(b)
        }
    )?;
    outln!(
        "one run of {} specialists: {:.1} ms",
        s.fan_out,
        s.large_run_ms
    )?;
    outln!(
        "memory per in-flight run: {:.2} MiB ({HELD_FAN_OUT} specialists, sessions started), {:.1} MiB for the run of {}",
        mib(s.held_run_bytes),
        mib(s.large_run_in_flight_bytes),
        s.fan_out
    )?;
    outln!(
        "restart: open runs found and read in {:.1} ms; keel resume's path for the run of {} in {:.1} ms, to its end {:.1} ms",
        s.recover_open_runs_ms,
        s.fan_out,
        s.resume_ms,
        s.resumed_to_end_ms
    )?;
    outln!(
        "keel runs: {:.1} ms; keel tree (the run of {}): {:.1} ms (processes, median of {COMMAND_REPEATS})",
        s.keel_runs_ms,
        s.fan_out,
        s.keel_tree_ms
    )?;
    Ok(())
}
