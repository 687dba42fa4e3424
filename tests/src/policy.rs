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
        match harness {
            None => {
                cmd.args(["--model-server", &self.url]);
            }
            Some(kind) => {
                cmd.args(["--harness", kind.as_str(), "--model", "keel-scripted-1"])
                    .env("ANTHROPIC_BASE_URL", &self.url)
                    .env("ANTHROPIC_API_KEY", "sk-policy-test")
                    .env("OPENAI_BASE_URL", format!("{}/v1", self.url))
                    .env("OPENAI_API_KEY", "sk-policy-test");
            }
        }
        Ok(cmd)
    }

    /// `keel --json audit` of the latest run: its rows.
    ///
    /// # Errors
    /// As [`keel_json_list`].
    pub fn audit(&self) -> Result<Vec<Value>, HelperError> {
        keel_json_list(self.path(), &["audit"], "rows", POLICY_WAIT)
    }

    /// Runs `cmd` (a `keel` command of this home) to its end, at most [`POLICY_WAIT`].
    ///
    /// # Errors
    /// As [`crate::run_to_end`].
    pub fn run_to_end(&self, cmd: &mut Command) -> Result<(i32, String, String), HelperError> {
        crate::run_to_end(cmd, POLICY_WAIT)
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
