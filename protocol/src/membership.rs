//! The coordinator node's view of its workers, as a pure value: time is an argument, answers are
//! [`Action`]s the endpoint carries out (docs/DESIGN.md §10).
//!
//! - **Leases.** A worker is alive while its heartbeats arrive: each renews its lease for
//!   [`MembershipConfig::lease_ms`]. When a lease expires the worker is lost, and every attempt
//!   placed on it is reported down ([`Action::Down`]): the supervisor settles it and decides (a
//!   restart runs the step again as a new attempt with a resume preamble, on another worker). A
//!   worker that comes back with a new incarnation lost what it hosted: its attempts go down at once.
//! - **Placement** by capability and load: a worker with the attempt's harness, below its capacity,
//!   least loaded relative to its capacity (ties by name). An attempt no worker can take yet waits,
//!   at most [`MembershipConfig::placement_wait_ms`], then goes down.
//! - **Spawns are acknowledged.** A spawn not acknowledged within [`MembershipConfig::spawn_ack_ms`]
//!   goes down (the worker may never have seen it). A spawn is addressed to one incarnation of its
//!   worker, which refuses copies addressed to another.
//! - **Stale attempts.** A worker hosting an attempt this coordinator did not place there (after a
//!   lease expired, or after the coordinator node restarted) is told to cancel it ([`Action::Cancel`]);
//!   its late reports are recognised by the coordinator machine as stale and never accepted.

use crate::name::NodeName;
use crate::wire::WorkerStatus;
use keel_actors::{AttemptId, Millis, SpecialistStart};
use keel_harness::HarnessKind;
use std::collections::{BTreeMap, BTreeSet, VecDeque};

/// The coordinator's timing of its workers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MembershipConfig {
    /// How long a heartbeat keeps a worker alive.
    pub lease_ms: Millis,
    /// How long a spawn may go unacknowledged.
    pub spawn_ack_ms: Millis,
    /// How long an attempt waits for a worker that can take it.
    pub placement_wait_ms: Millis,
    /// Most attempts waiting for a worker (more go down at once).
    pub waiting_max: usize,
}

impl Default for MembershipConfig {
    fn default() -> Self {
        Self {
            lease_ms: 5_000,
            spawn_ack_ms: 5_000,
            placement_wait_ms: 60_000,
            waiting_max: 4_096,
        }
    }
}

/// What the endpoint must do for the membership.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Send the spawn to the worker's incarnation.
    Spawn {
        /// The worker.
        worker: NodeName,
        /// Its incarnation, which the spawn is addressed to.
        incarnation: u64,
        /// What to host.
        start: Box<SpecialistStart>,
    },
    /// The attempt is gone without a result: report it down to the supervisor.
    Down {
        /// The attempt.
        attempt: AttemptId,
        /// Why, one line.
        reason: String,
        /// Whether its actor panicked on the worker (counted against its harness); a lost or
        /// refusing worker is not the harness's failure.
        panicked: bool,
    },
    /// Tell the worker to cancel an attempt the coordinator does not expect there.
    Cancel {
        /// The worker.
        worker: NodeName,
        /// The attempt.
        attempt: AttemptId,
    },
    /// A worker joined (or came back): worth a log line.
    Joined {
        /// The worker.
        worker: NodeName,
        /// Its harnesses.
        harnesses: Vec<HarnessKind>,
        /// Its capacity.
        capacity: u32,
    },
    /// A worker's lease expired: worth a log line.
    Lost {
        /// The worker.
        worker: NodeName,
        /// How many attempts it took down.
        attempts: usize,
    },
}

#[derive(Clone, Debug)]
struct Worker {
    incarnation: u64,
    harnesses: BTreeSet<HarnessKind>,
    capacity: u32,
    lease_until: Millis,
    lost: bool,
}

#[derive(Clone, Debug)]
struct Placement {
    worker: NodeName,
    incarnation: u64,
    sent_at: Millis,
    acked: bool,
}

/// The coordinator's view of its workers and of where each remote attempt runs.
#[derive(Debug, Default)]
pub struct Membership {
    config: MembershipConfig,
    workers: BTreeMap<NodeName, Worker>,
    placed: BTreeMap<AttemptId, Placement>,
    waiting: VecDeque<(Millis, SpecialistStart)>,
}

impl Membership {
    /// No workers yet.
    pub fn new(config: MembershipConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    /// The worker an attempt is placed on, if it is.
    pub fn worker_of(&self, attempt: AttemptId) -> Option<&NodeName> {
        self.placed.get(&attempt).map(|p| &p.worker)
    }

    /// The live workers, by name.
    pub fn live_workers(&self) -> impl Iterator<Item = &NodeName> {
        self.workers
            .iter()
            .filter(|(_, w)| !w.lost)
            .map(|(name, _)| name)
    }

    /// Attempts placed on `worker` right now (its load).
    pub fn load(&self, worker: &NodeName) -> usize {
        self.placed.values().filter(|p| &p.worker == worker).count()
    }

    /// Attempts waiting for a worker.
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// A worker's heartbeat: renew its lease, learn its capabilities, cancel what it should not host,
    /// and place waiting attempts that it can now take.
    pub fn heartbeat(
        &mut self,
        from: &NodeName,
        status: WorkerStatus,
        now: Millis,
        out: &mut Vec<Action>,
    ) {
        let lease_until = now.saturating_add(self.config.lease_ms);
        let harnesses: BTreeSet<HarnessKind> = status.harnesses.iter().copied().collect();
        let restarted = self
            .workers
            .get(from)
            .is_some_and(|w| w.incarnation != status.incarnation);
        if restarted {
            self.take_down(from, "restarted and lost what it hosted", out);
        }
        let joined = self
            .workers
            .get(from)
            .is_none_or(|w| w.lost || w.incarnation != status.incarnation);
        if joined {
            out.push(Action::Joined {
                worker: from.clone(),
                harnesses: status.harnesses.clone(),
                capacity: status.capacity,
            });
        }
        self.workers.insert(
            from.clone(),
            Worker {
                incarnation: status.incarnation,
                harnesses,
                capacity: status.capacity,
                lease_until,
                lost: false,
            },
        );
        for attempt in status.hosting {
            let expected = self
                .placed
                .get(&attempt)
                .is_some_and(|p| &p.worker == from && p.incarnation == status.incarnation);
            if !expected {
                out.push(Action::Cancel {
                    worker: from.clone(),
                    attempt,
                });
            }
        }
        self.place_waiting(now, out);
    }

    /// Place an admitted attempt (or queue it until a worker can take it).
    pub fn place(&mut self, start: SpecialistStart, now: Millis, out: &mut Vec<Action>) {
        if self.placed.contains_key(&start.attempt)
            || self.waiting.iter().any(|(_, s)| s.attempt == start.attempt)
        {
            // One attempt, one placement: a repeated spawn is already on its way.
            return;
        }
        if self.waiting.len() >= self.config.waiting_max {
            out.push(Action::Down {
                panicked: false,
                attempt: start.attempt,
                reason: format!(
                    "{} attempts already wait for a worker",
                    self.config.waiting_max
                ),
            });
            return;
        }
        self.waiting.push_back((now, start));
        self.place_waiting(now, out);
    }

    fn place_waiting(&mut self, now: Millis, out: &mut Vec<Action>) {
        let mut still = VecDeque::new();
        while let Some((since, start)) = self.waiting.pop_front() {
            match self.pick(start.assignment.harness) {
                Some(worker) => {
                    let incarnation = self.workers.get(&worker).map_or(0, |w| w.incarnation);
                    self.placed.insert(
                        start.attempt,
                        Placement {
                            worker: worker.clone(),
                            incarnation,
                            sent_at: now,
                            acked: false,
                        },
                    );
                    out.push(Action::Spawn {
                        worker,
                        incarnation,
                        start: Box::new(start),
                    });
                }
                None => still.push_back((since, start)),
            }
        }
        self.waiting = still;
    }

    /// The live worker with `harness`, below capacity, least loaded for its capacity (ties by name).
    fn pick(&self, harness: HarnessKind) -> Option<NodeName> {
        let mut best: Option<(&NodeName, usize, u32)> = None;
        for (name, w) in &self.workers {
            if w.lost || !w.harnesses.contains(&harness) {
                continue;
            }
            let load = self.load(name);
            if load >= w.capacity as usize {
                continue;
            }
            let better = match best {
                None => true,
                // load / capacity < best_load / best_capacity, without division.
                Some((_, bl, bc)) => {
                    (load as u128) * u128::from(bc) < (bl as u128) * u128::from(w.capacity)
                }
            };
            if better {
                best = Some((name, load, w.capacity));
            }
        }
        best.map(|(name, _, _)| name.clone())
    }

    /// The worker acknowledged a spawn. Returns when it was sent, for the dispatch latency.
    pub fn spawned(&mut self, from: &NodeName, attempt: AttemptId) -> Option<Millis> {
        let p = self.placed.get_mut(&attempt)?;
        if &p.worker != from || p.acked {
            return None;
        }
        p.acked = true;
        Some(p.sent_at)
    }

    /// The attempt is over on its worker (it exited, or the worker refused it): forget its
    /// placement, and place what waited for the capacity it frees. Returns whether it was placed on
    /// `from`.
    pub fn forget(
        &mut self,
        from: &NodeName,
        attempt: AttemptId,
        now: Millis,
        out: &mut Vec<Action>,
    ) -> bool {
        if self.placed.get(&attempt).is_some_and(|p| &p.worker == from) {
            self.placed.remove(&attempt);
            self.place_waiting(now, out);
            return true;
        }
        false
    }

    /// The supervisor stopped an attempt that still waits for a worker: drop it. Returns whether it
    /// was waiting.
    pub fn withdraw(&mut self, attempt: AttemptId) -> bool {
        let before = self.waiting.len();
        self.waiting.retain(|(_, s)| s.attempt != attempt);
        before != self.waiting.len()
    }

    /// The earliest time at which [`Membership::tick`] has something to do (a lease, an
    /// unacknowledged spawn or a waiting attempt runs out), if anything can run out: a host that
    /// keeps time itself (the simulator) ticks exactly then instead of on a fixed period.
    pub fn next_deadline(&self) -> Option<Millis> {
        let leases = self
            .workers
            .values()
            .filter(|w| !w.lost)
            .map(|w| w.lease_until);
        let acks = self
            .placed
            .values()
            .filter(|p| !p.acked)
            .map(|p| p.sent_at.saturating_add(self.config.spawn_ack_ms));
        let waiting = self
            .waiting
            .front()
            .map(|(since, _)| since.saturating_add(self.config.placement_wait_ms));
        leases.chain(acks).chain(waiting).min()
    }

    /// Time passed: expire leases, unacknowledged spawns and attempts that waited too long.
    pub fn tick(&mut self, now: Millis, out: &mut Vec<Action>) {
        let expired: Vec<NodeName> = self
            .workers
            .iter()
            .filter(|(_, w)| !w.lost && w.lease_until <= now)
            .map(|(name, _)| name.clone())
            .collect();
        for worker in expired {
            let before = out.len();
            self.take_down(&worker, "missed its heartbeats: its lease expired", out);
            let attempts = out.len() - before;
            if let Some(w) = self.workers.get_mut(&worker) {
                w.lost = true;
            }
            out.push(Action::Lost { worker, attempts });
        }
        let unacked: Vec<AttemptId> = self
            .placed
            .iter()
            .filter(|(_, p)| !p.acked && p.sent_at.saturating_add(self.config.spawn_ack_ms) <= now)
            .map(|(a, _)| *a)
            .collect();
        for attempt in unacked {
            if let Some(p) = self.placed.remove(&attempt) {
                out.push(Action::Down {
                    panicked: false,
                    attempt,
                    reason: format!(
                        "worker {} did not acknowledge the spawn within {} ms",
                        p.worker, self.config.spawn_ack_ms
                    ),
                });
            }
        }
        let wait = self.config.placement_wait_ms;
        while self
            .waiting
            .front()
            .is_some_and(|(since, _)| since.saturating_add(wait) <= now)
        {
            if let Some((_, start)) = self.waiting.pop_front() {
                out.push(Action::Down {
                    panicked: false,
                    attempt: start.attempt,
                    reason: format!(
                        "no worker with the {} harness and free capacity within {wait} ms",
                        start.assignment.harness
                    ),
                });
            }
        }
    }

    fn take_down(&mut self, worker: &NodeName, why: &str, out: &mut Vec<Action>) {
        let gone: Vec<AttemptId> = self
            .placed
            .iter()
            .filter(|(_, p)| &p.worker == worker)
            .map(|(a, _)| *a)
            .collect();
        for attempt in gone {
            self.placed.remove(&attempt);
            out.push(Action::Down {
                panicked: false,
                attempt,
                reason: format!("worker {worker} {why}"),
            });
        }
    }
}
