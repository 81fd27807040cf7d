//! Encoders appending complete messages to a `Vec<u8>`.
//!
//! Every encoder writes the length field itself. Encoders whose input can be invalid
//! (a string containing nul, a count or length too large for its field, an unknown
//! kind/status byte) return `Err` and leave the buffer exactly as it was.

mod backend;
mod frontend;

pub use backend::*;
pub use frontend::*;

use crate::WireError;

/// Largest value a protocol length field can hold.
const MAX_FIELD_LEN: usize = 0x7fff_ffff;

/// Appends one message: the optional tag, a length placeholder, then whatever `body`
/// writes; patches the length afterwards. Rolls back on error.
fn message(
    buf: &mut Vec<u8>,
    tag: Option<u8>,
    body: impl FnOnce(&mut Vec<u8>) -> Result<(), WireError>,
) -> Result<(), WireError> {
    let start = buf.len();
    if let Some(t) = tag {
        buf.push(t);
    }
    let len_at = buf.len();
    buf.extend_from_slice(&[0; 4]);
    let result = body(buf).and_then(|()| {
        let len = buf.len().saturating_sub(len_at);
        let field = i32::try_from(len).map_err(|_| WireError::TooLong {
            len,
            max: MAX_FIELD_LEN,
        })?;
        let end = len_at.checked_add(4).ok_or(WireError::TooShort)?;
        let slot = buf.get_mut(len_at..end).ok_or(WireError::TooShort)?;
        slot.copy_from_slice(&field.to_be_bytes());
        Ok(())
    });
    if result.is_err() {
        buf.truncate(start);
    }
    result
}

/// Appends a message whose body is fixed and small; cannot fail.
fn fixed(buf: &mut Vec<u8>, tag: u8, body: &[u8]) {
    // Bodies passed here are compile-time constants of a few bytes.
    let len = u8::try_from(body.len().saturating_add(4)).unwrap_or(u8::MAX);
    buf.extend_from_slice(&[tag, 0, 0, 0, len]);
    buf.extend_from_slice(body);
}

/// Appends `s` and its terminating nul.
fn put_cstr(buf: &mut Vec<u8>, s: &str) -> Result<(), WireError> {
    put_cstr_bytes(buf, s.as_bytes())
}

/// Appends `s` and its terminating nul; `s` must not contain nul.
fn put_cstr_bytes(buf: &mut Vec<u8>, s: &[u8]) -> Result<(), WireError> {
    if s.contains(&0) {
        return Err(WireError::InteriorNul);
    }
    buf.extend_from_slice(s);
    buf.push(0);
    Ok(())
}

/// Appends a u16 count, failing when `n` does not fit.
fn put_count(buf: &mut Vec<u8>, n: usize) -> Result<(), WireError> {
    let c = u16::try_from(n).map_err(|_| WireError::TooLong {
        len: n,
        max: usize::from(u16::MAX),
    })?;
    buf.extend_from_slice(&c.to_be_bytes());
    Ok(())
}

/// Appends an i32 byte count followed by the bytes.
fn put_len_prefixed(buf: &mut Vec<u8>, data: &[u8]) -> Result<(), WireError> {
    let n = i32::try_from(data.len()).map_err(|_| WireError::TooLong {
        len: data.len(),
        max: MAX_FIELD_LEN,
    })?;
    buf.extend_from_slice(&n.to_be_bytes());
    buf.extend_from_slice(data);
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn rollback_on_error() {
        let mut buf = b"keep".to_vec();
        let r = message(&mut buf, Some(b'Q'), |b| put_cstr(b, "a\0b"));
        assert_eq!(r, Err(WireError::InteriorNul));
        assert_eq!(buf, b"keep");
    }

    #[test]
    fn untagged_length_counts_itself() {
        let mut buf = Vec::new();
        message(&mut buf, None, |b| {
            b.extend_from_slice(&[1, 2]);
            Ok(())
        })
        .unwrap();
        assert_eq!(buf, [0, 0, 0, 6, 1, 2]);
    }

    #[test]
    fn count_overflow() {
        let mut buf = Vec::new();
        assert!(put_count(&mut buf, 65_536).is_err());
        put_count(&mut buf, 65_535).unwrap();
        assert_eq!(buf, [0xff, 0xff]);
    }
}
