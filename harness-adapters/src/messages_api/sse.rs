//! An incremental server-sent-events parser: bytes in, complete events out.
//!
//! Pure and allocation-light; the agent loop feeds it each network chunk as it arrives, so an event
//! split across chunks (or a `\r\n` split between two) is handled. Lines and events are bounded so a
//! hostile or broken endpoint cannot make it buffer without limit.

/// Longest line accepted (an `input_json_delta` is small; a whole non-streamed body on one line is
/// not an SSE line).
pub const SSE_LINE_BYTES_MAX: usize = 8 << 20;
/// Largest event (all its `data:` lines together).
pub const SSE_EVENT_BYTES_MAX: usize = 16 << 20;

/// One complete event.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SseFrame {
    /// The `event:` field, empty when absent.
    pub event: String,
    /// The `data:` lines joined by `\n`.
    pub data: String,
}

/// Why a stream is not valid SSE.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// A line exceeded [`SSE_LINE_BYTES_MAX`].
    #[error("SSE line longer than {SSE_LINE_BYTES_MAX} bytes")]
    LineTooLong,
    /// An event exceeded [`SSE_EVENT_BYTES_MAX`].
    #[error("SSE event larger than {SSE_EVENT_BYTES_MAX} bytes")]
    EventTooLarge,
    /// A line was not UTF-8.
    #[error("SSE line is not UTF-8")]
    NotUtf8,
}

/// The parser state.
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    pending_cr: bool,
    event: String,
    data: String,
    has_data: bool,
}

impl SseParser {
    /// A parser at the start of a stream.
    pub fn new() -> Self {
        SseParser::default()
    }

    /// Feeds bytes; complete events are appended to `out`.
    ///
    /// # Errors
    /// [`SseError`] when a bound is exceeded or a line is not UTF-8; the stream is then unusable.
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<SseFrame>) -> Result<(), SseError> {
        let mut rest = bytes;
        if self.pending_cr && !rest.is_empty() {
            // A `\r` ended the last chunk: a `\n` right after it belongs to the same line ending.
            self.pending_cr = false;
            if let Some(b'\n') = rest.first() {
                rest = &rest[1..];
            }
        }
        while !rest.is_empty() {
            match memchr2(b'\n', b'\r', rest) {
                None => {
                    if self.line.len() + rest.len() > SSE_LINE_BYTES_MAX {
                        return Err(SseError::LineTooLong);
                    }
                    self.line.extend_from_slice(rest);
                    return Ok(());
                }
                Some(at) => {
                    if self.line.len() + at > SSE_LINE_BYTES_MAX {
                        return Err(SseError::LineTooLong);
                    }
                    let ending = rest[at];
                    if self.line.is_empty() {
                        self.line_done(&rest[..at], out)?;
                    } else {
                        self.line.extend_from_slice(&rest[..at]);
                        let line = std::mem::take(&mut self.line);
                        self.line_done(&line, out)?;
                        self.line = line;
                        self.line.clear();
                    }
                    rest = &rest[at + 1..];
                    if ending == b'\r' {
                        match rest.first() {
                            Some(b'\n') => rest = &rest[1..],
                            None => self.pending_cr = true,
                            _ => {}
                        }
                    }
                }
            }
        }
        Ok(())
    }

    fn line_done(&mut self, line: &[u8], out: &mut Vec<SseFrame>) -> Result<(), SseError> {
        if line.is_empty() {
            if self.has_data {
                out.push(SseFrame {
                    event: std::mem::take(&mut self.event),
                    data: std::mem::take(&mut self.data),
                });
            } else {
                self.event.clear();
            }
            self.has_data = false;
            return Ok(());
        }
        if line[0] == b':' {
            return Ok(());
        }
        let line = std::str::from_utf8(line).map_err(|_| SseError::NotUtf8)?;
        let (field, value) = match line.find(':') {
            Some(i) => {
                let v = &line[i + 1..];
                (&line[..i], v.strip_prefix(' ').unwrap_or(v))
            }
            None => (line, ""),
        };
        match field {
            "event" => {
                self.event.clear();
                self.event.push_str(value);
            }
            "data" => {
                if self.data.len() + value.len() + 1 > SSE_EVENT_BYTES_MAX {
                    return Err(SseError::EventTooLarge);
                }
                if self.has_data {
                    self.data.push('\n');
                }
                self.data.push_str(value);
                self.has_data = true;
            }
            _ => {}
        }
        Ok(())
    }
}

fn memchr2(a: u8, b: u8, haystack: &[u8]) -> Option<usize> {
    haystack.iter().position(|&c| c == a || c == b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_in_pieces(input: &str, piece: usize) -> Vec<SseFrame> {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for chunk in input.as_bytes().chunks(piece) {
            p.feed(chunk, &mut out).unwrap();
        }
        out
    }

    #[test]
    fn events_survive_any_chunking_and_line_ending() {
        let input = "event: message_start\ndata: {\"a\":1}\n\n: comment\nevent: x\r\ndata: line1\r\ndata:line2\r\n\r\ndata: last\n\n";
        let expected = vec![
            SseFrame {
                event: "message_start".into(),
                data: "{\"a\":1}".into(),
            },
            SseFrame {
                event: "x".into(),
                data: "line1\nline2".into(),
            },
            SseFrame {
                event: String::new(),
                data: "last".into(),
            },
        ];
        for piece in 1..input.len() {
            assert_eq!(
                parse_in_pieces(input, piece),
                expected,
                "piece size {piece}"
            );
        }
    }

    #[test]
    fn a_crlf_split_by_an_empty_chunk_is_one_line_ending() {
        let mut p = SseParser::new();
        let mut out = Vec::new();
        for chunk in [&b"data: x\r"[..], b"", b"\n", b"data: y\n\n"] {
            p.feed(chunk, &mut out).unwrap();
        }
        assert_eq!(
            out,
            vec![SseFrame {
                event: String::new(),
                data: "x\ny".into()
            }]
        );
    }

    #[test]
    fn incomplete_trailing_event_is_not_emitted_and_bounds_hold() {
        assert!(parse_in_pieces("data: partial", 4).is_empty());
        let mut p = SseParser::new();
        let long = vec![b'a'; SSE_LINE_BYTES_MAX + 1];
        assert_eq!(p.feed(&long, &mut Vec::new()), Err(SseError::LineTooLong));
        let mut p = SseParser::new();
        assert_eq!(
            p.feed(b"data: \xff\xfe\n", &mut Vec::new()),
            Err(SseError::NotUtf8)
        );
    }
}
