//! An account's secret, resolved the one way everything that needs it does: the adapters when a
//! session starts, the host when it registers every account's secret with the scrubber, and
//! `keel doctor` when it checks that each account's credential is there.
//!
//! A [`Credential`] names where the secret is (an environment variable or a private file), never
//! the secret itself: specs are plain data that may be logged, persisted or sent to a worker node.
//! The secret is read when it is needed, so a rotated key file is picked up by the next session.

use std::path::{Path, PathBuf};

use crate::spec::{Credential, Provider};

/// Largest key file read: an API key is under a kilobyte; a bigger file is the wrong file.
pub const KEY_FILE_BYTES_MAX: u64 = 16 * 1024;

/// Why an account's secret could not be had. The message names the variable or the file and never
/// holds the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CredentialError {
    /// The environment variable is not set, or is blank.
    #[error("environment variable {0} is not set")]
    EnvUnset(String),
    /// The key file could not be used.
    #[error("key file {}: {reason}", path.display())]
    KeyFile {
        /// The file.
        path: PathBuf,
        /// What is wrong with it (missing, readable by others, empty, too large).
        reason: String,
    },
}

impl Credential {
    /// The secret this credential names: `None` for [`Credential::None`]; a variable's value as
    /// `env` finds it (adapters look in the spec's `env`, then the process's); a key file's first
    /// line, read now.
    ///
    /// # Errors
    /// [`CredentialError`] naming what is missing; a blank value counts as missing.
    pub fn secret(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Option<String>, CredentialError> {
        match self {
            Credential::None => Ok(None),
            Credential::ApiKeyEnv(name) | Credential::BearerTokenEnv(name) => env(name)
                .filter(|v| !v.trim().is_empty())
                .map(Some)
                .ok_or_else(|| CredentialError::EnvUnset(name.clone())),
            Credential::ApiKeyFile(path) => read_key_file(path).map(Some),
        }
    }

    /// Whether the secret is sent as a bearer token (`Authorization: Bearer`, Claude Code's
    /// `ANTHROPIC_AUTH_TOKEN`) rather than as an API key.
    pub fn is_bearer(&self) -> bool {
        matches!(self, Credential::BearerTokenEnv(_))
    }
}

/// Reads a key file: it must be private to its owner (no permission bits for group or others, the
/// rule ssh applies to a private key), at most [`KEY_FILE_BYTES_MAX`] bytes, and hold the key on
/// its first line (surrounding whitespace is dropped).
///
/// # Errors
/// [`CredentialError::KeyFile`] saying what is wrong.
pub fn read_key_file(path: &Path) -> Result<String, CredentialError> {
    let bad = |reason: String| CredentialError::KeyFile {
        path: path.to_path_buf(),
        reason,
    };
    let meta = std::fs::metadata(path).map_err(|e| bad(format!("cannot be read: {e}")))?;
    if !meta.is_file() {
        return Err(bad("is not a file".into()));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let mode = meta.mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(bad(format!(
                "may be read by others (mode {mode:o}); run chmod 600 {}",
                path.display()
            )));
        }
    }
    if meta.len() > KEY_FILE_BYTES_MAX {
        return Err(bad(format!(
            "is {} bytes; a key file holds one key (at most {KEY_FILE_BYTES_MAX} bytes)",
            meta.len()
        )));
    }
    let text = std::fs::read_to_string(path).map_err(|e| bad(format!("cannot be read: {e}")))?;
    let key = text.lines().next().unwrap_or("").trim();
    if key.is_empty() {
        return Err(bad("is empty".into()));
    }
    Ok(key.to_owned())
}

impl Provider {
    /// Every provider, in a fixed order.
    pub const ALL: [Provider; 2] = [Provider::Anthropic, Provider::OpenAi];

    /// The stable name used in keel.toml (`anthropic`, `openai`).
    pub fn as_str(self) -> &'static str {
        match self {
            Provider::Anthropic => "anthropic",
            Provider::OpenAi => "openai",
        }
    }

    /// The environment variable a session of this provider reads its key from when no account of
    /// keel.toml names another (`ANTHROPIC_API_KEY`, `OPENAI_API_KEY`).
    pub fn default_key_env(self) -> &'static str {
        match self {
            Provider::Anthropic => "ANTHROPIC_API_KEY",
            Provider::OpenAi => "OPENAI_API_KEY",
        }
    }

    /// The environment variable that overrides this provider's endpoint when an account names none.
    pub fn base_url_env(self) -> &'static str {
        match self {
            Provider::Anthropic => "ANTHROPIC_BASE_URL",
            Provider::OpenAi => "OPENAI_BASE_URL",
        }
    }
}

impl std::fmt::Display for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_come_from_the_named_place_and_blank_is_missing() {
        let env = |name: &str| match name {
            "SET" => Some("sk-value".to_owned()),
            "BLANK" => Some("  ".to_owned()),
            _ => None,
        };
        assert_eq!(Credential::None.secret(env), Ok(None));
        assert_eq!(
            Credential::ApiKeyEnv("SET".into()).secret(env),
            Ok(Some("sk-value".into()))
        );
        assert_eq!(
            Credential::BearerTokenEnv("BLANK".into()).secret(env),
            Err(CredentialError::EnvUnset("BLANK".into()))
        );
        assert_eq!(
            Credential::ApiKeyEnv("UNSET".into())
                .secret(env)
                .unwrap_err()
                .to_string(),
            "environment variable UNSET is not set"
        );
    }

    #[cfg(all(unix, feature = "io"))]
    #[test]
    fn a_key_file_must_be_private_and_hold_a_key() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("team.key");
        std::fs::write(&path, "sk-file-key\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let open = Credential::ApiKeyFile(path.clone()).secret(|_| None);
        let message = open.unwrap_err().to_string();
        assert!(message.contains("chmod 600"), "{message}");
        assert!(!message.contains("sk-file-key"), "{message}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert_eq!(
            Credential::ApiKeyFile(path.clone()).secret(|_| None),
            Ok(Some("sk-file-key".into()))
        );
        std::fs::write(&path, "\n").unwrap();
        assert!(
            read_key_file(&path)
                .unwrap_err()
                .to_string()
                .contains("empty")
        );
        assert!(read_key_file(&dir.path().join("missing")).is_err());
    }
}
