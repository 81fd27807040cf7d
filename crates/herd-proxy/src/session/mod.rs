//! One client connection: startup, then units of work routed to servers and relayed back.
//!
//! While no server is attached the proxy waits for a complete unit (a simple `Query`, or an
//! extended-protocol batch up to `Sync`/`Flush`), decides where it goes, attaches a pooled server
//! connection and forwards it. While attached, both directions are relayed as they come; the
//! server is given back when it reports `ReadyForQuery` idle with nothing outstanding (transaction
//! pooling), unless something pinned the session to it.

mod attach;
mod relay;
mod startup;
pub mod state;
mod translate;

use std::sync::Arc;

use bytes::BytesMut;
use herd_wire::encode;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::cancel::CancelSlot;
use crate::pool::Lease;
use crate::router::track::Tracker;
use crate::{ProxyContext, ProxyError};
use state::SessionState;

/// A server attached to the session.
struct Attached {
    lease: Lease,
    tracker: Tracker,
    /// Index of the replica, or `None` for the primary.
    replica: Option<usize>,
    /// The transaction so far may have written (its end must update the token).
    wrote: bool,
    /// Last ReadyForQuery status.
    status: u8,
    /// Session-level state on the server: keep it until the client leaves.
    pinned: bool,
    /// Bytes sent to the client since attaching (a read may be retried elsewhere while zero).
    forwarded: usize,
    /// The unit that caused the attach, kept for a retry while nothing was forwarded.
    unit: Option<Vec<u8>>,
    /// The transaction was rolled back (a ROLLBACK command completed).
    rolled_back: bool,
    /// Named statements parsed on this server in flight: id → server-side name.
    parsing: Vec<(u64, String)>,
    /// Session changes of the statements in flight, applied when the server confirms them.
    effects: Vec<crate::analysis::Effect>,
    /// An ErrorResponse arrived since the last ReadyForQuery.
    error_seen: bool,
    /// The last message was a ReadyForQuery with nothing else outstanding.
    ready_idle: bool,
    /// Client messages of a batch not yet closed by Sync were forwarded.
    batch_open: bool,
}

/// Everything one client connection owns.
pub struct Session {
    ctx: Arc<ProxyContext>,
    client: TcpStream,
    cbuf: BytesMut,
    user: String,
    database: String,
    state: SessionState,
    attached: Option<Attached>,
    cancel: Arc<CancelSlot>,
    /// Ids for tracked messages.
    next_id: u64,
    /// Bytes for the client, written once per batch.
    out: Vec<u8>,
    /// A transaction the client began that no server has seen yet.
    pending_begin: Option<PendingBegin>,
    /// The key this client proved at login (for new server connections).
    creds: Option<Arc<crate::pool::Credentials>>,
    /// Pools this session used, by node.
    pools: std::collections::HashMap<herd_core::Endpoint, Arc<crate::pool::Pool>>,
}

/// `BEGIN` answered by the proxy: the server is chosen by the transaction's first statement,
/// so a `READ ONLY` transaction can go to a replica with its own consistency level.
#[derive(Clone, Debug)]
struct PendingBegin {
    /// The client's statement, sent to the server ahead of the first real one.
    sql: String,
    /// Declared READ ONLY (and not SERIALIZABLE).
    read_only: bool,
    /// `SET LOCAL herd.consistency` inside it.
    consistency: Option<herd_core::Consistency>,
}

/// Serves one client connection to the end. Errors are reported to the client where the
/// protocol allows and logged; they never take the proxy down.
pub async fn serve_client(mut client: TcpStream, ctx: Arc<ProxyContext>) {
    let _ = client.set_nodelay(true);
    ctx.metrics.inc("herd_client_connections_total", "");
    let mut cbuf = BytesMut::with_capacity(16 * 1024);
    let login = match startup::startup(&mut client, &mut cbuf, &ctx).await {
        Ok(Some(login)) => login,
        Ok(None) => return,
        Err(e) => return fatal(&mut client, &e).await,
    };
    if let Err(e) = startup::authenticate(&mut client, &mut cbuf, &ctx, &login).await {
        ctx.metrics.inc("herd_auth_failures_total", "");
        return fatal(&mut client, &e).await;
    }
    let ((pid, key), cancel) = ctx.cancels.register();
    let mut state = SessionState::new(login.consistency.unwrap_or(ctx.config.consistency));
    for (name, stmt) in &login.settings {
        state.record_set(name, Some(stmt.clone()), false);
    }
    let mut session = Session {
        ctx,
        client,
        cbuf,
        user: login.user,
        database: login.database,
        state,
        attached: None,
        cancel,
        next_id: 0,
        out: Vec::with_capacity(16 * 1024),
        pending_begin: None,
        pools: std::collections::HashMap::new(),
        creds: None,
    };
    if let Err(e) = session.greet(pid, key).await {
        return fatal(&mut session.client, &e).await;
    }
    if let Err(e) = session.run().await {
        tracing::debug!(user = %session.user, "session ended: {e}");
        fatal(&mut session.client, &e).await;
    }
    session.finish().await;
}

/// Sends a FATAL ErrorResponse (best effort) before the connection closes.
async fn fatal(client: &mut TcpStream, e: &ProxyError) {
    if matches!(e, ProxyError::Io { .. }) && e.to_string().contains("client") {
        return; // the client is gone: nobody to tell
    }
    let mut out = Vec::new();
    let _ = encode::error_response(&mut out, "FATAL", e.sqlstate(), &e.to_string());
    let _ = client.write_all(&out).await;
}

impl Session {
    /// AuthenticationOk was sent: now the server parameters, the cancel key and ReadyForQuery.
    async fn greet(&mut self, pid: i32, key: i32) -> Result<(), ProxyError> {
        let params = self.ctx.server_params(&self.user, &self.database).await?;
        let mut out = Vec::new();
        for (name, value) in &params {
            encode::parameter_status(&mut out, name, value)?;
        }
        encode::backend_key_data(&mut out, pid, key);
        encode::ready_for_query(&mut out, b'I')?;
        self.write_client(&out).await
    }

    async fn write_client(&mut self, bytes: &[u8]) -> Result<(), ProxyError> {
        self.client
            .write_all(bytes)
            .await
            .map_err(|e| ProxyError::io("writing to client", e))
    }

    /// Flushes `self.out` to the client.
    async fn flush_out(&mut self) -> Result<(), ProxyError> {
        if self.out.is_empty() {
            return Ok(());
        }
        let out = std::mem::take(&mut self.out);
        let result = self.write_client(&out).await;
        self.out = out;
        self.out.clear();
        result
    }

    /// The client left (or the session failed): a server in a clean state goes back to its pool,
    /// after a reset if the session had pinned it; anything uncertain is closed.
    async fn finish(&mut self) {
        self.cancel.detach();
        let Some(mut att) = self.attached.take() else {
            return;
        };
        // Only a server that answered everything and reported idle since the last message is
        // clean: after an unsynced batch it would still hold an implicit transaction.
        if att.ready_idle && att.tracker.is_idle() && att.status == b'I' {
            let reset_needed =
                att.pinned || self.ctx.config.pool_mode == herd_core::PoolMode::Session;
            if reset_needed {
                if att.lease.conn.internal_query("DISCARD ALL").await.is_err() {
                    return; // dropped: closed
                }
                att.lease.conn.prepared.clear();
                att.lease.conn.state_hash = 0;
            }
            att.lease.release();
        }
        // Otherwise the lease drops here and its connection closes, rolling back whatever the
        // vanished client left open.
    }
}
