//! Filling the builders' views from stored rows, and the report `keel context TASK [--resume]` prints.
//!
//! The loaders are thin: they read a bounded number of rows through a [`ThreadSource`] and hand them to
//! the pure builders. Corrupt parent links cannot make them loop: every walk has a step limit and stops
//! at the first id it has already visited.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use keel_store::{ReadError, RunScope, SessionLogRow, Store, Task, TaskId, TaskKind};
use serde::{Deserialize, Serialize};

use super::placement::place_preamble;
use super::preamble::Preamble;
use super::resume::{LogEntry, ResumeView, resume_preamble};
use super::scrub::Scrubber;
use super::standard::{ThreadView, WalkEnd, standard_preamble};
use super::{ContextConfig, ContextConfigError};
use crate::report::Continuity;

/// Where the loaders read rows from: the store on a coordinator node, or rows already in memory
/// ([`RowSet`]) in the simulator and tests.
pub trait ThreadSource {
    /// The source's own error (an IO or decode failure).
    type Error: std::error::Error + Send + Sync + 'static;

    /// The task with this id, or `None` if there is none.
    ///
    /// # Errors
    /// When the source cannot be read.
    fn task(&self, id: TaskId) -> Result<Option<Task>, Self::Error>;

    /// The last `rows_max` rows of a task's session log with their sequence numbers, oldest first.
    ///
    /// # Errors
    /// When the source cannot be read.
    fn log_tail(
        &self,
        id: TaskId,
        rows_max: usize,
    ) -> Result<Vec<(u64, SessionLogRow)>, Self::Error>;

    /// The task's ancestors, nearest first, at most `max`, read at once (one transaction in the store)
    /// when the source can; `Ok(None)` when it cannot or the chain is broken. The loader checks what it
    /// gets and walks step by step when in doubt, so a source may always answer `None`.
    ///
    /// # Errors
    /// When the source cannot be read.
    fn ancestors(&self, id: TaskId, max: usize) -> Result<Option<Vec<Task>>, Self::Error> {
        let _ = (id, max);
        Ok(None)
    }

    /// The tasks whose parent is `id`, oldest first, at most `max`: what a resumed lead's preamble
    /// lists as the subtasks it delegated. A source that cannot list children answers none.
    ///
    /// # Errors
    /// When the source cannot be read.
    fn children(&self, id: TaskId, max: usize) -> Result<Vec<Task>, Self::Error> {
        let _ = (id, max);
        Ok(Vec::new())
    }
}

/// Rows held in memory: a real, bounded source for the simulator and tests (ordered maps, deterministic),
/// and what a coordinator node sends a worker for a remote specialist's preamble (serde).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RowSet {
    /// Tasks by id.
    pub tasks: BTreeMap<TaskId, Task>,
    /// Session log rows by task, oldest first.
    pub logs: BTreeMap<TaskId, Vec<(u64, SessionLogRow)>>,
}

impl RowSet {
    /// Adds or replaces a task.
    pub fn put_task(&mut self, task: Task) {
        self.tasks.insert(task.id, task);
    }

    /// Appends a log row to a task's log, numbered after the last one.
    pub fn append_log(&mut self, task: TaskId, row: SessionLogRow) {
        let log = self.logs.entry(task).or_default();
        let seq = log.last().map_or(0, |(s, _)| s + 1);
        log.push((seq, row));
    }
}

impl ThreadSource for RowSet {
    type Error = std::convert::Infallible;

    fn task(&self, id: TaskId) -> Result<Option<Task>, Self::Error> {
        Ok(self.tasks.get(&id).cloned())
    }

    fn log_tail(
        &self,
        id: TaskId,
        rows_max: usize,
    ) -> Result<Vec<(u64, SessionLogRow)>, Self::Error> {
        let log = self.logs.get(&id).map_or(&[][..], Vec::as_slice);
        Ok(log[log.len().saturating_sub(rows_max)..].to_vec())
    }

    /// Answers as the store does: follows parent links up to `max` without checking them (a cycle
    /// repeats tasks), and `None` when a link dangles; so the loader's checks are tested on both.
    fn ancestors(&self, id: TaskId, max: usize) -> Result<Option<Vec<Task>>, Self::Error> {
        let Some(mut current) = self.tasks.get(&id) else {
            return Ok(None);
        };
        let mut chain = Vec::new();
        while chain.len() < max {
            let Some(parent) = current.parent else {
                break;
            };
            let Some(parent) = self.tasks.get(&parent) else {
                return Ok(None);
            };
            chain.push(parent.clone());
            current = parent;
        }
        Ok(Some(chain))
    }

    /// Task ids are minted in time order, so id order is creation order.
    fn children(&self, id: TaskId, max: usize) -> Result<Vec<Task>, Self::Error> {
        Ok(self
            .tasks
            .values()
            .filter(|t| t.parent == Some(id))
            .take(max)
            .cloned()
            .collect())
    }
}

/// The store, through one run's scope: a task of another run is not found here, by construction
/// (invariant 9), so a walk that reaches one ends as a missing parent.
impl ThreadSource for RunScope<'_> {
    type Error = ReadError;

    fn task(&self, id: TaskId) -> Result<Option<Task>, Self::Error> {
        match RunScope::task(self, id) {
            Ok(task) => Ok(Some(task)),
            Err(ReadError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn log_tail(
        &self,
        id: TaskId,
        rows_max: usize,
    ) -> Result<Vec<(u64, SessionLogRow)>, Self::Error> {
        let n = u32::try_from(rows_max).unwrap_or(u32::MAX);
        match self.last_log_rows(id, n) {
            Ok(rows) => Ok(rows.into_iter().map(|r| (r.seq, r.value)).collect()),
            Err(ReadError::NotFound { .. }) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    fn ancestors(&self, id: TaskId, max: usize) -> Result<Option<Vec<Task>>, Self::Error> {
        let max = u32::try_from(max).unwrap_or(u32::MAX);
        match RunScope::ancestors(self, id, max) {
            Ok(chain) => Ok(Some(chain)),
            // A dangling link: the step-by-step walk finds where and says so.
            Err(ReadError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn children(&self, id: TaskId, max: usize) -> Result<Vec<Task>, Self::Error> {
        let max = u32::try_from(max).unwrap_or(u32::MAX);
        match RunScope::children(self, id, max) {
            Ok(listing) => Ok(listing.items),
            Err(ReadError::NotFound { .. }) => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }
}

/// A view could not be loaded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LoadError {
    /// The task itself is not in the source.
    #[error("task {0} not found")]
    TaskNotFound(TaskId),
    /// The source failed.
    #[error("reading the store failed: {0}")]
    Source(#[source] Box<dyn std::error::Error + Send + Sync>),
}

fn source<E: std::error::Error + Send + Sync + 'static>(e: E) -> LoadError {
    LoadError::Source(Box::new(e))
}

/// Walks up from `task` through parent links, at most `steps_max` steps, while `follow` accepts the task
/// reached. Returns the tasks walked (nearest first) and how the walk ended. Terminates on any data: a
/// step limit, and a visited set that stops at the first repeat.
fn walk<S: ThreadSource>(
    src: &S,
    task: &Task,
    steps_max: usize,
    follow: impl Fn(&Task) -> bool,
) -> Result<(Vec<Task>, WalkEnd), LoadError> {
    if let Some(chain) = src.ancestors(task.id, steps_max).map_err(source)?
        && let Some(checked) = check_chain(task, chain, steps_max, &follow)
    {
        return Ok(checked);
    }
    let mut visited: BTreeSet<TaskId> = BTreeSet::new();
    visited.insert(task.id);
    let mut walked: Vec<Task> = Vec::new();
    let mut current = task.clone();
    loop {
        let Some(parent_id) = current.parent else {
            return Ok((walked, WalkEnd::Root));
        };
        if !follow(&current) {
            return Ok((walked, WalkEnd::Root));
        }
        if walked.len() >= steps_max {
            return Ok((walked, WalkEnd::Limit));
        }
        if !visited.insert(parent_id) {
            return Ok((walked, WalkEnd::Cycle(parent_id)));
        }
        let Some(parent) = src.task(parent_id).map_err(source)? else {
            return Ok((walked, WalkEnd::Missing(parent_id)));
        };
        if parent.run_id != task.run_id {
            return Ok((walked, WalkEnd::OtherRun(parent_id)));
        }
        walked.push(parent.clone());
        current = parent;
    }
}

/// Replays the walk over a chain read at once, with the same rules (links, repeats, run, limit).
/// `None` when the chain does not prove where the walk ends: the caller then walks step by step.
fn check_chain(
    task: &Task,
    chain: Vec<Task>,
    steps_max: usize,
    follow: &impl Fn(&Task) -> bool,
) -> Option<(Vec<Task>, WalkEnd)> {
    let mut visited: BTreeSet<TaskId> = BTreeSet::new();
    visited.insert(task.id);
    let mut cut: Option<(usize, WalkEnd)> = None;
    for (i, ancestor) in chain.iter().enumerate() {
        let current = if i == 0 { task } else { &chain[i - 1] };
        if i >= steps_max || current.parent != Some(ancestor.id) || !follow(current) {
            return None;
        }
        if !visited.insert(ancestor.id) {
            cut = Some((i, WalkEnd::Cycle(ancestor.id)));
            break;
        }
        if ancestor.run_id != task.run_id {
            cut = Some((i, WalkEnd::OtherRun(ancestor.id)));
            break;
        }
    }
    if let Some((i, end)) = cut {
        let mut chain = chain;
        chain.truncate(i);
        return Some((chain, end));
    }
    let last = chain.last().unwrap_or(task);
    let end = if last.parent.is_none() || !follow(last) {
        WalkEnd::Root
    } else if chain.len() >= steps_max {
        WalkEnd::Limit
    } else {
        return None;
    };
    Some((chain, end))
}

fn load_task<S: ThreadSource>(src: &S, id: TaskId) -> Result<Task, LoadError> {
    src.task(id)
        .map_err(source)?
        .ok_or(LoadError::TaskNotFound(id))
}

/// Loads a task and at most [`ContextConfig::ancestors_max`] ancestors for [`standard_preamble`].
///
/// # Errors
/// [`LoadError`] when the task is missing or the source fails (a missing ancestor is not an error: the
/// walk ends there and the preamble says so).
pub fn load_thread<S: ThreadSource>(
    src: &S,
    id: TaskId,
    config: &ContextConfig,
) -> Result<ThreadView, LoadError> {
    let task = load_task(src, id)?;
    let (ancestors, walk_end) = walk(src, &task, usize::from(config.ancestors_max), |_| true)?;
    Ok(ThreadView {
        task,
        ancestors,
        walk_end,
    })
}

/// Loads an interrupted task, the attempts it re-dispatches back to the original, and their last
/// session log rows, for [`resume_preamble`].
///
/// # Errors
/// [`LoadError`] when the task is missing or the source fails.
pub fn load_resume<S: ThreadSource>(
    src: &S,
    id: TaskId,
    config: &ContextConfig,
) -> Result<ResumeView, LoadError> {
    let task = load_task(src, id)?;
    // Follow a link only out of a re-dispatch: its parent is the attempt it continues.
    let (earlier_attempts, walk_end) =
        walk(src, &task, usize::from(config.redispatch_chain_max), |t| {
            t.kind == TaskKind::Redispatch
        })?;
    // Newest attempt first, until enough steps are collected; steering rows ride along in the window.
    let steps_wanted = usize::from(config.log_rows_max);
    let window = steps_wanted * 2 + usize::from(config.steering_count_max);
    let mut per_attempt: Vec<Vec<LogEntry>> = Vec::new();
    let mut steps = 0usize;
    for attempt in std::iter::once(&task).chain(earlier_attempts.iter()) {
        if steps >= steps_wanted {
            break;
        }
        let rows = src.log_tail(attempt.id, window).map_err(source)?;
        steps += rows
            .iter()
            .filter(|(_, r)| {
                !matches!(
                    r.kind,
                    keel_store::LogKind::Usage | keel_store::LogKind::Steering
                )
            })
            .count();
        per_attempt.push(
            rows.into_iter()
                .map(|(seq, row)| LogEntry {
                    task: attempt.id,
                    seq,
                    row,
                })
                .collect(),
        );
    }
    let log = per_attempt.into_iter().rev().flatten().collect();
    // The subtasks delegated from the task and its earlier attempts (a lead's; a re-dispatch of the
    // lead delegates under the run's root), oldest first.
    let delegated_max = usize::from(config.delegated_max);
    let mut delegated: Vec<Task> = Vec::new();
    for attempt in std::iter::once(&task).chain(earlier_attempts.iter()) {
        let children = src.children(attempt.id, delegated_max).map_err(source)?;
        delegated.extend(
            children
                .into_iter()
                .filter(|t| t.kind == TaskKind::Subtask && t.id != task.id),
        );
    }
    delegated.sort_by_key(|t| t.id);
    delegated.dedup_by_key(|t| t.id);
    delegated.truncate(delegated_max);
    Ok(ResumeView {
        task,
        earlier_attempts,
        walk_end,
        log,
        delegated,
    })
}

/// The instruction that ends a resume prompt (after the preamble, which carries the brief itself).
pub const RESUME_INSTRUCTION: &str =
    "Continue the task above from where it stopped. Report what you finish as usual.";

/// Exactly what a new session of a task would get: what `keel context TASK [--resume]` prints.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContextReport {
    /// The task, as a ULID.
    pub task: String,
    /// How the session starts (in JSON: `{"kind": "standard", "parent": ULID}` and the like).
    #[serde(with = "crate::report::continuity_json")]
    pub start: Continuity,
    /// The preamble, if the session gets one (a fresh root task gets none).
    pub preamble: Option<Preamble>,
    /// The whole first message: the preamble placed into the prompt.
    pub prompt: String,
    /// Its size in characters.
    pub prompt_chars: u32,
}

impl fmt::Display for ContextReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.preamble {
            None => writeln!(
                f,
                "task {}: no preamble (a fresh task without a parent gets its brief alone)",
                self.task
            )?,
            Some(p) => {
                writeln!(
                    f,
                    "task {}: {} preamble, {} of {} characters{}",
                    self.task,
                    p.kind,
                    p.chars,
                    p.chars_max,
                    if p.brief_over_cap {
                        " (over the cap: the brief alone is larger, and is never cut)"
                    } else {
                        ""
                    }
                )?;
                if p.truncations.is_empty() {
                    writeln!(f, "truncated: nothing")?;
                } else {
                    let cuts: Vec<String> = p.truncations.iter().map(ToString::to_string).collect();
                    writeln!(f, "truncated: {}", cuts.join(", "))?;
                }
                if p.redactions.is_empty() {
                    writeln!(f, "redacted: nothing")?;
                } else {
                    let r: Vec<String> = p
                        .redactions
                        .iter()
                        .map(|(k, n)| format!("{k} x{n}"))
                        .collect();
                    writeln!(f, "redacted: {}", r.join(", "))?;
                }
            }
        }
        writeln!(f, "---- prompt ({} characters) ----", self.prompt_chars)?;
        f.write_str(&self.prompt)?;
        if !self.prompt.ends_with('\n') {
            writeln!(f)?;
        }
        Ok(())
    }
}

/// `keel context` could not build its report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ContextError {
    /// The configuration is out of range.
    #[error(transparent)]
    Config(#[from] ContextConfigError),
    /// The rows could not be loaded.
    #[error(transparent)]
    Load(#[from] LoadError),
}

/// Builds exactly the first message a new session of `task` would get, with its preamble's size, cuts
/// and redactions.
///
/// # Errors
/// [`ContextError`] when the config is invalid, the task is missing, or the source fails.
pub fn context_for_task<S: ThreadSource>(
    src: &S,
    task: TaskId,
    start: Continuity,
    config: &ContextConfig,
    scrubber: &Scrubber,
) -> Result<ContextReport, ContextError> {
    config.validate()?;
    let (preamble, prompt) = match start {
        Continuity::Fresh => {
            // The brief alone, scrubbed like everything else that leaves keel.
            let task = src
                .task(task)
                .map_err(source)?
                .ok_or(LoadError::TaskNotFound(task))?;
            (None, scrubber.scrub(&task.brief).text.into_owned())
        }
        Continuity::Standard { .. } => {
            let view = load_thread(src, task, config)?;
            let preamble = standard_preamble(&view, config, scrubber);
            // The brief is the prompt; it is scrubbed like everything else that leaves keel.
            let brief = scrubber.scrub(&view.task.brief).text.into_owned();
            let prompt = match &preamble {
                Some(p) => place_preamble(&p.text, &brief),
                None => brief,
            };
            (preamble, prompt)
        }
        Continuity::Resume { .. } => {
            let view = load_resume(src, task, config)?;
            let preamble = resume_preamble(&view, config, scrubber);
            let prompt = resume_prompt(&preamble, &view, scrubber);
            (Some(preamble), prompt)
        }
    };
    let prompt_chars = u32::try_from(prompt.chars().count()).unwrap_or(u32::MAX);
    Ok(ContextReport {
        task: task.to_string(),
        start,
        preamble,
        prompt,
        prompt_chars,
    })
}

/// [`context_for_task`] on the store: finds the task's run, then reads only through that run's scope.
/// This is what `keel context TASK [--resume]` calls.
///
/// # Errors
/// [`ContextError`] when the config is invalid, no run has the task, or the store fails.
pub fn context_from_store(
    store: &Store,
    task: TaskId,
    start: Continuity,
    config: &ContextConfig,
    scrubber: &Scrubber,
) -> Result<ContextReport, ContextError> {
    config.validate()?;
    let run = match store.catalog().locate_task(task) {
        Ok(run) => run,
        Err(ReadError::NotFound { .. }) => return Err(LoadError::TaskNotFound(task).into()),
        Err(e) => return Err(source(e).into()),
    };
    context_for_task(&store.run(run), task, start, config, scrubber)
}

/// The first message of a resumed session: the preamble (which carries the brief verbatim) and the
/// instruction to continue. When the original brief opens with a slash skill, that line stays line one.
pub fn resume_prompt(preamble: &Preamble, view: &ResumeView, scrubber: &Scrubber) -> String {
    let (original, _) = view.original();
    let first = original.brief.lines().next().unwrap_or("");
    let body = if super::placement::is_slash_skill_line(first) {
        // The skill's arguments leave keel too: scrubbed like the brief in the preamble.
        let first = scrubber.scrub(first);
        format!("{}\n{RESUME_INSTRUCTION}", first.text)
    } else {
        RESUME_INSTRUCTION.to_owned()
    };
    place_preamble(&preamble.text, &body)
}
