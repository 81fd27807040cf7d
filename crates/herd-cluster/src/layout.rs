//! Where everything lives inside a Herd data directory.

use std::path::{Path, PathBuf};

use herd_core::NodeName;

/// Paths inside one data directory:
///
/// ```text
/// herd.toml            configuration (flags of `herd up` are saved here)
/// state.json           topology: nodes, current primary, recorded sync set
/// secrets/             passwords and pgpass, mode 0600
/// nodes/<node>/        one PostgreSQL data directory per node
/// logs/<node>.log      server logs; logs/herd.log for a detached supervisor
/// run/                 supervisor pid, lock and API port
/// sockets/             the servers' Unix-domain sockets (mode 0700, the servers' OS user)
/// ```
#[derive(Clone, Debug)]
pub struct Layout {
    root: PathBuf,
}

impl Layout {
    /// The layout of `root`, which should be absolute.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Layout { root: root.into() }
    }

    /// The data directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// `herd.toml`.
    pub fn config(&self) -> PathBuf {
        self.root.join("herd.toml")
    }

    /// `state.json`.
    pub fn state(&self) -> PathBuf {
        self.root.join("state.json")
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

    /// Runtime files of the supervisor.
    pub fn run(&self) -> PathBuf {
        self.root.join("run")
    }
}
