//! The economy that justifies building preambles instead of resuming native sessions, measured with the
//! real builder. Prints a table (`cargo test -p keel-actors --test context_economy -- --nocapture`)
//! that goes into docs/PERFORMANCE.md, and checks the two shapes it shows: keel's cost per session is
//! bounded, a native resume's grows with every turn.
//!
//! Assumptions (deterministic, stated so the numbers can be argued with):
//! - a thread is a root task and N follow-ups, each follow-up the child of the previous turn;
//! - a root brief is 1,200 characters, a follow-up brief 300 to 700;
//! - a session's transcript (prompt, assistant text, tool calls and tool results, which a native resume
//!   resends whole) is 18,000 to 30,000 characters (4,500 to 7,500 tokens: about 20 tool calls with
//!   results of about a thousand characters, plus the model's text);
//! - what keel stores of a turn: an outcome of 1,200 to 2,000 characters and one inline attachment (a
//!   diff) of 1,500 characters;
//! - the system prompt and tool definitions are the same either way and are left out.

use keel_actors::Continuity;
use keel_actors::context::{ContextConfig, RowSet, Scrubber, context_for_task};
use keel_store::{Attachment, AttachmentBody, RunId, Task, TaskId, TaskKind, TaskStatus};

const TURNS_MAX: usize = 24;

fn brief_chars(turn: usize) -> usize {
    if turn == 0 {
        1_200
    } else {
        300 + (turn * 131) % 400
    }
}

fn transcript_chars(turn: usize) -> usize {
    18_000 + (turn * 7_919) % 12_000
}

fn outcome_chars(turn: usize) -> usize {
    1_200 + (turn * 337) % 800
}

fn text(chars: usize, seed: usize) -> String {
    // Words, not one repeated letter, so the scrubber does its real work.
    let words = [
        "change", "module", "test", "store", "scope", "fixed", "reads", "the", "a", "run",
    ];
    let mut out = String::with_capacity(chars + 8);
    let mut i = seed;
    while out.len() < chars {
        out.push_str(words[i % words.len()]);
        out.push(' ');
        i = i.wrapping_mul(31).wrapping_add(7);
    }
    out.truncate(chars);
    out
}

fn thread(turns: usize) -> RowSet {
    let mut rows = RowSet::default();
    for t in 0..=turns {
        rows.put_task(Task {
            id: TaskId(t as u128 + 1),
            run_id: RunId(1),
            parent: (t > 0).then_some(TaskId(t as u128)),
            depth: 0,
            kind: if t == 0 {
                TaskKind::Root
            } else {
                TaskKind::FollowUp
            },
            brief: text(brief_chars(t), t),
            goal: String::new(),
            quality_criteria: vec![],
            output_schema: None,
            assignee: None,
            model: None,
            observed: None,
            status: if t == turns {
                TaskStatus::Pending
            } else {
                TaskStatus::Complete
            },
            attempt: 1,
            idempotency_key: None,
            outcome: (t < turns).then(|| text(outcome_chars(t), t + 100)),
            attachments: if t < turns {
                vec![Attachment {
                    name: "diff.patch".into(),
                    body: AttachmentBody::Inline(text(1_500, t + 200)),
                }]
            } else {
                vec![]
            },
            progress_notes: vec![],
            created_ms: 0,
            updated_ms: 0,
        });
    }
    rows
}

#[derive(Debug)]
struct Row {
    follow_up: usize,
    keel: usize,
    native: usize,
    keel_total: usize,
    native_total: usize,
}

fn economy() -> Vec<Row> {
    let config = ContextConfig::default();
    let scrubber = Scrubber::new();
    let rows = thread(TURNS_MAX);
    let mut out = Vec::new();
    let (mut keel_total, mut native_total) = (0usize, 0usize);
    for n in 1..=TURNS_MAX {
        // Follow-up n is task n+1; its first message is what keel would send.
        let report = match context_for_task(
            &rows,
            TaskId(n as u128 + 1),
            Continuity::Standard {
                parent: TaskId(n as u128),
            },
            &config,
            &scrubber,
        ) {
            Ok(report) => report,
            Err(e) => panic!("follow-up {n}: {e}"),
        };
        let keel = report.prompt_chars as usize;
        // A native resume resends every earlier session's transcript, then the new brief.
        let native = (0..n).map(transcript_chars).sum::<usize>() + brief_chars(n);
        keel_total += keel;
        native_total += native;
        out.push(Row {
            follow_up: n,
            keel,
            native,
            keel_total,
            native_total,
        });
    }
    out
}

#[test]
fn keel_sends_a_bounded_context_while_a_native_resume_grows_each_turn() {
    let rows = economy();
    println!(
        "| follow-up | keel sends | native resume resends | ratio | keel total | native total |"
    );
    println!("|---:|---:|---:|---:|---:|---:|");
    for r in &rows {
        println!(
            "| {} | {} | {} | {:.1}x | {} | {} |",
            r.follow_up,
            r.keel,
            r.native,
            r.native as f64 / r.keel as f64,
            r.keel_total,
            r.native_total
        );
    }
    // keel: the preamble's cap plus the new brief, whatever the turn.
    let cap = ContextConfig::default().standard_chars_max();
    for r in &rows {
        assert!(r.keel <= cap + 2 + brief_chars(r.follow_up), "{r:?}");
    }
    // Native: strictly growing, and by the last turn more than 50 times keel's.
    for w in rows.windows(2) {
        assert!(w[1].native > w[0].native);
    }
    let last = &rows[TURNS_MAX - 1];
    assert!(last.native > 50 * last.keel, "{last:?}");
}
