//! Which shard group a statement runs on: a pure function of the statement's key facts, the
//! relations it reads, the shard map and the parameters of its execution. A statement the
//! planner cannot place on exactly one group with certainty is refused with a reason that
//! names the table and what would make it single-group; it is never sent somewhere on a guess.

use herd_sql::{KeyExpr, KeyFacts, StmtKind, TableRef};

use crate::{KeyType, KeyValue, ShardMap, TableKind};

mod ddl;
mod insert;
mod modifying_with;
mod wrapped;

use ddl::ddl_plan;
pub use ddl::{shared_object_plan, uniqueness_message};
use insert::{plan_insert, Dist};
use modifying_with::modifying_with_plan;
pub use wrapped::wrapped_plan;

/// A parameter's value as a Bind carries it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParamValue {
    /// Not known (a simple query has none; or the parameter does not exist).
    Missing,
    /// SQL NULL.
    Null,
    /// Text format.
    Text(Vec<u8>),
    /// Binary format.
    Binary(Vec<u8>),
    /// A value the client declared of this type (OID), which compares with the key through a
    /// conversion (`bpchar` drops trailing blanks, a float compares as a float): not read as
    /// a key.
    OtherType(u32),
}

/// Where a statement goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// It names no distributed table and no table that lives on group 0 only: any group can
    /// run it (the session's current one).
    Anywhere,
    /// Exactly this group.
    Group {
        /// The group.
        group: u32,
        /// Why (for metrics and EXPLAIN): `key` or `local_table`.
        reason: &'static str,
    },
    /// DDL on distributed or reference tables: every group runs it, all or none; the text
    /// is the command tag PostgreSQL answers it with.
    Everywhere(&'static str),
    /// DDL that cannot run inside a transaction (`CREATE INDEX CONCURRENTLY`): every group
    /// runs it in turn; if one fails, `undo` runs on every group it reached, so none keeps it.
    EachGroup {
        /// The command tag PostgreSQL answers it with.
        tag: &'static str,
        /// The statement that takes it back.
        undo: String,
    },
    /// `COPY … FROM STDIN` into a distributed table: rows split by key over every group.
    CopyIn(CopyIn),
    /// `COPY table TO STDOUT` of a distributed table: every group's rows, one group after
    /// the other.
    CopyOut(CopyOut),
    /// A SELECT of distributed tables (joined on their keys, if several) not restricted to one
    /// group: every group runs it and the proxy merges the rows (`herd_sql::fan_out` says how).
    AllGroups {
        /// The first distributed table it reads (for messages).
        table: String,
    },
    /// An UPDATE or DELETE of distributed tables (joined on their keys, if several) not
    /// restricted to one group: every group runs it, all or none (two-phase commit); the text
    /// is the command tag.
    WriteAllGroups(&'static str),
    /// An INSERT, UPDATE or DELETE of a reference table: every group applies it, all or none
    /// (the caller checks it is deterministic, so every copy stays the same).
    WriteReference {
        /// The reference table.
        table: String,
        /// The command tag (`INSERT 0`, `UPDATE`, `DELETE`).
        tag: &'static str,
        /// An INSERT's column list (empty: every column, or none named).
        columns: Vec<String>,
    },
    /// A multi-row INSERT … VALUES whose rows belong to several groups: the group of each row,
    /// in order (each group inserts its rows, all or none).
    InsertSplit(Vec<u32>),
    /// An INSERT … SELECT whose rows may belong to several groups: the proxy runs the SELECT,
    /// then each group inserts its rows (all or none).
    InsertSelect(InsertSelect),
    /// A read the fast paths cannot answer for want of a construct (a subquery, CTE or set
    /// operation over distributed tables, a join not on the key, a group-0 table joined with
    /// a distributed one): PostgreSQL answers it on group 0 over the global relations
    /// (`herd_global`, postgres_fdw), read-only. `why` is the fast path's refusal, given when
    /// the general path cannot take it either.
    General {
        /// The fast path's refusal.
        why: String,
    },
    /// Not runnable on one group; the message says why (SQLSTATE 0A000).
    Refuse(String),
}

impl Plan {
    /// Whether every shard group must run the statement, so a group being added must not miss
    /// it: reference-table writes and DDL. (Distributed tables' rows are on the groups their
    /// shards name, and a new group holds no shard yet.)
    pub fn reaches_every_group(&self) -> bool {
        matches!(
            self,
            Plan::WriteReference { .. } | Plan::Everywhere(_) | Plan::EachGroup { .. }
        )
    }
}

/// How to run an INSERT … SELECT whose rows may belong to several groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InsertSelect {
    /// The distributed table written, as written.
    pub table: String,
    /// Its distribution column.
    pub key_column: String,
    /// Its type.
    pub key_type: KeyType,
    /// The key's position among the SELECT's columns.
    pub key_index: usize,
    /// The group that runs the SELECT; `None`: every group runs it and the rows are put
    /// together (it reads distributed tables on every group).
    pub source: Option<u32>,
}

/// How to split a COPY into a distributed table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyIn {
    /// The table, as written.
    pub table: String,
    /// The COPY's column list (empty: the table's columns in order).
    pub columns: Vec<String>,
    /// The distribution column.
    pub key_column: String,
    /// Its type.
    pub key_type: KeyType,
    /// The data format.
    pub format: crate::CopyFormat,
}

/// How to gather a COPY out of a distributed table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyOut {
    /// The table, as written.
    pub table: String,
    /// The binary format (its header and trailer are sent once).
    pub binary: bool,
    /// A header line (text or CSV `HEADER`), sent once.
    pub header: bool,
}

/// Plans one statement. `facts` are its key facts (`None`: several statements or
/// unparsable), `relations` every relation it reads anywhere (as written), `param(n)` the
/// value of `$n`.
pub fn plan(
    facts: Option<&KeyFacts>,
    relations: &[String],
    map: &ShardMap,
    param: &dyn Fn(u32) -> ParamValue,
) -> Plan {
    let mut distributed = Vec::new();
    let mut local = Vec::new();
    let mut reference = Vec::new();
    // A DML target is not among the relations read: take the facts' tables too.
    let mut all: Vec<&String> = relations.iter().collect();
    for t in facts.into_iter().flat_map(|f| f.tables.iter()) {
        if !all
            .iter()
            .any(|r| crate::qualified(r) == crate::qualified(&t.name))
        {
            all.push(&t.name);
        }
    }
    // A CTE's name is not a table.
    let ctes: &[String] = facts.map_or(&[], |f| f.ctes.as_slice());
    for r in all.into_iter().filter(|r| !ctes.contains(r)) {
        match map.table(r) {
            Some(TableKind::Distributed { column, key_type }) => {
                distributed.push((r.as_str(), column.as_str(), *key_type))
            }
            Some(TableKind::Reference) => reference.push(r.as_str()),
            None => local.push(r.as_str()),
        }
    }
    // A data-modifying WITH writes rows of the tables it names, which no group holds all of
    // (distributed) or every group holds a copy of (reference): run on one group, it would
    // change that group's rows only.
    // Answered when each of its parts (each WITH query, and the rest) runs on one and the
    // same group by its key: that group holds every row it reads or writes.
    if let Some(f) = facts.filter(|f| f.modifying_cte) {
        if let Some(t) = distributed
            .first()
            .map(|d| d.0)
            .or(reference.first().copied())
        {
            let shared: Vec<&str> = distributed
                .iter()
                .map(|d| d.0)
                .chain(reference.iter().copied())
                .collect();
            return modifying_with_plan(f, t, &shared, map, param);
        }
    }
    // SELECT … INTO makes a table from rows of distributed tables: the new table would be
    // made on the one group that answered.
    if let Some(t) = facts
        .filter(|f| f.select_into)
        .and(distributed.first().map(|d| d.0))
    {
        return Plan::Refuse(format!(
            "SELECT … INTO reading distributed table {t} is not supported: the new table would \
             be made on one shard group from that group's rows; create the table, then \
             INSERT … SELECT (or distribute it and INSERT … SELECT by key)"
        ));
    }
    // GRANT/REVOKE on every table, sequence or function of a schema: each group applies it to
    // what it holds (the distributed tables' copies, their sequences; group 0 its own tables
    // too), so it runs everywhere.
    if let Some(f) = facts.filter(|f| f.all_in_schema && !map.tables.is_empty()) {
        return Plan::Everywhere(if f.revoke { "REVOKE" } else { "GRANT" });
    }
    if let Some(f) = facts.filter(|f| f.kind == StmtKind::Other) {
        if let Some(table) = distributed
            .first()
            .map(|d| d.0)
            .or(reference.first().copied())
        {
            return ddl_plan(f, table, map);
        }
    }
    let writes = facts.is_none_or(|f| f.kind != StmtKind::Select);
    if let (Some(r), true) = (reference.first(), writes) {
        if facts.is_some_and(|f| f.tables.first().is_some_and(|t| t.name == *r)) || facts.is_none()
        {
            let Some(f) = facts else {
                return Plan::Refuse(format!(
                    "a write to reference table {r} must be sent alone (not in a multi-statement \
                     string)"
                ));
            };
            if let Some(other) = distributed.first().map(|d| d.0).or(local.first().copied()) {
                return Plan::Refuse(format!(
                    "this write to reference table {r} reads {other}, whose rows are not on every \
                     shard group: every group's copy must come out the same"
                ));
            }
            return Plan::WriteReference {
                table: r.to_string(),
                tag: match f.kind {
                    StmtKind::Insert => "INSERT 0",
                    StmtKind::Update => "UPDATE",
                    _ => "DELETE",
                },
                columns: f.insert_columns.clone(),
            };
        }
    }
    if distributed.is_empty() {
        return if local.is_empty() {
            Plan::Anywhere
        } else {
            Plan::Group {
                group: 0,
                reason: "local_table",
            }
        };
    }
    let table = distributed[0].0;
    let Some(facts) = facts else {
        return Plan::Refuse(format!(
            "a statement on distributed table {table} must be sent alone (not in a multi-statement \
             string) so its shard key can be read"
        ));
    };
    if let Some(l) = local.first() {
        return general_if_read(
            facts,
            format!(
            "{l} is not distributed and lives on shard group 0 only, while rows of distributed \
             table {table} live on every group: distribute {l} on the same key, or make it a \
             reference table (herd.create_reference_table)"
        ),
        );
    }
    match facts.kind {
        StmtKind::Other => Plan::Refuse(format!(
            "this statement on distributed table {table} cannot run on one shard group; \
             statements on distributed tables are SELECT, INSERT, UPDATE and DELETE by key"
        )),
        StmtKind::Insert => plan_insert(facts, relations, &distributed, map, param),
        StmtKind::Select | StmtKind::Update | StmtKind::Delete => {
            plan_by_conditions(facts, &distributed, map, param)
        }
    }
}

/// The plan of a query string of several statements, from each statement's plan: they arrive
/// together and run together, so they must all run on one group; anything that needs every
/// group must come alone.
pub fn plan_several(plans: impl IntoIterator<Item = Plan>) -> Plan {
    let mut one: Option<Plan> = None;
    for p in plans {
        match p {
            Plan::Anywhere => {}
            Plan::Group { group, .. } => match &one {
                Some(Plan::Group { group: first, .. }) if *first != group => {
                    return Plan::Refuse(format!(
                        "the statements of this query string belong to different shard groups \
                         ({first} and {group}): send them separately"
                    ))
                }
                Some(_) => {}
                None => one = Some(p),
            },
            // The general path takes a statement sent alone.
            Plan::Refuse(why) | Plan::General { why } => return Plan::Refuse(why),
            _ => {
                return Plan::Refuse(
                    "a statement of this query string runs on every shard group (DDL, COPY, or \
                     a statement without a shard key of one group): send it alone"
                        .into(),
                )
            }
        }
    }
    one.unwrap_or(Plan::Anywhere)
}

/// A conversion to type `to` (as [`KeyExpr::Cast`] names it) leaves a value compared with a
/// key of `key_type` as written: the key's own type, or an integer of another width.
fn converts_alike(to: &str, key_type: KeyType) -> bool {
    match key_type {
        KeyType::Int2 | KeyType::Int4 | KeyType::Int8 => matches!(to, "int2" | "int4" | "int8"),
        KeyType::Text => matches!(to, "text" | "varchar"),
        KeyType::Uuid => to == "uuid",
    }
}

/// Parameter types (OIDs) whose values are read as a key of `key_type` as they are sent:
/// unspecified (the server gives it the key's type), `unknown`, or the key's own types.
pub fn param_type_alike(oid: u32) -> bool {
    // 0 unspecified, 705 unknown, 20/21/23 integers, 25 text, 1043 varchar, 2950 uuid.
    matches!(oid, 0 | 705 | 20 | 21 | 23 | 25 | 1043 | 2950)
}

/// Key types whose equal values hash alike (PostgreSQL's integer hashes agree across widths).
fn same_hash(a: KeyType, b: KeyType) -> bool {
    let int = |t| matches!(t, KeyType::Int2 | KeyType::Int4 | KeyType::Int8);
    a == b || (int(a) && int(b))
}

fn plan_by_conditions(
    facts: &KeyFacts,
    distributed: &[Dist<'_>],
    map: &ShardMap,
    param: &dyn Fn(u32) -> ParamValue,
) -> Plan {
    if facts.kind == StmtKind::Update {
        let (table, column, _) = distributed[0];
        if facts.set_columns.iter().any(|c| c == column) {
            return Plan::Refuse(format!(
                "UPDATE of the shard key {table}.{column} would move the row to another group; \
                 delete it and insert it again instead"
            ));
        }
    }
    // Each distributed table's group: from a condition on its own key, or (joined on the key)
    // from a co-located table's.
    let mut group = None;
    // A SELECT whose keys belong to several groups runs on all of them.
    let mut spans = false;
    let mut resolved: Vec<(&TableRef, &str, KeyType, Option<u32>)> = Vec::new();
    let same = |a: &str, b: &str| crate::qualified(a) == crate::qualified(b);
    for (table, column, _) in distributed {
        // Read in a subquery, CTE or set operation (also when read at the top level too): its
        // rows there cannot be tied to a condition, nor to the group of the top level.
        let top = facts.tables.iter().any(|t| same(&t.name, table));
        let inner = facts
            .inner_tables
            .iter()
            .any(|t| same(&t.name, table) && !facts.ctes.contains(&t.name));
        if !top || inner {
            return general_if_read(
                facts,
                format!(
                    "distributed table {table} is read in a subquery, join or CTE (or a UNION, \
                 INTERSECT or EXCEPT); such queries span shard groups (not supported yet): filter \
                 {table} by its key {column} at the top level"
                ),
            );
        }
    }
    // Each top-level reference of a distributed table (a self-join has two).
    let refs: Vec<(&TableRef, &str, KeyType)> = facts
        .tables
        .iter()
        .filter_map(|t| match map.table(&t.name) {
            Some(TableKind::Distributed { column, key_type }) => {
                Some((t, column.as_str(), *key_type))
            }
            _ => None,
        })
        .collect();
    for (tref, column, key_type) in refs {
        let table = tref.name.as_str();
        let only_one = facts.tables.len() == 1;
        let cond = facts.conditions.iter().find(|c| {
            c.column == *column
                && match &c.qualifier {
                    None => only_one,
                    Some(q) => names(tref, q),
                }
        });
        let mut own = None;
        for v in cond.map(|c| c.values.as_slice()).unwrap_or_default() {
            let g = match value_group(v, key_type, map, param) {
                Ok(g) => g,
                Err(why) => return Plan::Refuse(format!("{why} for {table}.{column}")),
            };
            if group.is_some_and(|x| x != g) {
                if matches!(
                    facts.kind,
                    StmtKind::Select | StmtKind::Update | StmtKind::Delete
                ) {
                    spans = true;
                    continue;
                }
                return Plan::Refuse(format!(
                    "the keys of this statement on {table} belong to several shard groups \
                     (not supported yet): query each key separately"
                ));
            }
            group = Some(g);
            own = Some(g);
        }
        resolved.push((tref, column, key_type, own));
    }
    // Joined on the key to a table whose group is known: the same group (its joined rows have
    // the same key). Repeated so that chains of joins resolve.
    loop {
        let mut changed = false;
        for i in 0..resolved.len() {
            if resolved[i].3.is_some() {
                continue;
            }
            let (tref, column, key_type, _) = resolved[i];
            let is_key = |c: &herd_sql::ColumnName, t: &TableRef, col: &str| {
                c.1 == col && c.0.as_deref().is_some_and(|q| names(t, q))
            };
            let found = resolved.iter().find_map(|(u, ucol, utype, g)| {
                let g = (*g)?;
                let linked = facts.equalities.iter().any(|(a, b)| {
                    (is_key(a, tref, column) && is_key(b, u, ucol))
                        || (is_key(b, tref, column) && is_key(a, u, ucol))
                });
                (linked && same_hash(key_type, *utype)).then_some(g)
            });
            if let Some(g) = found {
                resolved[i].3 = Some(g);
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    let unresolved = resolved.iter().find(|r| r.3.is_none());
    if spans || unresolved.is_some() {
        if let Some(why) = outer_join_spans(facts, map) {
            return general_if_read(facts, why);
        }
        return match not_colocated(facts, &resolved) {
            None if facts.kind == StmtKind::Select => Plan::AllGroups {
                table: distributed[0].0.to_string(),
            },
            None => Plan::WriteAllGroups(if facts.kind == StmtKind::Update {
                "UPDATE"
            } else {
                "DELETE"
            }),
            Some(table) => general_if_read(
                facts,
                format!(
                "distributed table {table} is not joined on its shard key to the other distributed \
                 tables of this query, so matching rows may live on different shard groups (a join \
                 on a non-key column between distributed tables is not supported): join them on \
                 their keys, or make {table} a reference table"
            ),
            ),
        };
    }
    if let Some((tref, column, _, _)) = unresolved {
        let table = &tref.name;
        return Plan::Refuse(format!(
            "this statement on distributed table {table} has no condition on its shard key \
             {column}, so it would need every shard group (not supported yet): add \
             WHERE {column} = <value> (or IN (…) within one group), or join it on its key to a \
             co-located table that has one"
        ));
    }
    Plan::Group {
        group: group.unwrap_or(0),
        reason: "key",
    }
}

/// Why the general path takes no write (`UPDATE … FROM`, `DELETE … USING`, subqueries,
/// data-modifying WITH across groups): appended to such a refusal.
const NO_GENERAL_WRITE: &str = "; a write whose rows span shard groups is not run \
     through the general path: it would read them in one transaction (postgres_fdw's, one \
     snapshot per group) and write them in others, which one server's single statement never \
     does (a row changed in between would be written from a stale read) — run the read as a \
     SELECT and write by key";

/// A refusal for want of a construct: a SELECT takes the general path (group 0, over every
/// group's rows), anything else is refused with `why` (and why the general path does not
/// take it).
fn general_if_read(facts: &KeyFacts, why: String) -> Plan {
    if facts.kind == StmtKind::Select && !facts.select_into && !facts.modifying_cte {
        Plan::General { why }
    } else if matches!(facts.kind, StmtKind::Update | StmtKind::Delete) || facts.modifying_cte {
        Plan::Refuse(format!("{why}{NO_GENERAL_WRITE}"))
    } else {
        Plan::Refuse(why)
    }
}

/// The first distributed table not linked to the first one by equalities of shard keys of
/// the same hash (directly or through others): its rows may meet rows of another group.
fn not_colocated<'a>(
    facts: &KeyFacts,
    resolved: &[(&'a TableRef, &str, KeyType, Option<u32>)],
) -> Option<&'a str> {
    let mut linked = vec![false; resolved.len()];
    if let Some(first) = linked.first_mut() {
        *first = true;
    }
    let is_key = |c: &herd_sql::ColumnName, t: &TableRef, col: &str| {
        c.1 == col && c.0.as_deref().is_some_and(|q| names(t, q))
    };
    loop {
        let mut changed = false;
        for i in 0..resolved.len() {
            if linked[i] {
                continue;
            }
            let (t, col, ty, _) = resolved[i];
            let joined = resolved.iter().enumerate().any(|(j, (u, ucol, uty, _))| {
                linked[j]
                    && same_hash(ty, *uty)
                    && facts.equalities.iter().any(|(a, b)| {
                        (is_key(a, t, col) && is_key(b, u, ucol))
                            || (is_key(b, t, col) && is_key(a, u, ucol))
                    })
            });
            if joined {
                linked[i] = true;
                changed = true;
            }
        }
        if !changed {
            break;
        }
    }
    resolved
        .iter()
        .zip(&linked)
        .find(|(_, l)| !**l)
        .map(|((t, ..), _)| t.name.as_str())
}

/// Why an outer join cannot run on every group and be concatenated: a preserved side that
/// holds no distributed table (a reference table, a function, `VALUES`) has all its rows on
/// every group, so each group would return its unmatched rows once. `None`: every preserved
/// side is split over the groups with the rows it is joined to.
fn outer_join_spans(facts: &KeyFacts, map: &ShardMap) -> Option<String> {
    let distributed =
        |t: &TableRef| matches!(map.table(&t.name), Some(TableKind::Distributed { .. }));
    facts.outer_joins.iter().find_map(|side| {
        if side.preserved.iter().any(distributed) {
            return None;
        }
        let other = side.other.iter().find(|t| distributed(t))?;
        let kept = side
            .preserved
            .first()
            .map_or("a function or VALUES list".to_string(), |t| t.name.clone());
        Some(format!(
            "{kept} is on the preserved side of an outer join with distributed table {}, which \
             every shard group would answer with {kept}'s unmatched rows: filter {} by its shard \
             key to read one group, or write the join the other way round (the distributed \
             table on the preserved side)",
            other.name, other.name
        ))
    })
}

/// `qualifier` names the table reference `t` (its alias, or its name when it has none).
fn names(t: &TableRef, qualifier: &str) -> bool {
    Some(qualifier) == t.alias.as_deref()
        || (t.alias.is_none()
            && (qualifier == t.name || t.name.ends_with(&format!(".{qualifier}"))))
}

fn value_group(
    expr: &KeyExpr,
    key_type: KeyType,
    map: &ShardMap,
    param: &dyn Fn(u32) -> ParamValue,
) -> Result<u32, String> {
    let value: Option<KeyValue> = match expr {
        KeyExpr::Const(None) => None,
        KeyExpr::Const(Some(text)) => Some(key_type.parse(text).map_err(|e| e.to_string())?),
        KeyExpr::Cast(inner, to) if converts_alike(to, key_type) => {
            return value_group(inner, key_type, map, param)
        }
        KeyExpr::Cast(_, to) => {
            return Err(format!(
                "the value compared with the shard key is converted to {to}, which may change \
                 it or compare it otherwise than as a {key_type}: compare the key with a value \
                 of its own type"
            ))
        }
        KeyExpr::Param(n) => match param(*n) {
            ParamValue::Null => None,
            ParamValue::Text(t) => {
                let text =
                    String::from_utf8(t).map_err(|_| "a key that is not UTF-8 text".to_string())?;
                Some(key_type.parse(&text).map_err(|e| e.to_string())?)
            }
            ParamValue::Binary(b) => Some(key_type.decode_binary(&b).map_err(|e| e.to_string())?),
            ParamValue::Missing => return Err(format!("parameter ${n} has no value")),
            ParamValue::OtherType(oid) => {
                return Err(format!(
                    "parameter ${n} is declared of type OID {oid}, which compares with a \
                     {key_type} key through a conversion: declare it as the key's type (or \
                     leave its type to the server)"
                ))
            }
        },
        KeyExpr::Other => {
            return Err("the shard key must be compared with a constant or a parameter".into())
        }
    };
    Ok(map.group_of(value.as_ref()))
}

#[cfg(test)]
mod tests;
