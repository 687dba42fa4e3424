//! Prometheus `/metrics` of `keel serve`: runs and tasks by state (read from the store at each
//! scrape), spawn refusals by reason and checkpoint commit latency (from the runtime's observer),
//! harness failures by kind (from the run events), the runtime's own counters, and on a cluster's
//! coordinator node the remote dispatch latency and the frames between nodes (from its cluster
//! endpoint).

use std::time::Duration;

use keel_actors::runtime::{Runtime, RuntimeObserver};
use keel_store::{RunStatus, Store};
use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
    TextEncoder,
};

/// Most runs counted at one scrape (the store's most rows a read): every open run up to this many
/// (found among all runs), and the newest runs for the ended states. Past it
/// `keel_runs_scan_truncated` is 1: the oldest ended runs are the ones left out, never an open one.
const RUNS_SCANNED_MAX: u32 = 10_000;
/// Most tasks of one open run read at one scrape.
const TASKS_PER_RUN_MAX: u32 = 10_000;
/// Commit latency buckets, in seconds: an fsync is a millisecond or so on an SSD and much more on
/// a loaded disk.
const COMMIT_BUCKETS_S: [f64; 12] = [
    0.000_5, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 5.0,
];

/// Remote dispatch latency buckets, in seconds: a loopback round trip is a few hundred
/// microseconds; a burst of spawns on a loaded worker queues for much longer.
const DISPATCH_BUCKETS_S: [f64; 12] = [
    0.000_1, 0.000_25, 0.000_5, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.0,
];

/// Why the metrics could not be built (a programming error in a metric's definition).
#[derive(Debug, thiserror::Error)]
#[error("metrics: {0}")]
pub(crate) struct MetricsError(#[from] prometheus::Error);

/// Every metric of the server, in one registry.
#[derive(Debug, Clone)]
pub(crate) struct Metrics {
    registry: Registry,
    runs: IntGaugeVec,
    runs_truncated: IntGauge,
    tasks: IntGaugeVec,
    refusals: IntCounterVec,
    failures: IntCounterVec,
    commit_seconds: Histogram,
    commit_failures: IntCounter,
    events_dropped: IntGauge,
    sessions_started: IntGauge,
    commits: IntGauge,
    dispatch_seconds: Histogram,
    frames: IntCounterVec,
}

impl Metrics {
    /// Define and register every metric.
    ///
    /// # Errors
    /// [`MetricsError`] if a definition is invalid (never for these).
    pub(crate) fn new() -> Result<Self, MetricsError> {
        let registry = Registry::new();
        let runs = IntGaugeVec::new(
            Opts::new("keel_runs", "Runs in the store by state."),
            &["state"],
        )?;
        let runs_truncated = IntGauge::new(
            "keel_runs_scan_truncated",
            "1 when the store holds more runs than one scrape reads (keel_runs counts the oldest).",
        )?;
        let tasks = IntGaugeVec::new(
            Opts::new(
                "keel_tasks",
                "Tasks of the runs that are not finished (running or paused), by state.",
            ),
            &["state"],
        )?;
        let refusals = IntCounterVec::new(
            Opts::new(
                "keel_spawn_refusals_total",
                "Spawns the supervisor refused, by reason.",
            ),
            &["reason"],
        )?;
        let failures = IntCounterVec::new(
            Opts::new(
                "keel_harness_failures_total",
                "Specialist attempts that failed, by failure kind (from the run events).",
            ),
            &["kind"],
        )?;
        let commit_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "keel_checkpoint_commit_seconds",
                "Time of one group commit on the store writer thread (transaction and fsync).",
            )
            .buckets(COMMIT_BUCKETS_S.to_vec()),
        )?;
        let commit_failures = IntCounter::new(
            "keel_checkpoint_commit_failures_total",
            "Group commits that failed.",
        )?;
        let events_dropped = IntGauge::new(
            "keel_events_dropped_total",
            "Run events the runtime dropped on a full channel.",
        )?;
        let sessions_started = IntGauge::new(
            "keel_sessions_started_total",
            "Harness sessions started by this server.",
        )?;
        let commits = IntGauge::new(
            "keel_commits_total",
            "Group commits handed to the store writer.",
        )?;
        let dispatch_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "keel_remote_dispatch_seconds",
                "From the supervisor's decision (a spawn handed to the cluster layer) to the worker's acknowledgement that the specialist runs (a cluster's coordinator node only).",
            )
            .buckets(DISPATCH_BUCKETS_S.to_vec()),
        )?;
        let frames = IntCounterVec::new(
            Opts::new(
                "keel_cluster_frames_total",
                "Frames of keel's cluster protocol between this coordinator node and other nodes, by direction (in, out).",
            ),
            &["direction"],
        )?;
        registry.register(Box::new(runs.clone()))?;
        registry.register(Box::new(runs_truncated.clone()))?;
        registry.register(Box::new(tasks.clone()))?;
        registry.register(Box::new(refusals.clone()))?;
        registry.register(Box::new(failures.clone()))?;
        registry.register(Box::new(commit_seconds.clone()))?;
        registry.register(Box::new(commit_failures.clone()))?;
        registry.register(Box::new(events_dropped.clone()))?;
        registry.register(Box::new(sessions_started.clone()))?;
        registry.register(Box::new(commits.clone()))?;
        registry.register(Box::new(dispatch_seconds.clone()))?;
        registry.register(Box::new(frames.clone()))?;
        Ok(Self {
            registry,
            runs,
            runs_truncated,
            tasks,
            refusals,
            failures,
            commit_seconds,
            commit_failures,
            events_dropped,
            sessions_started,
            commits,
            dispatch_seconds,
            frames,
        })
    }

    /// Count one failed attempt.
    pub(crate) fn harness_failure(&self, kind: &str) {
        self.failures.with_label_values(&[kind]).inc();
    }

    /// Read the store's counts and the runtime's counters, then encode everything in the
    /// Prometheus text format.
    ///
    /// # Errors
    /// A store read error, or an encoding error.
    pub(crate) fn render(&self, store: &Store, rt: &Runtime) -> anyhow::Result<String> {
        self.count_store(store)?;
        self.events_dropped.set(gauge(rt.events_dropped()));
        self.sessions_started.set(gauge(rt.sessions_started()));
        self.commits.set(gauge(rt.commits()));
        Ok(TextEncoder::new().encode_to_string(&self.registry.gather())?)
    }
}

impl Metrics {
    /// Runs by state and the tasks of the open runs, from the store. The open runs are found among
    /// every run (an operator watches them; they may be older than the newest page), the ended ones
    /// counted over the newest [`RUNS_SCANNED_MAX`] runs.
    fn count_store(&self, store: &Store) -> anyhow::Result<()> {
        let catalog = store.catalog();
        let open = catalog.open_runs(RUNS_SCANNED_MAX)?;
        let newest = catalog.runs_newest_first(None, RUNS_SCANNED_MAX)?;
        self.runs.reset();
        self.tasks.reset();
        for status in ALL_RUN_STATES {
            self.runs.with_label_values(&[run_state(status)]).set(0);
        }
        for run in &open.items {
            self.runs.with_label_values(&[run_state(run.status)]).inc();
            for task in catalog.tasks(Some(run.id), TASKS_PER_RUN_MAX)?.items {
                self.tasks
                    .with_label_values(&[&format!("{:?}", task.status).to_lowercase()])
                    .inc();
            }
        }
        for run in newest.items.iter().filter(|r| r.status.is_terminal()) {
            self.runs.with_label_values(&[run_state(run.status)]).inc();
        }
        self.runs_truncated
            .set(i64::from(open.more || newest.older > 0));
        Ok(())
    }
}

fn gauge(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

const ALL_RUN_STATES: [RunStatus; 7] = [
    RunStatus::Pending,
    RunStatus::Running,
    RunStatus::Paused,
    RunStatus::Completed,
    RunStatus::Failed,
    RunStatus::Cancelled,
    RunStatus::BudgetExceeded,
];

fn run_state(status: RunStatus) -> &'static str {
    match status {
        RunStatus::Pending => "pending",
        RunStatus::Running => "running",
        RunStatus::Paused => "paused",
        RunStatus::Completed => "completed",
        RunStatus::Failed => "failed",
        RunStatus::Cancelled => "cancelled",
        RunStatus::BudgetExceeded => "budget_exceeded",
    }
}

impl keel_cluster::EndpointObserver for Metrics {
    fn dispatched(&self, latency: Duration) {
        self.dispatch_seconds.observe(latency.as_secs_f64());
    }

    fn frame_received(&self) {
        self.frames.with_label_values(&["in"]).inc();
    }

    fn frame_sent(&self) {
        self.frames.with_label_values(&["out"]).inc();
    }
}

impl RuntimeObserver for Metrics {
    fn commit_ended(&self, latency: Duration, durable: bool) {
        self.commit_seconds.observe(latency.as_secs_f64());
        if !durable {
            self.commit_failures.inc();
        }
    }

    fn spawn_refused(&self, reason: &'static str) {
        self.refusals.with_label_values(&[reason]).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_store::{Budget, Durability, Run, RunId, WriteBatch};

    fn run(id: u128, status: RunStatus) -> Run {
        Run {
            id: RunId(id),
            brief: format!("run {id}"),
            plan: None,
            status,
            budget: Budget::default(),
            created_ms: 1,
            updated_ms: 1,
            config_snapshot: String::new(),
            outcome: None,
        }
    }

    #[test]
    fn open_runs_are_counted_however_many_ended_runs_the_store_holds() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("keel.redb")).unwrap();
        // The oldest run is still running, the newest is paused, and more ended runs than one scrape
        // reads lie between them.
        let ended = u128::from(RUNS_SCANNED_MAX) + 1;
        let newest = ended + 2;
        let runs = (1..=newest).map(|id| match id {
            1 => run(id, RunStatus::Running),
            id if id == newest => run(id, RunStatus::Paused),
            id => run(id, RunStatus::Completed),
        });
        let runs: Vec<Run> = runs.collect();
        // One write batch holds at most 4,096 writes.
        for chunk in runs.chunks(4_000) {
            let mut batch = WriteBatch::new();
            for r in chunk {
                batch.push(store.run(r.id).stage_create_run(r.clone()).unwrap());
            }
            store.commit_group(batch, Durability::Immediate).unwrap();
        }
        let m = Metrics::new().unwrap();
        m.count_store(&store).unwrap();
        let text = TextEncoder::new()
            .encode_to_string(&m.registry.gather())
            .unwrap();
        assert!(text.contains("keel_runs{state=\"running\"} 1"), "{text}");
        assert!(text.contains("keel_runs{state=\"paused\"} 1"), "{text}");
        // The newest page holds the paused run and 9,999 of the completed ones.
        let completed = u128::from(RUNS_SCANNED_MAX) - 1;
        assert!(
            text.contains(&format!("keel_runs{{state=\"completed\"}} {completed}")),
            "{text}"
        );
        assert!(text.contains("keel_runs_scan_truncated 1"), "{text}");
    }

    #[test]
    fn observed_values_reach_the_text() {
        let m = Metrics::new().unwrap();
        m.spawn_refused("rate");
        m.commit_ended(Duration::from_millis(3), true);
        m.commit_ended(Duration::from_millis(3), false);
        m.harness_failure("timeout");
        keel_cluster::EndpointObserver::dispatched(&m, Duration::from_micros(300));
        keel_cluster::EndpointObserver::frame_received(&m);
        let text = TextEncoder::new()
            .encode_to_string(&m.registry.gather())
            .unwrap();
        assert!(
            text.contains("keel_spawn_refusals_total{reason=\"rate\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("keel_checkpoint_commit_seconds_count 2"),
            "{text}"
        );
        assert!(
            text.contains("keel_checkpoint_commit_seconds_bucket{le=\"0.005\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("keel_checkpoint_commit_failures_total 1"),
            "{text}"
        );
        assert!(
            text.contains("keel_harness_failures_total{kind=\"timeout\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("keel_remote_dispatch_seconds_bucket{le=\"0.0005\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("keel_remote_dispatch_seconds_bucket{le=\"0.00025\"} 0"),
            "{text}"
        );
        assert!(
            text.contains("keel_cluster_frames_total{direction=\"in\"} 1"),
            "{text}"
        );
    }
}
