//! The gates checked against an oracle over every sequence of up to five steps (two tasks; a guarded
//! call, one a human approved after an ask, one whose tool failed, and the success of the call a
//! prerequisite or token waits for), for every kind in both scopes, with the ledger's index checked
//! against one rebuilt from the marks after every step; then each kind's reasons, the cap's arithmetic and the rule that a call the chain did not
//! allow is never counted.

use super::*;
use crate::chain::Policy;
use crate::ledger::GateLedger;
use keel_harness::PermissionMode;
use serde_json::json;
use std::collections::BTreeMap;

fn rule(text: &str) -> Rule {
    text.parse().unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn gate(name: &str, per: GateScope, check: GateCheck) -> Gate {
    Gate {
        name: name.into(),
        rule: rule("Bash(pay*)"),
        per,
        check,
    }
}

fn every_kind(per: GateScope) -> Vec<Gate> {
    vec![
        gate("count", per, GateCheck::Count { max_calls: 2 }),
        gate(
            "prereq",
            per,
            GateCheck::Prerequisite {
                after: rule("Bash(prepare*)"),
            },
        ),
        gate(
            "token",
            per,
            GateCheck::Token {
                issued_by: rule("Bash(prepare*)"),
            },
        ),
        gate(
            "cap",
            per,
            GateCheck::Cap {
                field: "amount".into(),
                max_micros: 5 * MICROS_PER_UNIT,
            },
        ),
    ]
}

fn pay(amount: Value) -> ToolCall {
    ToolCall::new("Bash", json!({"command": "pay bob", "amount": amount}))
}

fn prepare() -> ToolCall {
    ToolCall::new("Bash", json!({"command": "prepare invoice"}))
}

/// A node deciding calls and recording successes, as the runtime does: the marks as the store's
/// table holds them, and the index the gates read, kept up to date mark by mark and checked against
/// one rebuilt from the table after every step (what a restarted node reads).
struct Ledger {
    gates: Vec<Gate>,
    marks: Vec<GateMark>,
    index: GateLedger,
}

impl Ledger {
    fn new(gates: Vec<Gate>) -> Ledger {
        Ledger {
            gates,
            marks: Vec::new(),
            index: GateLedger::default(),
        }
    }

    fn write(&mut self, marks: Vec<GateMark>) {
        self.index.record(&marks);
        self.marks.extend(marks);
        assert_eq!(self.index, GateLedger::from_marks(&self.marks));
        assert_eq!(self.index.len(), self.marks.len() as u64);
    }

    fn decide(&mut self, call: &ToolCall, task: u128) -> Verdict {
        let v = Policy::default().decide(call, PermissionMode::Bypass, &[]);
        self.gated(call, task, v)
    }

    /// Applies the gates to a verdict on `call` (the chain's, or a human's approval).
    fn gated(&mut self, call: &ToolCall, task: u128, v: Verdict) -> Verdict {
        let (v, marks) = apply_gates(&self.gates, call, v, Some(TaskId(task)), &self.index, 7);
        self.write(marks);
        v
    }

    /// `call` under an ask rule: the gates check it before anyone is asked, and again, writing
    /// their marks, once a human approved it.
    fn approved(&mut self, call: &ToolCall, task: u128) -> Verdict {
        let policy = Policy {
            ask: vec![rule("Bash(pay*)")],
            ..Policy::default()
        };
        let v = policy.decide(call, PermissionMode::Bypass, &[]);
        assert_eq!(v.decision, Decision::Ask);
        let asked = self.gated(call, task, v);
        if asked.decision != Decision::Ask {
            return asked;
        }
        self.gated(call, task, Verdict::approved("approved by a human".into()))
    }

    fn succeeded(&mut self, call: &ToolCall, task: u128) {
        let marks = marks_on_success(&self.gates, call, Some(TaskId(task)), 8);
        self.write(marks);
    }
}

#[derive(Clone, Copy, Debug)]
enum Step {
    /// Task N calls the guarded tool (amount 2).
    Pay(u128),
    /// Task N calls it under an ask rule, and a human approves.
    Approved(u128),
    /// Task N calls it, and the tool fails (its result earns no mark).
    Failed(u128),
    /// Task N's preparing call succeeded.
    Prepared(u128),
}

const STEPS: [Step; 6] = [
    Step::Pay(1),
    Step::Pay(2),
    Step::Approved(1),
    Step::Failed(2),
    Step::Prepared(1),
    Step::Prepared(2),
];

fn sequences(len: usize) -> Vec<Vec<Step>> {
    let mut all: Vec<Vec<Step>> = vec![Vec::new()];
    let mut last = vec![Vec::new()];
    for _ in 0..len {
        let next: Vec<Vec<Step>> = last
            .iter()
            .flat_map(|s: &Vec<Step>| {
                STEPS.iter().map(move |step| {
                    let mut s = s.clone();
                    s.push(*step);
                    s
                })
            })
            .collect();
        all.extend(next.iter().cloned());
        last = next;
    }
    all
}

/// The documented semantics as counters, independently of the implementation: a call let through
/// counts (its count, its token, its amount) from the decision, whether the tool then succeeds or
/// fails; an approved ask is checked like any allowed call.
#[derive(Default)]
struct Oracle {
    counted: BTreeMap<u128, u32>,
    met: BTreeMap<u128, bool>,
    issued: BTreeMap<u128, u32>,
    spent: BTreeMap<u128, u32>,
    sum: BTreeMap<u128, u64>,
}

impl Oracle {
    fn key(per: GateScope, task: u128) -> u128 {
        match per {
            GateScope::Task => task,
            GateScope::Run => 0,
        }
    }

    fn pay(&mut self, kind: &str, k: u128) -> Decision {
        let allow = match kind {
            "count" => {
                let n = self.counted.entry(k).or_default();
                (*n < 2).then(|| *n += 1).is_some()
            }
            "prereq" => self.met.get(&k).copied().unwrap_or(false),
            "token" => {
                let issued = self.issued.get(&k).copied().unwrap_or(0);
                let spent = self.spent.entry(k).or_default();
                (issued > *spent).then(|| *spent += 1).is_some()
            }
            "cap" => {
                let sum = self.sum.entry(k).or_default();
                (*sum + 2 <= 5).then(|| *sum += 2).is_some()
            }
            other => panic!("{other}"),
        };
        if allow {
            Decision::Allow
        } else {
            Decision::Deny
        }
    }

    fn prepared(&mut self, k: u128) {
        self.met.insert(k, true);
        *self.issued.entry(k).or_default() += 1;
    }
}

#[test]
fn every_kind_in_both_scopes_matches_the_oracle_on_every_sequence() {
    let sequences = sequences(5);
    assert_eq!(sequences.len(), 9331);
    let mut checked = 0u32;
    for per in [GateScope::Task, GateScope::Run] {
        for g in every_kind(per) {
            for seq in &sequences {
                let mut ledger = Ledger::new(vec![g.clone()]);
                let mut oracle = Oracle::default();
                for (i, step) in seq.iter().enumerate() {
                    match *step {
                        Step::Pay(task) | Step::Approved(task) | Step::Failed(task) => {
                            let got = match step {
                                Step::Approved(_) => ledger.approved(&pay(json!(2)), task),
                                // The failure comes back after the decision and writes nothing.
                                _ => ledger.decide(&pay(json!(2)), task),
                            };
                            let want = oracle.pay(&g.name, Oracle::key(per, task));
                            assert_eq!(got.decision, want, "{} {per:?} {seq:?} at {i}", g.name);
                            if want == Decision::Deny {
                                assert_eq!(got.decided_by, g.who());
                            }
                            checked += 1;
                        }
                        Step::Prepared(task) => {
                            ledger.succeeded(&prepare(), task);
                            oracle.prepared(Oracle::key(per, task));
                        }
                    }
                }
            }
        }
    }
    assert!(checked > 100_000, "{checked}");
}

#[test]
fn a_call_the_chain_did_not_allow_passes_no_gate_and_writes_no_mark() {
    let gates = every_kind(GateScope::Run);
    let policy = Policy {
        deny: vec![rule("Bash")],
        ..Policy::default()
    };
    let call = pay(json!(1));
    let v = policy.decide(&call, PermissionMode::Bypass, &[]);
    let (v, marks) = apply_gates(&gates, &call, v, None, &GateLedger::default(), 0);
    assert_eq!(v.decision, Decision::Deny);
    assert!(marks.is_empty());
    assert!(v.trail.iter().all(|l| !l.who.starts_with("gate:")));
}

#[test]
fn the_first_refusing_gate_decides_and_nothing_is_written() {
    let mut ledger = Ledger::new(every_kind(GateScope::Run));
    let v = ledger.decide(&pay(json!(1)), 1);
    // The count passes; the prerequisite refuses; the count's mark is not written.
    assert_eq!(v.decided_by, "gate:prereq");
    assert!(ledger.marks.is_empty(), "{:?}", ledger.marks);
    ledger.succeeded(&prepare(), 1);
    let v = ledger.decide(&pay(json!(1)), 1);
    assert_eq!(v.decision, Decision::Allow, "{v:?}");
    let events: Vec<GateEvent> = ledger.marks.iter().map(|m| m.event).collect();
    assert_eq!(
        events,
        [
            GateEvent::Met,
            GateEvent::Issued,
            GateEvent::Counted,
            GateEvent::Spent,
            GateEvent::Added {
                micros: MICROS_PER_UNIT
            }
        ]
    );
    let gate_lines: Vec<&str> = v
        .trail
        .iter()
        .filter(|l| l.who.starts_with("gate:"))
        .map(|l| l.who.as_str())
        .collect();
    assert_eq!(
        gate_lines,
        ["gate:count", "gate:prereq", "gate:token", "gate:cap"]
    );
}

#[test]
fn a_failed_call_meets_no_prerequisite_and_unrelated_calls_are_not_gated() {
    let mut ledger = Ledger::new(every_kind(GateScope::Task));
    // The runtime reports only successes: a failed `prepare` leaves the ledger as it was.
    let v = ledger.decide(&ToolCall::new("Bash", json!({"command": "ls"})), 1);
    assert_eq!(v.decision, Decision::Allow);
    assert!(ledger.marks.is_empty());
    assert!(!guards(&ledger.gates, &prepare()));
    assert!(watches_success(&ledger.gates, &prepare()));
    assert!(!watches_success(&ledger.gates, &pay(json!(1))));
}

#[test]
fn refusals_say_what_to_do() {
    let mut ledger = Ledger::new(every_kind(GateScope::Task));
    let v = ledger.decide(&pay(json!(1)), 1);
    assert!(
        v.reason.contains(
            "a call matching Bash(prepare*) must succeed in this task before Bash; run it first"
        ),
        "{}",
        v.reason
    );
    let mut ledger = Ledger::new(vec![every_kind(GateScope::Run).remove(2)]);
    let v = ledger.decide(&pay(json!(1)), 1);
    assert!(
        v.reason.contains("needs a token token, issued when a call matching Bash(prepare*) succeeds; 0 issued and 0 spent in this run"),
        "{}",
        v.reason
    );
    let mut ledger = Ledger::new(vec![every_kind(GateScope::Run).remove(3)]);
    assert_eq!(ledger.decide(&pay(json!(4.5)), 1).decision, Decision::Allow);
    let v = ledger.decide(&pay(json!(0.75)), 2);
    assert_eq!(
        v.reason,
        "gate cap: amount 0.75 would bring this run's total to 5.25, past the cap of 5"
    );
    assert_eq!(ledger.decide(&pay(json!(0.5)), 2).decision, Decision::Allow);
    let v = ledger.decide(&pay(json!(0)), 2);
    assert_eq!(v.decision, Decision::Allow, "a zero amount fits a full cap");
}

#[test]
fn a_missing_negative_or_non_numeric_amount_denies() {
    for input in [
        json!({"command": "pay bob"}),
        json!({"command": "pay bob", "amount": "3"}),
        json!({"command": "pay bob", "amount": -1}),
        json!({"command": "pay bob", "amount": -0.5}),
        json!({"command": "pay bob", "amount": null}),
        json!({"command": "pay bob", "amount": [1]}),
        json!({"command": "pay bob", "amount": u64::MAX}),
        json!({"command": "pay bob", "amount": 1e300}),
    ] {
        let mut ledger = Ledger::new(vec![every_kind(GateScope::Run).remove(3)]);
        let v = ledger.decide(&ToolCall::new("Bash", input.clone()), 1);
        assert_eq!(v.decision, Decision::Deny, "{input}");
        assert!(v.reason.ends_with("so the call is denied"), "{}", v.reason);
        assert!(ledger.marks.is_empty());
    }
}

#[test]
fn amounts_are_read_by_dotted_path_in_millionths() {
    let input = json!({"payment": {"amount": 12.5, "n": 3}, "tiny": 0.000_000_4});
    assert_eq!(amount_micros(&input, "payment.amount"), Ok(12_500_000));
    assert_eq!(amount_micros(&input, "payment.n"), Ok(3_000_000));
    assert_eq!(amount_micros(&input, "tiny"), Ok(0));
    assert!(amount_micros(&input, "payment.missing").is_err());
    assert!(amount_micros(&input, "payment").is_err());
    // 0.1 + 0.2 in millionths is exact.
    assert_eq!(
        amount_micros(&json!({"a": 0.1}), "a").unwrap_or(0)
            + amount_micros(&json!({"a": 0.2}), "a").unwrap_or(0),
        300_000
    );
    assert_eq!(units(12_500_000), "12.5");
    assert_eq!(units(3_000_000), "3");
    assert_eq!(units(1), "0.000001");
    assert_eq!(units(0), "0");
}
