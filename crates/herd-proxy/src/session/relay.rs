//! The session loop: units while detached, both directions while attached, and what happens
//! when a transaction ends (token, settings, release) or a server fails.

use std::time::Duration;

use bytes::Bytes;
use herd_core::Lsn;
use herd_wire::backend::tag as btag;

use super::attach::unit_len;
use super::startup::read_more;
use super::Session;
use crate::analysis::Effect;
use crate::ProxyError;

/// Bytes of client messages held back while a replica answers the previous batch.
const HOLD_LIMIT: usize = 1 << 20;

enum Event {
    Client(std::io::Result<usize>),
    Server(Result<usize, ProxyError>),
}

impl Session {
    /// Serves units until the client terminates or leaves.
    pub(super) async fn run(&mut self) -> Result<(), ProxyError> {
        let max = self.ctx.config.max_message_bytes as usize;
        loop {
            let Some(att) = self.attached.as_mut() else {
                match unit_len(&self.cbuf, max)? {
                    Some(n) => {
                        let unit: Bytes = self.cbuf.split_to(n).freeze();
                        if !self.start_unit(unit).await? {
                            return Ok(());
                        }
                    }
                    None => {
                        if !read_more(&mut self.client, &mut self.cbuf).await? {
                            return Ok(());
                        }
                    }
                }
                continue;
            };
            // A new batch goes to a replica only once it has answered the previous one: a
            // pipelined write must not follow a read onto a read-only server. Messages that
            // continue an open batch (up to its Sync) always go on, or the server would wait
            // for them forever.
            let forward_now = att.replica.is_none() || att.batch_open || att.tracker.is_idle();
            if forward_now {
                if let Some(n) = complete_frames_len(&self.cbuf, max)? {
                    let bytes = self.cbuf.split_to(n).freeze();
                    if !self.forward(&bytes).await? {
                        return Ok(());
                    }
                    continue;
                }
            }
            // The client is read even while its messages wait (so its departure is noticed),
            // up to a bound that pushes back on a client that floods a busy server.
            let read_client = forward_now || self.cbuf.len() < HOLD_LIMIT;
            let Some(att) = self.attached.as_mut() else {
                continue;
            };
            let event = {
                let (client, cbuf) = (&mut self.client, &mut self.cbuf);
                let conn = &mut att.lease.conn;
                if cbuf.capacity() - cbuf.len() < 4096 {
                    cbuf.reserve(16 * 1024);
                }
                if read_client {
                    tokio::select! {
                        r = tokio::io::AsyncReadExt::read_buf(client, cbuf) => Event::Client(r),
                        r = conn.fill() => Event::Server(r),
                    }
                } else {
                    Event::Server(conn.fill().await)
                }
            };
            match event {
                Event::Client(Ok(0)) => return Ok(()),
                Event::Client(Ok(_)) => {}
                Event::Client(Err(e)) => return Err(ProxyError::io("reading from client", e)),
                Event::Server(Ok(_)) => self.relay_server().await?,
                Event::Server(Err(e)) => self.server_failed(e).await?,
            }
        }
    }

    /// Relays every complete server message, then handles a finished transaction.
    async fn relay_server(&mut self) -> Result<(), ProxyError> {
        let Some(att) = self.attached.as_mut() else {
            return Ok(());
        };
        while let Some(n) = att.lease.conn.complete_frame()? {
            let raw = att.lease.conn.rbuf.split_to(n);
            match raw.first().copied() {
                Some(btag::ERROR_RESPONSE) => att.error_seen = true,
                Some(btag::COMMAND_COMPLETE) if raw.get(5..13) == Some(b"ROLLBACK".as_slice()) => {
                    att.rolled_back = true
                }
                _ => {}
            }
            let before = self.out.len();
            let d = att.tracker.on_server_message(&raw, &mut self.out);
            att.forwarded += self.out.len() - before;
            for id in d.failed {
                if let Some(pos) = att.parsing.iter().position(|(i, _)| *i == id) {
                    let (_, name) = att.parsing.remove(pos);
                    att.lease.conn.prepared.remove(&name);
                }
            }
            if let Some(status) = d.ready {
                att.status = status;
                att.parsing.clear();
                let effects = std::mem::take(&mut att.effects);
                if !std::mem::take(&mut att.error_seen) {
                    apply_effects(
                        &mut self.state,
                        effects,
                        status == b'T',
                        &mut att.lease.conn.prepared,
                    );
                }
                att.ready_idle = att.tracker.is_idle();
            }
        }
        self.flush_out().await?;
        let finished = self
            .attached
            .as_ref()
            .is_some_and(|a| a.ready_idle && a.status == b'I');
        if finished {
            self.end_transaction().await?;
        }
        Ok(())
    }

    /// The attached server is idle outside a transaction: update the read-your-writes token
    /// after a write, settle settings, and give the server back unless pinned.
    async fn end_transaction(&mut self) -> Result<(), ProxyError> {
        let Some(att) = self.attached.as_mut() else {
            return Ok(());
        };
        self.state
            .end_transaction(!std::mem::take(&mut att.rolled_back));
        // The server ran every statement of the session's settings: it matches them now.
        att.lease.conn.state_hash = self.state.hash;
        att.unit = None;
        if att.wrote && att.replica.is_none() {
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
                self.state.advance_token(lsn);
            }
            att.wrote = false;
        }
        if att.pinned {
            return Ok(());
        }
        if let Some(att) = self.attached.take() {
            self.cancel.detach();
            att.lease.release();
        }
        Ok(())
    }

    /// The attached server failed. A read that sent nothing to the client yet is retried on
    /// another node; otherwise the client gets an error and the session ends (its transaction's
    /// outcome is unknown to the proxy, so it must not look like a success).
    async fn server_failed(&mut self, e: ProxyError) -> Result<(), ProxyError> {
        let Some(att) = self.attached.take() else {
            return Err(e);
        };
        self.cancel.detach();
        let node = att.lease.conn.endpoint.name.clone();
        let retry =
            att.replica.is_some() && att.forwarded == 0 && att.status == b'I' && att.unit.is_some();
        drop(att.lease); // closed, not returned
        self.ctx
            .metrics
            .inc("herd_server_failures_total", &format!("node=\"{node}\""));
        if retry {
            if let Some(unit) = att.unit {
                tracing::warn!(node = %node, "replica failed before answering; retrying the read elsewhere");
                self.ctx.metrics.inc("herd_read_retries_total", "");
                self.ctx.avoid(&node, Duration::from_secs(2));
                self.start_unit(Bytes::from(unit)).await?;
                return Ok(());
            }
        }
        Err(ProxyError::Unavailable(format!(
            "connection to server {node} was lost ({e}); the outcome of the current transaction is unknown"
        )))
    }
}

/// Applies confirmed session effects; `in_transaction` defers settings to the commit.
fn apply_effects(
    state: &mut super::state::SessionState,
    effects: Vec<Effect>,
    in_transaction: bool,
    prepared: &mut crate::server::PreparedSet,
) {
    for e in effects {
        match e {
            Effect::Set { name, sql } => state.record_set(&name, Some(sql), in_transaction),
            Effect::Reset { name } => state.record_set(&name, None, in_transaction),
            Effect::ResetAll => state.reset_all(),
            Effect::DiscardAll => {
                state.reset_all();
                state.statements.clear();
                prepared.clear();
            }
            Effect::Consistency(level) => state.consistency = level,
        }
    }
}

/// Length of all complete messages at the start of `buf`.
fn complete_frames_len(buf: &[u8], max: usize) -> Result<Option<usize>, ProxyError> {
    let mut offset = 0;
    while let Some((_, used)) = herd_wire::split_frame(&buf[offset..], max)? {
        offset += used;
    }
    Ok((offset > 0).then_some(offset))
}
