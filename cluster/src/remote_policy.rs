//! The policy of sessions hosted on workers (docs/DESIGN.md §9, §10): the coordinator node's
//! keel.toml is authoritative, its [`PolicyHost`] decides, and its store holds the audit rows.
//!
//! - Worker side, [`RemotePolicy`]: the [`PolicyDecider`] a worker's in-process guard and `keel
//!   hook` bridge ask. Each question crosses to the coordinator as [`ToCoordinator::Policy`] with an
//!   id minted here, and waits for the [`ToWorker::PolicyAnswer`] of that attempt and id. It fails
//!   closed: no coordinator reachable, the connection lost while waiting, no answer within the
//!   coordinator's own decision time plus [`WIRE_MARGIN_MS`], or the attempt ending first, and the
//!   call is denied (a result is withheld, a session event vetoed). A late answer finds no waiter
//!   and is dropped. A session is gated when its spawn carried the coordinator's policy terms, so a
//!   worker's own keel.toml neither adds nor removes a gate.
//! - Coordinator side, [`answer`]: a question is answered by [`PolicyHost`] (hooks, chain, gates,
//!   durable audit rows, an approval for an ask), only for an attempt the coordinator placed on the
//!   worker that asks.

use crate::name::{COORDINATOR_GROUP, NodeName};
use crate::wire::{self, PolicyAnswer, PolicyQuestion, PolicyScope, PolicyTerms, ToCoordinator};
use keel_actors::AttemptId;
use keel_actors::runtime::{
    EventAnswer, GateTimes, PolicyDecider, PolicyFuture, PolicyHost, ToolAnswer, ToolScope,
};
use keel_harness::ToolOutput;
use keel_policy::{Decision, HookEvent, ToolCall};
use serde_json::Value;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::oneshot;

use crate::worker::lock;

/// Time a worker waits beyond the coordinator's own decision time: the round trip and the
/// coordinator's scheduling. Its gate commands wait this much longer too.
pub const WIRE_MARGIN_MS: u64 = 3_000;

/// How often a waiting question checks that the coordinator is still connected.
const CONNECTION_CHECK: Duration = Duration::from_millis(250);

/// Who decides "keel" denials (the node could not get a decision).
const KEEL: &str = "keel";

/// The terms a coordinator's policy gives its spawns.
pub fn terms_of(host: &PolicyHost) -> PolicyTerms {
    let times = GateTimes::of(host.policy());
    PolicyTerms {
        decide_ms: times.decide_ms,
        post_ms: times.post_ms,
        session_events: times.session_events,
    }
}

/// A worker's policy: every question goes to the coordinator node. Shared by the worker endpoint
/// (which records each spawn's terms and hands answers in) and the sessions' guards and bridge.
#[derive(Debug)]
pub struct RemotePolicy {
    name: NodeName,
    next: AtomicU64,
    /// Each hosted attempt's coordinator policy terms (only gated attempts are here).
    terms: Mutex<BTreeMap<AttemptId, PolicyTerms>>,
    /// Questions waiting for their answer, by attempt and id: whoever removes one first (the
    /// answer, the timeout, the attempt's end) settles it.
    waiting: Mutex<BTreeMap<(AttemptId, u64), oneshot::Sender<PolicyAnswer>>>,
}

impl RemotePolicy {
    /// The remote policy of worker `name`.
    pub fn new(name: NodeName) -> RemotePolicy {
        RemotePolicy {
            name,
            next: AtomicU64::new(1),
            terms: Mutex::new(BTreeMap::new()),
            waiting: Mutex::new(BTreeMap::new()),
        }
    }

    /// `attempt` starts here; `terms` are its spawn's (`None`: the coordinator has no policy).
    pub(crate) fn hosting(&self, attempt: AttemptId, terms: Option<PolicyTerms>) {
        let mut all = lock(&self.terms);
        match terms {
            Some(t) => all.insert(attempt, t),
            None => all.remove(&attempt),
        };
    }

    /// `attempt` ended here: its questions still waiting are denied (their senders dropped).
    pub(crate) fn ended(&self, attempt: AttemptId) {
        lock(&self.terms).remove(&attempt);
        lock(&self.waiting).retain(|(a, _), _| *a != attempt);
    }

    /// The coordinator answered question `question` of `attempt`; an answer nobody waits for (it
    /// came after the timeout, or for an attempt that ended) is dropped.
    pub(crate) fn answered(&self, attempt: AttemptId, question: u64, answer: PolicyAnswer) {
        match lock(&self.waiting).remove(&(attempt, question)) {
            Some(waiter) => {
                let _ = waiter.send(answer);
            }
            None => {
                tracing::debug!(%attempt, question, "a late policy answer was ignored");
            }
        }
    }

    /// How long a question of `attempt` waits: the coordinator's decision time (`post` for a
    /// result) plus the wire's margin.
    fn wait_of(&self, attempt: AttemptId, post: bool) -> Duration {
        let terms = lock(&self.terms).get(&attempt).copied();
        let ms = match terms {
            Some(t) if post => t.post_ms.unwrap_or(t.decide_ms),
            Some(t) => t.decide_ms,
            // Not gated (asked anyway): as long as an ungated question can take.
            None => 0,
        };
        Duration::from_millis(ms + WIRE_MARGIN_MS)
    }

    /// Ask the coordinator; its answer, or why there is none (the caller denies).
    async fn ask(
        &self,
        attempt: AttemptId,
        ask: PolicyQuestion,
        wait: Duration,
    ) -> Result<PolicyAnswer, String> {
        let question = self.next.fetch_add(1, Ordering::Relaxed);
        let (tx, mut rx) = oneshot::channel();
        lock(&self.waiting).insert((attempt, question), tx);
        let forget = || {
            lock(&self.waiting).remove(&(attempt, question));
        };
        let sent = wire::cast_to_group(
            COORDINATOR_GROUP,
            &self.name,
            &ToCoordinator::Policy {
                attempt,
                question,
                ask,
            },
        );
        if !sent {
            forget();
            return Err("the coordinator node is not reachable".into());
        }
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            tokio::select! {
                answer = &mut rx => {
                    return answer.map_err(|_| "the attempt ended before the coordinator node answered".into());
                }
                () = tokio::time::sleep(CONNECTION_CHECK) => {
                    if ractor::pg::get_members(&COORDINATOR_GROUP.to_string()).is_empty() {
                        forget();
                        return Err("the connection to the coordinator node was lost".into());
                    }
                    if tokio::time::Instant::now() >= deadline {
                        forget();
                        return Err(format!("no answer from the coordinator node within {wait:?}"));
                    }
                }
            }
        }
    }
}

/// A decision, its reason, who decided and the hooks' notes.
type Decided = (Decision, String, String, Option<String>);

impl RemotePolicy {
    /// Ask a question whose answer is a decision: `Allow`, or `Deny` (an ask that comes back
    /// undecided is a denial); `Err` with why there is none (the caller denies).
    async fn ask_decision(
        &self,
        attempt: AttemptId,
        ask: PolicyQuestion,
    ) -> Result<Decided, String> {
        match self.ask(attempt, ask, self.wait_of(attempt, false)).await? {
            PolicyAnswer::Decided {
                decision,
                reason,
                decided_by,
                context,
            } => {
                let decision = if decision == Decision::Allow {
                    Decision::Allow
                } else {
                    Decision::Deny
                };
                Ok((decision, reason, decided_by, context))
            }
            PolicyAnswer::Output(_) => Err("the coordinator node answered another question".into()),
        }
    }
}

/// A result the model does not get, and why.
fn withheld(why: &str) -> ToolOutput {
    ToolOutput {
        is_error: true,
        text: format!("keel: {why}; the result is withheld"),
    }
}

fn scope_of(scope: &ToolScope) -> PolicyScope {
    PolicyScope {
        mode: scope.mode,
        tools: scope.tools.clone(),
        agent: scope.agent.clone(),
    }
}

impl PolicyDecider for RemotePolicy {
    fn gate_times(&self, attempt: AttemptId) -> Option<GateTimes> {
        let terms = lock(&self.terms).get(&attempt).copied()?;
        Some(GateTimes {
            decide_ms: terms.decide_ms + WIRE_MARGIN_MS,
            post_ms: terms.post_ms.map(|ms| ms + WIRE_MARGIN_MS),
            session_events: terms.session_events,
        })
    }

    fn before_tool<'a>(
        &'a self,
        scope: &'a ToolScope,
        call: &'a ToolCall,
        payload: Value,
    ) -> PolicyFuture<'a, ToolAnswer> {
        Box::pin(async move {
            let attempt = scope.attempt;
            let ask = PolicyQuestion::BeforeTool {
                scope: scope_of(scope),
                tool: call.tool.clone(),
                input: call.input.to_string(),
                payload: payload.to_string(),
            };
            match self.ask_decision(attempt, ask).await {
                Ok((decision, reason, decided_by, _)) => ToolAnswer {
                    decision,
                    reason,
                    decided_by,
                },
                Err(e) => {
                    tracing::warn!(%attempt, tool = %call.tool, error = %e, "a tool call denied: no decision from the coordinator node");
                    ToolAnswer {
                        decision: Decision::Deny,
                        reason: format!("keel: {e}, so the call is denied"),
                        decided_by: KEEL.into(),
                    }
                }
            }
        })
    }

    fn after_tool<'a>(
        &'a self,
        scope: &'a ToolScope,
        call: &'a ToolCall,
        payload: Value,
        output: ToolOutput,
    ) -> PolicyFuture<'a, ToolOutput> {
        Box::pin(async move {
            let attempt = scope.attempt;
            let ask = PolicyQuestion::AfterTool {
                scope: scope_of(scope),
                tool: call.tool.clone(),
                input: call.input.to_string(),
                payload: payload.to_string(),
                output,
            };
            match self.ask(attempt, ask, self.wait_of(attempt, true)).await {
                Ok(PolicyAnswer::Output(result)) => result,
                Ok(PolicyAnswer::Decided { .. }) => {
                    withheld("the coordinator node answered another question")
                }
                Err(e) => withheld(&e),
            }
        })
    }

    fn on_session_event<'a>(
        &'a self,
        scope: &'a ToolScope,
        event: HookEvent,
        payload: Value,
    ) -> PolicyFuture<'a, EventAnswer> {
        Box::pin(async move {
            let attempt = scope.attempt;
            let ask = PolicyQuestion::SessionEvent {
                scope: scope_of(scope),
                event,
                payload: payload.to_string(),
            };
            match self.ask_decision(attempt, ask).await {
                Ok((decision, reason, decided_by, context)) => EventAnswer {
                    decision,
                    reason,
                    context,
                    decided_by,
                },
                Err(e) => EventAnswer {
                    decision: Decision::Deny,
                    reason: format!("keel: {e}, so the {} is refused", event.as_str()),
                    context: None,
                    decided_by: KEEL.into(),
                },
            }
        })
    }
}

/// The coordinator's answer to `ask` from `attempt`'s session, decided by `host` (`None`: this
/// coordinator has no policy). `placed_there`: the attempt is placed on the worker that asks;
/// otherwise the question is denied unread.
pub(crate) async fn answer(
    host: Option<PolicyHost>,
    placed_there: bool,
    attempt: AttemptId,
    ask: PolicyQuestion,
) -> PolicyAnswer {
    let denied = |reason: String| PolicyAnswer::Decided {
        decision: Decision::Deny,
        reason,
        decided_by: KEEL.into(),
        context: None,
    };
    let scope = |s: PolicyScope| ToolScope {
        attempt,
        mode: s.mode,
        tools: s.tools,
        agent: s.agent,
    };
    let json = |text: &str| serde_json::from_str::<Value>(text).map_err(|e| e.to_string());
    let withhold = |why: String| PolicyAnswer::Output(withheld(&why));
    let Some(host) = host else {
        return match ask {
            // No policy here: a result goes on unchanged and an event goes on, as on a node
            // without one; a tool call the worker gated anyway is denied (fail closed).
            PolicyQuestion::AfterTool { output, .. } => PolicyAnswer::Output(output),
            PolicyQuestion::SessionEvent { .. } => PolicyAnswer::Decided {
                decision: Decision::Allow,
                reason: String::new(),
                decided_by: String::new(),
                context: None,
            },
            PolicyQuestion::BeforeTool { .. } => {
                denied("keel: the coordinator node has no policy to decide with (denied)".into())
            }
        };
    };
    if !placed_there {
        let why = "the attempt is not placed on the worker that asks";
        return match ask {
            PolicyQuestion::AfterTool { .. } => withhold(why.into()),
            _ => denied(format!("keel: {why} (denied)")),
        };
    }
    match ask {
        PolicyQuestion::BeforeTool {
            scope: s,
            tool,
            input,
            payload,
        } => match (json(&input), json(&payload)) {
            (Ok(input), Ok(payload)) => {
                let a = host
                    .before_tool(&scope(s), &ToolCall::new(tool, input), payload)
                    .await;
                PolicyAnswer::Decided {
                    decision: a.decision,
                    reason: a.reason,
                    decided_by: a.decided_by,
                    context: None,
                }
            }
            (Err(e), _) | (_, Err(e)) => denied(format!(
                "keel: the question's JSON did not parse ({e}) (denied)"
            )),
        },
        PolicyQuestion::AfterTool {
            scope: s,
            tool,
            input,
            payload,
            output,
        } => match (json(&input), json(&payload)) {
            (Ok(input), Ok(payload)) => PolicyAnswer::Output(
                host.after_tool(&scope(s), &ToolCall::new(tool, input), payload, output)
                    .await,
            ),
            (Err(e), _) | (_, Err(e)) => {
                withhold(format!("the question's JSON did not parse ({e})"))
            }
        },
        PolicyQuestion::SessionEvent {
            scope: s,
            event,
            payload,
        } => match json(&payload) {
            Ok(payload) => {
                let a = host.on_session_event(&scope(s), event, payload).await;
                PolicyAnswer::Decided {
                    decision: a.decision,
                    reason: a.reason,
                    decided_by: a.decided_by,
                    context: a.context,
                }
            }
            Err(e) => denied(format!(
                "keel: the question's JSON did not parse ({e}) (denied)"
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::wire::{ClusterMsg, Envelope, ToWorker};
    use keel_store::{RunId, TaskId};
    use ractor::{Actor, ActorProcessingErr, ActorRef};
    use std::sync::Arc;

    fn attempt(n: u32) -> AttemptId {
        AttemptId {
            run: RunId(7),
            task: TaskId(11),
            attempt: n,
        }
    }

    fn scope(attempt: AttemptId) -> ToolScope {
        ToolScope {
            attempt,
            mode: keel_harness::PermissionMode::default(),
            tools: Vec::new(),
            agent: "loop".into(),
        }
    }

    fn call() -> ToolCall {
        ToolCall::new("Bash", serde_json::json!({"command": "echo hi"}))
    }

    /// How a stand-in coordinator answers a policy question.
    #[derive(Clone, Copy)]
    enum Mode {
        /// Allows it, for the attempt that asked.
        Allow,
        /// Answers for attempt 2 of the same task, whatever asked (a late answer of another
        /// attempt).
        OtherAttempt,
        /// Never answers.
        Silent,
    }

    /// A stand-in coordinator node's endpoint in [`COORDINATOR_GROUP`], in this process.
    struct Coordinator {
        policy: Arc<RemotePolicy>,
        mode: Mode,
    }

    impl Actor for Coordinator {
        type Msg = ClusterMsg;
        type State = ();
        type Arguments = ();

        async fn pre_start(
            &self,
            myself: ActorRef<ClusterMsg>,
            _: (),
        ) -> Result<(), ActorProcessingErr> {
            ractor::pg::join(COORDINATOR_GROUP.to_string(), vec![myself.get_cell()]);
            Ok(())
        }

        async fn handle(
            &self,
            _: ActorRef<ClusterMsg>,
            message: ClusterMsg,
            _: &mut (),
        ) -> Result<(), ActorProcessingErr> {
            let Some(Envelope {
                body:
                    ToCoordinator::Policy {
                        attempt: asked,
                        question,
                        ..
                    },
                ..
            }) = wire::open::<ToCoordinator>(message)
            else {
                return Ok(());
            };
            let answer = PolicyAnswer::Decided {
                decision: Decision::Allow,
                reason: "allowed by the stand-in".into(),
                decided_by: "allow-rule".into(),
                context: None,
            };
            // Through the wire's encoding, as a worker endpoint receives it.
            let frame = wire::encode(
                &NodeName::new("coordinator").unwrap(),
                &ToWorker::PolicyAnswer {
                    attempt: match self.mode {
                        Mode::OtherAttempt => attempt(2),
                        _ => asked,
                    },
                    question,
                    answer,
                },
            )
            .unwrap();
            if let (Mode::Allow | Mode::OtherAttempt, Ok(Envelope { body, .. })) =
                (self.mode, wire::decode::<ToWorker>(&frame))
                && let ToWorker::PolicyAnswer {
                    attempt,
                    question,
                    answer,
                } = body
            {
                self.policy.answered(attempt, question, answer);
            }
            Ok(())
        }
    }

    async fn stand_in(policy: &Arc<RemotePolicy>, mode: Mode) -> ActorRef<ClusterMsg> {
        let (actor, _) = Actor::spawn(
            None,
            Coordinator {
                policy: Arc::clone(policy),
                mode,
            },
            (),
        )
        .await
        .unwrap();
        actor
    }

    async fn stop(actor: ActorRef<ClusterMsg>) {
        actor.stop(None);
        while !ractor::pg::get_members(&COORDINATOR_GROUP.to_string()).is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// One test, since the process group is global: every way a worker's question ends.
    #[tokio::test]
    async fn a_question_is_answered_by_its_attempt_or_denied() {
        let policy = Arc::new(RemotePolicy::new(NodeName::new("w1").unwrap()));
        let a = attempt(1);
        let terms = PolicyTerms {
            decide_ms: 0,
            post_ms: None,
            session_events: true,
        };
        policy.hosting(a, Some(terms));
        assert_eq!(
            policy.gate_times(a),
            Some(GateTimes {
                decide_ms: WIRE_MARGIN_MS,
                post_ms: None,
                session_events: true,
            })
        );
        assert_eq!(policy.gate_times(attempt(2)), None, "not hosted: no gate");

        // No coordinator reachable: denied at once; a result withheld; an event vetoed.
        let denied = policy.before_tool(&scope(a), &call(), Value::Null).await;
        assert_eq!(denied.decision, Decision::Deny);
        assert_eq!(denied.decided_by, KEEL);
        assert!(denied.reason.contains("not reachable"), "{denied:?}");
        let output = ToolOutput {
            is_error: false,
            text: "hi".into(),
        };
        let withheld = policy
            .after_tool(&scope(a), &call(), Value::Null, output.clone())
            .await;
        assert!(
            withheld.is_error && withheld.text.contains("withheld"),
            "{withheld:?}"
        );
        let vetoed = policy
            .on_session_event(&scope(a), HookEvent::SubagentStart, Value::Null)
            .await;
        assert_eq!(vetoed.decision, Decision::Deny);

        // The coordinator answers the attempt that asked: its decision.
        let coordinator = stand_in(&policy, Mode::Allow).await;
        let allowed = policy.before_tool(&scope(a), &call(), Value::Null).await;
        assert_eq!(allowed.decision, Decision::Allow, "{allowed:?}");
        assert_eq!(allowed.decided_by, "allow-rule");
        stop(coordinator).await;

        // An answer for another attempt of the task (same question id) is not this one's: the
        // question is denied when its wait ends, and nothing waits any more.
        let coordinator = stand_in(&policy, Mode::OtherAttempt).await;
        let late = policy.before_tool(&scope(a), &call(), Value::Null).await;
        assert_eq!(late.decision, Decision::Deny, "{late:?}");
        assert!(late.reason.contains("no answer"), "{late:?}");
        assert!(lock(&policy.waiting).is_empty());
        stop(coordinator).await;

        // The coordinator's connection goes away while a question waits: denied.
        let coordinator = stand_in(&policy, Mode::Silent).await;
        let asking = {
            let policy = Arc::clone(&policy);
            tokio::spawn(async move { policy.before_tool(&scope(a), &call(), Value::Null).await })
        };
        while lock(&policy.waiting).is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        stop(coordinator).await;
        let lost = asking.await.unwrap();
        assert_eq!(lost.decision, Decision::Deny, "{lost:?}");
        assert!(lost.reason.contains("lost"), "{lost:?}");

        // The attempt ends while its question waits: denied, and a late answer is dropped.
        let coordinator = stand_in(&policy, Mode::Silent).await;
        let asking = {
            let policy = Arc::clone(&policy);
            tokio::spawn(async move { policy.before_tool(&scope(a), &call(), Value::Null).await })
        };
        let question = loop {
            if let Some((_, q)) = lock(&policy.waiting).keys().next().copied() {
                break q;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        policy.ended(a);
        let ended = asking.await.unwrap();
        assert_eq!(ended.decision, Decision::Deny, "{ended:?}");
        assert!(ended.reason.contains("ended"), "{ended:?}");
        policy.answered(a, question, PolicyAnswer::Output(output));
        assert!(lock(&policy.waiting).is_empty());
        assert_eq!(policy.gate_times(a), None);
        stop(coordinator).await;
    }

    /// The coordinator's side: a question about an attempt not placed on the asking worker, or
    /// with JSON that does not parse, is denied without deciding; without a policy a result goes
    /// on unchanged and a call is denied.
    #[tokio::test]
    async fn the_coordinator_denies_what_it_cannot_decide() {
        let host = PolicyHost::new(keel_policy::Policy::default());
        let ask = |input: &str| PolicyQuestion::BeforeTool {
            scope: scope_of(&scope(attempt(1))),
            tool: "Bash".into(),
            input: input.into(),
            payload: "{}".into(),
        };
        let is_denied = |a: &PolicyAnswer, why: &str| matches!(a, PolicyAnswer::Decided { decision: Decision::Deny, reason, .. } if reason.contains(why));
        let a = answer(Some(host.clone()), false, attempt(1), ask("{}")).await;
        assert!(is_denied(&a, "not placed"), "{a:?}");
        let a = answer(Some(host), true, attempt(1), ask("{not json")).await;
        assert!(is_denied(&a, "did not parse"), "{a:?}");
        let a = answer(None, true, attempt(1), ask("{}")).await;
        assert!(is_denied(&a, "no policy"), "{a:?}");
        let output = ToolOutput {
            is_error: false,
            text: "hi".into(),
        };
        let a = answer(
            None,
            true,
            attempt(1),
            PolicyQuestion::AfterTool {
                scope: scope_of(&scope(attempt(1))),
                tool: "Bash".into(),
                input: "{}".into(),
                payload: "{}".into(),
                output: output.clone(),
            },
        )
        .await;
        assert_eq!(a, PolicyAnswer::Output(output));
    }
}
