//! A Herd cluster's data directory on one machine: its layout, secrets and run files, the
//! topology files (`state.json`, projections of the agents' store since issue #39), probing
//! every node into the status document, starting and stopping its servers (`herd down`,
//! `herd restore`), and cloning replicas from a restored primary. The HA engine is herd-agent's;
//! the per-group supervisor that lived here was retired in issue #39 slice 11.
//!
//! Everything that runs a PostgreSQL program goes through `herd-pg`.

mod bootstrap;
mod cluster;
mod commit;
mod error;
mod groups;
mod layout;
mod lifecycle;
mod progress;
mod rotation;
mod runfiles;
mod secrets;
mod state;
mod status;

pub use cluster::{Cluster, REPLICATION_USER, SUPERUSER};
pub use error::ClusterError;
pub use groups::{combine, existing_groups, observe_groups, open_groups, stop_groups};
pub use layout::Layout;
pub use progress::{Progress, SilentProgress};
pub use rotation::Rotation;
pub use runfiles::{read_supervisor, supervisor_running, SupervisorLock};
pub use secrets::Secrets;
pub use state::ClusterState;
pub use status::{
    archive_status_of, lag as replica_lag, observe, observe_with, Observation, Probers,
};
