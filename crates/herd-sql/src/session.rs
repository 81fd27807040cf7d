//! Transaction control and session-state statements: BEGIN / COMMIT / …,
//! SET / RESET / SET TRANSACTION, DISCARD.

use crate::classify::Draft;
use crate::{Reason, Route, SessionEffect, TxEffect};
use pg_query::protobuf::{
    a_const, node, DiscardMode, DiscardStmt, Node, TransactionStmt, TransactionStmtKind,
    VariableSetKind, VariableSetStmt,
};

/// Transaction properties found in BEGIN / START / SET TRANSACTION options.
#[derive(Debug, Default, Clone, Copy)]
struct TxOptions {
    read_only: Option<bool>,
    serializable: bool,
}

/// Reads `transaction_read_only` / `transaction_isolation` option DefElems.
fn tx_options(options: &[Node]) -> TxOptions {
    let mut out = TxOptions::default();
    for opt in options {
        let Some(node::Node::DefElem(def)) = opt.node.as_ref() else {
            continue;
        };
        let arg = def.arg.as_deref().and_then(|a| a.node.as_ref());
        let Some(node::Node::AConst(c)) = arg else {
            continue;
        };
        match (def.defname.as_str(), c.val.as_ref()) {
            ("transaction_read_only", Some(a_const::Val::Ival(i))) => {
                out.read_only = Some(i.ival != 0)
            }
            ("transaction_isolation", Some(a_const::Val::Sval(s))) => {
                out.serializable = s.sval.eq_ignore_ascii_case("serializable");
            }
            _ => {}
        }
    }
    out
}

/// BEGIN, START TRANSACTION, COMMIT, ROLLBACK, savepoints and two-phase commit.
///
/// COMMIT / ROLLBACK / savepoint commands do not write by themselves, so they
/// carry [`Route::Replica`]: they must follow whichever backend holds the
/// transaction, which the proxy decides. A read-write or SERIALIZABLE BEGIN
/// routes to the primary (a hot standby refuses both).
pub(crate) fn transaction(stmt: &TransactionStmt) -> Draft {
    use TransactionStmtKind as K;
    let kind = TransactionStmtKind::try_from(stmt.kind).unwrap_or(K::Undefined);
    let mut draft = Draft::new(Route::Replica, Reason::TransactionControl);
    draft.tx = match kind {
        K::TransStmtBegin | K::TransStmtStart => {
            let opts = tx_options(&stmt.options);
            let read_only = opts.read_only == Some(true);
            if opts.serializable {
                draft.route = Route::Primary;
                draft.reason = Reason::SerializableTransaction;
            } else if !read_only {
                draft.route = Route::Primary;
            }
            TxEffect::Begin { read_only }
        }
        K::TransStmtCommit => TxEffect::Commit,
        K::TransStmtRollback => TxEffect::Rollback,
        K::TransStmtSavepoint => TxEffect::Savepoint,
        K::TransStmtRelease => TxEffect::Release,
        K::TransStmtRollbackTo => TxEffect::RollbackToSavepoint,
        K::TransStmtPrepare => TxEffect::PrepareTransaction,
        K::TransStmtCommitPrepared => TxEffect::CommitPrepared,
        K::TransStmtRollbackPrepared => TxEffect::RollbackPrepared,
        K::Undefined => TxEffect::None,
    };
    if matches!(
        draft.tx,
        TxEffect::PrepareTransaction
            | TxEffect::CommitPrepared
            | TxEffect::RollbackPrepared
            | TxEffect::None
    ) {
        draft.route = Route::Primary;
    }
    draft
}

/// DISCARD ALL / PLANS / SEQUENCES / TEMP.
pub(crate) fn discard(stmt: &DiscardStmt) -> Draft {
    let all = DiscardMode::try_from(stmt.target) == Ok(DiscardMode::DiscardAll);
    let mut draft = Draft::new(Route::Replica, Reason::SessionState);
    draft.session = SessionEffect::Discard { all };
    draft
}

/// SET / SET LOCAL / SET SESSION / RESET / RESET ALL / SET TRANSACTION.
/// `text` is the statement's own source text.
pub(crate) fn variable_set(stmt: &VariableSetStmt, text: &str) -> Draft {
    use VariableSetKind as K;
    let kind = VariableSetKind::try_from(stmt.kind).unwrap_or(K::Undefined);
    let mut draft = Draft::new(Route::Replica, Reason::SessionState);
    let name = stmt.name.clone();
    draft.session = match kind {
        K::VarSetValue => {
            let (value, sql) = render_set(stmt, text);
            if let Some(tx_draft) = transaction_setting(&name, &value) {
                return tx_draft;
            }
            if stmt.is_local {
                SessionEffect::SetLocal { name, value, sql }
            } else {
                SessionEffect::Set { name, value, sql }
            }
        }
        K::VarSetDefault if stmt.is_local => SessionEffect::SetLocal {
            name,
            value: "DEFAULT".to_string(),
            sql: text.to_string(),
        },
        K::VarSetDefault | K::VarReset => SessionEffect::Reset { name },
        K::VarResetAll => SessionEffect::ResetAll,
        K::VarSetCurrent => SessionEffect::Set {
            name,
            value: String::new(),
            sql: text.to_string(),
        },
        K::VarSetMulti => return set_multi(stmt, text),
        K::Undefined => {
            draft.route = Route::Primary;
            draft.reason = Reason::Utility;
            SessionEffect::None
        }
    };
    draft
}

/// `SET transaction_read_only = …` / `SET transaction_isolation = …` only
/// affect the current transaction: treat them like SET TRANSACTION, not as
/// session state to replay.
fn transaction_setting(name: &str, value: &str) -> Option<Draft> {
    let mut draft = Draft::new(Route::Replica, Reason::TransactionControl);
    match name {
        "transaction_read_only" => {
            let read_only = parse_bool(value);
            draft.tx = TxEffect::SetTransaction { read_only };
            if read_only != Some(true) {
                draft.route = Route::Primary;
            }
        }
        "transaction_isolation" => {
            draft.tx = TxEffect::SetTransaction { read_only: None };
            if value.eq_ignore_ascii_case("serializable") {
                draft.route = Route::Primary;
                draft.reason = Reason::SerializableTransaction;
            }
        }
        _ => return None,
    }
    Some(draft)
}

/// PostgreSQL's boolean spellings (unique prefixes of true/false/yes/no, on/off, 1/0).
fn parse_bool(value: &str) -> Option<bool> {
    let v = value.trim().to_ascii_lowercase();
    let prefix_of = |word: &str, min: usize| v.len() >= min && word.starts_with(v.as_str());
    if prefix_of("true", 1) || prefix_of("yes", 1) || v == "on" || v == "1" {
        Some(true)
    } else if prefix_of("false", 1) || prefix_of("no", 1) || prefix_of("off", 2) || v == "0" {
        Some(false)
    } else {
        None
    }
}

/// SET TRANSACTION …, SET SESSION CHARACTERISTICS AS TRANSACTION …,
/// SET TRANSACTION SNAPSHOT ….
fn set_multi(stmt: &VariableSetStmt, text: &str) -> Draft {
    let opts = tx_options(&stmt.args);
    match stmt.name.as_str() {
        "TRANSACTION" => {
            let mut draft = Draft::new(Route::Replica, Reason::TransactionControl);
            draft.tx = TxEffect::SetTransaction {
                read_only: opts.read_only,
            };
            if opts.serializable {
                draft.route = Route::Primary;
                draft.reason = Reason::SerializableTransaction;
            } else if opts.read_only == Some(false) {
                draft.route = Route::Primary;
            }
            draft
        }
        "SESSION CHARACTERISTICS" => {
            let mut draft = Draft::new(Route::Replica, Reason::SessionState);
            draft.session = SessionEffect::Set {
                name: "session characteristics".to_string(),
                value: String::new(),
                sql: text.to_string(),
            };
            if opts.serializable || opts.read_only == Some(false) {
                draft.route = Route::Primary;
            }
            draft
        }
        // SET TRANSACTION SNAPSHOT and anything new: keep it on the primary.
        _ => Draft::new(Route::Primary, Reason::TransactionControl),
    }
}

/// Value text and replay statement for `SET name = value`.
///
/// When the statement used the generic syntax and every value is a plain
/// constant, the replay text is the canonical `SET name = 'v1', 2`, checked
/// by re-parsing it. Otherwise (SET TIME ZONE, SET NAMES, odd values) the
/// original statement text is replayed unchanged.
fn render_set(stmt: &VariableSetStmt, text: &str) -> (String, String) {
    let rendered: Option<Vec<(String, Option<String>)>> =
        stmt.args.iter().map(render_arg).collect();
    let Some(parts) = rendered.filter(|p| !p.is_empty()) else {
        // Non-constant values (e.g. SET TIME ZONE INTERVAL …): replay as written.
        return (String::new(), text.to_string());
    };
    let value = parts
        .iter()
        .map(|(raw, _)| raw.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let literals: Option<Vec<&str>> = parts.iter().map(|(_, lit)| lit.as_deref()).collect();
    let Some(literals) = literals.filter(|_| stmt.location >= 0) else {
        // Special syntax (SET TIME ZONE 'UTC', …) or a value that cannot be
        // re-quoted safely: replay as written.
        return (value, text.to_string());
    };
    let name = stmt
        .name
        .split('.')
        .map(quote_ident)
        .collect::<Vec<_>>()
        .join(".");
    let local = if stmt.is_local { "LOCAL " } else { "" };
    let canonical = format!("SET {local}{name} = {}", literals.join(", "));
    if reparses_same(&canonical, stmt) {
        (value, canonical)
    } else {
        (value, text.to_string())
    }
}

/// (plain value, SQL literal) of one constant argument; the literal is
/// `None` when re-quoting could change its meaning (backslashes, which depend
/// on `standard_conforming_strings`).
fn render_arg(arg: &Node) -> Option<(String, Option<String>)> {
    let Some(node::Node::AConst(c)) = arg.node.as_ref() else {
        return None;
    };
    match c.val.as_ref()? {
        a_const::Val::Sval(s) => {
            let literal =
                (!s.sval.contains('\\')).then(|| format!("'{}'", s.sval.replace('\'', "''")));
            Some((s.sval.clone(), literal))
        }
        a_const::Val::Ival(i) => Some((i.ival.to_string(), Some(i.ival.to_string()))),
        a_const::Val::Fval(f) => Some((f.fval.clone(), Some(f.fval.clone()))),
        a_const::Val::Boolval(b) => {
            let v = if b.boolval { "true" } else { "false" };
            Some((v.to_string(), Some(v.to_string())))
        }
        a_const::Val::Bsval(_) => None,
    }
}

/// Quotes one dotted part of a setting name when it is not a plain identifier.
fn quote_ident(part: &str) -> String {
    let mut chars = part.chars();
    let plain = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '$');
    if plain {
        part.to_string()
    } else {
        format!("\"{}\"", part.replace('"', "\"\""))
    }
}

/// True when `sql` parses to a SET of the same name, kind, and values.
fn reparses_same(sql: &str, original: &VariableSetStmt) -> bool {
    let Ok(parsed) = pg_query::parse(sql, 0) else {
        return false;
    };
    let [raw] = parsed.protobuf.stmts.as_slice() else {
        return false;
    };
    let Some(node::Node::VariableSetStmt(again)) =
        raw.stmt.as_deref().and_then(|s| s.node.as_ref())
    else {
        return false;
    };
    let values = |s: &VariableSetStmt| -> Option<Vec<(String, Option<String>)>> {
        s.args.iter().map(render_arg).collect()
    };
    again.name == original.name
        && again.kind == original.kind
        && again.is_local == original.is_local
        && values(again) == values(original)
}

/// The schemas a `SET [LOCAL] search_path …` statement sets, as PostgreSQL reads them
/// (unquoted names folded to lower case, each value one schema): `Some(None)`
/// for `TO DEFAULT`, `None` when `sql` is no such statement or sets it in a way not read
/// here (`FROM CURRENT`).
pub fn search_path_of(sql: &str) -> Option<Option<Vec<String>>> {
    let parsed = std::panic::catch_unwind(|| pg_query::parse(sql, 0))
        .ok()?
        .ok()?;
    let stmt = parsed.protobuf.stmts.first()?.stmt.as_ref()?;
    let Some(pg_query::NodeEnum::VariableSetStmt(set)) = stmt.node.as_ref() else {
        return None;
    };
    if set.name != "search_path" {
        return None;
    }
    use pg_query::protobuf::VariableSetKind as K;
    match K::try_from(set.kind).ok()? {
        K::VarSetDefault | K::VarReset => Some(None),
        K::VarSetValue => {
            let mut schemas = Vec::new();
            for arg in &set.args {
                let Some(pg_query::NodeEnum::AConst(c)) = arg.node.as_ref() else {
                    return None;
                };
                // Each value is one schema as it stands (PostgreSQL quotes each item of this
                // list setting): `'a, b'` is a schema named `a, b`.
                match c.val.as_ref()? {
                    pg_query::protobuf::a_const::Val::Sval(s) => schemas.push(s.sval.clone()),
                    _ => return None,
                }
            }
            Some(Some(schemas))
        }
        _ => None,
    }
}

/// A `search_path` value given as one string (`s2, "My Schema"`, as `pg_db_role_setting` or
/// a quoted `SET` value holds it): its schemas, unquoted names folded to lower case,
/// `"$user"` kept as `$user`.
pub fn split_path(value: &str) -> Vec<String> {
    let mut out = Vec::new();
    let (mut cur, mut quoted, mut was_quoted) = (String::new(), false, false);
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if quoted && chars.peek() == Some(&'"') => {
                cur.push('"');
                chars.next();
            }
            '"' => {
                quoted = !quoted;
                was_quoted = true;
            }
            ',' if !quoted => {
                let name = std::mem::take(&mut cur);
                out.push(if was_quoted {
                    name
                } else {
                    name.to_lowercase()
                });
                was_quoted = false;
            }
            c if !quoted && c.is_whitespace() => {}
            c => cur.push(c),
        }
    }
    if !cur.is_empty() || was_quoted {
        out.push(if was_quoted { cur } else { cur.to_lowercase() });
    }
    out
}

#[cfg(test)]
mod search_path_tests {
    use super::search_path_of;

    #[test]
    fn search_path_statements() {
        let set = |sql: &str| search_path_of(sql);
        let list = |v: &[&str]| Some(Some(v.iter().map(|s| s.to_string()).collect()));
        assert_eq!(set("SET search_path = s2, public"), list(&["s2", "public"]));
        assert_eq!(
            set("set search_path to S2, \"My S\""),
            list(&["s2", "My S"])
        );
        assert_eq!(set("SET LOCAL search_path = \"$user\""), list(&["$user"]));
        assert_eq!(set("SET search_path = 's2, public'"), list(&["s2, public"]));
        assert_eq!(set("SET search_path TO DEFAULT"), Some(None));
        assert_eq!(set("SET search_path FROM CURRENT"), None);
        assert_eq!(set("SET work_mem = '4MB'"), None);
    }
}
