//! Session events on the CLIs (docs/HARNESSES.md, "Policy hooks"): a CLI about to compact its own
//! context (`PreCompact`) asks keel's policy through the hook bridge before it does, so a
//! mandatory hook can block the compaction and an annotation can go into its instructions. The
//! CLI never decides on its own: its native hook runs `keel hook --url URL --event-for HARNESS`
//! through a wrapper that fails closed (a check that could not run refuses the event).
//!
//! This file holds the pure half: the command and its wrapper, and each CLI's answer. The shapes
//! were checked on the pinned binaries:
//!
//! - **Claude Code 2.1.197** runs a `PreCompact` command hook (stdin `{session_id,
//!   transcript_path, cwd, hook_event_name: "PreCompact", trigger: "manual"|"auto",
//!   custom_instructions}`) before a manual or an automatic compaction. Exit 2 (stderr the reason)
//!   or `{"decision": "block", "reason": R}` blocks it ("Compaction blocked by PreCompact hook");
//!   what an exit 0 prints on stdout is added to the compaction's custom instructions; any other
//!   exit is a non-blocking error, which is why the wrapper turns every failure into exit 2.
//! - **Codex 0.171.0** runs a `PreCompact` hook (`-c hooks.PreCompact`; stdin `{session_id,
//!   turn_id, transcript_path, cwd, hook_event_name: "PreCompact", model, trigger: "auto"}`) before
//!   it compacts. Only `{"continue": false, "stopReason": R}` on stdout blocks it, and it does so by
//!   aborting the turn: `codex exec` exits 1 without a terminal event, so the attempt fails and its
//!   retry starts a fresh session (what keel's own loop does when a context is full). An exit 2 or
//!   any other exit is a non-blocking error, and Codex takes no note from this hook, so a note is
//!   only audited.

use std::path::{Path, PathBuf};

use super::SessionFile;
use super::gate::{command_line, shell_quote};
use crate::spec::{GateCommand, HarnessKind};

/// The argument the adapters append to the spec's `session_event_hook` so the command knows whose
/// payload it reads and whose answer it prints (`keel hook --url URL --event-for claude-code`).
pub const EVENT_FOR_ARG: &str = "--event-for";

/// The words a note from keel's policy starts with where a CLI passes it on as text (it never
/// starts with `{`, which Claude Code would read as a JSON answer).
pub const NOTE_PREFIX: &str = "Note from keel's policy:";

/// The spec's `session_event_hook` with the harness named, as the adapters run it.
pub fn event_command(hook: &GateCommand, harness: HarnessKind) -> GateCommand {
    let mut command = hook.clone();
    command.args.push(EVENT_FOR_ARG.into());
    command.args.push(harness.as_str().into());
    command
}

/// What `keel hook --event-for HARNESS` prints and how it exits once keel decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventReply {
    /// The exit code.
    pub exit_code: u8,
    /// What goes to stdout, if anything.
    pub stdout: Option<String>,
    /// What goes to stderr, if anything.
    pub stderr: Option<String>,
}

/// The answer `harness` understands: `veto` refuses the event with its reason, `note` (when the
/// event goes on) is carried into it where the CLI can take one.
pub fn reply_for(harness: HarnessKind, veto: Option<&str>, note: Option<&str>) -> EventReply {
    if harness == HarnessKind::Codex {
        return EventReply {
            exit_code: 0,
            stdout: veto.map(|reason| {
                serde_json::json!({"continue": false, "stopReason": non_empty(reason)}).to_string()
            }),
            stderr: None,
        };
    }
    match (veto, note) {
        (Some(reason), _) => EventReply {
            exit_code: 2,
            stdout: None,
            stderr: Some(non_empty(reason).to_owned()),
        },
        (None, Some(note)) if !note.trim().is_empty() => EventReply {
            exit_code: 0,
            stdout: Some(format!("{NOTE_PREFIX} {note}")),
            stderr: None,
        },
        (None, _) => EventReply {
            exit_code: 0,
            stdout: None,
            stderr: None,
        },
    }
}

/// A veto's reason, never empty (Claude Code and Codex refuse a block without one).
fn non_empty(reason: &str) -> &str {
    if reason.trim().is_empty() {
        "refused by keel's policy"
    } else {
        reason
    }
}

/// Adds the session-event wrapper script to a session's files and returns its path: it runs
/// `keel hook ... --event-for HARNESS` with a timeout, passes its answer through, and turns any
/// other ending (a crash, a timeout, a missing program) into a veto.
pub fn install_event_wrapper(
    session_dir: &Path,
    hook: &GateCommand,
    harness: HarnessKind,
    files: &mut Vec<SessionFile>,
) -> PathBuf {
    super::gate::add_script(
        session_dir,
        "keel-session-event.sh",
        event_wrapper_script(&event_command(hook, harness), harness),
        files,
    )
}

/// The script of [`install_event_wrapper`].
pub fn event_wrapper_script(command: &GateCommand, harness: HarnessKind) -> String {
    let cmd = command_line(command);
    let secs = command.timeout_ms.div_ceil(1000).max(1);
    let refused = reply_for(
        harness,
        Some(
            "keel: the session-event check could not run, so the event is refused (failed closed)",
        ),
        None,
    );
    let print = |text: Option<String>, fd: &str| {
        text.map(|t| format!("printf '%s\\n' {} {fd}\n", shell_quote(&t)))
            .unwrap_or_default()
    };
    // The exits that are answers: Claude Code reads exit 2 as a veto, Codex only stdout.
    let answers = if harness == HarnessKind::Codex {
        "[ \"$rc\" -eq 0 ]"
    } else {
        "[ \"$rc\" -eq 0 ] || [ \"$rc\" -eq 2 ]"
    };
    format!(
        "#!/bin/sh\n# keel session-event hook wrapper: fail closed.\ntimeout -k 1 {secs} {cmd}\n\
         rc=$?\nif {answers}; then exit \"$rc\"; fi\n{}{}exit {}\n",
        print(refused.stdout, ""),
        print(refused.stderr, ">&2"),
        refused.exit_code
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_veto_exits_2_with_its_reason_and_a_note_is_plain_text() {
        let veto = reply_for(HarnessKind::ClaudeCode, Some("not now"), Some("ignored"));
        assert_eq!(veto.exit_code, 2);
        assert_eq!(veto.stderr.as_deref(), Some("not now"));
        assert_eq!(veto.stdout, None);
        let empty = reply_for(HarnessKind::ClaudeCode, Some(" "), None);
        assert_eq!(empty.stderr.as_deref(), Some("refused by keel's policy"));
        let note = reply_for(HarnessKind::ClaudeCode, None, Some("{keep the logs}"));
        assert_eq!(note.exit_code, 0);
        assert_eq!(
            note.stdout.as_deref(),
            Some("Note from keel's policy: {keep the logs}")
        );
        let nothing = reply_for(HarnessKind::ClaudeCode, None, Some(""));
        assert_eq!((nothing.exit_code, nothing.stdout), (0, None));
        // Codex: a veto is `continue: false` on stdout; a note is not something it takes.
        let codex = reply_for(HarnessKind::Codex, Some("not now"), None);
        assert_eq!(codex.exit_code, 0);
        let v: serde_json::Value =
            serde_json::from_str(codex.stdout.as_deref().unwrap_or_default()).expect("JSON");
        assert_eq!(
            v,
            serde_json::json!({"continue": false, "stopReason": "not now"})
        );
        let codex = reply_for(HarnessKind::Codex, None, Some("keep the logs"));
        assert_eq!((codex.exit_code, codex.stdout), (0, None));
    }

    /// Runs the wrapper of `harness` around `/bin/sh -c script`: its exit code, stdout and stderr.
    fn run_wrapper(harness: HarnessKind, script: &str) -> (Option<i32>, String, String) {
        let dir = tempfile::tempdir().expect("a temp dir");
        let command = GateCommand {
            program: "/bin/sh".into(),
            args: vec!["-c".into(), script.into()],
            timeout_ms: 1_000,
        };
        let path = dir.path().join("w.sh");
        std::fs::write(&path, event_wrapper_script(&command, harness)).expect("writes");
        let out = std::process::Command::new("/bin/sh")
            .arg(&path)
            .output()
            .expect("runs");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).trim().to_owned(),
            String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        )
    }

    /// The wrapper, run for real: an answer (exit 0 or 2) passes through; a crash, another exit
    /// code or a timeout vetoes.
    #[test]
    fn the_wrapper_passes_an_answer_through_and_otherwise_vetoes() {
        let run = |script: &str| run_wrapper(HarnessKind::ClaudeCode, script);
        assert_eq!(run("echo note"), (Some(0), "note".into(), String::new()));
        assert_eq!(
            run("echo no >&2; exit 2"),
            (Some(2), String::new(), "no".into())
        );
        let (code, out, err) = run("exit 7");
        assert_eq!((code, out.as_str()), (Some(2), ""));
        assert!(err.contains("failed closed"), "{err}");
        let (code, _, err) = run("sleep 5");
        assert_eq!(code, Some(2));
        assert!(err.contains("failed closed"), "{err}");
    }

    /// Codex's wrapper: exit 0 passes through; anything else (exit 2 included, which Codex would
    /// ignore) prints the veto on stdout.
    #[test]
    fn codexs_wrapper_vetoes_on_stdout() {
        assert_eq!(
            run_wrapper(HarnessKind::Codex, "true"),
            (Some(0), String::new(), String::new())
        );
        for failing in ["exit 2", "exit 1", "sleep 5"] {
            let (code, out, _) = run_wrapper(HarnessKind::Codex, failing);
            assert_eq!(code, Some(0), "{failing}");
            let v: serde_json::Value = serde_json::from_str(&out).expect("JSON");
            assert_eq!(v["continue"], false, "{failing}: {out}");
        }
    }
}
