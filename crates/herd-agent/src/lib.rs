//! `herd agent`: runs on each host of a multi-host cluster, supervises that host's one
//! PostgreSQL node and takes part in leadership through the store (etcd):
//!
//! - the primary's agent holds the leader lease and renews it; when it cannot, it fences its
//!   server (immediate stop) before the lease can expire elsewhere — a separate watchdog
//!   process does so even when the agent itself is frozen;
//! - replicas race for an expired lease with a compare-and-set, and only the candidate the
//!   quorum proof allows races at all;
//! - a former primary rejoins through pg_rewind (re-clone as fallback).
//!
//! Only durations measured on one host's monotonic clock and TTLs kept by etcd are used: no
//! decision depends on synchronized clocks between hosts.

pub mod coordinator;
pub mod decide;
pub mod events;
pub mod follow;
pub mod groups;
pub mod host;
pub mod jobs;
pub mod member;
pub mod policy;
pub mod rotation;
pub mod status;
pub mod sync;
pub mod verbs;

pub mod api;
mod archiving;
pub mod book;
pub mod config;
pub mod launch;
pub mod node;
pub mod pglog;
pub mod run;
pub mod steplog;
pub mod store;
pub mod tls;
pub mod watchdog;

pub use config::AgentConfig;

/// Why the agent stops or a step failed.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// A PostgreSQL program or query failed.
    #[error(transparent)]
    Pg(#[from] herd_pg::PgError),
    /// A file could not be read or written.
    #[error("{0}")]
    Io(String),
    /// The store refused or could not take a write.
    #[error("the store: {0}")]
    Store(String),
    /// The data directory belongs to another PostgreSQL cluster.
    #[error(
        "{dir} holds another cluster's data (system identifier {found}, this cluster's is {expected}); \
         move it away so the agent clones the cluster, or point --data-dir elsewhere"
    )]
    OtherCluster {
        /// The data directory.
        dir: std::path::PathBuf,
        /// Its system identifier.
        found: String,
        /// The cluster's.
        expected: String,
    },
    /// The configuration or the environment is unusable.
    #[error("{0}")]
    Setup(String),
}
