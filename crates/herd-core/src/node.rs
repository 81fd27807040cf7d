//! Node identity and role.

use std::fmt;

use serde::{Deserialize, Serialize};

/// A node's stable name (`node0`, `node1`, …). It is also the node's `application_name` on the
/// replication connection, so it appears in `synchronous_standby_names` and `pg_stat_replication`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeName(String);

impl NodeName {
    /// The name of the `index`-th node of a cluster.
    pub fn numbered(index: usize) -> Self {
        NodeName(format!("node{index}"))
    }

    /// A name as given by an operator.
    pub fn from_text(name: &str) -> Self {
        NodeName(name.to_string())
    }

    /// The name as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for NodeName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a node is for in the cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Accepts writes and streams WAL to the replicas.
    Primary,
    /// Hot standby: replays the primary's WAL and serves reads.
    Replica,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Primary => "primary",
            Role::Replica => "replica",
        })
    }
}
