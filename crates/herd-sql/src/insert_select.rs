//! `INSERT … SELECT` into a distributed table whose rows go to several shard groups: the
//! proxy runs the SELECT alone (its *source*), then sends each group an `INSERT … VALUES` of
//! the rows that group holds, the rest of the statement (column list, `ON CONFLICT`,
//! `RETURNING`) unchanged. This file cuts the statement in two and puts it back together.
//!
//! Values come back from the source as text and go out as literals. A literal keeps the
//! source column's type (`'1.5'::numeric`), so the target column converts it as PostgreSQL
//! converts the SELECT's value (an assignment cast: numeric to integer rounds, text to json is
//! refused). Only a column the SELECT writes as a bare string literal or `NULL` goes out
//! without a type, because PostgreSQL gives such a column the target column's type directly
//! (it parses an INSERT's SELECT without resolving unknown literals to text).

use pg_query::protobuf::node;

/// An `INSERT … SELECT` cut in two.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InsertSelect {
    /// The SELECT, alone, as a statement (parameters keep their numbers).
    pub source: String,
    /// For each column of the SELECT's target list, whether it is a bare string literal or
    /// `NULL` (sent without a type); empty when the list has a `*` (positions unknown: every
    /// value is sent with its type).
    pub untyped: Vec<bool>,
}

/// One value for a group's `INSERT … VALUES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Literal {
    /// SQL NULL.
    Null,
    /// A string literal without a type (the target column's type applies).
    Untyped(String),
    /// A string literal of this type (as `format_type()` names it).
    Typed(String, String),
}

/// Splits `sql`, an `INSERT … SELECT` (a plain SELECT: no set operation, no VALUES, no WITH
/// on the INSERT or the SELECT).
pub fn insert_select(sql: &str) -> Result<InsertSelect, String> {
    let parsed = pg_query::parse(sql, 0).map_err(|e| e.to_string())?;
    let tree = parsed.protobuf;
    let [raw] = tree.stmts.as_slice() else {
        return Err("one INSERT statement expected".into());
    };
    let Some(node::Node::InsertStmt(insert)) = raw.stmt.as_ref().and_then(|s| s.node.as_ref())
    else {
        return Err("an INSERT statement expected".into());
    };
    if insert.with_clause.is_some() {
        return Err("an INSERT with WITH".into());
    }
    let Some(node::Node::SelectStmt(select)) =
        insert.select_stmt.as_ref().and_then(|s| s.node.as_ref())
    else {
        return Err("an INSERT … SELECT expected".into());
    };
    if !select.values_lists.is_empty() || select.larg.is_some() || select.with_clause.is_some() {
        return Err("a plain SELECT expected (no VALUES, set operation or WITH)".into());
    }
    let mut untyped = Vec::with_capacity(select.target_list.len());
    for target in &select.target_list {
        let Some(node::Node::ResTarget(res)) = target.node.as_ref() else {
            return Err("a target list expected".into());
        };
        let value = res.val.as_ref().and_then(|v| v.node.as_ref());
        match value {
            Some(node::Node::ColumnRef(c))
                if c.fields
                    .iter()
                    .any(|f| matches!(f.node, Some(node::Node::AStar(_)))) =>
            {
                untyped.clear();
                break;
            }
            Some(node::Node::AConst(c)) => untyped.push(
                c.isnull
                    || matches!(
                        c.val,
                        Some(pg_query::protobuf::a_const::Val::Sval(_))
                            | Some(pg_query::protobuf::a_const::Val::Bsval(_))
                    ),
            ),
            _ => untyped.push(false),
        }
    }
    let alone = pg_query::protobuf::ParseResult {
        version: tree.version,
        stmts: vec![pg_query::protobuf::RawStmt {
            stmt: insert.select_stmt.clone(),
            stmt_location: 0,
            stmt_len: 0,
        }],
    };
    let source = pg_query::deparse(&alone, Default::default()).map_err(|e| e.to_string())?;
    Ok(InsertSelect { source, untyped })
}

/// `sql` (an `INSERT … SELECT`) with its SELECT replaced by `VALUES` of `rows`; with no rows,
/// by a SELECT of `width` NULLs that returns none (so `RETURNING` still describes its rows).
pub fn insert_values(sql: &str, rows: &[Vec<Literal>], width: usize) -> Result<String, String> {
    let values = if rows.is_empty() {
        let nulls = vec!["NULL"; width.max(1)].join(", ");
        format!("SELECT {nulls} WHERE false")
    } else {
        let mut text = String::from("VALUES ");
        for (i, row) in rows.iter().enumerate() {
            if i > 0 {
                text.push_str(", ");
            }
            text.push('(');
            for (j, value) in row.iter().enumerate() {
                if j > 0 {
                    text.push_str(", ");
                }
                push_literal(&mut text, value);
            }
            text.push(')');
        }
        text
    };
    let values_tree = pg_query::parse(&values, 0).map_err(|e| e.to_string())?;
    let new_select = values_tree
        .protobuf
        .stmts
        .into_iter()
        .next()
        .and_then(|s| s.stmt)
        .ok_or("the rows' VALUES did not parse")?;
    crate::split::rewrite_insert(sql, |insert| {
        insert.select_stmt = Some(new_select);
        Ok(())
    })
}

/// Appends `value` as SQL: `NULL`, `'text'` or `'text'::type` (quotes doubled; with
/// `standard_conforming_strings`, on since PostgreSQL 9.1 and assumed by Herd, backslashes
/// are plain characters).
fn push_literal(out: &mut String, value: &Literal) {
    let quoted = |out: &mut String, text: &str| {
        out.push('\'');
        out.push_str(&text.replace('\'', "''"));
        out.push('\'');
    };
    match value {
        Literal::Null => out.push_str("NULL"),
        Literal::Untyped(text) => quoted(out, text),
        Literal::Typed(text, type_name) => {
            out.push_str("CAST(");
            quoted(out, text);
            out.push_str(" AS ");
            out.push_str(type_name);
            out.push(')');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_the_select_out() {
        let cut = insert_select(
            "insert into t (id, v) select g, 'x' from generate_series(1, $1) g on conflict do nothing",
        )
        .expect("cut");
        assert_eq!(cut.source, "SELECT g, 'x' FROM generate_series(1, $1) g");
        assert_eq!(cut.untyped, vec![false, true]);
        let star = insert_select("insert into t select *, null from u").expect("cut");
        assert_eq!(star.source, "SELECT *, NULL FROM u");
        assert!(star.untyped.is_empty());
        assert!(insert_select("insert into t values (1)").is_err());
        assert!(insert_select("insert into t select 1 union select 2").is_err());
        assert!(insert_select("with w as (select 1) insert into t select * from w").is_err());
        assert!(insert_select("select 1").is_err());
    }

    #[test]
    fn puts_rows_back_as_literals() {
        let sql = "insert into t (id, v, j) select a, b, c from u returning id, $1::int";
        let rows = vec![
            vec![
                Literal::Typed("1".into(), "integer".into()),
                Literal::Untyped("it's".into()),
                Literal::Null,
            ],
            vec![
                Literal::Typed("2".into(), "integer".into()),
                Literal::Untyped("b\\c".into()),
                Literal::Typed("{\"a\": 1}".into(), "jsonb".into()),
            ],
        ];
        assert_eq!(
            insert_values(sql, &rows, 3).expect("rows"),
            "INSERT INTO t (id, v, j) VALUES ('1'::int, 'it''s', NULL), ('2'::int, E'b\\\\c', '{\"a\": 1}'::jsonb) \
             RETURNING id, $1::int"
        );
        assert_eq!(
            insert_values(sql, &[], 3).expect("none"),
            "INSERT INTO t (id, v, j) SELECT NULL, NULL, NULL WHERE false RETURNING id, $1::int"
        );
    }
}
