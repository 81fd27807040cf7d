//! Client messages on their way to the attached server: prepared statements renamed to their
//! shared server-side names (and prepared on demand, the unnamed one included), answers the
//! proxy gives itself queued in order, and each statement's effect on the session noted when
//! it runs.

use std::sync::Arc;

use herd_wire::frontend::{tag, Bind, Close, Describe, Parse, Query, KIND_STATEMENT};
use herd_wire::{encode, Frame};

use super::general::Here;
use super::state::{RecentParse, SessionState, Statement, Unnamed};
use super::undo::Undo;
use super::Attached;
use crate::analysis::{analyze, reason_label, Analysis};
use crate::router::track::Expect;
use crate::{ProxyContext, ProxyError};

mod groups;
mod kept;

use kept::deallocate_target;

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
    /// The message being translated is a Parse the client has sent nothing after (yet).
    pub at_pause: bool,
    /// Session pooling: the server is the client's alone, so statements and portals keep the
    /// client's own names and go through untouched (`pg_prepared_statements` shows them as
    /// the client named them, and the server itself answers duplicates and unknown names).
    pub passthrough: bool,
    /// The shard map while something is distributed: statements are checked against the
    /// group of the attached server.
    pub map: Option<&'a herd_shard::ShardMap>,
    /// The session's database and role (names resolve in them).
    pub database: &'a str,
    /// The session's role.
    pub user: &'a str,
    /// The transaction spans shard groups: statements that would end or split one group's
    /// part only are refused.
    pub spanning: bool,
    /// The analysis of the unit's simple query when the routing already made it.
    pub known_query: Option<Analysis>,
}

impl Translator<'_> {
    /// Appends what `frame` becomes on the server to `to_server`.
    pub fn translate(
        &mut self,
        frame: &Frame<'_>,
        to_server: &mut Vec<u8>,
    ) -> Result<Flow, ProxyError> {
        if self.att.tracker.skipping()
            && matches!(
                frame.tag,
                tag::PARSE | tag::BIND | tag::DESCRIBE | tag::CLOSE | tag::EXECUTE
            )
        {
            // After an error the server ignores these until Sync, and so must the proxy: no
            // statement is created or closed, nothing is answered.
            to_server.extend_from_slice(frame.raw);
            return Ok(Flow::Continue);
        }
        match self.wrong_group(frame)? {
            Some(Here::Refuse(why)) => {
                self.refuse_here(frame, &why, to_server)?;
                return Ok(Flow::Continue);
            }
            Some(Here::General(sql, types)) => {
                self.send_general(frame, &sql, &types, to_server)?;
                return Ok(Flow::Continue);
            }
            None => {}
        }
        if self.passthrough {
            if let Some(flow) = self.pass(frame, to_server)? {
                return Ok(flow);
            }
        }
        if matches!(
            frame.tag,
            tag::PARSE | tag::BIND | tag::DESCRIBE | tag::QUERY
        ) {
            self.expire_kept(to_server)?;
        }
        match frame.tag {
            tag::QUERY => {
                // A query analysed when it was routed was decoded then (its text, one NUL).
                let sql = match (&self.known_query, frame.body.split_last()) {
                    (Some(_), Some((&0, text))) => text,
                    _ => Query::decode(frame.body)?.sql,
                };
                let analysis = self.query_analysis(sql);
                self.note(&analysis);
                match self.deallocate(sql, to_server)? {
                    Some(sql) => encode::query(to_server, sql)?,
                    None => to_server.extend_from_slice(frame.raw),
                }
                // A simple query drops the unnamed statement (PostgreSQL's exec_simple_query).
                self.state.unnamed = None;
                self.att.lease.conn.unnamed = None;
                self.att.tracker.sent(Expect::Query, false, None);
            }
            tag::PARSE => self.parse(frame, to_server)?,
            tag::BIND => self.bind(frame, to_server)?,
            tag::DESCRIBE => {
                let d = Describe::decode(frame.body)?;
                if d.kind == KIND_STATEMENT {
                    if d.name.is_empty() {
                        self.ensure_unnamed(to_server)?;
                        to_server.extend_from_slice(frame.raw);
                    } else if let Some(stmt) = self.state.statements.get(d.name).cloned() {
                        self.ensure_prepared(&stmt, to_server)?;
                        encode::describe(to_server, KIND_STATEMENT, &stmt.server_name)?;
                        self.att.bound.push(stmt);
                    } else {
                        to_server.extend_from_slice(frame.raw);
                    }
                    self.att
                        .tracker
                        .sent(Expect::DescribeStatement, false, None);
                } else {
                    to_server.extend_from_slice(frame.raw);
                    self.att.tracker.sent(Expect::DescribePortal, false, None);
                }
            }
            tag::CLOSE => self.close(frame, to_server)?,
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
            tag::FLUSH | tag::COPY_DATA => to_server.extend_from_slice(frame.raw),
            tag::COPY_DONE | tag::COPY_FAIL => {
                to_server.extend_from_slice(frame.raw);
                self.att.tracker.copy_ended();
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

    /// Session pooling: messages that name statements go as they are. `None` for the others.
    fn pass(
        &mut self,
        frame: &Frame<'_>,
        to_server: &mut Vec<u8>,
    ) -> Result<Option<Flow>, ProxyError> {
        let expect = match frame.tag {
            tag::QUERY => {
                let q = Query::decode(frame.body)?;
                let analysis = self.query_analysis(q.sql);
                self.note(&analysis);
                Expect::Query
            }
            tag::PARSE => {
                let p = Parse::decode(frame.body)?;
                self.note(&analyze(self.ctx, p.query, self.state.unsafe_encoding));
                if self.map.is_some() {
                    self.state.passed.insert(p.name.to_vec(), p.query.to_vec());
                }
                Expect::Parse
            }
            tag::BIND => Expect::Bind,
            tag::CLOSE => Expect::Close,
            tag::DESCRIBE => match Describe::decode(frame.body)?.kind {
                KIND_STATEMENT => Expect::DescribeStatement,
                _ => Expect::DescribePortal,
            },
            _ => return Ok(None),
        };
        to_server.extend_from_slice(frame.raw);
        self.att.tracker.sent(expect, false, None);
        Ok(Some(Flow::Continue))
    }

    fn parse(&mut self, frame: &Frame<'_>, to_server: &mut Vec<u8>) -> Result<(), ProxyError> {
        let p = Parse::decode(frame.body)?;
        let unsafe_encoding = self.state.unsafe_encoding;
        if p.name.is_empty() {
            let recent = self.state.recent_parse.as_ref().filter(|r| {
                r.stmt.param_types == p.param_types
                    && r.answers(p.query, unsafe_encoding, self.ctx.catalog_ptr())
            });
            if let Some(stmt) = recent.map(|r| Arc::clone(&r.stmt)) {
                self.parse_unnamed(stmt, frame, to_server);
                return Ok(());
            }
        }
        // Taken before the classification, so a catalog replaced meanwhile is never recorded
        // as the one the statement was classified with.
        let catalog = p.name.is_empty().then(|| self.ctx.catalog());
        let analysis = analyze(self.ctx, p.query, unsafe_encoding);
        if let Some(sql) = self.deallocate(p.query, to_server)? {
            self.note(&analysis);
            encode::parse(to_server, p.name, sql, &p.param_types)?;
            self.att.tracker.sent(Expect::Parse, false, None);
            return Ok(());
        }
        let mut stmt = Statement::new(p.query, p.param_types.clone(), &analysis, self.state.path);
        if !p.name.is_empty() {
            // Newer than every server's copy from before the client's last Close of it, and
            // before the last schema change: those are not what a fresh prepare gives now.
            stmt.generation = self
                .ctx
                .closed_generation(&stmt.server_name)
                .max(self.ctx.schema_generation());
        }
        let stmt = Arc::new(stmt);
        if let Some(catalog) = catalog {
            // A DEALLOCATE acts on the session at each Parse (`deallocate` above, which the
            // reuse skips): never reused.
            if deallocate_target(p.query).is_none() {
                let reason = reason_label(&analysis.reason);
                self.state.recent_parse = Some(RecentParse::new(
                    Arc::clone(&stmt),
                    reason,
                    &catalog,
                    unsafe_encoding,
                ));
            }
            self.parse_unnamed(stmt, frame, to_server);
            return Ok(());
        }
        if let Some(existing) = self.state.statements.get(p.name).cloned() {
            return self.fail_duplicate(p.name, &existing, to_server);
        }
        self.state.statements.insert(p.name.to_vec(), stmt.clone());
        let client = Some((p.name.to_vec(), stmt.clone()));
        let fresh = self.fresh_here(&stmt);
        if fresh && self.at_pause {
            // The client may pause here before the rest of its batch: the server must have
            // received this Parse now, as directly, so that its statement_timeout runs from
            // here (pgx's TestPrepareHandlesTimeoutBetweenParseAndDescribe). Prepared again.
            let conn = &mut self.att.lease.conn;
            if !conn.stale.contains(&stmt.server_name) {
                conn.stale.push(stmt.server_name.clone());
            }
        } else if fresh {
            // Already on this server: answer ParseComplete ourselves, in order.
            let mut answer = Vec::new();
            encode::parse_complete(&mut answer);
            let id = self.record(Undo::Parse {
                server: None,
                client,
            });
            self.att
                .tracker
                .answered_by_proxy(Expect::Parse, answer, Some(id), self.to_client);
            return Ok(());
        }
        self.send_parse(&stmt, false, client, to_server)
    }

    /// An unnamed Parse, of `stmt`: forwarded as it is.
    fn parse_unnamed(&mut self, stmt: Arc<Statement>, frame: &Frame<'_>, to_server: &mut Vec<u8>) {
        // PostgreSQL drops the old unnamed statement first, whatever becomes of this one.
        let token = self.ctx.next_token();
        self.state.unnamed = Some(Unnamed { stmt, token });
        self.att.lease.conn.unnamed = Some(token);
        to_server.extend_from_slice(frame.raw);
        let id = self.record(Undo::Unnamed { token });
        self.att.tracker.sent(Expect::Parse, false, Some(id));
    }

    /// A Parse of a name the client already uses: PostgreSQL answers 42P05 and, like any
    /// extended-protocol error, skips to the next Sync and fails an open transaction. The proxy
    /// has the server fail the same way (a Parse of a name the server holds) and shows the
    /// client PostgreSQL's error with the client's own name.
    fn fail_duplicate(
        &mut self,
        name: &[u8],
        existing: &Statement,
        to_server: &mut Vec<u8>,
    ) -> Result<(), ProxyError> {
        self.ensure_prepared(existing, to_server)?;
        encode::parse(
            to_server,
            &existing.server_name,
            &existing.query,
            &existing.param_types,
        )?;
        let mut error = Vec::new();
        encode::error_response(
            &mut error,
            "ERROR",
            "42P05",
            &format!(
                "prepared statement \"{}\" already exists",
                String::from_utf8_lossy(name)
            ),
        )?;
        self.att.tracker.sent_to_fail(Expect::Parse, error);
        Ok(())
    }

    fn bind(&mut self, frame: &Frame<'_>, to_server: &mut Vec<u8>) -> Result<(), ProxyError> {
        let b = Bind::decode(frame.body)?;
        if b.statement.is_empty() {
            if let Some(stmt) = self.state.unnamed.as_ref().map(|u| u.stmt.clone()) {
                self.note_statement(&stmt);
            }
            self.ensure_unnamed(to_server)?;
            to_server.extend_from_slice(frame.raw);
        } else if let Some(stmt) = self.state.statements.get(b.statement).cloned() {
            self.note_statement(&stmt);
            self.ensure_prepared(&stmt, to_server)?;
            self.att.bound.push(stmt.clone());
            encode::bind_renamed(to_server, b.portal, &stmt.server_name, b.rest)?;
        } else {
            // Unknown to the proxy: the server reports the error (26000).
            to_server.extend_from_slice(frame.raw);
        }
        self.att.tracker.sent(Expect::Bind, false, None);
        Ok(())
    }

    fn close(&mut self, frame: &Frame<'_>, to_server: &mut Vec<u8>) -> Result<(), ProxyError> {
        let c = Close::decode(frame.body)?;
        if c.kind != KIND_STATEMENT {
            to_server.extend_from_slice(frame.raw);
            self.att.tracker.sent(Expect::Close, false, None);
            return Ok(());
        }
        if c.name.is_empty() {
            self.state.unnamed = None;
            self.att.lease.conn.unnamed = None;
            to_server.extend_from_slice(frame.raw);
            self.att.tracker.sent(Expect::Close, false, None);
            return Ok(());
        }
        // Server-side statements are shared: forget the client's name only.
        let mut answer = Vec::new();
        encode::close_complete(&mut answer);
        let id = self.state.statements.remove(c.name).map(|stmt| {
            // A driver closes a statement it found invalid (a schema change) before preparing
            // it again: the next Parse of this text must reach a server, not the proxy's cache.
            self.ctx.note_closed(&stmt.server_name);
            self.record(Undo::Close {
                client: c.name.to_vec(),
                stmt,
            })
        });
        self.att
            .tracker
            .answered_by_proxy(Expect::Close, answer, id, self.to_client);
        Ok(())
    }

    /// Keeps `undo` until the server has answered, under a fresh id for the tracker.
    fn record(&mut self, undo: Undo) -> u64 {
        *self.next_id += 1;
        let id = *self.next_id;
        self.att.undo.push((id, undo));
        id
    }

    /// The analysis of a simple query: the routing's when it made one for this unit.
    fn query_analysis(&mut self, sql: &[u8]) -> Analysis {
        match self.known_query.take() {
            Some(a) => a,
            None => analyze(self.ctx, sql, self.state.unsafe_encoding),
        }
    }

    /// Notes a statement's effects: a possible write (for the read-your-writes token), a pin,
    /// and session settings (applied once the server confirms them).
    fn note(&mut self, a: &Analysis) {
        self.att.wrote |= !a.read_only;
        self.att.pinned |= a.pin;
        self.att.schema = self.att.schema.max(a.schema);
        self.att.effects.extend(a.effects.iter().cloned());
    }

    /// Notes the effects of a prepared statement when it is bound to run (not when parsed: a
    /// prepared `DISCARD ALL` changes nothing until it is executed).
    fn note_statement(&mut self, stmt: &Statement) {
        self.att.wrote |= !stmt.read_only;
        self.att.pinned |= stmt.pin;
        self.att.schema = self.att.schema.max(stmt.schema);
        self.att.effects.extend(stmt.effects.iter().cloned());
    }
}
