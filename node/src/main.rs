//! `keel`: the command line. It opens the store in a keel home (`./.keel` by default) and reads it; later
//! commands run orchestrated jobs on it.
//!
//! Exit codes mean something so scripts can branch on them: see [`Exit`](exit::Exit).

mod cli;
mod config;
mod context;
mod dispatch;
mod doctor;
mod escalations;
mod exit;
mod home;
mod hook;
mod node_cmd;
mod outcome;
mod private;
mod read;
mod redact;
mod remote;
mod render;
mod run;
mod serve;
mod shell;
mod status;
mod stdout;
mod store_file;

use std::process::ExitCode;

use clap::Parser;

use crate::cli::Cli;
use crate::exit::Exit;

/// mimalloc rather than glibc's malloc: actor messages, rows and redb's page buffers are allocated on
/// one thread and freed on another by the thousand per run, and glibc's allocator (its arenas,
/// consolidation and heap trimming) was about a quarter of `keel bench`'s CPU (docs/PERFORMANCE.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // A pre-tool gate runs `keel hook --url URL` once per tool call: that path needs none of what
    // follows (the secret patterns, the command line parser), only the few bytes it forwards.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == "hook")
        && let Some(url) = hook::gate_url(&args[2..])
    {
        return hook::run(url);
    }
    if args.get(1).is_some_and(|a| a == "hook")
        && let Some((url, harness)) = hook::post_args(&args[2..])
    {
        return hook::run_post(url, harness);
    }
    quiet_storage_panics();
    // Before anything else: a build whose secret patterns do not compile must not run (issue 16).
    if let Err(e) = redact::init() {
        eprintln!("keel: {e}");
        return ExitCode::from(Exit::Failure as u8);
    }
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() {
                Exit::Usage
            } else {
                Exit::Ok
            };
            // clap formats help, version and usage errors itself.
            let _ = e.print();
            return ExitCode::from(code as u8);
        }
    };
    if let cli::Command::Hook {
        url,
        post_for,
        event_for,
        report_for,
    } = &cli.command
    {
        let kind_of = |harness: &String| {
            let kind = keel_harness::HarnessKind::parse(harness);
            if kind.is_none() {
                eprintln!("keel hook: unknown harness {harness}");
            }
            kind
        };
        return match (url, post_for, event_for) {
            (Some(url), Some(harness), _) => match kind_of(harness) {
                Some(kind) => hook::run_post(url, kind),
                None => ExitCode::from(Exit::Usage as u8),
            },
            // A session event's failure is a veto (exit 2), which Usage (2) is too.
            (Some(url), None, Some(harness)) => match kind_of(harness) {
                Some(kind) => hook::run_event(url, kind),
                None => ExitCode::from(Exit::Usage as u8),
            },
            (Some(url), None, None) => hook::run(url),
            (None, _, _) => hook::stop::run(report_for),
        };
    }
    match dispatch::run(cli) {
        Ok(()) => ExitCode::from(Exit::Ok as u8),
        Err(e) => {
            eprintln!("keel: {}", redact::text(&exit::sentence(&e.error)));
            ExitCode::from(e.exit as u8)
        }
    }
}

/// redb panics on some damaged pages; keel-store catches those panics at its boundary and answers a
/// typed corruption error naming the file, which `keel` prints. The default panic hook would print
/// the panic and a stack trace first, as if keel had crashed: this hook leaves those panics out and
/// passes every other panic on to the default hook.
fn quiet_storage_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if !keel_store::is_storage_panic(info) {
            default(info);
        }
    }));
}
