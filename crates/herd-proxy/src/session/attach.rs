//! A new unit of work while no server is attached: answer it locally, or choose a node, lease a
//! server connection there, bring it to the session's settings, and forward the unit.

use std::time::Duration;

use bytes::Bytes;
use herd_wire::frontend::{tag, Bind, Parse, Query};
use herd_wire::{encode, split_frame};

use super::translate::{Flow, Translator};
use super::{Attached, Session};
use crate::analysis::{analyze, reason_label, LocalAnswer};

use crate::pool::Lease;
use crate::router::choose::{choose, PrimaryReason, Request, Target};
use crate::ProxyError;

/// What the unit needs, from a look at its messages.
pub(super) struct UnitFacts {
    pub(super) read_only: bool,
    pub(super) reason: &'static str,
    pub(super) local: Option<LocalAnswer>,
    /// The SQL of a unit that is one simple query.
    pub(super) sql: Option<String>,
    /// The analysis of a unit that is one simple query, handed to its translation (which
    /// would otherwise classify the same text a second time).
    pub(super) query: Option<crate::analysis::Analysis>,
}

impl Session {
    /// Handles a complete unit that arrived while detached. `Ok(false)`: the client terminated.
    pub(super) async fn start_unit(&mut self, unit: Bytes) -> Result<bool, ProxyError> {
        self.ctx.wait_unpaused().await;
        let only = lone_message(&unit);
        if only == Some(tag::TERMINATE) && self.parked.is_empty() {
            // The client leaves between transactions: no server is needed for that. Attaching
            // one only to forward the Terminate would close a pooled connection (the session
            // then ends attached to it), so every connect-per-transaction client cost the
            // server a new backend.
            return Ok(false);
        }
        if let Some(only) = only.filter(|t| matches!(*t, tag::SYNC | tag::FLUSH)) {
            // Nothing to run: a Flush needs no answer, a Sync gets ReadyForQuery.
            if only == tag::SYNC {
                let status = if self.pending_begin.is_some() || !self.parked.is_empty() {
                    b'T'
                } else {
                    b'I'
                };
                encode::ready_for_query(&mut self.out.buf, status)?;
            }
            return Ok(true);
        }
        if !self.parked.is_empty() {
            self.unit_while_parked(&unit).await?;
            return Ok(true);
        }
        self.place_unit(unit).await
    }

    /// Answers `unit` locally or attaches the server it goes to and forwards it.
    pub(super) async fn place_unit(&mut self, unit: Bytes) -> Result<bool, ProxyError> {
        let facts = self.inspect(&unit)?;
        self.place_inspected(unit, facts).await
    }

    /// [`Session::place_unit`] once `facts` were found (without its local answer when it had
    /// one the proxy cannot give).
    pub(super) async fn place_inspected(
        &mut self,
        unit: Bytes,
        mut facts: UnitFacts,
    ) -> Result<bool, ProxyError> {
        if self.pending_failed {
            return self.in_failed_transaction(&unit, facts.local.take()).await;
        }
        if let Some(answer) = facts.local.take() {
            if self.answer_locally(answer, facts.sql.as_deref())? {
                return Ok(true);
            }
        }
        if self.ctx.groups() > 1 {
            if let Some((function, args)) = herd_call_of(&unit) {
                self.answer_herd_call(&unit, &function, &args).await?;
                return Ok(true);
            }
            if self.answer_extended_herd_call(&unit).await? {
                return Ok(true);
            }
            // Statements on no distributed table run on group 0, where such tables live.
            match self.unit_route(&unit).await {
                Ok(super::shard::UnitRoute::Group(group)) => self.group = group.unwrap_or(0),
                // The general path: group 0's primary (its global relations are built there).
                Ok(super::shard::UnitRoute::General) => {
                    self.group = 0;
                    self.force_primary = true;
                }
                Ok(super::shard::UnitRoute::Everywhere(tag)) => {
                    self.run_everywhere(&unit, tag).await?;
                    return Ok(true);
                }
                Ok(super::shard::UnitRoute::CopyIn(copy)) => {
                    self.copy_in(&unit, copy).await?;
                    return Ok(true);
                }
                Ok(super::shard::UnitRoute::EachGroup(tag, undo)) => {
                    self.run_each_group(&unit, tag, &undo).await?;
                    return Ok(true);
                }
                Ok(super::shard::UnitRoute::Database(stmt)) => {
                    self.run_database_statement(&unit, stmt).await?;
                    return Ok(true);
                }
                Ok(super::shard::UnitRoute::Role(tag)) => {
                    self.run_role_statement(&unit, tag).await?;
                    return Ok(true);
                }
                Ok(super::shard::UnitRoute::CopyOut(copy)) => {
                    self.copy_out(&unit, copy).await?;
                    return Ok(true);
                }
                Ok(super::shard::UnitRoute::ExplainFanOut(prefix, plan)) => {
                    self.explain_fan_out(&unit, &prefix, plan).await?;
                    return Ok(true);
                }
                Ok(super::shard::UnitRoute::FanOut(plan)) if self.in_transaction() => {
                    self.fan_out_in_transaction(&unit, plan).await?;
                    return Ok(true);
                }
                Ok(super::shard::UnitRoute::FanOut(plan)) => {
                    self.fan_out(&unit, plan).await?;
                    return Ok(true);
                }
                Ok(super::shard::UnitRoute::WriteAll(write)) if self.in_transaction() => {
                    self.write_all_in_transaction(&unit, write).await?;
                    return Ok(true);
                }
                Ok(super::shard::UnitRoute::WriteAll(write)) => {
                    self.write_all(&unit, write).await?;
                    return Ok(true);
                }
                Ok(super::shard::UnitRoute::Script(steps)) => {
                    self.start_script(steps);
                    return Ok(true);
                }
                Err(e) => {
                    self.reply_error(&e, &unit).await?;
                    return Ok(true);
                }
            }
        }
        let view = self.ctx.view_of(self.group);
        let target = self.target(facts.read_only, &view);
        self.force_primary = false;
        let leased = match target {
            Target::Primary(PrimaryReason::Write) => self.lease_primary(&view, facts.reason).await,
            Target::Primary(why) => self.lease_primary(&view, why.as_str()).await,
            Target::Replica {
                candidates,
                confirm,
            } => {
                self.lease_replica(&view, &candidates, confirm, facts.reason)
                    .await
            }
        };
        let (lease, replica) = match leased {
            Ok(l) => l,
            Err(e) => {
                // The client hears why; the session goes on.
                self.reply_error(&e, &unit).await?;
                return Ok(true);
            }
        };
        self.attach(lease, replica, unit, facts.query)
    }

    /// Where a unit goes (`read_only`: its statements may run on a standby); a unit retried
    /// after a standby refused it, or sent before its batch ended, goes to the primary.
    pub(super) fn target(&self, read_only: bool, view: &crate::topology::TopologyView) -> Target {
        if self.force_primary {
            Target::Primary(PrimaryReason::Write)
        } else {
            choose(&self.request(read_only), view)
        }
    }

    /// What routing needs to know of a unit (`read_only`: its statements may run on a standby).
    pub(super) fn request(&self, read_only: bool) -> Request {
        let (read_only, consistency) = match &self.pending_begin {
            // Inside a transaction only its declaration counts: it may write later otherwise.
            Some(b) => (b.read_only, b.consistency.unwrap_or(self.state.consistency)),
            None => (read_only, self.state.consistency),
        };
        Request {
            read_only,
            consistency,
            token: self
                .state
                .token(self.group)
                .max(self.ctx.read_floor(self.group)),
            max_staleness: Duration::from_millis(self.ctx.config.max_staleness_ms),
            may_wait: self.ctx.config.max_wait_ms > 0,
        }
    }

    /// Read-only-ness and local answers of a unit, before anything is sent.
    pub(super) fn inspect(&self, unit: &[u8]) -> Result<UnitFacts, ProxyError> {
        let mut facts = UnitFacts {
            read_only: true,
            reason: "read",
            local: None,
            sql: None,
            query: None,
        };
        let mut rest = unit;
        let mut frames = 0;
        let unsafe_encoding = self.state.unsafe_encoding;
        while let Some((frame, used)) = split_frame(rest, usize::MAX)? {
            rest = &rest[used..];
            frames += 1;
            let analysis = match frame.tag {
                tag::QUERY => Some(analyze(
                    &self.ctx,
                    Query::decode(frame.body)?.sql,
                    unsafe_encoding,
                )),
                tag::PARSE => {
                    let p = Parse::decode(frame.body)?;
                    let recent =
                        self.state.recent_parse.as_ref().filter(|r| {
                            r.answers(p.query, unsafe_encoding, self.ctx.catalog_ptr())
                        });
                    match recent {
                        // The text of the last unnamed Parse again: its facts are known.
                        Some(r) => {
                            if !r.stmt.read_only && facts.read_only {
                                facts.read_only = false;
                                facts.reason = r.reason;
                            }
                            None
                        }
                        None => Some(analyze(&self.ctx, p.query, unsafe_encoding)),
                    }
                }
                tag::BIND => {
                    let b = Bind::decode(frame.body)?;
                    let known = if b.statement.is_empty() {
                        // Parsed in an earlier unit: prepared again wherever this one goes.
                        self.state.unnamed.as_ref().map(|u| u.stmt.read_only)
                    } else {
                        self.state.statements.get(b.statement).map(|s| s.read_only)
                    };
                    if known != Some(true)
                        && !unit_parses_unnamed(unit, b.statement)
                        && facts.read_only
                    {
                        facts.read_only = false;
                        facts.reason = if known == Some(false) {
                            "write"
                        } else {
                            "unknown_statement"
                        };
                    }
                    None
                }
                tag::FUNCTION_CALL => {
                    facts.read_only = false;
                    facts.reason = "function_call";
                    None
                }
                tag::FLUSH if rest.is_empty() => {
                    // Not closed by Sync: the batch may go on with a write on the same server
                    // (its unnamed statement and portals live there). Only the primary takes that.
                    if facts.read_only {
                        facts.read_only = false;
                        facts.reason = "unsynced_batch";
                    }
                    None
                }
                _ => None,
            };
            if let Some(a) = analysis {
                if !a.read_only && facts.read_only {
                    facts.read_only = false;
                    facts.reason = reason_label(&a.reason);
                }
                let lone_query = frame.tag == tag::QUERY && frames == 1 && rest.is_empty();
                if lone_query && a.local.is_some() {
                    // Kept only for statements the proxy may answer itself (a deferred BEGIN
                    // replays it): no copy of every query's text.
                    facts.local = a.local;
                    facts.sql = Query::decode(frame.body)
                        .ok()
                        .and_then(|q| String::from_utf8(q.sql.to_vec()).ok());
                }
                if lone_query {
                    facts.query = Some(a);
                }
            }
        }
        Ok(facts)
    }

    /// Answers a statement without a server when it can; `Ok(false)` when it must go to one
    /// (then nothing was changed).
    pub(super) fn answer_locally(
        &mut self,
        answer: LocalAnswer,
        sql: Option<&str>,
    ) -> Result<bool, ProxyError> {
        let mut out = Vec::new();
        let status = match (answer, self.pending_begin.as_mut()) {
            (LocalAnswer::Consistency(level), _) => {
                self.state.consistency = level;
                encode::command_complete(&mut out, "SET")?;
                if self.pending_begin.is_some() {
                    b'T'
                } else {
                    b'I'
                }
            }
            (LocalAnswer::ConsistencyLocal(level), Some(begin)) => {
                begin.consistency = Some(level);
                encode::command_complete(&mut out, "SET")?;
                b'T'
            }
            (LocalAnswer::Begin { read_only }, None) => {
                let Some(sql) = sql else { return Ok(false) };
                self.pending_begin = Some(super::PendingBegin {
                    sql: sql.to_string(),
                    read_only,
                    consistency: None,
                });
                encode::command_complete(&mut out, "BEGIN")?;
                b'T'
            }
            (LocalAnswer::Commit, Some(_)) => {
                self.pending_begin = None;
                encode::command_complete(&mut out, "COMMIT")?;
                b'I'
            }
            (LocalAnswer::Rollback, Some(_)) => {
                self.pending_begin = None;
                encode::command_complete(&mut out, "ROLLBACK")?;
                b'I'
            }
            // Outside a deferred transaction these are the server's to answer (with its warnings).
            _ => return Ok(false),
        };
        encode::ready_for_query(&mut out, status)?;
        self.ctx.metrics.inc("herd_local_answers_total", "");
        self.out.buf.extend_from_slice(&out);
        Ok(true)
    }

    /// Attaches `lease` and forwards `unit` through it (`known`: the analysis of its lone
    /// simple query, made when it was routed).
    pub(super) fn attach(
        &mut self,
        lease: Lease,
        replica: Option<usize>,
        unit: Bytes,
        known: Option<crate::analysis::Analysis>,
    ) -> Result<bool, ProxyError> {
        self.install(lease, replica, replica.map(|_| unit.to_vec()));
        if let (Some(begin), Some(att)) = (self.pending_begin.take(), self.attached.as_mut()) {
            // The deferred BEGIN goes first; its answers were already given by the proxy.
            encode::query(&mut self.sout.buf, &begin.sql)?;
            att.lease.conn.unnamed = None;
            att.tracker
                .sent(crate::router::track::Expect::Query, true, None);
            att.begin = Some(begin);
        }
        if let (Some(given), Some(att)) = (self.rerun.take(), self.attached.as_mut()) {
            att.tracker.given(given);
        }
        let go_on = self.forward_analyzed(&unit, known)?;
        if let Some(att) = self.attached.as_mut() {
            if !att.bound.is_empty() && !att.batch_open {
                // A shared handle, not a copy: only kept for units that use kept statements.
                att.retry_unit = Some(unit);
            }
        }
        Ok(go_on)
    }

    /// Makes `lease` the session's server; `unit` is kept for a retry elsewhere.
    fn install(&mut self, lease: Lease, replica: Option<usize>, unit: Option<Vec<u8>>) {
        self.cancel.attach(
            &lease.conn.endpoint.host,
            lease.conn.endpoint.port,
            lease.conn.backend_key,
        );
        let mut att = self.new_part(lease, replica, self.group);
        att.unit = unit;
        self.attached = Some(att);
    }

    /// `lease` (of group `group`) as a server the session holds, idle outside a transaction.
    pub(super) fn new_part(
        &self,
        mut lease: Lease,
        replica: Option<usize>,
        group: u32,
    ) -> Attached {
        let spare = std::mem::take(&mut lease.conn.spare);
        Attached {
            group,
            tracker: spare.tracker,
            bound: spare.bound,
            schema: crate::analysis::SchemaChange::None,
            retry_unit: None,
            lease,
            replica,
            wrote: false,
            status: b'I',
            pinned: self.ctx.config.pool_mode == herd_core::PoolMode::Session,
            forwarded: 0,
            unit: None,
            rolled_back: false,
            undo: Vec::new(),
            fatal: false,
            begin: None,
            effects: Vec::new(),
            error_seen: false,
            // Idle after login and replayed settings: a session that leaves before sending
            // anything gives its server back.
            ready_idle: true,
            batch_open: false,
            cursor: None,
        }
    }

    /// Session pooling: the client's server for its whole session, chosen at login. A session
    /// that may write lives on the primary; one that declared itself read-only
    /// (`default_transaction_read_only=on` in its startup parameters) is served by a replica
    /// its consistency level allows. Returns the server's parameters (after the client's
    /// startup settings) and its real cancel key, which the client is given.
    pub(super) async fn attach_session(
        &mut self,
        read_only: bool,
    ) -> Result<(Vec<(String, String)>, (i32, i32)), ProxyError> {
        let view = self.ctx.view_of(self.group);
        // At login no transaction is open: the session's own level decides.
        let (lease, replica) = match choose(&self.request(read_only), &view) {
            Target::Primary(PrimaryReason::Write) => self.lease_primary(&view, "session").await?,
            Target::Primary(why) => self.lease_primary(&view, why.as_str()).await?,
            Target::Replica {
                candidates,
                confirm,
            } => {
                self.lease_replica(&view, &candidates, confirm, "session_read_only")
                    .await?
            }
        };
        let mut params = lease.conn.params.clone();
        crate::overlay_params(&mut params, &lease.conn.reported);
        let (key, cancel) = self.ctx.cancels.register_as(lease.conn.backend_key);
        self.cancel = cancel;
        self.install(lease, replica, None);
        Ok((params, key))
    }

    /// Translates client messages into the attached server's outbox. `Ok(false)`: Terminate.
    pub(super) fn forward(&mut self, bytes: &[u8]) -> Result<bool, ProxyError> {
        self.forward_analyzed(bytes, None)
    }

    /// [`Session::forward`], given the analysis of a lone simple query when routing made it
    /// (so the text is not classified a second time).
    fn forward_analyzed(
        &mut self,
        bytes: &[u8],
        known_query: Option<crate::analysis::Analysis>,
    ) -> Result<bool, ProxyError> {
        let Some(att) = self.attached.as_mut() else {
            return Err(ProxyError::Protocol("no server attached".into()));
        };
        // A lone Flush is answered with nothing: a server idle before it stays so (a COMMIT
        // that follows one, as psycopg sends Sync then Flush, must not wait for an answer).
        if lone_message(bytes) != Some(tag::FLUSH) {
            att.ready_idle = false;
        }
        let mut t = Translator {
            ctx: &self.ctx,
            state: &mut self.state,
            att,
            next_id: &mut self.next_id,
            to_client: &mut self.out.buf,
            at_pause: false,
            passthrough: self.ctx.config.pool_mode == herd_core::PoolMode::Session,
            map: self.map.as_deref(),
            database: &self.database,
            user: &self.user,
            spanning: !self.parked.is_empty(),
            known_query,
        };
        let to_server = &mut self.sout.buf;
        let mut rest = bytes;
        let mut go_on = true;
        // A batch is open after messages not closed by a Sync; a Flush changes nothing (a
        // lone Flush after a Sync opens none: the next unit is planned as usual).
        let mut open = t.att.batch_open;
        while let Some((frame, used)) = split_frame(rest, usize::MAX)? {
            rest = &rest[used..];
            open = match frame.tag {
                tag::SYNC | tag::QUERY | tag::FUNCTION_CALL => false,
                tag::FLUSH => open,
                // A COPY's rows continue the statement that started it. Its end closes a
                // simple query's COPY (ReadyForQuery follows), while an extended-protocol
                // COPY's server answers nothing until the client's next Sync, which must go
                // on to it. (Counting every copy message as opening a batch made the next
                // unit of a transaction skip `transaction_boundary`: a COMMIT after a psql
                // COPY in a transaction spanning groups was refused on one part, and the
                // session left failed.)
                tag::COPY_DATA => open,
                tag::COPY_DONE | tag::COPY_FAIL => t.att.tracker.copy_owes_sync(),
                _ => true,
            };
            // The last message the client has sent so far, with its batch still open.
            t.at_pause = rest.is_empty() && frame.tag == tag::PARSE;
            if t.translate(&frame, to_server)? == Flow::Terminate {
                go_on = false;
                break;
            }
        }
        if let Some(att) = self.attached.as_mut() {
            att.batch_open = open;
        }
        Ok(go_on)
    }

    /// Reports `e` for a unit that could not be placed (or was refused): ErrorResponse, then ReadyForQuery when
    /// the unit expected one (it ended with Sync or was a simple query).
    /// A unit inside a transaction that failed before any server saw it: its end is
    /// answered (COMMIT as ROLLBACK, as PostgreSQL answers it), anything else fails with
    /// 25P02.
    async fn in_failed_transaction(
        &mut self,
        unit: &[u8],
        local: Option<LocalAnswer>,
    ) -> Result<bool, ProxyError> {
        if let Some(LocalAnswer::Commit | LocalAnswer::Rollback) = local {
            self.pending_begin = None;
            self.pending_failed = false;
            let mut out = Vec::new();
            encode::command_complete(&mut out, "ROLLBACK")?;
            encode::ready_for_query(&mut out, b'I')?;
            self.out.buf.extend_from_slice(&out);
            return Ok(true);
        }
        let e = ProxyError::Server {
            code: "25P02".into(),
            message: "current transaction is aborted, commands ignored until end of \
                      transaction block"
                .into(),
        };
        self.reply_error(&e, unit).await?;
        Ok(true)
    }

    pub(super) async fn reply_error(
        &mut self,
        e: &ProxyError,
        unit: &[u8],
    ) -> Result<(), ProxyError> {
        // A refusal inside a transaction no server has seen yet fails it, as any error fails
        // a PostgreSQL transaction (its later statements must not commit).
        if self.pending_begin.is_some() && self.parked.is_empty() {
            self.pending_failed = true;
        }
        self.ctx.metrics.inc(
            "herd_unit_errors_total",
            &format!("sqlstate=\"{}\"", e.sqlstate()),
        );
        let mut out = Vec::new();
        encode::error_response(&mut out, "ERROR", e.sqlstate(), &e.to_string())?;
        let ends_with_ready = unit_ends_with(unit, tag::SYNC) || unit_ends_with(unit, tag::QUERY);
        if ends_with_ready {
            // Inside a transaction the proxy began for the client, the error fails it.
            let status = if self.in_transaction() { b'E' } else { b'I' };
            encode::ready_for_query(&mut out, status)?;
        } else if self.attached.is_none() && lone_message(unit) != Some(tag::FLUSH) {
            // Closed by Flush: the client goes on sending before its Sync, and PostgreSQL
            // would discard all of it after an error (a server attached does so itself).
            self.skip_to_sync = true;
        }
        self.out.buf.extend_from_slice(&out);
        Ok(())
    }
}

/// `SELECT herd.<function>(…)` when `unit` is exactly that simple query.
fn herd_call_of(unit: &[u8]) -> Option<(String, Vec<String>)> {
    let (frame, used) = split_frame(unit, usize::MAX).ok()??;
    if used != unit.len() || frame.tag != tag::QUERY {
        return None;
    }
    let sql = std::str::from_utf8(Query::decode(frame.body).ok()?.sql).ok()?;
    // Most statements are not calls of Herd's functions: no second parse for them.
    if !sql.to_ascii_lowercase().contains("herd.") {
        return None;
    }
    herd_sql::herd_call(sql)
}

/// `Some(tag)` when `unit` is a single message.
pub(super) fn lone_message(unit: &[u8]) -> Option<u8> {
    match split_frame(unit, usize::MAX) {
        Ok(Some((frame, used))) if used == unit.len() => Some(frame.tag),
        _ => None,
    }
}

/// The tag of the last message of `unit` is `tag`.
fn unit_ends_with(unit: &[u8], wanted: u8) -> bool {
    let mut rest = unit;
    let mut last = None;
    while let Ok(Some((frame, used))) = split_frame(rest, usize::MAX) {
        last = Some(frame.tag);
        rest = &rest[used..];
    }
    last == Some(wanted)
}

/// The unit itself parses the unnamed statement that a Bind of `name` uses.
fn unit_parses_unnamed(unit: &[u8], name: &[u8]) -> bool {
    if !name.is_empty() {
        return false;
    }
    let mut rest = unit;
    while let Ok(Some((frame, used))) = split_frame(rest, usize::MAX) {
        if frame.tag == tag::PARSE
            && Parse::decode(frame.body)
                .map(|p| p.name.is_empty())
                .unwrap_or(false)
        {
            return true;
        }
        rest = &rest[used..];
    }
    false
}

/// Length of the first complete unit in `buf`: up to and including a Query, Sync, Flush,
/// FunctionCall or Terminate. `Ok(None)` while incomplete.
pub fn unit_len(buf: &[u8], max_message: usize) -> Result<Option<usize>, ProxyError> {
    let mut offset = 0;
    while let Some((frame, used)) = split_frame(&buf[offset..], max_message)? {
        offset += used;
        if matches!(
            frame.tag,
            tag::QUERY | tag::SYNC | tag::FLUSH | tag::FUNCTION_CALL | tag::TERMINATE
        ) {
            return Ok(Some(offset));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_end_at_sync_query_or_flush() {
        let mut b = Vec::new();
        encode::parse(&mut b, "", "select 1", &[]).expect("parse");
        encode::bind_renamed(&mut b, "", "", &[0, 0, 0, 0, 0, 0]).expect("bind");
        assert_eq!(unit_len(&b, 1 << 20).expect("ok"), None);
        let before_sync = b.len();
        encode::sync(&mut b);
        assert_eq!(unit_len(&b, 1 << 20).expect("ok"), Some(before_sync + 5));
        let mut q = Vec::new();
        encode::query(&mut q, "select 1").expect("query");
        let qlen = q.len();
        encode::query(&mut q, "select 2").expect("query");
        assert_eq!(unit_len(&q, 1 << 20).expect("ok"), Some(qlen));
        assert!(unit_ends_with(&q[..qlen], tag::QUERY));
        assert!(
            unit_len(&[b'Q', 0, 0, 0, 1], 1 << 20).is_err(),
            "length below 4"
        );
    }
}
