//! Statements Herd answers or follows itself: calls of its `herd.*` functions, and the roles a
//! `DROP ROLE` names (dropped on every shard group).

use crate::keys::key_expr;
use crate::KeyExpr;

/// `SELECT herd.<function>('text', …)` alone, with only string literals as arguments: the
/// function name and its arguments. Herd's own administrative functions are called this way
/// through the endpoint.
pub fn herd_call(sql: &str) -> Option<(String, Vec<String>)> {
    let (function, args) = herd_call_args(sql)?;
    let args = args.into_iter().map(literal).collect::<Option<Vec<_>>>()?;
    Some((function, args))
}

/// `SELECT herd.<function>(…)` alone, with string literals or parameters (`$n`, also
/// converted: `$1::regclass`) as arguments: the function name and its arguments as written.
/// Drivers send such calls with bound parameters.
pub fn herd_call_args(sql: &str) -> Option<(String, Vec<KeyExpr>)> {
    let parsed = std::panic::catch_unwind(|| pg_query::parse(sql, 0))
        .ok()?
        .ok()?;
    let stmts = &parsed.protobuf.stmts;
    if stmts.len() != 1 {
        return None;
    }
    let value = serde_json::to_value(stmts[0].stmt.as_ref()?).ok()?;
    let s = value.get("node")?.get("SelectStmt")?;
    let plain = s["from_clause"].as_array().is_none_or(|a| a.is_empty())
        && s["where_clause"].is_null()
        && s["larg"].is_null();
    let targets = s["target_list"].as_array()?;
    if !plain || targets.len() != 1 {
        return None;
    }
    let call = targets[0]["node"]["ResTarget"]["val"]["node"].get("FuncCall")?;
    let name: Vec<&str> = call["funcname"]
        .as_array()?
        .iter()
        .map(|n| n["node"]["String"]["sval"].as_str())
        .collect::<Option<_>>()?;
    let [schema, function] = name.as_slice() else {
        return None;
    };
    if *schema != "herd" {
        return None;
    }
    let args = call["args"]
        .as_array()
        .map(|a| a.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|a| match key_expr(a) {
            KeyExpr::Other => None,
            e => Some(e),
        })
        .collect::<Option<Vec<_>>>()?;
    Some((function.to_string(), args))
}

/// A string literal, also converted (`'s.t'::regclass`).
fn literal(e: KeyExpr) -> Option<String> {
    match e {
        KeyExpr::Const(t) => t,
        KeyExpr::Cast(inner, _) => literal(*inner),
        _ => None,
    }
}

#[cfg(test)]
mod call_tests {
    use super::herd_call;

    #[test]
    fn herd_calls() {
        assert_eq!(
            herd_call("SELECT herd.create_distributed_table('orders', 'customer_id')"),
            Some((
                "create_distributed_table".into(),
                vec!["orders".into(), "customer_id".into()]
            ))
        );
        assert_eq!(
            herd_call("select herd.create_reference_table('s.countries'::regclass)"),
            Some(("create_reference_table".into(), vec!["s.countries".into()]))
        );
        assert_eq!(herd_call("select other.f('x')"), None);
        assert_eq!(herd_call("select herd.f(x)"), None);
        assert_eq!(herd_call("select herd.f('x') from t"), None);
        assert_eq!(herd_call("select herd.f('x'); select 1"), None);
        assert_eq!(
            herd_call("select herd.f($1)"),
            None,
            "a parameter is no literal"
        );
        assert_eq!(
            super::herd_call_args("select herd.create_distributed_table($1, $2::text)"),
            Some((
                "create_distributed_table".into(),
                vec![
                    crate::KeyExpr::Param(1),
                    crate::KeyExpr::Cast(Box::new(crate::KeyExpr::Param(2)), "text".into())
                ]
            ))
        );
    }
}

/// The roles a `DROP ROLE`/`DROP USER` statement names (empty for anything else).
pub fn dropped_roles(sql: &str) -> Vec<String> {
    let Some(parsed) = std::panic::catch_unwind(|| pg_query::parse(sql, 0))
        .ok()
        .and_then(Result::ok)
    else {
        return Vec::new();
    };
    let Some(value) = parsed
        .protobuf
        .stmts
        .first()
        .and_then(|s| s.stmt.as_ref())
        .and_then(|n| serde_json::to_value(n).ok())
    else {
        return Vec::new();
    };
    value["node"]["DropRoleStmt"]["roles"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| r["node"]["RoleSpec"]["rolename"].as_str())
        .map(str::to_string)
        .collect()
}

#[cfg(test)]
mod role_tests {
    #[test]
    fn dropped_roles() {
        assert_eq!(
            super::dropped_roles("drop role if exists app, \"Odd Name\""),
            vec!["app".to_string(), "Odd Name".to_string()]
        );
        assert_eq!(super::dropped_roles("drop user x"), vec!["x".to_string()]);
        assert!(super::dropped_roles("drop table t").is_empty());
        assert!(super::dropped_roles("selec").is_empty());
    }
}
