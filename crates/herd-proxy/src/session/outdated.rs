//! Statements Herd keeps prepared that a server refuses as out of date (a schema change made
//! elsewhere, or through the endpoint as the server confirms it): which refusals mean that,
//! what is forgotten, and the point from which the client's unit can run again.

use crate::analysis::SchemaChange;

/// Applies the schema change of what ran on `att` (reported ready with `status`): every
/// server's kept statements, or this one's, are prepared again before their next use. Raised
/// at every ReadyForQuery while the transaction lasts (this session's next statements on its
/// own server), and again at its end, when other sessions see the change: a statement another
/// server prepared in between, against the old schema, is not kept past it.
pub(super) fn note_schema_change(ctx: &crate::ProxyContext, att: &mut super::Attached, status: u8) {
    match att.schema {
        SchemaChange::None => return,
        SchemaChange::ThisServer => att.lease.conn.expired = true,
        SchemaChange::Everywhere => ctx.schema_changed(),
    }
    if status == b'I' {
        att.schema = SchemaChange::None;
        if att.rolled_back || att.error_seen {
            // Statements prepared here inside the transaction may name what it created and
            // then rolled back. (After a commit they stay: a statement the client parsed
            // before the change meets PostgreSQL's own revalidation, as directly.)
            att.lease.conn.expired = true;
        }
    }
}

/// A server refused a statement kept prepared there as out of date (`how`), while the
/// statements in `bound` were in use: they are closed and prepared again before their next
/// use, and after a schema change every server's kept statements are too.
pub(super) fn kept_statement_outdated(
    ctx: &crate::ProxyContext,
    att: &mut super::Attached,
    how: Outdated,
) {
    let conn = &mut att.lease.conn;
    for stmt in att.bound.drain(..) {
        let name = &stmt.server_name;
        conn.prepared.remove(name);
        if !conn.stale.contains(name) {
            conn.stale.push(name.clone());
        }
    }
    match how {
        Outdated::Schema => {
            tracing::debug!(node = %conn.endpoint.name, "a kept statement is out of date: the schema changed outside the endpoint");
            ctx.schema_changed();
        }
        Outdated::Missing => conn.expired = true,
    }
}

/// What the client was given of the answers of the unit on `att`, when a server refused one
/// of its kept statements as out of date and running the unit again is as if it had run once
/// on a new connection: the client parsed every statement in use in this very unit (directly,
/// it would have been prepared afresh: a statement parsed earlier answers as PostgreSQL's
/// own would, error included), the unit began outside a transaction block, ended with its
/// Sync, and nothing in it was executed (see [`crate::router::track::Tracker::stopped_at`]).
pub(super) fn rerun_point(att: &super::Attached) -> Option<crate::router::track::Given> {
    let parsed_here = |stmt: &std::sync::Arc<super::state::Statement>| {
        att.undo.iter().any(|(_, u)| {
            matches!(u, super::undo::Undo::Parse { client: Some((_, s)), .. }
                if std::sync::Arc::ptr_eq(s, stmt))
        })
    };
    if att.status != b'I' || att.retry_unit.is_none() || !att.bound.iter().all(parsed_here) {
        return None;
    }
    att.tracker.stopped_at()
}

/// How a server says a statement the proxy kept prepared there is out of date.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Outdated {
    /// It refers to an object dropped since (XX000 "cache lookup failed for type …"), or its
    /// result type changed (0A000 "cached plan must not change result type"): DDL from outside
    /// the endpoint, which every server's copies may share.
    Schema,
    /// The server does not hold it (26000): this connection's record is wrong.
    Missing,
}

/// Whether the error `code` / `message` says a prepared statement is out of date.
pub(super) fn outdated_statement(code: &str, message: &str) -> Option<Outdated> {
    match code {
        "XX000" if message.starts_with("cache lookup failed") => Some(Outdated::Schema),
        "0A000" if message.starts_with("cached plan must not change") => Some(Outdated::Schema),
        "26000" => Some(Outdated::Missing),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{outdated_statement, Outdated};

    #[test]
    fn refusals_of_outdated_statements() {
        assert_eq!(
            outdated_statement("XX000", "cache lookup failed for type 18134"),
            Some(Outdated::Schema)
        );
        assert_eq!(
            outdated_statement("0A000", "cached plan must not change result type"),
            Some(Outdated::Schema)
        );
        assert_eq!(
            outdated_statement("26000", "prepared statement \"herd_1\" does not exist"),
            Some(Outdated::Missing)
        );
        assert_eq!(outdated_statement("XX000", "could not open file"), None);
        assert_eq!(
            outdated_statement(
                "0A000",
                "cannot access temporary or unlogged relations during recovery"
            ),
            None
        );
        assert_eq!(outdated_statement("42P01", "relation does not exist"), None);
    }
}
