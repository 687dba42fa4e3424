//! Many seeds in a row: the sweep `cargo test` runs and the soak `keel-sim --seeds N` runs, with totals
//! for the report (events, faults by kind, violations).

use crate::config::WorldConfig;
use crate::profile::FaultCounts;
use crate::violation::{Invariant, Violation};
use crate::world::{RunReport, run};

/// Totals over a range of seeds.
#[derive(Debug, Clone, Default)]
pub struct SoakSummary {
    /// Seeds run.
    pub seeds: u64,
    /// Events processed over all seeds.
    pub events: u64,
    /// Store commits over all seeds (each one redb write transaction on the simulated disk).
    pub commits: u64,
    /// Faults injected, by kind, over all seeds.
    pub faults: FaultCounts,
    /// Every violation found (one per failing seed).
    pub violations: Vec<Violation>,
    /// Seeds whose runs all ended `Completed`.
    pub runs_completed: u64,
    /// Runs that ended in another terminal state (failed, budget, cancelled).
    pub runs_other_terminal: u64,
    /// Lead runs (`RunMode::Lead`) that ended `Completed`.
    pub lead_runs_completed: u64,
    /// Lead runs that ended in another terminal state.
    pub lead_runs_other_terminal: u64,
    /// Frames of the wire protocol put on the network over all seeds.
    pub frames_sent: u64,
    /// Their bytes.
    pub frame_bytes: u64,
    /// Frames of another protocol version refused.
    pub frames_refused: u64,
    /// Calls of keel's tools delivered to specialists, by tool (`late`: after their session ended).
    pub tool_calls: std::collections::BTreeMap<&'static str, u64>,
    /// Of those, calls delivered twice.
    pub tool_duplicates: u64,
    /// Calls the endpoint stopped waiting for (answered to their session with a tool error).
    pub tool_timeouts: u64,
    /// Escalations a simulated human answered.
    pub escalations_answered: u64,
    /// What the hooks of gated tool calls answered, by kind (issue 13).
    pub hook_outcomes: std::collections::BTreeMap<&'static str, u64>,
    /// What the cluster's membership did (heartbeats, leases, placements), summed.
    pub cluster: crate::world::ClusterCounts,
    /// Tool calls keel's policy gated.
    pub gated_calls: u64,
    /// Of those, the calls whose tool ran (the others were denied).
    pub gated_runs: u64,
}

impl SoakSummary {
    /// Adds one seed's report.
    pub fn add(&mut self, report: &RunReport) {
        self.seeds += 1;
        self.events += report.events;
        self.commits += report.commits;
        self.faults.merge(&report.faults);
        self.frames_sent += report.frames.sent;
        self.frame_bytes += report.frames.bytes;
        self.frames_refused += report.frames.refused;
        let (c, r) = (&mut self.cluster, &report.cluster);
        c.heartbeats += r.heartbeats;
        c.leases_expired += r.leases_expired;
        c.joined += r.joined;
        c.attempts_down += r.attempts_down;
        c.spawns_acknowledged += r.spawns_acknowledged;
        c.spawns_refused += r.spawns_refused;
        c.stale_cancelled += r.stale_cancelled;
        for (tool, n) in &report.observed.tool_calls {
            *self.tool_calls.entry(tool).or_default() += n;
        }
        self.tool_duplicates += report.observed.tool_duplicates;
        self.tool_timeouts += report.observed.tool_timeouts;
        self.escalations_answered += report.observed.escalations_answered;
        for (kind, n) in &report.observed.hook_outcomes {
            *self.hook_outcomes.entry(kind).or_default() += n;
        }
        self.gated_calls += report.observed.gated_calls;
        self.gated_runs += report.observed.gated_runs;
        if let Some(v) = &report.violation {
            self.violations.push(v.clone());
        }
        for (run, (status, _)) in &report.runs_final {
            let lead = report.lead_runs.contains(run);
            if *status == keel_store::RunStatus::Completed {
                self.runs_completed += 1;
                self.lead_runs_completed += u64::from(lead);
            } else if status.is_terminal() {
                self.runs_other_terminal += 1;
                self.lead_runs_other_terminal += u64::from(lead);
            }
        }
    }
}

/// Runs seeds `from..from + count` with [`WorldConfig::for_seed`], calling `each` after every seed.
pub fn sweep(from: u64, count: u64, mut each: impl FnMut(&RunReport)) -> SoakSummary {
    let mut summary = SoakSummary::default();
    for seed in from..from.saturating_add(count) {
        let report = run(WorldConfig::for_seed(seed));
        each(&report);
        summary.add(&report);
    }
    summary
}

/// Invariant 11 (same seed, same trace): runs `config` twice in this process and compares the trace
/// hash, the event count and the final run rows. The violation names the seed and the first event
/// count at which the two runs can differ.
///
/// # Errors
/// A [`Violation`] of [`Invariant::SameSeedSameTrace`] when the two runs differ.
pub fn same_seed_same_trace(config: &WorldConfig) -> Result<RunReport, Violation> {
    let first = run(config.clone());
    let second = run(config.clone());
    if first.trace_hash == second.trace_hash
        && first.events == second.events
        && first.runs_final == second.runs_final
    {
        return Ok(first);
    }
    Err(Violation {
        seed: config.seed,
        event: first.events.min(second.events),
        invariant: Invariant::SameSeedSameTrace,
        detail: format!(
            "two runs of one seed differ: trace hash {:#018x} vs {:#018x}, {} vs {} events",
            first.trace_hash, second.trace_hash, first.events, second.events
        ),
    })
}

/// Invariant 13 (a paused run resumes to the same outcome): runs `config` as it is and again with a
/// pause of the coordinator node at `at_ms` for `down_ms`, and compares every run's final status and
/// outcome (the synthesis). Meant for calm worlds, where the outcome does not depend on timing.
///
/// # Errors
/// The first violation of either world, or a [`Violation`] of [`Invariant::PauseResumesSame`] when a
/// run ends differently after the pause.
pub fn pause_resumes_same(
    config: &WorldConfig,
    at_ms: crate::queue::SimMillis,
    down_ms: u64,
) -> Result<RunReport, Violation> {
    let straight = run(config.clone());
    if let Some(v) = straight.violation {
        return Err(v);
    }
    let mut paused_config = config.clone();
    paused_config
        .interventions
        .push((at_ms, crate::config::Intervention::Pause { down_ms }));
    let paused = run(paused_config);
    if let Some(v) = paused.violation {
        return Err(v);
    }
    for (run_id, want) in &straight.runs_final {
        let got = paused.runs_final.get(run_id);
        if got != Some(want) {
            return Err(Violation {
                seed: config.seed,
                event: paused.events,
                invariant: Invariant::PauseResumesSame,
                detail: format!(
                    "run {run_id} paused at {at_ms} ms for {down_ms} ms ended {:?}, without the pause {:?}",
                    got.map(|(s, o)| (
                        s,
                        o.as_deref()
                            .map(|o| o.chars().take(120).collect::<String>())
                    )),
                    (
                        want.0,
                        want.1
                            .as_deref()
                            .map(|o| o.chars().take(120).collect::<String>())
                    )
                ),
            });
        }
    }
    Ok(paused)
}

/// Most trace lines [`explain`] returns (the tail up to the violation).
pub const EXPLAIN_LINES_MAX: usize = 400;

/// Replays `seed` with its trace recorded and returns the violation (if the replay finds one) followed
/// by the last trace lines up to the event it broke at: what a failing sweep prints next to the
/// reproduction command.
pub fn explain(seed: u64) -> String {
    let mut config = WorldConfig::for_seed(seed);
    config.trace = crate::trace::TraceMode::Record {
        lines_max: usize::MAX,
    };
    let report = run(config);
    let upto = report.violation.as_ref().map_or(u64::MAX, |v| v.event);
    let kept: Vec<&String> = report
        .trace_lines
        .iter()
        .take(usize::try_from(upto).unwrap_or(usize::MAX))
        .collect();
    let skip = kept.len().saturating_sub(EXPLAIN_LINES_MAX);
    let mut out = String::new();
    if let Some(v) = &report.violation {
        out.push_str(&format!("{v}\n"));
    }
    if skip > 0 {
        out.push_str(&format!(
            "... {skip} earlier trace lines (replay: keel-sim --seed {seed:#018x})\n"
        ));
    }
    for line in &kept[skip..] {
        out.push_str(line);
        out.push('\n');
    }
    out
}
