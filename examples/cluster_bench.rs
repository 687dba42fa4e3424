//! Remote dispatch latency, messages per second between nodes and the N=16 fan-out on two worker
//! processes against one node (docs/PERFORMANCE.md, "Cluster"), on real `keel` processes over
//! 127.0.0.1.
//!
//! `cargo run --release -p keel-tests --example cluster_bench -- [RUNS] [idle]` (default 10 runs a
//! shape; `idle`: only the first measurement).
//!
//! 1. Idle dispatch: a coordinator daemon and one worker; RUNS runs of a one-step plan, so each
//!    spawn crosses an idle network. The coordinator's own measurement (from the spawn handed to
//!    the cluster layer to the worker's acknowledgement), read from its log when it stops; and
//!    where it goes, from the nodes' log timestamps: coordinator to worker (the coordinator's
//!    "placed" line to the worker's "spawn received"), the specialist's actor started on the
//!    worker, and the rest (the acknowledgement's way back).
//! 2. Burst: a coordinator daemon and two workers (capacity 8 each); RUNS runs of a 16-step
//!    fan-out: dispatch latency as above, each run's duration (its row, created to ended), and
//!    keel frames between the nodes per second of those runs.
//! 3. One node: RUNS `keel run` of the same fan-out plan on one process: each run's duration.
//! 4. Capacity: this process joins the coordinator as a node and sends frames as fast as it can;
//!    the coordinator's `/metrics` counts them in.
#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)] // A benchmark: a panic is the report.

use std::path::Path;
use std::time::{Duration, Instant};

use keel_cluster::{ClusterMsg, NodeName, ToCoordinator};
use keel_store::RunStatus;
use keel_tests::cluster::{ClusterHome, join_coordinator, wait_joined};
use keel_tests::fan_out::reader;
use keel_tests::serve::{Server, worker_command};
use keel_tests::{Reaped, keel};

const WAIT: Duration = Duration::from_secs(300);
const BLAST_FRAMES: u64 = 100_000;

/// A keel home for `steps`-part fan-outs whose parts only echo, with no spawn-rate limit.
fn home(steps: usize) -> ClusterHome {
    ClusterHome::new(
        "[supervisor]\nmax_concurrent_specialists = 16\nspawns_per_minute = 1000000\nspawn_burst = 100000\n",
        steps,
        |i| format!("echo part {i} done"),
    )
}

/// Each run's duration in the store (created to last update), in ms, all completed.
fn durations(work: &Path) -> Vec<u64> {
    let store = reader(work);
    let runs = store.catalog().runs(10_000).unwrap().items;
    runs.iter()
        .map(|r| {
            assert_eq!(r.status, RunStatus::Completed, "{r:?}");
            r.updated_ms.saturating_sub(r.created_ms)
        })
        .collect()
}

fn quantile(v: &mut [u64], q: usize) -> u64 {
    v.sort_unstable();
    v[((v.len() - 1) * q) / 100]
}

/// A coordinator daemon and `workers` workers of capacity 8, joined; the workers log keel's
/// cluster lines at debug when `timed`.
fn cluster(h: &ClusterHome, workers: usize, timed: bool) -> (Server, Vec<Reaped>, String) {
    let (server, addr) = Server::start_coordinator(&h.work, &h.cookie);
    let mut ws = Vec::new();
    for i in 0..workers {
        let mut cmd = worker_command(&h.work, &addr, &format!("w{i}"), &h.cookie);
        cmd.args(["--capacity", "8"]);
        if timed {
            cmd.env("KEEL_LOG", "error,keel_cluster=debug");
        }
        ws.push(Reaped::spawn(cmd).unwrap());
    }
    wait_joined(&server.process, workers, WAIT);
    (server, ws, addr)
}

/// Microseconds since midnight of a log line's RFC 3339 timestamp (`...THH:MM:SS.ffffffZ ...`).
fn micros_of(line: &str) -> Option<u64> {
    let time = line.split_whitespace().next()?.split('T').nth(1)?;
    let time = time.trim_end_matches('Z');
    let mut parts = time.split(':');
    let h: u64 = parts.next()?.parse().ok()?;
    let m: u64 = parts.next()?.parse().ok()?;
    let (sec, frac) = parts.next()?.split_once('.')?;
    let sec: u64 = sec.parse().ok()?;
    let frac = format!("{frac:0<6}");
    let us: u64 = frac.get(..6)?.parse().ok()?;
    Some(((h * 60 + m) * 60 + sec) * 1_000_000 + us)
}

/// The time of the line of `log` holding `marker` and `attempt=ATTEMPT`, per attempt.
fn times(log: &str, marker: &str) -> std::collections::BTreeMap<String, u64> {
    log.lines()
        .filter(|l| l.contains(marker))
        .filter_map(|l| {
            let attempt = l.rsplit("attempt=").next()?.split_whitespace().next()?;
            Some((attempt.to_string(), micros_of(l)?))
        })
        .collect()
}

/// Median microseconds of each leg of a spawn (coordinator to worker, actor start on the worker)
/// from the coordinator's and the worker's logs.
fn legs(coordinator: &str, worker: &str) -> String {
    let placed = times(coordinator, "specialist placed on a worker");
    let received = times(worker, "spawn received");
    let started = times(worker, "specialist started");
    let mut there = Vec::new();
    let mut start = Vec::new();
    for (attempt, p) in &placed {
        if let (Some(r), Some(s)) = (received.get(attempt), started.get(attempt)) {
            there.push(r.saturating_sub(*p));
            start.push(s.saturating_sub(*r));
        }
    }
    if there.is_empty() {
        return "no timed spawns in the logs".into();
    }
    format!(
        "coordinator to worker median {} us, actor started on the worker median {} us ({} spawns)",
        quantile(&mut there, 50),
        quantile(&mut start, 50),
        there.len()
    )
}

/// `keel run --quiet --plan plan.json` by `cmd`.
fn run(mut cmd: std::process::Command) {
    let out = cmd
        .args(["run", "--quiet", "--plan", "plan.json", "fan out"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A metric's value in a Prometheus text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Stop the coordinator (SIGTERM) and read its dispatch latency line.
fn stop(server: Server) -> String {
    let pid = nix::unistd::Pid::from_raw(i32::try_from(server.process.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let (_, _, err) = server.process.wait_output(WAIT).unwrap();
    err.lines()
        .find(|l| l.contains("remote dispatch latency"))
        .map(|l| l.split("INFO").nth(1).unwrap_or(l).trim().to_string())
        .unwrap_or_else(|| format!("no latency line in {err}"))
}

fn main() {
    let runs: usize = std::env::args().nth(1).map_or(10, |r| r.parse().unwrap());

    // 1. Idle dispatch.
    let h = home(1);
    let (server, workers, _) = cluster(&h, 1, true);
    for _ in 0..runs {
        run(server.keel(&h.work));
    }
    let coordinator_log = server.process.stderr_so_far();
    let worker_log = workers[0].stderr_so_far();
    println!(
        "idle dispatch, {runs} one-step runs, one worker: {}",
        stop(server)
    );
    println!("  where it goes: {}", legs(&coordinator_log, &worker_log));
    drop(workers);
    if std::env::args().nth(2).as_deref() == Some("idle") {
        return;
    }

    // 2. Burst on two workers.
    let h = home(16);
    let (server, workers, addr) = cluster(&h, 2, false);
    let token = server.token();
    let (_, before) = server.request("GET", "/metrics", Some(&token), None);
    let started = Instant::now();
    for _ in 0..runs {
        run(server.keel(&h.work));
    }
    let elapsed = started.elapsed();
    let (_, after) = server.request("GET", "/metrics", Some(&token), None);
    let frames = |t: &str| {
        metric(t, "keel_cluster_frames_total{direction=\"in\"}")
            + metric(t, "keel_cluster_frames_total{direction=\"out\"}")
    };
    let moved = frames(&after) - frames(&before);
    let mut cluster_ms = durations(&h.work);

    // 4. Capacity, on the same coordinator: frames it decodes and drops (acknowledgements of
    // spawns it never made), from a node this process starts.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let blast = rt.block_on(async {
        let name = NodeName::new("bench").unwrap();
        let coordinator = join_coordinator(&name, &addr, WAIT).await;
        let (_, base) = server.request("GET", "/metrics", Some(&token), None);
        let base = metric(&base, "keel_cluster_frames_total{direction=\"in\"}");
        let started = Instant::now();
        for i in 0..BLAST_FRAMES {
            let attempt = keel_actors::AttemptId {
                run: keel_store::RunId(u128::from(i)),
                task: keel_store::TaskId(u128::from(i)),
                attempt: 1,
            };
            let frame =
                keel_cluster::wire::encode(&name, &ToCoordinator::Spawned { attempt }).unwrap();
            coordinator.cast(ClusterMsg::Frame(frame)).unwrap();
        }
        loop {
            let (_, m) = server.request("GET", "/metrics", Some(&token), None);
            if metric(&m, "keel_cluster_frames_total{direction=\"in\"}") - base
                >= BLAST_FRAMES as f64
            {
                break;
            }
            assert!(started.elapsed() < WAIT, "the frames did not all arrive");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        started.elapsed()
    });
    println!(
        "burst dispatch, {runs} runs of 16 steps, two workers: {}",
        stop(server)
    );
    drop(workers);
    println!(
        "frames between the nodes during the fan-out runs: {moved} in {:.2} s = {:.0}/s",
        elapsed.as_secs_f64(),
        moved / elapsed.as_secs_f64()
    );
    println!(
        "capacity: {BLAST_FRAMES} frames from another node decoded in {:.3} s = {:.0} frames/s",
        blast.as_secs_f64(),
        BLAST_FRAMES as f64 / blast.as_secs_f64()
    );

    // 3. One node.
    let h = home(16);
    for _ in 0..runs {
        run(keel(&h.work).unwrap());
    }
    let mut local_ms = durations(&h.work);
    println!(
        "N=16 run duration (created to ended), median / p90 ms: two workers {} / {}, one node {} / {}",
        quantile(&mut cluster_ms, 50),
        quantile(&mut cluster_ms, 90),
        quantile(&mut local_ms, 50),
        quantile(&mut local_ms, 90)
    );
}
