//! The context builders, rule by rule, each with its input and the exact text the agent would see.

use keel_actors::Continuity;
use keel_actors::context::{
    ContextConfig, ContextReport, CutUnit, LogEntry, PreambleKind, ResumeView, RowSet, Scrubber,
    Section, ThreadView, Truncation, WalkEnd, context_for_task, is_slash_skill_line, load_resume,
    load_thread, place_preamble, resolve_native_resume, resume_preamble, standard_preamble,
};
use keel_store::{
    Attachment, AttachmentBody, LogKind, ObservedSession, RunId, SessionLogRow, Task, TaskId,
    TaskKind, TaskStatus,
};

fn task(id: u128, parent: Option<u128>, kind: TaskKind, status: TaskStatus, brief: &str) -> Task {
    Task {
        id: TaskId(id),
        run_id: RunId(1),
        parent: parent.map(TaskId),
        depth: 0,
        kind,
        brief: brief.to_owned(),
        goal: String::new(),
        quality_criteria: Vec::new(),
        output_schema: None,
        assignee: None,
        model: None,
        observed: None,
        status,
        attempt: 1,
        idempotency_key: None,
        outcome: None,
        attachments: Vec::new(),
        progress_notes: Vec::new(),
        created_ms: 0,
        updated_ms: 0,
    }
}

fn row(kind: LogKind, summary: &str) -> SessionLogRow {
    SessionLogRow {
        ts_ms: 0,
        kind,
        summary: summary.to_owned(),
        detail: String::new(),
        redactions: Vec::new(),
    }
}

fn id(n: u128) -> String {
    TaskId(n).to_string()
}

/// Builds the standard preamble of `view` and checks its exact text and cuts.
fn check_standard(view: &ThreadView, config: &ContextConfig, expected: &str, cuts: &[Truncation]) {
    let Some(p) = standard_preamble(view, config, &Scrubber::new()) else {
        panic!("a task with a parent gets a standard preamble");
    };
    assert_eq!(p.kind, PreambleKind::Standard);
    assert_eq!(p.text, expected);
    assert_eq!(p.truncations, cuts);
    assert_eq!(p.chars as usize, p.text.chars().count());
    assert!(p.chars <= p.chars_max);
}

/// Builds the resume preamble of `view` and checks its exact text and cuts.
fn check_resume(view: &ResumeView, config: &ContextConfig, expected: &str, cuts: &[Truncation]) {
    let p = resume_preamble(view, config, &Scrubber::new());
    assert_eq!(p.kind, PreambleKind::Resume);
    assert_eq!(p.text, expected);
    assert_eq!(p.truncations, cuts);
    assert_eq!(p.chars as usize, p.text.chars().count());
}

fn items(section: Section, cut: u32) -> Truncation {
    Truncation {
        section,
        cut,
        unit: CutUnit::Items,
    }
}

fn characters(section: Section, cut: u32) -> Truncation {
    Truncation {
        section,
        cut,
        unit: CutUnit::Characters,
    }
}

const STANDARD_INTRO: &str = "This session continues a thread that keel stored (not a harness transcript). The parent task is inline; older tasks are one line each: expand any task with the get_task_details tool by id.";
const RESUME_INTRO: &str = "This task was interrupted and is resumed in a new session. keel does not resume harness sessions: below is keel's own record. Continue from where the work stopped; do not redo finished steps.";

#[test]
fn standard_preamble_inlines_the_parent_and_points_to_older_ancestors() {
    let root = task(
        1,
        None,
        TaskKind::Root,
        TaskStatus::Complete,
        "Audit the repo\nin depth",
    );
    let sub = task(
        2,
        Some(1),
        TaskKind::Subtask,
        TaskStatus::Complete,
        "Read the store",
    );
    let mut parent = task(
        3,
        Some(2),
        TaskKind::FollowUp,
        TaskStatus::Complete,
        "Fix the bug in scope.rs",
    );
    parent.outcome = Some("Fixed: the scope now checks the run id.".into());
    parent.attachments = vec![
        Attachment {
            name: "diff".into(),
            body: AttachmentBody::Inline("- a\n+ b".into()),
        },
        Attachment {
            name: "log.txt".into(),
            body: AttachmentBody::Blob {
                key: 9,
                len: 123_456,
            },
        },
    ];
    let view = ThreadView {
        task: task(
            4,
            Some(3),
            TaskKind::FollowUp,
            TaskStatus::Pending,
            "Add a test",
        ),
        ancestors: vec![parent, sub, root],
        walk_end: WalkEnd::Root,
    };
    let expected = format!(
        "<keel-context kind=\"standard\" task=\"{t4}\">\n{STANDARD_INTRO}\n\
## Parent task {t3} (follow-up, complete)\n### Brief\nFix the bug in scope.rs\n\
### Outcome\nFixed: the scope now checks the run id.\n\
### Attachments\n- diff: - a\n+ b\n- log.txt: stored blob of 123456 bytes (get_task_details on the parent)\n\
## Earlier tasks (nearest first)\n- {t2} (subtask, complete): Read the store\n\
- {t1} (root, complete): Audit the repo…\n</keel-context>",
        t1 = id(1),
        t2 = id(2),
        t3 = id(3),
        t4 = id(4)
    );
    check_standard(&view, &ContextConfig::default(), &expected, &[]);
}

#[test]
fn standard_preamble_is_none_for_a_task_without_a_parent() {
    let view = ThreadView {
        task: task(1, None, TaskKind::Root, TaskStatus::Pending, "brief"),
        ancestors: vec![],
        walk_end: WalkEnd::Root,
    };
    assert_eq!(
        standard_preamble(&view, &ContextConfig::default(), &Scrubber::new()),
        None
    );
}

#[test]
fn standard_preamble_gives_each_parent_field_its_share_and_marks_the_cut() {
    // A huge brief and a huge outcome share what the framing leaves; the short attachment keeps all of
    // its demand and its leftover goes to the two others.
    let mut parent = task(
        2,
        None,
        TaskKind::Root,
        TaskStatus::Complete,
        &"b".repeat(20_000),
    );
    parent.outcome = Some("o".repeat(20_000));
    parent.attachments = vec![Attachment {
        name: "a".into(),
        body: AttachmentBody::Inline("x".into()),
    }];
    let view = ThreadView {
        task: task(3, Some(2), TaskKind::Subtask, TaskStatus::Pending, "go"),
        ancestors: vec![parent],
        walk_end: WalkEnd::Root,
    };
    let head = format!(
        "<keel-context kind=\"standard\" task=\"{}\">\n{STANDARD_INTRO}\n## Parent task {} (root, complete)\n### Brief\n",
        id(3),
        id(2)
    );
    let fixed = head.chars().count()
        + "\n### Outcome\n".len()
        + "\n### Attachments\n".len()
        + "\n</keel-context>".len();
    // Max-min fair: the attachment takes its 6 characters, the brief and the outcome split the rest
    // (the second one in the order gets the odd character).
    let rest = 8_000 - fixed - "- a: x".len();
    let marker = " [truncated: 20000 characters]".len();
    let (kept_b, kept_o) = (rest / 2 - marker, rest - rest / 2 - marker);
    let expected = format!(
        "{head}{b} [truncated: {cb} characters]\n### Outcome\n{o} [truncated: {co} characters]\n### Attachments\n- a: x\n</keel-context>",
        b = "b".repeat(kept_b),
        o = "o".repeat(kept_o),
        cb = 20_000 - kept_b,
        co = 20_000 - kept_o,
    );
    let (cut_b, cut_o) = (
        u32::try_from(20_000 - kept_b).unwrap(),
        u32::try_from(20_000 - kept_o).unwrap(),
    );
    check_standard(
        &view,
        &ContextConfig::default(),
        &expected,
        &[
            characters(Section::ParentBrief, cut_b),
            characters(Section::ParentOutcome, cut_o),
        ],
    );
    // The sizes the test derives by hand match the cap exactly or within the marker's slack.
    assert!(expected.chars().count() <= 8_000);
    assert!(expected.chars().count() >= 8_000 - 2);
}

#[test]
fn standard_preamble_walks_at_most_five_ancestors() {
    let mut rows = RowSet::default();
    rows.put_task(task(1, None, TaskKind::Root, TaskStatus::Complete, "r"));
    for n in 2..=8 {
        rows.put_task(task(
            n,
            Some(n - 1),
            TaskKind::FollowUp,
            TaskStatus::Complete,
            &format!("f{n}"),
        ));
    }
    let config = ContextConfig::default();
    let view = load_thread(&rows, TaskId(8), &config).unwrap();
    assert_eq!(view.ancestors.len(), 5);
    assert_eq!(view.walk_end, WalkEnd::Limit);
    let expected = format!(
        "<keel-context kind=\"standard\" task=\"{}\">\n{STANDARD_INTRO}\n\
## Parent task {} (follow-up, complete)\n### Brief\nf7\n### Outcome\n(none recorded)\n\
## Earlier tasks (nearest first)\n- {} (follow-up, complete): f6\n- {} (follow-up, complete): f5\n\
- {} (follow-up, complete): f4\n- {} (follow-up, complete): f3\n\
- [walk stopped after 5 ancestors; older tasks exist: expand the oldest shown with get_task_details]\n</keel-context>",
        id(8),
        id(7),
        id(6),
        id(5),
        id(4),
        id(3)
    );
    check_standard(&view, &config, &expected, &[]);
}

#[test]
fn standard_preamble_ends_a_walk_at_a_cycle_in_corrupt_parent_links() {
    let mut rows = RowSet::default();
    // 1 -> 2 -> 3 -> 1: corrupt data, as a bug or a bad restore could leave it.
    rows.put_task(task(
        1,
        Some(3),
        TaskKind::Subtask,
        TaskStatus::Complete,
        "one",
    ));
    rows.put_task(task(
        2,
        Some(1),
        TaskKind::Subtask,
        TaskStatus::Complete,
        "two",
    ));
    rows.put_task(task(
        3,
        Some(2),
        TaskKind::Subtask,
        TaskStatus::Pending,
        "three",
    ));
    let config = ContextConfig::default();
    let view = load_thread(&rows, TaskId(3), &config).unwrap();
    assert_eq!(view.walk_end, WalkEnd::Cycle(TaskId(3)));
    let expected = format!(
        "<keel-context kind=\"standard\" task=\"{t3}\">\n{STANDARD_INTRO}\n\
## Parent task {t2} (subtask, complete)\n### Brief\ntwo\n### Outcome\n(none recorded)\n\
## Earlier tasks (nearest first)\n- {t1} (subtask, complete): one\n\
- [corrupt parent links: {t3} repeats; the thread stops here]\n</keel-context>",
        t1 = id(1),
        t2 = id(2),
        t3 = id(3)
    );
    check_standard(&view, &config, &expected, &[]);
}

#[test]
fn standard_preamble_says_when_the_parent_is_missing() {
    let mut rows = RowSet::default();
    rows.put_task(task(
        5,
        Some(4),
        TaskKind::Subtask,
        TaskStatus::Pending,
        "orphan",
    ));
    let config = ContextConfig::default();
    let view = load_thread(&rows, TaskId(5), &config).unwrap();
    let expected = format!(
        "<keel-context kind=\"standard\" task=\"{}\">\n{STANDARD_INTRO}\n## Parent task\n\
- [parent {} is not in the store; the thread stops here]\n</keel-context>",
        id(5),
        id(4)
    );
    check_standard(&view, &config, &expected, &[]);
}

#[test]
fn standard_preamble_scrubs_every_field() {
    let mut root = task(
        1,
        None,
        TaskKind::Root,
        TaskStatus::Complete,
        "deploy with AKIAIOSFODNN7EXAMPLE",
    );
    root.outcome = Some("unused".into());
    let mut parent = task(
        2,
        Some(1),
        TaskKind::Subtask,
        TaskStatus::Complete,
        "use account-key-0001",
    );
    parent.outcome = Some("token ghp_aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0dF3gH6 works".into());
    parent.attachments = vec![Attachment {
        name: "env".into(),
        body: AttachmentBody::Inline("DB=postgres://u:hunter22@db/x".into()),
    }];
    let view = ThreadView {
        task: task(3, Some(2), TaskKind::Subtask, TaskStatus::Pending, "go"),
        ancestors: vec![parent, root],
        walk_end: WalkEnd::Root,
    };
    let mut scrubber = Scrubber::new();
    scrubber.register_secret("account-key-0001").unwrap();
    let p = standard_preamble(&view, &ContextConfig::default(), &scrubber).unwrap();
    let expected = format!(
        "<keel-context kind=\"standard\" task=\"{}\">\n{STANDARD_INTRO}\n\
## Parent task {} (subtask, complete)\n### Brief\nuse [REDACTED:registered-secret]\n\
### Outcome\ntoken [REDACTED:github-token] works\n\
### Attachments\n- env: DB=postgres://u:[REDACTED:url-password]@db/x\n\
## Earlier tasks (nearest first)\n- {} (root, complete): deploy with [REDACTED:aws-access-key]\n</keel-context>",
        id(3),
        id(2),
        id(1)
    );
    assert_eq!(p.text, expected);
    assert_eq!(p.redactions.len(), 4);
}

#[test]
fn resume_preamble_keeps_the_original_brief_through_a_resume_of_a_resume() {
    let mut rows = RowSet::default();
    let mut original = task(
        1,
        None,
        TaskKind::Root,
        TaskStatus::Failed,
        "Port the parser to nom.\nKeep the API.",
    );
    original.progress_notes = vec!["lexer done".into()];
    rows.put_task(original);
    // Each re-dispatch's own brief is a generated resume text: it must not replace the original.
    let mut r1 = task(
        2,
        Some(1),
        TaskKind::Redispatch,
        TaskStatus::Failed,
        "<keel-context kind=\"resume\" ...",
    );
    r1.progress_notes = vec!["parser half done".into()];
    rows.put_task(r1);
    rows.put_task(task(
        3,
        Some(2),
        TaskKind::Redispatch,
        TaskStatus::Pending,
        "resume",
    ));
    rows.append_log(TaskId(1), row(LogKind::ToolUse, "Read src/lexer.rs"));
    rows.append_log(TaskId(1), row(LogKind::Usage, "in 1200 out 300"));
    rows.append_log(TaskId(2), row(LogKind::Steering, "use nom 8, not 7"));
    rows.append_log(
        TaskId(2),
        row(LogKind::ToolUse, "Edit src/parser.rs (+40 -12)"),
    );
    rows.append_log(
        TaskId(2),
        row(LogKind::Error, "rate limited (429)\nretry in 30 s"),
    );
    let config = ContextConfig::default();
    let view = load_resume(&rows, TaskId(3), &config).unwrap();
    assert_eq!(view.earlier_attempts.len(), 2);
    let expected = format!(
        "<keel-context kind=\"resume\" task=\"{}\">\n{RESUME_INTRO}\n\
## Original brief (verbatim, task {})\nPort the parser to nom.\nKeep the API.\n\
## Last session steps (oldest first)\n- tool_use: Read src/lexer.rs\n\
- tool_use: Edit src/parser.rs (+40 -12)\n- error: rate limited (429) retry in 30 s\n\
## Steering messages (oldest first)\n- use nom 8, not 7\n\
## Progress notes (oldest first)\n- lexer done\n- parser half done\n</keel-context>",
        id(3),
        id(1)
    );
    check_resume(&view, &config, &expected, &[]);
}

#[test]
fn resume_preamble_drops_the_oldest_steps_first_and_counts_them() {
    let t = task(1, None, TaskKind::Subtask, TaskStatus::Paused, "Brief.");
    let log: Vec<LogEntry> = (0..60)
        .map(|i| LogEntry {
            task: TaskId(1),
            seq: i,
            row: row(
                LogKind::ToolUse,
                &format!("Step {i:02} {}", "x".repeat(200)),
            ),
        })
        .collect();
    let view = ResumeView {
        task: t,
        earlier_attempts: vec![],
        walk_end: WalkEnd::Root,
        log,
        delegated: vec![],
    };
    // A small cap so that only a few of the last 50 step lines fit.
    let config = ContextConfig {
        resume_tokens_max: 400,
        ..ContextConfig::default()
    };
    let p = resume_preamble(&view, &config, &Scrubber::new());
    let line = |i: u32| {
        let body = format!("Step {i:02} {}", "x".repeat(200));
        // 200-character lines: the prefix "- tool_use: " (12) leaves 188 for the 208-character summary.
        let keep = 188 - " [truncated: 208 characters]".len();
        let cut = body.chars().count() - keep;
        format!(
            "- tool_use: {} [truncated: {cut} characters]",
            &body[..keep]
        )
    };
    let mut expected = format!(
        "<keel-context kind=\"resume\" task=\"{}\">\n{RESUME_INTRO}\n## Original brief (verbatim, task {})\nBrief.\n\
## Last session steps (oldest first)\n[truncated: 45 older steps left out]",
        id(1),
        id(1)
    );
    for i in 55..60 {
        expected.push('\n');
        expected.push_str(&line(i));
    }
    expected.push_str("\n</keel-context>");
    assert_eq!(p.text, expected);
    // Within the cap, and one more line (201 characters with its newline) would not have fitted.
    assert!(p.chars <= 1_600);
    assert!(p.chars + 201 > 1_600);
    assert_eq!(
        p.truncations,
        vec![
            characters(Section::Steps, 50 * 48),
            items(Section::Steps, 45)
        ]
    );
}

#[test]
fn resume_preamble_never_cuts_the_brief_even_over_the_cap() {
    let brief = "B".repeat(5_000);
    let mut t = task(1, None, TaskKind::Subtask, TaskStatus::Paused, &brief);
    t.progress_notes = vec!["n".into()];
    let view = ResumeView {
        task: t,
        earlier_attempts: vec![],
        walk_end: WalkEnd::Root,
        log: vec![LogEntry {
            task: TaskId(1),
            seq: 0,
            row: row(LogKind::ToolUse, "Read a"),
        }],
        delegated: vec![],
    };
    let config = ContextConfig {
        resume_tokens_max: 1_000,
        ..ContextConfig::default()
    };
    let expected = format!(
        "<keel-context kind=\"resume\" task=\"{}\">\n{RESUME_INTRO}\n## Original brief (verbatim, task {})\n{brief}\n\
[truncated: 1 steps, 0 steering messages, 1 progress notes left out: the brief alone fills the 4000-character cap]\n</keel-context>",
        id(1),
        id(1)
    );
    check_resume(
        &view,
        &config,
        &expected,
        &[items(Section::Steps, 1), items(Section::ProgressNotes, 1)],
    );
    let p = resume_preamble(&view, &config, &Scrubber::new());
    assert!(p.brief_over_cap);
}

#[test]
fn standalone_paused_task_gets_a_resume_preamble_from_its_own_rows() {
    let mut rows = RowSet::default();
    let mut t = task(
        7,
        None,
        TaskKind::Root,
        TaskStatus::Paused,
        "Summarise the logs",
    );
    t.progress_notes = vec!["read 3 of 5 files".into()];
    rows.put_task(t.clone());
    rows.append_log(TaskId(7), row(LogKind::ToolUse, "Read logs/a.log"));
    rows.append_log(
        TaskId(7),
        row(LogKind::Lifecycle, "paused: graceful shutdown"),
    );
    assert_eq!(
        Continuity::for_task(&t),
        Continuity::Resume { from: TaskId(7) }
    );
    let config = ContextConfig::default();
    let report = context_for_task(
        &rows,
        TaskId(7),
        Continuity::Resume { from: TaskId(7) },
        &config,
        &Scrubber::new(),
    )
    .unwrap();
    let preamble = format!(
        "<keel-context kind=\"resume\" task=\"{t7}\">\n{RESUME_INTRO}\n\
## Original brief (verbatim, task {t7})\nSummarise the logs\n\
## Last session steps (oldest first)\n- tool_use: Read logs/a.log\n- lifecycle: paused: graceful shutdown\n\
## Progress notes (oldest first)\n- read 3 of 5 files\n</keel-context>",
        t7 = id(7)
    );
    assert_eq!(report.preamble.as_ref().unwrap().text, preamble);
    assert_eq!(
        report.prompt,
        format!(
            "{preamble}\n\nContinue the task above from where it stopped. Report what you finish as usual."
        )
    );
}

#[test]
fn slash_skill_stays_on_line_one() {
    let cases: &[(&str, &str, &str)] = &[
        (
            "/review 123\nfocus on tests",
            "<P>",
            "/review 123\n<P>\n\nfocus on tests",
        ),
        ("/review", "<P>", "/review\n<P>"),
        (
            "/plugin:skill-name arg\r\nrest",
            "<P>",
            "/plugin:skill-name arg\r\n<P>\n\nrest",
        ),
        ("Fix the bug", "<P>", "<P>\n\nFix the bug"),
        (
            "/usr/bin/env is missing",
            "<P>",
            "<P>\n\n/usr/bin/env is missing",
        ),
        (" /review 1", "<P>", "<P>\n\n /review 1"),
        ("", "<P>", "<P>"),
        ("/review 1", "", "/review 1"),
    ];
    for (prompt, preamble, expected) in cases {
        assert_eq!(
            &place_preamble(preamble, prompt),
            expected,
            "prompt {prompt:?}"
        );
    }
    assert!(is_slash_skill_line("/a"));
    assert!(!is_slash_skill_line("/"));
    assert!(!is_slash_skill_line("//comment"));
}

#[test]
fn native_resume_shim_resumes_nothing_and_says_why() {
    let obs = |h: &str, id: &str| ObservedSession {
        harness: h.into(),
        account: "acct".into(),
        native_session_id: id.into(),
    };
    let report = resolve_native_resume(
        "claude-code",
        &[
            obs("claude-code", "s1"),
            obs("codex", "t9"),
            obs("claude-code", "s1"),
            obs("pi", "  "),
        ],
    );
    assert!(report.session_to_resume().is_none());
    let got: Vec<(String, String)> = report
        .skipped
        .iter()
        .map(|s| (s.native_session_id.clone(), format!("{:?}", s.reason)))
        .collect();
    assert_eq!(
        got,
        vec![
            ("s1".into(), "ContinuityFromStore".into()),
            ("t9".into(), "OtherHarness".into()),
            ("s1".into(), "Duplicate".into()),
            ("".into(), "EmptyId".into()),
        ]
    );
    let many: Vec<ObservedSession> = (0..40).map(|i| obs("pi", &format!("s{i}"))).collect();
    let report = resolve_native_resume("pi", &many);
    assert_eq!(report.skipped.len(), 32);
    assert_eq!(report.unrecorded, 8);
}

#[test]
fn keel_context_report_shows_size_cuts_and_redactions() {
    let mut rows = RowSet::default();
    let mut parent = task(1, None, TaskKind::Root, TaskStatus::Complete, "Root brief");
    parent.outcome = Some("done with sk-ant-api03-Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1".into());
    rows.put_task(parent);
    rows.put_task(task(
        2,
        Some(1),
        TaskKind::FollowUp,
        TaskStatus::Pending,
        "/fix 12\nplease",
    ));
    let report = context_for_task(
        &rows,
        TaskId(2),
        Continuity::Standard { parent: TaskId(1) },
        &ContextConfig::default(),
        &Scrubber::new(),
    )
    .unwrap();
    let p = report.preamble.as_ref().unwrap();
    assert!(report.prompt.starts_with("/fix 12\n<keel-context"));
    let shown = report.to_string();
    let expected_head = format!(
        "task {}: standard preamble, {} of 8000 characters\ntruncated: nothing\nredacted: anthropic-key x1\n---- prompt ({} characters) ----\n/fix 12\n",
        id(2),
        p.chars,
        report.prompt_chars
    );
    assert!(shown.starts_with(&expected_head), "{shown}");
    let json = serde_json::to_value(&report).unwrap();
    assert_eq!(json["start"]["kind"], "standard", "{json}");
    assert_eq!(
        json["start"]["parent"],
        id(1),
        "a ULID, not a number: {json}"
    );
    let back: ContextReport = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(back, report, "the readable form reads back");
    assert_eq!(json["preamble"]["kind"], "standard");
    assert_eq!(json["preamble"]["redactions"]["anthropic-key"], 1);
}

#[test]
fn standard_preamble_drops_the_oldest_pointer_lines_when_the_framing_crowds_the_parent() {
    // Long one-line briefs and a small cap: four pointer lines of up to 2,000 characters cannot all
    // stay, so the oldest go first and the cut is counted.
    let long = "w".repeat(3_000);
    let mut ancestors = vec![task(
        5,
        Some(4),
        TaskKind::FollowUp,
        TaskStatus::Complete,
        "parent",
    )];
    for n in (1..=4).rev() {
        ancestors.push(task(
            n,
            (n > 1).then_some(n - 1),
            TaskKind::FollowUp,
            TaskStatus::Complete,
            &long,
        ));
    }
    let view = ThreadView {
        task: task(6, Some(5), TaskKind::FollowUp, TaskStatus::Pending, "go"),
        ancestors,
        walk_end: WalkEnd::Root,
    };
    let config = ContextConfig {
        standard_tokens_max: 750,
        ancestor_line_chars_max: 2_000,
        ..ContextConfig::default()
    };
    let p = standard_preamble(&view, &config, &Scrubber::new()).unwrap();
    assert!(p.chars <= 3_000);
    assert_eq!(p.truncations, vec![items(Section::Ancestors, 3)]);
    assert!(
        p.text
            .contains(&format!("- {} (follow-up, complete): www", id(4)))
    );
    assert!(!p.text.contains(&id(3)));
    assert!(
        p.text
            .contains("- [truncated: 3 older tasks left out to fit the cap]\n</keel-context>")
    );
    assert!(p.text.contains("### Brief\nparent\n"));
}

#[test]
fn a_session_resumes_for_a_redispatch_or_a_paused_task() {
    let t = |parent, kind, status| task(2, parent, kind, status, "b");
    assert_eq!(
        Continuity::for_task(&t(Some(1), TaskKind::Redispatch, TaskStatus::Pending)),
        Continuity::Resume { from: TaskId(1) },
        "a re-dispatch resumes from the task it replaces"
    );
    assert_eq!(
        Continuity::for_task(&t(Some(1), TaskKind::Subtask, TaskStatus::Paused)),
        Continuity::Resume { from: TaskId(2) }
    );
    assert_eq!(
        Continuity::for_task(&t(Some(1), TaskKind::FollowUp, TaskStatus::Pending)),
        Continuity::Standard { parent: TaskId(1) }
    );
    assert_eq!(
        Continuity::for_task(&t(None, TaskKind::Root, TaskStatus::Pending)),
        Continuity::Fresh
    );
}

#[test]
fn config_caps_are_tokens_times_four_and_out_of_range_limits_are_refused() {
    let c = ContextConfig::default();
    assert_eq!(
        (c.standard_chars_max(), c.resume_chars_max()),
        (8_000, 16_000)
    );
    assert!(c.validate().is_ok());
    let small = ContextConfig {
        standard_tokens_max: 100,
        ..c
    };
    assert_eq!(
        small.validate().unwrap_err().to_string(),
        "the standard cap must be 1000..=1000000 characters, got 400"
    );
    let zero = ContextConfig {
        log_rows_max: 0,
        ..c
    };
    assert_eq!(
        zero.validate().unwrap_err().to_string(),
        "log_rows_max must be 1..=500, got 0"
    );
}
