//! The clauses of a statement that say where its rows are: the FROM list (tables, joins,
//! aliases), the WHERE clause's equalities and key conditions, key expressions and the
//! targets of an INSERT or UPDATE.

use serde_json::Value;

use super::*;

pub(super) fn select(s: &Value, f: &mut KeyFacts) {
    if !s["larg"].is_null() || !s["with_clause"].is_null() {
        f.nested = true;
    }
    from_list(&s["from_clause"], f);
    f.nested |= contains_sublink(&s["target_list"])
        || contains_sublink(&s["having_clause"])
        || contains_sublink(&s["sort_clause"]);
    where_clause(&s["where_clause"], f);
}

pub(super) fn from_list(list: &Value, f: &mut KeyFacts) {
    for item in list.as_array().into_iter().flatten() {
        from_item(item, f);
    }
}

/// A FROM item: a table, or a join of tables (its tables count as top-level: each is still
/// tied to its own key condition); anything else (a subquery, a function) is nesting.
pub(super) fn from_item(item: &Value, f: &mut KeyFacts) {
    let node = &item["node"];
    if let Some(t) = range_var(&node["RangeVar"]) {
        f.opaque_from |= node["RangeVar"]["alias"]["colnames"]
            .as_array()
            .is_some_and(|c| !c.is_empty());
        f.tables.push(t);
    } else if let Some(j) = node.get("JoinExpr") {
        f.opaque_from |= !j["alias"].is_null();
        from_item(&j["larg"], f);
        from_item(&j["rarg"], f);
        f.nested |= contains_sublink(&j["quals"]);
        // An inner join's ON restricts both sides like WHERE.
        let kind = j["jointype"].as_i64();
        let inner = kind == Some(pg_query::protobuf::JoinType::JoinInner as i64);
        let side = |keep: &Value, other: &Value| {
            let (mut preserved, mut joined) = (Vec::new(), Vec::new());
            all_range_vars(keep, &mut preserved);
            all_range_vars(other, &mut joined);
            OuterSide {
                preserved,
                other: joined,
            }
        };
        use pg_query::protobuf::JoinType;
        if kind == Some(JoinType::JoinLeft as i64) || kind == Some(JoinType::JoinFull as i64) {
            f.outer_joins.push(side(&j["larg"], &j["rarg"]));
        }
        if kind == Some(JoinType::JoinRight as i64) || kind == Some(JoinType::JoinFull as i64) {
            f.outer_joins.push(side(&j["rarg"], &j["larg"]));
        }
        if !j["quals"].is_null() {
            conjuncts(&j["quals"], f, inner);
        }
        if let (Some(l), Some(r)) = (range_name(&j["larg"]), range_name(&j["rarg"])) {
            for c in j["using_clause"].as_array().into_iter().flatten() {
                if let Some(col) = c["node"]["String"]["sval"].as_str() {
                    f.equalities
                        .push(((Some(l.clone()), col.into()), (Some(r.clone()), col.into())));
                }
            }
        }
    } else {
        f.nested = true;
        f.opaque_from = true;
    }
}

pub(super) fn range_var(rv: &Value) -> Option<TableRef> {
    let rel = rv.get("relname")?.as_str()?;
    let schema = rv["schemaname"].as_str().unwrap_or("");
    Some(TableRef {
        name: if schema.is_empty() {
            rel.to_string()
        } else {
            format!("{schema}.{rel}")
        },
        alias: rv["alias"]["aliasname"].as_str().map(str::to_string),
    })
}

pub(super) fn where_clause(w: &Value, f: &mut KeyFacts) {
    if w.is_null() {
        return;
    }
    f.nested |= contains_sublink(w);
    conjuncts(w, f, true);
}

/// The top-level conjuncts of `w`: column equalities always, value conditions when
/// `conditions` (not from the ON of an outer join, which does not restrict the preserved side).
pub(super) fn conjuncts(w: &Value, f: &mut KeyFacts, conditions: bool) {
    let node = &w["node"];
    // AND of conjuncts (boolop 1 = AND_EXPR), or a single condition.
    let single = [w.clone()];
    let parts: &[Value] = match node.get("BoolExpr") {
        Some(b) if b["boolop"].as_i64() == Some(1) => b["args"].as_array().map_or(&[], |a| a),
        Some(_) => return,
        None => &single,
    };
    for arg in parts {
        if let Some(eq) = equality(&arg["node"]) {
            f.equalities.push(eq);
        } else if let Some(c) = condition(&arg["node"]).filter(|_| conditions) {
            f.conditions.push(c);
        }
    }
}

/// `a.x = b.y`.
pub(super) fn equality(node: &Value) -> Option<(ColumnName, ColumnName)> {
    let e = node.get("AExpr")?;
    let op = e["name"].as_array()?.last()?["node"]["String"]["sval"].as_str()?;
    if op != "=" || e["kind"].as_i64()? != 1 {
        return None;
    }
    Some((
        column_ref(&e["lexpr"]["node"])?,
        column_ref(&e["rexpr"]["node"])?,
    ))
}

/// The name a FROM item that is a plain table goes by (its alias, else its name).
pub(super) fn range_name(item: &Value) -> Option<String> {
    let t = range_var(&item["node"]["RangeVar"])?;
    Some(
        t.alias
            .unwrap_or_else(|| t.name.rsplit('.').next().unwrap_or(&t.name).to_string()),
    )
}

/// `col = value`, `value = col` or `col IN (…)`.
pub(super) fn condition(node: &Value) -> Option<Condition> {
    let e = node.get("AExpr")?;
    let op = e["name"].as_array()?.last()?["node"]["String"]["sval"].as_str()?;
    if op != "=" {
        return None;
    }
    // kind 1 = AEXPR_OP, 7 = AEXPR_IN.
    match e["kind"].as_i64()? {
        1 => {
            if let Some((q, c)) = column_ref(&e["lexpr"]["node"]) {
                return Some(Condition {
                    qualifier: q,
                    column: c,
                    values: vec![key_expr(&e["rexpr"])],
                });
            }
            let (q, c) = column_ref(&e["rexpr"]["node"])?;
            Some(Condition {
                qualifier: q,
                column: c,
                values: vec![key_expr(&e["lexpr"])],
            })
        }
        7 => {
            let (q, c) = column_ref(&e["lexpr"]["node"])?;
            let values = e["rexpr"]["node"]["List"]["items"]
                .as_array()?
                .iter()
                .map(key_expr)
                .collect();
            Some(Condition {
                qualifier: q,
                column: c,
                values,
            })
        }
        _ => None,
    }
}

pub(super) fn column_ref(node: &Value) -> Option<(Option<String>, String)> {
    let fields: Vec<&str> = node
        .get("ColumnRef")?
        .get("fields")?
        .as_array()?
        .iter()
        .map(|f| f["node"]["String"]["sval"].as_str())
        .collect::<Option<Vec<_>>>()?;
    match fields.as_slice() {
        [c] => Some((None, c.to_string())),
        [q, c] => Some((Some(q.to_string()), c.to_string())),
        // schema.table.column: the table name qualifies it.
        [_, q, c] => Some((Some(q.to_string()), c.to_string())),
        _ => None,
    }
}

pub(crate) fn key_expr(v: &Value) -> KeyExpr {
    let node = &v["node"];
    if let Some(c) = node.get("AConst") {
        if c["isnull"].as_bool() == Some(true) {
            return KeyExpr::Const(None);
        }
        let val = &c["val"];
        let text = if let Some(i) = val["Ival"].get("ival") {
            Some(i.as_i64().unwrap_or(0).to_string())
        } else if let Some(s) = val["Sval"]["sval"].as_str() {
            Some(s.to_string())
        } else {
            // A bigint literal beyond int4 arrives as a Float node with its digits.
            val["Fval"]["fval"].as_str().map(str::to_string)
        };
        return match text {
            Some(t) => KeyExpr::Const(Some(t)),
            None => KeyExpr::Other,
        };
    }
    if let Some(p) = node.get("ParamRef") {
        return match p["number"].as_u64() {
            Some(n) if n > 0 => KeyExpr::Param(n as u32),
            _ => KeyExpr::Other,
        };
    }
    if let Some(cast) = node.get("TypeCast") {
        // '42'::bigint — the literal's text and the type; the planner reads it by the key's
        // own type when that is the type it is converted to.
        let t = &cast["type_name"];
        let mut name = t["names"]
            .as_array()
            .and_then(|n| n.last())
            .and_then(|n| n["node"]["String"]["sval"].as_str())
            .unwrap_or("?")
            .to_string();
        if t["typmods"].as_array().is_some_and(|m| !m.is_empty()) {
            name.push_str("(…)");
        }
        if t["array_bounds"].as_array().is_some_and(|b| !b.is_empty()) {
            name.push_str("[]");
        }
        return KeyExpr::Cast(Box::new(key_expr(&cast["arg"])), name);
    }
    KeyExpr::Other
}

/// The column names of a list of `ResTarget`s (an INSERT's columns, an UPDATE's SET).
pub(super) fn target_names(list: &Value) -> Vec<String> {
    list.as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["node"]["ResTarget"]["name"].as_str())
        .map(str::to_string)
        .collect()
}

/// A target list entry.
pub(super) fn target(v: &Value) -> Target {
    if let Some((qualifier, column)) = column_ref(&v["node"]) {
        return Target::Column(qualifier, column);
    }
    match key_expr(v) {
        KeyExpr::Other => Target::Other,
        e => Target::Value(e),
    }
}
