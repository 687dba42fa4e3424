//! Dispatch: each parsed command to the code that carries it out, with its errors mapped to exit codes.

use std::time::{Duration, Instant};

use crate::cli::{Cli, Command};
use crate::exit::{Failed, ended, failure, followed};
use crate::home::{Home, HomeError};
use crate::read::Read;
use crate::remote::client::ClientError;
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
            read(&home, &cli_remote, &out, Read::Audit { run, limit })?
        }
        // Handled in main before the home is located: a gate must answer even without a home.
        Command::Hook { .. } => {}
        Command::Context { task, resume } => match reader(&home, &cli_remote)? {
            Reader::Local(store) => {
                let caps = home.config()?.context.context_config();
                context::print(&store, task, resume, &caps, &out)?
            }
            Reader::Served(server) => server
                .answer(|client| remote::context(client, task, resume, cli.json))
                .map_err(|e| remote::exit_of(e, false))?,
        },
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
        Command::Escalations { run, all, limit } => match reader(&home, &cli_remote)? {
            Reader::Served(server) => server
                .answer(|client| remote::escalations(client, run, all, limit, cli.json))
                .map_err(|e| remote::exit_of(e, false))?,
            Reader::Local(store) => failure(crate::escalations::print_list(
                &store, run, all, limit, cli.json,
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
            share_store,
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
                share_store,
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

/// Where a command that reads the home's store is answered.
enum Reader {
    /// The store, opened here (read-only beside a `keel run` or `keel node` that shares it).
    Local(keel_store::Store),
    /// A server: the one `--server` names, or the `keel serve` that holds the home alone.
    Served(Served),
}

/// A server a read goes to, and why when it was not named.
struct Served {
    client: remote::client::Client,
    /// The error that sent the read to the server the home announces (not set under
    /// `--server`): said with the server's failure, so the operator sees why it was asked.
    held: Option<String>,
}

impl Served {
    /// `ask` on the server; a failure names why the server was asked.
    fn answer(
        &self,
        ask: impl FnOnce(&remote::client::Client) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        let asked = ask(&self.client);
        match &self.held {
            // A "not found" is the server's answer (an unknown task, exit 3), said as the local
            // command says it; any other failure (a server that did not answer, a refused token,
            // a server error) is told with why the server was asked.
            Some(held) => asked.map_err(|e| {
                if e.downcast_ref::<ClientError>()
                    .and_then(ClientError::status)
                    .is_some_and(|s| s == reqwest::StatusCode::NOT_FOUND)
                {
                    e
                } else {
                    e.context(held.clone())
                }
            }),
            None => asked,
        }
    }
}

/// How long a read retries a store held with no server announced: the windows while a
/// `keel serve` starts (the store opened, `server.json` not yet written) or stops (`server.json`
/// removed, the store not yet released).
const HELD_RETRY_WAIT: Duration = Duration::from_secs(5);
/// How often it tries again.
const HELD_RETRY_EVERY: Duration = Duration::from_millis(100);

/// Where a read of the home's store goes: the server `--server` names; else the store opened
/// here; else, when a `keel serve` holds it alone (so that no other process can open it), that
/// server, as its `server.json` announces it. A store held with no server announced is tried
/// again for [`HELD_RETRY_WAIT`] (a server starting or stopping), then is the typed
/// [`HomeError::Held`], which says what to do. A `server.json` left by a killed server changes
/// nothing: its lock went with it, so the open here succeeds.
fn reader(home: &Home, flags: &RemoteFlags) -> Result<Reader, Failed> {
    let named = remote::target(
        home,
        flags.server.as_deref(),
        flags.token_file.as_deref(),
        false,
    )
    .map_err(|e| remote::exit_of(e, false))?;
    if let Some(client) = named {
        return Ok(Reader::Served(Served { client, held: None }));
    }
    let started = Instant::now();
    let opened = loop {
        match home.open_existing() {
            Err(HomeError::Held { server: None, .. }) if started.elapsed() < HELD_RETRY_WAIT => {
                std::thread::sleep(HELD_RETRY_EVERY);
            }
            other => break other,
        }
    };
    match opened {
        Ok(store) => Ok(Reader::Local(store)),
        Err(HomeError::Held {
            path,
            server: Some(server),
        }) => {
            let held = format!(
                "the store at {} is held by {server}, which has it alone; this read went to that server",
                path.display(),
            );
            let client = remote::home_server(home, &server.url, flags.token_file.as_deref())
                .map_err(|e| remote::exit_of(e.context(held.clone()), false))?;
            Ok(Reader::Served(Served {
                client,
                held: Some(held),
            }))
        }
        Err(e) => Err(e.into()),
    }
}

/// A read command (`runs`, `tasks`, `show`, `logs`, `tree`, `status`, `audit`): printed here, or
/// by the server [`reader`] chooses, which prints the same text with the same exit code.
fn read(
    home: &Home,
    flags: &RemoteFlags,
    out: &render::Output,
    command: Read,
) -> Result<(), Failed> {
    match reader(home, flags)? {
        Reader::Local(store) => command.print(&store, out),
        Reader::Served(server) => server
            .answer(|client| remote::read(client, command, out.json()))
            .map_err(|e| remote::exit_of(e, false)),
    }
}
