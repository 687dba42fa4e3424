//! The server's one reader of the runtime's events: it keeps each run's events (bounded) so a
//! stream opened after a run started still shows it from its first event, fans them out to every
//! open stream of that run, and folds each run's usage the way the live view does, so a run's
//! summary served over HTTP says what a local run's says.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use keel_actors::AttemptId;
use keel_actors::runtime::RuntimeEvent;
use keel_harness::TokenCounts;
use keel_store::RunId;
use tokio::sync::{broadcast, mpsc};

use super::metrics::Metrics;
use super::wire::ApiEvent;
use crate::run::progress::Totals;

/// Most events kept per run for late subscribers; older ones are dropped (and counted).
const EVENTS_PER_RUN_MAX: usize = 10_000;
/// Most ended runs whose events are kept; the oldest is forgotten first (its summary is still
/// served from the store, without the usage line's numbers).
const ENDED_RUNS_MAX: usize = 256;
/// Capacity of a run's fan-out channel: a stream further behind than this skips events (told).
const FAN_OUT_CAPACITY: usize = 1_024;

/// One event of a run with its sequence number (1 for the run's first event).
pub(crate) type Sequenced = (u64, ApiEvent);

/// What a new subscriber gets: the events so far, then the live ones.
pub(crate) struct Subscription {
    /// Events kept so far, oldest first.
    pub(crate) replay: Vec<Sequenced>,
    /// Events dropped from the front of `replay` (over [`EVENTS_PER_RUN_MAX`]).
    pub(crate) dropped: u64,
    /// The live events; `None` once the run has ended (everything is in `replay`).
    pub(crate) live: Option<broadcast::Receiver<Sequenced>>,
}

/// One attempt's usage so far.
#[derive(Clone, Copy)]
struct AttemptUsage {
    started_seq: u64,
    tokens: TokenCounts,
    spent_micros: u64,
}

/// One run's events as the hub keeps them.
struct Feed {
    kept: VecDeque<Sequenced>,
    dropped: u64,
    next_seq: u64,
    live: broadcast::Sender<Sequenced>,
    ended: bool,
    /// Every attempt's latest usage, as the live view folds it, with the sequence number of the
    /// attempt's start (a view that began later does not count it).
    usage: BTreeMap<AttemptId, AttemptUsage>,
}

impl Feed {
    fn new() -> Self {
        Self {
            kept: VecDeque::new(),
            dropped: 0,
            next_seq: 1,
            live: broadcast::channel(FAN_OUT_CAPACITY).0,
            ended: false,
            usage: BTreeMap::new(),
        }
    }

    fn push(&mut self, event: Option<&RuntimeEvent>, wire: ApiEvent) {
        match event {
            Some(RuntimeEvent::TaskStarted { attempt, .. }) => {
                self.usage.insert(
                    *attempt,
                    AttemptUsage {
                        started_seq: self.next_seq,
                        tokens: TokenCounts::default(),
                        spent_micros: 0,
                    },
                );
            }
            Some(RuntimeEvent::Usage {
                attempt,
                tokens,
                spent_micros,
            }) => {
                if let Some(u) = self.usage.get_mut(attempt) {
                    u.tokens = *tokens;
                    u.spent_micros = *spent_micros;
                }
            }
            _ => {}
        }
        if wire.ends_stream() {
            self.ended = true;
        }
        let item = (self.next_seq, wire);
        self.next_seq += 1;
        // No receiver is not an error: nobody is watching this run right now.
        let _ = self.live.send(item.clone());
        if self.kept.len() == EVENTS_PER_RUN_MAX {
            self.kept.pop_front();
            self.dropped += 1;
        }
        self.kept.push_back(item);
    }

    /// The usage of the attempts that started at or after event `from`, as a live view opened
    /// then would add it up.
    fn totals(&self, from: u64) -> Totals {
        let mut totals = Totals::default();
        for u in self.usage.values().filter(|u| u.started_seq >= from) {
            totals.attempts = totals.attempts.saturating_add(1);
            totals.add(&u.tokens, u.spent_micros);
        }
        totals
    }
}

#[derive(Default)]
struct State {
    feeds: BTreeMap<RunId, Feed>,
    /// Ended runs, oldest first, for forgetting.
    ended: VecDeque<RunId>,
    /// Set when the server stops: every stream ends.
    closed: bool,
}

/// The fan-out of the runtime's events, shared by the server's handlers.
#[derive(Clone, Default)]
pub(crate) struct Hub {
    state: Arc<Mutex<State>>,
    /// Where failed attempts are counted, by kind.
    metrics: Option<Metrics>,
}

impl Hub {
    /// A hub that counts failed attempts in `metrics`.
    pub(crate) fn with_metrics(metrics: Metrics) -> Self {
        Self {
            state: Arc::default(),
            metrics: Some(metrics),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Read the runtime's events until its channel closes.
    pub(crate) async fn pump(self, mut events: mpsc::Receiver<RuntimeEvent>) {
        while let Some(event) = events.recv().await {
            self.publish(&event);
        }
        self.close();
    }

    /// Take one runtime event.
    pub(crate) fn publish(&self, event: &RuntimeEvent) {
        let Some(wire) = ApiEvent::from_runtime(event) else {
            return;
        };
        self.publish_wire(Some(event), wire);
    }

    /// Tell the streams of `run` that the server paused it as it stopped.
    pub(crate) fn paused(&self, run: RunId, reason: String) {
        let wire = ApiEvent::Paused { run, reason };
        // Not a runtime event: nothing to fold, only the stream to end.
        self.publish_wire(None, wire);
    }

    fn publish_wire(&self, event: Option<&RuntimeEvent>, wire: ApiEvent) {
        let run = wire.run();
        if let (Some(RuntimeEvent::TaskFailed { kind, .. }), Some(m)) = (event, &self.metrics) {
            m.harness_failure(kind.name());
        }
        let mut state = self.lock();
        let reopened = matches!(event, Some(RuntimeEvent::TaskStarted { .. }))
            && state.feeds.get(&run).is_some_and(|f| f.ended);
        if reopened {
            // A run reopened by a follow-up starts again with a task: it is live again.
            if let Some(feed) = state.feeds.get_mut(&run) {
                feed.ended = false;
            }
            state.ended.retain(|r| *r != run);
        }
        let feed = state.feeds.entry(run).or_insert_with(Feed::new);
        feed.push(event, wire);
        if feed.ended {
            state.ended.retain(|r| *r != run);
            state.ended.push_back(run);
            while state.ended.len() > ENDED_RUNS_MAX {
                if let Some(old) = state.ended.pop_front() {
                    state.feeds.remove(&old);
                }
            }
        }
    }

    /// Make sure a new run has a feed, so a stream opened before its first event waits for it.
    pub(crate) fn open(&self, run: RunId) {
        self.lock().feeds.entry(run).or_insert_with(Feed::new);
    }

    /// Make sure a run has a feed (a run about to be submitted, resumed or reopened here), live
    /// again if it had ended, so a stream opened now waits for its events instead of ending at
    /// once. Returns the sequence number its next event gets: a client that shows only what
    /// happens from now on (as a local `keel resume` or `keel follow-up` does) starts there.
    pub(crate) fn track(&self, run: RunId) -> u64 {
        let mut state = self.lock();
        let feed = state.feeds.entry(run).or_insert_with(Feed::new);
        let was_ended = std::mem::replace(&mut feed.ended, false);
        let next = feed.next_seq;
        if was_ended {
            state.ended.retain(|r| *r != run);
        }
        next
    }

    /// Subscribe to a run's events from event `from` on; `None` when the hub does not know the
    /// run.
    pub(crate) fn subscribe(&self, run: RunId, from: u64) -> Option<Subscription> {
        let state = self.lock();
        let closed = state.closed;
        let feed = state.feeds.get(&run)?;
        Some(Subscription {
            replay: feed
                .kept
                .iter()
                .filter(|(seq, _)| *seq >= from)
                .cloned()
                .collect(),
            dropped: feed.dropped,
            live: (!feed.ended && !closed).then(|| feed.live.subscribe()),
        })
    }

    /// The usage of a run as a live view opened at event `from` would have added it up, if the
    /// hub saw the run.
    pub(crate) fn totals(&self, run: RunId, from: u64) -> Option<Totals> {
        self.lock().feeds.get(&run).map(|f| f.totals(from))
    }

    /// End every stream (the server is stopping).
    pub(crate) fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        for feed in state.feeds.values_mut() {
            // Replacing the sender drops the old one: its receivers see the channel closed.
            feed.live = broadcast::channel(1).0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_actors::runtime::RunOutcome;
    use keel_store::{RunStatus, TaskId};

    fn attempt(run: u128, n: u32) -> AttemptId {
        AttemptId {
            run: RunId(run),
            task: TaskId(100 + u128::from(n)),
            attempt: 1,
        }
    }

    fn started(run: u128, n: u32) -> RuntimeEvent {
        RuntimeEvent::TaskStarted {
            attempt: attempt(run, n),
            step: format!("s{n}"),
            agent: "a".into(),
            harness: keel_harness::HarnessKind::Scripted,
            model: "m".into(),
        }
    }

    fn finished(run: u128) -> RuntimeEvent {
        RuntimeEvent::Finished(RunOutcome {
            run: RunId(run),
            status: RunStatus::Completed,
            outcome: String::new(),
        })
    }

    #[test]
    fn a_late_subscriber_gets_the_run_from_its_first_event_and_only_that_run() {
        let hub = Hub::default();
        hub.publish(&started(1, 1));
        hub.publish(&started(2, 1));
        hub.publish(&RuntimeEvent::Usage {
            attempt: attempt(1, 1),
            tokens: TokenCounts {
                input_tokens: 10,
                output_tokens: 3,
                ..TokenCounts::default()
            },
            spent_micros: 5,
        });
        let sub = hub.subscribe(RunId(1), 1).unwrap();
        assert_eq!(sub.replay.len(), 2);
        assert!(sub.replay.iter().all(|(_, e)| e.run() == RunId(1)));
        assert_eq!(sub.replay[0].0, 1);
        let mut live = sub.live.unwrap();
        hub.publish(&finished(1));
        let (seq, event) = live.try_recv().unwrap();
        assert_eq!((seq, event.name()), (3, "finished"));
        let ended = hub.subscribe(RunId(1), 1).unwrap();
        assert!(ended.live.is_none(), "an ended run's stream is its replay");
        let totals = hub.totals(RunId(1), 1).unwrap();
        assert_eq!((totals.attempts, totals.spent_micros), (1, 5));
        assert_eq!(totals.tokens.input_tokens, 10);
        assert!(hub.subscribe(RunId(3), 1).is_none());
        // A follow-up reopens the run: a view from the mark on counts only the new attempt.
        let mark = hub.track(RunId(1));
        assert_eq!(mark, 4);
        hub.publish(&started(1, 2));
        assert_eq!(hub.totals(RunId(1), mark).unwrap().attempts, 1);
        assert_eq!(hub.totals(RunId(1), 1).unwrap().attempts, 2);
        let from_mark = hub.subscribe(RunId(1), mark).unwrap();
        assert_eq!(from_mark.replay.len(), 1);
        assert!(from_mark.live.is_some(), "a reopened run is live again");
    }

    #[test]
    fn old_ended_runs_are_forgotten() {
        let hub = Hub::default();
        for run in 0..(ENDED_RUNS_MAX as u128 + 10) {
            hub.publish(&finished(1_000 + run));
        }
        assert!(hub.subscribe(RunId(1_000), 1).is_none());
        assert!(
            hub.subscribe(RunId(1_000 + ENDED_RUNS_MAX as u128 + 9), 1)
                .is_some()
        );
    }
}
