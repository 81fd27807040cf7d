//! Domain types shared by every Herd crate. Pure data and parsing; no I/O.

mod archive;
mod commit;
mod consistency;
mod copy;
mod event;
mod lsn;
mod node;
pub mod ports;
mod status;
mod topology;

pub use archive::ArchiveStatus;
pub use commit::{CommitMode, ParseError, SyncMethod, SyncStandbys};
pub use consistency::{Consistency, PoolMode};
pub use copy::{CopyState, CopyStatus, TableCopyStatus};
pub use event::{unix_ms, ClusterEvent, EventKind, EventSink};
pub use lsn::Lsn;
pub use node::{NodeName, Role};
pub use status::{
    ClusterStatus, LagInfo, NodeState, NodeStatus, SupervisorInfo, SyncState, STATUS_VERSION,
};
pub use topology::{Assignment, Endpoint};
