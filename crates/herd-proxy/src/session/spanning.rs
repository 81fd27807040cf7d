//! Transactions that span shard groups (transaction pooling).
//!
//! A transaction begins on the group of its first statement. When a later statement's rows
//! are on another group, the server the transaction holds is *parked* (still in its
//! transaction) and the statement runs on a server of the other group, in a transaction begun
//! there with the client's own BEGIN; a statement for a group already in the transaction goes
//! back to that group's parked server. Every group the transaction touched keeps its part open
//! until the client's `COMMIT` or `ROLLBACK`:
//! - ROLLBACK (or COMMIT of a failed transaction) rolls back every part;
//! - COMMIT with at most one part that may have written commits the others, then that one —
//!   no two-phase commit is needed for reads;
//! - COMMIT with several writing parts is a two-phase commit (`two_phase.rs`): every writing
//!   part is PREPAREd, group 0's part (begun for the purpose if the transaction had none)
//!   carries the decision row, group 0 commits first and the others follow; a crash between
//!   the phases is resolved by the in-doubt resolver from the decision row.
//!
//! Each part reads its own group's writes, so the transaction reads its own writes on every
//! group (a read across groups or a write on every group runs on every group's part,
//! `in_transaction.rs`). Each group takes its own snapshot (there is no snapshot across groups); a deadlock
//! between two groups is not one PostgreSQL sees (`lock_timeout` ends it). Savepoints,
//! `PREPARE TRANSACTION`, `AND CHAIN` and a COMMIT sent in one extended-protocol batch with
//! other statements are refused inside a transaction that spans groups (they would act on one
//! part only); a simple-query string with its COMMIT runs statement by statement (`script.rs`).

use bytes::Bytes;
use herd_wire::frontend::{tag, Bind, Query};
use herd_wire::split_frame;

use super::{Attached, PendingBegin, Session};
use crate::analysis::{analyze, LocalAnswer};
use crate::pool::Lease;
use crate::ProxyError;

/// What the session does with the unit at the head of its buffer, inside a transaction.
pub(super) enum Boundary {
    /// Forward it to the attached server as usual.
    Forward,
    /// It needs the attached server idle first (it ends or moves the transaction).
    Wait,
    /// Handled here.
    Done,
}

/// How long the commit of a spanning transaction may take (a frozen primary must not hang the
/// client forever; it is replaced well within this).
const COMMIT_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Why a statement that ends part of a spanning transaction is refused.
pub(super) const SPANNING_CONTROL: &str = "this transaction spans shard groups: end it with \
     COMMIT or ROLLBACK sent alone (savepoints, PREPARE TRANSACTION, AND CHAIN and COMMIT \
     inside an extended-protocol batch of other statements would act on one group's part \
     only; a simple-query string with its COMMIT runs statement by statement)";

impl Session {
    /// Looks at the complete unit at the head of the client buffer while the attached server
    /// is inside a transaction on a sharded cluster: a lone COMMIT or ROLLBACK of a transaction
    /// with parked parts ends them all; a statement whose rows are on another group moves the
    /// transaction there.
    pub(super) async fn transaction_boundary(&mut self, n: usize) -> Result<Boundary, ProxyError> {
        let Some(att) = self.attached.as_ref() else {
            return Ok(Boundary::Forward);
        };
        let idle = att.tracker.is_idle() && self.sout.is_empty() && att.ready_idle;
        let (group, status, pinned) = (att.group, att.status, att.pinned);
        // A block holding a cursor stays on its server (`cursors.rs`): a statement for
        // another group is refused there by the translator.
        let pinned = pinned || att.cursor.is_some();
        let unit = self.cbuf[..n].to_vec();
        if !self.parked.is_empty() {
            if let Some(commit) = self.ends_transaction(&unit) {
                if !idle {
                    return Ok(Boundary::Wait);
                }
                let unit = self.cbuf.split_to(n).freeze();
                self.end_spanning(&unit, commit).await?;
                return Ok(Boundary::Done);
            }
        }
        if status != b'T' || pinned {
            // A failed transaction answers 25P02 where it is; a pinned server is the session's.
            return Ok(Boundary::Forward);
        }
        use super::shard::UnitRoute;
        let route = match self.unit_route(&unit).await {
            Ok(UnitRoute::Group(Some(g))) if g != group => UnitRoute::Group(Some(g)),
            Ok(r @ (UnitRoute::FanOut(_) | UnitRoute::WriteAll(_) | UnitRoute::Script(_))) => r,
            // Refusals are made in-band by the translator, failing the transaction.
            _ => return Ok(Boundary::Forward),
        };
        if !idle {
            return Ok(Boundary::Wait);
        }
        let unit = self.cbuf.split_to(n).freeze();
        match route {
            UnitRoute::FanOut(plan) => self.fan_out_in_transaction(&unit, plan).await?,
            UnitRoute::WriteAll(write) => self.write_all_in_transaction(&unit, write).await?,
            UnitRoute::Group(Some(target)) => self.move_transaction(unit, target).await?,
            // A string of statements on several groups: one after the other, in this
            // transaction.
            UnitRoute::Script(steps) => self.start_script(steps),
            _ => {}
        }
        Ok(Boundary::Done)
    }

    /// `Some(true)` when `unit` is a lone COMMIT (or END), `Some(false)` a lone ROLLBACK
    /// (or ABORT): one simple query, or one extended-protocol execution of such a statement.
    pub(super) fn ends_transaction(&self, unit: &[u8]) -> Option<bool> {
        let mut rest = unit;
        let mut sql: Option<Vec<u8>> = None;
        let mut parsed = std::collections::HashMap::new();
        let mut statements = 0;
        while let Ok(Some((frame, used))) = split_frame(rest, usize::MAX) {
            rest = &rest[used..];
            match frame.tag {
                tag::QUERY => {
                    sql = Some(Query::decode(frame.body).ok()?.sql.to_vec());
                    statements += 1;
                }
                tag::PARSE => {
                    let p = herd_wire::frontend::Parse::decode(frame.body).ok()?;
                    parsed.insert(p.name.to_vec(), p.query.to_vec());
                }
                tag::BIND => {
                    let b = Bind::decode(frame.body).ok()?;
                    sql = self.bound_sql(&parsed, b.statement);
                    statements += 1;
                }
                _ => {}
            }
        }
        if statements != 1 {
            return None;
        }
        let sql = sql?;
        // AND CHAIN would begin a new transaction on one group only.
        if String::from_utf8_lossy(&sql)
            .to_ascii_lowercase()
            .contains("chain")
        {
            return None;
        }
        match analyze(&self.ctx, &sql, self.state.unsafe_encoding).local {
            Some(LocalAnswer::Commit) => Some(true),
            Some(LocalAnswer::Rollback) => Some(false),
            _ => None,
        }
    }

    /// Parks the attached server (idle in its transaction) and runs `unit` on group `target`:
    /// on the server the transaction already holds there, else on a new one, in a transaction
    /// begun as the client began this one.
    async fn move_transaction(&mut self, unit: Bytes, target: u32) -> Result<(), ProxyError> {
        let Some(current) = self.attached.take() else {
            return Ok(());
        };
        self.cancel.detach();
        let begin = current.begin.clone().unwrap_or(PendingBegin {
            sql: "BEGIN".into(),
            read_only: current.replica.is_some(),
            consistency: None,
        });
        self.parked.push(current);
        self.ctx.metrics.inc("herd_shard_group_moves_total", "");
        self.group = target;
        if let Some(pos) = self.parked.iter().position(|p| p.group == target) {
            let att = self.parked.swap_remove(pos);
            let conn = &att.lease.conn;
            self.cancel
                .attach(&conn.endpoint.host, conn.endpoint.port, conn.backend_key);
            self.attached = Some(att);
            self.forward(&unit)?;
            return Ok(());
        }
        self.pending_begin = Some(begin);
        self.place_unit(unit).await?;
        Ok(())
    }

    /// Answers a unit that arrives while no server is attached but parts of the transaction
    /// are parked (moving to another group failed, and the client was told): COMMIT or
    /// ROLLBACK end every part, anything else is refused as in any failed transaction.
    pub(super) async fn unit_while_parked(&mut self, unit: &[u8]) -> Result<(), ProxyError> {
        match self.ends_transaction(unit) {
            // The move's failure failed the transaction: COMMIT rolls back, as PostgreSQL's.
            Some(_) => self.end_spanning(unit, false).await,
            None => {
                let e = ProxyError::Server {
                    code: "25P02".into(),
                    message: "current transaction is aborted, commands ignored until end of \
                              transaction block"
                        .into(),
                };
                self.reply_error(&e, unit).await
            }
        }
    }

    /// Ends every part of a spanning transaction: commits them (two-phase when several may
    /// have written) or rolls them back, and answers the client's COMMIT or ROLLBACK.
    async fn end_spanning(&mut self, unit: &[u8], commit: bool) -> Result<(), ProxyError> {
        let mut parts: Vec<Attached> = std::mem::take(&mut self.parked);
        let failed_move = self.attached.is_none();
        parts.extend(self.attached.take());
        self.cancel.detach();
        self.pending_begin = None;
        parts.sort_by_key(|p| p.group);
        let failed = failed_move || parts.iter().any(|p| p.status != b'T');
        let batch = match self.fan_out_batch(unit) {
            Ok(b) => b,
            Err(e) => {
                rollback_all(&mut parts).await;
                self.release_parts(parts);
                return self.reply_error(&e, unit).await;
            }
        };
        let outcome = if commit && !failed {
            match tokio::time::timeout(COMMIT_WAIT, self.commit_parts(&mut parts)).await {
                Ok(done) => done,
                Err(_) => {
                    // Where each part stands is not known: none goes back to a pool.
                    for p in &mut parts {
                        p.fatal = true;
                    }
                    Err(ProxyError::Unavailable(format!(
                        "the commit of a transaction spanning shard groups did not finish within \
                         {COMMIT_WAIT:?}; its outcome is unknown (a part left prepared is \
                         committed or rolled back by the in-doubt resolver)"
                    )))
                }
            }
        } else {
            rollback_all(&mut parts).await;
            Ok(())
        };
        let committed = commit && !failed && outcome.is_ok();
        if committed {
            self.advance_tokens(&mut parts).await;
        }
        self.state.end_transaction(committed);
        self.release_parts(parts);
        if let Err(e) = outcome {
            return self.reply_error(&e, unit).await;
        }
        let tag = if committed { "COMMIT" } else { "ROLLBACK" };
        let mut out = Vec::new();
        super::batch::answer_command(&mut out, &batch, tag)?;
        self.out.buf.extend_from_slice(&out);
        Ok(())
    }

    /// Commits every part; see the module documentation for the order.
    async fn commit_parts(&mut self, parts: &mut [Attached]) -> Result<(), ProxyError> {
        let writers: Vec<usize> = (0..parts.len())
            .filter(|&i| parts[i].wrote && parts[i].replica.is_none())
            .collect();
        // Parts that only read: their commit changes nothing, so it may come first.
        for i in (0..parts.len()).filter(|i| !writers.contains(i)) {
            if let Err(e) = parts[i].lease.conn.internal_query("COMMIT").await {
                rollback_all(parts).await;
                return Err(e);
            }
            parts[i].status = b'I';
        }
        if writers.len() <= 1 {
            for &i in &writers {
                let done = parts[i].lease.conn.internal_query("COMMIT").await;
                parts[i].status = b'I';
                done?;
            }
            return Ok(());
        }
        self.ctx.metrics.inc("herd_shard_2pc_total", "");
        // Group 0's part carries the decision: begun for it when the transaction wrote no
        // rows there.
        let mut extra: Option<Lease> = None;
        if parts[writers[0]].group != 0 {
            let begun = async {
                let primary = self.ctx.current_primary_of(0).await?;
                let mut lease = self.lease(&primary).await?;
                lease.conn.internal_query("BEGIN").await?;
                Ok::<_, ProxyError>(lease)
            };
            match begun.await {
                Ok(l) => extra = Some(l),
                Err(e) => {
                    rollback_all(parts).await;
                    self.ctx.metrics.inc("herd_shard_2pc_aborts_total", "");
                    return Err(e);
                }
            }
        }
        let mut leases: Vec<&mut Lease> = extra.iter_mut().collect();
        leases.extend(
            parts
                .iter_mut()
                .filter(|p| p.wrote && p.replica.is_none())
                .map(|p| &mut p.lease),
        );
        let gid = super::two_phase::ddl_gid("t");
        let outcome = match super::two_phase::prepare_all(&mut leases, &gid, "").await {
            Ok(()) => {
                // Decided once every part is prepared: group 0 commits the decision row first.
                self.ctx.metrics.inc("herd_shard_2pc_commits_total", "");
                super::two_phase::commit_all(
                    &self.ctx.commits,
                    &mut leases,
                    &gid,
                    "the transaction",
                )
                .await
            }
            Err(e) => {
                // prepare_all rolled back the failed part and those prepared before it; the
                // parts after it are still open.
                for l in &mut leases {
                    let _ = l.conn.internal_query("ROLLBACK").await;
                }
                self.ctx.metrics.inc("herd_shard_2pc_aborts_total", "");
                Err(e)
            }
        };
        // After a failure the connections' state is not known well enough to pool them.
        if let (Some(l), true) = (extra, outcome.is_ok()) {
            l.release();
        }
        for &i in &writers {
            parts[i].status = b'I';
            parts[i].fatal |= outcome.is_err();
        }
        outcome
    }

    /// After a commit, the read-your-writes token of every group written to.
    async fn advance_tokens(&mut self, parts: &mut [Attached]) {
        for p in parts.iter_mut().filter(|p| p.wrote && p.replica.is_none()) {
            let rows = p
                .lease
                .conn
                .internal_query("select pg_current_wal_lsn()::text")
                .await;
            if let Some(lsn) = rows
                .ok()
                .and_then(|r| r.first().and_then(|r| r.first()).cloned().flatten())
                .and_then(|t| t.parse::<herd_core::Lsn>().ok())
            {
                self.state.advance_token(p.group, lsn);
            }
        }
    }

    /// Gives the parts' servers back (a pinned one stays the session's); those whose state is
    /// uncertain are closed.
    fn release_parts(&mut self, parts: Vec<Attached>) {
        for mut p in parts {
            let clean = p.tracker.is_idle() && p.status == b'I' && !p.fatal;
            if !clean {
                continue; // dropped: closed, rolling back whatever it held
            }
            p.lease.conn.state_hash = self.state.hash;
            p.wrote = false;
            p.unit = None;
            p.begin = None;
            if p.pinned && self.attached.is_none() {
                let conn = &p.lease.conn;
                self.cancel
                    .attach(&conn.endpoint.host, conn.endpoint.port, conn.backend_key);
                self.group = p.group;
                self.attached = Some(p);
            } else if !p.pinned {
                p.lease.release();
            }
        }
    }
}

/// Rolls back every part still in its transaction.
async fn rollback_all(parts: &mut [Attached]) {
    for p in parts.iter_mut().filter(|p| p.status != b'I') {
        match p.lease.conn.internal_query("ROLLBACK").await {
            Ok(_) => p.status = b'I',
            Err(_) => p.fatal = true, // closed when released
        }
    }
}
