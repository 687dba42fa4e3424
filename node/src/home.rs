//! The keel home: the folder holding `keel.toml` and the store file. One place decides where it is, so
//! every command agrees.

use std::path::{Path, PathBuf};

use keel_store::{OpenError, Store, StoreConfig};

use crate::config::{Config, ConfigError};
use crate::serve::discovery::{self, Announced};

/// The file name of the store inside a home.
pub(crate) const STORE_FILE: &str = "keel.redb";
/// The file name of the configuration inside a home.
pub(crate) const CONFIG_FILE: &str = "keel.toml";
/// The commented default configuration written by `keel init`.
const CONFIG_TEMPLATE: &str = include_str!("keel.toml");

/// Why a home could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum HomeError {
    /// No store at the expected place: the user has not run `keel init` (or pointed elsewhere).
    #[error("no keel store at {}: run `keel init` first (or pass --home DIR)", path.display())]
    Missing {
        /// Where the store was expected.
        path: PathBuf,
    },
    /// Creating the home folder or writing keel.toml failed.
    #[error("cannot create the keel home at {}: {source}", path.display())]
    Create {
        /// The path that failed.
        path: PathBuf,
        /// The IO error.
        source: std::io::Error,
    },
    /// keel.toml is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Another keel process holds the store in a way that excludes this open: a writer excludes a
    /// second writer, and `keel serve` (which opens it alone) excludes readers too. The message
    /// names the holder when the home announces a server, and what to do.
    #[error("cannot open the store at {}: {}", path.display(), held_hint(server.as_ref()))]
    Held {
        /// The store file.
        path: PathBuf,
        /// The server the home announces (its `server.json`, a live process), if any.
        server: Option<Announced>,
    },
    /// The store exists but does not open: damaged, not a store, not permitted, a newer format.
    /// The message names the file and what to do.
    #[error("cannot open the store at {}: {reason}{}", path.display(), open_hint(reason))]
    Open {
        /// The store file.
        path: PathBuf,
        /// Why (in the message, not a separate source, so the hint follows it and it is not
        /// printed twice).
        reason: OpenError,
    },
}

/// What the operator can do about an open error, after its message.
fn open_hint(e: &OpenError) -> &'static str {
    match e {
        OpenError::Corrupt(_) => {
            "; check it with `keel store check`, or restore a backup made with `keel store backup`"
        }
        OpenError::PermissionDenied(_) => "; check the file's owner and permissions",
        _ => "",
    }
}

/// Who holds the store, and what to do about it.
fn held_hint(server: Option<&Announced>) -> String {
    match server {
        Some(server) => format!(
            "it is held by {server}, which opens it alone: the read commands, `run`, `resume`, `follow-up`, `cancel` and `answer` go through it (or pass `--server {url}`); for this command, stop the server (SIGTERM: its runs pause; continue each with `keel resume RUN`)",
            url = server.url,
        ),
        None => "it is held by another keel process: a `keel run`, `resume`, `follow-up` or `keel node` writing it (wait for it, or stop its run with `keel cancel RUN`), one that has it alone (a `keel serve` starting or stopping, `keel store check` or `compact`), or, for a command that needs it alone, one reading it (a read command such as `keel status`, `keel store backup`, `keel doctor`: try again when it is done); if a `keel serve` holds it, pass `--server URL`".to_owned(),
    }
}

/// A located keel home.
#[derive(Debug, Clone)]
pub(crate) struct Home {
    dir: PathBuf,
}

impl Home {
    /// Reads this home's keel.toml (defaults when there is none yet), and registers its accounts'
    /// keys with the output scrubber (issue 16).
    pub(crate) fn config(&self) -> Result<Config, ConfigError> {
        let config = Config::load(&self.config_path())?;
        crate::redact::register_secrets(config.account_secrets());
        Ok(config)
    }
}

/// What `keel init` found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Created {
    /// Whether keel.toml was written now (false: one was there and was kept).
    pub(crate) config: bool,
    /// Whether the store file was created now (false: it existed and was opened).
    pub(crate) store: bool,
}

impl Home {
    /// `--home`, else `$KEEL_HOME`, else `./.keel`.
    pub(crate) fn locate(flag: Option<PathBuf>) -> Result<Self, HomeError> {
        let dir = flag
            .or_else(|| std::env::var_os("KEEL_HOME").map(PathBuf::from))
            .unwrap_or_else(|| PathBuf::from(".keel"));
        Ok(Self { dir })
    }

    /// The home folder.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The store file: `[store] path` of keel.toml, relative to the home unless absolute.
    pub(crate) fn store_path(&self) -> Result<PathBuf, ConfigError> {
        Ok(self.dir.join(self.config()?.store.path))
    }

    /// The configuration file.
    pub(crate) fn config_path(&self) -> PathBuf {
        self.dir.join(CONFIG_FILE)
    }

    /// Creates the folder (0700), a commented keel.toml (0600) and the store (0600), keeping whatever
    /// already exists: running it twice is harmless and never overwrites a user's configuration.
    pub(crate) fn init(&self) -> Result<Created, HomeError> {
        // 0700 at creation: transcripts and synthesis files live here (issue 16).
        crate::private::create_dir(&self.dir).map_err(|source| HomeError::Create {
            path: self.dir.clone(),
            source,
        })?;
        let config_path = self.config_path();
        let config = match crate::private::create_new_file(&config_path) {
            Ok(mut file) => {
                use std::io::Write;
                file.write_all(CONFIG_TEMPLATE.as_bytes())
                    .and_then(|()| file.sync_all())
                    .map_err(|source| HomeError::Create {
                        path: config_path.clone(),
                        source,
                    })?;
                true
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
            Err(source) => {
                return Err(HomeError::Create {
                    path: config_path,
                    source,
                });
            }
        };
        // A kept keel.toml is checked now, so a bad one is reported at init rather than at first use.
        let store_path = self.store_path()?;
        let store = !store_path.exists();
        match Store::open(&store_path) {
            Ok(_) => {}
            // A store another keel process holds (a `keel serve` has it alone) is a store: kept.
            Err(OpenError::Locked) if !store => {}
            Err(reason) => return Err(self.open_failed(store_path, reason)),
        }
        Ok(Created { config, store })
    }

    /// Opens the store of an initialised home. Read commands never create a store: a missing one is
    /// [`HomeError::Missing`], so a typo in `--home` does not silently create an empty store.
    pub(crate) fn open_existing(&self) -> Result<Store, HomeError> {
        let path = self.store_path()?;
        if !path.is_file() {
            return Err(HomeError::Missing { path });
        }
        // Read-only first, so the read commands work beside a running node that shares the file (a
        // `keel serve` does not share it: then this is [`HomeError::Held`] naming the server, and
        // the read commands go to it). A store left by a crash needs one writable open to
        // recover; only then fall back to it (which fails cleanly if another process holds it).
        match Store::open_read_only(&path, StoreConfig::default()) {
            Ok(store) => Ok(store),
            Err(OpenError::NeedsRecovery) => {
                Store::open(&path).map_err(|reason| self.open_failed(path, reason))
            }
            Err(reason) => Err(self.open_failed(path, reason)),
        }
    }

    /// The error of a failed open of this home's store at `path`: [`HomeError::Held`] (naming
    /// the server the home announces, if any) when another process holds it, else
    /// [`HomeError::Open`].
    pub(crate) fn open_failed(&self, path: PathBuf, reason: OpenError) -> HomeError {
        match reason {
            OpenError::Locked => HomeError::Held {
                path,
                server: discovery::read(self),
            },
            reason => HomeError::Open { path, reason },
        }
    }
}
