//! Where a CLI's executable is found: an explicit path from the environment, else the pinned
//! install under `harness-adapters/clis`.

use std::path::{Path, PathBuf};

use crate::error::StartError;

/// Where to find one CLI: an explicit path from the environment, else the pinned install.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CliBinary {
    /// Environment variable holding an explicit path (e.g. `KEEL_CLAUDE_BIN`).
    pub env_var: &'static str,
    /// Executable name under `harness-adapters/clis/node_modules/.bin/`.
    pub bin_name: &'static str,
}

/// The command that installs the pinned CLIs, named in every "not installed" error.
pub const INSTALL_COMMAND: &str = "npm ci --prefix harness-adapters/clis";

impl CliBinary {
    /// The pinned install directory of this source tree (used when no env override is set).
    pub fn pinned_bin_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("clis")
            .join("node_modules")
            .join(".bin")
    }

    /// Finds the executable.
    ///
    /// # Errors
    /// [`StartError::Unavailable`] saying how to install it or which variable to set.
    pub fn locate(&self) -> Result<PathBuf, StartError> {
        if let Some(path) = std::env::var_os(self.env_var) {
            let path = PathBuf::from(path);
            return if path.is_file() {
                Ok(path)
            } else {
                Err(StartError::Unavailable(format!(
                    "{} points at {}, which is not a file",
                    self.env_var,
                    path.display()
                )))
            };
        }
        let pinned = Self::pinned_bin_dir().join(self.bin_name);
        if pinned.is_file() {
            Ok(pinned)
        } else {
            Err(StartError::Unavailable(format!(
                "`{}` is not installed: run `{INSTALL_COMMAND}` (or set {} to its path)",
                self.bin_name, self.env_var
            )))
        }
    }
}
