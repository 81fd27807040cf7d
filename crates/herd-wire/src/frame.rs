//! Splitting a byte stream into tagged messages (`tag`, i32 length, body).

use crate::WireError;

/// Bytes before the body of a tagged message: the tag and the i32 length.
pub const HEADER_LEN: usize = 5;

/// PostgreSQL's own cap on a single message (`PQ_LARGE_MESSAGE_LIMIT`, 1 GiB - 1);
/// a sensible `max_len` when no tighter limit is wanted.
pub const DEFAULT_MAX_LEN: usize = 0x3fff_ffff;

/// One complete tagged message, borrowed from the input buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<'a> {
    /// The message type byte, e.g. `b'Q'`.
    pub tag: u8,
    /// The message body: everything after the length field.
    pub body: &'a [u8],
    /// The whole message as it appeared on the wire (tag, length, body),
    /// ready to be forwarded unchanged.
    pub raw: &'a [u8],
}

/// Splits the first tagged message off `buf`.
///
/// Returns `Ok(None)` when `buf` does not yet hold a complete message, and otherwise the
/// frame plus the number of bytes it occupies (always `frame.raw.len()`).
/// The length field (which counts itself but not the tag) must be at least 4 and at most
/// `max_len`; it is checked as soon as the 5 header bytes are present, before the body arrives.
pub fn split_frame(buf: &[u8], max_len: usize) -> Result<Option<(Frame<'_>, usize)>, WireError> {
    let Some((&tag, rest)) = buf.split_first() else {
        return Ok(None);
    };
    let Some((len_bytes, _)) = rest.split_first_chunk::<4>() else {
        return Ok(None);
    };
    let len = declared_len(i32::from_be_bytes(*len_bytes), 4, max_len)?;
    let total = len
        .checked_add(1)
        .ok_or(WireError::TooLong { len, max: max_len })?;
    let Some((raw, _)) = buf.split_at_checked(total) else {
        return Ok(None);
    };
    let body = raw.get(HEADER_LEN..).ok_or(WireError::TooShort)?;
    Ok(Some((Frame { tag, body, raw }, total)))
}

/// Validates a length field against a protocol minimum and a caller maximum.
pub(crate) fn declared_len(len: i32, min: i32, max_len: usize) -> Result<usize, WireError> {
    if len < min {
        return Err(WireError::BadLength(len));
    }
    let n = usize::try_from(len).map_err(|_| WireError::BadLength(len))?;
    if n > max_len {
        return Err(WireError::TooLong {
            len: n,
            max: max_len,
        });
    }
    Ok(n)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const SYNC: &[u8] = &[b'S', 0, 0, 0, 4];
    const QUERY: &[u8] = b"Q\x00\x00\x00\x0dSELECT 1\0";

    #[test]
    fn splits_a_bodyless_message() {
        let (f, used) = split_frame(SYNC, 100).unwrap().unwrap();
        assert_eq!(used, 5);
        assert_eq!(f.tag, b'S');
        assert!(f.body.is_empty());
        assert_eq!(f.raw, SYNC);
    }

    #[test]
    fn splits_first_of_two() {
        let mut buf = QUERY.to_vec();
        buf.extend_from_slice(SYNC);
        let (f, used) = split_frame(&buf, 100).unwrap().unwrap();
        assert_eq!(used, QUERY.len());
        assert_eq!(f.tag, b'Q');
        assert_eq!(f.body, b"SELECT 1\0");
        let (g, _) = split_frame(&buf[used..], 100).unwrap().unwrap();
        assert_eq!(g.raw, SYNC);
    }

    #[test]
    fn incomplete_is_none() {
        for k in 0..QUERY.len() {
            assert_eq!(split_frame(&QUERY[..k], 100), Ok(None), "prefix {k}");
        }
    }

    #[test]
    fn rejects_bad_lengths_early() {
        assert_eq!(
            split_frame(&[b'Q', 0, 0, 0, 3], 100),
            Err(WireError::BadLength(3))
        );
        assert_eq!(
            split_frame(&[b'Q', 0xff, 0xff, 0xff, 0xff], 100),
            Err(WireError::BadLength(-1))
        );
        assert_eq!(
            split_frame(&[b'Q', 0, 0, 1, 0], 100),
            Err(WireError::TooLong { len: 256, max: 100 })
        );
        assert_eq!(
            split_frame(&[b'Q', 0x7f, 0xff, 0xff, 0xff], usize::MAX),
            Ok(None)
        );
    }
}
