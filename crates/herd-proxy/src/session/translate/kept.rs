//! Statements kept prepared on the attached server: the client's unnamed and named statements
//! made the server's before a Bind or Describe uses them (prepared on demand under shared
//! names), kept ones expired or evicted, and `DEALLOCATE` forgetting them.

use std::sync::Arc;

use herd_wire::encode;
use herd_wire::frontend::KIND_STATEMENT;

use super::super::state::Statement;
use super::super::undo::Undo;
use super::Translator;
use crate::router::track::Expect;
use crate::server::{Lookup, PREPARED_CAPACITY};
use crate::ProxyError;

impl Translator<'_> {
    /// Makes the server's unnamed statement the client's before a Bind or Describe uses it: the
    /// client parsed it in an earlier unit, maybe on another server, or another client's
    /// Parse replaced it here. Without one, the server's own is closed so the client gets
    /// PostgreSQL's 26000 rather than someone else's statement.
    pub(super) fn ensure_unnamed(&mut self, to_server: &mut Vec<u8>) -> Result<(), ProxyError> {
        let conn = &mut self.att.lease.conn;
        match &self.state.unnamed {
            Some(u) if conn.unnamed == Some(u.token) => {}
            Some(u) => {
                encode::parse(to_server, b"", &u.stmt.query, &u.stmt.param_types)?;
                conn.unnamed = Some(u.token);
                let token = u.token;
                let id = self.record(Undo::Unnamed { token });
                self.att.tracker.sent(Expect::Parse, true, Some(id));
            }
            None if conn.unnamed.is_some() => {
                encode::close(to_server, KIND_STATEMENT, b"")?;
                conn.unnamed = None;
                self.att.tracker.sent(Expect::Close, true, None);
            }
            None => {}
        }
        Ok(())
    }

    /// Closes every statement kept on the server once they are all out of date
    /// (`ServerConn::expired`): they are prepared again on demand. The Closes go ahead of the
    /// client's message, their answers swallowed.
    pub(super) fn expire_kept(&mut self, to_server: &mut Vec<u8>) -> Result<(), ProxyError> {
        let conn = &mut self.att.lease.conn;
        if !std::mem::take(&mut conn.expired) {
            return Ok(());
        }
        let mut names = conn.prepared.take_all();
        names.append(&mut conn.stale);
        for name in names {
            encode::close(to_server, KIND_STATEMENT, &name)?;
            self.att.tracker.sent(Expect::Close, true, None);
        }
        Ok(())
    }

    /// Prepares `stmt` on the server first if it lacks it; the answer is swallowed.
    pub(super) fn ensure_prepared(
        &mut self,
        stmt: &Statement,
        to_server: &mut Vec<u8>,
    ) -> Result<(), ProxyError> {
        if self.fresh_here(stmt) {
            return Ok(());
        }
        self.send_parse(stmt, true, None, to_server)
    }

    /// Whether the server holds `stmt` as the client knows it; a stale copy is queued for
    /// closing.
    pub(super) fn fresh_here(&mut self, stmt: &Statement) -> bool {
        let conn = &mut self.att.lease.conn;
        match conn
            .prepared
            .lookup(&stmt.server_name, stmt.generation, stmt.path)
        {
            Lookup::Fresh => true,
            Lookup::Stale => {
                if !conn.stale.contains(&stmt.server_name) {
                    conn.stale.push(stmt.server_name.clone());
                }
                false
            }
            Lookup::Absent => false,
        }
    }

    /// Sends a Parse of `stmt` under its shared name (making room first, and closing a stale
    /// copy); its answer reaches the client unless `swallow`.
    pub(super) fn send_parse(
        &mut self,
        stmt: &Statement,
        swallow: bool,
        client: Option<(Vec<u8>, Arc<Statement>)>,
        to_server: &mut Vec<u8>,
    ) -> Result<(), ProxyError> {
        self.evict_if_full(to_server)?;
        let conn = &mut self.att.lease.conn;
        if let Some(pos) = conn.stale.iter().position(|n| *n == stmt.server_name) {
            conn.stale.swap_remove(pos);
            encode::close(to_server, KIND_STATEMENT, &stmt.server_name)?;
            self.att.tracker.sent(Expect::Close, true, None);
        }
        encode::parse(to_server, &stmt.server_name, &stmt.query, &stmt.param_types)?;
        // Read before the Parse reaches the server: a copy prepared while a schema change
        // commits counts as older than it.
        let generation = stmt.generation.max(self.ctx.schema_generation());
        self.att
            .lease
            .conn
            .prepared
            .insert(stmt.server_name.clone(), generation, self.state.path);
        let id = self.record(Undo::Parse {
            server: Some(stmt.server_name.clone()),
            client,
        });
        self.att.tracker.sent(Expect::Parse, swallow, Some(id));
        Ok(())
    }

    /// SQL `DEALLOCATE` of a protocol-level statement: the server knows it by its shared name.
    /// Returns the statement to send instead, after making sure the server has the statement
    /// (so the DEALLOCATE succeeds as the client expects); `None` to send the text unchanged.
    pub(super) fn deallocate(
        &mut self,
        sql: &[u8],
        to_server: &mut Vec<u8>,
    ) -> Result<Option<String>, ProxyError> {
        match deallocate_target(sql) {
            None => Ok(None),
            Some(None) => {
                // DEALLOCATE ALL: everything prepared on this server and by this client is gone.
                self.state.statements.clear();
                self.att.lease.conn.prepared.clear();
                Ok(None)
            }
            Some(Some(name)) => {
                let Some(stmt) = self.state.statements.remove(&name) else {
                    return Ok(None);
                };
                self.ensure_prepared(&stmt, to_server)?;
                self.att.lease.conn.prepared.remove(&stmt.server_name);
                Ok(Some(format!("DEALLOCATE \"{}\"", stmt.server_name)))
            }
        }
    }

    pub(super) fn evict_if_full(&mut self, to_server: &mut Vec<u8>) -> Result<(), ProxyError> {
        while self.att.lease.conn.prepared.len() >= PREPARED_CAPACITY {
            if let Some(old) = self.att.lease.conn.prepared.pop_oldest() {
                encode::close(to_server, KIND_STATEMENT, &old)?;
                self.att.tracker.sent(Expect::Close, true, None);
            }
        }
        Ok(())
    }
}

/// The target of a lone `DEALLOCATE [PREPARE] name | ALL`: `Some(None)` for ALL.
pub(super) fn deallocate_target(sql: &[u8]) -> Option<Option<Vec<u8>>> {
    // Every simple query and Parse passes here and almost none is a DEALLOCATE: its first
    // word is checked before any decoding or trimming (PostgreSQL's own whitespace is ASCII).
    let start = sql
        .iter()
        .position(|b| !b.is_ascii_whitespace() && *b != 0x0b)?;
    if !sql
        .get(start..start + "deallocate".len())?
        .eq_ignore_ascii_case(b"deallocate")
    {
        return None;
    }
    let text = std::str::from_utf8(sql).ok()?;
    let text = text.trim().trim_end_matches(';').trim();
    let mut words = text.split_whitespace();
    if !words.next()?.eq_ignore_ascii_case("deallocate") {
        return None;
    }
    let mut target = words.next()?;
    if target.eq_ignore_ascii_case("prepare") {
        target = words.next()?;
    }
    if words.next().is_some() {
        return None;
    }
    if target.eq_ignore_ascii_case("all") {
        return Some(None);
    }
    let name = match target.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        Some(quoted) => quoted.replace("\"\"", "\""),
        None => target.to_lowercase(),
    };
    Some(Some(name.into_bytes()))
}

#[cfg(test)]
mod tests {
    use super::deallocate_target;

    #[test]
    fn deallocate_forms() {
        assert_eq!(deallocate_target(b"DEALLOCATE ALL"), Some(None));
        assert_eq!(deallocate_target(b"deallocate prepare all;"), Some(None));
        assert_eq!(
            deallocate_target(b"DEALLOCATE _pg3_0"),
            Some(Some(b"_pg3_0".to_vec()))
        );
        assert_eq!(
            deallocate_target(b"DEALLOCATE \"Q1\""),
            Some(Some(b"Q1".to_vec()))
        );
        assert_eq!(
            deallocate_target(b"DEALLOCATE Q1"),
            Some(Some(b"q1".to_vec()))
        );
        assert_eq!(deallocate_target(b"select 1"), None);
        assert_eq!(deallocate_target(b"deallocate a b"), None);
        assert_eq!(deallocate_target(b" \t\x0b\n DeAllocate all"), Some(None));
        assert_eq!(deallocate_target(b"dealloc"), None);
        assert_eq!(deallocate_target(b""), None);
    }
}
