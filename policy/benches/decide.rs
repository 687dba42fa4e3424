//! The cost of the policy check per tool call in process (docs/PERFORMANCE.md; target under 20 µs):
//! a policy of ten deny, ten ask and ten allow rules with patterns, two hook outcomes, a shell call
//! that falls through every link, and its audit rows; then the same with an agent's rules, a tool
//! list and the four gate kinds evaluated over a ledger of 4 and of 1,000 marks (what keel's own loop runs
//! for each call, the durable commit of the rows aside).
#![allow(missing_docs, clippy::unwrap_used)]

use criterion::{Criterion, criterion_group, criterion_main};
use keel_harness::PermissionMode;
use keel_policy::{
    AgentRules, Caller, Gate, GateCheck, GateLedger, GateScope, HookOutcome, HookResult, Policy,
    ToolCall, Unmatched, apply_gates,
};
use keel_store::{GateEvent, GateMark, TaskId};
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

fn decide_with_agent_and_gates(c: &mut Criterion) {
    let rule = |t: &str| -> keel_policy::Rule { t.parse().unwrap() };
    let gates = vec![
        Gate {
            name: "count".into(),
            rule: rule("Bash(cargo*)"),
            per: GateScope::Task,
            check: GateCheck::Count { max_calls: 100_000 },
        },
        Gate {
            name: "built".into(),
            rule: rule("Bash(cargo*)"),
            per: GateScope::Run,
            check: GateCheck::Prerequisite {
                after: rule("Bash(make*)"),
            },
        },
        Gate {
            name: "token".into(),
            rule: rule("Bash(cargo*)"),
            per: GateScope::Run,
            check: GateCheck::Token {
                issued_by: rule("Bash(make*)"),
            },
        },
        Gate {
            name: "spend".into(),
            rule: rule("Bash(cargo*)"),
            per: GateScope::Run,
            check: GateCheck::Cap {
                field: "amount".into(),
                max_micros: u64::MAX / 2,
            },
        },
    ];
    let policy = Policy {
        deny: rules("deny"),
        ask: rules("ask"),
        allow: rules("allow"),
        unmatched: Unmatched::Allow,
        gates: gates.clone(),
        ..Policy::default()
    };
    let agent = AgentRules {
        agent: "coder".into(),
        mode: None,
        deny: rules("agent-deny"),
        ask: rules("agent-ask"),
        allow: rules("agent-allow"),
    };
    let tools: Vec<String> = ["Read", "Write", "Edit", "Bash", "Grep"]
        .iter()
        .map(|t| (*t).to_string())
        .collect();
    // A run's ledger: 1,000 marks over ten tasks, tokens and the prerequisite included.
    let ledger: Vec<GateMark> = (0..1000u128)
        .map(|i| GateMark {
            ts_ms: 1,
            task_id: Some(TaskId(i % 10)),
            gate: ["count", "built", "token", "spend"][(i % 4) as usize].into(),
            event: match i % 4 {
                0 => GateEvent::Counted,
                1 => GateEvent::Met,
                2 => GateEvent::Issued,
                _ => GateEvent::Added { micros: 1_000_000 },
            },
        })
        .collect();
    let call = ToolCall::new(
        "Bash",
        json!({"command": "cargo test --workspace -- --nocapture", "amount": 3}),
    );
    let caller = Caller {
        mode: PermissionMode::AcceptEdits,
        tools: &tools,
        agent: Some(&agent),
    };
    for marks in [4usize, 1000] {
        // The run's ledger as the runtime holds it: indexed once (when the run's first gated call
        // reads the store), then kept up to date with each durable mark.
        let ledger = &GateLedger::from_marks(&ledger[..marks]);
        c.bench_function(
            &format!("decide_agent_gates_{marks}_marks_and_audit_rows"),
            |b| {
                b.iter(|| {
                    let v = policy.decide_for(&call, caller, &[]);
                    let (v, marks) =
                        apply_gates(&policy.gates, &call, v, Some(TaskId(3)), ledger, 2);
                    (v.audit_entries(2, Some(TaskId(3)), &call), marks)
                })
            },
        );
    }
}

criterion_group!(benches, decide, decide_with_agent_and_gates);
criterion_main!(benches);
