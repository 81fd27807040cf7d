//! The old engine's `state.json` (`state-g<N>.json`) kept current from the store while both
//! engines exist: every reader not ported to the store yet (`herd status`, `herd url`,
//! `herd down`, shard moves, copies) finds the group's nodes, its primary (the lease holder)
//! and its recorded sync set where it always did. Written only when it changes.

use std::sync::Arc;
use std::time::Duration;

use herd_cluster::{ClusterState, Layout};
use herd_config::Config;
use herd_core::NodeName;
use herd_dcs::Dcs;
use tokio::sync::watch;

use crate::store::StoreClient;

/// What the store says about one group, as the projection needs it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupFacts {
    /// The holder of the leader lease.
    pub leader: Option<String>,
    /// The member that led when the sync set was last recorded.
    pub last_leader: Option<String>,
    /// The recorded synchronous standbys.
    pub sync_set: Vec<String>,
    /// Nodes that ran as primary since they last rejoined (`was-primary` marker present).
    pub was_primary: Vec<String>,
}

/// The group's `state.json` from `facts`, given its nodes and the file as it is: `None` while
/// no member ever led (nothing to describe yet; a reader then says the cluster does not exist).
/// Without a current lease holder the last known leader stays the primary.
pub fn project(
    nodes: &[NodeName],
    facts: &GroupFacts,
    previous: Option<&ClusterState>,
) -> Option<ClusterState> {
    let known = |n: &String| nodes.iter().find(|m| m.as_str() == n).cloned();
    let primary = facts
        .leader
        .as_ref()
        .and_then(known)
        .or_else(|| previous.map(|p| p.primary.clone()))
        .or_else(|| facts.last_leader.as_ref().and_then(known))?;
    Some(ClusterState {
        nodes: nodes.to_vec(),
        sync_set: facts
            .sync_set
            .iter()
            .filter_map(known)
            .filter(|n| *n != primary)
            .collect(),
        needs_rewind: facts
            .was_primary
            .iter()
            .filter_map(known)
            .filter(|n| *n != primary)
            .collect(),
        primary,
    })
}

/// Group `group`'s facts from the store (`None` when it cannot be read).
async fn facts(
    root: &StoreClient,
    layout: &Layout,
    nodes: &[NodeName],
    group: u32,
) -> Option<GroupFacts> {
    let store = StoreClient::new(crate::groups::scoped(root.dcs(), group));
    let read = store.read().await.ok()?;
    Some(GroupFacts {
        leader: read.store.leader,
        last_leader: read.store.last_leader,
        sync_set: read.store.sync_set,
        was_primary: nodes
            .iter()
            .filter(|n| layout.run().join(format!("{n}.was-primary")).exists())
            .map(|n| n.to_string())
            .collect(),
    })
}

/// Group `group`'s leader: the lease holder, else the last recorded one.
pub async fn leader(root: &StoreClient, group: u32) -> Option<String> {
    let store = StoreClient::new(crate::groups::scoped(root.dcs(), group));
    let read = store.read().await.ok()?;
    read.store.leader.or(read.store.last_leader)
}

/// Keeps every group's file current (one pass per `every`) until `stop`; a last pass then.
pub async fn run(
    layout: Layout,
    config: Config,
    root: Arc<dyn Dcs>,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let root = StoreClient::new(root);
    loop {
        pass(&layout, &config, &root).await;
        if *stop.borrow() {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(every) => {}
            _ = stop.changed() => {}
        }
    }
}

async fn pass(layout: &Layout, config: &Config, root: &StoreClient) {
    // Groups added while the cluster runs (`herd group add`) are in the store's count.
    let recorded = crate::groups::count(root).await.ok().flatten().unwrap_or(0);
    for group in 0..config.cluster.shards.max(recorded).max(1) {
        let nodes: Vec<NodeName> = (0..=config.cluster.replicas as usize)
            .map(|i| NodeName::in_group(group, i))
            .collect();
        let Some(facts) = facts(root, layout, &nodes, group).await else {
            continue;
        };
        let path = layout.for_group(group).state();
        let previous = ClusterState::load(&path).ok().flatten();
        let Some(next) = project(&nodes, &facts, previous.as_ref()) else {
            continue;
        };
        if previous.as_ref() != Some(&next) {
            tracing::info!(
                "group {group}: primary {}, sync set [{}]",
                next.primary,
                next.sync_set
                    .iter()
                    .map(|n| n.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            if let Err(e) = next.save(&path) {
                tracing::warn!("cannot write {}: {e}", path.display());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes() -> Vec<NodeName> {
        (0..3).map(|i| NodeName::in_group(0, i)).collect()
    }

    fn names(v: &[NodeName]) -> Vec<&str> {
        v.iter().map(NodeName::as_str).collect()
    }

    /// facts, previous primary, expected primary, sync set, needs_rewind.
    type Row = (
        GroupFacts,
        Option<&'static str>,
        Option<&'static str>,
        Vec<&'static str>,
        Vec<&'static str>,
    );

    #[test]
    fn projection_table() {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        // (facts, previous primary, expected primary, sync set, needs_rewind)
        let rows: Vec<Row> = vec![
            // Nothing led yet: no file.
            (GroupFacts::default(), None, None, vec![], vec![]),
            // The lease holder is the primary; the recorded set without it.
            (
                GroupFacts {
                    leader: Some("node1".into()),
                    sync_set: s(&["node0", "node2", "node1"]),
                    ..Default::default()
                },
                Some("node0"),
                Some("node1"),
                vec!["node0", "node2"],
                vec![],
            ),
            // No holder (an election): the last primary stays, its marker is not a rewind.
            (
                GroupFacts {
                    was_primary: s(&["node0"]),
                    ..Default::default()
                },
                Some("node0"),
                Some("node0"),
                vec![],
                vec![],
            ),
            // A former primary still marked must be rewound; unknown names are dropped.
            (
                GroupFacts {
                    leader: Some("node2".into()),
                    sync_set: s(&["node1", "g1_node0"]),
                    was_primary: s(&["node0", "node2"]),
                    ..Default::default()
                },
                Some("node0"),
                Some("node2"),
                vec!["node1"],
                vec!["node0"],
            ),
            // A fresh start with only the recorded leader known.
            (
                GroupFacts {
                    last_leader: Some("node0".into()),
                    ..Default::default()
                },
                None,
                Some("node0"),
                vec![],
                vec![],
            ),
        ];
        for (facts, previous, primary, sync, rewind) in rows {
            let prev = previous.map(|p| ClusterState {
                nodes: nodes(),
                primary: NodeName::from_text(p),
                sync_set: vec![],
                needs_rewind: vec![],
            });
            let got = project(&nodes(), &facts, prev.as_ref());
            assert_eq!(
                got.as_ref().map(|g| g.primary.as_str()),
                primary,
                "{facts:?}"
            );
            if let Some(g) = got {
                assert_eq!(names(&g.nodes), ["node0", "node1", "node2"]);
                assert_eq!(names(&g.sync_set), sync, "{facts:?}");
                assert_eq!(names(&g.needs_rewind), rewind, "{facts:?}");
            }
        }
    }
}
