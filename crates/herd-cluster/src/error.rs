//! Errors of cluster operations, each saying what happened and what to do.

use std::path::PathBuf;

/// Why a cluster operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A PostgreSQL program or probe failed.
    #[error(transparent)]
    Pg(#[from] herd_pg::PgError),
    /// The configuration is invalid.
    #[error(transparent)]
    Config(#[from] herd_config::ConfigError),
    /// A file Herd keeps could not be read or written.
    #[error("{action} {path}: {source}")]
    Io {
        /// What Herd was doing.
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// The data directory is not in a state Herd can use; nothing was changed.
    #[error("data directory {path} cannot be used: {detail}")]
    DataDir {
        /// The data directory.
        path: PathBuf,
        /// What is wrong and what to do.
        detail: String,
    },
    /// Another supervisor holds the data directory.
    #[error("a Herd supervisor (pid {pid}) is already running for {path}; use `herd status` or `herd down`")]
    AlreadyRunning {
        /// Its pid, 0 when unknown.
        pid: u32,
        /// The data directory.
        path: PathBuf,
    },
    /// A TCP port Herd needs is taken by another program.
    #[error("port {port} on {address} is already in use ({what}); stop the program using it or choose another --port")]
    PortInUse {
        /// The port.
        port: u16,
        /// The address.
        address: String,
        /// What Herd wanted it for.
        what: String,
    },
    /// The cluster did not reach the expected state in time.
    #[error("{0}")]
    NotReady(String),
}

impl ClusterError {
    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        ClusterError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}
