//! The wall-time overhead a CLI adapter adds to a one-turn run: the adapter (spawn, parse, process
//! tree cleanup, session directory) against the bare CLI run with the very same argv, environment and
//! config files, side by side against the scripted model server on 127.0.0.1.
//!
//! Run: `cargo run --release -p keel-harness --example cli_overhead -- [RUNS] [CLI...]`
//! (default 10 runs each of claude-code, codex, opencode and pi; needs the pinned CLIs installed with
//! `npm ci --prefix harness-adapters/clis`). Runs alternate adapter/bare so drift in machine load
//! hits both alike; it prints the median and mean of each and their ratio.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::print_stdout,
    missing_docs
)]

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use keel_harness::cli::claude::ClaudeCodeHarness;
use keel_harness::cli::codex::CodexHarness;
use keel_harness::cli::opencode::OpencodeHarness;
use keel_harness::cli::pi::PiHarness;
use keel_harness::cli::{CliFlavor, CliHarness, Invocation};
use keel_harness::scripted::Script;
use keel_harness::server::{ModelServer, ModelServerConfig};
use keel_harness::{Account, Credential, Harness, HarnessEvent, SessionSpec};

fn observed<F: CliFlavor>(
    h: CliHarness<F>,
    slot: &Arc<Mutex<Option<Invocation>>>,
) -> Box<dyn Harness> {
    let slot = Arc::clone(slot);
    Box::new(h.with_observer(Arc::new(move |inv: &Invocation| {
        *slot.lock().unwrap() = Some(inv.clone())
    })))
}

fn harness(name: &str, slot: &Arc<Mutex<Option<Invocation>>>) -> Box<dyn Harness> {
    match name {
        "claude-code" => observed(ClaudeCodeHarness::claude_code(), slot),
        "codex" => observed(CodexHarness::codex(), slot),
        "opencode" => observed(OpencodeHarness::opencode(), slot),
        "pi" => observed(PiHarness::pi(), slot),
        other => panic!("unknown CLI {other}"),
    }
}

/// Runs the recorded invocation directly: files recreated, stdin closed, stdout read to the end.
fn bare(inv: &Invocation) -> Duration {
    // The adapter removes its session directory just after the terminal event: wait for that, then
    // lay the same directory out again for the bare run.
    if let Some(session_dir) = inv.dirs.first().and_then(|d| d.parent()) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while session_dir.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    for d in &inv.dirs {
        std::fs::create_dir_all(d).unwrap();
    }
    for f in &inv.files {
        std::fs::create_dir_all(f.path.parent().unwrap()).unwrap();
        std::fs::write(&f.path, &f.contents).unwrap();
        if f.executable {
            std::fs::set_permissions(&f.path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
                .unwrap();
        }
    }
    let started = Instant::now();
    let out = std::process::Command::new(&inv.program)
        .args(&inv.args)
        .env_clear()
        .envs(&inv.env)
        .current_dir(&inv.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let took = started.elapsed();
    if let Some(session_dir) = inv.dirs.first().and_then(|d| d.parent()) {
        let _ = std::fs::remove_dir_all(session_dir);
    }
    assert!(
        !out.stdout.is_empty(),
        "bare run printed nothing: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

fn stats(mut xs: Vec<Duration>) -> (f64, f64) {
    xs.sort();
    let ms: Vec<f64> = xs.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
    let median = ms[ms.len() / 2];
    let mean = ms.iter().sum::<f64>() / ms.len() as f64;
    (median, mean)
}

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let runs: usize = args.next().map_or(10, |a| a.parse().unwrap());
    let mut clis: Vec<String> = args.collect();
    if clis.is_empty() {
        clis = ["claude-code", "codex", "opencode", "pi"]
            .map(String::from)
            .to_vec();
    }
    let server = ModelServer::start(ModelServerConfig::new(Script::rules()))
        .await
        .unwrap();
    println!(
        "cli           runs  adapter median/mean ms   bare median/mean ms   ratio (median, mean)"
    );
    for cli in clis {
        let mut with_adapter = Vec::new();
        let mut without = Vec::new();
        // One warm-up each, not counted (first-run caches of the CLI).
        for i in 0..=runs {
            let dir = tempfile::tempdir().unwrap();
            let mut spec = SessionSpec::new("say hi", "overhead-model", dir.path());
            spec.env.insert("KEEL_BENCH_KEY".into(), "sk-bench".into());
            spec.account = Account {
                id: "bench".into(),
                base_url: Some(server.base_url()),
                credential: Credential::ApiKeyEnv("KEEL_BENCH_KEY".into()),
            };
            let slot = Arc::new(Mutex::new(None));
            let h = harness(&cli, &slot);
            let started = Instant::now();
            let events = h
                .start(spec)
                .await
                .unwrap()
                .collect(Duration::from_secs(120))
                .await;
            let took = started.elapsed();
            assert!(
                matches!(events.last(), Some(HarnessEvent::Finished { .. })),
                "{cli}: {:?}",
                events.last()
            );
            let inv = slot.lock().unwrap().clone().unwrap();
            let bare_took = tokio::task::spawn_blocking(move || bare(&inv))
                .await
                .unwrap();
            if i > 0 {
                with_adapter.push(took);
                without.push(bare_took);
            }
        }
        let (am, aa) = stats(with_adapter);
        let (bm, ba) = stats(without);
        println!(
            "{cli:<12} {runs:>5}  {am:>10.1} / {aa:>7.1}      {bm:>10.1} / {ba:>7.1}     {:.3}, {:.3}",
            am / bm,
            aa / ba
        );
    }
    server.shutdown().await.unwrap();
}
