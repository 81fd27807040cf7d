//! The field list shared by ErrorResponse ('E') and NoticeResponse ('N').

use crate::reader::Reader;
use crate::WireError;

/// Field type bytes of ErrorResponse/NoticeResponse.
pub mod field {
    /// Severity, possibly localized.
    pub const SEVERITY: u8 = b'S';
    /// Severity, never localized (PostgreSQL 9.6+).
    pub const SEVERITY_NONLOCALIZED: u8 = b'V';
    /// SQLSTATE code.
    pub const CODE: u8 = b'C';
    /// Primary message.
    pub const MESSAGE: u8 = b'M';
    /// Detail.
    pub const DETAIL: u8 = b'D';
    /// Hint.
    pub const HINT: u8 = b'H';
}

/// A validated ErrorResponse/NoticeResponse body.
///
/// [`ErrorFields::decode`] checks every field once, so iterating never fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorFields<'a> {
    body: &'a [u8],
}

impl<'a> ErrorFields<'a> {
    /// Validates an ErrorResponse or NoticeResponse body: `(type byte, string)` pairs
    /// ended by a single nul, with every string utf-8.
    pub fn decode(body: &'a [u8]) -> Result<Self, WireError> {
        let mut r = Reader::new(body);
        loop {
            if r.u8()? == 0 {
                break;
            }
            r.cstr()?;
        }
        r.finish()?;
        Ok(Self { body })
    }

    /// Iterates over `(field type, value)` pairs in wire order.
    pub fn iter(&self) -> Fields<'a> {
        Fields {
            reader: Reader::new(self.body),
        }
    }

    /// The first value of the given field type.
    pub fn get(&self, field_type: u8) -> Option<&'a str> {
        self.iter().find(|(t, _)| *t == field_type).map(|(_, v)| v)
    }

    /// Severity ('S'), possibly localized.
    pub fn severity(&self) -> Option<&'a str> {
        self.get(field::SEVERITY)
    }

    /// Non-localized severity ('V'), e.g. `ERROR`.
    pub fn severity_nonlocalized(&self) -> Option<&'a str> {
        self.get(field::SEVERITY_NONLOCALIZED)
    }

    /// SQLSTATE code ('C'), e.g. `42P01`.
    pub fn code(&self) -> Option<&'a str> {
        self.get(field::CODE)
    }

    /// Primary message ('M').
    pub fn message(&self) -> Option<&'a str> {
        self.get(field::MESSAGE)
    }
}

impl<'a> IntoIterator for &ErrorFields<'a> {
    type Item = (u8, &'a str);
    type IntoIter = Fields<'a>;

    fn into_iter(self) -> Fields<'a> {
        self.iter()
    }
}

/// Iterator over the fields of an [`ErrorFields`].
#[derive(Debug, Clone)]
pub struct Fields<'a> {
    reader: Reader<'a>,
}

impl<'a> Iterator for Fields<'a> {
    type Item = (u8, &'a str);

    fn next(&mut self) -> Option<Self::Item> {
        let field_type = self.reader.u8().ok()?;
        if field_type == 0 {
            return None;
        }
        let value = self.reader.cstr().ok()?;
        Some((field_type, value))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const BODY: &[u8] = b"SERROR\0VERROR\0C42P01\0Mrelation \"x\" does not exist\0\0";

    #[test]
    fn fields() {
        let f = ErrorFields::decode(BODY).unwrap();
        assert_eq!(f.severity(), Some("ERROR"));
        assert_eq!(f.severity_nonlocalized(), Some("ERROR"));
        assert_eq!(f.code(), Some("42P01"));
        assert_eq!(f.message(), Some("relation \"x\" does not exist"));
        assert_eq!(f.get(field::HINT), None);
        assert_eq!(f.iter().count(), 4);
        let types: Vec<u8> = (&f).into_iter().map(|(t, _)| t).collect();
        assert_eq!(types, b"SVCM");
    }

    #[test]
    fn empty_list() {
        assert_eq!(ErrorFields::decode(b"\0").unwrap().iter().count(), 0);
    }

    #[test]
    fn malformed() {
        assert_eq!(ErrorFields::decode(b""), Err(WireError::TooShort));
        assert_eq!(
            ErrorFields::decode(&BODY[..BODY.len() - 1]),
            Err(WireError::TooShort)
        );
        assert_eq!(ErrorFields::decode(b"Sabc"), Err(WireError::MissingNul));
        assert_eq!(
            ErrorFields::decode(b"S\xff\0\0"),
            Err(WireError::InvalidUtf8)
        );
        assert!(ErrorFields::decode(b"\0x").is_err());
    }
}
