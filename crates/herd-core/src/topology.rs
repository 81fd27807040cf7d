//! Who is where: the supervisor's assignment of roles to node addresses, which the proxy follows.

use std::path::PathBuf;

use crate::NodeName;

/// How to reach one node.
#[derive(Clone, Debug, Eq)]
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

/// Field by field, the port first (the cheapest test that tells two nodes of one host apart),
/// and the socket paths as bytes: the proxy finds a session's pool by endpoint several times
/// per transaction, and `Path`'s own equality walks both paths component by component.
impl PartialEq for Endpoint {
    fn eq(&self, other: &Self) -> bool {
        self.port == other.port
            && self.name == other.name
            && self.host == other.host
            && self.socket.as_ref().map(|p| p.as_os_str())
                == other.socket.as_ref().map(|p| p.as_os_str())
    }
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

#[cfg(test)]
mod tests {
    use super::Endpoint;
    use crate::NodeName;

    #[test]
    fn endpoints_differ_in_any_field() {
        let ep = Endpoint {
            name: NodeName::from_text("node0"),
            host: "127.0.0.1".into(),
            port: 7601,
            socket: Some("/run/herd/.s.PGSQL.7601".into()),
        };
        assert_eq!(ep, ep.clone());
        let mut other = ep.clone();
        other.port = 7602;
        assert_ne!(ep, other, "port");
        let mut other = ep.clone();
        other.name = NodeName::from_text("node1");
        assert_ne!(ep, other, "name");
        let mut other = ep.clone();
        other.host = "127.0.0.2".into();
        assert_ne!(ep, other, "host");
        let mut other = ep.clone();
        other.socket = None;
        assert_ne!(ep, other, "socket");
        other.socket = Some("/run/herd2/.s.PGSQL.7601".into());
        assert_ne!(ep, other, "socket path");
    }
}
