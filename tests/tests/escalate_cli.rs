//! Escalations on the real `keel` path (docs/DESIGN.md §9, issues 11 and 13): a session calls the
//! `escalate` MCP tool, its task pauses durably, `keel escalations` lists the self-contained payload,
//! `keel answer` refuses a bad answer and changes nothing, and a good answer resumes the task in a
//! new session whose first request carries the answer.
//!
//! Real processes: `keel model-server` (the scripted model on 127.0.0.1, recording every request),
//! `keel run` on a one-step plan with keel's own agent loop and keel's MCP endpoint, and
//! `keel escalations` / `keel answer` from other processes while `keel run` holds the store.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use std::path::Path;
use std::time::Duration;

use keel_actors::Plan;
use keel_actors::runtime::scripted;
use keel_store::{RunId, Store, StoreConfig, TaskKind};
use keel_tests::{
    Reaped, keel, keel_json_list, recorded_bodies, run_to_end, session_openings, wait_for,
};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(120);
/// What the scripted session asks.
const QUESTION: &str = "Which config format should the tool write?";

/// `keel --json escalations [args]` in `dir`: the listed escalations.
fn escalations(dir: &Path, args: &[&str]) -> Vec<Value> {
    let args: Vec<&str> = std::iter::once("escalations")
        .chain(args.iter().copied())
        .collect();
    keel_json_list(dir, &args, "escalations", WAIT).unwrap()
}

/// A keel home in a temporary folder with a one-step plan, and a scripted model server (recording
/// every request in `records/`) whose first answer calls `escalate`; everything after follows the
/// prompt rules (the step's command prints its report).
struct Fixture {
    dir: tempfile::TempDir,
    url: String,
    _server: Reaped,
}

impl Fixture {
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let home = dir.path();
        let (code, out, err) = run_to_end(keel(home).unwrap().arg("init"), WAIT).unwrap();
        assert_eq!(code, 0, "{out}{err}");
        let plan = Plan {
            steps: vec![
                scripted::step(
                    "decide",
                    "Write the config file.",
                    "echo resumed-after-answer",
                    "shell",
                    &[],
                )
                .unwrap(),
            ],
            constraints: Vec::new(),
        };
        std::fs::write(
            home.join(".keel").join("plan.json"),
            serde_json::to_string(&plan).unwrap(),
        )
        .unwrap();
        let script = serde_json::json!({"turns": [{"tool_calls": [{
            "name": "mcp__keel__escalate",
            "input": {"reason": "the spec names two formats", "question": QUESTION, "options": ["json", "toml"]},
        }]}]});
        std::fs::write(home.join("script.json"), script.to_string()).unwrap();
        let mut cmd = keel(home).unwrap();
        cmd.args([
            "model-server",
            "--script",
            "script.json",
            "--record-dir",
            "records",
        ]);
        let mut server = Reaped::spawn(cmd).unwrap();
        let line = server
            .line_containing("listening on", Duration::from_secs(60))
            .unwrap();
        let url = line.split_whitespace().last().unwrap().to_string();
        Fixture {
            dir,
            url,
            _server: server,
        }
    }

    fn home(&self) -> &Path {
        self.dir.path()
    }

    /// `keel run` of the plan on keel's own loop, started.
    fn start(&self, verb: &[&str]) -> Reaped {
        let mut cmd = keel(self.home()).unwrap();
        cmd.args(verb)
            .args(["--quiet", "--model-server", &self.url]);
        Reaped::spawn(cmd).unwrap()
    }

    /// The one open escalation, once it is listed.
    fn open_escalation(&self) -> Value {
        let open = wait_for(WAIT, "an open escalation", || {
            let list = escalations(self.home(), &[]);
            (!list.is_empty()).then_some(list)
        })
        .unwrap();
        assert_eq!(open.len(), 1, "{open:#?}");
        open[0].clone()
    }

    /// The sessions' first requests, in order.
    fn openings(&self) -> Vec<String> {
        session_openings(&recorded_bodies(&self.home().join("records")))
    }
}

#[test]
fn an_escalated_task_pauses_until_keel_answer_and_resumes_with_the_answer() {
    let began = std::time::Instant::now();
    let fx = Fixture::new();
    let home = fx.home();
    eprintln!("model server up after {:?}", began.elapsed());
    let run = fx.start(&["run", "write the config", "--plan", ".keel/plan.json"]);

    // The escalation is listed while `keel run` holds the store, with its whole payload.
    let e = fx.open_escalation();
    eprintln!("escalation listed after {:?}", began.elapsed());
    assert_eq!(e["trigger"], "human_requested");
    assert_eq!(e["status"], "open");
    assert_eq!(e["asked"], QUESTION);
    assert_eq!(e["diagnosis"], "the spec names two formats");
    assert_eq!(e["options"], serde_json::json!(["json", "toml"]));
    assert_eq!(e["waiting"]["kind"], "task");
    let recommended = e["recommended_action"].as_str().unwrap();
    assert!(
        recommended.contains("\"json\", \"toml\"")
            && recommended.contains(e["id"].as_str().unwrap()),
        "{recommended}"
    );
    let id = e["id"].as_str().unwrap().to_string();
    let task = e["task"].as_str().unwrap().to_string();
    // The task is paused, durably.
    let (code, out, err) =
        run_to_end(keel(home).unwrap().args(["--json", "show", &task]), WAIT).unwrap();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("\"Paused\""), "{out}");

    // Bad answers are refused with the field's problem and change nothing.
    let (code, out, err) =
        run_to_end(keel(home).unwrap().args(["answer", &id, "yaml"]), WAIT).unwrap();
    assert_eq!(code, 2, "not an option\n{out}{err}");
    assert!(err.contains("json, toml"), "{err}");
    let (code, out, err) = run_to_end(
        keel(home)
            .unwrap()
            .args(["answer", "01ARZ3NDEKTSV4RRFFQ69G5FAV", "json"]),
        WAIT,
    )
    .unwrap();
    assert_eq!(code, 3, "unknown escalation\n{out}{err}");
    assert_eq!(
        escalations(home, &[]).len(),
        1,
        "a refused answer closed it"
    );

    // The answer goes to the process holding the store, which resumes the task.
    let (code, out, err) =
        run_to_end(keel(home).unwrap().args(["answer", &id, "TOML"]), WAIT).unwrap();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("resumes now"), "{out}");
    eprintln!("answered after {:?}", began.elapsed());
    let (status, out, err) = run.wait_output(WAIT).unwrap();
    eprintln!("run ended after {:?}", began.elapsed());
    assert_eq!(status.code(), Some(0), "the run completes\n{out}\n{err}");

    // The answer is recorded as the option spells it; nothing is open any more.
    assert!(escalations(home, &[]).is_empty());
    let all = escalations(home, &["--all"]);
    assert_eq!(all[0]["status"], "answered");
    assert_eq!(all[0]["answer"], "toml");
    // A second answer is refused.
    let (code, _, err) =
        run_to_end(keel(home).unwrap().args(["answer", &id, "json"]), WAIT).unwrap();
    assert_ne!(code, 0, "{err}");

    // Two sessions of the task: the second's first request carries the human's answer.
    let openings = fx.openings();
    assert_eq!(openings.len(), 2, "{openings:#?}");
    assert!(!openings[0].contains("The human answered"));
    assert!(
        openings[1].contains("The human answered: toml") && openings[1].contains(QUESTION),
        "{}",
        openings[1]
    );
}

/// The wait is durable: `keel run` is killed while the task waits, `keel answer` (no process holds
/// the store) records the answer, and `keel resume` runs the task once more with it; the task never
/// ran while nobody had answered.
#[test]
fn an_escalation_survives_a_sigkill_and_keel_resume_continues_with_the_answer() {
    let fx = Fixture::new();
    let home = fx.home();
    let run = fx.start(&["run", "write the config", "--plan", ".keel/plan.json"]);
    let e = fx.open_escalation();
    let id = e["id"].as_str().unwrap().to_string();
    let run_id = e["run"].as_str().unwrap().to_string();
    run.kill();
    // Resumed before the answer: the task keeps waiting (no new session starts).
    let mut cmd = keel(home).unwrap();
    cmd.args(["resume", &run_id, "--model-server", &fx.url]);
    let mut resumed = Reaped::spawn(cmd).unwrap();
    resumed.line_containing("resumed in", WAIT).unwrap();
    // Its rebuilt coordinator decided what to run again (a decision row on the run's root task):
    // nothing, since the only task waits for the human.
    let store = Store::open_read_only(home.join(".keel").join("keel.redb"), StoreConfig::default())
        .unwrap();
    let run_key: RunId = run_id.parse().unwrap();
    let decision = wait_for(WAIT, "the recovery's decision row", || {
        let tasks = store.run(run_key).tasks(None, 100).ok()?.items;
        let root = tasks.iter().find(|t| t.kind == TaskKind::Root)?;
        let rows = store.run(run_key).last_log_rows(root.id, 500).ok()?;
        rows.into_iter()
            .map(|r| r.value.summary)
            .find(|s| s.contains("recovered from checkpoint"))
    })
    .unwrap();
    assert!(decision.contains("0 to run again"), "{decision}");
    resumed.kill();
    assert_eq!(fx.openings().len(), 1, "a waiting task ran again");
    let (code, out, err) =
        run_to_end(keel(home).unwrap().args(["answer", &id, "json"]), WAIT).unwrap();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("keel resume"), "{out}");
    let (code, out, err) = run_to_end(
        keel(home)
            .unwrap()
            .args(["resume", &run_id, "--quiet", "--model-server", &fx.url]),
        WAIT,
    )
    .unwrap();
    assert_eq!(code, 0, "the resumed run completes\n{out}\n{err}");
    let openings = fx.openings();
    assert_eq!(openings.len(), 2, "{openings:#?}");
    assert!(
        openings[1].contains("The human answered: json"),
        "{}",
        openings[1]
    );
}
