//! Where everything lives inside a Herd data directory.

use std::path::{Path, PathBuf};

use herd_core::NodeName;

/// Paths inside one data directory:
///
/// ```text
/// herd.toml            configuration (flags of `herd up` are saved here)
/// state.json           topology of shard group 0: nodes, current primary, recorded sync set
/// state-g<N>.json      the same for shard group N (N ≥ 1; node names `g<N>_node<i>`)
/// store.json           the agent engine's store (the default engine); state*.json are then
///                      projections of it
/// secrets/             passwords and pgpass, mode 0600
/// nodes/<node>/        one PostgreSQL data directory per node
/// logs/<node>.log      server logs; logs/herd.log for a detached supervisor
/// run/                 supervisor pid, lock and API port; ha-note.txt (ha-note-g<N>.txt) per group
/// sockets/             the servers' Unix-domain sockets (mode 0700, the servers' OS user)
/// backup/              pgbackrest.conf when [backup] is on (see herd-backup's Paths)
/// backup-repo/         the default pgBackRest repository
/// ```
///
/// A layout is seen from one shard group (group 0 unless [`Layout::for_group`] says otherwise):
/// the files of the whole cluster are shared, the topology and the HA note are the group's own.
#[derive(Clone, Debug)]
pub struct Layout {
    root: PathBuf,
    group: u32,
}

impl Layout {
    /// The layout of `root`, which should be absolute, seen from shard group 0.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Layout {
            root: root.into(),
            group: 0,
        }
    }

    /// The same data directory seen from shard group `group`.
    pub fn for_group(&self, group: u32) -> Layout {
        Layout {
            root: self.root.clone(),
            group,
        }
    }

    /// The shard group this layout is seen from.
    pub fn group(&self) -> u32 {
        self.group
    }

    /// The data directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `herd.toml`.
    pub fn config(&self) -> PathBuf {
        self.root.join("herd.toml")
    }

    /// The group's topology: `state.json` for group 0 (as before shard groups existed),
    /// `state-g<N>.json` for group N.
    pub fn state(&self) -> PathBuf {
        match self.group {
            0 => self.root.join("state.json"),
            g => self.root.join(format!("state-g{g}.json")),
        }
    }

    /// Where the group's last high-availability event is left for `herd status`.
    pub fn ha_note(&self) -> PathBuf {
        match self.group {
            0 => self.run().join("ha-note.txt"),
            g => self.run().join(format!("ha-note-g{g}.txt")),
        }
    }

    /// The secrets directory.
    pub fn secrets(&self) -> PathBuf {
        self.root.join("secrets")
    }

    /// Parent of the node data directories.
    pub fn nodes(&self) -> PathBuf {
        self.root.join("nodes")
    }

    /// One node's PostgreSQL data directory.
    pub fn node(&self, name: &NodeName) -> PathBuf {
        self.nodes().join(name.as_str())
    }

    /// The logs directory.
    pub fn logs(&self) -> PathBuf {
        self.root.join("logs")
    }

    /// One node's server log.
    pub fn node_log(&self, name: &NodeName) -> PathBuf {
        self.logs().join(format!("{name}.log"))
    }

    /// The detached supervisor's log.
    pub fn supervisor_log(&self) -> PathBuf {
        self.logs().join("herd.log")
    }

    /// The servers' Unix-domain sockets, for the proxy on this host.
    pub fn sockets(&self) -> PathBuf {
        self.root.join("sockets")
    }

    /// Definitions of the cluster's logical copies (`herd copy`), one 0600 file each.
    pub fn copies(&self) -> PathBuf {
        self.root.join("copies")
    }

    /// Runtime files of the supervisor.
    pub fn run(&self) -> PathBuf {
        self.root.join("run")
    }
}
