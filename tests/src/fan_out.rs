//! Readers of a 16-part fan-out run (`keel_actors::runtime::scripted::fan_out_plan`, part `i`
//! printing `part i done`) in a store, shared by the crash tests of `keel run` and of `keel node`.

use keel_store::{RunId, Store, StoreConfig, Task, TaskKind, TaskStatus};
use std::path::Path;

/// Make `work` a folder with a keel home (`keel init`) whose keel.toml is `keel_toml`, and a
/// `plan.json` of `steps` parts, part `i` running `command(i)`.
///
/// # Panics
/// When a file cannot be written or `keel init` fails (a test's failure report).
#[allow(clippy::unwrap_used)]
pub fn prepare(work: &Path, keel_toml: &str, steps: usize, command: impl Fn(usize) -> String) {
    std::fs::create_dir_all(work).unwrap();
    let init = crate::keel(work).unwrap().arg("init").output().unwrap();
    assert!(init.status.success(), "{init:?}");
    std::fs::write(work.join(".keel/keel.toml"), keel_toml).unwrap();
    let plan = keel_actors::runtime::scripted::fan_out_plan(steps, command).unwrap();
    std::fs::write(
        work.join("plan.json"),
        serde_json::to_string(&plan).unwrap(),
    )
    .unwrap();
}

/// The store of the home in `work`, opened read-only.
///
/// # Panics
/// When it cannot be opened (a test's failure report).
#[allow(clippy::expect_used)]
pub fn reader(work: &Path) -> Store {
    Store::open_read_only(work.join(".keel/keel.redb"), StoreConfig::default())
        .expect("the store opens read-only")
}

/// The run's tasks other than its root.
pub fn subtasks(store: &Store, run: RunId) -> Vec<Task> {
    store
        .run(run)
        .tasks(None, 1000)
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|t| t.kind != TaskKind::Root)
        .collect()
}

/// How many of `tasks` have `status`.
pub fn count(tasks: &[Task], status: TaskStatus) -> usize {
    tasks.iter().filter(|t| t.status == status).count()
}

/// The part number a subtask's brief names (`usize::MAX` when it names none).
pub fn part(task: &Task) -> usize {
    task.brief
        .split("Part ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(usize::MAX)
}

/// How many recorded session openings are of part `part`.
pub fn openings_of(openings: &[String], part: usize) -> usize {
    let marker = format!("Part {part} of the fan-out.");
    openings.iter().filter(|o| o.contains(&marker)).count()
}

/// The claims of the run's complete reports, sorted (an uninterrupted run gives `part i done` for
/// each i); a task whose outcome is not a report gives `not a report: ...`.
pub fn claims(store: &Store, run: RunId) -> Vec<String> {
    let mut claims: Vec<String> = subtasks(store, run)
        .iter()
        .filter(|t| t.status == TaskStatus::Complete)
        .map(|t| {
            let outcome = t
                .outcome
                .as_deref()
                .and_then(|o| serde_json::from_str::<keel_actors::StepOutcome>(o).ok());
            match outcome {
                Some(keel_actors::StepOutcome::Report(r)) => r
                    .findings
                    .first()
                    .map(|f| f.claim.clone())
                    .unwrap_or_default(),
                other => format!("not a report: {other:?}"),
            }
        })
        .collect();
    claims.sort();
    claims
}

/// The claims of an uninterrupted run of `steps` parts, sorted.
pub fn expected_claims(steps: usize) -> Vec<String> {
    let mut v: Vec<String> = (0..steps).map(|i| format!("part {i} done")).collect();
    v.sort();
    v
}
