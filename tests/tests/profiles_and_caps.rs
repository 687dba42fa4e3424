//! keel.toml reaching the sessions of the real `keel` path (issue 11's continuity edges):
//!
//! - `[context]`: the preamble caps are the runtime's and `keel context`'s alike: a follow-up's first
//!   message, as the model server received it, is exactly what `keel context` prints for its task,
//!   cut to the cap keel.toml sets;
//! - `[[agents]]`: a profile's `tools`, `system_prompt` and `max_turns` reach its sessions (keel's
//!   own loop against the scripted model server: the tools offered, the system text, one turn).
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use keel_actors::Plan;
use keel_actors::runtime::scripted;
use keel_tests::{Reaped, keel, recorded_bodies};
use serde_json::Value;
use std::path::PathBuf;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(120);

struct Fixture {
    _dir: tempfile::TempDir,
    work: PathBuf,
    record: PathBuf,
    _server: Reaped,
    url: String,
}

impl Fixture {
    /// A keel home whose keel.toml ends with `toml`, and a recording scripted model server.
    fn new(toml: &str) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        let record = dir.path().join("requests");
        std::fs::create_dir_all(&work).unwrap();
        let init = keel(&work).unwrap().arg("init").output().unwrap();
        assert!(init.status.success(), "{init:?}");
        let config = work.join(".keel/keel.toml");
        let mut text = std::fs::read_to_string(&config).unwrap();
        match toml.strip_prefix("[context]\n") {
            // The template has a `[context]` table already (its keys commented out).
            Some(keys) => text = text.replacen("[context]\n", &format!("[context]\n{keys}"), 1),
            None => {
                text.push('\n');
                text.push_str(toml);
            }
        }
        std::fs::write(&config, text).unwrap();
        let (server, url) = keel_tests::model_server(&work, &record).unwrap();
        Fixture {
            _dir: dir,
            work,
            record,
            _server: server,
            url,
        }
    }

    fn keel(&self, args: &[&str]) -> std::process::Command {
        let mut cmd = keel(&self.work).unwrap();
        cmd.args(args)
            .env("ANTHROPIC_BASE_URL", &self.url)
            .env("ANTHROPIC_API_KEY", "sk-profiles-test");
        cmd
    }

    fn finish(&self, cmd: std::process::Command) -> (i32, String, String) {
        let (status, out, err) = Reaped::spawn(cmd).unwrap().wait_output(WAIT).unwrap();
        (status.code().unwrap_or(-1), out, err)
    }

    fn plan(&self, plan: &Plan) {
        std::fs::write(
            self.work.join("plan.json"),
            serde_json::to_string(plan).unwrap(),
        )
        .unwrap();
    }
}

/// The first user message of a recorded request, its text blocks joined.
fn first_user_text(body: &Value) -> String {
    let content = &body["messages"][0]["content"];
    match content {
        Value::String(s) => s.clone(),
        Value::Array(blocks) => blocks
            .iter()
            .filter_map(|b| b["text"].as_str())
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

fn json_out(out: &str) -> Value {
    serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
fn context_caps_from_keel_toml_are_what_the_runtime_and_keel_context_use() {
    // 250 tokens: a 1,000-character standard preamble (the default is 8,000).
    let fx = Fixture::new("[context]\nstandard_tokens_max = 250\n");
    let filler = "a long brief line that the small cap has to cut. ".repeat(60);
    let step = scripted::step(
        "long",
        &format!("Describe the folder. {filler}"),
        "echo described",
        "shell",
        &[],
    )
    .unwrap();
    fx.plan(&Plan {
        steps: vec![step],
        constraints: Vec::new(),
    });
    let (code, out, err) = fx.finish(fx.keel(&[
        "--json",
        "run",
        "describe",
        "--plan",
        "plan.json",
        "--model-server",
        &fx.url,
    ]));
    assert_eq!(code, 0, "{out}\n{err}");
    let run = json_out(&out)["run"].as_str().unwrap().to_string();
    let (_, tasks, _) = fx.finish(fx.keel(&["--json", "tasks", "--run", &run]));
    let tasks = json_out(&tasks);
    let parent = tasks
        .as_array()
        .or_else(|| tasks["tasks"].as_array())
        .unwrap()
        .iter()
        .find(|t| {
            t["brief"]
                .as_str()
                .is_some_and(|b| b.contains("Describe the folder"))
        })
        .unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();

    let before = recorded_bodies(&fx.record).len();
    let message = "What did it find?\nRUN_TOOL: echo followed ;;";
    let (_code, out, err) = fx.finish(fx.keel(&[
        "--json",
        "follow-up",
        &parent,
        message,
        "--model-server",
        &fx.url,
    ]));
    let follow = json_out(&out)["task"]
        .as_str()
        .unwrap_or_else(|| panic!("{out}\n{err}"))
        .to_string();
    let bodies = recorded_bodies(&fx.record);
    let opening = bodies[before..]
        .iter()
        .find(|b| b["messages"].as_array().is_some_and(|m| m.len() == 1))
        .expect("the follow-up's session was recorded");
    let sent = first_user_text(opening);

    let (code, out, err) = fx.finish(fx.keel(&["--json", "context", &follow]));
    assert_eq!(code, 0, "{out}\n{err}");
    let report = json_out(&out);
    assert_eq!(report["preamble"]["chars_max"], 1000, "{report}");
    let chars = report["preamble"]["chars"].as_u64().unwrap();
    assert!(chars <= 1000, "{report}");
    assert!(
        !report["preamble"]["truncations"]
            .as_array()
            .unwrap()
            .is_empty(),
        "the parent's long brief was cut: {report}"
    );
    assert_eq!(
        report["prompt"].as_str().unwrap(),
        sent,
        "keel context prints what the session got"
    );
}

#[test]
fn an_agent_profiles_tools_system_prompt_and_max_turns_reach_its_sessions() {
    let fx = Fixture::new(
        "[[agents]]\nname = \"narrow\"\nharness = \"messages-api\"\nmodel = \"keel-scripted-1\"\ntools = [\"bash\"]\nsystem_prompt = \"PROFILE-SYSTEM-MARKER: be brief.\"\nmax_turns = 1\n",
    );
    // The step needs two model turns (a tool call, then the answer): with max_turns = 1 every
    // session stops after its first.
    let step = scripted::step("probe", "Say hello.", "echo hello", "shell", &[]).unwrap();
    fx.plan(&Plan {
        steps: vec![step],
        constraints: Vec::new(),
    });
    let (code, out, err) =
        fx.finish(fx.keel(&["run", "probe", "--plan", "plan.json", "--agent", "narrow"]));
    assert_ne!(code, 0, "one turn cannot finish the step\n{out}\n{err}");
    let bodies = recorded_bodies(&fx.record);
    assert!(!bodies.is_empty(), "{out}\n{err}");
    for body in &bodies {
        let raw = body.to_string();
        assert!(raw.contains("PROFILE-SYSTEM-MARKER: be brief."), "{raw}");
        let mut tools: Vec<String> = body["tools"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["name"].as_str().map(str::to_string))
            .filter(|n| !n.starts_with("mcp__keel__"))
            .collect();
        tools.sort();
        assert_eq!(tools, vec!["bash".to_string()], "{raw}");
        // One turn per session: only opening requests, never one carrying a tool result.
        assert_eq!(
            body["messages"].as_array().map(Vec::len),
            Some(1),
            "a second turn: {raw}"
        );
    }
}
