//! Secret scrubbing for everything that goes into a preamble (docs/DESIGN.md §6, invariant 4).
//!
//! A preamble is sent to a model provider and often logged; a key that slipped into a brief, a tool
//! summary or an attachment must not travel with it. The [`Scrubber`] finds secrets in three ways, each
//! precompiled:
//!
//! 1. literals registered at runtime (an account's key, whatever its shape), through Aho-Corasick;
//! 2. one regex per known shape (provider keys, bearer tokens, JWTs, private key blocks, passwords in
//!    URLs and connection strings), compiled once per process. Most start with a literal that the
//!    regex engine's prefilter skips to, so nineteen small scans cost less than one scan of their union,
//!    whose prefilter is too weak to skip anything (measured: docs/PERFORMANCE.md, "Scrubbing at
//!    ingest"); the regex's captures are read only inside a match;
//! 3. one regex of `NAME = value` assignments, kept only when the name sounds secret **and** the value
//!    looks like one (length, character classes, entropy): the name alone is not enough, so
//!    `api_key = os.environ["API_KEY"]`, a git sha, a UUID and keel's own keys pass untouched.
//!
//! Before any regex, a gate over the text's three-byte windows (a bitmap holding one window of each
//! literal) and then one Aho-Corasick pass look for the literals every match of a shape contains
//! (`sk-`, `AKIA`, `://`, ...) and for the secret-sounding name words, ASCII case ignored: a regex
//! runs only over a text holding one of its literals (most texts hold none). The pre-check is exact,
//! never a heuristic: a text it lets through untouched cannot match any regex it skipped. The tests
//! check it on an example of every alternative of every shape and on random texts made of the
//! shapes' pieces; a literal list that misses an alternative no example spells out is not caught.
//!
//! The spans found are merged (a union: a partly overlapping pair is redacted as one) and each is replaced
//! by a marker naming what was removed, such as `[REDACTED:anthropic-key]`.

use std::borrow::Cow;
use std::fmt;
use std::sync::LazyLock;

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use keel_store::Redaction;
use regex::bytes::{Regex, RegexBuilder};

/// What kind of secret a redaction removed: keel-store's type, because rows keep the counts.
pub use keel_store::SecretKind;

mod shapes;
use shapes::{ASSIGNMENT_TAIL, SECRET_NAME_WORDS, SHAPES};

/// The text that opens every redaction marker; truncation never cuts inside a marker that starts with it.
pub const REDACTION_MARKER_PREFIX: &str = "[REDACTED:";

/// How many redactions of each kind a scrub made. Kept as a fixed array (no hash map: deterministic).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Redactions {
    counts: [u32; SecretKind::ALL.len()],
}

impl Redactions {
    /// Counts one more redaction of `kind`.
    pub fn add(&mut self, kind: SecretKind) {
        let slot = &mut self.counts[kind.index()];
        *slot = slot.saturating_add(1);
    }

    /// Adds every count of `other`.
    pub fn merge(&mut self, other: &Redactions) {
        for (mine, theirs) in self.counts.iter_mut().zip(other.counts.iter()) {
            *mine = mine.saturating_add(*theirs);
        }
    }

    /// How many redactions of `kind`.
    pub fn count(&self, kind: SecretKind) -> u32 {
        self.counts[kind.index()]
    }

    /// How many redactions in all.
    pub fn total(&self) -> u32 {
        self.counts.iter().fold(0u32, |a, b| a.saturating_add(*b))
    }

    /// The kinds with a non-zero count, in declaration order, with their counts.
    pub fn iter(&self) -> impl Iterator<Item = (SecretKind, u32)> + '_ {
        SecretKind::ALL
            .iter()
            .map(|k| (*k, self.counts[k.index()]))
            .filter(|(_, n)| *n > 0)
    }

    /// The counts as a stored row keeps them (one entry per kind removed, in declaration order).
    pub fn to_records(&self) -> Vec<Redaction> {
        self.iter()
            .map(|(kind, count)| Redaction { kind, count })
            .collect()
    }

    /// The counts a stored row kept.
    pub fn from_records(records: &[Redaction]) -> Self {
        let mut out = Self::default();
        for r in records {
            let slot = &mut out.counts[r.kind.index()];
            *slot = slot.saturating_add(r.count);
        }
        out
    }
}

impl fmt::Display for Redactions {
    /// `2 anthropic-key, 1 url-password`, or `none`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (kind, n) in self.iter() {
            if !first {
                f.write_str(", ")?;
            }
            first = false;
            write!(f, "{n} {kind}")?;
        }
        if first {
            f.write_str("none")?;
        }
        Ok(())
    }
}

/// One of the scrubber's built-in patterns does not compile (a defect of the build, never of input).
/// keel refuses to start with it rather than scrub less: `keel` exits with this message and
/// `Runtime::start` answers it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "the secret scrubber's {pattern} pattern does not compile ({reason}); keel will not run without it"
)]
pub struct PatternError {
    /// Which pattern (a secret kind's label, or the name of a helper automaton).
    pub pattern: &'static str,
    /// What the compiler said.
    pub reason: String,
}

/// A registered secret was refused; nothing was registered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RegisterSecretError {
    /// Shorter than [`Scrubber::REGISTERED_CHARS_MIN`]: redacting it everywhere would mangle ordinary
    /// text, and a credential that short is not a credential.
    #[error("a registered secret must be at least {min} characters long (got {len})")]
    TooShort {
        /// Its length in characters.
        len: usize,
        /// The minimum.
        min: usize,
    },
    /// Longer than [`Scrubber::REGISTERED_BYTES_MAX`].
    #[error("a registered secret must be at most {max} bytes long (got {len})")]
    TooLong {
        /// Its length in bytes.
        len: usize,
        /// The maximum.
        max: usize,
    },
    /// The registry already holds [`Scrubber::REGISTERED_COUNT_MAX`] secrets.
    #[error("at most {max} secrets can be registered")]
    Full {
        /// The maximum.
        max: usize,
    },
    /// The automaton over the registered literals could not be built with this one added; the
    /// registry is as it was (every earlier literal is still redacted).
    #[error("the registered secrets' automaton could not be built: {reason}")]
    Automaton {
        /// What the builder said.
        reason: String,
    },
}

/// The scrubbed text and what was removed from it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scrubbed<'a> {
    /// The text with every secret replaced by a marker (borrowed when nothing was found).
    pub text: Cow<'a, str>,
    /// What was removed.
    pub redactions: Redactions,
}

/// Removes secrets from text before it goes into a preamble. Cheap to clone (patterns are shared
/// statics); registered literals are per scrubber, since they belong to the accounts a node runs.
#[derive(Clone, Default)]
pub struct Scrubber {
    literals: Vec<String>,
    literal_automaton: Option<AhoCorasick>,
}

impl fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the registered secrets themselves.
        f.debug_struct("Scrubber")
            .field("registered", &self.literals.len())
            .finish()
    }
}

/// Two scrubbers are equal when they hold the same registered literals (the patterns are shared).
impl PartialEq for Scrubber {
    fn eq(&self, other: &Self) -> bool {
        self.literals == other.literals
    }
}

impl Eq for Scrubber {}

impl Scrubber {
    /// Shortest literal that can be registered, in characters.
    pub const REGISTERED_CHARS_MIN: usize = 6;
    /// Longest literal that can be registered, in bytes.
    pub const REGISTERED_BYTES_MAX: usize = 16 * 1024;
    /// Most literals one scrubber holds.
    pub const REGISTERED_COUNT_MAX: usize = 1024;

    /// A scrubber with the built-in patterns and no registered literal.
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a literal secret (an account's key): it is redacted wherever it appears, whatever its
    /// shape. Registering the same literal twice is a no-op.
    ///
    /// # Errors
    /// [`RegisterSecretError`] when the literal is too short, too long, or the registry is full.
    pub fn register_secret(&mut self, secret: &str) -> Result<(), RegisterSecretError> {
        let chars = secret.chars().count();
        if chars < Self::REGISTERED_CHARS_MIN {
            return Err(RegisterSecretError::TooShort {
                len: chars,
                min: Self::REGISTERED_CHARS_MIN,
            });
        }
        if secret.len() > Self::REGISTERED_BYTES_MAX {
            return Err(RegisterSecretError::TooLong {
                len: secret.len(),
                max: Self::REGISTERED_BYTES_MAX,
            });
        }
        if self.literals.iter().any(|s| s == secret) {
            return Ok(());
        }
        if self.literals.len() >= Self::REGISTERED_COUNT_MAX {
            return Err(RegisterSecretError::Full {
                max: Self::REGISTERED_COUNT_MAX,
            });
        }
        self.literals.push(secret.to_owned());
        // Leftmost-longest so that a secret that contains another registered one is removed whole.
        match AhoCorasickBuilder::new()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&self.literals)
        {
            Ok(automaton) => {
                self.literal_automaton = Some(automaton);
                Ok(())
            }
            Err(e) => {
                // Fail closed: keep the automaton that redacts every earlier literal, and say so.
                self.literals.pop();
                Err(RegisterSecretError::Automaton {
                    reason: e.to_string(),
                })
            }
        }
    }

    /// Whether the built-in patterns compiled. Hosts call it before they start (the `keel` binary
    /// for every command, `Runtime::start`): a build whose patterns do not compile must refuse to
    /// run. A scrubber without its patterns does not scrub less either: it removes every text whole
    /// ([`SecretKind::Unscanned`]).
    ///
    /// # Errors
    /// [`PatternError`] naming the pattern that did not compile.
    pub fn check_patterns() -> Result<(), PatternError> {
        Patterns::get().map(|_| ())
    }

    /// How many literals are registered.
    pub fn registered_count(&self) -> usize {
        self.literals.len()
    }

    /// The longest registered literal in bytes (0 when none): a caller that cuts a field before scrubbing
    /// keeps at least this much margin so a literal that straddles the cut is still found.
    pub fn longest_registered_bytes(&self) -> usize {
        self.literals.iter().map(String::len).max().unwrap_or(0)
    }

    /// Replaces every secret in `text` with a marker naming its kind.
    pub fn scrub<'a>(&self, text: &'a str) -> Scrubbed<'a> {
        self.scrub_with(Patterns::get(), text)
    }

    fn scrub_with<'a>(
        &self,
        patterns: Result<&Patterns, PatternError>,
        text: &'a str,
    ) -> Scrubbed<'a> {
        let Ok(patterns) = patterns else {
            return unscanned(text);
        };
        self.scrub_candidates(patterns, text, patterns.candidates(text))
    }

    /// Scrubs `text` running only the regexes of `candidates` (every one that could match it).
    fn scrub_candidates<'a>(
        &self,
        patterns: &Patterns,
        text: &'a str,
        candidates: Candidates,
    ) -> Scrubbed<'a> {
        let mut spans: Vec<Span> = Vec::new();
        if let Some(automaton) = &self.literal_automaton {
            for m in automaton.find_iter(text) {
                spans.push(Span {
                    start: m.start(),
                    end: m.end(),
                    kind: SecretKind::Registered,
                    rank: Rank::REGISTERED,
                });
            }
        }
        patterns.find_known(text, candidates, &mut spans);
        if candidates.has(Candidates::ASSIGNMENT) {
            patterns.find_assignments(text, &mut spans);
        }
        if spans.is_empty() {
            return Scrubbed {
                text: Cow::Borrowed(text),
                redactions: Redactions::default(),
            };
        }
        spans.sort_by_key(|s| (s.start, s.rank));
        let mut redactions = Redactions::default();
        let mut out = String::with_capacity(text.len());
        let mut cursor = 0usize;
        let mut i = 0usize;
        while i < spans.len() {
            let first = spans[i];
            let mut end = first.end;
            i += 1;
            // Union of overlapping spans: redact a superset rather than leave a piece of a secret.
            while i < spans.len() && spans[i].start < end {
                end = end.max(spans[i].end);
                i += 1;
            }
            out.push_str(&text[cursor..first.start]);
            out.push_str(REDACTION_MARKER_PREFIX);
            out.push_str(first.kind.label());
            out.push(']');
            redactions.add(first.kind);
            cursor = end;
        }
        out.push_str(&text[cursor..]);
        Scrubbed {
            text: Cow::Owned(out),
            redactions,
        }
    }
}

/// Without its patterns a scrubber cannot tell a secret from text: the whole text goes (fail closed).
fn unscanned(text: &str) -> Scrubbed<'_> {
    if text.is_empty() {
        return Scrubbed {
            text: Cow::Borrowed(text),
            redactions: Redactions::default(),
        };
    }
    let mut redactions = Redactions::default();
    redactions.add(SecretKind::Unscanned);
    Scrubbed {
        text: Cow::Owned(format!(
            "{REDACTION_MARKER_PREFIX}{}]",
            SecretKind::Unscanned.label()
        )),
        redactions,
    }
}

#[derive(Clone, Copy, Debug)]
struct Span {
    start: usize,
    end: usize,
    kind: SecretKind,
    /// Which label wins when two spans start at one position: a registered literal, then the known
    /// shapes in their order (most specific first), then an assignment.
    rank: Rank,
}

/// The order of the ways a secret is found, for the label of spans that start together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Rank(usize);

impl Rank {
    const REGISTERED: Rank = Rank(0);
    const ASSIGNMENT: Rank = Rank(usize::MAX);

    fn shape(index: usize) -> Rank {
        Rank(index.saturating_add(1))
    }
}

/// How a match of a known shape is checked before it is redacted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Check {
    /// The shape is specific enough.
    None,
    /// The match must contain a digit (OpenAI keys: `sk-` followed by words is a slug, not a key).
    HasDigit,
    /// The value must not be a placeholder (`$VAR`, `<token>`, `***`) nor code (`get_password()`).
    NotPlaceholder,
    /// The value must look like a token (not a placeholder; a digit, or 24 characters or more).
    TokenLike,
}

/// One known shape. `(?P<v>...)` marks the secret inside the match when the match has context around it
/// (a `Bearer ` prefix, a URL's user); otherwise the whole match is the secret.
struct Shape {
    kind: SecretKind,
    pattern: &'static str,
    check: Check,
    /// Literals one of which every match of `pattern` contains (ASCII case ignored): a text that
    /// holds none of them cannot match, so the pattern is not run over it. The tests' examples cover
    /// each alternative a literal stands for.
    literals: &'static [&'static str],
}

/// One known shape's regex, and where its secret is inside a match.
struct Known {
    regex: Regex,
    /// The group of the secret, when the match has context around it.
    value: Option<usize>,
}

struct Patterns {
    shapes: &'static [Shape],
    known: Vec<Known>,
    /// Every shape's literals and the secret-sounding name words in one automaton (ASCII case
    /// ignored, overlapping): one pass over a text says which regexes could match in it at all, so
    /// only those are run (most texts hold no literal of any). An exact pre-check: a regex is skipped
    /// only where a literal each of its matches contains is absent.
    literals: AhoCorasick,
    /// For each literal of `literals`, in order, the [`Candidates`] it stands for.
    literal_owners: Vec<Candidates>,
    /// The gate before `literals`: one three-byte window of each literal (see [`Trigrams`]).
    trigrams: Trigrams,
    /// A secret-sounding word, the rest of the name, the operator, the value: found by the regex,
    /// the value read by [`assignment_value`].
    assignment: Regex,
}

/// Which regexes could match a text: bit `i` for the known shape `i`, [`Candidates::ASSIGNMENT`] for
/// the assignment regex.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Candidates(u64);

impl Candidates {
    /// The assignment regex (one bit above every shape's).
    const ASSIGNMENT: Candidates = Candidates(1 << 63);
    /// Every regex: what a text is searched for when the pre-check cannot run.
    const ALL: Candidates = Candidates(u64::MAX);

    fn shape(index: usize) -> Candidates {
        Candidates(
            1u64.checked_shl(u32::try_from(index).unwrap_or(u32::MAX))
                .unwrap_or(0),
        )
    }

    fn has(self, other: Candidates) -> bool {
        self.0 & other.0 != 0
    }
}

/// The bits of [`Candidates`] hold one shape each below the assignment's.
const _: () = assert!(SHAPES.len() < 63);

/// A bitmap of three-byte windows, ASCII case folded: for each literal of the pre-check, one of its
/// windows, the one least likely in ordinary text (not in the text every brief ends with, then of
/// the rarest letters by English letter frequency; punctuation and digits count as rarest).
/// Wherever a literal occurs in a text, each of its windows occurs there, so a text whose windows
/// are all absent from the map holds no literal; the check costs about half the automaton's scan a
/// byte and most texts (prose, briefs, claims) end it without a hit. A hit proves nothing: the
/// automaton then says which literals are there.
struct Trigrams {
    bits: Box<[u64; Trigrams::WORDS]>,
}

impl Trigrams {
    /// 2^15 bits: three 5-bit folded bytes.
    const WORDS: usize = (1 << 15) / 64;

    /// A byte folded to 5 bits, the same for both cases of a letter (other bytes may share a
    /// value: a shared value only makes a hit more likely, never a miss).
    fn fold(b: u8) -> u32 {
        u32::from(b | 0x20) & 31
    }

    /// How common a byte is in text, for the choice of a literal's window (English letter
    /// frequency order; anything else is rare).
    fn commonness(b: u8) -> usize {
        const BY_FREQUENCY: &[u8] = b"zqxjkvbpygfwmucldrhsnioate";
        let lower = b.to_ascii_lowercase();
        BY_FREQUENCY
            .iter()
            .position(|c| *c == lower)
            .map_or(0, |rank| rank + 1)
    }

    /// The map of `literals`' windows least likely in text such as `ordinary`; the literal shorter
    /// than three bytes, if one is.
    fn of<'a>(literals: &[&'a str], ordinary: &str) -> Result<Trigrams, &'a str> {
        let mut seen = Trigrams {
            bits: Box::new([0u64; Trigrams::WORDS]),
        };
        seen.add_all(ordinary.as_bytes());
        let mut map = Trigrams {
            bits: Box::new([0u64; Trigrams::WORDS]),
        };
        for literal in literals {
            let window = literal
                .as_bytes()
                .windows(3)
                .min_by_key(|w| {
                    let letters: usize = w.iter().map(|b| Trigrams::commonness(*b)).sum();
                    usize::from(seen.has(Trigrams::key(w))) * 1000 + letters
                })
                .ok_or(*literal)?;
            map.add(Trigrams::key(window));
        }
        Ok(map)
    }

    /// The folded key of a window of three bytes.
    fn key(window: &[u8]) -> u32 {
        window
            .iter()
            .fold(0u32, |h, b| ((h << 5) | Trigrams::fold(*b)) & 0x7FFF)
    }

    fn add(&mut self, key: u32) {
        let (word, bit) = Trigrams::slot(key);
        self.bits[word] |= bit;
    }

    fn add_all(&mut self, text: &[u8]) {
        for window in text.windows(3) {
            self.add(Trigrams::key(window));
        }
    }

    fn has(&self, key: u32) -> bool {
        let (word, bit) = Trigrams::slot(key);
        self.bits[word] & bit != 0
    }

    fn slot(key: u32) -> (usize, u64) {
        let word = usize::try_from(key >> 6).unwrap_or(0) % Trigrams::WORDS;
        (word, 1u64 << (key & 63))
    }

    /// Whether a window of `text` is in the map.
    fn may_hold_one(&self, text: &str) -> bool {
        let mut key = 0u32;
        for &b in text.as_bytes() {
            key = ((key << 5) | Trigrams::fold(b)) & 0x7FFF;
            let (word, bit) = Trigrams::slot(key);
            if self.bits[word] & bit != 0 {
                return true;
            }
        }
        false
    }
}

static PATTERNS: LazyLock<Result<Patterns, PatternError>> =
    LazyLock::new(|| Patterns::compile(SHAPES, &SECRET_NAME_WORDS, ASSIGNMENT_TAIL));

impl Patterns {
    fn get() -> Result<&'static Patterns, PatternError> {
        PATTERNS.as_ref().map_err(Clone::clone)
    }

    /// Compiles the regexes once per process. The patterns are constants, so a failure is a defect
    /// of the build: it is a typed error that hosts check before they start
    /// ([`Scrubber::check_patterns`]), in debug and release builds alike, and a scrubber without its
    /// patterns removes whole texts rather than scrub less.
    fn compile(
        shapes: &'static [Shape],
        name_words: &[&str],
        assignment_tail: &str,
    ) -> Result<Patterns, PatternError> {
        let mut known = Vec::with_capacity(shapes.len());
        for shape in shapes {
            let regex = compile_ascii(shape.pattern).map_err(|e| PatternError {
                pattern: shape.kind.label(),
                reason: e.to_string(),
            })?;
            let value = group_index(&regex, "v");
            known.push(Known { regex, value });
        }
        let words = name_words
            .iter()
            .map(|w| regex::escape(w))
            .collect::<Vec<_>>()
            .join("|");
        let regex =
            compile_ascii(&format!("(?i:{words}){assignment_tail}")).map_err(|e| PatternError {
                pattern: "secret-assignment",
                reason: e.to_string(),
            })?;
        if group_index(&regex, "v").is_none() {
            return Err(PatternError {
                pattern: "secret-assignment",
                reason: "it has no value group (?P<v>...)".into(),
            });
        }
        let mut literals = Vec::new();
        let mut literal_owners = Vec::new();
        for (index, shape) in shapes.iter().enumerate() {
            if shape.literals.is_empty() || index >= 63 {
                return Err(PatternError {
                    pattern: shape.kind.label(),
                    reason: "it has no literal for the pre-check (or too many shapes)".into(),
                });
            }
            for literal in shape.literals {
                literals.push(*literal);
                literal_owners.push(Candidates::shape(index));
            }
        }
        for word in name_words {
            literals.push(*word);
            literal_owners.push(Candidates::ASSIGNMENT);
        }
        let trigrams =
            Trigrams::of(&literals, crate::report::REPORT_INSTRUCTION).map_err(|literal| {
                PatternError {
                    pattern: "pre-check literals",
                    reason: format!("{literal:?} is shorter than three bytes"),
                }
            })?;
        // Standard semantics, searched overlapping: every occurrence of every literal is seen.
        let literals = AhoCorasickBuilder::new()
            .match_kind(MatchKind::Standard)
            .ascii_case_insensitive(true)
            .build(&literals)
            .map_err(|e| PatternError {
                pattern: "pre-check literals",
                reason: e.to_string(),
            })?;
        Ok(Patterns {
            shapes,
            known,
            literals,
            literal_owners,
            trigrams,
            assignment: regex,
        })
    }

    /// The regexes that could match `text`: those whose literal occurs in it.
    fn candidates(&self, text: &str) -> Candidates {
        if !self.trigrams.may_hold_one(text) {
            return Candidates::default();
        }
        let Ok(found) = self.literals.try_find_overlapping_iter(text) else {
            // Not built for overlapping search (a defect): search for everything.
            return Candidates::ALL;
        };
        let mut candidates = Candidates::default();
        for m in found {
            let owner = self
                .literal_owners
                .get(m.pattern().as_usize())
                .copied()
                .unwrap_or(Candidates::ALL);
            candidates.0 |= owner.0;
        }
        candidates
    }

    fn find_known(&self, text: &str, candidates: Candidates, spans: &mut Vec<Span>) {
        for (index, (shape, known)) in self.shapes.iter().zip(&self.known).enumerate() {
            if candidates.has(Candidates::shape(index)) {
                find_shape(index, shape, known, text, spans);
            }
        }
    }

    fn find_assignments(&self, text: &str, spans: &mut Vec<Span>) {
        let bytes = text.as_bytes();
        let regex = &self.assignment;
        let mut at = 0usize;
        while at <= text.len() {
            // The match alone (a lazy DFA scan); the value inside it is read by `assignment_value`,
            // which gives the regex's own group (a property test holds them equal) at a fraction of a
            // capture engine's cost, paid here for every secret-sounding name with an operator.
            let Some(m) = regex.find_at(bytes, at) else {
                break;
            };
            let Some((start, end)) = assignment_value(&bytes[m.start()..m.end()]) else {
                at = next_char(text, m.start());
                continue;
            };
            let (start, end) = char_bounds(text, m.start() + start, m.start() + end);
            let value = &text[start..end];
            // A value that a known shape already covers keeps that shape's more precise label.
            let covered = spans.iter().any(|s| s.start < end && start < s.end);
            if !covered && looks_like_secret(value) {
                spans.push(Span {
                    start,
                    end,
                    kind: SecretKind::SecretAssignment,
                    rank: Rank::ASSIGNMENT,
                });
                at = end.max(next_char(text, m.start()));
            } else {
                // A later word inside this match may start an assignment of its own.
                at = next_char(text, m.start());
            }
        }
    }
}

/// The value group of a match of the assignment regex (`match_bytes` is the whole match), read the way
/// the regex reads it: the name runs on over name bytes, an optional quote, spaces, then the first of
/// the operators `:=`, `=>`, `=`, `:` after which spaces, an optional quote and at least
/// [`ASSIGNMENT_VALUE_BYTES_MIN`] value bytes follow. Only the operator is a real choice (every other
/// step is forced, because what follows a step is never a byte that the step takes).
fn assignment_value(match_bytes: &[u8]) -> Option<(usize, usize)> {
    let m = match_bytes;
    let skip = |mut i: usize, take: fn(u8) -> bool| {
        while i < m.len() && take(m[i]) {
            i += 1;
        }
        i
    };
    let quote = |i: usize| usize::from(i < m.len() && matches!(m[i], b'"' | b'\''));
    let mut i = skip(0, is_name_byte);
    i += quote(i);
    i = skip(i, is_space_byte);
    for operator in [&b":="[..], b"=>", b"=", b":"] {
        if !m[i..].starts_with(operator) {
            continue;
        }
        let mut start = skip(i + operator.len(), is_space_byte);
        start += quote(start);
        let end = skip(start, is_value_byte);
        if end - start >= ASSIGNMENT_VALUE_BYTES_MIN {
            return Some((start, end));
        }
    }
    None
}

/// The shortest value the assignment regex takes (its `{16,}`).
const ASSIGNMENT_VALUE_BYTES_MIN: usize = 16;

/// `[A-Za-z0-9_.\-]`, the rest of a name in [`ASSIGNMENT_TAIL`].
fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-')
}

/// `\s` with Unicode off.
fn is_space_byte(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r')
}

/// `[^\s"'`,;:(){}\[\]<>]`, a value byte in [`ASSIGNMENT_TAIL`].
fn is_value_byte(b: u8) -> bool {
    !is_space_byte(b)
        && !matches!(
            b,
            b'"' | b'\''
                | b'`'
                | b','
                | b';'
                | b':'
                | b'('
                | b')'
                | b'{'
                | b'}'
                | b'['
                | b']'
                | b'<'
                | b'>'
        )
}

/// Every match of one known shape that passes the shape's check.
fn find_shape(index: usize, shape: &Shape, known: &Known, text: &str, spans: &mut Vec<Span>) {
    let bytes = text.as_bytes();
    // Capture slots only once a match needs its group: most texts match no shape at all.
    let mut locs = None;
    let mut at = 0usize;
    while at <= text.len() {
        // The match alone first (the prefilter and a lazy DFA); the groups are read inside it.
        let Some(m) = known.regex.find_at(bytes, at) else {
            break;
        };
        let (m_start, m_end) = (m.start(), m.end());
        let value = match known.value {
            Some(group) => {
                let locs = locs.get_or_insert_with(|| known.regex.capture_locations());
                known
                    .regex
                    .captures_read_at(locs, bytes, m_start)
                    .and_then(|_| locs.get(group))
            }
            None => None,
        };
        let (start, end) = value.unwrap_or((m_start, m_end));
        let (start, end) = char_bounds(text, start, end);
        let value = &text[start..end];
        let accepted = match shape.check {
            Check::None => true,
            Check::HasDigit => value.bytes().any(|b| b.is_ascii_digit()),
            Check::NotPlaceholder => !is_placeholder(value),
            Check::TokenLike => {
                !is_placeholder(value)
                    && (value.bytes().any(|b| b.is_ascii_digit()) || value.len() >= 24)
            }
        };
        if accepted {
            spans.push(Span {
                start,
                end,
                kind: shape.kind,
                rank: Rank::shape(index),
            });
            at = if m_end > m_start {
                m_end
            } else {
                next_char(text, m_end)
            };
        } else {
            // A rejected candidate may hide a real secret that starts inside it: look again one
            // character further rather than after the whole match.
            at = next_char(text, m_start);
        }
    }
}

/// Compiles a pattern over bytes with Unicode off: ASCII classes and ASCII case folding make a DFA
/// several times smaller and faster than the Unicode one, and every secret shape is ASCII. Every pattern
/// starts and ends on an ASCII byte or the end of the text, so a match never splits a character
/// ([`char_bounds`] widens one that would, all the same).
fn compile_ascii(pattern: &str) -> Result<Regex, regex::Error> {
    RegexBuilder::new(pattern).unicode(false).build()
}

/// Widens a byte span to character boundaries (a wider redaction is always safe).
fn char_bounds(text: &str, mut start: usize, mut end: usize) -> (usize, usize) {
    while start > 0 && !text.is_char_boundary(start) {
        start -= 1;
    }
    while end < text.len() && !text.is_char_boundary(end) {
        end += 1;
    }
    (start, end)
}

fn group_index(re: &Regex, name: &str) -> Option<usize> {
    re.capture_names().position(|n| n == Some(name))
}

fn next_char(text: &str, at: usize) -> usize {
    let mut next = at + 1;
    while next < text.len() && !text.is_char_boundary(next) {
        next += 1;
    }
    next
}

/// A value that stands for a secret rather than being one: a variable reference, a template, a mask, code.
fn is_placeholder(value: &str) -> bool {
    let first = value.chars().next().unwrap_or('$');
    if matches!(first, '$' | '%' | '<' | '{' | '*' | '#') {
        return true;
    }
    if value.contains('(') || value.contains("${") || value.contains("{{") {
        return true;
    }
    let lower = value.to_ascii_lowercase();
    lower.chars().all(|c| c == 'x' || c == '*' || c == '.')
        || lower.starts_with("your")
        || lower.contains("xxxx")
        || lower.contains("redacted")
        || lower == "password"
        || lower == "changeme"
}

/// Whether an assignment's value looks like a secret by its shape alone: long enough, mixed, random
/// enough, and not one of the common shapes of ordinary values (paths, URLs, dotted code, UUIDs,
/// shas, the keys keel makes of its own ids).
pub(crate) fn looks_like_secret(value: &str) -> bool {
    let len = value.chars().count();
    if len < 16 || is_placeholder(value) {
        return false;
    }
    if value.starts_with('/')
        || value.starts_with("./")
        || value.starts_with("../")
        || value.starts_with("~/")
        || value.contains("://")
    {
        return false;
    }
    if is_uuid(value)
        || is_sha(value)
        || is_dotted_identifier(value)
        || is_wordy(value)
        || is_id_path(value)
    {
        return false;
    }
    let digits = value.bytes().filter(u8::is_ascii_digit).count();
    let letters = value.bytes().filter(u8::is_ascii_alphabetic).count();
    let upper = value.bytes().any(|b| b.is_ascii_uppercase());
    let lower = value.bytes().any(|b| b.is_ascii_lowercase());
    let word_separators = value.bytes().any(|b| matches!(b, b'_' | b'.' | b'-'));
    let mixed = (digits > 0 && letters > 0) || (len >= 32 && upper && lower && !word_separators);
    mixed && shannon_bits_per_char(value) >= 3.0
}

fn is_uuid(value: &str) -> bool {
    let parts: Vec<&str> = value.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8usize, 4, 4, 4, 12])
            .all(|(p, n)| p.len() == n && p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// A key keel makes of its own ids, as an attempt's idempotency key (`start/RUN/TASK/1`): a
/// lowercase word, then ULIDs minted by keel and numbers, at least one ULID. An identifier, not a
/// credential, as a UUID is: without this `"idempotency_key": "start/..."` in a task's JSON reads
/// as a secret assigned to a key. A bare ULID is not exempt: a random 128-bit token written in
/// Crockford's base32 has exactly its shape, so only the keyed path, with a ULID whose time is a
/// plausible one, passes.
fn is_id_path(value: &str) -> bool {
    let mut parts = value.split('/');
    let Some(word) = parts.next() else {
        return false;
    };
    if word.is_empty() || !word.bytes().all(|b| b.is_ascii_lowercase() || b == b'_') {
        return false;
    }
    let mut ulids = 0usize;
    let rest_plain = parts.all(|part| {
        if is_minted_ulid(part) {
            ulids += 1;
            true
        } else {
            !part.is_empty() && part.len() <= 10 && part.bytes().all(|b| b.is_ascii_digit())
        }
    });
    rest_plain && ulids > 0
}

/// A ULID as keel mints and prints its ids: 26 characters of Crockford's base32 in upper case
/// whose first 48 bits, the time in milliseconds, fall between 2020 and 2100 (a random 26-character
/// token of the same alphabet does so about twice in a thousand).
fn is_minted_ulid(value: &str) -> bool {
    const FROM_MS: u64 = 1_577_836_800_000; // 2020-01-01
    const UNTIL_MS: u64 = 4_102_444_800_000; // 2100-01-01
    let bytes = value.as_bytes();
    if bytes.len() != 26 {
        return false;
    }
    let mut millis = 0u64;
    for (i, b) in bytes.iter().enumerate() {
        let Some(digit) = crockford_digit(*b) else {
            return false;
        };
        if i < 10 {
            // The first ten characters carry the time (50 bits; a first character above 7, which
            // no 128-bit value has, puts it far past the range below).
            millis = (millis << 5) | u64::from(digit);
        }
    }
    (FROM_MS..UNTIL_MS).contains(&millis)
}

/// The value of one upper-case character of Crockford's base32 (no I, L, O or U).
fn crockford_digit(b: u8) -> Option<u8> {
    const ALPHABET: &[u8; 32] = b"0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    ALPHABET
        .iter()
        .position(|&c| c == b)
        .and_then(|i| u8::try_from(i).ok())
}

/// A git or content sha: 40 or 64 hex digits (an identifier, not a credential, in ordinary text).
fn is_sha(value: &str) -> bool {
    (value.len() == 40 || value.len() == 64) && value.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `os.environ`, `self.config.api_token`, `settings.SECRET_KEY`: code that names a value, not a value.
fn is_dotted_identifier(value: &str) -> bool {
    value.contains('.')
        && value.split('.').all(|part| {
            let mut bytes = part.bytes();
            matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
                && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        })
}

/// `created_at_2024_01_01`, `PROD-DB-PASSWORD`, `v2.3.1-rc1`: separated parts that are each a plain
/// word or number. Random tokens mix cases and digits inside their parts.
fn is_wordy(value: &str) -> bool {
    let parts: Vec<&str> = value
        .split(['_', '-', '.'])
        .filter(|p| !p.is_empty())
        .collect();
    parts.len() >= 2
        && parts.iter().all(|p| {
            let b = p.as_bytes();
            b.iter().all(u8::is_ascii_lowercase)
                || b.iter().all(u8::is_ascii_uppercase)
                || b.iter().all(u8::is_ascii_digit)
                || (b[0].is_ascii_uppercase() && b[1..].iter().all(u8::is_ascii_lowercase))
                || (b[0] == b'v' && b[1..].iter().all(u8::is_ascii_digit))
                || (b.len() <= 3
                    && b.iter()
                        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()))
        })
}

fn shannon_bits_per_char(value: &str) -> f64 {
    let mut counts = [0u32; 256];
    let mut n = 0u32;
    for b in value.bytes() {
        counts[usize::from(b)] += 1;
        n += 1;
    }
    if n == 0 {
        return 0.0;
    }
    let n = f64::from(n);
    counts
        .iter()
        .filter(|c| **c > 0)
        .map(|c| {
            let p = f64::from(*c) / n;
            -p * p.log2()
        })
        .sum()
}

#[cfg(test)]
mod tests;
