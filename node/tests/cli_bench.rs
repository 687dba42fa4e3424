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
