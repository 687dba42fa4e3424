//! The seed sweep: many seeds with sampled fault profiles, each checked for every invariant after every
//! event, plus determinism (a seed run twice gives the same trace hash).

use keel_sim::soak::{explain, same_seed_same_trace, sweep};
use keel_sim::{WorldConfig, run};

/// Seeds of the sweep. The brief asks for at least 500 in `cargo test`.
const SWEEP_SEEDS: u64 = 500;

#[test]
fn five_hundred_seeds_break_no_invariant() {
    let mut delegation_answers = 0usize;
    let mut tool_calls = std::collections::BTreeMap::<&str, u64>::new();
    let (mut tool_answers, mut escalations) = (0u64, 0u64);
    let mut hook_outcomes = std::collections::BTreeMap::<&str, u64>::new();
    let (mut gated, mut gated_ran) = (0u64, 0u64);
    let (mut pauses, mut cancels, mut reopens) = (0u32, 0usize, 0usize);
    let (mut step_cancels, mut announced, mut many_pauses) = (0usize, 0usize, 0usize);
    let summary = sweep(0, SWEEP_SEEDS, |r| {
        delegation_answers += r.observed.delegation_answers.len();
        for (kind, n) in &r.observed.hook_outcomes {
            *hook_outcomes.entry(kind).or_default() += n;
        }
        gated += r.observed.gated_calls;
        gated_ran += r.observed.gated_runs;
        for (tool, n) in &r.observed.tool_calls {
            *tool_calls.entry(tool).or_default() += n;
        }
        tool_answers += r.observed.tool_answers;
        escalations += r.observed.escalations_answered;
        pauses += r.observed.pauses;
        cancels += r.observed.cancels.len();
        reopens += r.observed.reopens.len();
        step_cancels += r.observed.step_cancels.len();
        announced += r.observed.follow_ups_announced.len();
        many_pauses += usize::from(r.observed.pauses > 5);
        if let Some(v) = &r.violation {
            // The seed, the event, the reproduction command and the trace up to it.
            eprintln!("{}", explain(v.seed));
        }
    });
    assert_eq!(summary.seeds, SWEEP_SEEDS);
    let shown: Vec<String> = summary
        .violations
        .iter()
        .take(5)
        .map(ToString::to_string)
        .collect();
    assert!(
        summary.violations.is_empty(),
        "{} violations, first: {shown:#?}",
        summary.violations.len()
    );
    // The sweep is not vacuous: faults were injected and runs finished both ways.
    assert!(
        summary.faults.total() > SWEEP_SEEDS,
        "faults: {:?}",
        summary.faults
    );
    assert!(summary.runs_completed > 0);
    // Lead runs are in the mix and complete too.
    eprintln!(
        "sweep: {} runs completed, {} other terminal; lead runs: {} completed, {} other terminal",
        summary.runs_completed,
        summary.runs_other_terminal,
        summary.lead_runs_completed,
        summary.lead_runs_other_terminal
    );
    assert!(summary.lead_runs_completed > 0);
    // And their leads delegated: turns were answered to their sessions.
    eprintln!("sweep: {delegation_answers} delegation turns answered to leads");
    assert!(delegation_answers > 0);
    // Sessions called keel's tools through the endpoint, and humans answered escalations.
    eprintln!(
        "sweep: tool calls {tool_calls:?}, {tool_answers} answers, {escalations} escalations answered"
    );
    for tool in [
        "report_progress",
        "report_findings",
        "get_task_details",
        "delegate",
        "escalate",
        "late",
    ] {
        assert!(
            tool_calls.get(tool).is_some_and(|n| *n > 0),
            "no {tool} call"
        );
    }
    assert!(tool_answers > 0 && escalations > 0);
    // Keel's policy gated tools: every kind of hook outcome was drawn, and calls ran and were denied.
    eprintln!("sweep: {gated} gated tool calls, {gated_ran} ran; hook outcomes {hook_outcomes:?}");
    for kind in [
        "allow",
        "deny",
        "ask",
        "no_opinion",
        "error_mandatory",
        "timeout_mandatory",
        "error",
        "timeout",
    ] {
        assert!(
            hook_outcomes.get(kind).is_some_and(|n| *n > 0),
            "no hook answered {kind}"
        );
    }
    assert!(gated_ran > 0 && gated_ran < gated);
    assert!(summary.events > SWEEP_SEEDS * 100);
    // The operator's drawn interventions happened, each kind.
    eprintln!("sweep: {pauses} pauses, {cancels} cancels, {reopens} reopens for a follow-up");
    assert!(pauses > 0 && cancels > 0 && reopens > 0);
    // Issue 17's: a step's cancel, announced follow-ups, more pauses than a step's retries.
    eprintln!(
        "sweep: {step_cancels} step cancels, {announced} follow-ups announced, {many_pauses} seeds with more than five pauses"
    );
    assert!(step_cancels > 0 && announced > 0 && many_pauses > 0);
    // Messages between nodes crossed as wire frames, and frames of another version were refused.
    eprintln!(
        "sweep: {} wire frames ({} bytes), {} of another protocol version refused",
        summary.frames_sent, summary.frame_bytes, summary.frames_refused
    );
    assert!(summary.frames_sent > SWEEP_SEEDS && summary.frames_refused > 0);
}

#[test]
fn the_same_seed_gives_the_same_trace() {
    for seed in [1u64, 7, 42, 0xdead_beef, 12_345] {
        if let Err(v) = same_seed_same_trace(&WorldConfig::for_seed(seed)) {
            panic!("{v}");
        }
    }
    // And different seeds differ, so the hash is not constant.
    assert_ne!(
        run(WorldConfig::for_seed(1)).trace_hash,
        run(WorldConfig::for_seed(2)).trace_hash
    );
}

#[test]
fn a_recorded_replay_has_the_hash_of_the_sweep() {
    let hashed = run(WorldConfig::for_seed(99));
    let mut config = WorldConfig::for_seed(99);
    config.trace = keel_sim::trace::TraceMode::Record {
        lines_max: 1_000_000,
    };
    let recorded = run(config);
    assert_eq!(hashed.trace_hash, recorded.trace_hash);
    assert_eq!(recorded.trace_lines.len() as u64, recorded.events);
}

#[test]
fn explain_replays_a_seed_with_its_trace() {
    let text = explain(5);
    assert!(text.lines().count() > 10, "{text}");
    assert!(text.contains("coord run="), "{text}");
    assert!(text.lines().count() <= keel_sim::soak::EXPLAIN_LINES_MAX + 2);
}
