//! The shared runner of the four CLI adapters: it writes the session's files, spawns the CLI
//! through [`crate::process`] with stdin closed, reads stdout and stderr line by line, enforces the
//! spec's limits, honours cancellation, and always ends with exactly one terminal event.

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::BufReader;
use tokio::sync::mpsc;

use super::{
    CliFlavor, EventParser, Invocation, ProcessOutcome, SessionFile, check_no_resume_flag, jsonl,
};
use crate::error::{HarnessError, StartError};
use crate::event::{BudgetKind, HarnessEvent, StopReason};
use crate::guard::ToolOutput;
use crate::process::{ProcessSpec, SessionProcess};
use crate::session::{BoxFuture, CancelToken, EventSink, Harness, RunningSession, session_channel};
use crate::spec::{HarnessKind, SessionSpec};
use crate::usage::UsageAccumulator;

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
                stdin: invocation.stdin_file.clone(),
            };
            let (process, stdout, stderr) = SessionProcess::spawn(&process_spec)?;
            let (sink, cancel, running) = session_channel(self.flavor.kind());
            let parser = self.flavor.parser(&spec);
            let results = ResultLog::of(&spec, Arc::clone(&self.flavor) as Arc<dyn CliFlavor>);
            let run = CliRun {
                spec,
                parser,
                sink,
                cancel,
                grace: self.config.cancel_grace,
                results,
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
    /// Where the policy's results are found, when the session hands its results to keel.
    results: Option<ResultLog>,
}

/// What the text of a result the runner could not match to the policy's record says in the log,
/// for a CLI whose stream shows a result before its hook ran (the hook failed, timed out, or its
/// record was not found): the stream's original output is not logged (fail closed).
pub const RESULT_NOT_RECORDED: &str = "keel: the result keel's policy handed back for this call did \
not reach the log, so the CLI's own output of it is not recorded";

/// Most calls whose names the runner remembers while their results are due.
const CALL_NAMES_MAX: usize = 1024;

/// The session log's side of a session that hands its results to keel's policy (a
/// `post_tool_hook`): each tool result becomes an event holding what the policy handed back
/// ([`crate::ResultRecords`]), not what the CLI's stream says (docs/HARNESSES.md).
struct ResultLog {
    records: Arc<dyn crate::guard::ResultRecords>,
    flavor: Arc<dyn CliFlavor>,
    /// How long to wait for a record the CLI's hook has not written yet: its own timeout and a
    /// margin.
    wait_ms: u64,
    /// The stream's name and input (JSON text) of each call whose result is due, by its id.
    calls: std::collections::BTreeMap<String, (String, String)>,
}

impl ResultLog {
    fn of(spec: &SessionSpec, flavor: Arc<dyn CliFlavor>) -> Option<ResultLog> {
        let hook = spec.post_tool_hook.as_ref()?;
        let records = Arc::clone(spec.in_process.results.as_ref()?);
        Some(ResultLog {
            records,
            flavor,
            wait_ms: hook.timeout_ms.saturating_add(RESULT_WAIT_MARGIN_MS),
            calls: std::collections::BTreeMap::new(),
        })
    }

    /// `event` as the log is to hold it: a tool result replaced by what the policy handed back.
    async fn rewrite(&mut self, event: &mut HarnessEvent, cancel: &CancelToken) {
        match event {
            HarnessEvent::ToolUse {
                id,
                name,
                input_json,
            } if self.calls.len() < CALL_NAMES_MAX => {
                self.calls
                    .insert(id.clone(), (name.clone(), input_json.text.clone()));
            }
            HarnessEvent::ToolResult {
                id,
                is_error,
                content,
            } => {
                let call = self.calls.remove(id.as_str());
                // A call the runner does not know gets the flavor's default (Codex: wait).
                let waits = call.as_ref().map_or_else(
                    || self.flavor.result_before_hook_unknown(),
                    |(name, _)| self.flavor.result_before_hook(name),
                );
                let wait_ms = if waits { self.wait_ms } else { 0 };
                let (tool, input) = call
                    .as_ref()
                    .map_or(("", ""), |(n, i)| (n.as_str(), i.as_str()));
                let result = crate::guard::StreamResult {
                    call_id: self.flavor.stream_ids_are_call_ids().then_some(id.as_str()),
                    tool,
                    input,
                    original: &content.text,
                };
                let found = tokio::select! {
                    found = self.records.result_for(result, wait_ms) => found,
                    () = cancel.cancelled() => None,
                };
                let replaced = match found {
                    Some(crate::guard::HandedBack::Changed(output)) => output,
                    Some(crate::guard::HandedBack::Unchanged) => return,
                    None if waits => ToolOutput {
                        is_error: true,
                        text: RESULT_NOT_RECORDED.to_owned(),
                    },
                    None => return,
                };
                *event = HarnessEvent::tool_result(
                    std::mem::take(id),
                    *is_error || replaced.is_error,
                    replaced.text,
                );
            }
            _ => {}
        }
    }
}

/// Time a runner waits for a result's record beyond the hook's own timeout.
const RESULT_WAIT_MARGIN_MS: u64 = 2_000;

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
        for mut event in events.drain(..) {
            if terminal.is_some() {
                continue;
            }
            if let Some(results) = &mut self.results {
                results.rewrite(&mut event, &self.cancel).await;
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
