//! The checkpoint writer: group commit, acknowledgement only after durability, bounded retries.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use keel_actors::*;
use keel_store::{ManifestEntry, ManifestOutcome, RunId};

fn stage_of(run: u128, ticket: u64, ops: usize) -> Stage {
    Stage {
        run: RunId(run),
        owner: StageOwner::Coordinator,
        ticket,
        ops: (0..ops)
            .map(|i| {
                PersistOp::AppendManifest(ManifestEntry {
                    ts_ms: 0,
                    item: format!("item{i}"),
                    task_id: None,
                    outcome: ManifestOutcome::Processed,
                })
            })
            .collect::<Vec<_>>()
            .into(),
    }
}

fn stage(run: u128, ticket: u64, ops: usize) -> CheckpointInput {
    CheckpointInput::Msg(CheckpointMsg::Stage(stage_of(run, ticket, ops)))
}

fn riding(run: u128, ticket: u64, ops: usize) -> CheckpointInput {
    CheckpointInput::Msg(CheckpointMsg::Riding(vec![stage_of(run, ticket, ops)]))
}

/// What one input produced, summarised: commits as (id, tickets), acks, failures, timers.
#[derive(Debug, Default, PartialEq, Eq)]
struct Seen {
    commits: Vec<(u64, Vec<u64>)>,
    durable: Vec<u64>,
    failed: Vec<u64>,
    timers: u32,
}

/// Commit ids start at a point drawn from the stream; specs name them 1, 2, 3 relative to that.
fn base() -> u64 {
    let mut w = CheckpointWriter::new(CheckpointConfig::default());
    let mut out = Vec::new();
    w.handle(stage(1, 1, 1), 0, &mut SplitMix64(0), &mut out);
    match &out[0] {
        Effect::Persist(b) => b.id.0 - 1,
        other => panic!("expected a commit, got {other:?}"),
    }
}

fn seen(effects: &[Effect]) -> Seen {
    let mut s = Seen::default();
    for e in effects {
        match e {
            Effect::Persist(b) => s.commits.push((
                b.id.0 - base(),
                b.stages.iter().map(|st| st.ticket).collect(),
            )),
            Effect::Send(Envelope::Coordinator {
                msg: CoordinatorMsg::Durable { ticket },
                ..
            }) => s.durable.push(*ticket),
            Effect::Send(Envelope::Coordinator {
                msg: CoordinatorMsg::PersistFailed { ticket, .. },
                ..
            }) => s.failed.push(*ticket),
            Effect::SetTimer { .. } => s.timers += 1,
            other => panic!("unexpected effect {other:?}"),
        }
    }
    s
}

/// Feed inputs in order; compare what each produced with the expected list.
fn check(config: CheckpointConfig, steps: Vec<(CheckpointInput, Seen)>) {
    let mut w = CheckpointWriter::new(config);
    let mut rng = SplitMix64(0);
    for (i, (input, want)) in steps.into_iter().enumerate() {
        let mut out = Vec::new();
        w.handle(input, 0, &mut rng, &mut out);
        assert_eq!(seen(&out), want, "step {i}");
    }
}

fn commit(id: u64, tickets: &[u64]) -> Seen {
    Seen {
        commits: vec![(id, tickets.to_vec())],
        ..Seen::default()
    }
}

/// A run row of `run` as the coordinator writes it, updated at `updated_ms`.
fn run_row(run: RunId, updated_ms: u64) -> keel_store::Run {
    keel_store::Run {
        id: run,
        brief: "b".into(),
        plan: None,
        status: keel_store::RunStatus::Running,
        budget: Default::default(),
        created_ms: 0,
        updated_ms,
        config_snapshot: String::new(),
        outcome: None,
    }
}

/// A checkpoint row of `run` holding `state`.
fn checkpoint_row(
    run: RunId,
    correlation_id: String,
    state: String,
    written_ms: u64,
) -> keel_store::Checkpoint {
    keel_store::Checkpoint {
        run_id: run,
        last_completed_step: None,
        verified_outputs: Vec::new(),
        pending_work: Vec::new(),
        correlation_id,
        state,
        written_ms,
    }
}

#[test]
fn stages_arriving_during_a_commit_share_the_next_one() {
    check(
        CheckpointConfig::default(),
        vec![
            (stage(1, 1, 2), commit(1, &[1])),
            (stage(1, 2, 2), Seen::default()),
            (stage(2, 7, 2), Seen::default()),
            // Acks only after the commit, then the waiting stages go together.
            (
                CheckpointInput::Committed(CommitId(base() + 1)),
                Seen {
                    durable: vec![1],
                    commits: vec![(2, vec![2, 7])],
                    ..Seen::default()
                },
            ),
            (
                CheckpointInput::Committed(CommitId(base() + 2)),
                Seen {
                    durable: vec![2, 7],
                    ..Seen::default()
                },
            ),
        ],
    );
}

#[test]
fn a_batch_never_exceeds_its_op_bound_and_never_splits_a_stage() {
    let config = CheckpointConfig {
        batch_ops_max: 5,
        ..CheckpointConfig::default()
    };
    check(
        config,
        vec![
            (stage(1, 1, 1), commit(1, &[1])),
            (stage(1, 2, 3), Seen::default()),
            (stage(1, 3, 3), Seen::default()),
            (
                CheckpointInput::Committed(CommitId(base() + 1)),
                Seen {
                    durable: vec![1],
                    commits: vec![(2, vec![2])],
                    ..Seen::default()
                },
            ),
            (
                CheckpointInput::Committed(CommitId(base() + 2)),
                Seen {
                    durable: vec![2],
                    commits: vec![(3, vec![3])],
                    ..Seen::default()
                },
            ),
            (
                stage(1, 4, 6),
                Seen {
                    failed: vec![4],
                    ..Seen::default()
                },
            ),
        ],
    );
}

#[test]
fn a_failed_commit_is_retried_then_answered_with_a_failure() {
    let config = CheckpointConfig {
        commit_retries_max: 1,
        ..CheckpointConfig::default()
    };
    let failed = |id| CheckpointInput::CommitFailed {
        id: CommitId(base() + id),
        error: "disk".into(),
    };
    let retry = |id| CheckpointInput::Timer(CheckpointTimer::RetryCommit(CommitId(base() + id)));
    check(
        config,
        vec![
            (stage(1, 1, 1), commit(1, &[1])),
            (
                failed(1),
                Seen {
                    timers: 1,
                    ..Seen::default()
                },
            ),
            // A late success of the failed try is not taken for the retry.
            (
                CheckpointInput::Committed(CommitId(base() + 1)),
                Seen::default(),
            ),
            (retry(1), commit(2, &[1])),
            (
                failed(2),
                Seen {
                    failed: vec![1],
                    ..Seen::default()
                },
            ),
            (stage(1, 2, 1), commit(3, &[2])),
        ],
    );
}

#[test]
fn a_full_queue_refuses_instead_of_growing() {
    let config = CheckpointConfig {
        queued_stages_max: 1,
        ..CheckpointConfig::default()
    };
    check(
        config,
        vec![
            (stage(1, 1, 1), commit(1, &[1])),
            (stage(1, 2, 1), Seen::default()),
            (
                stage(1, 3, 1),
                Seen {
                    failed: vec![3],
                    ..Seen::default()
                },
            ),
        ],
    );
}

#[test]
fn a_restarted_writer_ignores_completions_of_the_old_one() {
    check(
        CheckpointConfig::default(),
        vec![
            (
                CheckpointInput::Committed(CommitId(base() + 1)),
                Seen::default(),
            ),
            (stage(1, 1, 1), commit(1, &[1])),
        ],
    );
}

#[test]
fn a_permanent_failure_also_fails_the_runs_later_stages() {
    let config = CheckpointConfig {
        commit_retries_max: 0,
        ..CheckpointConfig::default()
    };
    let failed = CheckpointInput::CommitFailed {
        id: CommitId(base() + 1),
        error: "disk".into(),
    };
    check(
        config,
        vec![
            (stage(1, 1, 1), commit(1, &[1])),
            (stage(1, 2, 1), Seen::default()),
            (stage(2, 9, 1), Seen::default()),
            (
                failed,
                Seen {
                    failed: vec![1, 2],
                    commits: vec![(2, vec![9])],
                    ..Seen::default()
                },
            ),
        ],
    );
}

#[test]
fn the_stages_of_one_decision_go_into_one_commit() {
    let many = |tickets: &[u64]| {
        CheckpointInput::Msg(CheckpointMsg::Stages(
            tickets
                .iter()
                .map(|&t| match stage(1, t, 2) {
                    CheckpointInput::Msg(CheckpointMsg::Stage(s)) => s,
                    _ => unreachable!(),
                })
                .collect(),
        ))
    };
    check(
        CheckpointConfig::default(),
        vec![
            // An idle writer commits all of them at once, not the first alone.
            (many(&[1, 2, 3]), commit(1, &[1, 2, 3])),
            (many(&[4, 5]), Seen::default()),
            // One answer for the run, its newest ticket (its stages commit in ticket order).
            (
                CheckpointInput::Committed(CommitId(base() + 1)),
                Seen {
                    durable: vec![3],
                    commits: vec![(2, vec![4, 5])],
                    ..Seen::default()
                },
            ),
        ],
    );
}

#[test]
fn a_row_replaced_again_later_in_a_commit_is_written_once() {
    let run = RunId(1);
    let checkpoint =
        |n: u64| PersistOp::PutCheckpoint(checkpoint_row(run, format!("c{n}"), String::new(), n));
    let update = |n: u64| PersistOp::UpdateRun(run_row(run, n));
    let manifest = PersistOp::AppendManifest(ManifestEntry {
        ts_ms: 0,
        item: "x".into(),
        task_id: None,
        outcome: ManifestOutcome::Processed,
    });
    let other = RunId(2);
    let other_checkpoint =
        PersistOp::PutCheckpoint(checkpoint_row(other, "other".into(), String::new(), 0));
    let batch = CommitBatch {
        id: CommitId(1),
        stages: vec![
            Stage {
                run,
                owner: StageOwner::Coordinator,
                ticket: 1,
                ops: vec![update(1), manifest.clone(), checkpoint(1)].into(),
            },
            Stage {
                run: other,
                owner: StageOwner::Coordinator,
                ticket: 1,
                ops: vec![other_checkpoint.clone()].into(),
            },
            Stage {
                run,
                owner: StageOwner::Coordinator,
                ticket: 2,
                ops: vec![manifest.clone(), checkpoint(2), update(2)].into(),
            },
        ]
        .into(),
    };
    let ops: Vec<(RunId, PersistOp)> = batch.ops().map(|(r, op)| (r, op.clone())).collect();
    assert_eq!(
        ops,
        vec![
            (run, manifest.clone()),
            (other, other_checkpoint),
            (run, manifest),
            (run, checkpoint(2)),
            (run, update(2)),
        ]
    );
    assert_eq!(batch.all_ops().count(), 7);
}

/// A stage the host owns is answered to the host, never as a coordinator message: the owner is a
/// type, not a range of tickets, so a coordinator ticket of any size cannot be taken for the host's.
#[test]
fn a_host_stage_is_answered_to_the_host_and_a_coordinator_stage_to_its_coordinator() {
    let mut w = CheckpointWriter::new(CheckpointConfig::default());
    let mut rng = SplitMix64(0);
    let mut out = Vec::new();
    let host = Stage {
        run: RunId(1),
        owner: StageOwner::Host,
        ticket: u64::MAX,
        ops: vec![PersistOp::AppendManifest(ManifestEntry {
            ts_ms: 0,
            item: "host".into(),
            task_id: None,
            outcome: ManifestOutcome::Processed,
        })]
        .into(),
    };
    let coordinator = Stage {
        owner: StageOwner::Coordinator,
        ticket: u64::MAX,
        ..host.clone()
    };
    w.handle(
        CheckpointInput::Msg(CheckpointMsg::Stages(vec![host, coordinator])),
        0,
        &mut rng,
        &mut out,
    );
    let Some(Effect::Persist(batch)) = out.pop() else {
        panic!("expected one commit, got {out:?}");
    };
    w.handle(CheckpointInput::Committed(batch.id), 0, &mut rng, &mut out);
    assert_eq!(
        out,
        vec![
            Effect::Send(Envelope::Host {
                run: RunId(1),
                ticket: u64::MAX,
                result: Ok(()),
            }),
            Effect::Send(Envelope::Coordinator {
                run: RunId(1),
                msg: CoordinatorMsg::Durable { ticket: u64::MAX },
            }),
        ]
    );
}

#[test]
fn an_abandon_answers_every_waiting_stage_and_ignores_the_late_completion() {
    let abandon = CheckpointInput::Abandon {
        reason: "the node paused".into(),
    };
    check(
        CheckpointConfig::default(),
        vec![
            (stage(1, 1, 1), commit(1, &[1])),
            (stage(1, 2, 1), Seen::default()),
            (
                abandon,
                Seen {
                    failed: vec![1, 2],
                    ..Seen::default()
                },
            ),
            // The abandoned commit's completion is not taken for anything.
            (
                CheckpointInput::Committed(CommitId(base() + 1)),
                Seen::default(),
            ),
            // Idle again: the next stage commits at once.
            (stage(1, 3, 1), commit(2, &[3])),
        ],
    );
}

#[test]
fn riding_stages_wait_for_a_stage_that_needs_a_commit_and_share_it() {
    check(
        CheckpointConfig::default(),
        vec![
            // No commit for a riding stage alone: only its linger timer.
            (
                riding(1, 1, 1),
                Seen {
                    timers: 1,
                    ..Seen::default()
                },
            ),
            (riding(2, 5, 1), Seen::default()),
            // A stage that needs a commit takes the riders into it, in the order they came.
            (stage(1, 2, 1), commit(1, &[1, 5, 2])),
            // One answer per run, its newest ticket: run 1's covers its ticket 1 as well.
            (
                CheckpointInput::Committed(CommitId(base() + 1)),
                Seen {
                    durable: vec![5, 2],
                    ..Seen::default()
                },
            ),
        ],
    );
}

#[test]
fn riding_stages_alone_get_a_commit_once_they_waited_their_bound() {
    let linger = CheckpointInput::Timer(CheckpointTimer::Linger(base() + 1));
    check(
        CheckpointConfig::default(),
        vec![
            (
                riding(1, 1, 1),
                Seen {
                    timers: 1,
                    ..Seen::default()
                },
            ),
            (riding(1, 2, 1), Seen::default()),
            (linger.clone(), commit(1, &[1, 2])),
            (
                CheckpointInput::Committed(CommitId(base() + 1)),
                Seen {
                    durable: vec![2],
                    ..Seen::default()
                },
            ),
            // The timer of riders already committed changes nothing.
            (linger, Seen::default()),
        ],
    );
}

#[test]
fn riding_ops_beyond_one_commit_do_not_wait_for_the_bound() {
    let config = CheckpointConfig {
        batch_ops_max: 4,
        ..CheckpointConfig::default()
    };
    check(
        config,
        vec![
            (
                riding(1, 1, 2),
                Seen {
                    timers: 1,
                    ..Seen::default()
                },
            ),
            (riding(1, 2, 2), commit(1, &[1, 2])),
        ],
    );
}

fn stages_msg(urgent: bool, stages: &[(u64, usize)]) -> CheckpointInput {
    let stages = stages.iter().map(|&(t, n)| stage_of(1, t, n)).collect();
    CheckpointInput::Msg(if urgent {
        CheckpointMsg::Stages(stages)
    } else {
        CheckpointMsg::Riding(stages)
    })
}

#[test]
fn the_stages_of_one_message_are_never_split_across_commits() {
    let config = CheckpointConfig {
        batch_ops_max: 5,
        ..CheckpointConfig::default()
    };
    check(
        config,
        vec![
            // Six ops in one message: over the bound, committed together all the same.
            (stages_msg(true, &[(1, 3), (2, 3)]), commit(1, &[1, 2])),
            (stage(1, 3, 2), Seen::default()),
            (stages_msg(true, &[(4, 2), (5, 2)]), Seen::default()),
            // 3 and the message of 4 and 5 do not fit one commit: 3 goes alone, 4 and 5 next.
            (
                CheckpointInput::Committed(CommitId(base() + 1)),
                Seen {
                    durable: vec![2],
                    commits: vec![(2, vec![3])],
                    ..Seen::default()
                },
            ),
            (
                CheckpointInput::Committed(CommitId(base() + 2)),
                Seen {
                    durable: vec![3],
                    commits: vec![(3, vec![4, 5])],
                    ..Seen::default()
                },
            ),
        ],
    );
}

#[test]
fn one_refused_stage_refuses_its_whole_message() {
    let config = CheckpointConfig {
        batch_ops_max: 5,
        ..CheckpointConfig::default()
    };
    check(
        config,
        vec![
            (
                stages_msg(false, &[(1, 1), (2, 6)]),
                Seen {
                    failed: vec![1, 2],
                    ..Seen::default()
                },
            ),
            (stage(1, 3, 1), commit(1, &[3])),
        ],
    );
}

#[test]
fn a_write_the_store_refuses_fails_its_run_alone_and_the_others_commit_at_once() {
    let refused = CheckpointInput::Refused {
        id: CommitId(base() + 2),
        run: RunId(1),
        error: "checkpoint.state is over its limit".into(),
    };
    check(
        CheckpointConfig::default(),
        vec![
            (stage(1, 1, 1), commit(1, &[1])),
            (stage(1, 2, 1), Seen::default()),
            (stage(2, 9, 1), Seen::default()),
            (stage(3, 5, 1), Seen::default()),
            (
                CheckpointInput::Committed(CommitId(base() + 1)),
                Seen {
                    durable: vec![1],
                    commits: vec![(2, vec![2, 9, 5])],
                    ..Seen::default()
                },
            ),
            (stage(1, 3, 1), Seen::default()),
            (stage(2, 10, 1), Seen::default()),
            // Run 1's stages fail, in the refused commit and queued; no retry timer, no backoff:
            // runs 2 and 3 commit again at once, ahead of what queued since.
            (
                refused,
                Seen {
                    failed: vec![2, 3],
                    commits: vec![(3, vec![9, 5, 10])],
                    ..Seen::default()
                },
            ),
            (
                CheckpointInput::Committed(CommitId(base() + 3)),
                Seen {
                    durable: vec![5, 10],
                    ..Seen::default()
                },
            ),
        ],
    );
}

/// On a real store: a group commit holding one run's oversize checkpoint is refused as that run's
/// ([`keel_actors::host::HostError::refused_run`]) and writes nothing; without it the others commit.
#[test]
fn the_host_lays_a_refused_write_at_its_runs_door() {
    let dir = tempfile::tempdir().unwrap();
    let store = keel_store::Store::open(dir.path().join("keel.redb")).unwrap();
    let create = |id: u128| PersistOp::CreateRun(run_row(RunId(id), 0));
    let checkpoint = |id: u128, state: String| {
        PersistOp::PutCheckpoint(checkpoint_row(RunId(id), "c".into(), state, 0))
    };
    let batch = |id: u64, ops: Vec<(u128, PersistOp)>| CommitBatch {
        id: CommitId(id),
        stages: ops
            .into_iter()
            .enumerate()
            .map(|(i, (run, op))| Stage {
                run: RunId(run),
                owner: StageOwner::Coordinator,
                ticket: i as u64,
                ops: vec![op].into(),
            })
            .collect::<Vec<_>>()
            .into(),
    };
    host::store::commit(&store, &batch(1, vec![(1, create(1)), (2, create(2))])).unwrap();
    let oversize = "x".repeat(keel_store::Limits::default().checkpoint_bytes_max as usize + 1);
    let err = host::store::commit(
        &store,
        &batch(
            2,
            vec![
                (2, checkpoint(2, "two".into())),
                (1, checkpoint(1, oversize)),
            ],
        ),
    )
    .unwrap_err();
    assert_eq!(err.refused_run(), Some(RunId(1)), "{err}");
    assert!(store.run(RunId(2)).checkpoint().unwrap().is_none());
    host::store::commit(&store, &batch(3, vec![(2, checkpoint(2, "two".into()))])).unwrap();
    let kept = store.run(RunId(2)).checkpoint().unwrap().unwrap();
    assert_eq!(kept.state, "two");
}
