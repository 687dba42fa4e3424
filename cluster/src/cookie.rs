//! The cluster's shared secret (ractor_cluster's magic cookie), read from a file that only its owner
//! may read. Never from the command line: argv is visible to every user of the machine.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Most bytes of a cookie file.
pub const COOKIE_BYTES_MAX: u64 = 4096;
/// Fewest bytes of a cookie (after trimming whitespace): a guessable cookie is no secret.
pub const COOKIE_BYTES_MIN: usize = 16;

/// Why a cookie file was refused.
#[derive(Debug, thiserror::Error)]
pub enum CookieError {
    /// It could not be read.
    #[error("cannot read the cookie file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Others may read or write it.
    #[error(
        "the cookie file {path} is accessible to other users (mode {mode:o}); run `chmod 600 {path}`"
    )]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// Not a regular file.
    #[error("the cookie file {path} is not a regular file")]
    NotAFile {
        /// The path.
        path: PathBuf,
    },
    /// Too large.
    #[error("the cookie file {path} has {len} bytes; at most {COOKIE_BYTES_MAX} are allowed")]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its size.
        len: u64,
    },
    /// Too short, or not one line of text.
    #[error(
        "the cookie in {path} must be one line of at least {COOKIE_BYTES_MIN} printable characters"
    )]
    Shape {
        /// The file.
        path: PathBuf,
    },
}

/// Read the cookie from `path`: a regular file with no permission bits for group or others, holding
/// one line of at least [`COOKIE_BYTES_MIN`] printable ASCII characters (surrounding whitespace
/// ignored).
///
/// # Errors
/// [`CookieError`] naming the file and what is wrong.
pub fn read_cookie(path: &Path) -> Result<String, CookieError> {
    let read = |source| CookieError::Read {
        path: path.to_path_buf(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(read)?;
    if !meta.is_file() {
        return Err(CookieError::NotAFile {
            path: path.to_path_buf(),
        });
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(CookieError::Permissions {
            path: path.to_path_buf(),
            mode,
        });
    }
    if meta.len() > COOKIE_BYTES_MAX {
        return Err(CookieError::TooLarge {
            path: path.to_path_buf(),
            len: meta.len(),
        });
    }
    let text = std::fs::read_to_string(path).map_err(read)?;
    let cookie = text.trim();
    if cookie.len() < COOKIE_BYTES_MIN || !cookie.chars().all(|c| c.is_ascii_graphic()) {
        return Err(CookieError::Shape {
            path: path.to_path_buf(),
        });
    }
    Ok(cookie.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, text: &str, mode: u32) -> PathBuf {
        let path = dir.join("cookie");
        std::fs::write(&path, text).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    fn tempdir() -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "keel-cookie-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_private_file_is_read_and_trimmed() {
        let dir = tempdir();
        let path = write(&dir, "  0123456789abcdef-cookie\n", 0o600);
        assert_eq!(read_cookie(&path).unwrap(), "0123456789abcdef-cookie");
        let path = write(&dir, "0123456789abcdef-cookie", 0o400);
        assert!(read_cookie(&path).is_ok());
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn readable_by_others_short_or_missing_is_refused() {
        let dir = tempdir();
        let path = write(&dir, "0123456789abcdef-cookie", 0o644);
        assert!(matches!(
            read_cookie(&path),
            Err(CookieError::Permissions { mode: 0o644, .. })
        ));
        let path = write(&dir, "0123456789abcdef-cookie", 0o620);
        assert!(matches!(
            read_cookie(&path),
            Err(CookieError::Permissions { .. })
        ));
        let path = write(&dir, "short", 0o600);
        assert!(matches!(read_cookie(&path), Err(CookieError::Shape { .. })));
        let path = write(&dir, "two words but long enough", 0o600);
        assert!(matches!(read_cookie(&path), Err(CookieError::Shape { .. })));
        assert!(matches!(
            read_cookie(&dir.join("missing")),
            Err(CookieError::Read { .. })
        ));
        assert!(matches!(
            read_cookie(&dir),
            Err(CookieError::NotAFile { .. })
        ));
        let _ = std::fs::remove_dir_all(dir);
    }
}
