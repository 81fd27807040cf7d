//! How much room the session gives each read of its client: little while messages are small,
//! so an idle client holds 2 KiB rather than 16 (memory per client with many clients), and
//! doubling up to 64 KiB while reads fill all they were given (a bulk COPY, a big batch), so a
//! stream still moves in few system calls.

use bytes::BytesMut;

/// The room a read starts with, and what a client's buffer is trimmed back to when idle.
pub(super) const MIN_CHUNK: usize = 2 * 1024;
/// The most room one read is given.
const MAX_CHUNK: usize = 64 * 1024;
/// An outbox larger than this is given back once written (see `Outbox::trim`).
pub(super) const KEEP_OUTBOX: usize = 64 * 1024;

/// The room the client's next read gets.
#[derive(Debug)]
pub(super) struct ReadChunk {
    chunk: usize,
}

impl Default for ReadChunk {
    fn default() -> ReadChunk {
        ReadChunk { chunk: MIN_CHUNK }
    }
}

impl ReadChunk {
    /// Makes sure `buf` has room for a read (at least a quarter of the current chunk); the
    /// room it has. `reserve` reuses the buffer's allocation once the units cut from it are
    /// gone, so steady small traffic allocates nothing.
    pub(super) fn make_room(&self, buf: &mut BytesMut) -> usize {
        if buf.capacity() - buf.len() < self.chunk / 4 {
            buf.reserve(self.chunk);
        }
        buf.capacity() - buf.len()
    }

    /// A read of `n` bytes into `room`: a read that filled it suggests more is coming, so the
    /// next one gets twice as much.
    pub(super) fn read(&mut self, n: usize, room: usize) {
        if n >= room {
            self.chunk = (self.chunk * 2).min(MAX_CHUNK);
        }
    }

    /// The client is idle with nothing buffered: give back a buffer grown past the small size.
    pub(super) fn trim(&mut self, buf: &mut BytesMut) {
        if buf.is_empty() && buf.capacity() > 2 * MIN_CHUNK {
            *buf = BytesMut::with_capacity(MIN_CHUNK);
        }
        self.chunk = MIN_CHUNK;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_reads_keep_a_small_buffer() {
        let mut chunk = ReadChunk::default();
        let mut buf = BytesMut::new();
        for _ in 0..1000 {
            let room = chunk.make_room(&mut buf);
            assert!(room >= MIN_CHUNK / 4);
            buf.extend_from_slice(&[1u8; 60]);
            chunk.read(60, room);
            drop(buf.split_to(60).freeze());
        }
        assert!(buf.capacity() <= 2 * MIN_CHUNK, "{}", buf.capacity());
    }

    #[test]
    fn full_reads_grow_the_chunk_and_idle_trims_it() {
        let mut chunk = ReadChunk::default();
        let mut buf = BytesMut::new();
        let mut rooms = Vec::new();
        for _ in 0..8 {
            let room = chunk.make_room(&mut buf);
            rooms.push(room);
            buf.extend_from_slice(&vec![0u8; room]);
            chunk.read(room, room);
            // The session cuts what it read off the front, as messages.
            drop(buf.split_to(room).freeze());
        }
        assert!(rooms.last().copied().unwrap_or(0) >= MAX_CHUNK, "{rooms:?}");
        assert!(rooms.windows(2).all(|w| w[0] <= w[1]), "{rooms:?}");
        chunk.trim(&mut buf);
        assert!(buf.capacity() <= 2 * MIN_CHUNK);
        assert_eq!(chunk.chunk, MIN_CHUNK);
    }

    #[test]
    fn trim_keeps_buffered_bytes() {
        let mut chunk = ReadChunk::default();
        let mut buf = BytesMut::with_capacity(MAX_CHUNK);
        buf.extend_from_slice(b"Q\0\0\0");
        chunk.trim(&mut buf);
        assert_eq!(&buf[..], b"Q\0\0\0");
    }
}
