//! Bearer tokens: read from the file keel.toml names (refused when group or others may read or
//! write it), compared in constant time, and created (mode 0600, a random token) when the file is
//! missing so a first `keel serve` works without setup.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use subtle::ConstantTimeEq;

/// The shortest token accepted: shorter ones can be guessed.
const TOKEN_CHARS_MIN: usize = 16;
/// Most tokens in one file (one a line, so a new one can be added before an old one is removed).
const TOKENS_MAX: usize = 64;
/// The largest token file read.
const TOKEN_FILE_BYTES_MAX: u64 = 64 * 1024;

/// Why the token file cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum TokenError {
    /// It could not be read (or created).
    #[error("cannot read the token file {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// Group or others may read or write it.
    #[error(
        "the token file {} has mode {mode:o}: group and others must have no access (chmod 600 {})",
        path.display(),
        path.display()
    )]
    TooOpen {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// It holds no token, a token that is too short, or too many.
    #[error("the token file {} is not usable: {reason}", path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// The tokens a server accepts.
#[derive(Clone)]
pub(crate) struct Tokens {
    accepted: Vec<Vec<u8>>,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tokens({} accepted)", self.accepted.len())
    }
}

impl Tokens {
    /// Read the token file: one token a line (blank lines and `#` comments skipped).
    ///
    /// # Errors
    /// [`TokenError`]: unreadable, open to others, empty, a token too short, too many.
    pub(crate) fn load(path: &Path) -> Result<Self, TokenError> {
        let text = read_private(path)?;
        let invalid = |reason: String| TokenError::Invalid {
            path: path.to_owned(),
            reason,
        };
        let accepted: Vec<Vec<u8>> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| l.as_bytes().to_vec())
            .collect();
        if accepted.is_empty() {
            return Err(invalid("it holds no token".into()));
        }
        if accepted.len() > TOKENS_MAX {
            return Err(invalid(format!("more than {TOKENS_MAX} tokens")));
        }
        if let Some(n) = accepted.iter().position(|t| t.len() < TOKEN_CHARS_MIN) {
            return Err(invalid(format!(
                "token {} is shorter than {TOKEN_CHARS_MIN} characters",
                n + 1
            )));
        }
        Ok(Self { accepted })
    }

    /// The token file at `path`, created with a new random token (mode 0600) when it is missing.
    /// Returns the tokens and whether the file was created.
    ///
    /// # Errors
    /// As [`Tokens::load`]; also when the file cannot be created or no OS entropy is available.
    pub(crate) fn load_or_create(path: &Path) -> Result<(Self, bool), TokenError> {
        if path.exists() {
            return Ok((Self::load(path)?, false));
        }
        let io = |source| TokenError::Io {
            path: path.to_owned(),
            source,
        };
        let mut raw = [0u8; 32];
        getrandom::fill(&mut raw).map_err(|e| io(std::io::Error::other(e.to_string())))?;
        let token: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io)?;
        }
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io)?;
        file.write_all(format!("{token}\n").as_bytes())
            .map_err(io)?;
        Ok((Self::load(path)?, true))
    }

    /// Whether an `Authorization` header value carries an accepted token (`Bearer TOKEN`). Every
    /// accepted token is compared, each in constant time, so the time taken does not tell how
    /// much of a guess was right.
    pub(crate) fn accepts(&self, header: Option<&[u8]>) -> bool {
        let Some(presented) = header.and_then(bearer) else {
            return false;
        };
        let mut ok = subtle::Choice::from(0u8);
        for token in &self.accepted {
            ok |= token.as_slice().ct_eq(presented);
        }
        ok.into()
    }
}

/// The token of a `Bearer TOKEN` header value (the scheme is case-insensitive).
fn bearer(value: &[u8]) -> Option<&[u8]> {
    let (scheme, rest) = value.split_at_checked(7)?;
    if !scheme.eq_ignore_ascii_case(b"bearer ") {
        return None;
    }
    let token = rest.trim_ascii();
    (!token.is_empty()).then_some(token)
}

/// A client's token: the first token of a file, refused like the server refuses a file others can
/// read (a client's copy is as secret as the server's).
///
/// # Errors
/// [`TokenError`].
pub(crate) fn client_token(path: &Path) -> Result<String, TokenError> {
    let tokens = Tokens::load(path)?;
    let first = tokens.accepted.into_iter().next().unwrap_or_default();
    String::from_utf8(first).map_err(|_| TokenError::Invalid {
        path: path.to_owned(),
        reason: "the token is not UTF-8".into(),
    })
}

/// A file's text, if only its owner may read and write it.
fn read_private(path: &Path) -> Result<String, TokenError> {
    let io = |source| TokenError::Io {
        path: path.to_owned(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(TokenError::TooOpen {
            path: path.to_owned(),
            mode,
        });
    }
    if meta.len() > TOKEN_FILE_BYTES_MAX {
        return Err(TokenError::Invalid {
            path: path.to_owned(),
            reason: format!("it is larger than {TOKEN_FILE_BYTES_MAX} bytes"),
        });
    }
    std::fs::read_to_string(path).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str, mode: u32) -> (tempfile::TempDir, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        (dir, path)
    }

    #[test]
    fn a_token_file_others_can_read_is_refused() {
        let (_d, path) = file("0123456789abcdef0123\n", 0o644);
        let err = Tokens::load(&path).unwrap_err();
        assert!(
            matches!(err, TokenError::TooOpen { mode: 0o644, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("chmod 600"), "{err}");
    }

    #[test]
    fn only_an_accepted_bearer_token_passes() {
        let (_d, path) = file(
            "# rotation\nfirst-token-0123456789\nsecond-token-0123456789\n",
            0o600,
        );
        let tokens = Tokens::load(&path).unwrap();
        assert!(tokens.accepts(Some(b"Bearer first-token-0123456789")));
        assert!(tokens.accepts(Some(b"bearer second-token-0123456789")));
        assert!(!tokens.accepts(Some(b"Bearer first-token-012345678")));
        assert!(!tokens.accepts(Some(b"Basic first-token-0123456789")));
        assert!(!tokens.accepts(Some(b"Bearer ")));
        assert!(!tokens.accepts(None));
    }

    #[test]
    fn short_or_missing_tokens_are_refused() {
        let (_d, path) = file("short\n", 0o600);
        assert!(
            Tokens::load(&path)
                .unwrap_err()
                .to_string()
                .contains("shorter")
        );
        let (_d, path) = file("# nothing\n\n", 0o600);
        assert!(
            Tokens::load(&path)
                .unwrap_err()
                .to_string()
                .contains("no token")
        );
    }

    #[test]
    fn a_missing_file_is_created_private_with_a_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("api-token");
        let (tokens, created) = Tokens::load_or_create(&path).unwrap();
        assert!(created);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let token = client_token(&path).unwrap();
        assert_eq!(token.len(), 64);
        assert!(tokens.accepts(Some(format!("Bearer {token}").as_bytes())));
        let (_, again) = Tokens::load_or_create(&path).unwrap();
        assert!(!again);
    }
}
