//! Authentication ('R') requests from the server.

use crate::reader::Reader;
use crate::WireError;

/// Sub-codes carried in the first i32 of an Authentication message.
pub mod auth_code {
    /// AuthenticationOk.
    pub const OK: i32 = 0;
    /// AuthenticationCleartextPassword.
    pub const CLEARTEXT_PASSWORD: i32 = 3;
    /// AuthenticationMD5Password.
    pub const MD5_PASSWORD: i32 = 5;
    /// AuthenticationSASL.
    pub const SASL: i32 = 10;
    /// AuthenticationSASLContinue.
    pub const SASL_CONTINUE: i32 = 11;
    /// AuthenticationSASLFinal.
    pub const SASL_FINAL: i32 = 12;
}

/// A decoded Authentication message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Authentication<'a> {
    /// Authentication succeeded (code 0).
    Ok,
    /// Send the password in clear text (code 3).
    CleartextPassword,
    /// Send an MD5-hashed password using this salt (code 5).
    Md5Password {
        /// The 4-byte salt.
        salt: [u8; 4],
    },
    /// Start SASL with one of these mechanisms (code 10).
    Sasl {
        /// Mechanism names in server preference order, e.g. `SCRAM-SHA-256`.
        mechanisms: Vec<&'a str>,
    },
    /// A SASL challenge (code 11).
    SaslContinue {
        /// Mechanism-specific data.
        data: &'a [u8],
    },
    /// The SASL outcome (code 12).
    SaslFinal {
        /// Mechanism-specific data.
        data: &'a [u8],
    },
    /// Any other code (Kerberos, GSS, SSPI, ...); the rest of the body is not inspected.
    Other(i32),
}

impl<'a> Authentication<'a> {
    /// Decodes an Authentication body.
    pub fn decode(body: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body);
        let auth = match r.i32()? {
            auth_code::OK => Self::Ok,
            auth_code::CLEARTEXT_PASSWORD => Self::CleartextPassword,
            auth_code::MD5_PASSWORD => {
                let salt = r.bytes(4)?;
                let mut s = [0u8; 4];
                s.copy_from_slice(salt);
                Self::Md5Password { salt: s }
            }
            auth_code::SASL => {
                let mut mechanisms = Vec::new();
                loop {
                    let m = r.cstr()?;
                    if m.is_empty() {
                        break;
                    }
                    mechanisms.push(m);
                }
                Self::Sasl { mechanisms }
            }
            auth_code::SASL_CONTINUE => Self::SaslContinue { data: r.rest() },
            auth_code::SASL_FINAL => Self::SaslFinal { data: r.rest() },
            other => {
                r.rest();
                Self::Other(other)
            }
        };
        r.finish()?;
        Ok(auth)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn simple_codes() {
        assert_eq!(
            Authentication::decode(&[0, 0, 0, 0]),
            Ok(Authentication::Ok)
        );
        assert_eq!(
            Authentication::decode(&[0, 0, 0, 3]),
            Ok(Authentication::CleartextPassword)
        );
        assert!(Authentication::decode(&[0, 0, 0, 0, 1]).is_err());
        assert_eq!(Authentication::decode(&[0, 0]), Err(WireError::TooShort));
    }

    #[test]
    fn md5() {
        assert_eq!(
            Authentication::decode(&[0, 0, 0, 5, 1, 2, 3, 4]),
            Ok(Authentication::Md5Password { salt: [1, 2, 3, 4] })
        );
        assert_eq!(
            Authentication::decode(&[0, 0, 0, 5, 1]),
            Err(WireError::TooShort)
        );
    }

    #[test]
    fn sasl() {
        let body = b"\x00\x00\x00\x0aSCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0";
        assert_eq!(
            Authentication::decode(body),
            Ok(Authentication::Sasl {
                mechanisms: vec!["SCRAM-SHA-256-PLUS", "SCRAM-SHA-256"]
            })
        );
        // Missing list terminator.
        assert_eq!(
            Authentication::decode(&body[..body.len() - 1]),
            Err(WireError::MissingNul)
        );
        assert_eq!(
            Authentication::decode(b"\x00\x00\x00\x0br=abc"),
            Ok(Authentication::SaslContinue { data: b"r=abc" })
        );
        assert_eq!(
            Authentication::decode(b"\x00\x00\x00\x0cv=xyz"),
            Ok(Authentication::SaslFinal { data: b"v=xyz" })
        );
    }

    #[test]
    fn other() {
        assert_eq!(
            Authentication::decode(&[0, 0, 0, 8, 9, 9]),
            Ok(Authentication::Other(8))
        );
    }
}
