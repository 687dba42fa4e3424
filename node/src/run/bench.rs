//! `keel bench`: the orchestration path measured end to end with an instant harness.
//!
//! Each run fans out to N specialists; each specialist's session answers at once with a ~300-byte
//! report; every report is made durable (a redb commit with `Durability::Immediate`, group-committed
//! by the checkpoint actor) before it is acknowledged; then the coordinator writes the synthesis. What
//! is measured is keel's own cost: actors, messages, context loading, group commits, fsyncs. Runs
//! are timed sequentially and with several in flight, on a fresh store file in a temporary folder
//! (`$TMPDIR`); what the store file grew by over the runs, divided by the runs, is the bytes stored
//! per run.

use std::sync::Arc;
use std::time::Instant;

use crate::stdout::outln;
use anyhow::{Context, anyhow};
use keel_actors::runtime::{HarnessSet, Runtime, RuntimeConfig, SUBTASK_ID_ENV};
use keel_actors::{Plan, PlanStep, RunMode};
use keel_harness::session::BoxFuture;
use keel_harness::{
    Harness, HarnessEvent, HarnessKind, RunningSession, SessionSpec, StartError, StopReason,
    session_channel,
};
use keel_store::{AgentLimits, AgentProfile, RunStatus, Store};

/// Most specialists per run the bench accepts: the most a plan may have.
const FAN_OUT_MAX: u32 = keel_actors::plan::PLAN_STEPS_MAX as u32;
/// Most runs in flight the bench accepts.
const IN_FLIGHT_MAX: u32 = 64;

/// A harness whose every session ends at once with a report of about 300 bytes.
struct InstantHarness;

pub(super) fn report(task: &str) -> String {
    // The claim pads the report to about 300 bytes of JSON.
    format!(
        "{{\"subtask_id\":\"{task}\",\"status\":\"complete\",\"findings\":[{{\"claim\":\"the instant harness \
answered this part at once with a fixed finding that is long enough to weigh what a short real \
report weighs\",\"source\":\"bench\",\"confidence_permille\":900}}],\"gaps\":[],\"summary\":\"done\"}}"
    )
}

/// The task a benchmark session runs for: the runtime names it in the session's environment.
pub(super) fn subtask_of(spec: &SessionSpec) -> Result<String, StartError> {
    spec.env
        .get(SUBTASK_ID_ENV)
        .cloned()
        .ok_or_else(|| StartError::InvalidSpec("no subtask id in the env".into()))
}

impl Harness for InstantHarness {
    fn kind(&self) -> HarnessKind {
        HarnessKind::Scripted
    }

    fn start(&self, spec: SessionSpec) -> BoxFuture<'_, Result<RunningSession, StartError>> {
        Box::pin(async move {
            let task = subtask_of(&spec)?;
            let (sink, _cancel, session) = session_channel(HarnessKind::Scripted);
            tokio::spawn(async move {
                sink.send(HarnessEvent::Started {
                    native_session_id: None,
                    model: None,
                })
                .await;
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

pub(super) fn plan(n: u32) -> Plan {
    Plan {
        steps: (0..n)
            .map(|i| PlanStep {
                key: format!("part-{i:03}"),
                brief: format!("Part {i}."),
                goal: format!("part {i}"),
                quality_criteria: Vec::new(),
                output_schema: None,
                assignee: None,
                depends_on: Vec::new(),
                estimate_micros: 0,
            })
            .collect(),
        constraints: Vec::new(),
    }
}

pub(super) fn config(work: &std::path::Path, n: u32, in_flight: u32) -> RuntimeConfig {
    let mut c = RuntimeConfig::default();
    c.supervisor.agents = vec![AgentProfile {
        name: "instant".into(),
        description: "answers at once".into(),
        harness: HarnessKind::Scripted.as_str().into(),
        model: "instant".into(),
        account: "bench".into(),
        tools: Vec::new(),
        system_prompt: String::new(),
        limits: AgentLimits::default(),
    }];
    c.supervisor.specialists_max = n * in_flight;
    c.supervisor.spawn_burst = u32::MAX / 2;
    c.supervisor.spawn_interval_ms = 1;
    c.specialist.working_dir = work.to_path_buf();
    c.runs_in_flight_max = in_flight;
    c.events_capacity = 16;
    c
}

/// What one measurement gives.
struct Measured {
    runs_per_s: f64,
    us_per_specialist: f64,
    /// The process's CPU time (user and system, every thread: the runtime's workers, the store
    /// writer, the instant sessions) over the measured runs, per specialist: the CPU
    /// figure, measured by the same command as the throughput.
    cpu_us_per_specialist: f64,
    commits_per_run: f64,
    /// What the store file grew by from before the first run to after the runtime's shutdown,
    /// divided by the runs.
    bytes_per_run: f64,
}

/// One measurement: `runs` runs of `n` specialists, `in_flight` at a time.
async fn measure(n: u32, in_flight: u32, runs: u32, exclusive: bool) -> anyhow::Result<Measured> {
    let dir = tempfile::tempdir().context("creating a temporary folder")?;
    let store_path = dir.path().join("bench.redb");
    // The store as `keel run` and `keel node` open it (shared with readers: redb then commits in
    // two phases, two fsyncs a commit), unless asked for the store as `keel serve` opens it
    // (alone: one phase, one fsync), to compare the two with the same binary.
    let store_config = super::writer_config(if exclusive {
        super::SERVED
    } else {
        super::SHARED
    });
    let store = Arc::new(Store::open_with(&store_path, store_config)?);
    let harnesses = HarnessSet::new().with(HarnessKind::Scripted, Arc::new(InstantHarness));
    let (rt, events) = Runtime::start(store, harnesses, config(dir.path(), n, in_flight)).await?;
    drop(events);
    let rt = Arc::new(rt);
    let empty = file_size(&store_path)?;
    #[allow(clippy::disallowed_methods)] // A benchmark reads the clock by definition.
    let started = Instant::now();
    let cpu_before = cpu_seconds()?;
    // Finished runs are checked as they end, not kept to the end: a server lets go of a run's
    // outcome once it is answered, and thousands of outcomes held here would grow the heap (and
    // its page faults) on the runtime's thread, a cost of the benchmark and not of keel.
    let mut handles = tokio::task::JoinSet::new();
    for _ in 0..runs {
        // `submit` waits for a slot: at most `in_flight` runs are hosted at once.
        let handle = rt
            .submit("bench".into(), RunMode::Plan(plan(n)), None, String::new())
            .await?;
        handles.spawn(handle.finished());
        if in_flight == 1 {
            while let Some(h) = handles.join_next().await {
                check(h??.status)?;
            }
        }
        while let Some(h) = handles.try_join_next() {
            check(h??.status)?;
        }
    }
    while let Some(h) = handles.join_next().await {
        check(h??.status)?;
    }
    let secs = started.elapsed().as_secs_f64();
    let cpu = cpu_seconds()? - cpu_before;
    #[allow(clippy::cast_precision_loss)] // A count of commits far below 2^52.
    let commits_per_run = rt.commits() as f64 / f64::from(runs);
    if let Ok(rt) = Arc::try_unwrap(rt) {
        rt.shutdown().await;
    }
    let grown = file_size(&store_path)?.saturating_sub(empty);
    #[allow(clippy::cast_precision_loss)] // A file size far below 2^52.
    let bytes_per_run = grown as f64 / f64::from(runs);
    Ok(Measured {
        runs_per_s: f64::from(runs) / secs,
        us_per_specialist: secs * 1e6 / f64::from(runs * n),
        cpu_us_per_specialist: cpu * 1e6 / f64::from(runs * n),
        commits_per_run,
        bytes_per_run,
    })
}

/// The CPU time this process has used so far, user and system, over all its threads.
fn cpu_seconds() -> anyhow::Result<f64> {
    use nix::sys::resource::{UsageWho, getrusage};
    let usage = getrusage(UsageWho::RUSAGE_SELF).context("reading the process's CPU time")?;
    let seconds = |t: nix::sys::time::TimeVal| {
        #[allow(clippy::cast_precision_loss)] // Seconds of CPU time far below 2^52.
        let whole = t.tv_sec() as f64;
        #[allow(clippy::cast_precision_loss)] // Below one million.
        let micros = t.tv_usec() as f64;
        whole + micros / 1e6
    };
    Ok(seconds(usage.user_time()) + seconds(usage.system_time()))
}

fn file_size(path: &std::path::Path) -> anyhow::Result<u64> {
    Ok(std::fs::metadata(path)
        .with_context(|| format!("reading the size of {}", path.display()))?
        .len())
}

fn check(status: RunStatus) -> anyhow::Result<()> {
    if status == RunStatus::Completed {
        Ok(())
    } else {
        Err(anyhow!("a bench run ended {status:?}"))
    }
}

/// `keel bench`: print a table of runs/s, wall and CPU µs per specialist, commits and bytes per run
/// for each fan-out, sequential and with `in_flight` runs at once.
pub(crate) fn bench(
    fan_outs: &[u32],
    runs: u32,
    in_flight: u32,
    exclusive: bool,
    json: bool,
) -> anyhow::Result<()> {
    if fan_outs.iter().any(|&n| n == 0 || n > FAN_OUT_MAX)
        || in_flight == 0
        || in_flight > IN_FLIGHT_MAX
    {
        return Err(anyhow!(
            "fan-outs must be 1..={FAN_OUT_MAX} and in-flight 1..={IN_FLIGHT_MAX}"
        ));
    }
    let rt = super::tokio_runtime()?;
    let mut rows = Vec::new();
    rt.block_on(async {
        for &n in fan_outs {
            // A warm-up run per shape, not measured.
            measure(n, 1, 2, exclusive).await?;
            for flight in [1, in_flight] {
                let m = measure(n, flight, runs, exclusive).await?;
                if !json {
                    outln!(
                        "N={n:<3} in flight={flight:<2} runs={runs:<4} {:>9.1} runs/s {:>9.1} µs/specialist {:>7.1} µs CPU/specialist {:>6.1} commits/run {:>9.0} bytes/run",
                        m.runs_per_s,
                        m.us_per_specialist,
                        m.cpu_us_per_specialist,
                        m.commits_per_run,
                        m.bytes_per_run
                    )?;
                }
                rows.push((n, flight, m));
            }
        }
        Ok::<(), anyhow::Error>(())
    })?;
    if json {
        let v: Vec<_> = rows
            .iter()
            .map(|(n, f, m)| {
                serde_json::json!({"specialists": n, "in_flight": f, "runs_per_s": m.runs_per_s, "us_per_specialist": m.us_per_specialist, "cpu_us_per_specialist": m.cpu_us_per_specialist, "commits_per_run": m.commits_per_run, "bytes_per_run": m.bytes_per_run})
            })
            .collect();
        outln!("{}", serde_json::Value::Array(v))?;
    }
    Ok(())
}
