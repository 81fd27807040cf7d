//! `EXPLAIN` of a statement that runs on every shard group: the statement it explains, and the
//! EXPLAIN with its options to put before the statement each group runs.

use pg_query::protobuf::node;

/// The text that stands for the explained statement while the options are deparsed.
const PLACEHOLDER: &str = "SELECT herd_explained";

/// For `EXPLAIN [(options)] <statement>`: the EXPLAIN with its options (to put before another
/// statement) and the explained statement's text. `None` for anything else.
pub fn explained(sql: &str) -> Option<(String, String)> {
    let parsed = std::panic::catch_unwind(|| pg_query::parse(sql, 0))
        .ok()?
        .ok()?;
    let tree = parsed.protobuf;
    let [raw] = tree.stmts.as_slice() else {
        return None;
    };
    let Some(node::Node::ExplainStmt(explain)) = raw.stmt.as_ref()?.node.as_ref() else {
        return None;
    };
    let mut only = tree.clone();
    only.stmts[0].stmt = Some(explain.query.clone()?);
    let statement = pg_query::deparse(&only, Default::default()).ok()?;
    let placeholder = pg_query::parse(PLACEHOLDER, 0).ok()?.protobuf;
    let mut wrapper = tree.clone();
    if let Some(node::Node::ExplainStmt(e)) = wrapper.stmts[0].stmt.as_mut()?.node.as_mut() {
        e.query = placeholder.stmts.first()?.stmt.clone();
    }
    let text = pg_query::deparse(&wrapper, Default::default()).ok()?;
    let prefix = text.strip_suffix(PLACEHOLDER)?.trim_end().to_string();
    Some((prefix, statement))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn explain_and_its_statement() {
        let (prefix, statement) =
            explained("explain (costs off, verbose) select a from t where b > 1 order by a")
                .expect("an EXPLAIN");
        assert_eq!(prefix, "EXPLAIN (COSTS OFF, VERBOSE)");
        assert_eq!(statement, "SELECT a FROM t WHERE b > 1 ORDER BY a");
        let (prefix, _) = explained("EXPLAIN select 1").expect("an EXPLAIN");
        assert_eq!(prefix, "EXPLAIN");
        assert!(explained("select 1").is_none());
        assert!(explained("explain select 1; select 2").is_none());
    }
}
