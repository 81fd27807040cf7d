//! Logical replication connections (`replication=database`) through the endpoint: what a
//! logical copy's subscription uses. The connection is relayed, unpooled, to the shard group's
//! current primary, so a subscription follows failovers without being changed — and the relay
//! holds back what the primary streams until it is safe from a failover.
//!
//! Why hold back: on PostgreSQL 15 a logical walsender sends a transaction as soon as the
//! primary has flushed it locally, before any standby has it (PostgreSQL 17's
//! `synchronized_standby_slots` fixes this). Were the primary to die then, the target would
//! keep a transaction the promoted replica never had, and its position would make the new
//! primary skip the new timeline's first transactions. So each `XLogData` message (whose start
//! position, for a commit, is the end of the commit record) and each keepalive (whose position
//! the subscriber would confirm) waits in order until the WAL up to it is replayed on as many
//! replicas as hold every acknowledged commit ([`crate::topology::TopologyView::durable_lsn`]). The proxy polls
//! replicas every 100 ms, so copies trail by about that much more.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::BytesMut;
use herd_core::Lsn;

use crate::client::ClientStream;
use crate::server::ServerConn;
use crate::session::startup::{read_more, Login};
use crate::{ProxyContext, ProxyError};

/// How long connecting (and logging in) to the primary may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How often held messages are looked at again while the replicas catch up.
const RECHECK: Duration = Duration::from_millis(20);

/// Most bytes held back per connection: beyond it the relay stops reading from the primary, so
/// the walsender waits (TCP backpressure) instead of the proxy's memory growing while the
/// replicas are behind or down.
const MAX_HELD_BYTES: usize = 32 << 20;

/// The WAL position a server message, received while streaming (after CopyBothResponse),
/// must be durable up to before the client may see it; `None` for messages that carry none
/// (they keep their place in the queue all the same).
pub fn gated_position(tag: u8, body: &[u8]) -> Option<Lsn> {
    // CopyData carrying XLogData ('w': start, end, time, data) or a keepalive ('k': end,
    // time, reply requested): both start with a position after their kind byte.
    if tag != b'd' || !matches!(body.first(), Some(b'w' | b'k')) {
        return None;
    }
    let bytes: [u8; 8] = body.get(1..9)?.try_into().ok()?;
    Some(Lsn(u64::from_be_bytes(bytes)))
}

/// Messages from the server, in order, each with the position it waits for.
#[derive(Default)]
pub struct Held {
    queue: VecDeque<(Option<Lsn>, Vec<u8>)>,
    /// Bytes in `queue`.
    bytes: usize,
    /// Between CopyBothResponse and the end of streaming: CopyData is WAL. (A table's initial
    /// copy is CopyOut, whose CopyData are rows and may start with any byte.)
    streaming: bool,
}

impl Held {
    /// Queues one whole message (tag, length, body).
    pub fn push(&mut self, tag: u8, body: &[u8]) {
        let mut frame = Vec::with_capacity(body.len() + 5);
        frame.push(tag);
        frame.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
        frame.extend_from_slice(body);
        match tag {
            b'W' => self.streaming = true,
            b'H' | b'c' | b'C' | b'Z' | b'E' => self.streaming = false,
            _ => {}
        }
        let at = if self.streaming {
            gated_position(tag, body)
        } else {
            None
        };
        self.bytes += frame.len();
        self.queue.push_back((at, frame));
    }

    /// Appends to `out` the messages at the front that `durable` allows (`None`: all).
    pub fn release(&mut self, durable: Option<Lsn>, out: &mut Vec<u8>) {
        while let Some((at, _)) = self.queue.front() {
            let ready = match (at, durable) {
                (Some(at), Some(safe)) => *at <= safe,
                _ => true,
            };
            if !ready {
                break;
            }
            if let Some((_, frame)) = self.queue.pop_front() {
                self.bytes -= frame.len();
                out.extend_from_slice(&frame);
            }
        }
    }

    /// Whether anything waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether as much is held as a connection may hold.
    pub fn is_full(&self) -> bool {
        self.bytes >= MAX_HELD_BYTES
    }
}

/// Relays an authenticated replication connection to its group's primary until either side
/// ends it.
pub async fn relay(
    client: &mut ClientStream,
    cbuf: &mut BytesMut,
    login: &Login,
    ctx: &ProxyContext,
) -> Result<(), ProxyError> {
    let group = login.group.unwrap_or(0);
    if group >= ctx.groups() {
        return Err(ProxyError::Server {
            code: "22023".into(),
            message: format!(
                "there is no shard group {group}: the cluster has {}",
                ctx.groups()
            ),
        });
    }
    let primary = ctx.current_primary_of(group).await?;
    let creds = ctx.users.credentials(&login.user).ok_or_else(|| {
        ProxyError::Unavailable(format!("no credentials for {} after login", login.user))
    })?;
    let mut params = vec![
        ("user", login.user.as_str()),
        ("database", login.database.as_str()),
        ("replication", "database"),
    ];
    for (name, stmt) in &login.settings {
        // The subscriber's own startup settings (application_name names its walsender).
        if name == "application_name" {
            if let Some(v) = stmt
                .rsplit_once("= '")
                .map(|(_, v)| v.trim_end_matches('\''))
            {
                params.push(("application_name", v));
            }
        }
    }
    let mut server = ServerConn::connect_with(
        &primary,
        &params,
        &creds.key,
        &creds.verifier,
        CONNECT_TIMEOUT,
        ctx.pools.tls(),
    )
    .await?;
    ctx.metrics.inc("herd_replication_connections_total", "");
    tracing::info!(user = %login.user, node = %primary.name, "relaying a logical replication connection");
    // The server's login answers, as the client would have had them.
    let mut out = Vec::new();
    for (name, value) in &server.params {
        herd_wire::encode::parameter_status(&mut out, name, value)?;
    }
    herd_wire::encode::backend_key_data(&mut out, server.backend_key.0, server.backend_key.1);
    herd_wire::encode::ready_for_query(&mut out, b'I')?;
    write(client, &out).await?;
    if !cbuf.is_empty() {
        server.send(cbuf).await?;
        cbuf.clear();
    }
    let mut views = ctx.watch_view(group);
    let mut held = Held::default();
    loop {
        tokio::select! {
            more = read_more(client, cbuf) => {
                if !more? {
                    return Ok(());
                }
                server.send(cbuf).await?;
                cbuf.clear();
            }
            message = server.next_message(), if !held.is_full() => {
                let (tag, body) = message?;
                held.push(tag, &body);
            }
            _ = views.changed() => {}
            _ = tokio::time::sleep(RECHECK), if !held.is_empty() => {}
        }
        // The watched view itself: no lock per message (`view_of` also applies avoided nodes,
        // which only matter for routing queries).
        let durable = views.borrow().durable_lsn();
        out.clear();
        held.release(durable, &mut out);
        if !out.is_empty() {
            write(client, &out).await?;
        }
    }
}

async fn write(client: &mut ClientStream, bytes: &[u8]) -> Result<(), ProxyError> {
    client
        .write_all(bytes)
        .await
        .map_err(|e| ProxyError::io("writing to a replication client", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xlog(kind: u8, at: u64) -> Vec<u8> {
        let mut body = vec![kind];
        body.extend_from_slice(&at.to_be_bytes());
        body.extend_from_slice(&[0; 16]);
        body
    }

    #[test]
    fn positions_of_xlogdata_and_keepalives() {
        assert_eq!(gated_position(b'd', &xlog(b'w', 77)), Some(Lsn(77)));
        assert_eq!(gated_position(b'd', &xlog(b'k', 78)), Some(Lsn(78)));
        assert_eq!(
            gated_position(b'd', b"w123"),
            None,
            "too short to carry one"
        );
        assert_eq!(gated_position(b'T', &xlog(b'w', 77)), None);
        assert_eq!(gated_position(b'd', &xlog(b'r', 77)), None);
    }

    #[test]
    fn copy_rows_are_not_wal() {
        let mut held = Held::default();
        held.push(b'H', &[0, 0, 0]);
        held.push(b'd', &xlog(b'w', u64::MAX));
        let mut out = Vec::new();
        held.release(Some(Lsn(1)), &mut out);
        assert!(held.is_empty(), "a COPY row starting with 'w' is not held");
    }

    #[test]
    fn held_in_order_until_durable() {
        let mut held = Held::default();
        held.push(b'W', &[0, 0, 0]);
        held.push(b'd', &xlog(b'w', 100));
        held.push(b'd', &xlog(b'w', 300));
        held.push(b'd', &xlog(b'k', 200));
        let mut out = Vec::new();
        held.release(Some(Lsn(50)), &mut out);
        assert_eq!(out.len(), 8, "only the unpositioned first message");
        out.clear();
        held.release(Some(Lsn(250)), &mut out);
        assert_eq!(
            out.len(),
            30,
            "up to the message at 100; the one at 300 holds the keepalive back"
        );
        out.clear();
        held.release(Some(Lsn(300)), &mut out);
        assert_eq!(out.len(), 60);
        assert!(held.is_empty());
        held.push(b'd', &xlog(b'w', 9_999));
        out.clear();
        held.release(None, &mut out);
        assert!(held.is_empty(), "no replicas: nothing to wait for");
        assert_eq!(held.bytes, 0);
        let big = vec![0u8; MAX_HELD_BYTES];
        held.push(b'd', &big);
        assert!(
            held.is_full(),
            "a full queue stops the reads from the primary"
        );
        assert_eq!(&out[..1], b"d");
        assert_eq!(
            u32::from_be_bytes([out[1], out[2], out[3], out[4]]) as usize,
            out.len() - 1
        );
    }
}
