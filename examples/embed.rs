//! Embedding keel in a host program: open a store, start the runtime inside your own tokio runtime,
//! submit briefs through the typed handle, and read typed events from the channel.
//!
//! ```text
//! cargo run -p keel-tests --example embed -- [FOLDER]
//! ```
//!
//! FOLDER (default: a temporary folder) holds the store file and is the working directory the
//! specialists' tools run in. The harness is keel's in-process scripted model driving the native agent
//! loop, so the example needs no keys; a real host passes its own `HarnessSet` (the messages-api
//! harness with an account, or the CLI adapters).
#![allow(clippy::print_stdout)] // An example prints what it does.

use std::sync::Arc;

use keel_actors::RunMode;
use keel_actors::runtime::{HarnessSet, Runtime, RuntimeConfig, RuntimeEvent, scripted};
use keel_harness::HarnessKind;
use keel_harness::scripted::{Script, ScriptedHarness};
use keel_store::{AgentProfile, RunStatus, Store, StoreConfig};

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // The folder: the one given, or a temporary one removed at the end.
    let temp = tempfile::tempdir()?;
    let folder = match std::env::args().nth(1) {
        Some(dir) => std::path::PathBuf::from(dir),
        None => temp.path().to_path_buf(),
    };
    std::fs::create_dir_all(&folder)?;
    let folder = folder.canonicalize()?;
    std::fs::write(folder.join("hello.txt"), "hello from the host\n")?;

    // 1. A store (one redb file) and the harnesses this host offers.
    let store = Arc::new(Store::open_with(
        folder.join("embed.redb"),
        StoreConfig::default(),
    )?);
    let harnesses = HarnessSet::new().with(
        HarnessKind::Scripted,
        Arc::new(ScriptedHarness::new(Script::rules())),
    );

    // 2. The runtime's configuration: one agent profile, specialists working in the folder.
    let mut config = RuntimeConfig::default();
    config.supervisor.agents = vec![AgentProfile {
        name: "scripted".into(),
        description: "the built-in scripted model".into(),
        harness: HarnessKind::Scripted.as_str().into(),
        model: "keel-scripted-1".into(),
        account: "local".into(),
        tools: Vec::new(),
        system_prompt: String::new(),
        limits: Default::default(),
    }];
    config.specialist.working_dir = folder.clone();

    // 3. Start it inside this program's tokio runtime; events arrive on `events`.
    let (runtime, mut events) = Runtime::start(store, harnesses, config).await?;

    // 4. Submit two briefs through the typed handle.
    let survey = runtime
        .submit(
            "survey the folder".into(),
            RunMode::Plan(scripted::survey_plan("survey the folder")?),
            None,
            "embed example".into(),
        )
        .await?;
    let fan_out = runtime
        .submit(
            "count lines three ways".into(),
            RunMode::Plan(scripted::fan_out_plan(3, |i| {
                format!("echo view {i}: $(cat hello.txt | wc -l) lines")
            })?),
            None,
            "embed example".into(),
        )
        .await?;
    println!("submitted {} and {}", survey.id(), fan_out.id());

    // 5. Typed events, until both runs finished.
    let mut finished = 0;
    while finished < 2 {
        let Some(event) = events.recv().await else {
            break;
        };
        match event {
            RuntimeEvent::TaskStarted {
                attempt,
                step,
                harness,
                ..
            } => println!("task started: run {} step {step} on {harness}", attempt.run),
            RuntimeEvent::Report { step, report, .. } => println!(
                "report: step {step}: {}",
                report
                    .findings
                    .first()
                    .map_or("(no finding)", |f| f.claim.as_str())
            ),
            RuntimeEvent::Escalation { run, reason, .. } => {
                println!("escalation: run {run}: {reason}")
            }
            RuntimeEvent::Finished(outcome) => {
                finished += 1;
                println!("finished: run {} {:?}", outcome.run, outcome.status);
            }
            _ => {}
        }
    }

    // 6. The handles say how each run ended (durably).
    let a = survey.finished().await?;
    let b = fan_out.finished().await?;
    runtime.shutdown().await;
    if a.status == RunStatus::Completed && b.status == RunStatus::Completed {
        println!("both runs completed");
        Ok(())
    } else {
        Err(format!("runs ended {:?} and {:?}", a.status, b.status).into())
    }
}
