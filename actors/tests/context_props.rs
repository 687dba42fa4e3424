//! Property tests of invariant 4 (docs/DESIGN.md §12): for any store content (arbitrary unicode, huge
//! fields, deep chains, cycles and dangling links in corrupt data) a preamble stays within its cap, the
//! resume preamble carries the brief intact, no registered secret gets through, a slash skill stays on
//! line one, and building terminates.

use keel_actors::Continuity;
use keel_actors::context::{
    ContextConfig, RowSet, Scrubber, ThreadSource, context_for_task, is_slash_skill_line,
    load_resume, load_thread, place_preamble, resume_preamble, standard_preamble,
};
use keel_store::{
    Attachment, AttachmentBody, LogKind, RunId, SessionLogRow, Task, TaskId, TaskKind, TaskStatus,
};
use proptest::prelude::*;

/// Text as a store could hold it: arbitrary unicode, a huge run of one character, prose with a slash
/// skill on line one, or text around a secret-shaped token.
fn field() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => any::<String>(),
        1 => (any::<char>(), 0usize..24_000).prop_map(|(c, n)| c.to_string().repeat(n)),
        1 => ("[a-z]{1,12}", ".{0,40}", ".{0,200}")
            .prop_map(|(skill, args, rest)| format!("/{skill} {args}\n{rest}")),
        1 => (".{0,100}", "[A-Za-z0-9]{30,50}", ".{0,100}")
            .prop_map(|(a, tok, b)| format!("{a} sk-ant-{tok} {b} Bearer {tok}9 {b}")),
    ]
}

/// A registered secret: any shape of 12 to 40 characters from an alphabet the framing never forms.
fn secret() -> impl Strategy<Value = String> {
    "[A-Za-z0-9_~!%^-]{12,40}"
}

/// Puts `secret` somewhere inside `text` (by character position), or leaves the text alone.
fn plant(text: &str, secret: &str, at: Option<usize>) -> String {
    match at {
        None => text.to_owned(),
        Some(at) => {
            let n = text.chars().count();
            let at = if n == 0 { 0 } else { at % (n + 1) };
            let split = text.char_indices().nth(at).map_or(text.len(), |(i, _)| i);
            format!("{}{secret}{}", &text[..split], &text[split..])
        }
    }
}

#[derive(Debug, Clone)]
struct Node {
    parent: Option<usize>,
    kind: TaskKind,
    status: TaskStatus,
    other_run: bool,
    brief: String,
    outcome: Option<String>,
    attachments: Vec<(String, Option<String>)>,
    notes: Vec<String>,
    log: Vec<(u8, String)>,
    plant: [Option<usize>; 4],
}

fn kind() -> impl Strategy<Value = TaskKind> {
    prop_oneof![
        Just(TaskKind::Root),
        Just(TaskKind::Subtask),
        Just(TaskKind::FollowUp),
        Just(TaskKind::Review),
        Just(TaskKind::Redispatch),
        Just(TaskKind::Redispatch),
    ]
}

fn status() -> impl Strategy<Value = TaskStatus> {
    prop_oneof![
        Just(TaskStatus::Complete),
        Just(TaskStatus::Failed),
        Just(TaskStatus::Paused),
        Just(TaskStatus::Running)
    ]
}

fn node(n_tasks: usize) -> impl Strategy<Value = Node> {
    (
        // Parents point anywhere, itself and ids that do not exist included: corrupt data.
        prop::option::weighted(0.9, 0..n_tasks + 2),
        kind(),
        status(),
        prop::bool::weighted(0.05),
        field(),
        prop::option::of(field()),
        prop::collection::vec(("[a-z.]{0,12}", prop::option::of(field())), 0..4),
        prop::collection::vec(".{0,120}", 0..14),
        prop::collection::vec(
            (0u8..7, prop_oneof![4 => ".{0,60}", 1 => ".{0,600}"]),
            0..64,
        ),
        prop::array::uniform4(prop::option::weighted(0.3, any::<usize>())),
    )
        .prop_map(
            |(parent, kind, status, other_run, brief, outcome, attachments, notes, log, plant)| {
                Node {
                    parent,
                    kind,
                    status,
                    other_run,
                    brief,
                    outcome,
                    attachments,
                    notes,
                    log,
                    plant,
                }
            },
        )
}

fn graph() -> impl Strategy<Value = Vec<Node>> {
    (1usize..16).prop_flat_map(|n| prop::collection::vec(node(n), n))
}

fn log_kind(k: u8) -> LogKind {
    match k {
        0 => LogKind::Text,
        1 => LogKind::ToolUse,
        2 => LogKind::ToolResult,
        3 => LogKind::Usage,
        4 => LogKind::Steering,
        5 => LogKind::Error,
        _ => LogKind::Lifecycle,
    }
}

/// Stores the graph, planting the secret in the fields the node says.
fn rows(nodes: &[Node], secret: &str) -> RowSet {
    let mut rows = RowSet::default();
    for (i, n) in nodes.iter().enumerate() {
        let id = TaskId(i as u128 + 1);
        let task = Task {
            id,
            run_id: RunId(if n.other_run { 2 } else { 1 }),
            parent: n.parent.map(|p| TaskId(p as u128 + 1)),
            depth: 0,
            kind: n.kind,
            brief: plant(&n.brief, secret, n.plant[0]),
            goal: String::new(),
            quality_criteria: vec![],
            output_schema: None,
            assignee: None,
            model: None,
            observed: None,
            status: n.status,
            attempt: 1,
            idempotency_key: None,
            outcome: n.outcome.as_ref().map(|o| plant(o, secret, n.plant[1])),
            attachments: n
                .attachments
                .iter()
                .map(|(name, body)| Attachment {
                    name: name.clone(),
                    body: match body {
                        Some(b) => AttachmentBody::Inline(plant(b, secret, n.plant[2])),
                        None => AttachmentBody::Blob { key: 1, len: 99 },
                    },
                })
                .collect(),
            progress_notes: n
                .notes
                .iter()
                .map(|s| plant(s, secret, n.plant[3]))
                .collect(),
            created_ms: 0,
            updated_ms: 0,
        };
        rows.put_task(task);
        for (k, summary) in &n.log {
            rows.append_log(
                id,
                SessionLogRow {
                    ts_ms: 0,
                    kind: log_kind(*k),
                    summary: plant(summary, secret, n.plant[3]),
                    detail: plant(summary, secret, n.plant[0]),
                    redactions: Vec::new(),
                },
            );
        }
    }
    rows
}

fn config() -> impl Strategy<Value = ContextConfig> {
    (
        250u32..3_000,
        250u32..5_000,
        1u8..=8,
        1u16..=80,
        1u8..=12,
        1u8..=12,
    )
        .prop_map(
            |(std, resume, ancestors, steps, steering, notes)| ContextConfig {
                standard_tokens_max: std,
                resume_tokens_max: resume,
                ancestors_max: ancestors,
                log_rows_max: steps,
                steering_count_max: steering,
                notes_count_max: notes,
                ..ContextConfig::default()
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    #[test]
    fn standard_preamble_is_within_its_cap_and_leaks_no_registered_secret(
        nodes in graph(), secret in secret(), config in config(), pick in any::<usize>(),
    ) {
        prop_assert!(config.validate().is_ok());
        let rows = rows(&nodes, &secret);
        let mut scrubber = Scrubber::new();
        scrubber.register_secret(&secret).unwrap();
        let task = TaskId((pick % nodes.len()) as u128 + 1);
        let view = load_thread(&rows, task, &config).unwrap();
        prop_assert!(view.ancestors.len() <= usize::from(config.ancestors_max));
        if let Some(p) = standard_preamble(&view, &config, &scrubber) {
            prop_assert!(p.text.chars().count() <= config.standard_chars_max());
            prop_assert_eq!(p.chars as usize, p.text.chars().count());
            prop_assert!(!p.text.contains(&secret));
            prop_assert!(p.text.starts_with("<keel-context"));
        }
    }

    #[test]
    fn resume_preamble_keeps_the_brief_and_its_cap(
        nodes in graph(), secret in secret(), config in config(), pick in any::<usize>(),
    ) {
        let rows = rows(&nodes, &secret);
        let mut scrubber = Scrubber::new();
        scrubber.register_secret(&secret).unwrap();
        let task = TaskId((pick % nodes.len()) as u128 + 1);
        let view = load_resume(&rows, task, &config).unwrap();
        prop_assert!(view.earlier_attempts.len() <= usize::from(config.redispatch_chain_max));
        let p = resume_preamble(&view, &config, &scrubber);
        let (original, _) = view.original();
        let brief = scrubber.scrub(&original.brief).text.into_owned();
        // The brief is intact (scrubbed of secrets, never cut).
        prop_assert!(brief.is_empty() || p.text.contains(&brief));
        prop_assert!(!p.text.contains(&secret));
        let n = p.text.chars().count();
        if p.brief_over_cap {
            // Over the cap only by the brief's doing: without it the text would fit.
            prop_assert!(n - brief.chars().count() <= config.resume_chars_max());
        } else {
            prop_assert!(n <= config.resume_chars_max());
        }
    }

    #[test]
    fn the_prompt_keeps_a_slash_skill_on_line_one(
        nodes in graph(), secret in secret(), pick in any::<usize>(), resume in any::<bool>(),
    ) {
        let rows = rows(&nodes, &secret);
        let mut scrubber = Scrubber::new();
        scrubber.register_secret(&secret).unwrap();
        let task = TaskId((pick % nodes.len()) as u128 + 1);
        let start = if resume {
            Continuity::Resume { from: task }
        } else {
            Continuity::for_task(&rows.tasks[&task])
        };
        let config = ContextConfig::default();
        let report = context_for_task(&rows, task, start, &config, &scrubber).unwrap();
        prop_assert!(!report.prompt.contains(&secret));
        let brief_first = match start {
            Continuity::Fresh | Continuity::Standard { .. } => {
                rows.tasks[&task].brief.split('\n').next().unwrap_or("")
            }
            Continuity::Resume { .. } => {
                let view = load_resume(&rows, task, &config).unwrap();
                let original = view.original().0.id;
                rows.tasks[&original].brief.split('\n').next().unwrap_or("")
            }
        };
        let prompt_first = report.prompt.split('\n').next().unwrap_or("");
        if is_slash_skill_line(brief_first) {
            let scrubbed = scrubber.scrub(brief_first).text.into_owned();
            let scrubbed = if matches!(start, Continuity::Resume { .. }) {
                scrubbed.trim_end_matches('\r').to_owned()
            } else {
                scrubbed
            };
            prop_assert_eq!(prompt_first, scrubbed.as_str());
        } else if report.preamble.is_some() {
            prop_assert!(prompt_first.starts_with("<keel-context"));
        }
    }

    #[test]
    fn placement_never_moves_line_one_of_a_skill_prompt(
        skill in "/[a-z][a-z0-9:_-]{0,20}( .{0,30})?", rest in ".{0,200}", preamble in ".{1,200}",
    ) {
        let prompt = format!("{skill}\n{rest}");
        let placed = place_preamble(&preamble, &prompt);
        prop_assert_eq!(placed.split('\n').next(), Some(skill.as_str()));
        prop_assert!(placed.contains(&preamble));
        prop_assert!(placed.ends_with(rest.as_str()));
    }
}

/// The rows, read one task at a time: the loader's step-by-step walk, for comparison with the bulk read.
struct StepByStep<'a>(&'a RowSet);

impl ThreadSource for StepByStep<'_> {
    type Error = std::convert::Infallible;

    fn task(&self, id: TaskId) -> Result<Option<Task>, Self::Error> {
        self.0.task(id)
    }

    fn log_tail(
        &self,
        id: TaskId,
        rows_max: usize,
    ) -> Result<Vec<(u64, SessionLogRow)>, Self::Error> {
        self.0.log_tail(id, rows_max)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn a_chain_read_at_once_gives_the_same_view_as_the_walk_step_by_step(
        nodes in graph(), config in config(), pick in any::<usize>(),
    ) {
        let rows = rows(&nodes, "unused-secret-0001");
        let task = TaskId((pick % nodes.len()) as u128 + 1);
        let bulk = load_thread(&rows, task, &config).unwrap();
        let steps = load_thread(&StepByStep(&rows), task, &config).unwrap();
        prop_assert_eq!(bulk, steps);
    }
}
