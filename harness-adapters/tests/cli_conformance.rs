//! Conformance of the four CLI adapters against the REAL CLIs, driven by the scripted model server
//! on 127.0.0.1.
//!
//! The CLIs come from the pinned install: `npm ci --prefix harness-adapters/clis` (or set
//! `KEEL_CLAUDE_BIN`, `KEEL_CODEX_BIN`, `KEEL_OPENCODE_BIN`, `KEEL_PI_BIN`). Without them every test
//! here FAILS naming that command, unless `KEEL_SKIP_REAL_CLIS=1` is set, which skips them (for a
//! machine without Node.js; CI installs them through `scripts/test`).
//!
//! Each case is one short real session (about 0.3 s for Codex to 3 s for opencode); the cases run
//! in parallel.
#![cfg(feature = "io")] // Sessions, servers and processes: the IO half of the crate.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keel_harness::cli::claude::ClaudeCodeHarness;
use keel_harness::cli::codex::CodexHarness;
use keel_harness::cli::opencode::OpencodeHarness;
use keel_harness::cli::pi::PiHarness;
use keel_harness::cli::{
    CliBinary, CliFlavor, CliHarness, INSTALL_COMMAND, Invocation, RESUME_FLAGS,
};
use keel_harness::process::PROCESS_TAG_VAR;
use keel_harness::scripted::{Script, ScriptFailure, ScriptToolCall, ScriptTurn};
use keel_harness::server::{ModelServer, ModelServerConfig, RecordedRequest};
use keel_harness::{
    Account, Credential, ErrorCategory, GateCommand, Harness, HarnessEvent, HarnessKind,
    SessionSpec, StopReason,
};

const MODEL: &str = "keel-conformance-model";
const KEY_VAR: &str = "KEEL_CONFORMANCE_KEY";
const WAIT_MAX: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cli {
    Claude,
    Codex,
    Opencode,
    Pi,
}

type Recorded = Arc<Mutex<Vec<Invocation>>>;

fn binary(cli: Cli) -> CliBinary {
    match cli {
        Cli::Claude => ClaudeCodeHarness::claude_code().flavor().binary(),
        Cli::Codex => CodexHarness::codex().flavor().binary(),
        Cli::Opencode => OpencodeHarness::opencode().flavor().binary(),
        Cli::Pi => PiHarness::pi().flavor().binary(),
    }
}

/// `None` when the CLIs are missing and skipping was asked for; panics (failing the test) when they
/// are missing otherwise.
fn available(cli: Cli) -> Option<()> {
    match binary(cli).locate() {
        Ok(_) => Some(()),
        Err(e) if std::env::var("KEEL_SKIP_REAL_CLIS").as_deref() == Ok("1") => {
            eprintln!("skipping {cli:?} conformance (KEEL_SKIP_REAL_CLIS=1): {e}");
            None
        }
        Err(e) => panic!(
            "{e}\nthe conformance suite needs the real CLIs: run `{INSTALL_COMMAND}`, or set KEEL_SKIP_REAL_CLIS=1 to skip"
        ),
    }
}

fn observed<F: CliFlavor>(h: CliHarness<F>, rec: &Recorded) -> Box<dyn Harness> {
    let rec = Arc::clone(rec);
    Box::new(h.with_observer(Arc::new(move |inv: &Invocation| {
        rec.lock().unwrap().push(inv.clone())
    })))
}

fn harness(cli: Cli, rec: &Recorded) -> Box<dyn Harness> {
    match cli {
        Cli::Claude => observed(ClaudeCodeHarness::claude_code(), rec),
        Cli::Codex => observed(CodexHarness::codex(), rec),
        Cli::Opencode => observed(OpencodeHarness::opencode(), rec),
        Cli::Pi => observed(PiHarness::pi(), rec),
    }
}

struct Case {
    cli: Cli,
    server: ModelServer,
    dir: tempfile::TempDir,
    recorded: Recorded,
}

impl Case {
    async fn new(cli: Cli, turns: Vec<ScriptTurn>) -> Option<Case> {
        available(cli)?;
        let server = ModelServer::start(ModelServerConfig::new(Script::from_turns(turns)))
            .await
            .unwrap();
        Some(Case {
            cli,
            server,
            dir: tempfile::tempdir().unwrap(),
            recorded: Arc::default(),
        })
    }

    fn spec(&self, prompt: &str) -> SessionSpec {
        let mut spec = SessionSpec::new(prompt, MODEL, self.dir.path());
        spec.env.insert(KEY_VAR.into(), "sk-conformance".into());
        spec.account = Account {
            id: "conformance".into(),
            base_url: Some(self.server.base_url()),
            credential: Credential::ApiKeyEnv(KEY_VAR.into()),
        };
        spec.limits.wall_clock_ms_max = 45_000;
        spec
    }

    async fn run(&self, spec: SessionSpec) -> Vec<HarnessEvent> {
        let session = harness(self.cli, &self.recorded).start(spec).await.unwrap();
        session.collect(WAIT_MAX).await
    }

    fn model_requests(&self) -> Vec<RecordedRequest> {
        self.server
            .requests()
            .into_iter()
            .filter(|r| r.method == "POST")
            .collect()
    }

    /// Every recorded argv: no resume or continue flag before the prompt, ever.
    fn assert_no_resume_flag(&self) {
        let recorded = self.recorded.lock().unwrap();
        assert!(!recorded.is_empty(), "no invocation recorded");
        for inv in recorded.iter() {
            let before_prompt = inv.args.iter().take_while(|a| *a != "--");
            for arg in before_prompt {
                let flag = arg.split('=').next().unwrap();
                let is_resume = match flag {
                    "-c" => self.cli != Cli::Codex,
                    "-s" => self.cli == Cli::Opencode,
                    f => RESUME_FLAGS.contains(&f),
                };
                assert!(
                    !is_resume,
                    "{:?} argv holds {arg}: {:?}",
                    self.cli, inv.args
                );
                assert!(
                    arg != "resume" && arg != "fork",
                    "{:?}: {:?}",
                    self.cli,
                    inv.args
                );
            }
        }
    }
}

fn text_turn(text: &str) -> ScriptTurn {
    ScriptTurn {
        text: Some(text.into()),
        ..ScriptTurn::default()
    }
}

fn failure(failure: ScriptFailure) -> ScriptTurn {
    ScriptTurn {
        failure: Some(failure),
        ..ScriptTurn::default()
    }
}

fn shell_turn(command: &str) -> ScriptTurn {
    ScriptTurn {
        tool_calls: vec![ScriptToolCall {
            shell: Some(command.into()),
            ..ScriptToolCall::default()
        }],
        ..ScriptTurn::default()
    }
}

fn terminal(events: &[HarnessEvent]) -> &HarnessEvent {
    let last = events.last().unwrap();
    assert!(last.is_terminal(), "{events:#?}");
    assert_eq!(events.iter().filter(|e| e.is_terminal()).count(), 1);
    last
}

/// The texts of the user turns a request carries, whatever its wire API.
fn user_texts(body: &serde_json::Value) -> Vec<String> {
    let mut out = Vec::new();
    let items = body
        .get("messages")
        .or_else(|| body.get("input"))
        .and_then(|v| v.as_array())
        .cloned()
        .unwrap_or_default();
    for item in items {
        if item.get("role").and_then(|r| r.as_str()) != Some("user") {
            continue;
        }
        match item.get("content") {
            Some(serde_json::Value::String(s)) => out.push(s.clone()),
            Some(serde_json::Value::Array(blocks)) => {
                for b in blocks {
                    if let Some(t) = b.get("text").and_then(|t| t.as_str()) {
                        out.push(t.to_owned());
                    }
                }
            }
            _ => {}
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The cases, each a function over the CLI; the macro at the end makes one test per CLI and case.

/// One text turn whose prompt starts with a slash skill: the first line reaches the model as line
/// one, the model named in the spec is the one the server receives, and argv holds no resume flag.
async fn text_turn_case(cli: Cli) {
    let Some(case) = Case::new(cli, vec![text_turn("Hello from the scripted model.")]).await else {
        return;
    };
    let prompt = "/keel-skill review the diff\nThe preamble from keel goes here.\nAnd the brief.";
    if cli == Cli::Claude {
        let commands = case.dir.path().join(".claude/commands");
        std::fs::create_dir_all(&commands).unwrap();
        std::fs::write(
            commands.join("keel-skill.md"),
            "KEEL-SKILL-BODY with arguments: $ARGUMENTS\n",
        )
        .unwrap();
    }
    let events = case.run(case.spec(prompt)).await;
    assert!(
        matches!(events.first(), Some(HarnessEvent::Started { .. })),
        "{events:#?}"
    );
    assert!(
        events.iter().any(
            |e| matches!(e, HarnessEvent::Text { text } if text == "Hello from the scripted model.")
        ),
        "{cli:?}: {events:#?}"
    );
    match terminal(&events) {
        HarnessEvent::Finished {
            stop_reason,
            final_text,
        } => {
            assert_eq!(*stop_reason, StopReason::EndTurn);
            assert_eq!(final_text, "Hello from the scripted model.");
        }
        other => panic!("{cli:?}: {other:?}"),
    }
    let requests = case.model_requests();
    assert_eq!(
        requests.len(),
        1,
        "{cli:?}: one model request, no side requests: {requests:#?}"
    );
    assert_eq!(requests[0].body["model"], MODEL, "{cli:?}");
    let texts = user_texts(&requests[0].body);
    if cli == Cli::Claude {
        // Claude Code recognises the skill on line one and expands it; the preamble lines arrive as
        // its arguments, after the first line.
        assert!(
            texts
                .iter()
                .any(|t| t.contains("<command-name>/keel-skill</command-name>")),
            "{texts:#?}"
        );
        assert!(
            texts.iter().any(|t| t.starts_with(
                "KEEL-SKILL-BODY with arguments: review the diff\nThe preamble from keel goes here.\nAnd the brief."
            )),
            "{texts:#?}"
        );
    } else {
        // The others pass the prompt through: the skill line is the first line the model reads.
        let with_skill: Vec<_> = texts.iter().filter(|t| t.contains("/keel-skill")).collect();
        assert_eq!(with_skill.len(), 1, "{cli:?}: {texts:#?}");
        assert!(
            with_skill[0].starts_with("/keel-skill review the diff\n"),
            "{cli:?}: {:?}",
            with_skill[0]
        );
    }
    case.assert_no_resume_flag();
}

/// The CLI's own shell tool changes the file system; the result pairs with its call.
async fn tool_round_trip_case(cli: Cli) {
    let turns = vec![
        shell_turn("echo tool-ran > proof.txt && cat proof.txt"),
        text_turn("done"),
    ];
    let Some(case) = Case::new(cli, turns).await else {
        return;
    };
    let events = case.run(case.spec("make the proof file")).await;
    assert!(
        matches!(
            terminal(&events),
            HarnessEvent::Finished {
                stop_reason: StopReason::EndTurn,
                ..
            }
        ),
        "{events:#?}"
    );
    let proof = std::fs::read_to_string(case.dir.path().join("proof.txt")).unwrap();
    assert_eq!(proof, "tool-ran\n");
    let uses: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            HarnessEvent::ToolUse { id, .. } => Some(id.clone()),
            _ => None,
        })
        .collect();
    let results: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            HarnessEvent::ToolResult {
                id,
                is_error,
                content,
            } => Some((id.clone(), *is_error, content.text.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(uses.len(), 1, "{events:#?}");
    assert_eq!(results.len(), 1, "{events:#?}");
    assert_eq!(results[0].0, uses[0], "the result pairs with its call");
    assert!(!results[0].1);
    assert!(results[0].2.contains("tool-ran"), "{:?}", results[0]);
    // The model saw the tool result in the second request.
    let requests = case.model_requests();
    assert_eq!(requests.len(), 2, "{requests:#?}");
    assert!(requests[1].body.to_string().contains("tool-ran"));
    case.assert_no_resume_flag();
}

/// A 429 surfaces as `rate_limited`, quickly (the CLI's own retries are off), after one request.
async fn rate_limit_case(cli: Cli) {
    let turns = vec![failure(ScriptFailure::RateLimited {
        retry_after_secs: 1,
        reset_after_secs: Some(30),
    })];
    let Some(case) = Case::new(cli, turns).await else {
        return;
    };
    let started = Instant::now();
    let events = case.run(case.spec("say hi")).await;
    let elapsed = started.elapsed();
    match terminal(&events) {
        HarnessEvent::Failed(e) => {
            assert!(
                matches!(e.category, ErrorCategory::RateLimited { .. }),
                "{cli:?}: {e}"
            );
            assert!(e.retryable);
        }
        other => panic!("{cli:?}: {other:?}"),
    }
    // "Quickly" is proven by the count, not by a timing assertion: one request means no retry
    // schedule ran (the defaults take 8 s to 3 minutes, README §5.4).
    eprintln!("{cli:?}: rate limit surfaced after {elapsed:?}");
    assert_eq!(
        case.model_requests().len(),
        1,
        "{cli:?}: the CLI retried on its own"
    );
}

/// A 500 surfaces as a transient, retryable failure after one request.
async fn server_error_case(cli: Cli) {
    let turns = vec![failure(ScriptFailure::Http {
        status: 500,
        message: Some("internal server error".into()),
    })];
    let Some(case) = Case::new(cli, turns).await else {
        return;
    };
    let events = case.run(case.spec("say hi")).await;
    match terminal(&events) {
        HarnessEvent::Failed(e) => {
            assert_eq!(e.category, ErrorCategory::Transient, "{cli:?}: {e}");
            assert!(e.retryable);
        }
        other => panic!("{cli:?}: {other:?}"),
    }
    assert_eq!(
        case.model_requests().len(),
        1,
        "{cli:?}: the CLI retried on its own"
    );
}

/// Cancel while the CLI's tool runs: a terminal `cancelled` event, and no process of the session
/// left in the process table (the tool's `sleep` included).
async fn cancel_case(cli: Cli) {
    // A sleep length per CLI, so the cases (which run in parallel) find only their own tool.
    let secs = 37 + cli as u32;
    let turns = vec![
        shell_turn(&format!("sleep {secs} ; echo never > late.txt")),
        text_turn("done"),
    ];
    let Some(case) = Case::new(cli, turns).await else {
        return;
    };
    let session = harness(cli, &case.recorded)
        .start(case.spec("run the long command"))
        .await
        .unwrap();
    let cancel = session.cancel_token();
    // Wait until the tool's sleep is running, then cancel.
    let deadline = Instant::now() + WAIT_MAX;
    let mut sleeping = Vec::new();
    while Instant::now() < deadline {
        sleeping = sleep_processes(secs);
        if !sleeping.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!sleeping.is_empty(), "{cli:?}: the tool never started");
    cancel.cancel();
    let events = session.collect(WAIT_MAX).await;
    match terminal(&events) {
        HarnessEvent::Failed(e) => assert_eq!(e.category, ErrorCategory::Cancelled, "{cli:?}: {e}"),
        other => panic!("{cli:?}: {other:?}"),
    }
    let left: Vec<_> = sleeping
        .iter()
        .filter(|p| Path::new(&format!("/proc/{p}")).exists() && !is_zombie(**p))
        .collect();
    assert!(
        left.is_empty(),
        "{cli:?}: the tool survived the cancel: {left:?}"
    );
    let tagged = tagged_processes(&case);
    assert!(
        tagged.is_empty(),
        "{cli:?}: processes of the session survived: {tagged:?}"
    );
    assert!(!case.dir.path().join("late.txt").exists());
}

/// A gate that denies one command blocks that real tool call: the file it would create does not
/// exist, and the model gets an error result.
async fn gate_case(cli: Cli) {
    let turns = vec![
        shell_turn("echo should-not-run > blocked.txt"),
        text_turn("done"),
    ];
    let Some(case) = Case::new(cli, turns).await else {
        return;
    };
    let gate_dir = tempfile::tempdir().unwrap();
    let gate = gate_dir.path().join("deny-should-not-run.sh");
    std::fs::write(
        &gate,
        "#!/bin/sh\ninput=$(cat)\ncase \"$input\" in\n  *should-not-run*) echo \"BLOCKED by keel policy\" >&2; exit 2;;\nesac\nexit 0\n",
    )
    .unwrap();
    std::fs::set_permissions(&gate, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut spec = case.spec("try the forbidden command");
    spec.pre_tool_gate = Some(GateCommand {
        program: gate.display().to_string(),
        args: vec![],
        timeout_ms: 10_000,
    });
    let events = case.run(spec).await;
    assert!(
        !case.dir.path().join("blocked.txt").exists(),
        "{cli:?}: the gate did not block: {events:#?}"
    );
    assert!(
        matches!(
            terminal(&events),
            HarnessEvent::Finished {
                stop_reason: StopReason::EndTurn,
                ..
            }
        ),
        "{events:#?}"
    );
    let requests = case.model_requests();
    assert_eq!(requests.len(), 2, "{cli:?}: {requests:#?}");
    assert!(
        requests[1]
            .body
            .to_string()
            .contains("BLOCKED by keel policy"),
        "{cli:?}: the model never saw the reason"
    );
    // Codex prints no item for a blocked call (README §2.6); the others report an error result.
    if cli != Cli::Codex {
        assert!(
            events.iter().any(|e| matches!(e, HarnessEvent::ToolResult { is_error: true, content, .. } if content.text.contains("BLOCKED by keel policy"))),
            "{cli:?}: {events:#?}"
        );
    }
}

/// A stream without a finish reason makes opencode ask again forever; the adapter stops it after a
/// few such steps with a typed failure.
async fn missing_finish_reason_case(cli: Cli) {
    let turns = (0..50)
        .map(|_| {
            failure(ScriptFailure::MissingFinishReason {
                text: Some("looping".into()),
            })
        })
        .collect();
    let Some(case) = Case::new(cli, turns).await else {
        return;
    };
    let events = case.run(case.spec("say hi")).await;
    match terminal(&events) {
        HarnessEvent::Failed(e) => {
            assert_eq!(e.category, ErrorCategory::Transient, "{e}");
            assert!(e.message.contains("finish reason"), "{e}");
        }
        other => panic!("{cli:?}: {other:?}"),
    }
    // The adapter stops it after its third such step; the CLI may have sent a few more requests
    // before the stop lands (more on a loaded machine). Far fewer than the 50 scripted either way.
    let n = case.model_requests().len();
    assert!(
        (3..=10).contains(&n),
        "{cli:?}: {n} requests before the loop was stopped"
    );
}

fn sleep_processes(secs: u32) -> Vec<u32> {
    let secs = secs.to_string();
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        let args: Vec<_> = cmdline.split(|b| *b == 0).collect();
        if args.first().is_some_and(|a| a.ends_with(b"sleep"))
            && args.get(1) == Some(&secs.as_bytes())
        {
            out.push(pid);
        }
    }
    out
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| keel_harness::process::parse_stat(&s))
        .is_some_and(|e| e.state == 'Z')
}

/// Live processes of a keel session (tagged) working in this case's directory; other cases run in
/// parallel in their own directories.
fn tagged_processes(case: &Case) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let tagged = env
            .split(|b| *b == 0)
            .any(|kv| kv.starts_with(PROCESS_TAG_VAR.as_bytes()));
        let here = std::fs::read_link(format!("/proc/{pid}/cwd"))
            .is_ok_and(|cwd| cwd.starts_with(case.dir.path()));
        if tagged && here && !is_zombie(pid) {
            out.push(pid);
        }
    }
    out
}

macro_rules! conformance {
    ($($name:ident => $case:ident($cli:expr);)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                $case($cli).await;
            }
        )*
    };
}

conformance! {
    claude_code_text_turn => text_turn_case(Cli::Claude);
    claude_code_tool_round_trip => tool_round_trip_case(Cli::Claude);
    claude_code_rate_limit => rate_limit_case(Cli::Claude);
    claude_code_server_error => server_error_case(Cli::Claude);
    claude_code_cancel => cancel_case(Cli::Claude);
    claude_code_gate => gate_case(Cli::Claude);
    codex_text_turn => text_turn_case(Cli::Codex);
    codex_tool_round_trip => tool_round_trip_case(Cli::Codex);
    codex_rate_limit => rate_limit_case(Cli::Codex);
    codex_server_error => server_error_case(Cli::Codex);
    codex_cancel => cancel_case(Cli::Codex);
    codex_gate => gate_case(Cli::Codex);
    opencode_text_turn => text_turn_case(Cli::Opencode);
    opencode_tool_round_trip => tool_round_trip_case(Cli::Opencode);
    opencode_rate_limit => rate_limit_case(Cli::Opencode);
    opencode_server_error => server_error_case(Cli::Opencode);
    opencode_cancel => cancel_case(Cli::Opencode);
    opencode_gate => gate_case(Cli::Opencode);
    opencode_missing_finish_reason => missing_finish_reason_case(Cli::Opencode);
    pi_text_turn => text_turn_case(Cli::Pi);
    pi_tool_round_trip => tool_round_trip_case(Cli::Pi);
    pi_rate_limit => rate_limit_case(Cli::Pi);
    pi_server_error => server_error_case(Cli::Pi);
    pi_cancel => cancel_case(Cli::Pi);
    pi_gate => gate_case(Cli::Pi);
}

#[test]
fn kinds_are_the_four_clis() {
    let rec = Recorded::default();
    let kinds: Vec<_> = [Cli::Claude, Cli::Codex, Cli::Opencode, Cli::Pi]
        .map(|c| harness(c, &rec).kind())
        .to_vec();
    assert_eq!(
        kinds,
        [
            HarnessKind::ClaudeCode,
            HarnessKind::Codex,
            HarnessKind::Opencode,
            HarnessKind::Pi
        ]
    );
}
