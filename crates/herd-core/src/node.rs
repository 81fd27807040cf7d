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

    /// The name of the `index`-th node of shard group `group`: `node<i>` in group 0 (the names
    /// of clusters made before shard groups), `g<N>_node<i>` in group N. Names are unique across
    /// groups and valid replication slot names.
    pub fn in_group(group: u32, index: usize) -> Self {
        match group {
            0 => Self::numbered(index),
            g => NodeName(format!("g{g}_node{index}")),
        }
    }

    /// The shard group a node of this cluster belongs to, read from its name.
    pub fn group(&self) -> u32 {
        self.0
            .strip_prefix('g')
            .and_then(|rest| rest.split_once("_node"))
            .and_then(|(g, _)| g.parse().ok())
            .unwrap_or(0)
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
