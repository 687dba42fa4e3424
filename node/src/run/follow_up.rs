//! `keel follow-up TASK "MESSAGE"`: a derived task on the thread of TASK, served with keel's
//! standard preamble (the parent's brief and outcome, from the store; never a native resume), on
//! the agent `--agent` names (any harness), or the one the supervisor picks.
//!
//! This process becomes the run's host: a completed or failed run is reopened (its coordinator
//! rebuilt from the store, as `keel resume` does, with the follow-up queued first) and ends again
//! once the follow-up is done, with a synthesis over every step, the follow-up included. The store
//! must be free: a run held by another keel process is refused (its store cannot be opened for
//! writing), as is a cancelled or over-budget run.

use crate::stdout::outln;
use anyhow::Context;
use keel_actors::runtime::{FollowUpOutcome, Runtime};
use keel_store::TaskId;

use super::setup::{self, HarnessChoice, node_setup, work_dir};
use super::{
    Ended, Hosted, Stopped, detach, host_until, init_logs, node_store, pause, progress, summary,
};
use crate::home::Home;

/// `keel follow-up`'s arguments.
#[derive(Debug, Clone)]
pub(crate) struct FollowUpArgs {
    /// The task whose thread continues.
    pub(crate) task: TaskId,
    /// The message, verbatim.
    pub(crate) message: String,
    /// The agent profile the follow-up is assigned to; `None` lets the supervisor pick.
    pub(crate) agent: Option<String>,
    /// Harness choices for the node (`--harness`, `--model`, `--model-server`); `agent` is not
    /// used to narrow the node's agents, so a reopened run keeps every configured profile.
    pub(crate) choice: HarnessChoice,
    /// Print only the summary.
    pub(crate) quiet: bool,
    /// Run in the background.
    pub(crate) detach: bool,
    /// `--log-format`, overriding keel.toml's.
    pub(crate) log_format: Option<crate::config::LogFormat>,
}

/// Why a follow-up could not start, where the exit code depends on it (see `main.rs`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum FollowUpError {
    /// Another keel process has the store open for writing: it may be hosting the task's run, and
    /// a second writer cannot open the store anyway.
    #[error(
        "the store is held by another keel process ({detail}); a follow-up needs it: wait for that process to end, or stop its run with `keel cancel {run}` if it is this one"
    )]
    StoreHeld {
        /// The task's run.
        run: keel_store::RunId,
        /// The open error.
        detail: String,
    },
}

/// `keel follow-up TASK "MESSAGE"`.
pub(crate) fn follow_up(home: &Home, args: FollowUpArgs, json: bool) -> anyhow::Result<Ended> {
    // Unknown tasks and a missing home are told apart before anything starts, even while another
    // process holds the store (a read-only open works beside a writer).
    let (run, assignee, kept) = {
        let store = home.open_existing()?;
        let task = store.catalog().task(args.task)?;
        // Without `--agent` or `--harness`, the follow-up goes to the task's assignee, on the
        // profile the run kept (an ad-hoc `--harness`/`--model` one included).
        let kept = if args.agent.is_none() && args.choice.harness.is_none() {
            setup::kept_profile(&store, &task)?
        } else {
            None
        };
        (task.run_id, task.assignee, kept)
    };
    // Checked here too, so a detached follow-up refuses a bad message with its exit code at once.
    keel_actors::runtime::check_follow_up_message(&args.message)?;
    if args.detach {
        return detach(home, "follow-up", json);
    }
    let config = home.config()?;
    init_logs(&config.log, args.log_format);
    super::tokio_runtime()?.block_on(async {
        let store = node_store(home, super::SHARED).map_err(|e| held_or(e, run))?;
        let work = work_dir()?;
        let choice = HarnessChoice {
            agent: None,
            ..args.choice.clone()
        };
        let setup = node_setup(&config, &choice, &work, kept).await?;
        // `--agent`, else the task's assignee when this node has a profile of that name (the kept
        // one, or keel.toml's), else the supervisor's pick.
        let agent = args.agent.clone().or_else(|| {
            assignee.filter(|name| {
                setup
                    .config
                    .supervisor
                    .agents
                    .iter()
                    .any(|a| &a.name == name)
            })
        });
        let profile = agent.as_ref().and_then(|name| {
            setup
                .config
                .supervisor
                .agents
                .iter()
                .find(|a| &a.name == name)
                .cloned()
        });
        let (rt, events) = Runtime::start(store, setup.harnesses, setup.config).await?;
        super::setup::attach_policy(&setup.policy, &rt);
        // The follow-up's id is announced once it is durable, by then its session may have
        // started: the live view starts after the announcement (its events wait in the channel).
        let handle = match rt
            .follow_up(args.task, &args.message, agent.as_deref())
            .await
        {
            Ok(h) => h,
            Err(e) => {
                rt.shutdown().await;
                return Err(e.into());
            }
        };
        let (run, task) = (handle.run(), handle.task());
        if let Some(profile) = profile {
            setup::record_profiles(&rt, run, &[profile]);
        }
        super::announce(run, Some(task))?;
        if !json && !args.quiet {
            let how = if handle.reopened() {
                "reopened"
            } else {
                "joined"
            };
            outln!(
                "follow-up {task} on the thread of {} ({how} run {run}) in {}",
                args.task,
                work.display()
            )?;
        }
        let view = tokio::spawn(progress::show(events, args.quiet || json));
        let parent = handle.parent();
        let ended = match host_until(home, &rt, handle.finished()).await {
            Ok(Hosted::Ended(outcome)) => {
                let usage = super::view_usage(&rt, view).await;
                summary::follow_up(home, &*rt.store()?, &outcome, &usage, json)
                    .context("printing the summary")
                    .map(|()| ended_of(&outcome))
            }
            Ok(Hosted::Signal) => match pause(&rt, run, view, json).await {
                Ok(Stopped::Paused) => Ok(Ended::Paused),
                // The run ended as the signal came: report the end the store holds.
                Ok(Stopped::RunEnded(outcome, view)) => {
                    match rt.follow_up_outcome(task, parent, outcome).await {
                        Ok(outcome) => {
                            let usage = super::view_usage(&rt, view).await;
                            summary::follow_up(home, &*rt.store()?, &outcome, &usage, json)
                                .context("printing the summary")
                                .map(|()| ended_of(&outcome))
                        }
                        Err(e) => Err(e.into()),
                    }
                }
                Err(e) => Err(e),
            },
            Ok(Hosted::Paused(reason)) => super::paused(run, view, &reason, json),
            Err(e) => Err(e),
        };
        rt.shutdown().await;
        ended
    })
}

/// A store held by another keel process is [`FollowUpError::StoreHeld`] (what to do about it
/// names the run); any other open failure (damaged, not permitted) stays itself.
fn held_or(e: anyhow::Error, run: keel_store::RunId) -> anyhow::Error {
    if super::is_locked(&e) {
        FollowUpError::StoreHeld {
            run,
            detail: crate::exit::sentence(&e),
        }
        .into()
    } else {
        e
    }
}

fn ended_of(outcome: &FollowUpOutcome) -> Ended {
    if outcome.completed() {
        Ended::Completed
    } else {
        Ended::NotCompleted
    }
}
