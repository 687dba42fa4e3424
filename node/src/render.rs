//! How read commands print: readable tables for people, `--json` for scripts. The JSON views spell ids as
//! ULID strings (a 128-bit number does not survive a JavaScript reader) and carry every field of the row.

use std::io::Write;
use std::path::Path;
use std::time::{Duration, UNIX_EPOCH};

use comfy_table::{ContentArrangement, Table, presets::UTF8_BORDERS_ONLY};
use keel_store::{
    Attachment, AttachmentBody, AuditEntry, Listing, LogKind, Run, RunId, RunPage, Sequenced,
    SessionLogRow, Task, TaskId, TreeNode,
};
use serde::Serialize;
use serde_json::json;

use keel_actors::context::{ContextReport, Redactions};

use crate::config::Config;
use crate::exit::Failed;
use crate::home::{Created, Home};

/// The longest brief shown in one table cell; `keel show` prints the whole brief.
const BRIEF_CELL_CHARS_MAX: usize = 60;

/// The longest log summary shown in one table cell; `--json` carries the whole row.
const SUMMARY_CELL_CHARS_MAX: usize = 120;

/// Where and how a command prints.
pub(crate) struct Output {
    json: bool,
}

impl Output {
    pub(crate) fn new(json: bool) -> Self {
        Self { json }
    }

    /// Whether `--json` was asked for.
    pub(crate) fn json(&self) -> bool {
        self.json
    }

    fn print_json(&self, value: &impl Serialize) -> std::io::Result<()> {
        // String by string, so the output stays valid JSON (issue 16).
        let mut value = serde_json::to_value(value)?;
        crate::redact::json(&mut value);
        let mut out = crate::stdout::lock();
        serde_json::to_writer_pretty(&mut out, &value)?;
        writeln!(out)
    }

    fn print(&self, text: &str) -> std::io::Result<()> {
        let mut out = crate::stdout::lock();
        writeln!(out, "{text}")
    }

    pub(crate) fn init(&self, home: &Home, store: &Path, created: Created) -> std::io::Result<()> {
        if self.json {
            return self.print_json(&json!({
                "home": home.dir(),
                "store": store,
                "config": home.config_path(),
                "created_store": created.store,
                "created_config": created.config,
            }));
        }
        let verb = |made: bool| if made { "created" } else { "kept existing" };
        self.print(&format!(
            "keel home {}\n  store   {} ({})\n  config  {} ({})",
            home.dir().display(),
            store.display(),
            verb(created.store),
            home.config_path().display(),
            verb(created.config),
        ))
    }

    pub(crate) fn config(&self, home: &Home, config: &Config) -> Result<(), Failed> {
        if self.json {
            return Ok(self.print_json(config)?);
        }
        let text = toml::to_string_pretty(config)?;
        Ok(self.print(&format!(
            "# {} is valid; the configuration in effect:\n{text}",
            home.config_path().display()
        ))?)
    }

    pub(crate) fn context(&self, report: &ContextReport) -> std::io::Result<()> {
        if self.json {
            return self.print_json(report);
        }
        let mut out = crate::stdout::lock();
        write!(out, "{report}")
    }

    /// A page of runs, newest first, then how many older runs it leaves out and the command that
    /// shows them (`limit` is the page's size, repeated in that command).
    pub(crate) fn runs(&self, runs: &RunPage, limit: u32) -> std::io::Result<()> {
        let next = runs
            .items
            .last()
            .filter(|_| runs.older > 0)
            .map(|last| format!("keel runs --before {} --limit {limit}", last.id));
        if self.json {
            let items: Vec<_> = runs.items.iter().map(run_json).collect();
            return self.print_json(&json!({
                "runs": items,
                "more": runs.older > 0,
                "older": runs.older,
                "next": next,
            }));
        }
        if runs.items.is_empty() {
            return self.print("no runs yet");
        }
        let mut table = table(&["RUN", "STATUS", "CREATED", "BRIEF"]);
        for run in &runs.items {
            table.add_row(vec![
                run.id.to_string(),
                format!("{:?}", run.status),
                timestamp(run.created_ms),
                cell(&run.brief),
            ]);
        }
        self.print(&table.to_string())?;
        match next {
            Some(next) => self.print(&format!(
                "{} older {} not shown: {next}",
                runs.older,
                if runs.older == 1 { "run" } else { "runs" }
            )),
            None => Ok(()),
        }
    }

    pub(crate) fn tasks(&self, tasks: &Listing<Task>) -> std::io::Result<()> {
        if self.json {
            let items: Vec<_> = tasks.items.iter().map(task_json).collect();
            return self.print_json(&json!({ "tasks": items, "more": tasks.more }));
        }
        if tasks.items.is_empty() {
            return self.print("no tasks yet");
        }
        let mut table = table(&[
            "TASK", "RUN", "KIND", "STATUS", "DEPTH", "ASSIGNEE", "MODEL", "BRIEF",
        ]);
        for t in &tasks.items {
            table.add_row(vec![
                t.id.to_string(),
                t.run_id.to_string(),
                format!("{:?}", t.kind),
                format!("{:?}", t.status),
                t.depth.to_string(),
                t.assignee.clone().unwrap_or_else(|| "-".into()),
                t.model.clone().unwrap_or_else(|| "-".into()),
                cell(&t.brief),
            ]);
        }
        self.print(&table.to_string())?;
        self.more(tasks.more)
    }

    pub(crate) fn show(&self, task: &Task, children: &Listing<Task>) -> std::io::Result<()> {
        if self.json {
            let mut value = task_json(task);
            value["children"] = children
                .items
                .iter()
                .map(|c| json!(c.id.to_string()))
                .collect();
            return self.print_json(&value);
        }
        let opt = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        let mut lines = vec![
            format!("task        {}", task.id),
            format!("run         {}", task.run_id),
            format!(
                "parent      {}",
                task.parent.map_or("-".into(), |p| p.to_string())
            ),
            format!("kind        {:?}", task.kind),
            format!("status      {:?}", task.status),
            format!("depth       {}", task.depth),
            format!("attempt     {}", task.attempt),
            format!("assignee    {}", opt(&task.assignee)),
            format!("model       {}", opt(&task.model)),
        ];
        match &task.observed {
            Some(o) => lines.push(format!(
                "observed    {} / account {} / native session {} (for the record; never resumed)",
                o.harness, o.account, o.native_session_id
            )),
            None => lines.push("observed    -".into()),
        }
        lines.push(format!("idempotency {}", opt(&task.idempotency_key)));
        lines.push(format!("created     {}", timestamp(task.created_ms)));
        lines.push(format!("updated     {}", timestamp(task.updated_ms)));
        lines.push(format!("goal        {}", task.goal));
        for c in &task.quality_criteria {
            lines.push(format!("criterion   {c}"));
        }
        lines.push(format!("schema      {}", opt(&task.output_schema)));
        lines.push(String::new());
        lines.push("brief:".into());
        lines.push(indent(&task.brief));
        if let Some(outcome) = &task.outcome {
            lines.push("outcome:".into());
            // A sentence for people; `--json` keeps the stored structure.
            lines.push(indent(&crate::outcome::lines(outcome).join("\n")));
        }
        for note in &task.progress_notes {
            lines.push(format!("progress    {note}"));
        }
        for a in &task.attachments {
            lines.push(format!("attachment  {}", attachment_line(a)));
        }
        for c in &children.items {
            lines.push(format!("child       {} {:?} {:?}", c.id, c.kind, c.status));
        }
        if children.more {
            lines.push("child       ... (more children not shown)".into());
        }
        self.print(&lines.join("\n"))
    }

    pub(crate) fn logs(
        &self,
        task: TaskId,
        rows: &[Sequenced<SessionLogRow>],
    ) -> std::io::Result<()> {
        if self.json {
            let items: Vec<_> = rows
                .iter()
                .map(|r| {
                    json!({
                        "seq": r.seq,
                        "ts_ms": r.value.ts_ms,
                        "kind": log_kind(r.value.kind),
                        "summary": r.value.summary,
                        "detail": r.value.detail,
                        "redactions": r.value.redactions.iter().map(|x| json!({
                            "kind": x.kind.label(),
                            "count": x.count,
                        })).collect::<Vec<_>>(),
                    })
                })
                .collect();
            return self.print_json(&json!({ "task": task.to_string(), "rows": items }));
        }
        if rows.is_empty() {
            return self.print(&format!("task {task} has no session log rows"));
        }
        let mut table = table(&["SEQ", "TIME", "KIND", "SUMMARY", "REDACTED"]);
        let mut redacted = Redactions::default();
        for r in rows {
            let row = Redactions::from_records(&r.value.redactions);
            redacted.merge(&row);
            table.add_row(vec![
                r.seq.to_string(),
                timestamp(r.value.ts_ms),
                log_kind(r.value.kind).into(),
                clip(&r.value.summary, SUMMARY_CELL_CHARS_MAX),
                if row.total() == 0 {
                    "-".into()
                } else {
                    row.to_string()
                },
            ]);
        }
        self.print(&table.to_string())?;
        if redacted.total() > 0 {
            // Say it in words too: the secrets were removed before the rows were stored.
            self.print(&format!(
                "{} secrets were removed from these rows before they were stored ({redacted})",
                redacted.total()
            ))?;
        }
        Ok(())
    }

    /// `keel audit`: a run's policy decisions, oldest first.
    pub(crate) fn audit(
        &self,
        run: RunId,
        rows: &Listing<Sequenced<AuditEntry>>,
    ) -> std::io::Result<()> {
        if self.json {
            let items: Vec<_> = rows
                .items
                .iter()
                .map(|r| {
                    json!({
                        "seq": r.seq,
                        "ts_ms": r.value.ts_ms,
                        "task": r.value.task_id.map(|t| t.to_string()),
                        "who": r.value.hook,
                        "tool": r.value.tool,
                        "decision": format!("{:?}", r.value.decision).to_lowercase(),
                        "reason": r.value.reason,
                        "input_digest": r.value.input_digest,
                        "rewritten": r.value.rewritten,
                    })
                })
                .collect();
            return self
                .print_json(&json!({ "run": run.to_string(), "rows": items, "more": rows.more }));
        }
        if rows.items.is_empty() {
            return self.print(&format!("run {run} has no audit rows"));
        }
        let mut table = table(&["SEQ", "TIME", "TASK", "WHO", "TOOL", "DECISION", "REASON"]);
        for r in &rows.items {
            table.add_row(vec![
                r.seq.to_string(),
                timestamp(r.value.ts_ms),
                r.value.task_id.map(|t| t.to_string()).unwrap_or_default(),
                r.value.hook.clone(),
                r.value.tool.clone(),
                format!("{:?}", r.value.decision).to_lowercase(),
                clip(&r.value.reason, SUMMARY_CELL_CHARS_MAX),
            ]);
        }
        self.print(&table.to_string())
    }

    pub(crate) fn tree(&self, run: &Run, tree: &Listing<TreeNode>) -> std::io::Result<()> {
        if self.json {
            let items: Vec<_> = tree
                .items
                .iter()
                .map(|n| {
                    let mut v = task_json(&n.task);
                    v["level"] = json!(n.level);
                    v
                })
                .collect();
            return self.print_json(&json!({
                "run": run_json(run),
                "tasks": items,
                "more": tree.more,
            }));
        }
        let mut lines = vec![format!(
            "run {} {:?}  {}",
            run.id,
            run.status,
            cell(&run.brief)
        )];
        for n in &tree.items {
            let pad = "  ".repeat(usize::try_from(n.level).unwrap_or(0).saturating_add(1));
            let t = &n.task;
            lines.push(format!(
                "{pad}{} {:?} {:?} [{}] {}",
                t.id,
                t.kind,
                t.status,
                t.assignee.as_deref().unwrap_or("-"),
                cell(&t.brief)
            ));
        }
        if tree.items.is_empty() {
            lines.push("  (no tasks)".into());
        }
        self.print(&lines.join("\n"))?;
        self.more(tree.more)
    }

    fn more(&self, more: bool) -> std::io::Result<()> {
        if more {
            self.print("(more rows not shown: raise --limit)")
        } else {
            Ok(())
        }
    }
}

fn table(header: &[&str]) -> Table {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY)
        .set_content_arrangement(ContentArrangement::Disabled)
        .set_header(header.to_vec());
    t
}

/// One line of a brief for a table cell: first line only, cut with an ellipsis so the cut is visible.
fn cell(text: &str) -> String {
    clip(text, BRIEF_CELL_CHARS_MAX)
}

/// At most `max` characters of one line, with an ellipsis when anything was cut.
fn clip(text: &str, max: usize) -> String {
    // Scrubbed before the cut, so a cut cannot leave half of a secret (issue 16).
    let text = crate::redact::text(text);
    let line = text.lines().next().unwrap_or("");
    let mut cut: String = line.chars().take(max).collect();
    if cut.len() < text.len() {
        cut.push('…');
    }
    cut
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("  {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// UTC, RFC 3339, to the millisecond.
fn timestamp(ms: u64) -> String {
    let t = UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

fn log_kind(kind: LogKind) -> &'static str {
    match kind {
        LogKind::Text => "text",
        LogKind::ToolUse => "tool_use",
        LogKind::ToolResult => "tool_result",
        LogKind::Usage => "usage",
        LogKind::Steering => "steering",
        LogKind::Error => "error",
        LogKind::Lifecycle => "lifecycle",
    }
}

fn attachment_line(a: &Attachment) -> String {
    match &a.body {
        AttachmentBody::Inline(text) => format!("{} (inline, {} bytes)", a.name, text.len()),
        AttachmentBody::Blob { key, len } => {
            format!(
                "{} (stored by reference: blob {key:032x}, {len} bytes)",
                a.name
            )
        }
    }
}

fn run_json(run: &Run) -> serde_json::Value {
    json!({
        "id": run.id.to_string(),
        "status": format!("{:?}", run.status),
        "brief": run.brief,
        "plan": run.plan,
        "budget": {
            "limit_micros": run.budget.limit_micros,
            "reserved_micros": run.budget.reserved_micros,
            "spent_micros": run.budget.spent_micros,
        },
        "created_ms": run.created_ms,
        "updated_ms": run.updated_ms,
        "outcome": run.outcome,
    })
}

fn task_json(t: &Task) -> serde_json::Value {
    json!({
        "id": t.id.to_string(),
        "run": t.run_id.to_string(),
        "parent": t.parent.map(|p| p.to_string()),
        "depth": t.depth,
        "kind": format!("{:?}", t.kind),
        "status": format!("{:?}", t.status),
        "brief": t.brief,
        "goal": t.goal,
        "quality_criteria": t.quality_criteria,
        "output_schema": t.output_schema,
        "assignee": t.assignee,
        "model": t.model,
        "observed": t.observed.as_ref().map(|o| json!({
            "harness": o.harness,
            "account": o.account,
            "native_session_id": o.native_session_id,
        })),
        "attempt": t.attempt,
        "idempotency_key": t.idempotency_key,
        "outcome": t.outcome,
        "attachments": t.attachments.iter().map(|a| match &a.body {
            AttachmentBody::Inline(text) => json!({"name": a.name, "inline": text}),
            AttachmentBody::Blob { key, len } => json!({"name": a.name, "blob": format!("{key:032x}"), "len": len}),
        }).collect::<Vec<_>>(),
        "progress_notes": t.progress_notes,
        "created_ms": t.created_ms,
        "updated_ms": t.updated_ms,
    })
}
