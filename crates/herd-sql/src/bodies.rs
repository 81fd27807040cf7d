//! What a function's body reads: the relations and functions named by the SQL of a
//! `LANGUAGE sql` body (quoted or `BEGIN ATOMIC`) or of every statement and expression of a
//! PL/pgSQL body (read with libpg_query's PL/pgSQL parser). A body whose SQL is built at run
//! time (`EXECUTE`, `RETURN QUERY EXECUTE`, `OPEN … FOR EXECUTE`), in another language, or
//! that does not parse, cannot be read: the caller then refuses rather than guesses.

use serde_json::Value;

/// The relations (as written) and functions (as written) a body names.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BodyReads {
    /// Relations read or written.
    pub relations: Vec<String>,
    /// Functions called.
    pub calls: Vec<String>,
}

/// What the body of a function in `language` reads. `source` is `pg_proc.prosrc`;
/// `definition` is `pg_get_functiondef()` (needed for PL/pgSQL, and for SQL bodies written
/// `BEGIN ATOMIC`, whose `prosrc` is empty). `Err`: why it cannot be read.
pub fn body_reads(
    language: &str,
    source: &str,
    definition: Option<&str>,
) -> Result<BodyReads, String> {
    let mut reads = BodyReads::default();
    match language {
        "sql" if !source.trim().is_empty() => {
            if !add_sql(source, &mut reads) {
                return Err("has a SQL body Herd cannot parse".into());
            }
        }
        "sql" => {
            let def = definition.ok_or("has no definition to read")?;
            if !add_sql(def, &mut reads) {
                return Err("has a SQL body Herd cannot parse".into());
            }
        }
        "plpgsql" => {
            let def = definition.ok_or("has no definition to read")?;
            let def = as_plain_function(def);
            let tree = std::panic::catch_unwind(|| pg_query::parse_plpgsql(&def))
                .map_err(|_| "has a PL/pgSQL body Herd cannot parse".to_string())?
                .map_err(|_| "has a PL/pgSQL body Herd cannot parse".to_string())?;
            if dynamic(&tree) {
                return Err("runs dynamic SQL (EXECUTE of a string)".into());
            }
            let mut exprs = Vec::new();
            expressions(&tree, &mut exprs);
            for (mode, query) in exprs {
                let sql = match mode {
                    // An expression (`n + 1`) is the target list of a SELECT.
                    2 => format!("SELECT {query}"),
                    // An assignment (`n := expr`): its right-hand side.
                    3..=5 => match query.split_once(":=").or_else(|| query.split_once('=')) {
                        Some((_, rhs)) => format!("SELECT {rhs}"),
                        None => return Err("has a PL/pgSQL assignment Herd cannot read".into()),
                    },
                    _ => query.to_string(),
                };
                if !add_sql(&sql, &mut reads) {
                    return Err(format!(
                        "has a PL/pgSQL statement Herd cannot parse ({})",
                        query.chars().take(60).collect::<String>()
                    ));
                }
            }
        }
        other => return Err(format!("is written in {other}")),
    }
    Ok(reads)
}

/// The variables PostgreSQL gives a trigger function.
const TRIGGER_VARIABLES: &str = "DECLARE new record; old record; tg_op text; tg_name text; \
     tg_when text; tg_level text; tg_table_name text; tg_table_schema text; tg_relname text; \
     tg_relid oid; tg_nargs int; tg_argv text[]; tg_event text; tg_tag text;\n";

/// A trigger function's definition as a function returning `record` that declares the
/// trigger's variables itself: libpg_query's PL/pgSQL parser does not turn a trigger
/// function into valid JSON, and reads this one the same way otherwise. Other functions are
/// returned as they are.
fn as_plain_function(def: &str) -> std::borrow::Cow<'_, str> {
    let Some(returns) = ["RETURNS trigger", "RETURNS event_trigger"]
        .iter()
        .find(|r| def.contains(*r))
    else {
        return def.into();
    };
    // pg_get_functiondef writes `AS $function$` (or another dollar tag) before the body.
    let Some(at) = def.find("AS $") else {
        return def.into();
    };
    let tag_start = at + 3;
    let Some(tag_len) = def[tag_start + 1..].find('$') else {
        return def.into();
    };
    let body_start = tag_start + tag_len + 2;
    let mut out = String::with_capacity(def.len() + TRIGGER_VARIABLES.len());
    out.push_str(&def[..body_start].replacen(returns, "RETURNS record", 1));
    out.push('\n');
    out.push_str(TRIGGER_VARIABLES);
    out.push_str(&def[body_start..]);
    out.into()
}

/// Adds what `sql` names; false when it does not parse.
fn add_sql(sql: &str, reads: &mut BodyReads) -> bool {
    let Ok(Ok(parsed)) = std::panic::catch_unwind(|| pg_query::parse(sql, 0)) else {
        return false;
    };
    for stmt in &parsed.protobuf.stmts {
        let Some(node) = stmt.stmt.as_ref() else {
            continue;
        };
        let facts = crate::walk::scan(node);
        if facts.opaque {
            return false;
        }
        for r in facts.relations {
            if !reads.relations.contains(&r) {
                reads.relations.push(r);
            }
        }
        for f in facts.functions {
            if !reads.calls.contains(&f) {
                reads.calls.push(f);
            }
        }
    }
    true
}

/// SQL built at run time anywhere in the PL/pgSQL tree.
fn dynamic(v: &Value) -> bool {
    match v {
        Value::Object(m) => m.iter().any(|(k, child)| {
            matches!(
                k.as_str(),
                "PLpgSQL_stmt_dynexecute" | "PLpgSQL_stmt_dynfors" | "dynquery"
            ) || dynamic(child)
        }),
        Value::Array(a) => a.iter().any(dynamic),
        _ => false,
    }
}

/// Every `PLpgSQL_expr` of the tree: its parse mode and text.
fn expressions<'a>(v: &'a Value, out: &mut Vec<(i64, &'a str)>) {
    match v {
        Value::Object(m) => {
            if let Some(e) = m.get("PLpgSQL_expr") {
                if let Some(q) = e["query"].as_str() {
                    out.push((e["parseMode"].as_i64().unwrap_or(0), q));
                }
            }
            m.values().for_each(|c| expressions(c, out));
        }
        Value::Array(a) => a.iter().for_each(|c| expressions(c, out)),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sql_bodies() {
        let mut r = body_reads(
            "sql",
            "select count(*) from customers c join s.x on true",
            None,
        )
        .expect("reads");
        r.relations.sort();
        assert_eq!(r.relations, vec!["customers", "s.x"]);
        let r = body_reads("sql", "select f2($1) ; delete from t", None).expect("reads");
        assert_eq!(r.relations, vec!["t"]);
        assert_eq!(r.calls, vec!["f2"]);
        let atomic = "CREATE OR REPLACE FUNCTION public.g() RETURNS bigint LANGUAGE sql \
                      BEGIN ATOMIC SELECT count(*) FROM orders; END";
        let r = body_reads("sql", "", Some(atomic)).expect("reads");
        assert_eq!(r.relations, vec!["orders"]);
        assert!(body_reads("sql", "select from where", None).is_err());
    }

    #[test]
    fn plpgsql_bodies() {
        let def = "CREATE OR REPLACE FUNCTION public.f(k bigint) RETURNS bigint \
                   LANGUAGE plpgsql AS $function$\n\
                   declare n bigint; begin\n\
                   select count(*) into n from customers where id = k;\n\
                   n := n + (select count(*) from orders);\n\
                   return n + other_fn(k);\nend $function$";
        let r = body_reads("plpgsql", "", Some(def)).expect("reads");
        let mut rels = r.relations.clone();
        rels.sort();
        assert_eq!(rels, vec!["customers", "orders"]);
        assert!(r.calls.contains(&"other_fn".to_string()), "{:?}", r.calls);
        let dynamic = "CREATE FUNCTION public.d() RETURNS void LANGUAGE plpgsql AS $$ \
                       begin execute 'delete from ' || 't'; end $$";
        assert!(body_reads("plpgsql", "", Some(dynamic))
            .expect_err("opaque")
            .contains("dynamic SQL"));
        let query_exec = "CREATE FUNCTION public.q() RETURNS SETOF int LANGUAGE plpgsql AS $$ \
                          begin return query execute 'select 1'; end $$";
        assert!(body_reads("plpgsql", "", Some(query_exec)).is_err());
        let trigger = "CREATE OR REPLACE FUNCTION public.stamp()\n RETURNS trigger\n \
                       LANGUAGE plpgsql\nAS $function$\n declare n int; begin \
                       new.name := upper(new.name); select count(*) into n from audit; \
                       return new; end $function$\n";
        let r = body_reads("plpgsql", "", Some(trigger)).expect("a trigger function");
        assert_eq!(r.relations, vec!["audit"]);
        assert!(body_reads("plpython3u", "return 1", None)
            .expect_err("opaque")
            .contains("plpython3u"));
    }
}
