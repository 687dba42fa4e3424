//! `keel-sim`: runs seeds of the deterministic simulator.
//!
//! - `keel-sim --seed 0x2a` replays one seed and prints its trace (the reproduction command a violation
//!   prints).
//! - `keel-sim --seeds 10000 --from 0` runs many seeds for soak and prints seeds per second, events per
//!   second, faults injected by kind and every violation.

use std::process::ExitCode;

use clap::Parser;
use keel_sim::profile::FaultKind;
use keel_sim::trace::TraceMode;
use keel_sim::violation::parse_seed;
use keel_sim::{WorldConfig, run, soak};

/// mimalloc rather than glibc's malloc: redb's commits allocate and free page buffers by the thousand
/// per seed, and glibc's allocator was about a fifth of the sweep's time (docs/PERFORMANCE.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Most trace lines a replay prints.
const REPLAY_LINES_MAX: usize = 1_000_000;

#[derive(Debug, Parser)]
#[command(
    name = "keel-sim",
    about = "keel's deterministic simulator: one seed decides every fault"
)]
struct Args {
    /// Replay this one seed (0x-prefixed hex or decimal) and print its trace.
    #[arg(long, value_parser = parse_seed, conflicts_with = "seeds")]
    seed: Option<u64>,
    /// Run this many seeds.
    #[arg(long)]
    seeds: Option<u64>,
    /// The first seed of `--seeds`.
    #[arg(long, value_parser = parse_seed, default_value = "0")]
    from: u64,
    /// With `--seed`: print only the summary, not the trace.
    #[arg(long)]
    quiet: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    if let Some(seed) = args.seed {
        return replay(seed, args.quiet);
    }
    let count = args.seeds.unwrap_or(100);
    soak_run(args.from, count)
}

fn replay(seed: u64, quiet: bool) -> ExitCode {
    let mut config = WorldConfig::for_seed(seed);
    config.trace = TraceMode::Record {
        lines_max: REPLAY_LINES_MAX,
    };
    let report = run(config);
    if !quiet {
        for line in &report.trace_lines {
            if let Some(v) = &report.violation
                && line
                    .split_whitespace()
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
                    .is_some_and(|n| n > v.event)
            {
                break;
            }
            println!("{line}");
        }
    }
    println!(
        "seed {seed:#018x}: {} events, {} ms virtual, trace hash {:#018x}",
        report.events, report.end_ms, report.trace_hash
    );
    println!("profile: {:?}", report.profile);
    for (run, (status, outcome)) in &report.runs_final {
        println!("run {run}: {status:?} {}", outcome.as_deref().unwrap_or(""));
    }
    match &report.violation {
        Some(v) => {
            println!("VIOLATION {v}");
            ExitCode::FAILURE
        }
        None => ExitCode::SUCCESS,
    }
}

fn soak_run(from: u64, count: u64) -> ExitCode {
    // The wall clock is read only here, to report throughput; nothing in the world sees it.
    #[allow(clippy::disallowed_methods)]
    let started = std::time::Instant::now();
    let summary = soak::sweep(from, count, |r| {
        if let Some(v) = &r.violation {
            println!("VIOLATION {v}");
        }
    });
    // The trace of the first violation, up to the event it broke at (the others: replay their seed).
    if let Some(v) = summary.violations.first() {
        println!("{}", soak::explain(v.seed));
    }
    #[allow(clippy::disallowed_methods)]
    let secs = started.elapsed().as_secs_f64().max(1e-9);
    println!(
        "{} seeds from {from:#x} in {secs:.2} s: {:.1} seeds/s, {} events, {:.0} events/s",
        summary.seeds,
        summary.seeds as f64 / secs,
        summary.events,
        summary.events as f64 / secs
    );
    println!(
        "store commits: {} ({:.2} events per commit, {:.0} commits/s)",
        summary.commits,
        summary.events as f64 / summary.commits.max(1) as f64,
        summary.commits as f64 / secs
    );
    println!(
        "runs: {} completed, {} other terminal (lead runs: {} completed, {} other terminal)",
        summary.runs_completed,
        summary.runs_other_terminal,
        summary.lead_runs_completed,
        summary.lead_runs_other_terminal
    );
    println!(
        "wire frames: {} sent ({} bytes, {:.0} bytes/frame), {} of another protocol version refused",
        summary.frames_sent,
        summary.frame_bytes,
        summary.frame_bytes as f64 / summary.frames_sent.max(1) as f64,
        summary.frames_refused
    );
    let c = &summary.cluster;
    println!(
        "cluster: {} heartbeats, {} leases expired, {} joins, {} attempts down, {} spawns acknowledged, {} refused, {} stale attempts cancelled",
        c.heartbeats,
        c.leases_expired,
        c.joined,
        c.attempts_down,
        c.spawns_acknowledged,
        c.spawns_refused,
        c.stale_cancelled
    );
    let calls: Vec<String> = summary
        .tool_calls
        .iter()
        .map(|(tool, n)| format!("{tool} {n}"))
        .collect();
    println!(
        "tool calls: {} ({}); {} delivered twice, {} timed out at the endpoint; {} escalations answered",
        summary.tool_calls.values().sum::<u64>(),
        calls.join(", "),
        summary.tool_duplicates,
        summary.tool_timeouts,
        summary.escalations_answered
    );
    let hooks: Vec<String> = summary
        .hook_outcomes
        .iter()
        .map(|(kind, n)| format!("{kind} {n}"))
        .collect();
    println!(
        "gated tool calls: {} ({} ran, {} denied); hook outcomes: {}",
        summary.gated_calls,
        summary.gated_runs,
        summary.gated_calls - summary.gated_runs.min(summary.gated_calls),
        hooks.join(", ")
    );
    println!("faults injected ({} total):", summary.faults.total());
    for kind in FaultKind::ALL {
        println!("  {:<28} {}", kind.name(), summary.faults.get(kind));
    }
    println!("violations: {}", summary.violations.len());
    if summary.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
