//! One tool call as the policy sees it: the tool's literal name (each harness's own: `Bash`, `bash`,
//! `shell`, ...) and its input, with the one string rules match against and a digest for the audit.

use serde_json::Value;

/// The input fields that name what a call acts on, in the order they are looked for: a shell tool's
/// command (a string, or Codex's argv array), then a file tool's path under each harness's name for it.
const SUBJECT_FIELDS: [&str; 5] = ["command", "cmd", "file_path", "filePath", "path"];

/// A tool call awaiting a decision. Built by [`ToolCall::new`], which reads the call's subject once
/// (every rule with a pattern matches against it); change neither field afterwards.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolCall {
    /// The tool's literal name, as the harness reported it.
    pub tool: String,
    /// The tool's input, as the model sent it.
    pub input: Value,
    /// What the call acts on ([`ToolCall::subject`]), read from `input` once.
    subject: Option<String>,
}

impl ToolCall {
    /// A call of `tool` with `input`.
    pub fn new(tool: impl Into<String>, input: Value) -> Self {
        let subject = subject_of(&input);
        ToolCall {
            tool: tool.into(),
            input,
            subject,
        }
    }

    /// What the call acts on, for a rule's pattern: the command line of a shell tool (an argv array
    /// joined by spaces) or the path of a file tool. `None` when the input names neither.
    pub fn subject(&self) -> Option<&str> {
        self.subject.as_deref()
    }

    /// A digest of the input for the audit row: never the raw input, which may hold secrets. FNV-1a
    /// over the JSON text (object keys sorted by serde_json's map), 16 hex digits; it tells two calls
    /// apart, it is not a cryptographic commitment.
    pub fn input_digest(&self) -> String {
        let text = self.input.to_string();
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
        for byte in text.bytes() {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
        format!("fnv1a64:{hash:016x}")
    }
}

/// What `input` names a call acts on ([`ToolCall::subject`]).
fn subject_of(input: &Value) -> Option<String> {
    let obj = input.as_object()?;
    SUBJECT_FIELDS
        .iter()
        .find_map(|field| match obj.get(*field)? {
            Value::String(s) => Some(s.clone()),
            Value::Array(words) => {
                let words: Vec<&str> = words.iter().filter_map(Value::as_str).collect();
                (!words.is_empty()).then(|| words.join(" "))
            }
            _ => None,
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_subject_is_the_command_or_the_path() {
        let check = |input: Value, expected: Option<&str>| {
            assert_eq!(
                ToolCall::new("t", input.clone()).subject(),
                expected,
                "{input}"
            );
        };
        check(json!({"command": "touch x"}), Some("touch x"));
        check(
            json!({"command": ["bash", "-lc", "touch x"]}),
            Some("bash -lc touch x"),
        );
        check(json!({"cmd": "ls"}), Some("ls"));
        check(json!({"file_path": "/a/b", "content": "x"}), Some("/a/b"));
        check(json!({"filePath": "/a/c"}), Some("/a/c"));
        check(json!({"path": "src"}), Some("src"));
        check(json!({"pattern": "x"}), None);
        check(json!("just text"), None);
        check(json!({"command": []}), None);
    }

    #[test]
    fn the_digest_tells_inputs_apart_and_hides_them() {
        let a = ToolCall::new("Bash", json!({"command": "echo sk-secret"}));
        let b = ToolCall::new("Bash", json!({"command": "echo sk-secreT"}));
        assert_ne!(a.input_digest(), b.input_digest());
        assert_eq!(a.input_digest(), a.clone().input_digest());
        assert!(!a.input_digest().contains("secret"));
    }
}
