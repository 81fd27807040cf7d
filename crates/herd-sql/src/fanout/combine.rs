//! Aggregates, GROUP BY, HAVING and DISTINCT across shard groups, answered as one server
//! would: every group runs a *partial* query (its group keys and partial aggregates: count,
//! sum, min, max, bool_and/or, and sum with count for avg), and the final answer is computed
//! by PostgreSQL itself from the groups' partial rows (a query over `VALUES` on one group's
//! primary), so result types, numeric scales, NULLs, HAVING, ORDER BY and LIMIT are
//! PostgreSQL's own. Expressions are rewritten over the partial columns `c0, c1, …`; a
//! construct the rewrite does not know is refused, never guessed.

use pg_query::protobuf::{self, node, Node};
use serde_json::Value;

use super::{func_name, unsupported};

/// The final query's source, replaced by the partial rows' VALUES.
const SOURCE: &str = "herd_partial";
/// Placeholders the final SQL carries until the partial columns' types are known.
const SUM: &str = "herd_partial_sum";
const AVG: &str = "herd_partial_avg";

/// How partial rows combine into the answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Combine {
    /// The final query over `herd_partial(c0, …, herd_keep)`, with placeholders.
    final_sql: String,
    /// How many partial columns the groups return.
    pub columns: usize,
}

/// Type names of the partial sums the final query casts back to (the type a single server's
/// sum returns), by OID.
fn sum_type(oid: u32) -> Option<&'static str> {
    Some(match oid {
        20 => "int8",
        21 => "int2",
        23 => "int4",
        700 => "float4",
        701 => "float8",
        790 => "money",
        1186 => "interval",
        1700 => "numeric",
        _ => return None,
    })
}

impl Combine {
    /// The final query for partial columns of `types` (OIDs, in order): `first_param` is
    /// the number of the first parameter carrying partial values (the client's come first),
    /// `rows` how many partial rows there are.
    pub fn final_sql(
        &self,
        types: &[u32],
        first_param: usize,
        rows: usize,
    ) -> Result<String, String> {
        self.final_sql_collated(types, &[], first_param, rows)
    }

    /// [`Combine::final_sql`], the values of partial column i given collation
    /// `collations[i]` (a quoted name) where it is `Some`: a parameter has the database's
    /// default collation, and the final query must group, compare and order a column's values
    /// as the column's own collation does (a case-insensitive one groups 'a' with 'A').
    pub fn final_sql_collated(
        &self,
        types: &[u32],
        collations: &[Option<String>],
        first_param: usize,
        rows: usize,
    ) -> Result<String, String> {
        if types.len() != self.columns {
            return Err("a shard group answered the partial query with other columns".into());
        }
        let mut sql = self.final_sql.clone();
        // Placeholders: herd_partial_sum(cN), herd_partial_avg(cN, cM).
        for (i, oid) in types.iter().enumerate() {
            let sum = format!("{SUM}(c{i})");
            if sql.contains(&sum) {
                let t = sum_type(*oid)
                    .ok_or_else(|| unsupported(&format!("sum() of a value of type OID {oid}")))?;
                sql = sql.replace(&sum, &format!("sum(c{i})::{t}"));
            }
            let avg = format!("{AVG}(c{i}, c{})", i + 1);
            if sql.contains(&avg) {
                // avg is sum / count as PostgreSQL's final functions compute it: numeric
                // division for integers and numeric, float8 division for floats.
                let t = match oid {
                    20 | 1700 => "numeric",
                    701 => "float8",
                    _ => return Err(unsupported(&format!("avg() of a value of type OID {oid}"))),
                };
                sql = sql.replace(
                    &avg,
                    &format!("(sum(c{i})::{t} / nullif(sum(c{}), 0)::{t})", i + 1),
                );
            }
        }
        // The partial rows, as parameters typed like the partial columns; no rows at all is
        // one row of NULLs left out by herd_keep.
        let width = self.columns + 1;
        let mut values = Vec::new();
        for r in 0..rows.max(1) {
            let cells: Vec<String> = (0..width)
                .map(|c| {
                    let param = format!("${}", first_param + r * width + c);
                    match collations.get(c).and_then(Option::as_deref) {
                        Some(collation) => format!("{param} COLLATE {collation}"),
                        None => param,
                    }
                })
                .collect();
            values.push(format!("({})", cells.join(", ")));
        }
        let names: Vec<String> = (0..self.columns).map(|i| format!("c{i}")).collect();
        let from = format!(
            "(VALUES {}) AS {SOURCE}({}, herd_keep)",
            values.join(", "),
            names.join(", ")
        );
        let target = format!("FROM {SOURCE} ");
        let at = sql
            .find(&target)
            .ok_or_else(|| "the final query lost its source".to_string())?;
        sql.replace_range(at + 5..at + 5 + SOURCE.len(), &from);
        Ok(sql)
    }
}

/// Builds the partial query (into `s`, in place) and the final query, for a SELECT with
/// aggregates, GROUP BY, HAVING or DISTINCT.
pub(super) fn plan(
    s: &mut protobuf::SelectStmt,
    is_aggregate: &dyn Fn(&str) -> bool,
) -> Result<Combine, String> {
    if s.group_distinct {
        return Err(unsupported("GROUP BY DISTINCT"));
    }
    let distinct = !s.distinct_clause.is_empty();
    if distinct && s.distinct_clause.iter().any(|d| d.node.is_some()) {
        return Err(unsupported("DISTINCT ON"));
    }
    let targets: Vec<(String, Node)> = s
        .target_list
        .iter()
        .map(|t| match &t.node {
            Some(node::Node::ResTarget(r)) => match r.val.as_deref() {
                Some(v) if is_star(v) => Err(unsupported("* in a query that aggregates")),
                Some(v) => Ok((output_name(&r.name, v), v.clone())),
                None => Err(unsupported("this select list")),
            },
            _ => Err(unsupported("this select list")),
        })
        .collect::<Result<_, _>>()?;
    // The group keys: GROUP BY's expressions (positions and output names resolved), or every
    // output column for a plain DISTINCT.
    let mut keys: Vec<Node> = Vec::new();
    for g in &s.group_clause {
        let key = match &g.node {
            Some(node::Node::GroupingSet(_)) => {
                return Err(unsupported("GROUPING SETS, ROLLUP or CUBE"))
            }
            _ => resolve(g, &targets)?,
        };
        keys.push(key);
    }
    let mut r = Rewrite {
        keys: keys.iter().map(text).collect::<Result<_, _>>()?,
        partials: Vec::new(),
        grouped: Vec::new(),
        is_aggregate,
    };
    let aggregates =
        s.group_clause.is_empty() && targets.iter().any(|(_, v)| has_aggregate(v, is_aggregate));
    if distinct && s.group_clause.is_empty() && !aggregates {
        keys = targets.iter().map(|(_, v)| v.clone()).collect();
        r.keys = keys.iter().map(text).collect::<Result<_, _>>()?;
    }
    let mut final_targets = Vec::new();
    for (name, v) in &targets {
        final_targets.push(res_target(name, r.expr(v)?));
    }
    let having = s.having_clause.as_deref().map(|h| r.expr(h)).transpose()?;
    let mut sort = Vec::new();
    for item in &s.sort_clause {
        let Some(node::Node::SortBy(by)) = &item.node else {
            return Err(unsupported("this ORDER BY"));
        };
        let mut by = (**by).clone();
        if let Some(n) = by.node.as_deref() {
            // Positions and output names mean the same in the final query (same select list).
            let keep = matches!(&n.node, Some(node::Node::AConst(_))) || output_alias(n, &targets);
            if !keep {
                by.node = Some(Box::new(r.expr(n)?));
            }
        }
        sort.push(Node {
            node: Some(node::Node::SortBy(Box::new(by))),
        });
    }
    // The partial query: keys, then partial aggregates; grouped by the keys.
    let key_count = keys.len();
    let mut partial_targets: Vec<Node> = keys
        .iter()
        .enumerate()
        .map(|(i, k)| res_target(&format!("c{i}"), k.clone()))
        .collect();
    for (j, p) in r.partials.iter().enumerate() {
        partial_targets.push(res_target(&format!("c{}", key_count + j), p.clone()));
    }
    let columns = partial_targets.len();
    s.target_list = partial_targets;
    s.group_clause = keys;
    for j in &r.grouped {
        if let Some(p) = r.partials.get(*j) {
            s.group_clause.push(p.clone());
        }
    }
    s.having_clause = None;
    s.sort_clause = Vec::new();
    s.distinct_clause = Vec::new();
    let (limit, offset) = (s.limit_count.take(), s.limit_offset.take());
    let limit_option =
        std::mem::replace(&mut s.limit_option, protobuf::LimitOption::Default as i32);
    // The final query, over the partial rows.
    let final_select = protobuf::SelectStmt {
        distinct_clause: if distinct {
            vec![Node { node: None }]
        } else {
            Vec::new()
        },
        target_list: final_targets,
        from_clause: vec![Node {
            node: Some(node::Node::RangeVar(protobuf::RangeVar {
                relname: SOURCE.into(),
                inh: true,
                relpersistence: "p".into(),
                location: -1,
                ..Default::default()
            })),
        }],
        where_clause: Some(Box::new(column("herd_keep"))),
        group_clause: (0..key_count).map(|i| column(&format!("c{i}"))).collect(),
        having_clause: having.map(Box::new),
        sort_clause: sort,
        limit_count: limit,
        limit_offset: offset,
        limit_option,
        op: protobuf::SetOperation::SetopNone as i32,
        ..Default::default()
    };
    let final_sql = deparse_select(final_select)?;
    Ok(Combine { final_sql, columns })
}

/// The SQL text of a SELECT statement.
fn deparse_select(select: protobuf::SelectStmt) -> Result<String, String> {
    let tree = protobuf::ParseResult {
        version: 0,
        stmts: vec![protobuf::RawStmt {
            stmt: Some(Box::new(Node {
                node: Some(node::Node::SelectStmt(Box::new(select))),
            })),
            stmt_location: 0,
            stmt_len: 0,
        }],
    };
    pg_query::deparse(&tree, Default::default()).map_err(|e| e.to_string())
}

/// Rewrites expressions over the partial columns, collecting the partial aggregates.
struct Rewrite<'a> {
    /// The group keys' text.
    keys: Vec<String>,
    /// Partial aggregate expressions, in column order after the keys.
    partials: Vec<Node>,
    /// Which partial columns are grouped by too (the arguments of DISTINCT aggregates).
    grouped: Vec<usize>,
    is_aggregate: &'a dyn Fn(&str) -> bool,
}

impl Rewrite<'_> {
    /// The partial column of a new partial aggregate.
    fn partial(&mut self, call: protobuf::FuncCall) -> Node {
        let n = self.keys.len() + self.partials.len();
        self.partials.push(Node {
            node: Some(node::Node::FuncCall(Box::new(call))),
        });
        column(&format!("c{n}"))
    }

    fn expr(&mut self, e: &Node) -> Result<Node, String> {
        let t = text(e)?;
        if let Some(i) = self.keys.iter().position(|k| *k == t) {
            return Ok(column(&format!("c{i}")));
        }
        let Some(n) = &e.node else {
            return Ok(e.clone());
        };
        let mut out = e.clone();
        match (n, out.node.as_mut()) {
            (node::Node::FuncCall(f), _) if is_agg(f, self.is_aggregate) => {
                return self.aggregate(f);
            }
            (node::Node::ColumnRef(_), _) => {
                return Err(unsupported(&format!(
                    "the column {t} outside GROUP BY and aggregates"
                )))
            }
            (node::Node::SubLink(_), _) => {
                return Err(unsupported("a subquery in a query that aggregates"))
            }
            (_, Some(node::Node::FuncCall(f))) => {
                for a in &mut f.args {
                    *a = self.expr(a)?;
                }
            }
            (_, Some(node::Node::AExpr(a))) => {
                for side in [&mut a.lexpr, &mut a.rexpr].into_iter().flatten() {
                    **side = self.expr(side)?;
                }
            }
            (_, Some(node::Node::TypeCast(c))) => {
                if let Some(arg) = c.arg.as_mut() {
                    **arg = self.expr(arg)?;
                }
            }
            (_, Some(node::Node::BoolExpr(b))) => {
                for a in &mut b.args {
                    *a = self.expr(a)?;
                }
            }
            (_, Some(node::Node::NullTest(t))) => {
                if let Some(arg) = t.arg.as_mut() {
                    **arg = self.expr(arg)?;
                }
            }
            (_, Some(node::Node::CoalesceExpr(c))) => {
                for a in &mut c.args {
                    *a = self.expr(a)?;
                }
            }
            (_, Some(node::Node::MinMaxExpr(m))) => {
                for a in &mut m.args {
                    *a = self.expr(a)?;
                }
            }
            (_, Some(node::Node::CaseExpr(c))) => {
                if let Some(arg) = c.arg.as_mut() {
                    **arg = self.expr(arg)?;
                }
                for w in &mut c.args {
                    if let Some(node::Node::CaseWhen(w)) = w.node.as_mut() {
                        for part in [&mut w.expr, &mut w.result].into_iter().flatten() {
                            **part = self.expr(part)?;
                        }
                    }
                }
                if let Some(d) = c.defresult.as_mut() {
                    **d = self.expr(d)?;
                }
            }
            (_, Some(node::Node::AConst(_) | node::Node::ParamRef(_))) => {}
            _ => {
                // Any other node is kept only if it reads no column and no function.
                let json = serde_json::to_value(e).unwrap_or(Value::Null);
                if mentions(&json, &["ColumnRef", "FuncCall", "SubLink"]) {
                    return Err(unsupported(&format!("the expression {t}")));
                }
            }
        }
        Ok(out)
    }

    /// An aggregate's final form over partial columns.
    fn aggregate(&mut self, f: &protobuf::FuncCall) -> Result<Node, String> {
        let name = {
            let n = func_name_of(f);
            n.strip_prefix("pg_catalog.")
                .map(str::to_string)
                .unwrap_or(n)
        };
        if f.agg_distinct {
            // The argument's distinct values: each group returns them as a grouping column,
            // and the final query applies the aggregate, DISTINCT, to all groups' values
            // (other aggregates' partials, computed per finer group, still add up).
            let [arg] = f.args.as_slice() else {
                return Err(unsupported(&format!(
                    "{name}(DISTINCT …) of several arguments"
                )));
            };
            if f.agg_filter.is_some() || !f.agg_order.is_empty() {
                return Err(unsupported(&format!(
                    "{name}(DISTINCT …) with FILTER or ORDER BY"
                )));
            }
            if !matches!(name.as_str(), "count" | "sum" | "avg" | "min" | "max") {
                return Err(unsupported(&format!("the aggregate {name}(DISTINCT …)")));
            }
            let n = self.keys.len() + self.partials.len();
            self.grouped.push(self.partials.len());
            self.partials.push(arg.clone());
            let c = column(&format!("c{n}"));
            return Ok(Node {
                node: Some(node::Node::FuncCall(Box::new(protobuf::FuncCall {
                    funcname: vec![string(&name)],
                    args: vec![c],
                    agg_distinct: true,
                    funcformat: protobuf::CoercionForm::CoerceExplicitCall as i32,
                    location: -1,
                    ..Default::default()
                }))),
            });
        }
        if !f.agg_order.is_empty() || f.agg_within_group || f.over.is_some() {
            return Err(unsupported(&format!(
                "the aggregate {name}() with ORDER BY or OVER"
            )));
        }
        let call = |name: &str, args: Vec<Node>| protobuf::FuncCall {
            funcname: vec![string(name)],
            args,
            agg_star: false,
            funcformat: protobuf::CoercionForm::CoerceExplicitCall as i32,
            location: -1,
            ..Default::default()
        };
        // A FILTER applies where the rows are: in the partial aggregate.
        let partial = |name: &str| protobuf::FuncCall {
            funcname: vec![string(name)],
            ..f.clone()
        };
        Ok(match name.as_str() {
            "count" => {
                // A count is never NULL, also over no partial rows at all.
                let c = self.partial(partial("count"));
                let sum = Node {
                    node: Some(node::Node::FuncCall(Box::new(call("sum", vec![c])))),
                };
                let zero = Node {
                    node: Some(node::Node::AConst(protobuf::AConst {
                        isnull: false,
                        location: -1,
                        val: Some(protobuf::a_const::Val::Ival(protobuf::Integer { ival: 0 })),
                    })),
                };
                let coalesce = Node {
                    node: Some(node::Node::CoalesceExpr(Box::new(protobuf::CoalesceExpr {
                        args: vec![sum, zero],
                        location: -1,
                        ..Default::default()
                    }))),
                };
                cast(coalesce, "int8")
            }
            "sum" => {
                let c = self.partial(partial("sum"));
                Node {
                    node: Some(node::Node::FuncCall(Box::new(call(SUM, vec![c])))),
                }
            }
            "min" | "max" | "bool_and" | "bool_or" | "every" => {
                let c = self.partial(partial(&name));
                let combine = if name == "every" { "bool_and" } else { &name };
                Node {
                    node: Some(node::Node::FuncCall(Box::new(call(combine, vec![c])))),
                }
            }
            "avg" => {
                let s = self.partial(partial("sum"));
                let n = self.partial(partial("count"));
                Node {
                    node: Some(node::Node::FuncCall(Box::new(call(AVG, vec![s, n])))),
                }
            }
            _ => {
                return Err(unsupported(&format!("the aggregate {name}()")));
            }
        })
    }
}

fn is_agg(f: &protobuf::FuncCall, is_aggregate: &dyn Fn(&str) -> bool) -> bool {
    f.agg_star
        || f.over.is_some()
        || f.agg_distinct
        || f.agg_filter.is_some()
        || !f.agg_order.is_empty()
        || f.agg_within_group
        || is_aggregate(&func_name_of(f))
}

fn func_name_of(f: &protobuf::FuncCall) -> String {
    let json =
        serde_json::json!({ "funcname": serde_json::to_value(&f.funcname).unwrap_or(Value::Null) });
    func_name(&json)
}

/// Whether `v` calls an aggregate outside subqueries.
fn has_aggregate(v: &Node, is_aggregate: &dyn Fn(&str) -> bool) -> bool {
    let json = serde_json::to_value(v).unwrap_or(Value::Null);
    super::aggregate_or_window(&json, is_aggregate).is_some()
}

fn mentions(v: &Value, kinds: &[&str]) -> bool {
    match v {
        Value::Object(m) => {
            kinds.iter().any(|k| m.contains_key(*k)) || m.values().any(|x| mentions(x, kinds))
        }
        Value::Array(a) => a.iter().any(|x| mentions(x, kinds)),
        _ => false,
    }
}

/// The expression a GROUP BY item means: a select-list position or output name, or itself.
fn resolve(g: &Node, targets: &[(String, Node)]) -> Result<Node, String> {
    if let Some(node::Node::AConst(c)) = &g.node {
        if let Some(protobuf::a_const::Val::Ival(i)) = &c.val {
            return targets
                .get((i.ival as usize).wrapping_sub(1))
                .map(|t| t.1.clone())
                .ok_or_else(|| "GROUP BY position out of range".to_string());
        }
    }
    if let Some(name) = bare_name(g) {
        // An input column of that name wins over an output name in GROUP BY; only a name
        // that is not a plain column of the select list is taken as an output name.
        if let Some((_, v)) = targets
            .iter()
            .find(|(n, v)| *n == name && bare_name(v).is_none())
        {
            return Ok(v.clone());
        }
    }
    Ok(g.clone())
}

/// Whether an ORDER BY item is an output column's name.
fn output_alias(n: &Node, targets: &[(String, Node)]) -> bool {
    bare_name(n).is_some_and(|name| targets.iter().any(|(t, _)| *t == name))
}

fn bare_name(n: &Node) -> Option<String> {
    let Some(node::Node::ColumnRef(c)) = &n.node else {
        return None;
    };
    let [field] = c.fields.as_slice() else {
        return None;
    };
    match &field.node {
        Some(node::Node::String(s)) => Some(s.sval.clone()),
        _ => None,
    }
}

fn is_star(v: &Node) -> bool {
    matches!(&v.node, Some(node::Node::ColumnRef(c))
        if c.fields.iter().any(|f| matches!(f.node, Some(node::Node::AStar(_)))))
}

/// The name PostgreSQL gives an output column (its FigureColname, for the common cases).
fn output_name(alias: &str, v: &Node) -> String {
    if !alias.is_empty() {
        return alias.to_string();
    }
    figure(v).unwrap_or_else(|| "?column?".into())
}

fn figure(v: &Node) -> Option<String> {
    match v.node.as_ref()? {
        node::Node::ColumnRef(c) => c.fields.last().and_then(|f| match &f.node {
            Some(node::Node::String(s)) => Some(s.sval.clone()),
            _ => None,
        }),
        node::Node::FuncCall(f) => f.funcname.last().and_then(|f| match &f.node {
            Some(node::Node::String(s)) => Some(s.sval.clone()),
            _ => None,
        }),
        node::Node::TypeCast(t) => t.arg.as_deref().and_then(figure).or_else(|| {
            t.type_name
                .as_ref()
                .and_then(|n| n.names.last())
                .and_then(|f| match &f.node {
                    Some(node::Node::String(s)) => Some(s.sval.clone()),
                    _ => None,
                })
        }),
        node::Node::CaseExpr(c) => c
            .defresult
            .as_deref()
            .and_then(figure)
            .or_else(|| Some("case".into())),
        node::Node::CoalesceExpr(_) => Some("coalesce".into()),
        node::Node::MinMaxExpr(m) => Some(
            if m.op == protobuf::MinMaxOp::IsGreatest as i32 {
                "greatest"
            } else {
                "least"
            }
            .into(),
        ),
        _ => None,
    }
}

/// An expression's SQL text (deparsed as the select list of a SELECT).
fn text(n: &Node) -> Result<String, String> {
    let select = protobuf::SelectStmt {
        target_list: vec![res_target("", n.clone())],
        limit_option: protobuf::LimitOption::Default as i32,
        op: protobuf::SetOperation::SetopNone as i32,
        ..Default::default()
    };
    let sql = deparse_select(select)?;
    Ok(sql.strip_prefix("SELECT ").unwrap_or(&sql).to_string())
}

fn string(s: &str) -> Node {
    Node {
        node: Some(node::Node::String(protobuf::String { sval: s.into() })),
    }
}

fn column(name: &str) -> Node {
    Node {
        node: Some(node::Node::ColumnRef(protobuf::ColumnRef {
            fields: vec![string(name)],
            location: -1,
        })),
    }
}

fn cast(arg: Node, type_name: &str) -> Node {
    Node {
        node: Some(node::Node::TypeCast(Box::new(protobuf::TypeCast {
            arg: Some(Box::new(arg)),
            type_name: Some(protobuf::TypeName {
                names: vec![string(type_name)],
                typemod: -1,
                location: -1,
                ..Default::default()
            }),
            location: -1,
        }))),
    }
}

fn res_target(name: &str, val: Node) -> Node {
    Node {
        node: Some(node::Node::ResTarget(Box::new(protobuf::ResTarget {
            name: name.into(),
            indirection: Vec::new(),
            val: Some(Box::new(val)),
            location: -1,
        }))),
    }
}
