//! A bounds-checked cursor over a message body; every read fails instead of panicking.

use crate::WireError;

/// Reads big-endian integers, byte runs and nul-terminated strings from a borrowed slice.
#[derive(Debug, Clone)]
pub(crate) struct Reader<'a> {
    buf: &'a [u8],
}

impl<'a> Reader<'a> {
    /// Starts reading at the beginning of `buf`.
    pub(crate) fn new(buf: &'a [u8]) -> Self {
        Self { buf }
    }

    /// Bytes not read yet.
    pub(crate) fn remaining(&self) -> usize {
        self.buf.len()
    }

    /// Reads one byte.
    pub(crate) fn u8(&mut self) -> Result<u8, WireError> {
        let (&b, rest) = self.buf.split_first().ok_or(WireError::TooShort)?;
        self.buf = rest;
        Ok(b)
    }

    fn array<const N: usize>(&mut self) -> Result<[u8; N], WireError> {
        let (head, rest) = self
            .buf
            .split_first_chunk::<N>()
            .ok_or(WireError::TooShort)?;
        self.buf = rest;
        Ok(*head)
    }

    /// Reads a big-endian u16.
    pub(crate) fn u16(&mut self) -> Result<u16, WireError> {
        self.array().map(u16::from_be_bytes)
    }

    /// Reads a big-endian i32.
    pub(crate) fn i32(&mut self) -> Result<i32, WireError> {
        self.array().map(i32::from_be_bytes)
    }

    /// Reads a big-endian u32.
    pub(crate) fn u32(&mut self) -> Result<u32, WireError> {
        self.array().map(u32::from_be_bytes)
    }

    /// Reads exactly `n` bytes.
    pub(crate) fn bytes(&mut self, n: usize) -> Result<&'a [u8], WireError> {
        let (head, rest) = self.buf.split_at_checked(n).ok_or(WireError::TooShort)?;
        self.buf = rest;
        Ok(head)
    }

    /// Reads bytes up to the next nul, consuming the nul but not returning it.
    pub(crate) fn cstr_bytes(&mut self) -> Result<&'a [u8], WireError> {
        // A vectorised search for the nul: every Query and Parse passes here (std's
        // word-at-a-time search cost about 100 instructions on pgbench's statement).
        let pos = memchr::memchr(0, self.buf).ok_or(WireError::MissingNul)?;
        let (s, rest) = self
            .buf
            .split_at_checked(pos)
            .ok_or(WireError::MissingNul)?;
        self.buf = rest.get(1..).ok_or(WireError::MissingNul)?;
        Ok(s)
    }

    /// Reads a nul-terminated utf-8 string.
    pub(crate) fn cstr(&mut self) -> Result<&'a str, WireError> {
        core::str::from_utf8(self.cstr_bytes()?).map_err(|_| WireError::InvalidUtf8)
    }

    /// Takes everything not read yet.
    pub(crate) fn rest(&mut self) -> &'a [u8] {
        core::mem::take(&mut self.buf)
    }

    /// Fails if any bytes are left over.
    pub(crate) fn finish(&self) -> Result<(), WireError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(WireError::Malformed("trailing bytes after message"))
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn reads_fields_in_order() {
        let mut r = Reader::new(b"\x01\x00\x02\xff\xff\xff\xfeab\0rest");
        assert_eq!(r.u8().unwrap(), 1);
        assert_eq!(r.u16().unwrap(), 2);
        assert_eq!(r.i32().unwrap(), -2);
        assert_eq!(r.cstr().unwrap(), "ab");
        assert_eq!(r.remaining(), 4);
        assert!(r.finish().is_err());
        assert_eq!(r.rest(), b"rest");
        assert!(r.finish().is_ok());
        assert_eq!(r.u8(), Err(WireError::TooShort));
    }

    #[test]
    fn string_errors() {
        assert_eq!(Reader::new(b"abc").cstr(), Err(WireError::MissingNul));
        assert_eq!(Reader::new(b"").cstr(), Err(WireError::MissingNul));
        assert_eq!(Reader::new(b"\xff\0").cstr(), Err(WireError::InvalidUtf8));
        assert_eq!(Reader::new(b"\0").cstr(), Ok(""));
    }

    #[test]
    fn short_reads() {
        assert_eq!(Reader::new(b"\0\0\0").i32(), Err(WireError::TooShort));
        assert_eq!(Reader::new(b"ab").bytes(3), Err(WireError::TooShort));
        assert_eq!(Reader::new(b"ab").bytes(2), Ok(&b"ab"[..]));
    }
}
