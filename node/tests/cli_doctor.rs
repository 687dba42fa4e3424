//! `keel doctor` and the preflight of `keel run`, run as real processes: what a newcomer's first run
//! needs (harness binaries at their pinned versions, credentials, keel.toml, the store, private
//! files) is checked before it costs a failed run, and every problem names its fix.

// Test helpers panic on purpose: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::process::{Command, Output};

fn keel(dir: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_keel"));
    cmd.current_dir(dir)
        .args(args)
        .env_remove("KEEL_HOME")
        .env_remove("ANTHROPIC_API_KEY")
        .env_remove("OPENAI_API_KEY")
        .env_remove("KEEL_CLAUDE_BIN")
        .env("KEEL_LOG", "error");
    cmd
}

fn run(cmd: &mut Command) -> (i32, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = cmd.output().unwrap();
    (
        status.code().unwrap_or(-1),
        String::from_utf8_lossy(&stdout).into_owned(),
        String::from_utf8_lossy(&stderr).into_owned(),
    )
}

/// A stand-in `claude` that answers `--version` as the real one does, at `version`: the version
/// check is what is under test (the pinned CLI is not installed in every test environment).
fn claude_at(dir: &Path, version: &str) -> std::path::PathBuf {
    let path = dir.join(format!("claude-{version}"));
    // Written by another process: a write handle of this one, inherited by a sibling test's child
    // between its fork and exec, would make executing the file fail with "text file busy".
    let made = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "printf '#!/bin/sh\\necho \"{version} (Claude Code)\"\\n' > \"$0\" && chmod 755 \"$0\""
        ))
        .arg(&path)
        .status()
        .unwrap();
    assert!(made.success());
    path
}

fn pinned_claude() -> String {
    let package: serde_json::Value =
        serde_json::from_str(include_str!("../../harness-adapters/clis/package.json")).unwrap();
    package["dependencies"]["@anthropic-ai/claude-code"]
        .as_str()
        .unwrap()
        .to_owned()
}

fn init_with_claude_agent(dir: &Path) {
    assert_eq!(run(&mut keel(dir, &["init"])).0, 0);
    let config = dir.join(".keel/keel.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(
        "\n[[agents]]\nname = \"coder\"\nharness = \"claude-code\"\nmodel = \"claude-sonnet-4-5\"\n",
    );
    std::fs::write(&config, text).unwrap();
}

#[test]
fn doctor_on_a_fresh_home_finds_nothing_wrong_and_warns_about_a_looser_one() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(run(&mut keel(dir.path(), &["init"])).0, 0);
    let (code, out, err) = run(&mut keel(dir.path(), &["doctor"]));
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("ok       keel.toml"), "{out}");
    assert!(out.contains("built-in scripted model"), "{out}");
    assert!(out.contains("intact"), "{out}");
    assert!(out.contains("MiB free on the store's disk"), "{out}");
    assert!(out.contains("are private"), "{out}");
    assert!(out.ends_with("0 problems, 0 warnings\n"), "{out}");

    // A home made by an older keel, readable by others (issue 16): a warning with its fix.
    std::fs::set_permissions(
        dir.path().join(".keel"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    let (code, out, _) = run(&mut keel(dir.path(), &["doctor"]));
    assert_eq!(code, 0, "a warning alone is not a failure: {out}");
    assert!(out.contains("warning  permissions"), "{out}");
    // The home as it was found (here the relative `./.keel`).
    assert!(out.contains("fix: chmod 700 .keel"), "{out}");

    let (_, out, _) = run(&mut keel(dir.path(), &["doctor", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["problems"], 0, "{v}");
    assert_eq!(v["warnings"], 1, "{v}");
}

#[test]
fn doctor_names_a_wrong_harness_version_and_a_missing_credential_with_their_fixes() {
    let dir = tempfile::tempdir().unwrap();
    init_with_claude_agent(dir.path());
    let old = claude_at(dir.path(), "1.0.0");
    let (code, out, err) = run(keel(dir.path(), &["doctor"]).env("KEEL_CLAUDE_BIN", &old));
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains(&format!(
            "PROBLEM  claude-code: {} is version 1.0.0; keel is pinned to {}",
            old.display(),
            pinned_claude()
        )),
        "{out}"
    );
    assert!(
        out.contains("fix: run `npm ci --prefix harness-adapters/clis`"),
        "{out}"
    );
    assert!(
        out.contains("environment variable ANTHROPIC_API_KEY is not set"),
        "{out}"
    );
    assert!(out.contains("fix: export ANTHROPIC_API_KEY="), "{out}");

    // At the pinned version and with the key set, the harness checks pass.
    let pinned = claude_at(dir.path(), &pinned_claude());
    let (code, out, err) = run(keel(dir.path(), &["doctor"])
        .env("KEEL_CLAUDE_BIN", &pinned)
        .env("ANTHROPIC_API_KEY", "sk-doctor-test-key"));
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains(&format!("ok       claude-code: {}", pinned.display())),
        "{out}"
    );
    assert!(
        out.contains("ok       credential ANTHROPIC_API_KEY"),
        "{out}"
    );
    assert!(!out.contains("sk-doctor-test-key"), "{out}");
}

#[test]
fn keel_run_without_a_key_or_a_harness_binary_exits_2_naming_the_fix_before_any_run_starts() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(run(&mut keel(dir.path(), &["init"])).0, 0);
    let (code, out, err) = run(keel(
        dir.path(),
        &["run", "survey this folder", "--harness", "claude-code"],
    )
    .env("KEEL_CLAUDE_BIN", dir.path().join("no-such-claude")));
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("environment variable ANTHROPIC_API_KEY is not set"),
        "{err}"
    );
    assert!(err.contains("export ANTHROPIC_API_KEY="), "{err}");
    assert!(err.contains("KEEL_CLAUDE_BIN points at"), "{err}");
    assert!(
        !err.contains("{\""),
        "no JSON in what a person reads: {err}"
    );
    let (_, runs, _) = run(&mut keel(dir.path(), &["runs"]));
    assert!(runs.contains("no runs yet"), "nothing was started: {runs}");
}

#[test]
fn doctor_checks_every_accounts_credential_without_printing_it() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(run(&mut keel(dir.path(), &["init"])).0, 0);
    let config = dir.path().join(".keel/keel.toml");
    let mut text = std::fs::read_to_string(&config).unwrap();
    text.push_str(
        "\n[[accounts]]\nname = \"team-a\"\nprovider = \"anthropic\"\nkey_env = \"KEEL_DOCTOR_KEY_A\"\n\
         \n[[accounts]]\nname = \"team-b\"\nprovider = \"anthropic\"\nkey_file = \"keys/team-b.key\"\n\
         \n[[agents]]\nname = \"loop\"\nharness = \"messages-api\"\nmodel = \"m\"\naccount = \"team-a\"\n",
    );
    std::fs::write(&config, text).unwrap();
    let key_a = "sk-doctor-account-a-0001";
    let key_b = "sk-doctor-account-b-0002";

    // team-a's variable is set; team-b's key file is missing: a problem with its fix, even though
    // no agent names team-b (a rate-limited task may move there).
    let (code, out, err) = run(keel(dir.path(), &["doctor"]).env("KEEL_DOCTOR_KEY_A", key_a));
    assert_eq!(code, 1, "{out}{err}");
    assert!(
        out.contains("ok       account team-a: KEEL_DOCTOR_KEY_A is set (for loop)"),
        "{out}"
    );
    assert!(out.contains("PROBLEM  account team-b: key file"), "{out}");
    assert!(out.contains("chmod 600"), "{out}");

    // A key file others may read is a problem too; a private one is fine. No key is ever printed.
    let keys = dir.path().join(".keel/keys");
    std::fs::create_dir_all(&keys).unwrap();
    std::fs::write(keys.join("team-b.key"), format!("{key_b}\n")).unwrap();
    std::fs::set_permissions(
        keys.join("team-b.key"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let (code, out, err) = run(keel(dir.path(), &["doctor"]).env("KEEL_DOCTOR_KEY_A", key_a));
    assert_eq!(code, 1, "{out}{err}");
    assert!(out.contains("may be read by others"), "{out}");
    std::fs::set_permissions(
        keys.join("team-b.key"),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let (code, out, err) =
        run(keel(dir.path(), &["--json", "doctor"]).env("KEEL_DOCTOR_KEY_A", key_a));
    assert_eq!(code, 0, "{out}{err}");
    assert!(!out.contains(key_a) && !out.contains(key_b), "{out}");

    // Without team-a's variable, `keel run` stops before creating the run, naming it.
    let (code, out, err) = run(&mut keel(dir.path(), &["run", "hello"]));
    assert_eq!(code, 2, "{out}{err}");
    assert!(
        err.contains("environment variable KEEL_DOCTOR_KEY_A is not set"),
        "{err}"
    );
}
