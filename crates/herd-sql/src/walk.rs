//! Whole-tree scan of one statement.
//!
//! pg_query's own `nodes()` iterator deliberately skips many node kinds
//! (e.g. LIMIT expressions), which would let a `nextval()` there slip by.
//! Instead the statement's protobuf tree is turned into a generic
//! `serde_json::Value` (every pg_query node type derives `Serialize`, with the
//! node kind as the object key) and walked with an explicit stack, so every
//! node of every kind is visited and deep trees cannot overflow the stack.
//! Tree depth is already bounded by prost's decoding recursion limit.

use pg_query::protobuf::Node;
use serde_json::Value;

/// What a scan found anywhere in a statement's tree (the root included).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct Facts {
    /// Function names in order of first appearance, without duplicates.
    pub functions: Vec<String>,
    /// An INSERT / UPDATE / DELETE / MERGE node was found.
    pub dml: bool,
    /// A row-locking clause (FOR UPDATE / SHARE …) was found.
    pub locking: bool,
    /// A SELECT with an INTO clause was found.
    pub select_into: bool,
    /// A session pin implied by a function call (advisory lock, set_config),
    /// with the function's name.
    pub pin: Option<(crate::PinReason, String)>,
    /// The tree could not be scanned; treat the statement as opaque.
    pub opaque: bool,
    /// Relations read, as written (`name` or `schema.name`), without duplicates.
    pub relations: Vec<String>,
    /// What makes a hot standby answer differently from the primary (a node-local view, a
    /// setting that differs on a standby), if anything.
    pub primary_only: Option<String>,
    /// A name in the session's temporary schema (`pg_temp…`) appears: what is created there
    /// exists only on this server.
    pub temp_schema: bool,
}

/// Views whose rows describe the node that answers, not the database: a standby's differ from
/// the primary's (its `pg_prepared_xacts` is empty, its `pg_stat_replication` lists no
/// standbys, its `pg_stat_activity` shows other sessions). A client of the cluster's endpoint
/// means the primary, which holds the database's transactions, locks and sessions.
pub(crate) const NODE_LOCAL_VIEWS: [&str; 14] = [
    "pg_prepared_xacts",
    "pg_stat_replication",
    "pg_replication_slots",
    "pg_stat_activity",
    "pg_locks",
    "pg_stat_wal_receiver",
    "pg_stat_subscription",
    "pg_stat_statements",
    "pg_prepared_statements",
    "pg_cursors",
    "pg_backend_memory_contexts",
    "pg_stat_replication_slots",
    "pg_stat_wal",
    "pg_stat_archiver",
];

/// Settings whose value on a hot standby differs from the primary's.
pub(crate) const STANDBY_SETTINGS: [&str; 3] = [
    "transaction_read_only",
    "default_transaction_read_only",
    "in_hot_standby",
];

/// Whether `name` (bare or `pg_catalog.`-qualified) is a node-local view.
pub(crate) fn is_node_local_view(name: &str) -> bool {
    let bare = name.strip_prefix("pg_catalog.").unwrap_or(name);
    NODE_LOCAL_VIEWS.contains(&bare) || bare.starts_with("pg_stat_progress_")
}

const DML_KINDS: [&str; 4] = ["InsertStmt", "UpdateStmt", "DeleteStmt", "MergeStmt"];

/// Scans the whole tree under `node`.
pub(crate) fn scan(node: &Node) -> Facts {
    let mut facts = Facts::default();
    let value = match serde_json::to_value(node) {
        Ok(v) => v,
        Err(_) => {
            facts.opaque = true;
            return facts;
        }
    };
    let mut stack: Vec<&Value> = vec![&value];
    while let Some(v) = stack.pop() {
        match v {
            Value::Object(map) => {
                // A RangeVar in a typed field (an INSERT, UPDATE or DELETE's target, also one
                // inside WITH; `SELECT INTO`'s table) has no "RangeVar" key of its own: its
                // fields sit in the parent's field directly.
                if map.contains_key("relname") {
                    on_range_var(v, &mut facts);
                }
                for (key, child) in map {
                    match key.as_str() {
                        "FuncCall" => on_func_call(child, &mut facts),
                        "String"
                            if child
                                .get("sval")
                                .and_then(Value::as_str)
                                .is_some_and(|s| s.starts_with("pg_temp")) =>
                        {
                            facts.temp_schema = true
                        }
                        "LockingClause" => facts.locking = true,
                        "SelectStmt" if child.get("into_clause").is_some_and(|c| !c.is_null()) => {
                            facts.select_into = true;
                        }
                        k if DML_KINDS.contains(&k) => facts.dml = true,
                        _ => {}
                    }
                    stack.push(child);
                }
            }
            Value::Array(items) => stack.extend(items.iter().rev()),
            _ => {}
        }
    }
    facts
}

/// Records one relation read.
fn on_range_var(rv: &Value, facts: &mut Facts) {
    let rel = rv.get("relname").and_then(Value::as_str).unwrap_or("");
    let schema = rv.get("schemaname").and_then(Value::as_str).unwrap_or("");
    let name = if schema.is_empty() {
        rel.to_string()
    } else {
        format!("{schema}.{rel}")
    };
    if schema.starts_with("pg_temp") {
        facts.temp_schema = true;
    }
    if is_node_local_view(&name) && facts.primary_only.is_none() {
        facts.primary_only = Some(name.clone());
    }
    if !facts.relations.contains(&name) {
        facts.relations.push(name);
    }
}

/// Records one `FuncCall` node: its name and any pin it implies.
fn on_func_call(call: &Value, facts: &mut Facts) {
    let name = func_name(call);
    if facts.primary_only.is_none() {
        let bare = name.strip_prefix("pg_catalog.").unwrap_or(&name);
        if bare == "current_setting" {
            if let Some(setting) = first_string_arg(call) {
                let setting = setting.to_ascii_lowercase();
                if STANDBY_SETTINGS.contains(&setting.as_str()) {
                    facts.primary_only = Some(format!("current_setting('{setting}')"));
                }
            } else {
                // A computed name might be any of them.
                facts.primary_only = Some("current_setting(…)".to_string());
            }
        }
    }
    if facts.pin.is_none() {
        facts.pin = function_pin(&name, call).map(|p| (p, name.clone()));
    }
    if !facts.functions.contains(&name) {
        facts.functions.push(name);
    }
}

/// Joins the `funcname` string list with dots; odd shapes give a name no
/// catalog knows, so the statement goes to the primary.
fn func_name(call: &Value) -> String {
    let parts: Vec<&str> = call
        .get("funcname")
        .and_then(Value::as_array)
        .map(|list| list.iter().map(|n| string_node(n).unwrap_or("?")).collect())
        .unwrap_or_default();
    if parts.is_empty() {
        "?".to_string()
    } else {
        parts.join(".")
    }
}

/// The `sval` of a `{"node": {"String": {"sval": …}}}` node.
fn string_node(node: &Value) -> Option<&str> {
    node.get("node")?.get("String")?.get("sval")?.as_str()
}

/// Session pin implied by a call to a built-in function, if any.
fn function_pin(name: &str, call: &Value) -> Option<crate::PinReason> {
    use crate::PinReason;
    let bare = match name.strip_prefix("pg_catalog.") {
        Some(rest) => rest,
        None if name.contains('.') => return None,
        None => name,
    };
    match bare {
        "pg_advisory_lock"
        | "pg_advisory_lock_shared"
        | "pg_try_advisory_lock"
        | "pg_try_advisory_lock_shared" => Some(PinReason::AdvisoryLock),
        "pg_advisory_unlock" | "pg_advisory_unlock_shared" | "pg_advisory_unlock_all" => {
            Some(PinReason::SessionAdvisoryUnlock)
        }
        "set_config" if !third_arg_is_true(call) => Some(PinReason::SetConfig),
        _ => None,
    }
}

/// The first argument of a call when it is a string literal.
fn first_string_arg(call: &Value) -> Option<&str> {
    call.get("args")?
        .as_array()?
        .first()?
        .get("node")?
        .get("AConst")?
        .get("val")?
        .get("Sval")?
        .get("sval")?
        .as_str()
}

/// True when the call's third argument is the literal `true` (or a string
/// literal PostgreSQL reads as true), i.e. `set_config(…, …, true)`.
fn third_arg_is_true(call: &Value) -> bool {
    let Some(arg) = call
        .get("args")
        .and_then(Value::as_array)
        .and_then(|a| a.get(2))
    else {
        return false;
    };
    let Some(val) = arg
        .get("node")
        .and_then(|n| n.get("AConst"))
        .and_then(|c| c.get("val"))
    else {
        return false;
    };
    if let Some(b) = val.get("Boolval") {
        // prost omits nothing here, but an absent field means false.
        return b.get("boolval").and_then(Value::as_bool).unwrap_or(false);
    }
    if let Some(s) = val
        .get("Sval")
        .and_then(|s| s.get("sval"))
        .and_then(Value::as_str)
    {
        return matches!(
            s.to_ascii_lowercase().as_str(),
            "t" | "true" | "on" | "yes" | "y" | "1"
        );
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(sql: &str) -> Facts {
        let parsed = pg_query::parse(sql, 0).expect("parses");
        let node = parsed.protobuf.stmts[0].stmt.as_deref().expect("stmt");
        scan(node)
    }

    #[test]
    fn finds_functions_in_limit() {
        let f = facts("select 1 limit nextval('s')");
        assert_eq!(f.functions, vec!["nextval".to_string()]);
    }

    #[test]
    fn schema_qualified_names() {
        let f = facts("select pg_catalog.now(), now(), now()");
        assert_eq!(
            f.functions,
            vec!["pg_catalog.now".to_string(), "now".to_string()]
        );
    }

    #[test]
    fn nested_locking_and_dml() {
        assert!(facts("select * from (select * from t for share) s").locking);
        assert!(facts("with x as (delete from t returning *) select * from x").dml);
        assert!(facts("select * into n from t").select_into);
    }

    #[test]
    fn relations_and_standby_dependent_reads() {
        let f = facts(
            "select * from a join s.b on true where x in (select 1 from pg_catalog.pg_locks)",
        );
        let mut rels = f.relations.clone();
        rels.sort();
        assert_eq!(rels, vec!["a", "pg_catalog.pg_locks", "s.b"]);
        assert_eq!(f.primary_only.as_deref(), Some("pg_catalog.pg_locks"));
        // The targets of writes are relations too, also inside WITH.
        let mut rels =
            facts("with d as (delete from o where x = 1 returning *), i as (insert into s.p values (1) returning *) update q set y = 1 from d").relations;
        rels.sort();
        assert_eq!(rels, vec!["d", "o", "q", "s.p"]);
        assert_eq!(
            facts("with x as (select * from pg_prepared_xacts) select * from x").primary_only,
            Some("pg_prepared_xacts".into())
        );
        assert_eq!(
            facts("select current_setting('Transaction_Read_Only', true)").primary_only,
            Some("current_setting('transaction_read_only')".into())
        );
        assert_eq!(
            facts("select current_setting('work_mem')").primary_only,
            None
        );
        assert!(facts("select * from pg_stat_progress_vacuum")
            .primary_only
            .is_some());
        assert_eq!(facts("select * from my_pg_locks").primary_only, None);
    }

    #[test]
    fn set_config_pin() {
        let pin = |sql: &str| facts(sql).pin.map(|(p, _)| p);
        assert_eq!(
            pin("select set_config('a','b',false)"),
            Some(crate::PinReason::SetConfig)
        );
        assert_eq!(pin("select set_config('a','b',true)"), None);
        assert_eq!(
            pin("select pg_try_advisory_lock(1)"),
            Some(crate::PinReason::AdvisoryLock)
        );
        assert_eq!(
            pin("select pg_catalog.pg_advisory_lock(1)"),
            Some(crate::PinReason::AdvisoryLock)
        );
        assert_eq!(pin("select pg_advisory_xact_lock(1)"), None);
    }
}
