//! The scripted harness: keel's loop with the model in process (no socket), as `keel run` uses it
//! offline.
#![cfg(feature = "io")]
// Sessions, servers and processes: the IO half of the crate.

// Test helpers panic on setup failure by design: a broken fixture must fail the test loudly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use keel_harness::messages_api::agent::LoopConfig;
use keel_harness::messages_api::backoff::RetryPolicy;
use keel_harness::scripted::{Script, ScriptedHarness};
use keel_harness::{ErrorCategory, Harness, HarnessEvent, HarnessKind, SessionSpec, StopReason};

fn fast() -> LoopConfig {
    LoopConfig {
        retry: RetryPolicy {
            attempts_max: 3,
            base_ms: 5,
            cap_ms: 20,
            retry_after_wait_ms_max: 1_000,
        },
        ..LoopConfig::default()
    }
}

#[tokio::test]
async fn runs_real_tools_in_process() {
    let dir = tempfile::tempdir().unwrap();
    let harness = ScriptedHarness::new(Script::rules()).with_loop_config(fast());
    assert_eq!(harness.kind(), HarnessKind::Scripted);
    let spec = SessionSpec::new(
        "CALL_TOOL: write {\"path\": \"notes/a.md\", \"content\": \"hello\"}",
        "scripted",
        dir.path(),
    );
    let events = harness
        .start(spec)
        .await
        .unwrap()
        .collect(Duration::from_secs(30))
        .await;
    let Some(HarnessEvent::Finished {
        stop_reason: StopReason::EndTurn,
        final_text,
    }) = events.last()
    else {
        panic!("{events:?}")
    };
    assert_eq!(
        final_text,
        "FINAL: tool toolu_scripted_001 returned: wrote 5 bytes to notes/a.md"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("notes/a.md")).unwrap(),
        "hello"
    );
}

#[tokio::test]
async fn scripted_failures_map_to_typed_errors() {
    let dir = tempfile::tempdir().unwrap();
    let script = Script::from_toml_str(
        r#"
        [[turns]]
        failure = { kind = "rate_limited", retry_after_secs = 600, reset_after_secs = 600 }
        "#,
    )
    .unwrap();
    let harness = ScriptedHarness::new(script).with_loop_config(fast());
    let events = harness
        .start(SessionSpec::new("hi", "m", dir.path()))
        .await
        .unwrap()
        .collect(Duration::from_secs(30))
        .await;
    let Some(HarnessEvent::Failed(e)) = events.last() else {
        panic!("{events:?}")
    };
    assert!(matches!(
        e.category,
        ErrorCategory::RateLimited {
            reset_at_unix_ms: Some(_)
        }
    ));

    let script = Script::from_json_str(
        r#"{"turns": [{"failure": {"kind": "hang"}}, {"text": "recovered"}]}"#,
    )
    .unwrap();
    let harness = ScriptedHarness::new(script)
        .with_loop_config(fast())
        .with_stall_ms_max(50);
    let events = harness
        .start(SessionSpec::new("hi", "m", dir.path()))
        .await
        .unwrap()
        .collect(Duration::from_secs(30))
        .await;
    assert!(
        matches!(events.last(), Some(HarnessEvent::Finished { stop_reason: StopReason::EndTurn, final_text }) if final_text == "recovered")
    );
}
