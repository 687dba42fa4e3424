//! The cluster between the simulated nodes, as `keel node` runs it (docs/DESIGN.md §10): the
//! coordinator node keeps keel-protocol's [`Membership`] exactly as its cluster endpoint does
//! (`cluster/src/coordinator.rs`), and the workers speak to it as `keel node --role worker` does.
//!
//! - Each worker sends a heartbeat frame every [`crate::WorldConfig::heartbeat_ms`] (its
//!   incarnation, installed harnesses, capacity and hosted attempts) over the simulated network, so
//!   heartbeats are delayed, dropped, duplicated and partitioned like any frame. Each one renews its
//!   lease.
//! - An admitted attempt is placed by [`Membership::place`] (capability and load); the spawn goes
//!   to the chosen worker's incarnation and is acknowledged (`Spawned`) or refused
//!   (`SpawnRefused`); an attempt that ends sends `Exited`, which frees its capacity.
//! - The membership is ticked at its next deadline ([`Membership::next_deadline`]; the real
//!   endpoint ticks every 200 ms, which comes to the same decisions later): a lease that expires, a
//!   spawn not acknowledged in time or an attempt that waited too long goes down to the supervisor,
//!   which restarts the step as a new attempt with a resume preamble.
//! - A worker that comes back (after a partition, or restarted as a new incarnation) rejoins with
//!   its next heartbeat; attempts it still hosts that the coordinator no longer expects there are
//!   cancelled, and their late reports are stale at the coordinator machine.
//!
//! The membership is host memory of the coordinator node: a crash loses it, and the restarted node
//! learns its workers again from their heartbeats.

use keel_actors::{AttemptId, SpecialistMsg, SpecialistStart, SupervisorInput, SupervisorMsg};
use keel_protocol::membership::Action;
use keel_protocol::{NodeName, ToCoordinator, ToWorker, WorkerStatus};

use crate::check::PlacementSeen;
use crate::mutation::Mutation;
use crate::net::NodeId;

use super::World;
use super::event::Ev;
use super::frames::Frame;

/// What the cluster's protocol did in one world, for the soak report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ClusterCounts {
    /// Heartbeats the coordinator node received (each renews a lease).
    pub heartbeats: u64,
    /// Leases that expired (a worker lost).
    pub leases_expired: u64,
    /// Workers that joined, or came back after a lost lease or a restart.
    pub joined: u64,
    /// Attempts the membership reported down (lease expired, worker restarted, spawn not
    /// acknowledged or refused, no worker in time).
    pub attempts_down: u64,
    /// Spawns a worker acknowledged.
    pub spawns_acknowledged: u64,
    /// Spawns a worker refused (another incarnation, full).
    pub spawns_refused: u64,
    /// Attempts a worker was told to cancel because the coordinator no longer expects them there.
    pub stale_cancelled: u64,
}

impl World {
    /// A node's name on the wire.
    pub(super) fn name_of(&self, node: NodeId) -> Option<NodeName> {
        self.wire.name(node).cloned()
    }

    /// The supervisor admitted `start`: place it as the coordinator's cluster endpoint does.
    pub(super) fn place(&mut self, start: SpecialistStart) {
        let now = self.now;
        let mut out = Vec::new();
        let Some(c) = &mut self.coord else { return };
        c.membership.place(start, now, &mut out);
        self.act(out);
    }

    /// Carries out what the membership decided (`Shared::act` in `cluster/src/coordinator.rs`).
    pub(super) fn act(&mut self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Spawn {
                    worker,
                    incarnation,
                    start,
                } => {
                    let Some(node) = self.wire.node_of(&worker) else {
                        self.checker
                            .world_bound(self.event_no, format!("no node is named {worker}"));
                        continue;
                    };
                    let installed = crate::setup::worker_harnesses(node.0);
                    let load = self
                        .coord
                        .as_ref()
                        .map_or(0, |c| c.membership.load(&worker));
                    self.checker.placed(
                        self.event_no,
                        start.attempt,
                        PlacementSeen {
                            node,
                            harness: start.assignment.harness,
                            installed: &installed,
                            load,
                            capacity: self.config.worker_capacity,
                        },
                    );
                    self.send_frame(
                        NodeId::COORDINATOR,
                        node,
                        // The simulated sessions make no tool calls, so no policy is in force (see
                        // docs/DESIGN.md §10: the policy questions are not modelled).
                        Frame::ToWorker(ToWorker::Spawn {
                            incarnation,
                            start,
                            policy: None,
                        }),
                    );
                }
                Action::Down {
                    attempt,
                    reason,
                    panicked,
                } => {
                    self.cluster.attempts_down += 1;
                    self.schedule(
                        self.now,
                        Ev::Sup {
                            input: Box::new(SupervisorInput::Msg(SupervisorMsg::SpecialistDown {
                                attempt,
                                reason,
                                panicked,
                            })),
                            inc: Some(self.coord_inc),
                        },
                    );
                }
                Action::Cancel { worker, attempt } => {
                    self.cluster.stale_cancelled += 1;
                    if let Some(node) = self.wire.node_of(&worker) {
                        self.send_frame(
                            NodeId::COORDINATOR,
                            node,
                            Frame::ToWorker(ToWorker::Specialist {
                                attempt,
                                msg: SpecialistMsg::Cancel {
                                    reason: "the coordinator no longer expects this attempt here"
                                        .into(),
                                },
                            }),
                        );
                    }
                }
                Action::Joined { .. } => self.cluster.joined += 1,
                Action::Lost { .. } => self.cluster.leases_expired += 1,
            }
        }
        self.schedule_membership_tick();
    }

    /// Ticks the membership at its next deadline, unless a tick no later is already on the agenda.
    fn schedule_membership_tick(&mut self) {
        if self.config.mutation == Some(Mutation::NeverExpireLeases) {
            return;
        }
        let now = self.now;
        let inc = self.coord_inc;
        let Some(c) = &mut self.coord else { return };
        let Some(at) = c.membership.next_deadline() else {
            return;
        };
        let at = at.max(now);
        if c.tick_at.is_some_and(|t| t >= now && t <= at) {
            return;
        }
        c.tick_at = Some(at);
        self.schedule(at, Ev::MembershipTick { inc });
    }

    /// The membership's tick: leases, unacknowledged spawns and waits that ran out.
    pub(super) fn membership_tick(&mut self, inc: u32) {
        let now = self.now;
        let mut out = Vec::new();
        {
            if inc != self.coord_inc {
                return;
            }
            let Some(c) = &mut self.coord else { return };
            if c.tick_at.is_some_and(|t| t <= now) {
                c.tick_at = None;
            }
            c.membership.tick(now, &mut out);
        }
        self.act(out);
    }

    /// What a worker's frame tells the coordinator node's endpoint about the cluster (the
    /// `Receiver` of `cluster/src/coordinator.rs`).
    pub(super) fn cluster_frame(&mut self, from: NodeId, msg: ToCoordinator) {
        let Some(name) = self.name_of(from) else {
            return;
        };
        let now = self.now;
        let mut out = Vec::new();
        {
            let Some(c) = &mut self.coord else { return };
            match msg {
                ToCoordinator::Heartbeat(status) => {
                    self.cluster.heartbeats += 1;
                    c.membership.heartbeat(&name, status, now, &mut out);
                }
                ToCoordinator::Spawned { attempt } => {
                    if c.membership.spawned(&name, attempt).is_some() {
                        self.cluster.spawns_acknowledged += 1;
                    }
                }
                ToCoordinator::SpawnRefused { attempt, reason } => {
                    self.cluster.spawns_refused += 1;
                    out.push(Action::Down {
                        attempt,
                        reason: format!("worker {name} refused the spawn: {reason}"),
                        panicked: false,
                    });
                    if !c.membership.forget(&name, attempt, now, &mut out) {
                        out.remove(0);
                    }
                }
                ToCoordinator::Exited {
                    attempt,
                    normal,
                    panicked,
                    reason,
                } => {
                    let was_placed = c.membership.forget(&name, attempt, now, &mut out);
                    if was_placed && !normal {
                        out.insert(
                            0,
                            Action::Down {
                                attempt,
                                reason: format!("its actor on worker {name} ended: {reason}"),
                                panicked,
                            },
                        );
                    }
                }
                // Handled by the coordinator node's machines (`frames.rs`); not sent by the
                // simulated workers (usage and lifecycle events are the machines' emits).
                // A policy question: not sent, the simulated sessions make no gated tool calls.
                ToCoordinator::Reply { .. }
                | ToCoordinator::LoadContext { .. }
                | ToCoordinator::Policy { .. }
                | ToCoordinator::Lifecycle(_)
                | ToCoordinator::Usage { .. } => {}
            }
        }
        self.act(out);
    }

    /// A worker's heartbeat is due: it sends its status and the next one.
    pub(super) fn heartbeat(&mut self, node: NodeId, inc: u32) {
        let Some(w) = self.workers.get(usize::from(node.0).wrapping_sub(1)) else {
            return;
        };
        if !w.up || w.inc != inc {
            return;
        }
        let harnesses = if self.config.mutation == Some(Mutation::AdvertiseAllHarnesses) {
            keel_harness::HarnessKind::ALL.to_vec()
        } else {
            crate::setup::worker_harnesses(node.0)
        };
        let status = WorkerStatus {
            incarnation: u64::from(inc),
            harnesses,
            capacity: self.config.worker_capacity,
            hosting: w.specialists.keys().copied().collect(),
        };
        self.send_frame(
            node,
            NodeId::COORDINATOR,
            Frame::ToCoordinator(ToCoordinator::Heartbeat(status)),
        );
        self.schedule(
            self.now + self.config.heartbeat_ms.max(1),
            Ev::Heartbeat { node, inc },
        );
    }

    /// The coordinator node's message to an attempt, through the worker the membership placed it
    /// on (`Hosts::deliver`); a cancel of an attempt that still waits for a worker withdraws it.
    pub(super) fn send_to_specialist(&mut self, attempt: AttemptId, msg: SpecialistMsg) {
        let Some(c) = &mut self.coord else { return };
        let worker = c.membership.worker_of(attempt).cloned();
        match worker.and_then(|w| self.wire.node_of(&w)) {
            Some(node) => self.send_frame(
                NodeId::COORDINATOR,
                node,
                Frame::ToWorker(ToWorker::Specialist { attempt, msg }),
            ),
            None => {
                if matches!(msg, SpecialistMsg::Cancel { .. }) {
                    c.membership.withdraw(attempt);
                }
            }
        }
    }

    /// Worker `node` answers a spawn as `keel node --role worker` does: refused when addressed to
    /// another incarnation, acknowledged again for a duplicate, refused past its capacity or its
    /// memory of hosted attempts, else hosted and acknowledged.
    pub(super) fn spawn_arrives(&mut self, node: NodeId, start: SpecialistStart, incarnation: u64) {
        let Some(w) = self.workers.get(usize::from(node.0).wrapping_sub(1)) else {
            return;
        };
        if !w.up {
            return;
        }
        let attempt = start.attempt;
        let refusal = if incarnation != u64::from(w.inc) {
            // A late copy of a spawn the worker may have hosted before it restarted (its memory
            // of that is gone, the session may have run): the membership took the attempt down
            // when the worker came back as a new incarnation.
            self.stale_spawns_refused += 1;
            Some(format!(
                "addressed to incarnation {incarnation}, this worker is {}",
                w.inc
            ))
        } else if w.hosted_ever.contains(&attempt) {
            // A duplicate: one attempt, one specialist; acknowledged again.
            self.send_frame(
                node,
                NodeId::COORDINATOR,
                Frame::ToCoordinator(ToCoordinator::Spawned { attempt }),
            );
            return;
        } else if w.hosted_ever.len() >= super::HOSTED_REMEMBERED_MAX {
            Some("this worker has hosted as many attempts as it remembers".into())
        } else if w.specialists.len() >= self.config.worker_capacity as usize {
            Some(format!("at capacity ({})", self.config.worker_capacity))
        } else {
            None
        };
        let msg = match refusal {
            Some(reason) => ToCoordinator::SpawnRefused { attempt, reason },
            None => {
                self.host_specialist(node, start);
                ToCoordinator::Spawned { attempt }
            }
        };
        self.send_frame(node, NodeId::COORDINATOR, Frame::ToCoordinator(msg));
    }
}
