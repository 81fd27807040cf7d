//! A client's connection, plain or TLS, with the readiness-style calls the session's relay is
//! built on (`readable`, `try_read_buf`, `writable`, `try_write`); the TLS side is
//! [`crate::tls_stream::TlsSocket`].

use std::io;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use crate::tls_stream::TlsSocket;

/// A client connection.
#[derive(Debug)]
pub enum ClientStream {
    /// No encryption.
    Plain(TcpStream),
    /// TLS, after a completed handshake.
    Tls(Box<TlsSocket>),
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

impl ClientStream {
    /// Sets `TCP_NODELAY` (the protocol is request/response: no Nagle delay).
    pub fn set_nodelay(&self) {
        let tcp = match self {
            ClientStream::Plain(s) => s,
            ClientStream::Tls(t) => t.tcp(),
        };
        let _ = tcp.set_nodelay(true);
    }

    /// The connection is encrypted.
    pub fn is_tls(&self) -> bool {
        matches!(self, ClientStream::Tls(_))
    }

    /// Waits until a `try_read_buf` may make progress.
    pub async fn readable(&self) -> io::Result<()> {
        match self {
            ClientStream::Plain(s) => s.readable().await,
            ClientStream::Tls(t) => t.readable().await,
        }
    }

    /// Waits until a `try_write` may make progress.
    pub async fn writable(&self) -> io::Result<()> {
        match self {
            ClientStream::Plain(s) => s.writable().await,
            ClientStream::Tls(t) => t.tcp().writable().await,
        }
    }

    /// [`ClientStream::readable`] as a poll: the socket keeps one waker per direction, so a
    /// wait costs no waiter of its own (the session's loop waits this way on every message).
    pub fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            ClientStream::Plain(s) => s.poll_read_ready(cx),
            ClientStream::Tls(t) => t.poll_readable(cx),
        }
    }

    /// [`ClientStream::writable`] as a poll.
    pub fn poll_writable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            ClientStream::Plain(s) => s.poll_write_ready(cx),
            ClientStream::Tls(t) => t.poll_writable(cx),
        }
    }

    /// Encrypted bytes are waiting for the socket.
    pub fn has_backlog(&self) -> bool {
        match self {
            ClientStream::Plain(_) => false,
            ClientStream::Tls(t) => t.has_backlog(),
        }
    }

    /// Appends what can be read now to `buf`: `Ok(0)` at the end of the stream, `WouldBlock`
    /// when nothing is there.
    pub fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        match self {
            ClientStream::Plain(s) => crate::drained::read_drained(s, buf),
            ClientStream::Tls(t) => t.try_read_buf(buf),
        }
    }

    /// Writes some of `data` now (for TLS: flushes the backlog first, then takes up to
    /// 64 KiB). With empty `data` it only flushes.
    pub fn try_write(&mut self, data: &[u8]) -> io::Result<usize> {
        match self {
            ClientStream::Plain(s) => s.try_write(data),
            ClientStream::Tls(t) => t.try_write(data),
        }
    }

    /// Reads at least one byte (or the end: `Ok(0)`).
    pub async fn read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        loop {
            self.readable().await?;
            match self.try_read_buf(buf) {
                Err(e) if would_block(&e) => continue,
                other => return other,
            }
        }
    }

    /// Writes all of `data` and the backlog.
    pub async fn write_all(&mut self, data: &[u8]) -> io::Result<()> {
        match self {
            ClientStream::Plain(s) => s.write_all(data).await,
            ClientStream::Tls(t) => t.write_all(data).await,
        }
    }

    /// Ends TLS with a close_notify (best effort: the client may be gone).
    pub fn close_notify(&mut self) {
        if let ClientStream::Tls(t) = self {
            t.close_notify();
        }
    }

    /// Runs the server side of a TLS handshake on `tcp` (after the proxy answered `S` to an
    /// SSLRequest).
    pub async fn accept_tls(
        tcp: TcpStream,
        config: Arc<rustls::ServerConfig>,
    ) -> io::Result<ClientStream> {
        let conn = rustls::ServerConnection::new(config).map_err(io::Error::other)?;
        let t = TlsSocket::handshake(tcp, rustls::Connection::Server(conn)).await?;
        Ok(ClientStream::Tls(Box::new(t)))
    }
}
