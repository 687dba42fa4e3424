//! The Stop hook's report check on the real `keel` path (docs/DESIGN.md §9; issues 13 and 15): a
//! session whose final text is not a valid report gets ONE more turn in the SAME session with the
//! exact error before the attempt fails. The re-ask is part of the attempt (no new task, no second
//! attempt, one idempotency key: invariant 2).
//!
//! Real processes: `keel model-server` (the scripted model on 127.0.0.1, whose `MALFORMED_REPORTS:
//! n` rule answers with an unsourced report until it was re-asked `n` times), `keel run` on a plan
//! of one step, on keel's own loop, on the real Claude Code (its Stop command hook) and on the real
//! Codex (its `-c hooks.Stop` hook); the CLIs are skipped only with `KEEL_SKIP_REAL_CLIS=1` when they
//! are not installed.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use keel_actors::PlanStep;
use keel_harness::HarnessKind;
use keel_harness::scripted::model::{MALFORMED_REPORTS, REPORT_AFTER_TOOL};
use keel_store::{RunId, Store, StoreConfig, Task, TaskKind};
use keel_tests::policy::PolicyHome;
/// What the log row of a re-ask starts with (the specialist's record of a `SentBack` event).
const SENT_BACK: &str = "report check: sent back for one more turn";
/// The exact error of the scripted model's unsourced report.
const UNSOURCED: &str = "finding 0 has no source";

struct Fixture(PolicyHome);

impl Fixture {
    /// A keel home with a plan of one step whose session reports `malformed` unsourced reports
    /// before a good one, and a scripted model server recording every request.
    fn new(malformed: u32) -> Fixture {
        let home = PolicyHome::new("").unwrap();
        // The scripted model runs the command, then reports (unsourced `malformed` times) whatever
        // the tool answered: a CLI refusing the command still gets a tool result to report.
        let step = PlanStep {
            key: "hello".into(),
            brief: format!(
                "Say hello.\nRUN_TOOL: echo hello ;;\n{REPORT_AFTER_TOOL}\n{MALFORMED_REPORTS} {malformed}"
            ),
            goal: "Say hello.".into(),
            quality_criteria: Vec::new(),
            output_schema: None,
            assignee: None,
            depends_on: Vec::new(),
            estimate_micros: 0,
        };
        home.write_plan(vec![step]).unwrap();
        Fixture(home)
    }

    /// `keel run` of the plan on keel's own loop (`None`) or a real CLI.
    fn run(&self, harness: Option<HarnessKind>) -> (i32, String, String) {
        self.0
            .run_to_end(&mut self.0.run_command(harness).unwrap())
            .unwrap()
    }

    /// The run's subtasks (oldest first) with the summaries of their log rows.
    fn subtasks(&self) -> Vec<(Task, Vec<String>)> {
        let store = Store::open_read_only(
            self.0.path().join(".keel").join("keel.redb"),
            StoreConfig::default(),
        )
        .unwrap();
        let run: RunId = store.catalog().latest_run().unwrap().unwrap().id;
        let tasks = store.run(run).tasks(None, 100).unwrap().items;
        tasks
            .into_iter()
            .filter(|t| t.kind != TaskKind::Root)
            .map(|t| {
                let rows = store.run(run).last_log_rows(t.id, 500).unwrap();
                (t, rows.into_iter().map(|r| r.value.summary).collect())
            })
            .collect()
    }
}

fn sent_back(rows: &[String]) -> Vec<&String> {
    rows.iter().filter(|r| r.starts_with(SENT_BACK)).collect()
}

/// One malformed report, then a good one: the run completes in one attempt of one task, whose log
/// shows the one re-ask with the exact error.
fn fixed_in_one_more_turn(harness: Option<HarnessKind>) {
    let fx = Fixture::new(1);
    let (code, out, err) = fx.run(harness);
    let tasks = fx.subtasks();
    assert_eq!(
        code, 0,
        "{harness:?}: the run failed\n{out}\n{err}\n{tasks:#?}"
    );
    assert_eq!(
        tasks.len(),
        1,
        "{harness:?}: a new task started: {tasks:#?}"
    );
    let (task, rows) = &tasks[0];
    assert_eq!(task.attempt, 1, "{harness:?}: a second attempt started");
    let re_asks = sent_back(rows);
    assert_eq!(re_asks.len(), 1, "{harness:?}: {rows:#?}");
    assert!(re_asks[0].contains(UNSOURCED), "{}", re_asks[0]);
    assert!(
        rows.iter()
            .any(|r| r.starts_with("finished: Complete report")),
        "{rows:#?}"
    );
}

/// Two malformed reports: the attempt fails with the exact error after its one re-ask (the step's
/// retry then starts a new attempt, whose preamble carries the error, and may succeed).
fn fails_after_one_re_ask(harness: Option<HarnessKind>) {
    let fx = Fixture::new(2);
    let (_code, out, err) = fx.run(harness);
    let tasks = fx.subtasks();
    let rows: Vec<&String> = tasks.iter().flat_map(|(_, rows)| rows).collect();
    let failed = rows
        .iter()
        .position(|r| r.starts_with("failed: malformed_report"))
        .unwrap_or_else(|| panic!("{harness:?}: no failed attempt: {tasks:#?}\n{out}\n{err}"));
    assert!(rows[failed].contains(UNSOURCED), "{}", rows[failed]);
    let before: Vec<String> = rows[..failed].iter().map(|r| (*r).clone()).collect();
    assert_eq!(sent_back(&before).len(), 1, "{harness:?}: {before:#?}");
    assert!(sent_back(&before)[0].contains(UNSOURCED), "{before:#?}");
}

#[test]
fn keels_own_loop_fixes_a_malformed_report_in_one_more_turn_of_the_same_session() {
    fixed_in_one_more_turn(None);
}

#[test]
fn keels_own_loop_fails_the_attempt_after_a_second_malformed_report() {
    fails_after_one_re_ask(None);
}

#[test]
fn claude_code_fixes_a_malformed_report_in_one_more_turn_through_its_stop_hook() {
    if keel_tests::claude_code_installed() {
        fixed_in_one_more_turn(Some(HarnessKind::ClaudeCode));
    }
}

#[test]
fn codex_fixes_a_malformed_report_in_one_more_turn_through_its_stop_hook() {
    if keel_tests::cli_installed(HarnessKind::Codex) {
        fixed_in_one_more_turn(Some(HarnessKind::Codex));
    }
}

#[test]
fn codex_fails_the_attempt_after_a_second_malformed_report() {
    if keel_tests::cli_installed(HarnessKind::Codex) {
        fails_after_one_re_ask(Some(HarnessKind::Codex));
    }
}
