//! Values for the cluster's tests: a specialist start as the supervisor would hand it over.
#![allow(dead_code)]

use keel_actors::{
    Assignment, AttemptId, Continuity, Coordinator, ReplyTo, SpecialistStart, SubtaskBrief,
};
use keel_harness::HarnessKind;
use keel_store::{RunId, TaskId, TaskKind};

/// An attempt of task `task` of run 7.
pub fn attempt(task: u128, n: u32) -> AttemptId {
    AttemptId {
        run: RunId(7),
        task: TaskId(task),
        attempt: n,
    }
}

/// A reply address, as a worker gets it: decoded (only keel-actors mints one in process).
pub fn reply_to(attempt: AttemptId) -> ReplyTo<Coordinator> {
    let bytes = bincode::serde::encode_to_vec(attempt, bincode::config::standard()).unwrap();
    bincode::serde::decode_from_slice(&bytes, bincode::config::standard())
        .unwrap()
        .0
}

/// A start of `attempt` on `harness`.
pub fn start(attempt: AttemptId, harness: HarnessKind, brief: &str) -> SpecialistStart {
    SpecialistStart {
        attempt,
        reply_to: reply_to(attempt),
        brief: SubtaskBrief {
            step: format!("step-{}", attempt.task.0),
            task: attempt.task,
            brief: brief.into(),
            goal: "a goal".into(),
            quality_criteria: vec!["sourced".into()],
            prior_findings: Vec::new(),
            output_schema: None,
            constraints: vec!["stay in the folder".into()],
            known_gaps: Vec::new(),
            aliases: Vec::new(),
        },
        assignment: Assignment {
            agent: "scripted".into(),
            harness,
            model: "keel-scripted-1".into(),
            tools: Vec::new(),
            system_prompt: String::new(),
            turns_max: None,
            account: "scripted-local".into(),
        },
        continuity: Continuity::Fresh,
        kind: TaskKind::Subtask,
        deadline_at: 1_000_000,
        task: attempt.task,
    }
}
