//! The cost of one permission-chain decision in process (docs/PERFORMANCE.md; target under 20 µs):
//! a policy of ten deny, ten ask and ten allow rules with patterns, two hook outcomes, a shell call
//! that falls through every link, and its audit rows.
#![allow(missing_docs, clippy::unwrap_used)]

use criterion::{Criterion, criterion_group, criterion_main};
use keel_harness::PermissionMode;
use keel_policy::{HookOutcome, HookResult, Policy, ToolCall, Unmatched};
use serde_json::json;

fn rules(prefix: &str) -> Vec<keel_policy::Rule> {
    (0..10)
        .map(|i| format!("Bash({prefix}-{i} *)").parse().unwrap())
        .collect()
}

fn decide(c: &mut Criterion) {
    let policy = Policy {
        deny: rules("deny"),
        ask: rules("ask"),
        allow: rules("allow"),
        unmatched: Unmatched::Deny,
        ..Policy::default()
    };
    let call = ToolCall::new(
        "Bash",
        json!({"command": "cargo test --workspace -- --nocapture", "description": "run the tests"}),
    );
    let hooks = [
        HookOutcome {
            hook: "logger".into(),
            mandatory: false,
            result: HookResult::NoOpinion,
        },
        HookOutcome {
            hook: "guard".into(),
            mandatory: true,
            result: HookResult::NoOpinion,
        },
    ];
    c.bench_function("decide_and_audit_rows", |b| {
        b.iter(|| {
            let v = policy.decide(&call, PermissionMode::AcceptEdits, &hooks);
            v.audit_entries(1, None, &call)
        })
    });
}

criterion_group!(benches, decide);
criterion_main!(benches);
