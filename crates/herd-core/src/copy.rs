//! The status of logical copies (`herd copy`), as the status document carries it.

use serde::{Deserialize, Serialize};

use crate::Lsn;

/// Where a logical copy is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CopyState {
    /// Tables are being copied initially.
    Copying,
    /// Every table copied; changes stream.
    Streaming,
    /// Paused by the operator (`herd copy pause`).
    Paused,
    /// Not working: see the reason.
    Broken,
}

impl CopyState {
    /// The word `herd status` and `/metrics` use.
    pub fn as_str(self) -> &'static str {
        match self {
            CopyState::Copying => "copying",
            CopyState::Streaming => "streaming",
            CopyState::Paused => "paused",
            CopyState::Broken => "broken",
        }
    }
}

/// One logical copy: where it comes from, where it goes, how far behind it is.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CopyStatus {
    /// Its name.
    pub name: String,
    /// The shard group it copies from.
    pub group: u32,
    /// The source database.
    pub database: String,
    /// The target, without its password.
    pub target: String,
    /// Its state.
    pub state: CopyState,
    /// Why it is broken, or a warning worth attention (a slot retaining much WAL); `null` when
    /// all is well.
    pub reason: Option<String>,
    /// The source's WAL not yet confirmed by the target, in bytes.
    pub lag_bytes: Option<u64>,
    /// The time the target's last confirmation trails the source (the walsender's
    /// `replay_lag`), in seconds.
    pub lag_seconds: Option<f64>,
    /// WAL the copy's slot keeps on the source, in bytes.
    pub retained_bytes: Option<u64>,
    /// Decoded change bytes sent to the target since the slot's statistics began
    /// (`pg_stat_replication_slots.total_bytes`).
    pub sent_bytes: Option<u64>,
    /// The position the target has confirmed.
    pub confirmed_lsn: Option<Lsn>,
    /// Every table of the copy.
    pub tables: Vec<TableCopyStatus>,
}

/// One table of a logical copy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TableCopyStatus {
    /// `schema.table`.
    pub table: String,
    /// `copying`, `streaming` (PostgreSQL's states i/d/f/s/r named for people).
    pub state: String,
    /// Rows in the target table (PostgreSQL's live-row estimate; while copying, the rows the
    /// initial copy has written so far).
    pub rows: Option<i64>,
}
