//! Decoders for messages sent by the server (backend), borrowing from a frame body.

mod auth;
mod fields;

pub use auth::{auth_code, Authentication};
pub use fields::{field, ErrorFields, Fields};

use crate::reader::Reader;
use crate::WireError;

/// Tag bytes of backend messages.
pub mod tag {
    /// Authentication request family (AuthenticationOk, ...SASL, ...).
    pub const AUTHENTICATION: u8 = b'R';
    /// BackendKeyData.
    pub const BACKEND_KEY_DATA: u8 = b'K';
    /// BindComplete.
    pub const BIND_COMPLETE: u8 = b'2';
    /// CloseComplete.
    pub const CLOSE_COMPLETE: u8 = b'3';
    /// CommandComplete.
    pub const COMMAND_COMPLETE: u8 = b'C';
    /// CopyData.
    pub const COPY_DATA: u8 = b'd';
    /// CopyDone.
    pub const COPY_DONE: u8 = b'c';
    /// CopyInResponse.
    pub const COPY_IN_RESPONSE: u8 = b'G';
    /// CopyOutResponse.
    pub const COPY_OUT_RESPONSE: u8 = b'H';
    /// CopyBothResponse.
    pub const COPY_BOTH_RESPONSE: u8 = b'W';
    /// DataRow.
    pub const DATA_ROW: u8 = b'D';
    /// EmptyQueryResponse.
    pub const EMPTY_QUERY_RESPONSE: u8 = b'I';
    /// ErrorResponse.
    pub const ERROR_RESPONSE: u8 = b'E';
    /// FunctionCallResponse.
    pub const FUNCTION_CALL_RESPONSE: u8 = b'V';
    /// NegotiateProtocolVersion.
    pub const NEGOTIATE_PROTOCOL_VERSION: u8 = b'v';
    /// NoData.
    pub const NO_DATA: u8 = b'n';
    /// NoticeResponse.
    pub const NOTICE_RESPONSE: u8 = b'N';
    /// NotificationResponse.
    pub const NOTIFICATION_RESPONSE: u8 = b'A';
    /// ParameterDescription.
    pub const PARAMETER_DESCRIPTION: u8 = b't';
    /// ParameterStatus.
    pub const PARAMETER_STATUS: u8 = b'S';
    /// ParseComplete.
    pub const PARSE_COMPLETE: u8 = b'1';
    /// PortalSuspended.
    pub const PORTAL_SUSPENDED: u8 = b's';
    /// ReadyForQuery.
    pub const READY_FOR_QUERY: u8 = b'Z';
    /// RowDescription.
    pub const ROW_DESCRIPTION: u8 = b'T';
}

/// ReadyForQuery status: idle, not in a transaction block.
pub const STATUS_IDLE: u8 = b'I';
/// ReadyForQuery status: inside a transaction block.
pub const STATUS_IN_TRANSACTION: u8 = b'T';
/// ReadyForQuery status: inside a failed transaction block.
pub const STATUS_FAILED: u8 = b'E';

/// Checks a ReadyForQuery status byte.
pub(crate) fn check_status(status: u8) -> Result<u8, WireError> {
    match status {
        STATUS_IDLE | STATUS_IN_TRANSACTION | STATUS_FAILED => Ok(status),
        _ => Err(WireError::Malformed(
            "ready-for-query status must be 'I', 'T' or 'E'",
        )),
    }
}

/// ReadyForQuery ('Z').
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadyForQuery {
    /// [`STATUS_IDLE`], [`STATUS_IN_TRANSACTION`] or [`STATUS_FAILED`].
    pub status: u8,
}

impl ReadyForQuery {
    /// Decodes a ReadyForQuery body; the status must be `b'I'`, `b'T'` or `b'E'`.
    pub fn decode(body: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body);
        let status = check_status(r.u8()?)?;
        r.finish()?;
        Ok(Self { status })
    }
}

/// ParameterStatus ('S'): a run-time parameter reported by the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParameterStatus<'a> {
    /// Parameter name, e.g. `server_version`.
    pub name: &'a str,
    /// Current value.
    pub value: &'a str,
}

impl<'a> ParameterStatus<'a> {
    /// Decodes a ParameterStatus body.
    pub fn decode(body: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body);
        let name = r.cstr()?;
        let value = r.cstr()?;
        r.finish()?;
        Ok(Self { name, value })
    }
}

/// BackendKeyData ('K'): the key a client needs to cancel queries (protocol 3.0 layout).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BackendKeyData {
    /// Backend process id.
    pub pid: i32,
    /// Secret key.
    pub key: i32,
}

impl BackendKeyData {
    /// Decodes a BackendKeyData body (exactly 8 bytes).
    pub fn decode(body: &[u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body);
        let pid = r.i32()?;
        let key = r.i32()?;
        r.finish()?;
        Ok(Self { pid, key })
    }
}

/// CommandComplete ('C').
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CommandComplete<'a> {
    /// Command tag, e.g. `SELECT 1` or `BEGIN`.
    pub tag: &'a str,
}

impl<'a> CommandComplete<'a> {
    /// Decodes a CommandComplete body.
    pub fn decode(body: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body);
        let tag = r.cstr()?;
        r.finish()?;
        Ok(Self { tag })
    }
}

/// DataRow ('D').
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataRow<'a> {
    /// Column values; `None` is SQL NULL (length -1).
    pub columns: Vec<Option<&'a [u8]>>,
}

impl<'a> DataRow<'a> {
    /// Decodes a DataRow body.
    pub fn decode(body: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body);
        let count = usize::from(r.u16()?);
        // Every column needs at least its 4-byte length, which bounds the allocation.
        let mut columns = Vec::with_capacity(count.min(r.remaining() / 4));
        for _ in 0..count {
            let len = r.i32()?;
            columns.push(if len == -1 {
                None
            } else {
                let n = usize::try_from(len).map_err(|_| WireError::BadLength(len))?;
                Some(r.bytes(n)?)
            });
        }
        r.finish()?;
        Ok(Self { columns })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn ready_for_query() {
        assert_eq!(
            ReadyForQuery::decode(b"I"),
            Ok(ReadyForQuery { status: b'I' })
        );
        assert_eq!(ReadyForQuery::decode(b"E").unwrap().status, STATUS_FAILED);
        assert!(matches!(
            ReadyForQuery::decode(b"Q"),
            Err(WireError::Malformed(_))
        ));
        assert_eq!(ReadyForQuery::decode(b""), Err(WireError::TooShort));
        assert!(ReadyForQuery::decode(b"II").is_err());
    }

    #[test]
    fn parameter_status() {
        assert_eq!(
            ParameterStatus::decode(b"client_encoding\0UTF8\0"),
            Ok(ParameterStatus {
                name: "client_encoding",
                value: "UTF8"
            })
        );
        assert_eq!(ParameterStatus::decode(b"a\0b"), Err(WireError::MissingNul));
    }

    #[test]
    fn backend_key_data() {
        assert_eq!(
            BackendKeyData::decode(&[0, 0, 0x30, 0x39, 0x80, 0, 0, 0]),
            Ok(BackendKeyData {
                pid: 12345,
                key: i32::MIN
            })
        );
        assert_eq!(BackendKeyData::decode(&[0; 7]), Err(WireError::TooShort));
        assert!(BackendKeyData::decode(&[0; 9]).is_err());
    }

    #[test]
    fn command_complete() {
        assert_eq!(
            CommandComplete::decode(b"SELECT 1\0").unwrap().tag,
            "SELECT 1"
        );
    }

    #[test]
    fn data_row() {
        let body = b"\x00\x03\x00\x00\x00\x02hi\xff\xff\xff\xff\x00\x00\x00\x00";
        let row = DataRow::decode(body).unwrap();
        assert_eq!(row.columns, vec![Some(&b"hi"[..]), None, Some(&b""[..])]);
        assert_eq!(
            DataRow::decode(&body[..body.len() - 1]),
            Err(WireError::TooShort)
        );
        assert_eq!(
            DataRow::decode(b"\x00\x01\xff\xff\xff\xfe"),
            Err(WireError::BadLength(-2))
        );
        assert_eq!(DataRow::decode(b"\xff\xff"), Err(WireError::TooShort));
    }
}
