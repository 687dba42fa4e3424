//! The scripted interventions of a scenario.

use keel_actors::{CoordinatorInput, CoordinatorMsg, FollowUpRequest};

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
            } => {
                // The thread starts at the first task the step was dispatched as.
                let parent = self
                    .checker
                    .observed()
                    .spawns
                    .iter()
                    .find(|(a, s)| a.run == run && s.step == step)
                    .map(|(a, _)| a.task);
                match parent {
                    Some(parent) => self.deliver_coord(
                        run,
                        CoordinatorInput::Msg(CoordinatorMsg::FollowUp(FollowUpRequest {
                            parent,
                            brief,
                            agent,
                            task: None,
                        })),
                    ),
                    None => self.checker.world_bound(
                        self.event_no,
                        format!("no task of step {step} to follow up"),
                    ),
                }
            }
        }
    }
}
