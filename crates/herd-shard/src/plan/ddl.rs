//! Planning of DDL and COPY on distributed and reference tables: which statements every group
//! runs (in a two-phase commit, or group by group), how a COPY is split or gathered, and what
//! is refused.

use herd_sql::KeyFacts;

use super::{CopyIn, CopyOut, Plan};
use crate::{ShardMap, TableKind};

/// DDL that keeps a table's name and rows where they are, so every group can run it as is:
/// (statement kind, command tag).
const BROADCAST_DDL: [(&str, &str); 5] = [
    ("IndexStmt", "CREATE INDEX"),
    ("AlterTableStmt", "ALTER TABLE"),
    ("TruncateStmt", "TRUNCATE TABLE"),
    ("GrantStmt", "GRANT"),
    ("CommentStmt", "COMMENT"),
];

/// COPY of a distributed or reference table.
fn copy_plan(copy: &herd_sql::CopyFacts, table: &str, map: &ShardMap) -> Plan {
    let Some(TableKind::Distributed { column, key_type }) = map.table(table) else {
        if !copy.from {
            // Every group holds the same rows.
            return Plan::Anywhere;
        }
        return Plan::Refuse(format!(
            "COPY of reference table {table} would need every shard group at once (not supported \
             yet): load it through each group (herd url --group G --primary)"
        ));
    };
    if !copy.from {
        if !copy.client_data || copy.filtered || !copy.other_options.is_empty() {
            return Plan::Refuse(format!(
                "COPY TO of distributed table {table} gathers every shard group's rows to \
                 STDOUT in the text, CSV or binary format with default delimiters, quoting and \
                 NULL (FORMAT and HEADER only)"
            ));
        }
        return Plan::CopyOut(CopyOut {
            table: table.to_string(),
            binary: copy.format == "binary",
            header: copy.header,
        });
    }
    let format = match copy.format.as_str() {
        "text" => crate::CopyFormat::Text,
        "csv" => crate::CopyFormat::Csv {
            header: copy.header,
        },
        "binary" => crate::CopyFormat::Binary,
        other => return Plan::Refuse(format!("COPY format {other} is unknown")),
    };
    if !copy.client_data || copy.filtered || !copy.other_options.is_empty() {
        return Plan::Refuse(format!(
            "COPY into distributed table {table} is split by key from STDIN in the text, CSV or \
             binary format with default delimiters, quoting and NULL (FORMAT and HEADER only)"
        ));
    }
    if !copy.columns.is_empty() && !copy.columns.iter().any(|c| c == column) {
        return Plan::Refuse(format!(
            "COPY into distributed table {table} must include its shard key column {column}"
        ));
    }
    Plan::CopyIn(CopyIn {
        table: table.to_string(),
        columns: copy.columns.clone(),
        key_column: column.clone(),
        key_type: *key_type,
        format,
    })
}

/// DDL naming a distributed or reference `table`.
pub(super) fn ddl_plan(f: &KeyFacts, table: &str, map: &ShardMap) -> Plan {
    if let Some(copy) = &f.copy {
        return copy_plan(copy, table, map);
    }
    let kind = f.utility.as_deref().unwrap_or("");
    let ddl = f.ddl.as_deref();
    if let Some(refusal) = ddl.and_then(|d| uniqueness_refusal(d, map)) {
        return refusal;
    }
    if let Some(refusal) = ddl.and_then(|d| key_change_refusal(d, map)) {
        return refusal;
    }
    if f.concurrent && kind == "IndexStmt" {
        let Some(index) = &f.index_name else {
            return Plan::Refuse(format!(
                "CREATE INDEX CONCURRENTLY on {table} needs an index name, so that a build that \
                 fails on one shard group can be dropped from the others: CREATE INDEX \
                 CONCURRENTLY <name> ON …"
            ));
        };
        let schema = table.rsplit_once('.').map(|(s, _)| format!("{s}."));
        return Plan::EachGroup {
            tag: "CREATE INDEX",
            undo: format!(
                "DROP INDEX CONCURRENTLY IF EXISTS {}{index}",
                schema.unwrap_or_default()
            ),
        };
    }
    if let Some(vacuum) = ddl.and_then(|d| d.vacuum) {
        return vacuum_plan(vacuum, f, table, map);
    }
    if kind == "DropStmt" && f.drop_type.as_deref() == Some("OBJECT_TABLE") {
        // Every named table must be on every group; its map entry goes with it.
        return match f.tables.iter().find(|t| map.table(&t.name).is_none()) {
            None => Plan::Everywhere("DROP TABLE"),
            Some(local) => Plan::Refuse(format!(
                "{} lives on shard group 0 only while {table} is on every group: drop them in \
                 separate statements",
                local.name
            )),
        };
    }
    if kind == "RenameStmt" {
        return rename_plan(ddl, table, map);
    }
    if kind == "CreateStmt" && ddl.is_some_and(|d| d.inherits) {
        return Plan::Refuse(format!(
            "CREATE TABLE … PARTITION OF (or INHERITS) {table} is not supported: {table} is on \
             every shard group and the new table would be on group 0 only; create the \
             partitions before distributing the table (herd.undistribute_table('{table}') \
             while it is empty, create them, then distribute it again)"
        ));
    }
    if kind == "ViewStmt" && reads_distributed(f, map) {
        // The catalog object, made on group 0 as written and never read there directly: a
        // read of it is answered over its global view (`herd_global.v_<oid>`, made from its
        // definition), see docs/sharding-general.md. (A temporary one is refused by the
        // caller, which knows the statement is temporary.)
        return Plan::Group {
            group: 0,
            reason: "view",
        };
    }
    if matches!(kind, "ViewStmt" | "CreateTableAsStmt") && !reads_distributed(f, map) {
        // Over reference tables only: group 0 holds every row, so a view or table made there
        // (which lives on group 0, like every table not distributed) answers as one server.
        return Plan::Group {
            group: 0,
            reason: "local_table",
        };
    }
    match BROADCAST_DDL.iter().find(|(k, _)| *k == kind) {
        Some(_) if kind == "GrantStmt" && f.revoke && grant_on_tables_only(f) => {
            Plan::Everywhere("REVOKE")
        }
        Some((_, tag)) if kind != "GrantStmt" || grant_on_tables_only(f) => Plan::Everywhere(tag),
        _ => Plan::Refuse(refusal(kind, table)),
    }
}

/// Statements on objects every group must share that name no table: `CREATE COLLATION` and
/// `DROP COLLATION`, and functions, procedures, aggregates, types, domains, schemas and
/// extensions (created, changed, dropped), in a database with distributed or reference
/// tables run on every group (all or none), so a column of such a table can be given the collation later (`ALTER
/// TABLE … TYPE … COLLATE`, which runs on every group). `None`: plan the statement as usual.
pub fn shared_object_plan(facts: Option<&KeyFacts>, map: &ShardMap) -> Option<Plan> {
    let f = facts?;
    if map.tables.is_empty() {
        // Nothing is on the other groups yet; distributing a table copies its collations.
        return None;
    }
    if f.ddl.as_deref().is_some_and(|d| d.creates_collation) {
        return Some(Plan::Everywhere("CREATE COLLATION"));
    }
    // Functions, types, domains, schemas and extensions: a statement on every group may use
    // them (a function in a read across groups), so every group has them.
    if let Some(tag) = f.shared_object {
        return Some(Plan::Everywhere(tag));
    }
    (f.utility.as_deref() == Some("DropStmt") && f.drop_type.as_deref() == Some("OBJECT_COLLATION"))
        .then_some(Plan::Everywhere("DROP COLLATION"))
}

/// A UNIQUE, PRIMARY KEY or EXCLUDE constraint, or a unique index, on a distributed table
/// that does not compare its shard key for equality: each group would enforce it over its
/// own rows only, so two groups could each accept the same value (one server raises 23505).
/// Refused, as Citus does. (`… USING INDEX` takes an existing unique index's columns, and
/// that index was checked when it was created.)
fn uniqueness_refusal(d: &herd_sql::DdlFacts, map: &ShardMap) -> Option<Plan> {
    let (target, column) = distributed_target(d, map)?;
    let u = d
        .uniqueness
        .iter()
        .find(|u| !u.using_index && !u.equal_columns.iter().any(|c| c == column))?;
    Some(Plan::Refuse(uniqueness_message(
        u.what,
        u.name.as_deref(),
        target,
        column,
        true,
    )))
}

/// The table an ALTER TABLE or CREATE INDEX changes, and its shard key, when it is
/// distributed.
fn distributed_target<'a>(
    d: &'a herd_sql::DdlFacts,
    map: &'a ShardMap,
) -> Option<(&'a str, &'a str)> {
    let target = d.target.as_deref()?;
    match map.table(target) {
        Some(TableKind::Distributed { column, .. }) => Some((target, column.as_str())),
        _ => None,
    }
}

/// `ALTER COLUMN key TYPE` or `DROP COLUMN key` on a distributed table: rows are placed by
/// the hash of the key's type, and the map names the column.
fn key_change_refusal(d: &herd_sql::DdlFacts, map: &ShardMap) -> Option<Plan> {
    let (table, column) = distributed_target(d, map)?;
    d.retyped_or_dropped.iter().any(|c| c == column).then(|| {
        Plan::Refuse(format!(
            "changing the type of, or dropping, the shard key column {table}.{column} is not \
             supported: each row's shard group follows from the key's value hashed by its \
             type, and the shard map names the column; add a new column instead (or, while \
             the table is empty, herd.undistribute_table('{table}') first)"
        ))
    })
}

/// Why a uniqueness without the shard key is refused, and what to do instead; `distributed`:
/// the table is distributed already (else it is being distributed).
pub fn uniqueness_message(
    what: &str,
    name: Option<&str>,
    table: &str,
    column: &str,
    distributed: bool,
) -> String {
    let named = name.map(|n| format!(" {n}")).unwrap_or_default();
    let reference = if distributed {
        format!(
            "herd.undistribute_table('{table}') while it is empty, then \
             herd.create_reference_table('{table}')"
        )
    } else {
        format!("herd.create_reference_table('{table}')")
    };
    format!(
        "{what}{named} on distributed table {table} does not include its shard key {column}: \
         each shard group would enforce it over its own rows only, so the same value could be \
         stored once per group; include {column} in it (with = for EXCLUDE), or keep the table \
         whole on every group as a reference table ({reference})"
    )
}

/// `VACUUM` (not in a transaction: group after group) or `ANALYZE` of distributed or
/// reference tables: every group runs it on its own rows. Running it again is harmless, so
/// a failure needs no undo.
fn vacuum_plan(vacuum: bool, f: &KeyFacts, table: &str, map: &ShardMap) -> Plan {
    let what = if vacuum { "VACUUM" } else { "ANALYZE" };
    if let Some(local) = f.tables.iter().find(|t| map.table(&t.name).is_none()) {
        return Plan::Refuse(format!(
            "this {what} names {} (on shard group 0 only) and {table} (on every group): run \
             them in separate statements",
            local.name
        ));
    }
    Plan::EachGroup {
        tag: what,
        undo: String::new(),
    }
}

/// `ALTER TABLE … RENAME`: a column or constraint is renamed on every group (but not the
/// shard key column, which the map names); the table itself keeps its name.
fn rename_plan(ddl: Option<&herd_sql::DdlFacts>, table: &str, map: &ShardMap) -> Plan {
    let rename_type = ddl.and_then(|d| d.rename_type.as_deref()).unwrap_or("");
    match (rename_type, ddl.and_then(|d| d.rename_column.as_ref())) {
        ("OBJECT_COLUMN", Some((old, _))) => match map.table(table) {
            Some(TableKind::Distributed { column, .. }) if column == old => Plan::Refuse(format!(
                "renaming the shard key column {table}.{old} is not supported: the shard \
                     map names it; keep its name (or, while the table is empty, \
                     herd.undistribute_table('{table}'), rename it, and distribute it again)"
            )),
            _ => Plan::Everywhere("ALTER TABLE"),
        },
        ("OBJECT_TABCONSTRAINT", _) => Plan::Everywhere("ALTER TABLE"),
        _ => Plan::Refuse(format!(
            "renaming {table} (or an object of it other than a column or constraint) is not \
             supported: the shard map names the table on every shard group; to rename the \
             table, first empty it and call herd.undistribute_table('{table}')"
        )),
    }
}

/// The refusal of a statement kind on a distributed or reference table that no group can
/// run for all: the construct, why, and what to do instead.
fn refusal(kind: &str, table: &str) -> String {
    match kind {
        "CreateTableAsStmt" => format!(
            "CREATE TABLE … AS (or CREATE MATERIALIZED VIEW) reading distributed table {table} is \
             not supported: \
             it would run on one shard group and keep that group's rows only (a materialized \
             view's REFRESH too); create the table, then fill it with INSERT … SELECT \
             (filtered by the shard key), or use a plain view (CREATE VIEW, read across \
             groups)"
        ),
        "PrepareStmt" => format!(
            "SQL PREPARE of a statement on {table} is supported only alone in a simple query: \
             the endpoint then keeps it and places each EXECUTE by its shard key, while a \
             server-side prepared statement (in a string of several statements, or through the \
             extended protocol) would run where it was prepared; send the PREPARE on its own, \
             or use your driver's prepared statements (Parse/Bind, placed per execution)"
        ),
        "DeclareCursorStmt" => format!(
            "DECLARE … CURSOR over {table} is not supported: a cursor lives on one server, \
             while {table}'s rows are on every shard group; run the SELECT itself (filtered by \
             the shard key, or across groups) and page with ORDER BY … LIMIT"
        ),
        "CopyStmt" => format!(
            "COPY (query) TO over {table} is not supported: the query would run on one shard \
             group only; use COPY {table} TO STDOUT (every group's rows), or run the query as \
             a SELECT"
        ),
        "CreatePolicyStmt" | "AlterPolicyStmt" => format!(
            "CREATE/ALTER POLICY on {table} is not supported: row-level security policies are \
             not carried to every shard group; restrict access with GRANT/REVOKE (which run on \
             every group), or keep the table on group 0 (herd.undistribute_table('{table}') \
             while it is empty)"
        ),
        "CreateTrigStmt" | "RuleStmt" => format!(
            "a trigger or rule on {table} is not supported: it would exist on shard group 0 \
             only, and fire for group 0's rows only"
        ),
        "AlterObjectSchemaStmt" => format!(
            "ALTER TABLE … SET SCHEMA of {table} is not supported: the shard map names the \
             table on every shard group; to move it, first empty it and call \
             herd.undistribute_table('{table}')"
        ),
        _ => format!(
            "this statement ({kind}) on {table} is not supported: {table} is on every shard \
             group and the statement would run on group 0 only; Herd runs CREATE INDEX, ALTER \
             TABLE, TRUNCATE, GRANT/REVOKE, COMMENT, VACUUM, ANALYZE and DROP TABLE on every \
             group"
        ),
    }
}

/// The statement names a distributed table.
fn reads_distributed(f: &KeyFacts, map: &ShardMap) -> bool {
    f.tables
        .iter()
        .any(|t| matches!(map.table(&t.name), Some(TableKind::Distributed { .. })))
}

/// A GRANT/REVOKE whose every named object is a table (no mix with other objects).
fn grant_on_tables_only(f: &KeyFacts) -> bool {
    !f.tables.is_empty()
}
