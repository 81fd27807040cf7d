//! A TLS connection over a tokio TCP socket, driven without blocking: the readiness-style
//! calls the proxy's relay is built on (`poll_readable`, `try_read_buf`, `poll_writable`,
//! `try_write`), for the server side (clients' connections) and the client side (the proxy's
//! connections to the servers) alike.
//!
//! rustls is a synchronous state machine, which fits that style directly: records are pulled
//! from the socket with non-blocking reads, decrypted into the caller's buffer, and encrypted
//! output is pushed with non-blocking writes. What rustls could not write yet is the stream's
//! *backlog*: the relay keeps waiting for the socket to be writable while there is one, even
//! when its own outbox is empty.

use std::io::{self, Read, Write};
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::net::TcpStream;

/// Plaintext accepted per `try_write` (rustls encrypts it at once).
const WRITE_CHUNK: usize = 64 * 1024;

/// A TLS connection (either side) after its handshake.
#[derive(Debug)]
pub struct TlsSocket {
    tcp: TcpStream,
    conn: rustls::Connection,
    /// rustls may hold decrypted bytes the caller has not taken (right after the handshake).
    plaintext_pending: bool,
    /// The peer closed its side of the socket.
    eof: bool,
}

/// The socket as `std::io::Read`, never blocking.
struct SockRead<'a>(&'a TcpStream);

impl Read for SockRead<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}

/// The socket as `std::io::Write`, never blocking.
struct SockWrite<'a>(&'a TcpStream);

impl Write for SockWrite<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.try_write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn would_block(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::WouldBlock
}

impl TlsSocket {
    /// Runs the handshake of `conn` (a rustls client or server) over `tcp`; a peer whose
    /// certificate does not verify, or that sends no TLS, is an error naming rustls's reason.
    pub async fn handshake(tcp: TcpStream, conn: rustls::Connection) -> io::Result<TlsSocket> {
        let mut t = TlsSocket {
            tcp,
            conn,
            plaintext_pending: true,
            eof: false,
        };
        loop {
            while t.conn.wants_write() {
                match t.flush() {
                    Ok(()) => {}
                    Err(e) if would_block(&e) => t.tcp.writable().await?,
                    Err(e) => return Err(e),
                }
            }
            if !t.conn.is_handshaking() {
                return Ok(t);
            }
            t.tcp.readable().await?;
            match t.conn.read_tls(&mut SockRead(&t.tcp)) {
                Ok(0) => {
                    return Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the peer closed the connection during the TLS handshake",
                    ))
                }
                Ok(_) => t.process()?,
                Err(e) if would_block(&e) => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// The socket under the TLS layer.
    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    /// Ready once a `try_read_buf` may make progress.
    pub fn poll_readable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.plaintext_pending || self.eof {
            return Poll::Ready(Ok(()));
        }
        self.tcp.poll_read_ready(cx)
    }

    /// Ready once a `try_write` may make progress.
    pub fn poll_writable(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.tcp.poll_write_ready(cx)
    }

    /// Waits until a `try_read_buf` may make progress.
    pub async fn readable(&self) -> io::Result<()> {
        if self.plaintext_pending || self.eof {
            return Ok(());
        }
        self.tcp.readable().await
    }

    /// Encrypted bytes are waiting for the socket.
    pub fn has_backlog(&self) -> bool {
        self.conn.wants_write()
    }

    /// Ends TLS with a close_notify (best effort: the peer may be gone).
    pub fn close_notify(&mut self) {
        self.conn.send_close_notify();
        let _ = self.flush();
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
    pub async fn write_all(&mut self, mut data: &[u8]) -> io::Result<()> {
        while !data.is_empty() || self.has_backlog() {
            match self.try_write(data) {
                Ok(n) => data = data.get(n..).unwrap_or_default(),
                Err(e) if would_block(&e) => self.tcp.writable().await?,
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Decrypts what was received; on a TLS error the alert rustls queued is sent (best
    /// effort) so the client learns why.
    fn process(&mut self) -> io::Result<()> {
        match self.conn.process_new_packets() {
            Ok(_) => Ok(()),
            Err(e) => {
                let _ = self.flush();
                Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("TLS: {e}"),
                ))
            }
        }
    }

    /// Writes encrypted output until none is left or the socket is full (`WouldBlock`).
    fn flush(&mut self) -> io::Result<()> {
        while self.conn.wants_write() {
            self.conn.write_tls(&mut SockWrite(&self.tcp))?;
        }
        Ok(())
    }

    /// Moves all decrypted bytes rustls holds into `buf`; `Ok(None)` when it holds none.
    fn take_plaintext(&mut self, buf: &mut BytesMut) -> io::Result<Option<usize>> {
        let mut total = 0;
        loop {
            let start = buf.len();
            buf.resize(start + 16 * 1024, 0);
            let read = self.conn.reader().read(&mut buf[start..]);
            let n = *read.as_ref().unwrap_or(&0);
            buf.truncate(start + n);
            match read {
                Ok(0) => return Ok(Some(total)), // close_notify: the end (after what came before)
                Ok(n) => total += n,
                Err(e) if would_block(&e) => {
                    return Ok((total > 0).then_some(total));
                }
                // The peer closed the socket without close_notify: treat as the end.
                Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(Some(total)),
                Err(e) => return Err(e),
            }
        }
    }

    /// Appends what can be read now to `buf`: `Ok(0)` at the end of the stream, `WouldBlock`
    /// when nothing is there.
    pub fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        loop {
            if let Some(n) = self.take_plaintext(buf)? {
                return Ok(n);
            }
            self.plaintext_pending = false;
            if self.eof {
                return Ok(0);
            }
            match self.conn.read_tls(&mut SockRead(&self.tcp)) {
                Ok(0) => self.eof = true,
                Ok(_) => {}
                Err(e) => return Err(e), // WouldBlock included: wait for the socket
            }
            self.process()?;
            // Post-handshake messages (key updates) may want an answer.
            match self.flush() {
                Err(e) if !would_block(&e) => return Err(e),
                _ => {}
            }
        }
    }

    /// Writes some of `data` now: flushes the backlog first, then takes up to 64 KiB. With
    /// empty `data` it only flushes.
    pub fn try_write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.flush()?; // WouldBlock: the backlog first
        if data.is_empty() {
            return Ok(0);
        }
        let chunk = data.get(..WRITE_CHUNK).unwrap_or(data);
        let n = self.conn.writer().write(chunk)?;
        match self.flush() {
            Err(e) if !would_block(&e) => Err(e),
            _ => Ok(n), // what is left is the backlog
        }
    }
}
