//! SQL-level `PREPARE` / `EXECUTE` / `DEALLOCATE` on a sharded cluster, kept by the proxy.
//!
//! A statement prepared on one server would run there only, while its rows may be on another
//! group or on every group; and a session pinned to that server loses every other group. So
//! the proxy keeps SQL-level prepared statements itself, per session, as it keeps
//! protocol-level ones: `PREPARE` is checked on a group-0 primary (PostgreSQL's own error if
//! it fails, its parameter types as it infers them) and kept as (name, text, types);
//! `EXECUTE name(args)` becomes the kept statement with its constant arguments written in as
//! values of those types (`CAST(arg AS type)`), which then goes where that statement goes (by
//! key, fan-out, the general path, a write on every group) through the same planning as any
//! query; `DEALLOCATE` and `DISCARD ALL` forget them. Each command is handled before its
//! unit is placed, when it arrives alone as a simple query.

use herd_sql::{Argument, SqlPrepared};
use herd_wire::frontend::{tag, Parse, Query};
use herd_wire::{encode, split_frame};

use super::state::SqlKept;
use super::Session;
use crate::ProxyError;

/// The name a PREPARE is checked under on a group-0 server (a token added: never a client's).
const CHECK_NAME: &str = "herd_sql_prepare_check";

/// What became of a client's unit at the door.
enum Door {
    /// Not one of these commands (or nothing to do): the unit goes on as it is.
    Pass,
    /// Answered by the proxy (CommandComplete and ReadyForQuery).
    Answered(&'static str),
    /// The unit is replaced by this statement, which goes on as any query.
    Replace(String),
}

impl Session {
    /// The door's turn before a unit is taken: `Ok(true)` when it answered one. Only a unit
    /// that may be one of these commands goes further, behind a box (the session's future
    /// keeps the relay loop's size).
    pub(super) async fn sql_prepared_turn(&mut self, max: usize) -> Result<bool, ProxyError> {
        if !self.sql_prepared_waiting(max) {
            return Ok(false);
        }
        Box::pin(self.sql_prepared_door(max)).await
    }

    /// Whether the unit at the head of the client's buffer may be one of these commands, to
    /// be handled now (a sharded cluster in transaction pooling, nothing else owed): looked at
    /// before every unit, so only the first word of a simple query is read.
    fn sql_prepared_waiting(&self, max: usize) -> bool {
        if !matches!(self.cbuf.first(), Some(&(tag::QUERY | tag::PARSE))) {
            return false;
        }
        if self.ctx.groups() <= 1
            || self.ctx.config.pool_mode == herd_core::PoolMode::Session
            || self.script.is_some()
            || self.skip_to_sync
        {
            return false;
        }
        if let Some(att) = &self.attached {
            // A session pinned to its server (a server-side PREPARE from before anything was
            // distributed, among others) keeps its statements there.
            if att.pinned || !att.tracker.is_idle() || att.batch_open || att.tracker.in_copy() {
                return false;
            }
        }
        match split_frame(&self.cbuf, max) {
            Ok(Some((frame, _))) if frame.tag == tag::QUERY => frame
                .body
                .split_last()
                .is_some_and(|(_, sql)| herd_sql::may_be_sql_prepared(sql)),
            // A Parse's body: its name, then its text (each ending with a NUL).
            Ok(Some((frame, _))) => frame
                .body
                .iter()
                .position(|b| *b == 0)
                .and_then(|end| frame.body.get(end + 1..))
                .is_some_and(herd_sql::may_be_sql_prepared),
            _ => false,
        }
    }

    /// An extended-protocol unit whose Parses run `EXECUTE` of statements the proxy keeps
    /// (a driver sending the client's SQL through Parse/Bind): each such Parse's text becomes
    /// the statement it runs, as for a simple query, and the unit goes on.
    async fn extended_execute(&mut self, max: usize) -> Result<bool, ProxyError> {
        let Some(len) = super::attach::unit_len(&self.cbuf, max)? else {
            return Ok(false);
        };
        if self.active_map().await?.is_none() {
            return Ok(false);
        }
        let mut out = Vec::with_capacity(len + 64);
        let mut changed = false;
        let mut rest = &self.cbuf[..len];
        while let Some((frame, used)) = split_frame(rest, max)? {
            rest = &rest[used..];
            if frame.tag == tag::PARSE {
                let p = Parse::decode(frame.body)?;
                let execute = herd_sql::may_be_sql_prepared(p.query)
                    .then(|| std::str::from_utf8(p.query).ok())
                    .flatten()
                    .and_then(herd_sql::sql_prepared);
                if let Some(SqlPrepared::Execute { name, args }) = execute {
                    if let Door::Replace(sql) = self.execute(&name, args) {
                        encode::parse(&mut out, p.name, &sql, &p.param_types)?;
                        changed = true;
                        continue;
                    }
                }
            }
            out.extend_from_slice(frame.raw);
        }
        if changed {
            let rest = self.cbuf.split_off(len);
            self.cbuf.clear();
            self.cbuf.extend_from_slice(&out);
            self.cbuf.unsplit(rest);
        }
        Ok(false)
    }

    /// Handles a lone simple-query `PREPARE`, `EXECUTE`, `DEALLOCATE` or `DISCARD ALL` at the
    /// head of the client's buffer (when [`Session::sql_prepared_waiting`]): answered here
    /// (`Ok(true)`), or rewritten in place for the placement that follows.
    async fn sql_prepared_door(&mut self, max: usize) -> Result<bool, ProxyError> {
        if self.cbuf.first() == Some(&tag::PARSE) {
            return self.extended_execute(max).await;
        }
        let Some((frame, n)) = split_frame(&self.cbuf, max)? else {
            return Ok(false);
        };
        let sql = Query::decode(frame.body)?.sql;
        let Some(command) = std::str::from_utf8(sql)
            .ok()
            .and_then(herd_sql::sql_prepared)
        else {
            return Ok(false);
        };
        match self.sql_prepared_command(command).await? {
            Door::Pass => Ok(false),
            Door::Replace(sql) => {
                let mut unit = Vec::with_capacity(sql.len() + 6);
                encode::query(&mut unit, &sql)?;
                let rest = self.cbuf.split_off(n);
                self.cbuf.clear();
                self.cbuf.extend_from_slice(&unit);
                self.cbuf.unsplit(rest);
                Ok(false)
            }
            Door::Answered(command_tag) => {
                let _ = self.cbuf.split_to(n);
                let status = match &self.attached {
                    Some(att) => att.status,
                    None if self.pending_begin.is_some() || !self.parked.is_empty() => b'T',
                    None => b'I',
                };
                encode::command_complete(&mut self.out.buf, command_tag)?;
                encode::ready_for_query(&mut self.out.buf, status)?;
                Ok(true)
            }
        }
    }

    /// What the proxy does with `command`.
    async fn sql_prepared_command(&mut self, command: SqlPrepared) -> Result<Door, ProxyError> {
        // In a failed transaction PostgreSQL refuses each of these (25P02) and keeps nothing:
        // whatever the unit becomes is refused the same way (by its server, or by the proxy
        // for a transaction no server has seen), so it must change nothing here.
        let failed =
            self.pending_failed || self.attached.as_ref().is_some_and(|a| a.status == b'E');
        Ok(match command {
            SqlPrepared::Prepare { name, types, query } => {
                if failed {
                    return Ok(Door::Replace("SELECT 1".into()));
                }
                if self.state.sql_prepared.contains_key(&name)
                    || self.state.statements.contains_key(name.as_bytes())
                {
                    return Ok(Door::Replace(raising(
                        "42P05",
                        &format!("prepared statement \"{name}\" already exists"),
                        None,
                    )));
                }
                match self.check_prepare(&types, &query).await {
                    Ok(types) => {
                        self.state
                            .sql_prepared
                            .insert(name, SqlKept { query, types });
                        Door::Answered("PREPARE")
                    }
                    Err(ProxyError::Server { code, message }) => {
                        Door::Replace(raising(&code, &message, None))
                    }
                    Err(e) => Door::Replace(raising(e.sqlstate(), &e.to_string(), None)),
                }
            }
            SqlPrepared::Execute { name, args } => self.execute(&name, args),
            SqlPrepared::Deallocate(Some(name)) => {
                if failed {
                    return Ok(Door::Replace("SELECT 1".into()));
                }
                if self.state.sql_prepared.remove(&name).is_some() {
                    Door::Answered("DEALLOCATE")
                } else if self.state.statements.contains_key(name.as_bytes()) {
                    Door::Pass
                } else {
                    unknown_statement(&name)
                }
            }
            SqlPrepared::Deallocate(None) => {
                if !failed {
                    self.state.sql_prepared.clear();
                }
                Door::Pass
            }
            // Refused inside a transaction block (25001), where it forgets nothing.
            SqlPrepared::DiscardAll => {
                if !self.in_transaction() {
                    self.state.sql_prepared.clear();
                }
                Door::Pass
            }
        })
    }

    /// What `EXECUTE name(args)` becomes: the kept statement with its arguments written in,
    /// or SQL that fails as PostgreSQL would.
    fn execute(&self, name: &str, args: Vec<Argument>) -> Door {
        let Some(kept) = self.state.sql_prepared.get(name) else {
            // A protocol-level statement's name: as before (the server answers).
            if self.state.statements.contains_key(name.as_bytes()) {
                return Door::Pass;
            }
            return unknown_statement(name);
        };
        if args.len() != kept.types.len() {
            return Door::Replace(raising(
                "42601",
                &format!("wrong number of parameters for prepared statement \"{name}\""),
                Some(&format!(
                    "Expected {} parameters but got {}.",
                    kept.types.len(),
                    args.len()
                )),
            ));
        }
        let mut texts = Vec::with_capacity(args.len());
        for (i, (arg, ty)) in args.into_iter().zip(&kept.types).enumerate() {
            match arg {
                Argument::Constant(kind, text) if herd_sql::assigned_as_cast(kind, ty) => {
                    texts.push(text);
                }
                Argument::Constant(..) => {
                    return Door::Replace(super::shard::raising_sql(&format!(
                        "EXECUTE's argument {} is converted to {ty} as an assignment, which Herd \
                         does not reproduce for a constant of that kind on a sharded cluster: \
                         write it as a quoted literal ('…')",
                        i + 1
                    )));
                }
                Argument::Expression => {
                    return Door::Replace(super::shard::raising_sql(
                        "EXECUTE of a statement Herd keeps for a sharded cluster takes constants \
                         as arguments (a quoted literal, a number, true/false or NULL), not \
                         expressions or conversions: compute the value first and pass it as a \
                         literal",
                    ));
                }
            }
        }
        match herd_sql::with_arguments(&kept.query, &texts, &kept.types) {
            Some(sql) => Door::Replace(sql),
            None => Door::Replace(super::shard::raising_sql(
                "this prepared statement's parameters could not be given their \
                 arguments: send the statement itself",
            )),
        }
    }

    /// PostgreSQL's check of `PREPARE name <types> AS <query>` on a group-0 primary, under the
    /// session's settings: the parameter types it gives the statement (as type names), or its
    /// error. Nothing stays prepared there.
    async fn check_prepare(&mut self, types: &str, query: &str) -> Result<Vec<String>, ProxyError> {
        // Not a routed transaction: not counted in `herd_routed_total`.
        let view = self.ctx.view_of(0);
        let primary = match &view.primary {
            Some(p) => p.clone(),
            None => self.ctx.current_primary_of(0).await?,
        };
        let mut lease = self.lease(&primary).await?;
        let name = format!("{CHECK_NAME}_{}", self.ctx.next_token());
        let sql = format!(
            "PREPARE {name} {types} AS {query};\n\
             SELECT u.t::text FROM pg_prepared_statements, \
             unnest(parameter_types) WITH ORDINALITY AS u(t, n) \
             WHERE name = '{name}' ORDER BY u.n;\n\
             DEALLOCATE {name}"
        );
        let rows = lease.conn.internal_query(&sql).await;
        // The check's string is one implicit transaction, ended either way: the connection is
        // idle again (should it have failed before the DEALLOCATE, the name is unique).
        lease.release();
        Ok(rows?
            .into_iter()
            .map(|mut r| r.pop().flatten().unwrap_or_default())
            .collect())
    }
}

/// PostgreSQL's error for a name no statement has.
fn unknown_statement(name: &str) -> Door {
    Door::Replace(raising(
        "26000",
        &format!("prepared statement \"{name}\" does not exist"),
        None,
    ))
}

/// SQL that fails on the server with SQLSTATE `code`, `message` (and `detail`), as the
/// statement it replaces would have failed on one PostgreSQL server (its transaction aborted).
fn raising(code: &str, message: &str, detail: Option<&str>) -> String {
    let quote = |s: &str| s.replace('\'', "''").replace("$herd$", "");
    let code = if code.len() == 5 && code.bytes().all(|b| b.is_ascii_alphanumeric()) {
        code
    } else {
        "XX000"
    };
    let detail = detail
        .map(|d| format!(", DETAIL = '{}'", quote(d)))
        .unwrap_or_default();
    format!(
        "DO $herd$ BEGIN RAISE EXCEPTION USING ERRCODE = '{code}', MESSAGE = '{}'{detail}; \
         END $herd$",
        quote(message)
    )
}

#[cfg(test)]
mod tests {
    use super::raising;

    #[test]
    fn raising_quotes_and_checks_the_code() {
        let sql = raising("42P05", "it's \"p\"", Some("d'x"));
        assert!(sql.contains("ERRCODE = '42P05'"), "{sql}");
        assert!(sql.contains("MESSAGE = 'it''s \"p\"'"), "{sql}");
        assert!(sql.contains("DETAIL = 'd''x'"), "{sql}");
        assert!(raising("bad", "m", None).contains("'XX000'"));
    }
}
