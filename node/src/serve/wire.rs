//! The HTTP API's JSON: request bodies, the event stream's events and error bodies. Wire types kept
//! apart from the runtime's own (a serialized type is a compatibility promise): ids are ULID
//! strings, enums have stable snake_case tags, and a client turns an [`ApiEvent`] back into the
//! runtime's event to show the same live view as a local run. docs/openapi.yaml describes them.

use keel_actors::AttemptId;
use keel_actors::report::{FailureKind, SubagentReport};
use keel_actors::runtime::{RunOutcome, RuntimeEvent};
use keel_harness::{HarnessKind, TokenCounts};
use keel_store::{RunId, RunStatus, TaskId};
use serde::{Deserialize, Serialize};

/// Ids as their ULID text (a 128-bit number does not survive a JavaScript reader).
pub(crate) mod id_text {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::fmt::Display;
    use std::str::FromStr;

    /// Writes the id as its text.
    pub(crate) fn serialize<T: Display, S: Serializer>(id: &T, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(id)
    }

    /// Reads an id from its text.
    pub(crate) fn deserialize<'de, T, D>(d: D) -> Result<T, D::Error>
    where
        T: FromStr,
        T::Err: Display,
        D: Deserializer<'de>,
    {
        let text = std::borrow::Cow::<str>::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// `POST /v1/runs`: a brief to run, as `keel run` takes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct SubmitRun {
    /// The brief (not blank; at most the store's brief limit).
    pub(crate) brief: String,
    /// A fixed plan (the JSON of `keel run --plan`) instead of the server's default decomposition.
    #[serde(default)]
    pub(crate) plan: Option<keel_actors::Plan>,
    /// The agent profile the brief's single step goes to (without a plan, on a real harness).
    #[serde(default)]
    pub(crate) agent: Option<String>,
}

/// What `POST /v1/runs` and `POST /v1/runs/{run}/resume` answer.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Submitted {
    /// The new run.
    #[serde(with = "id_text")]
    pub(crate) run: RunId,
    /// The sequence number of the run's first event from now on: a stream or summary asked with
    /// `from` set to it shows what this request started, as a local command's live view does.
    pub(crate) events_from: u64,
    /// Where the run's sessions work, on the server.
    pub(crate) work_dir: String,
}

/// `POST /v1/tasks/{task}/follow-ups`: a follow-up on a task's thread, as `keel follow-up` takes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct AskFollowUp {
    /// The message, verbatim.
    pub(crate) message: String,
    /// The agent profile to put it on; the supervisor picks when left out.
    #[serde(default)]
    pub(crate) agent: Option<String>,
}

/// What `POST /v1/tasks/{task}/follow-ups` answers.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct FollowUpStarted {
    /// The run it joined or reopened.
    #[serde(with = "id_text")]
    pub(crate) run: RunId,
    /// The follow-up's own task.
    #[serde(with = "id_text")]
    pub(crate) task: TaskId,
    /// Whether the run was reopened (it had ended) rather than joined.
    pub(crate) reopened: bool,
    /// As [`Submitted::events_from`].
    pub(crate) events_from: u64,
    /// Where its session works, on the server.
    pub(crate) work_dir: String,
}

/// `POST /v1/runs/{run}/cancel`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CancelRun {
    /// Why (kept in the run's outcome); "cancelled by an operator" when left out.
    #[serde(default)]
    pub(crate) reason: Option<String>,
}

/// A command's output as the `keel` command prints it, for a client to print verbatim: the
/// human text, or the `--json` text, whichever was asked for. `completed` tells a run's command
/// its exit code.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Printed {
    /// What `keel` prints to stdout.
    pub(crate) stdout: String,
    /// For a run's end: whether it completed (exit 0) or not (exit 5). Absent for other output.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) completed: Option<bool>,
}

/// An error body: what went wrong, in a word a program can branch on and a sentence a person reads.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct ErrorBody {
    /// `unauthorized`, `not_found`, `bad_request`, `too_large`, `conflict`, `busy`, `internal`.
    pub(crate) error: String,
    /// What the problem is, naming the field or the limit.
    pub(crate) message: String,
}

/// One attempt of a task, as events name it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct ApiAttempt {
    /// Its run.
    #[serde(with = "id_text")]
    pub(crate) run: RunId,
    /// Its task.
    #[serde(with = "id_text")]
    pub(crate) task: TaskId,
    /// 1 for the first attempt.
    pub(crate) number: u32,
}

impl From<AttemptId> for ApiAttempt {
    fn from(a: AttemptId) -> Self {
        Self {
            run: a.run,
            task: a.task,
            number: a.attempt,
        }
    }
}

impl From<ApiAttempt> for AttemptId {
    fn from(a: ApiAttempt) -> Self {
        AttemptId {
            run: a.run,
            task: a.task,
            attempt: a.number,
        }
    }
}

/// One event of a run on `GET /v1/runs/{run}/events` (the SSE `event:` field is its `type`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub(crate) enum ApiEvent {
    /// A specialist attempt was admitted and spawned.
    TaskStarted {
        /// The attempt.
        attempt: ApiAttempt,
        /// Its plan step.
        step: String,
        /// Its agent profile.
        agent: String,
        /// Its harness.
        harness: HarnessKind,
        /// Its model.
        model: String,
    },
    /// A session log line of an attempt.
    Progress {
        /// The attempt.
        attempt: ApiAttempt,
        /// One line.
        summary: String,
    },
    /// Cumulative spend of an attempt.
    Spend {
        /// The attempt.
        attempt: ApiAttempt,
        /// Micro-dollars so far.
        spent_micros: u64,
    },
    /// Token usage of an attempt's session so far.
    Usage {
        /// The attempt.
        attempt: ApiAttempt,
        /// Tokens so far.
        tokens: TokenCounts,
        /// Micro-dollars so far.
        spent_micros: u64,
    },
    /// A report was made durable and acknowledged.
    Report {
        /// The attempt.
        attempt: ApiAttempt,
        /// Its plan step.
        step: String,
        /// The verified report.
        report: SubagentReport,
    },
    /// An attempt failed.
    TaskFailed {
        /// The attempt.
        attempt: ApiAttempt,
        /// Its plan step.
        step: String,
        /// The failure's kind.
        kind: FailureKind,
    },
    /// The run handed something to a human.
    Escalation {
        /// The run.
        #[serde(with = "id_text")]
        run: RunId,
        /// The task concerned, as a ULID string, if any.
        task: Option<String>,
        /// The diagnosis.
        reason: String,
    },
    /// The run was paused (the server stopped, or its disk is full); it is not terminal and
    /// continues when resumed. The stream ends after it.
    Paused {
        /// The run.
        #[serde(with = "id_text")]
        run: RunId,
        /// Why, and what to do.
        reason: String,
    },
    /// The run reached a terminal state (the stream ends after it).
    Finished {
        /// The run.
        #[serde(with = "id_text")]
        run: RunId,
        /// Its terminal status.
        status: RunStatus,
        /// The synthesis as JSON for a completed run, else the reason.
        outcome: String,
    },
}

impl ApiEvent {
    /// The wire form of a runtime event; `None` for a kind this version does not carry.
    pub(crate) fn from_runtime(event: &RuntimeEvent) -> Option<Self> {
        Some(match event.clone() {
            RuntimeEvent::TaskStarted {
                attempt,
                step,
                agent,
                harness,
                model,
            } => ApiEvent::TaskStarted {
                attempt: attempt.into(),
                step,
                agent,
                harness,
                model,
            },
            RuntimeEvent::Progress { attempt, summary } => ApiEvent::Progress {
                attempt: attempt.into(),
                summary,
            },
            RuntimeEvent::Spend {
                attempt,
                spent_micros,
            } => ApiEvent::Spend {
                attempt: attempt.into(),
                spent_micros,
            },
            RuntimeEvent::Usage {
                attempt,
                tokens,
                spent_micros,
            } => ApiEvent::Usage {
                attempt: attempt.into(),
                tokens,
                spent_micros,
            },
            RuntimeEvent::Report {
                attempt,
                step,
                report,
            } => ApiEvent::Report {
                attempt: attempt.into(),
                step,
                report,
            },
            RuntimeEvent::TaskFailed {
                attempt,
                step,
                kind,
            } => ApiEvent::TaskFailed {
                attempt: attempt.into(),
                step,
                kind,
            },
            RuntimeEvent::Escalation { run, task, reason } => ApiEvent::Escalation {
                run,
                task: task.map(|t| t.to_string()),
                reason,
            },
            RuntimeEvent::Paused { run, reason } => ApiEvent::Paused {
                run,
                reason: reason.to_string(),
            },
            RuntimeEvent::Finished(outcome) => ApiEvent::Finished {
                run: outcome.run,
                status: outcome.status,
                outcome: outcome.outcome,
            },
            _ => return None,
        })
    }

    /// The runtime event it stands for (a client feeds these to the same live view as a local
    /// run); `None` for a pause, whose reason the client prints itself.
    pub(crate) fn into_runtime(self) -> Option<RuntimeEvent> {
        Some(match self {
            ApiEvent::TaskStarted {
                attempt,
                step,
                agent,
                harness,
                model,
            } => RuntimeEvent::TaskStarted {
                attempt: attempt.into(),
                step,
                agent,
                harness,
                model,
            },
            ApiEvent::Progress { attempt, summary } => RuntimeEvent::Progress {
                attempt: attempt.into(),
                summary,
            },
            ApiEvent::Spend {
                attempt,
                spent_micros,
            } => RuntimeEvent::Spend {
                attempt: attempt.into(),
                spent_micros,
            },
            ApiEvent::Usage {
                attempt,
                tokens,
                spent_micros,
            } => RuntimeEvent::Usage {
                attempt: attempt.into(),
                tokens,
                spent_micros,
            },
            ApiEvent::Report {
                attempt,
                step,
                report,
            } => RuntimeEvent::Report {
                attempt: attempt.into(),
                step,
                report,
            },
            ApiEvent::TaskFailed {
                attempt,
                step,
                kind,
            } => RuntimeEvent::TaskFailed {
                attempt: attempt.into(),
                step,
                kind,
            },
            ApiEvent::Escalation { run, task, reason } => RuntimeEvent::Escalation {
                run,
                task: task.and_then(|t| t.parse().ok()),
                reason,
            },
            ApiEvent::Finished {
                run,
                status,
                outcome,
            } => RuntimeEvent::Finished(RunOutcome {
                run,
                status,
                outcome,
            }),
            ApiEvent::Paused { .. } => return None,
        })
    }

    /// Whether the run's stream ends with it (the run ended, or was paused).
    pub(crate) fn ends_stream(&self) -> bool {
        matches!(self, ApiEvent::Finished { .. } | ApiEvent::Paused { .. })
    }

    /// The run it belongs to.
    pub(crate) fn run(&self) -> RunId {
        match self {
            ApiEvent::TaskStarted { attempt, .. }
            | ApiEvent::Progress { attempt, .. }
            | ApiEvent::Spend { attempt, .. }
            | ApiEvent::Usage { attempt, .. }
            | ApiEvent::Report { attempt, .. }
            | ApiEvent::TaskFailed { attempt, .. } => attempt.run,
            ApiEvent::Escalation { run, .. }
            | ApiEvent::Paused { run, .. }
            | ApiEvent::Finished { run, .. } => *run,
        }
    }

    /// Its SSE event name (the `type` tag).
    pub(crate) fn name(&self) -> &'static str {
        match self {
            ApiEvent::TaskStarted { .. } => "task_started",
            ApiEvent::Progress { .. } => "progress",
            ApiEvent::Spend { .. } => "spend",
            ApiEvent::Usage { .. } => "usage",
            ApiEvent::Report { .. } => "report",
            ApiEvent::TaskFailed { .. } => "task_failed",
            ApiEvent::Escalation { .. } => "escalation",
            ApiEvent::Paused { .. } => "paused",
            ApiEvent::Finished { .. } => "finished",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attempt() -> AttemptId {
        AttemptId {
            run: RunId(7),
            task: TaskId(9),
            attempt: 2,
        }
    }

    #[test]
    fn events_round_trip_through_json_with_ids_as_text() {
        let events = [
            RuntimeEvent::TaskStarted {
                attempt: attempt(),
                step: "s".into(),
                agent: "a".into(),
                harness: HarnessKind::MessagesApi,
                model: "m".into(),
            },
            RuntimeEvent::TaskFailed {
                attempt: attempt(),
                step: "s".into(),
                kind: FailureKind::Timeout,
            },
            RuntimeEvent::Finished(RunOutcome {
                run: RunId(7),
                status: RunStatus::Completed,
                outcome: "{}".into(),
            }),
        ];
        for event in events {
            let wire = ApiEvent::from_runtime(&event).unwrap();
            let text = serde_json::to_string(&wire).unwrap();
            assert!(
                text.contains(&format!("\"run\":\"{}\"", RunId(7))),
                "{text}"
            );
            assert!(
                text.contains(&format!("\"type\":\"{}\"", wire.name())),
                "{text}"
            );
            let back: ApiEvent = serde_json::from_str(&text).unwrap();
            assert_eq!(back.run(), RunId(7));
            assert_eq!(back.into_runtime(), Some(event));
        }
    }

    #[test]
    fn a_submission_with_an_unknown_field_is_refused_by_name() {
        let err = serde_json::from_str::<SubmitRun>(r#"{"brief":"b","brif":"x"}"#).unwrap_err();
        assert!(err.to_string().contains("brif"), "{err}");
    }
}
