//! The cluster status document: `herd status --json` and `GET /status` serialise these types.
//! Its shape is documented in `docs/status-json.md`; fields are only ever added, never renamed.

use serde::{Deserialize, Serialize};

use crate::{CommitMode, Lsn, NodeName, Role, SyncStandbys};

/// Version of the status document's shape; bumped only on an incompatible change.
pub const STATUS_VERSION: u32 = 1;

/// The whole cluster as observed at one moment.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterStatus {
    /// Always [`STATUS_VERSION`].
    pub version: u32,
    /// The configured commit mode.
    pub commit_mode: CommitMode,
    /// The configured quorum (`ANY k` / `FIRST k`).
    pub sync_standbys: SyncStandbys,
    /// `synchronous_standby_names` as the primary reports it (`null` when unreachable).
    pub synchronous_standby_names: Option<String>,
    /// The connection URL of the cluster's endpoint, without the password.
    pub endpoint: String,
    /// The supervisor process, when one runs.
    pub supervisor: Option<SupervisorInfo>,
    /// Every node, primary first.
    pub nodes: Vec<NodeStatus>,
    /// The supervisor's last high-availability event worth attention (a failover, a refusal
    /// to fail over and why), `null` when there is none.
    #[serde(default)]
    pub ha_note: Option<String>,
    /// The shard group these fields describe (0 when there is one group).
    #[serde(default)]
    pub group: u32,
    /// The other shard groups (1, 2, …), each described with these same fields; empty when the
    /// cluster has one group. The top-level fields describe group 0.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub groups: Vec<ClusterStatus>,
    /// The logical copies from this cluster (`herd copy`), at the top level only; empty when
    /// there are none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub copies: Vec<crate::CopyStatus>,
    /// The group's WAL archiving health, when backups are configured and the primary answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archiving: Option<crate::ArchiveStatus>,
}

impl ClusterStatus {
    /// The node currently acting as primary, if any is reachable as one.
    pub fn primary(&self) -> Option<&NodeStatus> {
        self.nodes
            .iter()
            .find(|n| n.role == Role::Primary && n.state == NodeState::Running)
    }

    /// Every group's status, group 0 (the top level, without its `groups`) first.
    pub fn all_groups(&self) -> Vec<&ClusterStatus> {
        std::iter::once(self).chain(self.groups.iter()).collect()
    }

    /// A node by name.
    pub fn node(&self, name: &str) -> Option<&NodeStatus> {
        self.nodes.iter().find(|n| n.name.as_str() == name)
    }
}

/// The supervisor (`herd up`) process.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SupervisorInfo {
    /// Its process id.
    pub pid: u32,
    /// The port of its HTTP API on 127.0.0.1.
    pub api_port: u16,
}

/// One PostgreSQL server of the cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    /// Stable node name.
    pub name: NodeName,
    /// The role Herd assigned to the node.
    pub role: Role,
    /// Postmaster process id, when running.
    pub pid: Option<u32>,
    /// TCP port on 127.0.0.1.
    pub port: u16,
    /// What the node is doing.
    pub state: NodeState,
    /// Primary only: `pg_current_wal_lsn()`.
    pub current_lsn: Option<Lsn>,
    /// Replica only: last WAL position received and flushed (`pg_last_wal_receive_lsn()`).
    pub received_lsn: Option<Lsn>,
    /// Replica only: last WAL position replayed (`pg_last_wal_replay_lsn()`).
    pub replayed_lsn: Option<Lsn>,
    /// Replica only: how far behind the primary it is.
    pub lag: Option<LagInfo>,
    /// Replica only: its standing in `synchronous_standby_names`, as the primary reports it.
    pub sync_state: Option<SyncState>,
}

/// Observed state of a node.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NodeState {
    /// Primary accepting connections and writes.
    Running,
    /// Replica receiving WAL from the primary.
    Streaming,
    /// Replica accepting connections but not (yet) streaming from the primary.
    Disconnected,
    /// Postmaster alive but not accepting connections (starting up, shutting down).
    Starting,
    /// No postmaster runs.
    Stopped,
    /// Running, but in a role other than the one Herd assigned (e.g. a "primary" in recovery).
    WrongRole,
}

/// Replication lag of one replica, from the primary's `pg_stat_replication`.
///
/// Byte lags are `pg_current_wal_lsn()` minus the replica's write / flush / replay position.
/// Time lags are PostgreSQL's measured `write_lag` / `flush_lag` / `replay_lag`: the time a recent
/// commit took to reach that stage. PostgreSQL clears them once an idle replica has caught up;
/// Herd then reports 0 (nothing is outstanding) and `null` only when bytes are outstanding but no
/// measurement exists. It never reports `now() - pg_last_xact_replay_timestamp()`, which grows
/// without bound while the primary is idle.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LagInfo {
    /// Bytes written by the primary but not yet written by the replica.
    pub write_bytes: u64,
    /// Bytes not yet flushed to the replica's disk.
    pub flush_bytes: u64,
    /// Bytes not yet replayed (visible to the replica's readers).
    pub replay_bytes: u64,
    /// Seconds, see the type's documentation.
    pub write_seconds: Option<f64>,
    /// Seconds, see the type's documentation.
    pub flush_seconds: Option<f64>,
    /// Seconds, see the type's documentation.
    pub replay_seconds: Option<f64>,
}

/// `pg_stat_replication.sync_state`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SyncState {
    /// A synchronous standby (FIRST k).
    Sync,
    /// A quorum member (ANY k).
    Quorum,
    /// Would become synchronous if a current one fails (FIRST k).
    Potential,
    /// Not waited for.
    Async,
}

impl SyncState {
    /// Parses PostgreSQL's `sync_state` text.
    pub fn from_pg(text: &str) -> Option<SyncState> {
        match text {
            "sync" => Some(SyncState::Sync),
            "quorum" => Some(SyncState::Quorum),
            "potential" => Some(SyncState::Potential),
            "async" => Some(SyncState::Async),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_shape_is_stable() {
        let status = ClusterStatus {
            version: STATUS_VERSION,
            commit_mode: CommitMode::On,
            sync_standbys: SyncStandbys::default(),
            synchronous_standby_names: Some("ANY 1 (\"node1\")".into()),
            endpoint: "postgresql://postgres@127.0.0.1:7432/postgres".into(),
            supervisor: Some(SupervisorInfo {
                pid: 42,
                api_port: 7532,
            }),
            nodes: vec![NodeStatus {
                name: NodeName::numbered(1),
                role: Role::Replica,
                pid: Some(7),
                port: 7434,
                state: NodeState::Streaming,
                current_lsn: None,
                received_lsn: Some(Lsn(0x300_0000)),
                replayed_lsn: Some(Lsn(0x300_0000)),
                lag: Some(LagInfo {
                    write_bytes: 0,
                    flush_bytes: 0,
                    replay_bytes: 0,
                    write_seconds: Some(0.0),
                    flush_seconds: Some(0.0),
                    replay_seconds: Some(0.0),
                }),
                sync_state: Some(SyncState::Quorum),
            }],
            ha_note: None,
            group: 0,
            groups: Vec::new(),
            copies: Vec::new(),
            archiving: None,
        };
        let json = serde_json::to_value(&status).expect("serialises");
        assert_eq!(json["commit_mode"], "on");
        assert_eq!(json["sync_standbys"], "ANY 1");
        assert_eq!(json["nodes"][0]["role"], "replica");
        assert_eq!(json["nodes"][0]["state"], "streaming");
        assert_eq!(json["nodes"][0]["received_lsn"], "0/3000000");
        assert_eq!(json["nodes"][0]["sync_state"], "quorum");
        let back: ClusterStatus = serde_json::from_value(json).expect("parses back");
        assert_eq!(back, status);
    }
}
