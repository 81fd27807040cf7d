//! Who is where: the supervisor's assignment of roles to node addresses, which the proxy follows.

use std::path::PathBuf;

use crate::NodeName;

/// How to reach one node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// Node name.
    pub name: NodeName,
    /// Host address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// The node's Unix-domain socket when it runs on this host: cheaper than TCP loopback, so
    /// the proxy prefers it (and falls back to TCP when it cannot connect there).
    pub socket: Option<PathBuf>,
}

/// Hashes the name and port only: the proxy looks its pools up by endpoint on every
/// transaction, and host and socket path add bytes without telling endpoints apart any better.
/// Consistent with `Eq`: equal endpoints have equal names and ports.
impl std::hash::Hash for Endpoint {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.name.hash(state);
        self.port.hash(state);
    }
}

/// The nodes as assigned by the supervisor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Assignment {
    /// The node that should be the primary.
    pub primary: Endpoint,
    /// The hot standbys.
    pub replicas: Vec<Endpoint>,
    /// The supervisor saw the primary's postmaster gone: send it nothing, even if backends it
    /// left behind still answer, until a replica is promoted or it is back.
    pub primary_down: bool,
    /// How many replicas hold every acknowledged commit: the quorum's k in the synchronous
    /// commit modes, 0 in async. A failover promotes a replica holding whatever that many
    /// replicas hold, so WAL replayed on that many is safe to hand to logical copies.
    pub durable_replicas: u32,
}
