//! JSON-lines plumbing shared by the four CLI parsers: typed line errors and bounded line reading.
//!
//! A harness's stdout is untrusted input: a crash can cut a line in half, a bug can print a banner,
//! a tool can flood it. Every line is parsed on its own, a bad one yields a [`ParseError`] (never a
//! panic) and the session goes on; lines are bounded so one runaway line cannot exhaust memory.

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// Longest stdout line kept. pi repeats the whole conversation in `agent_end`, so this is generous;
/// a longer line is skipped and reported as [`ParseError::LineTooLong`].
pub const LINE_BYTES_MAX: usize = 32 * 1024 * 1024;

/// Longest stderr line kept (stderr carries logs and error notices only).
pub const STDERR_LINE_BYTES_MAX: usize = 64 * 1024;

/// Why one line of harness output could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ParseError {
    /// The line ends before its JSON value does (a crash or a kill mid-write).
    #[error("truncated JSON line: {0}")]
    Truncated(String),
    /// The line is not JSON at all, or not the JSON the harness documents.
    #[error("invalid JSON line: {0}")]
    InvalidJson(String),
    /// The line is valid JSON but lacks a field its event type requires.
    #[error("event `{event}` lacks `{field}`")]
    MissingField {
        /// The event type (`type` value) of the line.
        event: String,
        /// The missing field.
        field: &'static str,
    },
    /// The line was longer than [`LINE_BYTES_MAX`] and was skipped.
    #[error("line of {0} bytes exceeds the limit")]
    LineTooLong(usize),
}

impl ParseError {
    /// Maps a serde_json error, telling a cut line from a wrong one.
    pub fn from_json(err: &serde_json::Error) -> ParseError {
        let text = err.to_string();
        if err.is_eof() {
            ParseError::Truncated(text)
        } else {
            ParseError::InvalidJson(text)
        }
    }
}

/// A string field of a JSON object, or `""` when it is absent or not a string. The CLIs leave fields
/// out freely; a missing id or text is carried as empty rather than failing the whole line.
pub fn str_field<'a>(value: &'a serde_json::Value, key: &str) -> &'a str {
    value
        .get(key)
        .and_then(serde_json::Value::as_str)
        .unwrap_or_default()
}

/// Parses one line into `T`, with the error typed.
///
/// # Errors
/// [`ParseError::Truncated`] or [`ParseError::InvalidJson`].
pub fn parse_json<'a, T: serde::Deserialize<'a>>(line: &'a [u8]) -> Result<T, ParseError> {
    serde_json::from_slice(line).map_err(|e| ParseError::from_json(&e))
}

/// The `type` of a line whose first key is `"type"` (as every CLI prints it), read without parsing
/// the rest; `None` when the line has another shape (the caller then parses it in full).
pub fn leading_type(line: &[u8]) -> Option<&[u8]> {
    let rest = line.strip_prefix(b"{\"type\":")?;
    let rest = rest.strip_prefix(b" ").unwrap_or(rest);
    let rest = rest.strip_prefix(b"\"")?;
    let end = rest.iter().position(|b| *b == b'"' || *b == b'\\')?;
    (rest[end] == b'"').then_some(&rest[..end])
}

/// A cheap check for a line the parser skips without reading: a cut line almost never ends with
/// the object's closing brace. Lets skipped event types still report truncation.
///
/// # Errors
/// [`ParseError::Truncated`] when the line does not end with `}`.
pub fn check_closed(line: &[u8]) -> Result<(), ParseError> {
    match line.iter().rev().find(|b| !b.is_ascii_whitespace()) {
        Some(b'}') => Ok(()),
        _ => Err(ParseError::Truncated(
            "line does not end with `}`".to_owned(),
        )),
    }
}

/// Strips a trailing `\r`, and reports whether the line holds nothing but whitespace (such lines are
/// skipped, not errors: some CLIs print blank lines between events).
pub fn trim_line(line: &[u8]) -> Option<&[u8]> {
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.iter().all(u8::is_ascii_whitespace) {
        None
    } else {
        Some(line)
    }
}

/// One line read from a stream, or the size of one that was too long to keep.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReadLine {
    /// A complete line without its newline.
    Line(Vec<u8>),
    /// A line longer than the limit; its bytes were discarded.
    TooLong(usize),
}

/// Reads the next line of at most `bytes_max` bytes; `Ok(None)` at end of stream. A final line
/// without a newline is returned as a line. Memory stays bounded by `bytes_max` whatever the input.
///
/// # Errors
/// The reader's I/O error.
///
/// # Cancel safety
/// Not cancel safe (a partial line is lost); call it from a task that owns the reader.
pub async fn read_bounded_line<R: AsyncBufRead + Unpin>(
    reader: &mut R,
    bytes_max: usize,
) -> std::io::Result<Option<ReadLine>> {
    let mut line = Vec::new();
    let mut seen: usize = 0;
    loop {
        let buf = reader.fill_buf().await?;
        if buf.is_empty() {
            if seen == 0 {
                return Ok(None);
            }
            break;
        }
        let (chunk, found) = match buf.iter().position(|b| *b == b'\n') {
            Some(i) => (&buf[..i], Some(i)),
            None => (buf, None),
        };
        if seen.saturating_add(chunk.len()) <= bytes_max {
            line.extend_from_slice(chunk);
        } else {
            line = Vec::new();
        }
        seen = seen.saturating_add(chunk.len());
        let consumed = found.map_or(chunk.len(), |i| i + 1);
        reader.consume(consumed);
        if found.is_some() {
            // An empty line still counts as a line; `seen` stays 0 for it.
            if seen == 0 {
                return Ok(Some(ReadLine::Line(Vec::new())));
            }
            break;
        }
    }
    if seen > bytes_max {
        Ok(Some(ReadLine::TooLong(seen)))
    } else {
        Ok(Some(ReadLine::Line(line)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncation_and_garbage_are_told_apart() {
        assert!(matches!(
            parse_json::<serde_json::Value>(br#"{"type":"res"#),
            Err(ParseError::Truncated(_))
        ));
        assert!(matches!(
            parse_json::<serde_json::Value>(b"not json"),
            Err(ParseError::InvalidJson(_))
        ));
        assert_eq!(trim_line(b"  \r"), None);
        assert_eq!(
            leading_type(br#"{"type": "message_update", "x": 1}"#),
            Some(&b"message_update"[..])
        );
        assert_eq!(leading_type(br#"{"type":"a\"b"}"#), None);
        assert_eq!(leading_type(br#"{"id":1,"type":"x"}"#), None);
        assert!(check_closed(b"{\"type\":\"x\"} ").is_ok());
        assert!(check_closed(b"{\"type\":\"x\",\"a\":[1").is_err());
        assert_eq!(trim_line(b"{}\r"), Some(&b"{}"[..]));
    }

    #[tokio::test]
    async fn lines_are_bounded() {
        let data: &[u8] = b"short\nthis one is far too long\n\nlast";
        let mut reader = tokio::io::BufReader::with_capacity(4, data);
        let mut got = Vec::new();
        while let Some(l) = read_bounded_line(&mut reader, 10).await.unwrap() {
            got.push(l);
        }
        assert_eq!(
            got,
            vec![
                ReadLine::Line(b"short".to_vec()),
                ReadLine::TooLong(24),
                ReadLine::Line(Vec::new()),
                ReadLine::Line(b"last".to_vec()),
            ]
        );
    }
}
