//! What the proxy needs to know about a SQL string: may it run on a replica, does it pin the
//! session, which settings does it change. Built on `herd-sql`'s cached classification and
//! the function catalog read from `pg_proc`.

use herd_core::Consistency;
use herd_sql::{Reason, Route, SessionEffect, TxEffect};

use crate::ProxyContext;

/// A change to the session that the proxy carries between servers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// `SET name = …`, replayed with `sql`.
    Set {
        /// Setting name.
        name: String,
        /// Replay statement.
        sql: String,
    },
    /// `SET LOCAL search_path …`: the path for the rest of the transaction (replayed never:
    /// the transaction stays on its server).
    SetLocalPath {
        /// The statement.
        sql: String,
    },
    /// `set_config('search_path', …)`: the session's path is no longer known to the proxy.
    PathUnknown,
    /// `RESET name`.
    Reset {
        /// Setting name.
        name: String,
    },
    /// `RESET ALL`.
    ResetAll,
    /// `DISCARD ALL`: settings and prepared statements are gone.
    DiscardAll,
    /// `SET herd.consistency = …`.
    Consistency(Consistency),
}

/// Statements the proxy may answer itself, without a server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LocalAnswer {
    /// `SET [SESSION] herd.consistency = level` alone.
    Consistency(Consistency),
    /// `SET LOCAL herd.consistency = level` alone: for the current transaction.
    ConsistencyLocal(Consistency),
    /// `BEGIN` / `START TRANSACTION` alone: the server is chosen at the first real statement.
    Begin {
        /// Declared READ ONLY.
        read_only: bool,
    },
    /// `COMMIT` / `END` alone.
    Commit,
    /// `ROLLBACK` / `ABORT` alone.
    Rollback,
}

/// The facts about one SQL string.
#[derive(Clone, Debug)]
pub struct Analysis {
    /// May run on a hot standby (given the function catalog).
    pub read_only: bool,
    /// Why it got its route.
    pub reason: Reason,
    /// Binds the session to the server that runs it.
    pub pin: bool,
    /// Session changes, applied once the server confirmed them.
    pub effects: Vec<Effect>,
    /// Answered by the proxy alone.
    pub local: Option<LocalAnswer>,
    /// What running it may change in the schema that statements kept prepared on servers
    /// refer to.
    pub schema: SchemaChange,
}

/// How far a statement's schema change reaches: statements Herd keeps prepared on servers
/// were analysed against the old schema, and PostgreSQL does not always notice (a dropped and
/// recreated type leaves plans naming the old type's OID: XX000 "cache lookup failed").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum SchemaChange {
    /// Changes no schema object.
    #[default]
    None,
    /// Changes objects of this server's session only (a temporary table or type): the
    /// statements kept on this server connection are prepared again, no others.
    ThisServer,
    /// May change objects every server sees (CREATE, ALTER, DROP, a DO block): every server
    /// connection prepares its kept statements again.
    Everywhere,
}

/// Classifies `sql`, bytes in the client's encoding (cached by text), and combines it with the
/// function catalog. Text that is not UTF-8 is classified from its lossy UTF-8 reading (in an
/// ASCII-compatible encoding the SQL keywords, quotes and names it routes by are all ASCII),
/// but it never goes to a replica when the client's encoding may hide ASCII bytes inside
/// multibyte characters (`unsafe_encoding`), and settings it changes pin the session instead
/// of being replayed (their text could not be replayed byte for byte).
pub fn analyze(ctx: &ProxyContext, sql: &[u8], unsafe_encoding: bool) -> Analysis {
    match std::str::from_utf8(sql) {
        Ok(text) if !unsafe_encoding || text.is_ascii() => analyze_text(ctx, text),
        Ok(text) => not_routable(analyze_text(ctx, text)),
        Err(_) => {
            let text = String::from_utf8_lossy(sql);
            let mut a = analyze_text(ctx, &text);
            if unsafe_encoding {
                a = not_routable(a);
            }
            if !a.effects.is_empty() {
                a.effects
                    .retain(|e| matches!(e, Effect::Consistency(_) | Effect::PathUnknown));
                a.pin = true;
            }
            a.local = None;
            a
        }
    }
}

/// `a`, but for the primary.
fn not_routable(mut a: Analysis) -> Analysis {
    if a.read_only {
        a.read_only = false;
        a.reason = Reason::Unparseable;
    }
    a.local = None;
    a
}

fn analyze_text(ctx: &ProxyContext, sql: &str) -> Analysis {
    let classification = ctx.classifier.get_or_classify(sql);
    let catalog = ctx.catalog();
    let (route, reason) = classification.route(&*catalog);
    let mut effects = Vec::new();
    let mut pin = false;
    for s in &classification.statements {
        match &s.session {
            SessionEffect::Set { name, value, .. } if name == "herd.consistency" => {
                if let Ok(level) = value.parse() {
                    effects.push(Effect::Consistency(level));
                }
            }
            SessionEffect::Set { name, sql, .. } => effects.push(Effect::Set {
                name: name.clone(),
                sql: sql.clone(),
            }),
            SessionEffect::Reset { name } => effects.push(Effect::Reset { name: name.clone() }),
            SessionEffect::ResetAll => effects.push(Effect::ResetAll),
            SessionEffect::Discard { all: true } => effects.push(Effect::DiscardAll),
            SessionEffect::Pin(_) => pin = true,
            SessionEffect::SetLocal { name, sql, .. } if name == "search_path" => {
                effects.push(Effect::SetLocalPath { sql: sql.clone() })
            }
            SessionEffect::Discard { all: false }
            | SessionEffect::SetLocal { .. }
            | SessionEffect::None => {}
        }
        // Names in tables resolve by the path: one set where the proxy cannot read it makes
        // every unqualified name uncertain.
        if s.functions.iter().any(|f| f.ends_with("set_config"))
            && sql.to_ascii_lowercase().contains("search_path")
        {
            effects.push(Effect::PathUnknown);
        }
    }
    let local = match (classification.statements.as_slice(), effects.as_slice()) {
        ([_], [Effect::Consistency(level)]) => Some(LocalAnswer::Consistency(*level)),
        ([only], []) => match (&only.session, only.tx) {
            (SessionEffect::SetLocal { name, value, .. }, _) if name == "herd.consistency" => {
                value.parse().ok().map(LocalAnswer::ConsistencyLocal)
            }
            // SERIALIZABLE transactions are refused by standbys: they are never deferred.
            (_, TxEffect::Begin { read_only }) if route == Route::Replica || !read_only => {
                Some(LocalAnswer::Begin {
                    read_only: read_only && route == Route::Replica,
                })
            }
            (_, TxEffect::Commit) => Some(LocalAnswer::Commit),
            (_, TxEffect::Rollback) => Some(LocalAnswer::Rollback),
            _ => None,
        },
        _ => None,
    };
    Analysis {
        read_only: route == Route::Replica,
        reason,
        pin,
        effects,
        local,
        schema: schema_change(sql, &classification.statements),
    }
}

/// What `statements` (classified from `sql`) may change in the schema. Errs on the side of a
/// change: DDL of any kind (GRANT, VACUUM and ANALYZE included: rare through the endpoint, and
/// a needless change costs one prepare per kept statement), and DO blocks, which migrations
/// use to run DDL. Functions and procedures that run DDL are not seen here: the server's
/// errors about outdated statements catch those (see `session::relay`).
fn schema_change(sql: &str, statements: &[herd_sql::Statement]) -> SchemaChange {
    statements
        .iter()
        .map(|s| match (&s.reason, &s.session) {
            (Reason::Ddl, SessionEffect::Pin(herd_sql::PinReason::TempTable)) => {
                SchemaChange::ThisServer
            }
            (Reason::Ddl, _) => SchemaChange::Everywhere,
            (Reason::Utility, _) if s.may_write && starts_with_do(sql.get(s.span.clone())) => {
                SchemaChange::Everywhere
            }
            _ => SchemaChange::None,
        })
        .max()
        .unwrap_or_default()
}

/// Whether a statement's text is a DO block.
fn starts_with_do(text: Option<&str>) -> bool {
    let Some(text) = text else {
        return true; // no text to tell by: assume the worst
    };
    let word: String = text
        .chars()
        .take_while(|c| c.is_ascii_alphabetic())
        .collect();
    word.eq_ignore_ascii_case("do")
}

/// A short label of a reason, for metrics.
pub fn reason_label(reason: &Reason) -> &'static str {
    match reason {
        Reason::ReadOnly => "read",
        Reason::Write => "write",
        Reason::Ddl => "ddl",
        Reason::LockingRead => "locking_read",
        Reason::Lock => "lock",
        Reason::SelectInto => "select_into",
        Reason::WritingCte => "writing_cte",
        Reason::VolatileFunction(_) => "volatile_function",
        Reason::UnknownFunction(_) => "unknown_function",
        Reason::TransactionControl => "transaction_control",
        Reason::SerializableTransaction => "serializable",
        Reason::SessionState => "session_state",
        Reason::Cursor => "cursor",
        Reason::Utility => "utility",
        Reason::PrimaryOnly(_) => "primary_only",
        Reason::Unparseable => "unparseable",
        Reason::TooComplex => "too_complex",
        Reason::Empty => "empty",
    }
}

#[cfg(test)]
mod tests {
    use super::{schema_change, SchemaChange};

    fn change(sql: &str) -> SchemaChange {
        schema_change(sql, &herd_sql::classify(sql).statements)
    }

    #[test]
    fn schema_changes_by_statement() {
        assert_eq!(change("select 1"), SchemaChange::None);
        assert_eq!(change("insert into t values (1)"), SchemaChange::None);
        assert_eq!(change("set search_path = a"), SchemaChange::None);
        assert_eq!(change("call p()"), SchemaChange::None);
        for ddl in [
            "drop type e",
            "create type e as enum ('a')",
            "alter table t add column b int",
            "create or replace function f() returns int language sql as 'select 1'",
            "drop schema s cascade",
            "select 1; alter table t drop column b",
            "DO $$ begin execute 'drop table t'; end $$",
            "grant select on t to public",
        ] {
            assert_eq!(change(ddl), SchemaChange::Everywhere, "{ddl}");
        }
        assert_eq!(
            change("create temporary table tt(a int)"),
            SchemaChange::ThisServer
        );
        assert_eq!(
            change("create temp table tt(a int); drop table t"),
            SchemaChange::Everywhere
        );
    }
}
