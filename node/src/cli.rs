//! The command line's grammar: the clap types of every `keel` command and its flags, and how the
//! harness flags become a [`HarnessChoice`](crate::run::setup::HarnessChoice).

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use keel_store::{RunId, TaskId};

use crate::{config, run};

/// keel: an orchestrator for coding-agent harnesses whose conversations live in its own store.
#[derive(Parser, Debug)]
#[command(name = "keel", version, about, long_about = None)]
pub(crate) struct Cli {
    /// The keel home (a folder with `keel.toml` and the store). Defaults to `$KEEL_HOME`, else `./.keel`.
    #[arg(long, global = true, value_name = "DIR")]
    pub(crate) home: Option<PathBuf>,

    /// Print machine-readable JSON instead of tables.
    #[arg(long, global = true)]
    pub(crate) json: bool,

    /// The format of log lines on stderr (over `[log] format` of keel.toml): `human`, or `json` for
    /// one JSON object a line with the run and task spans.
    #[arg(long, global = true, value_name = "FORMAT")]
    pub(crate) log_format: Option<config::LogFormat>,

    /// Talk to the keel server at this URL (`keel serve`) instead of this home's store: `run`,
    /// `resume`, `follow-up`, `cancel`, `answer`, `status`, `tree`, `logs`, `runs`, `tasks`,
    /// `show`, `audit`, `context`, `escalations`.
    #[arg(long, global = true, value_name = "URL")]
    pub(crate) server: Option<String>,

    /// The file holding the server's bearer token (else `$KEEL_API_TOKEN`, else
    /// `$KEEL_API_TOKEN_FILE`, else the token file named in this home's keel.toml; for the server this
    /// home announces, that token file before the environment).
    #[arg(long, global = true, value_name = "FILE")]
    pub(crate) token_file: Option<PathBuf>,

    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Create a keel home (`./.keel/` by default) with an empty store and a commented keel.toml.
    Init,
    /// Check keel.toml and print the configuration keel would use (defaults filled in).
    Config,
    /// Check what runs need: each configured harness's binary at its pinned version, credentials,
    /// keel.toml, the store (integrity, size, free disk) and the home's permissions, with what to
    /// do about each problem (exit 1 when there is one).
    Doctor,
    /// List runs, newest first, a page at a time, saying how many older runs are not shown.
    Runs {
        /// Show at most this many.
        #[arg(long, default_value_t = crate::read::RUNS_LIMIT_DEFAULT)]
        limit: u32,
        /// Only runs older than this one (the last run of the page before): the next page.
        #[arg(long, value_name = "RUN")]
        before: Option<RunId>,
    },
    /// List tasks, of one run or of all runs.
    Tasks {
        /// Only the tasks of this run.
        #[arg(long, value_name = "RUN")]
        run: Option<RunId>,
        /// Show at most this many.
        #[arg(long, default_value_t = crate::read::TASKS_LIMIT_DEFAULT)]
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
        #[arg(long, default_value_t = crate::read::LOGS_TAIL_DEFAULT)]
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
    /// Print a run's task tree (the latest run's when no run is named).
    Tree {
        /// The run id; the latest run when left out.
        run: Option<RunId>,
        /// Read at most this many tasks.
        #[arg(long, default_value_t = crate::read::TREE_LIMIT_DEFAULT)]
        limit: u32,
    },
    /// Print a run's audit rows: every hook and permission decision on its tool calls (the latest
    /// run's when no run is named).
    Audit {
        /// The run id; the latest run when left out.
        run: Option<RunId>,
        /// Show at most this many rows.
        #[arg(long, default_value_t = crate::read::AUDIT_LIMIT_DEFAULT)]
        limit: u32,
    },
    /// The hook bridge a session's pre-tool gate runs: forwards the tool call on stdin to the node
    /// that started the session and exits 0 (allow) or 2 (deny, reason on stderr). Not for humans.
    #[command(hide = true)]
    Hook {
        /// The node's hook endpoint (a pre-tool gate).
        #[arg(
            long,
            required_unless_present = "report_for",
            conflicts_with = "report_for"
        )]
        url: Option<String>,
        /// Run as this CLI's PostToolUse hook (`claude-code`, `codex`, `opencode`, `pi`): hand the
        /// node the call's result and print the CLI's answer when the model is to see another.
        #[arg(long = "post-for", value_name = "HARNESS", requires = "url")]
        post_for: Option<String>,
        /// Run as this CLI's session-event hook (`PreCompact`; `claude-code`, `codex`): the node
        /// runs the event's hooks; a veto blocks the event, a note is carried into it.
        #[arg(
            long = "event-for",
            value_name = "HARNESS",
            requires = "url",
            conflicts_with = "post_for"
        )]
        event_for: Option<String>,
        /// Run as a CLI's Stop hook instead: the task ids the session's report may name (its own
        /// first); a last message that is not a valid report is sent back once with the error.
        #[arg(long = "report-for", value_name = "TASK")]
        report_for: Vec<String>,
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
    /// Cancel a run, or one task's step (a follow-up), through the process running it if one is.
    /// A run or task that has ended is refused; a run reopened for follow-ups keeps its outcome
    /// (only its follow-ups end).
    Cancel {
        /// The run id, or a task id (its step is cancelled; the run goes on).
        run: RunId,
    },
    /// List escalations waiting for a human (of one run, or of every run), each with what was
    /// asked, what was tried, why it stopped and a recommended action.
    Escalations {
        /// The run id; every run when left out.
        run: Option<RunId>,
        /// Answered and expired ones too.
        #[arg(long)]
        all: bool,
        /// Show at most this many.
        #[arg(long, default_value_t = 100)]
        limit: u32,
    },
    /// Answer an escalation: a paused task resumes with the answer in its preamble, a tool call
    /// waiting for an approval runs (`allow`) or is denied (`deny`).
    Answer {
        /// The escalation id (from `keel escalations`).
        escalation: keel_store::EscalationId,
        /// The answer (one of the escalation's options, when it has some).
        text: String,
    },
    /// Show one run's state (the latest run's when no run is named) and which other runs are open.
    Status {
        /// The run id; the latest run when left out.
        run: Option<RunId>,
    },
    /// Host runs on this home and answer the HTTP API (docs/API.md) until SIGINT or SIGTERM. It
    /// opens the store alone (one fsync a commit): local `keel run`, `resume`, `follow-up`,
    /// `cancel`, `answer` and the read commands on this home then go to it.
    Serve {
        /// The address to bind (over `[server] listen`; port 0 picks a free one).
        #[arg(long, value_name = "ADDR")]
        listen: Option<std::net::SocketAddr>,
        #[command(flatten)]
        harness: HarnessArgs,
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
    /// Run this process as a node of a keel cluster (coordinator, worker, or both) over
    /// ractor_cluster; flags override `[node]` of keel.toml (docs/OPERATIONS.md).
    Node {
        /// coordinator (owns the store and the runs), worker (stateless, hosts specialists), or all.
        #[arg(long, value_enum)]
        role: Option<crate::node_cmd::NodeRole>,
        /// The address the cluster port binds, IP:PORT (port 0 picks a free one).
        #[arg(long, value_name = "ADDR")]
        listen: Option<std::net::SocketAddr>,
        /// The coordinator node's cluster address (workers).
        #[arg(long, value_name = "ADDR")]
        join: Option<std::net::SocketAddr>,
        /// The file holding the cluster cookie; refused if group or others may read it.
        #[arg(long, value_name = "PATH")]
        cookie_file: Option<PathBuf>,
        /// This node's name in the cluster.
        #[arg(long, value_name = "NAME")]
        name: Option<String>,
        /// Most specialists a worker hosts at once (default 8).
        #[arg(long, value_name = "N")]
        capacity: Option<u32>,
        /// How long a worker's heartbeat keeps it alive at the coordinator, in ms (default 5000).
        #[arg(long, value_name = "MS")]
        lease_ms: Option<u32>,
        /// This node's TLS certificate chain (PEM): with --tls-key and --tls-ca, sessions between
        /// nodes use mutual TLS.
        #[arg(long, value_name = "PATH", requires_all = ["tls_key", "tls_ca"])]
        tls_cert: Option<PathBuf>,
        /// This node's TLS private key (PEM, mode 600 or stricter).
        #[arg(long, value_name = "PATH", requires_all = ["tls_cert", "tls_ca"])]
        tls_key: Option<PathBuf>,
        /// The CA certificates (PEM) that sign the cluster's nodes' certificates.
        #[arg(long, value_name = "PATH", requires_all = ["tls_cert", "tls_key"])]
        tls_ca: Option<PathBuf>,
        /// Coordinator: the address the HTTP API binds, IP:PORT (default `[server] listen`;
        /// port 0 picks a free one). Not served with `--run`.
        #[arg(long, value_name = "ADDR", conflicts_with = "run")]
        api: Option<std::net::SocketAddr>,
        /// Coordinator daemon: let other processes open this home's store file while it runs
        /// (each commit then syncs twice instead of once). Without it the daemon holds the store
        /// alone, as `keel serve` does, and this home's read commands go through its API.
        #[arg(long, conflicts_with = "run")]
        share_store: bool,
        /// Coordinator: submit this brief once `--wait-workers` workers joined, print the run's
        /// summary and exit with its code.
        #[arg(long, value_name = "BRIEF")]
        run: Option<String>,
        /// A plan file for `--run`.
        #[arg(long, value_name = "FILE", requires = "run")]
        plan: Option<PathBuf>,
        /// Workers to wait for before `--run` submits.
        #[arg(long, value_name = "N", default_value_t = 1, requires = "run")]
        wait_workers: u32,
        #[command(flatten)]
        harness: HarnessArgs,
        /// Print only the summary of `--run`.
        #[arg(long)]
        quiet: bool,
    },
    /// A narrated scenario: a worker crash, recovery from the checkpoint, a harness switch.
    Demo,
    /// Print the shell completion script (bash, zsh, fish, elvish, powershell), e.g.
    /// `keel completions bash > ~/.local/share/bash-completion/completions/keel`.
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Print keel's man page (roff), generated from these definitions: `keel man > keel.1`.
    Man,
    /// Look after the store file: check it, back it up, compact it.
    Store {
        #[command(subcommand)]
        action: StoreAction,
    },
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
        /// Measure the `keel hook` bridge's round trip instead: this many pre-tool gate calls of
        /// one session, each through a `keel hook` process, the node's policy and a durable audit
        /// row.
        #[arg(long, value_name = "N")]
        hook_calls: Option<u32>,
        /// Measure keel at scale instead: a home with this many stored runs, one run of
        /// `--scale-fan-out` specialists, memory per in-flight run, a restart's recovery, and the
        /// `keel runs` and `keel tree` commands on that home.
        #[arg(long, value_name = "N", conflicts_with = "hook_calls")]
        scale_runs: Option<u32>,
        /// Specialists in the large run of `--scale-runs`.
        #[arg(long, value_name = "N", default_value_t = 1024)]
        scale_fan_out: u32,
        /// Build the home of `--scale-runs` in this new folder and keep it (for `keel --home DIR
        /// runs`, a profile, or another binary on the same store) instead of a temporary one.
        #[arg(long, value_name = "DIR", requires = "scale_runs")]
        scale_keep: Option<PathBuf>,
        /// Open the bench's store exclusive, as `keel serve` opens a home's store (redb commits in
        /// one phase: one fsync a commit), instead of shared with readers as `keel run` and `keel
        /// node` open it (two phases, two fsyncs): what sharing the file costs, measured by the
        /// same binary.
        #[arg(long, conflicts_with_all = ["hook_calls", "scale_runs"])]
        exclusive_store: bool,
    },
}

/// `keel store ...`: upkeep of the store file.
#[derive(Subcommand, Debug)]
pub(crate) enum StoreAction {
    /// Run redb's integrity check over every page (needs the store alone: no keel process running
    /// on this home).
    Check,
    /// Write a consistent copy of the store to a new file (works while a node runs).
    Backup {
        /// The backup file to create; an existing file is never overwritten.
        path: PathBuf,
    },
    /// Release the free space inside the file (needs the store alone).
    Compact,
}

/// Which agents and harnesses a run uses.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct HarnessArgs {
    /// Only this agent profile of keel.toml.
    #[arg(long, value_name = "NAME")]
    agent: Option<String>,
    #[command(flatten)]
    backend: BackendArgs,
}

/// Where the node's sessions run, shared by every command that hosts runs (`--agent` means a
/// different thing on each, so it is not here).
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct BackendArgs {
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
    pub(crate) fn choice(self) -> run::setup::HarnessChoice {
        self.backend.choice(self.agent)
    }
}

impl BackendArgs {
    pub(crate) fn choice(self, agent: Option<String>) -> run::setup::HarnessChoice {
        run::setup::HarnessChoice {
            agent,
            harness: self.harness,
            model: self.model,
            model_server: self.model_server,
        }
    }
}
