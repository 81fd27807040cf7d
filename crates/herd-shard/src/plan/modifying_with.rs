//! Statements with a data-modifying `WITH` over distributed or reference tables: planned
//! part by part, answered on the one group every part runs on by its key.

use herd_sql::KeyFacts;

use super::{plan, ParamValue, Plan};
use crate::ShardMap;

/// The plan of a statement with a data-modifying `WITH` that reads or writes distributed or
/// reference table `t`: the one group every part runs on by its key, else refused — a part
/// on every group (or on another group) would write some groups' rows only, or read rows
/// the others' writes never see.
pub(super) fn modifying_with_plan(
    f: &KeyFacts,
    t: &str,
    shared: &[&str],
    map: &ShardMap,
    param: &dyn Fn(u32) -> ParamValue,
) -> Plan {
    let across = |why: &str| {
        Plan::Refuse(format!(
            "a data-modifying WITH (INSERT, UPDATE or DELETE inside WITH) on distributed or \
             reference table {t} runs only when every part of the statement is on one shard \
             group by its key ({why}): run the INSERT, UPDATE or DELETE as a statement of its \
             own (its RETURNING gives the rows), or add conditions on the shard key"
        ))
    };
    if f.with_parts.is_empty() {
        return across("its WITH is not at the top level");
    }
    // A distributed or reference table the statement reads through a view or a function is
    // in no part's tables: no part's plan would account for it.
    let named = |name: &str| {
        f.with_parts.iter().any(|p| {
            p.tables
                .iter()
                .chain(&p.inner_tables)
                .any(|t| crate::qualified(&t.name) == crate::qualified(name))
        })
    };
    if let Some(hidden) = shared.iter().find(|s| !named(s)) {
        return across(&format!("{hidden} is read through a view or function"));
    }
    let mut group = None;
    for part in &f.with_parts {
        let relations: Vec<String> = part
            .tables
            .iter()
            .chain(&part.inner_tables)
            .map(|t| t.name.clone())
            .collect();
        match plan(Some(part), &relations, map, param) {
            Plan::Anywhere => {}
            Plan::Group { group: g, .. } if group.is_none_or(|x| x == g) => group = Some(g),
            Plan::Group { .. } => return across("its parts are on different groups"),
            Plan::Refuse(why) | Plan::General { why } => return across(&why),
            Plan::WriteReference { .. } => return across("it writes a reference table"),
            _ => return across("a part runs on every group"),
        }
    }
    match group {
        Some(g) => Plan::Group {
            group: g,
            reason: "key",
        },
        None => across("no part names a key"),
    }
}
