//! A data directory made by the supervisor engine, opened by the agent engine for the first
//! time (no `store.json` yet): each group's `state.json` becomes the store's records, so the
//! cluster resumes with the same primary and a former primary still to be rewound is rewound.

use std::sync::Arc;
use std::time::Duration;

use herd_cluster::{ClusterState, Layout};
use herd_config::Config;
use herd_dcs::Dcs;
use herd_pg::Pg;

use crate::member::{
    encode, ClusterSettings, Initialized, SyncRecord, CONFIG, INITIALIZE, LEADER, SYNC,
};
use crate::store::StoreClient;
use crate::AgentError;

/// What one group's `state.json` says in the store's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Imported {
    /// The leader lease's holder: the recorded primary.
    pub leader: String,
    /// The sync record: the recorded set, recorded by that primary.
    pub sync: SyncRecord,
    /// Nodes that get a `was-primary` marker: the primary (it runs as one) and every node
    /// waiting for a rewind.
    pub was_primary: Vec<String>,
}

/// The store's records for `state`.
pub fn import(state: &ClusterState) -> Imported {
    let leader = state.primary.to_string();
    let mut was_primary = vec![leader.clone()];
    was_primary.extend(
        state
            .needs_rewind
            .iter()
            .filter(|n| **n != state.primary)
            .map(|n| n.to_string()),
    );
    Imported {
        sync: SyncRecord {
            members: state.sync_set.iter().map(|n| n.to_string()).collect(),
            reported: Vec::new(),
            leader: leader.clone(),
        },
        leader,
        was_primary,
    }
}

fn store(e: impl std::fmt::Display) -> AgentError {
    AgentError::Store(e.to_string())
}

/// Writes every group's records from its `state.json` into `root` (the lease for `ttl`: its
/// holder renews it in its first round), and the markers into `layout`'s `run/`. Answers the
/// number of groups imported (0: no `state.json`, a new cluster).
pub async fn from_state_json(
    layout: &Layout,
    config: &Config,
    pg: &Pg,
    root: &Arc<dyn Dcs>,
    ttl: Duration,
) -> Result<u32, AgentError> {
    let groups = herd_cluster::existing_groups(layout);
    let mut imported = 0;
    for group in 0..groups {
        let Some(state) = ClusterState::load(&layout.for_group(group).state())
            .map_err(|e| AgentError::Setup(e.to_string()))?
        else {
            continue;
        };
        let records = import(&state);
        let system_identifier = pg.system_identifier(&layout.node(&state.primary)).await?;
        let dcs = crate::groups::scoped(root.clone(), group);
        let settings = config.for_group(group).cluster;
        let settings = ClusterSettings {
            commit_mode: settings.commit_mode,
            sync_standbys: settings.sync_standbys,
            ..ClusterSettings::default()
        };
        let init = Initialized {
            system_identifier,
            by: records.leader.clone(),
        };
        dcs.compare_and_set(INITIALIZE, 0, encode(&init))
            .map_err(store)?;
        dcs.compare_and_set(CONFIG, 0, encode(&settings))
            .map_err(store)?;
        dcs.compare_and_set(SYNC, 0, encode(&records.sync))
            .map_err(store)?;
        if !dcs
            .acquire_lease(LEADER, &records.leader, ttl)
            .map_err(store)?
        {
            return Err(store(format!("group {group}: the imported lease is taken")));
        }
        for name in &records.was_primary {
            let marker = layout.run().join(format!("{name}.was-primary"));
            std::fs::write(&marker, "")
                .map_err(|e| AgentError::Io(format!("{}: {e}", marker.display())))?;
        }
        tracing::warn!(
            "group {group}: imported state.json (primary {}, sync set [{}], to rewind [{}])",
            records.leader,
            records.sync.members.join(", "),
            records.was_primary[1..].join(", ")
        );
        imported += 1;
    }
    if imported > 0 {
        crate::groups::record_count(&StoreClient::new(root.clone()), groups)
            .await
            .map_err(AgentError::Store)?;
    }
    Ok(imported)
}

#[cfg(test)]
mod tests {
    use super::*;
    use herd_core::NodeName;

    #[test]
    fn a_state_becomes_lease_sync_record_and_markers() {
        let n = |s: &str| NodeName::from_text(s);
        let state = ClusterState {
            nodes: vec![n("node0"), n("node1"), n("node2")],
            primary: n("node1"),
            sync_set: vec![n("node2")],
            needs_rewind: vec![n("node0")],
        };
        let got = import(&state);
        assert_eq!(got.leader, "node1");
        assert_eq!(got.sync.members, ["node2"]);
        assert_eq!(got.sync.leader, "node1");
        assert_eq!(got.was_primary, ["node1", "node0"]);
        let plain = ClusterState::new(2);
        let got = import(&plain);
        assert_eq!((got.leader.as_str(), got.was_primary.len()), ("node0", 1));
        assert_eq!(got.sync.members, ["node1", "node2"]);
    }
}
