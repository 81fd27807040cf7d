//! Statements that wrap a query: `DECLARE … CURSOR FOR <query>` and `COPY (<query>) TO`. Their shard group is the wrapped query's (planned as a
//! statement of its own), so the wrapped query is taken out of them here, deparsed.

use pg_query::protobuf::node;

/// PostgreSQL's `CURSOR_OPT_HOLD` (`DECLARE … WITH HOLD`).
pub(crate) const CURSOR_OPT_HOLD: i32 = 0x0020;

/// What wraps the query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wrapper {
    /// `DECLARE name … CURSOR [WITH HOLD] FOR query`.
    Cursor {
        /// `WITH HOLD`: the cursor outlives its transaction.
        hold: bool,
    },
    /// `COPY (query) TO …`.
    CopyTo {
        /// To the client (`STDOUT`), not a server file or program.
        client: bool,
    },
}

/// A statement wrapping a query, and that query.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wrapped {
    /// The wrapping statement.
    pub wrapper: Wrapper,
    /// The wrapped query, deparsed (for planning; the client's text is what runs).
    pub query: String,
}

/// The query `sql` wraps when it is one `DECLARE CURSOR` or `COPY (query) TO`;
/// `None` for anything else (or SQL that does not parse).
pub fn wrapped(sql: &str) -> Option<Wrapped> {
    let parsed = std::panic::catch_unwind(|| pg_query::parse(sql, 0))
        .ok()?
        .ok()?;
    let tree = parsed.protobuf;
    let [raw] = tree.stmts.as_slice() else {
        return None;
    };
    let (wrapper, inner) = match raw.stmt.as_ref()?.node.as_ref()? {
        node::Node::DeclareCursorStmt(d) => (
            Wrapper::Cursor {
                hold: d.options & CURSOR_OPT_HOLD != 0,
            },
            d.query.clone()?,
        ),
        node::Node::CopyStmt(c) if !c.is_from => (
            Wrapper::CopyTo {
                client: c.filename.is_empty() && !c.is_program,
            },
            c.query.clone()?,
        ),
        _ => return None,
    };
    let mut only = tree.clone();
    only.stmts[0].stmt = Some(inner);
    let query = pg_query::deparse(&only, Default::default()).ok()?;
    Some(Wrapped { wrapper, query })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wrapped_query_comes_out() {
        let cases: &[(&str, Wrapper, &str)] = &[
            (
                "declare c cursor for select a from t where k = 1",
                Wrapper::Cursor { hold: false },
                "SELECT a FROM t WHERE k = 1",
            ),
            (
                "DECLARE c SCROLL CURSOR WITH HOLD FOR SELECT * FROM t",
                Wrapper::Cursor { hold: true },
                "SELECT * FROM t",
            ),
            (
                "copy (select a, b from t order by a) to stdout with (format csv)",
                Wrapper::CopyTo { client: true },
                "SELECT a, b FROM t ORDER BY a",
            ),
            (
                "COPY (SELECT 1 FROM t) TO '/tmp/x'",
                Wrapper::CopyTo { client: false },
                "SELECT 1 FROM t",
            ),
        ];
        for (sql, wrapper, query) in cases {
            let got = wrapped(sql).unwrap_or_else(|| panic!("{sql}"));
            assert_eq!(&got.wrapper, wrapper, "{sql}");
            assert_eq!(got.query, *query, "{sql}");
        }
    }

    #[test]
    fn other_statements_wrap_nothing() {
        for sql in [
            "select 1",
            "copy t to stdout",
            "copy t from stdin",
            "declare c cursor for select 1; select 2",
            "execute q(1)",
            "prepare q as select * from t",
            "not sql at all",
        ] {
            assert_eq!(wrapped(sql), None, "{sql}");
        }
    }
}
