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
        self.scratch.clear();
        // The same text as `format!("{event:>7} {at_ms:>9}ms ")`, without the formatter's
        // machinery (a line per event: this prefix alone was 2% of a sweep).
        push_right_aligned(&mut self.scratch, event, 7);
        self.scratch.push(' ');
        push_right_aligned(&mut self.scratch, at_ms, 9);
        self.scratch.push_str("ms ");
        f(&mut self.scratch);
        self.hash.write(self.scratch.as_bytes());
        self.hash.write(b"\n");
        self.events += 1;
        if let TraceMode::Record { lines_max } = self.mode {
            if self.lines.len() < lines_max {
                self.lines.push(self.scratch.clone());
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

/// Appends `n` in decimal, right-aligned in `width` columns (wider numbers take what they need).
fn push_right_aligned(s: &mut String, n: u64, width: usize) {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    let mut rest = n;
    loop {
        start -= 1;
        // `rest % 10` is below 10: the cast keeps it whole.
        digits[start] = b'0' + (rest % 10) as u8;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    let len = digits.len() - start;
    s.extend(std::iter::repeat_n(' ', width.saturating_sub(len)));
    s.extend(digits[start..].iter().map(|d| char::from(*d)));
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
        for (n, width) in [
            (0, 7),
            (42, 7),
            (1_234_567, 7),
            (12_345_678, 7),
            (u64::MAX, 9),
            (7, 9),
        ] {
            let mut s = String::new();
            push_right_aligned(&mut s, n, width);
            assert_eq!(s, format!("{n:>width$}"));
        }
    }
}
