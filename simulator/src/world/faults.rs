//! Faults: the random fault tick, crashes and restarts of nodes, disk faults, and the heal that
//! starts the liveness phase.

use keel_actors::host;
use keel_actors::{AttemptId, CoordinatorInput};
use keel_store::RunId;

use crate::config::DiskFault;
use crate::net::NodeId;
use crate::profile::FaultKind;

use super::World;
use super::event::Ev;

impl World {
    pub(super) fn fault_tick(&mut self) {
        if self.healed {
            return;
        }
        let p = self.profile.clone();
        let nodes = self.workers.len() + 1;
        if self.rng.chance(p.partition_ppm) {
            let a = NodeId(u8::try_from(self.rng.index(nodes)).unwrap_or(0));
            let b = NodeId(u8::try_from(self.rng.index(nodes)).unwrap_or(0));
            if a != b {
                let one_way = self.rng.chance(p.partition_one_way_ppm);
                let until = self.now + self.rng.range(1, p.partition_ms_max);
                self.net.cut(a, b, one_way, until);
                self.faults.add(if one_way {
                    FaultKind::PartitionOneWay
                } else {
                    FaultKind::Partition
                });
            }
        }
        if self.rng.chance(p.crash_ppm) {
            let node = NodeId(u8::try_from(self.rng.index(nodes)).unwrap_or(0));
            let down_ms = self.rng.range(1, p.restart_ms_max.max(1));
            self.crash(node, down_ms);
        }
        if self.rng.chance(p.disk_fault_ppm) {
            // Half the disk faults are failed syncs, half a full disk on the next commit.
            let fault = if self.rng.chance(500_000) {
                DiskFault::Full
            } else {
                DiskFault::FailedSync
            };
            self.arm_disk_fault(fault);
        }
        self.schedule(self.now + p.fault_tick_ms, Ev::FaultTick);
    }

    pub(super) fn arm_disk_fault(&mut self, fault: DiskFault) {
        self.disk_fault_armed = Some(fault);
        self.faults.add(match fault {
            DiskFault::FailedSync => FaultKind::DiskFault,
            DiskFault::Full => FaultKind::DiskFull,
        });
    }

    pub(super) fn crash(&mut self, node: NodeId, down_ms: u64) {
        if node == NodeId::COORDINATOR {
            let Some(c) = self.coord.take() else { return };
            self.faults.add(FaultKind::NodeCrash);
            drop(c);
            self.coord_inc += 1;
            self.checker.coordinator_crashed();
            self.withdraw_undurable_cancels();
            if let Err(e) = self.store.crash_and_reopen() {
                self.checker.world_bound(
                    self.event_no,
                    format!("the store did not reopen after a crash: {e}"),
                );
            }
        } else {
            let w = &mut self.workers[usize::from(node.0) - 1];
            if !w.up {
                return;
            }
            self.faults.add(FaultKind::NodeCrash);
            w.up = false;
            w.inc += 1;
            w.hosted_ever.clear();
            let lost: Vec<AttemptId> = std::mem::take(&mut w.specialists).into_keys().collect();
            // Nothing tells the coordinator node: its membership stops hearing the worker's
            // heartbeats, and the lease expires (invariant 20 bounds when).
            let latency_max = self
                .profile_sampled
                .latency_ms_max
                .max(self.profile.latency_ms_max);
            let deadline = self.now + self.config.membership.lease_ms + latency_max;
            self.checker.worker_crashed(node, lost, deadline);
        }
        self.schedule(self.now + down_ms, Ev::Restart(node));
    }

    pub(super) fn restart(&mut self, node: NodeId) {
        if node == NodeId::COORDINATOR {
            if self.coord.is_some() {
                return;
            }
            self.coord = Some(self.fresh_coordinator_node());
            self.resume_paused_runs();
            let recovered = match host::store::recover_open_runs(self.store.store()) {
                Ok(r) => r,
                Err(e) => {
                    self.checker.world_bound(
                        self.event_no,
                        format!("recovery could not read the store: {e}"),
                    );
                    return;
                }
            };
            let known: Vec<RunId> = recovered.iter().map(|r| r.run.id).collect();
            for r in recovered {
                let r = self.mutate_recovered(r);
                let run = r.run.id;
                self.ensure_coordinator(run);
                self.deliver_coord(run, CoordinatorInput::Recovered(Box::new(r)));
            }
            // A run whose row never became durable was never acknowledged: its submitter submits it
            // again (Accept is idempotent).
            for spec in self.submitted.clone() {
                let durable = self.store.store().run(spec.run).get().is_ok();
                if !durable && !known.contains(&spec.run) {
                    self.schedule(self.now, Ev::Submit(Box::new(spec)));
                }
            }
        } else {
            let w = &mut self.workers[usize::from(node.0) - 1];
            w.up = true;
            // A new incarnation announces itself at once.
            let inc = w.inc;
            self.heartbeat(node, inc);
        }
    }

    pub(super) fn heal(&mut self) {
        self.healed = true;
        self.profile = self.profile.healed();
        self.net.heal_all();
        self.disk_fault_armed = None;
        if self.coord.is_none() {
            self.restart(NodeId::COORDINATOR);
        }
        for i in 0..self.workers.len() {
            if !self.workers[i].up {
                self.restart(NodeId(u8::try_from(i + 1).unwrap_or(1)));
            }
        }
    }
}
