//! The general path's statement: a read the fast paths cannot answer across shard groups runs
//! on the coordinating group (group 0), where each distributed table has a global relation
//! over every group's rows (`herd_global.…`, postgres_fdw foreign tables). Every read of a
//! distributed table is pointed at its global relation, by name at its place in the text
//! (`FROM orders o` → `FROM herd_global.t_16384 o`, `FROM orders` → `FROM
//! herd_global.t_16384 AS orders`): the rest of the text stays the client's own, so column
//! names, literals and comments come out exactly as written.
//!
//! Only a plain read qualifies: one SELECT (or VALUES/set operation; or a `DECLARE` without
//! `WITH HOLD` or a `COPY (…) TO STDOUT` of one), without `INTO` and
//! without `FOR UPDATE`/`FOR SHARE` (row locks through postgres_fdw would be taken in
//! transactions of its own, not the client's). Anything else is an error, never a statement
//! that reads part of the rows.

use pg_query::protobuf::node;
use serde_json::Value;

use crate::hide::{name_end, names_of, quote_ident, scan};
use crate::wrapped::CURSOR_OPT_HOLD;

/// `sql` with every read of a table that `global(schema, name)` maps (`schema` as written,
/// `None` when unqualified) replaced by the relation it returns (SQL text, already quoted).
/// A name of a `WITH` query is not a table. `Err` with the reason when `sql` is not one plain
/// read, or a mapped name cannot be found in the text.
pub fn globalize(
    sql: &str,
    global: &dyn Fn(Option<&str>, &str) -> Option<String>,
) -> Result<String, String> {
    let parsed = pg_query::parse(sql, 0).map_err(|e| e.to_string())?;
    let [raw] = parsed.protobuf.stmts.as_slice() else {
        return Err("the general path runs one statement at a time".into());
    };
    let select = |q: &Option<Box<pg_query::protobuf::Node>>| {
        matches!(
            q.as_deref().and_then(|n| n.node.as_ref()),
            Some(node::Node::SelectStmt(_))
        )
    };
    // A read, or a statement that wraps one and keeps its rows within the client's session:
    // a cursor of the transaction (not WITH HOLD: it would outlive the transaction on one
    // server connection), COPY of the rows to the client.
    let plain = match raw.stmt.as_ref().and_then(|s| s.node.as_ref()) {
        Some(node::Node::SelectStmt(_)) => true,
        Some(node::Node::DeclareCursorStmt(d)) => {
            d.options & CURSOR_OPT_HOLD == 0 && select(&d.query)
        }
        Some(node::Node::CopyStmt(c)) => {
            !c.is_from && c.filename.is_empty() && !c.is_program && select(&c.query)
        }
        _ => false,
    };
    if !plain {
        return Err(
            "the general path runs reads only (a SELECT, a cursor declared without \
             WITH HOLD, COPY (SELECT …) TO STDOUT)"
                .into(),
        );
    }
    let tree = serde_json::to_value(&parsed.protobuf.stmts).map_err(|e| e.to_string())?;
    let mut refusal = None;
    scan(&tree, &mut |n| {
        if let Some(s) = n.get("SelectStmt") {
            let nonempty = |field: &str| match s.get(field) {
                Some(Value::Array(a)) => !a.is_empty(),
                Some(Value::Null) | None => false,
                Some(_) => true,
            };
            if nonempty("locking_clause") {
                refusal = Some("FOR UPDATE/SHARE");
            } else if nonempty("into_clause") {
                refusal = Some("SELECT … INTO");
            }
        }
    });
    if let Some(what) = refusal {
        return Err(format!(
            "{what} is not supported on the general path (it is read-only and takes no row locks)"
        ));
    }
    let ctes = names_of(&tree, "ctename");
    let mut reads: Vec<(usize, String, Option<String>)> = Vec::new();
    scan(&tree, &mut |n| {
        let Some(rv) = n.get("RangeVar") else {
            return;
        };
        let Some(relname) = rv.get("relname").and_then(Value::as_str) else {
            return;
        };
        let schema = rv
            .get("schemaname")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty());
        if schema.is_none() && ctes.iter().any(|c| c == relname) {
            return;
        }
        let Some(to) = global(schema, relname) else {
            return;
        };
        let Some(start) = rv.get("location").and_then(Value::as_u64) else {
            return;
        };
        let aliased = rv.get("alias").is_some_and(|a| !a.is_null());
        let alias = (!aliased).then(|| format!(" AS {}", quote_ident(relname)));
        reads.push((start as usize, to, alias));
    });
    reads.sort_by_key(|r| std::cmp::Reverse(r.0));
    let mut text = sql.to_string();
    for (start, to, alias) in reads {
        let end = name_end(&text, start)
            .ok_or_else(|| "cannot find a distributed table's name in the statement".to_string())?;
        text.replace_range(start..end, &format!("{to}{}", alias.unwrap_or_default()));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `orders` and `lineitem` (of `public`, however written) are distributed.
    fn map(schema: Option<&str>, name: &str) -> Option<String> {
        if !matches!(schema, None | Some("public")) {
            return None;
        }
        match name {
            "orders" => Some("herd_global.t_1".into()),
            "lineitem" => Some("herd_global.t_2".into()),
            _ => None,
        }
    }

    fn g(sql: &str) -> Result<String, String> {
        globalize(sql, &map)
    }

    #[test]
    fn reads_of_distributed_tables_point_at_their_global_relations() {
        let cases: &[(&str, &str)] = &[
            (
                "SELECT count(*) FROM orders",
                "SELECT count(*) FROM herd_global.t_1 AS \"orders\"",
            ),
            (
                "SELECT o.id FROM orders o JOIN lineitem AS l ON l.o = o.id",
                "SELECT o.id FROM herd_global.t_1 o JOIN herd_global.t_2 AS l ON l.o = o.id",
            ),
            (
                "SELECT * FROM public.orders WHERE id IN (SELECT o FROM \"lineitem\")",
                "SELECT * FROM herd_global.t_1 AS \"orders\" WHERE id IN (SELECT o FROM \
                 herd_global.t_2 AS \"lineitem\")",
            ),
            (
                "WITH orders AS (SELECT * FROM lineitem) SELECT * FROM orders",
                "WITH orders AS (SELECT * FROM herd_global.t_2 AS \"lineitem\") SELECT * FROM orders",
            ),
            (
                "SELECT id FROM orders UNION SELECT o FROM lineitem ORDER BY 1",
                "SELECT id FROM herd_global.t_1 AS \"orders\" UNION SELECT o FROM \
                 herd_global.t_2 AS \"lineitem\" ORDER BY 1",
            ),
            (
                "SELECT rank() OVER (ORDER BY total) FROM other.orders, customers",
                "SELECT rank() OVER (ORDER BY total) FROM other.orders, customers",
            ),
            // Literals and comments that look like names are left alone.
            (
                "SELECT 'orders' /* orders */ FROM orders",
                "SELECT 'orders' /* orders */ FROM herd_global.t_1 AS \"orders\"",
            ),
            // Statements that wrap a read.
            (
                "DECLARE c CURSOR FOR SELECT * FROM orders o ORDER BY 1",
                "DECLARE c CURSOR FOR SELECT * FROM herd_global.t_1 o ORDER BY 1",
            ),
            (
                "copy (select id from orders) to stdout (format csv)",
                "copy (select id from herd_global.t_1 AS \"orders\") to stdout (format csv)",
            ),
        ];
        for (sql, want) in cases {
            assert_eq!(g(sql).as_deref(), Ok(*want), "{sql}");
        }
    }

    #[test]
    fn only_one_plain_read_qualifies() {
        for sql in [
            "SELECT 1; SELECT 2",
            "UPDATE orders SET total = 0",
            "DELETE FROM orders",
            "SELECT * FROM orders FOR UPDATE",
            "SELECT * FROM (SELECT * FROM orders FOR SHARE) s",
            "SELECT * INTO t2 FROM orders",
            "INSERT INTO orders SELECT * FROM lineitem",
            "SELECT FROM WHERE",
            "DECLARE c CURSOR WITH HOLD FOR SELECT * FROM orders",
            "DECLARE c CURSOR FOR SELECT * FROM orders FOR UPDATE",
            "COPY (SELECT * FROM orders) TO '/tmp/x'",
            "COPY orders TO STDOUT",
            "COPY (DELETE FROM orders RETURNING *) TO STDOUT",
            "PREPARE q AS SELECT * FROM orders",
        ] {
            assert!(g(sql).is_err(), "{sql}");
        }
    }
}
