//! `PreCompact` on the real CLIs (docs/DESIGN.md §9, docs/HARNESSES.md "Policy hooks"): with a
//! `[[hooks]] event = "PreCompact"` in keel.toml, every Claude Code and Codex session gets the
//! CLI's own pre-compaction hook running `keel hook --event-for HARNESS`; the node runs the
//! policy's hooks (`PolicyHost::on_session_event`), makes each one's audit row durable, and
//! answers: a veto blocks the compaction, a note goes into its instructions where the CLI takes one
//! (Claude Code).
//!
//! The compaction is the CLI's own automatic one, made deterministic: the scripted model server
//! answers with a few shell calls, the last reporting a nearly full context, so the CLI compacts
//! before its next model request (Claude Code with the project setting `autoCompactWindow`, which
//! puts its threshold under the reported usage; Codex at its default threshold). A compaction is a
//! model request carrying the CLI's summary prompt, which the server records. Real processes:
//! `keel model-server --script`, `keel run` on the real CLI (skipped only with
//! `KEEL_SKIP_REAL_CLIS=1` when it is not installed), its hooks, `keel hook`, the node's bridge,
//! `keel --json audit`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use keel_harness::HarnessKind;
use keel_tests::policy::{
    PolicyHome, compact_claude_code_early, compaction_prompt, compaction_script, shell_step,
};
use keel_tests::{audit_rows_by as rows_by, cli_installed, recorded_bodies};
use serde_json::Value;

/// What the run found: the audit rows, the requests the model server received, and the context a
/// failed assertion prints.
struct Ran {
    rows: Vec<Value>,
    bodies: Vec<String>,
    context: String,
}

impl Ran {
    /// The requests that were compactions (they carry `harness`'s summary prompt).
    fn compactions(&self, harness: HarnessKind) -> Vec<&String> {
        let prompt = compaction_prompt(harness);
        self.bodies.iter().filter(|b| b.contains(prompt)).collect()
    }

    /// The audit rows of hook `name` with `decision`, each checked to be a `PreCompact` row.
    fn pre_compact_rows(&self, name: &str, decision: &str) -> Vec<&Value> {
        let rows = rows_by(&self.rows, &format!("hook:{name}"), decision);
        for row in &rows {
            assert_eq!(row["tool"], "PreCompact", "{}", self.context);
        }
        rows
    }
}

/// A keel home whose policy is one `PreCompact` hook `name` running `/bin/sh -c script`, a plan of
/// one step, and `keel run` of it on `harness` against a model that calls the shell `calls` times,
/// the last answer reporting `usage` input tokens.
fn run_with_pre_compact_hook(harness: HarnessKind, name: &str, script: &str) -> Ran {
    let policy = format!(
        "\n[[hooks]]\nname = \"{name}\"\nevent = \"PreCompact\"\ncommand = [\"/bin/sh\", \"-c\", {}]\n",
        serde_json::to_string(script).unwrap()
    );
    let home = PolicyHome::with_script(&policy, Some(&compaction_script(harness))).unwrap();
    compact_claude_code_early(home.path()).unwrap();
    home.write_plan(vec![shell_step("hello", "Say hello.", "echo hello", &[])])
        .unwrap();
    let (code, out, err) = home
        .run_to_end(&mut home.run_command(Some(harness)).unwrap())
        .unwrap();
    let rows = home.audit().unwrap();
    let bodies = recorded_bodies(&home.record_dir())
        .iter()
        .map(Value::to_string)
        .collect();
    let context = format!("{harness}: exit {code}\n{out}\n{err}\n{rows:#?}");
    Ran {
        rows,
        bodies,
        context,
    }
}

/// A mandatory hook that refuses (exit 2): the CLI asked keel before compacting, the veto is an
/// audit row of the `PreCompact` event, and no compaction request ever reached the model.
fn a_veto_blocks_the_compaction(harness: HarnessKind) {
    let ran = run_with_pre_compact_hook(
        harness,
        "whole-context",
        "echo 'the context stays whole' >&2; exit 2",
    );
    let vetoes = ran.pre_compact_rows("whole-context", "deny");
    assert!(!vetoes.is_empty(), "no veto was audited: {}", ran.context);
    assert!(
        vetoes[0]["reason"]
            .as_str()
            .unwrap()
            .contains("the context stays whole"),
        "{}",
        ran.context
    );
    assert!(
        ran.compactions(harness).is_empty(),
        "the CLI compacted although keel vetoed it: {}",
        ran.context
    );
}

/// A hook that annotates: the compaction happens (so the setup does make the CLI compact, and the
/// veto above is what stopped it), and the note is audited.
fn a_note_lets_the_compaction_happen(harness: HarnessKind) -> Ran {
    let ran = run_with_pre_compact_hook(
        harness,
        "keep-logs",
        r#"echo '{"hookSpecificOutput": {"additionalContext": "keep-the-build-logs"}}'"#,
    );
    assert!(
        !ran.pre_compact_rows("keep-logs", "allow").is_empty(),
        "no note was audited: {}",
        ran.context
    );
    assert!(
        !ran.compactions(harness).is_empty(),
        "the CLI never compacted: {}",
        ran.context
    );
    ran
}

#[test]
fn a_mandatory_pre_compact_hook_blocks_claude_codes_compaction() {
    if cli_installed(HarnessKind::ClaudeCode) {
        a_veto_blocks_the_compaction(HarnessKind::ClaudeCode);
    }
}

#[test]
fn a_pre_compact_note_goes_into_claude_codes_compaction() {
    if cli_installed(HarnessKind::ClaudeCode) {
        let ran = a_note_lets_the_compaction_happen(HarnessKind::ClaudeCode);
        let compacted = ran.compactions(HarnessKind::ClaudeCode);
        assert!(
            compacted.iter().any(|b| b.contains("keep-the-build-logs")),
            "the note is not in the compaction's instructions: {compacted:#?}\n{}",
            ran.context
        );
    }
}

#[test]
fn a_mandatory_pre_compact_hook_blocks_codexs_compaction() {
    if cli_installed(HarnessKind::Codex) {
        a_veto_blocks_the_compaction(HarnessKind::Codex);
    }
}

#[test]
fn codex_compacts_when_the_pre_compact_hook_only_annotates() {
    if cli_installed(HarnessKind::Codex) {
        a_note_lets_the_compaction_happen(HarnessKind::Codex);
    }
}
