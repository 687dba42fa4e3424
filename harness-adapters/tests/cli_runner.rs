//! The shared CLI runner's IO behaviour (limits, cancel, exit without a terminal event, missing
//! binaries), with a shell script standing in for the CLI so these run on any machine. The real CLIs
//! are exercised by `cli_conformance.rs`.
#![cfg(feature = "io")] // Sessions, servers and processes: the IO half of the crate.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::path::{Path, PathBuf};
use std::time::Duration;

use keel_harness::cli::claude::ClaudeCode;
use keel_harness::cli::pi::Pi;
use keel_harness::cli::{CliConfig, CliFlavor, CliHarness};
use keel_harness::{
    BudgetKind, ErrorCategory, Harness, HarnessEvent, SessionSpec, StartError, StopReason,
};

fn fixture(cli: &str, name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/cli")
        .join(cli)
        .join(name)
}

/// A stand-in CLI: a shell script (arguments ignored).
fn fake_cli(dir: &Path, body: &str) -> PathBuf {
    let path = dir.join("fake-cli.sh");
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

fn harness<F: CliFlavor>(flavor: F, program: PathBuf) -> CliHarness<F> {
    CliHarness::new(
        flavor,
        CliConfig {
            program: Some(program),
            ..CliConfig::default()
        },
    )
}

async fn run<F: CliFlavor>(h: &CliHarness<F>, spec: SessionSpec) -> Vec<HarnessEvent> {
    h.start(spec)
        .await
        .unwrap()
        .collect(Duration::from_secs(30))
        .await
}

#[tokio::test]
async fn a_captured_run_streams_through_the_runner() {
    let dir = tempfile::tempdir().unwrap();
    let out = fixture("claude", "tool-bash.stream-json.jsonl");
    let cli = fake_cli(dir.path(), &format!("cat '{}'", out.display()));
    let events = run(
        &harness(ClaudeCode, cli),
        SessionSpec::new("x", "m", dir.path()),
    )
    .await;
    let kinds: Vec<_> = events
        .iter()
        .map(|e| match e {
            HarnessEvent::Started { .. } => "started",
            HarnessEvent::Text { .. } => "text",
            HarnessEvent::SentBack { .. } => "sent_back",
            HarnessEvent::ToolUse { .. } => "tool_use",
            HarnessEvent::ToolResult { .. } => "tool_result",
            HarnessEvent::Usage(_) => "usage",
            HarnessEvent::Finished { .. } => "finished",
            HarnessEvent::Failed(_) => "failed",
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "started",
            "tool_use",
            "usage",
            "tool_result",
            "text",
            "usage",
            "usage",
            "finished"
        ]
    );
}

#[tokio::test]
async fn pi_exiting_zero_after_a_failed_turn_is_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let meta: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixture("pi", "failure-500_noretry.meta.json")).unwrap(),
    )
    .unwrap();
    let out = dir.path().join("out.jsonl");
    std::fs::write(&out, meta["stdout_tail"].as_str().unwrap()).unwrap();
    let cli = fake_cli(dir.path(), &format!("cat '{}'; exit 0", out.display()));
    let events = run(
        &harness(Pi::default(), cli),
        SessionSpec::new("x", "m", dir.path()),
    )
    .await;
    match events.last().unwrap() {
        HarnessEvent::Failed(e) => assert_eq!(e.category, ErrorCategory::Transient, "{e}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn death_without_a_terminal_event_is_a_typed_failure_with_stderr() {
    let dir = tempfile::tempdir().unwrap();
    let cli = fake_cli(
        dir.path(),
        "echo 'Invalid API key · Please run /login' >&2; exit 1",
    );
    let events = run(
        &harness(ClaudeCode, cli),
        SessionSpec::new("x", "m", dir.path()),
    )
    .await;
    match events.last().unwrap() {
        HarnessEvent::Failed(e) => {
            assert_eq!(e.category, ErrorCategory::Auth, "{e}");
            assert!(e.message.contains("code 1"), "{e}");
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn wall_clock_limit_stops_a_hung_cli_as_a_budget_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let cli = fake_cli(dir.path(), "trap '' TERM; sleep 60");
    let mut spec = SessionSpec::new("x", "m", dir.path());
    spec.limits.wall_clock_ms_max = 300;
    let mut config = CliConfig {
        program: Some(cli),
        ..CliConfig::default()
    };
    config.cancel_grace = Duration::from_millis(100);
    let events = run(&CliHarness::new(ClaudeCode, config), spec).await;
    assert_eq!(
        events.last().unwrap(),
        &HarnessEvent::Finished {
            stop_reason: StopReason::Budget(BudgetKind::WallClock),
            final_text: String::new()
        }
    );
}

#[tokio::test]
async fn cancel_ends_with_cancelled_and_kills_the_tree() {
    let dir = tempfile::tempdir().unwrap();
    // The "CLI" starts a tool in a session of its own, as Claude Code and opencode do.
    let cli = fake_cli(
        dir.path(),
        "setsid sleep 53 & echo started > started.txt; wait",
    );
    let h = harness(ClaudeCode, cli);
    let session = h
        .start(SessionSpec::new("x", "m", dir.path()))
        .await
        .unwrap();
    let started = dir.path().join("started.txt");
    for _ in 0..500 {
        if started.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    session.cancel();
    let events = session.collect(Duration::from_secs(30)).await;
    match events.last().unwrap() {
        HarnessEvent::Failed(e) => assert_eq!(e.category, ErrorCategory::Cancelled),
        other => panic!("{other:?}"),
    }
    let sleepers: Vec<_> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()))
        .filter(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let alive = std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| keel_harness::process::parse_stat(&s))
                .is_some_and(|e| e.state != 'Z');
            alive && cmd == b"sleep\x0053\x00"
        })
        .collect();
    assert!(sleepers.is_empty(), "{sleepers:?}");
}

#[tokio::test]
async fn missing_binaries_name_the_install_command() {
    let dir = tempfile::tempdir().unwrap();
    let h = harness(ClaudeCode, dir.path().join("no-such-cli"));
    let err = h
        .start(SessionSpec::new("x", "m", dir.path()))
        .await
        .unwrap_err();
    assert!(matches!(err, StartError::Unavailable(_)), "{err}");
    // Without an explicit path the error names the pinned install command (when not installed) or
    // the binary is found; either way it is typed, never a panic.
    let located = ClaudeCode.binary().locate();
    if let Err(e) = located {
        assert!(
            e.to_string()
                .contains("npm ci --prefix harness-adapters/clis"),
            "{e}"
        );
    }
}

#[tokio::test]
async fn token_and_turn_ceilings_stop_the_session_as_budget_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let out = fixture("claude", "tool-bash.stream-json.jsonl");
    // The stand-in prints the two-turn capture, then stays alive like a CLI still working.
    let cli = fake_cli(dir.path(), &format!("cat '{}'; sleep 30", out.display()));
    let h = harness(ClaudeCode, cli);

    let mut spec = SessionSpec::new("x", "m", dir.path());
    spec.limits.tokens_max = 5;
    let events = run(&h, spec).await;
    assert!(
        matches!(
            events.last().unwrap(),
            HarnessEvent::Finished {
                stop_reason: StopReason::Budget(BudgetKind::Tokens),
                ..
            }
        ),
        "{events:?}"
    );

    let mut spec = SessionSpec::new("x", "m", dir.path());
    spec.limits.turns_max = 1;
    let events = run(&h, spec).await;
    assert!(
        matches!(
            events.last().unwrap(),
            HarnessEvent::Finished {
                stop_reason: StopReason::Budget(BudgetKind::Turns),
                ..
            }
        ),
        "{events:?}"
    );
}
