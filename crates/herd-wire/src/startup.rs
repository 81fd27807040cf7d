//! The startup phase: untagged packets (i32 length including itself, i32 code, payload).

use crate::frame::declared_len;
use crate::reader::Reader;
use crate::WireError;

/// Request code of an SSLRequest.
pub const SSL_REQUEST_CODE: i32 = 80_877_103;
/// Request code of a GSSENCRequest.
pub const GSSENC_REQUEST_CODE: i32 = 80_877_104;
/// Request code of a CancelRequest.
pub const CANCEL_REQUEST_CODE: i32 = 80_877_102;
/// Protocol version 3.0 as sent in a StartupMessage (`3 << 16 | 0`).
pub const PROTOCOL_3_0: i32 = 196_608;
/// PostgreSQL's own cap on a startup packet (`MAX_STARTUP_PACKET_LENGTH`).
pub const MAX_STARTUP_LEN: usize = 10_000;
/// Single-byte server reply accepting an SSLRequest or GSSENCRequest.
pub const ENCRYPTION_ACCEPTED: u8 = b'S';
/// Single-byte server reply refusing an SSLRequest or GSSENCRequest.
pub const ENCRYPTION_REFUSED: u8 = b'N';

/// The major version PostgreSQL reserves for special request codes (1234.xxxx).
const SPECIAL_MAJOR: i32 = 1234;

/// A decoded startup-phase packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartupRequest<'a> {
    /// SSLRequest: the client asks to switch to TLS.
    Ssl,
    /// GSSENCRequest: the client asks for GSSAPI encryption.
    GssEnc,
    /// CancelRequest for the backend identified by `pid` and `key`.
    Cancel {
        /// Backend process id from BackendKeyData.
        pid: i32,
        /// Secret key from BackendKeyData.
        key: i32,
    },
    /// StartupMessage. Any version is accepted; the caller decides which it supports.
    Startup {
        /// Protocol major version (3 for the v3 protocol).
        major: u16,
        /// Protocol minor version.
        minor: u16,
        /// Parameter name/value pairs in wire order (e.g. `user`, `database`, `options`).
        params: Vec<(&'a str, &'a str)>,
    },
}

impl<'a> StartupRequest<'a> {
    /// The value of startup parameter `name` (first occurrence), if this is a StartupMessage.
    pub fn param(&self, name: &str) -> Option<&'a str> {
        match self {
            Self::Startup { params, .. } => params.iter().find(|(k, _)| *k == name).map(|p| p.1),
            _ => None,
        }
    }
}

/// Splits the first startup-phase packet off `buf`.
///
/// Returns `Ok(None)` when more bytes are needed, otherwise the whole packet (length field
/// included) and the number of bytes consumed. The length must be at least 8 and at most
/// `max_len` (see [`MAX_STARTUP_LEN`]); it is checked as soon as its 4 bytes are present.
pub fn split_startup(buf: &[u8], max_len: usize) -> Result<Option<(&[u8], usize)>, WireError> {
    let Some((len_bytes, _)) = buf.split_first_chunk::<4>() else {
        return Ok(None);
    };
    let len = declared_len(i32::from_be_bytes(*len_bytes), 8, max_len)?;
    Ok(buf.split_at_checked(len).map(|(packet, _)| (packet, len)))
}

/// Decodes a whole startup-phase packet as returned by [`split_startup`].
///
/// The length field must equal `packet.len()`, fixed-size requests must have exactly their
/// size, and a StartupMessage's parameter list must end with a nul as the last byte.
/// Codes with major version 1234 other than the three known requests yield
/// [`WireError::UnknownRequestCode`].
pub fn parse_startup(packet: &[u8]) -> Result<StartupRequest<'_>, WireError> {
    let mut r = Reader::new(packet);
    let len = r.i32()?;
    if usize::try_from(len).ok() != Some(packet.len()) {
        return Err(WireError::BadLength(len));
    }
    let code = r.i32()?;
    let request = match code {
        SSL_REQUEST_CODE => StartupRequest::Ssl,
        GSSENC_REQUEST_CODE => StartupRequest::GssEnc,
        CANCEL_REQUEST_CODE => {
            let pid = r.i32()?;
            let key = r.i32()?;
            StartupRequest::Cancel { pid, key }
        }
        c if c >> 16 == SPECIAL_MAJOR => return Err(WireError::UnknownRequestCode(c)),
        c => {
            let [a, b, c0, d] = c.to_be_bytes();
            let mut params = Vec::new();
            loop {
                let key = r.cstr()?;
                if key.is_empty() {
                    break;
                }
                params.push((key, r.cstr()?));
            }
            StartupRequest::Startup {
                major: u16::from_be_bytes([a, b]),
                minor: u16::from_be_bytes([c0, d]),
                params,
            }
        }
    };
    r.finish()?;
    Ok(request)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const SSL: &[u8] = &[0x00, 0x00, 0x00, 0x08, 0x04, 0xd2, 0x16, 0x2f];
    const GSS: &[u8] = &[0x00, 0x00, 0x00, 0x08, 0x04, 0xd2, 0x16, 0x30];

    #[test]
    fn ssl_and_gss_requests() {
        let (p, used) = split_startup(SSL, MAX_STARTUP_LEN).unwrap().unwrap();
        assert_eq!((p, used), (SSL, 8));
        assert_eq!(parse_startup(p), Ok(StartupRequest::Ssl));
        assert_eq!(parse_startup(GSS), Ok(StartupRequest::GssEnc));
    }

    #[test]
    fn cancel_request() {
        let pkt = [
            0, 0, 0, 16, 0x04, 0xd2, 0x16, 0x2e, 0, 0, 0x30, 0x39, 0xff, 0xff, 0xff, 0xfe,
        ];
        assert_eq!(
            parse_startup(&pkt),
            Ok(StartupRequest::Cancel {
                pid: 12345,
                key: -2
            })
        );
        assert!(parse_startup(&pkt[..12]).is_err());
    }

    #[test]
    fn startup_message() {
        let mut pkt = vec![0, 0, 0, 0, 0, 3, 0, 0];
        pkt.extend_from_slice(b"user\0alice\0database\0db\0\0");
        let n = u8::try_from(pkt.len()).unwrap();
        pkt[3] = n;
        let req = parse_startup(&pkt).unwrap();
        assert_eq!(
            req,
            StartupRequest::Startup {
                major: 3,
                minor: 0,
                params: vec![("user", "alice"), ("database", "db")],
            }
        );
        assert_eq!(req.param("database"), Some("db"));
        assert_eq!(req.param("nope"), None);
    }

    #[test]
    fn startup_other_versions_are_passed_through() {
        let pkt = [0, 0, 0, 9, 0, 2, 0, 1, 0];
        assert_eq!(
            parse_startup(&pkt),
            Ok(StartupRequest::Startup {
                major: 2,
                minor: 1,
                params: vec![]
            })
        );
    }

    #[test]
    fn startup_layout_errors() {
        // No terminator at all.
        assert_eq!(
            parse_startup(&[0, 0, 0, 8, 0, 3, 0, 0]),
            Err(WireError::MissingNul)
        );
        // Key without value.
        assert_eq!(
            parse_startup(b"\0\0\0\x0d\0\x03\0\0user\0"),
            Err(WireError::MissingNul)
        );
        // Bytes after the terminator.
        assert!(matches!(
            parse_startup(&[0, 0, 0, 10, 0, 3, 0, 0, 0, 7]),
            Err(WireError::Malformed(_))
        ));
        // Invalid utf-8 key.
        assert_eq!(
            parse_startup(&[0, 0, 0, 13, 0, 3, 0, 0, 0xff, 0, b'v', 0, 0]),
            Err(WireError::InvalidUtf8)
        );
    }

    #[test]
    fn unknown_special_code() {
        let pkt = [0x00, 0x00, 0x00, 0x08, 0x04, 0xd2, 0x16, 0x31];
        assert_eq!(
            parse_startup(&pkt),
            Err(WireError::UnknownRequestCode(80_877_105))
        );
    }

    #[test]
    fn length_checks() {
        assert_eq!(split_startup(&SSL[..3], 100), Ok(None));
        assert_eq!(split_startup(&SSL[..7], 100), Ok(None));
        assert_eq!(
            split_startup(&[0, 0, 0, 7], 100),
            Err(WireError::BadLength(7))
        );
        assert_eq!(
            split_startup(&[0, 0, 0x27, 0x11], MAX_STARTUP_LEN),
            Err(WireError::TooLong {
                len: 10_001,
                max: MAX_STARTUP_LEN
            })
        );
        // Length field disagreeing with the packet handed to the parser.
        assert_eq!(
            parse_startup(&[0, 0, 0, 9, 4, 0xd2, 0x16, 0x2f]),
            Err(WireError::BadLength(9))
        );
        assert_eq!(parse_startup(&[0, 0, 0]), Err(WireError::TooShort));
    }
}
