//! Exit codes and the mapping of errors to them: every failure leaves `keel` as a [`Failed`] that carries
//! the code scripts branch on.

use keel_store::ReadError;

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

/// Any error becomes a [`Failed`] with the code [`exit_of`] finds in its chain, so `?` works on
/// every error a command meets.
impl<E: Into<anyhow::Error>> From<E> for Failed {
    fn from(e: E) -> Self {
        let error = e.into();
        Failed {
            exit: exit_of(&error),
            error,
        }
    }
}

/// The exit code of an error: that of the first cause in its chain with a code of its own (a
/// missing home, a run or task the store does not have, a refused follow-up), else
/// [`Exit::Failure`]. The chain is walked because the typed cause is often wrapped (a read of
/// the runtime's recovery, a `context` added on the way up).
fn exit_of(error: &anyhow::Error) -> Exit {
    use keel_actors::context::{ContextError, LoadError};
    use keel_actors::runtime::FollowUpError;
    for cause in error.chain() {
        let exit = if let Some(e) = cause.downcast_ref::<HomeError>() {
            matches!(e, HomeError::Missing { .. }).then_some(Exit::NoHome)
        } else if let Some(e) = cause.downcast_ref::<ReadError>() {
            matches!(e, ReadError::NotFound { .. }).then_some(Exit::NotFound)
        } else if let Some(e) = cause.downcast_ref::<ContextError>() {
            matches!(e, ContextError::Load(LoadError::TaskNotFound(_))).then_some(Exit::NotFound)
        } else if cause.downcast_ref::<run::summary::NoRuns>().is_some() {
            Some(Exit::NotFound)
        } else if let Some(e) = cause.downcast_ref::<run::CancelRefused>() {
            matches!(e, run::CancelRefused::Unknown(_)).then_some(Exit::NotFound)
        } else if let Some(e) = cause.downcast_ref::<keel_actors::runtime::CancelError>() {
            matches!(e, keel_actors::runtime::CancelError::UnknownTask(_)).then_some(Exit::NotFound)
        } else if let Some(e) = cause.downcast_ref::<FollowUpError>() {
            match e {
                FollowUpError::UnknownTask(_) => Some(Exit::NotFound),
                FollowUpError::UnknownAgent { .. }
                | FollowUpError::EmptyMessage
                | FollowUpError::MessageTooLarge { .. } => Some(Exit::Usage),
                _ => None,
            }
        } else {
            None
        };
        if let Some(exit) = exit {
            return exit;
        }
    }
    Exit::Failure
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

/// The exit of a command that hosts a run: 0 when it completed, 5 when it ended without
/// completing, 6 when a signal paused it; an error maps as [`exit_of`] says.
pub(crate) fn ended(e: anyhow::Result<run::Ended>) -> Result<(), Failed> {
    ended_as(e, "run")
}

/// The exit of `keel follow-up`: as [`ended`] (its refusals have their codes in [`exit_of`]).
pub(crate) fn followed(e: anyhow::Result<run::Ended>) -> Result<(), Failed> {
    ended_as(e, "follow-up")
}

/// The exit of a command that does not host a run: 0, or the code [`exit_of`] finds.
pub(crate) fn failure(e: anyhow::Result<()>) -> Result<(), Failed> {
    e.map_err(Failed::from)
}

fn ended_as(e: anyhow::Result<run::Ended>, what: &str) -> Result<(), Failed> {
    match e? {
        run::Ended::Completed => Ok(()),
        run::Ended::NotCompleted => Err(Failed {
            exit: Exit::RunNotCompleted,
            error: anyhow::anyhow!("the {what} did not complete"),
        }),
        run::Ended::Paused => Err(Failed {
            exit: Exit::Paused,
            error: anyhow::anyhow!("the {what} is paused"),
        }),
    }
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
