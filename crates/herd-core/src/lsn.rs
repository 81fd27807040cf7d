//! PostgreSQL write-ahead log positions.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::ParseError;

/// A WAL position (`pg_lsn`), printed as PostgreSQL does: `16/B374D848`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Lsn(pub u64);

impl Lsn {
    /// Bytes from `other` up to `self`, zero when `other` is ahead.
    pub fn bytes_after(self, other: Lsn) -> u64 {
        self.0.saturating_sub(other.0)
    }
}

impl fmt::Display for Lsn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:X}/{:X}", self.0 >> 32, self.0 & 0xFFFF_FFFF)
    }
}

impl FromStr for Lsn {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || {
            ParseError::new(
                "LSN",
                s,
                "two hexadecimal numbers separated by '/', e.g. 0/16B3748",
            )
        };
        let (hi, lo) = s.trim().split_once('/').ok_or_else(bad)?;
        let hi = u32::from_str_radix(hi, 16).map_err(|_| bad())?;
        let lo = u32::from_str_radix(lo, 16).map_err(|_| bad())?;
        Ok(Lsn((u64::from(hi) << 32) | u64::from(lo)))
    }
}

impl Serialize for Lsn {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Lsn {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_postgres_format() {
        for text in ["0/0", "0/16B3748", "16/B374D848", "FFFFFFFF/FFFFFFFF"] {
            let lsn: Lsn = text.parse().expect("valid");
            assert_eq!(lsn.to_string(), text);
        }
        assert_eq!("1/0".parse::<Lsn>().expect("valid").0, 1 << 32);
    }

    #[test]
    fn rejects_garbage() {
        for text in ["", "0", "x/1", "1/", "/1", "1/2/3", "100000000/0"] {
            assert!(text.parse::<Lsn>().is_err(), "{text} should not parse");
        }
    }

    #[test]
    fn distance_saturates() {
        assert_eq!(Lsn(10).bytes_after(Lsn(4)), 6);
        assert_eq!(Lsn(4).bytes_after(Lsn(10)), 0);
    }
}
