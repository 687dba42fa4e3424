//! `keel context TASK [--resume]`: what the agent will see, before it sees it.

use keel_actors::Continuity;
use keel_actors::context::{
    ContextConfig, ContextError, ContextReport, Scrubber, context_from_store,
};
use keel_store::{Store, TaskId};

/// Environment variables whose values are credentials. Their values are registered as literal secrets,
/// so a key pasted into a brief or echoed into a log never reaches a preamble, whatever its shape.
const CREDENTIAL_VARS: &[&str] = &[
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "OPENAI_API_KEY",
    "CODEX_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "GITHUB_TOKEN",
    "GH_TOKEN",
    "GITLAB_TOKEN",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "SLACK_BOT_TOKEN",
    "STRIPE_SECRET_KEY",
];

/// Builds the report with the caps of keel.toml's `[context]` (what the runtime's sessions get) and
/// the credentials of this environment registered.
pub(crate) fn build(
    store: &Store,
    task: TaskId,
    resume: bool,
    config: &ContextConfig,
) -> Result<ContextReport, ContextError> {
    let mut scrubber = Scrubber::new();
    for var in CREDENTIAL_VARS {
        if let Ok(value) = std::env::var(var) {
            // A value too short or empty to register safely is still caught by the pattern rules;
            // refusing it here must not stop an operator from looking at a preamble.
            let _ = scrubber.register_secret(&value);
        }
    }
    let start = match store.catalog().task(task) {
        Ok(t) if resume => Continuity::Resume { from: t.id },
        Ok(t) => Continuity::for_task(&t),
        // Let the builder report the missing task with its own typed error.
        Err(_) => Continuity::Fresh,
    };
    context_from_store(store, task, start, config, &scrubber)
}

/// `keel context`'s output for `task`, printed through `out`: called by the command on a store
/// opened here, and by the server holding the home (`GET /v1/tasks/{task}/context`), so both
/// print the same.
///
/// # Errors
/// [`crate::exit::Failed`]: exit 3 for an unknown task.
pub(crate) fn print(
    store: &Store,
    task: TaskId,
    resume: bool,
    config: &ContextConfig,
    out: &crate::render::Output,
) -> Result<(), crate::exit::Failed> {
    out.context(&build(store, task, resume, config)?)?;
    Ok(())
}
