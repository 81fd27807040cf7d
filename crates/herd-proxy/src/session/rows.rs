//! DataRow and RowDescription bodies from the servers: read into values and fields, and
//! written again with only the first columns (the client's, without hidden sort columns).

use crate::ProxyError;

/// A DataRow's values (`None`: NULL).
pub(super) fn row_values(body: &[u8]) -> Result<Vec<Option<&[u8]>>, ProxyError> {
    let bad = || ProxyError::Protocol("malformed DataRow from a shard group".into());
    let count = u16::from_be_bytes([
        *body.first().ok_or_else(bad)?,
        *body.get(1).ok_or_else(bad)?,
    ]);
    let mut at = 2;
    let mut values = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let len = i32::from_be_bytes(
            body.get(at..at + 4)
                .ok_or_else(bad)?
                .try_into()
                .map_err(|_| bad())?,
        );
        at += 4;
        if len < 0 {
            values.push(None);
        } else {
            let end = at + len as usize;
            values.push(Some(body.get(at..end).ok_or_else(bad)?));
            at = end;
        }
    }
    Ok(values)
}

/// A RowDescription's fields: the raw bytes of each, with its table OID, column number,
/// type OID and format code.
pub(super) struct Field {
    pub(super) raw: Vec<u8>,
    pub(super) table: u32,
    pub(super) column: i16,
    pub(super) type_oid: u32,
    pub(super) format: i16,
}

pub(super) fn fields(body: &[u8]) -> Result<Vec<Field>, ProxyError> {
    let bad = || ProxyError::Protocol("malformed RowDescription from a shard group".into());
    let count = u16::from_be_bytes([
        *body.first().ok_or_else(bad)?,
        *body.get(1).ok_or_else(bad)?,
    ]);
    let mut at = 2;
    let mut out = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let name_end = at
            + body
                .get(at..)
                .ok_or_else(bad)?
                .iter()
                .position(|b| *b == 0)
                .ok_or_else(bad)?;
        let fixed = body.get(name_end + 1..name_end + 19).ok_or_else(bad)?;
        let u32_at =
            |i: usize| u32::from_be_bytes([fixed[i], fixed[i + 1], fixed[i + 2], fixed[i + 3]]);
        let i16_at = |i: usize| i16::from_be_bytes([fixed[i], fixed[i + 1]]);
        out.push(Field {
            raw: body[at..name_end + 19].to_vec(),
            table: u32_at(0),
            column: i16_at(4),
            type_oid: u32_at(6),
            format: i16_at(16),
        });
        at = name_end + 19;
    }
    Ok(out)
}

/// A RowDescription of the first `keep` fields.
pub(super) fn row_description(out: &mut Vec<u8>, fields: &[Field], keep: usize) {
    let mut body = Vec::new();
    body.extend_from_slice(&(keep as u16).to_be_bytes());
    for f in fields.iter().take(keep) {
        body.extend_from_slice(&f.raw);
    }
    out.push(b'T');
    out.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    out.extend_from_slice(&body);
}

/// A DataRow of the first `keep` values.
pub(super) fn data_row(out: &mut Vec<u8>, values: &[Option<&[u8]>], keep: usize) {
    let start = out.len();
    out.push(b'D');
    out.extend_from_slice(&[0, 0, 0, 0]);
    out.extend_from_slice(&(keep as u16).to_be_bytes());
    for v in values.iter().take(keep) {
        match v {
            None => out.extend_from_slice(&(-1i32).to_be_bytes()),
            Some(b) => {
                out.extend_from_slice(&(b.len() as i32).to_be_bytes());
                out.extend_from_slice(b);
            }
        }
    }
    let len = (out.len() - start - 1) as u32;
    out[start + 1..start + 5].copy_from_slice(&len.to_be_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_and_descriptions_lose_their_hidden_columns() {
        let mut row = Vec::new();
        data_row(&mut row, &[Some(b"1"), None, Some(b"key")], 3);
        let body = &row[5..];
        let values = row_values(body).expect("values");
        assert_eq!(values, vec![Some(&b"1"[..]), None, Some(&b"key"[..])]);
        let mut short = Vec::new();
        data_row(&mut short, &values, 2);
        assert_eq!(
            row_values(&short[5..]).expect("values"),
            vec![Some(&b"1"[..]), None]
        );
        assert_eq!(
            u32::from_be_bytes([short[1], short[2], short[3], short[4]]) as usize,
            short.len() - 1
        );
        assert!(row_values(&[0, 1, 0, 0, 0, 9, 1]).is_err(), "truncated");
    }
}
