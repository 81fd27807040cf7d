//! INSERTs into distributed tables: `INSERT … VALUES` placed by each row's key (one group,
//! or split by key), and `INSERT … SELECT` placed on one group when its rows are certain to
//! belong there, else run by rows ([`Plan::InsertSelect`]).

use herd_sql::KeyFacts;

use super::{names, plan, same_hash, value_group, InsertSelect, ParamValue, Plan};
use crate::{KeyType, ShardMap, TableKind};

pub(super) type Dist<'a> = (&'a str, &'a str, KeyType);

pub(super) fn plan_insert(
    facts: &KeyFacts,
    relations: &[String],
    distributed: &[Dist<'_>],
    map: &ShardMap,
    param: &dyn Fn(u32) -> ParamValue,
) -> Plan {
    // The target (the first table of an INSERT's facts), which relations read may precede.
    let target = facts.tables.first().map(|t| crate::qualified(&t.name));
    let (table, column, key_type) = distributed
        .iter()
        .find(|d| Some(crate::qualified(d.0)) == target)
        .copied()
        .unwrap_or(distributed[0]);
    let Some(index) = facts.insert_columns.iter().position(|c| c == column) else {
        return Plan::Refuse(format!(
            "an INSERT into distributed table {table} must name its shard key column {column} \
             in its column list, with a value"
        ));
    };
    if facts.insert_select {
        return plan_insert_select(
            facts,
            relations,
            (table, column, key_type),
            index,
            map,
            param,
        );
    }
    if distributed.len() > 1 {
        return Plan::Refuse(format!(
            "this INSERT into distributed table {table} reads other distributed tables in a \
             subquery, whose rows may live on several shard groups"
        ));
    }
    if facts.insert_rows.is_empty() {
        return Plan::Refuse(format!(
            "an INSERT into distributed table {table} needs VALUES with its key {column}"
        ));
    }
    let mut groups = Vec::with_capacity(facts.insert_rows.len());
    for row in &facts.insert_rows {
        let Some(expr) = row.get(index) else {
            return Plan::Refuse(format!("a VALUES row lacks the key {column}"));
        };
        match value_group(expr, key_type, map, param) {
            Ok(g) => groups.push(g),
            Err(why) => return Plan::Refuse(format!("{why} for {table}.{column}")),
        }
    }
    if groups.windows(2).any(|w| w[0] != w[1]) {
        if facts.nested {
            return Plan::Refuse(format!(
                "this INSERT into {table} has rows for several shard groups and a subquery, CTE or \
                 ON CONFLICT expression; insert each group's rows separately"
            ));
        }
        return Plan::InsertSplit(groups);
    }
    Plan::Group {
        group: groups.first().copied().unwrap_or(0),
        reason: "key",
    }
}

/// `INSERT INTO t (…, key, …) SELECT …`: runs on one group when the SELECT does (its
/// distributed tables filtered by keys of that group) and every row's key is certain to belong
/// there: a constant of that group, or the key column of a co-located table the SELECT reads.
/// Otherwise the proxy runs the SELECT and sends each group its rows
/// ([`Plan::InsertSelect`]), when the SELECT alone can be answered: a plain SELECT (no set
/// operation, CTE or subquery) that one group answers or that every group answers in part.
fn plan_insert_select(
    facts: &KeyFacts,
    relations: &[String],
    (table, column, key_type): Dist<'_>,
    index: usize,
    map: &ShardMap,
    param: &dyn Fn(u32) -> ParamValue,
) -> Plan {
    let refuse = |why: &str| {
        Plan::Refuse(format!(
            "INSERT … SELECT into distributed table {table} is answered across shard groups              when its SELECT is a plain SELECT (no set operation, CTE or subquery): {why}"
        ))
    };
    let Some(source) = facts.source.as_deref() else {
        return refuse("the SELECT is a set operation or not a plain SELECT");
    };
    if facts.nested {
        return refuse("a CTE or subquery is present");
    }
    // The relations the SELECT reads: the target is among the statement's relations as
    // written to (a read of it by the SELECT is in the source's own facts).
    let read: Vec<String> = relations
        .iter()
        .filter(|r| crate::qualified(r) != crate::qualified(table))
        .cloned()
        .collect();
    let by_rows = |source: Option<u32>| {
        Plan::InsertSelect(InsertSelect {
            table: table.to_string(),
            key_column: column.to_string(),
            key_type,
            key_index: index,
            source,
        })
    };
    let read_group = match plan(Some(source), &read, map, param) {
        Plan::Group {
            group,
            reason: "key",
        } => Some(group),
        Plan::Anywhere => None,
        // A table of group 0 only: the SELECT runs there.
        Plan::Group { group, .. } => return by_rows(Some(group)),
        Plan::Refuse(why) | Plan::General { why } => return Plan::Refuse(why),
        Plan::AllGroups { .. } => return by_rows(None),
        _ => return refuse("the SELECT cannot be placed"),
    };
    let source_group = read_group.unwrap_or(0);
    let key_group = match source.targets.get(index) {
        Some(herd_sql::Target::Value(v)) => match value_group(v, key_type, map, param) {
            Ok(g) => g,
            Err(_) => return by_rows(Some(source_group)),
        },
        Some(herd_sql::Target::Column(qualifier, name)) => {
            let from = source.tables.iter().find(|t| {
                let keyed = matches!(
                    map.table(&t.name),
                    Some(TableKind::Distributed { column: c, key_type: k })
                        if c == name && same_hash(*k, key_type)
                );
                keyed
                    && match qualifier {
                        None => true,
                        Some(q) => names(t, q),
                    }
            });
            match (from, read_group) {
                (Some(_), Some(g)) => g,
                _ => return by_rows(Some(source_group)),
            }
        }
        Some(herd_sql::Target::Other) | None => return by_rows(Some(source_group)),
    };
    if read_group.is_some_and(|g| g != key_group) {
        return by_rows(Some(source_group));
    }
    Plan::Group {
        group: key_group,
        reason: "key",
    }
}
