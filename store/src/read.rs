//! Read helpers shared by [`crate::RunScope`] and [`crate::Catalog`]. Every function here takes the run
//! explicitly and builds keys only inside that run's range; the scope passes its own run, the catalog
//! the run it located.

use std::collections::BTreeMap;

use redb::TableDefinition;

use crate::codec;
use crate::error::ReadError;
use crate::limits::{LimitError, Limits};
use crate::log_segment;
use crate::model::{ManifestEntry, Run, RunId, SessionLogRow, Task, TaskId};
use crate::snapshot::{Snapshot, View};
use crate::tables::{self, Row, name};
use crate::task_state::{States, TaskHead};

/// Rows of a bounded read, with whether more rows were left unread (never truncated silently).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing<T> {
    /// The rows read, in key order.
    pub items: Vec<T>,
    /// Whether rows beyond `items` exist; ask again after the last one to read on.
    pub more: bool,
}

/// One page of runs, newest first, with how many older runs it leaves out: a list that stops at
/// its limit says so, and the next page starts before its last run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunPage {
    /// The runs, newest first.
    pub items: Vec<Run>,
    /// How many runs are older than the last one shown.
    pub older: u64,
}

/// A row of an ordered per-run or per-task table, with its sequence number.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sequenced<T> {
    /// The row's sequence number (1 for the first row).
    pub seq: u64,
    /// The row.
    pub value: T,
}

/// One task of a run's tree, with its level in the tree (0 for a root) for indentation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TreeNode {
    /// How many ancestors it has among the rows read.
    pub level: u32,
    /// The task.
    pub task: Task,
}

pub(crate) fn check_limit(limits: &Limits, n: u32) -> Result<usize, ReadError> {
    if u64::from(n) > limits.read_rows_max {
        return Err(ReadError::TooManyRows(LimitError {
            field: "read.rows",
            size: u64::from(n),
            limit: limits.read_rows_max,
        }));
    }
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

pub(crate) fn get_run(txn: &Snapshot<'_>, run: RunId) -> Result<Run, ReadError> {
    let table = txn.open_table(tables::RUNS)?;
    let plans = Plans::open(txn)?;
    match table.get(run.0)? {
        None => Err(ReadError::NotFound {
            what: "run",
            key: run.to_string(),
        }),
        Some(g) => plans.attach(codec::decode(name::RUNS, &run, g.value())?),
    }
}

/// The plans table of a read, to put each run's plan back into its row (store format 2 keeps it
/// beside the row). Absent in a format-1 store opened read-only, whose rows still hold their plans.
pub(crate) struct Plans<'s>(Option<View<'s, u128, Row>>);

/// A table a store of an older format opened read-only may not have (a read-only open does not
/// upgrade): `None` then.
pub(crate) fn table_if_any<'s, K: redb::Key + 'static, V: redb::Value + 'static>(
    txn: &'s Snapshot<'_>,
    definition: TableDefinition<'static, K, V>,
) -> Result<Option<View<'s, K, V>>, ReadError> {
    match txn.open_table(definition) {
        Ok(table) => Ok(Some(table)),
        Err(redb::TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

impl<'s> Plans<'s> {
    pub(crate) fn open(txn: &'s Snapshot<'_>) -> Result<Self, ReadError> {
        table_if_any(txn, tables::RUN_PLANS).map(Self)
    }

    /// The run with its plan (a row that holds its own plan, written by format 1, keeps it).
    pub(crate) fn attach(&self, mut run: Run) -> Result<Run, ReadError> {
        if run.plan.is_none()
            && let Some(table) = &self.0
            && let Some(g) = table.get(run.id.0)?
        {
            run.plan = Some(String::from_utf8(g.value().to_vec()).map_err(|e| {
                codec::DecodeError::Corrupt {
                    table: name::RUN_PLANS,
                    key: run.id.to_string(),
                    reason: e.to_string(),
                }
            })?);
        }
        Ok(run)
    }
}

/// Whether the store's open-runs index can be trusted in this read: the store is of format 2 or
/// later (a format-1 store opened read-only has none).
fn open_runs_indexed(txn: &Snapshot<'_>) -> Result<bool, ReadError> {
    let meta = txn.open_table(tables::META)?;
    let format = meta.get("store_format")?.map_or(0, |g| g.value());
    Ok(format >= crate::upgrade::FORMAT_OPEN_RUNS_INDEX)
}

pub(crate) fn get_task(txn: &Snapshot<'_>, run: RunId, task: TaskId) -> Result<Task, ReadError> {
    let table = txn.open_table(tables::TASKS)?;
    match table.get((run.0, task.0))? {
        None => Err(ReadError::NotFound {
            what: "task",
            key: task.to_string(),
        }),
        Some(g) => States::open(txn)?.attach(codec::decode(
            name::TASKS,
            &format_args!("{run}/{task}"),
            g.value(),
        )?),
    }
}

pub(crate) fn require_task(txn: &Snapshot<'_>, run: RunId, task: TaskId) -> Result<(), ReadError> {
    let table = txn.open_table(tables::TASKS)?;
    if table.get((run.0, task.0))?.is_none() {
        return Err(ReadError::NotFound {
            what: "task",
            key: task.to_string(),
        });
    }
    Ok(())
}

pub(crate) fn tasks_of_run(
    txn: &Snapshot<'_>,
    run: RunId,
    after: Option<TaskId>,
    limit: usize,
) -> Result<Listing<Task>, ReadError> {
    let table = txn.open_table(tables::TASKS)?;
    let states = States::open(txn)?;
    let start = match after {
        None => 0,
        Some(t) => match t.0.checked_add(1) {
            Some(s) => s,
            None => {
                return Ok(Listing {
                    items: Vec::new(),
                    more: false,
                });
            }
        },
    };
    let mut items = Vec::new();
    let mut more = false;
    for entry in table.range((run.0, start)..=(run.0, u128::MAX))? {
        let (k, v) = entry?;
        if items.len() == limit {
            more = true;
            break;
        }
        let (_, t) = k.value();
        items.push(states.attach(codec::decode(
            name::TASKS,
            &format_args!("{run}/{}", TaskId(t)),
            v.value(),
        )?)?);
    }
    Ok(Listing { items, more })
}

pub(crate) fn all_tasks(txn: &Snapshot<'_>, limit: usize) -> Result<Listing<Task>, ReadError> {
    let table = txn.open_table(tables::TASKS)?;
    let states = States::open(txn)?;
    let mut items = Vec::new();
    let mut more = false;
    for entry in table.iter()? {
        let (k, v) = entry?;
        if items.len() == limit {
            more = true;
            break;
        }
        let (r, t) = k.value();
        items.push(states.attach(codec::decode(
            name::TASKS,
            &format_args!("{}/{}", RunId(r), TaskId(t)),
            v.value(),
        )?)?);
    }
    Ok(Listing { items, more })
}

pub(crate) fn runs(txn: &Snapshot<'_>, limit: usize) -> Result<Listing<Run>, ReadError> {
    let table = txn.open_table(tables::RUNS)?;
    let plans = Plans::open(txn)?;
    let mut items = Vec::new();
    let mut more = false;
    for entry in table.iter()? {
        let (k, v) = entry?;
        if items.len() == limit {
            more = true;
            break;
        }
        items.push(plans.attach(codec::decode(name::RUNS, &RunId(k.value()), v.value())?)?);
    }
    Ok(Listing { items, more })
}

/// Runs newest first (the highest ids: ULIDs sort by creation time), only those older than
/// `before` when given, at most `limit`, and the count of older runs left out. Reads one page: the
/// count is the table's length (kept by redb) less the runs at or after the page's last one, which
/// are counted by key only from the first page down to it (none for the first page).
pub(crate) fn runs_newest_first(
    txn: &Snapshot<'_>,
    before: Option<RunId>,
    limit: usize,
) -> Result<RunPage, ReadError> {
    let table = txn.open_table(tables::RUNS)?;
    let plans = Plans::open(txn)?;
    let mut rows = match before {
        Some(before) => table.range(..before.0)?,
        None => table.range::<u128>(..)?,
    }
    .rev();
    let mut items = Vec::new();
    while items.len() < limit {
        let Some(entry) = rows.next() else { break };
        let (k, v) = entry?;
        items.push(plans.attach(codec::decode(name::RUNS, &RunId(k.value()), v.value())?)?);
    }
    drop(rows);
    if items.len() < limit {
        return Ok(RunPage { items, older: 0 });
    }
    let mut newer = 0u64;
    if let Some(before) = before {
        for entry in table.range(before.0..)? {
            entry?;
            newer += 1;
        }
    }
    let shown = u64::try_from(items.len()).unwrap_or(u64::MAX);
    let older = table.len()?.saturating_sub(newer).saturating_sub(shown);
    Ok(RunPage { items, older })
}

/// Every run that is not terminal, in id order (oldest first), at most `limit` of them, however
/// many terminal runs the store holds: read through the open-runs index, one row per open run (a
/// format-1 store opened read-only has no index: every run row is read).
pub(crate) fn open_runs(txn: &Snapshot<'_>, limit: usize) -> Result<Listing<Run>, ReadError> {
    if !open_runs_indexed(txn)? {
        return open_runs_scanned(txn, limit);
    }
    let index = txn.open_table(tables::OPEN_RUNS)?;
    let mut items = Vec::new();
    let mut more = false;
    for entry in index.iter()? {
        let (k, _) = entry?;
        if items.len() == limit {
            more = true;
            break;
        }
        items.push(get_run(txn, RunId(k.value()))?);
    }
    Ok(Listing { items, more })
}

/// [`open_runs`] without the index: every run row decoded.
fn open_runs_scanned(txn: &Snapshot<'_>, limit: usize) -> Result<Listing<Run>, ReadError> {
    let table = txn.open_table(tables::RUNS)?;
    let mut items = Vec::new();
    let mut more = false;
    for entry in table.iter()? {
        let (k, v) = entry?;
        let run: Run = codec::decode(name::RUNS, &RunId(k.value()), v.value())?;
        if run.status.is_terminal() {
            continue;
        }
        if items.len() == limit {
            more = true;
            break;
        }
        items.push(run);
    }
    Ok(Listing { items, more })
}

/// The run with the highest id: the newest, as run ids are ULIDs that sort by creation time.
pub(crate) fn latest_run(txn: &Snapshot<'_>) -> Result<Option<Run>, ReadError> {
    let table = txn.open_table(tables::RUNS)?;
    let Some(entry) = table.iter()?.next_back() else {
        return Ok(None);
    };
    let (k, v) = entry?;
    let run = codec::decode(name::RUNS, &RunId(k.value()), v.value())?;
    Ok(Some(Plans::open(txn)?.attach(run)?))
}

pub(crate) fn children(
    txn: &Snapshot<'_>,
    run: RunId,
    parent: TaskId,
    limit: usize,
) -> Result<Listing<Task>, ReadError> {
    let head = task_head(txn, run, parent)?;
    if head.parent.is_none() {
        return children_of_root(txn, run, parent, limit);
    }
    let index = txn.open_table(tables::TASK_CHILDREN)?;
    let mut items = Vec::new();
    let mut more = false;
    for entry in index.range((run.0, parent.0, 0u128)..=(run.0, parent.0, u128::MAX))? {
        let (k, _) = entry?;
        if items.len() == limit {
            more = true;
            break;
        }
        let (_, _, child) = k.value();
        items.push(get_task(txn, run, TaskId(child))?);
    }
    Ok(Listing { items, more })
}

/// The once-written fields of stored task `task` of `run`.
fn task_head(txn: &Snapshot<'_>, run: RunId, task: TaskId) -> Result<TaskHead, ReadError> {
    let table = txn.open_table(tables::TASKS)?;
    match table.get((run.0, task.0))? {
        None => Err(ReadError::NotFound {
            what: "task",
            key: task.to_string(),
        }),
        Some(g) => Ok(codec::decode_prefix(
            name::TASKS,
            &format_args!("{run}/{task}"),
            g.value(),
        )?),
    }
}

/// [`children`] of a root, which are not indexed (store format 6; an older store's index rows for
/// them are not needed): the run's task rows in id order, each read as far as its parent, the
/// children decoded whole.
fn children_of_root(
    txn: &Snapshot<'_>,
    run: RunId,
    root: TaskId,
    limit: usize,
) -> Result<Listing<Task>, ReadError> {
    let table = txn.open_table(tables::TASKS)?;
    let states = States::open(txn)?;
    let mut items = Vec::new();
    let mut more = false;
    for entry in table.range((run.0, 0u128)..=(run.0, u128::MAX))? {
        let (k, v) = entry?;
        let (_, id) = k.value();
        let key = format_args!("{run}/{}", TaskId(id));
        let head: TaskHead = codec::decode_prefix(name::TASKS, &key, v.value())?;
        if head.parent != Some(root) {
            continue;
        }
        if items.len() == limit {
            more = true;
            break;
        }
        items.push(states.attach(codec::decode(name::TASKS, &key, v.value())?)?);
    }
    Ok(Listing { items, more })
}

pub(crate) fn ancestors(
    txn: &Snapshot<'_>,
    run: RunId,
    task: TaskId,
    max: usize,
) -> Result<Vec<Task>, ReadError> {
    let mut current = get_task(txn, run, task)?;
    let mut chain = Vec::new();
    while chain.len() < max {
        let Some(parent) = current.parent else { break };
        let parent = get_task(txn, run, parent)?;
        chain.push(parent.clone());
        current = parent;
    }
    Ok(chain)
}

pub(crate) fn tree(
    txn: &Snapshot<'_>,
    run: RunId,
    limit: usize,
) -> Result<Listing<TreeNode>, ReadError> {
    get_run(txn, run)?;
    let Listing { items, more } = tasks_of_run(txn, run, None, limit)?;
    let mut by_id: BTreeMap<TaskId, Task> = items.into_iter().map(|t| (t.id, t)).collect();
    let mut kids: BTreeMap<TaskId, Vec<TaskId>> = BTreeMap::new();
    let mut roots = Vec::new();
    for t in by_id.values() {
        match t.parent {
            Some(p) if by_id.contains_key(&p) => kids.entry(p).or_default().push(t.id),
            _ => roots.push(t.id),
        }
    }
    // Depth-first, children in id order (ULIDs: creation order). An explicit stack bounds the walk
    // by the number of rows read, whatever the tree's shape.
    let mut out = Vec::with_capacity(by_id.len());
    let mut stack: Vec<(TaskId, u32)> = roots.into_iter().rev().map(|id| (id, 0)).collect();
    while let Some((id, level)) = stack.pop() {
        if let Some(children) = kids.get(&id) {
            stack.extend(children.iter().rev().map(|c| (*c, level.saturating_add(1))));
        }
        if let Some(task) = by_id.remove(&id) {
            out.push(TreeNode { level, task });
        }
    }
    Ok(Listing { items: out, more })
}

/// The last `n` rows of a task's log, oldest first: entries read from the end, each expanded into
/// its rows (a segment holds several, see `log_segment`).
pub(crate) fn last_log_rows(
    txn: &Snapshot<'_>,
    run: RunId,
    task: TaskId,
    n: usize,
) -> Result<Vec<Sequenced<SessionLogRow>>, ReadError> {
    require_task(txn, run, task)?;
    let table = txn.open_table(tables::SESSION_LOGS)?;
    let mut rows = Vec::with_capacity(n.min(1024));
    if n == 0 {
        return Ok(rows);
    }
    for entry in table
        .range((run.0, task.0, 0u64)..=(run.0, task.0, u64::MAX))?
        .rev()
    {
        let (k, v) = entry?;
        let seq = k.value().2;
        let entry_rows = log_segment::rows_of(
            name::SESSION_LOGS,
            &format_args!("{run}/{task}/{seq}"),
            seq,
            v.value(),
        )?;
        rows.extend(entry_rows.into_iter().rev().take(n - rows.len()));
        if rows.len() == n {
            break;
        }
    }
    rows.reverse();
    Ok(rows)
}

/// The rows of a task's log numbered after `after`, at most `limit`, oldest first. A segment
/// holding `after + 1` starts before it, so the read starts at the last entry at or before it.
pub(crate) fn log_rows_after(
    txn: &Snapshot<'_>,
    run: RunId,
    task: TaskId,
    after: u64,
    limit: usize,
) -> Result<Listing<Sequenced<SessionLogRow>>, ReadError> {
    require_task(txn, run, task)?;
    let table = txn.open_table(tables::SESSION_LOGS)?;
    let mut items = Vec::new();
    let mut more = false;
    let Some(start) = after.checked_add(1) else {
        return Ok(Listing { items, more });
    };
    let from = match table
        .range((run.0, task.0, 0u64)..=(run.0, task.0, start))?
        .next_back()
    {
        Some(entry) => entry?.0.value().2,
        None => start,
    };
    for entry in table.range((run.0, task.0, from)..=(run.0, task.0, u64::MAX))? {
        let (k, v) = entry?;
        let seq = k.value().2;
        let rows = log_segment::rows_of(
            name::SESSION_LOGS,
            &format_args!("{run}/{task}/{seq}"),
            seq,
            v.value(),
        )?;
        if take_from(rows, start, limit, &mut items) {
            more = true;
            break;
        }
    }
    Ok(Listing { items, more })
}

/// Moves the rows of one stored entry (a row or a segment's rows) numbered `start` or later into
/// `items`, up to `limit` in all; answers whether a row was left out for the limit.
fn take_from<T>(
    rows: Vec<Sequenced<T>>,
    start: u64,
    limit: usize,
    items: &mut Vec<Sequenced<T>>,
) -> bool {
    for row in rows.into_iter().filter(|row| row.seq >= start) {
        if items.len() == limit {
            return true;
        }
        items.push(row);
    }
    false
}

/// [`seq_rows`] of the manifest, whose entries staged in one commit are one segment (store format
/// 6, `log_segment`): a segment holding `after + 1` starts before it, so the read starts at the
/// last key at or before it and expands each segment into its entries.
pub(crate) fn manifest_rows(
    txn: &Snapshot<'_>,
    run: RunId,
    after: u64,
    limit: usize,
) -> Result<Listing<Sequenced<ManifestEntry>>, ReadError> {
    let table = txn.open_table(tables::MANIFEST)?;
    let mut items = Vec::new();
    let mut more = false;
    let Some(start) = after.checked_add(1) else {
        return Ok(Listing { items, more });
    };
    let from = match table.range((run.0, 0u64)..=(run.0, start))?.next_back() {
        Some(entry) => entry?.0.value().1,
        None => start,
    };
    for entry in table.range((run.0, from)..=(run.0, u64::MAX))? {
        let (k, v) = entry?;
        let seq = k.value().1;
        let rows =
            log_segment::rows_of(name::MANIFEST, &format_args!("{run}/{seq}"), seq, v.value())?;
        if take_from(rows, start, limit, &mut items) {
            more = true;
            break;
        }
    }
    Ok(Listing { items, more })
}

pub(crate) fn seq_rows<T: crate::codec::Record>(
    txn: &Snapshot<'_>,
    def: TableDefinition<'_, tables::RunSeq, Row>,
    table_name: &'static str,
    run: RunId,
    after: u64,
    limit: usize,
) -> Result<Listing<Sequenced<T>>, ReadError> {
    let table = txn.open_table(def)?;
    let mut items = Vec::new();
    let mut more = false;
    let Some(start) = after.checked_add(1) else {
        return Ok(Listing { items, more });
    };
    for entry in table.range((run.0, start)..=(run.0, u64::MAX))? {
        let (k, v) = entry?;
        if items.len() == limit {
            more = true;
            break;
        }
        let seq = k.value().1;
        items.push(Sequenced {
            seq,
            value: codec::decode(table_name, &format_args!("{run}/{seq}"), v.value())?,
        });
    }
    Ok(Listing { items, more })
}

pub(crate) fn locate_task(txn: &Snapshot<'_>, task: TaskId) -> Result<RunId, ReadError> {
    let table = txn.open_table(tables::TASK_RUN)?;
    match table.get(task.0)? {
        None => Err(ReadError::NotFound {
            what: "task",
            key: task.to_string(),
        }),
        Some(g) => Ok(RunId(g.value())),
    }
}
