//! `[[accounts]]` on the real `keel` path (issue 15): two Anthropic accounts in keel.toml, one key
//! from an environment variable and one from a private file, an agent on keel's own loop naming
//! the first, and a scripted model server (its own process) that answers every request sent with
//! the first account's key with a 429 whose reset is far off:
//!
//! - the run finishes on the second account: the supervisor moves the task there with a resume
//!   preamble, as for any retry, and `keel logs` says which account each attempt billed to;
//! - a SIGKILL during the attempt on the second account, then `keel resume`: the resumed attempt
//!   bills to the second account again (the switch is in the run's checkpoint), never the first.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use keel_actors::Plan;
use keel_actors::runtime::scripted;
use keel_tests::{Reaped, keel, wait_for};
use serde_json::Value;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(120);
/// Account A's key: every request sent with it is rate-limited.
const KEY_A: &str = "sk-account-a-limited-0001";
/// Account B's key, in a private key file.
const KEY_B: &str = "sk-account-b-working-0002";
/// What the model server's recordings keep of a key (its first twelve characters).
const PREFIX_A: &str = "sk-account-a";
const PREFIX_B: &str = "sk-account-b";

struct Fixture {
    _dir: tempfile::TempDir,
    work: PathBuf,
    record: PathBuf,
    _server: Reaped,
}

impl Fixture {
    /// A keel home with the two accounts and the agent, a one-step plan, and the model server
    /// following `turns` (TOML `[[turns]]` tables) after its failure for account A's key.
    fn new(turns: &str) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let work = dir.path().join("work");
        let record = dir.path().join("requests");
        std::fs::create_dir_all(&work).unwrap();
        let init = keel(&work).unwrap().arg("init").output().unwrap();
        assert!(init.status.success(), "{init:?}");
        let script = dir.path().join("script.toml");
        std::fs::write(
            &script,
            format!(
                "[[key_failures]]\nkey = \"{KEY_A}\"\nfailure = {{ kind = \"rate_limited\", retry_after_secs = 60, reset_after_secs = 600 }}\n\n{turns}"
            ),
        )
        .unwrap();
        let (server, url) = keel_tests::model_server_with(&work, &record, Some(&script)).unwrap();
        let keys = work.join(".keel/keys");
        std::fs::create_dir_all(&keys).unwrap();
        std::fs::write(keys.join("team-b.key"), format!("{KEY_B}\n")).unwrap();
        std::fs::set_permissions(
            keys.join("team-b.key"),
            std::fs::Permissions::from_mode(0o600),
        )
        .unwrap();
        let config = work.join(".keel/keel.toml");
        let mut text = std::fs::read_to_string(&config).unwrap();
        text.push_str(&format!(
            r#"
[[accounts]]
name = "team-a"
provider = "anthropic"
base_url = "{url}"
key_env = "KEEL_TEST_KEY_TEAM_A"

[[accounts]]
name = "team-b"
provider = "anthropic"
base_url = "{url}"
key_file = "keys/team-b.key"

[[agents]]
name = "worker"
harness = "messages-api"
model = "keel-scripted-1"
account = "team-a"
"#
        ));
        std::fs::write(&config, text).unwrap();
        let step = scripted::step("probe", "Say hello.", "echo hello", "shell", &[]).unwrap();
        std::fs::write(
            work.join("plan.json"),
            serde_json::to_string(&Plan {
                steps: vec![step],
                constraints: Vec::new(),
            })
            .unwrap(),
        )
        .unwrap();
        Fixture {
            _dir: dir,
            work,
            record,
            _server: server,
        }
    }

    fn keel(&self, args: &[&str]) -> std::process::Command {
        let mut cmd = keel(&self.work).unwrap();
        cmd.args(args).env("KEEL_TEST_KEY_TEAM_A", KEY_A);
        cmd
    }

    fn finish(&self, cmd: std::process::Command) -> (i32, String, String) {
        let (status, out, err) = Reaped::spawn(cmd).unwrap().wait_output(WAIT).unwrap();
        (status.code().unwrap_or(-1), out, err)
    }

    fn json(&self, args: &[&str]) -> Value {
        let mut all = vec!["--json"];
        all.extend_from_slice(args);
        let (code, out, err) = self.finish(self.keel(&all));
        assert_eq!(code, 0, "keel {args:?}\n{out}\n{err}");
        serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"))
    }

    /// The step's task row (the run's only task with the probe's brief), as `keel tasks` prints it.
    fn probe_task(&self, run: &str) -> Value {
        let tasks = self.json(&["tasks", "--run", run]);
        let list = tasks
            .as_array()
            .or_else(|| tasks["tasks"].as_array())
            .unwrap();
        list.iter()
            .find(|t| {
                t["brief"]
                    .as_str()
                    .is_some_and(|b| b.contains("Say hello."))
            })
            .unwrap_or_else(|| panic!("no probe task: {tasks}"))
            .clone()
    }

    /// The account each session of `task` started on, in order, as `keel logs` shows it.
    fn accounts_of(&self, task: &str) -> Vec<String> {
        let logs = self.json(&["logs", task, "--tail", "1000"]);
        let text = logs.to_string();
        assert!(
            !text.contains(KEY_A) && !text.contains(KEY_B),
            "a key reached the log: {text}"
        );
        logs["rows"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|r| r["summary"].as_str())
            .filter_map(|s| s.strip_prefix("session started on account "))
            .map(str::to_string)
            .collect()
    }
}

/// Each model request the server recorded: the key prefix it was sent with, and its opening user
/// text when it opens a session (its conversation holds one message).
fn requests(record: &Path) -> Vec<(String, Option<String>)> {
    keel_tests::recorded_requests(record)
        .into_iter()
        .filter(|r| r["path"].as_str().is_some_and(|p| p.contains("/messages")))
        .map(|r| {
            let key = r["headers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|h| h[0] == "x-api-key")
                .and_then(|h| h[1].as_str())
                .unwrap_or("")
                .chars()
                .take(PREFIX_A.len())
                .collect();
            let messages = r["body"]["messages"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let opening = (messages.len() == 1).then(|| messages[0]["content"].to_string());
            (key, opening)
        })
        .collect()
}

#[test]
fn a_rate_limited_account_hands_the_task_to_another_account_of_its_provider() {
    let fx = Fixture::new("");
    let (code, out, err) = fx.finish(fx.keel(&["--json", "run", "probe", "--plan", "plan.json"]));
    assert_eq!(code, 0, "the run finishes on account team-b\n{out}\n{err}");
    let summary: Value = serde_json::from_str(out.trim()).unwrap();
    let run = summary["run"].as_str().unwrap().to_string();

    // The model server saw account A's key first, then only B's, and B's session opened with the
    // resume preamble a retry gets.
    let seen = requests(&fx.record);
    assert_eq!(
        seen.first().map(|r| r.0.as_str()),
        Some(PREFIX_A),
        "{seen:?}"
    );
    let first_b = seen
        .iter()
        .position(|r| r.0 == PREFIX_B)
        .unwrap_or_else(|| panic!("account B was never used: {seen:?}"));
    assert!(
        seen[first_b..].iter().all(|r| r.0 == PREFIX_B),
        "account A was used again after the switch: {seen:?}"
    );
    let opening_b = seen[first_b].1.as_deref().unwrap();
    assert!(
        opening_b.contains(r#"kind=\"resume\""#),
        "the attempt on account B has no resume preamble: {opening_b}"
    );

    // The store says which account each attempt billed to.
    let task = fx.probe_task(&run);
    assert_eq!(task["status"], "Complete", "{task}");
    assert_eq!(task["attempt"], 2, "{task}");
    let id = task["id"].as_str().unwrap();
    assert_eq!(fx.accounts_of(id), vec!["team-a", "team-b"]);
}

#[test]
fn a_restart_after_the_switch_stays_on_the_new_account() {
    // Account B's first request hangs, so the process can be killed during the attempt on B.
    let fx = Fixture::new("[[turns]]\nfailure = { kind = \"hang\", ms = 60000 }\n");
    let mut proc_ = Reaped::spawn(fx.keel(&["run", "probe", "--plan", "plan.json"])).unwrap();
    let line = proc_.line_containing("started in", WAIT).unwrap();
    let run = line.split_whitespace().nth(1).unwrap().to_string();
    wait_for(WAIT, "a request on account B", || {
        requests(&fx.record)
            .iter()
            .any(|r| r.0 == PREFIX_B)
            .then_some(())
    })
    .unwrap();
    proc_.kill();
    let before = requests(&fx.record).len();

    // A fresh process knows nothing of A's rate limit but the run's checkpoint.
    let (code, out, err) = fx.finish(fx.keel(&["resume", &run]));
    assert_eq!(code, 0, "{out}\n{err}");
    assert!(out.contains(": Completed"), "{out}");
    let after = &requests(&fx.record)[before..];
    assert!(!after.is_empty(), "the resume sent nothing");
    assert!(
        after.iter().all(|r| r.0 == PREFIX_B),
        "the resumed attempt went back to account A: {after:?}"
    );
    let task = fx.probe_task(&run);
    assert_eq!(task["status"], "Complete", "{task}");
    let accounts = fx.accounts_of(task["id"].as_str().unwrap());
    assert_eq!(accounts.first().map(String::as_str), Some("team-a"));
    // Log rows ride with the next commit (at most 20 ms later, docs/DESIGN.md §4), so the killed
    // attempt's "session started on account team-b" row may be lost with the process: the resumed
    // attempt's row is always there.
    assert!(
        accounts.len() >= 2 && accounts[1..].iter().all(|a| a == "team-b"),
        "{accounts:?}"
    );
}
