//! The architecture invariant that no adapter resumes a native session (docs/DESIGN.md §6, invariant 5):
//! the flags that would, and the check that refuses an argv holding one before anything is spawned.

use crate::error::StartError;
use crate::spec::HarnessKind;

/// Flags that would make a CLI resume a native session; never allowed (docs/DESIGN.md §6).
pub const RESUME_FLAGS: [&str; 8] = [
    "--resume",
    "-r",
    "--continue",
    "-c",
    "--session",
    "-s",
    "--fork",
    "--session-id",
];

/// Refuses an argv that holds a resume or continue flag, or Codex's `resume` subcommand.
///
/// Codex's `-c key=value` config flag shares its spelling with other CLIs' `-c/--continue`, so
/// `-c` is refused only for the CLIs where it means continue.
///
/// # Errors
/// [`StartError::InvalidSpec`] naming the flag.
pub fn check_no_resume_flag(kind: HarnessKind, args: &[String]) -> Result<(), StartError> {
    let mut after_double_dash = false;
    for (i, arg) in args.iter().enumerate() {
        if arg == "--" {
            after_double_dash = true;
        }
        if after_double_dash {
            continue;
        }
        let flag = arg.split('=').next().unwrap_or(arg);
        let refused = match flag {
            "-c" => kind != HarnessKind::Codex,
            "-s" => kind == HarnessKind::Opencode,
            f => RESUME_FLAGS.contains(&f) && f != "-s",
        };
        let codex_subcommand =
            kind == HarnessKind::Codex && i <= 1 && (arg == "resume" || arg == "fork");
        if refused || codex_subcommand {
            return Err(StartError::InvalidSpec(format!(
                "argv holds the native resume flag `{arg}`; keel never resumes a harness session"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_flags_are_refused() {
        let v = |a: &[&str]| a.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert!(
            check_no_resume_flag(HarnessKind::ClaudeCode, &v(&["-p", "x", "--resume", "abc"]))
                .is_err()
        );
        assert!(check_no_resume_flag(HarnessKind::ClaudeCode, &v(&["-p", "--continue"])).is_err());
        assert!(check_no_resume_flag(HarnessKind::Pi, &v(&["-c"])).is_err());
        assert!(check_no_resume_flag(HarnessKind::Pi, &v(&["--session=x"])).is_err());
        assert!(check_no_resume_flag(HarnessKind::Opencode, &v(&["run", "-s", "ses_1"])).is_err());
        assert!(check_no_resume_flag(HarnessKind::Codex, &v(&["exec", "resume", "id"])).is_err());
        assert!(
            check_no_resume_flag(HarnessKind::Codex, &v(&["exec", "-c", "model=x", "--json"]))
                .is_ok()
        );
        // A prompt after `--` may say anything.
        assert!(
            check_no_resume_flag(HarnessKind::Opencode, &v(&["run", "--", "--resume"])).is_ok()
        );
    }
}
