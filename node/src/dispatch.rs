//! Dispatch: each parsed command to the code that carries it out, with its errors mapped to exit codes.

use crate::cli::{Cli, Command};
use crate::exit::{Exit, Failed, ended, failure, followed};
use crate::home::Home;
use crate::read::Read;
use crate::{context, node_cmd, remote, render, run, serve, store_file};

/// Carries out one parsed command line.
pub(crate) fn run(cli: Cli) -> Result<(), Failed> {
    let home = Home::locate(cli.home)?;
    let out = render::Output::new(cli.json);
    let cli_remote = RemoteFlags {
        server: cli.server,
        token_file: cli.token_file,
    };
    match cli.command {
        Command::Init => {
            let created = home.init()?;
            out.init(&home, &home.store_path()?, created)?;
        }
        Command::Config => {
            let config = home.config()?;
            out.config(&home, &config)?;
            // On stderr, so `keel config --json` stays one JSON value.
            for looser in crate::private::looser_than_private(home.dir(), &home.store_path()?) {
                eprintln!("keel: warning: {looser}");
            }
        }
        Command::Doctor => crate::doctor::doctor(&home, cli.json)?,
        Command::Runs { limit, before } => {
            read(&home, &cli_remote, &out, Read::Runs { limit, before })?
        }
        Command::Tasks { run, limit } => {
            read(&home, &cli_remote, &out, Read::Tasks { run, limit })?
        }
        Command::Show { task } => read(&home, &cli_remote, &out, Read::Show { task })?,
        Command::Logs { task, tail } => read(&home, &cli_remote, &out, Read::Logs { task, tail })?,
        Command::Audit { run, limit } => {
            let store = home.open_existing()?;
            let catalog = store.catalog();
            let run = match run {
                Some(run) => catalog.run(run)?.id,
                None => {
                    catalog
                        .latest_run()?
                        .ok_or_else(|| Failed {
                            exit: Exit::NotFound,
                            error: run::summary::NoRuns.into(),
                        })?
                        .id
                }
            };
            out.audit(run, &catalog.audit(run, 0, limit)?)?;
        }
        // Handled in main before the home is located: a gate must answer even without a home.
        Command::Hook { .. } => {}
        Command::Context { task, resume } => {
            let store = home.open_existing()?;
            let caps = home.config()?.context.context_config();
            out.context(&context::build(&store, task, resume, &caps)?)?;
        }
        Command::Tree { run, limit } => read(&home, &cli_remote, &out, Read::Tree { run, limit })?,
        Command::Run {
            brief,
            plan,
            harness,
            quiet,
            detach,
        } => {
            let args = run::RunArgs {
                brief,
                plan,
                choice: harness.choice(),
                quiet,
                detach,
                log_format: cli.log_format,
            };
            match cli_remote.hosting(&home)? {
                Some(server) => remote::ended(remote::run(&server, args, cli.json), false)?,
                None => {
                    // Before anything starts: a missing harness or credential exits 2 naming the fix.
                    crate::doctor::preflight(&home, &args.choice)?;
                    ended(run::run(&home, args, cli.json))?
                }
            }
        }
        Command::Resume {
            run: id,
            harness,
            quiet,
        } => match cli_remote.hosting(&home)? {
            Some(server) => remote::ended(
                remote::resume(&server, id, &harness.choice(), quiet, cli.json),
                false,
            )?,
            None => ended(run::resume(
                &home,
                id,
                harness.choice(),
                quiet,
                cli.log_format,
                cli.json,
            ))?,
        },
        Command::FollowUp {
            task,
            message,
            agent,
            backend,
            quiet,
            detach,
        } => {
            let args = run::follow_up::FollowUpArgs {
                task,
                message,
                agent,
                choice: backend.choice(None),
                quiet,
                detach,
                log_format: cli.log_format,
            };
            match cli_remote.hosting(&home)? {
                Some(server) => remote::ended(remote::follow_up(&server, args, cli.json), true)?,
                None => followed(run::follow_up::follow_up(&home, args, cli.json))?,
            }
        }
        Command::Cancel { run: id } => match cli_remote.hosting(&home)? {
            Some(server) => {
                remote::cancel(&server, id, cli.json).map_err(|e| remote::exit_of(e, false))?
            }
            None => failure(run::cancel(&home, id, cli.json))?,
        },
        Command::Escalations { run, all, limit } => match remote::target(
            &home,
            cli_remote.server.as_deref(),
            cli_remote.token_file.as_deref(),
            false,
        )
        .map_err(|e| remote::exit_of(e, false))?
        {
            Some(server) => remote::escalations(&server, run, all, limit, cli.json)
                .map_err(|e| remote::exit_of(e, false))?,
            None => failure(crate::escalations::print_list(
                &home.open_existing()?,
                run,
                all,
                limit,
                cli.json,
            ))?,
        },
        Command::Answer { escalation, text } => match cli_remote.hosting(&home)? {
            Some(server) => remote::answer(&server, escalation, &text, cli.json)
                .map_err(|e| remote::exit_of(e, true))?,
            None => crate::escalations::answer_local(&home, escalation, &text, cli.json)?,
        },
        Command::Status { run: id } => read(&home, &cli_remote, &out, Read::Status { run: id })?,
        Command::Serve { listen, harness } => failure(serve::serve(
            &home,
            serve::ServeArgs {
                listen,
                choice: harness.choice(),
                log_format: cli.log_format,
            },
            cli.json,
        ))?,
        Command::ModelServer {
            script,
            port,
            record_dir,
        } => failure(run::model_server(script, port, record_dir))?,
        Command::Store { action } => store_file::run(&home, action, &out)?,
        Command::Node {
            role,
            listen,
            join,
            cookie_file,
            name,
            capacity,
            lease_ms,
            tls_cert,
            tls_key,
            tls_ca,
            api,
            run: brief,
            plan,
            wait_workers,
            harness,
            quiet,
        } => {
            let args = node_cmd::NodeArgs {
                role,
                listen,
                join,
                cookie_file,
                name,
                capacity,
                lease_ms,
                tls: tls_cert
                    .zip(tls_key)
                    .zip(tls_ca)
                    .map(|((cert, key), ca)| keel_cluster::TlsFiles { cert, key, ca }),
                api,
                choice: harness.choice(),
                run: brief,
                plan,
                wait_workers,
                quiet,
                log_format: cli.log_format,
            };
            ended(node_cmd::node(&home, args, cli.json))?;
        }
        Command::Demo => failure(run::demo::demo(&home))?,
        Command::Completions { shell } => crate::shell::completions(shell)?,
        Command::Man => crate::shell::man()?,
        Command::Bench {
            hook_calls: Some(calls),
            ..
        } => failure(run::bench_hook::bench_hook(calls, cli.json))?,
        Command::Bench {
            scale_runs: Some(stored),
            scale_fan_out,
            scale_keep,
            ..
        } => failure(run::bench_scale::bench_scale(
            stored,
            scale_fan_out,
            scale_keep.as_deref(),
            cli.json,
        ))?,
        Command::Bench {
            fan_out,
            runs,
            in_flight,
            hook_calls: None,
            scale_runs: None,
            exclusive_store,
            ..
        } => failure(run::bench::bench(
            &fan_out,
            runs,
            in_flight,
            exclusive_store,
            cli.json,
        ))?,
    }
    Ok(())
}

/// `--server` and `--token-file`, as given.
struct RemoteFlags {
    server: Option<String>,
    token_file: Option<std::path::PathBuf>,
}

impl RemoteFlags {
    /// The server a command that hosts runs goes to: `--server`, else the server holding the
    /// home (its `server.json`), else none (the command hosts the run itself).
    fn hosting(&self, home: &Home) -> Result<Option<remote::client::Client>, Failed> {
        remote::target(
            home,
            self.server.as_deref(),
            self.token_file.as_deref(),
            true,
        )
        .map_err(|e| remote::exit_of(e, false))
    }
}

/// A read command: on the server `--server` names, else on the home's store opened read-only
/// (which works beside a server holding it).
fn read(
    home: &Home,
    flags: &RemoteFlags,
    out: &render::Output,
    command: Read,
) -> Result<(), Failed> {
    let server = remote::target(
        home,
        flags.server.as_deref(),
        flags.token_file.as_deref(),
        false,
    )
    .map_err(|e| remote::exit_of(e, false))?;
    match server {
        Some(server) => {
            remote::read(&server, command, out.json()).map_err(|e| remote::exit_of(e, false))
        }
        None => command.print(&home.open_existing()?, out),
    }
}
