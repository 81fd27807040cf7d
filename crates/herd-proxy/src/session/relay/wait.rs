//! The session loop's wait: until a socket with work can move (the client's or the server's,
//! each direction only while the outbox it feeds is below its bound), a batch's start has
//! waited long enough for its end, or the primary the session waits on was failed over.

use std::future::Future;
use std::task::Poll;

use bytes::Bytes;

use super::super::attach::unit_len;
use super::super::primary_watch::PrimaryWatch;
use super::super::Session;
use super::{complete_frames_len, IN_LIMIT, OUT_LIMIT, PARTIAL_WAIT};
use crate::ProxyError;

/// A socket that became ready, or failed.
enum Ready {
    ClientRead,
    ClientWrite,
    ServerRead,
    ServerWrite,
    ClientFailed(ProxyError),
    ServerFailed(ProxyError),
    /// The start of a batch waited long enough for its end.
    PartialUnit,
}

impl Session {
    /// Waits until a socket with work can move, and moves it. `Ok(false)`: the client left.
    pub(super) async fn wait_io(&mut self) -> Result<bool, ProxyError> {
        let max = self.ctx.config.max_message_bytes as usize;
        let next_complete = match &self.attached {
            None => unit_len(&self.cbuf, max)?.is_some(),
            Some(_) => herd_wire::split_frame(&self.cbuf, max)?.is_some(),
        };
        // The client is read while little is waiting (so its departure is noticed), and
        // always while what is waiting is incomplete.
        // Not while a query string runs statement by statement: what follows it waits.
        let read_client = (self.cbuf.len() < IN_LIMIT || !next_complete) && self.script.is_none();
        if self.attached.is_none() && self.cbuf.is_empty() && self.out.is_empty() {
            // Nothing in flight: an idle client keeps small buffers, whatever it sent or
            // received before (memory per idle client).
            self.inbuf.trim(&mut self.cbuf);
            self.out.trim();
        }
        let write_client = !self.out.is_empty() || self.client.has_backlog();
        let attached = self.attached.is_some();
        let read_server = attached && self.out.len() < OUT_LIMIT;
        // Also while TLS holds encrypted bytes the socket did not take yet (the outbox may be
        // empty by then): they are the end of what was sent.
        let write_server = self
            .attached
            .as_ref()
            .is_some_and(|a| !self.sout.is_empty() || a.lease.conn.has_backlog());
        // Detached with complete messages but no end of their batch yet: a deadline for them.
        let partial =
            (!attached && !next_complete && herd_wire::split_frame(&self.cbuf, max)?.is_some())
                || self.hold_partial;
        let partial_deadline = partial.then(|| {
            let since = *self
                .partial_since
                .get_or_insert_with(std::time::Instant::now);
            tokio::time::Instant::from_std(since + PARTIAL_WAIT)
        });
        // Attached to a primary: watch for another node's promotion.
        let on_primary = self
            .attached
            .as_ref()
            .and_then(|a| a.replica.is_none().then_some(a.group));
        if let Some(group) = on_primary {
            if self
                .primary_watch
                .as_ref()
                .is_none_or(|w| w.group() != group)
            {
                self.primary_watch = Some(PrimaryWatch::new(&self.ctx, group));
            }
        }
        let ready = {
            let client = &self.client;
            let ctx = &*self.ctx;
            let conn = self.attached.as_ref().map(|a| &*a.lease.conn);
            let mut primary_watch = on_primary.and(self.primary_watch.as_mut());
            let mut partial = std::pin::pin!(sleep_until(partial_deadline));
            // Polled in this order: writes first, then the server's answers, then new client
            // bytes (every direction is bounded by its outbox, so none starves the others).
            // Sockets are polled for readiness directly rather than through `select!` over
            // readiness futures, each of which would queue and unqueue a waiter per wait.
            std::future::poll_fn(|cx| {
                if write_client {
                    if let Poll::Ready(r) = client.poll_writable(cx) {
                        return Poll::Ready(match r {
                            Ok(()) => Ready::ClientWrite,
                            Err(e) => Ready::ClientFailed(ProxyError::io("writing to client", e)),
                        });
                    }
                }
                if let Some(c) = conn {
                    if write_server {
                        if let Poll::Ready(r) = c.poll_writable(cx) {
                            return Poll::Ready(match r {
                                Ok(()) => Ready::ServerWrite,
                                Err(e) => Ready::ServerFailed(e),
                            });
                        }
                    }
                    if read_server {
                        if let Poll::Ready(r) = c.poll_readable(cx) {
                            return Poll::Ready(match r {
                                Ok(()) => Ready::ServerRead,
                                Err(e) => Ready::ServerFailed(e),
                            });
                        }
                    }
                }
                if read_client {
                    if let Poll::Ready(r) = client.poll_readable(cx) {
                        return Poll::Ready(match r {
                            Ok(()) => Ready::ClientRead,
                            Err(e) => Ready::ClientFailed(ProxyError::io("reading from client", e)),
                        });
                    }
                }
                if partial_deadline.is_some() && partial.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Ready::PartialUnit);
                }
                match (primary_watch.as_deref_mut(), conn) {
                    (Some(w), Some(c)) => w
                        .poll_moved(cx, ctx, &c.endpoint.name)
                        .map(|()| Ready::ServerFailed(no_longer_primary(c))),
                    _ => Poll::Pending,
                }
            })
            .await
        };
        match ready {
            Ready::ClientRead => {
                let room = self.inbuf.make_room(&mut self.cbuf);
                match self.client.try_read_buf(&mut self.cbuf) {
                    Ok(0) => return Ok(false),
                    Ok(n) => {
                        self.inbuf.read(n, room);
                        self.partial_since = None; // a batch waits from the last bytes on
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(ProxyError::io("reading from client", e)),
                }
            }
            Ready::ClientWrite => match self.write_client_now() {
                Ok(n) => self.out.advance(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(ProxyError::io("writing to client", e)),
            },
            Ready::ServerRead => {
                let filled = match self.attached.as_mut() {
                    Some(att) => att.lease.conn.try_fill().map(|_| ()),
                    None => Ok(()),
                };
                if let Err(e) = filled {
                    Box::pin(self.server_failed(e)).await?;
                }
            }
            Ready::ServerWrite => {
                let sent = match self.attached.as_mut() {
                    Some(att) => att.lease.conn.try_send(self.sout.pending()),
                    None => Ok(0),
                };
                match sent {
                    Ok(n) => self.sout.advance(n),
                    Err(e) => Box::pin(self.server_failed(e)).await?,
                }
            }
            Ready::PartialUnit if self.attached.is_some() => {
                // Held inside a transaction: the messages go on as they are.
                self.partial_expired = true;
            }
            Ready::PartialUnit => {
                if let Some(n) = complete_frames_len(&self.cbuf, max)? {
                    let unit: Bytes = self.cbuf.split_to(n).freeze();
                    self.force_primary = true;
                    if !Box::pin(self.start_unit(unit)).await? {
                        return Ok(false);
                    }
                }
            }
            Ready::ClientFailed(e) => return Err(e),
            Ready::ServerFailed(e) => Box::pin(self.server_failed(e)).await?,
        }
        Ok(true)
    }
}

/// How a session learns that the primary it waited on was failed over (an isolated old primary
/// goes silent rather than failing).
fn no_longer_primary(conn: &crate::server::ServerConn) -> ProxyError {
    ProxyError::io(
        format!(
            "{} is no longer the primary (another node was promoted)",
            conn.endpoint.name
        ),
        std::io::Error::from(std::io::ErrorKind::ConnectionAborted),
    )
}

/// Sleeps until `deadline` (never, without one).
async fn sleep_until(deadline: Option<tokio::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}
