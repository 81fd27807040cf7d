//! Reads that tell tokio a socket is drained when a short read shows it, saving the relay one
//! `recv` that would only answer `EAGAIN` per message.
//!
//! tokio (like mio) keeps a socket "readable" until a read reports `WouldBlock`, so a relay
//! that reads one answer and then waits again wakes at once, tries to read, gets `EAGAIN`, and
//! only then sleeps: two `recv` calls per message where one moved bytes (measured with
//! `perf trace -s` on `pgbench -S` through the proxy: half of the proxy's `recvfrom` calls
//! failed with `EAGAIN`). A read of a stream socket that returns fewer bytes than the buffer
//! had room for emptied the socket's receive queue at that moment (TCP and Unix stream sockets
//! copy until the buffer is full or the queue is empty), so the readiness can be cleared then.
//! Bytes that arrive after it raise a new edge-triggered event, which sets it again; tokio
//! only clears readiness that no newer event has set since it was observed, so no wake-up is
//! lost.

use std::io;

use bytes::BytesMut;
use tokio::io::Interest;
use tokio::net::{TcpStream, UnixStream};

/// A tokio socket with readiness-style reads.
pub(crate) trait ReadySocket {
    /// Runs `f` if the socket is readable; clears the readiness when `f` says `WouldBlock`.
    fn try_io_read(&self, f: &mut dyn FnMut() -> io::Result<usize>) -> io::Result<usize>;
    /// Appends what can be read now to `buf`.
    fn try_read_into(&self, buf: &mut BytesMut) -> io::Result<usize>;
}

impl ReadySocket for TcpStream {
    fn try_io_read(&self, f: &mut dyn FnMut() -> io::Result<usize>) -> io::Result<usize> {
        self.try_io(Interest::READABLE, f)
    }
    fn try_read_into(&self, buf: &mut BytesMut) -> io::Result<usize> {
        self.try_read_buf(buf)
    }
}

impl ReadySocket for UnixStream {
    fn try_io_read(&self, f: &mut dyn FnMut() -> io::Result<usize>) -> io::Result<usize> {
        self.try_io(Interest::READABLE, f)
    }
    fn try_read_into(&self, buf: &mut BytesMut) -> io::Result<usize> {
        self.try_read_buf(buf)
    }
}

/// Like `try_read_buf` (`Ok(0)` at the end of the stream, `WouldBlock` when nothing is there),
/// but a short read also marks the socket not readable, so the next wait sleeps until new
/// bytes arrive instead of returning at once for a read that would find nothing.
pub(crate) fn read_drained(s: &impl ReadySocket, buf: &mut BytesMut) -> io::Result<usize> {
    let mut got = None;
    let result = s.try_io_read(&mut || {
        let room = buf.capacity() - buf.len();
        let n = s.try_read_into(buf)?;
        got = Some(n);
        if n > 0 && n < room {
            // Not an error for the caller (the bytes are in `buf`): it only clears readiness.
            Err(io::ErrorKind::WouldBlock.into())
        } else {
            Ok(n)
        }
    });
    match (result, got) {
        (Ok(n), _) => Ok(n),
        (Err(e), Some(n)) if e.kind() == io::ErrorKind::WouldBlock => Ok(n),
        (Err(e), _) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;

    /// After a short read the socket no longer reports readable until more bytes arrive; a
    /// plain `try_read_buf` leaves it readable (the wasted wake-up this module removes).
    #[tokio::test]
    async fn short_read_clears_readiness_and_new_bytes_set_it() {
        let (a, mut b) = UnixStream::pair().expect("socket pair");
        b.write_all(b"hello").await.expect("write");
        a.readable().await.expect("readable");
        let mut buf = BytesMut::with_capacity(1024);
        assert_eq!(read_drained(&a, &mut buf).expect("read"), 5);
        assert_eq!(&buf[..], b"hello");
        let waited = tokio::time::timeout(Duration::from_millis(50), a.readable()).await;
        assert!(
            waited.is_err(),
            "readiness should be cleared after a short read"
        );

        b.write_all(b"more").await.expect("write");
        tokio::time::timeout(Duration::from_secs(5), a.readable())
            .await
            .expect("new bytes make the socket readable again")
            .expect("readable");
        assert_eq!(read_drained(&a, &mut buf).expect("read"), 4);
        assert_eq!(&buf[..], b"hellomore");

        // The end of the stream is still reported as Ok(0).
        drop(b);
        a.readable().await.expect("readable at eof");
        assert_eq!(read_drained(&a, &mut buf).expect("eof"), 0);
    }

    /// A read that fills the buffer leaves the socket readable: more may be waiting.
    #[tokio::test]
    async fn full_read_keeps_readiness() {
        let (a, mut b) = UnixStream::pair().expect("socket pair");
        b.write_all(&[7u8; 100]).await.expect("write");
        a.readable().await.expect("readable");
        let mut buf = BytesMut::with_capacity(10);
        let room = buf.capacity();
        assert_eq!(read_drained(&a, &mut buf).expect("read"), room);
        tokio::time::timeout(Duration::from_millis(500), a.readable())
            .await
            .expect("still readable")
            .expect("readable");
    }

    /// Nothing to read: WouldBlock, as `try_read_buf`.
    #[tokio::test]
    async fn nothing_to_read_would_block() {
        let (a, _b) = UnixStream::pair().expect("socket pair");
        let mut buf = BytesMut::with_capacity(64);
        let e = read_drained(&a, &mut buf).expect_err("nothing there");
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
    }
}
