//! What each agent publishes about its node, and the keys of a cluster in the store.

use herd_core::{CommitMode, Lsn, SyncStandbys};
use serde::{Deserialize, Serialize};

/// The lease the primary's agent holds.
pub const LEADER: &str = "leader";
/// Written once by the agent that creates the cluster (compare-and-set on absence).
pub const INITIALIZE: &str = "initialize";
/// The cluster-wide settings ([`ClusterSettings`]).
pub const CONFIG: &str = "config";
/// The recorded synchronous standby set ([`SyncRecord`]).
pub const SYNC: &str = "sync";
/// An operator's switchover or failover request ([`Handover`]).
pub const HANDOVER: &str = "handover";
/// Cluster-wide, at the store's root: how many shard groups the cluster has ([`ShardGroups`]),
/// written once by the agent that creates group 0.
pub const SHARD_GROUPS: &str = "shard_groups";
/// Prefix of operator requests to one member (`requests/<name>`, a [`Request`]).
pub const REQUESTS: &str = "requests/";
/// Prefix of the members' heartbeats.
pub const MEMBERS: &str = "members/";
/// Prefix of the timeline's events (see [`crate::events`]).
pub const EVENTS: &str = "events/";

/// The key of member `name`.
pub fn member_key(name: &str) -> String {
    format!("{MEMBERS}{name}")
}

/// How the node of one agent is doing, as its agent last saw it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Member {
    /// The agent's node name (also the replication slot and `application_name`).
    pub name: String,
    /// A random id of the agent process: two agents claiming one name are told apart by it.
    pub instance: String,
    /// `primary`, `replica`, `stopped`, `starting` or `unreachable`.
    pub role: String,
    /// Where clients and replicas reach its PostgreSQL.
    pub pg_host: String,
    /// Its PostgreSQL port.
    pub pg_port: u16,
    /// The agent's API (`host:port`).
    pub api: String,
    /// Primary: `pg_current_wal_lsn()`; replica: the furthest of received and replayed WAL.
    pub lsn: Option<Lsn>,
    /// Replica: replayed WAL (the proxy's read-your-writes and lag checks use it).
    pub replayed: Option<Lsn>,
    /// Replica: the member it streams from, when its WAL receiver is streaming.
    pub streaming_from: Option<String>,
    /// Its PostgreSQL's Unix-domain socket, for a proxy on the same host (`herd up`'s agents;
    /// absent on multi-host agents, whose proxies are elsewhere).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub socket: Option<String>,
    /// When its PostgreSQL serves TLS (the cluster has a CA): the last valid moment of its
    /// server's certificate, Unix seconds (`herd status --dcs` shows the days left).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_not_after: Option<i64>,
    /// The fingerprint of the CA that issued that certificate (`herd certs rotate --finish`
    /// waits until every member's is the next CA's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_issuer: Option<String>,
    /// The fingerprints of the CAs its `ca.crt` holds (two during a rotation; `herd certs
    /// rotate --issue` waits until every member trusts the next CA).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tls_trusts: Vec<String>,
    /// As primary with `[backup]` across hosts: its WAL archiving health (`herd status --dcs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub archiving: Option<herd_core::ArchiveStatus>,
    /// Its acknowledgement of the password rotation under way (`herd secrets rotate --dcs`,
    /// [`crate::rotation`]): `<id>` once it holds the next passwords, `<id> applied` once
    /// they are its current ones.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secrets_rotation: Option<String>,
    /// As primary: its walsenders as `pg_stat_replication` showed them this round (each
    /// replica's lag in seconds and live `sync_state` in the status document).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub walsenders: Vec<herd_pg::ReplicationRow>,
}

/// The cluster's PostgreSQL system identifier, fixed when it was created: a data directory of
/// another cluster is refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Initialized {
    /// `pg_control`'s "Database system identifier", once known ("" while initdb runs).
    pub system_identifier: String,
    /// The member that created it.
    pub by: String,
}

/// The cluster's shard groups: group `g` (0 ≤ g < `count`) keeps its keys under `groups/<g>/`
/// (group 0 at the root). `count` is set when the cluster is created and raised by `herd group
/// add`; a group added across hosts is served by the proxies only once admitted.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardGroups {
    /// How many groups (whose agents may run).
    pub count: u32,
    /// How many of them the endpoint serves (`None`: all; groups created with the cluster).
    /// Below `count` while `herd group add --dcs` waits for the new group's agents and its
    /// admission by a proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admitted: Option<u32>,
}

impl ShardGroups {
    /// How many groups the endpoint serves.
    pub fn served(&self) -> u32 {
        self.admitted.map_or(self.count, |a| a.min(self.count))
    }
}

/// An operator's request to one member (`herd restart --dcs … --node N`): the member's agent
/// leaves the read pool, restarts its server and marks the request done.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Request {
    /// Tells one request from the next (the asker's choice, e.g. a time stamp).
    pub id: String,
    /// What to do: `restart`.
    pub kind: String,
    /// Taken up by the member (it restarts now or has restarted).
    pub done: bool,
}

/// The key of member `name`'s request.
pub fn request_key(name: &str) -> String {
    format!("{REQUESTS}{name}")
}

/// Settings every member follows, changed with `herd config set --dcs …`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterSettings {
    /// The commit mode.
    pub commit_mode: CommitMode,
    /// `ANY k` / `FIRST k`.
    pub sync_standbys: SyncStandbys,
    /// Async failover: how far (bytes) behind the lost primary a replica may be promoted.
    pub max_lag_on_failover: u64,
    /// `wal_compression` of every member (`None`: each agent's `[postgres]` setting).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wal_compression: Option<String>,
    /// `herd certs rotate --issue`: every agent issues its certificate from the next CA
    /// (`secrets/ca.next.*`); cleared by `--finish`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub issue_from_next_ca: bool,
}

impl Default for ClusterSettings {
    fn default() -> Self {
        ClusterSettings {
            commit_mode: CommitMode::On,
            sync_standbys: SyncStandbys::default(),
            max_lag_on_failover: 1024 * 1024,
            wal_compression: None,
            issue_from_next_ca: false,
        }
    }
}

/// The synchronous standby set, recorded before `synchronous_standby_names` grows (and shrunk
/// only after the remaining standbys hold everything acknowledged under the larger set).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncRecord {
    /// The standbys.
    pub members: Vec<String>,
    /// `FIRST k`: the standbys the primary reports as synchronous (`pg_stat_replication`).
    #[serde(default)]
    pub reported: Vec<String>,
    /// The leader that recorded it.
    pub leader: String,
}

/// `herd switchover` / `herd failover` against a multi-host cluster: the leader steps down
/// (a clean stop, or a fence for a failover) and gives the lease up; then only the named
/// member (or the best candidate other than the old leader) may take it. The new leader marks
/// the request done; the command cancels it when nobody took over in time.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handover {
    /// The leader asked to step down.
    pub from: String,
    /// The member to take over (default: the best candidate).
    pub to: Option<String>,
    /// A failover: the leader is fenced at once instead of stopped cleanly.
    pub immediate: bool,
    /// The target may take over without the quorum proof.
    pub allow_data_loss: bool,
    /// Finished (taken over) or cancelled: ignored from then on.
    pub done: bool,
}

/// Decodes a JSON value from the store, naming the key when it is damaged.
pub fn decode<T: for<'de> Deserialize<'de>>(key: &str, bytes: &[u8]) -> Result<T, String> {
    serde_json::from_slice(bytes).map_err(|e| format!("the store's {key} key is damaged: {e}"))
}

/// Encodes a value for the store.
pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    serde_json::to_vec(value).unwrap_or_default()
}
