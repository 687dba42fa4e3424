//! Plans that the built-in scripted model can carry out for real, so `keel run` does something true on
//! a machine with no model access and no keys.
//!
//! The scripted model's prompt rules (keel-harness `scripted::model`) call the shell tool with the
//! command after `RUN_TOOL:` in the brief, then answer with the tool's result. Each step here is one
//! real command run by keel's agent loop in the working directory; the command prints the step's
//! report (the JSON object the specialist parses, naming the subtask id the session finds in
//! [`SUBTASK_ID_ENV`]) on stderr, which is the end of the tool result and so the end of the model's
//! final answer. The finding's claim is the first line the command printed, so reports carry what the
//! tools really saw.
//!
//! Limit: the model echoes at most 300 characters of a tool result, so claims are cut to
//! [`CLAIM_CHARS_MAX`] and source and summary must be short ([`SHORT_TEXT_CHARS_MAX`]).

use crate::plan::{Plan, PlanStep};
use crate::runtime::SUBTASK_ID_ENV;
use keel_store::AgentProfile;

/// The agent that runs keel-harness's in-process scripted harness (`HarnessKind::Scripted`, no
/// model, no keys): the runtime's tests and examples assign their steps to it, so its name, model
/// and account are said once.
pub fn scripted_agent() -> AgentProfile {
    AgentProfile {
        name: "scripted".into(),
        description: "the built-in scripted model".into(),
        harness: "scripted".into(),
        model: "scripted-1".into(),
        account: "local".into(),
        tools: Vec::new(),
        system_prompt: String::new(),
        limits: Default::default(),
    }
}

/// A start of `attempt` by [`scripted_agent`], as the supervisor hands one over once admitted:
/// what tests of a specialist's hosts (here and on a cluster worker) spawn directly, without a
/// supervisor to admit it.
pub fn scripted_start(attempt: crate::ids::AttemptId, brief: &str) -> crate::SpecialistStart {
    let agent = scripted_agent();
    crate::SpecialistStart {
        attempt,
        reply_to: crate::ids::ReplyTo::new(attempt),
        task: attempt.task,
        brief: crate::SubtaskBrief::plain(
            format!("step-{}", attempt.task.0),
            attempt.task,
            brief,
            "a goal",
        ),
        assignment: crate::Assignment {
            agent: agent.name,
            harness: keel_harness::HarnessKind::Scripted,
            model: agent.model,
            account: agent.account,
            tools: Vec::new(),
            system_prompt: String::new(),
            turns_max: None,
        },
        continuity: crate::Continuity::Fresh,
        kind: keel_store::TaskKind::Subtask,
        deadline_at: u64::MAX / 2,
    }
}

/// Most characters of a finding's claim (what the command printed, sanitised).
pub const CLAIM_CHARS_MAX: usize = 60;
/// Most characters of a step's source and summary.
pub const SHORT_TEXT_CHARS_MAX: usize = 24;

/// Why a scripted step could not be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScriptedStepError {
    /// Source or summary is too long for the model's echo, or holds characters a JSON string in
    /// single quotes cannot carry.
    #[error("{field} must be at most {SHORT_TEXT_CHARS_MAX} characters of [A-Za-z0-9 ._:/-]")]
    BadText {
        /// Which field.
        field: &'static str,
    },
    /// The command contains `;;`, which ends a `RUN_TOOL:` command early, or a line break.
    #[error("the command must be one line without ';;'")]
    BadCommand,
}

fn plain(text: &str) -> bool {
    text.len() <= SHORT_TEXT_CHARS_MAX
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || " ._:/-".contains(c))
}

/// The brief of one scripted step: run `command` in the working directory and report its first
/// output line as the finding, with `source` and `summary`.
///
/// # Errors
/// [`ScriptedStepError`] when a text would not survive the model's echo or the shell.
pub fn report_brief(
    what: &str,
    command: &str,
    source: &str,
    summary: &str,
) -> Result<String, ScriptedStepError> {
    if !plain(source) {
        return Err(ScriptedStepError::BadText { field: "source" });
    }
    if !plain(summary) {
        return Err(ScriptedStepError::BadText { field: "summary" });
    }
    if command.contains(";;") || command.contains('\n') {
        return Err(ScriptedStepError::BadCommand);
    }
    Ok(format!(
        "{what}\nRUN_TOOL: c=$( {{ {command} ; }} 2>/dev/null | head -n 1 | tr -cd 'A-Za-z0-9 ._:/-' | cut -c1-{CLAIM_CHARS_MAX} ); \
printf '{{\"subtask_id\":\"%s\",\"status\":\"complete\",\"findings\":[{{\"claim\":\"%s\",\"source\":\"{source}\",\"confidence_permille\":900}}],\"gaps\":[],\"summary\":\"{summary}\"}}' \"${SUBTASK_ID_ENV}\" \"${{c:-no output}}\" >&2 ;;"
    ))
}

/// One plan step carrying a scripted brief.
///
/// # Errors
/// As [`report_brief`].
pub fn step(
    key: &str,
    what: &str,
    command: &str,
    source: &str,
    depends_on: &[&str],
) -> Result<PlanStep, ScriptedStepError> {
    Ok(PlanStep {
        key: key.into(),
        brief: report_brief(what, command, source, key)?,
        goal: what.into(),
        quality_criteria: vec!["the finding is what the command printed".into()],
        output_schema: None,
        assignee: None,
        depends_on: depends_on.iter().map(|d| (*d).to_string()).collect(),
        estimate_micros: 0,
    })
}

/// The files a survey looks at, one path a line: in a git work tree the files git tracks or would
/// track (`git ls-files --cached --others --exclude-standard`: what `.gitignore` leaves out, a
/// build's `target/` say, is not part of the repository), elsewhere every file; never keel's own
/// folder. A tracked file deleted from the working tree is listed by git but fails the later tools,
/// whose errors are discarded.
const SURVEY_FILES: &str = "{ git -c core.quotePath=false ls-files --cached --others --exclude-standard 2>/dev/null || find . -path ./.keel -prune -o -type f -print ; } | sed 's#^[.]/##' | grep -v '^[.]keel/'";

/// The deterministic survey plan `keel run` uses with the scripted model: a few real looks at the
/// working directory's files ([`SURVEY_FILES`]: in a git repository, not what git ignores),
/// independent of each other, so they run in parallel. The brief is kept on the run row; every
/// step restates it as a constraint.
///
/// # Errors
/// Never for the built-in steps; the type keeps the builder honest.
pub fn survey_plan(brief: &str) -> Result<Plan, ScriptedStepError> {
    let steps = vec![
        step(
            "inventory",
            "Count the files in the working directory (keel's own folder and what git ignores excluded).",
            &format!("printf 'files: %s' $({SURVEY_FILES} | wc -l)"),
            "find",
            &[],
        )?,
        step(
            "languages",
            "Find the most common file extension in the working directory.",
            &format!(
                "{SURVEY_FILES} | sed 's#.*/##' | grep '[.]' | sed 's/.*[.]//' | sort | uniq -c | sort -rn | head -n 1 | awk '{{print \"most common extension: \" $2 \" (\" $1 \" files)\"}}'"
            ),
            "find ext",
            &[],
        )?,
        step(
            "largest",
            "Find the largest file in the working directory.",
            &format!(
                "{SURVEY_FILES} | tr '\\n' '\\0' | xargs -0 -r stat -c '%s %n' | sort -rn | head -n 1 | awk '{{print \"largest: \" $2 \" \" $1 \" bytes\"}}'"
            ),
            "find size",
            &[],
        )?,
        step(
            "todos",
            "Count TODO and FIXME markers in the working directory.",
            &format!(
                "printf 'todo markers: %s' $({SURVEY_FILES} | tr '\\n' '\\0' | xargs -0 -r grep -IE 'TODO|FIXME' | wc -l)"
            ),
            "grep",
            &[],
        )?,
    ];
    Ok(Plan {
        steps,
        constraints: vec![format!("The run's brief: {}", one_line(brief))],
    })
}

/// A plan of `n` independent scripted steps, each running `command_of(i)` (tests and benchmarks).
///
/// # Errors
/// As [`step`].
pub fn fan_out_plan(
    n: usize,
    command_of: impl Fn(usize) -> String,
) -> Result<Plan, ScriptedStepError> {
    let mut steps = Vec::with_capacity(n);
    for i in 0..n {
        steps.push(step(
            &format!("part-{i:03}"),
            &format!("Part {i} of the fan-out."),
            &command_of(i),
            "bash",
            &[],
        )?);
    }
    Ok(Plan {
        steps,
        constraints: Vec::new(),
    })
}

fn one_line(text: &str) -> String {
    let line = crate::context::collapse_whitespace(text, usize::MAX).into_owned();
    crate::report::bounded(line, 512)
}
