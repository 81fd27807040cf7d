//! DDL and role statements on every shard group's primary, as the client's own role: in one
//! two-phase commit, or (what cannot run in a transaction) group after group with an undo.

use herd_wire::encode;

use super::shard::lone_query;
use super::Session;
use crate::ProxyError;

impl Session {
    /// Runs the one DDL statement of `unit` on every group's primary as the client's own role,
    /// all or none: each group PREPAREs it, then group 0 commits first (its part holds the
    /// decision row: a change left in doubt is committed where that row exists, else rolled back),
    /// then the others; a failure before that rolls back the others first, group 0 last.
    pub(super) async fn run_everywhere(
        &mut self,
        unit: &[u8],
        tag_text: &str,
    ) -> Result<(), ProxyError> {
        let Some(sql) = lone_query(unit)? else {
            return Ok(());
        };
        // A function's body is checked on group 0, which holds every table (tables never
        // distributed live there only); on the others it is taken as it is, as a dump
        // restores it, so a body naming a group-0 table does not fail the whole creation.
        let unchecked = matches!(tag_text, "CREATE FUNCTION" | "CREATE PROCEDURE");
        let mut outcome = self.ddl_two_phase_with(&sql, unchecked).await;
        if outcome.is_ok() && tag_text == "DROP TABLE" {
            // The dropped tables leave the shard map (if this fails, the next load of the map
            // removes them).
            self.map = None;
            outcome = self.ctx.forget_dropped(&self.database).await.map(|_| ());
        }
        self.ddl_done(unit, tag_text, outcome).await
    }

    /// Runs the role statement of `unit` on group 0's primary as the client's role, then
    /// copies the roles to every other group (see [`crate::ProxyContext::sync_roles`]).
    pub(super) async fn run_role_statement(
        &mut self,
        unit: &[u8],
        tag_text: &str,
    ) -> Result<(), ProxyError> {
        let Some(sql) = lone_query(unit)? else {
            return Ok(());
        };
        let outcome = async {
            let primary = self.ctx.current_primary_of(0).await?;
            let mut lease = self.lease(&primary).await?;
            let ran = lease.conn.internal_query(&sql).await;
            lease.release();
            ran?;
            let dropped = herd_sql::dropped_roles(&sql);
            self.ctx
                .sync_roles(&self.database, &dropped)
                .await
                .map(|_| ())
        }
        .await;
        self.ddl_done(unit, tag_text, outcome).await
    }

    /// Answers DDL run on every group: its tag, or its failure.
    pub(super) async fn ddl_done(
        &mut self,
        unit: &[u8],
        tag_text: &str,
        outcome: Result<(), ProxyError>,
    ) -> Result<(), ProxyError> {
        // Even a failure may have changed some groups before it was undone: kept statements
        // are prepared again either way.
        self.ctx.schema_changed();
        match outcome {
            Ok(()) => {
                encode::command_complete(&mut self.out.buf, tag_text)?;
                encode::ready_for_query(&mut self.out.buf, b'I')?;
                self.ctx.metrics.inc("herd_shard_ddl_total", "");
                Ok(())
            }
            Err(e) => self.reply_error(&e, unit).await,
        }
    }

    /// Runs the one statement of `unit` (DDL that cannot run inside a transaction) on every
    /// group's primary in turn as the client's role; if a group fails, `undo` runs on every
    /// group it reached (the failed one too: a failed concurrent build leaves an invalid
    /// index behind) and the client gets the failure.
    pub(super) async fn run_each_group(
        &mut self,
        unit: &[u8],
        tag_text: &str,
        undo: &str,
    ) -> Result<(), ProxyError> {
        let Some(sql) = lone_query(unit)? else {
            return Ok(());
        };
        let outcome = self.each_group(&sql, undo).await;
        self.ddl_done(unit, tag_text, outcome).await
    }

    async fn each_group(&mut self, sql: &str, undo: &str) -> Result<(), ProxyError> {
        let mut leases = self.primary_leases().await?;
        let mut failure = None;
        let mut reached = 0;
        for lease in leases.iter_mut() {
            reached += 1;
            if let Err(e) = lease.conn.internal_query(sql).await {
                failure = Some(e);
                break;
            }
        }
        if let Some(e) = failure {
            // An empty undo: the statement is safe to run again (DROP … CONCURRENTLY).
            let undo_on = if undo.is_empty() { 0 } else { reached };
            for (g, lease) in leases[..undo_on].iter_mut().enumerate() {
                if let Err(u) = lease.conn.internal_query(undo).await {
                    tracing::warn!(group = g, error = %u, "undoing DDL on a shard group failed");
                }
            }
            for lease in leases {
                lease.release();
            }
            return Err(e);
        }
        for lease in leases {
            lease.release();
        }
        Ok(())
    }

    pub(super) async fn ddl_two_phase(&mut self, sql: &str) -> Result<(), ProxyError> {
        self.ddl_two_phase_with(sql, false).await
    }

    /// [`Session::ddl_two_phase`]; `unchecked_elsewhere`: groups other than 0 run it with
    /// `check_function_bodies` off.
    async fn ddl_two_phase_with(
        &mut self,
        sql: &str,
        unchecked_elsewhere: bool,
    ) -> Result<(), ProxyError> {
        let gid = super::two_phase::ddl_gid("");
        let mut leases = self.primary_leases().await?;
        let body = sql.trim().trim_end_matches(';');
        let before = |i: usize| {
            if unchecked_elsewhere && i > 0 {
                format!("BEGIN; SET LOCAL check_function_bodies = off; {body};")
            } else {
                format!("BEGIN; {body};")
            }
        };
        let outcome = match super::two_phase::prepare_each(&mut leases, &gid, &before).await {
            Ok(()) => {
                super::two_phase::commit_all(&self.ctx.commits, &mut leases, &gid, "the change")
                    .await
            }
            Err(e) => Err(e),
        };
        for lease in leases {
            lease.release();
        }
        outcome
    }
}
