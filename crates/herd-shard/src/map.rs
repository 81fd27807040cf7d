//! The shard map: which tables are distributed (by which key) or replicated to every group, and
//! which group holds each virtual shard.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{partition_hash, virtual_shard, KeyType, KeyValue};

/// Virtual shards of a new map: enough to spread over up to 32 groups, few enough to move.
pub const DEFAULT_SHARD_COUNT: u32 = 32;

/// How a table lives across the groups.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TableKind {
    /// Its rows are spread over the groups by the hash of one column.
    Distributed {
        /// The distribution column.
        column: String,
        /// Its type.
        key_type: KeyType,
    },
    /// Every group holds all its rows (small tables joined with distributed ones).
    Reference,
}

/// Tables and placement; identical on every group, changed atomically.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardMap {
    /// Bumped by every change, so a stale copy is recognisable.
    pub version: u64,
    /// Number of virtual shards (the modulus of the partition hash).
    pub shard_count: u32,
    /// The group of each virtual shard (index = shard).
    pub placement: Vec<u32>,
    /// Distributed and reference tables by qualified name (`schema.table`).
    pub tables: BTreeMap<String, TableKind>,
}

impl ShardMap {
    /// A map with no tables; shard `s` on group `s % groups`.
    pub fn new(groups: u32, shard_count: u32) -> ShardMap {
        let groups = groups.max(1);
        ShardMap {
            version: 1,
            shard_count: shard_count.max(1),
            placement: (0..shard_count.max(1)).map(|s| s % groups).collect(),
            tables: BTreeMap::new(),
        }
    }

    /// The virtual shard of a key.
    pub fn shard_of(&self, key: Option<&KeyValue>) -> u32 {
        virtual_shard(partition_hash(key), self.shard_count)
    }

    /// The group holding a key's rows.
    pub fn group_of(&self, key: Option<&KeyValue>) -> u32 {
        let shard = self.shard_of(key) as usize;
        self.placement.get(shard).copied().unwrap_or(0)
    }

    /// How many groups the placement uses.
    pub fn groups(&self) -> u32 {
        self.placement.iter().max().map_or(1, |g| g + 1)
    }

    /// A table by name: `schema.table`, or an unqualified name in schema `public`.
    pub fn table(&self, name: &str) -> Option<&TableKind> {
        self.tables.get(&qualified(name))
    }
}

/// `schema.table` for a possibly unqualified name (unqualified names are in `public`).
pub fn qualified(name: &str) -> String {
    if name.contains('.') {
        name.to_string()
    } else {
        format!("public.{name}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_round_robin_and_lookup() {
        let mut m = ShardMap::new(2, 32);
        assert_eq!(m.groups(), 2);
        assert_eq!(m.placement[..4], [0, 1, 0, 1]);
        m.tables.insert(
            "public.orders".into(),
            TableKind::Distributed {
                column: "customer_id".into(),
                key_type: KeyType::Int8,
            },
        );
        assert!(m.table("orders").is_some());
        assert!(m.table("public.orders").is_some());
        assert!(m.table("other.orders").is_none());
        let k = KeyValue::Int8(42);
        assert_eq!(m.group_of(Some(&k)), m.shard_of(Some(&k)) % 2);
        let json = serde_json::to_string(&m).expect("json");
        assert_eq!(serde_json::from_str::<ShardMap>(&json).expect("back"), m);
    }
}
