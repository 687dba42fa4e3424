//! The interventions of a scenario, and the operator's drawn ones: faults placed at a fixed time, and
//! what an operator does to a run (pause, cancel, a follow-up).

use crate::config::Intervention;
use crate::profile::FaultKind;

use super::World;

impl World {
    pub(super) fn intervene(&mut self, i: Intervention) {
        match i {
            Intervention::Disk(fault) => self.arm_disk_fault(fault),
            Intervention::Partition {
                a,
                b,
                one_way,
                until_ms,
            } => {
                self.net.cut(a, b, one_way, until_ms);
                self.faults.add(if one_way {
                    FaultKind::PartitionOneWay
                } else {
                    FaultKind::Partition
                });
            }
            Intervention::Crash { node, down_ms } => self.crash(node, down_ms),
            Intervention::FollowUp {
                run,
                step,
                brief,
                agent,
            } => self.follow_up(run, step, brief, agent),
            Intervention::Pause { down_ms } => self.pause(down_ms),
            Intervention::Cancel { run, reason } => self.cancel(run, reason),
            Intervention::CancelTask { run, step, reason } => self.cancel_task(run, step, reason),
            Intervention::CrashAfterFollowUp {
                run,
                step,
                brief,
                down_ms,
            } => self.follow_up_then(run, step, brief, None, Some(down_ms)),
        }
    }
}
