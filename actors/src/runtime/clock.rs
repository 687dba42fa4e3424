//! The two things the runtime injects into every machine: the wall clock and an OS-seeded ChaCha8
//! stream (docs/DESIGN.md §3). This is the only place in the crate that reads either.

use crate::machine::{Entropy, Millis};
use rand_chacha::ChaCha8Rng;
use rand_core::{Rng, SeedableRng};

/// Milliseconds since the Unix epoch on this host's wall clock (0 if the clock is before 1970).
#[allow(clippy::disallowed_methods)] // The runtime is the host: it reads the clock so machines never do.
pub fn wall_clock_ms() -> Millis {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A clock that never goes backwards for the machine it feeds (the machine contract asks for it;
/// the wall clock may step back under NTP).
#[derive(Clone, Copy, Debug, Default)]
pub struct MonotonicMillis {
    last: Millis,
}

impl MonotonicMillis {
    /// The wall clock, or the last reading if the wall clock stepped back.
    pub fn now(&mut self) -> Millis {
        self.last = self.last.max(wall_clock_ms());
        self.last
    }
}

/// The runtime's random stream: ChaCha8 (a named, stable algorithm, never `StdRng`), seeded once from
/// the OS. Each hosted machine gets its own stream forked from the node's, so no lock is shared.
#[derive(Clone, Debug)]
pub struct OsEntropy {
    rng: ChaCha8Rng,
}

/// The OS could not provide a seed.
#[derive(Debug, thiserror::Error)]
#[error("the operating system could not provide a random seed: {0}")]
pub struct EntropyError(String);

impl OsEntropy {
    /// A stream seeded from the operating system.
    ///
    /// # Errors
    /// [`EntropyError`] when the OS source fails (no `getrandom`, no `/dev/urandom`).
    pub fn from_os() -> Result<Self, EntropyError> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| EntropyError(e.to_string()))?;
        Ok(Self {
            rng: ChaCha8Rng::from_seed(seed),
        })
    }

    /// A stream with a fixed seed (benchmarks and tests that want a replayable node).
    pub fn from_seed(seed: u64) -> Self {
        Self {
            rng: ChaCha8Rng::seed_from_u64(seed),
        }
    }

    /// A new independent stream seeded from this one.
    pub fn fork(&mut self) -> Self {
        let mut seed = [0u8; 32];
        for chunk in seed.chunks_mut(8) {
            chunk.copy_from_slice(&self.rng.next_u64().to_le_bytes());
        }
        Self {
            rng: ChaCha8Rng::from_seed(seed),
        }
    }
}

impl Entropy for OsEntropy {
    fn next_u64(&mut self) -> u64 {
        self.rng.next_u64()
    }
}
