//! The in-process guard against starting two harness sessions with one idempotency key (DESIGN.md
//! §12, invariant 2), bounded without forgetting: a full guard refuses new sessions rather than
//! clearing itself (a cleared guard would let a replayed start run a session a second time).

use crate::ids::IdempotencyKey;
use std::collections::BTreeSet;

/// Most idempotency keys a runtime's guard remembers: a million sessions in one process. Past it the
/// process refuses new sessions until it is restarted (recovery rebuilds from the store's
/// idempotency records, which are the durable guard).
pub const STARTED_KEYS_MAX: usize = 1 << 20;

/// Why a session may not start.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StartRefusal {
    /// A session was already started with this key in this process.
    #[error("a session was already started with key {0}")]
    AlreadyStarted(IdempotencyKey),
    /// The guard holds its maximum of keys; forgetting any would let a duplicate through.
    #[error(
        "this process has started {max} sessions, the most its duplicate-start guard remembers; restart the node to go on (runs resume from the store)"
    )]
    GuardFull {
        /// The guard's bound.
        max: usize,
    },
}

/// The keys of the sessions this process started, bounded by `max`.
#[derive(Clone, Debug)]
pub struct StartedKeys {
    keys: BTreeSet<IdempotencyKey>,
    max: usize,
}

impl Default for StartedKeys {
    fn default() -> Self {
        Self::new(STARTED_KEYS_MAX)
    }
}

impl StartedKeys {
    /// An empty guard that remembers at most `max` keys.
    pub fn new(max: usize) -> Self {
        Self {
            keys: BTreeSet::new(),
            max,
        }
    }

    /// Record `key` as started, or refuse it: a key seen before is refused, and so is a new key
    /// once the guard is full (no key is ever forgotten).
    ///
    /// # Errors
    /// [`StartRefusal::AlreadyStarted`] or [`StartRefusal::GuardFull`].
    pub fn admit(&mut self, key: IdempotencyKey) -> Result<(), StartRefusal> {
        if self.keys.len() >= self.max {
            return Err(if self.keys.contains(&key) {
                StartRefusal::AlreadyStarted(key)
            } else {
                StartRefusal::GuardFull { max: self.max }
            });
        }
        // One walk of the set: a key already there is put back as it was, and refused.
        match self.keys.replace(key) {
            Some(seen) => Err(StartRefusal::AlreadyStarted(seen)),
            None => Ok(()),
        }
    }

    /// How many keys the guard holds.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the guard holds no key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u32) -> IdempotencyKey {
        IdempotencyKey(format!("k{n}"))
    }

    #[test]
    fn a_key_starts_once() {
        let mut started = StartedKeys::new(4);
        assert_eq!(started.admit(key(1)), Ok(()));
        assert_eq!(
            started.admit(key(1)),
            Err(StartRefusal::AlreadyStarted(key(1)))
        );
    }

    #[test]
    fn a_full_guard_refuses_new_keys_and_still_knows_the_old_ones() {
        let mut started = StartedKeys::new(3);
        for n in 0..3 {
            assert_eq!(started.admit(key(n)), Ok(()));
        }
        // The guard used to clear itself here, after which key 0 could start a second session.
        assert_eq!(
            started.admit(key(9)),
            Err(StartRefusal::GuardFull { max: 3 })
        );
        assert_eq!(
            started.admit(key(0)),
            Err(StartRefusal::AlreadyStarted(key(0)))
        );
        assert_eq!(started.len(), 3);
    }
}
