//! keel's files are private (issue 16): after `keel init` and after a run, the home and its folders
//! are 0700 and keel.toml, the store and the synthesis file 0600, whatever the umask allowed; a home
//! an older keel left readable by others is reported by `keel config`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use keel_tests::{Reaped, keel};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .mode()
        & 0o777
}

#[test]
fn init_and_a_run_leave_only_private_files_and_config_warns_about_a_looser_home() {
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join(".keel");

    let init = keel(dir.path()).unwrap().arg("init").output().unwrap();
    assert!(init.status.success(), "{init:?}");
    assert_eq!(mode(&home), 0o700, "the home");
    assert_eq!(mode(&home.join("keel.toml")), 0o600, "keel.toml");
    assert_eq!(mode(&home.join("keel.redb")), 0o600, "the store");

    let mut cmd = keel(dir.path()).unwrap();
    cmd.args(["--json", "run", "--quiet", "survey this folder"]);
    let (status, out, err) = Reaped::spawn(cmd)
        .unwrap()
        .wait_output(Duration::from_secs(120))
        .unwrap();
    assert!(status.success(), "keel run failed: {status}\n{out}\n{err}");
    let summary: serde_json::Value = serde_json::from_str(&out).unwrap();
    let synthesis = summary["synthesis_file"].as_str().unwrap();
    // Relative to the folder keel ran in.
    assert_eq!(
        mode(&dir.path().join(synthesis)),
        0o600,
        "the synthesis file"
    );
    assert_eq!(mode(&home.join("synthesis")), 0o700, "the synthesis folder");
    assert_eq!(
        mode(&home.join("keel.redb")),
        0o600,
        "the store after a run"
    );
    for entry in walk(&home) {
        let m = mode(&entry);
        if entry.is_dir() {
            assert_eq!(m, 0o700, "{}", entry.display());
        } else {
            assert_eq!(m & 0o077, 0, "{} is {m:o}", entry.display());
        }
    }

    let quiet = keel(dir.path()).unwrap().arg("config").output().unwrap();
    assert!(quiet.status.success(), "{quiet:?}");
    assert!(
        !String::from_utf8_lossy(&quiet.stderr).contains("warning"),
        "{quiet:?}"
    );

    // A home as an older keel made it: readable by every local user.
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(
        home.join("keel.redb"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let warned = keel(dir.path())
        .unwrap()
        .args(["--json", "config"])
        .output()
        .unwrap();
    assert!(warned.status.success(), "{warned:?}");
    let _: serde_json::Value = serde_json::from_slice(&warned.stdout).unwrap();
    let err = String::from_utf8_lossy(&warned.stderr);
    assert!(
        err.contains("warning: folder") && err.contains("0755"),
        "{err}"
    );
    assert!(err.contains("keel.redb is 0644"), "{err}");
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if entry.file_type().unwrap().is_dir() {
            out.extend(walk(&path));
        }
        out.push(path);
    }
    out
}
