//! Ordering rows from several shard groups as one PostgreSQL server would: each sort key's
//! value decoded from a DataRow (text or binary format, by type OID from the RowDescription)
//! into a value compared the way PostgreSQL's default operator class compares that type.
//! Types not listed here are refused (the caller answers 0A000), never compared as bytes on a
//! guess. Text is compared byte by byte, which is PostgreSQL's order only under the C
//! collation; the caller checks the collation before merging on text.

use std::cmp::Ordering;

/// Type OIDs (pg_type) the merge understands.
pub mod oid {
    /// bool
    pub const BOOL: u32 = 16;
    /// name
    pub const NAME: u32 = 19;
    /// int8
    pub const INT8: u32 = 20;
    /// int2
    pub const INT2: u32 = 21;
    /// int4
    pub const INT4: u32 = 23;
    /// text
    pub const TEXT: u32 = 25;
    /// oid
    pub const OID: u32 = 26;
    /// float4
    pub const FLOAT4: u32 = 700;
    /// float8
    pub const FLOAT8: u32 = 701;
    /// bpchar (char(n))
    pub const BPCHAR: u32 = 1042;
    /// varchar
    pub const VARCHAR: u32 = 1043;
    /// date
    pub const DATE: u32 = 1082;
    /// timestamp
    pub const TIMESTAMP: u32 = 1114;
    /// timestamptz
    pub const TIMESTAMPTZ: u32 = 1184;
    /// numeric
    pub const NUMERIC: u32 = 1700;
    /// uuid
    pub const UUID: u32 = 2950;
}

/// Whether values of `type_oid` compare by bytes under a collation (text types).
pub fn is_text(type_oid: u32) -> bool {
    matches!(type_oid, oid::TEXT | oid::VARCHAR | oid::BPCHAR | oid::NAME)
}

/// A sort key's value, comparable with values of the same column.
#[derive(Debug, Clone, PartialEq)]
pub enum SortValue {
    /// SQL NULL (placed by the key's NULLS FIRST/LAST, not by comparison).
    Null,
    /// Integers, and date/time values as a count of days or microseconds.
    Int(i64),
    /// float4/float8, in PostgreSQL's order (NaN above everything, -0 equal to 0).
    Float(f64),
    /// numeric.
    Numeric(Decimal),
    /// Text, uuid, bool: byte order.
    Bytes(Vec<u8>),
}

/// A numeric value in an order-preserving form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decimal {
    /// -Infinity.
    NegInfinity,
    /// A finite value: negative, its base-10 exponent of the first digit and its significant
    /// digits (no leading or trailing zeros; zero has no digits and is never negative).
    Finite {
        /// Below zero.
        negative: bool,
        /// Position of the first significant digit (1 for 1–9, 0 for 0.1–0.9, …).
        exponent: i64,
        /// The significant digits, ASCII.
        digits: Vec<u8>,
    },
    /// Infinity.
    Infinity,
    /// NaN, above every other numeric in PostgreSQL.
    NaN,
}

impl Decimal {
    /// From numeric's text form (`-12.340`, `NaN`, `Infinity`).
    pub fn parse(text: &str) -> Option<Decimal> {
        match text {
            "NaN" => return Some(Decimal::NaN),
            "Infinity" => return Some(Decimal::Infinity),
            "-Infinity" => return Some(Decimal::NegInfinity),
            _ => {}
        }
        let (negative, unsigned) = match text.strip_prefix('-') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let (int, frac) = unsigned.split_once('.').unwrap_or((unsigned, ""));
        if int.is_empty() && frac.is_empty()
            || !int.bytes().chain(frac.bytes()).all(|b| b.is_ascii_digit())
        {
            return None;
        }
        let int = int.trim_start_matches('0');
        let mut digits: Vec<u8> = int.bytes().chain(frac.bytes()).collect();
        let mut exponent = int.len() as i64;
        if int.is_empty() {
            let zeros = frac.bytes().take_while(|b| *b == b'0').count();
            exponent = -(zeros as i64);
            digits.drain(..zeros);
        }
        while digits.last() == Some(&b'0') {
            digits.pop();
        }
        if digits.is_empty() {
            return Some(Decimal::Finite {
                negative: false,
                exponent: 0,
                digits,
            });
        }
        Some(Decimal::Finite {
            negative,
            exponent,
            digits,
        })
    }

    /// From numeric's binary form: ndigits, weight, sign, dscale, base-10000 digits.
    pub fn decode(bytes: &[u8]) -> Option<Decimal> {
        let word = |i: usize| -> Option<u16> {
            Some(u16::from_be_bytes([*bytes.get(i)?, *bytes.get(i + 1)?]))
        };
        let ndigits = word(0)? as usize;
        let weight = word(2)? as i16 as i64;
        let sign = word(4)?;
        match sign {
            0xC000 => return Some(Decimal::NaN),
            0xD000 => return Some(Decimal::Infinity),
            0xF000 => return Some(Decimal::NegInfinity),
            0x0000 | 0x4000 => {}
            _ => return None,
        }
        // Digit i stands for 10000^(weight - i); missing ones are zero.
        let group = |i: i64| -> Option<u16> {
            if i < 0 || i >= ndigits as i64 {
                Some(0)
            } else {
                word(8 + 2 * i as usize)
            }
        };
        let mut int = String::new();
        for p in (0..=weight).rev() {
            int.push_str(&format!("{:04}", group(weight - p)?));
        }
        let mut frac = String::new();
        let last = weight - (ndigits as i64 - 1);
        let mut p = -1;
        while p >= last {
            frac.push_str(&format!("{:04}", group(weight - p)?));
            p -= 1;
        }
        let text = format!(
            "{}{}.{frac}",
            if sign == 0x4000 { "-" } else { "" },
            if int.is_empty() { "0" } else { &int }
        );
        Decimal::parse(&text)
    }
}

impl Ord for Decimal {
    fn cmp(&self, other: &Self) -> Ordering {
        use Decimal::*;
        let rank = |d: &Decimal| match d {
            NegInfinity => 0,
            Finite { .. } => 1,
            Infinity => 2,
            NaN => 3,
        };
        match (self, other) {
            (
                Finite {
                    negative: an,
                    exponent: ae,
                    digits: ad,
                },
                Finite {
                    negative: bn,
                    exponent: be,
                    digits: bd,
                },
            ) => {
                let zero = |d: &Vec<u8>| d.is_empty();
                // Zero sits between the negatives and the positives.
                let class = |n: bool, d: &Vec<u8>| {
                    if zero(d) {
                        1
                    } else if n {
                        0
                    } else {
                        2
                    }
                };
                let (ac, bc) = (class(*an, ad), class(*bn, bd));
                if ac != bc || ac == 1 {
                    return ac.cmp(&bc);
                }
                let magnitude = ae.cmp(be).then_with(|| ad.cmp(bd));
                if *an {
                    magnitude.reverse()
                } else {
                    magnitude
                }
            }
            _ => rank(self).cmp(&rank(other)),
        }
    }
}

impl PartialOrd for Decimal {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Why a value cannot be ordered here.
fn cannot(type_oid: u32, what: &str) -> String {
    format!("cannot order values of type OID {type_oid} across shard groups ({what})")
}

/// Decodes one sort key value of `type_oid` in `format` (0 text, 1 binary).
pub fn sort_value(type_oid: u32, format: i16, raw: Option<&[u8]>) -> Result<SortValue, String> {
    let Some(raw) = raw else {
        return Ok(SortValue::Null);
    };
    let binary = format == 1;
    let text = || std::str::from_utf8(raw).map_err(|_| cannot(type_oid, "not UTF-8"));
    let bad = || cannot(type_oid, "unexpected value");
    let be = |n: usize| -> Result<i64, String> {
        if raw.len() != n {
            return Err(bad());
        }
        Ok(match n {
            2 => i64::from(i16::from_be_bytes([raw[0], raw[1]])),
            4 => i64::from(i32::from_be_bytes([raw[0], raw[1], raw[2], raw[3]])),
            _ => i64::from_be_bytes(raw.try_into().map_err(|_| bad())?),
        })
    };
    Ok(match type_oid {
        oid::INT2 | oid::INT4 | oid::INT8 | oid::OID if binary => SortValue::Int(match type_oid {
            oid::INT2 => be(2)?,
            oid::INT4 => be(4)?,
            // oid is unsigned.
            oid::OID => be(4)? & 0xffff_ffff,
            _ => be(8)?,
        }),
        oid::INT2 | oid::INT4 | oid::INT8 | oid::OID => {
            SortValue::Int(text()?.parse().map_err(|_| bad())?)
        }
        oid::FLOAT4 | oid::FLOAT8 => {
            let v = if binary {
                match raw.len() {
                    4 => f64::from(f32::from_be_bytes(raw.try_into().map_err(|_| bad())?)),
                    8 => f64::from_be_bytes(raw.try_into().map_err(|_| bad())?),
                    _ => return Err(bad()),
                }
            } else {
                match text()? {
                    "NaN" => f64::NAN,
                    "Infinity" => f64::INFINITY,
                    "-Infinity" => f64::NEG_INFINITY,
                    t => t.parse().map_err(|_| bad())?,
                }
            };
            SortValue::Float(v)
        }
        oid::NUMERIC => SortValue::Numeric(
            if binary {
                Decimal::decode(raw)
            } else {
                Decimal::parse(text()?)
            }
            .ok_or_else(bad)?,
        ),
        oid::BOOL => SortValue::Bytes(match (binary, raw) {
            (true, [b]) => vec![u8::from(*b != 0)],
            (false, b"t") => vec![1],
            (false, b"f") => vec![0],
            _ => return Err(bad()),
        }),
        // char(n): trailing spaces do not count.
        oid::BPCHAR => {
            let end = raw.iter().rposition(|b| *b != b' ').map_or(0, |p| p + 1);
            SortValue::Bytes(raw[..end].to_vec())
        }
        oid::TEXT | oid::VARCHAR | oid::NAME => SortValue::Bytes(raw.to_vec()),
        oid::UUID if binary => SortValue::Bytes(raw.to_vec()),
        oid::UUID => SortValue::Bytes(uuid_bytes(text()?).ok_or_else(bad)?),
        oid::DATE if binary => SortValue::Int(be(4)?),
        oid::DATE => SortValue::Int(
            date_days(text()?)
                .ok_or_else(|| cannot(type_oid, "dates must be output in the ISO DateStyle"))?,
        ),
        oid::TIMESTAMP | oid::TIMESTAMPTZ if binary => SortValue::Int(be(8)?),
        oid::TIMESTAMP | oid::TIMESTAMPTZ => SortValue::Int(
            timestamp_micros(text()?, type_oid == oid::TIMESTAMPTZ).ok_or_else(|| {
                cannot(type_oid, "timestamps must be output in the ISO DateStyle")
            })?,
        ),
        _ => return Err(cannot(type_oid, "no merge order is known for this type")),
    })
}

fn uuid_bytes(text: &str) -> Option<Vec<u8>> {
    let hex: Vec<u8> = text.bytes().filter(|b| *b != b'-').collect();
    if hex.len() != 32 {
        return None;
    }
    hex.chunks(2)
        .map(|p| u8::from_str_radix(std::str::from_utf8(p).ok()?, 16).ok())
        .collect()
}

/// Days from 2000-01-01 of a proleptic Gregorian date (year may be ≤ 0 for BC).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    // Howard Hinnant's algorithm, shifted to PostgreSQL's epoch.
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468 - 10_957
}

/// `YYYY-MM-DD[ BC]`, `infinity`, `-infinity` → days from 2000-01-01 (as binary dates).
fn date_days(text: &str) -> Option<i64> {
    match text {
        "infinity" => return Some(i64::from(i32::MAX)),
        "-infinity" => return Some(i64::from(i32::MIN)),
        _ => {}
    }
    let (body, bc) = match text.strip_suffix(" BC") {
        Some(b) => (b, true),
        None => (text, false),
    };
    let mut parts = body.splitn(3, '-');
    let year: i64 = parts.next()?.parse().ok()?;
    let month: i64 = parts.next()?.parse().ok()?;
    let day: i64 = parts.next()?.parse().ok()?;
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    // 1 BC is year 0.
    let year = if bc { 1 - year } else { year };
    Some(days_from_civil(year, month, day))
}

/// `YYYY-MM-DD HH:MM:SS[.ffffff][±HH[:MM[:SS]]][ BC]` → microseconds from 2000-01-01 (UTC
/// for timestamptz, as the binary form).
fn timestamp_micros(text: &str, zoned: bool) -> Option<i64> {
    match text {
        "infinity" => return Some(i64::MAX),
        "-infinity" => return Some(i64::MIN),
        _ => {}
    }
    let (body, bc) = match text.strip_suffix(" BC") {
        Some(b) => (b, true),
        None => (text, false),
    };
    let (date, time) = body.split_once(' ')?;
    let days = date_days(&format!("{date}{}", if bc { " BC" } else { "" }))?;
    // The zone offset starts at the first sign after the seconds.
    let (clock, offset) = if zoned {
        let at = time.find(['+', '-'])?;
        (&time[..at], Some(&time[at..]))
    } else {
        (time, None)
    };
    let mut hms = clock.splitn(3, ':');
    let h: i64 = hms.next()?.parse().ok()?;
    let m: i64 = hms.next()?.parse().ok()?;
    let sec = hms.next()?;
    let (s, frac) = sec.split_once('.').unwrap_or((sec, ""));
    let s: i64 = s.parse().ok()?;
    if frac.len() > 6 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let micros: i64 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<6}").parse().ok()?
    };
    let mut total = ((days * 24 + h) * 60 + m) * 60 + s;
    if let Some(off) = offset {
        let negative = off.starts_with('-');
        let mut parts = off[1..].split(':');
        let oh: i64 = parts.next()?.parse().ok()?;
        let om: i64 = parts.next().map_or(Some(0), |p| p.parse().ok())?;
        let os: i64 = parts.next().map_or(Some(0), |p| p.parse().ok())?;
        let secs = (oh * 60 + om) * 60 + os;
        // Local time = UTC + offset.
        total += if negative { secs } else { -secs };
    }
    total.checked_mul(1_000_000)?.checked_add(micros)
}

/// Compares two non-NULL values of one column.
pub fn compare(a: &SortValue, b: &SortValue) -> Ordering {
    match (a, b) {
        (SortValue::Int(x), SortValue::Int(y)) => x.cmp(y),
        (SortValue::Float(x), SortValue::Float(y)) => match (x.is_nan(), y.is_nan()) {
            (true, true) => Ordering::Equal,
            (true, false) => Ordering::Greater,
            (false, true) => Ordering::Less,
            // -0 and 0 compare equal, as in PostgreSQL.
            _ => x.partial_cmp(y).unwrap_or(Ordering::Equal),
        },
        (SortValue::Numeric(x), SortValue::Numeric(y)) => x.cmp(y),
        (SortValue::Bytes(x), SortValue::Bytes(y)) => x.cmp(y),
        // A column's values share one type; NULLs are placed by the caller.
        _ => Ordering::Equal,
    }
}

/// The merge order of one key: direction and NULL placement.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyOrder {
    /// Descending.
    pub descending: bool,
    /// NULLs first.
    pub nulls_first: bool,
}

/// Compares two rows' sort keys, key by key.
pub fn compare_keys(order: &[KeyOrder], a: &[SortValue], b: &[SortValue]) -> Ordering {
    for ((o, x), y) in order.iter().zip(a).zip(b) {
        let c = match (x, y) {
            (SortValue::Null, SortValue::Null) => Ordering::Equal,
            (SortValue::Null, _) => {
                if o.nulls_first {
                    Ordering::Less
                } else {
                    Ordering::Greater
                }
            }
            (_, SortValue::Null) => {
                if o.nulls_first {
                    Ordering::Greater
                } else {
                    Ordering::Less
                }
            }
            _ => {
                let c = compare(x, y);
                if o.descending {
                    c.reverse()
                } else {
                    c
                }
            }
        };
        if c != Ordering::Equal {
            return c;
        }
    }
    Ordering::Equal
}

#[cfg(test)]
mod tests;
