//! Encoders for client (frontend) messages, including the untagged startup packets.

use super::{fixed, message, put_count, put_cstr, put_cstr_bytes, put_len_prefixed};
use crate::frontend::{check_kind, tag};
use crate::startup::{CANCEL_REQUEST_CODE, GSSENC_REQUEST_CODE, PROTOCOL_3_0, SSL_REQUEST_CODE};
use crate::WireError;

/// StartupMessage for protocol 3.0. Names must be non-empty; names and values nul-free.
pub fn startup_message(buf: &mut Vec<u8>, params: &[(&str, &str)]) -> Result<(), WireError> {
    message(buf, None, |b| {
        b.extend_from_slice(&PROTOCOL_3_0.to_be_bytes());
        for (name, value) in params {
            if name.is_empty() {
                return Err(WireError::Malformed("empty startup parameter name"));
            }
            put_cstr(b, name)?;
            put_cstr(b, value)?;
        }
        b.push(0);
        Ok(())
    })
}

/// SSLRequest (`00 00 00 08 04 d2 16 2f`).
pub fn ssl_request(buf: &mut Vec<u8>) {
    buf.extend_from_slice(&8i32.to_be_bytes());
    buf.extend_from_slice(&SSL_REQUEST_CODE.to_be_bytes());
}

/// GSSENCRequest (`00 00 00 08 04 d2 16 30`).
pub fn gssenc_request(buf: &mut Vec<u8>) {
    buf.extend_from_slice(&8i32.to_be_bytes());
    buf.extend_from_slice(&GSSENC_REQUEST_CODE.to_be_bytes());
}

/// CancelRequest for backend `pid` with secret `key`.
pub fn cancel_request(buf: &mut Vec<u8>, pid: i32, key: i32) {
    buf.extend_from_slice(&16i32.to_be_bytes());
    buf.extend_from_slice(&CANCEL_REQUEST_CODE.to_be_bytes());
    buf.extend_from_slice(&pid.to_be_bytes());
    buf.extend_from_slice(&key.to_be_bytes());
}

/// Query ('Q').
pub fn query(buf: &mut Vec<u8>, sql: impl AsRef<[u8]>) -> Result<(), WireError> {
    message(buf, Some(tag::QUERY), |b| put_cstr_bytes(b, sql.as_ref()))
}

/// Parse ('P') with statement `name`, SQL `query` and parameter type OIDs.
pub fn parse(
    buf: &mut Vec<u8>,
    name: impl AsRef<[u8]>,
    query: impl AsRef<[u8]>,
    param_types: &[u32],
) -> Result<(), WireError> {
    message(buf, Some(tag::PARSE), |b| {
        put_cstr_bytes(b, name.as_ref())?;
        put_cstr_bytes(b, query.as_ref())?;
        put_count(b, param_types.len())?;
        for t in param_types {
            b.extend_from_slice(&t.to_be_bytes());
        }
        Ok(())
    })
}

/// Bind ('B') naming `statement` instead of the original, with the original's
/// [`Bind::rest`](crate::frontend::Bind::rest) copied verbatim.
pub fn bind_renamed(
    buf: &mut Vec<u8>,
    portal: impl AsRef<[u8]>,
    statement: impl AsRef<[u8]>,
    rest: &[u8],
) -> Result<(), WireError> {
    message(buf, Some(tag::BIND), |b| {
        put_cstr_bytes(b, portal.as_ref())?;
        put_cstr_bytes(b, statement.as_ref())?;
        b.extend_from_slice(rest);
        Ok(())
    })
}

/// Describe ('D'); `kind` must be `b'S'` (statement) or `b'P'` (portal).
pub fn describe(buf: &mut Vec<u8>, kind: u8, name: impl AsRef<[u8]>) -> Result<(), WireError> {
    message(buf, Some(tag::DESCRIBE), |b| {
        b.push(check_kind(kind)?);
        put_cstr_bytes(b, name.as_ref())
    })
}

/// Close ('C'); `kind` must be `b'S'` (statement) or `b'P'` (portal).
pub fn close(buf: &mut Vec<u8>, kind: u8, name: impl AsRef<[u8]>) -> Result<(), WireError> {
    message(buf, Some(tag::CLOSE), |b| {
        b.push(check_kind(kind)?);
        put_cstr_bytes(b, name.as_ref())
    })
}

/// Execute ('E'); `max_rows` 0 means no limit.
pub fn execute(
    buf: &mut Vec<u8>,
    portal: impl AsRef<[u8]>,
    max_rows: i32,
) -> Result<(), WireError> {
    message(buf, Some(tag::EXECUTE), |b| {
        put_cstr_bytes(b, portal.as_ref())?;
        b.extend_from_slice(&max_rows.to_be_bytes());
        Ok(())
    })
}

/// Sync ('S').
pub fn sync(buf: &mut Vec<u8>) {
    fixed(buf, tag::SYNC, &[]);
}

/// Flush ('H').
pub fn flush(buf: &mut Vec<u8>) {
    fixed(buf, tag::FLUSH, &[]);
}

/// Terminate ('X').
pub fn terminate(buf: &mut Vec<u8>) {
    fixed(buf, tag::TERMINATE, &[]);
}

/// SASLInitialResponse ('p'); `None` data is sent as length -1.
pub fn sasl_initial_response(
    buf: &mut Vec<u8>,
    mechanism: &str,
    data: Option<&[u8]>,
) -> Result<(), WireError> {
    message(buf, Some(tag::SASL_INITIAL_RESPONSE), |b| {
        put_cstr(b, mechanism)?;
        match data {
            Some(d) => put_len_prefixed(b, d),
            None => {
                b.extend_from_slice(&(-1i32).to_be_bytes());
                Ok(())
            }
        }
    })
}

/// SASLResponse ('p'): the body is `data` verbatim.
pub fn sasl_response(buf: &mut Vec<u8>, data: &[u8]) -> Result<(), WireError> {
    message(buf, Some(tag::SASL_RESPONSE), |b| {
        b.extend_from_slice(data);
        Ok(())
    })
}

/// PasswordMessage ('p'): `password` (nul-free) plus a terminating nul.
pub fn password_message(buf: &mut Vec<u8>, password: &[u8]) -> Result<(), WireError> {
    message(buf, Some(tag::PASSWORD_MESSAGE), |b| {
        put_cstr_bytes(b, password)
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn startup_packets() {
        let mut b = Vec::new();
        ssl_request(&mut b);
        assert_eq!(b, [0x00, 0x00, 0x00, 0x08, 0x04, 0xd2, 0x16, 0x2f]);
        b.clear();
        gssenc_request(&mut b);
        assert_eq!(b, [0x00, 0x00, 0x00, 0x08, 0x04, 0xd2, 0x16, 0x30]);
        b.clear();
        cancel_request(&mut b, 1, 2);
        assert_eq!(
            b,
            [0, 0, 0, 16, 0x04, 0xd2, 0x16, 0x2e, 0, 0, 0, 1, 0, 0, 0, 2]
        );
        b.clear();
        startup_message(&mut b, &[("user", "u")]).unwrap();
        assert_eq!(b, b"\0\0\0\x10\0\x03\0\0user\0u\0\0");
        assert!(startup_message(&mut b, &[("", "x")]).is_err());
        assert_eq!(b.len(), 16);
    }

    #[test]
    fn tagged_messages() {
        let mut b = Vec::new();
        query(&mut b, "SELECT 1").unwrap();
        assert_eq!(b, b"Q\0\0\0\x0dSELECT 1\0");
        b.clear();
        sync(&mut b);
        flush(&mut b);
        terminate(&mut b);
        assert_eq!(b, b"S\0\0\0\x04H\0\0\0\x04X\0\0\0\x04");
        b.clear();
        parse(&mut b, "s", "q", &[23]).unwrap();
        assert_eq!(b, b"P\0\0\0\x0es\0q\0\0\x01\0\0\0\x17");
        b.clear();
        execute(&mut b, "", 0).unwrap();
        assert_eq!(b, b"E\0\0\0\x09\0\0\0\0\0");
        b.clear();
        password_message(&mut b, b"pw").unwrap();
        assert_eq!(b, b"p\0\0\0\x07pw\0");
    }

    #[test]
    fn invalid_inputs_leave_buffer_untouched() {
        let mut b = Vec::new();
        assert_eq!(
            describe(&mut b, b'x', "n"),
            Err(WireError::Malformed(
                "describe/close kind must be 'S' or 'P'"
            ))
        );
        assert_eq!(close(&mut b, b'S', "a\0"), Err(WireError::InteriorNul));
        assert_eq!(password_message(&mut b, b"\0"), Err(WireError::InteriorNul));
        assert!(b.is_empty());
    }
}
