//! `keel completions SHELL` and `keel man`, run as real processes: generated from the clap
//! definitions, so they name every command this `keel` has (`doctor` included).

// Test helpers panic on purpose: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn keel(args: &[&str]) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_keel"))
        .args(args)
        .env_remove("KEEL_HOME")
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn completions_for_bash_zsh_and_fish_name_every_command() {
    let (code, bash) = keel(&["completions", "bash"]);
    assert_eq!(code, 0, "{bash}");
    assert!(bash.contains("_keel()"), "{bash}");
    let (code, zsh) = keel(&["completions", "zsh"]);
    assert_eq!(code, 0, "{zsh}");
    assert!(zsh.starts_with("#compdef keel"), "{zsh}");
    let (code, fish) = keel(&["completions", "fish"]);
    assert_eq!(code, 0, "{fish}");
    assert!(fish.contains("complete -c keel"), "{fish}");
    for script in [&bash, &zsh, &fish] {
        for command in [
            "run",
            "runs",
            "status",
            "doctor",
            "follow-up",
            "completions",
        ] {
            assert!(script.contains(command), "{command} missing from {script}");
        }
        assert!(script.contains("before"), "the flags too: {script}");
    }
    let (code, _) = keel(&["completions", "tcsh"]);
    assert_eq!(code, 2, "an unknown shell is a usage error");
}

#[test]
fn the_man_page_is_roff_with_every_command() {
    let (code, page) = keel(&["man"]);
    assert_eq!(code, 0, "{page}");
    assert!(page.contains(".TH keel 1"), "{page}");
    assert!(page.contains(".SH SYNOPSIS"), "{page}");
    for command in ["doctor", "status", "follow\\-up", "completions"] {
        assert!(page.contains(command), "{command} missing from {page}");
    }
}
