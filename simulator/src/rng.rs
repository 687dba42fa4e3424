//! The world's single source of randomness: one ChaCha8 stream per seed. Every choice the world makes
//! (latency, drops, which harness failure, when to crash) is drawn from it in event order, so a seed fixes
//! the whole run. ChaCha8 is named, not `StdRng`, because `StdRng`'s algorithm may change between
//! releases and replays must not.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Probabilities are integers in parts per million: exact, printable, and free of float rounding.
pub type PartsPerMillion = u32;

/// One million parts: certainty.
pub const PPM_ONE: PartsPerMillion = 1_000_000;

/// The seeded stream, with the few draws the world needs.
#[derive(Debug, Clone)]
pub struct SimRng {
    inner: ChaCha8Rng,
    draws: u64,
}

impl SimRng {
    /// The stream for `seed`.
    pub fn new(seed: u64) -> Self {
        Self {
            inner: ChaCha8Rng::seed_from_u64(seed),
            draws: 0,
        }
    }

    /// True with probability `ppm / 1_000_000`. Zero and certainty never draw, so a fault class that a
    /// profile turns off consumes nothing from the stream.
    pub fn chance(&mut self, ppm: PartsPerMillion) -> bool {
        if ppm == 0 {
            return false;
        }
        if ppm >= PPM_ONE {
            return true;
        }
        self.draws += 1;
        self.inner.random_range(0..PPM_ONE) < ppm
    }

    /// A value in `lo..=hi` (`lo` when `hi <= lo`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        self.draws += 1;
        self.inner.random_range(lo..=hi)
    }

    /// An index in `0..len` (0 when `len` is 0).
    pub fn index(&mut self, len: usize) -> usize {
        if len <= 1 {
            return 0;
        }
        self.draws += 1;
        self.inner.random_range(0..len)
    }

    /// A raw 64-bit draw, for ids and for the random input the machines take.
    pub fn next_u64(&mut self) -> u64 {
        self.draws += 1;
        self.inner.random()
    }

    /// A raw 128-bit draw, for run and task ids (ULID-sized).
    pub fn next_u128(&mut self) -> u128 {
        self.draws += 1;
        self.inner.random()
    }

    /// An index chosen with the given integer weights (0 when every weight is zero).
    pub fn weighted(&mut self, weights: &[u32]) -> usize {
        let total: u64 = weights.iter().map(|w| u64::from(*w)).sum();
        if total == 0 {
            return 0;
        }
        let mut pick = self.range(0, total - 1);
        for (i, w) in weights.iter().enumerate() {
            let w = u64::from(*w);
            if pick < w {
                return i;
            }
            pick -= w;
        }
        weights.len() - 1
    }

    /// How many values were drawn: part of a violation report, to tell two diverging replays apart.
    pub fn draws(&self) -> u64 {
        self.draws
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_one_stream() {
        let mut a = SimRng::new(7);
        let mut b = SimRng::new(7);
        let xs: Vec<u64> = (0..32).map(|_| a.range(0, 1000)).collect();
        let ys: Vec<u64> = (0..32).map(|_| b.range(0, 1000)).collect();
        assert_eq!(xs, ys);
        let mut c = SimRng::new(8);
        let zs: Vec<u64> = (0..32).map(|_| c.range(0, 1000)).collect();
        assert_ne!(xs, zs);
    }

    #[test]
    fn chance_bounds_are_exact() {
        let mut r = SimRng::new(1);
        assert!((0..1000).all(|_| !r.chance(0)));
        assert!((0..1000).all(|_| r.chance(PPM_ONE)));
        assert_eq!(r.draws(), 0);
    }

    #[test]
    fn weighted_never_picks_a_zero_weight() {
        let mut r = SimRng::new(3);
        for _ in 0..1000 {
            assert_ne!(r.weighted(&[5, 0, 5]), 1);
        }
    }
}
