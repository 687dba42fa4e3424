//! Messages between simulated nodes travel as `keel node`'s frames: keel-protocol's [`ToWorker`] and
//! [`ToCoordinator`] in an envelope naming the sending node, encoded behind the protocol version with
//! bincode 2, and decoded (totally) where they arrive. So the simulated network carries the bytes the
//! real cluster carries, and a message the machines exchange that the protocol could not carry is
//! invariant 18's violation here rather than a surprise on a real network. Frames from a node of
//! another protocol version are drawn too (`version_skew_ppm`): the receiver refuses them, as
//! `keel node` does with a logged error, and they change nothing.
//!
//! Heartbeats, spawn acknowledgements and exits go to the coordinator node's membership
//! (`cluster.rs`). What the simulated workers do not send: lifecycle and usage messages (the
//! machines' emits are not modelled as messages).

use keel_actors::{AttemptId, CoordinatorInput, CoordinatorMsg, SpecialistInput};
use keel_protocol::wire::{self, Envelope, PROTOCOL_VERSION, WireError};
use keel_protocol::{NodeName, ToCoordinator, ToWorker};
use serde::de::DeserializeOwned;

use crate::mutation::Mutation;
use crate::net::NodeId;
use crate::profile::FaultKind;

use super::World;
use super::event::{AttemptTag, Ev};

/// One message crossing the network, before it is encoded.
pub(super) enum Frame {
    /// From the coordinator node to a worker.
    ToWorker(ToWorker),
    /// From a worker to the coordinator node.
    ToCoordinator(ToCoordinator),
}

impl Frame {
    /// What the trace calls it.
    fn label(&self) -> &'static str {
        match self {
            Self::ToWorker(ToWorker::Spawn { .. }) => "spawn",
            Self::ToWorker(ToWorker::Specialist { .. }) => "specialist",
            Self::ToWorker(ToWorker::ContextRows { .. }) => "context-rows",
            Self::ToWorker(ToWorker::PolicyAnswer { .. }) => "policy-answer",
            Self::ToCoordinator(ToCoordinator::Policy { .. }) => "policy",
            Self::ToCoordinator(ToCoordinator::Reply { .. }) => "reply",
            Self::ToCoordinator(ToCoordinator::LoadContext { .. }) => "load-context",
            Self::ToCoordinator(ToCoordinator::Heartbeat(_)) => "heartbeat",
            Self::ToCoordinator(ToCoordinator::Spawned { .. }) => "spawned",
            Self::ToCoordinator(ToCoordinator::SpawnRefused { .. }) => "spawn-refused",
            Self::ToCoordinator(ToCoordinator::Exited { .. }) => "exited",
            Self::ToCoordinator(_) => "worker-status",
        }
    }

    /// The attempt it concerns, for the trace.
    fn attempt(&self) -> Option<AttemptId> {
        match self {
            Self::ToWorker(ToWorker::Spawn { start, .. }) => Some(start.attempt),
            Self::ToWorker(
                ToWorker::Specialist { attempt, .. }
                | ToWorker::ContextRows { attempt, .. }
                | ToWorker::PolicyAnswer { attempt, .. },
            )
            | Self::ToCoordinator(
                ToCoordinator::LoadContext { attempt, .. }
                | ToCoordinator::Policy { attempt, .. }
                | ToCoordinator::Spawned { attempt }
                | ToCoordinator::SpawnRefused { attempt, .. }
                | ToCoordinator::Exited { attempt, .. },
            ) => Some(*attempt),
            Self::ToCoordinator(ToCoordinator::Reply { from, .. }) => Some(*from),
            Self::ToCoordinator(_) => None,
        }
    }

    fn encode(&self, version: u16, from: &NodeName) -> Result<Vec<u8>, WireError> {
        match self {
            Self::ToWorker(m) => wire::encode_as_version(version, from, m),
            Self::ToCoordinator(m) => wire::encode_as_version(version, from, m),
        }
    }
}

/// The simulated nodes' names on the wire, and what crossed it.
#[derive(Debug, Default)]
pub(super) struct Wire {
    /// Node `i`'s name (`coord`, `w1`, ...).
    names: Vec<NodeName>,
    /// Frames put on the network (each copy of a duplicate counts).
    pub(super) sent: u64,
    /// Their bytes.
    pub(super) bytes: u64,
    /// Frames of another protocol version refused on arrival.
    pub(super) refused: u64,
}

/// What crossed the simulated network as frames, for the soak report.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FrameCounts {
    /// Frames put on the network (each copy of a duplicate counts).
    pub sent: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Frames of another protocol version refused on arrival.
    pub refused: u64,
}

impl Wire {
    /// The names of a coordinator node and `workers` workers; `None` if one is not a valid name.
    pub(super) fn new(workers: usize) -> Option<Self> {
        let names = (0..=workers)
            .map(|i| {
                let node = NodeId(u8::try_from(i).ok()?);
                NodeName::new(node.to_string()).ok()
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Self {
            names,
            ..Self::default()
        })
    }

    /// Node `node`'s name.
    pub(super) fn name(&self, node: NodeId) -> Option<&NodeName> {
        self.names.get(usize::from(node.0))
    }

    /// The node named `name`.
    pub(super) fn node_of(&self, name: &NodeName) -> Option<NodeId> {
        let i = self.names.iter().position(|n| n == name)?;
        Some(NodeId(u8::try_from(i).ok()?))
    }

    /// What crossed, for the report.
    pub(super) fn counts(&self) -> FrameCounts {
        FrameCounts {
            sent: self.sent,
            bytes: self.bytes,
            refused: self.refused,
        }
    }
}

impl World {
    /// Sends `frame` from `from` to `to` over the network: encoded as `keel node` encodes it, then
    /// lost, delayed or delivered twice as the route says.
    pub(super) fn send_frame(&mut self, from: NodeId, to: NodeId, frame: Frame) {
        let Some((first, second)) = self.route(from, to) else {
            return;
        };
        // The name is borrowed, not cloned, for each encoding (a frame is sent every few events).
        let label = frame.label();
        let attempt = frame.attempt();
        let encoded = self
            .wire
            .name(from)
            .map(|name| frame.encode(PROTOCOL_VERSION, name));
        let mut bytes = match encoded {
            Some(Ok(bytes)) => bytes,
            Some(Err(e)) => {
                self.checker.fail_protocol(
                    self.event_no,
                    format!("a {label} frame from {from} to {to} could not be encoded: {e}"),
                );
                return;
            }
            None => {
                self.checker
                    .world_bound(self.event_no, format!("node {from} has no name"));
                return;
            }
        };
        if self.config.mutation == Some(Mutation::TruncateFrame) {
            bytes.pop();
        }
        if self.rng.chance(self.profile.version_skew_ppm) {
            // A copy from a node of another protocol version arrives first.
            self.faults.add(FaultKind::VersionSkew);
            let skewed = self
                .wire
                .name(from)
                .map(|name| frame.encode(PROTOCOL_VERSION.wrapping_add(1), name));
            if let Some(Ok(skewed)) = skewed {
                self.put_frame(first, to, label, attempt, skewed);
            }
        }
        if let Some(second) = second {
            self.put_frame(second, to, label, attempt, bytes.clone());
        }
        self.put_frame(first, to, label, attempt, bytes);
    }

    fn put_frame(
        &mut self,
        at: u64,
        to: NodeId,
        label: &'static str,
        attempt: Option<AttemptId>,
        bytes: Vec<u8>,
    ) {
        self.wire.sent += 1;
        self.wire.bytes += bytes.len() as u64;
        self.schedule(
            at,
            Ev::Frame {
                to,
                label,
                attempt: attempt.as_ref().map(AttemptTag::of),
                bytes,
            },
        );
    }

    /// A frame arrives at `to`: decoded as the receiving node decodes it, then handed to its machines.
    pub(super) fn frame_arrives(&mut self, to: NodeId, bytes: &[u8]) {
        if to == NodeId::COORDINATOR {
            if let Some((from, msg)) = self.open::<ToCoordinator>(to, bytes) {
                self.coordinator_receives(from, msg);
            }
        } else if let Some((_, msg)) = self.open::<ToWorker>(to, bytes) {
            self.worker_receives(to, msg);
        }
    }

    /// Decodes a frame: the sender and the message, or `None` after counting a refused frame of
    /// another version or reporting a frame the protocol could not carry.
    fn open<B: DeserializeOwned>(&mut self, to: NodeId, bytes: &[u8]) -> Option<(NodeId, B)> {
        match wire::decode::<B>(bytes) {
            Ok(Envelope { from, body }) => match self.wire.node_of(&from) {
                Some(node) => Some((node, body)),
                None => {
                    self.checker.fail_protocol(
                        self.event_no,
                        format!("a frame at {to} names an unknown sender {from}"),
                    );
                    None
                }
            },
            Err(WireError::Version { .. }) => {
                self.wire.refused += 1;
                None
            }
            Err(e) => {
                self.checker.fail_protocol(
                    self.event_no,
                    format!("a frame at {to} did not decode: {e}"),
                );
                None
            }
        }
    }

    fn coordinator_receives(&mut self, from: NodeId, msg: ToCoordinator) {
        if self.coord.is_none() {
            return;
        }
        match msg {
            ToCoordinator::Reply {
                from: attempt,
                reply,
            } => self.deliver_coord(
                attempt.run,
                CoordinatorInput::Msg(CoordinatorMsg::Specialist {
                    from: attempt,
                    reply,
                }),
            ),
            ToCoordinator::LoadContext { attempt, request } => {
                self.context_request(from, attempt, request);
            }
            other => self.cluster_frame(from, other),
        }
    }

    fn worker_receives(&mut self, node: NodeId, msg: ToWorker) {
        let Some(w) = self.workers.get(usize::from(node.0).wrapping_sub(1)) else {
            return;
        };
        if !w.up {
            return;
        }
        match msg {
            ToWorker::Spawn {
                incarnation, start, ..
            } => self.spawn_arrives(node, *start, incarnation),
            ToWorker::Specialist { attempt, msg } => {
                self.deliver_spec(node, attempt, SpecialistInput::Msg(msg));
            }
            ToWorker::ContextRows { attempt, rows } => {
                self.deliver_spec(node, attempt, SpecialistInput::ContextLoaded(rows));
            }
            // Never sent: the simulated coordinator has no policy (its spawns carry none).
            ToWorker::PolicyAnswer { .. } => {}
        }
    }
}
