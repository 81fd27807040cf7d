//! Client messages on their way to the attached server: prepared statements renamed to their
//! shared server-side names (and prepared on demand), answers the proxy gives itself queued in
//! order, and each statement's effect on the session noted.

use herd_wire::frontend::{tag, Bind, Close, Describe, Parse, Query, KIND_STATEMENT};
use herd_wire::{encode, Frame};

use super::state::{SessionState, Statement};
use super::Attached;
use crate::analysis::{analyze, Analysis};
use crate::router::track::Expect;
use crate::server::PREPARED_CAPACITY;
use crate::{ProxyContext, ProxyError};

/// What the caller does after a client message.
#[derive(Debug, PartialEq, Eq)]
pub enum Flow {
    /// Go on.
    Continue,
    /// The client sent Terminate.
    Terminate,
}

/// Everything translation touches, borrowed from the session.
pub struct Translator<'a> {
    pub ctx: &'a ProxyContext,
    pub state: &'a mut SessionState,
    pub att: &'a mut Attached,
    pub next_id: &'a mut u64,
    /// Answers for the client (synthetic ones, in order).
    pub to_client: &'a mut Vec<u8>,
}

impl Translator<'_> {
    /// Appends what `frame` becomes on the server to `to_server`.
    pub fn translate(
        &mut self,
        frame: &Frame<'_>,
        to_server: &mut Vec<u8>,
    ) -> Result<Flow, ProxyError> {
        match frame.tag {
            tag::QUERY => {
                let q = Query::decode(frame.body)?;
                self.note(&analyze(self.ctx, q.sql));
                match self.deallocate(q.sql, to_server)? {
                    Some(sql) => encode::query(to_server, &sql)?,
                    None => to_server.extend_from_slice(frame.raw),
                }
                self.att.tracker.sent(Expect::Query, false, None);
            }
            tag::PARSE => self.parse(frame, to_server)?,
            tag::BIND => {
                let b = Bind::decode(frame.body)?;
                if b.statement.is_empty() {
                    self.att.wrote |= !self.state.unnamed_read_only;
                    to_server.extend_from_slice(frame.raw);
                } else if let Some(stmt) = self.state.statements.get(b.statement).cloned() {
                    self.att.wrote |= !stmt.read_only;
                    self.ensure_prepared(&stmt, to_server)?;
                    encode::bind_renamed(to_server, b.portal, &stmt.server_name, b.rest)?;
                } else {
                    // Unknown to the proxy: the server reports the error (26000).
                    to_server.extend_from_slice(frame.raw);
                }
                self.att.tracker.sent(Expect::Bind, false, None);
            }
            tag::DESCRIBE => {
                let d = Describe::decode(frame.body)?;
                if d.kind == KIND_STATEMENT {
                    match self.state.statements.get(d.name).cloned() {
                        Some(stmt) if !d.name.is_empty() => {
                            self.ensure_prepared(&stmt, to_server)?;
                            encode::describe(to_server, KIND_STATEMENT, &stmt.server_name)?;
                        }
                        _ => to_server.extend_from_slice(frame.raw),
                    }
                    self.att
                        .tracker
                        .sent(Expect::DescribeStatement, false, None);
                } else {
                    to_server.extend_from_slice(frame.raw);
                    self.att.tracker.sent(Expect::DescribePortal, false, None);
                }
            }
            tag::CLOSE => {
                let c = Close::decode(frame.body)?;
                if c.kind == KIND_STATEMENT && !c.name.is_empty() {
                    // Server-side statements are shared: forget the client's name only.
                    self.state.statements.remove(c.name);
                    let mut answer = Vec::new();
                    encode::close_complete(&mut answer);
                    self.att
                        .tracker
                        .answered_by_proxy(Expect::Close, answer, self.to_client);
                } else {
                    to_server.extend_from_slice(frame.raw);
                    self.att.tracker.sent(Expect::Close, false, None);
                }
            }
            tag::EXECUTE => {
                to_server.extend_from_slice(frame.raw);
                self.att.tracker.sent(Expect::Execute, false, None);
            }
            tag::SYNC => {
                to_server.extend_from_slice(frame.raw);
                self.att.tracker.sent(Expect::Sync, false, None);
            }
            tag::FUNCTION_CALL => {
                // Answered by FunctionCallResponse then ReadyForQuery, like a simple query.
                self.att.wrote = true;
                to_server.extend_from_slice(frame.raw);
                self.att.tracker.sent(Expect::Query, false, None);
            }
            tag::FLUSH | tag::COPY_DATA | tag::COPY_DONE | tag::COPY_FAIL => {
                to_server.extend_from_slice(frame.raw)
            }
            tag::TERMINATE => return Ok(Flow::Terminate),
            other => {
                return Err(ProxyError::Protocol(format!(
                    "unexpected message type '{}'",
                    char::from(other)
                )));
            }
        }
        Ok(Flow::Continue)
    }

    fn parse(&mut self, frame: &Frame<'_>, to_server: &mut Vec<u8>) -> Result<(), ProxyError> {
        let p = Parse::decode(frame.body)?;
        let analysis = analyze(self.ctx, p.query);
        self.note(&analysis);
        if let Some(sql) = self.deallocate(p.query, to_server)? {
            encode::parse(to_server, p.name, &sql, &p.param_types)?;
            self.att.tracker.sent(Expect::Parse, false, None);
            return Ok(());
        }
        if p.name.is_empty() {
            self.state.unnamed_read_only = analysis.read_only;
            to_server.extend_from_slice(frame.raw);
            self.att.tracker.sent(Expect::Parse, false, None);
            return Ok(());
        }
        let stmt = std::sync::Arc::new(Statement::new(
            p.query,
            p.param_types.clone(),
            analysis.read_only,
        ));
        self.state
            .statements
            .insert(p.name.to_string(), stmt.clone());
        if self.att.lease.conn.prepared.touch(&stmt.server_name) {
            // Already on this server: answer ParseComplete ourselves, in order.
            let mut answer = Vec::new();
            encode::parse_complete(&mut answer);
            self.att
                .tracker
                .answered_by_proxy(Expect::Parse, answer, self.to_client);
            return Ok(());
        }
        self.send_parse(&stmt, false, to_server)
    }

    /// Prepares `stmt` on the server first if it lacks it; the answer is swallowed.
    fn ensure_prepared(
        &mut self,
        stmt: &Statement,
        to_server: &mut Vec<u8>,
    ) -> Result<(), ProxyError> {
        if self.att.lease.conn.prepared.touch(&stmt.server_name) {
            return Ok(());
        }
        self.send_parse(stmt, true, to_server)
    }

    /// Sends a Parse of `stmt` under its shared name (making room first); its answer reaches
    /// the client unless `swallow`.
    fn send_parse(
        &mut self,
        stmt: &Statement,
        swallow: bool,
        to_server: &mut Vec<u8>,
    ) -> Result<(), ProxyError> {
        let id = self.new_id();
        self.evict_if_full(to_server)?;
        encode::parse(to_server, &stmt.server_name, &stmt.query, &stmt.param_types)?;
        self.att
            .lease
            .conn
            .prepared
            .insert(stmt.server_name.clone());
        self.att.parsing.push((id, stmt.server_name.clone()));
        self.att.tracker.sent(Expect::Parse, swallow, Some(id));
        Ok(())
    }

    /// SQL `DEALLOCATE` of a protocol-level statement: the server knows it by its shared name.
    /// Returns the statement to send instead, after making sure the server has the statement
    /// (so the DEALLOCATE succeeds as the client expects); `None` to send the text unchanged.
    fn deallocate(
        &mut self,
        sql: &str,
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

    fn evict_if_full(&mut self, to_server: &mut Vec<u8>) -> Result<(), ProxyError> {
        while self.att.lease.conn.prepared.len() >= PREPARED_CAPACITY {
            if let Some(old) = self.att.lease.conn.prepared.pop_oldest() {
                encode::close(to_server, KIND_STATEMENT, &old)?;
                self.att.tracker.sent(Expect::Close, true, None);
            }
        }
        Ok(())
    }

    fn new_id(&mut self) -> u64 {
        *self.next_id += 1;
        *self.next_id
    }

    /// Notes a statement's effects: a possible write (for the read-your-writes token), a pin,
    /// and session settings (applied once the server confirms them).
    fn note(&mut self, a: &Analysis) {
        self.att.wrote |= !a.read_only;
        self.att.pinned |= a.pin;
        self.att.effects.extend(a.effects.iter().cloned());
    }
}

/// The target of a lone `DEALLOCATE [PREPARE] name | ALL`: `Some(None)` for ALL.
fn deallocate_target(sql: &str) -> Option<Option<String>> {
    let text = sql.trim().trim_end_matches(';').trim();
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
    Some(Some(name))
}

#[cfg(test)]
mod tests {
    use super::deallocate_target;

    #[test]
    fn deallocate_forms() {
        assert_eq!(deallocate_target("DEALLOCATE ALL"), Some(None));
        assert_eq!(deallocate_target("deallocate prepare all;"), Some(None));
        assert_eq!(
            deallocate_target("DEALLOCATE _pg3_0"),
            Some(Some("_pg3_0".into()))
        );
        assert_eq!(
            deallocate_target("DEALLOCATE \"Q1\""),
            Some(Some("Q1".into()))
        );
        assert_eq!(deallocate_target("DEALLOCATE Q1"), Some(Some("q1".into())));
        assert_eq!(deallocate_target("select 1"), None);
        assert_eq!(deallocate_target("deallocate a b"), None);
    }
}
