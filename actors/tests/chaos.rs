//! Random faults against the real machines on the in-memory host: lost and duplicated remote messages,
//! failing harness sessions, disk faults and coordinator-node crashes at random points, then a healed
//! phase that must end every run. The simulator does this at scale; this keeps the machines honest in
//! their own crate's suite.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::*;
use keel_actors::*;
use keel_harness::{ErrorCategory, HarnessError, HarnessEvent, StopReason};
use keel_store::{RunStatus, TaskStatus};
use proptest::prelude::*;
use std::collections::BTreeMap;

fn plan(n: usize) -> Plan {
    let steps = (0..n)
        .map(|i| {
            let deps: Vec<String> = if i >= 2 {
                vec![format!("s{}", i / 2 - 1)]
            } else {
                Vec::new()
            };
            let refs: Vec<&str> = deps.iter().map(String::as_str).collect();
            step(&format!("s{i}"), &refs)
        })
        .collect();
    Plan {
        steps,
        constraints: Vec::new(),
    }
}

/// A harness that fails some sessions, decided by a seeded stream.
fn flaky(seed: u64, fail_permille: u64) -> Script {
    let mut rng = SplitMix64(seed);
    Box::new(move |a: AttemptId, _spec| {
        let roll = rng.next_u64() % 1000;
        let end = if roll < fail_permille {
            match rng.next_u64() % 5 {
                0 => HarnessEvent::Failed(HarnessError::transient("500")),
                1 => HarnessEvent::Failed(HarnessError::rate_limited("429", None, Some(500))),
                2 => HarnessEvent::Failed(HarnessError::new(
                    ErrorCategory::ContextOverflow,
                    "SIGTERM 143",
                )),
                3 => HarnessEvent::Finished {
                    stop_reason: StopReason::EndTurn,
                    final_text: "garbage".into(),
                },
                _ => return vec![], // a hang: only the supervisor's deadline ends it
            }
        } else {
            HarnessEvent::Finished {
                stop_reason: StopReason::EndTurn,
                final_text: report_json(a.task, "complete", "x"),
            }
        };
        vec![
            HarnessEvent::tool_use("t", "Read", "{}"),
            HarnessEvent::tool_result("t", false, "ok"),
            end,
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn every_run_ends_and_no_result_is_accepted_twice(
        seed in any::<u64>(),
        steps in 1usize..8,
        drop_permille in 0u64..300,
        dup_permille in 0u64..300,
        fail_permille in 0u64..400,
        disk_faults in 0u32..4,
        crashes in proptest::collection::vec(1usize..400, 0..3),
    ) {
        let sup = SupervisorConfig { subtask_timeout_ms: 30_000, ..World::default_agents() };
        let mut w = World::new(sup, flaky(seed, fail_permille));
        w.rng = SplitMix64(seed);
        w.chaos = SplitMix64(seed ^ 0xA5A5);
        w.drop_permille = drop_permille;
        w.dup_permille = dup_permille;
        w.fail_commits = disk_faults;
        w.submit(RunMode::Plan(plan(steps)), None);
        let mut accepted: BTreeMap<String, Vec<AttemptId>> = BTreeMap::new();
        let record = |w: &World, accepted: &mut BTreeMap<String, Vec<AttemptId>>| {
            for (key, a) in w.coordinator.accepted_attempts() {
                if let Some(a) = a {
                    let v = accepted.entry(key).or_default();
                    if !v.contains(&a) { v.push(a); }
                }
            }
        };
        let mut crashes = crashes;
        crashes.sort_unstable();
        let mut done = 0usize;
        for at in crashes {
            while done < at && w.step() { done += 1; record(&w, &mut accepted); }
            w.crash_and_recover();
        }
        // Heal: no more losses or duplicates; every run must end.
        w.drop_permille = 0;
        w.dup_permille = 0;
        let n = w.run(200_000);
        prop_assert!(n < 200_000, "the run did not settle");
        record(&w, &mut accepted);
        if w.store.runs.contains_key(&w.run) {
            prop_assert!(w.coordinator.is_terminal(), "not terminal: {:#?}", w.coordinator.steps());
            let status = w.run_status().unwrap();
            prop_assert!(status.is_terminal(), "run row not terminal: {status:?}");
            for (key, attempts) in &accepted {
                prop_assert!(attempts.len() <= 1, "step {} accepted twice: {:?}", key, attempts);
            }
            // A completed run has a usable report; no task is complete without a durable outcome.
            for t in w.store.tasks.values() {
                if t.status == TaskStatus::Complete && t.kind != keel_store::TaskKind::Root {
                    prop_assert!(t.outcome.is_some());
                }
            }
            if status == RunStatus::Completed {
                prop_assert!(w.store.tasks.values().any(|t| t.status == TaskStatus::Complete && t.kind != keel_store::TaskKind::Root));
            }
        }
    }
}
