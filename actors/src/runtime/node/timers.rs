//! The node's timers: one task holds every pending timer of the node's machines, in deadline
//! order, and fires each once at its time. A task spawned per timer (a spawn, a poll to register
//! its sleep, a wake and a poll to fire, per timer) cost more than the timer's own work: a
//! specialist alone sets two (its deadline at the supervisor, its result's resend).

use super::spawn;
use crate::machine::Millis;
use crate::runtime::clock::wall_clock_ms;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio::sync::mpsc;

/// What a timer does when it fires (delivers a machine's timer input).
type Deliver = Box<dyn FnOnce() + Send>;

/// The node's timer queue; its task ends once this handle is dropped (with the node).
pub(crate) struct Timers {
    tx: mpsc::UnboundedSender<(Millis, Deliver)>,
}

impl Timers {
    /// Starts the task that fires the node's timers, on the current tokio runtime.
    pub(crate) fn start() -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        spawn(drive(rx));
        Self { tx }
    }

    /// Run `deliver` at host time `at` (at once if it has passed). Timers are never cancelled;
    /// machines ignore stale ones.
    pub(crate) fn set(&self, at: Millis, deliver: impl FnOnce() + Send + 'static) {
        let _ = self.tx.send((at, Box::new(deliver)));
    }
}

/// Fires every timer at its deadline, in deadline order (then in the order they were set).
async fn drive(mut rx: mpsc::UnboundedReceiver<(Millis, Deliver)>) {
    let mut due: BTreeMap<(Millis, u64), Deliver> = BTreeMap::new();
    let mut set = 0u64;
    let sleep = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(sleep);
    // The deadline the sleep is armed for, and the one whose sleep has just ended (fired then even
    // if the wall clock reads a little earlier: the sleep's clock and the wall clock may differ).
    let mut armed: Option<Millis> = None;
    let mut ended: Option<Millis> = None;
    loop {
        let now = wall_clock_ms().max(ended.take().unwrap_or(0));
        while let Some(entry) = due.first_entry() {
            if entry.key().0 > now {
                break;
            }
            (entry.remove())();
        }
        let next = due.first_key_value().map(|((at, _), _)| *at);
        if next != armed {
            if let Some(at) = next {
                let wait = Duration::from_millis(at.saturating_sub(wall_clock_ms()));
                sleep.as_mut().reset(tokio::time::Instant::now() + wait);
            }
            armed = next;
        }
        tokio::select! {
            received = rx.recv() => {
                let Some((at, deliver)) = received else {
                    return; // the node is gone
                };
                set += 1;
                due.insert((at, set), deliver);
                while let Ok((at, deliver)) = rx.try_recv() {
                    set += 1;
                    due.insert((at, set), deliver);
                }
            }
            () = &mut sleep, if armed.is_some() => {
                ended = armed.take();
            }
        }
    }
}
