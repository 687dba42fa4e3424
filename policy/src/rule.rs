//! Permission rules: `Tool` or `Tool(pattern)`, where the tool is a literal name (or `*` for any) and
//! the pattern is matched against the call's subject (its command line or path) with `*` standing for
//! any run of characters. The same syntax serves deny, ask and allow rules.

use std::fmt;
use std::str::FromStr;

use crate::call::ToolCall;

/// The longest rule text accepted; a rule is a name and a short pattern.
pub const RULE_BYTES_MAX: usize = 1024;

/// One rule, parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rule {
    text: String,
    tool: ToolName,
    pattern: Option<Glob>,
}

/// A rule's pattern split at its `*`s once, when the rule is parsed: the piece the subject starts
/// with, the pieces it holds in order, and the piece it ends with (`None`: no `*`, the subject is
/// exactly `first`).
#[derive(Clone, Debug, PartialEq, Eq)]
struct Glob {
    first: String,
    middle: Vec<String>,
    last: Option<String>,
}

impl Glob {
    fn new(pattern: &str) -> Glob {
        let mut pieces: Vec<String> = pattern.split('*').map(str::to_owned).collect();
        let first = pieces.remove(0);
        let last = pieces.pop();
        Glob {
            first,
            middle: pieces,
            last,
        }
    }

    /// `*` matches any run of characters (none included); every other character matches itself.
    /// Linear in the subject for each piece, so a hostile subject cannot blow up the check.
    fn matches(&self, subject: &str) -> bool {
        let Some(mut rest) = subject.strip_prefix(self.first.as_str()) else {
            return false;
        };
        let Some(last) = &self.last else {
            return rest.is_empty();
        };
        for piece in &self.middle {
            match rest.find(piece.as_str()) {
                Some(at) => rest = &rest[at + piece.len()..],
                None => return false,
            }
        }
        rest.ends_with(last.as_str())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum ToolName {
    Any,
    Literal(String),
}

/// Why a rule's text is not a rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RuleError {
    /// The text is empty.
    #[error("a rule is empty; write a tool name such as \"Bash\" or \"Bash(rm *)\"")]
    Empty,
    /// The text is longer than [`RULE_BYTES_MAX`].
    #[error("a rule is {0} bytes; at most {RULE_BYTES_MAX}")]
    TooLong(usize),
    /// A `(` without its closing `)` at the end, or a `)` without an opening `(`.
    #[error("rule {0:?}: a pattern is written Tool(pattern), with the `)` last")]
    Unbalanced(String),
    /// The tool name holds a character no tool name has.
    #[error("rule {0:?}: a tool name is letters, digits, `_`, `-`, `.`, `:` or `*` alone")]
    BadToolName(String),
}

impl FromStr for Rule {
    type Err = RuleError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let trimmed = text.trim();
        if trimmed.is_empty() {
            return Err(RuleError::Empty);
        }
        if trimmed.len() > RULE_BYTES_MAX {
            return Err(RuleError::TooLong(trimmed.len()));
        }
        let (name, pattern) = match trimmed.split_once('(') {
            Some((name, rest)) => match rest.strip_suffix(')') {
                Some(pattern) => (name.trim(), Some(Glob::new(pattern))),
                None => return Err(RuleError::Unbalanced(trimmed.to_owned())),
            },
            None if trimmed.contains(')') => {
                return Err(RuleError::Unbalanced(trimmed.to_owned()));
            }
            None => (trimmed, None),
        };
        let tool = if name == "*" {
            ToolName::Any
        } else if !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "_-.:".contains(c))
        {
            ToolName::Literal(name.to_owned())
        } else {
            return Err(RuleError::BadToolName(trimmed.to_owned()));
        };
        Ok(Rule {
            text: trimmed.to_owned(),
            tool,
            pattern,
        })
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Rule {
    /// Whether the rule covers `call`: the tool name matches literally (or the rule says `*`), and the
    /// pattern, if any, matches the call's subject. A rule with a pattern never covers a call without
    /// a subject: a deny rule on `Bash(rm *)` does not deny `Bash` with no command, and an allow rule
    /// does not allow it either.
    pub fn matches(&self, call: &ToolCall) -> bool {
        let name_ok = match &self.tool {
            ToolName::Any => true,
            ToolName::Literal(name) => *name == call.tool,
        };
        name_ok
            && match &self.pattern {
                None => true,
                Some(glob) => call.subject().is_some_and(|s| glob.matches(s)),
            }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn check(rule: &str, tool: &str, command: &str, expected: bool) {
        let rule: Rule = rule.parse().unwrap_or_else(|e| panic!("{rule}: {e}"));
        let call = ToolCall::new(tool, json!({ "command": command }));
        assert_eq!(rule.matches(&call), expected, "{rule} on {tool}({command})");
    }

    #[test]
    fn rules_match_by_literal_name_and_pattern() {
        check("Bash", "Bash", "anything", true);
        check("Bash", "bash", "anything", false);
        check("*", "write", "x", true);
        check("Bash(rm *)", "Bash", "rm -rf /", true);
        check("Bash(rm *)", "Bash", "echo rm", false);
        check("Bash(*touch*)", "Bash", "cd /tmp && touch x", true);
        check("Bash(ls)", "Bash", "ls", true);
        check("Bash(ls)", "Bash", "ls -la", false);
        check("*(git push*)", "shell", "git push origin", true);
        check("Bash(a*b*c)", "Bash", "a--b--c", true);
        check("Bash(a*b*c)", "Bash", "a--c--b", false);
        check("Bash(*)", "Bash", "", true);
    }

    #[test]
    fn a_pattern_never_covers_a_call_without_a_subject() {
        let rule: Rule = "Bash(rm *)".parse().unwrap_or_else(|e| panic!("{e}"));
        assert!(!rule.matches(&ToolCall::new("Bash", json!({}))));
        let rule: Rule = "Bash".parse().unwrap_or_else(|e| panic!("{e}"));
        assert!(rule.matches(&ToolCall::new("Bash", json!({}))));
    }

    #[test]
    fn bad_rules_are_refused_with_a_reason() {
        assert_eq!("".parse::<Rule>(), Err(RuleError::Empty));
        assert!(matches!(
            "Bash(rm *".parse::<Rule>(),
            Err(RuleError::Unbalanced(_))
        ));
        assert!(matches!(
            "Bash)".parse::<Rule>(),
            Err(RuleError::Unbalanced(_))
        ));
        assert!(matches!(
            "Ba sh".parse::<Rule>(),
            Err(RuleError::BadToolName(_))
        ));
        assert!(matches!(
            "(x)".parse::<Rule>(),
            Err(RuleError::BadToolName(_))
        ));
        assert!(matches!(
            "x".repeat(RULE_BYTES_MAX + 1).parse::<Rule>(),
            Err(RuleError::TooLong(_))
        ));
        assert_eq!(
            " Bash(rm *) ".parse::<Rule>().map(|r| r.to_string()),
            Ok("Bash(rm *)".to_owned())
        );
    }
}
