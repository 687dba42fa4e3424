//! `keel`: the command line. It opens the store in a keel home (`./.keel` by default) and reads it; later
//! commands run orchestrated jobs on it.
//!
//! Exit codes mean something so scripts can branch on them: see [`Exit`].

mod config;
mod context;
mod home;
mod render;
mod run;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use keel_store::{ReadError, RunId, Store, TaskId};

use crate::home::{Home, HomeError};

/// Exit codes of `keel`. Stable: scripts depend on them.
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

/// keel: an orchestrator for coding-agent harnesses whose conversations live in its own store.
#[derive(Parser, Debug)]
#[command(name = "keel", version, about, long_about = None)]
struct Cli {
    /// The keel home (a folder with `keel.toml` and the store). Defaults to `$KEEL_HOME`, else `./.keel`.
    #[arg(long, global = true, value_name = "DIR")]
    home: Option<PathBuf>,

    /// Print machine-readable JSON instead of tables.
    #[arg(long, global = true)]
    json: bool,

    /// The format of log lines on stderr (over `[log] format` of keel.toml): `human`, or `json` for
    /// one JSON object a line with the run and task spans.
    #[arg(long, global = true, value_name = "FORMAT")]
    log_format: Option<config::LogFormat>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Create a keel home (`./.keel/` by default) with an empty store and a commented keel.toml.
    Init,
    /// Check keel.toml and print the configuration keel would use (defaults filled in).
    Config,
    /// List runs, oldest first.
    Runs {
        /// Show at most this many.
        #[arg(long, default_value_t = 200)]
        limit: u32,
    },
    /// List tasks, of one run or of all runs.
    Tasks {
        /// Only the tasks of this run.
        #[arg(long, value_name = "RUN")]
        run: Option<RunId>,
        /// Show at most this many.
        #[arg(long, default_value_t = 500)]
        limit: u32,
    },
    /// Show every field of one task.
    Show {
        /// The task id (a ULID, as `keel tasks` prints it).
        task: TaskId,
    },
    /// Print a task's session log, oldest row first.
    Logs {
        /// The task id.
        task: TaskId,
        /// Only the last N rows.
        #[arg(long, default_value_t = 200)]
        tail: u32,
    },
    /// Print exactly the first message a new session of a task would get: its preamble (placed into the
    /// prompt), the preamble's size against its cap, and what was truncated or redacted.
    Context {
        /// The task id.
        task: TaskId,
        /// Build the resume variant (the original brief plus the task's own recent log), as a session
        /// restarted after an interruption would get. Without it, keel picks what the task's next
        /// session would get: a resume for a paused or re-dispatched task, a standard preamble otherwise.
        #[arg(long)]
        resume: bool,
    },
    /// Print a run's task tree.
    Tree {
        /// The run id.
        run: RunId,
        /// Read at most this many tasks.
        #[arg(long, default_value_t = 2000)]
        limit: u32,
    },
    /// Run one orchestrated job on this home's store (created on first use).
    Run {
        /// The brief.
        brief: String,
        /// A plan file (JSON, or TOML with a .toml extension) instead of the built-in decomposition.
        #[arg(long, value_name = "FILE")]
        plan: Option<PathBuf>,
        #[command(flatten)]
        harness: HarnessArgs,
        /// Print only the summary.
        #[arg(long)]
        quiet: bool,
        /// Run in the background: print the run id and return (output goes to a log in the home).
        #[arg(long)]
        detach: bool,
    },
    /// Continue a paused or interrupted run from its checkpoint.
    Resume {
        /// The run id.
        run: RunId,
        #[command(flatten)]
        harness: HarnessArgs,
        /// Print only the summary.
        #[arg(long)]
        quiet: bool,
    },
    /// Ask a follow-up on a task's thread: a new task (kind FollowUp, its parent the thread's newest
    /// task) served with keel's preamble of the parent's brief and outcome, never a native resume.
    /// A finished run is reopened for it and ends again when it is done.
    #[command(name = "follow-up")]
    FollowUp {
        /// The task id (a ULID, as `keel tasks` prints it).
        task: TaskId,
        /// The message.
        message: String,
        /// The agent profile to put it on (any harness); the supervisor picks when left out.
        #[arg(long, value_name = "NAME")]
        agent: Option<String>,
        #[command(flatten)]
        backend: BackendArgs,
        /// Print only the summary.
        #[arg(long)]
        quiet: bool,
        /// Run in the background: print the run and task ids and return.
        #[arg(long)]
        detach: bool,
    },
    /// Cancel a run (through the process running it, if one is).
    Cancel {
        /// The run id.
        run: RunId,
    },
    /// Show open runs, or one run's state.
    Status {
        /// The run id.
        run: Option<RunId>,
    },
    /// Serve the scripted model on 127.0.0.1 (for harness CLIs and `--model-server`).
    ModelServer {
        /// A script (JSON or TOML); without one the model answers by its prompt rules.
        #[arg(long, value_name = "FILE")]
        script: Option<PathBuf>,
        /// The port (0 picks a free one; the address is printed).
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// Write every request there as a JSON file.
        #[arg(long, value_name = "DIR")]
        record_dir: Option<PathBuf>,
    },
    /// A narrated scenario: a worker crash, recovery from the checkpoint, a harness switch.
    Demo,
    /// Measure the orchestration path with an instant harness on a temporary store.
    Bench {
        /// Specialists per run, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "1,4,16,64")]
        fan_out: Vec<u32>,
        /// Runs per measurement.
        #[arg(long, default_value_t = 50)]
        runs: u32,
        /// Runs in flight for the concurrent measurement.
        #[arg(long, default_value_t = 8)]
        in_flight: u32,
    },
}

/// Which agents and harnesses a run uses.
#[derive(clap::Args, Debug, Clone)]
struct HarnessArgs {
    /// Only this agent profile of keel.toml.
    #[arg(long, value_name = "NAME")]
    agent: Option<String>,
    #[command(flatten)]
    backend: BackendArgs,
}

/// Where the node's sessions run, shared by every command that hosts runs (`--agent` means a
/// different thing on each, so it is not here).
#[derive(clap::Args, Debug, Clone)]
struct BackendArgs {
    /// Run every task on this harness (claude-code, codex, opencode, pi, messages-api, scripted).
    #[arg(long, value_name = "KIND", value_parser = parse_harness)]
    harness: Option<keel_harness::HarnessKind>,
    /// The model for `--harness`.
    #[arg(long, value_name = "NAME")]
    model: Option<String>,
    /// Use the scripted model served at this URL (`keel model-server`) instead of a built-in one.
    #[arg(long, value_name = "URL")]
    model_server: Option<String>,
}

fn parse_harness(name: &str) -> Result<keel_harness::HarnessKind, String> {
    keel_harness::HarnessKind::parse(name).ok_or_else(|| {
        format!(
            "unknown harness {name:?}: claude-code, codex, opencode, pi, messages-api or scripted"
        )
    })
}

impl HarnessArgs {
    fn choice(self) -> run::setup::HarnessChoice {
        self.backend.choice(self.agent)
    }
}

impl BackendArgs {
    fn choice(self, agent: Option<String>) -> run::setup::HarnessChoice {
        run::setup::HarnessChoice {
            agent,
            harness: self.harness,
            model: self.model,
            model_server: self.model_server,
        }
    }
}

fn ended(e: anyhow::Result<run::Ended>) -> Result<(), Failed> {
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
fn followed(e: anyhow::Result<run::Ended>) -> Result<(), Failed> {
    use keel_actors::runtime::RuntimeError;
    match e {
        Ok(run::Ended::NotCompleted) => Err(Failed {
            exit: Exit::RunNotCompleted,
            error: anyhow::anyhow!("the follow-up did not complete"),
        }),
        Err(error) => {
            let exit = if let Some(r) = error.downcast_ref::<RuntimeError>() {
                match r {
                    RuntimeError::UnknownTask(_) => Exit::NotFound,
                    RuntimeError::UnknownAgent { .. }
                    | RuntimeError::EmptyMessage
                    | RuntimeError::MessageTooLarge { .. } => Exit::Usage,
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

fn failure(e: anyhow::Result<()>) -> Result<(), Failed> {
    e.map_err(|error| Failed {
        exit: Exit::Failure,
        error,
    })
}

fn main() -> ExitCode {
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
    match run(cli) {
        Ok(()) => ExitCode::from(Exit::Ok as u8),
        Err(e) => {
            eprintln!("keel: {:#}", e.error);
            ExitCode::from(e.exit as u8)
        }
    }
}

/// An error on its way out, with the exit code it maps to.
struct Failed {
    exit: Exit,
    error: anyhow::Error,
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

fn run(cli: Cli) -> Result<(), Failed> {
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
            let header = catalog.run(run)?;
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
        Command::Status { run: id } => failure(run::summary::status(&home, id, cli.json))?,
        Command::ModelServer {
            script,
            port,
            record_dir,
        } => failure(run::model_server(script, port, record_dir))?,
        Command::Demo => failure(run::demo::demo(&home))?,
        Command::Bench {
            fan_out,
            runs,
            in_flight,
        } => failure(run::bench::bench(&fan_out, runs, in_flight, cli.json))?,
    }
    Ok(())
}
