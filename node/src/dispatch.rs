//! Dispatch: each parsed command to the code that carries it out, with its errors mapped to exit codes.

use keel_store::Store;

use crate::cli::{Cli, Command};
use crate::exit::{self, Exit, Failed, ended, failure, followed};
use crate::home::Home;
use crate::{context, render, run, store_file};

/// Carries out one parsed command line.
pub(crate) fn run(cli: Cli) -> Result<(), Failed> {
    let home = Home::locate(cli.home)?;
    let out = render::Output::new(cli.json);
    match cli.command {
        Command::Init => {
            let created = home.init()?;
            out.init(&home, &home.store_path()?, created)?;
        }
        Command::Config => {
            let config = home.config()?;
            out.config(&home, &config)?;
        }
        Command::Runs { limit } => {
            let store = home.open_existing()?;
            out.runs(&store.catalog().runs(limit)?)?;
        }
        Command::Tasks { run, limit } => {
            let store = home.open_existing()?;
            out.tasks(&store.catalog().tasks(run, limit)?)?;
        }
        Command::Show { task } => {
            let store = home.open_existing()?;
            let task = store.catalog().task(task)?;
            let children = store.catalog().children(task.id, 200)?;
            out.show(&task, &children)?;
        }
        Command::Logs { task, tail } => {
            let store: Store = home.open_existing()?;
            out.logs(task, &store.catalog().session_log(task, tail)?)?;
        }
        Command::Context { task, resume } => {
            let store = home.open_existing()?;
            out.context(&context::build(&store, task, resume)?)?;
        }
        Command::Tree { run, limit } => {
            let store = home.open_existing()?;
            let catalog = store.catalog();
            let header = match run {
                Some(run) => catalog.run(run)?,
                None => catalog.latest_run()?.ok_or_else(|| Failed {
                    exit: Exit::NotFound,
                    error: run::summary::NoRuns.into(),
                })?,
            };
            let run = header.id;
            out.tree(&header, &catalog.tree(run, limit)?)?;
        }
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
            ended(run::run(&home, args, cli.json))?;
        }
        Command::Resume {
            run: id,
            harness,
            quiet,
        } => ended(run::resume(
            &home,
            id,
            harness.choice(),
            quiet,
            cli.log_format,
            cli.json,
        ))?,
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
            followed(run::follow_up::follow_up(&home, args, cli.json))?;
        }
        Command::Cancel { run: id } => failure(run::cancel(&home, id, cli.json))?,
        Command::Status { run: id } => exit::status(run::summary::status(&home, id, cli.json))?,
        Command::ModelServer {
            script,
            port,
            record_dir,
        } => failure(run::model_server(script, port, record_dir))?,
        Command::Store { action } => store_file::run(&home, action, &out)?,
        Command::Demo => failure(run::demo::demo(&home))?,
        Command::Bench {
            fan_out,
            runs,
            in_flight,
        } => failure(run::bench::bench(&fan_out, runs, in_flight, cli.json))?,
    }
    Ok(())
}
