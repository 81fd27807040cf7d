//! Splitting `COPY … FROM STDIN` data by shard group: rows are cut out of the client's
//! CopyData stream (text, CSV or binary format), their key read, and each row's bytes passed on
//! unchanged to the group that owns the key. Pure: bytes in, `(group, bytes)` out.

use crate::{KeyType, KeyValue, ShardMap};

/// COPY data formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyFormat {
    /// `text` (tab-separated, backslash escapes, `\N` for NULL).
    Text,
    /// `csv` (comma-separated, double quotes, empty unquoted field for NULL).
    Csv {
        /// The first line is a header.
        header: bool,
    },
    /// `binary`.
    Binary,
}

/// A problem with the client's COPY data.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("COPY data: {0}")]
pub struct CopyError(pub String);

/// Cuts rows out of a COPY stream and sends each to its key's group.
pub struct CopySplitter<'a> {
    format: CopyFormat,
    key_index: usize,
    key_type: KeyType,
    map: &'a ShardMap,
    pending: Vec<u8>,
    /// Bytes every group must receive first (binary header, CSV header line).
    preamble_done: bool,
    rows: u64,
}

/// Output of the splitter: bytes for one group, or for every group.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Routed {
    /// Rows of this group.
    Group(u32, Vec<u8>),
    /// Bytes every group needs (a header, the binary trailer).
    All(Vec<u8>),
}

const BINARY_SIGNATURE: &[u8] = b"PGCOPY\n\xff\r\n\0";

impl<'a> CopySplitter<'a> {
    /// A splitter for rows whose key is column `key_index` (0-based) of type `key_type`.
    pub fn new(format: CopyFormat, key_index: usize, key_type: KeyType, map: &'a ShardMap) -> Self {
        CopySplitter {
            format,
            key_index,
            key_type,
            map,
            pending: Vec::new(),
            preamble_done: !matches!(
                format,
                CopyFormat::Binary | CopyFormat::Csv { header: true }
            ),
            rows: 0,
        }
    }

    /// Rows split so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// Takes the next chunk of CopyData; returns what can be sent now.
    pub fn push(&mut self, data: &[u8]) -> Result<Vec<Routed>, CopyError> {
        self.pending.extend_from_slice(data);
        let mut out = Vec::new();
        while let Some(cut) = self.next_piece()? {
            let piece: Vec<u8> = self.pending.drain(..cut.len).collect();
            match cut.kind {
                Piece::Shared => out.push(Routed::All(piece)),
                Piece::Row(key) => {
                    self.rows += 1;
                    let group = self.map.group_of(key.as_ref());
                    match out.last_mut() {
                        Some(Routed::Group(g, bytes)) if *g == group => {
                            bytes.extend_from_slice(&piece)
                        }
                        _ => out.push(Routed::Group(group, piece)),
                    }
                }
                Piece::Skip => {}
            }
        }
        Ok(out)
    }

    /// The end of the data: a last text or CSV line without its newline is still a row (as
    /// PostgreSQL accepts it); anything else left over is an incomplete row.
    pub fn finish(&mut self) -> Result<Vec<Routed>, CopyError> {
        if self.pending.is_empty() {
            return Ok(Vec::new());
        }
        if self.format == CopyFormat::Binary {
            return Err(CopyError("binary COPY data ends inside a row".into()));
        }
        self.pending.push(b'\n');
        let routed = self.push(&[])?;
        if !self.pending.is_empty() {
            return Err(CopyError("COPY data ends inside a quoted CSV field".into()));
        }
        Ok(routed)
    }

    /// The next complete piece at the start of `pending`, if there is one.
    fn next_piece(&mut self) -> Result<Option<Cut>, CopyError> {
        match self.format {
            CopyFormat::Text => self.text_line(),
            CopyFormat::Csv { .. } => self.csv_record(),
            CopyFormat::Binary => self.binary_piece(),
        }
    }

    fn text_line(&mut self) -> Result<Option<Cut>, CopyError> {
        let Some(pos) = self.pending.iter().position(|b| *b == b'\n') else {
            return Ok(None);
        };
        let line = trim_cr(&self.pending[..pos]);
        if line == b"\\." {
            return Ok(Some(Cut {
                len: pos + 1,
                kind: Piece::Skip,
            }));
        }
        let field = line
            .split(|b| *b == b'\t')
            .nth(self.key_index)
            .ok_or_else(|| {
                CopyError(format!(
                    "a row has fewer than {} columns",
                    self.key_index + 1
                ))
            })?;
        let key = if field == b"\\N" {
            None
        } else {
            Some(self.key(&unescape_text(field))?)
        };
        Ok(Some(Cut {
            len: pos + 1,
            kind: Piece::Row(key),
        }))
    }

    fn csv_record(&mut self) -> Result<Option<Cut>, CopyError> {
        let mut in_quotes = false;
        let mut end = None;
        for (i, b) in self.pending.iter().enumerate() {
            match b {
                b'"' => in_quotes = !in_quotes,
                b'\n' if !in_quotes => {
                    end = Some(i);
                    break;
                }
                _ => {}
            }
        }
        let Some(end) = end else {
            return Ok(None);
        };
        if !self.preamble_done {
            self.preamble_done = true;
            return Ok(Some(Cut {
                len: end + 1,
                kind: Piece::Shared,
            }));
        }
        let fields = csv_fields(trim_cr(&self.pending[..end]));
        let field = fields.get(self.key_index).ok_or_else(|| {
            CopyError(format!(
                "a row has fewer than {} columns",
                self.key_index + 1
            ))
        })?;
        let key = match field {
            None => None,
            Some(v) => Some(self.key(v)?),
        };
        Ok(Some(Cut {
            len: end + 1,
            kind: Piece::Row(key),
        }))
    }

    fn binary_piece(&mut self) -> Result<Option<Cut>, CopyError> {
        let p = &self.pending;
        if !self.preamble_done {
            if p.len() < 19 {
                return Ok(None);
            }
            if &p[..11] != BINARY_SIGNATURE {
                return Err(CopyError(
                    "binary COPY data lacks the PGCOPY signature".into(),
                ));
            }
            let ext = u32::from_be_bytes([p[15], p[16], p[17], p[18]]) as usize;
            if p.len() < 19 + ext {
                return Ok(None);
            }
            self.preamble_done = true;
            return Ok(Some(Cut {
                len: 19 + ext,
                kind: Piece::Shared,
            }));
        }
        if p.len() < 2 {
            return Ok(None);
        }
        let count = i16::from_be_bytes([p[0], p[1]]);
        if count == -1 {
            return Ok(Some(Cut {
                len: 2,
                kind: Piece::Shared,
            }));
        }
        let mut at = 2;
        let mut key = None;
        for field in 0..count.max(0) as usize {
            let Some(len) = p.get(at..at + 4) else {
                return Ok(None);
            };
            let len = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
            at += 4;
            if len >= 0 {
                let Some(value) = p.get(at..at + len as usize) else {
                    return Ok(None);
                };
                if field == self.key_index {
                    key = Some(
                        self.key_type
                            .decode_binary(value)
                            .map_err(|e| CopyError(e.to_string()))?,
                    );
                }
                at += len as usize;
            }
        }
        if (count.max(0) as usize) <= self.key_index {
            return Err(CopyError(format!(
                "a row has fewer than {} columns",
                self.key_index + 1
            )));
        }
        Ok(Some(Cut {
            len: at,
            kind: Piece::Row(key),
        }))
    }

    fn key(&self, text: &[u8]) -> Result<KeyValue, CopyError> {
        let text =
            std::str::from_utf8(text).map_err(|_| CopyError("a key that is not UTF-8".into()))?;
        self.key_type
            .parse(text)
            .map_err(|e| CopyError(e.to_string()))
    }
}

/// A piece of the stream.
struct Cut {
    len: usize,
    kind: Piece,
}

enum Piece {
    /// For every group.
    Shared,
    /// A row with its key.
    Row(Option<KeyValue>),
    /// Dropped (the text format's `\.` end marker).
    Skip,
}

fn trim_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

/// The text format's backslash escapes.
fn unescape_text(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let b = field[i];
        if b != b'\\' || i + 1 == field.len() {
            out.push(b);
            i += 1;
            continue;
        }
        let next = field[i + 1];
        i += 2;
        match next {
            b'b' => out.push(8),
            b'f' => out.push(12),
            b'n' => out.push(b'\n'),
            b'r' => out.push(b'\r'),
            b't' => out.push(b'\t'),
            b'v' => out.push(11),
            b'x' => {
                let hex: Vec<u8> = field[i..]
                    .iter()
                    .take(2)
                    .take_while(|c| c.is_ascii_hexdigit())
                    .copied()
                    .collect();
                i += hex.len();
                let text = std::str::from_utf8(&hex).unwrap_or("0");
                out.push(u8::from_str_radix(text, 16).unwrap_or(0));
            }
            b'0'..=b'7' => {
                let mut v = u32::from(next - b'0');
                let mut n = 0;
                while n < 2 && i < field.len() && (b'0'..=b'7').contains(&field[i]) {
                    v = v * 8 + u32::from(field[i] - b'0');
                    i += 1;
                    n += 1;
                }
                out.push(v as u8);
            }
            other => out.push(other),
        }
    }
    out
}

/// CSV fields of one record: `None` for NULL (an unquoted empty field).
fn csv_fields(record: &[u8]) -> Vec<Option<Vec<u8>>> {
    let mut fields = Vec::new();
    let mut current = Vec::new();
    let mut quoted = false;
    let mut in_quotes = false;
    let mut i = 0;
    while i < record.len() {
        let b = record[i];
        if in_quotes {
            if b == b'"' {
                if record.get(i + 1) == Some(&b'"') {
                    current.push(b'"');
                    i += 1;
                } else {
                    in_quotes = false;
                }
            } else {
                current.push(b);
            }
        } else if b == b'"' {
            in_quotes = true;
            quoted = true;
        } else if b == b',' {
            fields.push((quoted || !current.is_empty()).then(|| std::mem::take(&mut current)));
            current.clear();
            quoted = false;
        } else {
            current.push(b);
        }
        i += 1;
    }
    fields.push((quoted || !current.is_empty()).then_some(current));
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups_of(routed: &[Routed]) -> Vec<u32> {
        routed
            .iter()
            .filter_map(|r| match r {
                Routed::Group(g, _) => Some(*g),
                Routed::All(_) => None,
            })
            .collect()
    }

    fn all_bytes(routed: &[Routed]) -> Vec<u8> {
        routed
            .iter()
            .flat_map(|r| match r {
                Routed::Group(_, b) | Routed::All(b) => b.clone(),
            })
            .collect()
    }

    #[test]
    fn text_rows_split_by_key_across_chunks() {
        let map = ShardMap::new(2, 32);
        let mut s = CopySplitter::new(CopyFormat::Text, 1, KeyType::Int8, &map);
        let data = b"a\t1\tx\nb\t2\ty\nc\t\\N\tz\n\\.\n";
        let mut routed = Vec::new();
        for chunk in data.chunks(3) {
            routed.extend(s.push(chunk).expect("push"));
        }
        routed.extend(s.finish().expect("finish"));
        assert_eq!(s.rows(), 3);
        assert_eq!(
            all_bytes(&routed),
            b"a\t1\tx\nb\t2\ty\nc\t\\N\tz\n".to_vec()
        );
        let want = |k: Option<i64>| map.group_of(k.map(KeyValue::Int8).as_ref());
        let mut expected = vec![want(Some(1)), want(Some(2)), want(None)];
        expected.dedup();
        let mut got = groups_of(&routed);
        got.dedup();
        assert_eq!(got, expected);
        assert!(s.push(b"only\n").is_err(), "too few columns");
    }

    #[test]
    fn csv_with_header_quotes_and_newlines() {
        let map = ShardMap::new(2, 32);
        let mut s = CopySplitter::new(CopyFormat::Csv { header: true }, 0, KeyType::Text, &map);
        let routed = s
            .push(b"k,v\n\"a,b\",\"multi\nline\"\n,null key\n\"\",empty key\n")
            .expect("push");
        assert!(matches!(&routed[0], Routed::All(h) if h == b"k,v\n"));
        assert_eq!(s.rows(), 3);
        let keys = [Some("a,b"), None, Some("")];
        let mut expected: Vec<u32> = keys
            .iter()
            .map(|k| map.group_of(k.map(|t| KeyValue::Text(t.into())).as_ref()))
            .collect();
        expected.dedup();
        assert_eq!(groups_of(&routed), expected);
        let mut last = CopySplitter::new(CopyFormat::Csv { header: false }, 0, KeyType::Int4, &map);
        assert!(last.push(b"5,x").expect("push").is_empty());
        assert_eq!(last.finish().expect("a last line without newline").len(), 1);
    }

    #[test]
    fn binary_tuples() {
        let map = ShardMap::new(2, 32);
        let mut data = BINARY_SIGNATURE.to_vec();
        data.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0]);
        for k in [7i32, 8] {
            data.extend_from_slice(&2i16.to_be_bytes());
            data.extend_from_slice(&4i32.to_be_bytes());
            data.extend_from_slice(&k.to_be_bytes());
            data.extend_from_slice(&(-1i32).to_be_bytes());
        }
        data.extend_from_slice(&(-1i16).to_be_bytes());
        let mut s = CopySplitter::new(CopyFormat::Binary, 0, KeyType::Int4, &map);
        let mut routed = Vec::new();
        for chunk in data.chunks(5) {
            routed.extend(s.push(chunk).expect("push"));
        }
        assert!(s.finish().expect("finish").is_empty());
        assert_eq!(s.rows(), 2);
        assert!(matches!(routed.first(), Some(Routed::All(h)) if h.len() == 19));
        assert!(matches!(routed.last(), Some(Routed::All(t)) if t == &(-1i16).to_be_bytes()));
        assert_eq!(all_bytes(&routed), data);
    }

    #[test]
    fn text_escapes() {
        assert_eq!(
            unescape_text(b"a\\tb\\\\c\\101\\x41"),
            b"a\tb\\cAA".to_vec()
        );
    }
}
