//! Where a preamble goes in a prompt. Harnesses recognise a slash skill (`/review 123`) only on the
//! prompt's first line, so a preamble put in front of it would silently turn the skill into plain text;
//! a known public orchestrator breaks it that way by starting its preamble with a newline.

/// Longest skill name recognised (a longer `/word` is a path or prose, not a skill).
const SKILL_NAME_CHARS_MAX: usize = 64;

/// Whether `line` invokes a slash skill: `/name` with optional arguments after a space or tab, where the
/// name starts with a letter or digit and holds letters, digits, `-`, `_`, `.` and `:` (plugin
/// namespaces). A path such as `/usr/bin/env` is not a skill (a second `/` ends the match), and neither
/// is a line with leading whitespace (the harness would not see it as one).
pub fn is_slash_skill_line(line: &str) -> bool {
    let line = line.strip_suffix('\r').unwrap_or(line);
    let Some(rest) = line.strip_prefix('/') else {
        return false;
    };
    let name_end = rest.find([' ', '\t']).unwrap_or(rest.len());
    let name = &rest[..name_end];
    let mut chars = name.chars();
    let Some(first) = chars.next() else {
        return false;
    };
    first.is_ascii_alphanumeric()
        && name.chars().count() <= SKILL_NAME_CHARS_MAX
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
}

/// Puts `preamble` into `prompt`: right after line one when line one is a slash skill (line one is kept
/// byte for byte, its line ending included), otherwise before the prompt with a blank line between.
/// An empty preamble leaves the prompt unchanged.
pub fn place_preamble(preamble: &str, prompt: &str) -> String {
    if preamble.is_empty() {
        return prompt.to_owned();
    }
    let (first, rest) = match prompt.find('\n') {
        Some(i) => (&prompt[..i], Some(&prompt[i + 1..])),
        None => (prompt, None),
    };
    let mut out = String::with_capacity(prompt.len() + preamble.len() + 3);
    if is_slash_skill_line(first) {
        out.push_str(first);
        out.push('\n');
        out.push_str(preamble);
        if let Some(rest) = rest.filter(|r| !r.is_empty()) {
            out.push_str("\n\n");
            out.push_str(rest);
        }
    } else {
        out.push_str(preamble);
        if !prompt.is_empty() {
            out.push_str("\n\n");
            out.push_str(prompt);
        }
    }
    out
}
