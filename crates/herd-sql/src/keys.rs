//! What a statement says about the rows it touches, for routing by shard key: its kind, the
//! tables it names, the equality conditions of its WHERE clause, an INSERT's columns and rows,
//! the columns an UPDATE sets. Only what is certain is reported; everything else is marked so
//! a planner can refuse rather than guess.

use pg_query::protobuf::Node;
use serde_json::Value;

/// The kind of statement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StmtKind {
    /// `SELECT` (also `VALUES`, set operations).
    Select,
    /// `INSERT`.
    Insert,
    /// `UPDATE`.
    Update,
    /// `DELETE`.
    Delete,
    /// Anything else (DDL, utility statements, `COPY`, `MERGE` …).
    Other,
}

/// A value a key may be compared with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeyExpr {
    /// A literal in its text form (`None`: SQL NULL).
    Const(Option<String>),
    /// A parameter, `$n` (1-based).
    Param(u32),
    /// A value converted to a type before it is compared (`'k '::char(12)`): the value, and
    /// the type as written (its last name, `(…)` when it has modifiers, `[]` for an array).
    /// A conversion may change the value (`char` drops trailing blanks, `varchar(3)` cuts):
    /// only one to the key's own type leaves it as written.
    Cast(Box<KeyExpr>, String),
    /// Anything else (an expression, a column, a subquery).
    Other,
}

/// `column = value` or `column IN (values…)`, as a top-level conjunct of a WHERE clause.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Condition {
    /// The table name or alias qualifying the column, if written.
    pub qualifier: Option<String>,
    /// The column.
    pub column: String,
    /// The values it equals (one for `=`, the list for `IN`).
    pub values: Vec<KeyExpr>,
}

/// One entry of a SELECT's target list, as far as routing cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A plain column reference, with its qualifier if written.
    Column(Option<String>, String),
    /// A constant or parameter.
    Value(KeyExpr),
    /// Anything else (an expression, `*`).
    Other,
}

/// A column as written: its qualifier (table name or alias), if any, and its name.
pub type ColumnName = (Option<String>, String);

/// A table named in the statement's top-level FROM (or its target), with its alias.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableRef {
    /// As written: `name` or `schema.name`.
    pub name: String,
    /// Its alias, if any.
    pub alias: Option<String>,
}

/// Key facts of one statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyFacts {
    /// The statement's kind.
    pub kind: StmtKind,
    /// INSERT/UPDATE/DELETE target, and the top-level FROM / USING tables.
    pub tables: Vec<TableRef>,
    /// Top-level conjuncts of the WHERE clause (and of inner joins' ON) that compare a column
    /// with values.
    pub conditions: Vec<Condition>,
    /// `a.x = b.y` between two columns: top-level conjuncts of the WHERE clause and of any
    /// join's ON, and the columns of `JOIN … USING`.
    pub equalities: Vec<(ColumnName, ColumnName)>,
    /// An INSERT's column list (empty when not written).
    pub insert_columns: Vec<String>,
    /// An INSERT's VALUES rows (empty for INSERT … SELECT or DEFAULT VALUES).
    pub insert_rows: Vec<Vec<KeyExpr>>,
    /// The INSERT takes its rows from a query.
    pub insert_select: bool,
    /// That query's own facts, when it is a plain SELECT (no set operation).
    pub source: Option<Box<KeyFacts>>,
    /// A SELECT's target list (for the source of an INSERT … SELECT).
    pub targets: Vec<Target>,
    /// Columns an UPDATE sets.
    pub set_columns: Vec<String>,
    /// A join, subquery, CTE or set operation is present: tables beyond `tables` may be read.
    pub nested: bool,
    /// A top-level FROM item whose columns are not its table's own, so an unqualified column
    /// cannot be tied to a table by the tables' columns: a subquery, a function, `VALUES`, a
    /// table alias with column names, an aliased join.
    pub opaque_from: bool,
    /// Names of the statement's common table expressions (`WITH name AS …`): not tables.
    pub ctes: Vec<String>,
    /// SELECT, UPDATE, DELETE: tables read anywhere but the top level (subqueries, CTEs, set
    /// operations), one entry per reference — a table may be both here and in `tables`.
    pub inner_tables: Vec<TableRef>,
    /// An INSERT, UPDATE or DELETE with a RETURNING list.
    pub returning: bool,
    /// For other statements, the parse node's kind (`IndexStmt`, `AlterTableStmt`,
    /// `TruncateStmt`, `DropStmt` …).
    pub utility: Option<String>,
    /// `CREATE INDEX CONCURRENTLY` (it cannot run inside a transaction).
    pub concurrent: bool,
    /// What a `DROP` drops (`OBJECT_TABLE`, `OBJECT_INDEX` …).
    pub drop_type: Option<String>,
    /// A `REVOKE` (a `GrantStmt` that takes privileges away).
    pub revoke: bool,
    /// A `GRANT`/`REVOKE … ON ALL TABLES|SEQUENCES|FUNCTIONS IN SCHEMA`.
    pub all_in_schema: bool,
    /// The name a `CREATE INDEX` gives its index, if written.
    pub index_name: Option<String>,
    /// A `COPY` of a table.
    pub copy: Option<CopyFacts>,
    /// A `WITH` query (at any depth) is an INSERT, UPDATE, DELETE or MERGE: the statement
    /// writes rows beyond its top-level target.
    pub modifying_cte: bool,
    /// When `modifying_cte`: the facts of each query of the top-level `WITH` (each planned as
    /// a statement of its own), then those of the statement without its `WITH` (its CTE
    /// names kept in `ctes`). Empty otherwise, or when the `WITH` is not the top level's.
    pub with_parts: Vec<KeyFacts>,
    /// Each preserved side of an outer join (`LEFT`: the left, `RIGHT`: the right, `FULL`:
    /// both), at any depth of the FROM clause: a row of that side appears in the answer even
    /// when nothing on the other side matches it.
    pub outer_joins: Vec<OuterSide>,
    /// DDL facts (uniqueness, renames, VACUUM, databases) of a utility statement.
    pub ddl: Option<Box<crate::DdlFacts>>,
    /// A `SELECT … INTO new_table`: it creates a table from its rows.
    pub select_into: bool,
    /// The command tag of a statement that creates, changes or drops a function, procedure,
    /// aggregate, type, domain, schema or extension: objects statements on any group may use.
    pub shared_object: Option<&'static str>,
}

/// The preserved side of an outer join and the side it is joined to, each as every table
/// reference under it (subqueries included). A side with no table (a function, `VALUES`)
/// has an empty list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OuterSide {
    /// The side whose rows are kept without a match.
    pub preserved: Vec<TableRef>,
    /// The other side.
    pub other: Vec<TableRef>,
}

/// What a `COPY table …` statement says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopyFacts {
    /// `FROM` (else `TO`).
    pub from: bool,
    /// Data through the protocol (`STDIN`/`STDOUT`), not a server file or program.
    pub client_data: bool,
    /// The column list (empty: every column in order).
    pub columns: Vec<String>,
    /// `text`, `csv` or `binary`.
    pub format: String,
    /// `HEADER` (true or `match`).
    pub header: bool,
    /// Options other than FORMAT and HEADER, by name.
    pub other_options: Vec<String>,
    /// A WHERE clause is present.
    pub filtered: bool,
}

/// Key facts of `sql` when it is exactly one statement that parses; `None` otherwise.
pub fn key_facts(sql: &str) -> Option<KeyFacts> {
    let parsed = std::panic::catch_unwind(|| pg_query::parse(sql, 0))
        .ok()?
        .ok()?;
    let stmts = &parsed.protobuf.stmts;
    if stmts.len() != 1 {
        return None;
    }
    let node: &Node = stmts[0].stmt.as_ref()?;
    let value = serde_json::to_value(node).ok()?;
    let mut facts = facts_of(value.get("node")?);
    facts.ddl = crate::ddl::ddl_facts(node).map(Box::new);
    Some(facts)
}

fn facts_of(node: &Value) -> KeyFacts {
    // EXPLAIN [ANALYZE] runs where the statement it explains would.
    if let Some(inner) = node.get("ExplainStmt").and_then(|e| e["query"].get("node")) {
        return facts_of(inner);
    }
    let mut f = KeyFacts {
        kind: StmtKind::Other,
        tables: Vec::new(),
        conditions: Vec::new(),
        equalities: Vec::new(),
        insert_columns: Vec::new(),
        insert_rows: Vec::new(),
        insert_select: false,
        source: None,
        targets: Vec::new(),
        set_columns: Vec::new(),
        nested: false,
        opaque_from: false,
        ctes: Vec::new(),
        inner_tables: Vec::new(),
        returning: false,
        utility: None,
        concurrent: false,
        drop_type: None,
        revoke: false,
        all_in_schema: false,
        index_name: None,
        copy: None,
        modifying_cte: modifying_cte(node),
        with_parts: Vec::new(),
        outer_joins: Vec::new(),
        ddl: None,
        shared_object: None,
        select_into: false,
    };
    if let Some(body) = ["SelectStmt", "InsertStmt", "UpdateStmt", "DeleteStmt"]
        .iter()
        .find_map(|k| node.get(*k))
    {
        f.ctes = body["with_clause"]["ctes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["node"]["CommonTableExpr"]["ctename"].as_str())
            .map(str::to_string)
            .collect();
    }
    if let Some(body) = ["InsertStmt", "UpdateStmt", "DeleteStmt"]
        .iter()
        .find_map(|k| node.get(*k))
    {
        f.returning = body["returning_clause"]["exprs"]
            .as_array()
            .is_some_and(|l| !l.is_empty());
    }
    if f.modifying_cte {
        f.with_parts = with_parts(node, &f.ctes);
    }
    if let Some(s) = node.get("SelectStmt") {
        f.kind = StmtKind::Select;
        f.select_into = !s["into_clause"].is_null();
        select(s, &mut f);
        f.inner_tables = inner_tables(s, &f.tables);
    } else if let Some(s) = node.get("InsertStmt") {
        f.kind = StmtKind::Insert;
        f.tables.extend(range_var(&s["relation"]));
        f.insert_columns = target_names(&s["cols"]);
        f.nested |= !s["with_clause"].is_null();
        let source = &s["select_stmt"]["node"]["SelectStmt"];
        let rows = source["values_lists"].as_array();
        match rows {
            Some(rows) if !rows.is_empty() => {
                f.insert_rows = rows
                    .iter()
                    .map(|r| {
                        r["node"]["List"]["items"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(key_expr)
                            .collect()
                    })
                    .collect();
                f.nested |= contains_sublink(source);
            }
            _ => {
                f.insert_select = !s["select_stmt"].is_null();
                if !source.is_null() && source["larg"].is_null() {
                    let mut inner = facts_of(&s["select_stmt"]["node"]);
                    inner.targets = source["target_list"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .map(|t| target(&t["node"]["ResTarget"]["val"]))
                        .collect();
                    f.source = Some(Box::new(inner));
                }
            }
        }
        f.nested |=
            !s["on_conflict_clause"].is_null() && contains_sublink(&s["on_conflict_clause"]);
    } else if let Some(s) = node.get("UpdateStmt") {
        f.kind = StmtKind::Update;
        f.tables.extend(range_var(&s["relation"]));
        f.set_columns = target_names(&s["target_list"]);
        from_list(&s["from_clause"], &mut f);
        f.nested |= !s["with_clause"].is_null() || contains_sublink(&s["target_list"]);
        where_clause(&s["where_clause"], &mut f);
        f.inner_tables = inner_tables(s, &f.tables);
    } else if let Some(s) = node.get("DeleteStmt") {
        f.kind = StmtKind::Delete;
        f.tables.extend(range_var(&s["relation"]));
        from_list(&s["using_clause"], &mut f);
        f.nested |= !s["with_clause"].is_null();
        where_clause(&s["where_clause"], &mut f);
        f.inner_tables = inner_tables(s, &f.tables);
    } else {
        if let Some((kind, body)) = node.as_object().and_then(|m| m.iter().next()) {
            f.utility = Some(kind.clone());
            f.shared_object = shared_object_tag(kind, body);
            f.concurrent = body["concurrent"].as_bool() == Some(true);
            f.drop_type = (kind == "DropStmt")
                .then(|| body["remove_type"].as_i64())
                .flatten()
                .and_then(|t| i32::try_from(t).ok())
                .and_then(|t| pg_query::protobuf::ObjectType::try_from(t).ok())
                .map(|t| t.as_str_name().to_string());
            if kind == "GrantStmt" {
                f.revoke = body["is_grant"].as_bool() != Some(true);
                f.all_in_schema = body["targtype"].as_i64()
                    == Some(pg_query::protobuf::GrantTargetType::AclTargetAllInSchema as i64);
            }
            f.index_name = (kind == "IndexStmt")
                .then(|| body["idxname"].as_str().filter(|n| !n.is_empty()))
                .flatten()
                .map(str::to_string);
            if kind == "CopyStmt" && !body["relation"].is_null() {
                f.copy = Some(copy_facts(body));
            }
        }
        // DDL and utility statements: every table they name (TRUNCATE, ALTER, CREATE INDEX,
        // COPY, GRANT … carry RangeVars; DROP carries name lists).
        all_range_vars(node, &mut f.tables);
        if let Some(d) = node.get("DropStmt") {
            for obj in d["objects"].as_array().into_iter().flatten() {
                let parts: Vec<&str> = obj["node"]["List"]["items"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|p| p["node"]["String"]["sval"].as_str())
                    .collect();
                if !parts.is_empty() {
                    f.tables.push(TableRef {
                        name: parts.join("."),
                        alias: None,
                    });
                }
            }
        }
    }
    f
}

fn copy_facts(c: &Value) -> CopyFacts {
    let mut facts = CopyFacts {
        from: c["is_from"].as_bool() == Some(true),
        client_data: c["filename"].as_str().unwrap_or("").is_empty()
            && c["is_program"].as_bool() != Some(true),
        columns: c["attlist"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|a| a["node"]["String"]["sval"].as_str())
            .map(str::to_string)
            .collect(),
        format: "text".into(),
        header: false,
        other_options: Vec::new(),
        filtered: !c["where_clause"].is_null(),
    };
    for opt in c["options"].as_array().into_iter().flatten() {
        let d = &opt["node"]["DefElem"];
        let name = d["defname"].as_str().unwrap_or("").to_string();
        let arg = &d["arg"]["node"];
        let text = arg["String"]["sval"]
            .as_str()
            .map(str::to_ascii_lowercase)
            .or_else(|| arg["Boolean"]["boolval"].as_bool().map(|b| b.to_string()))
            .unwrap_or_else(|| {
                if arg.is_null() {
                    "true".into()
                } else {
                    String::new()
                }
            });
        match name.as_str() {
            "format" => facts.format = text,
            "header" => facts.header = matches!(text.as_str(), "true" | "on" | "1" | "match"),
            _ => facts.other_options.push(name),
        }
    }
    facts
}

/// Every table reference of `stmt` but those of `top` (one removed per occurrence).
fn inner_tables(stmt: &Value, top: &[TableRef]) -> Vec<TableRef> {
    let mut all = Vec::new();
    all_range_vars(stmt, &mut all);
    for t in top {
        if let Some(i) = all.iter().position(|a| a == t) {
            all.remove(i);
        }
    }
    all
}

fn all_range_vars(v: &Value, out: &mut Vec<TableRef>) {
    match v {
        Value::Object(m) => {
            // A RangeVar, as a node ({"RangeVar": {…}}) or as a typed field ({"relname": …}).
            if m.contains_key("relname") {
                out.extend(range_var(v));
                return;
            }
            m.values().for_each(|child| all_range_vars(child, out));
        }
        Value::Array(a) => a.iter().for_each(|x| all_range_vars(x, out)),
        _ => {}
    }
}

/// The command tag of a statement of kind `kind` (its parse node `body`) that makes, changes
/// or drops an object other statements use by name and that no table holds: functions,
/// procedures, aggregates, types, domains, schemas (without elements), extensions.
fn shared_object_tag(kind: &str, body: &Value) -> Option<&'static str> {
    use pg_query::protobuf::ObjectType as O;
    let object = |field: &str| {
        body[field]
            .as_i64()
            .and_then(|t| i32::try_from(t).ok())
            .and_then(|t| O::try_from(t).ok())
    };
    Some(match kind {
        "CreateFunctionStmt" if body["is_procedure"].as_bool() == Some(true) => "CREATE PROCEDURE",
        "CreateFunctionStmt" => "CREATE FUNCTION",
        "AlterFunctionStmt" => match object("objtype")? {
            O::ObjectProcedure => "ALTER PROCEDURE",
            O::ObjectRoutine => "ALTER ROUTINE",
            _ => "ALTER FUNCTION",
        },
        "CompositeTypeStmt" | "CreateEnumStmt" | "CreateRangeStmt" => "CREATE TYPE",
        "AlterEnumStmt" => "ALTER TYPE",
        "CreateDomainStmt" => "CREATE DOMAIN",
        "AlterDomainStmt" => "ALTER DOMAIN",
        "CreateSchemaStmt"
            if body["schemaElts"].as_array().is_none_or(|e| e.is_empty())
                && body["schema_elts"].as_array().is_none_or(|e| e.is_empty()) =>
        {
            "CREATE SCHEMA"
        }
        "CreateExtensionStmt" => "CREATE EXTENSION",
        "AlterExtensionStmt" => "ALTER EXTENSION",
        "DefineStmt" => match object("kind")? {
            O::ObjectAggregate => "CREATE AGGREGATE",
            O::ObjectType => "CREATE TYPE",
            _ => return None,
        },
        "DropStmt" => match object("remove_type")? {
            O::ObjectFunction => "DROP FUNCTION",
            O::ObjectProcedure => "DROP PROCEDURE",
            O::ObjectRoutine => "DROP ROUTINE",
            O::ObjectAggregate => "DROP AGGREGATE",
            O::ObjectType => "DROP TYPE",
            O::ObjectDomain => "DROP DOMAIN",
            O::ObjectExtension => "DROP EXTENSION",
            _ => return None,
        },
        _ => return None,
    })
}

/// A common table expression anywhere under `v` whose query writes (INSERT, UPDATE, DELETE,
/// MERGE).
fn modifying_cte(v: &Value) -> bool {
    match v {
        Value::Object(m) => {
            if let Some(cte) = m.get("CommonTableExpr") {
                let q = &cte["ctequery"]["node"];
                if ["InsertStmt", "UpdateStmt", "DeleteStmt", "MergeStmt"]
                    .iter()
                    .any(|k| q.get(*k).is_some())
                {
                    return true;
                }
            }
            m.values().any(modifying_cte)
        }
        Value::Array(a) => a.iter().any(modifying_cte),
        _ => false,
    }
}

fn contains_sublink(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.contains_key("SubLink") || m.values().any(contains_sublink),
        Value::Array(a) => a.iter().any(contains_sublink),
        _ => false,
    }
}

mod clauses;
mod with_parts;
pub(crate) use clauses::key_expr;
use clauses::*;
use with_parts::with_parts;

#[cfg(test)]
mod tests;
