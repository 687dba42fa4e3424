//! The node's timers: one task holds every pending timer of the node's machines, in deadline
//! order, and fires each once at its time. A task spawned per timer (a spawn, a poll to register
//! its sleep, a wake and a poll to fire, per timer) cost more than the timer's own work: a
//! specialist alone sets two (its deadline at the supervisor, its result's resend).
//!
//! A machine's timer can be cancelled ([`crate::Effect::CancelTimer`]): the supervisor drops an
//! attempt's deadline when the attempt ends. Without it every specialist's deadline stayed here for
//! its whole timeout (ten minutes by default), so a node running thousands of specialists a second
//! held millions of dead timers.

use super::spawn;
use crate::effect::TimerKey;
use crate::machine::Millis;
use crate::runtime::clock::wall_clock_ms;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::Notify;

/// What a timer does when it fires (delivers a machine's timer input).
type Deliver = Box<dyn FnOnce() + Send>;

/// The node's timer queue; its task ends once this handle is dropped (with the node).
///
/// Setting and cancelling change the queue in place under its lock, from whatever thread the
/// machine's effects run on; the task is woken only when a new timer is due before the one it
/// sleeps for. A queue behind a channel woke the task for every order, and a deadline set ten
/// minutes out or a cancel needs no wake.
pub(crate) struct Timers {
    shared: Arc<Shared>,
}

struct Shared {
    pending: Mutex<Pending>,
    wake: Notify,
    closed: AtomicBool,
}

impl Timers {
    /// Starts the task that fires the node's timers, on the current tokio runtime.
    pub(crate) fn start() -> Self {
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending::default()),
            wake: Notify::new(),
            closed: AtomicBool::new(false),
        });
        spawn(drive(Arc::clone(&shared)));
        Self { shared }
    }

    /// Run `deliver` at host time `at` (at once if it has passed); `key` names the machine's timer
    /// it delivers, if it is one, so [`Timers::cancel`] can drop it.
    pub(crate) fn set(
        &self,
        at: Millis,
        key: Option<TimerKey>,
        deliver: impl FnOnce() + Send + 'static,
    ) {
        let sooner = {
            let mut pending = self.shared.lock();
            // After `close` nothing fires: a timer an actor still sets as it stops is dropped, not
            // kept (with the node it holds) by a queue no task reads. Checked under the lock that
            // `close` empties the queue under, so none slips in after it.
            if self.shared.closed.load(Ordering::Acquire) {
                return;
            }
            pending.set(at, key, Box::new(deliver))
        };
        if sooner {
            self.shared.wake.notify_one();
        }
    }

    /// Drop every pending firing of the machine timer `key` (none pending: nothing happens).
    pub(crate) fn cancel(&self, key: TimerKey) {
        self.shared.lock().cancel(key);
    }
}

impl Timers {
    /// Drop every pending timer and end the task: the node shuts down. A machine timer's delivery
    /// holds the node, so until then the node could not be dropped (nor its store closed) while the
    /// async runtime it ran on lives on.
    pub(crate) fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        let dropped = {
            let mut pending = self.shared.lock();
            pending.keyed.clear();
            std::mem::take(&mut pending.due)
        };
        drop(dropped);
        self.shared.wake.notify_one();
    }
}

impl Drop for Timers {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.wake.notify_one();
    }
}

impl Shared {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        // A deliver runs outside the lock: nothing panics while it is held but the collections.
        self.pending.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The pending timers: by deadline (then by the order they were set), and the keyed ones also by
/// key, so a cancel finds them without a walk; and the deadline the task sleeps for.
#[derive(Default)]
struct Pending {
    due: BTreeMap<(Millis, u64), (Option<TimerKey>, Deliver)>,
    keyed: BTreeSet<(TimerKey, Millis, u64)>,
    set: u64,
    /// The deadline the task sleeps until (`None`: it waits for a timer without a deadline).
    armed: Option<Millis>,
}

impl Pending {
    /// Add a timer; true when the task must wake for it (it is due before the one it sleeps for).
    fn set(&mut self, at: Millis, key: Option<TimerKey>, deliver: Deliver) -> bool {
        self.set += 1;
        if let Some(key) = key {
            self.keyed.insert((key, at, self.set));
        }
        self.due.insert((at, self.set), (key, deliver));
        self.armed.is_none_or(|armed| at < armed)
    }

    fn cancel(&mut self, key: TimerKey) {
        let found: Vec<(TimerKey, Millis, u64)> = self
            .keyed
            .range((key, Millis::MIN, u64::MIN)..=(key, Millis::MAX, u64::MAX))
            .copied()
            .collect();
        for entry @ (_, at, set) in found {
            self.keyed.remove(&entry);
            self.due.remove(&(at, set));
        }
    }

    /// Take the first timer due at `now`, if any.
    fn pop_due(&mut self, now: Millis) -> Option<Deliver> {
        let entry = self.due.first_entry()?;
        let (at, set) = *entry.key();
        if at > now {
            return None;
        }
        let (key, deliver) = entry.remove();
        if let Some(key) = key {
            self.keyed.remove(&(key, at, set));
        }
        Some(deliver)
    }

    fn next(&self) -> Option<Millis> {
        self.due.first_key_value().map(|((at, _), _)| *at)
    }
}

/// Drops the pending timers when the timer task ends or is dropped (the runtime drops its tasks
/// as it shuts down). A machine timer's delivery holds the node, and the node holds the queue: were
/// they kept, the node would never be dropped, nor its store closed cleanly.
struct DropPending(Arc<Shared>);

impl Drop for DropPending {
    fn drop(&mut self) {
        let dropped = {
            let mut pending = self.0.lock();
            pending.keyed.clear();
            std::mem::take(&mut pending.due)
        };
        // Outside the lock: the last of them may drop the node, and with it this queue's handle.
        drop(dropped);
    }
}

/// Fires every timer at its deadline, in deadline order (then in the order they were set), each
/// outside the queue's lock.
async fn drive(shared: Arc<Shared>) {
    let _drop_pending = DropPending(Arc::clone(&shared));
    let mut fire = Vec::new();
    // The deadline whose sleep has just ended: fired then even if the wall clock reads a little
    // earlier (the sleep's clock and the wall clock may differ).
    let mut ended: Option<Millis> = None;
    loop {
        if shared.closed.load(Ordering::Acquire) {
            return; // the node is gone
        }
        let next = {
            let mut pending = shared.lock();
            let now = wall_clock_ms().max(ended.take().unwrap_or(0));
            while let Some(deliver) = pending.pop_due(now) {
                fire.push(deliver);
            }
            let next = pending.next();
            // Armed under the lock: a timer set from now on compares with this deadline.
            pending.armed = next;
            next
        };
        for deliver in fire.drain(..) {
            deliver();
        }
        match next {
            Some(at) => {
                let wait = Duration::from_millis(at.saturating_sub(wall_clock_ms()));
                tokio::select! {
                    () = shared.wake.notified() => {}
                    () = tokio::time::sleep(wait) => ended = Some(at),
                }
            }
            None => shared.wake.notified().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Pending;
    use crate::AttemptId;
    use crate::effect::TimerKey;
    use crate::message::SupervisorTimer;
    use keel_store::{RunId, TaskId};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering};

    fn deadline(n: u128) -> TimerKey {
        TimerKey::Supervisor(SupervisorTimer::Deadline(AttemptId {
            run: RunId(1),
            task: TaskId(n),
            attempt: 1,
        }))
    }

    fn counting(fired: &Arc<AtomicU32>) -> Box<dyn FnOnce() + Send> {
        let fired = Arc::clone(fired);
        Box::new(move || {
            fired.fetch_add(1, Ordering::Relaxed);
        })
    }

    #[test]
    fn a_cancelled_timer_is_dropped_and_the_others_fire_in_order() {
        let fired = Arc::new(AtomicU32::new(0));
        let mut pending = Pending::default();
        assert!(pending.set(30, Some(deadline(1)), counting(&fired)));
        pending.armed = Some(30);
        assert!(
            pending.set(10, Some(deadline(2)), counting(&fired)),
            "sooner: wake"
        );
        pending.armed = Some(10);
        assert!(!pending.set(20, None, counting(&fired)), "later: no wake");
        assert!(!pending.set(40, Some(deadline(1)), counting(&fired)));
        pending.cancel(deadline(1));
        // A cancel of a timer that is not pending changes nothing.
        pending.cancel(deadline(9));
        assert_eq!(pending.due.len(), 2);
        assert_eq!(pending.keyed.len(), 1);
        assert_eq!(pending.next(), Some(10));
        assert!(pending.pop_due(5).is_none());
        let mut order = Vec::new();
        while let Some(at) = pending.next() {
            let Some(deliver) = pending.pop_due(at) else {
                break;
            };
            deliver();
            order.push(at);
        }
        assert_eq!(order, vec![10, 20]);
        assert_eq!(fired.load(Ordering::Relaxed), 2);
        assert!(
            pending.keyed.is_empty(),
            "a fired timer leaves no key behind"
        );
    }
}
