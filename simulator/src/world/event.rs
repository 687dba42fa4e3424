//! The events of the world's agenda and their one-line descriptions for the trace.

use keel_actors::{
    AttemptId, CheckpointInput, CoordinatorInput, CoordinatorMsg, RunSpec, SpecialistInput,
    SpecialistMsg, SupervisorInput, SupervisorMsg,
};
use keel_harness::HarnessEvent;
use keel_store::RunId;

use crate::config::Intervention;
use crate::net::NodeId;
use crate::trace::{push_dec, push_hex8};

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
        /// Boxed: the largest payload left inline (an event was 176 bytes with it), and one
        /// event in forty is a specialist's.
        input: Box<SpecialistInput>,
        inc: Option<u32>,
    },
    /// A frame of the wire protocol arrives at a node (`frames.rs`); `label` and `attempt` are what
    /// the sender knew of it, for the trace (the attempt as the trace writes it: frames are the
    /// commonest events, and a whole attempt id is 64 bytes of each).
    Frame {
        to: NodeId,
        label: &'static str,
        attempt: Option<AttemptTag>,
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
    /// A scripted intervention of the scenario (boxed, as the operator's: rare, and large).
    Intervene(Box<Intervention>),
    /// An operator's intervention the seed drew (the world does not end before it happened).
    Operator(Box<Intervention>),
    /// The node's endpoint stops waiting for the answer to a session's call of keel's tools.
    ToolTimeout {
        node: NodeId,
        inc: u32,
        attempt: AttemptId,
        session: u64,
        /// A boxed `str`, a word shorter than a `String`: this variant sets the size of every event.
        call_id: Box<str>,
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
    /// Written piece by piece rather than through `write!`: a line per event, and the formatter's
    /// machinery was most of the cost of writing them. The text is what the format strings in the
    /// comments write.
    pub(super) fn describe(&self, s: &mut String) {
        use std::fmt::Write as _;
        match self {
            Ev::Submit(spec) => {
                s.push_str("submit run=");
                short(s, spec.run.0);
            }
            Ev::Coord { run, input, .. } => {
                // "coord run={run} {input}"
                s.push_str("coord run=");
                short(s, run.0);
                s.push(' ');
                coord_input_name(s, input);
            }
            Ev::Sup { input, .. } => {
                s.push_str("supervisor ");
                sup_input_name(s, input);
            }
            Ev::Ckpt { input, .. } => {
                s.push_str("checkpoint ");
                ckpt_input_name(s, input);
            }
            Ev::Spec {
                node,
                attempt,
                input,
                ..
            } => {
                // "spec {node} {attempt} {input}"
                s.push_str("spec ");
                node_name(s, *node);
                s.push(' ');
                attempt_short(s, attempt);
                s.push(' ');
                spec_input_name(s, input);
            }
            Ev::Frame {
                to,
                label,
                attempt,
                bytes,
            } => {
                // "frame to {to} {label} {attempt} {len}B", or two spaces without an attempt.
                s.push_str("frame to ");
                node_name(s, *to);
                s.push(' ');
                s.push_str(label);
                s.push(' ');
                if let Some(a) = attempt {
                    a.write(s);
                }
                s.push(' ');
                dec(s, bytes.len());
                s.push('B');
            }
            Ev::HarnessNext { node, attempt, .. } => {
                s.push_str("harness ");
                node_name(s, *node);
                s.push(' ');
                attempt_short(s, attempt);
            }
            Ev::Heartbeat { node, .. } => {
                s.push_str("heartbeat ");
                node_name(s, *node);
            }
            Ev::MembershipTick { .. } => s.push_str("membership-tick"),
            Ev::FaultTick => s.push_str("fault-tick"),
            Ev::Intervene(i) => {
                let _ = write!(s, "intervene {i:?}");
            }
            Ev::Operator(i) => {
                let _ = write!(s, "operator {i:?}");
            }
            Ev::ToolTimeout {
                node,
                attempt,
                call_id,
                ..
            } => {
                s.push_str("tool-timeout ");
                node_name(s, *node);
                s.push(' ');
                attempt_short(s, attempt);
                s.push(' ');
                s.push_str(call_id);
            }
            Ev::HumanAnswers { run, tries } => {
                s.push_str("human-answers run=");
                short(s, run.0);
                s.push_str(" try=");
                push_dec(s, u64::from(*tries));
            }
            Ev::AuditWait { ticket } => {
                s.push_str("audit-wait #");
                push_dec(s, *ticket);
            }
            Ev::Restart(node) => {
                s.push_str("restart ");
                node_name(s, *node);
            }
            Ev::Heal => s.push_str("heal"),
        }
    }
}

/// An attempt as the trace writes it, `task#n` with the task shortened to its last 32 bits: all a
/// frame keeps of the attempt it concerns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct AttemptTag {
    task: u32,
    attempt: u32,
}

impl AttemptTag {
    /// The tag of `a`.
    pub(super) fn of(a: &AttemptId) -> Self {
        Self {
            task: (a.task.0 & 0xffff_ffff) as u32,
            attempt: a.attempt,
        }
    }

    /// Writes it as [`attempt_short`] writes the attempt.
    fn write(self, s: &mut String) {
        push_hex8(s, self.task);
        s.push('#');
        push_dec(s, u64::from(self.attempt));
    }
}

/// A node as its `Display` writes it (`coord`, `w1`, ...).
fn node_name(s: &mut String, node: NodeId) {
    if node == NodeId::COORDINATOR {
        s.push_str("coord");
    } else {
        s.push('w');
        push_dec(s, u64::from(node.0));
    }
}

/// An id shortened to its last 32 bits, as `{:08x}`.
fn short(s: &mut String, id: u128) {
    push_hex8(s, (id & 0xffff_ffff) as u32);
}

/// An attempt as `task#n` (the task shortened as by [`short`]).
fn attempt_short(s: &mut String, a: &AttemptId) {
    AttemptTag::of(a).write(s);
}

/// A count or a length in decimal.
fn dec(s: &mut String, n: usize) {
    push_dec(s, u64::try_from(n).unwrap_or(u64::MAX));
}

/// `name(n)`.
fn call(s: &mut String, name: &str, n: u64) {
    s.push_str(name);
    s.push('(');
    push_dec(s, n);
    s.push(')');
}

fn coord_input_name(s: &mut String, i: &CoordinatorInput) {
    use std::fmt::Write as _;
    match i {
        CoordinatorInput::Msg(m) => match m {
            CoordinatorMsg::Accept(_) => s.push_str("accept"),
            CoordinatorMsg::Specialist { from, reply } => {
                s.push_str("from ");
                attempt_short(s, from);
                s.push(' ');
                match reply {
                    keel_actors::SpecialistReply::Logs { rows } => {
                        call(s, "logs", u64::try_from(rows.len()).unwrap_or(u64::MAX));
                    }
                    keel_actors::SpecialistReply::Spend { spent_micros } => {
                        call(s, "spend", *spent_micros);
                    }
                    keel_actors::SpecialistReply::Finished(r) => s.push_str(if r.outcome.is_ok() {
                        "finished(report)"
                    } else {
                        "finished(failure)"
                    }),
                    keel_actors::SpecialistReply::Delegate { turn, .. } => {
                        call(s, "delegate", u64::from(*turn));
                    }
                    keel_actors::SpecialistReply::Tool { call_id, request } => {
                        s.push_str("tool(");
                        s.push_str(call_id);
                        s.push(' ');
                        s.push_str(request.tool());
                        s.push(')');
                    }
                }
            }
            CoordinatorMsg::EscalationAnswered { escalation, task } => {
                s.push_str("escalation-answered(");
                short(s, escalation.0);
                s.push(' ');
                short(s, task.0);
                s.push(')');
            }
            CoordinatorMsg::Durable { ticket } => call(s, "durable", *ticket),
            CoordinatorMsg::PersistFailed { ticket, .. } => call(s, "persist-failed", *ticket),
            CoordinatorMsg::Admission { attempt, answer } => {
                s.push_str("admission ");
                attempt_short(s, attempt);
                s.push_str(if answer.is_ok() { " ok" } else { " refused" });
            }
            CoordinatorMsg::Verdict { attempt, verdict } => {
                s.push_str("verdict ");
                attempt_short(s, attempt);
                let _ = write!(s, " {verdict:?}");
            }
            CoordinatorMsg::AttemptLost { attempt, .. } => {
                s.push_str("attempt-lost ");
                attempt_short(s, attempt);
            }
            CoordinatorMsg::BudgetTripped { .. } => s.push_str("budget-tripped"),
            CoordinatorMsg::Cancel { .. } => s.push_str("cancel"),
            CoordinatorMsg::CancelTask { task, .. } => {
                s.push_str("cancel-task ");
                short(s, task.0);
            }
            CoordinatorMsg::FollowUp(f) => {
                s.push_str("follow-up on ");
                short(s, f.parent.0);
            }
        },
        CoordinatorInput::Msgs(msgs) => {
            dec(s, msgs.len());
            s.push_str(" messages");
        }
        CoordinatorInput::Timer(t) => {
            let _ = write!(s, "timer {t:?}");
        }
        CoordinatorInput::Recovered(_) => s.push_str("recovered"),
        CoordinatorInput::Reopened { follow_up, .. } => {
            s.push_str("reopened for a follow-up on ");
            short(s, follow_up.parent.0);
        }
    }
}

fn sup_input_name(s: &mut String, i: &SupervisorInput) {
    match i {
        SupervisorInput::Msg(m) => match m {
            SupervisorMsg::OpenRun { run, .. } => {
                s.push_str("open-run ");
                short(s, run.0);
            }
            SupervisorMsg::Admit(r) => {
                s.push_str("admit ");
                attempt_short(s, &r.attempt);
            }
            SupervisorMsg::Spend {
                attempt,
                spent_micros,
            } => {
                s.push_str("spend ");
                attempt_short(s, attempt);
                s.push(' ');
                push_dec(s, *spent_micros);
            }
            SupervisorMsg::Settle {
                attempt, outcome, ..
            } => {
                s.push_str("settle ");
                attempt_short(s, attempt);
                s.push_str(if outcome.is_ok() { " ok" } else { " failed" });
            }
            SupervisorMsg::SpecialistDown { attempt, .. } => {
                s.push_str("down ");
                attempt_short(s, attempt);
            }
            SupervisorMsg::CloseRun { run } => {
                s.push_str("close-run ");
                short(s, run.0);
            }
        },
        SupervisorInput::Msgs(msgs) => {
            dec(s, msgs.len());
            s.push_str(" messages");
        }
        SupervisorInput::Timer(t) => match t {
            keel_actors::SupervisorTimer::Deadline(a) => {
                s.push_str("deadline ");
                attempt_short(s, a);
            }
        },
    }
}

/// `{verb} {run} #t1,#t2,...`: the stages' run (the first one's, or 0) and their tickets.
fn stages(s: &mut String, verb: &str, stages: &[keel_actors::Stage]) {
    s.push_str(verb);
    s.push(' ');
    short(s, stages.first().map_or(0, |st| st.run.0));
    s.push(' ');
    for (i, stage) in stages.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        s.push('#');
        push_dec(s, stage.ticket);
    }
}

fn ckpt_input_name(s: &mut String, i: &CheckpointInput) {
    use std::fmt::Write as _;
    match i {
        CheckpointInput::Msg(keel_actors::CheckpointMsg::Stage(stage)) => {
            s.push_str("stage ");
            short(s, stage.run.0);
            s.push_str(" #");
            push_dec(s, stage.ticket);
        }
        CheckpointInput::Msg(keel_actors::CheckpointMsg::Stages(st)) => stages(s, "stages", st),
        CheckpointInput::Msg(keel_actors::CheckpointMsg::Riding(st)) => stages(s, "riding", st),
        CheckpointInput::Committed(id) => {
            s.push_str("committed ");
            push_dec(s, id.0);
        }
        CheckpointInput::CommitFailed { id, .. } => {
            s.push_str("commit-failed ");
            push_dec(s, id.0);
        }
        CheckpointInput::Refused { id, run, .. } => {
            let _ = write!(s, "commit-refused {} {run}", id.0);
        }
        CheckpointInput::Timer(t) => {
            let _ = write!(s, "timer {t:?}");
        }
        CheckpointInput::Abandon { .. } => s.push_str("abandon"),
    }
}

fn spec_input_name(s: &mut String, i: &SpecialistInput) {
    use std::fmt::Write as _;
    match i {
        SpecialistInput::Begin => s.push_str("begin"),
        SpecialistInput::Msg(SpecialistMsg::Ack) => s.push_str("ack"),
        SpecialistInput::Msg(SpecialistMsg::Cancel { .. }) => s.push_str("cancel"),
        SpecialistInput::Msg(SpecialistMsg::Delegated { turn, .. }) => {
            s.push_str("delegated ");
            push_dec(s, u64::from(*turn));
        }
        SpecialistInput::Msg(SpecialistMsg::ToolAnswer { call_id, .. }) => {
            s.push_str("tool-answer ");
            s.push_str(call_id);
        }
        SpecialistInput::ToolCall(call) => {
            s.push_str("tool-call ");
            s.push_str(&call.call_id);
            s.push(' ');
            s.push_str(call.request.tool());
        }
        SpecialistInput::ContextLoaded(r) => s.push_str(if r.is_ok() {
            "context-loaded ok"
        } else {
            "context-loaded err"
        }),
        SpecialistInput::Harness(e) => match e {
            HarnessEvent::Started { .. } => s.push_str("harness started"),
            HarnessEvent::Text { .. } => s.push_str("harness text"),
            HarnessEvent::SentBack { .. } => s.push_str("harness sent back"),
            HarnessEvent::ToolUse { id, .. } => {
                s.push_str("harness tool_use ");
                s.push_str(id);
            }
            HarnessEvent::ToolResult { id, .. } => {
                s.push_str("harness tool_result ");
                s.push_str(id);
            }
            HarnessEvent::Usage(_) => s.push_str("harness usage"),
            HarnessEvent::Finished { stop_reason, .. } => {
                let _ = write!(s, "harness finished {stop_reason}");
            }
            HarnessEvent::Failed(e) => {
                let _ = write!(s, "harness failed {}", e.category);
            }
        },
        SpecialistInput::SessionSecret(_) => s.push_str("session secret"),
        SpecialistInput::Timer(t) => {
            let _ = write!(s, "timer {t:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    /// Every event moves by value through the agenda and the step, a few times each: a variant
    /// that grows past this makes every event pay for it (box its payload instead).
    #[test]
    fn an_event_stays_small() {
        assert!(std::mem::size_of::<super::Ev>() <= 80);
    }
}
