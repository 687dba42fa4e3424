//! Escalations at the host (docs/DESIGN.md §9): answering one (`keel answer`, the HTTP API) and
//! raising an approval a caller waits for (the hook bridge's `ask`), each durable through the
//! checkpoint actor as a host stage before anything acts on it.
//!
//! An answer is made durable first (the escalation's resolution and, for a paused task, the
//! steering row its next session reads), then delivered: a task's coordinator, when this node hosts
//! the run, starts the task's next attempt; a tool call waiting in this process for an approval is
//! woken. A run no process hosts keeps the answer in the store and its task resumes with it on
//! `keel resume`.

use super::node::{Node, lock};
use super::{Deliver, Runtime, StoreReadError, wall_clock_ms};
use crate::escalation::{AnswerRefusal, answer_ops, check_answer};
use crate::message::{CoordinatorInput, CoordinatorMsg};
use crate::persist::PersistOp;
use keel_store::{Escalation, EscalationId, EscalationResolution, EscalationWait, RunId};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::oneshot;

/// How long an answer or an approval waits for its rows to be durable.
pub const ESCALATION_WRITE_WAIT_MS: u64 = 10_000;

/// Why an answer was not taken.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AnswerError {
    /// No escalation has this id.
    #[error("escalation {0} not found")]
    NotFound(EscalationId),
    /// The answer does not fit the escalation (closed, blank, not an option).
    #[error(transparent)]
    Refused(#[from] AnswerRefusal),
    /// The store could not be read.
    #[error(transparent)]
    Read(#[from] StoreReadError),
    /// The answer was not made durable; nothing acted on it.
    #[error("the answer was not recorded: {0}")]
    NotWritten(String),
}

/// An answer that is durable.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answered {
    /// The escalation's run.
    pub run: RunId,
    /// The escalation as it was before the answer.
    pub escalation: Escalation,
    /// The answer as recorded (an option as the escalation spells it).
    pub text: String,
    /// Who acted on it in this process: the run's coordinator (a paused task resumes) or a waiting
    /// tool call; `None` when nothing here waits (the run is not hosted here: its task resumes with
    /// the answer when the run is resumed).
    pub delivered_to: Option<Delivered>,
}

/// What an answer was delivered to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delivered {
    /// The coordinator of the run, which resumes the task.
    Coordinator,
    /// The tool call waiting for the approval.
    ToolCall,
}

/// How a raised approval ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ApprovalEnd {
    /// A human answered (the answer as recorded).
    Answered(String),
    /// The deadline passed first; the escalation is recorded as expired.
    Expired,
}

/// Why an approval could not be waited for (the call it is for must be denied).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApprovalError {
    /// The runtime has stopped.
    #[error("the runtime has stopped")]
    Stopped,
    /// The escalation was not made durable.
    #[error("the escalation was not recorded: {0}")]
    NotWritten(String),
}

/// A handle for raising approvals and waiting for their answers; it holds the node weakly, so once
/// the runtime is gone every approval fails (and the call it is for is denied).
#[derive(Clone, Debug)]
pub struct ApprovalDesk {
    node: Weak<Node>,
}

impl ApprovalDesk {
    /// Records `escalation` (an approval: it waits for a tool call) for `run` durably, then waits
    /// for its answer until `deadline` from now; at the deadline it records the expiry (the first
    /// resolution stays, so a racing answer wins or loses cleanly) and answers
    /// [`ApprovalEnd::Expired`].
    ///
    /// # Errors
    /// [`ApprovalError`]: the call must be denied.
    pub async fn raise_and_wait(
        &self,
        run: RunId,
        escalation: Escalation,
        deadline: Duration,
    ) -> Result<ApprovalEnd, ApprovalError> {
        let node = self.node.upgrade().ok_or(ApprovalError::Stopped)?;
        let id = escalation.id;
        let (tx, rx) = oneshot::channel();
        lock(&node.approvals).insert(id, tx);
        let written = node
            .stage_host(
                run,
                vec![PersistOp::AppendEscalation(escalation.clone())],
                Duration::from_millis(ESCALATION_WRITE_WAIT_MS),
            )
            .await;
        if let Err(e) = written {
            lock(&node.approvals).remove(&id);
            return Err(ApprovalError::NotWritten(e));
        }
        drop(node);
        let answered = tokio::time::timeout(deadline, rx).await;
        let node = self.node.upgrade().ok_or(ApprovalError::Stopped)?;
        match answered {
            Ok(Ok(text)) => Ok(ApprovalEnd::Answered(text)),
            // The sender is gone without an answer (the node is stopping): deny.
            Ok(Err(_)) => Err(ApprovalError::Stopped),
            Err(_) => {
                // An answer that takes the waiter first is the one that counts; without it the
                // expiry is recorded (a late answer then finds the escalation closed).
                if lock(&node.approvals).remove(&id).is_none() {
                    return Ok(ApprovalEnd::Expired);
                }
                let expired = PersistOp::ResolveEscalation {
                    id,
                    resolution: EscalationResolution::Expired {
                        ts_ms: wall_clock_ms(),
                    },
                };
                // A failed write of the expiry still denies the call; the row stays open.
                if let Err(e) = node
                    .stage_host(
                        run,
                        vec![expired],
                        Duration::from_millis(ESCALATION_WRITE_WAIT_MS),
                    )
                    .await
                {
                    tracing::warn!(escalation = %id, error = %e, "the expiry of an approval was not recorded");
                }
                Ok(ApprovalEnd::Expired)
            }
        }
    }
}

impl Runtime {
    /// A handle for the approvals of this runtime's runs (the hook bridge holds one).
    pub fn approval_desk(&self) -> ApprovalDesk {
        ApprovalDesk {
            node: Arc::downgrade(&self.node),
        }
    }

    /// The escalation `id`, with its run.
    ///
    /// # Errors
    /// [`AnswerError::NotFound`], [`AnswerError::Read`].
    pub async fn escalation(&self, id: EscalationId) -> Result<(RunId, Escalation), AnswerError> {
        let found = self
            .node
            .read(move |store| match store.catalog().escalation(id) {
                Ok((run, row)) => Ok(Some((run, row.value))),
                Err(keel_store::ReadError::NotFound { .. }) => Ok(None),
                Err(e) => Err(e.into()),
            })
            .await?;
        found.ok_or(AnswerError::NotFound(id))
    }

    /// Answers escalation `id` with `text`: checked against the escalation (open, not blank, one of
    /// its options), made durable (with the steering row of a paused task), then delivered to what
    /// waits for it in this process.
    ///
    /// # Errors
    /// [`AnswerError`]; on any error nothing was delivered.
    pub async fn answer_escalation(
        &self,
        id: EscalationId,
        text: &str,
    ) -> Result<Answered, AnswerError> {
        let (run, escalation) = self.escalation(id).await?;
        let text = check_answer(&escalation, text)?;
        let now = wall_clock_ms();
        // An approval is answered by whoever takes its waiter: a waiter already gone has expired
        // (or its process ended), and the escalation is closed then.
        let waiter = match escalation.waiting {
            EscalationWait::ToolCall { .. } => {
                let taken = lock(&self.node.approvals).remove(&id);
                if taken.is_none() {
                    return Err(AnswerError::Refused(AnswerRefusal::Closed {
                        id,
                        how: "no tool call waits for it any more".into(),
                    }));
                }
                taken
            }
            _ => None,
        };
        let ops = answer_ops(&escalation, &text, now);
        let written = self
            .node
            .stage_host(run, ops, Duration::from_millis(ESCALATION_WRITE_WAIT_MS))
            .await;
        if let Err(e) = written {
            if let Some(tx) = waiter {
                // Put the waiter back: the approval still waits (until its deadline).
                lock(&self.node.approvals).insert(id, tx);
            }
            return Err(AnswerError::NotWritten(e));
        }
        let delivered_to = match (waiter, &escalation.waiting, escalation.task_id) {
            (Some(tx), _, _) => tx.send(text.clone()).ok().map(|()| Delivered::ToolCall),
            (None, EscalationWait::Task, Some(task)) => self.node.coordinator(run).and_then(|c| {
                c.send_message(Deliver(CoordinatorInput::Msg(
                    CoordinatorMsg::EscalationAnswered {
                        escalation: id,
                        task,
                    },
                )))
                .ok()
                .map(|()| Delivered::Coordinator)
            }),
            _ => None,
        };
        Ok(Answered {
            run,
            escalation,
            text,
            delivered_to,
        })
    }
}
