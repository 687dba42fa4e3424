//! Retry policy for model requests: exponential backoff with full jitter, an attempt cap, and
//! `retry-after` honoured. Pure: the random draw is an input, so tests and the simulator can
//! replay it.

use crate::error::{ErrorCategory, HarnessError};

/// How the loop retries one model request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Total attempts for one request, the first included.
    pub attempts_max: u32,
    /// Backoff base: the n-th retry waits a random time in `[0, min(cap, base * 2^n)]`.
    pub base_ms: u64,
    /// Ceiling of one backoff wait.
    pub cap_ms: u64,
    /// Longest `retry-after` the loop waits out itself. A longer rate limit is surfaced at once as
    /// `rate_limited` so the supervisor can move the task to another account or harness instead of
    /// holding a session idle.
    pub retry_after_wait_ms_max: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            attempts_max: 4,
            base_ms: 500,
            cap_ms: 20_000,
            retry_after_wait_ms_max: 20_000,
        }
    }
}

/// What to do after a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryDecision {
    /// Wait this long, then try again.
    RetryAfterMs(u64),
    /// Stop retrying and report the error.
    GiveUp,
}

impl RetryPolicy {
    /// Decides after attempt number `attempt` (1-based) failed with `error`. `random` is a uniform
    /// 64-bit draw used for jitter.
    pub fn decide(&self, attempt: u32, error: &HarnessError, random: u64) -> RetryDecision {
        if !error.retryable || attempt >= self.attempts_max {
            return RetryDecision::GiveUp;
        }
        let exp = self.base_ms.saturating_mul(1u64 << attempt.min(30));
        let ceiling = exp.min(self.cap_ms);
        let jittered = if ceiling == 0 {
            0
        } else {
            random % (ceiling + 1)
        };
        match error.retry_after_ms {
            Some(after) if after > self.retry_after_wait_ms_max => RetryDecision::GiveUp,
            Some(after) => RetryDecision::RetryAfterMs(after.max(jittered)),
            None if matches!(error.category, ErrorCategory::RateLimited { .. }) => {
                // A 429 without retry-after: back off at least the base.
                RetryDecision::RetryAfterMs(jittered.max(self.base_ms))
            }
            None => RetryDecision::RetryAfterMs(jittered),
        }
    }
}

/// A small, fast, seedable generator (SplitMix64) for jitter. Not cryptographic; jitter only needs
/// to de-synchronise clients.
#[derive(Debug, Clone)]
pub struct Jitter {
    state: u64,
}

impl Jitter {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Self {
        Jitter { state: seed }
    }

    /// The next draw.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(attempt: u32, error: HarnessError, random: u64, expected: RetryDecision) {
        assert_eq!(
            RetryPolicy::default().decide(attempt, &error, random),
            expected,
            "{error:?} attempt {attempt}"
        );
    }

    #[test]
    fn decisions() {
        // Jitter stays within the exponential ceiling: attempt 1 -> [0, 1000].
        check(
            1,
            HarnessError::transient("500"),
            1001 + 700,
            RetryDecision::RetryAfterMs(700),
        );
        // Capped at cap_ms for late attempts.
        let p = RetryPolicy {
            attempts_max: 100,
            ..RetryPolicy::default()
        };
        assert!(
            matches!(p.decide(40, &HarnessError::transient("x"), u64::MAX), RetryDecision::RetryAfterMs(ms) if ms <= 20_000)
        );
        // The attempt cap holds.
        check(4, HarnessError::transient("500"), 0, RetryDecision::GiveUp);
        // Not retryable: give up at once.
        check(
            1,
            HarnessError::from_http_status(400, "bad", None, None),
            0,
            RetryDecision::GiveUp,
        );
        // retry-after is a floor.
        check(
            1,
            HarnessError::rate_limited("429", None, Some(3000)),
            5,
            RetryDecision::RetryAfterMs(3000),
        );
        // A long rate limit goes to the supervisor.
        check(
            1,
            HarnessError::rate_limited("429", Some(1), Some(3_600_000)),
            5,
            RetryDecision::GiveUp,
        );
    }

    #[test]
    fn jitter_is_replayable() {
        let mut a = Jitter::new(7);
        let mut b = Jitter::new(7);
        let xs: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        assert_eq!(xs, (0..5).map(|_| b.next_u64()).collect::<Vec<_>>());
        assert_ne!(xs[0], xs[1]);
    }
}
