//! `keel serve` runs what `keel run` runs (issue 11), over real HTTP on 127.0.0.1:
//!
//! - a brief submitted without a plan to a server on a harness with an MCP client runs a lead
//!   session, which delegates three subtasks through keel's `delegate` tool, gets their reports and
//!   ends the run with its synthesis;
//! - a session's `escalate` call pauses its task; `GET /v1/escalations` lists it with its payload,
//!   `POST /v1/escalations/{id}/answer` refuses a bad answer (400), an unknown id (404) and a second
//!   answer (409) without changing anything, and a good answer resumes the task in a new session
//!   whose first request carries the answer.
//!
//! Real processes: `keel model-server` (the scripted model, recording every request) and `keel
//! serve --harness messages-api` (keel's own agent loop and its MCP endpoint).
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use std::path::PathBuf;
use std::time::Duration;

use keel_actors::Plan;
use keel_actors::runtime::scripted;
use keel_store::{RunId, RunStatus, TaskKind, TaskStatus};
use keel_tests::serve::Server;
use keel_tests::{Reaped, keel, recorded_bodies, session_openings, wait_for};
use serde_json::{Value, json};

const WAIT: Duration = Duration::from_secs(120);

/// A field of a JSON read, as the store's type (`field!(v, "status", RunStatus)`).
macro_rules! field {
    ($v:expr, $name:literal, $ty:ty) => {
        serde_json::from_value::<$ty>($v[$name].clone())
            .unwrap_or_else(|e| panic!("{}: {e}: {}", $name, $v))
    };
}
/// What the escalating session asks.
const QUESTION: &str = "Which config format should the tool write?";

struct Fixture {
    _dir: tempfile::TempDir,
    record: PathBuf,
    _model: Reaped,
    server: Server,
    token: String,
}

impl Fixture {
    /// A keel home served by `keel serve` on keel's own loop, against a model server whose first
    /// answer calls `escalate` (everything after follows the prompt rules).
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        let record = dir.path().join("requests");
        std::fs::create_dir_all(&work).unwrap();
        let init = keel(&work).unwrap().arg("init").output().unwrap();
        assert!(init.status.success(), "{init:?}");
        let script = dir.path().join("script.json");
        let escalate = json!({"turns": [{"tool_calls": [{
            "name": "mcp__keel__escalate",
            "input": {"reason": "the spec names two formats", "question": QUESTION, "options": ["json", "toml"]},
        }]}]});
        std::fs::write(&script, escalate.to_string()).unwrap();
        let (model, url) = keel_tests::model_server_with(&work, &record, Some(&script)).unwrap();
        let server = Server::start_with(
            &work,
            &["--harness", "messages-api", "--model", "keel-scripted-1"],
            &[
                ("ANTHROPIC_BASE_URL", url.as_str()),
                ("ANTHROPIC_API_KEY", "sk-serve-lead-test"),
            ],
        );
        let token = server.token();
        Fixture {
            _dir: dir,
            record,
            _model: model,
            server,
            token,
        }
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        let bytes = body.map(|b| b.to_string().into_bytes());
        let (status, text) = self
            .server
            .request(method, path, Some(&self.token), bytes.as_deref());
        let value = serde_json::from_str(text.trim()).unwrap_or(Value::String(text));
        (status, value)
    }

    /// `POST /v1/runs`: the new run's id. The server answers once the run is in its store: a
    /// read right after finds it.
    fn submit(&self, body: Value) -> RunId {
        let (status, v) = self.call("POST", "/v1/runs", Some(body));
        assert_eq!(status, 201, "{v}");
        let run: RunId = v["run"].as_str().unwrap().parse().unwrap();
        let (status, v) = self.call("GET", &format!("/v1/runs/{run}"), None);
        assert_eq!(
            status, 200,
            "GET /v1/runs/{run} right after its submission: {v}"
        );
        run
    }

    /// A read of the API (`keel serve` has the store alone: the test reads it as `keel` does,
    /// through the server), as JSON.
    fn read(&self, path: &str) -> Value {
        let (status, v) = self.call("GET", path, None);
        assert_eq!(status, 200, "{path}: {v}");
        v
    }

    /// The run's status once it has ended.
    fn ended(&self, run: RunId) -> RunStatus {
        wait_for(WAIT, "the run to end", || {
            // A submitted run is in the store (`submit`): any refusal is a failure, reported at
            // once.
            let (code, v) = self.call("GET", &format!("/v1/runs/{run}"), None);
            assert_eq!(code, 200, "GET /v1/runs/{run}: {v}");
            let status = field!(v, "status", RunStatus);
            matches!(status, RunStatus::Completed | RunStatus::Failed).then_some(status)
        })
        .unwrap()
    }

    /// `GET /v1/escalations` with `query`: the listed escalations.
    fn escalations(&self, query: &str) -> Vec<Value> {
        let (status, v) = self.call("GET", &format!("/v1/escalations{query}"), None);
        assert_eq!(status, 200, "{v}");
        v["escalations"].as_array().unwrap().clone()
    }
}

/// The text of every tool result in a recorded request (Anthropic's wire shape).
fn tool_results(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter(|c| c["type"] == "tool_result")
        .map(|c| match &c["content"] {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .collect()
}

/// A subtask the scripted model carries out on keel's loop: it runs `echo part N done` and reports
/// that line as its finding.
fn part(i: usize) -> Value {
    json!({
        "id": format!("part-{i}"),
        "brief": format!("Part {i}. REPORT_AFTER_TOOL\nRUN_TOOL: echo part {i} done ;;"),
        "goal": format!("part {i}"),
    })
}

#[test]
fn keel_serve_pauses_an_escalated_task_answers_it_over_http_then_runs_a_lead_for_a_brief() {
    let fx = Fixture::new();

    // A one-step plan whose session escalates (the script's first answer).
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
    let run = fx.submit(json!({"brief": "write the config", "plan": plan}));
    let open = wait_for(WAIT, "an open escalation", || {
        let list = fx.escalations("");
        (!list.is_empty()).then_some(list)
    })
    .unwrap();
    assert_eq!(open.len(), 1, "{open:#?}");
    let e = &open[0];
    assert_eq!(e["trigger"], "human_requested");
    assert_eq!(e["asked"], QUESTION);
    assert_eq!(e["diagnosis"], "the spec names two formats");
    assert_eq!(e["options"], json!(["json", "toml"]));
    assert_eq!(e["run"], run.to_string());
    let id = e["id"].as_str().unwrap().to_string();
    assert_eq!(fx.escalations(&format!("?run={run}")).len(), 1);
    let (status, one) = fx.call("GET", &format!("/v1/escalations/{id}"), None);
    assert_eq!(status, 200, "{one}");
    assert!(one.to_string().contains(QUESTION), "{one}");
    let task: keel_store::TaskId = e["task"].as_str().unwrap().parse().unwrap();
    let paused = fx.read(&format!("/v1/tasks/{task}"));
    let status = field!(paused, "status", TaskStatus);
    assert_eq!(status, TaskStatus::Paused, "{paused:#}");

    // Refused answers change nothing.
    let answer = |id: &str, text: &str| {
        fx.call(
            "POST",
            &format!("/v1/escalations/{id}/answer"),
            Some(json!({ "answer": text })),
        )
    };
    let (status, v) = answer(&id, "yaml");
    assert_eq!(status, 400, "not an option: {v}");
    assert!(v.to_string().contains("json, toml"), "{v}");
    let (status, v) = answer("01ARZ3NDEKTSV4RRFFQ69G5FAV", "json");
    assert_eq!(status, 404, "{v}");
    let (status, v) = answer("not-an-id", "json");
    assert_eq!(status, 400, "{v}");
    assert_eq!(fx.escalations("").len(), 1, "a refused answer closed it");

    // The answer resumes the task in the server's runtime.
    let (status, v) = answer(&id, "TOML");
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["answer"], "toml", "{v}");
    assert_eq!(v["delivered"], "coordinator", "{v}");
    assert_eq!(fx.ended(run), RunStatus::Completed);
    assert!(fx.escalations("").is_empty());
    let all = fx.escalations("?all=true");
    assert_eq!(all[0]["status"], "answered", "{all:#?}");
    let (status, v) = answer(&id, "json");
    assert_eq!(status, 409, "a second answer: {v}");
    let openings = session_openings(&recorded_bodies(&fx.record));
    assert_eq!(openings.len(), 2, "{openings:#?}");
    assert!(
        openings[1].contains("The human answered: toml") && openings[1].contains(QUESTION),
        "{}",
        openings[1]
    );

    // A brief without a plan: a lead session delegates three subtasks in one call and ends the
    // run with its synthesis, as under `keel run`.
    let brief = format!(
        "Lead the three parts. REPORT_AFTER_TOOL\nCALL_TOOL: mcp__keel__delegate {}",
        json!({"subtasks": [part(1), part(2), part(3)]})
    );
    let run = fx.submit(json!({ "brief": brief }));
    assert_eq!(fx.ended(run), RunStatus::Completed);
    let all = fx.read(&format!("/v1/runs/{run}/tasks?limit=1000"))["tasks"]
        .as_array()
        .unwrap()
        .clone();
    let kind = |t: &Value| field!(t, "kind", TaskKind);
    let status = |t: &Value| field!(t, "status", TaskStatus);
    let tasks: Vec<&Value> = all.iter().filter(|t| kind(t) != TaskKind::Root).collect();
    assert_eq!(tasks.len(), 3, "{tasks:#?}");
    assert!(
        tasks
            .iter()
            .all(|t| kind(t) == TaskKind::Subtask && status(t) == TaskStatus::Complete),
        "{tasks:#?}"
    );
    let root = all.iter().find(|t| kind(t) == TaskKind::Root).unwrap();
    let log = fx.read(&format!(
        "/v1/tasks/{}/logs?tail=500",
        root["id"].as_str().unwrap()
    ));
    assert!(
        log["rows"].as_array().unwrap().iter().any(|r| r["summary"]
            .as_str()
            .unwrap_or_default()
            .contains("dispatch delegation turn 1: 3 calls in parallel")),
        "{log:#}"
    );
    // The lead's `delegate` call was answered with the three reports: the model read them in the
    // lead's next request.
    let answer = recorded_bodies(&fx.record)
        .iter()
        .flat_map(tool_results)
        .find(|r| r.contains("part-1") && r.contains("part-2") && r.contains("part-3"))
        .expect("the lead's delegate answer reached the model");
    assert_eq!(answer.matches("\"Report\"").count(), 3, "{answer}");
    assert!(!root["outcome"].is_null(), "{root:#}");
    assert!(!fx.read(&format!("/v1/runs/{run}"))["outcome"].is_null());
}
