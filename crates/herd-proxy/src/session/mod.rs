//! One client connection: startup, then units of work routed to servers and relayed back.
//!
//! While no server is attached the proxy waits for a complete unit (a simple `Query`, or an
//! extended-protocol batch up to `Sync`/`Flush`), decides where it goes, attaches a pooled server
//! connection and forwards it. While attached, both directions are relayed as they come; the
//! server is given back when it reports `ReadyForQuery` idle with nothing outstanding (transaction
//! pooling), unless something pinned the session to it.

mod attach;
mod batch;
mod bound;
mod combine;
mod copy;
mod copy_out;
mod cursors;
mod database;
mod ddl;
mod ending;
mod explain;
mod fan_out;
mod general;
mod herd_call;
mod hidden;
mod in_transaction;
mod inbuf;
mod insert_select;
mod lease;
mod outdated;
mod pipeline;
mod place_now;
mod plan_sql;
mod primary_watch;
mod relay;
mod replication;
mod rows;
mod script;
mod shard;
mod spanning;
mod sql_prepare;
mod startup;
pub mod state;
mod translate;
mod two_phase;
mod undo;
mod write_all;

use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use herd_wire::encode;
use tokio::net::TcpStream;

use crate::client::ClientStream;

use crate::cancel::CancelSlot;
use crate::pool::Lease;
use crate::router::track::Tracker;
use crate::{ProxyContext, ProxyError};
use state::SessionState;

/// A server attached to the session.
struct Attached {
    lease: Lease,
    /// The shard group of the server.
    group: u32,
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
    /// What to undo should a message in flight fail, by tracker id.
    undo: Vec<(u64, undo::Undo)>,
    /// The kept statements bound or described since the last ReadyForQuery (a server's error
    /// saying one is out of date applies to them).
    bound: Vec<Arc<state::Statement>>,
    /// The unit that caused the attach when it used kept statements and ended with its Sync:
    /// run again (once) should a server refuse one of them as out of date before anything ran.
    retry_unit: Option<Bytes>,
    /// The schema change of the statements run since the transaction began, applied at each
    /// ReadyForQuery (and so again at the commit, when other servers see it).
    schema: crate::analysis::SchemaChange,
    /// The server sent a FATAL error: it is closing the connection.
    fatal: bool,
    /// The deferred BEGIN sent ahead of `unit`, restored should the unit be retried.
    begin: Option<PendingBegin>,
    /// Session changes of the statements in flight, applied when the server confirms them.
    effects: Vec<crate::analysis::Effect>,
    /// An ErrorResponse arrived since the last ReadyForQuery.
    error_seen: bool,
    /// The last message was a ReadyForQuery with nothing else outstanding.
    ready_idle: bool,
    /// Client messages of a batch not yet closed by Sync were forwarded.
    batch_open: bool,
    /// A cursor was declared in the transaction block on this server (`Some(true)`: on the
    /// general path): the block stays on this server until it ends (`cursors.rs`).
    cursor: Option<bool>,
}

impl Attached {
    /// Returns the server to its pool, idle, with the emptied tracker and list of bound
    /// statements for its next session.
    fn give_back(mut self) {
        self.tracker.reset();
        self.bound.clear();
        self.lease.conn.spare = Spare {
            tracker: self.tracker,
            bound: self.bound,
        };
        self.lease.release();
    }
}

/// What a session leaves on a server connection it gives back, emptied, for the next one
/// (see [`crate::server::ServerConn`]'s `spare`).
#[derive(Debug, Default)]
pub(crate) struct Spare {
    tracker: Tracker,
    bound: Vec<Arc<state::Statement>>,
}

/// Everything one client connection owns.
pub struct Session {
    ctx: Arc<ProxyContext>,
    client: ClientStream,
    cbuf: BytesMut,
    user: String,
    database: String,
    state: SessionState,
    attached: Option<Attached>,
    cancel: Arc<CancelSlot>,
    /// Ids for tracked messages.
    next_id: u64,
    /// How much room the next read of the client gets.
    inbuf: inbuf::ReadChunk,
    /// Bytes for the client, written as its socket takes them.
    out: Outbox,
    /// Bytes for the attached server, written as its socket takes them.
    sout: Outbox,
    /// The next unit goes to the primary whatever it is (a standby refused it, or it is the
    /// start of a batch whose end is late).
    force_primary: bool,
    /// Since when the start of a batch has waited for its end with no client bytes arriving
    /// (set by the first wait after a read that left it incomplete, cleared by every read): the
    /// clock is read only when a batch waits, not on every message.
    partial_since: Option<std::time::Instant>,
    /// Inside a transaction on a sharded cluster, the start of a batch waits for its end
    /// (its Sync or Flush) before it goes anywhere: its statements may belong to other groups
    /// (a pipeline, `pipeline.rs`). Set while the session waits so; `partial_expired` once
    /// it waited `PARTIAL_WAIT` without more bytes (the messages then go on as they are).
    hold_partial: bool,
    partial_expired: bool,
    /// The shard group the next unit goes to.
    group: u32,
    /// The shard map of the session's database while something is distributed there.
    map: Option<Arc<herd_shard::ShardMap>>,
    /// DDL ran in this session's last unit: the database's names are read again before the
    /// next one is planned (it may have changed what a name means).
    names_dirty: bool,
    /// A transaction the client began that no server has seen yet.
    pending_begin: Option<PendingBegin>,
    /// That transaction failed (a statement was refused before any server saw it): as in
    /// PostgreSQL, everything but its end fails with 25P02, and COMMIT rolls it back.
    pending_failed: bool,
    /// An extended-protocol unit closed by Flush (not Sync) was refused with no server
    /// attached: as PostgreSQL after an error, the client's messages are discarded up to its
    /// next Sync, which gets ReadyForQuery (`place_now.rs`).
    skip_to_sync: bool,
    /// The key this client proved at login (for new server connections).
    creds: Option<Arc<crate::pool::Credentials>>,
    /// The other groups' parts of a transaction that spans shard groups: servers idle in
    /// their transaction, ended together at the client's COMMIT or ROLLBACK.
    parked: Vec<Attached>,
    /// Pools this session used (each knows its node).
    pools: Vec<Arc<crate::pool::Pool>>,
    /// `herd_routed_total` series this session bumped, by node and reason.
    routed: Vec<(herd_core::NodeName, &'static str, crate::metrics::Counter)>,
    /// Set at the first attach to a primary: notices another node's promotion while the
    /// session waits on the old one.
    primary_watch: Option<primary_watch::PrimaryWatch>,
    /// What the client was given of the answers of a unit about to run again after a kept
    /// statement was refused as out of date (taken when it is attached).
    rerun: Option<crate::router::track::Given>,
    /// A unit runs again (see `rerun`): until its end it is not run a third time.
    rerunning: bool,
    /// A query string of several statements on different shard groups, run statement by
    /// statement (`script.rs`).
    script: Option<Box<script::Script>>,
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
pub async fn serve_client(tcp: TcpStream, ctx: Arc<ProxyContext>) {
    let mut client = ClientStream::Plain(tcp);
    client.set_nodelay();
    ctx.metrics.inc("herd_client_connections_total", "");
    let mut cbuf = BytesMut::with_capacity(inbuf::MIN_CHUNK);
    let login = loop {
        match Box::pin(startup::startup(&mut client, &mut cbuf, &ctx)).await {
            Ok(startup::Step::Login(login)) => break login,
            Ok(startup::Step::Done) => {
                // A TLS peer (libpq 17's cancel, for one) waits for close_notify.
                client.close_notify();
                return;
            }
            Ok(startup::Step::StartTls(config)) => {
                let ClientStream::Plain(tcp) = client else {
                    return; // startup refuses a second SSLRequest
                };
                let accepted = tokio::time::timeout(
                    TLS_HANDSHAKE,
                    Box::pin(ClientStream::accept_tls(tcp, config)),
                );
                client = match accepted.await {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        ctx.metrics.inc("herd_tls_handshake_failures_total", "");
                        tracing::debug!("TLS handshake with a client failed: {e}");
                        return;
                    }
                    Err(_) => {
                        ctx.metrics.inc("herd_tls_handshake_failures_total", "");
                        tracing::debug!("a client's TLS handshake took over {TLS_HANDSHAKE:?}");
                        return;
                    }
                };
            }
            Err(e) => return fatal(&mut client, &e).await,
        }
    };
    let authenticated =
        match Box::pin(startup::authenticate(&mut client, &mut cbuf, &ctx, &login)).await {
            Ok(bytes) => bytes,
            Err(e) => {
                ctx.metrics.inc("herd_auth_failures_total", "");
                return fatal(&mut client, &e).await;
            }
        };
    if login.replication {
        if let Err(e) = startup::write(&mut client, &authenticated).await {
            tracing::debug!(user = %login.user, "replication connection ended: {e}");
            return;
        }
        if let Err(e) = Box::pin(replication::relay(&mut client, &mut cbuf, &login, &ctx)).await {
            tracing::debug!(user = %login.user, "replication connection ended: {e}");
            fatal(&mut client, &e).await;
        }
        client.close_notify();
        return;
    }
    let cancel = Arc::new(CancelSlot::default()); // registered in greet
    let mut state = SessionState::new(login.consistency.unwrap_or(ctx.config.consistency));
    for (name, stmt) in &login.settings {
        state.record_set(name, Some(stmt.clone()), false);
    }
    let read_only_session = login.read_only;
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
        inbuf: inbuf::ReadChunk::default(),
        out: Outbox::default(),
        sout: Outbox::default(),
        force_primary: false,
        partial_since: None,
        hold_partial: false,
        partial_expired: false,
        group: 0,
        map: None,
        names_dirty: false,
        pending_begin: None,
        pending_failed: false,
        skip_to_sync: false,
        pools: Vec::new(),
        routed: Vec::new(),
        primary_watch: None,
        parked: Vec::new(),
        creds: None,
        rerun: None,
        rerunning: false,
        script: None,
    };
    if let Err(e) = Box::pin(session.greet(read_only_session, authenticated)).await {
        return fatal(&mut session.client, &e).await;
    }
    let result = session.run().await;
    // What the client was owed before the end (a server's own FATAL among it) goes first.
    let pending = std::mem::take(&mut session.out);
    if !pending.is_empty() {
        let _ =
            tokio::time::timeout(FINAL_WRITE, session.client.write_all(pending.pending())).await;
    }
    if let Err(e) = result {
        tracing::debug!(user = %session.user, "session ended: {e}");
        fatal(&mut session.client, &e).await;
    }
    Box::pin(session.finish()).await;
    session.client.close_notify();
}

/// How long a client may take over its TLS handshake (PostgreSQL's `authentication_timeout`
/// default is 60 s for the whole login).
const TLS_HANDSHAKE: std::time::Duration = std::time::Duration::from_secs(30);

/// How long the proxy tries to hand a departing client what it is owed.
const FINAL_WRITE: std::time::Duration = std::time::Duration::from_secs(5);

/// Sends a FATAL ErrorResponse (best effort) before the connection closes.
async fn fatal(client: &mut ClientStream, e: &ProxyError) {
    if matches!(e, ProxyError::Ended(_)) {
        return; // the server told the client itself
    }
    if matches!(e, ProxyError::Io { .. }) && e.to_string().contains("client") {
        return; // the client is gone: nobody to tell
    }
    let mut out = Vec::new();
    let _ = encode::error_response(&mut out, "FATAL", e.sqlstate(), &e.to_string());
    let _ = client.write_all(&out).await;
    client.close_notify();
}

/// Bytes waiting for a socket, written as it takes them.
#[derive(Default)]
struct Outbox {
    /// Appended to at the end.
    buf: Vec<u8>,
    /// Bytes at the start already written.
    sent: usize,
    /// While a query string runs statement by statement (`script.rs`): the bytes before this
    /// were looked at by its filter, and only they are written.
    held: Option<usize>,
}

impl Outbox {
    /// What is still to be written.
    fn pending(&self) -> &[u8] {
        let end = self.held.unwrap_or(self.buf.len());
        self.buf.get(self.sent..end).unwrap_or_default()
    }

    /// Bytes still to be written.
    fn len(&self) -> usize {
        self.buf.len() - self.sent
    }

    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `n` more bytes were written.
    fn advance(&mut self, n: usize) {
        self.sent += n;
        if self.sent >= self.buf.len() {
            self.buf.clear();
            self.held = self.held.map(|_| 0);
            self.sent = 0;
        } else if self.sent >= 64 * 1024 && self.sent * 2 >= self.buf.len() {
            // Keep the buffer from growing without bound under a steady stream.
            self.buf.drain(..self.sent);
            self.held = self.held.map(|h| h.saturating_sub(self.sent));
            self.sent = 0;
        }
    }

    /// Drops what was not written (the socket it was for is gone).
    fn clear(&mut self) {
        self.buf.clear();
        self.held = self.held.map(|_| 0);
        self.sent = 0;
    }

    /// Gives back a large buffer once everything in it is written: one big result must not
    /// keep its memory for the rest of an idle session.
    fn trim(&mut self) {
        if self.buf.len() == self.sent && self.buf.capacity() > inbuf::KEEP_OUTBOX {
            self.buf = Vec::new();
            self.sent = 0;
        }
    }
}

impl Session {
    /// The login succeeded: `authenticated` (its last messages, AuthenticationOk among them),
    /// then the server parameters, the cancel key and ReadyForQuery, in one write. Should
    /// this fail, the client hears the error instead of AuthenticationOk, as from a server
    /// that could not start its backend.
    ///
    /// In transaction pooling the parameters are a server's, with the client's own startup
    /// settings applied (so `application_name`, `client_encoding`, `DateStyle` read as the client
    /// asked), and the cancel key is the proxy's. In session pooling the client's server is
    /// chosen now: the parameters and the key are that server's own.
    async fn greet(&mut self, read_only: bool, authenticated: Vec<u8>) -> Result<(), ProxyError> {
        let mut out = authenticated;
        if self.ctx.config.pool_mode == herd_core::PoolMode::Session {
            let (params, key) = self.attach_session(read_only).await?;
            for (name, value) in &params {
                encode::parameter_status(&mut out, name, value)?;
            }
            encode::backend_key_data(&mut out, key.0, key.1);
        } else {
            let params = self
                .ctx
                .client_params(&self.user, &self.database, &self.state)
                .await?;
            out.extend_from_slice(&params);
            let ((pid, key), cancel) = self.ctx.cancels.register();
            self.cancel = cancel;
            encode::backend_key_data(&mut out, pid, key);
        }
        encode::ready_for_query(&mut out, b'I')?;
        self.write_client(&out).await
    }

    async fn write_client(&mut self, bytes: &[u8]) -> Result<(), ProxyError> {
        if self.script.is_some() {
            // In order with the rest of the string's answers, through its filter.
            self.out.buf.extend_from_slice(bytes);
            return Ok(());
        }
        self.client
            .write_all(bytes)
            .await
            .map_err(|e| ProxyError::io("writing to client", e))
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
