//! The shard map: which tables are distributed (by which key) or replicated to every group, and
//! which group holds each virtual shard.

use std::collections::{BTreeMap, BTreeSet};

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
    /// Shards moving between groups, by shard: both groups hold rows of the shard meanwhile,
    /// and the rows of the group that does not serve it are hidden from every statement.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub moves: BTreeMap<u32, ShardMove>,
    /// Shards whose statements wait (the switch of a move): never stored, only in the proxy's
    /// copy of the map while the switch lasts.
    #[serde(skip)]
    pub paused: BTreeSet<u32>,
}

/// A shard on its way from one group to another (`herd shards move`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardMove {
    /// The group it leaves.
    pub from: u32,
    /// The group it goes to. The move has switched once the placement names it: the rows
    /// left on `from` are then hidden until deleted; before, the rows copied to `to` are.
    pub to: u32,
}

/// The group of a paused shard: a statement planned there waits for the switch to end.
pub const PAUSED: u32 = u32::MAX;

impl ShardMap {
    /// A map with no tables; shard `s` on group `s % groups`.
    pub fn new(groups: u32, shard_count: u32) -> ShardMap {
        let groups = groups.max(1);
        ShardMap {
            version: 1,
            shard_count: shard_count.max(1),
            placement: (0..shard_count.max(1)).map(|s| s % groups).collect(),
            tables: BTreeMap::new(),
            moves: BTreeMap::new(),
            paused: BTreeSet::new(),
        }
    }

    /// The shards whose rows on `group` no statement may see: copies made for a move that has
    /// not switched yet (on the target), or rows a switched move has not deleted yet (on the
    /// source).
    pub fn hidden_on(&self, group: u32) -> Vec<u32> {
        self.moves
            .iter()
            .filter(|(s, m)| {
                if self.switched(**s) {
                    m.from == group
                } else {
                    m.to == group
                }
            })
            .map(|(s, _)| *s)
            .collect()
    }

    /// Whether the move of `shard` has switched: the placement names its target.
    pub fn switched(&self, shard: u32) -> bool {
        self.moves
            .get(&shard)
            .is_some_and(|m| self.placement.get(shard as usize) == Some(&m.to))
    }

    /// The distributed tables: name, key column, key type.
    pub fn distributed(&self) -> impl Iterator<Item = (&str, &str, KeyType)> {
        self.tables.iter().filter_map(|(t, k)| match k {
            TableKind::Distributed { column, key_type } => {
                Some((t.as_str(), column.as_str(), *key_type))
            }
            TableKind::Reference => None,
        })
    }

    /// SQL computing, inside PostgreSQL, the virtual shard of key column `column` (of the row
    /// `row`, e.g. a trigger's `NEW`, when given).
    pub fn key_shard_sql(&self, column: &str, key_type: KeyType, row: Option<&str>) -> String {
        let quoted = format!("\"{}\"", column.replace('"', "\"\""));
        let expr = match row {
            Some(r) => format!("{r}.{quoted}"),
            None => quoted,
        };
        crate::shard_sql(&expr, key_type, self.shard_count)
    }

    /// Whether any group hides rows (a move is under way).
    pub fn hides_rows(&self) -> bool {
        !self.moves.is_empty()
    }

    /// Whether a statement planned as `plan` must wait for a paused shard's switch: one whose
    /// key is in it, and every write that is not by key (it may touch it).
    pub fn waits(&self, plan: &crate::Plan) -> bool {
        use crate::Plan;
        if self.paused.is_empty() {
            return false;
        }
        match plan {
            Plan::Group { group, .. } => *group == PAUSED,
            Plan::InsertSplit(groups) => groups.contains(&PAUSED),
            Plan::WriteAllGroups(_) | Plan::CopyIn(_) | Plan::InsertSelect(_) => true,
            _ => false,
        }
    }

    /// The virtual shard of a key.
    pub fn shard_of(&self, key: Option<&KeyValue>) -> u32 {
        virtual_shard(partition_hash(key), self.shard_count)
    }

    /// The group holding a key's rows.
    pub fn group_of(&self, key: Option<&KeyValue>) -> u32 {
        let shard = self.shard_of(key);
        if self.paused.contains(&shard) {
            return PAUSED;
        }
        self.placement.get(shard as usize).copied().unwrap_or(0)
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

/// The moves (shard, from, to) that spread `placement` evenly over `groups` groups: each group
/// ends with ⌊shards / groups⌋ or one more, the fewest shards move, and each move takes the
/// highest-numbered shard of the group with the most to the group with the fewest (ties to the
/// lower group), so the plan is the same every time.
pub fn rebalance(placement: &[u32], groups: u32) -> Vec<(u32, u32, u32)> {
    let groups = groups.max(1);
    let mut placement = placement.to_vec();
    let mut moves = Vec::new();
    loop {
        let count = |g: u32| placement.iter().filter(|p| **p == g).count();
        let (most, least) = (0..groups).fold((0, 0), |(most, least), g| {
            (
                if count(g) > count(most) { g } else { most },
                if count(g) < count(least) { g } else { least },
            )
        });
        // Shards on groups beyond `groups` go first (they have nowhere to stay).
        let stray = placement.iter().rposition(|p| *p >= groups);
        let (shard, from, to) = match stray {
            Some(s) => (s, placement[s], least),
            None if count(most) > count(least) + 1 => {
                match placement.iter().rposition(|p| *p == most) {
                    Some(s) => (s, most, least),
                    None => break,
                }
            }
            None => break,
        };
        placement[shard] = to;
        moves.push((shard as u32, from, to));
    }
    moves
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
        // A map stored before moves existed reads as one without moves.
        assert!(!json.contains("moves"));
        m.tables.insert("public.plans".into(), TableKind::Reference);
        let d: Vec<_> = m.distributed().collect();
        assert_eq!(d, vec![("public.orders", "customer_id", KeyType::Int8)]);
        let sql = m.key_shard_sql("customer_id", KeyType::Int8, Some("NEW"));
        assert!(
            sql.contains("hashint8extended(NEW.\"customer_id\", "),
            "{sql}"
        );
        assert!(sql.ends_with("% 32)::int"), "{sql}");
    }

    #[test]
    fn rebalance_spreads_evenly_with_the_fewest_moves() {
        // 32 shards on 2 groups, a third group added: 10 or 11 each, 10 moves, all to group 2.
        let two = ShardMap::new(2, 32).placement;
        let moves = rebalance(&two, 3);
        assert_eq!(moves.len(), 10);
        assert!(moves.iter().all(|(_, _, to)| *to == 2));
        let mut after = two.clone();
        for (s, from, to) in &moves {
            assert_eq!(after[*s as usize], *from);
            after[*s as usize] = *to;
        }
        for g in 0..3 {
            let n = after.iter().filter(|p| **p == g).count();
            assert!((10..=11).contains(&n), "group {g}: {n}");
        }
        // Already even: nothing; deterministic.
        assert!(rebalance(&two, 2).is_empty());
        assert_eq!(rebalance(&two, 3), moves);
        // Uneven after hand-made moves: back to 16/16 in two moves.
        let mut uneven = two.clone();
        uneven[0] = 1;
        uneven[2] = 1;
        assert_eq!(rebalance(&uneven, 2).len(), 2);
        // A shard on a group that is not counted moves.
        assert_eq!(rebalance(&[0, 1, 2], 2), vec![(2, 2, 0)]);
        // Cases: (placement, groups, moves).
        let cases: [(&[u32], u32, usize); 4] = [
            (&[0, 0, 0, 0], 2, 2),
            (&[0, 0, 0, 0], 4, 3),
            (&[0, 1, 0, 1], 1, 2),
            (&[], 3, 0),
        ];
        for (placement, groups, n) in cases {
            assert_eq!(
                rebalance(placement, groups).len(),
                n,
                "{placement:?} on {groups}"
            );
        }
    }

    #[test]
    fn moves_hide_rows_on_the_group_that_does_not_serve_them() {
        let mut m = ShardMap::new(3, 8);
        m.moves.insert(2, ShardMove { from: 2, to: 0 });
        m.moves.insert(4, ShardMove { from: 1, to: 2 });
        // Shard 4 has switched: the placement names its target.
        m.placement[4] = 2;
        assert_eq!(m.hidden_on(0), vec![2]);
        assert_eq!(m.hidden_on(1), vec![4]);
        assert_eq!(m.hidden_on(2), Vec::<u32>::new());
        assert!(m.hides_rows());
        assert!(m.switched(4) && !m.switched(2) && !m.switched(5));
        let json = serde_json::to_string(&m).expect("json");
        assert_eq!(serde_json::from_str::<ShardMap>(&json).expect("back"), m);
    }

    #[test]
    fn a_paused_shard_makes_its_statements_and_writes_without_key_wait() {
        use crate::Plan;
        let mut m = ShardMap::new(2, 8);
        let key = (0..1000)
            .map(KeyValue::Int8)
            .find(|k| m.shard_of(Some(k)) == 3)
            .expect("a key of shard 3");
        let other = (0..1000)
            .map(KeyValue::Int8)
            .find(|k| m.shard_of(Some(k)) == 5)
            .expect("a key of shard 5");
        let on = |g| Plan::Group {
            group: g,
            reason: "key",
        };
        assert!(!m.waits(&Plan::WriteAllGroups("UPDATE")));
        m.paused.insert(3);
        assert_eq!(m.group_of(Some(&key)), PAUSED);
        assert_eq!(m.group_of(Some(&other)), 1);
        let cases = [
            (on(PAUSED), true),
            (on(1), false),
            (Plan::InsertSplit(vec![0, PAUSED]), true),
            (Plan::InsertSplit(vec![0, 1]), false),
            (Plan::WriteAllGroups("UPDATE"), true),
            (Plan::AllGroups { table: "t".into() }, false),
            (Plan::Anywhere, false),
        ];
        for (plan, waits) in cases {
            assert_eq!(m.waits(&plan), waits, "{plan:?}");
        }
        // The pause is never stored.
        let json = serde_json::to_string(&m).expect("json");
        assert!(serde_json::from_str::<ShardMap>(&json)
            .expect("back")
            .paused
            .is_empty());
    }
}
