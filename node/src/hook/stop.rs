//! The Stop hook's report check for a CLI (docs/DESIGN.md §9): `keel hook --report-for ID...`, the
//! command a CLI's native Stop hook runs (Claude Code's and Codex's), and the session service that
//! gives every session with a report check that command. The check is keel-actors' own
//! ([`keel_actors::report::judge_final_text`], the same the specialist and keel's own loop use), run
//! in the hook's process: it needs nothing from the node.
//!
//! Contract (Claude Code's Stop command hook, which Codex 0.171.0 follows): the event on stdin as
//! JSON with `last_assistant_message` and `stop_hook_active`; exit 0 with nothing lets the session
//! end; exit 0 with `{"decision": "block", "reason": ...}` sends it back for one more turn with the
//! reason. A session already sent back once (`stop_hook_active`) may end: its attempt then fails
//! with the exact error, as it would without the hook. Anything that goes wrong lets the session
//! end, since the specialist's own verdict on its final text still runs (this hook only adds a
//! chance).

use std::io::Read;
use std::path::PathBuf;
use std::process::ExitCode;

use keel_actors::AttemptId;
use keel_actors::runtime::SessionService;
use keel_harness::{GateCommand, SessionSpec};
use serde_json::{Value, json};

use super::PAYLOAD_BYTES_MAX;

/// How long the Stop hook may take: it parses one text.
pub(crate) const STOP_HOOK_TIMEOUT_MS: u64 = 10_000;

/// `keel hook --report-for ID...`: judge the session's last message; print a `block` decision with
/// the re-ask when it is not a valid report. Always exits 0.
pub(crate) fn run(report_for: &[String]) -> ExitCode {
    let mut payload = Vec::new();
    let read = std::io::stdin()
        .take(PAYLOAD_BYTES_MAX as u64)
        .read_to_end(&mut payload);
    if read.is_ok()
        && let Some(reason) = decide(report_for, &payload)
    {
        println!("{}", json!({"decision": "block", "reason": reason}));
    }
    ExitCode::SUCCESS
}

/// The re-ask for a Stop event's payload, or `None` to let the session end (pure).
pub(crate) fn decide(report_for: &[String], payload: &[u8]) -> Option<String> {
    let event: Value = serde_json::from_slice(payload).ok()?;
    if event.get("stop_hook_active").and_then(Value::as_bool) == Some(true) {
        return None; // sent back once already: one more turn is all a session gets
    }
    let text = event
        .get("last_assistant_message")
        .and_then(Value::as_str)?;
    keel_actors::report::judge_final_text(report_for, text).err()
}

/// Gives every session with a report check the Stop hook command (`keel hook --report-for ...`).
pub(crate) struct StopHookService {
    /// The keel executable the hook runs.
    pub(crate) keel_exe: PathBuf,
}

impl SessionService for StopHookService {
    fn session_starting(&self, _attempt: AttemptId, spec: &mut SessionSpec) {
        let Some(check) = &spec.stop_check else {
            return;
        };
        let mut args = vec!["hook".to_owned()];
        for id in &check.report_for {
            args.push("--report-for".into());
            args.push(id.clone());
        }
        spec.stop_gate = Some(GateCommand {
            program: self.keel_exe.display().to_string(),
            args,
            timeout_ms: STOP_HOOK_TIMEOUT_MS,
        });
    }

    fn session_ended(&self, _attempt: AttemptId) {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_last_message_is_sent_back_once_and_a_good_one_ends() {
        let task = keel_store::TaskId(0x01AB_CDEF).to_string();
        let ids = [task.clone()];
        let unsourced = r#"{"status":"complete","findings":[{"claim":"c","source":"","confidence_permille":900}],"summary":"s"}"#;
        let event = json!({"hook_event_name": "Stop", "stop_hook_active": false,
                           "last_assistant_message": unsourced});
        let reason = decide(&ids, event.to_string().as_bytes());
        let reason = reason.unwrap_or_default();
        assert!(reason.starts_with(keel_harness::RE_ASK_MARKER), "{reason}");
        assert!(reason.contains("finding 0 has no source"), "{reason}");
        let again = json!({"stop_hook_active": true, "last_assistant_message": unsourced});
        assert_eq!(decide(&ids, again.to_string().as_bytes()), None);
        let good = format!(
            r#"{{"subtask_id":"{task}","status":"complete","findings":[{{"claim":"c","source":"s","confidence_permille":900}}],"summary":"s"}}"#
        );
        let event = json!({"stop_hook_active": false, "last_assistant_message": good});
        assert_eq!(decide(&ids, event.to_string().as_bytes()), None);
        assert_eq!(decide(&ids, b"not json"), None);
    }
}
