//! Secrets never rest on disk in plain text (issue 16). A tool prints a corpus of made-up
//! credentials of twenty kinds and benign look-alikes (`keel_tests::secrets`): through keel's own
//! agent loop on the scripted model, and through each of the four real CLIs against the scripted
//! model server. Then the raw bytes of the store file, every read command in every format, the
//! synthesis file and the JSON log stream hold none of the secrets; the store keeps the look-alikes;
//! `keel logs` says that something was removed.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use keel_tests::secrets::{self, leaked, lost};
use keel_tests::serve::Server;
use keel_tests::{Reaped, keel};
use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const WAIT: Duration = Duration::from_secs(180);

/// A folder whose `creds.txt` holds the corpus and `token.txt` one token alone (so a brief can name
/// the file and never the secret: the brief is the user's, kept as given).
fn folder() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("creds.txt"), secrets::printed()).unwrap();
    let token = secrets::corpus()
        .into_iter()
        .find(|s| s.name == "github token")
        .unwrap();
    std::fs::write(dir.path().join("token.txt"), token.line).unwrap();
    dir
}

/// `keel` with the registered key as the account's credential.
fn keel_with_key(dir: &Path) -> Command {
    let mut cmd = keel(dir).unwrap();
    cmd.env("ANTHROPIC_API_KEY", secrets::registered_key())
        .env("OPENAI_API_KEY", secrets::registered_key());
    cmd
}

fn output(cmd: Command) -> (i32, String, String) {
    let (status, out, err) = Reaped::spawn(cmd).unwrap().wait_output(WAIT).unwrap();
    (status.code().unwrap_or(-1), out, err)
}

fn run_id(out: &str) -> String {
    out.lines()
        .find_map(|l| l.strip_prefix("run ")?.split_whitespace().next())
        .unwrap_or_else(|| panic!("no run id in {out}"))
        .trim_end_matches(':')
        .to_string()
}

/// `--json` (or nothing) before a command's arguments.
fn with<'a>(json: &[&'a str], rest: &[&'a str]) -> Vec<&'a str> {
    [json, rest].concat()
}

/// Every read command of `keel`, in both formats, for the run and each of its tasks: (what, stdout).
/// `keel_in` makes the command: local, or against a server (`--server`).
fn every_output(keel_in: impl Fn() -> Command, run: &str) -> Vec<(String, String)> {
    let read = |args: &[&str]| {
        let out = keel_in().args(args).output().unwrap();
        // `keel status` exits with the run's code (5: not completed).
        let code = out.status.code();
        assert!(
            code == Some(0) || (args.contains(&"status") && code == Some(5)),
            "keel {args:?}: {out:?}"
        );
        (
            format!("keel {}", args.join(" ")),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    let mut outputs = Vec::new();
    for json in [false, true] {
        let j: &[&str] = if json { &["--json"] } else { &[] };
        outputs.push(read(&with(j, &["runs"])));
        outputs.push(read(&with(j, &["tasks", "--run", run])));
        outputs.push(read(&with(j, &["tree", run])));
        outputs.push(read(&with(j, &["status", run])));
    }
    let tasks = keel_in()
        .args(["--json", "tasks", "--run", run])
        .output()
        .unwrap();
    let tasks: Value = serde_json::from_slice(&tasks.stdout).unwrap();
    for task in tasks["tasks"].as_array().unwrap() {
        let id = task["id"].as_str().unwrap();
        for json in [false, true] {
            let j: &[&str] = if json { &["--json"] } else { &[] };
            outputs.push(read(&with(j, &["show", id])));
            outputs.push(read(&with(j, &["logs", id])));
            outputs.push(read(&with(j, &["context", id])));
            outputs.push(read(&with(j, &["context", id, "--resume"])));
        }
    }
    outputs
}

/// The checks every run shares: the store's raw bytes, every output, every synthesis file, the
/// log stream; the look-alikes in the store; redactions counted and shown.
fn check_nothing_leaked(dir: &Path, run: &str, run_out: &str, log_stream: &str) {
    let home = dir.join(".keel");
    let store = std::fs::read(home.join("keel.redb")).unwrap();
    assert_eq!(leaked(&store), Vec::<&str>::new(), "the store file");
    assert_eq!(lost(&store), Vec::<&str>::new(), "look-alikes in the store");
    assert_eq!(leaked(run_out.as_bytes()), Vec::<&str>::new(), "{run_out}");
    for (what, text) in every_output(|| keel_with_key(dir), run) {
        assert_eq!(
            leaked(text.as_bytes()),
            Vec::<&str>::new(),
            "{what}:\n{text}"
        );
    }
    if let Ok(entries) = std::fs::read_dir(home.join("synthesis")) {
        for entry in entries.flatten() {
            let text = std::fs::read(entry.path()).unwrap();
            assert_eq!(
                leaked(&text),
                Vec::<&str>::new(),
                "{}",
                entry.path().display()
            );
        }
    }
    assert_eq!(leaked(log_stream.as_bytes()), Vec::<&str>::new(), "logs");
    for line in log_stream.lines().filter(|l| l.starts_with('{')) {
        let _: Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("a log line is not JSON after scrubbing: {e}: {line}"));
    }

    // Something was removed, and `keel logs` says so.
    let tasks = keel_with_key(dir)
        .args(["--json", "tasks", "--run", run])
        .output()
        .unwrap();
    let tasks: Value = serde_json::from_slice(&tasks.stdout).unwrap();
    let mut removed = 0u64;
    let mut said = false;
    for task in tasks["tasks"].as_array().unwrap() {
        let id = task["id"].as_str().unwrap();
        let logs = keel_with_key(dir)
            .args(["--json", "logs", id])
            .output()
            .unwrap();
        let logs: Value = serde_json::from_slice(&logs.stdout).unwrap();
        for row in logs["rows"].as_array().unwrap() {
            for r in row["redactions"].as_array().unwrap() {
                removed += r["count"].as_u64().unwrap();
            }
        }
        let human = keel_with_key(dir).args(["logs", id]).output().unwrap();
        said |= String::from_utf8_lossy(&human.stdout).contains("secrets were removed");
    }
    assert!(removed >= 20, "{removed} redactions recorded");
    assert!(said, "`keel logs` never said that secrets were removed");
}

/// Through keel's own agent loop on the built-in scripted model: one step whose tool prints the
/// corpus (on stderr) and a report (on stdout, padded so the scripted model's 300-character echo
/// ends with it) whose finding holds a token, so the report, the synthesis and the rows are tested.
#[test]
fn a_tool_printing_credentials_on_the_scripted_model_leaves_none_anywhere() {
    let dir = folder();
    let report = r#"{"subtask_id":"%s","status":"complete","findings":[{"claim":"token %s","source":"creds.txt","confidence_permille":900}],"gaps":[],"summary":"printed"}"#;
    let command = format!(
        "cat creds.txt >&2; printf '%-279s' \"$(printf '{report}' \"$KEEL_SUBTASK_ID\" \"$(cat token.txt)\")\""
    );
    let plan = json!({
        "steps": [{
            "key": "dump",
            "brief": format!("Print the credentials file.\nRUN_TOOL: {command} ;;"),
            "goal": "print the file",
        }]
    });
    std::fs::write(dir.path().join("plan.json"), plan.to_string()).unwrap();
    let mut cmd = keel_with_key(dir.path());
    cmd.env(
        "KEEL_LOG",
        "warn,keel_actors=debug,keel_harness=debug,keel_node=debug",
    )
    .args([
        "--log-format",
        "json",
        "run",
        "--plan",
        "plan.json",
        "print the credentials file",
    ]);
    let (code, out, err) = output(cmd);
    assert_eq!(code, 0, "keel run failed\n{out}\n{err}");
    assert!(
        err.contains("\"tool call\""),
        "no debug line of a tool input in the log stream:\n{err}"
    );
    let run = run_id(&out);
    check_nothing_leaked(dir.path(), &run, &out, &err);
    // The synthesis kept the finding, with its token removed.
    let synthesis =
        std::fs::read_to_string(dir.path().join(".keel/synthesis").join(format!("{run}.md")))
            .unwrap();
    assert!(
        synthesis.contains("token [REDACTED:github-token]"),
        "{synthesis}"
    );

    // The HTTP API is a way out too: every read through `keel serve`, and its raw JSON.
    let server = Server::start(dir.path());
    for (what, text) in every_output(|| server.keel(dir.path()), &run) {
        assert_eq!(
            leaked(text.as_bytes()),
            Vec::<&str>::new(),
            "{what} through the server:\n{text}"
        );
    }
    let token = server.token();
    let (status, body) = server.request(
        "GET",
        &format!("/v1/runs/{run}/tasks?format=json"),
        Some(&token),
        None,
    );
    assert_eq!(status, 200, "{body}");
    let tasks: Value = serde_json::from_str(&body).unwrap();
    let mut raw = body.clone();
    for task in tasks["tasks"].as_array().unwrap() {
        let id = task["id"].as_str().unwrap();
        for path in [
            format!("/v1/tasks/{id}?format=json"),
            format!("/v1/tasks/{id}/logs?format=json"),
        ] {
            let (status, body) = server.request("GET", &path, Some(&token), None);
            assert_eq!(status, 200, "{path}: {body}");
            raw.push_str(&body);
        }
    }
    assert!(
        raw.contains("REDACTED"),
        "the API showed no redaction: {raw}"
    );
    assert_eq!(leaked(raw.as_bytes()), Vec::<&str>::new(), "the API's JSON");
}

/// The same corpus printed by a tool run through a real CLI against `keel model-server` (the
/// scripted model's prompt rule calls the CLI's own shell tool). The report is not the scripted
/// model's to give here, so the step fails and is retried: every attempt's rows are checked.
fn real_cli(harness: &str, base_url_var: &str) {
    let bin = keel_harness_bin(harness);
    if bin.is_none() && std::env::var("KEEL_SKIP_REAL_CLIS").as_deref() == Ok("1") {
        eprintln!("skipping {harness} (KEEL_SKIP_REAL_CLIS=1)");
        return;
    }
    assert!(
        bin.is_some(),
        "the {harness} CLI is missing: run `npm ci --prefix harness-adapters/clis`, or set KEEL_SKIP_REAL_CLIS=1"
    );
    let dir = folder();
    let mut server = keel(dir.path()).unwrap();
    server.args(["model-server"]);
    let mut server = Reaped::spawn(server).unwrap();
    let line = server
        .line_containing("listening on", Duration::from_secs(30))
        .unwrap();
    let url = line.split_whitespace().last().unwrap().to_string();
    let mut cmd = keel_with_key(dir.path());
    cmd.env(base_url_var, &url)
        .env("KEEL_LOG", "warn,keel_actors=debug,keel_harness=debug")
        .args([
            "--log-format",
            "json",
            "run",
            "--harness",
            harness,
            "--quiet",
            "Print the credentials file.\nRUN_TOOL: cat creds.txt ;;",
        ]);
    let (code, out, err) = output(cmd);
    assert!(code == 0 || code == 5, "keel run failed\n{out}\n{err}");
    let run = run_id(&out);
    check_nothing_leaked(dir.path(), &run, &out, &err);
}

/// Where the CLI of `harness` is, if it is installed (keel-harness's own lookup: its `KEEL_*_BIN`
/// variable, else the pinned install).
fn keel_harness_bin(harness: &str) -> Option<std::path::PathBuf> {
    use keel_harness::cli::CliFlavor;
    let binary = match harness {
        "claude-code" => keel_harness::cli::claude::ClaudeCodeHarness::claude_code()
            .flavor()
            .binary(),
        "codex" => keel_harness::cli::codex::CodexHarness::codex()
            .flavor()
            .binary(),
        "opencode" => keel_harness::cli::opencode::OpencodeHarness::opencode()
            .flavor()
            .binary(),
        _ => keel_harness::cli::pi::PiHarness::pi().flavor().binary(),
    };
    binary.locate().ok()
}

#[test]
fn a_tool_printing_credentials_through_claude_code_leaves_none_anywhere() {
    real_cli("claude-code", "ANTHROPIC_BASE_URL");
}

#[test]
fn a_tool_printing_credentials_through_codex_leaves_none_anywhere() {
    real_cli("codex", "OPENAI_BASE_URL");
}

#[test]
fn a_tool_printing_credentials_through_opencode_leaves_none_anywhere() {
    real_cli("opencode", "OPENAI_BASE_URL");
}

#[test]
fn a_tool_printing_credentials_through_pi_leaves_none_anywhere() {
    real_cli("pi", "OPENAI_BASE_URL");
}
