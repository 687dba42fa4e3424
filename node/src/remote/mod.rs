//! The `keel` commands against a keel server (`keel serve`) instead of a local store: with
//! `--server URL`; for the commands that host runs (`run`, `resume`, `follow-up`, `cancel`,
//! `answer`), when a server holds this home (its `server.json`); for the read commands, when the
//! store is held and the home announces a server (`dispatch.rs`). They print what the local
//! commands print and exit with the same codes: the live view is the same code fed with the
//! server's event stream, and reads and summaries are the text the server's copy of the same code
//! printed.

pub(crate) mod client;

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::bail;
use keel_store::{RunId, TaskId};
use reqwest::StatusCode;
use tokio::sync::mpsc;

use crate::exit::{self, Exit, Failed};
use crate::home::Home;
use crate::read::Read;
use crate::run::follow_up::FollowUpArgs;
use crate::run::{Ended, RunArgs, progress, tokio_runtime};
use crate::serve::wire::{AskFollowUp, CancelRun, FollowUpStarted, Printed, SubmitRun, Submitted};
use crate::serve::{auth, discovery};
use crate::stdout::outln;
use client::{Client, ClientError, Followed};

/// The environment variable holding a server's token itself.
pub(crate) const TOKEN_ENV: &str = "KEEL_API_TOKEN";
/// The environment variable naming a file with a server's token.
pub(crate) const TOKEN_FILE_ENV: &str = "KEEL_API_TOKEN_FILE";
/// The environment variable naming a file of CA certificates to trust for an `https` server.
pub(crate) const CA_FILE_ENV: &str = "KEEL_API_CA_FILE";
/// Capacity of the channel between the event stream and the live view.
const VIEW_EVENTS_MAX: usize = 1_024;

/// The server a command goes to: the one `--server` names, else (when `discover` is set, for
/// the commands that host runs) the one that announces itself in the home, if any.
///
/// # Errors
/// When a server is named but no token is found, or the token file is unusable.
pub(crate) fn target(
    home: &Home,
    server: Option<&str>,
    token_file: Option<&Path>,
    discover: bool,
) -> anyhow::Result<Option<Client>> {
    match server {
        Some(url) => {
            let token = token(home, token_file, false)?;
            Ok(Some(connect(home, url, token)?))
        }
        None if discover => match discovery::read(home) {
            Some(announced) => Ok(Some(home_server(home, &announced.url, token_file)?)),
            None => Ok(None),
        },
        None => Ok(None),
    }
}

/// The server the home announces (its `server.json`), at `url`: asked with the home's own token
/// file before the environment's token, which may be meant for another server.
///
/// # Errors
/// When no token is found, or the token file is unusable.
pub(crate) fn home_server(
    home: &Home,
    url: &str,
    token_file: Option<&Path>,
) -> anyhow::Result<Client> {
    let token = token(home, token_file, true)?;
    connect(home, url, token)
}

fn connect(home: &Home, url: &str, token: String) -> anyhow::Result<Client> {
    let ca = if url.starts_with("https://") {
        ca_file(home)?
    } else {
        None
    };
    Client::new(url, token, ca.as_deref())
}

/// The CA certificates an `https` server is checked against: `$KEEL_API_CA_FILE`, else the home's
/// `[server] tls_ca`, else none (the platform's roots).
fn ca_file(home: &Home) -> anyhow::Result<Option<PathBuf>> {
    if let Some(path) = std::env::var_os(CA_FILE_ENV) {
        return Ok(Some(PathBuf::from(path)));
    }
    let config = home.config()?;
    Ok(config.server.tls_ca.map(|p| home.dir().join(p)))
}

/// The token: `--token-file`; then, for the server the home announces (`home_first`), the
/// token file of the home's keel.toml (that server's own); then `$KEEL_API_TOKEN`, then
/// `$KEEL_API_TOKEN_FILE`; then, for a server `--server` names, the home's token file.
fn token(home: &Home, token_file: Option<&Path>, home_first: bool) -> anyhow::Result<String> {
    if let Some(path) = token_file {
        return Ok(auth::client_token(path)?);
    }
    let home_token = || -> anyhow::Result<Option<String>> {
        let config = home.config()?;
        let path: PathBuf = home.dir().join(&config.server.token_file);
        if path.is_file() {
            return Ok(Some(auth::client_token(&path)?));
        }
        Ok(None)
    };
    if home_first && let Some(token) = home_token()? {
        return Ok(token);
    }
    if let Ok(token) = std::env::var(TOKEN_ENV)
        && !token.trim().is_empty()
    {
        return Ok(token.trim().to_owned());
    }
    if let Some(path) = std::env::var_os(TOKEN_FILE_ENV) {
        return Ok(auth::client_token(Path::new(&path))?);
    }
    if !home_first && let Some(token) = home_token()? {
        return Ok(token);
    }
    bail!(
        "no token for the keel server: pass --token-file FILE, or set {TOKEN_ENV} or {TOKEN_FILE_ENV}"
    )
}

/// The exit of a command that talked to a server: as the local command's, with the server's
/// refusals mapped to the codes a local refusal has (404 is 3; a bad follow-up message is 2).
pub(crate) fn exit_of(e: anyhow::Error, bad_request_is_usage: bool) -> Failed {
    let exit = match e
        .downcast_ref::<ClientError>()
        .and_then(ClientError::status)
    {
        Some(StatusCode::NOT_FOUND) => Exit::NotFound,
        Some(StatusCode::BAD_REQUEST) if bad_request_is_usage => Exit::Usage,
        _ => Exit::Failure,
    };
    Failed { exit, error: e }
}

/// A command that hosts a run, carried out by a server: its end as the local command's.
pub(crate) fn ended(e: anyhow::Result<Ended>, follow_up: bool) -> Result<(), Failed> {
    match e {
        Ok(ended) if follow_up => exit::followed(Ok(ended)),
        Ok(ended) => exit::ended(Ok(ended)),
        Err(e) => Err(exit_of(e, follow_up)),
    }
}

fn print_raw(text: &str) -> std::io::Result<()> {
    let mut out = crate::stdout::lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}

/// A read command (`runs`, `tasks`, `show`, `logs`, `tree`, `status`, `audit`) answered by the
/// server.
pub(crate) fn read(client: &Client, command: Read, json: bool) -> anyhow::Result<()> {
    let latest = |run: Option<RunId>| run.map_or_else(|| "latest".to_owned(), |r| r.to_string());
    let path = match command {
        Read::Runs {
            limit,
            before: None,
        } => format!("/v1/runs?limit={limit}"),
        Read::Runs {
            limit,
            before: Some(before),
        } => format!("/v1/runs?limit={limit}&before={before}"),
        Read::Tasks {
            run: Some(run),
            limit,
        } => format!("/v1/runs/{run}/tasks?limit={limit}"),
        Read::Tasks { run: None, limit } => format!("/v1/tasks?limit={limit}"),
        Read::Show { task } => format!("/v1/tasks/{task}?"),
        Read::Logs { task, tail } => format!("/v1/tasks/{task}/logs?tail={tail}"),
        Read::Tree { run, limit } => format!("/v1/runs/{}/tree?limit={limit}", latest(run)),
        Read::Status { run } => format!("/v1/runs/{}?", latest(run)),
        Read::Audit { run, limit } => format!("/v1/runs/{}/audit?limit={limit}", latest(run)),
    };
    print_served(client, &path, json)
}

/// Print what the server printed for the read at `path` (a query started, or ending in `?`): its
/// text, or its `--json` output.
fn print_served(client: &Client, path: &str, json: bool) -> anyhow::Result<()> {
    let format = if json { "json" } else { "text" };
    let sep = if path.ends_with('?') { "" } else { "&" };
    let path = format!("{path}{sep}format={format}");
    let text = tokio_runtime()?.block_on(client.get_text(&path))?;
    print_raw(&text)?;
    Ok(())
}

/// `keel context TASK [--resume]` answered by the server.
pub(crate) fn context(
    client: &Client,
    task: TaskId,
    resume: bool,
    json: bool,
) -> anyhow::Result<()> {
    print_served(
        client,
        &format!("/v1/tasks/{task}/context?resume={resume}"),
        json,
    )
}

fn refuse_node_flags(choice: &crate::run::setup::HarnessChoice) -> anyhow::Result<()> {
    if choice.harness.is_some() || choice.model.is_some() || choice.model_server.is_some() {
        bail!(
            "--harness, --model and --model-server choose how a node runs sessions: the server decides (its keel.toml and the flags it was started with)"
        );
    }
    Ok(())
}

/// Show a run's events from `from` on in the live view until the run ends or is paused.
async fn watch(client: &Client, run: RunId, from: u64, quiet: bool) -> anyhow::Result<Followed> {
    let (tx, rx) = mpsc::channel(VIEW_EVENTS_MAX);
    let view = tokio::spawn(progress::show(rx, quiet));
    let followed = client.follow(run, from, tx).await;
    let _ = view.await;
    Ok(followed?)
}

/// A run the server paused: said as a local paused run says it (exit 6).
fn paused(run: RunId, reason: &str, json: bool) -> anyhow::Result<Ended> {
    if json {
        outln!(
            "{}",
            serde_json::json!({"run": run.to_string(), "status": "paused", "reason": reason})
        )?;
    } else {
        outln!("paused run {run}: {reason}; continue with `keel resume {run}`")?;
    }
    Ok(Ended::Paused)
}

/// Print a summary the server printed, and the command's end.
fn summary_end(printed: Printed) -> anyhow::Result<Ended> {
    print_raw(&printed.stdout)?;
    Ok(if printed.completed == Some(true) {
        Ended::Completed
    } else {
        Ended::NotCompleted
    })
}

/// `keel run "BRIEF"` on a server.
pub(crate) fn run(client: &Client, args: RunArgs, json: bool) -> anyhow::Result<Ended> {
    refuse_node_flags(&args.choice)?;
    let plan = args
        .plan
        .as_deref()
        .map(crate::run::read_plan)
        .transpose()?;
    let body = SubmitRun {
        brief: args.brief,
        plan,
        agent: args.choice.agent,
    };
    tokio_runtime()?.block_on(async {
        let submitted: Submitted = client.post_json("/v1/runs", &body).await?;
        let run = submitted.run;
        crate::run::announce(run, None)?;
        if args.detach {
            if json {
                outln!(
                    "{}",
                    serde_json::json!({"run": run.to_string(), "server": client.base()})
                )?;
            } else {
                outln!(
                    "run {run} started on {} in {}\nfollow with `keel status {run}`, stop with `keel cancel {run}`",
                    client.base(),
                    submitted.work_dir
                )?;
            }
            return Ok(Ended::Completed);
        }
        if !json && !args.quiet {
            outln!("run {run} started in {}", submitted.work_dir)?;
        }
        hosted_end(client, run, submitted.events_from, args.quiet || json, json).await
    })
}

/// Follow a run the server hosts to its end and print its summary.
async fn hosted_end(
    client: &Client,
    run: RunId,
    from: u64,
    quiet: bool,
    json: bool,
) -> anyhow::Result<Ended> {
    if let Followed::Paused(reason) = watch(client, run, from, quiet).await? {
        return paused(run, &reason, json);
    }
    let printed: Printed = client
        .get_json(&format!("/v1/runs/{run}/summary?from={from}&json={json}"))
        .await?;
    summary_end(printed)
}

/// `keel resume RUN` on a server.
pub(crate) fn resume(
    client: &Client,
    run: RunId,
    choice: &crate::run::setup::HarnessChoice,
    quiet: bool,
    json: bool,
) -> anyhow::Result<Ended> {
    refuse_node_flags(choice)?;
    tokio_runtime()?.block_on(async {
        let resumed: Submitted = client
            .post_json(&format!("/v1/runs/{run}/resume"), &serde_json::json!({}))
            .await?;
        if !json && !quiet {
            outln!("run {run} resumed in {}", resumed.work_dir)?;
        }
        hosted_end(client, run, resumed.events_from, quiet || json, json).await
    })
}

/// `keel follow-up TASK "MESSAGE"` on a server.
pub(crate) fn follow_up(client: &Client, args: FollowUpArgs, json: bool) -> anyhow::Result<Ended> {
    refuse_node_flags(&args.choice)?;
    let body = AskFollowUp {
        message: args.message,
        agent: args.agent,
    };
    let parent: TaskId = args.task;
    tokio_runtime()?.block_on(async {
        let started: FollowUpStarted = client
            .post_json(&format!("/v1/tasks/{parent}/follow-ups"), &body)
            .await?;
        let (run, task) = (started.run, started.task);
        crate::run::announce(run, Some(task))?;
        if args.detach {
            if json {
                outln!(
                    "{}",
                    serde_json::json!({"run": run.to_string(), "task": task.to_string(), "server": client.base()})
                )?;
            } else {
                outln!(
                    "follow-up {task} on run {run} started on {}\nfollow with `keel status {run}`, stop with `keel cancel {task}`",
                    client.base()
                )?;
            }
            return Ok(Ended::Completed);
        }
        if !json && !args.quiet {
            let how = if started.reopened { "reopened" } else { "joined" };
            outln!(
                "follow-up {task} on the thread of {parent} ({how} run {run}) in {}",
                started.work_dir
            )?;
        }
        let from = started.events_from;
        if let Followed::Paused(reason) = watch(client, run, from, args.quiet || json).await? {
            return paused(run, &reason, json);
        }
        let printed: Printed = client
            .get_json(&format!("/v1/follow-ups/{task}/summary?from={from}&json={json}"))
            .await?;
        summary_end(printed)
    })
}

/// `keel cancel ID` on a server: a run (`POST /v1/runs/{id}/cancel`), else, when the server knows
/// no such run, a task's step (`POST /v1/tasks/{id}/cancel`).
pub(crate) fn cancel(client: &Client, id: RunId, json: bool) -> anyhow::Result<()> {
    tokio_runtime()?.block_on(async {
        let as_run: Result<serde_json::Value, ClientError> = client
            .post_json(&format!("/v1/runs/{id}/cancel"), &CancelRun::default())
            .await;
        let (answer, task) = match as_run {
            Err(e) if e.status() == Some(StatusCode::NOT_FOUND) => {
                let answer: serde_json::Value = client
                    .post_json(&format!("/v1/tasks/{id}/cancel"), &CancelRun::default())
                    .await?;
                (answer, Some(id))
            }
            other => (other?, None),
        };
        let run = answer["run"].as_str().unwrap_or_default();
        let cancelled = answer["status"] == "cancelled";
        if json {
            outln!("{answer}")?;
        } else if let Some(task) = task {
            if cancelled {
                outln!("task {task} of run {run} cancelled")?;
            } else {
                outln!(
                    "task {task}: cancel sent to the keel server hosting run {run} ({})",
                    client.base()
                )?;
            }
        } else if cancelled {
            outln!(
                "run {run} cancelled ({} open tasks cancelled)",
                answer["tasks_cancelled"]
            )?;
        } else {
            outln!(
                "run {run}: cancel sent to the keel server hosting it ({})",
                client.base()
            )?;
        }
        Ok(())
    })
}

/// `keel escalations` on a server: the text (or JSON) the server's copy of the same code printed.
pub(crate) fn escalations(
    client: &Client,
    run: Option<RunId>,
    all: bool,
    limit: u32,
    json: bool,
) -> anyhow::Result<()> {
    let run = run.map(|r| format!("&run={r}")).unwrap_or_default();
    print_served(
        client,
        &format!("/v1/escalations?all={all}&limit={limit}{run}"),
        json,
    )
}

/// `keel answer` on a server.
pub(crate) fn answer(
    client: &Client,
    escalation: keel_store::EscalationId,
    text: &str,
    json: bool,
) -> anyhow::Result<()> {
    let outcome: crate::escalations::AnswerOutcome =
        tokio_runtime()?.block_on(client.post_json(
            &format!("/v1/escalations/{escalation}/answer"),
            &serde_json::json!({ "answer": text }),
        ))?;
    outcome.print(json)
}
