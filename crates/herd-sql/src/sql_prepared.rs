//! SQL-level `PREPARE` / `EXECUTE` / `DEALLOCATE` taken apart for a proxy that keeps the
//! prepared statements itself (a sharded cluster: each `EXECUTE` is placed like the statement
//! it runs). Pure: the statement's parts as the client wrote them, and the kept text with the
//! arguments written in.

use pg_query::protobuf::{node, Token};

/// One SQL-level prepared-statement command, alone in its query string.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SqlPrepared {
    /// `PREPARE name [(types)] AS statement`.
    Prepare {
        /// The statement's name (as PostgreSQL folds it).
        name: String,
        /// The declared types as written, parentheses included (empty when none).
        types: String,
        /// The statement, as the client wrote it.
        query: String,
    },
    /// `EXECUTE name [(arguments)]`.
    Execute {
        /// The statement's name.
        name: String,
        /// Each argument.
        args: Vec<Argument>,
    },
    /// `DEALLOCATE [PREPARE] name`, or `None` for `DEALLOCATE ALL`.
    Deallocate(Option<String>),
    /// `DISCARD ALL` (which deallocates every prepared statement too).
    DiscardAll,
}

/// An `EXECUTE` argument.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Argument {
    /// A literal: its kind and its text as written.
    Constant(ConstKind, String),
    /// Anything else (an expression, a column, a literal converted to a type).
    Expression,
}

/// The kind of a literal argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConstKind {
    /// A quoted string (its type unknown until converted: the type's input function).
    Text,
    /// An integer or decimal number.
    Number,
    /// `true` / `false`.
    Bool,
    /// `NULL`.
    Null,
}

/// Whether a literal of `kind` becomes the same value of type `type_name` (as PostgreSQL's
/// `format_type` names it) through an explicit `CAST` as through the assignment conversion
/// PostgreSQL applies to an `EXECUTE` argument: a quoted string or NULL always (the type's
/// input function either way); a number to a numeric or string type; a boolean to boolean or
/// a string type. Another pair may convert explicitly where an assignment is refused
/// (`1` to boolean).
pub fn assigned_as_cast(kind: ConstKind, type_name: &str) -> bool {
    let string = matches!(
        type_name,
        "text" | "character varying" | "character" | "name"
    );
    match kind {
        ConstKind::Text | ConstKind::Null => true,
        ConstKind::Number => {
            string
                || matches!(
                    type_name,
                    "smallint" | "integer" | "bigint" | "numeric" | "real" | "double precision"
                )
        }
        ConstKind::Bool => string || type_name == "boolean",
    }
}

/// Whether `sql` starts with a word that may begin one of [`SqlPrepared`]'s commands (looked
/// at for every simple query: no decoding before the first word says so).
pub fn may_be_sql_prepared(sql: &[u8]) -> bool {
    let start = sql
        .iter()
        .position(|b| !b.is_ascii_whitespace())
        .unwrap_or(sql.len());
    let word = |w: &str| {
        sql.get(start..start + w.len())
            .is_some_and(|s| s.eq_ignore_ascii_case(w.as_bytes()))
    };
    word("prepare") || word("execute") || word("deallocate") || word("discard")
}

/// The command `sql` is, when it is exactly one `PREPARE` (of a statement, not a
/// transaction), `EXECUTE`, `DEALLOCATE` or `DISCARD ALL`.
pub fn sql_prepared(sql: &str) -> Option<SqlPrepared> {
    let parsed = std::panic::catch_unwind(|| pg_query::parse(sql, 0))
        .ok()?
        .ok()?;
    let [raw] = parsed.protobuf.stmts.as_slice() else {
        return None;
    };
    // The statement's own text (a trailing `;` and blanks left out).
    let start = usize::try_from(raw.stmt_location).ok()?;
    let text = match raw.stmt_len {
        0 => sql.get(start..)?,
        n => sql.get(start..start + usize::try_from(n).ok()?)?,
    };
    let tokens = pg_query::scan_tokens(text).ok()?;
    let at = |t: &pg_query::protobuf::ScanToken| -> Option<(usize, usize)> {
        Some((usize::try_from(t.start).ok()?, usize::try_from(t.end).ok()?))
    };
    match raw.stmt.as_ref()?.node.as_ref()? {
        node::Node::PrepareStmt(p) => {
            // PREPARE name [ ( types ) ] AS statement: the first AS outside parentheses.
            let mut depth = 0i32;
            let mut types = String::new();
            let mut open = None;
            for (i, t) in tokens.iter().enumerate().skip(2) {
                if t.token == Token::Ascii40 as i32 {
                    if depth == 0 {
                        open = Some(at(t)?.0);
                    }
                    depth += 1;
                } else if t.token == Token::Ascii41 as i32 {
                    depth -= 1;
                    if depth == 0 {
                        types = text.get(open?..at(t)?.1)?.to_string();
                    }
                } else if depth == 0 && t.token == Token::As as i32 {
                    let from = at(tokens.get(i + 1)?)?.0;
                    return Some(SqlPrepared::Prepare {
                        name: p.name.clone(),
                        types,
                        query: text.get(from..)?.trim_end().to_string(),
                    });
                }
            }
            None
        }
        node::Node::ExecuteStmt(e) => {
            let mut args = Vec::new();
            let mut depth = 0i32;
            let mut from = 0;
            for t in tokens.iter().skip(2) {
                let (s, end) = at(t)?;
                if t.token == Token::Ascii40 as i32 {
                    depth += 1;
                    if depth == 1 {
                        from = end;
                    }
                } else if t.token == Token::Ascii41 as i32 {
                    depth -= 1;
                    if depth == 0 {
                        args.push(text.get(from..s)?.trim().to_string());
                        break;
                    }
                } else if depth == 1 && t.token == Token::Ascii44 as i32 {
                    args.push(text.get(from..s)?.trim().to_string());
                    from = end;
                }
            }
            if args.len() != e.params.len() {
                return None;
            }
            let args = e
                .params
                .iter()
                .zip(args)
                .map(|(p, text)| match constant(p) {
                    Some(kind) => Argument::Constant(kind, text),
                    None => Argument::Expression,
                })
                .collect();
            Some(SqlPrepared::Execute {
                name: e.name.clone(),
                args,
            })
        }
        node::Node::DeallocateStmt(d) if d.isall => Some(SqlPrepared::Deallocate(None)),
        node::Node::DeallocateStmt(d) => Some(SqlPrepared::Deallocate(Some(d.name.clone()))),
        node::Node::DiscardStmt(d)
            if d.target == pg_query::protobuf::DiscardMode::DiscardAll as i32 =>
        {
            Some(SqlPrepared::DiscardAll)
        }
        _ => None,
    }
}

/// The kind of literal `n` is, if it is one.
fn constant(n: &pg_query::protobuf::Node) -> Option<ConstKind> {
    use pg_query::protobuf::a_const::Val;
    let Some(node::Node::AConst(c)) = n.node.as_ref() else {
        return None;
    };
    if c.isnull {
        return Some(ConstKind::Null);
    }
    match c.val.as_ref()? {
        Val::Ival(_) | Val::Fval(_) => Some(ConstKind::Number),
        Val::Sval(_) => Some(ConstKind::Text),
        Val::Boolval(_) => Some(ConstKind::Bool),
        Val::Bsval(_) => None,
    }
}

/// `query` with each parameter `$n` replaced by `args[n-1]` converted to `types[n-1]`
/// (`(CAST(arg AS type))`): the statement one server runs for `EXECUTE` with those
/// arguments. `None` when a parameter has no argument or the text does not scan.
pub fn with_arguments(query: &str, args: &[String], types: &[String]) -> Option<String> {
    let tokens = pg_query::scan_tokens(query).ok()?;
    let mut out = String::with_capacity(query.len() + 32 * args.len());
    let mut last = 0;
    for t in tokens.iter().filter(|t| t.token == Token::Param as i32) {
        let (s, e) = (usize::try_from(t.start).ok()?, usize::try_from(t.end).ok()?);
        let n: usize = query.get(s + 1..e)?.parse().ok()?;
        let i = n.checked_sub(1)?;
        out.push_str(query.get(last..s)?);
        out.push_str(&format!("(CAST({} AS {}))", args.get(i)?, types.get(i)?));
        last = e;
    }
    out.push_str(query.get(last..)?);
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prepare(name: &str, types: &str, query: &str) -> Option<SqlPrepared> {
        Some(SqlPrepared::Prepare {
            name: name.into(),
            types: types.into(),
            query: query.into(),
        })
    }

    #[test]
    fn commands_taken_apart() {
        let cases: Vec<(&str, Option<SqlPrepared>)> = vec![
            (
                "PREPARE p1(bigint) AS select id from customers where id = $1",
                prepare("p1", "(bigint)", "select id from customers where id = $1"),
            ),
            (
                " prepare Q (int, numeric(10,2)) as insert into t values ($1, $2);",
                prepare("q", "(int, numeric(10,2))", "insert into t values ($1, $2)"),
            ),
            (
                "prepare \"Q\" as select 'as' as x",
                prepare("Q", "", "select 'as' as x"),
            ),
            (
                "EXECUTE p1(5, 'a,b', -2, NULL, '2024-01-01'::date, true, f(1), 1+1)",
                Some(SqlPrepared::Execute {
                    name: "p1".into(),
                    args: vec![
                        Argument::Constant(ConstKind::Number, "5".into()),
                        Argument::Constant(ConstKind::Text, "'a,b'".into()),
                        Argument::Constant(ConstKind::Number, "-2".into()),
                        Argument::Constant(ConstKind::Null, "NULL".into()),
                        Argument::Expression,
                        Argument::Constant(ConstKind::Bool, "true".into()),
                        Argument::Expression,
                        Argument::Expression,
                    ],
                }),
            ),
            (
                "execute p",
                Some(SqlPrepared::Execute {
                    name: "p".into(),
                    args: vec![],
                }),
            ),
            (
                "deallocate prepare P1",
                Some(SqlPrepared::Deallocate(Some("p1".into()))),
            ),
            ("DEALLOCATE ALL", Some(SqlPrepared::Deallocate(None))),
            ("discard all;", Some(SqlPrepared::DiscardAll)),
            ("discard plans", None),
            ("prepare transaction 'x'", None),
            ("select 1; execute p", None),
            ("prepare p as", None),
            ("select 1", None),
        ];
        for (sql, want) in cases {
            assert_eq!(sql_prepared(sql), want, "{sql}");
        }
        assert_eq!(
            sql_prepared("execute p(1.5, B'101')"),
            Some(SqlPrepared::Execute {
                name: "p".into(),
                args: vec![
                    Argument::Constant(ConstKind::Number, "1.5".into()),
                    Argument::Expression
                ],
            })
        );
        assert!(may_be_sql_prepared(b"  Execute p"));
        assert!(may_be_sql_prepared(b"DEALLOCATE ALL"));
        assert!(!may_be_sql_prepared(b"select 1"));
        assert!(!may_be_sql_prepared(b"exec"));
    }

    #[test]
    fn conversions_that_match_an_assignment() {
        use ConstKind::{Bool, Null, Number, Text};
        let cases = [
            (Text, "date", true),
            (Null, "boolean", true),
            (Number, "bigint", true),
            (Number, "double precision", true),
            (Number, "text", true),
            (Number, "boolean", false),
            (Number, "money", false),
            (Bool, "boolean", true),
            (Bool, "character varying", true),
            (Bool, "integer", false),
        ];
        for (kind, ty, want) in cases {
            assert_eq!(assigned_as_cast(kind, ty), want, "{kind:?} to {ty}");
        }
    }

    #[test]
    fn arguments_written_in() {
        let types = vec!["bigint".to_string(), "text".to_string()];
        let args = vec!["5".to_string(), "'it''s $1'".to_string()];
        assert_eq!(
            with_arguments(
                "select '$1', $1 /* $2 */ from t where a = $2 and b = $1",
                &args,
                &types
            )
            .as_deref(),
            Some(
                "select '$1', (CAST(5 AS bigint)) /* $2 */ from t where a = \
                 (CAST('it''s $1' AS text)) and b = (CAST(5 AS bigint))"
            )
        );
        assert_eq!(with_arguments("select $3", &args, &types), None);
        assert_eq!(
            with_arguments("select 1", &[], &[]).as_deref(),
            Some("select 1")
        );
    }
}
