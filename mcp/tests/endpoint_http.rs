//! The endpoint over real HTTP on 127.0.0.1, called by keel's own MCP client (the one keel's agent
//! loop uses): tokens scope every call to one attempt, an ended session's token is refused, and bad
//! arguments are MCP errors naming the field that deliver nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use keel_actors::AttemptId;
use keel_actors::session_tool::{
    DeliverToolCall, SESSION_TOOLS, SessionAnswer, SessionEndpoint, SessionRequest,
    SessionToolCall, ToolRefusal,
};
use keel_harness::tools::mcp::{McpClient, McpError};
use keel_mcp::{EndpointConfig, McpEndpoint};
use keel_store::{RunId, TaskId};
use serde_json::json;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;

fn attempt(run: u128, task: u128) -> AttemptId {
    AttemptId {
        run: RunId(run),
        task: TaskId(task),
        attempt: 1,
    }
}

/// Calls delivered to one attempt, in order, and a channel the test answers them from.
type Delivered = Arc<Mutex<Vec<SessionToolCall>>>;

fn recorder(
    tx: mpsc::UnboundedSender<(AttemptId, SessionToolCall)>,
    a: AttemptId,
) -> (DeliverToolCall, Delivered) {
    let seen: Delivered = Arc::default();
    let log = Arc::clone(&seen);
    let deliver: DeliverToolCall = Box::new(move |call| {
        log.lock().unwrap().push(call.clone());
        tx.send((a, call)).is_ok()
    });
    (deliver, seen)
}

/// Answers every delivered call the way the attempt's coordinator would for a run that holds only
/// `own_tasks`: a task outside them is not in the session's thread.
fn answer_as_coordinators(
    endpoint: Arc<McpEndpoint>,
    mut rx: mpsc::UnboundedReceiver<(AttemptId, SessionToolCall)>,
    own_tasks: Vec<(RunId, TaskId)>,
) {
    tokio::spawn(async move {
        while let Some((a, call)) = rx.recv().await {
            let answer = match call.request {
                SessionRequest::GetTaskDetails { task } if !own_tasks.contains(&(a.run, task)) => {
                    SessionAnswer::Refused(ToolRefusal::NotInThread { task })
                }
                SessionRequest::ReportProgress { note } => SessionAnswer::Recorded {
                    what: format!("note {note}"),
                },
                _ => SessionAnswer::Recorded {
                    what: "other".into(),
                },
            };
            endpoint.answer(a, &call.call_id, answer);
        }
    });
}

async fn client(endpoint: &McpEndpoint, token: Option<String>) -> Result<McpClient, McpError> {
    let http = keel_harness::messages_api::http::model_client().expect("the HTTP client");
    McpClient::connect(http, endpoint.url(), token).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_lists_the_five_tools_and_its_call_reaches_its_own_attempt_only() {
    let endpoint = Arc::new(McpEndpoint::start(EndpointConfig::default()).await.unwrap());
    let (tx, rx) = mpsc::unbounded_channel();
    let a = attempt(0xA, 0xA1);
    let b = attempt(0xB, 0xB1);
    let (deliver_a, seen_a) = recorder(tx.clone(), a);
    let (deliver_b, seen_b) = recorder(tx, b);
    let access_a = endpoint.open(a, deliver_a).unwrap();
    let access_b = endpoint.open(b, deliver_b).unwrap();
    assert_ne!(access_a.token, access_b.token);
    answer_as_coordinators(
        Arc::clone(&endpoint),
        rx,
        vec![(a.run, a.task), (b.run, b.task)],
    );

    let session = client(&endpoint, Some(access_a.token.clone()))
        .await
        .unwrap();
    let names: Vec<String> = session
        .list_tools()
        .await
        .unwrap()
        .into_iter()
        .map(|t| t.name)
        .collect();
    assert_eq!(names, SESSION_TOOLS.to_vec());
    let (text, is_error) = session
        .call_tool("report_progress", json!({"note": "half way"}))
        .await
        .unwrap();
    assert!(!is_error, "{text}");
    assert_eq!(text, "recorded: note half way");

    // Run A's token asks for run B's task: the call is A's (scope from the token, never from the
    // arguments), and A's coordinator does not know B's task.
    let (text, is_error) = session
        .call_tool("get_task_details", json!({"task_id": b.task.to_string()}))
        .await
        .unwrap();
    assert!(is_error, "{text}");
    assert!(
        text.contains("not a task of this session's thread"),
        "{text}"
    );
    assert_eq!(seen_a.lock().unwrap().len(), 2);
    assert!(
        seen_b.lock().unwrap().is_empty(),
        "nothing of A's session reached B"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_sessions_token_is_refused_and_its_waiting_call_is_answered() {
    let endpoint = Arc::new(McpEndpoint::start(EndpointConfig::default()).await.unwrap());
    let (tx, mut rx) = mpsc::unbounded_channel();
    let a = attempt(0xA, 0xA1);
    let (deliver, _seen) = recorder(tx, a);
    let access = endpoint.open(a, deliver).unwrap();
    let session = Arc::new(client(&endpoint, Some(access.token.clone())).await.unwrap());

    // A call that nobody answers, then the session ends: the call gets "ended", never hangs.
    let waiting = {
        let session = Arc::clone(&session);
        tokio::spawn(async move {
            session
                .call_tool("report_progress", json!({"note": "x"}))
                .await
        })
    };
    let delivered = rx.recv().await.expect("the call was delivered");
    assert_eq!(delivered.0, a);
    endpoint.close(a);
    let (text, is_error) = waiting.await.unwrap().unwrap();
    assert!(is_error);
    assert!(text.contains("ended"), "{text}");

    // The token is revoked: every later request is refused before MCP sees it.
    match session
        .call_tool("report_progress", json!({"note": "late"}))
        .await
    {
        Err(McpError::Transport(e)) => assert!(e.contains("401"), "{e}"),
        other => panic!("a revoked token is refused: {other:?}"),
    }
    match client(&endpoint, Some(access.token)).await {
        Err(McpError::Transport(e)) => assert!(e.contains("401"), "{e}"),
        other => panic!("a revoked token cannot connect: {other:?}"),
    }
    assert!(
        rx.try_recv().is_err(),
        "nothing of the ended session was delivered"
    );
    assert_eq!(endpoint.registry().open_count(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_a_valid_token_are_refused() {
    let endpoint = McpEndpoint::start(EndpointConfig::default()).await.unwrap();
    for token in [None, Some("0".repeat(64))] {
        match client(&endpoint, token).await {
            Err(McpError::Transport(e)) => assert!(e.contains("401"), "{e}"),
            other => panic!("refused: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_arguments_are_mcp_errors_naming_the_field_and_deliver_nothing() {
    let endpoint = Arc::new(McpEndpoint::start(EndpointConfig::default()).await.unwrap());
    let (tx, _rx) = mpsc::unbounded_channel();
    let a = attempt(0xA, 0xA1);
    let (deliver, seen) = recorder(tx, a);
    let access = endpoint.open(a, deliver).unwrap();
    let session = client(&endpoint, Some(access.token)).await.unwrap();
    let cases = [
        ("report_progress", json!({}), "`note`"),
        ("report_progress", json!({"note": 7}), "`note`"),
        ("report_progress", json!({"note": "   "}), "`note`"),
        (
            "get_task_details",
            json!({"task_id": "not-a-ulid"}),
            "`task_id`",
        ),
        (
            "report_findings",
            json!({"findings": [{"claim": "c"}]}),
            "`findings[0].source`",
        ),
        (
            "report_findings",
            json!({"findings": [{"claim": "c", "source": "s", "confidence_permille": 1001}]}),
            "`findings[0].confidence_permille`",
        ),
        ("delegate", json!({"subtasks": []}), "`subtasks`"),
        (
            "delegate",
            json!({"subtasks": [{"brief": "a"}, {"brief": ""}]}),
            "`subtasks[1].brief`",
        ),
        (
            "delegate",
            json!({"subtasks": [{"brief": "a", "id": "x"}, {"brief": "b", "id": "x"}]}),
            "`subtasks[1].id`",
        ),
        ("escalate", json!({"reason": "r"}), "`question`"),
        ("no_such_tool", json!({}), "`name`"),
    ];
    for (tool, args, field) in cases {
        match session.call_tool(tool, args.clone()).await {
            Err(McpError::Rpc { code, message }) => {
                assert_eq!(code, -32602, "{tool} {args}: {message}");
                assert!(
                    message.contains(field),
                    "{tool} {args}: {message} names {field}"
                );
            }
            other => panic!("{tool} {args}: an MCP error, not {other:?}"),
        }
    }
    assert!(
        seen.lock().unwrap().is_empty(),
        "no malformed call reached the specialist"
    );
}
