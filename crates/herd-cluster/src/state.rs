//! The cluster's persisted topology. Today a JSON file in the data directory; the `Dcs` of the
//! HA issue will hold the same facts (and records the sync set before the server setting).

use std::path::Path;

use herd_core::NodeName;
use serde::{Deserialize, Serialize};

use crate::ClusterError;

/// Facts about the cluster that outlive processes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClusterState {
    /// Every node, in creation order; node `i` listens on `port + 1 + i`.
    pub nodes: Vec<NodeName>,
    /// The node acting as primary.
    pub primary: NodeName,
    /// The standbys named in `synchronous_standby_names`, recorded before each change of it.
    pub sync_set: Vec<NodeName>,
    /// Former primaries that must be rewound before they can follow the current primary.
    #[serde(default)]
    pub needs_rewind: Vec<NodeName>,
}

impl ClusterState {
    /// A new cluster: `node0` primary, `replicas` replicas all in the sync set.
    pub fn new(replicas: u32) -> ClusterState {
        Self::new_group(0, replicas)
    }

    /// A new shard group: its node 0 primary, `replicas` replicas all in the sync set.
    pub fn new_group(group: u32, replicas: u32) -> ClusterState {
        let nodes: Vec<NodeName> = (0..=replicas as usize)
            .map(|i| NodeName::in_group(group, i))
            .collect();
        ClusterState {
            primary: nodes[0].clone(),
            sync_set: nodes[1..].to_vec(),
            nodes,
            needs_rewind: Vec::new(),
        }
    }

    /// The replicas: every node but the primary.
    pub fn replicas(&self) -> Vec<NodeName> {
        self.nodes
            .iter()
            .filter(|n| **n != self.primary)
            .cloned()
            .collect()
    }

    /// The replicas that can stream now (not waiting to be rewound): the sync set.
    pub fn streaming_replicas(&self) -> Vec<NodeName> {
        self.replicas()
            .into_iter()
            .filter(|n| !self.needs_rewind.contains(n))
            .collect()
    }

    /// The index of a node (which fixes its port).
    pub fn index(&self, name: &NodeName) -> Option<usize> {
        self.nodes.iter().position(|n| n == name)
    }

    /// Reads `state.json`; `Ok(None)` when absent.
    pub fn load(path: &Path) -> Result<Option<ClusterState>, ClusterError> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(ClusterError::io("reading", path, e)),
        };
        let state: ClusterState =
            serde_json::from_str(&text).map_err(|e| ClusterError::DataDir {
                path: path.to_path_buf(),
                detail: format!("state.json is damaged ({e}); restore it from a backup"),
            })?;
        if state.index(&state.primary).is_none() {
            return Err(ClusterError::DataDir {
                path: path.to_path_buf(),
                detail: format!(
                    "state.json names primary {} which is not a node",
                    state.primary
                ),
            });
        }
        Ok(Some(state))
    }

    /// Records the topology in `dcs` (key `topology`, compare-and-set on its revision), so the
    /// store holds the primary and sync set before any server changes.
    pub fn record(&self, dcs: &dyn herd_dcs::Dcs) -> Result<(), ClusterError> {
        let value = serde_json::to_vec(self).unwrap_or_default();
        let unavailable = |e: herd_dcs::DcsError| ClusterError::NotReady(e.to_string());
        let revision = dcs
            .get("topology")
            .map_err(unavailable)?
            .map_or(0, |v| v.revision);
        dcs.compare_and_set("topology", revision, value)
            .map_err(unavailable)?;
        Ok(())
    }

    /// Writes `state.json` atomically (temporary file, fsync, rename).
    pub fn save(&self, path: &Path) -> Result<(), ClusterError> {
        use std::io::Write;
        let tmp = path.with_extension("json.tmp");
        let text = serde_json::to_string_pretty(self).unwrap_or_default();
        let mut f =
            std::fs::File::create(&tmp).map_err(|e| ClusterError::io("creating", &tmp, e))?;
        f.write_all(text.as_bytes())
            .and_then(|_| f.sync_all())
            .map_err(|e| ClusterError::io("writing", &tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| ClusterError::io("renaming", path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_state_and_round_trip() {
        let s = ClusterState::new(2);
        assert_eq!(s.primary.as_str(), "node0");
        assert_eq!(
            s.replicas(),
            vec![NodeName::numbered(1), NodeName::numbered(2)]
        );
        let tmp = tempfile::tempdir().expect("tempdir");
        let path = tmp.path().join("state.json");
        assert_eq!(ClusterState::load(&path).expect("absent"), None);
        s.save(&path).expect("save");
        assert_eq!(ClusterState::load(&path).expect("load"), Some(s.clone()));
        let g2 = ClusterState::new_group(2, 1);
        assert_eq!(g2.primary.as_str(), "g2_node0");
        assert_eq!(g2.replicas()[0].group(), 2);
        assert_eq!(s.replicas()[0].group(), 0);
        std::fs::write(&path, "{").expect("write");
        assert!(ClusterState::load(&path)
            .expect_err("damaged")
            .to_string()
            .contains("damaged"));
    }
}
