//! The run's trace: one line per event, folded into a hash as it is written. Two runs of one seed must
//! produce the same hash (docs/DESIGN.md §12, invariant 11); the lines themselves are kept only when asked
//! (a replay), because formatting is one of the sweep's larger costs.

/// FNV-1a, 64-bit: tiny, stable across platforms and Rust versions (unlike `DefaultHasher`, whose
/// algorithm is unspecified), and good enough to tell two traces apart.
#[derive(Debug, Clone, Copy)]
pub struct TraceHash(u64);

impl TraceHash {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;

    fn new() -> Self {
        Self(Self::OFFSET)
    }

    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(Self::PRIME);
        }
    }

    /// The hash so far.
    pub fn value(self) -> u64 {
        self.0
    }
}

/// How much of the trace a run keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TraceMode {
    /// Hash only: the sweep. A violation is replayed with [`TraceMode::Record`] to print the lines.
    HashOnly,
    /// Hash and every line, up to `lines_max` (older lines are never dropped: the tail is cut instead and
    /// the cut is counted, so a reproduction always starts at event 0).
    Record {
        /// At most this many lines are kept.
        lines_max: usize,
    },
}

/// The trace of one run.
#[derive(Debug)]
pub struct Trace {
    mode: TraceMode,
    hash: TraceHash,
    lines: Vec<String>,
    lines_cut: u64,
    events: u64,
    scratch: String,
}

impl Trace {
    /// An empty trace in `mode`.
    pub fn new(mode: TraceMode) -> Self {
        Self {
            mode,
            hash: TraceHash::new(),
            lines: Vec::new(),
            lines_cut: 0,
            events: 0,
            scratch: String::new(),
        }
    }

    /// Appends one line, formatted by `f`, for event number `event` at virtual time `at_ms`. The line is
    /// `event time text`; all of it goes into the hash.
    pub fn line(&mut self, event: u64, at_ms: u64, f: impl FnOnce(&mut String)) {
        // The prefix is hashed from bytes on the stack and the text after it as `f` writes it:
        // the hash is the same as the whole line's (it is streamed), and a sweep, which keeps no
        // line, never appends the prefix to a `String` a character at a time (2% of a sweep).
        let prefix = Prefix::new(event, at_ms);
        self.hash.write(prefix.bytes());
        self.scratch.clear();
        f(&mut self.scratch);
        self.hash.write(self.scratch.as_bytes());
        self.hash.write(b"\n");
        self.events += 1;
        if let TraceMode::Record { lines_max } = self.mode {
            if self.lines.len() < lines_max {
                let mut line = String::with_capacity(prefix.len + self.scratch.len());
                push_ascii(&mut line, prefix.bytes());
                line.push_str(&self.scratch);
                self.lines.push(line);
            } else {
                self.lines_cut += 1;
            }
        }
    }

    /// The hash of every line so far.
    pub fn hash(&self) -> u64 {
        self.hash.value()
    }

    /// The recorded lines (empty in [`TraceMode::HashOnly`]).
    pub fn lines(&self) -> &[String] {
        &self.lines
    }

    /// Lines written after the record bound was reached (counted in the hash, not kept).
    pub fn lines_cut(&self) -> u64 {
        self.lines_cut
    }

    /// Lines written in total.
    pub fn len(&self) -> u64 {
        self.events
    }

    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.events == 0
    }
}

/// A line's prefix, `format!("{event:>7} {at_ms:>9}ms ")`, in bytes on the stack.
struct Prefix {
    buf: [u8; Prefix::BYTES_MAX],
    len: usize,
}

impl Prefix {
    /// Two numbers of at most 20 digits, a space and `ms `.
    const BYTES_MAX: usize = 44;

    fn new(event: u64, at_ms: u64) -> Self {
        let mut prefix = Self {
            buf: [b' '; Self::BYTES_MAX],
            len: 0,
        };
        prefix.right_aligned(event, 7);
        prefix.push(b" ");
        prefix.right_aligned(at_ms, 9);
        prefix.push(b"ms ");
        prefix
    }

    fn bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    fn push(&mut self, bytes: &[u8]) {
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }

    /// `n` in decimal, right-aligned in `width` columns (wider numbers take what they need); the
    /// padding is the spaces the buffer starts with.
    fn right_aligned(&mut self, n: u64, width: usize) {
        let mut digits_buf = [0u8; 20];
        let start = digits(&mut digits_buf, n);
        let digits = &digits_buf[start..];
        self.len += width.saturating_sub(digits.len());
        self.push(digits);
    }
}

/// The decimal digits of `n`, at the end of `buf`; returns where they start.
fn digits(buf: &mut [u8; 20], n: u64) -> usize {
    let mut start = buf.len();
    let mut rest = n;
    loop {
        start -= 1;
        // `rest % 10` is below 10: the cast keeps it whole.
        buf[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    start
}

/// Appends ASCII bytes as text, a character each (the digits here: one or two handfuls, for which
/// this is cheaper than checking them as UTF-8 to append them at once).
fn push_ascii(s: &mut String, bytes: &[u8]) {
    s.reserve(bytes.len());
    for b in bytes {
        s.push(char::from(*b));
    }
}

/// Appends `n` in decimal, as `{n}` writes it: the trace's numbers without the formatter's
/// machinery (one or more per line, and the formatter was a fifth of writing the trace).
pub(crate) fn push_dec(s: &mut String, n: u64) {
    let mut buf = [0u8; 20];
    let start = digits(&mut buf, n);
    push_ascii(s, &buf[start..]);
}

/// Appends `n` as eight lowercase hex digits, as `{n:08x}` writes it.
pub(crate) fn push_hex8(s: &mut String, n: u32) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut buf = [0u8; 8];
    for (i, b) in buf.iter_mut().enumerate() {
        // The shift leaves four bits: the index is below 16.
        *b = HEX[((n >> (28 - 4 * i)) & 0xf) as usize];
    }
    push_ascii(s, &buf);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hash_does_not_depend_on_the_mode() {
        let mut a = Trace::new(TraceMode::HashOnly);
        let mut b = Trace::new(TraceMode::Record { lines_max: 1 });
        for t in [&mut a, &mut b] {
            t.line(0, 0, |s| s.push_str("start"));
            t.line(1, 5, |s| s.push_str("deliver"));
        }
        assert_eq!(a.hash(), b.hash());
        assert_eq!(b.lines().len(), 1);
        assert_eq!(b.lines_cut(), 1);
        assert!(a.lines().is_empty());
    }

    #[test]
    fn different_lines_give_different_hashes() {
        let mut a = Trace::new(TraceMode::HashOnly);
        let mut b = Trace::new(TraceMode::HashOnly);
        a.line(0, 0, |s| s.push('x'));
        b.line(0, 0, |s| s.push('y'));
        assert_ne!(a.hash(), b.hash());
    }

    #[test]
    fn the_prefix_is_what_the_formatter_writes() {
        for (event, at_ms) in [
            (0, 0),
            (42, 7),
            (1_234_567, 123_456_789),
            (12_345_678, 1_234_567_890),
            (u64::MAX, u64::MAX),
        ] {
            let prefix = Prefix::new(event, at_ms);
            assert_eq!(
                prefix.bytes(),
                format!("{event:>7} {at_ms:>9}ms ").as_bytes()
            );
        }
    }

    /// The hash streamed in pieces is the hash of each whole line, as it was when lines were
    /// formatted whole, and a recorded line is that text.
    #[test]
    fn the_hash_is_the_hash_of_the_whole_lines() {
        let mut t = Trace::new(TraceMode::Record { lines_max: 8 });
        let mut whole = TraceHash::new();
        for (event, at_ms, text) in [(1, 0, "heartbeat w1"), (12_345_678, 99, "frame to coord x")] {
            t.line(event, at_ms, |s| s.push_str(text));
            let line = format!("{event:>7} {at_ms:>9}ms {text}");
            whole.write(line.as_bytes());
            whole.write(b"\n");
            assert_eq!(t.lines().last(), Some(&line));
        }
        assert_eq!(t.hash(), whole.value());
    }

    #[test]
    fn numbers_are_what_the_formatter_writes() {
        for n in [
            0,
            1,
            9,
            10,
            4096,
            1_234_567_890,
            u64::from(u32::MAX),
            u64::MAX,
        ] {
            let mut s = String::from("x");
            push_dec(&mut s, n);
            assert_eq!(s, format!("x{n}"));
        }
        for n in [0, 1, 0xab, 0xdead_beef, 0x0102_0304, u32::MAX] {
            let mut s = String::new();
            push_hex8(&mut s, n);
            assert_eq!(s, format!("{n:08x}"));
        }
    }
}
