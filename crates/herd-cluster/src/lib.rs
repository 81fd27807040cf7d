//! A Herd cluster on one machine: its data directory, first-time bootstrap, resuming an existing
//! cluster (adopting servers that still run), supervision through `herd-ha`'s decisions, run-time
//! commit mode changes, the status document, and clusters of several shard groups.
//!
//! Everything that runs a PostgreSQL program goes through `herd-pg`.

mod bootstrap;
mod cluster;
mod commit;
mod error;
mod failover;
mod groups;
mod layout;
mod lifecycle;
mod progress;
mod restart;
mod runfiles;
mod secrets;
mod state;
mod status;
mod supervise;
mod switchover;

pub use cluster::{Cluster, REPLICATION_USER, SUPERUSER};
pub use error::ClusterError;
pub use groups::{combine, existing_groups, observe_groups, open_groups, stop_groups};
pub use layout::Layout;
pub use progress::{Progress, SilentProgress};
pub use runfiles::{read_supervisor, supervisor_running, SupervisorLock};
pub use secrets::Secrets;
pub use state::ClusterState;
pub use status::{observe, observe_with, Observation, Probers};
pub use supervise::{supervise, Command, Gate, Links};
