//! Token usage that cannot be double counted.
//!
//! Harnesses report usage more than once for the same work: Anthropic streams send a partial count in
//! `message_start` and the cumulative count in `message_delta`; Claude Code repeats each message's
//! usage on every `assistant` frame and then prints a session total in `result`. Adding every frame
//! over-counted by up to 15x in one public orchestrator. The rule here is explicit:
//!
//! 1. A [`UsageScope::Message`] report is the *cumulative* usage of that one model message so far. A
//!    later report for the same message id **replaces** the earlier one; different ids add up.
//! 2. A [`UsageScope::SessionTotal`] report is the harness's authoritative total for the whole
//!    session. Once one arrives, it **replaces** the per-message sum (the latest total wins); it is
//!    never added to it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Token counts for some scope. Fixed-width integers so they cross nodes unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct TokenCounts {
    /// Uncached input tokens.
    pub input_tokens: u64,
    /// Output tokens.
    pub output_tokens: u64,
    /// Input tokens read from the prompt cache.
    pub cache_read_tokens: u64,
    /// Input tokens written to the prompt cache.
    pub cache_write_tokens: u64,
    /// Cost in millionths of a US dollar, when the harness reports it.
    pub cost_micros: Option<u64>,
}

impl TokenCounts {
    /// Every token billed, the figure `SessionLimits::tokens_max` is compared with.
    pub fn total_tokens(&self) -> u64 {
        self.input_tokens
            .saturating_add(self.output_tokens)
            .saturating_add(self.cache_read_tokens)
            .saturating_add(self.cache_write_tokens)
    }

    fn saturating_add(&self, other: &TokenCounts) -> TokenCounts {
        TokenCounts {
            input_tokens: self.input_tokens.saturating_add(other.input_tokens),
            output_tokens: self.output_tokens.saturating_add(other.output_tokens),
            cache_read_tokens: self
                .cache_read_tokens
                .saturating_add(other.cache_read_tokens),
            cache_write_tokens: self
                .cache_write_tokens
                .saturating_add(other.cache_write_tokens),
            cost_micros: match (self.cost_micros, other.cost_micros) {
                (None, None) => None,
                (a, b) => Some(a.unwrap_or(0).saturating_add(b.unwrap_or(0))),
            },
        }
    }
}

/// What a usage report covers; decides whether it replaces or adds (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum UsageScope {
    /// Cumulative usage of one model message, keyed by the endpoint's message id (or a
    /// harness-local id that is unique per model message, e.g. a turn counter).
    Message(String),
    /// The harness's authoritative total for the session so far.
    SessionTotal,
}

/// One usage report from a harness.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct UsageReport {
    /// What the counts cover.
    pub scope: UsageScope,
    /// The counts.
    pub counts: TokenCounts,
}

/// Bound on distinct message ids remembered; past it, the oldest entries are folded into a settled
/// sum (a message that old will not be reported again).
pub const USAGE_MESSAGES_MAX: usize = 4096;

/// Folds usage reports into a session total without double counting. Pure and deterministic.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct UsageAccumulator {
    per_message: BTreeMap<String, (u64, TokenCounts)>,
    settled: TokenCounts,
    session_total: Option<TokenCounts>,
    reports_count: u64,
}

impl UsageAccumulator {
    /// An empty accumulator.
    pub fn new() -> Self {
        UsageAccumulator::default()
    }

    /// Records one report by the module's rule.
    pub fn record(&mut self, report: &UsageReport) {
        self.reports_count += 1;
        match &report.scope {
            UsageScope::Message(id) => {
                self.per_message
                    .insert(id.clone(), (self.reports_count, report.counts));
                if self.per_message.len() > USAGE_MESSAGES_MAX {
                    self.settle_oldest();
                }
            }
            UsageScope::SessionTotal => self.session_total = Some(report.counts),
        }
    }

    fn settle_oldest(&mut self) {
        let oldest = self
            .per_message
            .iter()
            .min_by_key(|(_, (seq, _))| *seq)
            .map(|(id, _)| id.clone());
        if let Some(id) = oldest
            && let Some((_, counts)) = self.per_message.remove(&id)
        {
            self.settled = self.settled.saturating_add(&counts);
        }
    }

    /// The session's usage: the latest authoritative total if any arrived, else the sum over
    /// messages of each message's latest report.
    pub fn total(&self) -> TokenCounts {
        if let Some(total) = self.session_total {
            return total;
        }
        self.per_message
            .values()
            .fold(self.settled, |acc, (_, c)| acc.saturating_add(c))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(id: &str, input: u64, output: u64) -> UsageReport {
        UsageReport {
            scope: UsageScope::Message(id.into()),
            counts: TokenCounts {
                input_tokens: input,
                output_tokens: output,
                ..TokenCounts::default()
            },
        }
    }

    #[test]
    fn repeated_reports_for_one_message_replace() {
        let mut acc = UsageAccumulator::new();
        // message_start (output 1), then message_delta with the cumulative count, then Claude Code's
        // assistant frame repeating the same usage for each content block.
        for r in [
            msg("m1", 10, 1),
            msg("m1", 10, 5),
            msg("m1", 10, 5),
            msg("m1", 10, 5),
        ] {
            acc.record(&r);
        }
        assert_eq!(acc.total().input_tokens, 10);
        assert_eq!(acc.total().output_tokens, 5);
        acc.record(&msg("m2", 20, 7));
        assert_eq!(acc.total().total_tokens(), 42);
    }

    #[test]
    fn a_session_total_replaces_never_adds() {
        let mut acc = UsageAccumulator::new();
        acc.record(&msg("m1", 10, 5));
        acc.record(&msg("m2", 20, 5));
        let total = UsageReport {
            scope: UsageScope::SessionTotal,
            counts: TokenCounts {
                input_tokens: 30,
                output_tokens: 10,
                cost_micros: Some(120),
                ..TokenCounts::default()
            },
        };
        acc.record(&total);
        acc.record(&total);
        assert_eq!(acc.total().input_tokens, 30);
        assert_eq!(acc.total().output_tokens, 10);
        assert_eq!(acc.total().cost_micros, Some(120));
    }

    #[test]
    fn many_messages_stay_bounded_and_exact() {
        let mut acc = UsageAccumulator::new();
        for i in 0..(USAGE_MESSAGES_MAX as u64 + 100) {
            acc.record(&msg(&format!("m{i}"), 1, 1));
            acc.record(&msg(&format!("m{i}"), 1, 2));
        }
        assert!(acc.per_message.len() <= USAGE_MESSAGES_MAX);
        assert_eq!(
            acc.total().output_tokens,
            2 * (USAGE_MESSAGES_MAX as u64 + 100)
        );
    }
}
