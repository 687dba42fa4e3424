//! Plan validation: cycles rejected, dependencies respected, independent steps batched.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use keel_actors::plan::{PLAN_STEPS_MAX, validate};
use keel_actors::{Plan, PlanError, PlanStep};
use proptest::prelude::*;

fn step(key: &str, deps: &[&str]) -> PlanStep {
    PlanStep {
        key: key.into(),
        brief: String::new(),
        goal: String::new(),
        quality_criteria: Vec::new(),
        output_schema: None,
        assignee: None,
        depends_on: deps.iter().map(|d| d.to_string()).collect(),
        estimate_micros: 0,
    }
}

/// Validate `(key, deps)` steps and compare the batches (as keys) or the error.
fn check(steps: &[(&str, &[&str])], expected: Result<Vec<Vec<&str>>, PlanError>) {
    let plan = Plan {
        steps: steps.iter().map(|(k, d)| step(k, d)).collect(),
        constraints: Vec::new(),
    };
    let got = validate(plan).map(|v| {
        v.batches()
            .iter()
            .map(|b| {
                b.iter()
                    .map(|&i| v.plan().steps[i].key.clone())
                    .collect::<Vec<_>>()
            })
            .collect::<Vec<_>>()
    });
    let expected = expected.map(|bs| {
        bs.into_iter()
            .map(|b| b.into_iter().map(String::from).collect::<Vec<_>>())
            .collect::<Vec<_>>()
    });
    assert_eq!(got, expected);
}

#[test]
fn independent_steps_share_a_batch() {
    check(
        &[("a", &[]), ("b", &[]), ("c", &[])],
        Ok(vec![vec!["a", "b", "c"]]),
    );
}

#[test]
fn dependent_steps_run_in_order() {
    check(
        &[("c", &["b"]), ("b", &["a"]), ("a", &[])],
        Ok(vec![vec!["a"], vec!["b"], vec!["c"]]),
    );
}

#[test]
fn a_diamond_has_three_batches() {
    check(
        &[("a", &[]), ("b", &["a"]), ("c", &["a"]), ("d", &["b", "c"])],
        Ok(vec![vec!["a"], vec!["b", "c"], vec!["d"]]),
    );
}

#[test]
fn a_duplicated_dependency_counts_once() {
    check(
        &[("a", &[]), ("b", &["a", "a"])],
        Ok(vec![vec!["a"], vec!["b"]]),
    );
}

#[test]
fn a_cycle_is_rejected_with_its_steps() {
    check(
        &[("a", &[]), ("b", &["c"]), ("c", &["b"]), ("d", &["c"])],
        Err(PlanError::Cycle(vec!["b".into(), "c".into(), "d".into()])),
    );
}

#[test]
fn a_self_dependency_is_a_cycle() {
    check(&[("a", &["a"])], Err(PlanError::Cycle(vec!["a".into()])));
}

#[test]
fn bad_plans_get_typed_errors() {
    check(&[], Err(PlanError::Empty));
    check(
        &[("a", &[]), ("a", &[])],
        Err(PlanError::DuplicateKey("a".into())),
    );
    check(
        &[("a", &["zzz"])],
        Err(PlanError::UnknownDependency {
            step: "a".into(),
            missing: "zzz".into(),
        }),
    );
    check(&[("", &[])], Err(PlanError::BadKey(String::new())));
    let many: Vec<String> = (0..=PLAN_STEPS_MAX).map(|i| format!("s{i}")).collect();
    let steps: Vec<(&str, &[&str])> = many.iter().map(|k| (k.as_str(), &[][..])).collect();
    check(
        &steps,
        Err(PlanError::TooManySteps((PLAN_STEPS_MAX + 1) as u32)),
    );
}

/// A random DAG: step i may depend only on steps with a lower index.
fn dag() -> impl Strategy<Value = Vec<Vec<usize>>> {
    (1usize..40).prop_flat_map(|n| {
        (0..n)
            .map(|i| {
                proptest::collection::vec(0..i.max(1), 0..4.min(i + 1))
                    .prop_map(move |d| if i == 0 { Vec::new() } else { d })
            })
            .collect::<Vec<_>>()
    })
}

fn to_plan(deps: &[Vec<usize>]) -> Plan {
    Plan {
        steps: deps
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let names: Vec<String> = d.iter().map(|j| format!("s{j}")).collect();
                let refs: Vec<&str> = names.iter().map(String::as_str).collect();
                step(&format!("s{i}"), &refs)
            })
            .collect(),
        constraints: Vec::new(),
    }
}

proptest! {
    #[test]
    fn every_dag_validates_and_every_dependency_is_in_an_earlier_batch(deps in dag()) {
        let v = validate(to_plan(&deps)).expect("a DAG is valid");
        let mut batch_of = vec![usize::MAX; deps.len()];
        for (b, batch) in v.batches().iter().enumerate() {
            prop_assert!(!batch.is_empty());
            for &i in batch {
                prop_assert_eq!(batch_of[i], usize::MAX, "a step in two batches");
                batch_of[i] = b;
            }
        }
        for (i, d) in deps.iter().enumerate() {
            prop_assert!(batch_of[i] != usize::MAX, "a step in no batch");
            for &j in d {
                prop_assert!(batch_of[j] < batch_of[i], "dependency not in an earlier batch");
            }
            // Maximal batching: a step sits right after its latest dependency.
            let want = d.iter().map(|&j| batch_of[j] + 1).max().unwrap_or(0);
            prop_assert_eq!(batch_of[i], want);
        }
    }

    #[test]
    fn a_back_edge_makes_a_cycle_that_is_rejected(deps in dag(), pick in any::<proptest::sample::Index>()) {
        // Add an edge from a step's dependency back to the step: a cycle through both.
        let with_deps: Vec<usize> = (0..deps.len()).filter(|&i| !deps[i].is_empty()).collect();
        prop_assume!(!with_deps.is_empty());
        let i = with_deps[pick.index(with_deps.len())];
        let j = deps[i][0];
        let mut cyclic = deps.clone();
        cyclic[j].push(i);
        match validate(to_plan(&cyclic)) {
            Err(PlanError::Cycle(keys)) => {
                let (ki, kj) = (format!("s{}", i), format!("s{}", j));
                prop_assert!(keys.contains(&ki));
                prop_assert!(keys.contains(&kj));
            }
            other => prop_assert!(false, "expected a cycle, got {:?}", other.map(|v| v.batches().to_vec())),
        }
    }
}
