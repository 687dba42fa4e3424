//! Adapters for the four real coding-agent CLIs: Claude Code, Codex, opencode and pi.
//!
//! Each adapter is two halves, kept apart so the logic is testable without a process:
//!
//! - a pure **invocation builder** (`SessionSpec` + a per-session directory → argv, environment and
//!   the config files to write), and
//! - a pure **event parser** (one JSON line of the CLI's output → normalized [`HarnessEvent`]s),
//!
//! joined by one shared runner ([`run_cli_session`]) that does the IO: it writes the files, spawns
//! the CLI through [`crate::process`] with stdin closed, reads stdout and stderr line by line,
//! enforces the spec's limits, honours cancellation, and always ends with exactly one terminal event.
//!
//! **Architecture invariant:** no adapter ever passes a native resume or continue flag (DESIGN.md §6,
//! invariant 5). [`check_no_resume_flag`] refuses such an argv before anything is spawned.

pub mod claude;
pub mod codex;
pub mod jsonl;
pub mod limits;
pub mod opencode;
pub mod pi;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::BufReader;
use tokio::sync::mpsc;

use crate::error::{HarnessError, StartError, truncate_to};
use crate::event::{BudgetKind, HarnessEvent, StopReason};
use crate::process::{ProcessSpec, SessionProcess};
use crate::session::{BoxFuture, CancelToken, EventSink, Harness, RunningSession, session_channel};
use crate::spec::{Credential, GateCommand, HarnessKind, SessionSpec};
use crate::usage::UsageAccumulator;

pub use jsonl::ParseError;

/// How long a CLI gets to exit by itself after SIGTERM before it is killed. Claude Code may still
/// make one more model call after SIGTERM during a long tool (README §1.7), so this stays short.
pub const CANCEL_GRACE: Duration = Duration::from_secs(2);

/// How long to wait for the CLI to exit after it printed its terminal event.
pub const EXIT_AFTER_TERMINAL_MAX: Duration = Duration::from_secs(5);

/// Longest time to keep reading stdout after the CLI exited (a tool it left behind may hold the
/// pipe open, so the drain cannot wait for end of file).
pub const DRAIN_AFTER_EXIT_MAX: Duration = Duration::from_secs(10);

/// Longest pause between two lines while draining after exit before the drain stops.
pub const DRAIN_IDLE_MAX: Duration = Duration::from_millis(300);

/// Bytes of stderr kept for the failure message when a CLI dies without a terminal event.
pub const STDERR_TAIL_BYTES_MAX: usize = 2048;

/// Malformed stdout lines tolerated per session before the session fails as a protocol violation.
pub const MALFORMED_LINES_MAX: u32 = 100;

/// What the CLI's process did when it ended, for parsers deciding on a terminal event.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ProcessOutcome {
    /// Exit code, when the process exited normally.
    pub exit_code: Option<i32>,
    /// The last bytes of stderr (bounded by [`STDERR_TAIL_BYTES_MAX`]).
    pub stderr_tail: String,
    /// When the process ended (Unix ms), for relative reset times.
    pub now_unix_ms: u64,
}

/// One CLI's output format, turned into normalized events. Pure: no IO, the time is an input.
pub trait EventParser: Send {
    /// Parses one stdout line (without its newline), pushing the events it yields.
    ///
    /// # Errors
    /// A typed [`ParseError`]; the parser's state stays usable for the next line.
    fn parse_line(
        &mut self,
        line: &[u8],
        now_unix_ms: u64,
        out: &mut Vec<HarnessEvent>,
    ) -> Result<(), ParseError>;

    /// Reads one stderr line. Most CLIs print only logs there; opencode's per-attempt model errors
    /// arrive only on stderr, so its parser ends the session from here.
    fn parse_stderr_line(&mut self, _line: &str, _now_unix_ms: u64, _out: &mut Vec<HarnessEvent>) {}

    /// Model turns (requests) seen so far, checked against `SessionLimits::turns_max`.
    fn turns(&self) -> u32;

    /// The last assistant text seen, the answer if the session stops at a budget.
    fn last_text(&self) -> &str;

    /// The terminal event for a process that ended without printing one.
    fn finish(&mut self, outcome: &ProcessOutcome) -> HarnessEvent;
}

/// Everything needed to start one CLI session: the command and the files it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invocation {
    /// The CLI executable.
    pub program: PathBuf,
    /// Arguments, without a shell.
    pub args: Vec<String>,
    /// The complete environment (nothing else is inherited).
    pub env: BTreeMap<String, String>,
    /// The working directory of the process.
    pub cwd: PathBuf,
    /// Files to write before the spawn (config, hooks, plugins), with their mode bits.
    pub files: Vec<SessionFile>,
    /// Directories to create before the spawn (HOME, config homes): some CLIs refuse a missing one.
    pub dirs: Vec<PathBuf>,
}

/// A file an adapter writes into the session directory before the spawn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionFile {
    /// Absolute path (inside the session directory).
    pub path: PathBuf,
    /// Content.
    pub contents: String,
    /// Whether to make it executable (gate wrapper scripts).
    pub executable: bool,
}

/// Flags that would make a CLI resume a native session; never allowed (DESIGN.md §6).
pub const RESUME_FLAGS: [&str; 8] = [
    "--resume",
    "-r",
    "--continue",
    "-c",
    "--session",
    "-s",
    "--fork",
    "--session-id",
];

/// Refuses an argv that holds a resume or continue flag, or Codex's `resume` subcommand.
///
/// Codex's `-c key=value` config flag shares its spelling with other CLIs' `-c/--continue`, so
/// `-c` is refused only for the CLIs where it means continue.
///
/// # Errors
/// [`StartError::InvalidSpec`] naming the flag.
pub fn check_no_resume_flag(kind: HarnessKind, args: &[String]) -> Result<(), StartError> {
    let mut after_double_dash = false;
    for (i, arg) in args.iter().enumerate() {
        if arg == "--" {
            after_double_dash = true;
        }
        if after_double_dash {
            continue;
        }
        let flag = arg.split('=').next().unwrap_or(arg);
        let refused = match flag {
            "-c" => kind != HarnessKind::Codex,
            "-s" => kind == HarnessKind::Opencode,
            f => RESUME_FLAGS.contains(&f) && f != "-s",
        };
        let codex_subcommand =
            kind == HarnessKind::Codex && i <= 1 && (arg == "resume" || arg == "fork");
        if refused || codex_subcommand {
            return Err(StartError::InvalidSpec(format!(
                "argv holds the native resume flag `{arg}`; keel never resumes a harness session"
            )));
        }
    }
    Ok(())
}

/// Where to find one CLI: an explicit path from the environment, else the pinned install.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CliBinary {
    /// Environment variable holding an explicit path (e.g. `KEEL_CLAUDE_BIN`).
    pub env_var: &'static str,
    /// Executable name under `harness-adapters/clis/node_modules/.bin/`.
    pub bin_name: &'static str,
}

/// The command that installs the pinned CLIs, named in every "not installed" error.
pub const INSTALL_COMMAND: &str = "npm ci --prefix harness-adapters/clis";

impl CliBinary {
    /// The pinned install directory of this source tree (used when no env override is set).
    pub fn pinned_bin_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("clis")
            .join("node_modules")
            .join(".bin")
    }

    /// Finds the executable.
    ///
    /// # Errors
    /// [`StartError::Unavailable`] saying how to install it or which variable to set.
    pub fn locate(&self) -> Result<PathBuf, StartError> {
        if let Some(path) = std::env::var_os(self.env_var) {
            let path = PathBuf::from(path);
            return if path.is_file() {
                Ok(path)
            } else {
                Err(StartError::Unavailable(format!(
                    "{} points at {}, which is not a file",
                    self.env_var,
                    path.display()
                )))
            };
        }
        let pinned = Self::pinned_bin_dir().join(self.bin_name);
        if pinned.is_file() {
            Ok(pinned)
        } else {
            Err(StartError::Unavailable(format!(
                "`{}` is not installed: run `{INSTALL_COMMAND}` (or set {} to its path)",
                self.bin_name, self.env_var
            )))
        }
    }
}

/// Environment variables passed through from keel's own environment to every CLI: what a
/// process needs to run (PATH for `node`, locale, time zone), never credentials or CLI config.
pub const PASSTHROUGH_ENV: [&str; 7] =
    ["PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "USER", "TMPDIR"];

/// The base environment of a session: pass-through variables, the per-session HOME, then the
/// spec's own `env` (which wins).
pub fn base_env(spec: &SessionSpec, home: &Path) -> BTreeMap<String, String> {
    let mut env = BTreeMap::new();
    for name in PASSTHROUGH_ENV {
        if let Ok(v) = std::env::var(name) {
            env.insert(name.to_owned(), v);
        }
    }
    env.entry("PATH".to_owned())
        .or_insert_with(|| "/usr/local/bin:/usr/bin:/bin".to_owned());
    env.insert("HOME".to_owned(), home.display().to_string());
    for (k, v) in &spec.env {
        env.insert(k.clone(), v.clone());
    }
    env
}

/// The account's secret, resolved the one way adapters must (spec env first, then ours).
///
/// # Errors
/// [`StartError::MissingCredential`] naming the variable.
pub fn credential_value(spec: &SessionSpec) -> Result<Option<(Credential, String)>, StartError> {
    let name = match &spec.account.credential {
        Credential::None => return Ok(None),
        Credential::ApiKeyEnv(n) | Credential::BearerTokenEnv(n) => n,
    };
    spec.env_var(name)
        .map(|v| Some((spec.account.credential.clone(), v)))
        .ok_or_else(|| {
            StartError::MissingCredential(format!("environment variable {name} is not set"))
        })
}

/// Quotes one word for a POSIX shell.
pub fn shell_quote(word: &str) -> String {
    if !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-=:,+@%".contains(&b))
    {
        return word.to_owned();
    }
    format!("'{}'", word.replace('\'', "'\\''"))
}

/// Adds the gate's wrapper script to a session's files and returns its path: every CLI's hook,
/// plugin or extension calls this one wrapper, which fails closed on a crash or a timeout.
pub fn install_gate_wrapper(
    session_dir: &std::path::Path,
    gate: &GateCommand,
    files: &mut Vec<SessionFile>,
) -> PathBuf {
    let wrapper = session_dir.join("keel-gate.sh");
    files.push(SessionFile {
        path: wrapper.clone(),
        contents: gate_wrapper_script(gate),
        executable: true,
    });
    wrapper
}

/// A shell script that runs the spec's gate with a timeout and fails closed: exit 0 allows, exit 2
/// denies with stderr as the reason, and anything else (a crash, a timeout, a missing program)
/// becomes exit 2. Claude Code and Codex treat other exit codes as a non-blocking hook error and
/// would run the tool, which a mandatory gate must never allow (DESIGN.md §9).
pub fn gate_wrapper_script(gate: &GateCommand) -> String {
    let mut cmd = shell_quote(&gate.program);
    for a in &gate.args {
        cmd.push(' ');
        cmd.push_str(&shell_quote(a));
    }
    let secs = gate.timeout_ms.div_ceil(1000).max(1);
    format!(
        "#!/bin/sh\n# keel pre-tool gate wrapper: fail closed.\ntimeout -k 1 {secs} {cmd}\nrc=$?\n\
         if [ \"$rc\" -eq 0 ] || [ \"$rc\" -eq 2 ]; then exit \"$rc\"; fi\n\
         echo \"keel gate failed closed (exit $rc)\" >&2\nexit 2\n"
    )
}

/// The JavaScript that runs the gate from a Node/Bun based CLI (opencode plugin, pi extension):
/// a function `keelGate(toolName, toolInput, toolUseId, cwd)` returning `null` to allow or the
/// deny reason. It hands the gate a Claude-compatible `PreToolUse` payload on stdin and fails closed
/// like [`gate_wrapper_script`] (it runs that same wrapper).
pub fn gate_js_function(wrapper: &Path, harness: HarnessKind) -> String {
    let wrapper =
        serde_json::to_string(&wrapper.display().to_string()).unwrap_or_else(|_| "\"\"".to_owned());
    format!(
        r#"import {{ spawnSync }} from "node:child_process";
const KEEL_GATE = {wrapper};
function keelGate(toolName, toolInput, toolUseId, cwd) {{
  const payload = JSON.stringify({{ hook_event_name: "PreToolUse", harness: "{harness}", tool_name: toolName,
    tool_input: toolInput ?? {{}}, tool_use_id: toolUseId ?? null, cwd: cwd ?? process.cwd() }});
  const r = spawnSync(KEEL_GATE, [], {{ input: payload, encoding: "utf8" }});
  if (r.status === 0) return null;
  const reason = String(r.stderr ?? "").trim();
  return reason.length > 0 ? reason : `keel gate denied the call (exit ${{r.status}})`;
}}
"#
    )
}

/// Configuration shared by the four adapters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CliConfig {
    /// Parent of the per-session directories (HOME, config, hooks); each session gets a fresh one
    /// that is removed when the session ends.
    pub session_root: PathBuf,
    /// SIGTERM-to-SIGKILL grace period on cancel.
    pub cancel_grace: Duration,
    /// An explicit path to the CLI (e.g. from the node's configuration); wins over the
    /// `KEEL_*_BIN` variable and the pinned install.
    pub program: Option<PathBuf>,
}

impl Default for CliConfig {
    fn default() -> Self {
        CliConfig {
            session_root: std::env::temp_dir(),
            cancel_grace: CANCEL_GRACE,
            program: None,
        }
    }
}

/// Called with each invocation just before its spawn; lets tests record argv and environment.
pub type InvocationObserver = Arc<dyn Fn(&Invocation) + Send + Sync>;

/// One CLI's adapter-specific half: how to build the invocation and the parser.
pub trait CliFlavor: Send + Sync + 'static {
    /// Which harness this is.
    fn kind(&self) -> HarnessKind;
    /// Where its executable is found.
    fn binary(&self) -> CliBinary;
    /// Builds the invocation for `spec` with `program`, using `session_dir` for HOME and config.
    ///
    /// # Errors
    /// [`StartError`] for a spec the CLI cannot run (e.g. a missing credential).
    fn invocation(
        &self,
        spec: &SessionSpec,
        program: &Path,
        session_dir: &Path,
    ) -> Result<Invocation, StartError>;
    /// A fresh parser for one session.
    fn parser(&self, spec: &SessionSpec) -> Box<dyn EventParser>;
}

/// A [`Harness`] that runs one of the four CLIs.
pub struct CliHarness<F: CliFlavor> {
    flavor: Arc<F>,
    config: CliConfig,
    observer: Option<InvocationObserver>,
}

impl<F: CliFlavor> std::fmt::Debug for CliHarness<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CliHarness")
            .field("kind", &self.flavor.kind())
            .field("config", &self.config)
            .finish()
    }
}

impl<F: CliFlavor> CliHarness<F> {
    /// An adapter with the given flavor and configuration.
    pub fn new(flavor: F, config: CliConfig) -> Self {
        CliHarness {
            flavor: Arc::new(flavor),
            config,
            observer: None,
        }
    }

    /// Registers a callback that sees every invocation before its spawn (argv recording in tests).
    #[must_use]
    pub fn with_observer(mut self, observer: InvocationObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// The flavor, for building invocations without running them.
    pub fn flavor(&self) -> &F {
        &self.flavor
    }
}

impl<F: CliFlavor> Harness for CliHarness<F> {
    fn kind(&self) -> HarnessKind {
        self.flavor.kind()
    }

    fn start(&self, spec: SessionSpec) -> BoxFuture<'_, Result<RunningSession, StartError>> {
        Box::pin(async move {
            spec.validate()?;
            let program = match &self.config.program {
                Some(p) if p.is_file() => p.clone(),
                Some(p) => {
                    return Err(StartError::Unavailable(format!(
                        "the configured {} path {} is not a file",
                        self.flavor.kind(),
                        p.display()
                    )));
                }
                None => self.flavor.binary().locate()?,
            };
            std::fs::create_dir_all(&self.config.session_root)?;
            let session_dir = tempfile::Builder::new()
                .prefix(&format!("keel-{}-", self.flavor.kind()))
                .tempdir_in(&self.config.session_root)?;
            let invocation = self
                .flavor
                .invocation(&spec, &program, session_dir.path())?;
            check_no_resume_flag(self.flavor.kind(), &invocation.args)?;
            for dir in &invocation.dirs {
                std::fs::create_dir_all(dir)?;
            }
            write_session_files(&invocation.files)?;
            if let Some(observer) = &self.observer {
                observer(&invocation);
            }
            let process_spec = ProcessSpec {
                program: invocation.program.clone(),
                args: invocation.args.iter().map(OsString::from).collect(),
                env: invocation
                    .env
                    .iter()
                    .map(|(k, v)| (OsString::from(k), OsString::from(v)))
                    .collect(),
                cwd: invocation.cwd.clone(),
            };
            let (process, stdout, stderr) = SessionProcess::spawn(&process_spec)?;
            let (sink, cancel, running) = session_channel(self.flavor.kind());
            let parser = self.flavor.parser(&spec);
            let run = CliRun {
                spec,
                parser,
                sink,
                cancel,
                grace: self.config.cancel_grace,
            };
            // The session runs in the caller's span, so its log lines name the caller's task.
            let drive = async move {
                run.drive(process, stdout, stderr).await;
                // Removed only after the process tree is gone, so no tool writes into a deleted HOME.
                drop(session_dir);
            };
            tokio::spawn(tracing::Instrument::instrument(
                drive,
                tracing::Span::current(),
            ));
            Ok(running)
        })
    }
}

fn write_session_files(files: &[SessionFile]) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    for f in files {
        if let Some(parent) = f.path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&f.path, &f.contents)?;
        if f.executable {
            std::fs::set_permissions(&f.path, std::fs::Permissions::from_mode(0o755))?;
        }
    }
    Ok(())
}

/// Wall-clock milliseconds since the Unix epoch (the parsers take time as an input).
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

enum Output {
    Stdout(jsonl::ReadLine),
    Stderr(String),
    StdoutClosed,
}

struct CliRun {
    spec: SessionSpec,
    parser: Box<dyn EventParser>,
    sink: EventSink,
    cancel: CancelToken,
    grace: Duration,
}

/// Why the runner stopped the CLI itself.
enum Stop {
    Cancelled,
    ConsumerGone,
    Budget(BudgetKind),
    Terminal,
}

impl CliRun {
    async fn drive(
        mut self,
        mut process: SessionProcess,
        stdout: tokio::process::ChildStdout,
        stderr: tokio::process::ChildStderr,
    ) {
        let (tx, mut rx) = mpsc::channel::<Output>(64);
        let out_tx = tx.clone();
        let out_task = tokio::spawn(async move {
            let mut reader = BufReader::with_capacity(64 * 1024, stdout);
            while let Ok(Some(line)) =
                jsonl::read_bounded_line(&mut reader, jsonl::LINE_BYTES_MAX).await
            {
                if out_tx.send(Output::Stdout(line)).await.is_err() {
                    return;
                }
            }
            let _ = out_tx.send(Output::StdoutClosed).await;
        });
        let err_task = tokio::spawn(async move {
            let mut reader = BufReader::new(stderr);
            while let Ok(Some(line)) =
                jsonl::read_bounded_line(&mut reader, jsonl::STDERR_LINE_BYTES_MAX).await
            {
                let text = match line {
                    jsonl::ReadLine::Line(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                    jsonl::ReadLine::TooLong(n) => format!("[stderr line of {n} bytes skipped]"),
                };
                if tx.send(Output::Stderr(text)).await.is_err() {
                    return;
                }
            }
        });

        let deadline =
            tokio::time::Instant::now() + Duration::from_millis(self.spec.limits.wall_clock_ms_max);
        let mut usage = UsageAccumulator::new();
        let mut stderr_tail = String::new();
        let mut malformed: u32 = 0;
        let mut stop: Option<Stop> = None;
        let mut terminal: Option<HarnessEvent> = None;
        let mut exited = false;
        let mut events = Vec::new();
        let cancel = self.cancel.clone();

        while stop.is_none() {
            tokio::select! {
                biased;
                () = cancel.cancelled() => stop = Some(Stop::Cancelled),
                () = tokio::time::sleep_until(deadline) => stop = Some(Stop::Budget(BudgetKind::WallClock)),
                status = process.wait(), if !exited => {
                    exited = true;
                    let _ = status;
                    stop = self.drain_after_exit(&mut rx, &mut events, &mut stderr_tail, &mut malformed, &mut usage, &mut terminal).await;
                    if stop.is_none() { break; }
                }
                item = rx.recv() => {
                    match item {
                        None | Some(Output::StdoutClosed) => {
                            // stdout closed: the process is ending; wait for it (bounded).
                            if !exited {
                                if tokio::time::timeout(EXIT_AFTER_TERMINAL_MAX, process.wait()).await.is_err() {
                                    stop = Some(Stop::Terminal);
                                } else {
                                    // stderr may still hold the CLI's last words (an auth error).
                                    stop = self.drain_after_exit(&mut rx, &mut events, &mut stderr_tail, &mut malformed, &mut usage, &mut terminal).await;
                                }
                                exited = true;
                            }
                            if stop.is_none() { break; }
                        }
                        Some(item) => {
                            self.handle(item, &mut events, &mut stderr_tail, &mut malformed);
                            stop = self.dispatch(&mut events, &mut usage, &mut terminal).await;
                        }
                    }
                }
            }
            if stop.is_none() && malformed > MALFORMED_LINES_MAX {
                terminal = Some(HarnessEvent::Failed(HarnessError::system(format!(
                    "the CLI printed more than {MALFORMED_LINES_MAX} malformed lines"
                ))));
                stop = Some(Stop::Terminal);
            }
        }

        // Stop the process tree. After a terminal event the CLI is normally exiting by itself: give
        // it a moment before signalling, so its own cleanup runs.
        // A failure the CLI has not acted on yet (opencode's first failed request, a runaway loop)
        // must not wait: the CLI would retry or loop on its own schedule meanwhile.
        let failed = matches!(terminal, Some(HarnessEvent::Failed(_)));
        let end = match stop {
            Some(Stop::Terminal) if !exited && failed => process.terminate(self.grace).await,
            Some(Stop::Terminal) if !exited => {
                match tokio::time::timeout(EXIT_AFTER_TERMINAL_MAX, process.wait()).await {
                    Ok(_) => process.finish().await,
                    Err(_) => process.terminate(self.grace).await,
                }
            }
            None | Some(Stop::Terminal) => process.finish().await,
            Some(_) => process.terminate(self.grace).await,
        };
        out_task.abort();
        err_task.abort();

        let final_event = match (stop, terminal) {
            (_, Some(t)) => t,
            (Some(Stop::Cancelled | Stop::ConsumerGone), None) => {
                HarnessEvent::Failed(HarnessError::cancelled())
            }
            (Some(Stop::Budget(kind)), None) => HarnessEvent::Finished {
                stop_reason: StopReason::Budget(kind),
                final_text: self.parser.last_text().to_owned(),
            },
            (Some(Stop::Terminal) | None, None) => {
                let outcome = ProcessOutcome {
                    exit_code: end.status.and_then(|s| s.code()),
                    stderr_tail: stderr_tail.clone(),
                    now_unix_ms: now_unix_ms(),
                };
                self.parser.finish(&outcome)
            }
        };
        let _ = self.sink.send(final_event).await;
    }

    /// Reads what is still queued after the CLI exited. A left-behind tool may hold the pipes open,
    /// so this stops after [`DRAIN_IDLE_MAX`] without a line, and after [`DRAIN_AFTER_EXIT_MAX`] in
    /// all; time spent handing events to a slow consumer does not count as idle.
    async fn drain_after_exit(
        &mut self,
        rx: &mut mpsc::Receiver<Output>,
        events: &mut Vec<HarnessEvent>,
        stderr_tail: &mut String,
        malformed: &mut u32,
        usage: &mut UsageAccumulator,
        terminal: &mut Option<HarnessEvent>,
    ) -> Option<Stop> {
        let drain_until = tokio::time::Instant::now() + DRAIN_AFTER_EXIT_MAX;
        loop {
            let idle_until = (tokio::time::Instant::now() + DRAIN_IDLE_MAX).min(drain_until);
            let item = match tokio::time::timeout_at(idle_until, rx.recv()).await {
                Ok(None) | Err(_) => return None,
                Ok(Some(Output::StdoutClosed)) => continue,
                Ok(Some(item)) => item,
            };
            self.handle(item, events, stderr_tail, malformed);
            if let Some(stop) = self.dispatch(events, usage, terminal).await {
                return Some(stop);
            }
        }
    }

    fn handle(
        &mut self,
        item: Output,
        events: &mut Vec<HarnessEvent>,
        stderr_tail: &mut String,
        malformed: &mut u32,
    ) {
        let now = now_unix_ms();
        match item {
            Output::Stdout(jsonl::ReadLine::Line(bytes)) => {
                let Some(line) = jsonl::trim_line(&bytes) else {
                    return;
                };
                if self.parser.parse_line(line, now, events).is_err() {
                    *malformed += 1;
                }
            }
            Output::Stdout(jsonl::ReadLine::TooLong(_)) => *malformed += 1,
            Output::Stderr(line) => {
                self.parser.parse_stderr_line(&line, now, events);
                stderr_tail.push_str(&line);
                stderr_tail.push('\n');
                if stderr_tail.len() > STDERR_TAIL_BYTES_MAX * 2 {
                    let cut = stderr_tail.len() - STDERR_TAIL_BYTES_MAX;
                    let cut = (cut..stderr_tail.len())
                        .find(|i| stderr_tail.is_char_boundary(*i))
                        .unwrap_or(0);
                    *stderr_tail = stderr_tail[cut..].to_owned();
                }
            }
            Output::StdoutClosed => {}
        }
    }

    /// Forwards parsed events, holding back a terminal one; returns why to stop, if anything.
    async fn dispatch(
        &mut self,
        events: &mut Vec<HarnessEvent>,
        usage: &mut UsageAccumulator,
        terminal: &mut Option<HarnessEvent>,
    ) -> Option<Stop> {
        for event in events.drain(..) {
            if terminal.is_some() {
                continue;
            }
            if event.is_terminal() {
                *terminal = Some(event);
                continue;
            }
            if let HarnessEvent::Usage(report) = &event {
                usage.record(report);
            }
            if !self.sink.send(event).await {
                return Some(Stop::ConsumerGone);
            }
        }
        if terminal.is_some() {
            return Some(Stop::Terminal);
        }
        if usage.total().total_tokens() > self.spec.limits.tokens_max {
            return Some(Stop::Budget(BudgetKind::Tokens));
        }
        if self.parser.turns() > self.spec.limits.turns_max {
            return Some(Stop::Budget(BudgetKind::Turns));
        }
        None
    }
}

/// Collapses a tool result's content (a string, or a list of `{type:"text", text}` blocks) to text.
pub fn content_text(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Array(items) => {
            let mut out = String::new();
            for item in items {
                if let Some(t) = item.get("text").and_then(serde_json::Value::as_str) {
                    if !out.is_empty() {
                        out.push('\n');
                    }
                    out.push_str(t);
                }
            }
            out
        }
        serde_json::Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// A message for a process that ended without the CLI's terminal event.
pub fn died_message(cli: &str, outcome: &ProcessOutcome) -> String {
    let code = outcome
        .exit_code
        .map_or_else(|| "a signal".to_owned(), |c| format!("code {c}"));
    let tail = outcome.stderr_tail.trim();
    truncate_to(
        if tail.is_empty() {
            format!("{cli} exited with {code} without a terminal event")
        } else {
            format!("{cli} exited with {code} without a terminal event; stderr: {tail}")
        },
        crate::error::ERROR_MESSAGE_BYTES_MAX,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_flags_are_refused() {
        let v = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(
            check_no_resume_flag(HarnessKind::ClaudeCode, &v(&["-p", "x", "--resume", "abc"]))
                .is_err()
        );
        assert!(check_no_resume_flag(HarnessKind::ClaudeCode, &v(&["-p", "--continue"])).is_err());
        assert!(check_no_resume_flag(HarnessKind::Pi, &v(&["-c"])).is_err());
        assert!(check_no_resume_flag(HarnessKind::Pi, &v(&["--session=x"])).is_err());
        assert!(check_no_resume_flag(HarnessKind::Opencode, &v(&["run", "-s", "ses_1"])).is_err());
        assert!(check_no_resume_flag(HarnessKind::Codex, &v(&["exec", "resume", "id"])).is_err());
        assert!(
            check_no_resume_flag(HarnessKind::Codex, &v(&["exec", "-c", "model=x", "--json"]))
                .is_ok()
        );
        // A prompt after `--` may say anything.
        assert!(
            check_no_resume_flag(HarnessKind::Opencode, &v(&["run", "--", "--resume"])).is_ok()
        );
    }

    #[test]
    fn gate_wrapper_fails_closed() {
        let gate = GateCommand {
            program: "/srv/example/gate".into(),
            args: vec!["it's".into()],
            timeout_ms: 1500,
        };
        let s = gate_wrapper_script(&gate);
        assert!(
            s.contains("timeout -k 1 2 /srv/example/gate 'it'\\''s'"),
            "{s}"
        );
        assert!(s.contains("exit 2"));
    }

    #[test]
    fn content_blocks_collapse_to_text() {
        let v: serde_json::Value = serde_json::json!([{"type":"text","text":"a"},{"type":"image"},{"type":"text","text":"b"}]);
        assert_eq!(content_text(&v), "a\nb");
        assert_eq!(content_text(&serde_json::json!("x")), "x");
    }
}
