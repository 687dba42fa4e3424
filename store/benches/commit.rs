//! Durable commit throughput on a real file: single-record `Immediate` commits, and group commits of
//! 1, 16 and 256 records (one transaction, one fsync each), the checkpoint actor's pattern; plus the
//! resume preamble's read (the last 50 log rows of a task).
//!
//! Run: `cargo bench -p keel-store --bench commit`. The database lives under the crate's target
//! directory (`CARGO_TARGET_TMPDIR`), a real disk, never tmpfs, so the fsync cost is real.
//! A record is one session log row (a 60-byte summary, a 200-byte detail), spread over 8 runs so a
//! batch mixes callers as the checkpoint actor's batches do.

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use keel_store::*;

const RUNS: u128 = 8;

fn setup() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let store = Store::open(dir.path().join("bench.redb")).unwrap();
    let mut batch = WriteBatch::new();
    for r in 1..=RUNS {
        let scope = store.run(RunId(r));
        batch.push(
            scope
                .stage_create_run(Run {
                    id: RunId(r),
                    brief: "benchmark run".into(),
                    plan: None,
                    status: RunStatus::Running,
                    budget: Budget::default(),
                    created_ms: 0,
                    updated_ms: 0,
                    config_snapshot: String::new(),
                    outcome: None,
                })
                .unwrap(),
        );
        batch.push(
            scope
                .stage_create_task(Task {
                    id: TaskId(1_000 + r),
                    run_id: RunId(r),
                    parent: None,
                    depth: 0,
                    kind: TaskKind::Root,
                    brief: "benchmark task".into(),
                    goal: String::new(),
                    quality_criteria: vec![],
                    output_schema: None,
                    assignee: None,
                    model: None,
                    observed: None,
                    status: TaskStatus::Running,
                    attempt: 1,
                    idempotency_key: None,
                    outcome: None,
                    attachments: vec![],
                    progress_notes: vec![],
                    created_ms: 0,
                    updated_ms: 0,
                })
                .unwrap(),
        );
    }
    store.commit_group(batch, Durability::Immediate).unwrap();
    (dir, store)
}

fn record(n: u64) -> SessionLogRow {
    SessionLogRow {
        ts_ms: n,
        kind: LogKind::ToolResult,
        summary: format!("{n:>12} Read src/lib.rs -> 412 lines, ok ........"),
        detail: "d".repeat(200),
        redactions: Vec::new(),
    }
}

fn stage(store: &Store, n: u64) -> StagedWrite<'static> {
    let r = u128::from(n) % RUNS + 1;
    store
        .run(RunId(r))
        .stage_append_log(TaskId(1_000 + r), record(n))
        .unwrap()
}

fn single_durable_commits(c: &mut Criterion) {
    let (_dir, store) = setup();
    let mut group = c.benchmark_group("single_durable_commit");
    group.throughput(Throughput::Elements(1));
    let mut n = 0u64;
    group.bench_function("immediate", |b| {
        b.iter(|| {
            n += 1;
            black_box(
                store
                    .commit_one(stage(&store, n), Durability::Immediate)
                    .unwrap(),
            )
        })
    });
    group.finish();
}

fn group_durable_commits(c: &mut Criterion) {
    let (_dir, store) = setup();
    let mut group = c.benchmark_group("group_commit_immediate");
    let mut n = 0u64;
    for size in [1u64, 16, 256] {
        group.throughput(Throughput::Elements(size));
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.iter(|| {
                let batch: WriteBatch<'_> = (0..size)
                    .map(|_| {
                        n += 1;
                        stage(&store, n)
                    })
                    .collect();
                black_box(store.commit_group(batch, Durability::Immediate).unwrap())
            })
        });
    }
    group.finish();
}

/// What the resume preamble reads: the last 50 log rows of a task that has 5,000.
fn read_last_log_rows(c: &mut Criterion) {
    let (_dir, store) = setup();
    for chunk in 0..20u64 {
        let batch: WriteBatch<'_> = (0..250u64)
            .map(|i| {
                store
                    .run(RunId(1))
                    .stage_append_log(TaskId(1_001), record(chunk * 250 + i))
                    .unwrap()
            })
            .collect();
        store.commit_group(batch, Durability::None).unwrap();
    }
    let mut group = c.benchmark_group("read");
    group.throughput(Throughput::Elements(50));
    group.bench_function("last_50_log_rows", |b| {
        b.iter(|| {
            black_box(
                store
                    .run(RunId(1))
                    .last_log_rows(TaskId(1_001), 50)
                    .unwrap(),
            )
        })
    });
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    targets = single_durable_commits, group_durable_commits, read_last_log_rows
}
criterion_main!(benches);
