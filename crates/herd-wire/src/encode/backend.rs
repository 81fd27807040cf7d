//! Encoders for server (backend) messages.

use super::{fixed, message, put_count, put_cstr, put_len_prefixed};
use crate::backend::{auth_code, check_status, field, tag};
use crate::WireError;

/// AuthenticationOk ('R', code 0).
pub fn authentication_ok(buf: &mut Vec<u8>) {
    fixed(buf, tag::AUTHENTICATION, &auth_code::OK.to_be_bytes());
}

/// AuthenticationCleartextPassword ('R', code 3).
pub fn authentication_cleartext_password(buf: &mut Vec<u8>) {
    fixed(
        buf,
        tag::AUTHENTICATION,
        &auth_code::CLEARTEXT_PASSWORD.to_be_bytes(),
    );
}

/// AuthenticationMD5Password ('R', code 5) with `salt`.
pub fn authentication_md5_password(buf: &mut Vec<u8>, salt: [u8; 4]) {
    let [a, b, c, d] = auth_code::MD5_PASSWORD.to_be_bytes();
    fixed(
        buf,
        tag::AUTHENTICATION,
        &[a, b, c, d, salt[0], salt[1], salt[2], salt[3]],
    );
}

/// AuthenticationSASL ('R', code 10) listing `mechanisms` (each non-empty and nul-free).
pub fn authentication_sasl(buf: &mut Vec<u8>, mechanisms: &[&str]) -> Result<(), WireError> {
    message(buf, Some(tag::AUTHENTICATION), |b| {
        b.extend_from_slice(&auth_code::SASL.to_be_bytes());
        for m in mechanisms {
            if m.is_empty() {
                return Err(WireError::Malformed("empty sasl mechanism name"));
            }
            put_cstr(b, m)?;
        }
        b.push(0);
        Ok(())
    })
}

/// AuthenticationSASLContinue ('R', code 11) carrying `data`.
pub fn authentication_sasl_continue(buf: &mut Vec<u8>, data: &[u8]) -> Result<(), WireError> {
    auth_with_data(buf, auth_code::SASL_CONTINUE, data)
}

/// AuthenticationSASLFinal ('R', code 12) carrying `data`.
pub fn authentication_sasl_final(buf: &mut Vec<u8>, data: &[u8]) -> Result<(), WireError> {
    auth_with_data(buf, auth_code::SASL_FINAL, data)
}

fn auth_with_data(buf: &mut Vec<u8>, code: i32, data: &[u8]) -> Result<(), WireError> {
    message(buf, Some(tag::AUTHENTICATION), |b| {
        b.extend_from_slice(&code.to_be_bytes());
        b.extend_from_slice(data);
        Ok(())
    })
}

/// ParameterStatus ('S').
pub fn parameter_status(buf: &mut Vec<u8>, name: &str, value: &str) -> Result<(), WireError> {
    message(buf, Some(tag::PARAMETER_STATUS), |b| {
        put_cstr(b, name)?;
        put_cstr(b, value)
    })
}

/// BackendKeyData ('K'), protocol 3.0 layout.
pub fn backend_key_data(buf: &mut Vec<u8>, pid: i32, key: i32) {
    let [a, b, c, d] = pid.to_be_bytes();
    let [e, f, g, h] = key.to_be_bytes();
    fixed(buf, tag::BACKEND_KEY_DATA, &[a, b, c, d, e, f, g, h]);
}

/// ReadyForQuery ('Z'); `status` must be `b'I'`, `b'T'` or `b'E'`.
pub fn ready_for_query(buf: &mut Vec<u8>, status: u8) -> Result<(), WireError> {
    fixed(buf, tag::READY_FOR_QUERY, &[check_status(status)?]);
    Ok(())
}

/// ErrorResponse ('E') with severity (sent as both 'S' and non-localized 'V', like
/// PostgreSQL), SQLSTATE `code` and `message`.
pub fn error_response(
    buf: &mut Vec<u8>,
    severity: &str,
    code: &str,
    message: &str,
) -> Result<(), WireError> {
    fields_message(buf, tag::ERROR_RESPONSE, severity, code, message)
}

/// NoticeResponse ('N'); same layout as [`error_response`].
pub fn notice_response(
    buf: &mut Vec<u8>,
    severity: &str,
    code: &str,
    message: &str,
) -> Result<(), WireError> {
    fields_message(buf, tag::NOTICE_RESPONSE, severity, code, message)
}

fn fields_message(
    buf: &mut Vec<u8>,
    tag: u8,
    severity: &str,
    code: &str,
    text: &str,
) -> Result<(), WireError> {
    message(buf, Some(tag), |b| {
        for (t, v) in [
            (field::SEVERITY, severity),
            (field::SEVERITY_NONLOCALIZED, severity),
            (field::CODE, code),
            (field::MESSAGE, text),
        ] {
            b.push(t);
            put_cstr(b, v)?;
        }
        b.push(0);
        Ok(())
    })
}

/// CommandComplete ('C').
pub fn command_complete(buf: &mut Vec<u8>, command_tag: &str) -> Result<(), WireError> {
    message(buf, Some(tag::COMMAND_COMPLETE), |b| {
        put_cstr(b, command_tag)
    })
}

/// RowDescription ('T') of text columns (type `text`, OID 25) named `names`, not from a table.
pub fn row_description_text(buf: &mut Vec<u8>, names: &[&str]) -> Result<(), WireError> {
    message(buf, Some(tag::ROW_DESCRIPTION), |b| {
        put_count(b, names.len())?;
        for name in names {
            put_cstr(b, name)?;
            b.extend_from_slice(&0i32.to_be_bytes()); // table OID
            b.extend_from_slice(&0i16.to_be_bytes()); // column number
            b.extend_from_slice(&25i32.to_be_bytes()); // type OID: text
            b.extend_from_slice(&(-1i16).to_be_bytes()); // variable length
            b.extend_from_slice(&(-1i32).to_be_bytes()); // no type modifier
            b.extend_from_slice(&0i16.to_be_bytes()); // text format
        }
        Ok(())
    })
}

/// DataRow ('D'); `None` columns are sent as NULL (length -1).
pub fn data_row(buf: &mut Vec<u8>, columns: &[Option<&[u8]>]) -> Result<(), WireError> {
    message(buf, Some(tag::DATA_ROW), |b| {
        put_count(b, columns.len())?;
        for c in columns {
            match c {
                Some(v) => put_len_prefixed(b, v)?,
                None => b.extend_from_slice(&(-1i32).to_be_bytes()),
            }
        }
        Ok(())
    })
}

/// ParseComplete ('1').
pub fn parse_complete(buf: &mut Vec<u8>) {
    fixed(buf, tag::PARSE_COMPLETE, &[]);
}

/// BindComplete ('2').
pub fn bind_complete(buf: &mut Vec<u8>) {
    fixed(buf, tag::BIND_COMPLETE, &[]);
}

/// CloseComplete ('3').
pub fn close_complete(buf: &mut Vec<u8>) {
    fixed(buf, tag::CLOSE_COMPLETE, &[]);
}

/// ParameterDescription ('t'): the type OIDs of a statement's parameters.
pub fn parameter_description(buf: &mut Vec<u8>, types: &[u32]) -> Result<(), WireError> {
    message(buf, Some(tag::PARAMETER_DESCRIPTION), |b| {
        put_count(b, types.len())?;
        for t in types {
            b.extend_from_slice(&t.to_be_bytes());
        }
        Ok(())
    })
}

/// NoData ('n').
pub fn no_data(buf: &mut Vec<u8>) {
    fixed(buf, tag::NO_DATA, &[]);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn auth() {
        let mut b = Vec::new();
        authentication_ok(&mut b);
        assert_eq!(b, b"R\0\0\0\x08\0\0\0\0");
        b.clear();
        authentication_md5_password(&mut b, [1, 2, 3, 4]);
        assert_eq!(b, b"R\0\0\0\x0c\0\0\0\x05\x01\x02\x03\x04");
        b.clear();
        authentication_sasl(&mut b, &["SCRAM-SHA-256"]).unwrap();
        assert_eq!(b, b"R\0\0\0\x17\0\0\0\x0aSCRAM-SHA-256\0\0");
        assert!(authentication_sasl(&mut b, &[""]).is_err());
        assert_eq!(b.len(), 24);
    }

    #[test]
    fn status_and_keys() {
        let mut b = Vec::new();
        ready_for_query(&mut b, b'I').unwrap();
        assert_eq!(b, b"Z\0\0\0\x05I");
        assert!(ready_for_query(&mut b, b'x').is_err());
        assert_eq!(b.len(), 6);
        b.clear();
        backend_key_data(&mut b, 1, -1);
        assert_eq!(b, b"K\0\0\0\x0c\0\0\0\x01\xff\xff\xff\xff");
        b.clear();
        parse_complete(&mut b);
        bind_complete(&mut b);
        close_complete(&mut b);
        no_data(&mut b);
        assert_eq!(b, b"1\0\0\0\x042\0\0\0\x043\0\0\0\x04n\0\0\0\x04");
    }

    #[test]
    fn error_fields() {
        let mut b = Vec::new();
        error_response(&mut b, "FATAL", "28P01", "bad").unwrap();
        assert_eq!(b, b"E\0\0\0\x1fSFATAL\0VFATAL\0C28P01\0Mbad\0\0");
    }

    #[test]
    fn rows() {
        let mut b = Vec::new();
        data_row(&mut b, &[Some(b"1"), None]).unwrap();
        assert_eq!(b, b"D\0\0\0\x0f\0\x02\0\0\0\x011\xff\xff\xff\xff");
        b.clear();
        command_complete(&mut b, "SELECT 1").unwrap();
        assert_eq!(b, b"C\0\0\0\x0dSELECT 1\0");
    }
}
