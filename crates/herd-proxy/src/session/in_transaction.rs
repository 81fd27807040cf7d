//! Statements on every shard group inside a transaction block (transaction pooling): a read
//! across groups, or a write on every group, runs on the transaction's part on each group —
//! begun there with the client's BEGIN for groups the transaction had not touched yet — so it
//! sees the transaction's own writes, nobody sees its writes before the COMMIT, and they
//! commit or roll back with the rest of the transaction (`spanning.rs`: two-phase when several
//! groups wrote). A failure on any group fails the whole transaction: every part's server is
//! made to fail its transaction too, so each answers later statements as PostgreSQL would.

use super::batch::Batch;
use super::fan_out::Stream;
use super::write_all::{run, Done, Write};
use super::{Attached, PendingBegin, Session};
use crate::ProxyError;

impl Session {
    /// Runs the SELECT of `unit` across groups inside the client's transaction.
    pub(super) async fn fan_out_in_transaction(
        &mut self,
        unit: &[u8],
        plan: herd_sql::FanOut,
    ) -> Result<(), ProxyError> {
        // Bound here, executed by a later batch: the merge would never see the rows whole.
        if super::batch::binds_without_execute(unit) {
            let e = super::fan_out::not_supported(super::batch::FETCHED_WHOLE.into());
            return self.fail_transaction(unit, &e).await;
        }
        let Some((batch, mut parts)) = self.batch_and_parts(unit).await? else {
            return Ok(());
        };
        let mut streams: Vec<Stream> = parts
            .iter_mut()
            .map(|p| Stream::new(&mut p.lease))
            .collect();
        let answer = self.fan_out_on(&batch, &plan, &mut streams, b'T').await;
        let states: Vec<(u8, bool)> = streams.iter().map(|s| (s.status, s.clean)).collect();
        drop(streams);
        for (p, (status, clean)) in parts.iter_mut().zip(states) {
            if status != 0 {
                p.status = status;
            }
            p.fatal |= !clean;
        }
        if let Err((_, e)) = &answer {
            fail_parts(&mut parts, &e.to_string()).await;
        }
        self.restore_parts(parts);
        self.answer_fan_out(answer, unit).await
    }

    /// Runs the write of `unit` on every group inside the client's transaction.
    pub(super) async fn write_all_in_transaction(
        &mut self,
        unit: &[u8],
        write: Write,
    ) -> Result<(), ProxyError> {
        let Some((batch, mut parts)) = self.batch_and_parts(unit).await? else {
            return Ok(());
        };
        let mut leases: Vec<&mut crate::pool::Lease> =
            parts.iter_mut().map(|p| &mut p.lease).collect();
        let requests = self.write_requests(&batch, &write, &mut leases).await;
        drop(leases);
        let outcome = match requests {
            Ok(requests) => run_parts(&mut parts, &requests).await,
            Err(e) => Err(e),
        };
        match outcome {
            Ok(answers) => {
                self.restore_parts(parts);
                let (tag, one_copy) = write.answer();
                let out = self.write_answer(&batch, &answers, tag, one_copy, b'T')?;
                self.ctx.metrics.inc("herd_shard_write_all_total", "");
                self.write_client(&out).await
            }
            Err(e) => {
                fail_parts(&mut parts, &e.to_string()).await;
                self.restore_parts(parts);
                self.reply_error(&e, unit).await
            }
        }
    }

    /// The client's batch and the transaction's parts on every group; `None` once a failure
    /// to get them was answered (it fails the transaction).
    async fn batch_and_parts(
        &mut self,
        unit: &[u8],
    ) -> Result<Option<(Batch, Vec<Attached>)>, ProxyError> {
        let batch = match self.fan_out_batch(unit) {
            Ok(b) => b,
            Err(e) => return self.fail_transaction(unit, &e).await.map(|()| None),
        };
        match self.all_parts().await {
            Ok(parts) => Ok(Some((batch, parts))),
            Err(e) => self.fail_transaction(unit, &e).await.map(|()| None),
        }
    }

    /// The transaction's parts on every group, in group order, taken out of the session: the
    /// ones it has, and for the other groups a server of the group's primary in a transaction
    /// begun as the client began this one. On failure the parts are back in the session.
    async fn all_parts(&mut self) -> Result<Vec<Attached>, ProxyError> {
        let begin = self
            .pending_begin
            .clone()
            .or_else(|| self.attached.as_ref().and_then(|a| a.begin.clone()))
            .or_else(|| self.parked.iter().find_map(|p| p.begin.clone()))
            .unwrap_or(PendingBegin {
                sql: "BEGIN".into(),
                read_only: false,
                consistency: None,
            });
        let mut parts = std::mem::take(&mut self.parked);
        parts.extend(self.attached.take());
        self.cancel.detach();
        if parts.iter().any(|p| p.replica.is_some() || p.pinned) {
            self.restore_parts(parts);
            return Err(super::fan_out::not_supported(
                "a statement on every shard group runs on the groups' primaries: not inside a \
                 READ ONLY transaction served by replicas, nor in a session pinned to its server"
                    .into(),
            ));
        }
        for g in 0..self.ctx.groups() {
            if parts.iter().any(|p| p.group == g) {
                continue;
            }
            let begun = async {
                let primary = self.ctx.current_primary_of(g).await?;
                let mut lease = self.lease(&primary).await?;
                lease.conn.internal_query(&begin.sql).await?;
                Ok::<_, ProxyError>(lease)
            };
            match begun.await {
                Ok(lease) => {
                    let mut part = self.new_part(lease, None, g);
                    part.status = b'T';
                    part.begin = Some(begin.clone());
                    parts.push(part);
                }
                Err(e) => {
                    self.restore_parts(parts);
                    return Err(e);
                }
            }
        }
        // The deferred BEGIN now lives in the parts.
        self.pending_begin = None;
        parts.sort_by_key(|p| p.group);
        Ok(parts)
    }

    /// Puts the parts back in the session: the one of the session's current group (else the
    /// first) attached, the others parked.
    fn restore_parts(&mut self, mut parts: Vec<Attached>) {
        let Some(pos) = parts
            .iter()
            .position(|p| p.group == self.group)
            .or((!parts.is_empty()).then_some(0))
        else {
            return;
        };
        let att = parts.swap_remove(pos);
        let conn = &att.lease.conn;
        self.cancel
            .attach(&conn.endpoint.host, conn.endpoint.port, conn.backend_key);
        self.group = att.group;
        self.attached = Some(att);
        self.parked.extend(parts);
    }

    /// Fails the client's transaction on every part after `e` (its statement failed before
    /// reaching them all), and answers the error.
    async fn fail_transaction(&mut self, unit: &[u8], e: &ProxyError) -> Result<(), ProxyError> {
        let mut parts = std::mem::take(&mut self.parked);
        parts.extend(self.attached.take());
        fail_parts(&mut parts, &e.to_string()).await;
        self.restore_parts(parts);
        self.reply_error(e, unit).await
    }
}

/// Runs each part's request (none: nothing to do there) in its open transaction, group by
/// group, up to the first failure; what each answered.
async fn run_parts(
    parts: &mut [Attached],
    requests: &[Option<Vec<u8>>],
) -> Result<Vec<Done>, ProxyError> {
    let mut answers = Vec::new();
    for (p, request) in parts.iter_mut().zip(requests) {
        let Some(request) = request else {
            answers.push(Done::default());
            continue;
        };
        p.wrote = true;
        match run(&mut p.lease, request).await {
            Ok(done) => answers.push(done),
            Err(e) => {
                // A server's error left its transaction failed; anything else, unknown.
                match &e {
                    ProxyError::Server { .. } => p.status = b'E',
                    _ => p.fatal = true,
                }
                return Err(e);
            }
        }
    }
    Ok(answers)
}

/// Makes every part still in its transaction fail it (a statement that raises `why`), as the
/// failed statement would have on one server.
async fn fail_parts(parts: &mut [Attached], why: &str) {
    let raise = super::shard::raising_sql(why);
    for p in parts.iter_mut().filter(|p| p.status == b'T' && !p.fatal) {
        match p.lease.conn.internal_query(&raise).await {
            Err(ProxyError::Server { .. }) => p.status = b'E',
            _ => p.fatal = true,
        }
    }
}
