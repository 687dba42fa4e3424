//! `keel escalations [RUN]` and `keel answer ESCALATION "TEXT"` (docs/DESIGN.md §9): the hand-offs
//! to a human, listed from the store, and answered on whichever path reaches the process that can
//! act on the answer.
//!
//! An answer is made durable by a runtime (`Runtime::answer_escalation`), which also delivers it:
//! - a `keel serve` holding the home: through its HTTP API (`POST /v1/escalations/{id}/answer`);
//! - a `keel run`, `resume` or `follow-up` holding the store: through a control file in the home's
//!   `control/` folder (`<id>.answer`), which that process polls as it polls `keel cancel`'s; it
//!   writes the outcome to `<id>.answered`, which `keel answer` waits for and prints;
//! - nobody holding the store: `keel answer` starts a runtime on it itself and writes the answer;
//!   the paused task resumes with it on `keel resume RUN`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, anyhow};
use keel_actors::escalation::{check_answer, describe};
use keel_actors::runtime::{AnswerError, Answered, Delivered, Runtime};
use keel_store::{
    Escalation, EscalationId, EscalationResolution, EscalationTrigger, EscalationWait, Listing,
    RunId, Sequenced, Store,
};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::exit::{Exit, Failed};
use crate::home::Home;
use crate::stdout::outln;

/// How long `keel answer` waits for the process holding the store to take an answer.
const CONTROL_ANSWER_WAIT: Duration = Duration::from_secs(20);
/// How often it looks.
const CONTROL_ANSWER_POLL: Duration = Duration::from_millis(100);
/// Most answer requests one poll of the control folder takes.
const CONTROL_ANSWERS_PER_POLL_MAX: usize = 16;
/// Most bytes of an answer request file.
const CONTROL_FILE_BYTES_MAX: u64 = 64 * 1024;

/// An escalation as `keel escalations --json` and the HTTP API show it (ids as ULID strings).
pub(crate) fn view(run: RunId, row: &Sequenced<Escalation>) -> Value {
    let e = &row.value;
    let waiting = match &e.waiting {
        EscalationWait::Nothing => json!({"kind": "nothing"}),
        EscalationWait::Task => json!({"kind": "task"}),
        EscalationWait::ToolCall { tool, deadline_ms } => {
            json!({"kind": "tool_call", "tool": tool, "deadline_ms": deadline_ms})
        }
    };
    let (status, answer, resolved_ms) = match &e.resolution {
        None if lapsed(e, keel_actors::runtime::wall_clock_ms()) => ("expired", None, None),
        None => ("open", None, None),
        Some(EscalationResolution::Answered { ts_ms, text }) => {
            ("answered", Some(text.clone()), Some(*ts_ms))
        }
        Some(EscalationResolution::Expired { ts_ms }) => ("expired", None, Some(*ts_ms)),
    };
    json!({
        "id": e.id.to_string(),
        "run": run.to_string(),
        "seq": row.seq,
        "task": e.task_id.map(|t| t.to_string()),
        "trigger": trigger_name(e.trigger),
        "raised_ms": e.ts_ms,
        "account": e.account,
        "asked": e.asked,
        "attempted": e.attempted,
        "diagnosis": e.diagnosis,
        "amount_micros": e.amount_micros,
        "recommended_action": e.recommended_action,
        "options": e.options,
        "waiting": waiting,
        "status": status,
        "answer": answer,
        "resolved_ms": resolved_ms,
    })
}

/// Whether `e` is an approval whose deadline passed without a recorded end (its process stopped
/// waiting, or ended, before it could record the expiry): nothing can answer it any more.
pub(crate) fn lapsed(e: &Escalation, now_ms: u64) -> bool {
    matches!(e.waiting, EscalationWait::ToolCall { deadline_ms, .. } if deadline_ms < now_ms)
}

/// The stable name of a trigger.
pub(crate) fn trigger_name(trigger: EscalationTrigger) -> &'static str {
    match trigger {
        EscalationTrigger::HumanRequested => "human_requested",
        EscalationTrigger::PolicyGap => "policy_gap",
        EscalationTrigger::NoProgress => "no_progress",
    }
}

/// The escalations `keel escalations` and `GET /v1/escalations` list: open ones unless `all`.
///
/// # Errors
/// A failed read.
pub(crate) fn listing(
    store: &Store,
    run: Option<RunId>,
    all: bool,
    limit: u32,
) -> anyhow::Result<Listing<(RunId, Sequenced<Escalation>)>> {
    if let Some(run) = run {
        store.catalog().run(run)?;
    }
    let mut list = store.catalog().escalations(run, !all, limit)?;
    if !all {
        let now = keel_actors::runtime::wall_clock_ms();
        list.items.retain(|(_, row)| !lapsed(&row.value, now));
    }
    Ok(list)
}

/// The listing as JSON.
pub(crate) fn listing_json(list: &Listing<(RunId, Sequenced<Escalation>)>) -> Value {
    let items: Vec<Value> = list
        .items
        .iter()
        .map(|(run, row)| view(*run, row))
        .collect();
    json!({"escalations": items, "more": list.more})
}

/// `keel escalations [RUN] [--all]`.
pub(crate) fn print_list(
    store: &Store,
    run: Option<RunId>,
    all: bool,
    limit: u32,
    json_out: bool,
) -> anyhow::Result<()> {
    let list = listing(store, run, all, limit)?;
    if json_out {
        let mut value = listing_json(&list);
        crate::redact::json(&mut value);
        outln!("{}", serde_json::to_string_pretty(&value)?)?;
        return Ok(());
    }
    if list.items.is_empty() {
        let which = if all {
            "escalations"
        } else {
            "open escalations"
        };
        match run {
            Some(run) => outln!("run {run} has no {which}")?,
            None => outln!("no {which}")?,
        }
        return Ok(());
    }
    let now = keel_actors::runtime::wall_clock_ms();
    for (run, row) in &list.items {
        let e = &row.value;
        let status = match &e.resolution {
            Some(r) => describe(r),
            None if lapsed(e, now) => "expired unanswered".into(),
            None => "open".into(),
        };
        outln!("escalation {}  {}  {status}", e.id, trigger_name(e.trigger))?;
        outln!(
            "  run {run}{}",
            e.task_id.map(|t| format!("  task {t}")).unwrap_or_default()
        )?;
        outln!("  asked:       {}", e.asked)?;
        outln!("  why:         {}", e.diagnosis)?;
        outln!("  tried:       {}", e.attempted)?;
        if let Some(m) = e.amount_micros {
            outln!("  amount:      {m} micro-dollars")?;
        }
        if !e.options.is_empty() {
            outln!("  options:     {}", e.options.join(" | "))?;
        }
        outln!("  recommended: {}", e.recommended_action)?;
    }
    if list.more {
        outln!("(more escalations: raise --limit)")?;
    }
    Ok(())
}

/// What became of an answer, as `keel answer` prints it and the API answers it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AnswerOutcome {
    /// The escalation.
    pub(crate) escalation: String,
    /// Its run.
    pub(crate) run: String,
    /// The answer as recorded.
    pub(crate) answer: String,
    /// What acted on it: `coordinator` (the paused task resumes now), `tool_call` (the waiting call
    /// is decided), `none` (kept for `keel resume`).
    pub(crate) delivered: String,
}

impl AnswerOutcome {
    pub(crate) fn of(answered: &Answered) -> Self {
        AnswerOutcome {
            escalation: answered.escalation.id.to_string(),
            run: answered.run.to_string(),
            answer: answered.text.clone(),
            delivered: match answered.delivered_to {
                Some(Delivered::Coordinator) => "coordinator",
                Some(Delivered::ToolCall) => "tool_call",
                None => "none",
            }
            .into(),
        }
    }

    pub(crate) fn print(&self, json_out: bool) -> anyhow::Result<()> {
        if json_out {
            outln!("{}", serde_json::to_string(self)?)?;
            return Ok(());
        }
        let then = match self.delivered.as_str() {
            "coordinator" => "its task resumes now with the answer".to_string(),
            "tool_call" => "the waiting tool call is decided".to_string(),
            _ => format!(
                "no process hosts run {} now: its task resumes with the answer on `keel resume {}`",
                self.run, self.run
            ),
        };
        outln!(
            "escalation {} answered ({}); {then}",
            self.escalation,
            self.answer
        )?;
        Ok(())
    }
}

/// The exit code of a refused answer: not found 3, a bad answer 2, the rest 1.
pub(crate) fn failed(e: AnswerError) -> Failed {
    let exit = match &e {
        AnswerError::NotFound(_) => Exit::NotFound,
        AnswerError::Refused(_) => Exit::Usage,
        _ => Exit::Failure,
    };
    Failed {
        exit,
        error: e.into(),
    }
}

/// `keel answer ESCALATION "TEXT"` on this machine's store (the caller has already sent it to a
/// server holding the home, if one does).
pub(crate) fn answer_local(
    home: &Home,
    id: EscalationId,
    text: &str,
    json_out: bool,
) -> Result<(), Failed> {
    let rt = crate::run::tokio_runtime()?;
    match crate::run::open_writer(home) {
        Ok(store) => {
            let outcome = rt.block_on(async {
                let (node, _events) = Runtime::start(
                    store,
                    keel_actors::runtime::HarnessSet::new(),
                    keel_actors::runtime::RuntimeConfig::default(),
                )
                .await?;
                let result = node.answer_escalation(id, text).await;
                node.shutdown().await;
                Ok::<_, anyhow::Error>(result)
            })?;
            let answered = outcome.map_err(failed)?;
            AnswerOutcome::of(&answered).print(json_out)?;
            Ok(())
        }
        Err(held) => {
            // Another keel process holds the store: check the answer against the row here (a clear
            // error at once), then hand it to that process through the control folder.
            let store = home.open_existing()?;
            let (_, row) = match store.catalog().escalation(id) {
                Ok(found) => found,
                Err(keel_store::ReadError::NotFound { .. }) => {
                    return Err(failed(AnswerError::NotFound(id)));
                }
                Err(e) => return Err(e.into()),
            };
            check_answer(&row.value, text).map_err(|e| failed(AnswerError::Refused(e)))?;
            let outcome = through_control(home, id, text).with_context(|| {
                format!(
                    "the store is held by another keel process ({})",
                    crate::exit::sentence(&held)
                )
            })?;
            match outcome {
                ControlAnswer::Taken(outcome) => Ok(outcome.print(json_out)?),
                ControlAnswer::Refused { message, not_found } => Err(Failed {
                    exit: if not_found {
                        Exit::NotFound
                    } else {
                        Exit::Usage
                    },
                    error: anyhow!(message),
                }),
            }
        }
    }
}

/// What the process holding the store answered to a control-file answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
enum ControlAnswer {
    Taken(AnswerOutcome),
    Refused { message: String, not_found: bool },
}

/// The request `keel answer` leaves in the control folder.
#[derive(Clone, Debug, Serialize, Deserialize)]
struct ControlRequest {
    answer: String,
}

fn control_dir(home: &Home) -> PathBuf {
    home.dir().join("control")
}

fn request_path(home: &Home, id: EscalationId) -> PathBuf {
    control_dir(home).join(format!("{id}.answer"))
}

fn reply_path(home: &Home, id: EscalationId) -> PathBuf {
    control_dir(home).join(format!("{id}.answered"))
}

fn through_control(home: &Home, id: EscalationId, text: &str) -> anyhow::Result<ControlAnswer> {
    let dir = control_dir(home);
    crate::private::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let reply = reply_path(home, id);
    let _ = std::fs::remove_file(&reply);
    let request = request_path(home, id);
    let body = serde_json::to_vec(&ControlRequest {
        answer: text.to_owned(),
    })?;
    // Written under another name and renamed, so the polling process never reads half a request.
    let partial = dir.join(format!("{id}.answer.partial"));
    crate::private::write_file(&partial, &body)
        .with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, &request)
        .with_context(|| format!("writing {}", request.display()))?;
    let mut waited = Duration::ZERO;
    while waited < CONTROL_ANSWER_WAIT {
        std::thread::sleep(CONTROL_ANSWER_POLL);
        waited += CONTROL_ANSWER_POLL;
        if let Ok(bytes) = std::fs::read(&reply) {
            let _ = std::fs::remove_file(&reply);
            return serde_json::from_slice(&bytes)
                .with_context(|| format!("reading {}", reply.display()));
        }
    }
    let _ = std::fs::remove_file(&request);
    Err(anyhow!(
        "it did not take the answer within {} s (a `keel node` or an older keel does not poll for answers); nothing was answered",
        CONTROL_ANSWER_WAIT.as_secs()
    ))
}

/// Takes the answers `keel answer` left in the home's control folder and answers each through
/// `rt` (the process hosting runs calls this as it polls for `keel cancel`). Each outcome is
/// written back for the waiting `keel answer`.
pub(crate) async fn take_answers(home: &Home, rt: &Runtime) {
    let dir = control_dir(home);
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return;
    };
    let requests: Vec<(EscalationId, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let id = name.strip_suffix(".answer")?.parse::<EscalationId>().ok()?;
            Some((id, e.path()))
        })
        .take(CONTROL_ANSWERS_PER_POLL_MAX)
        .collect();
    for (id, path) in requests {
        let request = read_request(&path);
        let _ = std::fs::remove_file(&path);
        let reply = match request {
            Err(e) => ControlAnswer::Refused {
                message: format!("{e:#}"),
                not_found: false,
            },
            Ok(request) => match rt.answer_escalation(id, &request.answer).await {
                Ok(answered) => ControlAnswer::Taken(AnswerOutcome::of(&answered)),
                Err(e) => ControlAnswer::Refused {
                    not_found: matches!(e, AnswerError::NotFound(_)),
                    message: e.to_string(),
                },
            },
        };
        if let Ok(bytes) = serde_json::to_vec(&reply) {
            let target = reply_path(home, id);
            let partial = dir.join(format!("{id}.answered.partial"));
            let written = crate::private::write_file(&partial, &bytes)
                .and_then(|()| std::fs::rename(&partial, &target));
            if let Err(e) = written {
                tracing::warn!(path = %target.display(), error = %e, "the answer's outcome could not be written");
            }
        }
    }
}

fn read_request(path: &Path) -> anyhow::Result<ControlRequest> {
    let len = std::fs::metadata(path)?.len();
    if len > CONTROL_FILE_BYTES_MAX {
        anyhow::bail!("the answer file is over {CONTROL_FILE_BYTES_MAX} bytes");
    }
    Ok(serde_json::from_slice(&std::fs::read(path)?)?)
}
