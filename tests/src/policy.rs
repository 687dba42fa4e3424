//! A keel home with a policy for the policy tests (docs/DESIGN.md §9): `keel init`, keel.toml
//! ending with the test's policy, a recording scripted model server, plans of shell steps, `keel
//! run` on keel's own loop or a real CLI pointed at that server, and `keel --json audit`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use keel_actors::{Plan, PlanStep};
use keel_harness::HarnessKind;
use keel_harness::scripted::model::REPORT_AFTER_TOOL;
use serde_json::Value;

use crate::{HelperError, Reaped, init_home_with, keel, keel_json_list, model_server_with};

/// How long one `keel` command of a policy test may take.
pub const POLICY_WAIT: Duration = Duration::from_secs(240);

/// A `PostToolUse` command hook (`/bin/sh -c SCRIPT`) that copies the result out of its payload
/// (`tool_response.output`, JSON-escaped), replaces the word `hunter2` with `REDACTED` and hands it
/// back as `updatedToolOutput`.
pub const REDACT_HUNTER2: &str = r#"out=$(sed -E 's/.*"output":"(([^"\\]|\\.)*)".*/\1/' | sed 's/hunter2/REDACTED/g'); printf '{"hookSpecificOutput":{"updatedToolOutput":"%s"}}' "$out""#;

/// A keel home whose keel.toml ends with a policy, beside a scripted model server that records
/// every request it receives.
pub struct PolicyHome {
    dir: tempfile::TempDir,
    /// The model server's URL.
    pub url: String,
    _server: Reaped,
}

impl PolicyHome {
    /// `keel init` in a new folder, `policy` appended to its keel.toml, and `keel model-server
    /// --record-dir` started beside it.
    ///
    /// # Errors
    /// A `keel` command failed or the files could not be written.
    pub fn new(policy: &str) -> Result<PolicyHome, HelperError> {
        PolicyHome::with_script(policy, None)
    }

    /// [`PolicyHome::new`] whose model server follows `script` (the JSON of a `keel model-server
    /// --script` file: its turns, its usage) before its prompt rules.
    ///
    /// # Errors
    /// As [`PolicyHome::new`].
    pub fn with_script(policy: &str, script: Option<&str>) -> Result<PolicyHome, HelperError> {
        let dir = tempfile::tempdir()?;
        init_home_with(dir.path(), policy, POLICY_WAIT)?;
        let script_file = match script {
            Some(text) => {
                let file = dir.path().join(".keel").join("model-script.json");
                std::fs::write(&file, text)?;
                Some(file)
            }
            None => None,
        };
        let (server, url) = model_server_with(
            dir.path(),
            &dir.path().join("record"),
            script_file.as_deref(),
        )?;
        Ok(PolicyHome {
            dir,
            url,
            _server: server,
        })
    }

    /// The folder (`keel run` works in it; `.keel` is the home).
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Where the model server records its requests.
    pub fn record_dir(&self) -> PathBuf {
        self.path().join("record")
    }

    /// Writes `steps` as `.keel/plan.json`.
    ///
    /// # Errors
    /// The file cannot be written.
    pub fn write_plan(&self, steps: Vec<PlanStep>) -> Result<(), HelperError> {
        let plan = Plan {
            steps,
            constraints: Vec::new(),
        };
        let text = serde_json::to_string(&plan).map_err(std::io::Error::other)?;
        std::fs::write(self.path().join(".keel").join("plan.json"), text)?;
        Ok(())
    }

    /// `keel run` of `.keel/plan.json`, not started: on keel's own loop against the model server
    /// (`None`), or on a real CLI pointed at it (Anthropic and OpenAI endpoints and keys).
    ///
    /// # Errors
    /// As [`keel`].
    pub fn run_command(&self, harness: Option<HarnessKind>) -> Result<Command, HelperError> {
        let mut cmd = keel(self.path())?;
        cmd.args(["run", "policy", "--quiet", "--plan", ".keel/plan.json"]);
        harness_args(&mut cmd, harness, &self.url);
        Ok(cmd)
    }

    /// A cluster on 127.0.0.1 running `.keel/plan.json` on `harness` (as
    /// [`PolicyHome::run_command`]): `keel node --role coordinator --run` in this home (its
    /// policy), and one `keel node --role worker` in `worker_dir` (a keel home), joined. Returns the
    /// coordinator, then the worker.
    ///
    /// # Errors
    /// As [`keel`], or a node did not start or join within [`POLICY_WAIT`].
    pub fn start_cluster(
        &self,
        harness: Option<HarnessKind>,
        worker_dir: &Path,
    ) -> Result<(Reaped, Reaped), HelperError> {
        use crate::cluster::{COOKIE, NODE_LOG, free_port, wait_joined, write_cookie};
        let cookie = self.path().join("cookie");
        write_cookie(&cookie, COOKIE, 0o600);
        let addr = format!("127.0.0.1:{}", free_port());
        let mut coordinator = Reaped::spawn(self.coordinator_command(harness, &addr, &cookie)?)?;
        coordinator.line_containing("listening on", POLICY_WAIT)?;
        let mut cmd = crate::serve::worker_command(worker_dir, &addr, "w1", &cookie);
        cmd.env("KEEL_LOG", NODE_LOG)
            .args(["--capacity", "4", "--lease-ms", "1500"]);
        harness_args(&mut cmd, harness, &self.url);
        let worker = Reaped::spawn(cmd)?;
        wait_joined(&coordinator, 1, POLICY_WAIT);
        Ok((coordinator, worker))
    }

    fn coordinator_command(
        &self,
        harness: Option<HarnessKind>,
        addr: &str,
        cookie: &Path,
    ) -> Result<Command, HelperError> {
        let mut cmd = keel(self.path())?;
        cmd.env("KEEL_LOG", crate::cluster::NODE_LOG).args([
            "node",
            "--role",
            "coordinator",
            "--listen",
            addr,
            "--lease-ms",
            "1500",
            "--run",
            "policy",
            "--plan",
            ".keel/plan.json",
            "--wait-workers",
            "1",
        ]);
        cmd.arg("--cookie-file").arg(cookie);
        harness_args(&mut cmd, harness, &self.url);
        Ok(cmd)
    }

    /// `keel --json audit` of the latest run: its rows.
    ///
    /// # Errors
    /// As [`keel_json_list`].
    pub fn audit(&self) -> Result<Vec<Value>, HelperError> {
        keel_json_list(self.path(), &["audit"], "rows", POLICY_WAIT)
    }

    /// What keel kept of each task of the latest run that a person or a later session reads: `keel
    /// --json logs TASK` (its session log rows) and `keel context TASK --resume` (the preamble a
    /// restarted attempt would get), each named by its command.
    ///
    /// # Errors
    /// A `keel` command failed.
    pub fn logs_and_preambles(&self) -> Result<Vec<(String, String)>, HelperError> {
        let tasks = keel_json_list(self.path(), &["tasks"], "tasks", POLICY_WAIT)?;
        let mut outputs = Vec::new();
        for task in &tasks {
            let Some(id) = task["id"].as_str() else {
                continue;
            };
            for args in [
                vec!["--json", "logs", id, "--tail", "1000"],
                vec!["context", id, "--resume"],
            ] {
                let (code, out, err) =
                    crate::run_to_end(keel(self.path())?.args(&args), POLICY_WAIT)?;
                if code != 0 {
                    return Err(HelperError::Output(format!(
                        "keel {args:?}: {code}\n{out}{err}"
                    )));
                }
                outputs.push((format!("keel {}", args.join(" ")), out));
            }
        }
        Ok(outputs)
    }

    /// Runs `cmd` (a `keel` command of this home) to its end, at most [`POLICY_WAIT`].
    ///
    /// # Errors
    /// As [`crate::run_to_end`].
    pub fn run_to_end(&self, cmd: &mut Command) -> Result<(i32, String, String), HelperError> {
        crate::run_to_end(cmd, POLICY_WAIT)
    }
}

/// `--harness KIND --model keel-scripted-1` and the variables that point a real CLI at the scripted
/// model server at `url` (Anthropic and OpenAI endpoints and keys), or `--model-server URL` for
/// keel's own loop (`None`).
pub fn harness_args(cmd: &mut Command, harness: Option<HarnessKind>, url: &str) {
    match harness {
        None => {
            cmd.args(["--model-server", url]);
        }
        Some(kind) => {
            cmd.args(["--harness", kind.as_str(), "--model", "keel-scripted-1"])
                .env("ANTHROPIC_BASE_URL", url)
                .env("ANTHROPIC_API_KEY", "sk-policy-test")
                .env("OPENAI_BASE_URL", format!("{url}/v1"))
                .env("OPENAI_API_KEY", "sk-policy-test");
        }
    }
}

/// keel.toml's `[[hooks]]` entry `redact`: a `PostToolUse` hook running [`REDACT_HUNTER2`].
pub fn redact_hunter2_policy() -> String {
    rewrite_policy("hunter2", "REDACTED")
}

/// keel.toml's `[[hooks]]` entry `redact`: [`REDACT_HUNTER2`] replacing the word `from` (plain
/// letters) with `to` instead.
pub fn rewrite_policy(from: &str, to: &str) -> String {
    let script = REDACT_HUNTER2.replace("s/hunter2/REDACTED/g", &format!("s/{from}/{to}/g"));
    format!(
        "\n[[hooks]]\nname = \"redact\"\nevent = \"PostToolUse\"\ncommand = [\"/bin/sh\", \"-c\", {}]\n",
        serde_json::to_string(&script).unwrap_or_default()
    )
}

/// The checks of a run whose tool printed `pw-hunter2` and whose `PostToolUse` hook redacted it:
/// the model saw `pw-REDACTED` and never the secret (`bodies`, the requests the model server
/// received), and what keel kept (`kept`, [`PolicyHome::logs_and_preambles`]) holds the redacted
/// result and never the secret.
///
/// # Panics
/// When one fails (`context` is printed).
pub fn assert_redacted_everywhere(bodies: &[String], kept: &[(String, String)], context: &str) {
    assert!(
        bodies.iter().any(|b| b.contains("pw-REDACTED")),
        "the model never saw the redacted result: {context}\n{bodies:#?}"
    );
    assert!(
        bodies.iter().all(|b| !b.contains("hunter2")),
        "the secret reached the model: {context}\n{bodies:#?}"
    );
    assert_kept_redacted(kept, context);
}

/// The second half of [`assert_redacted_everywhere`]: what keel kept holds the redacted result
/// and never the secret.
///
/// # Panics
/// When it does not (`context` is printed).
pub fn assert_kept_redacted(kept: &[(String, String)], context: &str) {
    assert!(
        kept.iter().any(|(_, text)| text.contains("pw-REDACTED")),
        "no log row holds the redacted result: {context}\n{kept:#?}"
    );
    for (what, text) in kept {
        assert!(
            !text.contains("hunter2"),
            "the secret is in {what}: {context}\n{text}"
        );
    }
}

/// A model script that makes `harness` compact its context automatically: a few shell calls, the
/// last answer reporting a nearly full context (Claude Code also needs
/// [`compact_claude_code_early`] in its working folder; Codex compacts at its default threshold).
pub fn compaction_script(harness: HarnessKind) -> String {
    // Claude Code compacts only when the conversation has a few exchanges to fold.
    let (calls, usage) = match harness {
        HarnessKind::Codex => (3, 260_000),
        _ => (5, 90_000),
    };
    let mut turns: Vec<Value> = (1..=calls)
        .map(|i| serde_json::json!({"tool_calls": [{"shell": format!("echo step-{i}")}]}))
        .collect();
    if let Some(last) = turns.last_mut() {
        last["usage"] = serde_json::json!({"input_tokens": usage, "output_tokens": 5});
    }
    serde_json::json!({ "turns": turns }).to_string()
}

/// A project setting Claude Code reads in `dir` (`--setting-sources project`): compact past
/// 100,000 tokens less its reserve, under the 90,000 [`compaction_script`] reports. Codex ignores
/// the folder.
///
/// # Errors
/// The file cannot be written.
pub fn compact_claude_code_early(dir: &Path) -> Result<(), HelperError> {
    let claude_dir = dir.join(".claude");
    std::fs::create_dir_all(&claude_dir)?;
    std::fs::write(
        claude_dir.join("settings.json"),
        r#"{"autoCompactWindow": 100000}"#,
    )?;
    Ok(())
}

/// Words only `harness`'s compaction request carries (its summary prompt).
pub fn compaction_prompt(harness: HarnessKind) -> &'static str {
    match harness {
        HarnessKind::Codex => "You are performing a CONTEXT CHECKPOINT COMPACTION",
        _ => "Your task is to create a detailed summary of the conversation so far",
    }
}

/// A step whose session runs `command` with its harness's shell tool and then reports whatever the
/// tool answered (the scripted model's report rule), so a denied call still ends its step in one
/// attempt, on every harness.
pub fn shell_step(key: &str, what: &str, command: &str, depends_on: &[&str]) -> PlanStep {
    PlanStep {
        key: key.into(),
        brief: format!("{what} {REPORT_AFTER_TOOL}\nRUN_TOOL: {command} ;;"),
        goal: what.into(),
        quality_criteria: vec!["the finding is what the tool answered".into()],
        output_schema: None,
        assignee: None,
        depends_on: depends_on.iter().map(|d| (*d).to_string()).collect(),
        estimate_micros: 0,
    }
}
