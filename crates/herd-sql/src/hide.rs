//! Hiding some rows of some tables from a statement: while a shard moves between shard groups
//! both groups hold its rows, and the group that does not serve it must not show them to a
//! statement that reads or writes every group. Each read of such a table becomes a subquery
//! with the condition (`FROM t` → `FROM (SELECT * FROM t WHERE cond) AS t`), the target of an
//! UPDATE or DELETE gets it added to its WHERE, a `COPY t TO` becomes `COPY (SELECT …) TO`.
//!
//! Every reference to the table anywhere in the statement (joins, subqueries, CTEs) is found
//! by the whole-tree scan; a statement the rewrite cannot handle is an error, never a statement
//! that would show the hidden rows.

use pg_query::protobuf::{self, node, BoolExprType, Node};
use serde_json::Value;

/// The rows of one table a statement must not see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hidden {
    /// `schema.table`.
    pub table: String,
    /// An SQL condition over the table's columns (unqualified) that the rows it may see meet.
    pub keep: String,
}

/// `sql` with the rows `hidden` names left out of every table it reads or writes.
pub fn hide_rows(sql: &str, hidden: &[Hidden]) -> Result<String, String> {
    if hidden.is_empty() {
        return Ok(sql.to_string());
    }
    let parsed = pg_query::parse(sql, 0).map_err(|e| e.to_string())?;
    let tree = serde_json::to_value(&parsed.protobuf.stmts).map_err(|e| e.to_string())?;
    let ctes = names_of(&tree, "ctename");
    // Every table read, as written at its place in the text: replaced from the end so earlier
    // offsets stay valid.
    let mut reads = Vec::new();
    scan(&tree, &mut |node| {
        if let Some(rv) = node.get("RangeVar") {
            if let Some(r) = range_var(rv, hidden, &ctes) {
                reads.push(r);
            }
        }
    });
    reads.sort_by_key(|r| std::cmp::Reverse(r.start));
    let mut text = sql.to_string();
    for r in &reads {
        let end = name_end(&text, r.start)
            .ok_or_else(|| format!("cannot find table {} in the statement", r.table))?;
        let written = &text[r.start..end];
        let alias = if r.aliased {
            String::new()
        } else {
            format!(" AS {}", quote_ident(&r.relname))
        };
        let replacement = format!("(SELECT * FROM {written} WHERE {}){alias}", r.keep);
        text.replace_range(r.start..end, &replacement);
    }
    hide_in_target(&text, hidden)
}

/// A table read, at its place in the statement's text.
struct Read {
    start: usize,
    table: String,
    relname: String,
    aliased: bool,
    keep: String,
}

fn range_var(rv: &Value, hidden: &[Hidden], ctes: &[String]) -> Option<Read> {
    let relname = rv.get("relname")?.as_str()?.to_string();
    let schema = rv.get("schemaname").and_then(Value::as_str).unwrap_or("");
    if schema.is_empty() && ctes.contains(&relname) {
        return None;
    }
    let table = format!(
        "{}.{relname}",
        if schema.is_empty() { "public" } else { schema }
    );
    let h = hidden.iter().find(|h| h.table == table)?;
    Some(Read {
        start: rv.get("location")?.as_u64()? as usize,
        table,
        relname,
        aliased: rv.get("alias").is_some_and(|a| !a.is_null()),
        keep: h.keep.clone(),
    })
}

/// The UPDATE or DELETE target, or the table a COPY writes out: the condition goes into
/// the statement itself (a target cannot be a subquery).
fn hide_in_target(sql: &str, hidden: &[Hidden]) -> Result<String, String> {
    let parsed = pg_query::parse(sql, 0).map_err(|e| e.to_string())?;
    let mut tree = parsed.protobuf;
    let [raw] = tree.stmts.as_mut_slice() else {
        return Err("a statement that hides rows must be one statement".into());
    };
    let Some(stmt) = raw.stmt.as_mut().and_then(|s| s.node.as_mut()) else {
        return Ok(sql.to_string());
    };
    let find = |rv: &Option<protobuf::RangeVar>| {
        rv.as_ref().and_then(|rv| {
            let schema = if rv.schemaname.is_empty() {
                "public"
            } else {
                &rv.schemaname
            };
            let table = format!("{schema}.{}", rv.relname);
            let h = hidden.iter().find(|h| h.table == table)?;
            let qualifier = rv
                .alias
                .as_ref()
                .map_or(rv.relname.clone(), |a| a.aliasname.clone());
            Some((h.keep.clone(), qualifier))
        })
    };
    match stmt {
        node::Node::UpdateStmt(u) => {
            let Some((keep, qualifier)) = find(&u.relation) else {
                return Ok(sql.to_string());
            };
            u.where_clause = Some(Box::new(and(
                u.where_clause.take().map(|b| *b),
                condition(&keep, &qualifier)?,
            )));
        }
        node::Node::DeleteStmt(d) => {
            let Some((keep, qualifier)) = find(&d.relation) else {
                return Ok(sql.to_string());
            };
            d.where_clause = Some(Box::new(and(
                d.where_clause.take().map(|b| *b),
                condition(&keep, &qualifier)?,
            )));
        }
        node::Node::CopyStmt(c) if !c.is_from => {
            let Some((keep, _)) = find(&c.relation) else {
                return Ok(sql.to_string());
            };
            let Some(rv) = c.relation.take() else {
                return Ok(sql.to_string());
            };
            let columns: Vec<String> = c
                .attlist
                .drain(..)
                .filter_map(|n| match n.node {
                    Some(node::Node::String(s)) => Some(quote_ident(&s.sval)),
                    _ => None,
                })
                .collect();
            let name = if rv.schemaname.is_empty() {
                quote_ident(&rv.relname)
            } else {
                format!(
                    "{}.{}",
                    quote_ident(&rv.schemaname),
                    quote_ident(&rv.relname)
                )
            };
            let list = if columns.is_empty() {
                "*".to_string()
            } else {
                columns.join(", ")
            };
            let query = select_stmt(&format!("SELECT {list} FROM {name} WHERE {keep}"))?;
            c.query = Some(Box::new(query));
        }
        _ => return Ok(sql.to_string()),
    }
    pg_query::deparse(&tree, Default::default()).map_err(|e| e.to_string())
}

/// `keep` with its columns qualified by `qualifier`: parsed from a SELECT over a table of
/// that name, so PostgreSQL's grammar decides what is a column.
fn condition(keep: &str, qualifier: &str) -> Result<Node, String> {
    let q = quote_ident(qualifier);
    let select = select_stmt(&format!("SELECT 1 FROM {q} WHERE {keep}"))?;
    let Some(node::Node::SelectStmt(mut s)) = select.node else {
        return Err("the hiding condition is not a condition".into());
    };
    let mut cond = s
        .where_clause
        .take()
        .map(|b| *b)
        .ok_or("the hiding condition is empty")?;
    qualify_columns(&mut cond, qualifier);
    Ok(cond)
}

/// Qualifies every one-part column reference under `node` (the condition's own columns).
fn qualify_columns(n: &mut Node, qualifier: &str) {
    let Some(inner) = n.node.as_mut() else {
        return;
    };
    match inner {
        node::Node::ColumnRef(c) if c.fields.len() == 1 => {
            c.fields.insert(
                0,
                Node {
                    node: Some(node::Node::String(protobuf::String {
                        sval: qualifier.to_string(),
                    })),
                },
            );
        }
        node::Node::BoolExpr(b) => b
            .args
            .iter_mut()
            .for_each(|a| qualify_columns(a, qualifier)),
        node::Node::AExpr(a) => {
            for side in [a.lexpr.as_deref_mut(), a.rexpr.as_deref_mut()]
                .into_iter()
                .flatten()
            {
                qualify_columns(side, qualifier);
            }
        }
        node::Node::FuncCall(f) => f
            .args
            .iter_mut()
            .for_each(|a| qualify_columns(a, qualifier)),
        node::Node::TypeCast(t) => {
            if let Some(a) = t.arg.as_deref_mut() {
                qualify_columns(a, qualifier);
            }
        }
        node::Node::CoalesceExpr(c) => c
            .args
            .iter_mut()
            .for_each(|a| qualify_columns(a, qualifier)),
        node::Node::List(l) => l
            .items
            .iter_mut()
            .for_each(|a| qualify_columns(a, qualifier)),
        _ => {}
    }
}

fn and(left: Option<Node>, right: Node) -> Node {
    let Some(left) = left else {
        return right;
    };
    Node {
        node: Some(node::Node::BoolExpr(Box::new(protobuf::BoolExpr {
            xpr: None,
            boolop: BoolExprType::AndExpr as i32,
            args: vec![left, right],
            location: -1,
        }))),
    }
}

fn select_stmt(sql: &str) -> Result<Node, String> {
    let parsed = pg_query::parse(sql, 0).map_err(|e| e.to_string())?;
    parsed
        .protobuf
        .stmts
        .into_iter()
        .next()
        .and_then(|s| s.stmt)
        .map(|b| *b)
        .ok_or_else(|| "an empty statement".to_string())
}

/// Every value of the string field `field` anywhere in `tree`.
pub(crate) fn names_of(tree: &Value, field: &str) -> Vec<String> {
    let mut out = Vec::new();
    scan(tree, &mut |node| {
        if let Some(Value::String(s)) = node.get(field) {
            out.push(s.clone());
        }
    });
    out
}

/// Calls `visit` on every object in `tree` (an explicit stack: deep trees cannot overflow).
pub(crate) fn scan(tree: &Value, visit: &mut dyn FnMut(&serde_json::Map<String, Value>)) {
    let mut stack = vec![tree];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(o) => {
                visit(o);
                stack.extend(o.values());
            }
            Value::Array(a) => stack.extend(a.iter()),
            _ => {}
        }
    }
}

/// Where the (possibly qualified, possibly quoted) name starting at `start` ends.
pub(crate) fn name_end(text: &str, start: usize) -> Option<usize> {
    let bytes = text.as_bytes();
    let mut i = start;
    loop {
        if bytes.get(i) == Some(&b'"') {
            i += 1;
            loop {
                match bytes.get(i)? {
                    b'"' if bytes.get(i + 1) == Some(&b'"') => i += 2,
                    b'"' => {
                        i += 1;
                        break;
                    }
                    _ => i += 1,
                }
            }
        } else {
            let from = i;
            while bytes.get(i).is_some_and(|b| {
                b.is_ascii_alphanumeric() || *b == b'_' || *b == b'$' || *b >= 0x80
            }) {
                i += 1;
            }
            if i == from {
                return None;
            }
        }
        if bytes.get(i) == Some(&b'.') {
            i += 1;
        } else {
            return Some(i);
        }
    }
}

pub(crate) fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hidden() -> Vec<Hidden> {
        vec![Hidden {
            table: "public.orders".into(),
            keep: "(id % 4) <> 1".into(),
        }]
    }

    fn hide(sql: &str) -> String {
        hide_rows(sql, &hidden()).expect(sql)
    }

    #[test]
    fn every_read_of_the_table_becomes_a_filtered_subquery() {
        let cases = [
            (
                "select count(*) from orders",
                "select count(*) from (SELECT * FROM orders WHERE (id % 4) <> 1) AS \"orders\"",
            ),
            (
                "SELECT o.id FROM public.orders o JOIN items i ON i.id = o.id",
                "SELECT o.id FROM (SELECT * FROM public.orders WHERE (id % 4) <> 1) o JOIN items i ON i.id = o.id",
            ),
            (
                "select * from items where id in (select id from \"orders\" as x)",
                "select * from items where id in (select id from (SELECT * FROM \"orders\" WHERE (id % 4) <> 1) as x)",
            ),
            // Another table, another schema, a CTE of the same name: untouched.
            ("select * from items", "select * from items"),
            ("select * from other.orders", "select * from other.orders"),
            (
                "with orders as (select 1 as id) select * from orders",
                "with orders as (select 1 as id) select * from orders",
            ),
        ];
        for (sql, want) in cases {
            assert_eq!(hide(sql), want);
        }
        // Both references of a self-join.
        let both = hide("select * from orders a join orders b on a.id = b.id");
        assert_eq!(both.matches("WHERE (id % 4) <> 1").count(), 2, "{both}");
        // The result is valid SQL.
        pg_query::parse(&both, 0).expect("valid");
    }

    #[test]
    fn writes_and_copies_get_the_condition() {
        assert_eq!(
            hide("UPDATE orders SET total = total + 1 WHERE total > 5"),
            "UPDATE orders SET total = total + 1 WHERE total > 5 AND orders.id % 4 <> 1"
        );
        assert_eq!(
            hide("delete from orders o"),
            "DELETE FROM orders o WHERE o.id % 4 <> 1"
        );
        assert_eq!(
            hide("delete from orders where total < 0 or total > 9"),
            "DELETE FROM orders WHERE (total < 0 OR total > 9) AND orders.id % 4 <> 1"
        );
        assert_eq!(
            hide("copy orders (id, total) to stdout with (format csv)"),
            "COPY (SELECT id, total FROM orders WHERE id % 4 <> 1) TO STDOUT CSV"
        );
        // Not a hidden table: unchanged.
        assert_eq!(hide("delete from items"), "delete from items");
        // A condition of the shape Herd uses (the shard of the key, by PostgreSQL's hash):
        // its column is qualified wherever it is nested.
        let shard = vec![Hidden {
            table: "public.orders".into(),
            keep: "(coalesce(((hashint8extended(id, 42)::numeric + 7) % 9), 0) % 4)::int NOT IN (1, 3)"
                .into(),
        }];
        let done = hide_rows(
            "update orders set total = 0 from items where items.id = orders.id",
            &shard,
        )
        .expect("update");
        assert!(done.contains("hashint8extended(orders.id, 42)"), "{done}");
        assert!(done.contains("NOT IN (1, 3)"), "{done}");
        assert_eq!(hide_rows("select 1", &[]).expect("none"), "select 1");
    }

    #[test]
    fn names_end_where_the_identifier_ends() {
        assert_eq!(name_end("from a.b x", 5), Some(8));
        assert_eq!(name_end("\"a\"\"b\".c ", 0), Some(8));
        assert_eq!(name_end("(", 0), None);
    }
}
