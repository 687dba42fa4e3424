//! The wire protocol: every message round-trips; decoding is total (garbage, truncation, trailing
//! bytes and another protocol version are typed errors, never a panic).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{attempt, start};
use keel_actors::{AttemptResult, SpecialistMsg, SpecialistReply, SubtaskFailure};
use keel_harness::HarnessKind;
use keel_protocol::wire::{self, encode_as_version};
use keel_protocol::{
    NodeName, PROTOCOL_VERSION, PolicyAnswer, PolicyQuestion, PolicyScope, PolicyTerms,
    ToCoordinator, ToWorker, WireError, WorkerStatus,
};
use keel_store::{LogKind, SessionLogRow};
use proptest::prelude::*;

fn name() -> NodeName {
    NodeName::new("worker-1").unwrap()
}

fn samples_to_coordinator(text: &str, n: u32) -> Vec<ToCoordinator> {
    let a = attempt(u128::from(n) + 1, n);
    vec![
        ToCoordinator::Heartbeat(WorkerStatus {
            incarnation: u64::from(n) << 7,
            harnesses: vec![HarnessKind::MessagesApi, HarnessKind::ClaudeCode],
            capacity: n,
            hosting: vec![a],
        }),
        ToCoordinator::Spawned { attempt: a },
        ToCoordinator::Reply {
            from: a,
            reply: SpecialistReply::Logs {
                rows: vec![(
                    n,
                    SessionLogRow {
                        ts_ms: u64::from(n),
                        kind: LogKind::Text,
                        summary: text.into(),
                        detail: text.repeat(2),
                        redactions: Vec::new(),
                    },
                )],
            },
        },
        ToCoordinator::Reply {
            from: a,
            reply: SpecialistReply::Finished(AttemptResult {
                attempt: a,
                outcome: Err(SubtaskFailure {
                    kind: keel_actors::FailureKind::Crashed,
                    attempted: text.into(),
                    partial: Vec::new(),
                    retryable: true,
                    retry_after_ms: Some(5),
                    detail: text.into(),
                }),
                spent_micros: u64::from(n),
            }),
        },
        ToCoordinator::Exited {
            attempt: a,
            normal: n.is_multiple_of(2),
            panicked: n.is_multiple_of(3),
            reason: text.into(),
        },
        ToCoordinator::Policy {
            attempt: a,
            question: u64::from(n) << 3,
            ask: PolicyQuestion::BeforeTool {
                scope: scope(text),
                tool: "Bash".into(),
                input: format!("{{\"command\":{:?}}}", text),
                payload: text.into(),
            },
        },
        ToCoordinator::Policy {
            attempt: a,
            question: u64::MAX - u64::from(n),
            ask: PolicyQuestion::AfterTool {
                scope: scope(text),
                tool: text.into(),
                input: "{}".into(),
                payload: text.repeat(2),
                output: keel_harness::ToolOutput {
                    is_error: n.is_multiple_of(2),
                    text: text.into(),
                },
            },
        },
        ToCoordinator::Policy {
            attempt: a,
            question: 0,
            ask: PolicyQuestion::SessionEvent {
                scope: scope(text),
                event: keel_policy::HookEvent::SubagentStart,
                payload: text.into(),
            },
        },
    ]
}

fn scope(text: &str) -> PolicyScope {
    PolicyScope {
        mode: keel_harness::PermissionMode::default(),
        tools: vec![text.into(), "Bash".into()],
        agent: text.into(),
    }
}

fn samples_to_worker(text: &str, n: u32) -> Vec<ToWorker> {
    let a = attempt(u128::from(n) + 1, n);
    vec![
        ToWorker::Spawn {
            incarnation: u64::from(n),
            start: Box::new(start(a, HarnessKind::MessagesApi, text)),
            policy: None,
        },
        ToWorker::Spawn {
            incarnation: u64::from(n),
            start: Box::new(start(a, HarnessKind::ClaudeCode, text)),
            policy: Some(PolicyTerms {
                decide_ms: u64::from(n),
                post_ms: n.is_multiple_of(2).then_some(u64::from(n) + 1),
                session_events: n.is_multiple_of(3),
            }),
        },
        ToWorker::PolicyAnswer {
            attempt: a,
            question: u64::from(n),
            answer: PolicyAnswer::Decided {
                decision: keel_policy::Decision::Deny,
                reason: text.into(),
                decided_by: "deny-rule".into(),
                context: Some(text.into()),
            },
        },
        ToWorker::PolicyAnswer {
            attempt: a,
            question: 1,
            answer: PolicyAnswer::Output(keel_harness::ToolOutput {
                is_error: false,
                text: text.into(),
            }),
        },
        ToWorker::Specialist {
            attempt: a,
            msg: SpecialistMsg::Ack,
        },
        ToWorker::Specialist {
            attempt: a,
            msg: SpecialistMsg::Cancel {
                reason: text.into(),
            },
        },
        ToWorker::ContextRows {
            attempt: a,
            rows: Err(text.into()),
        },
        ToWorker::ContextRows {
            attempt: a,
            rows: Ok(keel_actors::context::RowSet::default()),
        },
    ]
}

#[test]
fn every_message_round_trips() {
    for m in samples_to_coordinator("a line", 3) {
        let bytes = wire::encode(&name(), &m).unwrap();
        let back = wire::decode::<ToCoordinator>(&bytes).unwrap();
        assert_eq!(back.from, name());
        assert_eq!(back.body, m);
    }
    for m in samples_to_worker("a brief", 4) {
        let bytes = wire::encode(&name(), &m).unwrap();
        assert_eq!(wire::decode::<ToWorker>(&bytes).unwrap().body, m);
    }
}

#[test]
fn another_version_is_refused_as_such() {
    let m = ToCoordinator::Spawned {
        attempt: attempt(1, 1),
    };
    let bytes = encode_as_version(PROTOCOL_VERSION + 1, &name(), &m).unwrap();
    assert_eq!(
        wire::decode::<ToCoordinator>(&bytes),
        Err(WireError::Version {
            got: PROTOCOL_VERSION + 1
        })
    );
    let err = wire::decode::<ToCoordinator>(&bytes)
        .unwrap_err()
        .to_string();
    let got = format!("protocol version {}", PROTOCOL_VERSION + 1);
    assert!(err.contains(&got), "{err}");
}

#[test]
fn truncation_trailing_bytes_and_bad_names_are_typed_errors() {
    let m = ToCoordinator::Spawned {
        attempt: attempt(1, 1),
    };
    let bytes = wire::encode(&name(), &m).unwrap();
    assert_eq!(
        wire::decode::<ToCoordinator>(&bytes[..1]),
        Err(WireError::Truncated { len: 1 })
    );
    assert!(matches!(
        wire::decode::<ToCoordinator>(&bytes[..bytes.len() - 1]),
        Err(WireError::Malformed(_))
    ));
    let mut longer = bytes.clone();
    longer.push(0);
    assert_eq!(
        wire::decode::<ToCoordinator>(&longer),
        Err(WireError::Trailing { extra: 1 })
    );
    // A frame whose sender name is not a node name: refused by the decoder, not accepted raw.
    #[derive(serde::Serialize)]
    struct Forged<'a> {
        from: &'a str,
        body: &'a ToCoordinator,
    }
    let mut forged = PROTOCOL_VERSION.to_be_bytes().to_vec();
    forged.extend(
        bincode::serde::encode_to_vec(
            Forged {
                from: "no spaces allowed",
                body: &m,
            },
            bincode::config::standard(),
        )
        .unwrap(),
    );
    assert!(matches!(
        wire::decode::<ToCoordinator>(&forged),
        Err(WireError::Malformed(_))
    ));
    // A message for the other direction is not misread as one of this direction.
    let other = wire::encode(
        &name(),
        &ToWorker::ContextRows {
            attempt: attempt(1, 1),
            rows: Err("x".into()),
        },
    )
    .unwrap();
    assert!(wire::decode::<ToCoordinator>(&other).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Any bytes after a valid header decode to a message or a typed error, never a panic.
    #[test]
    fn garbage_never_panics(body in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut bytes = PROTOCOL_VERSION.to_be_bytes().to_vec();
        bytes.extend(&body);
        let _ = wire::decode::<ToCoordinator>(&bytes);
        let _ = wire::decode::<ToWorker>(&bytes);
        let _ = wire::decode::<ToWorker>(&body);
    }

    /// Flipping any byte of a real message gives a message or a typed error, never a panic.
    #[test]
    fn corrupted_messages_never_panic(text in "\\PC{0,40}", n in 0u32..1000, at in any::<usize>(), flip in 1u8..=255) {
        for m in samples_to_worker(&text, n) {
            let mut bytes = wire::encode(&name(), &m).unwrap();
            let i = at % bytes.len();
            bytes[i] ^= flip;
            let _ = wire::decode::<ToWorker>(&bytes);
        }
        for m in samples_to_coordinator(&text, n) {
            let mut bytes = wire::encode(&name(), &m).unwrap();
            let i = at % bytes.len();
            bytes[i] ^= flip;
            let _ = wire::decode::<ToCoordinator>(&bytes);
        }
    }

    /// Every message round-trips whatever its text and numbers.
    #[test]
    fn round_trips(text in "\\PC{0,80}", n in any::<u32>()) {
        for m in samples_to_coordinator(&text, n) {
            let bytes = wire::encode(&name(), &m).unwrap();
            prop_assert_eq!(wire::decode::<ToCoordinator>(&bytes).unwrap().body, m);
        }
        for m in samples_to_worker(&text, n) {
            let bytes = wire::encode(&name(), &m).unwrap();
            prop_assert_eq!(wire::decode::<ToWorker>(&bytes).unwrap().body, m);
        }
    }
}

/// A frame is the version header, then the sender's name as a string and the body, in bincode's
/// standard configuration: the bytes every earlier keel of this version wrote and reads.
#[test]
fn a_frame_is_the_header_then_the_name_as_a_string_then_the_body() {
    let body = ToCoordinator::Spawned {
        attempt: attempt(7, 3),
    };
    let mut expected = PROTOCOL_VERSION.to_be_bytes().to_vec();
    expected.extend(
        bincode::serde::encode_to_vec(("worker-1".to_string(), &body), bincode::config::standard())
            .unwrap(),
    );
    assert_eq!(wire::encode(&name(), &body).unwrap(), expected);
}
