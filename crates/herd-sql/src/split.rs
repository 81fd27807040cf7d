//! Writes on several shard groups: a multi-row `INSERT … VALUES` cut into one statement per
//! group (the same statement with only the rows that group holds; parameters keep their
//! numbers), and the syntax that makes a write come out differently on each group.

use pg_query::protobuf::node;
use serde_json::Value;

/// SQL syntax whose value differs from one server (or transaction) to the next, when `sql`
/// uses it: `current_timestamp` and the other SQL value functions, and `DEFAULT` (a column's
/// default may call `nextval` or `now`). Function calls are the caller's to check, by volatility.
pub fn nondeterministic_syntax(sql: &str) -> Option<String> {
    let parsed = match pg_query::parse(sql, 0) {
        Ok(p) => p,
        Err(e) => return Some(e.to_string()),
    };
    let json = serde_json::to_value(&parsed.protobuf).unwrap_or(Value::Null);
    fn find(v: &Value) -> Option<String> {
        match v {
            Value::Object(m) => {
                if m.contains_key("SqlvalueFunction") {
                    return Some(
                        "CURRENT_TIMESTAMP, CURRENT_USER or a similar SQL value function".into(),
                    );
                }
                if m.contains_key("SetToDefault") {
                    return Some("DEFAULT".into());
                }
                m.values().find_map(find)
            }
            Value::Array(a) => a.iter().find_map(find),
            _ => None,
        }
    }
    find(&json)
}

/// The statements of a query string, each as its own text (`None` when it does not parse).
/// A string of several statements is planned statement by statement.
pub fn statements(sql: &str) -> Option<Vec<String>> {
    let parts = std::panic::catch_unwind(|| {
        pg_query::split_with_parser(sql)
            .map(|v| v.into_iter().map(str::to_string).collect::<Vec<_>>())
    })
    .ok()?
    .ok()?;
    Some(parts.into_iter().filter(|p| !p.trim().is_empty()).collect())
}

/// `sql` (an INSERT … VALUES) with only the VALUES rows at `keep` (0-based, ascending).
pub fn insert_rows(sql: &str, keep: &[usize]) -> Result<String, String> {
    rewrite_insert(sql, |insert| keep_rows(insert, keep))
}

/// Parses `sql`, one INSERT statement, lets `change` rewrite it, and deparses the result.
pub(crate) fn rewrite_insert(
    sql: &str,
    change: impl FnOnce(&mut pg_query::protobuf::InsertStmt) -> Result<(), String>,
) -> Result<String, String> {
    let parsed = pg_query::parse(sql, 0).map_err(|e| e.to_string())?;
    let mut tree = parsed.protobuf;
    let [raw] = tree.stmts.as_mut_slice() else {
        return Err("one INSERT statement expected".into());
    };
    let Some(node::Node::InsertStmt(insert)) = raw.stmt.as_mut().and_then(|s| s.node.as_mut())
    else {
        return Err("an INSERT statement expected".into());
    };
    change(insert)?;
    pg_query::deparse(&tree, Default::default()).map_err(|e| e.to_string())
}

/// Keeps only the VALUES rows at `keep` of `insert`.
fn keep_rows(insert: &mut pg_query::protobuf::InsertStmt, keep: &[usize]) -> Result<(), String> {
    let Some(node::Node::SelectStmt(select)) =
        insert.select_stmt.as_mut().and_then(|s| s.node.as_mut())
    else {
        return Err("an INSERT … VALUES expected".into());
    };
    if keep.is_empty() || keep.iter().any(|&i| i >= select.values_lists.len()) {
        return Err("rows out of range".into());
    }
    let rows = std::mem::take(&mut select.values_lists);
    select.values_lists = rows
        .into_iter()
        .enumerate()
        .filter(|(i, _)| keep.contains(i))
        .map(|(_, r)| r)
        .collect();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statements_of_a_string() {
        assert_eq!(
            statements("begin; update t set a = ';' where id = 1 ;select 2").expect("splits"),
            vec!["begin", "update t set a = ';' where id = 1 ", "select 2"]
        );
        assert!(statements("select (").is_none());
    }

    #[test]
    fn finds_what_differs_between_servers() {
        assert!(nondeterministic_syntax("update t set at = current_timestamp").is_some());
        assert!(nondeterministic_syntax("insert into t values (default, 1)").is_some());
        assert!(nondeterministic_syntax("update t set v = 2 where id = 1").is_none());
    }

    #[test]
    fn keeps_the_rows_asked_for() {
        let sql = "insert into orders (customer_id, v) values (1, 'a'), ($1, $2), (3, 'c') on conflict do nothing";
        assert_eq!(
            insert_rows(sql, &[0, 2]).expect("split"),
            "INSERT INTO orders (customer_id, v) VALUES (1, 'a'), (3, 'c') ON CONFLICT DO NOTHING"
        );
        assert_eq!(
            insert_rows(sql, &[1]).expect("split"),
            "INSERT INTO orders (customer_id, v) VALUES ($1, $2) ON CONFLICT DO NOTHING"
        );
        assert!(insert_rows(sql, &[5]).is_err());
        assert!(insert_rows("select 1", &[0]).is_err());
    }
}
