//! The specialist: one subtask attempt, one harness session (DESIGN.md §4).

use crate::machine::Millis;
use keel_harness::SessionLimits;
use std::path::PathBuf;

/// Most log rows in one `SpecialistReply::Logs`.
pub const LOG_ROWS_PER_REPLY_MAX: usize = 64;

/// Limits and environment of a specialist.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecialistConfig {
    /// The directory sessions work in (absolute, on the worker).
    pub working_dir: PathBuf,
    /// Ceilings of the harness session.
    pub session_limits: SessionLimits,
    /// How often an unacknowledged result is sent again.
    pub resend_interval_ms: Millis,
    /// How many times it is sent again before the specialist exits anyway (the supervisor's deadline
    /// then decides).
    pub resends_max: u32,
    /// Most log rows one attempt forwards; past it, rows are counted but not sent (the session keeps
    /// running: the preamble only ever needs the last 50).
    pub log_rows_max: u32,
    /// Price of a million tokens in micro-dollars, for harnesses that report tokens but not cost.
    pub micros_per_mtok: u64,
}

impl Default for SpecialistConfig {
    fn default() -> Self {
        Self {
            working_dir: PathBuf::from("/srv/example/work"),
            session_limits: SessionLimits::default(),
            resend_interval_ms: 2_000,
            resends_max: 10,
            log_rows_max: 10_000,
            micros_per_mtok: 3_000_000,
        }
    }
}

/// One specialist attempt. Created by the host from a `SpecialistStart`, then given
/// `SpecialistInput::Begin`.
#[derive(Debug)]
pub struct Specialist {
    #[allow(dead_code)]
    config: SpecialistConfig,
}
