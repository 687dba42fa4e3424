//! Exit codes and the mapping of errors to them: every failure leaves `keel` as a [`Failed`] that carries
//! the code scripts branch on.

use keel_store::ReadError;

use crate::config;
use crate::home::HomeError;
use crate::run;

/// Exit codes of `keel`. Stable: scripts depend on them.
///
/// A closed stdout (`keel runs | head -1`) is not a failure and has no code of its own: the rest of
/// the output is dropped and the command ends with the code of what it did (0 for a read command,
/// the run's code for a command that hosts one, 6 for a paused run). See [`crate::stdout`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Exit {
    /// The command did what was asked.
    Ok = 0,
    /// Something failed that is not covered below (IO, a corrupt row, a store from a newer keel).
    Failure = 1,
    /// The command line was wrong (clap prints the usage).
    Usage = 2,
    /// The run or task named does not exist in the store.
    NotFound = 3,
    /// There is no keel home here: run `keel init` first.
    NoHome = 4,
    /// The run ended without a usable synthesis (failed, cancelled, over budget); for `keel
    /// follow-up`, the follow-up ended without a complete report.
    RunNotCompleted = 5,
    /// A signal paused the run; `keel resume RUN` continues it.
    Paused = 6,
}

/// An error on its way out, with the exit code it maps to.
pub(crate) struct Failed {
    pub(crate) exit: Exit,
    pub(crate) error: anyhow::Error,
}

impl From<HomeError> for Failed {
    fn from(e: HomeError) -> Self {
        let exit = match e {
            HomeError::Missing { .. } => Exit::NoHome,
            _ => Exit::Failure,
        };
        Failed {
            exit,
            error: e.into(),
        }
    }
}

impl From<config::ConfigError> for Failed {
    fn from(e: config::ConfigError) -> Self {
        Failed {
            exit: Exit::Failure,
            error: e.into(),
        }
    }
}

impl From<toml::ser::Error> for Failed {
    fn from(e: toml::ser::Error) -> Self {
        Failed {
            exit: Exit::Failure,
            error: e.into(),
        }
    }
}

impl From<keel_actors::context::ContextError> for Failed {
    fn from(e: keel_actors::context::ContextError) -> Self {
        use keel_actors::context::{ContextError, LoadError};
        let exit = match e {
            ContextError::Load(LoadError::TaskNotFound(_)) => Exit::NotFound,
            _ => Exit::Failure,
        };
        Failed {
            exit,
            error: e.into(),
        }
    }
}

impl From<ReadError> for Failed {
    fn from(e: ReadError) -> Self {
        let exit = match e {
            ReadError::NotFound { .. } => Exit::NotFound,
            _ => Exit::Failure,
        };
        Failed {
            exit,
            error: e.into(),
        }
    }
}

impl From<std::io::Error> for Failed {
    fn from(e: std::io::Error) -> Self {
        Failed {
            exit: Exit::Failure,
            error: e.into(),
        }
    }
}

impl From<serde_json::Error> for Failed {
    fn from(e: serde_json::Error) -> Self {
        Failed {
            exit: Exit::Failure,
            error: e.into(),
        }
    }
}

/// An error as a person reads it: its message, then each cause that adds something, joined by
/// ": ". Many error types of the workspace put their source's message in their own and also return
/// it as `source()` (`#[error("read failed: {0}")]` with `#[from]`); printing the whole chain as
/// anyhow's `{:#}` does would say that cause twice, so a cause whose message is already in the text
/// is left out.
pub(crate) fn sentence(error: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in error.chain() {
        let message = cause.to_string();
        if message.is_empty() || text.contains(&message) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&message);
    }
    text
}

pub(crate) fn ended(e: anyhow::Result<run::Ended>) -> Result<(), Failed> {
    match e {
        Ok(run::Ended::Completed) => Ok(()),
        Ok(run::Ended::NotCompleted) => Err(Failed {
            exit: Exit::RunNotCompleted,
            error: anyhow::anyhow!("the run did not complete"),
        }),
        Ok(run::Ended::Paused) => Err(Failed {
            exit: Exit::Paused,
            error: anyhow::anyhow!("the run is paused"),
        }),
        Err(error) => Err(Failed {
            exit: Exit::Failure,
            error,
        }),
    }
}

/// The exit of `keel follow-up`: as [`ended`], with the refusals that have their own codes.
pub(crate) fn followed(e: anyhow::Result<run::Ended>) -> Result<(), Failed> {
    use keel_actors::runtime::FollowUpError;
    match e {
        Ok(run::Ended::NotCompleted) => Err(Failed {
            exit: Exit::RunNotCompleted,
            error: anyhow::anyhow!("the follow-up did not complete"),
        }),
        Err(error) => {
            let exit = if let Some(r) = error.downcast_ref::<FollowUpError>() {
                match r {
                    FollowUpError::UnknownTask(_) => Exit::NotFound,
                    FollowUpError::UnknownAgent { .. }
                    | FollowUpError::EmptyMessage
                    | FollowUpError::MessageTooLarge { .. } => Exit::Usage,
                    _ => Exit::Failure,
                }
            } else if let Some(ReadError::NotFound { .. }) = error.downcast_ref::<ReadError>() {
                Exit::NotFound
            } else if let Some(HomeError::Missing { .. }) = error.downcast_ref::<HomeError>() {
                Exit::NoHome
            } else {
                Exit::Failure
            };
            Err(Failed { exit, error })
        }
        other => ended(other),
    }
}

/// The exit of `keel status`: not found (3) for an unknown run or a store without runs, no home
/// (4), failure (1) otherwise.
pub(crate) fn status(e: anyhow::Result<()>) -> Result<(), Failed> {
    e.map_err(|error| {
        let exit = if error.downcast_ref::<run::summary::NoRuns>().is_some() {
            Exit::NotFound
        } else if let Some(ReadError::NotFound { .. }) = error.downcast_ref::<ReadError>() {
            Exit::NotFound
        } else if let Some(HomeError::Missing { .. }) = error.downcast_ref::<HomeError>() {
            Exit::NoHome
        } else {
            Exit::Failure
        };
        Failed { exit, error }
    })
}

pub(crate) fn failure(e: anyhow::Result<()>) -> Result<(), Failed> {
    e.map_err(|error| Failed {
        exit: Exit::Failure,
        error,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cause named in its wrapper's message and also returned as its source, as `HostError` and
    /// keel-store's errors do.
    #[derive(Debug, thiserror::Error)]
    enum Wrapper {
        #[error("read failed: {0}")]
        Read(#[from] Inner),
    }

    #[derive(Debug, thiserror::Error)]
    #[error("the store file x.redb is corrupt: bad page")]
    struct Inner;

    #[test]
    fn a_cause_already_in_the_message_is_said_once() {
        let e = anyhow::Error::from(Wrapper::Read(Inner)).context("reading run 1");
        assert_eq!(
            sentence(&e),
            "reading run 1: read failed: the store file x.redb is corrupt: bad page"
        );
    }

    #[test]
    fn a_cause_not_in_the_message_is_added() {
        let e = anyhow::Error::from(Inner).context("reading run 1");
        assert_eq!(
            sentence(&e),
            "reading run 1: the store file x.redb is corrupt: bad page"
        );
    }
}
