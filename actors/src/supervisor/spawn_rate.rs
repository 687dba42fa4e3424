//! The supervisor's spawn-rate bucket: governor's GCRA limiter on a clock that is the machine's `now`.
//!
//! governor's `RateLimiter` reads time only through its `Clock` (`fn now(&self) -> Instant`), so the
//! limiter here owns a [`MachineClock`] that the supervisor sets to the injected `now` before each
//! check: no wall clock, no randomness, and the same inputs give the same admissions (docs/DESIGN.md §3).
//! The limiter is "direct" (one state, no keys: governor's keyed limiters are hash maps) and its state
//! is governor's `InMemoryState`, an atomic theoretical arrival time in nanoseconds since the limiter
//! was made, which is Millis 0 of the machine's clock.
//!
//! governor's GCRA is the one this module replaced: a spawn at `now` is admitted when
//! `now >= tat - interval * (burst - 1)`, after which `tat = max(tat, now) + interval`; a refusal
//! says when the earliest admission would be. governor computes in `u64` nanoseconds with plain
//! `+` and `*`, so both the clock and the bucket's span are capped here at about 292 years each,
//! which keeps every sum inside `u64` (and governor's `Duration` to nanoseconds conversion from
//! panicking); values below the caps behave exactly as before.

use crate::machine::Millis;
use governor::clock::Clock;
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};
use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

const NANOS_PER_MS: u64 = 1_000_000;

/// Latest `now` the clock represents (about 292 years after Millis 0); later readings are held here.
pub const CLOCK_MS_MAX: Millis = u64::MAX / NANOS_PER_MS / 2;

/// Longest bucket span, `interval * burst` (about 292 years): with [`CLOCK_MS_MAX`], a theoretical
/// arrival time never passes `u64::MAX` nanoseconds.
pub const BUCKET_SPAN_MS_MAX: Millis = u64::MAX / NANOS_PER_MS / 2;

/// A governor clock that reads the machine's `now`, set by the supervisor before each check. Atomic
/// only because governor's `Clock::now` takes `&self`; the supervisor is single-threaded.
#[derive(Debug, Default)]
pub struct MachineClock {
    now_nanos: AtomicU64,
}

impl MachineClock {
    /// Moves the clock to `now` (capped at [`CLOCK_MS_MAX`]).
    fn set(&self, now: Millis) {
        self.now_nanos
            .store(now.min(CLOCK_MS_MAX) * NANOS_PER_MS, Ordering::Relaxed);
    }
}

impl Clock for MachineClock {
    type Instant = Nanos;

    fn now(&self) -> Nanos {
        Nanos::from(self.now_nanos.load(Ordering::Relaxed))
    }
}

/// Spawns admitted back to back up to a burst, then one per interval, on the machine's clock.
#[derive(Debug)]
pub struct SpawnRate {
    limiter: RateLimiter<NotKeyed, InMemoryState, MachineClock, NoOpMiddleware<Nanos>>,
}

impl SpawnRate {
    /// A full bucket of `burst` tokens (at least 1) refilled one every `interval_ms` (at least 1).
    pub fn new(burst: u32, interval_ms: Millis) -> Self {
        let interval_ms = interval_ms.clamp(1, BUCKET_SPAN_MS_MAX);
        let burst_max = u32::try_from(BUCKET_SPAN_MS_MAX / interval_ms).unwrap_or(u32::MAX);
        let burst = NonZeroU32::new(burst.min(burst_max)).unwrap_or(NonZeroU32::MIN);
        // `with_period` refuses only a zero period, which the clamp above rules out.
        let quota = Quota::with_period(Duration::from_millis(interval_ms))
            .unwrap_or(Quota::per_second(NonZeroU32::MIN))
            .allow_burst(burst);
        // The clock reads Millis 0 here, so governor's start instant is the machine clock's origin.
        Self {
            limiter: RateLimiter::direct_with_clock(quota, MachineClock::default()),
        }
    }

    /// Takes a token at `now`, or says in how many milliseconds the next one is free. A refusal takes
    /// nothing, so a refused spawn does not delay the next.
    ///
    /// # Errors
    /// The wait in milliseconds (at least 1) when the bucket is empty at `now`.
    pub fn take(&self, now: Millis) -> Result<(), Millis> {
        let clock = self.limiter.clock();
        clock.set(now);
        self.limiter.check().map_err(|not_until| {
            let wait = not_until.wait_time_from(clock.now());
            u64::try_from(wait.as_nanos().div_ceil(u128::from(NANOS_PER_MS)))
                .unwrap_or(u64::MAX)
                .max(1)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_then_one_per_interval() {
        let rate = SpawnRate::new(2, 1000);
        assert_eq!(rate.take(5000), Ok(()));
        assert_eq!(rate.take(5000), Ok(()));
        assert_eq!(rate.take(5000), Err(1000));
        assert_eq!(rate.take(5400), Err(600));
        assert_eq!(rate.take(6000), Ok(()));
        assert_eq!(rate.take(6000), Err(1000));
    }

    #[test]
    fn extreme_settings_and_times_do_not_overflow() {
        let rate = SpawnRate::new(u32::MAX, u64::MAX);
        assert_eq!(rate.take(u64::MAX), Ok(()));
        assert!(rate.take(u64::MAX).is_err());
        let rate = SpawnRate::new(0, 0);
        assert_eq!(rate.take(0), Ok(()));
        assert_eq!(rate.take(0), Err(1));
        let rate = SpawnRate::new(u32::MAX / 2, 1);
        for now in [0, 1, CLOCK_MS_MAX - 1, CLOCK_MS_MAX, u64::MAX] {
            assert_eq!(rate.take(now), Ok(()));
        }
    }
}
