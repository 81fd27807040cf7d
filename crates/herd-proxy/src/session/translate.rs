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
use crate::server::{Lookup, PREPARED_CAPACITY};
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

    /// Why a Query or Bind cannot run on the attached server's shard group (a transaction
    /// stays on the group of its first statement), if it cannot; or the general path's
    /// statement that runs in its place.
    fn wrong_group(&mut self, frame: &Frame<'_>) -> Result<Option<Here>, ProxyError> {
        let Some(map) = self.map else {
            return Ok(None);
        };
        let mut sql_of_bind = None;
        let mut bind_types = Vec::new();
        // The names as last read (this check runs inside a transaction, without awaiting),
        // however old: the routing of the unit has just read them (if 3 s old, a name would
        // otherwise be taken as `public`'s, e.g. under `search_path = one`).
        let names = self.ctx.last_names(self.database);
        let resolver = names.as_deref().map(|names| super::shard::Resolver {
            names,
            path: self.state.search_path(),
            user: self.user,
        });
        let plan = match frame.tag {
            tag::QUERY => super::shard::plan_sql(
                self.ctx,
                map,
                resolver.as_ref(),
                Query::decode(frame.body)?.sql,
                &[],
            ),
            tag::BIND => {
                let b = Bind::decode(frame.body)?;
                let stmt = if b.statement.is_empty() {
                    self.state.unnamed.as_ref().map(|u| &*u.stmt)
                } else {
                    self.state.statements.get(b.statement).map(|s| &**s)
                };
                let types = stmt.map(|s| s.param_types.clone()).unwrap_or_default();
                bind_types = types.clone();
                let sql = stmt.map(|s| s.query.clone());
                let Some(sql) = sql.or_else(|| self.state.passed.get(b.statement).cloned()) else {
                    return Ok(None);
                };
                let plan = super::shard::plan_sql(
                    self.ctx,
                    map,
                    resolver.as_ref(),
                    &sql,
                    &super::shard::typed_params(b.rest, &types),
                );
                sql_of_bind = Some(sql);
                plan
            }
            _ => return Ok(None),
        };
        if self.spanning {
            let text = match frame.tag {
                tag::QUERY => Query::decode(frame.body)?.sql.to_vec(),
                _ => sql_of_bind.clone().unwrap_or_default(),
            };
            let classified = self
                .ctx
                .classifier
                .get_or_classify(&String::from_utf8_lossy(&text));
            if classified
                .statements
                .iter()
                .any(|s| s.tx != herd_sql::TxEffect::None)
            {
                return Ok(Some(Here::Refuse(
                    super::spanning::SPANNING_CONTROL.to_string(),
                )));
            }
        }
        // Only its first word is looked at: a Query's body as it is (the text and its NUL).
        let text: &[u8] = match frame.tag {
            tag::QUERY => frame.body,
            _ => sql_of_bind.as_deref().unwrap_or_default(),
        };
        // A block holding a cursor on group 0 stays there: a read across groups takes the
        // general path there instead of every group's part.
        let plan = match plan {
            herd_shard::Plan::AllGroups { table }
                if self.att.cursor.is_some() && self.att.group == 0 =>
            {
                herd_shard::Plan::General {
                    why: format!(
                        "{table} is distributed, and this transaction block holds a cursor on \
                         group 0's server"
                    ),
                }
            }
            p => p,
        };
        // A block holding a cursor stays on its server (`cursors.rs`).
        if let Some(verdict) = self.held_here(&plan, text, map) {
            return Ok(Some(verdict));
        }
        // A read the fast paths cannot answer: the general path, on group 0.
        if let Some(verdict) = self.general_here(
            &plan,
            frame,
            sql_of_bind.as_deref(),
            bind_types,
            map,
            resolver.as_ref(),
        )? {
            if let Here::General(sql, _) = &verdict {
                self.note_general(sql);
            }
            return Ok(Some(verdict));
        }
        let here = self.att.group;
        if matches!(plan, herd_shard::Plan::Anywhere)
            || matches!(plan, herd_shard::Plan::Group { group, .. } if group == here)
        {
            self.note_cursor(text);
        }
        Ok(match plan {
            herd_shard::Plan::Refuse(why) => Some(why),
            herd_shard::Plan::Everywhere(_)
            | herd_shard::Plan::EachGroup { .. }
            | herd_shard::Plan::CopyIn(_)
            | herd_shard::Plan::CopyOut(_) => Some(super::shard::ALONE.to_string()),
            herd_shard::Plan::AllGroups { .. } => Some(super::shard::FAN_OUT_ALONE.to_string()),
            herd_shard::Plan::WriteAllGroups(_)
            | herd_shard::Plan::InsertSplit(_)
            | herd_shard::Plan::InsertSelect(_)
            | herd_shard::Plan::WriteReference { .. } => {
                Some(super::shard::WRITE_ALL_ALONE.to_string())
            }
            herd_shard::Plan::Group { group, .. } if group != here => Some(format!(
                "this statement's rows are on shard group {group}, but it came in one batch with \
                 statements for group {here} (or the session is pinned to group {here}): inside a \
                 transaction, send statements for another group in a query or Sync of their own"
            )),
            _ => None,
        }
        .map(Here::Refuse))
    }

    /// Makes the server itself fail `frame` with 0A000 and `why`, so its transaction aborts
    /// as PostgreSQL's would: a Query becomes a DO block that raises; a Bind binds the client's
    /// portal to such a block (its Execute raises).
    fn refuse_here(
        &mut self,
        frame: &Frame<'_>,
        why: &str,
        to_server: &mut Vec<u8>,
    ) -> Result<(), ProxyError> {
        let sql = super::shard::raising_sql(why);
        if frame.tag == tag::QUERY {
            encode::query(to_server, &sql)?;
            self.att.tracker.sent(Expect::Query, false, None);
        } else {
            let b = Bind::decode(frame.body)?;
            encode::parse(to_server, "", &sql, &[])?;
            self.att.tracker.sent(Expect::Parse, true, None);
            // The server's unnamed statement is no longer the client's.
            self.att.lease.conn.unnamed = None;
            encode::bind_renamed(to_server, b.portal, "", &[0, 0, 0, 0, 0, 0])?;
            self.att.tracker.sent(Expect::Bind, false, None);
        }
        Ok(())
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

    /// Makes the server's unnamed statement the client's before a Bind or Describe uses it: the
    /// client parsed it in an earlier unit, maybe on another server, or another client's
    /// Parse replaced it here. Without one, the server's own is closed so the client gets
    /// PostgreSQL's 26000 rather than someone else's statement.
    fn ensure_unnamed(&mut self, to_server: &mut Vec<u8>) -> Result<(), ProxyError> {
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
    fn expire_kept(&mut self, to_server: &mut Vec<u8>) -> Result<(), ProxyError> {
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
    fn ensure_prepared(
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
    fn fresh_here(&mut self, stmt: &Statement) -> bool {
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
    fn send_parse(
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
    fn deallocate(
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

    fn evict_if_full(&mut self, to_server: &mut Vec<u8>) -> Result<(), ProxyError> {
        while self.att.lease.conn.prepared.len() >= PREPARED_CAPACITY {
            if let Some(old) = self.att.lease.conn.prepared.pop_oldest() {
                encode::close(to_server, KIND_STATEMENT, &old)?;
                self.att.tracker.sent(Expect::Close, true, None);
            }
        }
        Ok(())
    }

    /// Keeps `undo` until the server has answered, under a fresh id for the tracker.
    fn record(&mut self, undo: Undo) -> u64 {
        *self.next_id += 1;
        let id = *self.next_id;
        self.att.undo.push((id, undo));
        id
    }

    /// Notes a statement's effects: a possible write (for the read-your-writes token), a pin,
    /// and session settings (applied once the server confirms them).
    /// The analysis of a simple query: the routing's when it made one for this unit.
    fn query_analysis(&mut self, sql: &[u8]) -> Analysis {
        match self.known_query.take() {
            Some(a) => a,
            None => analyze(self.ctx, sql, self.state.unsafe_encoding),
        }
    }

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

/// The target of a lone `DEALLOCATE [PREPARE] name | ALL`: `Some(None)` for ALL.
fn deallocate_target(sql: &[u8]) -> Option<Option<Vec<u8>>> {
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
