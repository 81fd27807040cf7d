//! The value of a LIMIT or OFFSET given as a parameter, read the way PostgreSQL reads it: the
//! parameter's type (declared by the client's Parse, or as the server infers it) says how its
//! bytes are encoded, and the value is then converted to `bigint` as PostgreSQL's LIMIT does
//! (numeric rounds half away from zero, floats to the nearest even). A value whose encoding
//! Herd cannot read is refused, never taken as "no bound": a merge that ignores the client's
//! LIMIT returns rows one server would not.

use herd_shard::ParamValue;

/// Type OIDs a LIMIT parameter may have.
const INT2: u32 = 21;
const INT4: u32 = 23;
const INT8: u32 = 20;
const FLOAT4: u32 = 700;
const FLOAT8: u32 = 701;
const NUMERIC: u32 = 1700;

/// Why a bound could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum BoundError {
    /// The value's encoding (or type) is not one Herd reads here.
    #[error("{what} parameter ${param} {why}: send it as an integer")]
    Unreadable {
        /// `LIMIT` or `OFFSET`.
        what: &'static str,
        /// The parameter's number.
        param: u32,
        /// What is wrong.
        why: String,
    },
    /// Out of `bigint`'s range, or not a number (PostgreSQL fails the same way).
    #[error("{0}")]
    OutOfRange(String),
}

impl BoundError {
    /// The SQLSTATE the client sees.
    pub(crate) fn code(&self) -> &'static str {
        match self {
            BoundError::Unreadable { .. } => "0A000",
            BoundError::OutOfRange(_) => "22003",
        }
    }
}

/// The value of parameter `param` used as a LIMIT or OFFSET (`what`), of type `type_oid`
/// (0: unknown, which PostgreSQL infers as `bigint` for a parameter used only there);
/// `None` for SQL NULL or a missing parameter (no bound).
pub(crate) fn bound_param(
    what: &'static str,
    param: u32,
    value: &ParamValue,
    type_oid: u32,
) -> Result<Option<i64>, BoundError> {
    let unreadable = |why: String| BoundError::Unreadable { what, param, why };
    match value {
        ParamValue::Null | ParamValue::Missing => Ok(None),
        ParamValue::OtherType(t) => Err(unreadable(format!("has type OID {t}"))),
        ParamValue::Text(t) => {
            let text = std::str::from_utf8(t)
                .map_err(|_| unreadable("is not UTF-8 text".into()))?
                .trim();
            if let Ok(n) = text.parse::<i64>() {
                return Ok(Some(n));
            }
            // A numeric or float in text: PostgreSQL rounds it to bigint.
            let x: f64 = text
                .parse()
                .map_err(|_| unreadable(format!("is not a number ({text:?})")))?;
            let rounded = if type_oid == FLOAT4 || type_oid == FLOAT8 {
                round_half_even(x)
            } else {
                x.round()
            };
            to_i64(rounded).map(Some)
        }
        ParamValue::Binary(b) => {
            let fixed = |n: usize| -> Result<&[u8], BoundError> {
                (b.len() == n).then_some(b.as_slice()).ok_or_else(|| {
                    unreadable(format!("has {} bytes where its type has {n}", b.len()))
                })
            };
            let ty = match type_oid {
                // Unknown: by length, as the server infers an integer type for it.
                0 => match b.len() {
                    2 => INT2,
                    4 => INT4,
                    8 => INT8,
                    n => return Err(unreadable(format!("is {n} bytes of an unknown type"))),
                },
                t => t,
            };
            match ty {
                INT2 => Ok(Some(i64::from(i16::from_be_bytes(arr(fixed(2)?))))),
                INT4 => Ok(Some(i64::from(i32::from_be_bytes(arr(fixed(4)?))))),
                INT8 => Ok(Some(i64::from_be_bytes(arr(fixed(8)?)))),
                FLOAT4 => to_i64(round_half_even(f64::from(f32::from_be_bytes(arr(fixed(
                    4,
                )?)))))
                .map(Some),
                FLOAT8 => to_i64(round_half_even(f64::from_be_bytes(arr(fixed(8)?)))).map(Some),
                NUMERIC => numeric_to_i64(b)
                    .map_err(|why| match why {
                        NumericError::Malformed => unreadable("is a malformed numeric".into()),
                        NumericError::Range(m) => BoundError::OutOfRange(m),
                    })
                    .map(Some),
                other => Err(unreadable(format!("has type OID {other}"))),
            }
        }
    }
}

fn arr<const N: usize>(b: &[u8]) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[..N]);
    a
}

/// `rint()`: halves go to the even neighbour, as PostgreSQL's float-to-bigint cast does.
fn round_half_even(x: f64) -> f64 {
    let r = x.round();
    if (x - x.trunc()).abs() == 0.5 && r % 2.0 != 0.0 {
        r - x.signum()
    } else {
        r
    }
}

fn to_i64(x: f64) -> Result<i64, BoundError> {
    // i64::MAX as f64 rounds up to 2^63, which is out of range.
    // 2^63 as f64 (i64::MAX rounds up to it): the first value out of range.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    if x.is_finite() && (-LIMIT..LIMIT).contains(&x) {
        Ok(x as i64)
    } else {
        Err(BoundError::OutOfRange("bigint out of range".into()))
    }
}

enum NumericError {
    Malformed,
    Range(String),
}

/// A binary `numeric` rounded to bigint (half away from zero, as `numeric_int8` does).
fn numeric_to_i64(b: &[u8]) -> Result<i64, NumericError> {
    let word = |i: usize| -> Result<i16, NumericError> {
        b.get(i..i + 2)
            .map(|w| i16::from_be_bytes([w[0], w[1]]))
            .ok_or(NumericError::Malformed)
    };
    let ndigits = usize::try_from(word(0)?).map_err(|_| NumericError::Malformed)?;
    let weight = i32::from(word(2)?);
    let sign = word(4)? as u16;
    if b.len() != 8 + 2 * ndigits {
        return Err(NumericError::Malformed);
    }
    match sign {
        0x0000 | 0x4000 => {}
        0xC000 => return Err(NumericError::Range("cannot convert NaN to bigint".into())),
        0xD000 | 0xF000 => {
            return Err(NumericError::Range(
                "cannot convert infinity to bigint".into(),
            ))
        }
        _ => return Err(NumericError::Malformed),
    }
    let range = || NumericError::Range("bigint out of range".into());
    // Digits are base 10,000; digit i has weight `weight - i`.
    let mut int: i128 = 0;
    let mut round_up = false;
    for i in 0..ndigits {
        let d = i128::from(word(8 + 2 * i)?);
        if !(0..10_000).contains(&d) {
            return Err(NumericError::Malformed);
        }
        let w = weight - i as i32;
        if w >= 0 {
            let scale = 10_000i128.checked_pow(w as u32).ok_or_else(range)?;
            int = d
                .checked_mul(scale)
                .and_then(|x| int.checked_add(x))
                .ok_or_else(range)?;
        } else if w == -1 {
            round_up = d >= 5_000;
        }
    }
    if round_up {
        int += 1;
    }
    if sign == 0x4000 {
        int = -int;
    }
    i64::try_from(int).map_err(|_| range())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bin(b: &[u8]) -> ParamValue {
        ParamValue::Binary(b.to_vec())
    }

    fn numeric(weight: i16, sign: u16, digits: &[i16]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend_from_slice(&(digits.len() as i16).to_be_bytes());
        v.extend_from_slice(&weight.to_be_bytes());
        v.extend_from_slice(&sign.to_be_bytes());
        v.extend_from_slice(&0i16.to_be_bytes());
        for d in digits {
            v.extend_from_slice(&d.to_be_bytes());
        }
        v
    }

    #[test]
    fn every_integer_width_and_format() {
        let cases: Vec<(ParamValue, u32, Option<i64>)> = vec![
            (bin(&4i16.to_be_bytes()), INT2, Some(4)),
            (bin(&4i16.to_be_bytes()), 0, Some(4)),
            (bin(&1450i32.to_be_bytes()), INT4, Some(1450)),
            (bin(&1450i32.to_be_bytes()), 0, Some(1450)),
            (bin(&7i64.to_be_bytes()), INT8, Some(7)),
            (bin(&7i64.to_be_bytes()), 0, Some(7)),
            (ParamValue::Text(b" 12 ".to_vec()), 0, Some(12)),
            (ParamValue::Text(b"2.5".to_vec()), NUMERIC, Some(3)),
            (ParamValue::Text(b"2.5".to_vec()), FLOAT8, Some(2)),
            (ParamValue::Text(b"3.5".to_vec()), FLOAT8, Some(4)),
            (bin(&2.5f64.to_be_bytes()), FLOAT8, Some(2)),
            (bin(&3.5f32.to_be_bytes()), FLOAT4, Some(4)),
            (bin(&numeric(0, 0, &[42])), NUMERIC, Some(42)),
            (bin(&numeric(1, 0, &[1, 2])), NUMERIC, Some(10_002)),
            (bin(&numeric(0, 0, &[2, 5000])), NUMERIC, Some(3)),
            (bin(&numeric(0, 0x4000, &[2, 4999])), NUMERIC, Some(-2)),
            (bin(&numeric(-1, 0, &[5000])), NUMERIC, Some(1)),
            (bin(&numeric(0, 0, &[])), NUMERIC, Some(0)),
            (ParamValue::Null, INT8, None),
            (ParamValue::Missing, 0, None),
        ];
        for (value, ty, want) in cases {
            assert_eq!(
                bound_param("LIMIT", 1, &value, ty),
                Ok(want),
                "{value:?} of type {ty}"
            );
        }
    }

    #[test]
    fn unreadable_values_are_refused_never_ignored() {
        let refused = [
            (bin(&[0, 0, 1]), 0),
            (bin(&4i16.to_be_bytes()), INT8),
            (bin(b"abcd"), 25),
            (ParamValue::Text(b"four".to_vec()), 0),
            (bin(&numeric(0, 0, &[1])[..7]), NUMERIC),
        ];
        for (value, ty) in refused {
            let e = bound_param("OFFSET", 2, &value, ty).expect_err("refused");
            assert_eq!(e.code(), "0A000", "{value:?}: {e}");
            assert!(e.to_string().contains("OFFSET parameter $2"), "{e}");
        }
        let nan = bound_param("LIMIT", 1, &bin(&numeric(0, 0xC000, &[])), NUMERIC);
        assert_eq!(nan.map_err(|e| e.code()), Err("22003"));
        let huge = bound_param("LIMIT", 1, &bin(&numeric(5, 0, &[1])), NUMERIC);
        assert_eq!(huge.map_err(|e| e.code()), Err("22003"));
        let inf = bound_param("LIMIT", 1, &bin(&f64::INFINITY.to_be_bytes()), FLOAT8);
        assert_eq!(inf.map_err(|e| e.code()), Err("22003"));
    }
}
