//! A SELECT that every shard group must answer: the statement each group runs, and how the
//! proxy merges the groups' rows into the one answer a single server would give. Rows are
//! concatenated; with `ORDER BY` each group sorts its own rows and the proxy merges the sorted
//! streams on the sort keys (appended to the group's select list as hidden columns when they
//! are not output columns already); with `LIMIT n OFFSET m` each group is asked for `n + m`
//! rows and the proxy skips `m` and stops after `n`. Anything whose merge is not built is
//! refused with a message naming the construct (the caller answers SQLSTATE 0A000); nothing
//! is ever answered partially or wrongly.

use pg_query::protobuf::{self, a_const, node, Node};
use serde_json::Value;

mod combine;

pub use combine::Combine;

/// How a SELECT runs on every group and is merged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FanOut {
    /// The statement each group runs (parameters unchanged).
    pub sql: String,
    /// The merge order, over the group statement's output columns.
    pub sort: Vec<SortKey>,
    /// Columns appended to the select list for sorting, removed before the client sees rows.
    pub hidden: usize,
    /// `LIMIT` (`None`: all rows).
    pub limit: Option<Bound>,
    /// `OFFSET` (`None`: none).
    pub offset: Option<Bound>,
    /// Aggregates, GROUP BY, HAVING or DISTINCT: `sql` is the partial query, and the answer
    /// is computed from the groups' partial rows by this final query (which orders and limits;
    /// `sort`, `limit` and `offset` are then empty).
    pub combine: Option<Combine>,
}

/// A LIMIT or OFFSET.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// A constant.
    Const(i64),
    /// `$n` (1-based), read from the Bind.
    Param(u32),
}

/// One key of the merge order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SortKey {
    /// The output column (0-based) of the group statement that holds the key.
    pub column: SortColumn,
    /// `DESC`.
    pub descending: bool,
    /// NULLs come first (PostgreSQL's default: with `DESC`).
    pub nulls_first: bool,
}

/// Where a sort key is in a group's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortColumn {
    /// A column the client sees (`ORDER BY 2`): its 0-based position.
    Output(usize),
    /// The n-th (0-based) hidden column appended after the client's columns.
    Hidden(usize),
}

/// What a fan-out SELECT may not contain yet, or ever: the construct, for the message.
fn unsupported(what: &str) -> String {
    format!("{what} over distributed tables needs rows from several shard groups combined, which is not supported")
}

/// Plans the fan-out of `sql`, a lone SELECT on distributed tables not restricted to one
/// group. `is_aggregate(name)` says whether a function name (as written, possibly
/// schema-qualified) may be an aggregate; unknown names should answer true.
pub fn fan_out(sql: &str, is_aggregate: &dyn Fn(&str) -> bool) -> Result<FanOut, String> {
    let parsed = pg_query::parse(sql, 0).map_err(|e| e.to_string())?;
    let mut tree = parsed.protobuf;
    let [raw] = tree.stmts.as_mut_slice() else {
        return Err("send a SELECT across shard groups as a statement of its own".into());
    };
    let Some(node::Node::SelectStmt(select)) = raw.stmt.as_mut().and_then(|s| s.node.as_mut())
    else {
        return Err("only SELECT can read distributed tables across shard groups".into());
    };
    check(select, is_aggregate)?;
    if sql.contains("herd_partial") || sql.contains("herd_keep") {
        return Err(
            "herd_partial and herd_keep are names Herd uses in queries across shard groups".into(),
        );
    }
    let json = |nodes: &[Node]| serde_json::to_value(nodes).unwrap_or(Value::Null);
    let aggregates = [json(&select.target_list), json(&select.sort_clause)]
        .iter()
        .any(|part| aggregate_or_window(part, is_aggregate).is_some());
    if aggregates
        || !select.distinct_clause.is_empty()
        || !select.group_clause.is_empty()
        || select.having_clause.is_some()
    {
        let combine = combine::plan(select, is_aggregate)?;
        let sql = pg_query::deparse(&tree, Default::default()).map_err(|e| e.to_string())?;
        return Ok(FanOut {
            sql,
            sort: Vec::new(),
            hidden: 0,
            limit: None,
            offset: None,
            combine: Some(combine),
        });
    }
    let sort = sort_keys(select)?;
    let limit = bound(select.limit_count.as_deref(), "LIMIT")?;
    let offset = bound(select.limit_offset.as_deref(), "OFFSET")?;
    // Each group returns the first `limit + offset` rows; the proxy skips the offset.
    if let Some(off) = offset {
        let group_limit = match (limit, off) {
            (None, _) => None,
            (Some(Bound::Const(n)), Bound::Const(m)) => Some(n.saturating_add(m.max(0))),
            _ => {
                return Err(unsupported(
                    "LIMIT and OFFSET given as parameters together (write them as constants)",
                ))
            }
        };
        select.limit_offset = None;
        select.limit_count = group_limit.map(|n| Box::new(int_const(n)));
    }
    let hidden = sort
        .iter()
        .filter(|(key, _)| matches!(key.column, SortColumn::Hidden(_)))
        .count();
    for (i, (_, expr)) in sort.iter().enumerate() {
        if let Some(expr) = expr {
            select.target_list.push(Node {
                node: Some(node::Node::ResTarget(Box::new(protobuf::ResTarget {
                    name: format!("herd_sort_{i}"),
                    indirection: Vec::new(),
                    val: Some(Box::new(expr.clone())),
                    location: -1,
                }))),
            });
        }
    }
    let sql = pg_query::deparse(&tree, Default::default()).map_err(|e| e.to_string())?;
    Ok(FanOut {
        sql,
        sort: sort.into_iter().map(|(k, _)| k).collect(),
        hidden,
        limit,
        offset,
        combine: None,
    })
}

/// Refuses what the merge cannot answer exactly.
fn check(s: &protobuf::SelectStmt, is_aggregate: &dyn Fn(&str) -> bool) -> Result<(), String> {
    if s.op != protobuf::SetOperation::SetopNone as i32 {
        return Err(unsupported("UNION, INTERSECT or EXCEPT"));
    }
    if s.with_clause.is_some() {
        return Err(unsupported("a WITH query (CTE)"));
    }
    if s.into_clause.is_some() {
        return Err(unsupported("SELECT INTO"));
    }
    if !s.window_clause.is_empty() {
        return Err(unsupported("a window function"));
    }
    if s.limit_option == protobuf::LimitOption::WithTies as i32 {
        return Err(unsupported("FETCH … WITH TIES"));
    }
    let json = |nodes: &[Node]| serde_json::to_value(nodes).unwrap_or(Value::Null);
    for part in [json(&s.target_list), json(&s.sort_clause)] {
        if let Some(what) = aggregate_or_window(&part, is_aggregate) {
            if what.starts_with("the window function") {
                return Err(unsupported(&what));
            }
        }
    }
    if let Some(name) = collation(&json(&s.sort_clause)) {
        return Err(unsupported(&format!(
            "ORDER BY … COLLATE \"{name}\" (the merge compares text in byte order, COLLATE \"C\")"
        )));
    }
    Ok(())
}

/// A collation other than byte order written in `v` (the sort keys), if any.
fn collation(v: &Value) -> Option<String> {
    match v {
        Value::Object(map) => {
            if let Some(c) = map.get("CollateClause") {
                let name = func_name(&serde_json::json!({ "funcname": c.get("collname") }));
                if !matches!(
                    name.as_str(),
                    "C" | "POSIX" | "pg_catalog.C" | "pg_catalog.POSIX"
                ) {
                    return Some(name);
                }
            }
            map.values().find_map(collation)
        }
        Value::Array(items) => items.iter().find_map(collation),
        _ => None,
    }
}

/// The first aggregate or window call in `v` outside subqueries, described.
fn aggregate_or_window(v: &Value, is_aggregate: &dyn Fn(&str) -> bool) -> Option<String> {
    match v {
        Value::Object(map) => {
            if map.contains_key("SubLink") {
                // A subquery is run whole by each group (on reference tables; the planner
                // refuses distributed tables read there), its aggregates are its own.
                return None;
            }
            if let Some(call) = map.get("FuncCall") {
                let name = func_name(call);
                if call.get("over").is_some_and(|o| !o.is_null()) {
                    return Some(format!("the window function {name}"));
                }
                let flagged = ["agg_star", "agg_distinct", "agg_within_group"]
                    .iter()
                    .any(|k| call.get(*k).and_then(Value::as_bool) == Some(true))
                    || call.get("agg_filter").is_some_and(|f| !f.is_null())
                    || call
                        .get("agg_order")
                        .and_then(Value::as_array)
                        .is_some_and(|a| !a.is_empty());
                if flagged || is_aggregate(&name) {
                    return Some(format!("the aggregate {name}()"));
                }
            }
            map.values()
                .find_map(|x| aggregate_or_window(x, is_aggregate))
        }
        Value::Array(items) => items
            .iter()
            .find_map(|x| aggregate_or_window(x, is_aggregate)),
        _ => None,
    }
}

/// A FuncCall's name as written (`schema.name` or `name`).
fn func_name(call: &Value) -> String {
    call.get("funcname")
        .and_then(Value::as_array)
        .map(|parts| {
            parts
                .iter()
                .filter_map(|p| p.pointer("/node/String/sval").and_then(Value::as_str))
                .collect::<Vec<_>>()
                .join(".")
        })
        .unwrap_or_default()
}

/// The ORDER BY keys; each hidden one with the expression to append.
fn sort_keys(s: &protobuf::SelectStmt) -> Result<Vec<(SortKey, Option<Node>)>, String> {
    let mut keys = Vec::new();
    let mut hidden = 0;
    for item in &s.sort_clause {
        let Some(node::Node::SortBy(by)) = &item.node else {
            return Err(unsupported("this ORDER BY"));
        };
        let descending = match by.sortby_dir {
            d if d == protobuf::SortByDir::SortbyDesc as i32 => true,
            d if d == protobuf::SortByDir::SortbyUsing as i32 => {
                return Err(unsupported("ORDER BY … USING"))
            }
            _ => false,
        };
        let nulls_first = match by.sortby_nulls {
            n if n == protobuf::SortByNulls::SortbyNullsFirst as i32 => true,
            n if n == protobuf::SortByNulls::SortbyNullsLast as i32 => false,
            _ => descending,
        };
        let Some(expr) = by.node.as_deref() else {
            return Err(unsupported("this ORDER BY"));
        };
        let (column, append) = match position(expr) {
            Some(p) if p >= 1 => (SortColumn::Output(p as usize - 1), None),
            Some(_) => return Err("ORDER BY position out of range".into()),
            None => {
                // A name the select list gives (`sum(x) AS total … ORDER BY total`) means that
                // entry's expression, as in PostgreSQL.
                let expr = alias_target(s, expr).unwrap_or(expr).clone();
                hidden += 1;
                (SortColumn::Hidden(hidden - 1), Some(expr))
            }
        };
        keys.push((
            SortKey {
                column,
                descending,
                nulls_first,
            },
            append,
        ));
    }
    Ok(keys)
}

/// `ORDER BY 2`: the integer constant.
fn position(expr: &Node) -> Option<i64> {
    match &expr.node {
        Some(node::Node::AConst(c)) => match &c.val {
            Some(a_const::Val::Ival(i)) => Some(i64::from(i.ival)),
            _ => None,
        },
        _ => None,
    }
}

/// The select list's expression named `expr` when `expr` is a bare name given as an alias.
fn alias_target<'a>(s: &'a protobuf::SelectStmt, expr: &Node) -> Option<&'a Node> {
    let Some(node::Node::ColumnRef(c)) = &expr.node else {
        return None;
    };
    let [field] = c.fields.as_slice() else {
        return None;
    };
    let Some(node::Node::String(name)) = &field.node else {
        return None;
    };
    s.target_list.iter().find_map(|t| match &t.node {
        Some(node::Node::ResTarget(r)) if r.name == name.sval => r.val.as_deref(),
        _ => None,
    })
}

/// A LIMIT/OFFSET value: a constant, a parameter, or none (`LIMIT ALL`, `LIMIT NULL`).
fn bound(expr: Option<&Node>, what: &str) -> Result<Option<Bound>, String> {
    let Some(expr) = expr else {
        return Ok(None);
    };
    match &expr.node {
        Some(node::Node::AConst(c)) => match &c.val {
            None => Ok(None),
            Some(a_const::Val::Ival(i)) => Ok(Some(Bound::Const(i64::from(i.ival)))),
            Some(a_const::Val::Fval(f)) => f
                .fval
                .parse()
                .map(|n| Some(Bound::Const(n)))
                .map_err(|_| format!("{what} must be an integer")),
            _ => Err(format!("{what} must be an integer")),
        },
        Some(node::Node::ParamRef(p)) => u32::try_from(p.number)
            .map(|n| Some(Bound::Param(n)))
            .map_err(|_| format!("{what}: bad parameter")),
        // `CAST(3 AS smallint)` (how an SQL EXECUTE's argument is written in): an integer
        // constant converted to an integer type is that constant.
        Some(node::Node::TypeCast(c)) if integer_type(c.type_name.as_ref()) => {
            match c.arg.as_deref().map(|a| bound(Some(a), what)) {
                Some(Ok(b @ (None | Some(Bound::Const(_))))) => Ok(b),
                _ => Err(unsupported(&format!(
                    "{what} given as an expression (write a constant or a parameter)"
                ))),
            }
        }
        _ => Err(unsupported(&format!(
            "{what} given as an expression (write a constant or a parameter)"
        ))),
    }
}

/// `int2`, `int4` or `int8`, without modifiers or array bounds.
fn integer_type(t: Option<&protobuf::TypeName>) -> bool {
    t.is_some_and(|t| {
        t.typmods.is_empty()
            && t.array_bounds.is_empty()
            && matches!(
                t.names.last().and_then(|n| n.node.as_ref()),
                Some(node::Node::String(s)) if matches!(s.sval.as_str(), "int2" | "int4" | "int8")
            )
    })
}

fn int_const(n: i64) -> Node {
    let val = match i32::try_from(n) {
        Ok(i) => a_const::Val::Ival(protobuf::Integer { ival: i }),
        Err(_) => a_const::Val::Fval(protobuf::Float {
            fval: n.to_string(),
        }),
    };
    Node {
        node: Some(node::Node::AConst(protobuf::AConst {
            isnull: false,
            location: -1,
            val: Some(val),
        })),
    }
}

#[cfg(test)]
mod tests;
