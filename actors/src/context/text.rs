//! Character arithmetic for bounded text: caps are in characters (Unicode scalar values), never bytes,
//! so a preamble in any script is held to the same size.

use std::borrow::Cow;

use super::scrub::REDACTION_MARKER_PREFIX;

/// Characters in `s`.
pub(crate) fn chars(s: &str) -> usize {
    s.chars().count()
}

/// The byte offset just after the first `n` characters of `s` (its length when it is shorter).
pub(crate) fn byte_at_char(s: &str, n: usize) -> usize {
    s.char_indices().nth(n).map_or(s.len(), |(i, _)| i)
}

/// The longest prefix of `s` of at most `bytes_max` bytes that ends on a character boundary.
pub(crate) fn prefix_bytes(s: &str, bytes_max: usize) -> &str {
    if s.len() <= bytes_max {
        return s;
    }
    let mut end = bytes_max;
    while end > 0 && !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// `text`'s first `words_max` whitespace-separated words joined by one space each (what
/// `split_whitespace().take(words_max).collect::<Vec<_>>().join(" ")` gives), borrowed when `text` is
/// already that: log summaries and claims are usually one plain line, and copying them word by word
/// cost more than everything else done with them.
pub(crate) fn collapse_whitespace(text: &str, words_max: usize) -> Cow<'_, str> {
    if is_collapsed(text, words_max) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(
        text.split_whitespace()
            .take(words_max)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

/// Whether `text` is ASCII with no whitespace but single spaces between words, and at most
/// `words_max` words (outside ASCII, Unicode's whitespace is left to `split_whitespace`).
fn is_collapsed(text: &str, words_max: usize) -> bool {
    let mut words = 0usize;
    let mut after_space = true;
    for &b in text.as_bytes() {
        match b {
            b' ' if after_space => return false,
            b' ' => after_space = true,
            b'\t' | b'\n' | 0x0b | 0x0c | b'\r' => return false,
            _ if !b.is_ascii() => return false,
            _ => {
                if after_space {
                    words += 1;
                    if words > words_max {
                        return false;
                    }
                }
                after_space = false;
            }
        }
    }
    // A trailing space is whitespace to drop; an empty text is collapsed.
    !after_space || text.is_empty()
}

/// The marker appended where a field was cut.
pub(crate) fn cut_marker(cut_chars: usize) -> String {
    format!(" [truncated: {cut_chars} characters]")
}

/// A text fitted into a share of the budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fitted {
    /// The text, with a marker when it was cut; never longer than the share.
    pub text: String,
    /// Characters removed (0 when it fitted).
    pub cut_chars: usize,
}

/// Fits `text` (of `text_chars` characters, plus `unseen_chars` already removed before it was scrubbed)
/// into `max_chars`: kept whole when it fits, else a prefix and a marker with the count of what was cut.
/// A cut never splits a redaction marker. When even the marker does not fit, the result is empty and
/// the cut is still counted (the caller records it).
pub(crate) fn fit(text: &str, text_chars: usize, unseen_chars: usize, max_chars: usize) -> Fitted {
    if unseen_chars == 0 && text_chars <= max_chars {
        return Fitted {
            text: text.to_owned(),
            cut_chars: 0,
        };
    }
    let total = text_chars + unseen_chars;
    // The marker for `total` is at least as long as the marker for what is actually cut.
    let marker_len = chars(&cut_marker(total));
    if max_chars < marker_len {
        return Fitted {
            text: String::new(),
            cut_chars: total,
        };
    }
    let keep = (max_chars - marker_len).min(text_chars);
    let mut end = byte_at_char(text, keep);
    end = not_inside_marker(text, end);
    let kept = &text[..end];
    let kept_chars = chars(kept);
    let cut = total - kept_chars;
    let mut out = String::with_capacity(end + marker_len);
    out.push_str(kept);
    out.push_str(&cut_marker(cut));
    Fitted {
        text: out,
        cut_chars: cut,
    }
}

/// Moves a cut back to the start of a redaction marker it would split.
fn not_inside_marker(text: &str, end: usize) -> usize {
    let head = &text[..end];
    match head.rfind('[') {
        Some(open)
            if text[open..].starts_with(REDACTION_MARKER_PREFIX) && !head[open..].contains(']') =>
        {
            open
        }
        _ => end,
    }
}

/// One line: control characters (newlines, tabs, escapes) become spaces, so a log summary or a note
/// cannot break the preamble's layout nor forge a heading.
pub(crate) fn one_line(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect()
}

/// Max-min fair shares of `total` among `demands`: every demand gets an equal share, and what a small
/// demand leaves unused goes to the others.
pub(crate) fn fair_shares(demands: &[usize], total: usize) -> Vec<usize> {
    let mut shares = vec![0usize; demands.len()];
    let mut order: Vec<usize> = (0..demands.len()).collect();
    order.sort_by_key(|i| demands[*i]);
    let mut left = total;
    let mut remaining = demands.len();
    for i in order {
        let equal = left / remaining.max(1);
        let give = demands[i].min(equal);
        shares[i] = give;
        left -= give;
        remaining -= 1;
    }
    shares
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pieces with every kind of whitespace `split_whitespace` knows, and a few it does not.
    const PIECES: &[&str] = &[
        " ", " ", "\t", "\n", "\x0b", "\x0c", "\r", "\x1c", "a", "bc", "\u{a0}", "\u{3000}",
        "\u{85}", "\u{e9}", "-",
    ];

    proptest::proptest! {
        /// The borrowed fast path gives exactly what splitting and joining gives.
        #[test]
        fn collapsing_whitespace_is_split_and_join(
            picks in proptest::collection::vec(0..PIECES.len(), 0..24),
            words_max in 0usize..8,
        ) {
            let text: String = picks.iter().map(|i| PIECES[*i]).collect();
            let expected = text
                .split_whitespace()
                .take(words_max)
                .collect::<Vec<_>>()
                .join(" ");
            proptest::prop_assert_eq!(collapse_whitespace(&text, words_max), expected);
        }
    }

    #[test]
    fn a_plain_line_is_borrowed() {
        assert!(matches!(
            collapse_whitespace("a plain line", 3),
            Cow::Borrowed(_)
        ));
        assert!(matches!(
            collapse_whitespace("a plain line", 2),
            Cow::Owned(_)
        ));
        assert!(matches!(collapse_whitespace("", 0), Cow::Borrowed(_)));
    }

    #[test]
    fn fit_keeps_short_text_whole() {
        let f = fit("hello", 5, 0, 5);
        assert_eq!(f.text, "hello");
        assert_eq!(f.cut_chars, 0);
    }

    #[test]
    fn fit_cuts_and_marks() {
        let text = "a".repeat(100);
        let f = fit(&text, 100, 0, 40);
        // The marker is sized for the whole text (100), so the kept prefix is 12, not 13.
        assert_eq!(
            f.text,
            format!("{} [truncated: 88 characters]", "a".repeat(12))
        );
        assert_eq!(f.cut_chars, 88);
    }

    #[test]
    fn fit_never_splits_a_redaction_marker() {
        let text = "abc [REDACTED:anthropic-key] tail tail tail tail tail tail";
        let f = fit(text, chars(text), 0, 40);
        assert_eq!(f.text, "abc  [truncated: 54 characters]");
    }

    #[test]
    fn fair_shares_give_leftovers_to_the_large() {
        assert_eq!(fair_shares(&[10, 1000, 1000], 610), vec![10, 300, 300]);
        assert_eq!(fair_shares(&[10, 20, 30], 610), vec![10, 20, 30]);
        assert_eq!(fair_shares(&[], 610), Vec::<usize>::new());
    }
}
