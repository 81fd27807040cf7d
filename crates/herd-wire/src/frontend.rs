//! Decoders for messages sent by the client (frontend), borrowing from a frame body.

use crate::reader::Reader;
use crate::WireError;

/// Tag bytes of frontend messages.
pub mod tag {
    /// Query (simple protocol).
    pub const QUERY: u8 = b'Q';
    /// Parse (extended protocol).
    pub const PARSE: u8 = b'P';
    /// Bind.
    pub const BIND: u8 = b'B';
    /// Describe.
    pub const DESCRIBE: u8 = b'D';
    /// Close.
    pub const CLOSE: u8 = b'C';
    /// Execute.
    pub const EXECUTE: u8 = b'E';
    /// Sync.
    pub const SYNC: u8 = b'S';
    /// Flush.
    pub const FLUSH: u8 = b'H';
    /// Terminate.
    pub const TERMINATE: u8 = b'X';
    /// FunctionCall.
    pub const FUNCTION_CALL: u8 = b'F';
    /// CopyData.
    pub const COPY_DATA: u8 = b'd';
    /// CopyDone.
    pub const COPY_DONE: u8 = b'c';
    /// CopyFail.
    pub const COPY_FAIL: u8 = b'f';
    /// PasswordMessage; also SASLInitialResponse, SASLResponse and GSSResponse,
    /// told apart only by the authentication state.
    pub const PASSWORD_MESSAGE: u8 = b'p';
    /// SASLInitialResponse (same byte as [`PASSWORD_MESSAGE`]).
    pub const SASL_INITIAL_RESPONSE: u8 = b'p';
    /// SASLResponse (same byte as [`PASSWORD_MESSAGE`]).
    pub const SASL_RESPONSE: u8 = b'p';
}

/// The `kind` byte of Describe/Close naming a prepared statement.
pub const KIND_STATEMENT: u8 = b'S';
/// The `kind` byte of Describe/Close naming a portal.
pub const KIND_PORTAL: u8 = b'P';

/// Checks a Describe/Close `kind` byte.
pub(crate) fn check_kind(kind: u8) -> Result<u8, WireError> {
    match kind {
        KIND_STATEMENT | KIND_PORTAL => Ok(kind),
        _ => Err(WireError::Malformed(
            "describe/close kind must be 'S' or 'P'",
        )),
    }
}

/// Query ('Q'): a simple-protocol query string.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Query<'a> {
    /// The SQL text, as bytes in the client's encoding (not necessarily UTF-8).
    pub sql: &'a [u8],
}

impl<'a> Query<'a> {
    /// Decodes a Query body.
    pub fn decode(body: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body);
        let sql = r.cstr_bytes()?;
        r.finish()?;
        Ok(Self { sql })
    }
}

/// Parse ('P'): create a prepared statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parse<'a> {
    /// Statement name (bytes in the client's encoding); empty for the unnamed statement.
    pub name: &'a [u8],
    /// The SQL text, as bytes in the client's encoding.
    pub query: &'a [u8],
    /// Parameter type OIDs (0 = unspecified). Empty (no allocation) in the common case.
    pub param_types: Vec<u32>,
}

impl<'a> Parse<'a> {
    /// Decodes a Parse body.
    pub fn decode(body: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body);
        let name = r.cstr_bytes()?;
        let query = r.cstr_bytes()?;
        let count = usize::from(r.u16()?);
        let expected = count.checked_mul(4).ok_or(WireError::TooShort)?;
        if r.remaining() < expected {
            return Err(WireError::TooShort);
        }
        // Length is now known to cover every type, so the allocation is bounded by the body.
        let mut param_types = Vec::with_capacity(count);
        for _ in 0..count {
            param_types.push(r.u32()?);
        }
        r.finish()?;
        Ok(Self {
            name,
            query,
            param_types,
        })
    }
}

/// Bind ('B'): create a portal from a prepared statement.
///
/// Only the two names are decoded; everything after them is kept verbatim in `rest`
/// so a proxy can rename the statement (see [`crate::encode::bind_renamed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bind<'a> {
    /// Destination portal name; empty for the unnamed portal.
    pub portal: &'a [u8],
    /// Source prepared statement name; empty for the unnamed statement.
    pub statement: &'a [u8],
    /// Parameter formats, values and result formats, unparsed.
    pub rest: &'a [u8],
}

impl<'a> Bind<'a> {
    /// Decodes the names of a Bind body.
    pub fn decode(body: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body);
        let portal = r.cstr_bytes()?;
        let statement = r.cstr_bytes()?;
        Ok(Self {
            portal,
            statement,
            rest: r.rest(),
        })
    }
}

/// Describe ('D'): ask for the description of a statement or portal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Describe<'a> {
    /// [`KIND_STATEMENT`] (`b'S'`) or [`KIND_PORTAL`] (`b'P'`).
    pub kind: u8,
    /// Statement or portal name (bytes in the client's encoding).
    pub name: &'a [u8],
}

impl<'a> Describe<'a> {
    /// Decodes a Describe body; the kind must be `b'S'` or `b'P'`.
    pub fn decode(body: &'a [u8]) -> Result<Self, WireError> {
        let (kind, name) = kind_and_name(body)?;
        Ok(Self { kind, name })
    }
}

/// Close ('C'): close a statement or portal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Close<'a> {
    /// [`KIND_STATEMENT`] (`b'S'`) or [`KIND_PORTAL`] (`b'P'`).
    pub kind: u8,
    /// Statement or portal name (bytes in the client's encoding).
    pub name: &'a [u8],
}

impl<'a> Close<'a> {
    /// Decodes a Close body; the kind must be `b'S'` or `b'P'`.
    pub fn decode(body: &'a [u8]) -> Result<Self, WireError> {
        let (kind, name) = kind_and_name(body)?;
        Ok(Self { kind, name })
    }
}

fn kind_and_name(body: &[u8]) -> Result<(u8, &[u8]), WireError> {
    let mut r = Reader::new(body);
    let kind = check_kind(r.u8()?)?;
    let name = r.cstr_bytes()?;
    r.finish()?;
    Ok((kind, name))
}

/// Execute ('E'): run a portal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Execute<'a> {
    /// Portal name; empty for the unnamed portal.
    pub portal: &'a [u8],
    /// Row limit; 0 means no limit.
    pub max_rows: i32,
}

impl<'a> Execute<'a> {
    /// Decodes an Execute body.
    pub fn decode(body: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body);
        let portal = r.cstr_bytes()?;
        let max_rows = r.i32()?;
        r.finish()?;
        Ok(Self { portal, max_rows })
    }
}

/// SASLInitialResponse ('p' while a SASL exchange is starting).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SaslInitialResponse<'a> {
    /// Chosen mechanism, e.g. `SCRAM-SHA-256`.
    pub mechanism: &'a str,
    /// Initial client response; `None` when the length field is -1.
    pub data: Option<&'a [u8]>,
}

impl<'a> SaslInitialResponse<'a> {
    /// Decodes a SASLInitialResponse body.
    pub fn decode(body: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body);
        let mechanism = r.cstr()?;
        let len = r.i32()?;
        let data = if len == -1 {
            None
        } else {
            let n = usize::try_from(len).map_err(|_| WireError::BadLength(len))?;
            Some(r.bytes(n)?)
        };
        r.finish()?;
        Ok(Self { mechanism, data })
    }
}

/// SASLResponse ('p' during a SASL exchange): the body is the mechanism data itself.
pub fn sasl_response(body: &[u8]) -> &[u8] {
    body
}

/// PasswordMessage ('p' after AuthenticationCleartextPassword/MD5Password): returns the
/// password bytes without the terminating nul. Not checked for utf-8, since passwords may
/// be in any client encoding.
pub fn password_message(body: &[u8]) -> Result<&[u8], WireError> {
    let mut r = Reader::new(body);
    let password = r.cstr_bytes()?;
    r.finish()?;
    Ok(password)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn query() {
        assert_eq!(Query::decode(b"SELECT 1\0").unwrap().sql, b"SELECT 1");
        assert_eq!(Query::decode(b"SELECT 1"), Err(WireError::MissingNul));
        // Text in a client encoding other than UTF-8 (here LATIN1 'é') is kept as bytes.
        assert_eq!(
            Query::decode(b"select '\xe9'\0").unwrap().sql,
            b"select '\xe9'"
        );
        assert!(matches!(
            Query::decode(b"a\0b"),
            Err(WireError::Malformed(_))
        ));
    }

    #[test]
    fn parse_message() {
        let body = b"s1\0SELECT $1\0\x00\x01\x00\x00\x00\x17";
        let p = Parse::decode(body).unwrap();
        assert_eq!(p.name, b"s1");
        assert_eq!(p.query, b"SELECT $1");
        assert_eq!(p.param_types, vec![23]);
        assert_eq!(
            Parse::decode(&body[..body.len() - 1]),
            Err(WireError::TooShort)
        );
        let mut long = body.to_vec();
        long.push(0);
        assert!(matches!(Parse::decode(&long), Err(WireError::Malformed(_))));
        // Count claims far more types than the body holds.
        assert_eq!(Parse::decode(b"\0\0\xff\xff"), Err(WireError::TooShort));
    }

    #[test]
    fn bind_keeps_rest() {
        let body = b"p1\0s1\0\x00\x00\x00\x01\x00\x00\x00\x011\x00\x00";
        let b = Bind::decode(body).unwrap();
        assert_eq!((b.portal, b.statement), (&b"p1"[..], &b"s1"[..]));
        assert_eq!(b.rest, &body[6..]);
        // Truncated inside the statement name.
        assert_eq!(Bind::decode(b"p1\0s"), Err(WireError::MissingNul));
        assert_eq!(Bind::decode(b""), Err(WireError::MissingNul));
    }

    #[test]
    fn describe_close() {
        assert_eq!(
            Describe::decode(b"Sstmt\0"),
            Ok(Describe {
                kind: b'S',
                name: b"stmt"
            })
        );
        assert_eq!(
            Close::decode(b"P\0"),
            Ok(Close {
                kind: b'P',
                name: b""
            })
        );
        assert!(matches!(
            Describe::decode(b"Xa\0"),
            Err(WireError::Malformed(_))
        ));
        assert_eq!(Close::decode(b""), Err(WireError::TooShort));
    }

    #[test]
    fn execute() {
        assert_eq!(
            Execute::decode(b"\0\0\0\0\x0a"),
            Ok(Execute {
                portal: b"",
                max_rows: 10
            })
        );
        assert_eq!(Execute::decode(b"\0\0\0"), Err(WireError::TooShort));
    }

    #[test]
    fn sasl() {
        let r = SaslInitialResponse::decode(b"SCRAM-SHA-256\0\x00\x00\x00\x03abc").unwrap();
        assert_eq!(r.mechanism, "SCRAM-SHA-256");
        assert_eq!(r.data, Some(&b"abc"[..]));
        let none = SaslInitialResponse::decode(b"M\0\xff\xff\xff\xff").unwrap();
        assert_eq!(none.data, None);
        assert_eq!(
            SaslInitialResponse::decode(b"M\0\xff\xff\xff\xfe"),
            Err(WireError::BadLength(-2))
        );
        assert_eq!(
            SaslInitialResponse::decode(b"M\0\x00\x00\x00\x05abc"),
            Err(WireError::TooShort)
        );
        assert_eq!(sasl_response(b"xyz"), b"xyz");
    }

    #[test]
    fn password() {
        assert_eq!(password_message(b"md5abc\0"), Ok(&b"md5abc"[..]));
        assert_eq!(password_message(b"\xff\0"), Ok(&b"\xff"[..]));
        assert_eq!(password_message(b"abc"), Err(WireError::MissingNul));
    }
}
