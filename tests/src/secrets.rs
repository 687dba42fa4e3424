//! A corpus of made-up credentials in the shapes real ones have, and of benign look-alikes that must
//! survive scrubbing (issue 16). None of these is a real credential: each is assembled from pieces
//! at run time (so no file of the repository holds a whole secret-shaped string a scanner could
//! flag), from a fixed alphabet walk that no provider issued.
//!
//! Shared by the scrubber's unit-level test (`actors/tests/ingest_scrub.rs`, which includes this
//! file by path) and the real-process tests of keel-tests.

/// One made-up secret: a name for failure messages, the text a tool prints, and the part of it that
/// must never be seen again (the whole line, or the value after a `Bearer`, a URL's password...).
#[derive(Debug, Clone)]
pub struct Secret {
    /// What it stands for.
    pub name: &'static str,
    /// The line a tool prints.
    pub line: String,
    /// The secret part of the line.
    pub value: String,
}

/// `n` characters from a fixed, random-looking alphabet walk starting at `seed` (letters and digits,
/// mixed case): deterministic, high entropy, never a real key.
pub fn noise(seed: usize, n: usize) -> String {
    const ALPHABET: &[u8] = b"q7Zt4pW9xL2mKc8RvN3bH6yF1sJ5dG0aTeUoPiYrEwQuLkMnBvCxZ";
    (0..n)
        .map(|i| ALPHABET[(seed * 31 + i * 17 + i * i * 7) % ALPHABET.len()] as char)
        .collect()
}

fn upper_digits(seed: usize, n: usize) -> String {
    const ALPHABET: &[u8] = b"Q7ZT4PW9XL2MKC8RVN3BH6YF5DG";
    (0..n)
        .map(|i| ALPHABET[(seed * 13 + i * 11 + i * i * 5) % ALPHABET.len()] as char)
        .collect()
}

fn whole(name: &'static str, line: String) -> Secret {
    Secret {
        name,
        value: line.clone(),
        line,
    }
}

fn inside(name: &'static str, line: String, value: String) -> Secret {
    Secret { name, line, value }
}

/// The value registered with the scrubber as the account's key in the real-process tests (set as
/// `ANTHROPIC_API_KEY` / `OPENAI_API_KEY`): no known shape, so only the literal registration can
/// find it.
pub fn registered_key() -> String {
    format!("kq{}-{}-{}", noise(40, 5), noise(41, 6), noise(42, 7))
}

/// The secrets, at least fifteen kinds, one per line.
pub fn corpus() -> Vec<Secret> {
    let sk = "sk";
    let pem_label = ["RSA", "PRIVATE", "KEY"].join(" ");
    let pem_body: Vec<String> = (0..4).map(|i| noise(60 + i, 64)).collect();
    let aws_secret = format!("{}/{}+{}", noise(5, 18), noise(6, 10), noise(7, 10));
    let db_password = format!("Pw{}", noise(11, 14));
    let conn_password = format!("Cn{}", noise(12, 12));
    let bearer = noise(13, 40);
    let basic = format!("{}==", noise(14, 22));
    let assigned = noise(15, 40);
    vec![
        whole(
            "anthropic key",
            format!("{sk}-ant-api03-{}-{}", noise(1, 40), noise(2, 20)),
        ),
        whole("openai key", format!("{sk}-proj-{}", noise(3, 48))),
        whole("aws access key id", format!("AKIA{}", upper_digits(4, 16))),
        inside(
            "aws secret access key",
            format!("aws_secret_access_key = {aws_secret}"),
            aws_secret,
        ),
        whole("github token", format!("ghp_{}", noise(8, 36))),
        whole(
            "github fine-grained token",
            format!("github_pat_{}_{}", noise(9, 22), noise(10, 59)),
        ),
        whole("gitlab token", format!("glpat-{}", noise(16, 20))),
        whole(
            "slack bot token",
            format!("xoxb-{}-{}-{}", "2048", "4096", noise(17, 24)),
        ),
        whole(
            "slack webhook",
            format!(
                "https://hooks.slack.com/services/T{}/B{}/{}",
                upper_digits(18, 8),
                upper_digits(19, 10),
                noise(20, 24)
            ),
        ),
        whole("stripe key", format!("{sk}_live_{}", noise(21, 32))),
        whole("google api key", format!("AIza{}", noise(22, 35))),
        whole("google oauth secret", format!("GOCSPX-{}", noise(23, 28))),
        whole(
            "jwt",
            format!(
                "eyJ{}.eyJ{}.{}",
                noise(24, 30),
                noise(25, 40),
                noise(26, 43)
            ),
        ),
        inside(
            "bearer token",
            format!("Authorization: Bearer {bearer}"),
            bearer,
        ),
        inside("basic auth", format!("Authorization: Basic {basic}"), basic),
        inside(
            "database url with a password",
            format!("postgres://app_user:{db_password}@db.internal.example:5432/orders"),
            db_password,
        ),
        inside(
            "connection string password",
            format!("Server=db.example;Database=orders;User Id=app;Password={conn_password};"),
            conn_password,
        ),
        inside(
            "secret assignment",
            format!("DJANGO_SECRET_KEY={assigned}"),
            assigned,
        ),
        inside(
            "private key",
            format!(
                "-----BEGIN {pem_label}-----\n{}\n-----END {pem_label}-----",
                pem_body.join("\n")
            ),
            pem_body[1].clone(),
        ),
        whole("registered key of no known shape", registered_key()),
    ]
}

/// Benign text that looks a little like a secret and must come through scrubbing untouched.
pub fn look_alikes() -> Vec<&'static str> {
    vec![
        "commit 3f2a9c4e5b6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f",
        "request 8c4f2b1e-9a7d-4e3c-b2a1-0f9e8d7c6b5a",
        "api_key = settings.API_KEY_NAME",
        "SECRET_KEY_SETTING_NAME",
        "/home/dev/.ssh/id_ed25519.pub",
        "password_reset_token_ttl = 3600",
        "https://example.com/docs/tokens",
        "created_at_2024_01_01",
    ]
}

/// The text a tool prints: every secret, then every look-alike, one per line.
pub fn printed() -> String {
    let mut text = String::new();
    for s in corpus() {
        text.push_str(&s.line);
        text.push('\n');
    }
    for l in look_alikes() {
        text.push_str(l);
        text.push('\n');
    }
    text
}

/// The secrets found in `haystack`, by name (empty: none leaked).
pub fn leaked(haystack: &[u8]) -> Vec<&'static str> {
    corpus()
        .into_iter()
        .filter(|s| contains(haystack, s.value.as_bytes()))
        .map(|s| s.name)
        .collect()
}

/// The look-alikes missing from `haystack` (empty: all survived).
pub fn lost(haystack: &[u8]) -> Vec<&'static str> {
    look_alikes()
        .into_iter()
        .filter(|l| !contains(haystack, l.as_bytes()))
        .collect()
}

/// Whether `needle` occurs in `haystack`.
pub fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}
