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
    if f.concurrent {
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
    match BROADCAST_DDL.iter().find(|(k, _)| *k == kind) {
        Some(_) if kind == "GrantStmt" && f.revoke && grant_on_tables_only(f) => {
            Plan::Everywhere("REVOKE")
        }
        Some((_, tag)) if kind != "GrantStmt" || grant_on_tables_only(f) => Plan::Everywhere(tag),
        _ => Plan::Refuse(format!(
            "this statement on {table} would change the table's identity or its place in the \
             shard map; to RENAME it, first empty it and call herd.undistribute_table('{table}')"
        )),
    }
}

/// A GRANT/REVOKE whose every named object is a table (no mix with other objects).
fn grant_on_tables_only(f: &KeyFacts) -> bool {
    !f.tables.is_empty()
}
