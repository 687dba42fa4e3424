//! The built-in tools: read, write, edit, list, grep and bash, all confined to the working
//! directory, with timeouts (enforced by the loop, and by bash itself) and output caps.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncRead, AsyncReadExt};

use super::path::confine;
use super::{Tool, ToolContext, ToolError, ToolErrorCategory};
use crate::messages_api::wire::ToolDefinition;
use crate::session::BoxFuture;

/// Largest file read, written or edited.
pub const FILE_BYTES_MAX: u64 = 16 << 20;
/// Lines `read` returns when no limit is given.
pub const READ_LINES_DEFAULT: usize = 2000;
/// Entries `list` returns at most.
pub const LIST_ENTRIES_MAX: usize = 1000;
/// Files `grep` visits at most.
pub const GREP_FILES_MAX: usize = 10_000;
/// Matches `grep` returns at most.
pub const GREP_MATCHES_MAX: usize = 200;
/// Directory depth `grep` descends at most.
pub const GREP_DEPTH_MAX: usize = 32;
/// Largest file `grep` searches.
pub const GREP_FILE_BYTES_MAX: u64 = 4 << 20;

/// The six built-in tools.
pub fn all() -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(Read),
        Arc::new(Write),
        Arc::new(Edit),
        Arc::new(List),
        Arc::new(Grep),
        Arc::new(Bash),
    ]
}

/// Cuts `text` to `bytes_max`, saying how much was left out.
pub fn cap_output(text: String, bytes_max: usize) -> String {
    if text.len() <= bytes_max {
        return text;
    }
    let full = text.len();
    let kept = crate::error::truncate_to(text, bytes_max);
    let omitted = full - kept.len();
    format!("{kept}\n[output truncated: {omitted} bytes omitted]")
}

fn str_arg<'a>(input: &'a Value, key: &str) -> Result<&'a str, ToolError> {
    input
        .get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| ToolError::input(format!("missing string argument `{key}`")))
}

fn opt_u64(input: &Value, key: &str) -> Option<u64> {
    input.get(key).and_then(Value::as_u64)
}

fn io_error(what: &str, e: std::io::Error) -> ToolError {
    let category = match e.kind() {
        std::io::ErrorKind::NotFound
        | std::io::ErrorKind::InvalidData
        | std::io::ErrorKind::IsADirectory => ToolErrorCategory::BusinessRule,
        std::io::ErrorKind::PermissionDenied => ToolErrorCategory::Permission,
        _ => ToolErrorCategory::System,
    };
    ToolError::new(category, format!("{what}: {e}"))
}

/// Runs blocking file work off the async threads.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ToolError> + Send + 'static,
) -> Result<T, ToolError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ToolError::new(ToolErrorCategory::System, format!("tool task failed: {e}")))?
}

fn read_text(path: &Path) -> Result<String, ToolError> {
    let meta = std::fs::metadata(path).map_err(|e| io_error("stat", e))?;
    if meta.is_dir() {
        return Err(ToolError::input("path is a directory; use list"));
    }
    if meta.len() > FILE_BYTES_MAX {
        return Err(ToolError::input(format!(
            "file is larger than {FILE_BYTES_MAX} bytes"
        )));
    }
    let bytes = std::fs::read(path).map_err(|e| io_error("read", e))?;
    String::from_utf8(bytes).map_err(|_| ToolError::input("file is not UTF-8 text"))
}

fn definition(name: &str, description: &str, schema: Value) -> ToolDefinition {
    ToolDefinition {
        name: name.to_owned(),
        description: description.to_owned(),
        input_schema: schema,
    }
}

/// `read`: a text file's lines, numbered.
pub struct Read;

impl Tool for Read {
    fn is_read_only(&self) -> bool {
        true
    }

    fn definition(&self) -> ToolDefinition {
        definition(
            "read",
            "Read a UTF-8 text file inside the working directory. Lines are numbered from 1.",
            json!({"type": "object", "properties": {
                "path": {"type": "string", "description": "File path, relative to the working directory"},
                "offset": {"type": "integer", "description": "First line to return (1-based)"},
                "limit": {"type": "integer", "description": "Most lines to return"}},
                "required": ["path"]}),
        )
    }

    fn call<'a>(
        &'a self,
        input: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let path = confine(&ctx.working_dir, str_arg(&input, "path")?, true)?;
            let offset = opt_u64(&input, "offset").unwrap_or(1).max(1) as usize;
            let limit = opt_u64(&input, "limit").map_or(READ_LINES_DEFAULT, |l| l as usize);
            let cap = ctx.output_bytes_max;
            blocking(move || {
                let text = read_text(&path)?;
                let mut out = String::new();
                for (n, line) in text.lines().enumerate().skip(offset - 1).take(limit) {
                    out.push_str(&format!("{:>6}\t{line}\n", n + 1));
                    if out.len() > cap {
                        break;
                    }
                }
                Ok(cap_output(out, cap))
            })
            .await
        })
    }
}

/// `write`: create or replace a file.
pub struct Write;

impl Tool for Write {
    fn definition(&self) -> ToolDefinition {
        definition(
            "write",
            "Create or overwrite a file inside the working directory; parent directories are created.",
            json!({"type": "object", "properties": {
                "path": {"type": "string"}, "content": {"type": "string"}}, "required": ["path", "content"]}),
        )
    }

    fn call<'a>(
        &'a self,
        input: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let path = confine(&ctx.working_dir, str_arg(&input, "path")?, false)?;
            let content = str_arg(&input, "content")?.to_owned();
            if content.len() as u64 > FILE_BYTES_MAX {
                return Err(ToolError::input(format!(
                    "content is larger than {FILE_BYTES_MAX} bytes"
                )));
            }
            let root = ctx.working_dir.clone();
            blocking(move || {
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)
                        .map_err(|e| io_error("create directories", e))?;
                }
                if path.is_dir() {
                    return Err(ToolError::input("path is a directory"));
                }
                std::fs::write(&path, content.as_bytes()).map_err(|e| io_error("write", e))?;
                Ok(format!(
                    "wrote {} bytes to {}",
                    content.len(),
                    display(&root, &path)
                ))
            })
            .await
        })
    }
}

fn display(root: &Path, path: &Path) -> String {
    path.strip_prefix(root)
        .map_or_else(|_| path.display().to_string(), |p| p.display().to_string())
}

/// `edit`: replace an exact string in a file.
pub struct Edit;

impl Tool for Edit {
    fn definition(&self) -> ToolDefinition {
        definition(
            "edit",
            "Replace `old_string` with `new_string` in a file. `old_string` must occur exactly once unless `replace_all` is true.",
            json!({"type": "object", "properties": {
                "path": {"type": "string"}, "old_string": {"type": "string"}, "new_string": {"type": "string"},
                "replace_all": {"type": "boolean"}}, "required": ["path", "old_string", "new_string"]}),
        )
    }

    fn call<'a>(
        &'a self,
        input: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let path = confine(&ctx.working_dir, str_arg(&input, "path")?, true)?;
            let old = str_arg(&input, "old_string")?.to_owned();
            let new = str_arg(&input, "new_string")?.to_owned();
            let replace_all = input
                .get("replace_all")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            if old.is_empty() {
                return Err(ToolError::input("old_string is empty"));
            }
            blocking(move || {
                let text = read_text(&path)?;
                let count = text.matches(&old).count();
                if count == 0 {
                    return Err(ToolError::input("old_string not found"));
                }
                if count > 1 && !replace_all {
                    return Err(ToolError::input(format!(
                        "old_string occurs {count} times; make it unique or set replace_all"
                    )));
                }
                let updated = if replace_all {
                    text.replace(&old, &new)
                } else {
                    text.replacen(&old, &new, 1)
                };
                if updated.len() as u64 > FILE_BYTES_MAX {
                    return Err(ToolError::input("the edited file would be too large"));
                }
                std::fs::write(&path, updated).map_err(|e| io_error("write", e))?;
                Ok(format!("replaced {count} occurrence(s)"))
            })
            .await
        })
    }
}

/// `list`: a directory's entries.
pub struct List;

impl Tool for List {
    fn is_read_only(&self) -> bool {
        true
    }

    fn definition(&self) -> ToolDefinition {
        definition(
            "list",
            "List a directory inside the working directory (directories end in `/`, symlinks in `@`).",
            json!({"type": "object", "properties": {"path": {"type": "string"}}}),
        )
    }

    fn call<'a>(
        &'a self,
        input: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let requested = input.get("path").and_then(Value::as_str).unwrap_or(".");
            let path = confine(&ctx.working_dir, requested, true)?;
            let cap = ctx.output_bytes_max;
            blocking(move || {
                let mut names = Vec::new();
                let mut more = 0usize;
                for entry in std::fs::read_dir(&path).map_err(|e| io_error("list", e))? {
                    let entry = entry.map_err(|e| io_error("list", e))?;
                    if names.len() >= LIST_ENTRIES_MAX {
                        more += 1;
                        continue;
                    }
                    let kind = entry.file_type().map_err(|e| io_error("list", e))?;
                    let mut name = entry.file_name().to_string_lossy().into_owned();
                    if kind.is_symlink() {
                        name.push('@');
                    } else if kind.is_dir() {
                        name.push('/');
                    }
                    names.push(name);
                }
                names.sort();
                let mut out = names.join("\n");
                if more > 0 {
                    out.push_str(&format!("\n[{more} more entries not shown]"));
                }
                Ok(cap_output(out, cap))
            })
            .await
        })
    }
}

/// `grep`: a literal string search through text files.
pub struct Grep;

impl Tool for Grep {
    fn is_read_only(&self) -> bool {
        true
    }

    fn definition(&self) -> ToolDefinition {
        definition(
            "grep",
            "Search text files under a path for a literal string; returns `file:line: text` for each match. Symlinks are not followed.",
            json!({"type": "object", "properties": {
                "pattern": {"type": "string", "description": "Literal text to find"},
                "path": {"type": "string"}, "ignore_case": {"type": "boolean"}}, "required": ["pattern"]}),
        )
    }

    fn call<'a>(
        &'a self,
        input: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let pattern = str_arg(&input, "pattern")?.to_owned();
            if pattern.is_empty() {
                return Err(ToolError::input("pattern is empty"));
            }
            let start = confine(
                &ctx.working_dir,
                input.get("path").and_then(Value::as_str).unwrap_or("."),
                true,
            )?;
            let ignore_case = input
                .get("ignore_case")
                .and_then(Value::as_bool)
                .unwrap_or(false);
            let root = ctx.working_dir.clone();
            let cap = ctx.output_bytes_max;
            blocking(move || {
                let needle = if ignore_case {
                    pattern.to_lowercase()
                } else {
                    pattern
                };
                let mut matches = Vec::new();
                let mut visited = 0usize;
                let mut stack: Vec<(PathBuf, usize)> = vec![(start, 0)];
                while let Some((path, depth)) = stack.pop() {
                    if matches.len() >= GREP_MATCHES_MAX || visited >= GREP_FILES_MAX {
                        break;
                    }
                    let Ok(meta) = std::fs::symlink_metadata(&path) else {
                        continue;
                    };
                    if meta.is_dir() {
                        if depth >= GREP_DEPTH_MAX || path.file_name().is_some_and(|n| n == ".git")
                        {
                            continue;
                        }
                        let Ok(entries) = std::fs::read_dir(&path) else {
                            continue;
                        };
                        let mut children: Vec<PathBuf> =
                            entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
                        children.sort();
                        stack.extend(children.into_iter().rev().map(|c| (c, depth + 1)));
                        continue;
                    }
                    if !meta.is_file() || meta.len() > GREP_FILE_BYTES_MAX {
                        continue;
                    }
                    visited += 1;
                    let Ok(bytes) = std::fs::read(&path) else {
                        continue;
                    };
                    if bytes.iter().take(8192).any(|&b| b == 0) {
                        continue;
                    }
                    let text = String::from_utf8_lossy(&bytes);
                    for (n, line) in text.lines().enumerate() {
                        let hit = if ignore_case {
                            line.to_lowercase().contains(&needle)
                        } else {
                            line.contains(&needle)
                        };
                        if hit {
                            matches.push(format!("{}:{}: {}", display(&root, &path), n + 1, line));
                            if matches.len() >= GREP_MATCHES_MAX {
                                break;
                            }
                        }
                    }
                }
                if matches.is_empty() {
                    return Ok("no matches".to_owned());
                }
                let mut out = matches.join("\n");
                if matches.len() >= GREP_MATCHES_MAX {
                    out.push_str(&format!("\n[stopped at {GREP_MATCHES_MAX} matches]"));
                }
                Ok(cap_output(out, cap))
            })
            .await
        })
    }
}

/// `bash`: one shell command in the working directory, in its own process group so a timeout or a
/// cancel kills everything it started.
pub struct Bash;

async fn read_capped<R: AsyncRead + Unpin>(reader: Option<R>, cap: usize) -> (Vec<u8>, u64) {
    let mut kept = Vec::new();
    let mut dropped = 0u64;
    let Some(mut reader) = reader else {
        return (kept, dropped);
    };
    let mut buf = [0u8; 8192];
    loop {
        match reader.read(&mut buf).await {
            Ok(0) | Err(_) => return (kept, dropped),
            Ok(n) => {
                let room = cap.saturating_sub(kept.len()).min(n);
                kept.extend_from_slice(&buf[..room]);
                dropped += (n - room) as u64;
            }
        }
    }
}

fn kill_group(pid: Option<u32>) {
    if let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) {
        // The group may already be gone; nothing else to do then.
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
}

impl Tool for Bash {
    fn definition(&self) -> ToolDefinition {
        definition(
            "bash",
            "Run a bash command in the working directory (stdin closed). Returns the exit code, stdout and stderr.",
            json!({"type": "object", "properties": {
                "command": {"type": "string"},
                "timeout_ms": {"type": "integer", "description": "Lower the time limit for this command"}},
                "required": ["command"]}),
        )
    }

    fn call<'a>(
        &'a self,
        input: Value,
        ctx: &'a ToolContext,
    ) -> BoxFuture<'a, Result<String, ToolError>> {
        Box::pin(async move {
            let command = str_arg(&input, "command")?;
            let timeout_ms =
                opt_u64(&input, "timeout_ms").map_or(ctx.timeout_ms, |t| t.min(ctx.timeout_ms));
            let mut cmd = tokio::process::Command::new("bash");
            cmd.arg("-c")
                .arg(command)
                .current_dir(&ctx.working_dir)
                .env_clear()
                .env(
                    "PATH",
                    std::env::var("PATH")
                        .unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".to_owned()),
                )
                .env("LANG", "C.UTF-8")
                .env("TERM", "dumb")
                .envs(&ctx.env)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .process_group(0);
            if let Ok(home) = std::env::var("HOME") {
                cmd.env("HOME", home);
            }
            let mut child = cmd.spawn().map_err(|e| {
                ToolError::new(ToolErrorCategory::System, format!("cannot start bash: {e}"))
            })?;
            let pid = child.id();
            let (stdout, stderr) = (child.stdout.take(), child.stderr.take());
            let cap = ctx.output_bytes_max;
            let work = async {
                let (out, err, status) = tokio::join!(
                    read_capped(stdout, cap),
                    read_capped(stderr, cap),
                    child.wait()
                );
                (out, err, status)
            };
            let outcome = tokio::select! {
                r = work => Some(r),
                _ = tokio::time::sleep(Duration::from_millis(timeout_ms)) => None,
                _ = ctx.cancel.cancelled() => None,
            };
            let Some(((out, out_dropped), (err, err_dropped), status)) = outcome else {
                kill_group(pid);
                if ctx.cancel.is_cancelled() {
                    return Err(ToolError::new(ToolErrorCategory::System, "cancelled"));
                }
                return Err(ToolError::new(
                    ToolErrorCategory::Transient,
                    format!("command timed out after {timeout_ms} ms and was killed"),
                ));
            };
            // Children left running in the group (backgrounded with &) would hold resources.
            kill_group(pid);
            let status = status.map_err(|e| {
                ToolError::new(ToolErrorCategory::System, format!("wait failed: {e}"))
            })?;
            let code = status
                .code()
                .map_or_else(|| "killed by a signal".to_owned(), |c| c.to_string());
            let mut text = format!(
                "exit_code: {code}\nstdout:\n{}",
                String::from_utf8_lossy(&out)
            );
            if out_dropped > 0 {
                text.push_str(&format!(
                    "\n[stdout truncated: {out_dropped} bytes omitted]"
                ));
            }
            text.push_str(&format!("\nstderr:\n{}", String::from_utf8_lossy(&err)));
            if err_dropped > 0 {
                text.push_str(&format!(
                    "\n[stderr truncated: {err_dropped} bytes omitted]"
                ));
            }
            if status.success() {
                Ok(text)
            } else {
                Err(ToolError::input(text))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::CancelToken;
    use crate::tools::ToolRegistry;

    fn ctx(dir: &Path) -> ToolContext {
        ToolContext {
            working_dir: dir.canonicalize().unwrap(),
            timeout_ms: 5_000,
            output_bytes_max: 4096,
            env: Default::default(),
            cancel: CancelToken::new(),
        }
    }

    async fn run(tool: &str, input: Value, ctx: &ToolContext) -> Result<String, ToolError> {
        ToolRegistry::with_builtins()
            .get(tool)
            .unwrap()
            .call(input, ctx)
            .await
    }

    #[tokio::test]
    async fn file_tools_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let c = ctx(dir.path());
        run(
            "write",
            json!({"path": "a/b.txt", "content": "one\ntwo\ntwo\n"}),
            &c,
        )
        .await
        .unwrap();
        assert_eq!(
            run("read", json!({"path": "a/b.txt", "offset": 2}), &c)
                .await
                .unwrap(),
            "     2\ttwo\n     3\ttwo\n"
        );
        let e = run(
            "edit",
            json!({"path": "a/b.txt", "old_string": "two", "new_string": "2"}),
            &c,
        )
        .await
        .unwrap_err();
        assert!(e.message.contains("2 times"));
        run(
            "edit",
            json!({"path": "a/b.txt", "old_string": "one", "new_string": "1"}),
            &c,
        )
        .await
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("a/b.txt")).unwrap(),
            "1\ntwo\ntwo\n"
        );
        assert_eq!(run("list", json!({}), &c).await.unwrap(), "a/");
        assert_eq!(
            run("grep", json!({"pattern": "TWO", "ignore_case": true}), &c)
                .await
                .unwrap(),
            "a/b.txt:2: two\na/b.txt:3: two"
        );
        let e = run(
            "write",
            json!({"path": "../escape.txt", "content": "x"}),
            &c,
        )
        .await
        .unwrap_err();
        assert_eq!(e.category, ToolErrorCategory::Permission);
        let e = run("read", json!({}), &c).await.unwrap_err();
        assert_eq!(e.category, ToolErrorCategory::BusinessRule);
    }

    #[tokio::test]
    async fn bash_reports_exit_codes_caps_output_and_times_out() {
        let dir = tempfile::tempdir().unwrap();
        let c = ctx(dir.path());
        let ok = run(
            "bash",
            json!({"command": "echo hi > f.txt && cat f.txt"}),
            &c,
        )
        .await
        .unwrap();
        assert!(ok.starts_with("exit_code: 0\nstdout:\nhi\n"), "{ok}");
        let fail = run("bash", json!({"command": "echo oops >&2; exit 3"}), &c)
            .await
            .unwrap_err();
        assert!(fail.message.contains("exit_code: 3") && fail.message.contains("oops"));
        let big = run(
            "bash",
            json!({"command": "head -c 100000 /dev/zero | tr '\\0' a"}),
            &c,
        )
        .await
        .unwrap();
        assert!(
            big.contains("[stdout truncated: 95904 bytes omitted]"),
            "{}",
            &big[big.len() - 80..]
        );
        let slow = run(
            "bash",
            json!({"command": "sleep 30", "timeout_ms": 200}),
            &c,
        )
        .await
        .unwrap_err();
        assert_eq!(slow.category, ToolErrorCategory::Transient);
        assert!(slow.retryable);
        let env = run(
            "bash",
            json!({"command": "echo ${ANTHROPIC_API_KEY:-unset}"}),
            &c,
        )
        .await
        .unwrap();
        assert!(
            env.contains("stdout:\nunset"),
            "the keel process environment must not leak: {env}"
        );
    }
}
