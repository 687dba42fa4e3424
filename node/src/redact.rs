//! Every way out of `keel` is scrubbed (issue 16). What a harness produced was scrubbed at ingest
//! (keel-actors' specialist), but the store also keeps what the user gave as given (a run's brief, a
//! plan's steps, a follow-up's message), and a secret can reach an error message or a log line. So
//! everything `keel` prints passes the process's one [`Scrubber`], with the values of the
//! credentials keel knows registered:
//!
//! - `--json` values are scrubbed string by string ([`json`]) before they are serialized, so the
//!   output stays valid JSON;
//! - every line on stdout passes [`ScrubbedLines`] (the `stdout` module's writer), and every log
//!   line on stderr passes [`log_line`] (a JSON log line is scrubbed as a value, a human one as
//!   text), so no command and no future `outln!` can print around it;
//! - text that is cut for a table cell or a one-line summary is scrubbed before the cut
//!   ([`text`]), so a cut cannot leave half of a secret the whole would have matched;
//! - the synthesis file is scrubbed before it is written.

use std::borrow::Cow;
use std::io::{self, Write};
use std::sync::{OnceLock, PoisonError, RwLock};

use keel_actors::context::{PatternError, Scrubber};

use crate::run::setup::CREDENTIAL_ENV;

/// The process's scrubber, set by [`init`] (a scrubber with no registered literal until then: the
/// built-in shapes still apply); [`register_secrets`] adds the keys of keel.toml's accounts once
/// it is read.
static SCRUBBER: OnceLock<RwLock<Scrubber>> = OnceLock::new();

/// Most bytes a line writer holds without a newline before it scrubs and writes them anyway (a line
/// longer than this may be cut inside a secret: the margin keeps every built-in shape whole).
const LINE_BYTES_MAX: usize = 1024 * 1024;

/// Checks the scrubber's patterns (keel refuses to start without them) and registers the values of
/// the credential variables keel reads (`ANTHROPIC_API_KEY`, `OPENAI_API_KEY`) that are set.
///
/// # Errors
/// [`PatternError`] when a built-in pattern does not compile.
pub(crate) fn init() -> Result<(), PatternError> {
    Scrubber::check_patterns()?;
    let mut scrubber = Scrubber::new();
    for name in CREDENTIAL_ENV {
        if let Ok(value) = std::env::var(name) {
            // A value shorter than six characters is not a credential; it stays unregistered.
            let _ = scrubber.register_secret(&value);
        }
    }
    let _ = SCRUBBER.set(RwLock::new(scrubber));
    Ok(())
}

fn scrubber() -> &'static RwLock<Scrubber> {
    SCRUBBER.get_or_init(|| RwLock::new(Scrubber::new()))
}

/// Registers more credential values (the keys of keel.toml's `[[accounts]]`, read when the file
/// is loaded), so nothing keel prints afterwards carries them.
pub(crate) fn register_secrets(values: impl IntoIterator<Item = String>) {
    // A poisoned lock still holds a usable scrubber: registering is a push onto its list.
    let mut scrubber = scrubber().write().unwrap_or_else(PoisonError::into_inner);
    for value in values {
        // A value shorter than six characters is not a credential; it stays unregistered.
        let _ = scrubber.register_secret(&value);
    }
}

/// `text` with every secret replaced by its marker.
pub(crate) fn text(text: &str) -> Cow<'_, str> {
    scrubber()
        .read()
        .unwrap_or_else(PoisonError::into_inner)
        .scrub(text)
        .text
}

/// Scrubs every string of a JSON value in place (keys included).
pub(crate) fn json(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::String(s) => {
            if let Cow::Owned(clean) = text(s) {
                *s = clean;
            }
        }
        Value::Array(items) => items.iter_mut().for_each(json),
        Value::Object(map) => {
            let keys: Vec<String> = map.keys().cloned().collect();
            for key in keys {
                let Some(mut v) = map.remove(&key) else {
                    continue;
                };
                json(&mut v);
                map.insert(text(&key).into_owned(), v);
            }
        }
        Value::Null | Value::Bool(_) | Value::Number(_) => {}
    }
}

/// One log line as the tracing formatter wrote it, scrubbed: a JSON line as a value (it stays valid
/// JSON), anything else as text.
pub(crate) fn log_line(line: &[u8]) -> Vec<u8> {
    let body = line.strip_suffix(b"\n").unwrap_or(line);
    if let Ok(mut value) = serde_json::from_slice::<serde_json::Value>(body) {
        json(&mut value);
        let mut out = serde_json::to_vec(&value).unwrap_or_default();
        if body.len() != line.len() {
            out.push(b'\n');
        }
        return out;
    }
    text(&String::from_utf8_lossy(line))
        .into_owned()
        .into_bytes()
}

/// A writer that scrubs whole lines: bytes are held until a newline (or [`LINE_BYTES_MAX`]), then
/// the line is scrubbed and written. What is left without a newline is written on `flush` and when
/// the writer is dropped.
pub(crate) struct ScrubbedLines<W: Write> {
    inner: W,
    pending: Vec<u8>,
}

impl<W: Write> ScrubbedLines<W> {
    /// Scrubs what is written to `inner`.
    pub(crate) fn new(inner: W) -> Self {
        Self {
            inner,
            pending: Vec::new(),
        }
    }

    fn emit(&mut self, upto: usize) -> io::Result<()> {
        let line: Vec<u8> = self.pending.drain(..upto).collect();
        let clean = text(&String::from_utf8_lossy(&line)).into_owned();
        self.inner.write_all(clean.as_bytes())
    }
}

impl<W: Write> Write for ScrubbedLines<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.pending.extend_from_slice(buf);
        while let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
            self.emit(end + 1)?;
        }
        if self.pending.len() > LINE_BYTES_MAX {
            // Cut on a character boundary so the lossy decoding does not mangle a character.
            let text = String::from_utf8_lossy(&self.pending);
            let mut cut = LINE_BYTES_MAX.min(text.len());
            while cut > 0 && !text.is_char_boundary(cut) {
                cut -= 1;
            }
            self.emit(cut)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let n = self.pending.len();
        if n > 0 {
            self.emit(n)?;
        }
        self.inner.flush()
    }
}

impl<W: Write> Drop for ScrubbedLines<W> {
    fn drop(&mut self) {
        // Nobody can hear an error here; the line is written if it can be.
        let _ = self.flush();
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const KEY: &str = "sk-ant-api03-Zq3xT9vLm2Kp8RwYc4Nf6Hd1Gs5Bj7Ue0Ao";

    #[test]
    fn lines_are_scrubbed_whole_even_when_written_in_pieces() {
        let mut out = Vec::new();
        {
            let mut w = ScrubbedLines::new(&mut out);
            let (a, b) = KEY.split_at(10);
            write!(w, "key {a}").unwrap();
            write!(w, "{b} end\nnext").unwrap();
        }
        let out = String::from_utf8(out).unwrap();
        assert_eq!(out, "key [REDACTED:anthropic-key] end\nnext");
    }

    #[test]
    fn json_values_and_log_lines_stay_valid_json() {
        let mut v = serde_json::json!({"a": [format!("x {KEY} \"q\\")], "n": 1});
        json(&mut v);
        assert_eq!(v["a"][0], "x [REDACTED:anthropic-key] \"q\\");
        let line = format!("{{\"fields\":{{\"input\":\"password={KEY}\\\"x\"}}}}\n");
        let clean = log_line(line.as_bytes());
        let parsed: serde_json::Value = serde_json::from_slice(&clean).unwrap();
        assert!(!parsed.to_string().contains(KEY), "{parsed}");
        assert!(clean.ends_with(b"\n"));
    }
}
