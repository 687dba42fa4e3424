//! `keel bench`, run as a real process: every cell of its JSON carries the figures the issue's
//! comparison reads (runs/s, wall and CPU time per specialist, commits and bytes per run), each one
//! measured, so `scripts/bench-vs-langgraph` can rely on them. No timing is asserted.

// Test helpers panic on purpose: a panic is the failure report.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

#[test]
fn bench_prints_every_figure_of_every_cell_as_json() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_keel"))
        .current_dir(dir.path())
        .args([
            "--json",
            "bench",
            "--fan-out",
            "1,3",
            "--runs",
            "3",
            "--in-flight",
            "2",
            "--exclusive-store",
        ])
        .env_remove("KEEL_HOME")
        .env("KEEL_LOG", "error")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "keel bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cells: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let cells = cells.as_array().unwrap();
    let shapes: Vec<(u64, u64)> = cells
        .iter()
        .map(|c| {
            (
                c["specialists"].as_u64().unwrap(),
                c["in_flight"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(shapes, [(1, 1), (1, 2), (3, 1), (3, 2)]);
    for cell in cells {
        for figure in [
            "runs_per_s",
            "us_per_specialist",
            "cpu_us_per_specialist",
            "commits_per_run",
        ] {
            let value = cell[figure].as_f64().unwrap_or(f64::NAN);
            assert!(value > 0.0, "{figure} of {cell} is not a positive number");
        }
        // The file's growth, which moves in redb's allocation steps: zero is possible, absent is not.
        assert!(cell["bytes_per_run"].as_f64().unwrap() >= 0.0, "{cell}");
    }
}

/// Runs in flight on the journaled store as `keel serve` opens it, the journal's durable commits
/// every 64 among their group commits. A run whose acknowledgement never came would hang the bench,
/// so the process is given a bound and killed past it. (A store writer that ended the durable
/// commit ahead of a sync under way, in an experiment with two commits in flight, hung it in three
/// tries out of three.)
#[test]
fn many_runs_in_flight_on_the_journaled_store_all_finish() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_keel"))
        .current_dir(dir.path())
        .args([
            "--json",
            "bench",
            "--fan-out",
            "16",
            "--runs",
            "2000",
            "--in-flight",
            "8",
            "--exclusive-store",
        ])
        .env_remove("KEEL_HOME")
        .env("KEEL_LOG", "error")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut waited = 0;
    while child.try_wait().unwrap().is_none() {
        if waited >= 1_800 {
            child.kill().unwrap();
            let out = child.wait_with_output().unwrap();
            panic!(
                "keel bench did not finish in 180 s: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        waited += 1;
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "keel bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let cells: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let in_flight = cells
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["in_flight"].as_u64() == Some(8))
        .expect("the in-flight cell");
    assert!(
        in_flight["runs_per_s"].as_f64().unwrap() > 0.0,
        "{in_flight}"
    );
}
