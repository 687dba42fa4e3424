//! Specialists hosted on other nodes: the seam between the runtime and a cluster layer (keel-cluster,
//! docs/DESIGN.md §10).
//!
//! The runtime stays the coordinator node: its coordinators, supervisor and checkpoint writer are
//! local actors, and the store is written here only. A cluster layer attached with
//! [`Runtime::attach_remote`] takes each specialist the supervisor admits ([`RemoteHosts::place`])
//! and carries the coordinator's messages to it ([`RemoteHosts::deliver`]); what a remote specialist
//! says comes back through the [`RemoteInbox`] as the same inputs a local one produces
//! (`CoordinatorMsg::Specialist`, `SupervisorMsg::SpecialistDown`, lifecycle events), so the
//! machines cannot tell a remote attempt from a local one. Acknowledgement stays the machines'
//! protocol: a result is acknowledged only once durable, and the specialist resends it until then.

use super::node::specialist_role::apply_stop_answer;
use super::node::{Node, lock};
use super::{Runtime, RuntimeEvent};
use crate::context::RowSet;
use crate::effect::Envelope;
use crate::ids::AttemptId;
use crate::message::{
    ContextRequest, CoordinatorMsg, LifecycleEvent, SpecialistMsg, SpecialistReply,
    SpecialistStart, SupervisorMsg,
};
use crate::report::SubagentReport;
use crate::runtime::harnesses::SubagentEvent;
use keel_harness::TokenCounts;
use keel_store::RunId;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, Weak};

/// Where the runtime sends the specialists it does not host itself (implemented by keel-cluster).
pub trait RemoteHosts: Send + Sync + 'static {
    /// Host the attempt on another node. `Err` hands it back, to be hosted in this process.
    ///
    /// # Errors
    /// The start itself, when no remote node takes it.
    fn place(&self, start: SpecialistStart) -> Result<(), Box<SpecialistStart>>;

    /// Carry a coordinator's or supervisor's message to an attempt hosted elsewhere. `Err` hands
    /// the message back when the attempt is not hosted remotely.
    ///
    /// # Errors
    /// The message itself, when the attempt is unknown here.
    fn deliver(&self, attempt: AttemptId, msg: SpecialistMsg) -> Result<(), SpecialistMsg>;
}

/// The runtime's side of remote hosting, held by its node.
pub(crate) struct Remote {
    hosts: Arc<dyn RemoteHosts>,
    /// Per remote attempt: its plan step and its report once the session finished, so observers get
    /// `RuntimeEvent::Report` when the `Ack` is routed (after the result is durable), as for a local
    /// attempt.
    attempts: Mutex<BTreeMap<AttemptId, RemoteAttempt>>,
}

#[derive(Default)]
struct RemoteAttempt {
    step: String,
    /// The agent profile it runs as (what the SubagentStop hooks match).
    agent: String,
    report: Option<SubagentReport>,
}

/// Most remote attempts whose step is remembered for observers (the oldest are forgotten first).
const REMEMBERED_MAX: usize = 65_536;

impl Node {
    /// Whether a cluster layer is attached (attempts may be hosted on other nodes).
    pub(crate) fn has_remote(&self) -> bool {
        self.remote.get().is_some()
    }

    /// Hand an admitted specialist to the attached cluster layer; `Some` gives it back to be hosted
    /// here (no cluster layer, or no remote node took it).
    pub(crate) fn place_remote(&self, start: SpecialistStart) -> Option<SpecialistStart> {
        let Some(remote) = self.remote.get() else {
            return Some(start);
        };
        let attempt = start.attempt;
        let step = start.brief.step.clone();
        let agent = start.assignment.agent.clone();
        match remote.hosts.place(start) {
            Ok(()) => {
                let mut attempts = lock(&remote.attempts);
                if attempts.len() >= REMEMBERED_MAX
                    && let Some(oldest) = attempts.keys().next().copied()
                {
                    attempts.remove(&oldest);
                }
                attempts.insert(
                    attempt,
                    RemoteAttempt {
                        step,
                        agent,
                        report: None,
                    },
                );
                None
            }
            Err(start) => Some(*start),
        }
    }

    /// Deliver a message to an attempt that is not hosted in this process (dropped if no remote
    /// node hosts it either: every message to a specialist is resent or made moot by the store).
    pub(crate) fn route_remote(&self, attempt: AttemptId, msg: SpecialistMsg) {
        let Some(remote) = self.remote.get() else {
            return;
        };
        if matches!(msg, SpecialistMsg::Ack) {
            let acked = lock(&remote.attempts)
                .get_mut(&attempt)
                .and_then(|a| a.report.take().map(|r| (a.step.clone(), r)));
            if let Some((step, report)) = acked {
                self.emit(RuntimeEvent::Report {
                    attempt,
                    step,
                    report,
                });
            }
        }
        if remote.hosts.deliver(attempt, msg).is_err() {
            tracing::debug!(%attempt, "message for a specialist hosted nowhere, dropped");
        }
    }
}

impl Node {
    /// A remote specialist resends its result to a run no coordinator here hosts: once the run has
    /// ended (its end rode in the commit of its last results; a crash, or the coordinator's own
    /// stop, came before the acknowledgement reached it), it is answered from the store
    /// (`host::decide::answer_after_end`); otherwise the message is dropped as before.
    fn answer_after_end(self: &Arc<Self>, attempt: AttemptId) {
        let node = Arc::clone(self);
        super::node::spawn(async move {
            let answer = node
                .read(move |store| {
                    let scope = store.run(attempt.run);
                    let run = scope.get()?;
                    let task = scope.task(attempt.task).ok();
                    Ok(crate::host::decide::answer_after_end(
                        &run,
                        task.as_ref(),
                        attempt,
                    ))
                })
                .await;
            match answer {
                Ok(Some(msg)) => node.route_remote(attempt, msg),
                Ok(None) => tracing::debug!(%attempt, "result for a run not hosted here, dropped"),
                Err(e) => {
                    tracing::debug!(%attempt, error = %e, "result for an unhosted run unread")
                }
            }
        });
    }
}

/// How a cluster layer hands the runtime what remote specialists say. Holds the node weakly: once the
/// runtime is gone every call is a no-op.
#[derive(Clone)]
pub struct RemoteInbox {
    node: Weak<Node>,
}

impl std::fmt::Debug for RemoteInbox {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteInbox").finish_non_exhaustive()
    }
}

impl RemoteInbox {
    /// A reply of a remote attempt, for its run's coordinator (as `CoordinatorMsg::Specialist`).
    /// A report first passes the policy's SubagentStop hooks here, on the node that holds the
    /// policy and the store (a worker has neither), as a local attempt's does in its host.
    pub fn reply(&self, from: AttemptId, reply: SpecialistReply) {
        let Some(node) = self.node.upgrade() else {
            return;
        };
        match reply {
            SpecialistReply::Finished(mut result) if result.outcome.is_ok() => {
                let known = node
                    .remote
                    .get()
                    .and_then(|remote| lock(&remote.attempts).get(&from).map(|a| a.agent.clone()));
                super::node::spawn(async move {
                    // An attempt placed before this node restarted is not remembered: its agent
                    // is its task's assignee in the store.
                    let agent = match known {
                        Some(agent) => agent,
                        None => node
                            .read(move |store| Ok(store.run(from.run).task(from.task)?.assignee))
                            .await
                            .ok()
                            .flatten()
                            .unwrap_or_default(),
                    };
                    if let Ok(report) = &result.outcome {
                        let answer = node
                            .harnesses
                            .subagent_event(
                                from,
                                SubagentEvent::Stop {
                                    agent: &agent,
                                    report,
                                },
                            )
                            .await;
                        apply_stop_answer(answer, &mut result);
                    }
                    Self::pass_on(&node, from, SpecialistReply::Finished(result));
                });
            }
            reply => Self::pass_on(&node, from, reply),
        }
    }

    /// [`RemoteInbox::reply`] once the policy has seen a report: observers hear of it, and it goes
    /// to its run's coordinator (or is answered from the store when that run has ended).
    fn pass_on(node: &Arc<Node>, from: AttemptId, reply: SpecialistReply) {
        match &reply {
            SpecialistReply::Finished(result) => {
                if let Ok(report) = &result.outcome
                    && let Some(remote) = node.remote.get()
                    && let Some(a) = lock(&remote.attempts).get_mut(&from)
                {
                    a.report = Some(report.clone());
                }
            }
            SpecialistReply::Logs { rows } => {
                if let Some((_, row)) = rows.last() {
                    node.emit(RuntimeEvent::Progress {
                        attempt: from,
                        summary: row.summary.clone(),
                    });
                }
            }
            SpecialistReply::Spend { spent_micros } => node.emit(RuntimeEvent::Spend {
                attempt: from,
                spent_micros: *spent_micros,
            }),
            _ => {}
        }
        if matches!(reply, SpecialistReply::Finished(_))
            && node.coordinator(from.run).is_none()
            && !node.frozen.load(std::sync::atomic::Ordering::Acquire)
        {
            node.answer_after_end(from);
            return;
        }
        node.route(Envelope::Coordinator {
            run: from.run,
            msg: CoordinatorMsg::Specialist { from, reply },
        });
    }

    /// A remote attempt is gone without a result (its node was lost, it could not be started
    /// there, or its actor there panicked: `panicked`): the supervisor settles it and decides (as
    /// for a local actor's abnormal end).
    pub fn down(&self, attempt: AttemptId, reason: String, panicked: bool) {
        if let Some(node) = self.node.upgrade() {
            node.route(Envelope::Supervisor(SupervisorMsg::SpecialistDown {
                attempt,
                reason,
                panicked,
            }));
        }
    }

    /// A lifecycle event a remote specialist emitted.
    pub fn lifecycle(&self, event: LifecycleEvent) {
        if let Some(node) = self.node.upgrade() {
            node.lifecycle(event, None);
        }
    }

    /// Token usage of a remote attempt's session so far, for observers.
    pub fn usage(&self, attempt: AttemptId, tokens: TokenCounts, spent_micros: u64) {
        if let Some(node) = self.node.upgrade() {
            node.emit(RuntimeEvent::Usage {
                attempt,
                tokens,
                spent_micros,
            });
        }
    }

    /// The rows a remote specialist's preamble is built from, read from this node's store (workers
    /// never open it), on the blocking pool.
    ///
    /// # Errors
    /// Why the rows could not be read, one line (the attempt then fails as a transient failure).
    pub async fn load_context(
        &self,
        run: RunId,
        request: ContextRequest,
    ) -> Result<RowSet, String> {
        let Some(node) = self.node.upgrade() else {
            return Err("the coordinator node is shutting down".into());
        };
        let config = node.config.specialist.context;
        tokio::task::spawn_blocking(move || {
            let store = node.store.get().map_err(|e| e.to_string())?;
            crate::host::store::load_context(&store, run, &request, &config)
        })
        .await
        .unwrap_or_else(|e| Err(format!("context load task failed: {e}")))
    }
}

impl Runtime {
    /// Host specialists on other nodes from now on: every admitted specialist is offered to `hosts`
    /// first. Returns the inbox through which the cluster layer feeds their replies back. A second
    /// call keeps the first `hosts`.
    pub fn attach_remote(&self, hosts: Arc<dyn RemoteHosts>) -> RemoteInbox {
        let _ = self.node.remote.set(Remote {
            hosts,
            attempts: Mutex::new(BTreeMap::new()),
        });
        RemoteInbox {
            node: Arc::downgrade(&self.node),
        }
    }
}
