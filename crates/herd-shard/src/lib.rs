//! Sharding across shard groups: where a row lives and which groups a statement needs.
//!
//! Placement follows PostgreSQL's own hash partitioning: a key is hashed with the type's
//! extended hash function and the partition seed, exactly as `PARTITION BY HASH` and
//! `satisfies_hash_partition()` do, then `hash % shard_count` names one of a fixed number of
//! virtual shards, and the shard map says which group holds each shard. So PostgreSQL itself can
//! check where a row belongs, and a shard can later move as a unit. Everything here is pure.

mod columns;
mod copy;
mod hash;
mod map;
mod names;
mod plan;
mod script;
mod views;

pub use columns::{fill_insert_columns, qualify_columns};
pub use copy::{CopyError, CopyFormat, CopySplitter, Routed};
pub use hash::{partition_hash, shard_sql, virtual_shard, KeyType, KeyValue, ParseKeyError};
pub use map::{qualified, rebalance, ShardMap, ShardMove, TableKind, DEFAULT_SHARD_COUNT, PAUSED};
pub use names::{path_schemas, Body, Hidden, Names, SearchPath};
pub use plan::{
    param_type_alike, plan, plan_several, shared_object_plan, uniqueness_message, wrapped_plan,
    CopyIn, CopyOut, InsertSelect, ParamValue, Plan,
};
pub use script::{script, Control, ScriptStep};
pub use views::{
    reads_its_tables, view_reads_distributed, view_use, views_over_distributed, write_through_view,
    ViewUse,
};
