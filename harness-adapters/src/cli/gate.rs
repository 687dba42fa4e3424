//! The pre-tool gate as each CLI runs it: one fail-closed shell wrapper that every hook, plugin
//! and extension calls, and the JavaScript that calls it from the Node/Bun based CLIs.

use std::path::{Path, PathBuf};

use super::SessionFile;
use crate::spec::{GateCommand, HarnessKind};

/// Quotes one word for a POSIX shell.
pub fn shell_quote(word: &str) -> String {
    if !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"/._-=:,+@%".contains(&b))
    {
        return word.to_owned();
    }
    format!("'{}'", word.replace('\'', "'\\''"))
}

/// A command's program and arguments as one shell command line, each word quoted.
pub fn command_line(command: &GateCommand) -> String {
    std::iter::once(&command.program)
        .chain(&command.args)
        .map(|w| shell_quote(w))
        .collect::<Vec<_>>()
        .join(" ")
}

/// How a CLI learns that the gate allowed a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateAllow {
    /// Exit 0 alone: the CLI then runs the call (Codex, opencode, pi: none of them asks again).
    ExitZero,
    /// Exit 0 and a `PreToolUse` `permissionDecision: "allow"` on stdout. Claude Code treats a
    /// silent exit 0 as "no opinion" and goes on to its own permission check, which in `-p` refuses
    /// what its own rules do not pre-approve (a compound shell command under `acceptEdits`, for one)
    /// although keel's policy allowed it: the gate, not the CLI, decides (docs/DESIGN.md §9).
    ClaudeCodeDecision,
}

/// What Claude Code reads as "this call is allowed" from a `PreToolUse` command hook.
const CLAUDE_CODE_ALLOW: &str = r#"{"hookSpecificOutput":{"hookEventName":"PreToolUse","permissionDecision":"allow","permissionDecisionReason":"allowed by the keel gate"}}"#;

/// Adds the gate's wrapper script to a session's files and returns its path: every CLI's hook,
/// plugin or extension calls this one wrapper, which fails closed on a crash or a timeout.
pub fn install_gate_wrapper(
    session_dir: &std::path::Path,
    gate: &GateCommand,
    allow: GateAllow,
    files: &mut Vec<SessionFile>,
) -> PathBuf {
    add_script(
        session_dir,
        "keel-gate.sh",
        gate_wrapper_script(gate, allow),
        files,
    )
}

/// Adds the executable script `name` with `contents` to a session's files and returns its path
/// (each of keel's fail-closed hook wrappers is one).
pub(crate) fn add_script(
    session_dir: &Path,
    name: &str,
    contents: String,
    files: &mut Vec<SessionFile>,
) -> PathBuf {
    let path = session_dir.join(name);
    files.push(SessionFile {
        path: path.clone(),
        contents,
        executable: true,
    });
    path
}

/// A shell script that runs the spec's gate with a timeout and fails closed: exit 0 allows, exit 2
/// denies with stderr as the reason, and anything else (a crash, a timeout, a missing program)
/// becomes exit 2. Claude Code and Codex treat other exit codes as a non-blocking hook error and
/// would run the tool, which a mandatory gate must never allow (docs/DESIGN.md §9). With
/// [`GateAllow::ClaudeCodeDecision`] an allowing gate that printed nothing gets Claude Code's allow
/// decision printed for it (a gate that printed its own decision is passed through).
pub fn gate_wrapper_script(gate: &GateCommand, allow: GateAllow) -> String {
    let cmd = command_line(gate);
    let secs = gate.timeout_ms.div_ceil(1000).max(1);
    let run = match allow {
        GateAllow::ExitZero => format!("timeout -k 1 {secs} {cmd}\nrc=$?\n"),
        GateAllow::ClaudeCodeDecision => format!(
            "out=$(timeout -k 1 {secs} {cmd})\nrc=$?\n\
             if [ \"$rc\" -eq 0 ]; then\n  if [ -n \"$out\" ]; then printf '%s\\n' \"$out\"; \
             else printf '%s\\n' {}; fi\nfi\n",
            shell_quote(CLAUDE_CODE_ALLOW)
        ),
    };
    format!(
        "#!/bin/sh\n# keel pre-tool gate wrapper: fail closed.\n{run}\
         if [ \"$rc\" -eq 0 ] || [ \"$rc\" -eq 2 ]; then exit \"$rc\"; fi\n\
         echo \"keel gate failed closed (exit $rc)\" >&2\nexit 2\n"
    )
}

/// The JavaScript that runs the gate from a Node/Bun based CLI (opencode plugin, pi extension):
/// a function `keelGate(toolName, toolInput, toolUseId, cwd)` returning `null` to allow or the
/// deny reason. It hands the gate a Claude-compatible `PreToolUse` payload on stdin and fails closed
/// like [`gate_wrapper_script`] (it runs that same wrapper).
pub fn gate_js_function(wrapper: &Path, harness: HarnessKind) -> String {
    let wrapper =
        serde_json::to_string(&wrapper.display().to_string()).unwrap_or_else(|_| "\"\"".to_owned());
    format!(
        r#"import {{ spawnSync }} from "node:child_process";
const KEEL_GATE = {wrapper};
function keelGate(toolName, toolInput, toolUseId, cwd) {{
  const payload = JSON.stringify({{ hook_event_name: "PreToolUse", harness: "{harness}", tool_name: toolName,
    tool_input: toolInput ?? {{}}, tool_use_id: toolUseId ?? null, cwd: cwd ?? process.cwd() }});
  const r = spawnSync(KEEL_GATE, [], {{ input: payload, encoding: "utf8" }});
  if (r.status === 0) return null;
  const reason = String(r.stderr ?? "").trim();
  return reason.length > 0 ? reason : `keel gate denied the call (exit ${{r.status}})`;
}}
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gate_wrapper_fails_closed() {
        let gate = GateCommand {
            program: "/srv/example/gate".into(),
            args: vec!["it's".into()],
            timeout_ms: 1500,
        };
        let s = gate_wrapper_script(&gate, GateAllow::ExitZero);
        assert!(
            s.contains("timeout -k 1 2 /srv/example/gate 'it'\\''s'"),
            "{s}"
        );
        assert!(s.contains("exit 2"));
        assert!(!s.contains("permissionDecision"), "{s}");
    }

    /// The Claude Code wrapper, run for real: an allowing gate gets the allow decision printed, a
    /// gate's own output is passed through, a denial and a crash exit 2 with nothing on stdout.
    #[test]
    fn claude_code_wrapper_states_the_allow_and_still_fails_closed() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let run = |script: &str| {
            let gate = GateCommand {
                program: "/bin/sh".into(),
                args: vec!["-c".into(), script.into()],
                timeout_ms: 5_000,
            };
            let path = dir.path().join("w.sh");
            std::fs::write(
                &path,
                gate_wrapper_script(&gate, GateAllow::ClaudeCodeDecision),
            )
            .expect("writes");
            let out = std::process::Command::new("/bin/sh")
                .arg(&path)
                .output()
                .expect("runs");
            (
                out.status.code(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
            )
        };
        let (code, out) = run("exit 0");
        assert_eq!(code, Some(0));
        let v: serde_json::Value = serde_json::from_str(out.trim()).expect("JSON");
        assert_eq!(
            v["hookSpecificOutput"]["permissionDecision"], "allow",
            "{out}"
        );
        assert_eq!(run(r#"echo '{"x":1}'"#), (Some(0), "{\"x\":1}\n".into()));
        assert_eq!(run("echo no >&2; exit 2"), (Some(2), String::new()));
        assert_eq!(run("exit 7"), (Some(2), String::new()));
    }
}
