//! `keel doctor` and the preflight of `keel run`: what a newcomer's first run needs, checked before
//! it costs a failed run. The preflight checks what a run would use (each configured harness's
//! binary at its pinned version, each credential variable); `keel doctor` checks those for every
//! agent of keel.toml and also keel.toml itself, the store (integrity, size, free disk) and the keel
//! home's permissions. Every problem comes with what to do about it.

use std::collections::BTreeMap;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use keel_harness::cli::CliFlavor;
use keel_harness::{Credential, CredentialError, HarnessKind};
use serde_json::json;

use crate::config::{AccountSection, Config};
use crate::exit::{Exit, Failed};
use crate::home::Home;
use crate::run::setup::{HarnessChoice, credential_env};

/// The pinned harness CLIs (`harness-adapters/clis/package.json`), read at build time: the
/// versions keel's adapters and its conformance suite were made for.
const PINNED_PACKAGES: &str = include_str!("../../harness-adapters/clis/package.json");
/// How long `--version` of a harness CLI may take (a Node.js CLI starts in about a second).
const VERSION_TIMEOUT: Duration = Duration::from_secs(20);
/// Below this much free space on the store's disk, `keel doctor` warns (a run appends logs).
const DISK_FREE_MIN_BYTES: u64 = 512 * 1024 * 1024;

/// How bad one finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Severity {
    /// Checked and fine.
    Ok,
    /// Works, but should be looked at.
    Warning,
    /// A run would fail (or keel cannot work) until it is fixed.
    Problem,
}

impl Severity {
    fn word(self) -> &'static str {
        match self {
            Severity::Ok => "ok",
            Severity::Warning => "warning",
            Severity::Problem => "PROBLEM",
        }
    }
}

/// One finding: what was checked, how it went, and what to do when it is not fine.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Finding {
    /// What was checked (`claude-code`, `credential ANTHROPIC_API_KEY`, `store`, ...).
    pub(crate) subject: String,
    /// How it went.
    pub(crate) severity: Severity,
    /// What was found.
    pub(crate) detail: String,
    /// What to do, when it is not fine.
    pub(crate) fix: Option<String>,
}

impl Finding {
    fn ok(subject: impl Into<String>, detail: impl Into<String>) -> Self {
        Self {
            subject: subject.into(),
            severity: Severity::Ok,
            detail: detail.into(),
            fix: None,
        }
    }

    fn bad(
        severity: Severity,
        subject: impl Into<String>,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Self {
        Self {
            subject: subject.into(),
            severity,
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

/// The preflight of `keel run` found what would make the run fail: exit 2, naming each fix.
#[derive(Debug, thiserror::Error)]
#[error("{}", preflight_text(.0))]
pub(crate) struct PreflightError(pub(crate) Vec<Finding>);

fn preflight_text(problems: &[Finding]) -> String {
    let lines: Vec<String> = problems
        .iter()
        .map(|p| match &p.fix {
            Some(fix) => format!("{}: {} (fix: {fix})", p.subject, p.detail),
            None => format!("{}: {}", p.subject, p.detail),
        })
        .collect();
    format!(
        "the run was not started: {}; `keel doctor` checks everything",
        lines.join("; ")
    )
}

/// The agents a run uses, as `(name, harness, account of keel.toml)`, as `node_setup` would pick
/// them: `--harness` (no configured account), else the agents of keel.toml (only `--agent` when
/// given), else none (the built-in scripted model).
fn agents_used<'c>(
    config: &'c Config,
    choice: &HarnessChoice,
) -> Vec<(String, HarnessKind, Option<&'c AccountSection>)> {
    if let Some(kind) = choice.harness {
        return vec![(kind.as_str().to_owned(), kind, None)];
    }
    config
        .agents
        .iter()
        .filter(|a| choice.agent.as_ref().is_none_or(|n| n == &a.name))
        .map(|a| (a.name.clone(), a.harness, config.account(a.account_name())))
        .collect()
}

/// The pinned version of a harness CLI, if it is one of the four.
fn pinned_version(kind: HarnessKind) -> Option<String> {
    let package = match kind {
        HarnessKind::ClaudeCode => "@anthropic-ai/claude-code",
        HarnessKind::Codex => "@openai/codex",
        HarnessKind::Opencode => "opencode-ai",
        HarnessKind::Pi => "@mariozechner/pi-coding-agent",
        _ => return None,
    };
    let packages: serde_json::Value = serde_json::from_str(PINNED_PACKAGES).ok()?;
    packages["dependencies"][package]
        .as_str()
        .map(str::to_owned)
}

/// Where a harness CLI's binary is looked for (its `KEEL_*_BIN` variable, else the pinned install).
fn cli_binary(kind: HarnessKind) -> Option<keel_harness::cli::CliBinary> {
    Some(match kind {
        HarnessKind::ClaudeCode => keel_harness::cli::claude::ClaudeCode.binary(),
        HarnessKind::Codex => keel_harness::cli::codex::Codex.binary(),
        HarnessKind::Opencode => keel_harness::cli::opencode::Opencode.binary(),
        HarnessKind::Pi => keel_harness::cli::pi::Pi::default().binary(),
        _ => return None,
    })
}

/// The first `N.N.N` in `text`: how the four CLIs print their version (`2.1.197 (Claude Code)`,
/// `codex-cli 0.171.0`, a bare `1.18.33`).
pub(crate) fn version_in(text: &str) -> Option<&str> {
    text.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .map(|w| w.trim_matches('.'))
        .find(|w| w.split('.').count() >= 3 && w.split('.').all(|p| !p.is_empty()))
}

/// Runs `binary --version` with a bounded wait and returns what it printed.
fn version_output(binary: &Path) -> Result<String, String> {
    let mut child = Command::new(binary)
        .arg("--version")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{} could not be started: {e}", binary.display()))?;
    let started = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if started.elapsed() > VERSION_TIMEOUT => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{} --version did not answer in {} s",
                    binary.display(),
                    VERSION_TIMEOUT.as_secs()
                ));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(format!("waiting for {}: {e}", binary.display())),
        }
    }
    let mut text = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut text);
    }
    if let Some(mut err) = child.stderr.take() {
        let _ = err.read_to_string(&mut text);
    }
    Ok(text)
}

/// The binary of a CLI harness: found, and at the pinned version. `None` for a harness that is
/// not a CLI (keel's own loop, the scripted model).
fn check_binary(kind: HarnessKind) -> Option<Finding> {
    let binary = cli_binary(kind)?;
    let subject = kind.as_str();
    let pinned = pinned_version(kind).unwrap_or_default();
    let reinstall = format!(
        "run `{}` (or set {} to {subject} {pinned})",
        keel_harness::cli::INSTALL_COMMAND,
        binary.env_var
    );
    let path: PathBuf = match binary.locate() {
        Ok(path) => path,
        Err(e) => {
            let fix = reinstall.clone();
            return Some(Finding::bad(Severity::Problem, subject, e.to_string(), fix));
        }
    };
    let text = match version_output(&path) {
        Ok(text) => text,
        Err(e) => return Some(Finding::bad(Severity::Problem, subject, e, reinstall)),
    };
    Some(match version_in(&text) {
        Some(v) if v == pinned => Finding::ok(subject, format!("{} {v}", path.display())),
        Some(v) => Finding::bad(
            Severity::Problem,
            subject,
            format!(
                "{} is version {v}; keel is pinned to {pinned}",
                path.display()
            ),
            reinstall,
        ),
        None => Finding::bad(
            Severity::Problem,
            subject,
            format!(
                "{} --version printed no version: {}",
                path.display(),
                text.trim()
            ),
            reinstall,
        ),
    })
}

/// The credential a harness's sessions need: its variable is set and not blank.
fn check_credential(kind: HarnessKind, agents: &[String]) -> Option<Finding> {
    let var = credential_env(kind)?;
    let subject = format!("credential {var}");
    let set = std::env::var(var).is_ok_and(|v| !v.trim().is_empty());
    Some(if set {
        Finding::ok(subject, format!("set (for {})", agents.join(", ")))
    } else {
        Finding::bad(
            Severity::Problem,
            subject,
            format!(
                "environment variable {var} is not set (needed by {} on {})",
                agents.join(", "),
                kind.as_str()
            ),
            format!("export {var}=<your key> before `keel run`"),
        )
    })
}

/// An `[[accounts]]` entry's credential: its variable set and not blank, or its key file private
/// and holding a key. Never prints the key.
fn check_account(account: &AccountSection, users: &[String]) -> Finding {
    let subject = format!("account {}", account.name);
    let for_whom = if users.is_empty() {
        format!("a {} account for rate-limit switches", account.provider)
    } else {
        format!("for {}", users.join(", "))
    };
    let credential = account.credential();
    match credential.secret(|var| std::env::var(var).ok()) {
        Ok(_) => {
            let place = match &credential {
                Credential::ApiKeyEnv(var) | Credential::BearerTokenEnv(var) => {
                    format!("{var} is set")
                }
                Credential::ApiKeyFile(path) => format!("key file {} is private", path.display()),
                Credential::None => "no key".to_owned(),
            };
            Finding::ok(subject, format!("{place} ({for_whom})"))
        }
        Err(e) => {
            let fix = match (&e, &credential) {
                (CredentialError::EnvUnset(var), _) => {
                    format!(
                        "export {var}=<the key of account {}> before `keel run`",
                        account.name
                    )
                }
                (_, Credential::ApiKeyFile(path)) => format!(
                    "write the key of account {} on the first line of {} and chmod 600 it",
                    account.name,
                    path.display()
                ),
                _ => "see docs/CONFIG.md, [[accounts]]".to_owned(),
            };
            Finding::bad(Severity::Problem, subject, format!("{e} ({for_whom})"), fix)
        }
    }
}

/// The harness findings of a run with this configuration and choice: each harness's binary, then
/// each credential once (a configured account's, or the provider variable of an agent that names
/// none).
fn harness_findings(config: &Config, choice: &HarnessChoice) -> Vec<Finding> {
    let used = agents_used(config, choice);
    let mut kinds: BTreeMap<HarnessKind, Vec<String>> = BTreeMap::new();
    let mut accounts: BTreeMap<&str, (&AccountSection, Vec<String>)> = BTreeMap::new();
    for (agent, kind, account) in &used {
        match account {
            Some(a) => accounts
                .entry(a.name.as_str())
                .or_insert((a, Vec::new()))
                .1
                .push(agent.clone()),
            None => kinds.entry(*kind).or_default().push(agent.clone()),
        }
    }
    let mut found = Vec::new();
    let mut binaries: Vec<HarnessKind> = used.iter().map(|(_, k, _)| *k).collect();
    binaries.sort();
    binaries.dedup();
    for kind in binaries {
        found.extend(check_binary(kind));
    }
    for (kind, agents) in kinds {
        found.extend(check_credential(kind, &agents));
    }
    for (account, agents) in accounts.into_values() {
        found.push(check_account(account, &agents));
    }
    found
}

/// `keel doctor`'s check of the accounts no agent names: a task moved there after a rate limit
/// needs their keys too.
fn spare_account_findings(config: &Config) -> Vec<Finding> {
    config
        .accounts
        .iter()
        .filter(|a| !config.agents.iter().any(|g| g.account_name() == a.name))
        .map(|a| check_account(a, &[]))
        .collect()
}

/// The preflight of `keel run` on this home: the harness binaries (found, at the pinned versions)
/// and credentials the run would use. A keel.toml that does not load is left to the run itself,
/// which says where it is wrong.
///
/// # Errors
/// [`PreflightError`] listing every problem with its fix (exit 2).
pub(crate) fn preflight(home: &Home, choice: &HarnessChoice) -> Result<(), Failed> {
    let Ok(config) = home.config() else {
        return Ok(());
    };
    let problems: Vec<Finding> = harness_findings(&config, choice)
        .into_iter()
        .filter(|f| f.severity == Severity::Problem)
        .collect();
    if problems.is_empty() {
        return Ok(());
    }
    Err(Failed {
        exit: Exit::Usage,
        error: PreflightError(problems).into(),
    })
}

/// The store: present, its size, its integrity (when no other keel process holds it), and the free
/// space of its disk.
fn store_findings(home: &Home, store: &Path) -> Vec<Finding> {
    let mut found = Vec::new();
    let Ok(meta) = std::fs::metadata(store) else {
        found.push(Finding::bad(
            Severity::Problem,
            "store",
            format!("no store at {}", store.display()),
            "run `keel init`",
        ));
        return found;
    };
    let size = meta.len();
    match keel_store::Store::open(store) {
        Ok(mut opened) => match opened.check_integrity() {
            Ok(keel_store::Integrity::Intact) => found.push(Finding::ok(
                "store",
                format!("{}: {size} bytes, intact", store.display()),
            )),
            Ok(keel_store::Integrity::Repaired) => found.push(Finding::bad(
                Severity::Warning,
                "store",
                format!(
                    "{}: {size} bytes, was damaged and repaired from the previous commit",
                    store.display()
                ),
                "check the last run with `keel status`; `keel store backup PATH` keeps a copy",
            )),
            Err(e) => found.push(Finding::bad(
                Severity::Problem,
                "store",
                format!("{}: {e}", store.display()),
                "restore a backup (`keel store backup` makes them), or move the file away and run `keel init`",
            )),
        },
        Err(keel_store::OpenError::Locked) => {
            let holder = match crate::serve::discovery::read(home) {
                Some(server) => server.to_string(),
                None => "another keel process".to_owned(),
            };
            found.push(Finding::bad(
                Severity::Warning,
                "store",
                format!(
                    "{}: {size} bytes; {holder} holds it, so its integrity was not checked",
                    store.display()
                ),
                "run `keel doctor` (or `keel store check`) again when it has stopped",
            ));
        }
        Err(e) => found.push(Finding::bad(
            Severity::Problem,
            "store",
            format!("{}: {e}", store.display()),
            "restore a backup, or move the file away and run `keel init`",
        )),
    }
    let dir = store.parent().unwrap_or(Path::new("."));
    match rustix::fs::statvfs(dir) {
        Ok(s) => {
            let free = s.f_bavail.saturating_mul(s.f_frsize);
            let text = format!("{} MiB free on the store's disk", free / (1024 * 1024));
            found.push(if free < DISK_FREE_MIN_BYTES {
                Finding::bad(
                    Severity::Warning,
                    "disk",
                    text,
                    "free some space: a run appends its session logs to the store",
                )
            } else {
                Finding::ok("disk", text)
            });
        }
        Err(e) => found.push(Finding::bad(
            Severity::Warning,
            "disk",
            format!("free space of {} unknown: {e}", dir.display()),
            "check it with `df`",
        )),
    }
    found
}

/// Everything `keel doctor` checks on `home`.
fn findings(home: &Home) -> Vec<Finding> {
    let mut found = Vec::new();
    let config = match home.config() {
        Ok(config) => {
            found.push(Finding::ok(
                "keel.toml",
                format!(
                    "{}: valid, {} agents",
                    home.config_path().display(),
                    config.agents.len()
                ),
            ));
            Some(config)
        }
        Err(e) => {
            found.push(Finding::bad(
                Severity::Problem,
                "keel.toml",
                e.to_string(),
                "edit keel.toml (docs/CONFIG.md lists every key; `keel config` checks it)",
            ));
            None
        }
    };
    if let Some(config) = &config {
        if config.agents.is_empty() {
            found.push(Finding::ok(
                "harnesses",
                "no agents configured: runs use the built-in scripted model",
            ));
        }
        found.extend(harness_findings(config, &HarnessChoice::default()));
        found.extend(spare_account_findings(config));
        let store = home.dir().join(&config.store.path);
        found.extend(store_findings(home, &store));
        let looser = crate::private::looser_than_private(home.dir(), &store);
        if looser.is_empty() {
            found.push(Finding::ok(
                "permissions",
                format!("{} and its files are private", home.dir().display()),
            ));
        }
        for l in looser {
            let want = if l.dir { "700" } else { "600" };
            found.push(Finding::bad(
                Severity::Warning,
                "permissions",
                l.to_string(),
                format!("chmod {want} {}", l.path.display()),
            ));
        }
    }
    found
}

/// `keel doctor`: every check with its result and fix; exits 1 when there is a problem (warnings
/// alone exit 0).
///
/// # Errors
/// A failed write to stdout; [`Failed`] with exit 1 when a problem was found.
pub(crate) fn doctor(home: &Home, json: bool) -> Result<(), Failed> {
    let found = findings(home);
    let problems = found
        .iter()
        .filter(|f| f.severity == Severity::Problem)
        .count();
    let warnings = found
        .iter()
        .filter(|f| f.severity == Severity::Warning)
        .count();
    let mut out = crate::stdout::lock();
    if json {
        let mut value = json!({
            "home": home.dir(),
            "checks": found.iter().map(|f| json!({
                "subject": f.subject,
                "severity": f.severity.word().to_lowercase(),
                "detail": f.detail,
                "fix": f.fix,
            })).collect::<Vec<_>>(),
            "problems": problems,
            "warnings": warnings,
        });
        crate::redact::json(&mut value);
        writeln!(out, "{value}")?;
    } else {
        writeln!(out, "keel doctor: {}", home.dir().display())?;
        for f in &found {
            writeln!(
                out,
                "  {:<8} {}: {}",
                f.severity.word(),
                f.subject,
                crate::redact::text(&f.detail)
            )?;
            if let Some(fix) = &f.fix {
                writeln!(out, "  {:<8} fix: {fix}", "")?;
            }
        }
        writeln!(out, "{problems} problems, {warnings} warnings")?;
    }
    drop(out);
    if problems > 0 {
        return Err(Failed {
            exit: Exit::Failure,
            error: anyhow::anyhow!("keel doctor found {problems} problems"),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_found_as_each_cli_prints_them() {
        assert_eq!(version_in("2.1.197 (Claude Code)\n"), Some("2.1.197"));
        assert_eq!(version_in("codex-cli 0.171.0"), Some("0.171.0"));
        assert_eq!(version_in("1.18.33"), Some("1.18.33"));
        assert_eq!(version_in("no version here 1.2"), None);
    }

    #[test]
    fn the_pinned_versions_are_those_of_the_clis_package() {
        assert!(pinned_version(HarnessKind::ClaudeCode).is_some());
        assert!(pinned_version(HarnessKind::Codex).is_some());
        assert!(pinned_version(HarnessKind::Opencode).is_some());
        assert!(pinned_version(HarnessKind::Pi).is_some());
        assert_eq!(pinned_version(HarnessKind::MessagesApi), None);
    }
}
