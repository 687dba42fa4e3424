//! The secret scrubber against a corpus of positives (each secret kind, in the places it is found: env
//! files, JSON, headers, URLs, connection strings) and negatives (ordinary code that only looks close).
//! A missed secret is a leak; a false positive mangles the agent's context. Both are bugs.

use keel_actors::context::{RegisterSecretError, Scrubber, SecretKind};

/// Scrubs `input` with the built-in patterns and checks the exact output.
fn check(input: &str, expected: &str) {
    check_with(&Scrubber::new(), input, expected);
}

fn check_with(scrubber: &Scrubber, input: &str, expected: &str) {
    let out = scrubber.scrub(input);
    assert_eq!(out.text, expected, "input: {input:?}");
    // Scrubbing is idempotent: a marker is never itself taken for a secret.
    let again = scrubber.scrub(&out.text);
    assert_eq!(again.text, out.text, "not idempotent on {input:?}");
    assert_eq!(again.redactions.total(), 0);
}

fn unchanged(input: &str) {
    check(input, input);
}

#[test]
fn anthropic_key_in_an_env_file() {
    check(
        "ANTHROPIC_API_KEY=sk-ant-api03-Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0LzXcVbNm-AbCdEfAA\nDEBUG=1",
        "ANTHROPIC_API_KEY=[REDACTED:anthropic-key]\nDEBUG=1",
    );
}

#[test]
fn openai_keys_legacy_and_project() {
    check(
        "use sk-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4zAb3dEf6hIj9kLm2n for the call",
        "use [REDACTED:openai-key] for the call",
    );
    check(
        r#"{"key": "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z"}"#,
        r#"{"key": "[REDACTED:openai-key]"}"#,
    );
}

#[test]
fn aws_access_key_and_secret() {
    check(
        "aws_access_key_id = AKIAIOSFODNN7EXAMPLE\naws_secret_access_key = wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY\n",
        "aws_access_key_id = [REDACTED:aws-access-key]\naws_secret_access_key = [REDACTED:aws-secret-key]\n",
    );
}

#[test]
fn github_tokens() {
    check(
        "git clone https://ghp_aB3dE6gH9jK2mN5pQ8sT1vW4yZ7bC0dF3gH6@example.com/r.git",
        "git clone https://[REDACTED:github-token]@example.com/r.git",
    );
    check(
        "GH=github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyzABCD",
        "GH=[REDACTED:github-token]",
    );
}

#[test]
fn gitlab_slack_stripe_google() {
    check(
        "token glpat-AbCdEf1234567890xYz_ ok",
        "token [REDACTED:gitlab-token] ok",
    );
    check(
        "SLACK=xoxb-1234567890-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",
        "SLACK=[REDACTED:slack-token]",
    );
    check(
        "post to https://hooks.slack.com/services/T00000000/B00000000/XXXXXXXXXXXXXXXXXXXXXXXX now",
        "post to [REDACTED:slack-webhook] now",
    );
    check(
        "stripe.api_key = 'sk_live_51H8abcdEFGH1234ijklMNOP'",
        "stripe.api_key = '[REDACTED:stripe-key]'",
    );
    check(
        "key=AIzaSyA1234567890abcdefghijklmnopqrstuv&q=1",
        "key=[REDACTED:google-api-key]&q=1",
    );
    check(
        "client_secret GOCSPX-AbCdEfGhIjKlMnOpQrStUvWxYz12",
        "client_secret [REDACTED:google-oauth]",
    );
}

#[test]
fn bearer_basic_and_jwt() {
    check(
        "curl -H 'Authorization: Bearer abc123def456ghi789jkl0' https://api.example",
        "curl -H 'Authorization: Bearer [REDACTED:bearer-token]' https://api.example",
    );
    check(
        "Authorization: Basic dXNlcjpwYXNzd29yZA==",
        "Authorization: Basic [REDACTED:basic-auth]",
    );
    check(
        "cookie=eyJhbGciOiJIUzI1NiIsInR5cCI6IkpXVCJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U;",
        "cookie=[REDACTED:jwt];",
    );
}

#[test]
fn private_key_blocks_whole_or_cut() {
    check(
        "key:\n-----BEGIN RSA PRIVATE KEY-----\nMIIEowIBAAKCAQEA1234\nabcd\n-----END RSA PRIVATE KEY-----\ndone",
        "key:\n[REDACTED:private-key]\ndone",
    );
    check(
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA (cut by a limit",
        "[REDACTED:private-key]",
    );
}

#[test]
fn passwords_in_urls_and_connection_strings() {
    check(
        "DATABASE_URL=postgres://app:s3cr3tP4ss@db.example:5432/app",
        "DATABASE_URL=postgres://app:[REDACTED:url-password]@db.example:5432/app",
    );
    check(
        "Server=db;User Id=app;Password=Tr0ub4dor&3;Encrypt=true",
        "Server=db;User Id=app;Password=[REDACTED:connection-password];Encrypt=true",
    );
}

#[test]
fn assignments_whose_value_looks_like_a_secret() {
    check(
        "export DEPLOY_TOKEN=f8Kq2Lm9Xz4Rt7Wb1Nc6Vd3Hs5",
        "export DEPLOY_TOKEN=[REDACTED:secret-assignment]",
    );
    check(
        r#"{"client_secret": "9aF3kLq81ZxPw7RtYb2M"}"#,
        r#"{"client_secret": "[REDACTED:secret-assignment]"}"#,
    );
    check(
        "SESSION_SECRET=4f9d2c8a7b1e6f3d0c5a9e2b7d4f1a8c",
        "SESSION_SECRET=[REDACTED:secret-assignment]",
    );
    // FIXME(known limitation): a value of exactly 40 or 64 hex digits is taken for a sha even under a
    // secret-sounding name, because `cache_key = <sha>` is far more common in code. An account's key
    // of that shape is caught by registering it.
    check(
        "session_key: 4f9d2c8a7b1e6f3d0c5a9e2b7d4f1a8c6e3b0d9f",
        "session_key: 4f9d2c8a7b1e6f3d0c5a9e2b7d4f1a8c6e3b0d9f",
    );
}

#[test]
fn registered_literals_whatever_their_shape() {
    let mut s = Scrubber::new();
    s.register_secret("correct horse battery").unwrap();
    s.register_secret("pw-123").unwrap();
    check_with(
        &s,
        "say correct horse battery and pw-123 twice: pw-123",
        "say [REDACTED:registered-secret] and [REDACTED:registered-secret] twice: [REDACTED:registered-secret]",
    );
    assert_eq!(
        s.register_secret("abc"),
        Err(RegisterSecretError::TooShort { len: 3, min: 6 })
    );
    assert_eq!(s.registered_count(), 2);
    // Debug never prints a registered secret.
    assert!(!format!("{s:?}").contains("horse"));
}

#[test]
fn overlapping_findings_are_redacted_as_one() {
    let mut s = Scrubber::new();
    // A registered literal that overlaps the start of a pattern match: the union is removed.
    s.register_secret("prefix-sk-ant").unwrap();
    check_with(
        &s,
        "x prefix-sk-ant-api03-Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1 y",
        "x [REDACTED:registered-secret] y",
    );
}

#[test]
fn counts_by_kind() {
    let out = Scrubber::new().scrub(
        "AKIAIOSFODNN7EXAMPLE and AKIAIOSFODNN7EXAMPLF and sk-ant-api03-Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1",
    );
    assert_eq!(out.redactions.count(SecretKind::AwsAccessKey), 2);
    assert_eq!(out.redactions.count(SecretKind::AnthropicKey), 1);
    assert_eq!(out.redactions.total(), 3);
}

// ----- negatives: ordinary code and text that must pass untouched -----

#[test]
fn api_key_loaded_from_the_environment_is_not_a_secret() {
    unchanged(r#"api_key = os.environ["API_KEY"]"#);
    unchanged(r#"token = os.environ.get("GITHUB_TOKEN")"#);
    unchanged("apiKey: process.env.STRIPE_SECRET_KEY,");
    unchanged("const key = config.secrets.anthropic_api_key_v2;");
    unchanged(r#"API_KEY="${OPENAI_API_KEY}""#);
    unchanged("API_TOKEN=$DEPLOY_TOKEN_FROM_VAULT");
}

#[test]
fn git_shas_and_uuids_are_not_secrets() {
    unchanged("commit 3f786850e387550fdab836ed7e6dc881de23001b (HEAD -> main)");
    unchanged(r#"cache_key = "3f786850e387550fdab836ed7e6dc881de23001b""#);
    unchanged("request_id = 550e8400-e29b-41d4-a716-446655440000");
    unchanged("idempotency_key: 550e8400-e29b-41d4-a716-446655440000");
    unchanged("sha256: 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08");
}

#[test]
fn keels_own_ids_and_keys_are_not_secrets() {
    // An attempt's idempotency key as `keel show TASK --json` prints it: it was redacted as a
    // secret assigned to a key.
    unchanged(
        r#""idempotency_key": "start/01M8WFF513E9ZT1MJERM19PS4P/01M8WFF5134FE222T43HMEXYF9/1""#,
    );
    unchanged("lease_key=start/01M8WFF513E9ZT1MJERM19PS4P/2");
    // What is not a word, then keel's ULIDs and numbers, is still read as a value: a bare ULID-shaped
    // token (a random 128-bit secret in Crockford's base32 has that shape), a path with a mixed-case
    // part, a lowercase ULID, a ULID whose time is not a plausible one, a path without the word.
    for value in [
        "01M8WFF513E9ZT1MJERM19PS4P",
        "start/01M8WFF513E9ZT1MJERM19PS4P/Zx9qT7bV3mK8pL2w",
        "start/01m8wff513e9zt1mjerm19ps4p/1",
        "start/7ZX9QT7BV3MK8PL2WQ4RJ6HN5C/1",
        "01M8WFF513E9ZT1MJERM19PS4P/01M8WFF5134FE222T43HMEXYF9",
    ] {
        let text = format!("api_key={value}");
        let scrubbed = Scrubber::new().scrub(&text);
        assert_ne!(scrubbed.text, text, "{value} passed as keel's own key");
    }
}

#[test]
fn ordinary_code_is_not_a_secret() {
    unchanged("password = get_password_from_vault();");
    unchanged("const MAX_TOKENS: u32 = 4096;");
    unchanged("max_tokens=4096 input_tokens: 123456789012345678");
    unchanged(r#"secret_name = "PRODUCTION_DATABASE_PASSWORD""#);
    unchanged("sort_key=created_at_2024_01_01");
    unchanged("cache_key = user:1234:profile:settings");
    unchanged(r#"private_key_path = "/etc/keel/keys/id_ed25519""#);
    unchanged("Bearer tokens are sent in the Authorization header.");
    unchanged("Authorization: Bearer $TOKEN");
    unchanged("see https://example.com:8080/path?q=1 and git@github.com:org/repo.git");
    unchanged("postgres://app:${PGPASSWORD}@db.example/app");
    unchanged("the risk-averse plan uses sk-learn-style-pipelines-for-tabular-data");
    unchanged(r#""tokenizer": "cl100k_base", "author": "A. Writer""#);
    unchanged("fn scrub(text: &str) -> String { text.to_owned() }");
    unchanged("Ünïcödé ✓ 日本語のテキスト with emoji 🦀 and no secrets");
}
