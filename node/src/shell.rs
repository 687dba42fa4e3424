//! `keel completions SHELL` and `keel man`: shell completions and the man page, generated from the
//! clap definitions of `cli.rs` (clap_complete, clap_mangen), so they list exactly the commands and
//! flags this `keel` has.

use std::io::Write as _;

use clap::CommandFactory;

use crate::cli::Cli;

/// Prints the completion script for `shell` (`keel completions bash > ~/.local/share/bash-completion/completions/keel`).
///
/// # Errors
/// A failed write to stdout.
pub(crate) fn completions(shell: clap_complete::Shell) -> std::io::Result<()> {
    let mut command = Cli::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "keel", &mut script);
    let mut out = crate::stdout::lock();
    out.write_all(&script)?;
    out.flush()
}

/// Prints keel's man page in roff (`keel man > keel.1; man ./keel.1`): the synopsis, the global
/// flags and every command with what it does (`keel COMMAND --help` has each command's flags).
///
/// # Errors
/// A failed write to stdout.
pub(crate) fn man() -> std::io::Result<()> {
    let mut page = Vec::new();
    clap_mangen::Man::new(Cli::command()).render(&mut page)?;
    let mut out = crate::stdout::lock();
    out.write_all(&page)?;
    out.flush()
}
