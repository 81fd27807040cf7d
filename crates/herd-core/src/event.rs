//! Cluster events worth a line on a timeline: failovers, switchovers, restarts, rejoins and
//! replicas leaving or joining the read pool, shard groups added, each with the sentence Herd logs for it.

use serde::{Deserialize, Serialize};

/// What kind of thing happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    /// The supervisor promoted a replica in place of a lost primary, or an operator forced it.
    Failover,
    /// The supervisor found no replica it could prove safe and did not promote.
    RefusedFailover,
    /// A planned change of primary (`herd switchover`), done or refused.
    Switchover,
    /// A server was (re)started: after a crash, or on an operator's request.
    Restart,
    /// A former primary came back as a replica.
    Rejoin,
    /// A replica left the read pool (lag, staleness or no answer).
    LeftReadPool,
    /// A replica came back into the read pool.
    JoinedReadPool,
    /// A shard group was added while the cluster ran (`herd group add`), or its admission failed.
    GroupAdded,
    /// A primary was stopped at once so it cannot take another write (it lost its lease, or
    /// it gave the lead up because its server died or hung).
    Fenced,
}

/// One event, stamped when it happened.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterEvent {
    /// Milliseconds since the Unix epoch.
    pub unix_ms: u64,
    /// The shard group it concerns.
    pub group: u32,
    /// What happened.
    pub kind: EventKind,
    /// The node it concerns, when one does.
    pub node: Option<String>,
    /// Herd's sentence for it (the reason, or the outcome).
    pub text: String,
    /// False when the action failed or was refused.
    pub ok: bool,
}

impl ClusterEvent {
    /// An event stamped with the current time.
    pub fn now(group: u32, kind: EventKind, node: Option<String>, text: String, ok: bool) -> Self {
        ClusterEvent {
            unix_ms: unix_ms(),
            group,
            kind,
            node,
            text,
            ok,
        }
    }
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// Where the supervisor reports events (the dashboard's event log keeps them).
pub type EventSink = std::sync::Arc<dyn Fn(ClusterEvent) + Send + Sync>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_serialise_in_snake_case() {
        let e = ClusterEvent {
            unix_ms: 1,
            group: 0,
            kind: EventKind::LeftReadPool,
            node: Some("node1".into()),
            text: "lag".into(),
            ok: true,
        };
        let json = serde_json::to_string(&e).expect("json");
        assert!(json.contains("\"kind\":\"left_read_pool\""), "{json}");
    }
}
