//! What happens when a transaction ends (the read-your-writes token, the settings, the server
//! given back) or when its server fails (a read retried elsewhere, or the client told).

use std::time::Duration;

use bytes::Bytes;
use herd_core::Lsn;

use super::Session;
use crate::ProxyError;

impl Session {
    /// The common end of a transaction, without an await: a server that wrote nothing, alone
    /// in the session and not pinned, goes straight back to its pool. `false` when the end
    /// needs [`Session::end_transaction`] (a token to read, a pinned server, parked parts).
    pub(super) fn release_now(&mut self) -> bool {
        let simple = self.parked.is_empty()
            && self.attached.as_ref().is_some_and(|a| {
                // A write on the primary needs its token read; a pinned server stays.
                let token_needed = a.wrote && a.replica.is_none();
                !(a.pinned || token_needed)
            });
        if !simple {
            return false;
        }
        let Some(mut att) = self.attached.take() else {
            return false;
        };
        settle(&mut self.state, &mut att);
        self.cancel.detach();
        att.give_back();
        true
    }

    /// A standby refused a read the proxy sent it (it touched an unlogged table, or wrote after
    /// all) before the client saw anything: the connection is dropped and the unit runs on the
    /// primary instead.
    pub(super) async fn retry_on_primary(&mut self, code: &str) -> Result<(), ProxyError> {
        let Some(att) = self.attached.take() else {
            return Ok(());
        };
        self.cancel.detach();
        self.sout.clear();
        let node = att.lease.conn.endpoint.name.clone();
        tracing::debug!(node = %node, code, "a standby refused a read; running it on the primary");
        self.ctx.metrics.inc_labels(
            "herd_standby_refusals_total",
            &[("node", node.as_str()), ("sqlstate", code)],
        );
        drop(att.lease); // mid-unit: closed, not returned
        self.pending_begin = att.begin;
        self.force_primary = true;
        if let Some(unit) = att.unit {
            Box::pin(self.start_unit(Bytes::from(unit))).await?;
        }
        Ok(())
    }

    /// A server refused a statement kept prepared there as out of date (SQLSTATE `code`) when
    /// the unit could run again as on a new connection (see `relay::rerun_point`): the
    /// connection is dropped (the server skips to the Sync; nothing ran) and the unit runs
    /// again from its start, its statements prepared afresh, the answers the client was given
    /// (`given`) not given twice. Once per unit.
    pub(super) async fn rerun_outdated(
        &mut self,
        given: crate::router::track::Given,
        code: &str,
    ) -> Result<(), ProxyError> {
        let Some(mut att) = self.attached.take() else {
            return Ok(());
        };
        self.cancel.detach();
        self.sout.clear();
        // What the unit did to the session (statements named, the unnamed one replaced, a
        // Close answered) is done again by the rerun.
        let ids: Vec<u64> = att.undo.iter().map(|(id, _)| *id).collect();
        super::undo::undo_failed(&ids, &mut att, &mut self.state);
        let node = att.lease.conn.endpoint.name.clone();
        tracing::debug!(node = %node, code, "a kept statement was out of date; running the unit again");
        self.ctx.metrics.inc("herd_stale_retries_total", "");
        drop(att.lease); // mid-unit: closed, not returned
        self.pending_begin = att.begin;
        if let Some(unit) = att.retry_unit {
            self.rerun = Some(given);
            self.rerunning = true;
            Box::pin(self.start_unit(unit)).await?;
            // Answered without a server after all: nothing is owed to a later unit.
            self.rerun = None;
            self.rerunning &= self.attached.is_some();
        }
        Ok(())
    }

    /// The attached server is idle outside a transaction: update the read-your-writes token
    /// after a write, settle settings, and give the server back unless pinned.
    pub(super) async fn end_transaction(&mut self) -> Result<(), ProxyError> {
        if !self.parked.is_empty() {
            // Statements that end one part are refused in a spanning transaction; should one
            // slip through, the other parts must not stay open (closing them rolls them back).
            tracing::error!("a transaction spanning shard groups ended on one group only; rolling back the others");
            self.parked.clear();
        }
        let Some(att) = self.attached.as_mut() else {
            return Ok(());
        };
        settle(&mut self.state, att);
        att.unit = None;
        att.begin = None;
        // In session pooling the client never leaves its server, so no token is needed; and
        // a query of the proxy's own would drop the client's unnamed statement there.
        let session_pooling = self.ctx.config.pool_mode == herd_core::PoolMode::Session;
        if att.wrote && att.replica.is_none() && !session_pooling {
            // A late CancelRequest of the client must not cancel the proxy's own query.
            self.cancel.detach();
            // The commit is done; the primary's position now is at or past its commit record.
            let rows = att
                .lease
                .conn
                .internal_query("select pg_current_wal_lsn()::text")
                .await?;
            if let Some(lsn) = rows
                .first()
                .and_then(|r| r.first())
                .cloned()
                .flatten()
                .and_then(|t| t.parse::<Lsn>().ok())
            {
                self.state.advance_token(att.group, lsn);
            }
            att.wrote = false;
            if att.pinned {
                let conn = &att.lease.conn;
                self.cancel
                    .attach(&conn.endpoint.host, conn.endpoint.port, conn.backend_key);
            }
        }
        if att.pinned {
            return Ok(());
        }
        if let Some(att) = self.attached.take() {
            self.cancel.detach();
            att.give_back();
        }
        Ok(())
    }

    /// The attached server failed. A read that sent nothing to the client yet is retried on
    /// another node; otherwise the client gets an error and the session ends (its transaction's
    /// outcome is unknown to the proxy, so it must not look like a success). After a FATAL the
    /// server sent itself, the session just ends, as it would on PostgreSQL.
    pub(super) async fn server_failed(&mut self, e: ProxyError) -> Result<(), ProxyError> {
        let Some(att) = self.attached.take() else {
            return Err(e);
        };
        self.cancel.detach();
        self.sout.clear();
        let node = att.lease.conn.endpoint.name.clone();
        let retry = att.replica.is_some()
            && att.forwarded == 0
            && att.status == b'I'
            && att.unit.is_some()
            && !att.fatal;
        drop(att.lease); // closed, not returned
        self.ctx
            .metrics
            .inc("herd_server_failures_total", &format!("node=\"{node}\""));
        if retry {
            if let Some(unit) = att.unit {
                tracing::warn!(node = %node, "replica failed before answering; retrying the read elsewhere");
                self.ctx.metrics.inc("herd_read_retries_total", "");
                self.ctx.avoid(&node, Duration::from_secs(2));
                self.pending_begin = att.begin;
                Box::pin(self.start_unit(Bytes::from(unit))).await?;
                return Ok(());
            }
        }
        if att.fatal {
            return Err(ProxyError::Ended(format!(
                "server {node} ended the connection ({e})"
            )));
        }
        Err(ProxyError::Unavailable(format!(
            "connection to server {node} was lost ({e}); the outcome of the current transaction is unknown"
        )))
    }
}

/// The session's settings after the transaction on `att` ended; the server ran every statement
/// of them, so it matches them now.
fn settle(state: &mut super::state::SessionState, att: &mut super::Attached) {
    state.end_transaction(!std::mem::take(&mut att.rolled_back));
    att.lease.conn.state_hash = state.hash;
}
