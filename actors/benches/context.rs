//! How long building a preamble takes, reading from a real redb store (docs/DESIGN.md §6).
//!
//! Targets on a 2-core machine: under 50 µs median for a standard preamble with 5 ancestors, under
//! 200 µs for a resume preamble over 50 session log rows. Each benchmark measures the whole path a new
//! session takes: load the rows through the run-scoped store handle, scrub, cut and format. The
//! `pure/*` benchmarks measure the builders alone over rows already loaded, to separate the two costs.
//!
//! Run: `cargo bench -p keel-actors --bench context`.

// A benchmark whose set-up fails has nothing to measure: it stops at once.
#![allow(missing_docs, clippy::unwrap_used)]

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use keel_actors::context::{
    ContextConfig, Scrubber, load_resume, load_thread, resume_preamble, standard_preamble,
};
use keel_store::{
    Attachment, AttachmentBody, Budget, Durability, LogKind, Run, RunId, RunStatus, SessionLogRow,
    Store, Task, TaskId, TaskKind, TaskStatus,
};

fn task(id: u128, parent: Option<u128>, kind: TaskKind, brief: String) -> Task {
    Task {
        id: TaskId(id),
        run_id: RunId(1),
        parent: parent.map(TaskId),
        depth: 0,
        kind,
        brief,
        goal: "Ship the change with tests".into(),
        quality_criteria: vec!["tests pass".into()],
        output_schema: None,
        assignee: Some("coder".into()),
        model: Some("model-a".into()),
        observed: None,
        status: TaskStatus::Complete,
        attempt: 1,
        idempotency_key: None,
        outcome: Some(format!(
            "Done: {} The change is in src/scope.rs and tests/scope.rs; all 212 tests pass.",
            "Summary sentence of realistic length. ".repeat(20)
        )),
        attachments: vec![
            Attachment {
                name: "diff.patch".into(),
                body: AttachmentBody::Inline("+ fn check() {}\n- fn old() {}\n".repeat(40)),
            },
            Attachment {
                name: "test-output.txt".into(),
                // Over the store's inline limit: the store moves it to the blob table.
                body: AttachmentBody::Inline("test result: ok. 212 passed\n".repeat(1_700)),
            },
        ],
        progress_notes: vec!["read the store module".into(), "wrote the fix".into()],
        created_ms: 1,
        updated_ms: 1,
    }
}

fn brief(n: u128) -> String {
    format!(
        "Task {n}: {}\nConstraints: keep the public API; add tests; api_key = os.environ[\"API_KEY\"].",
        "Investigate the failing isolation check in the run scope and fix it. ".repeat(8)
    )
}

/// A store with a root, five ancestors above task 7, and a re-dispatched task 9 of a paused task 8 with
/// 60 log rows each.
fn seeded_store(dir: &std::path::Path) -> Store {
    let store = Store::open(dir.join("bench.redb")).unwrap();
    let run = store.run(RunId(1));
    let mut writes = vec![
        run.stage_create_run(Run {
            id: RunId(1),
            brief: "bench".into(),
            plan: None,
            status: RunStatus::Running,
            budget: Budget::default(),
            created_ms: 1,
            updated_ms: 1,
            config_snapshot: String::new(),
            outcome: None,
        })
        .unwrap(),
    ];
    writes.push(
        run.stage_create_task(task(1, None, TaskKind::Root, brief(1)))
            .unwrap(),
    );
    for n in 2..=7 {
        writes.push(
            run.stage_create_task(task(n, Some(n - 1), TaskKind::FollowUp, brief(n)))
                .unwrap(),
        );
    }
    let mut paused = task(8, Some(1), TaskKind::Subtask, brief(8));
    paused.status = TaskStatus::Paused;
    writes.push(run.stage_create_task(paused).unwrap());
    let mut redispatch = task(9, Some(8), TaskKind::Redispatch, "resume".into());
    redispatch.status = TaskStatus::Pending;
    writes.push(run.stage_create_task(redispatch).unwrap());
    store
        .commit_group(writes.into_iter().collect(), Durability::Immediate)
        .unwrap();
    let mut logs = Vec::new();
    for t in [8u128, 9] {
        for i in 0..60u64 {
            let kind = match i % 5 {
                0 => LogKind::ToolUse,
                1 => LogKind::ToolResult,
                2 => LogKind::Text,
                3 => LogKind::Usage,
                _ => LogKind::ToolUse,
            };
            logs.push(
                run.stage_append_log(
                    TaskId(t),
                    SessionLogRow {
                        ts_ms: i,
                        kind,
                        summary: format!(
                            "Edit src/module_{i}.rs: replace 12 lines near fn handle_{i}"
                        ),
                        detail: "x".repeat(400),
                        redactions: Vec::new(),
                    },
                )
                .unwrap(),
            );
        }
    }
    store
        .commit_group(logs.into_iter().collect(), Durability::Immediate)
        .unwrap();
    store
}

fn benches(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let store = seeded_store(dir.path());
    let scope = store.run(RunId(1));
    let config = ContextConfig::default();
    let mut scrubber = Scrubber::new();
    scrubber
        .register_secret("account-key-of-the-bench-0001")
        .unwrap();

    c.bench_function("store/standard_5_ancestors", |b| {
        b.iter(|| {
            let view = load_thread(&scope, black_box(TaskId(7)), &config).unwrap();
            black_box(standard_preamble(&view, &config, &scrubber))
        })
    });
    c.bench_function("store/resume_50_log_rows", |b| {
        b.iter(|| {
            let view = load_resume(&scope, black_box(TaskId(9)), &config).unwrap();
            black_box(resume_preamble(&view, &config, &scrubber))
        })
    });

    let thread = load_thread(&scope, TaskId(7), &config).unwrap();
    let resume = load_resume(&scope, TaskId(9), &config).unwrap();
    c.bench_function("pure/standard_5_ancestors", |b| {
        b.iter(|| black_box(standard_preamble(black_box(&thread), &config, &scrubber)))
    });
    c.bench_function("pure/resume_50_log_rows", |b| {
        b.iter(|| black_box(resume_preamble(black_box(&resume), &config, &scrubber)))
    });
    let text = resume_preamble(&resume, &config, &scrubber).text;
    c.bench_function("pure/scrub_16k_chars", |b| {
        b.iter(|| black_box(scrubber.scrub(black_box(&text))))
    });
}

criterion_group! {
    name = context;
    config = Criterion::default()
        .sample_size(50)
        .warm_up_time(std::time::Duration::from_millis(500))
        .measurement_time(std::time::Duration::from_secs(2));
    targets = benches
}
criterion_main!(context);
