//! Shared helpers for keel's cross-crate integration tests: the `keel` binary, child processes that
//! are reaped even when a test fails, and readers of a scripted model server's request recordings.

pub mod cluster;
pub mod fan_out;
pub mod policy;
pub mod secrets;
pub mod serve;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// Why a helper failed; tests turn it into a panic with this message.
#[derive(Debug, thiserror::Error)]
pub enum HelperError {
    /// The `keel` binary could not be built or found.
    #[error("the keel binary: {0}")]
    Binary(String),
    /// A process could not be started or waited for.
    #[error("process: {0}")]
    Process(#[from] std::io::Error),
    /// A wait ran out.
    #[error("timed out after {0:?}: {1}")]
    Timeout(Duration, String),
    /// A command failed or printed something other than what its caller reads.
    #[error("unexpected output: {0}")]
    Output(String),
}

/// A `cargo` command for a build from inside a test, without the variables cargo sets for the test
/// binary itself (`CARGO_MANIFEST_DIR`, `CARGO_PKG_NAME`, ...): build scripts such as ring's rerun
/// when those change, so inheriting them rebuilt ring and everything above it on every nested build
/// and again on the next `cargo test`.
fn nested_cargo() -> Command {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        let set_for_the_test = name.starts_with("CARGO_PKG_")
            || name.starts_with("CARGO_BIN_")
            || matches!(
                name,
                "CARGO_MANIFEST_DIR"
                    | "CARGO_MANIFEST_PATH"
                    | "CARGO_MANIFEST_LINKS"
                    | "CARGO_CRATE_NAME"
                    | "CARGO_PRIMARY_PACKAGE"
                    | "CARGO_TARGET_TMPDIR"
                    | "OUT_DIR"
            );
        if set_for_the_test {
            cmd.env_remove(name);
        }
    }
    cmd
}

/// The `keel` binary of this build, built once per test process (a no-op when it is fresh).
///
/// # Errors
/// [`HelperError::Binary`] when cargo fails or the binary is not where the build puts it.
pub fn keel_binary() -> Result<PathBuf, HelperError> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| {
        // tests run from target/<profile>/deps/; the binary lands in target/<profile>/.
        let exe = std::env::current_exe().map_err(|e| e.to_string())?;
        let profile_dir = exe
            .parent()
            .and_then(Path::parent)
            .ok_or("no profile directory above the test binary")?
            .to_path_buf();
        let target_dir = profile_dir
            .parent()
            .ok_or("no target directory above the profile directory")?;
        let mut build = nested_cargo();
        build
            .args(["build", "--quiet", "-p", "keel-node", "--bin", "keel"])
            .env("CARGO_TARGET_DIR", target_dir);
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            build.arg("--release");
        }
        let status = build.status().map_err(|e| format!("running cargo: {e}"))?;
        if !status.success() {
            return Err(format!("cargo build of keel failed: {status}"));
        }
        let bin = profile_dir.join("keel");
        if bin.is_file() {
            Ok(bin)
        } else {
            Err(format!("{} is missing after the build", bin.display()))
        }
    })
    .clone()
    .map_err(HelperError::Binary)
}

/// An example of the keel-tests package (`examples/NAME.rs` at the workspace root), built once.
///
/// # Errors
/// [`HelperError::Binary`] when cargo fails or the example is not where the build puts it.
pub fn example_binary(name: &str) -> Result<PathBuf, HelperError> {
    let exe = std::env::current_exe().map_err(|e| HelperError::Binary(e.to_string()))?;
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or_else(|| HelperError::Binary("no profile directory".into()))?
        .to_path_buf();
    let target_dir = profile_dir
        .parent()
        .ok_or_else(|| HelperError::Binary("no target directory".into()))?;
    let status = nested_cargo()
        .args(["build", "--quiet", "-p", "keel-tests", "--example", name])
        .env("CARGO_TARGET_DIR", target_dir)
        .status()?;
    if !status.success() {
        return Err(HelperError::Binary(format!(
            "building example {name}: {status}"
        )));
    }
    let bin = profile_dir.join("examples").join(name);
    if bin.is_file() {
        Ok(bin)
    } else {
        Err(HelperError::Binary(format!("{} is missing", bin.display())))
    }
}

/// A `keel` command in `dir` (its `./.keel` is the home), with logs quiet.
///
/// # Errors
/// As [`keel_binary`].
pub fn keel(dir: &Path) -> Result<Command, HelperError> {
    let mut cmd = Command::new(keel_binary()?);
    cmd.current_dir(dir)
        .env_remove("KEEL_HOME")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env("KEEL_LOG", "error");
    Ok(cmd)
}

/// A child process that is killed and reaped when dropped, so a failing test leaves nothing behind.
/// Its stdout and stderr are drained by threads into buffers (a full pipe never blocks it).
#[derive(Debug)]
pub struct Reaped {
    child: Option<Child>,
    stdout: Arc<Mutex<Vec<String>>>,
    stderr: Arc<Mutex<Vec<String>>>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

fn drain(
    pipe: impl std::io::Read + Send + 'static,
    into: Arc<Mutex<Vec<String>>>,
) -> std::thread::JoinHandle<()> {
    // The thread ends when the pipe closes (the child exits or is killed).
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines().map_while(Result::ok) {
            into.lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(line);
        }
    })
}

/// Wait until a line of `lines` contains `needle`; a timeout shows `stderr`.
fn wait_for_line(
    lines: &Mutex<Vec<String>>,
    stderr: &Mutex<Vec<String>>,
    needle: &str,
    wait: Duration,
) -> Result<String, HelperError> {
    wait_for(wait, needle, || {
        lines
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .find(|l| l.contains(needle))
            .cloned()
    })
    .map_err(|e| HelperError::Timeout(wait, format!("{e}; stderr: {}", joined(stderr))))
}

fn joined(lines: &Mutex<Vec<String>>) -> String {
    let lines = lines
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let mut text = lines.join("\n");
    text.push('\n');
    text
}

impl Reaped {
    /// Start `cmd` with piped stdout and stderr.
    ///
    /// # Errors
    /// [`HelperError::Process`].
    pub fn spawn(mut cmd: Command) -> Result<Self, HelperError> {
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()?;
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let mut readers = Vec::new();
        if let Some(out) = child.stdout.take() {
            readers.push(drain(out, Arc::clone(&stdout)));
        }
        if let Some(err) = child.stderr.take() {
            readers.push(drain(err, Arc::clone(&stderr)));
        }
        Ok(Self {
            child: Some(child),
            stdout,
            stderr,
            readers,
        })
    }

    /// The process id.
    pub fn id(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// Wait until a stdout line contains `needle`, at most `wait`; returns that line.
    ///
    /// # Errors
    /// [`HelperError::Timeout`] (the process ended or stayed silent).
    pub fn line_containing(&mut self, needle: &str, wait: Duration) -> Result<String, HelperError> {
        wait_for_line(&self.stdout, &self.stderr, needle, wait)
    }

    /// Wait until a line of the child's stderr contains `needle` (its log), at most `wait`.
    ///
    /// # Errors
    /// [`HelperError::Timeout`] with the stderr seen so far.
    pub fn stderr_line_containing(
        &mut self,
        needle: &str,
        wait: Duration,
    ) -> Result<String, HelperError> {
        wait_for_line(&self.stderr, &self.stderr, needle, wait)
    }

    /// The child's stderr so far.
    pub fn stderr_so_far(&self) -> String {
        joined(&self.stderr)
    }

    /// Wait for the exit, at most `wait`, and return the status with everything printed.
    ///
    /// # Errors
    /// [`HelperError::Timeout`] (the child is killed then) or [`HelperError::Process`].
    pub fn wait_output(
        mut self,
        wait: Duration,
    ) -> Result<(ExitStatus, String, String), HelperError> {
        let mut child = self
            .child
            .take()
            .ok_or_else(|| HelperError::Timeout(wait, "already reaped".into()))?;
        let deadline = Instant::now() + wait;
        let status = loop {
            if let Some(status) = child.try_wait()? {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(HelperError::Timeout(
                    wait,
                    format!("the process did not exit; stdout: {}", joined(&self.stdout)),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        Ok((status, joined(&self.stdout), joined(&self.stderr)))
    }

    /// SIGKILL and reap.
    pub fn kill(mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Poll `check` every 20 ms until it returns `Some`, at most `wait`.
///
/// # Errors
/// [`HelperError::Timeout`] naming `what`.
pub fn wait_for<T>(
    wait: Duration,
    what: &str,
    mut check: impl FnMut() -> Option<T>,
) -> Result<T, HelperError> {
    let deadline = Instant::now() + wait;
    loop {
        if let Some(v) = check() {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            return Err(HelperError::Timeout(wait, what.to_owned()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `cmd` to its end (killed after `wait`): its exit code (-1 when a signal ended it), stdout
/// and stderr. It takes `&mut` so that a builder chain (`keel(dir)?.args([..])`) passes straight in.
///
/// # Errors
/// As [`Reaped::spawn`] and [`Reaped::wait_output`].
pub fn run_to_end(cmd: &mut Command, wait: Duration) -> Result<(i32, String, String), HelperError> {
    let cmd = std::mem::replace(cmd, Command::new("true"));
    let (status, out, err) = Reaped::spawn(cmd)?.wait_output(wait)?;
    Ok((status.code().unwrap_or(-1), out, err))
}

/// `keel init` in `dir`, then `extra` appended to the new home's keel.toml: a home with a policy,
/// profiles or accounts of the test's own.
///
/// # Errors
/// [`HelperError::Output`] when `keel init` fails, [`HelperError::Process`] when keel.toml cannot be
/// read or written.
pub fn init_home_with(dir: &Path, extra: &str, wait: Duration) -> Result<(), HelperError> {
    let (code, out, err) = run_to_end(keel(dir)?.arg("init"), wait)?;
    if code != 0 {
        return Err(HelperError::Output(format!(
            "keel init: {code}\n{out}{err}"
        )));
    }
    let config = dir.join(".keel").join("keel.toml");
    let mut text = std::fs::read_to_string(&config)?;
    text.push_str(extra);
    std::fs::write(&config, text)?;
    Ok(())
}

/// `keel --json ARGS` in `dir`, which must succeed: the array `field` of what it prints (`rows` of
/// `audit`, `escalations` of `escalations`...).
///
/// # Errors
/// [`HelperError::Output`] when the command fails or prints no such array.
pub fn keel_json_list(
    dir: &Path,
    args: &[&str],
    field: &str,
    wait: Duration,
) -> Result<Vec<serde_json::Value>, HelperError> {
    let (code, out, err) = run_to_end(keel(dir)?.arg("--json").args(args), wait)?;
    if code != 0 {
        return Err(HelperError::Output(format!(
            "keel {args:?}: {code}\n{out}{err}"
        )));
    }
    let v: serde_json::Value = serde_json::from_str(out.trim())
        .map_err(|e| HelperError::Output(format!("keel {args:?} printed no JSON ({e}): {out}")))?;
    v[field]
        .as_array()
        .cloned()
        .ok_or_else(|| HelperError::Output(format!("keel {args:?} printed no `{field}`: {out}")))
}

/// The audit rows written by `who` (a hook's name, `rules`, `human`...) with `decision`.
pub fn audit_rows_by<'a>(
    rows: &'a [serde_json::Value],
    who: &str,
    decision: &str,
) -> Vec<&'a serde_json::Value> {
    rows.iter()
        .filter(|r| r["who"] == who && r["decision"] == decision)
        .collect()
}

/// Write `plan` to `dir/plan.json` and start `keel run <brief> --plan plan.json --detach` in `dir`;
/// the output of the starting command (its stdout names the run).
///
/// # Errors
/// As [`keel`], or [`HelperError::Process`] when the plan cannot be written or the command run.
pub fn run_detached(
    dir: &Path,
    brief: &str,
    plan: &keel_actors::Plan,
) -> Result<Output, HelperError> {
    let text = serde_json::to_string(plan).map_err(std::io::Error::other)?;
    std::fs::write(dir.join("plan.json"), text)?;
    Ok(keel(dir)?
        .args(["run", brief, "--plan", "plan.json", "--detach"])
        .output()?)
}

/// Wait up to `wait` for `keel --json status <run>` in `dir` to report the run cancelled.
///
/// # Errors
/// As [`keel`], or [`HelperError::Timeout`].
pub fn wait_cancelled(dir: &Path, run: &str, wait: Duration) -> Result<(), HelperError> {
    keel_binary()?;
    wait_for(wait, "the run to be cancelled", || {
        let s = keel(dir)
            .ok()?
            .args(["--json", "status", run])
            .output()
            .ok()?;
        String::from_utf8_lossy(&s.stdout)
            .contains("\"Cancelled\"")
            .then_some(())
    })
}

/// The requests a scripted model server recorded in `dir` (`keel model-server --record-dir`), in
/// arrival order: `seq`, `method`, `path`, `headers` (secret values cut to a prefix) and `body`.
pub fn recorded_requests(dir: &Path) -> Vec<serde_json::Value> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.sort();
    files
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .filter_map(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .collect()
}

/// The request bodies of [`recorded_requests`].
pub fn recorded_bodies(dir: &Path) -> Vec<serde_json::Value> {
    recorded_requests(dir)
        .into_iter()
        .filter_map(|v| v.get("body").cloned())
        .collect()
}

/// Sessions that started in a recording: requests whose conversation holds only the first user
/// message (every later request of a session carries tool results). Each is one execution.
pub fn session_openings(bodies: &[serde_json::Value]) -> Vec<String> {
    bodies
        .iter()
        .filter(|b| {
            b.get("messages")
                .and_then(|m| m.as_array())
                .is_some_and(|m| m.len() == 1)
        })
        .map(|b| b.to_string())
        .collect()
}

/// `keel model-server` started in `dir`, recording every request into `record`: the process (killed
/// when dropped) and the URL it listens on.
///
/// # Errors
/// [`HelperError`] when it cannot start or does not say where it listens within 30 s.
pub fn model_server(dir: &Path, record: &Path) -> Result<(Reaped, String), HelperError> {
    model_server_with(dir, record, None)
}

/// [`model_server`] following the script in the file `script` first (`keel model-server --script`:
/// its turns, its failures by API key), then the prompt rules.
///
/// # Errors
/// As [`model_server`].
pub fn model_server_with(
    dir: &Path,
    record: &Path,
    script: Option<&Path>,
) -> Result<(Reaped, String), HelperError> {
    let mut cmd = keel(dir)?;
    cmd.args(["model-server", "--record-dir"]).arg(record);
    if let Some(script) = script {
        cmd.arg("--script").arg(script);
    }
    let mut server = Reaped::spawn(cmd)?;
    let line = server.line_containing("listening on", Duration::from_secs(30))?;
    let url = line.trim_start_matches("listening on ").trim().to_string();
    Ok((server, url))
}

/// Whether the real CLI of `kind` (the pinned version) is installed; `true` for keel's own loop;
/// `false` (with the reason printed) only when `KEEL_SKIP_REAL_CLIS=1` allows skipping.
///
/// # Panics
/// When it is missing and skipping was not allowed: the test needs it.
pub fn cli_installed(kind: keel_harness::HarnessKind) -> bool {
    use keel_harness::HarnessKind;
    use keel_harness::cli::CliFlavor as _;
    let binary = match kind {
        HarnessKind::ClaudeCode => keel_harness::cli::claude::ClaudeCode.binary(),
        HarnessKind::Codex => keel_harness::cli::codex::Codex.binary(),
        HarnessKind::Opencode => keel_harness::cli::opencode::Opencode.binary(),
        HarnessKind::Pi => keel_harness::cli::pi::Pi::default().binary(),
        _ => return true,
    };
    match binary.locate() {
        Ok(_) => true,
        Err(e) if std::env::var("KEEL_SKIP_REAL_CLIS").as_deref() == Ok("1") => {
            eprintln!("skipping {kind} (KEEL_SKIP_REAL_CLIS=1): {e}");
            false
        }
        Err(e) => panic!(
            "{e}\nthis test needs the real {kind} CLI: run `{}`, or set KEEL_SKIP_REAL_CLIS=1",
            keel_harness::cli::INSTALL_COMMAND
        ),
    }
}

/// [`cli_installed`] for Claude Code, the CLI most tests use.
///
/// # Panics
/// As [`cli_installed`].
pub fn claude_code_installed() -> bool {
    cli_installed(keel_harness::HarnessKind::ClaudeCode)
}
