//! Fixed decompositions and their validation (docs/DESIGN.md §8): a plan is checked before it runs, cycles are
//! rejected, and independent steps are batched in topological order.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// Most steps one plan may have: a run of 1,024 specialists (issue 14). The plan's text is stored
/// once in its own row (the store's `run_plans`, up to its `plan_bytes_max`), never in the run's row,
/// and a step's key and dependencies are bounded below, so the bound is on memory and on one
/// checkpoint's size (a step's snapshot is about 160 bytes, more with its newest failure or a
/// lead's delegated brief: the store's `checkpoint_bytes_max` of 4 MiB leaves room for 1,024).
pub const PLAN_STEPS_MAX: usize = 1024;
/// Most dependencies one step may declare.
pub const STEP_DEPENDENCIES_MAX: usize = 32;
/// Most bytes of a step key.
pub const STEP_KEY_BYTES_MAX: usize = 64;

/// One step of a fixed plan: a brief for one specialist and the steps it must wait for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlanStep {
    /// A key unique within the plan (`"survey"`, `"compare-2"`).
    pub key: String,
    /// What the specialist is asked to do.
    pub brief: String,
    /// The goal, stated separately for the report check.
    pub goal: String,
    /// Explicit quality criteria.
    #[serde(default)]
    pub quality_criteria: Vec<String>,
    /// The output schema of the report, if any.
    #[serde(default)]
    pub output_schema: Option<String>,
    /// The agent profile to ask for; `None` lets the supervisor pick.
    #[serde(default)]
    pub assignee: Option<String>,
    /// Steps whose reports this one needs (their findings are passed to it).
    #[serde(default)]
    pub depends_on: Vec<String>,
    /// The most this step may spend, reserved in the ledger before it is admitted.
    #[serde(default)]
    pub estimate_micros: u64,
}

/// A fixed decomposition, known before the input arrives (sectioning).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Plan {
    /// The steps, in any order.
    pub steps: Vec<PlanStep>,
    /// Constraints restated to every specialist.
    #[serde(default)]
    pub constraints: Vec<String>,
}

/// Why a plan was rejected. Nothing of a rejected plan is dispatched.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum PlanError {
    /// No steps.
    #[error("the plan has no steps")]
    Empty,
    /// More than [`PLAN_STEPS_MAX`] steps.
    #[error("the plan has {0} steps, more than the limit")]
    TooManySteps(u32),
    /// A key is empty or longer than [`STEP_KEY_BYTES_MAX`].
    #[error("step key {0:?} is empty or too long")]
    BadKey(String),
    /// Two steps share a key.
    #[error("two steps share the key {0:?}")]
    DuplicateKey(String),
    /// A step depends on a key that does not exist.
    #[error("step {step:?} depends on unknown step {missing:?}")]
    UnknownDependency {
        /// The step.
        step: String,
        /// The missing key.
        missing: String,
    },
    /// A step has more than [`STEP_DEPENDENCIES_MAX`] dependencies.
    #[error("step {0:?} has too many dependencies")]
    TooManyDependencies(String),
    /// The dependencies form a cycle; these steps are on or behind it.
    #[error("the plan has a cycle through {0:?}")]
    Cycle(Vec<String>),
}

/// A validated plan: the steps plus their topological batches. Only [`validate`] builds one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValidatedPlan {
    plan: Plan,
    batches: Vec<Vec<usize>>,
}

impl ValidatedPlan {
    /// The plan as given.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Step indices in batches: every step's dependencies are in earlier batches; the steps of one batch
    /// are independent and dispatched together. Within a batch, indices ascend (deterministic).
    pub fn batches(&self) -> &[Vec<usize>] {
        &self.batches
    }

    /// The step with this index.
    pub fn step(&self, index: usize) -> Option<&PlanStep> {
        self.plan.steps.get(index)
    }

    /// The index of the step with this key.
    pub fn index_of(&self, key: &str) -> Option<usize> {
        self.plan.steps.iter().position(|s| s.key == key)
    }
}

/// Check a plan and compute its batches (Kahn's algorithm, layer by layer).
///
/// # Errors
/// The first problem found, as a [`PlanError`]; a cycle names every step that could not be ordered.
pub fn validate(plan: Plan) -> Result<ValidatedPlan, PlanError> {
    let n = plan.steps.len();
    if n == 0 {
        return Err(PlanError::Empty);
    }
    if n > PLAN_STEPS_MAX {
        return Err(PlanError::TooManySteps(
            u32::try_from(n).unwrap_or(u32::MAX),
        ));
    }
    let mut index: BTreeMap<&str, usize> = BTreeMap::new();
    for (i, s) in plan.steps.iter().enumerate() {
        if s.key.is_empty() || s.key.len() > STEP_KEY_BYTES_MAX {
            return Err(PlanError::BadKey(s.key.chars().take(80).collect()));
        }
        if index.insert(s.key.as_str(), i).is_some() {
            return Err(PlanError::DuplicateKey(s.key.clone()));
        }
    }
    let mut indegree = vec![0usize; n];
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (i, s) in plan.steps.iter().enumerate() {
        if s.depends_on.len() > STEP_DEPENDENCIES_MAX {
            return Err(PlanError::TooManyDependencies(s.key.clone()));
        }
        let deps: BTreeSet<&str> = s.depends_on.iter().map(String::as_str).collect();
        for d in deps {
            let Some(&j) = index.get(d) else {
                return Err(PlanError::UnknownDependency {
                    step: s.key.clone(),
                    missing: d.to_string(),
                });
            };
            indegree[i] += 1;
            dependents[j].push(i);
        }
    }
    let mut batches = Vec::new();
    let mut ready: Vec<usize> = (0..n).filter(|&i| indegree[i] == 0).collect();
    let mut placed = 0;
    while !ready.is_empty() {
        ready.sort_unstable();
        placed += ready.len();
        let mut next = Vec::new();
        for &i in &ready {
            for &d in &dependents[i] {
                indegree[d] -= 1;
                if indegree[d] == 0 {
                    next.push(d);
                }
            }
        }
        batches.push(std::mem::replace(&mut ready, next));
    }
    if placed < n {
        let stuck = (0..n)
            .filter(|&i| indegree[i] > 0)
            .map(|i| plan.steps[i].key.clone())
            .collect();
        return Err(PlanError::Cycle(stuck));
    }
    Ok(ValidatedPlan { plan, batches })
}
