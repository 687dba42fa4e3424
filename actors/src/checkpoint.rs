//! The checkpoint writer: the only writer of progress (docs/DESIGN.md §4).
//!
//! Coordinators send it [`Stage`]s (the writes of one decision); it batches whatever arrived while the
//! previous commit was in flight into the next one (group commit: one transaction, one fsync for many
//! stages), asks its host to commit, and acknowledges each stage to its coordinator only after the host
//! says the commit is durable. A stage is never split across transactions. A failed commit wrote
//! nothing; it is retried with backoff a bounded number of times, then its stages are answered with
//! `PersistFailed` so no coordinator waits forever. A write the store refuses (a limit it passed, a
//! row it cannot apply) is one run's permanent failure: that run's stages are answered with it, and
//! the other runs' stages of the commit go again at once, so one run cannot fail another's writes.
//!
//! Riding stages ([`CheckpointMsg::Riding`]: writes no consequence waits on soon) start no commit of
//! their own: they wait in the queue, in order with the others, until a stage that needs a commit
//! arrives or until they have waited [`CheckpointConfig::ride_linger_ms`]. A run's durable commits
//! then follow its decisions that need them, not every row it writes.

use crate::effect::{Effect, Envelope, TimerKey};
use crate::machine::{Entropy, Machine, Millis};
use crate::message::{CheckpointInput, CheckpointMsg, CheckpointTimer, CoordinatorMsg};
use crate::persist::{CommitBatch, CommitId, STAGE_OPS_MAX, Stage, StageOwner};
use keel_store::RunId;
use std::collections::{BTreeSet, VecDeque};

/// Bounds of the checkpoint writer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CheckpointConfig {
    /// Most ops in one commit (keep it at or below the store's `batch_items_max`). The stages of
    /// one message are never split, so a message over it gets a commit of its own.
    pub batch_ops_max: u32,
    /// Most stages waiting for a commit; past it a stage is refused with `PersistFailed`.
    pub queued_stages_max: u32,
    /// Most retries of a failed commit before its stages are answered with `PersistFailed`.
    pub commit_retries_max: u32,
    /// Wait before the first retry; doubles per retry.
    pub retry_backoff_ms: Millis,
    /// Longest a riding stage waits for a commit another stage needs before it gets one of its own.
    pub ride_linger_ms: Millis,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self {
            batch_ops_max: 4096,
            queued_stages_max: 4096,
            commit_retries_max: 5,
            retry_backoff_ms: 20,
            ride_linger_ms: 20,
        }
    }
}

/// A stage waiting for a commit.
#[derive(Debug)]
struct Queued {
    stage: Stage,
    /// Whether it needs a commit (false: it may ride).
    urgent: bool,
    /// Whether it must go into the same commit as the stage after it: the stages of one message
    /// ([`CheckpointMsg::Stages`], [`CheckpointMsg::Riding`]) are one coordinator input's writes,
    /// and only the last of them that needs the run's checkpoint carries it, so they are never
    /// split across commits.
    joined: bool,
}

#[derive(Debug)]
struct InFlight {
    id: CommitId,
    stages: std::sync::Arc<[Stage]>,
    retries: u32,
    /// Waiting for the retry timer rather than for the host.
    waiting_retry: bool,
}

/// The checkpoint writer of a coordinator node (named for its role; the store's `Checkpoint` row is one
/// of the things it writes).
#[derive(Debug)]
pub struct CheckpointWriter {
    config: CheckpointConfig,
    /// Stages waiting for a commit, in order.
    queue: VecDeque<Queued>,
    /// Of `queue`, the stages that need a commit.
    urgent_queued: usize,
    /// The ops of the stages in `queue`.
    queued_ops: usize,
    /// The linger timer armed for the riding stages in `queue`, if any (its number).
    linger: Option<u64>,
    /// Whether the linger bound passed for the riding stages now in `queue`.
    lingered: bool,
    in_flight: Option<InFlight>,
    next_commit: u64,
    commits_count: u64,
}

impl CheckpointWriter {
    /// An idle writer. After a crash a new one starts empty. Its commit ids start at a point drawn from
    /// the injected stream on its first input, so a late completion of an old writer's commit is not
    /// mistaken for one of the new writer's.
    pub fn new(config: CheckpointConfig) -> Self {
        Self {
            config,
            queue: VecDeque::new(),
            urgent_queued: 0,
            queued_ops: 0,
            linger: None,
            lingered: false,
            in_flight: None,
            next_commit: 0,
            commits_count: 0,
        }
    }

    /// Stages waiting for the next commit.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Commits made durable so far (for benchmarks and the simulator's statistics).
    pub fn commits_count(&self) -> u64 {
        self.commits_count
    }

    /// Answer a stage's owner: its coordinator, or the host for the host's own stages.
    fn answer(stage: &Stage, result: Result<(), String>, out: &mut Vec<Effect>) {
        Self::answer_as(stage, result, false, out);
    }

    /// [`Self::answer`], a failure marked `permanent` when sending the stage again cannot help.
    fn answer_as(
        stage: &Stage,
        result: Result<(), String>,
        permanent: bool,
        out: &mut Vec<Effect>,
    ) {
        let (run, ticket) = (stage.run, stage.ticket);
        let envelope = match stage.owner {
            StageOwner::Coordinator => Envelope::Coordinator {
                run,
                msg: match result {
                    Ok(()) => CoordinatorMsg::Durable { ticket },
                    Err(error) => CoordinatorMsg::PersistFailed {
                        ticket,
                        error,
                        permanent,
                    },
                },
            },
            StageOwner::Host => Envelope::Host {
                run,
                ticket,
                result,
            },
        };
        out.push(Effect::Send(envelope));
    }

    /// Answer a durable commit: each host stage by its ticket, each coordinator once, with the
    /// newest of its stages in the commit (its stages commit in ticket order, so `Durable` for that
    /// ticket covers every earlier one it sent: one message per run and commit, not per stage).
    fn answer_durable(stages: &[Stage], out: &mut Vec<Effect>) {
        let mut newest = std::collections::BTreeMap::new();
        for (i, stage) in stages.iter().enumerate() {
            if stage.owner == StageOwner::Coordinator {
                newest.insert(stage.run, i);
            }
        }
        for (i, stage) in stages.iter().enumerate() {
            if stage.owner == StageOwner::Host || newest.get(&stage.run) == Some(&i) {
                Self::answer(stage, Ok(()), out);
            }
        }
    }

    /// Why a stage cannot be queued (too many ops, queue full), if it cannot.
    /// Why a stage cannot be queued, and whether that is permanent (its size) or passing (a full
    /// queue).
    fn refusal(&self, stage: &Stage, queued: usize) -> Option<(String, bool)> {
        if stage.ops.len() > STAGE_OPS_MAX || stage.ops.len() > self.config.batch_ops_max as usize {
            return Some((
                format!("a stage of {} ops exceeds the limit", stage.ops.len()),
                true,
            ));
        }
        if queued >= self.config.queued_stages_max as usize {
            return Some((
                "the checkpoint queue is full; stage again later".to_string(),
                false,
            ));
        }
        None
    }

    /// Queue the stages of one message for the next commit, together (`urgent`: they need one;
    /// else they may ride), or refuse them all with `PersistFailed` when one of them cannot be
    /// queued (too many ops, queue full): they are one input's writes and commit whole or not at
    /// all, so a run's writes still commit as a prefix of its decisions.
    fn enqueue(&mut self, stages: Vec<Stage>, urgent: bool, out: &mut Vec<Effect>) {
        let refused = stages
            .iter()
            .enumerate()
            .find_map(|(i, stage)| self.refusal(stage, self.queue.len() + i));
        if let Some((error, permanent)) = refused {
            for stage in &stages {
                Self::answer_as(stage, Err(error.clone()), permanent, out);
            }
            return;
        }
        let last = stages.len().saturating_sub(1);
        for (i, stage) in stages.into_iter().enumerate() {
            self.urgent_queued += usize::from(urgent);
            self.queued_ops += stage.ops.len();
            self.queue.push_back(Queued {
                stage,
                urgent,
                joined: i < last,
            });
        }
    }

    /// Fail every queued stage of `runs` after an earlier write of theirs failed: a run's writes
    /// only ever commit as a prefix of what its coordinator decided.
    fn fail_queued(
        &mut self,
        runs: &BTreeSet<RunId>,
        error: &str,
        permanent: bool,
        out: &mut Vec<Effect>,
    ) {
        let (dependent, rest): (VecDeque<_>, VecDeque<_>) = std::mem::take(&mut self.queue)
            .into_iter()
            .partition(|q| runs.contains(&q.stage.run));
        self.queue = rest;
        self.urgent_queued = self.queue.iter().filter(|q| q.urgent).count();
        self.queued_ops = self.queue.iter().map(|q| q.stage.ops.len()).sum();
        for q in &dependent {
            let error = format!("an earlier write of this run failed: {error}");
            Self::answer_as(&q.stage, Err(error), permanent, out);
        }
    }

    /// Arm the linger timer for riding stages that wait with no commit coming for them.
    fn arm_linger(&mut self, now: Millis, out: &mut Vec<Effect>) {
        if self.linger.is_some() || self.lingered || self.queue.is_empty() {
            return;
        }
        let n = self.next_commit;
        self.linger = Some(n);
        out.push(Effect::SetTimer {
            key: TimerKey::Checkpoint(CheckpointTimer::Linger(n)),
            at: now.saturating_add(self.config.ride_linger_ms),
        });
    }

    /// Start the next commit when none is in flight and the queue holds a stage that needs one (or
    /// riding stages that waited their bound, or more riding ops than one commit takes).
    fn flush(&mut self, now: Millis, out: &mut Vec<Effect>) {
        if self.in_flight.is_some() || self.queue.is_empty() {
            return;
        }
        if self.urgent_queued == 0
            && !self.lingered
            && self.queued_ops < self.config.batch_ops_max as usize
        {
            self.arm_linger(now, out);
            return;
        }
        let mut ops = 0usize;
        let mut stages = Vec::new();
        while !self.queue.is_empty() {
            // The stages of one message go whole (see `Queued::joined`).
            let mut group = 0;
            let mut n = 0;
            for q in &self.queue {
                group += 1;
                n += q.stage.ops.len();
                if !q.joined {
                    break;
                }
            }
            if !stages.is_empty() && ops + n > self.config.batch_ops_max as usize {
                break;
            }
            ops += n;
            for q in self.queue.drain(..group) {
                self.urgent_queued -= usize::from(q.urgent);
                self.queued_ops -= q.stage.ops.len();
                stages.push(q.stage);
            }
        }
        if self.queue.is_empty() {
            self.lingered = false;
            self.linger = None;
        }
        let id = CommitId(self.next_commit);
        self.next_commit += 1;
        let stages: std::sync::Arc<[Stage]> = stages.into();
        out.push(Effect::Persist(CommitBatch {
            id,
            stages: std::sync::Arc::clone(&stages),
        }));
        self.in_flight = Some(InFlight {
            id,
            stages,
            retries: 0,
            waiting_retry: false,
        });
    }
}

impl Machine for CheckpointWriter {
    type Input = CheckpointInput;
    type Effect = Effect;

    fn handle(
        &mut self,
        input: CheckpointInput,
        now: Millis,
        rng: &mut dyn Entropy,
        out: &mut Vec<Effect>,
    ) {
        if self.next_commit == 0 {
            // 62 random bits: room for any number of commits without wrapping.
            self.next_commit = (rng.next_u64() >> 2).max(1);
        }
        match input {
            CheckpointInput::Msg(CheckpointMsg::Stage(stage)) => {
                self.enqueue(vec![stage], true, out);
                self.flush(now, out);
            }
            CheckpointInput::Msg(CheckpointMsg::Stages(stages)) => {
                self.enqueue(stages, true, out);
                self.flush(now, out);
            }
            CheckpointInput::Msg(CheckpointMsg::Riding(stages)) => {
                self.enqueue(stages, false, out);
                self.flush(now, out);
            }
            CheckpointInput::Timer(CheckpointTimer::Linger(n)) => {
                if self.linger != Some(n) {
                    return; // a timer of riding stages that have been committed since
                }
                self.linger = None;
                self.lingered = true;
                self.flush(now, out);
            }
            CheckpointInput::Committed(id) => {
                let Some(flight) = self.in_flight.take_if(|f| f.id == id && !f.waiting_retry)
                else {
                    return; // a completion of a commit this writer no longer waits for
                };
                self.commits_count += 1;
                Self::answer_durable(&flight.stages, out);
                self.flush(now, out);
            }
            CheckpointInput::CommitFailed { id, error } => {
                let Some(flight) = self.in_flight.as_mut().filter(|f| f.id == id) else {
                    return;
                };
                if flight.retries < self.config.commit_retries_max {
                    let delay = self
                        .config
                        .retry_backoff_ms
                        .saturating_mul(1u64 << flight.retries.min(20));
                    flight.retries += 1;
                    flight.waiting_retry = true;
                    out.push(Effect::SetTimer {
                        key: TimerKey::Checkpoint(CheckpointTimer::RetryCommit(id)),
                        at: now.saturating_add(delay),
                    });
                    return;
                }
                if let Some(flight) = self.in_flight.take() {
                    let error = format!("commit failed after {} retries: {error}", flight.retries);
                    for stage in flight.stages.iter() {
                        let error = error.clone();
                        Self::answer(stage, Err(error), out);
                    }
                    let runs: BTreeSet<_> = flight.stages.iter().map(|s| s.run).collect();
                    self.fail_queued(&runs, &error, false, out);
                }
                self.flush(now, out);
            }
            CheckpointInput::Refused { id, run, error } => {
                let Some(flight) = self.in_flight.take_if(|f| f.id == id && !f.waiting_retry)
                else {
                    return;
                };
                // The refusal is the run's and permanent: its stages fail (a retry would fail the
                // same way), and so do its later ones.
                let mut others = Vec::with_capacity(flight.stages.len());
                for stage in flight.stages.iter() {
                    if stage.run == run {
                        Self::answer_as(stage, Err(error.clone()), true, out);
                    } else {
                        others.push(stage.clone());
                    }
                }
                self.fail_queued(&BTreeSet::from([run]), &error, true, out);
                // The other runs' stages commit again at once, ahead of what queued since and
                // together (they fitted one commit, and a message of theirs is never split).
                let last = others.len().saturating_sub(1);
                for (i, stage) in others.into_iter().enumerate().rev() {
                    self.urgent_queued += 1;
                    self.queued_ops += stage.ops.len();
                    self.queue.push_front(Queued {
                        stage,
                        urgent: true,
                        joined: i < last,
                    });
                }
                self.flush(now, out);
            }
            CheckpointInput::Abandon { reason } => {
                if let Some(flight) = self.in_flight.take() {
                    for stage in flight.stages.iter() {
                        Self::answer(stage, Err(reason.clone()), out);
                    }
                }
                for q in std::mem::take(&mut self.queue) {
                    Self::answer(&q.stage, Err(reason.clone()), out);
                }
                self.urgent_queued = 0;
                self.queued_ops = 0;
                self.linger = None;
                self.lingered = false;
            }
            CheckpointInput::Timer(CheckpointTimer::RetryCommit(id)) => {
                let next = CommitId(self.next_commit);
                let Some(flight) = self
                    .in_flight
                    .as_mut()
                    .filter(|f| f.id == id && f.waiting_retry)
                else {
                    return;
                };
                // A fresh id, so a late completion of the failed try cannot be taken for this one.
                self.next_commit += 1;
                flight.id = next;
                flight.waiting_retry = false;
                out.push(Effect::Persist(CommitBatch {
                    id: next,
                    stages: std::sync::Arc::clone(&flight.stages),
                }));
            }
        }
    }
}
