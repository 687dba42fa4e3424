//! The scrubber's patterns: the known shapes of secrets with the literals of the pre-check, and the
//! words and tail of a secret assignment.

use super::{Check, SecretKind, Shape};

/// The known shapes, most specific first: of two that match at one position, the first names the
/// redaction (both spans are removed).
pub(super) const SHAPES: &[Shape] = &[
    Shape {
        kind: SecretKind::PrivateKey,
        // A block with no END line (cut by an upstream limit) is redacted to the end of the text.
        pattern: r"-----BEGIN[ A-Z0-9]{0,40}PRIVATE KEY(?: BLOCK)?-----(?:[\s\S]*?-----END[ A-Z0-9]{0,40}PRIVATE KEY(?: BLOCK)?-----|[\s\S]*)",
        check: Check::None,
        literals: &["-----BEGIN"],
    },
    Shape {
        kind: SecretKind::AnthropicKey,
        pattern: r"(?-u:\b)sk-ant-[A-Za-z0-9_\-]{20,}",
        check: Check::None,
        literals: &["sk-ant-"],
    },
    Shape {
        kind: SecretKind::OpenaiKey,
        pattern: r"(?-u:\b)sk-(?:proj-|svcacct-|admin-|None-)?[A-Za-z0-9_\-]{20,}",
        check: Check::HasDigit,
        literals: &["sk-"],
    },
    Shape {
        kind: SecretKind::AwsAccessKey,
        pattern: r"(?-u:\b)(?:AKIA|ASIA|ABIA|ACCA|AGPA|AIDA|AROA|AIPA|ANPA|ANVA|APKA)[A-Z0-9]{16}(?-u:\b)",
        check: Check::None,
        literals: &[
            "AKIA", "ASIA", "ABIA", "ACCA", "AGPA", "AIDA", "AROA", "AIPA", "ANPA", "ANVA", "APKA",
        ],
    },
    Shape {
        kind: SecretKind::AwsSecretKey,
        pattern: r#"(?:aws|AWS|Aws)[A-Za-z0-9_.\-]{0,30}(?:secret|SECRET|Secret|sk|SK)[A-Za-z0-9_.\-]{0,30}["']?\s*(?:=|:|=>)\s*["']?(?P<v>[A-Za-z0-9/+]{40})(?:[^A-Za-z0-9/+=]|$)"#,
        check: Check::None,
        literals: &["aws"],
    },
    Shape {
        kind: SecretKind::GithubToken,
        pattern: r"(?-u:\b)(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{22,})",
        check: Check::None,
        literals: &["ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"],
    },
    Shape {
        kind: SecretKind::GitlabToken,
        pattern: r"(?-u:\b)gl(?:pat|dt|rt|ptt|ft|cbt|oas|imt|soat|agent)-[A-Za-z0-9_\-]{20,}",
        check: Check::None,
        literals: &[
            "glpat-", "gldt-", "glrt-", "glptt-", "glft-", "glcbt-", "gloas-", "glimt-", "glsoat-",
            "glagent-",
        ],
    },
    Shape {
        kind: SecretKind::SlackWebhook,
        pattern: r"https://hooks\.slack\.com/(?:services|workflows|triggers)/[A-Za-z0-9/_\-]{8,}",
        check: Check::None,
        literals: &["https://hooks.slack.com/"],
    },
    Shape {
        kind: SecretKind::SlackToken,
        pattern: r"(?-u:\b)(?:xox[abposre]-[A-Za-z0-9\-]{10,}|xapp-[0-9]-[A-Za-z0-9\-]{10,})",
        check: Check::None,
        literals: &["xox", "xapp-"],
    },
    Shape {
        kind: SecretKind::StripeKey,
        pattern: r"(?-u:\b)(?:(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{16,}|whsec_[A-Za-z0-9+/=]{20,})",
        check: Check::None,
        literals: &["sk_live_", "sk_test_", "rk_live_", "rk_test_", "whsec_"],
    },
    Shape {
        kind: SecretKind::GoogleApiKey,
        pattern: r"(?-u:\b)AIza[0-9A-Za-z_\-]{35}",
        check: Check::None,
        literals: &["AIza"],
    },
    Shape {
        kind: SecretKind::GoogleOauth,
        pattern: r"(?-u:\b)(?:GOCSPX-[A-Za-z0-9_\-]{20,}|ya29\.[0-9A-Za-z_\-]{20,})",
        check: Check::None,
        literals: &["GOCSPX-", "ya29."],
    },
    Shape {
        kind: SecretKind::Jwt,
        pattern: r"(?-u:\b)eyJ[A-Za-z0-9_\-]{5,}\.eyJ[A-Za-z0-9_\-]{5,}\.[A-Za-z0-9_\-]*",
        check: Check::None,
        literals: &["eyJ"],
    },
    Shape {
        kind: SecretKind::BasicAuth,
        pattern: r#"(?:[Aa]uthorization|AUTHORIZATION)["']?\s*[:=]\s*["']?(?:[Bb]asic|BASIC|[Tt]oken|TOKEN|[Dd]igest|DIGEST)\s+(?P<v>[A-Za-z0-9._~+/=\-]{8,})"#,
        check: Check::NotPlaceholder,
        literals: &["authorization"],
    },
    Shape {
        kind: SecretKind::BearerToken,
        pattern: r"(?-u:\b)(?:[Bb]earer|BEARER)\s+(?P<v>[A-Za-z0-9._~+/=\-]{16,})",
        check: Check::TokenLike,
        literals: &["bearer"],
    },
    Shape {
        kind: SecretKind::UrlPassword,
        pattern: r#"(?-u:\b)[A-Za-z][A-Za-z0-9+.\-]*://[^\s/:@"'<>\[\]]+:(?P<v>[^\s/@"'<>\[\]]+)@"#,
        check: Check::NotPlaceholder,
        literals: &["://"],
    },
    Shape {
        kind: SecretKind::ConnectionPassword,
        pattern: r#";\s*(?:[Pp]assword|PASSWORD|[Pp]wd|PWD)\s*=\s*(?P<v>[^;"'\s]+)"#,
        check: Check::NotPlaceholder,
        literals: &["password", "pwd"],
    },
    Shape {
        kind: SecretKind::ConnectionPassword,
        pattern: r#"(?-u:\b)(?:[Pp]assword|PASSWORD|[Pp]wd|PWD)=(?P<v>[^;"'\s]+);"#,
        check: Check::NotPlaceholder,
        literals: &["password", "pwd"],
    },
];

/// Words that make a name sound secret (ASCII case-insensitive). An assignment is looked for only where
/// one of them starts a name's secret-sounding part.
pub(super) const SECRET_NAME_WORDS: [&str; 11] = [
    "password",
    "passwd",
    "pass",
    "pwd",
    "secret",
    "token",
    "key",
    "auth",
    "credential",
    "cred",
    "private",
];

/// The rest of `NAME = value` after a secret-sounding word: the end of the name, the operator, and the
/// value, which is then judged on its own.
pub(super) const ASSIGNMENT_TAIL: &str =
    r#"[A-Za-z0-9_.\-]*["']?\s*(?::=|=>|=|:)\s*["']?(?P<v>[^\s"'`,;:(){}\[\]<>]{16,})"#;
