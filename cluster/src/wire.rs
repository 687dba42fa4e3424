//! The protocol on ractor_cluster: every message between keel nodes travels as one encoded frame of
//! keel-protocol's wire format ([`keel_protocol::wire`], re-exported here), so decoding happens in
//! keel's endpoint and a bad frame is a typed, logged refusal.

pub use keel_protocol::wire::*;

use crate::name::NodeName;
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The one ractor message type that crosses between keel nodes: an encoded frame. Decoding happens
/// in keel's endpoint, never inside ractor's session actors, so a bad frame is a logged, typed
/// refusal ([`WireError`]) and never a failure of the connection.
#[derive(ractor_cluster::RactorClusterMessage, Debug)]
pub enum ClusterMsg {
    /// One frame (see [`encode`]).
    Frame(Vec<u8>),
}

/// Send `body` to the first member of a process group (the coordinator's, or one worker's), as a
/// frame of this protocol version. Dropped with a debug line when nobody is in the group (the node
/// is unreachable): what must arrive is resent by the machines until it is acknowledged. Returns
/// whether the frame was handed to the transport (a policy question is denied at once when not).
pub fn cast_to_group<B: Serialize>(group: &str, from: &NodeName, body: &B) -> bool {
    let bytes = match encode(from, body) {
        Ok(b) => b,
        Err(e) => {
            tracing::error!(%group, error = %e, "a cluster message could not be encoded");
            return false;
        }
    };
    match ractor::pg::get_members(&group.to_string())
        .into_iter()
        .next()
    {
        Some(cell) => {
            let to: ractor::ActorRef<ClusterMsg> = cell.into();
            match to.cast(ClusterMsg::Frame(bytes)) {
                Ok(()) => true,
                Err(e) => {
                    tracing::debug!(%group, error = %e, "a cluster message was not sent");
                    false
                }
            }
        }
        None => {
            tracing::debug!(%group, "nobody in the group; cluster message dropped");
            false
        }
    }
}

/// Open a received frame: the message, or `None` after logging why it was refused (an error line
/// naming the protocol version for a message of another version).
pub fn open<B: DeserializeOwned>(message: ClusterMsg) -> Option<Envelope<B>> {
    let ClusterMsg::Frame(bytes) = message;
    match decode::<B>(&bytes) {
        Ok(envelope) => Some(envelope),
        Err(e @ WireError::Version { .. }) => {
            tracing::error!(error = %e, "refused a cluster message of another protocol version");
            None
        }
        Err(e) => {
            tracing::error!(error = %e, "refused a cluster message");
            None
        }
    }
}
