//! The hook bridge (docs/DESIGN.md §9): `keel hook`, the command every session's pre-tool gate runs
//! (a Claude Code command hook, a Codex hook, the opencode plugin, the pi extension, keel's own loop),
//! and the node's endpoint it asks ([`bridge`]). The command decides nothing: it forwards the CLI's
//! payload with the session's token and turns the node's answer into the gate's exit code (0 allows,
//! 2 denies with the reason on stderr). Anything that goes wrong denies. With `--report-for` it is a
//! CLI's Stop hook instead ([`stop`]: the report check, run in the hook's own process).

pub(crate) mod bridge;
pub(crate) mod stop;

use std::io::Read;
use std::process::ExitCode;
use std::time::Duration;

use keel_policy::Decision;
use serde::{Deserialize, Serialize};

/// The environment variable holding a session's hook token (set by the bridge for each session; the
/// token is never written to a spec that is persisted).
pub(crate) const HOOK_TOKEN_ENV: &str = "KEEL_HOOK_TOKEN";
/// The endpoint's path.
pub(crate) const HOOK_PATH: &str = "/v1/hook";
/// The largest payload forwarded: a tool input is bounded by the model's output.
pub(crate) const PAYLOAD_BYTES_MAX: usize = 1024 * 1024;
/// How long `keel hook` waits for the node at most (an `ask` may wait a day for a human); the gate
/// wrapper's own timeout, which counts the policy's ask timeout, is shorter and wins.
const ANSWER_WAIT_MS_MAX: u64 = 25 * 60 * 60 * 1000;
/// The gate contract's exit codes.
const EXIT_ALLOW: u8 = 0;
const EXIT_DENY: u8 = 2;

/// The node's answer to one hook call.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct HookAnswer {
    /// Allow or deny (an ask is resolved in the node before it answers).
    pub(crate) decision: Decision,
    /// Why; what the model is told on a denial.
    pub(crate) reason: String,
}

/// `keel hook --url URL`: forward stdin to the node and exit 0 (allow) or 2 (deny, reason on
/// stderr).
pub(crate) fn run(url: &str) -> ExitCode {
    match ask_node(url) {
        Ok(HookAnswer {
            decision: Decision::Allow,
            ..
        }) => ExitCode::from(EXIT_ALLOW),
        Ok(HookAnswer { reason, .. }) => deny(&reason),
        Err(e) => deny(&format!("keel hook failed, so the call is denied: {e:#}")),
    }
}

fn deny(reason: &str) -> ExitCode {
    eprintln!("{reason}");
    ExitCode::from(EXIT_DENY)
}

fn ask_node(url: &str) -> anyhow::Result<HookAnswer> {
    let token = std::env::var(HOOK_TOKEN_ENV)
        .map_err(|_| anyhow::anyhow!("{HOOK_TOKEN_ENV} is not set: not a keel session"))?;
    let mut payload = Vec::new();
    std::io::stdin()
        .take(PAYLOAD_BYTES_MAX as u64 + 1)
        .read_to_end(&mut payload)?;
    if payload.len() > PAYLOAD_BYTES_MAX {
        anyhow::bail!("the hook payload is over {PAYLOAD_BYTES_MAX} bytes");
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        keel_harness::messages_api::http::install_crypto_provider();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_millis(ANSWER_WAIT_MS_MAX))
            .build()?;
        let response = client
            .post(url)
            .bearer_auth(token)
            .header("content-type", "application/json")
            .body(payload)
            .send()
            .await?;
        // A refusal (unknown token, bad payload) still carries a deny answer with its reason.
        let answer: HookAnswer = response.json().await?;
        Ok(answer)
    })
}
