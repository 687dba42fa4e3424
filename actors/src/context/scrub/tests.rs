//! The scrubber's private parts under test: its patterns, the pre-check, the value read by hand.

use super::*;

#[test]
fn patterns_compile() {
    assert_eq!(Scrubber::check_patterns(), Ok(()));
}

static BROKEN: [Shape; 2] = [
    Shape {
        kind: SecretKind::AnthropicKey,
        pattern: r"sk-ant-[A-Za-z0-9]{20,}",
        check: Check::None,
        literals: &["sk-ant-"],
    },
    Shape {
        kind: SecretKind::GithubToken,
        pattern: r"ghp_[A-Za-z0-9]{36,",
        check: Check::None,
        literals: &["ghp_"],
    },
];

#[test]
fn a_pattern_that_does_not_compile_is_a_typed_error_naming_it() {
    let Err(e) = Patterns::compile(&BROKEN, &SECRET_NAME_WORDS, ASSIGNMENT_TAIL) else {
        panic!("a broken pattern compiled");
    };
    assert_eq!(e.pattern, "github-token");
    assert!(e.to_string().contains("will not run"), "{e}");
    let Err(e) = Patterns::compile(&SHAPES[..1], &SECRET_NAME_WORDS, r"(?P<v>[a-z]") else {
        panic!("a broken assignment pattern compiled");
    };
    assert_eq!(e.pattern, "secret-assignment");
}

#[test]
fn without_its_patterns_a_scrubber_removes_the_whole_text() {
    let broken = Patterns::compile(&BROKEN, &SECRET_NAME_WORDS, ASSIGNMENT_TAIL);
    let e = broken.err().unwrap_or_else(|| panic!("compiled"));
    let out = Scrubber::new().scrub_with(Err(e), "harmless text with ghp_ maybe");
    assert_eq!(out.text, "[REDACTED:unscanned-text]");
    assert_eq!(out.redactions.count(SecretKind::Unscanned), 1);
    let empty = Scrubber::new().scrub_with(
        Err(PatternError {
            pattern: "x",
            reason: String::new(),
        }),
        "",
    );
    assert_eq!(empty.text, "");
}

/// Pieces of assignments and a few other bytes, so that random texts hit every branch.
const ASSIGNMENT_PIECES: &[&str] = &[
    "token", "KEY", "pass", "_", ".", "-", "=", ":", ">", "\"", "'", " ", "\t", "\n", "aZ09",
    "abcdefgh", "Zq3xT9vL", ";", ",", "(", "`", "x",
];

proptest::proptest! {
    /// `assignment_value` reads the value exactly where the regex's own group is, for every match
    /// in random texts made of the pieces that matter.
    #[test]
    fn the_value_read_by_hand_is_the_regexs_group(
        picks in proptest::collection::vec(0..ASSIGNMENT_PIECES.len(), 0..40)
    ) {
        let text: Vec<u8> = picks.iter().flat_map(|i| ASSIGNMENT_PIECES[*i].bytes()).collect();
        let Ok(patterns) = Patterns::get() else {
            panic!("the patterns do not compile");
        };
        let regex = &patterns.assignment;
        let group = group_index(regex, "v").unwrap_or_else(|| panic!("no value group"));
        let mut locs = regex.capture_locations();
        for m in regex.find_iter(&text) {
            let whole = &text[m.start()..m.end()];
            let by_regex = regex.captures_read(&mut locs, whole).and_then(|_| locs.get(group));
            proptest::prop_assert_eq!(assignment_value(whole), by_regex);
        }
    }
}

#[test]
fn the_value_read_by_hand_takes_the_second_operator_when_the_first_leaves_too_little() {
    // `:=` leaves a value of 5 bytes; the regex then reads `:` and a value that starts with `=`.
    assert_eq!(
        assignment_value(b"token:=abcde"),
        None,
        "neither reading has 16 value bytes"
    );
    assert_eq!(assignment_value(b"token:=abcdefghijklmnop"), Some((7, 23)));
    assert_eq!(
        assignment_value(b"api_key = \"Zq3xT9vLm2Kp8RwYc4Nf\""),
        Some((11, 31))
    );
}

/// Secrets of every shape as they stand in text, and near misses.
const SECRET_TEXTS: &[&str] = &[
    "-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----",
    "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA",
    "ANTHROPIC_API_KEY=sk-ant-api03-Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0LzXcVbNm-AbCdEfAA",
    "use sk-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAb3dEf6hIj9kLm2n for the call",
    r#"{"key": "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z"}"#,
    "aws_access_key_id = AKIAIOSFODNN7EXAMPLE",
    "ASIAIOSFODNN7EXAMPLE APKAIOSFODNN7EXAMPLE",
    "aws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "AWS_SK: \"wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\"",
    "git clone https://ghp_aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0dF3gH6@example.com/r.git",
    "GH=github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCD",
    "token glpat-AbCdEf1234567890xYz_ ok glagent-AbCdEf1234567890xYz_",
    "SLACK=xoxb-1234567890-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx xapp-1-A0123456789",
    "post to https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX now",
    "stripe.api_key = 'sk_live_51H8abcdEFGH1234ijklMNOP' whsec_abcdefghij0123456789AB",
    "key=AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",
    "GOCSPX-AbCdEf1234567890xYz_AB ya29.a0AfH6SMBx1234567890abcdefgh",
    "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
    "Authorization: Basic dXNlcjpwYXNzd29yZDEyMw==",
    "authorization=\"Token abcdef0123456789\"",
    "curl -H 'Authorization: Bearer abcdefghijklmnop1234567890'",
    "postgres://admin:s3cr3tP4ss@db.example.com:5432/app",
    "Server=db;Database=app;User Id=sa;Password=Str0ngPassw0rd!;",
    "PWD=Str0ngPassw0rd!; host=x",
    "export DB_PASSWORD=Zq3xT9vLm2Kp8RwYc4Nf",
    "client_secret: \"Zq3xT9vLm2Kp8RwYc4Nf6Hd1\"",
    "let token_ttl = config.session.token_ttl_seconds; // password reset in 3600 s",
    // One example of each alternative a shape's literal stands for, each alone in its text, so a
    // literal missing from a shape's list skips a regex that matches and fails the pre-check test.
    "x gho_aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0dF3gH6 x",
    "x ghu_aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0dF3gH6 x",
    "x ghs_aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0dF3gH6 x",
    "x ghr_aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0dF3gH6 x",
    "x gldt-AbCdEf1234567890xYz_ x",
    "x glrt-AbCdEf1234567890xYz_ x",
    "x glptt-AbCdEf1234567890xYz_ x",
    "x glft-AbCdEf1234567890xYz_ x",
    "x glcbt-AbCdEf1234567890xYz_ x",
    "x gloas-AbCdEf1234567890xYz_ x",
    "x glimt-AbCdEf1234567890xYz_ x",
    "x glsoat-AbCdEf1234567890xYz_ x",
    "x ABIAIOSFODNN7EXAMPLE x",
    "x AIDAIOSFODNN7EXAMPLE x",
    "x ACCAIOSFODNN7EXAMPLE x",
    "x AGPAIOSFODNN7EXAMPLE x",
    "x AROAIOSFODNN7EXAMPLE x",
    "x AIPAIOSFODNN7EXAMPLE x",
    "x ANPAIOSFODNN7EXAMPLE x",
    "x ANVAIOSFODNN7EXAMPLE x",
    "x sk_test_51H8abcdEFGH1234ijkl x",
    "x rk_live_51H8abcdEFGH1234ijkl x",
    "x rk_test_51H8abcdEFGH1234ijkl x",
    "commit 3f2a9c4e5b6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f Author: dev <dev@example.com>",
    "the instant harness answered this part at once with a fixed finding",
];

/// Pieces of every shape (prefixes, separators, bodies, case variants), so that random texts
/// made of them match shapes in ways no example spells out.
const SHAPE_PIECES: &[&str] = &[
    "-----BEGIN",
    " RSA",
    " PRIVATE KEY-----",
    "-----END",
    "sk",
    "SK",
    "-",
    "_",
    "ant",
    "proj",
    "AKIA",
    "ASIA",
    "AIDA",
    "aws",
    "AWS",
    "Aws",
    "secret",
    "Secret",
    "gh",
    "p",
    "github_pat_",
    "gl",
    "pat",
    "agent",
    "https",
    "://",
    "hooks.slack.com/",
    "services/",
    "xox",
    "b",
    "xapp",
    "1",
    "live",
    "test",
    "rk",
    "whsec",
    "AIza",
    "GOCSPX",
    "ya29",
    ".",
    "eyJ",
    "Authorization",
    "AUTHORIZATION",
    "Basic",
    "Token",
    "Bearer",
    "BEARER",
    "Password",
    "PASSWORD",
    "pwd",
    "PWD",
    "token",
    "KEY",
    "cred",
    "auth",
    "=",
    ":",
    "=>",
    ";",
    "@",
    "/",
    "'",
    "\"",
    " ",
    "\n",
    "Zq3xT9vLm2Kp8RwYc4Nf6Hd1Gs5Bj7Ue0AoXyWv",
    "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "0123456789ABCDEF",
    "abcdefghij",
    "Ab3dEf6hIj",
    "\u{e9}",
];

/// The pre-check's promise for one text: every regex that matches it is a candidate, and the
/// scrub with the pre-check is the scrub with every regex run.
fn check_pre_check(patterns: &Patterns, text: &str) -> Result<(), String> {
    let candidates = patterns.candidates(text);
    for (index, known) in patterns.known.iter().enumerate() {
        if known.regex.is_match(text.as_bytes()) && !candidates.has(Candidates::shape(index)) {
            return Err(format!(
                "shape {} matches {text:?} but is not a candidate",
                patterns.shapes[index].kind.label()
            ));
        }
    }
    if patterns.assignment.is_match(text.as_bytes()) && !candidates.has(Candidates::ASSIGNMENT) {
        return Err(format!("the assignment regex matches {text:?} unsearched"));
    }
    let scrubber = Scrubber::new();
    let checked = scrubber.scrub_candidates(patterns, text, candidates);
    let everything = scrubber.scrub_candidates(patterns, text, Candidates::ALL);
    if checked != everything {
        return Err(format!(
            "{text:?}: {checked:?} with the pre-check, {everything:?} without"
        ));
    }
    Ok(())
}

#[test]
fn the_pre_check_never_skips_a_secret_of_the_examples() {
    let Ok(patterns) = Patterns::get() else {
        panic!("the patterns do not compile");
    };
    for text in SECRET_TEXTS {
        let upper = text.to_ascii_uppercase();
        let lower = text.to_ascii_lowercase();
        for t in [*text, upper.as_str(), lower.as_str()] {
            if let Err(e) = check_pre_check(patterns, t) {
                panic!("{e}");
            }
        }
        // Every example but the last three holds a secret the scrub removes.
        assert!(
            Scrubber::new().scrub(text).redactions.total() > 0
                || text.contains("token_ttl")
                || text.contains("Author:")
                || text.contains("instant harness"),
            "nothing removed from {text:?}"
        );
    }
    // A text without any literal skips every regex.
    let plain = "the instant harness answered this part at once";
    assert_eq!(patterns.candidates(plain), Candidates::default());
}

#[test]
fn the_window_gate_passes_every_literal_and_stops_plain_prose() {
    let Ok(patterns) = Patterns::get() else {
        panic!("the patterns do not compile");
    };
    let literals = SHAPES
        .iter()
        .flat_map(|s| s.literals.iter())
        .chain(SECRET_NAME_WORDS.iter());
    for literal in literals {
        for text in [
            literal.to_string(),
            literal.to_ascii_uppercase(),
            format!("a {} b", literal.to_ascii_lowercase()),
        ] {
            assert!(
                patterns.trigrams.may_hold_one(&text),
                "{text:?} not let through"
            );
        }
    }
    // What every session's brief ends with, and prose, hold no literal: nothing else runs.
    for prose in [
        crate::report::REPORT_INSTRUCTION,
        "the instant harness answered this part at once with a fixed finding",
    ] {
        assert!(!patterns.trigrams.may_hold_one(prose), "{prose:?}");
        assert_eq!(patterns.candidates(prose), Candidates::default());
    }
    assert!(
        Trigrams::of(&["ab"], "").is_err(),
        "a literal of two bytes has no window"
    );
}

proptest::proptest! {
    /// Random texts of shape pieces and whole examples: the pre-check never skips a regex that
    /// matches, and scrubbing with it removes exactly what scrubbing without it removes.
    #[test]
    fn the_pre_check_never_skips_a_regex_that_matches(
        picks in proptest::collection::vec(0..SHAPE_PIECES.len() + SECRET_TEXTS.len(), 0..32)
    ) {
        let Ok(patterns) = Patterns::get() else {
            panic!("the patterns do not compile");
        };
        let text: String = picks
            .iter()
            .map(|i| SHAPE_PIECES.get(*i).copied().unwrap_or_else(|| SECRET_TEXTS[*i - SHAPE_PIECES.len()]))
            .collect();
        if let Err(e) = check_pre_check(patterns, &text) {
            proptest::prop_assert!(false, "{}", e);
        }
    }
}

#[test]
fn entropy_of_repeated_char_is_zero() {
    assert_eq!(shannon_bits_per_char("aaaa"), 0.0);
    assert!((shannon_bits_per_char("abcd") - 2.0).abs() < 1e-9);
}
