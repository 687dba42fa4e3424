//! What the runtime's own tests share: a store in a temporary directory, a runtime on it with the
//! in-process scripted model, and follow-up messages that report through a real tool call.
#![allow(clippy::unwrap_used, clippy::expect_used)] // Tests: a panic is the failure report.

use super::{HarnessSet, Runtime, RuntimeConfig, SUBTASK_ID_ENV};
use keel_harness::HarnessKind;
use keel_harness::scripted::{Script, ScriptedHarness};
use keel_store::{RunId, Sharing, Store, StoreConfig, TaskId, TaskKind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A temporary directory with a `work` directory for the sessions and a store on a file in it.
pub(crate) fn workspace() -> (tempfile::TempDir, PathBuf, Arc<Store>) {
    let dir = tempfile::tempdir().unwrap();
    let work = dir.path().join("work");
    std::fs::create_dir_all(&work).unwrap();
    let cfg = StoreConfig {
        sharing: Sharing::WithReaders,
        ..StoreConfig::default()
    };
    let store = Arc::new(Store::open_with(dir.path().join("keel.redb"), cfg).unwrap());
    (dir, work, store)
}

/// A runtime on `store` with one scripted agent working in `work`.
pub(crate) async fn start(store: &Arc<Store>, work: &Path) -> Runtime {
    let mut c = RuntimeConfig::default();
    c.supervisor.agents = vec![crate::runtime::scripted::scripted_agent()];
    c.supervisor.spawn_burst = 64;
    c.supervisor.spawn_interval_ms = 1;
    c.specialist.working_dir = work.to_path_buf();
    c.specialist.resend_interval_ms = 200;
    c.stop_grace_ms = 1_000;
    let harnesses = HarnessSet::new().with(
        HarnessKind::Scripted,
        Arc::new(ScriptedHarness::new(Script::rules())),
    );
    Runtime::start(Arc::clone(store), harnesses, c)
        .await
        .unwrap()
        .0
}

/// A follow-up message whose session waits for `gate` (at most 30 s), then reports `claim`.
pub(crate) fn gated_follow_up(gate: &Path, claim: &str) -> String {
    let command = format!(
        "for n in $(seq 1 600); do [ -e {} ] && break; sleep 0.05; done; printf '{{\"subtask_id\":\"%s\",\"status\":\"complete\",\"findings\":[{{\"claim\":\"{claim}\",\"source\":\"printf\",\"confidence_permille\":900}}],\"gaps\":[],\"summary\":\"follow-up\"}}' \"${SUBTASK_ID_ENV}\" >&2",
        gate.display()
    );
    format!(
        "Now answer this too.\nCALL_TOOL: bash {}",
        serde_json::json!({ "command": command })
    )
}

/// The root task of `run` (it exists once the run's first commit is durable).
pub(crate) async fn root_of(store: &Store, run: RunId) -> TaskId {
    for _ in 0..3_000 {
        if let Ok(page) = store.run(run).tasks(None, 10)
            && let Some(root) = page.items.iter().find(|t| t.kind == TaskKind::Root)
        {
            return root.id;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!("no root task for {run}");
}
