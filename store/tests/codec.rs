//! The codec: round trips of every record type, typed errors for rows from the future and garbage,
//! and checked-in fixtures of schema version 1 that must decode forever.
//!
//! To (re)write the fixtures after adding a record type: `KEEL_BLESS_FIXTURES=1 cargo test -p
//! keel-store --test codec`. Never re-bless an existing fixture to make a failing decode pass: that
//! failure means rows already on users' disks would no longer read.

#![allow(clippy::unwrap_used)]

use keel_store::codec::{Record, SCHEMA_VERSION, decode, encode};
use keel_store::*;
use proptest::prelude::*;
use std::fmt::Debug;
use std::path::PathBuf;

fn sample_task() -> Task {
    Task {
        id: TaskId(0x0191_0000_0000_0000_0000_0000_0000_0002),
        run_id: RunId(0x0191_0000_0000_0000_0000_0000_0000_0001),
        parent: Some(TaskId(0x0191_0000_0000_0000_0000_0000_0000_0003)),
        depth: 1,
        kind: TaskKind::Review,
        brief: "review the diff in /srv/example/repo".into(),
        goal: "find defects".into(),
        quality_criteria: vec!["each finding cites a line".into(), "no style nits".into()],
        output_schema: Some("{\"type\":\"object\"}".into()),
        assignee: Some("reviewer".into()),
        model: Some("model-b".into()),
        observed: Some(ObservedSession {
            harness: "codex".into(),
            account: "acct-1".into(),
            native_session_id: "sess-123".into(),
        }),
        status: TaskStatus::Partial,
        attempt: 2,
        idempotency_key: Some("review-7".into()),
        outcome: Some("two findings, one gap".into()),
        attachments: vec![
            Attachment {
                name: "notes.md".into(),
                body: AttachmentBody::Inline("short".into()),
            },
            Attachment {
                name: "full.log".into(),
                body: AttachmentBody::Blob {
                    key: 7,
                    len: 90_000,
                },
            },
        ],
        progress_notes: vec!["read 3 files".into()],
        created_ms: 1_700_000_000_000,
        updated_ms: 1_700_000_100_000,
    }
}

fn sample_run() -> Run {
    Run {
        id: RunId(0x0191_0000_0000_0000_0000_0000_0000_0001),
        brief: "audit the repository".into(),
        plan: Some("steps: [a, b]".into()),
        status: RunStatus::BudgetExceeded,
        budget: Budget {
            limit_micros: Some(10_000_000),
            reserved_micros: 250_000,
            spent_micros: 9_900_000,
        },
        created_ms: 1_700_000_000_000,
        updated_ms: 1_700_000_500_000,
        config_snapshot: "agents v3".into(),
        outcome: Some("budget tripped".into()),
    }
}

fn sample_log_row() -> SessionLogRow {
    SessionLogRow {
        ts_ms: 1_700_000_000_123,
        kind: LogKind::ToolUse,
        summary: "Read src/lib.rs".into(),
        detail: "{\"path\":\"src/lib.rs\"}".into(),
        redactions: Vec::new(),
    }
}

fn sample_checkpoint() -> Checkpoint {
    Checkpoint {
        run_id: RunId(0x0191_0000_0000_0000_0000_0000_0000_0001),
        last_completed_step: Some("gather".into()),
        verified_outputs: vec![TaskId(2), TaskId(3)],
        pending_work: vec![TaskId(4)],
        correlation_id: "corr-9".into(),
        state: "{\"phase\":\"synthesis\"}".into(),
        written_ms: 1_700_000_200_000,
    }
}

fn sample_manifest() -> Vec<ManifestEntry> {
    vec![
        ManifestEntry {
            ts_ms: 1,
            item: "file a".into(),
            task_id: Some(TaskId(2)),
            outcome: ManifestOutcome::Processed,
        },
        ManifestEntry {
            ts_ms: 2,
            item: "file b".into(),
            task_id: None,
            outcome: ManifestOutcome::Failed {
                reason: "429".into(),
            },
        },
        ManifestEntry {
            ts_ms: 3,
            item: "file b".into(),
            task_id: Some(TaskId(5)),
            outcome: ManifestOutcome::Retried { attempt: 2 },
        },
    ]
}

fn sample_dead_letter() -> DeadLetter {
    DeadLetter {
        ts_ms: 9,
        task_id: Some(TaskId(4)),
        subject: "report to coordinator".into(),
        payload: "{\"status\":\"complete\"}".into(),
        reason: "node unreachable after 5 attempts".into(),
        attempts: 5,
    }
}

fn sample_idempotency() -> IdempotencyRecord {
    IdempotencyRecord {
        key: "charge-42".into(),
        ts_ms: 10,
        task_id: Some(TaskId(4)),
        effect: "charge card".into(),
        result: Some("ok".into()),
    }
}

fn sample_audit() -> Vec<AuditEntry> {
    [
        HookDecision::Allow,
        HookDecision::Deny,
        HookDecision::Ask,
        HookDecision::Defer,
        HookDecision::Error,
    ]
    .into_iter()
    .enumerate()
    .map(|(i, decision)| AuditEntry {
        ts_ms: 11 + i as u64,
        task_id: Some(TaskId(4)),
        hook: "pre-tool".into(),
        tool: "Bash".into(),
        decision,
        reason: format!("reason {i}"),
        input_digest: "d41d8cd9".into(),
        rewritten: i % 2 == 0,
    })
    .collect()
}

/// The escalation of the version 1 fixture, as this build reads it (no id, waits for nothing).
fn sample_escalation() -> Escalation {
    Escalation {
        id: EscalationId(0),
        ts_ms: 12,
        task_id: Some(TaskId(4)),
        trigger: EscalationTrigger::HumanRequested,
        account: "acct-1".into(),
        asked: "refund order 9".into(),
        attempted: "looked up the order".into(),
        diagnosis: "refund above the cap".into(),
        amount_micros: Some(150_000_000),
        recommended_action: "approve the refund".into(),
        options: Vec::new(),
        waiting: EscalationWait::Nothing,
        resolution: None,
    }
}

fn sample_agent() -> AgentProfile {
    AgentProfile {
        name: "researcher".into(),
        description: "reads and cites".into(),
        harness: "claude-code".into(),
        model: "model-a".into(),
        account: "acct-1".into(),
        tools: vec!["Read".into(), "Grep".into()],
        system_prompt: "cite every claim".into(),
        limits: AgentLimits {
            turns_max: 40,
            tokens_max: 400_000,
            timeout_ms: 900_000,
            spend_micros_max: Some(2_000_000),
        },
    }
}

fn fixture_path(version: u8, name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join(format!("tests/fixtures/v{version}"))
        .join(format!("{name}.bin"))
}

/// Decodes the checked-in fixture `name` of schema version 1 and compares it with `expected`.
fn check_fixture<T: Record + PartialEq + Debug>(name: &'static str, expected: &T) {
    check_fixture_of(1, name, expected);
}

/// Decodes the checked-in fixture `name` written by schema `version` and compares it with `expected`.
/// With KEEL_BLESS_FIXTURES=1 writes a missing fixture of the current version first (only for a new
/// record type or a new schema version).
fn check_fixture_of<T: Record + PartialEq + Debug>(version: u8, name: &'static str, expected: &T) {
    let path = fixture_path(version, name);
    if std::env::var_os("KEEL_BLESS_FIXTURES").is_some()
        && !path.exists()
        && version == SCHEMA_VERSION
    {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, encode(name, expected).unwrap()).unwrap();
    }
    let bytes = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "missing fixture {}: {e}; write it with KEEL_BLESS_FIXTURES=1",
            path.display()
        )
    });
    assert_eq!(
        bytes[0], version,
        "fixture {name} was written by schema version {version}"
    );
    let decoded: T = decode(name, &"fixture", &bytes)
        .unwrap_or_else(|e| panic!("fixture {name} no longer decodes: {e}"));
    assert_eq!(
        &decoded, expected,
        "fixture {name} decodes to another value"
    );
}

/// Version 2: a session log row records what the scrubber removed from it (issue 16). Its version 1
/// fixture above still decodes, with no redactions.
#[test]
fn version_2_fixtures_still_decode() {
    let mut row = sample_log_row();
    row.summary = "Bash cat .env: [REDACTED:anthropic-key]".into();
    row.redactions = vec![
        Redaction {
            kind: SecretKind::AnthropicKey,
            count: 1,
        },
        Redaction {
            kind: SecretKind::UrlPassword,
            count: 2,
        },
    ];
    check_fixture_of(2, "session_log_row", &row);
}

/// Version 3: an escalation has an id, options, what waits for it and its resolution.
#[test]
fn version_3_fixtures_still_decode() {
    let mut e = sample_escalation();
    e.id = EscalationId(0x0191_0000_0000_0000_0000_0000_0000_0042);
    e.options = vec!["allow".into(), "deny".into()];
    e.waiting = EscalationWait::ToolCall {
        tool: "Pay".into(),
        deadline_ms: 99,
    };
    e.resolution = Some(EscalationResolution::Answered {
        ts_ms: 50,
        text: "allow".into(),
    });
    check_fixture_of(3, "escalation", &e);
}

#[test]
fn version_1_fixtures_still_decode() {
    check_fixture("run", &sample_run());
    check_fixture("task", &sample_task());
    check_fixture("session_log_row", &sample_log_row());
    check_fixture("checkpoint", &sample_checkpoint());
    check_fixture("manifest_entries", &sample_manifest());
    check_fixture("dead_letter", &sample_dead_letter());
    check_fixture("idempotency_record", &sample_idempotency());
    check_fixture("audit_entries", &sample_audit());
    check_fixture("escalation", &sample_escalation());
    check_fixture("agent_profile", &sample_agent());
}

#[test]
fn a_version_byte_from_the_future_is_schema_from_future() {
    let mut bytes = encode("tasks", &sample_task()).unwrap();
    bytes[0] = SCHEMA_VERSION + 1;
    match decode::<Task>("tasks", &"run/task", &bytes) {
        Err(DecodeError::SchemaFromFuture {
            table,
            key,
            version,
            supported,
        }) => {
            assert_eq!(table, "tasks");
            assert_eq!(key, "run/task");
            assert_eq!(version, SCHEMA_VERSION + 1);
            assert_eq!(supported, SCHEMA_VERSION);
        }
        other => panic!("expected SchemaFromFuture, got {other:?}"),
    }
}

#[test]
fn garbage_is_corrupt_naming_table_and_key() {
    let cases: [&[u8]; 4] = [&[], &[0, 1, 2], &[1, 0xff, 0xff, 0xff, 0xff], &[1]];
    for bytes in cases {
        match decode::<Task>("tasks", &"R/T", bytes) {
            Err(DecodeError::Corrupt { table, key, .. }) => {
                assert_eq!((table, key.as_str()), ("tasks", "R/T"));
            }
            other => panic!("expected Corrupt for {bytes:?}, got {other:?}"),
        }
    }
    // Trailing bytes after a valid value are corruption too (a row is exactly one value).
    let mut bytes = encode("session_logs", &sample_log_row()).unwrap();
    bytes.push(0);
    assert!(matches!(
        decode::<SessionLogRow>("session_logs", &"k", &bytes),
        Err(DecodeError::Corrupt { .. })
    ));
}

fn text() -> impl Strategy<Value = String> {
    ".{0,24}"
}

fn opt_task() -> impl Strategy<Value = Option<TaskId>> {
    proptest::option::of(any::<u128>().prop_map(TaskId))
}

fn arb_task() -> impl Strategy<Value = Task> {
    (
        (any::<u128>(), any::<u128>(), opt_task(), any::<u8>()),
        (text(), text(), proptest::collection::vec(text(), 0..3)),
        (
            proptest::option::of(text()),
            proptest::option::of(text()),
            proptest::option::of((text(), text(), text())),
        ),
        (
            any::<u32>(),
            proptest::option::of(text()),
            any::<u64>(),
            any::<u64>(),
        ),
        proptest::collection::vec(
            (
                text(),
                prop_oneof![
                    text().prop_map(AttachmentBody::Inline),
                    (any::<u128>(), any::<u64>())
                        .prop_map(|(key, len)| AttachmentBody::Blob { key, len })
                ],
            ),
            0..3,
        ),
    )
        .prop_map(
            |(
                (id, run, parent, depth),
                (brief, goal, criteria),
                (schema, model, observed),
                (attempt, outcome, c, u),
                atts,
            )| Task {
                id: TaskId(id),
                run_id: RunId(run),
                parent,
                depth,
                kind: TaskKind::FollowUp,
                brief,
                goal,
                quality_criteria: criteria,
                output_schema: schema,
                assignee: model.clone(),
                model,
                observed: observed.map(|(harness, account, native_session_id)| ObservedSession {
                    harness,
                    account,
                    native_session_id,
                }),
                status: TaskStatus::Blocked,
                attempt,
                idempotency_key: outcome.clone(),
                outcome,
                attachments: atts
                    .into_iter()
                    .map(|(name, body)| Attachment { name, body })
                    .collect(),
                progress_notes: vec![],
                created_ms: c,
                updated_ms: u,
            },
        )
}

fn round_trip<T: Record + PartialEq + Debug>(v: &T) -> Result<(), TestCaseError> {
    let bytes = encode("t", v).unwrap();
    prop_assert_eq!(bytes[0], SCHEMA_VERSION);
    let back: T = decode("t", &"k", &bytes).unwrap();
    prop_assert_eq!(&back, v);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn tasks_round_trip(t in arb_task()) {
        round_trip(&t)?;
    }

    #[test]
    fn log_rows_and_runs_round_trip(
        ts in any::<u64>(), summary in text(), detail in text(),
        id in any::<u128>(), brief in text(), limit in proptest::option::of(any::<u64>()),
        reserved in any::<u64>(), spent in any::<u64>(),
    ) {
        round_trip(&SessionLogRow { ts_ms: ts, kind: LogKind::Steering, summary, detail, redactions: Vec::new() })?;
        round_trip(&Run {
            id: RunId(id), brief, plan: None, status: RunStatus::Paused,
            budget: Budget { limit_micros: limit, reserved_micros: reserved, spent_micros: spent },
            created_ms: ts, updated_ms: ts, config_snapshot: String::new(), outcome: None,
        })?;
    }

    #[test]
    fn records_round_trip(
        ts in any::<u64>(), a in text(), b in text(), c in text(), n in any::<u32>(),
        task in opt_task(), amount in proptest::option::of(any::<u64>()),
        ids in proptest::collection::vec(any::<u128>().prop_map(TaskId), 0..4),
    ) {
        round_trip(&Checkpoint {
            run_id: RunId(u128::from(ts)), last_completed_step: Some(a.clone()),
            verified_outputs: ids.clone(), pending_work: ids, correlation_id: b.clone(),
            state: c.clone(), written_ms: ts,
        })?;
        round_trip(&ManifestEntry { ts_ms: ts, item: a.clone(), task_id: task, outcome: ManifestOutcome::Failed { reason: b.clone() } })?;
        round_trip(&DeadLetter { ts_ms: ts, task_id: task, subject: a.clone(), payload: b.clone(), reason: c.clone(), attempts: n })?;
        round_trip(&IdempotencyRecord { key: a.clone(), ts_ms: ts, task_id: task, effect: b.clone(), result: Some(c.clone()) })?;
        round_trip(&AuditEntry { ts_ms: ts, task_id: task, hook: a.clone(), tool: b.clone(), decision: HookDecision::Defer, reason: c.clone(), input_digest: a.clone(), rewritten: true })?;
        round_trip(&Escalation { id: EscalationId(u128::from(ts)), ts_ms: ts, task_id: task, trigger: EscalationTrigger::NoProgress, account: a.clone(), asked: b.clone(), attempted: c.clone(), diagnosis: a.clone(), amount_micros: amount, recommended_action: b.clone(), options: vec![c.clone()], waiting: EscalationWait::Task, resolution: Some(EscalationResolution::Expired { ts_ms: ts }) })?;
        round_trip(&AgentProfile { name: a.clone(), description: b.clone(), harness: c.clone(), model: a.clone(), account: b, tools: vec![c.clone()], system_prompt: c, limits: AgentLimits { turns_max: n, tokens_max: ts, timeout_ms: ts, spend_micros_max: amount } })?;
    }

    /// Any bytes at all decode to a value or a typed error; never a panic.
    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..64)) {
        let _ = decode::<Task>("tasks", &"k", &bytes);
        let _ = decode::<Run>("runs", &"k", &bytes);
        let _ = decode::<SessionLogRow>("session_logs", &"k", &bytes);
    }
}
