//! What a scrub removed from a row before it was stored (issue 16): the kind of each secret and how
//! many of it. keel's scrubber (keel-actors' `context::Scrubber`) finds them; the store keeps the
//! counts with the row, so `keel logs` can say that something was removed and what, while the secret
//! itself never reaches the file.

use serde::{Deserialize, Serialize};
use std::fmt;

/// What kind of secret a redaction removed, so a reader knows something was there and what.
///
/// Stored in rows (bincode keeps the variant's index): append new kinds at the end, never reorder or
/// remove one, and bump the codec's schema version when adding one (an older keel must refuse a row
/// with a kind it does not know rather than misread it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SecretKind {
    /// A literal registered at runtime (an account's key).
    Registered,
    /// A PEM or PGP private key block.
    PrivateKey,
    /// An Anthropic API key (`sk-ant-...`).
    AnthropicKey,
    /// An OpenAI API key (`sk-...`, `sk-proj-...`).
    OpenaiKey,
    /// An AWS access key id (`AKIA...`, `ASIA...`).
    AwsAccessKey,
    /// An AWS secret access key (40 characters after an `aws...secret` name).
    AwsSecretKey,
    /// A GitHub token (`ghp_`, `gho_`, `ghs_`, `github_pat_`, ...).
    GithubToken,
    /// A GitLab token (`glpat-`, ...).
    GitlabToken,
    /// A Slack token (`xoxb-`, `xapp-`, ...).
    SlackToken,
    /// A Slack incoming webhook URL.
    SlackWebhook,
    /// A Stripe secret or restricted key, or a webhook signing secret.
    StripeKey,
    /// A Google API key (`AIza...`).
    GoogleApiKey,
    /// A Google OAuth client secret or access token.
    GoogleOauth,
    /// A JSON Web Token.
    Jwt,
    /// The credential after `Bearer`.
    BearerToken,
    /// The credential of an `Authorization: Basic|Token` header.
    BasicAuth,
    /// The password of a `scheme://user:password@host` URL.
    UrlPassword,
    /// The password of a `Key=value;` connection string.
    ConnectionPassword,
    /// The value of a `SECRET_NAME = value` assignment whose value looks like a secret.
    SecretAssignment,
    /// A whole text, removed because the scrubber's patterns were not available to look inside it (a
    /// build whose patterns do not compile fails closed: it removes everything rather than less).
    Unscanned,
}

impl SecretKind {
    /// Every kind, in declaration order (for counting without a hash map).
    pub const ALL: [SecretKind; 20] = [
        Self::Registered,
        Self::PrivateKey,
        Self::AnthropicKey,
        Self::OpenaiKey,
        Self::AwsAccessKey,
        Self::AwsSecretKey,
        Self::GithubToken,
        Self::GitlabToken,
        Self::SlackToken,
        Self::SlackWebhook,
        Self::StripeKey,
        Self::GoogleApiKey,
        Self::GoogleOauth,
        Self::Jwt,
        Self::BearerToken,
        Self::BasicAuth,
        Self::UrlPassword,
        Self::ConnectionPassword,
        Self::SecretAssignment,
        Self::Unscanned,
    ];

    /// The label used in a redaction marker (`[REDACTED:<label>]`) and in `keel logs`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Registered => "registered-secret",
            Self::PrivateKey => "private-key",
            Self::AnthropicKey => "anthropic-key",
            Self::OpenaiKey => "openai-key",
            Self::AwsAccessKey => "aws-access-key",
            Self::AwsSecretKey => "aws-secret-key",
            Self::GithubToken => "github-token",
            Self::GitlabToken => "gitlab-token",
            Self::SlackToken => "slack-token",
            Self::SlackWebhook => "slack-webhook",
            Self::StripeKey => "stripe-key",
            Self::GoogleApiKey => "google-api-key",
            Self::GoogleOauth => "google-oauth",
            Self::Jwt => "jwt",
            Self::BearerToken => "bearer-token",
            Self::BasicAuth => "basic-auth",
            Self::UrlPassword => "url-password",
            Self::ConnectionPassword => "connection-password",
            Self::SecretAssignment => "secret-assignment",
            Self::Unscanned => "unscanned-text",
        }
    }

    /// Its position in [`SecretKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for SecretKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.label())
    }
}

/// How many secrets of one kind a scrub removed from a row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Redaction {
    /// What was removed.
    pub kind: SecretKind,
    /// How many times.
    pub count: u32,
}
