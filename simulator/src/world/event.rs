//! The events of the world's agenda and their one-line descriptions for the trace.

use keel_actors::{
    AttemptId, CheckpointInput, CoordinatorInput, CoordinatorMsg, RunSpec, SpecialistInput,
    SpecialistMsg, SupervisorInput, SupervisorMsg,
};
use keel_harness::HarnessEvent;
use keel_store::RunId;

use crate::config::Intervention;
use crate::net::NodeId;

/// Something that happens at a point of virtual time.
#[derive(Debug)]
pub(super) enum Ev {
    /// A run is submitted to the coordinator node (the embedding host's submission API).
    Submit(Box<RunSpec>),
    /// An input for a run's coordinator. `inc` is the coordinator node's incarnation for local inputs
    /// (lost with the node), `None` for messages from the network (delivered to whoever is up).
    Coord {
        run: RunId,
        /// Boxed, as the supervisor's: the largest inputs by far, and every event moves through
        /// the agenda and the step by value (an event was 256 bytes with them inline).
        input: Box<CoordinatorInput>,
        inc: Option<u32>,
    },
    /// An input for the supervisor.
    Sup {
        input: Box<SupervisorInput>,
        inc: Option<u32>,
    },
    /// An input for the checkpoint writer.
    Ckpt { input: CheckpointInput, inc: u32 },
    /// An input for a specialist on a worker, valid only for the worker incarnation it was sent to
    /// (`None`: a network message, delivered if the attempt is hosted there now).
    Spec {
        node: NodeId,
        attempt: AttemptId,
        input: SpecialistInput,
        inc: Option<u32>,
    },
    /// A frame of the wire protocol arrives at a node (`frames.rs`); `label` and `attempt` are what
    /// the sender knew of it, for the trace.
    Frame {
        to: NodeId,
        label: &'static str,
        attempt: Option<AttemptId>,
        bytes: Vec<u8>,
    },
    /// The next scripted event of a harness session.
    HarnessNext {
        node: NodeId,
        inc: u32,
        attempt: AttemptId,
        session: u64,
    },
    /// A worker's heartbeat is due (valid for the incarnation that scheduled it).
    Heartbeat { node: NodeId, inc: u32 },
    /// The coordinator node's membership has a deadline (valid for the node's incarnation).
    MembershipTick { inc: u32 },
    /// Roll for partitions, crashes and disk faults.
    FaultTick,
    /// A scripted intervention of the scenario.
    Intervene(Intervention),
    /// An operator's intervention the seed drew (the world does not end before it happened).
    Operator(Intervention),
    /// The node's endpoint stops waiting for the answer to a session's call of keel's tools.
    ToolTimeout {
        node: NodeId,
        inc: u32,
        attempt: AttemptId,
        session: u64,
        call_id: String,
    },
    /// A human answers the open escalations of a run (`keel answer`); `tries` counts the looks
    /// that found none open yet.
    HumanAnswers { run: RunId, tries: u32 },
    /// A gated call stops waiting for the checkpoint writer's answer to its audit rows' host stage
    /// (`AUDIT_WAIT_MS` after they were staged): if no answer came, the call is denied.
    AuditWait { ticket: u64 },
    /// A crashed node comes back.
    Restart(NodeId),
    /// The liveness phase begins: heal everything.
    Heal,
}

impl Ev {
    /// A compact, stable description for the trace (ids shortened, payloads named, not dumped).
    pub(super) fn describe(&self, s: &mut String) {
        use std::fmt::Write as _;
        let _ = match self {
            Ev::Submit(spec) => write!(s, "submit run={}", short(spec.run.0)),
            Ev::Coord { run, input, .. } => {
                write!(s, "coord run={} ", short(run.0)).and_then(|()| coord_input_name(s, input))
            }
            Ev::Sup { input, .. } => s
                .write_str("supervisor ")
                .and_then(|()| sup_input_name(s, input)),
            Ev::Ckpt { input, .. } => s
                .write_str("checkpoint ")
                .and_then(|()| ckpt_input_name(s, input)),
            Ev::Spec {
                node,
                attempt,
                input,
                ..
            } => write!(s, "spec {node} {} ", attempt_short(attempt))
                .and_then(|()| spec_input_name(s, input)),
            Ev::Frame {
                to,
                label,
                attempt,
                bytes,
            } => match attempt {
                Some(a) => write!(
                    s,
                    "frame to {to} {label} {} {}B",
                    attempt_short(a),
                    bytes.len()
                ),
                None => write!(s, "frame to {to} {label}  {}B", bytes.len()),
            },
            Ev::HarnessNext { node, attempt, .. } => {
                write!(s, "harness {node} {}", attempt_short(attempt))
            }
            Ev::Heartbeat { node, .. } => write!(s, "heartbeat {node}"),
            Ev::MembershipTick { .. } => write!(s, "membership-tick"),
            Ev::FaultTick => write!(s, "fault-tick"),
            Ev::Intervene(i) => write!(s, "intervene {i:?}"),
            Ev::Operator(i) => write!(s, "operator {i:?}"),
            Ev::ToolTimeout {
                node,
                attempt,
                call_id,
                ..
            } => write!(
                s,
                "tool-timeout {node} {} {call_id}",
                attempt_short(attempt)
            ),
            Ev::HumanAnswers { run, tries } => {
                write!(s, "human-answers run={} try={tries}", short(run.0))
            }
            Ev::AuditWait { ticket } => write!(s, "audit-wait #{ticket}"),
            Ev::Restart(node) => write!(s, "restart {node}"),
            Ev::Heal => write!(s, "heal"),
        };
    }
}

/// An id shortened to its last 32 bits, written without an allocation of its own.
struct Short(u32);

impl std::fmt::Display for Short {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:08x}", self.0)
    }
}

fn short(id: u128) -> Short {
    Short((id & 0xffff_ffff) as u32)
}

/// An attempt as `task#n`, written without an allocation of its own.
struct AttemptShort(u32, u32);

impl std::fmt::Display for AttemptShort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:08x}#{}", self.0, self.1)
    }
}

fn attempt_short(a: &AttemptId) -> AttemptShort {
    AttemptShort((a.task.0 & 0xffff_ffff) as u32, a.attempt)
}

fn coord_input_name(s: &mut String, i: &CoordinatorInput) -> std::fmt::Result {
    use std::fmt::Write as _;
    match i {
        CoordinatorInput::Msg(m) => match m {
            CoordinatorMsg::Accept(_) => s.write_str("accept"),
            CoordinatorMsg::Specialist { from, reply } => {
                write!(s, "from {} ", attempt_short(from))?;
                match reply {
                    keel_actors::SpecialistReply::Logs { rows } => {
                        write!(s, "logs({})", rows.len())
                    }
                    keel_actors::SpecialistReply::Spend { spent_micros } => {
                        write!(s, "spend({spent_micros})")
                    }
                    keel_actors::SpecialistReply::Finished(r) => {
                        write!(
                            s,
                            "finished({})",
                            if r.outcome.is_ok() {
                                "report"
                            } else {
                                "failure"
                            }
                        )
                    }
                    keel_actors::SpecialistReply::Delegate { turn, .. } => {
                        write!(s, "delegate({turn})")
                    }
                    keel_actors::SpecialistReply::Tool { call_id, request } => {
                        write!(s, "tool({call_id} {})", request.tool())
                    }
                }
            }
            CoordinatorMsg::EscalationAnswered { escalation, task } => {
                write!(
                    s,
                    "escalation-answered({} {})",
                    short(escalation.0),
                    short(task.0)
                )
            }
            CoordinatorMsg::Durable { ticket } => write!(s, "durable({ticket})"),
            CoordinatorMsg::PersistFailed { ticket, .. } => write!(s, "persist-failed({ticket})"),
            CoordinatorMsg::Admission { attempt, answer } => {
                write!(
                    s,
                    "admission {} {}",
                    attempt_short(attempt),
                    if answer.is_ok() { "ok" } else { "refused" }
                )
            }
            CoordinatorMsg::Verdict { attempt, verdict } => {
                write!(s, "verdict {} {verdict:?}", attempt_short(attempt))
            }
            CoordinatorMsg::AttemptLost { attempt, .. } => {
                write!(s, "attempt-lost {}", attempt_short(attempt))
            }
            CoordinatorMsg::BudgetTripped { .. } => s.write_str("budget-tripped"),
            CoordinatorMsg::Cancel { .. } => s.write_str("cancel"),
            CoordinatorMsg::CancelTask { task, .. } => write!(s, "cancel-task {}", short(task.0)),
            CoordinatorMsg::FollowUp(f) => write!(s, "follow-up on {}", short(f.parent.0)),
        },
        CoordinatorInput::Msgs(msgs) => write!(s, "{} messages", msgs.len()),
        CoordinatorInput::Timer(t) => write!(s, "timer {t:?}"),
        CoordinatorInput::Recovered(_) => s.write_str("recovered"),
        CoordinatorInput::Reopened { follow_up, .. } => {
            write!(
                s,
                "reopened for a follow-up on {}",
                short(follow_up.parent.0)
            )
        }
    }
}

fn sup_input_name(s: &mut String, i: &SupervisorInput) -> std::fmt::Result {
    use std::fmt::Write as _;
    match i {
        SupervisorInput::Msg(m) => match m {
            SupervisorMsg::OpenRun { run, .. } => write!(s, "open-run {}", short(run.0)),
            SupervisorMsg::Admit(r) => write!(s, "admit {}", attempt_short(&r.attempt)),
            SupervisorMsg::Spend {
                attempt,
                spent_micros,
            } => write!(s, "spend {} {spent_micros}", attempt_short(attempt)),
            SupervisorMsg::Settle {
                attempt, outcome, ..
            } => {
                write!(
                    s,
                    "settle {} {}",
                    attempt_short(attempt),
                    if outcome.is_ok() { "ok" } else { "failed" }
                )
            }
            SupervisorMsg::SpecialistDown { attempt, .. } => {
                write!(s, "down {}", attempt_short(attempt))
            }
            SupervisorMsg::CloseRun { run } => write!(s, "close-run {}", short(run.0)),
        },
        SupervisorInput::Msgs(msgs) => write!(s, "{} messages", msgs.len()),
        SupervisorInput::Timer(t) => match t {
            keel_actors::SupervisorTimer::Deadline(a) => write!(s, "deadline {}", attempt_short(a)),
        },
    }
}

fn ckpt_input_name(s: &mut String, i: &CheckpointInput) -> std::fmt::Result {
    use std::fmt::Write as _;
    match i {
        CheckpointInput::Msg(keel_actors::CheckpointMsg::Stage(stage)) => {
            write!(s, "stage {} #{}", short(stage.run.0), stage.ticket)
        }
        CheckpointInput::Msg(keel_actors::CheckpointMsg::Stages(stages)) => {
            let tickets: Vec<String> = stages.iter().map(|s| format!("#{}", s.ticket)).collect();
            let run = stages.first().map_or(0, |s| s.run.0);
            write!(s, "stages {} {}", short(run), tickets.join(","))
        }
        CheckpointInput::Msg(keel_actors::CheckpointMsg::Riding(stages)) => {
            let tickets: Vec<String> = stages.iter().map(|s| format!("#{}", s.ticket)).collect();
            let run = stages.first().map_or(0, |s| s.run.0);
            write!(s, "riding {} {}", short(run), tickets.join(","))
        }
        CheckpointInput::Applied(id) => write!(s, "applied {}", id.0),
        CheckpointInput::Committed(id) => write!(s, "committed {}", id.0),
        CheckpointInput::CommitFailed { id, .. } => write!(s, "commit-failed {}", id.0),
        CheckpointInput::Refused { id, run, .. } => write!(s, "commit-refused {} {run}", id.0),
        CheckpointInput::Timer(t) => write!(s, "timer {t:?}"),
        CheckpointInput::Abandon { .. } => s.write_str("abandon"),
    }
}

fn spec_input_name(s: &mut String, i: &SpecialistInput) -> std::fmt::Result {
    use std::fmt::Write as _;
    match i {
        SpecialistInput::Begin => s.write_str("begin"),
        SpecialistInput::Msg(SpecialistMsg::Ack) => s.write_str("ack"),
        SpecialistInput::Msg(SpecialistMsg::Cancel { .. }) => s.write_str("cancel"),
        SpecialistInput::Msg(SpecialistMsg::Delegated { turn, .. }) => {
            write!(s, "delegated {turn}")
        }
        SpecialistInput::Msg(SpecialistMsg::ToolAnswer { call_id, .. }) => {
            write!(s, "tool-answer {call_id}")
        }
        SpecialistInput::ToolCall(call) => {
            write!(s, "tool-call {} {}", call.call_id, call.request.tool())
        }
        SpecialistInput::ContextLoaded(r) => {
            write!(s, "context-loaded {}", if r.is_ok() { "ok" } else { "err" })
        }
        SpecialistInput::Harness(e) => match e {
            HarnessEvent::Started { .. } => s.write_str("harness started"),
            HarnessEvent::Text { .. } => s.write_str("harness text"),
            HarnessEvent::SentBack { .. } => s.write_str("harness sent back"),
            HarnessEvent::ToolUse { id, .. } => write!(s, "harness tool_use {id}"),
            HarnessEvent::ToolResult { id, .. } => write!(s, "harness tool_result {id}"),
            HarnessEvent::Usage(_) => s.write_str("harness usage"),
            HarnessEvent::Finished { stop_reason, .. } => {
                write!(s, "harness finished {stop_reason}")
            }
            HarnessEvent::Failed(e) => write!(s, "harness failed {}", e.category),
        },
        SpecialistInput::SessionSecret(_) => s.write_str("session secret"),
        SpecialistInput::Timer(t) => write!(s, "timer {t:?}"),
    }
}
