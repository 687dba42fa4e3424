//! `keel cancel` while another keel process holds the store: the request goes to that process
//! through a file in the home's `control/` folder, and that process answers in another file.
//!
//! A request never outlives the command that made it. It names the requesting process and a
//! deadline; the process holding the store claims it (an atomic rename) before the deadline and
//! carries it out on the store it holds (a run it hosts is told through its coordinator; any other
//! run or task is cancelled in the store, which refuses what has ended), then writes the answer the
//! command prints. A request nobody claimed by its deadline is taken back by the command, which says
//! so and exits 1; a request, claim or answer past its deadline is removed unread by whichever
//! process sees it, so a leftover can never cancel a run later (issue 17). Files of the older form
//! (`RUN.cancel`, no deadline) are removed unread.
//!
//! The commands that host runs in this process answer (`keel run`, `resume`, `follow-up`, and
//! `keel node --run`); a `keel serve` and a coordinator node serving the API (`keel node` without
//! `--run`) announce themselves in `server.json`, so `keel cancel` on their home goes to their HTTP
//! API instead (`keel --server URL cancel ID`). A worker node never holds the store.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use keel_actors::runtime::{Runtime, TaskCancel};
use keel_store::{ReadError, RunId, TaskId};
use serde::{Deserialize, Serialize};

use crate::home::Home;

/// How long `keel cancel` waits for the holding process to claim its request.
const CLAIM_WAIT: Duration = Duration::from_secs(10);
/// How long it waits for the answer once the request is claimed.
const ANSWER_WAIT: Duration = Duration::from_secs(20);
/// How often `keel cancel` looks for the answer.
const ANSWER_POLL: Duration = Duration::from_millis(50);
/// The ending of a request's file name.
const REQUEST_SUFFIX: &str = ".request.json";
/// The ending of a claimed request's file name.
const CLAIMED_SUFFIX: &str = ".claimed.json";
/// The ending of an answer's file name.
const ANSWER_SUFFIX: &str = ".answer.json";

/// A cancel request, as `keel cancel` writes it.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Request {
    /// The run or task id, as typed.
    target: String,
    /// Why, one line.
    reason: String,
    /// The requesting process.
    requester: u32,
    /// Unix milliseconds after which nobody acts on it.
    deadline_ms: u64,
}

/// What the holding process did, as `keel cancel` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Answer {
    /// Whether it did what was asked.
    pub(crate) ok: bool,
    /// `cancel_sent` (its coordinator was told), `cancelled` (marked in the store), or `refused`.
    pub(crate) status: String,
    /// The run concerned.
    pub(crate) run: Option<String>,
    /// Tasks marked cancelled in the store.
    pub(crate) tasks: Option<u32>,
    /// What happened, one sentence.
    pub(crate) message: String,
    /// The answering process.
    pub(crate) holder: u32,
    /// Unix milliseconds after which the answer file is stale.
    deadline_ms: u64,
}

/// Why a request through the holding process did not get done.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ControlError {
    /// Nobody claimed the request in time (the process holding the store does not answer
    /// requests, or is stuck); it was taken back, so nothing happens later.
    #[error(
        "the store is held by another keel process that did not take the cancel request within {waited:?} (a `keel serve`: use `keel --server URL cancel`; or a process that is not hosting runs); nothing was cancelled"
    )]
    NotClaimed {
        /// How long it was waited for.
        waited: Duration,
    },
    /// The holding process claimed the request but wrote no answer in time.
    #[error(
        "the keel process holding the store took the cancel request but did not answer within {waited:?}; see `keel status`"
    )]
    NoAnswer {
        /// How long it was waited for.
        waited: Duration,
    },
    /// The holding process refused it (the run or task has ended, or does not exist).
    #[error("{0}")]
    Refused(String),
}

fn control_dir(home: &Home) -> PathBuf {
    home.dir().join("control")
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// `keel cancel ID` through the process holding the store: write the request, wait for its answer
/// (or take the request back), and return the answer.
///
/// # Errors
/// [`ControlError`] when nobody claimed or answered it, or the holder refused; IO errors.
pub(crate) fn request(home: &Home, target: RunId, reason: &str) -> anyhow::Result<Answer> {
    let dir = control_dir(home);
    crate::private::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let pid = std::process::id();
    let stem = format!("cancel-{target}-{pid}");
    let request = dir.join(format!("{stem}{REQUEST_SUFFIX}"));
    let answer = dir.join(format!("{stem}{ANSWER_SUFFIX}"));
    let claim_deadline = std::time::Instant::now() + CLAIM_WAIT;
    let body = Request {
        target: target.to_string(),
        reason: reason.to_owned(),
        requester: pid,
        deadline_ms: now_ms().saturating_add(millis(CLAIM_WAIT)),
    };
    let text = serde_json::to_vec(&body).context("encoding the cancel request")?;
    // Written under a temporary name and renamed, so the holder never reads half a request.
    let partial = dir.join(format!("{stem}.partial"));
    crate::private::write_file(&partial, &text)
        .with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, &request)
        .with_context(|| format!("writing {}", request.display()))?;
    let mut answer_deadline = None;
    loop {
        if let Some(found) = read_answer(&answer) {
            let _ = std::fs::remove_file(&answer);
            return if found.ok {
                Ok(found)
            } else {
                Err(ControlError::Refused(found.message).into())
            };
        }
        let now = std::time::Instant::now();
        match answer_deadline {
            None if now >= claim_deadline => match std::fs::remove_file(&request) {
                // Taken back unclaimed: nothing happens later.
                Ok(()) => return Err(ControlError::NotClaimed { waited: CLAIM_WAIT }.into()),
                // Claimed just now: its answer follows.
                Err(_) => answer_deadline = Some(now + ANSWER_WAIT),
            },
            Some(deadline) if now >= deadline => {
                return Err(ControlError::NoAnswer {
                    waited: CLAIM_WAIT + ANSWER_WAIT,
                }
                .into());
            }
            _ => {}
        }
        std::thread::sleep(ANSWER_POLL);
    }
}

fn read_answer(path: &Path) -> Option<Answer> {
    let text = std::fs::read(path).ok()?;
    serde_json::from_slice(&text).ok()
}

/// The holding process's side: take every live request in the home's control folder, carry it
/// out on `rt` (which holds the store), and answer it; remove every stale file. Called by a
/// command hosting runs every few hundred milliseconds.
pub(crate) async fn serve_requests(home: &Home, rt: &Runtime) {
    let dir = control_dir(home);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    let names: Vec<String> = entries
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    for name in names {
        let path = dir.join(&name);
        if name.ends_with(".cancel") {
            // The older form, without a deadline: never acted on.
            let _ = std::fs::remove_file(&path);
            continue;
        }
        let Some(stem) = name.strip_suffix(REQUEST_SUFFIX) else {
            remove_if_stale(&path, &name);
            continue;
        };
        let claimed = dir.join(format!("{stem}{CLAIMED_SUFFIX}"));
        if std::fs::rename(&path, &claimed).is_err() {
            continue; // taken back by its command meanwhile
        }
        let request: Option<Request> = std::fs::read(&claimed)
            .ok()
            .and_then(|t| serde_json::from_slice(&t).ok());
        let Some(request) = request.filter(|r| r.deadline_ms >= now_ms()) else {
            let _ = std::fs::remove_file(&claimed);
            continue;
        };
        let answer = carry_out(rt, &request).await;
        let path = dir.join(format!("{stem}{ANSWER_SUFFIX}"));
        if let Ok(text) = serde_json::to_vec(&answer) {
            let partial = dir.join(format!("{stem}.answer.partial"));
            if crate::private::write_file(&partial, &text).is_ok() {
                let _ = std::fs::rename(&partial, &path);
            }
        }
        let _ = std::fs::remove_file(&claimed);
    }
}

/// A claim or answer file whose deadline has passed (its command gave up or ended) is removed;
/// anything unreadable too, once it is older than the longest wait.
fn remove_if_stale(path: &Path, name: &str) {
    let deadline = if name.ends_with(CLAIMED_SUFFIX) {
        std::fs::read(path)
            .ok()
            .and_then(|t| serde_json::from_slice::<Request>(&t).ok())
            .map(|r| r.deadline_ms)
    } else if name.ends_with(ANSWER_SUFFIX) {
        read_answer(path).map(|a| a.deadline_ms)
    } else {
        None
    };
    let stale = match deadline {
        Some(deadline) => now_ms() > deadline,
        None => std::fs::metadata(path)
            .and_then(|m| m.modified())
            .ok()
            .and_then(|m| m.elapsed().ok())
            .is_some_and(|age| age > CLAIM_WAIT + ANSWER_WAIT),
    };
    if stale {
        let _ = std::fs::remove_file(path);
    }
}

/// Carry out one request on the runtime holding the store: a run hosted here is told through its
/// coordinator; any other run or task is cancelled in the store, which refuses what has ended.
async fn carry_out(rt: &Runtime, request: &Request) -> Answer {
    let holder = std::process::id();
    let deadline_ms = now_ms().saturating_add(millis(ANSWER_WAIT));
    let answer = |ok: bool, status: &str, run: Option<String>, tasks, message: String| Answer {
        ok,
        status: status.into(),
        run,
        tasks,
        message,
        holder,
        deadline_ms,
    };
    let Ok(id) = request.target.parse::<RunId>() else {
        return answer(
            false,
            "refused",
            None,
            None,
            format!("{:?} is not a run or task id", request.target),
        );
    };
    let reason = request.reason.as_str();
    if rt.cancel(id, reason) {
        return answer(
            true,
            "cancel_sent",
            Some(id.to_string()),
            None,
            format!("run {id}: cancel sent to the keel process hosting it (pid {holder})"),
        );
    }
    let is_run = match rt.store() {
        Ok(store) => match store.catalog().run(id) {
            Ok(_) => true,
            Err(ReadError::NotFound { .. }) => false,
            Err(e) => return answer(false, "refused", None, None, e.to_string()),
        },
        Err(e) => return answer(false, "refused", None, None, e.to_string()),
    };
    if is_run {
        return match rt.cancel_stored(id, reason).await {
            Ok(tasks) => answer(
                true,
                "cancelled",
                Some(id.to_string()),
                Some(tasks),
                format!("run {id} cancelled ({tasks} open tasks cancelled)"),
            ),
            Err(e) => answer(false, "refused", Some(id.to_string()), None, e.to_string()),
        };
    }
    let task = TaskId(id.0);
    match rt.cancel_task(task, reason).await {
        Ok(TaskCancel::Sent { run }) => answer(
            true,
            "cancel_sent",
            Some(run.to_string()),
            None,
            format!(
                "task {task}: cancel sent to the keel process hosting run {run} (pid {holder})"
            ),
        ),
        Ok(TaskCancel::Stored { run, tasks }) => answer(
            true,
            "cancelled",
            Some(run.to_string()),
            Some(tasks),
            format!("task {task} of run {run} cancelled"),
        ),
        Err(e) => answer(false, "refused", None, None, e.to_string()),
    }
}
