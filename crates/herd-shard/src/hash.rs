//! PostgreSQL's partition hash, reimplemented bit for bit: `hash_bytes_extended` (Bob Jenkins'
//! lookup3 as PostgreSQL adapted it), the per-type extended hash functions of int2/int4/int8,
//! text and uuid, and the row hash of `compute_partition_hash_value` with its seed. Checked
//! against a real server's `satisfies_hash_partition()` in the end-to-end tests.

use std::fmt;

/// `HASH_PARTITION_SEED`: the seed PostgreSQL passes to every key's extended hash function.
const PARTITION_SEED: u64 = 0x7A5B_2236_7996_DCFD;

/// The types a distribution key may have.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyType {
    /// `smallint`
    Int2,
    /// `integer`
    Int4,
    /// `bigint`
    Int8,
    /// `text` and `varchar` (default, deterministic collation)
    Text,
    /// `uuid`
    Uuid,
}

impl KeyType {
    /// The key type of a column from its type as `format_type()` prints it; `None` when Herd
    /// cannot place rows by that type.
    pub fn from_pg(type_name: &str) -> Option<KeyType> {
        let base = type_name.split('(').next().unwrap_or("").trim();
        Some(match base {
            "smallint" | "int2" => KeyType::Int2,
            "integer" | "int" | "int4" => KeyType::Int4,
            "bigint" | "int8" => KeyType::Int8,
            "text" | "character varying" | "varchar" => KeyType::Text,
            "uuid" => KeyType::Uuid,
            _ => return None,
        })
    }

    /// Parses a key's text form (as a client sends it) into a value of this type.
    pub fn parse(self, text: &str) -> Result<KeyValue, ParseKeyError> {
        let bad = || ParseKeyError {
            text: text.chars().take(64).collect(),
            key_type: self,
        };
        let t = text.trim();
        Ok(match self {
            KeyType::Int2 => KeyValue::Int2(t.parse().map_err(|_| bad())?),
            KeyType::Int4 => KeyValue::Int4(t.parse().map_err(|_| bad())?),
            KeyType::Int8 => KeyValue::Int8(t.parse().map_err(|_| bad())?),
            KeyType::Text => KeyValue::Text(text.to_string()),
            KeyType::Uuid => KeyValue::Uuid(parse_uuid(t).ok_or_else(bad)?),
        })
    }

    /// Decodes a key sent in binary format (network byte order, as `*_send` writes it).
    pub fn decode_binary(self, bytes: &[u8]) -> Result<KeyValue, ParseKeyError> {
        let bad = || ParseKeyError {
            text: format!("{} bytes of binary data", bytes.len()),
            key_type: self,
        };
        Ok(match self {
            // A driver may send an integer key in a narrower or wider integer type than the
            // column's (psycopg sends 4242 as int2): the width tells which, and equal values
            // of every integer width hash alike, as PostgreSQL's cross-type comparison needs.
            KeyType::Int2 | KeyType::Int4 | KeyType::Int8 => match bytes.len() {
                2 => KeyValue::Int2(i16::from_be_bytes([bytes[0], bytes[1]])),
                4 => KeyValue::Int4(i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])),
                8 => KeyValue::Int8(i64::from_be_bytes(bytes.try_into().map_err(|_| bad())?)),
                _ => return Err(bad()),
            },
            KeyType::Text => KeyValue::Text(String::from_utf8(bytes.to_vec()).map_err(|_| bad())?),
            KeyType::Uuid => KeyValue::Uuid(bytes.try_into().map_err(|_| bad())?),
        })
    }
}

impl fmt::Display for KeyType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            KeyType::Int2 => "smallint",
            KeyType::Int4 => "integer",
            KeyType::Int8 => "bigint",
            KeyType::Text => "text",
            KeyType::Uuid => "uuid",
        })
    }
}

/// A key that is not a valid value of its column's type.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("'{text}' is not a valid {key_type}")]
pub struct ParseKeyError {
    /// The offending text (cut to 64 characters).
    pub text: String,
    /// The type it should have had.
    pub key_type: KeyType,
}

/// A distribution key's value.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KeyValue {
    /// `smallint`
    Int2(i16),
    /// `integer`
    Int4(i32),
    /// `bigint`
    Int8(i64),
    /// `text`, as the server stores it (UTF-8)
    Text(String),
    /// `uuid`, its 16 bytes
    Uuid([u8; 16]),
}

/// The row hash PostgreSQL's hash partitioning computes for a one-column key (a NULL key
/// hashes to 0, as PostgreSQL skips NULL columns).
pub fn partition_hash(key: Option<&KeyValue>) -> u64 {
    match key {
        None => 0,
        Some(k) => hash_combine64(0, extended_hash(k, PARTITION_SEED)),
    }
}

/// The virtual shard of a row hash: the remainder for which `satisfies_hash_partition(…,
/// shard_count, remainder, key)` is true.
pub fn virtual_shard(hash: u64, shard_count: u32) -> u32 {
    // shard_count ≥ 1 is guaranteed by the shard map; the result fits in u32.
    (hash % u64::from(shard_count.max(1))) as u32
}

/// The type's extended hash function (`hashint4extended`, `hashtextextended`, …).
fn extended_hash(key: &KeyValue, seed: u64) -> u64 {
    match key {
        KeyValue::Int2(v) => hash_uint32_extended(i32::from(*v) as u32, seed),
        KeyValue::Int4(v) => hash_uint32_extended(*v as u32, seed),
        KeyValue::Int8(v) => {
            // Equal int4 and int8 values hash alike: fold the high half into the low one.
            let lo = *v as u32;
            let hi = (*v >> 32) as u32;
            hash_uint32_extended(if *v >= 0 { lo ^ hi } else { lo ^ !hi }, seed)
        }
        KeyValue::Text(s) => hash_bytes_extended(s.as_bytes(), seed),
        KeyValue::Uuid(b) => hash_bytes_extended(b, seed),
    }
}

/// `hash_combine64`: how PostgreSQL folds each key column's hash into the row hash.
fn hash_combine64(a: u64, b: u64) -> u64 {
    a ^ (b
        .wrapping_add(0x49a0_f4dd_15e5_a8e3)
        .wrapping_add(a << 54)
        .wrapping_add(a >> 7))
}

fn mix(a: &mut u32, b: &mut u32, c: &mut u32) {
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(4);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(6);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(8);
    *b = b.wrapping_add(*a);
    *a = a.wrapping_sub(*c);
    *a ^= c.rotate_left(16);
    *c = c.wrapping_add(*b);
    *b = b.wrapping_sub(*a);
    *b ^= a.rotate_left(19);
    *a = a.wrapping_add(*c);
    *c = c.wrapping_sub(*b);
    *c ^= b.rotate_left(4);
    *b = b.wrapping_add(*a);
}

fn finish(a: &mut u32, b: &mut u32, c: &mut u32) {
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(14));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(11));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(25));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(16));
    *a ^= *c;
    *a = a.wrapping_sub(c.rotate_left(4));
    *b ^= *a;
    *b = b.wrapping_sub(a.rotate_left(14));
    *c ^= *b;
    *c = c.wrapping_sub(b.rotate_left(24));
}

/// The seed folded into the initial state, as PostgreSQL does for a non-zero seed.
fn seeded(len: u32, seed: u64) -> (u32, u32, u32) {
    let init = 0x9e37_79b9u32.wrapping_add(len).wrapping_add(3_923_095);
    let (mut a, mut b, mut c) = (init, init, init);
    if seed != 0 {
        a = a.wrapping_add((seed >> 32) as u32);
        b = b.wrapping_add(seed as u32);
        mix(&mut a, &mut b, &mut c);
    }
    (a, b, c)
}

/// `hash_bytes_uint32_extended`.
fn hash_uint32_extended(k: u32, seed: u64) -> u64 {
    let (mut a, mut b, mut c) = seeded(4, seed);
    a = a.wrapping_add(k);
    finish(&mut a, &mut b, &mut c);
    (u64::from(b) << 32) | u64::from(c)
}

/// `hash_bytes_extended` on a little-endian machine (PostgreSQL's result depends on the
/// server's byte order; Herd supports little-endian servers).
fn hash_bytes_extended(k: &[u8], seed: u64) -> u64 {
    let (mut a, mut b, mut c) = seeded(k.len() as u32, seed);
    let word = |w: &[u8]| {
        w.iter()
            .enumerate()
            .fold(0u32, |acc, (i, byte)| acc | (u32::from(*byte) << (8 * i)))
    };
    let mut rest = k;
    while rest.len() >= 12 {
        a = a.wrapping_add(word(&rest[0..4]));
        b = b.wrapping_add(word(&rest[4..8]));
        c = c.wrapping_add(word(&rest[8..12]));
        mix(&mut a, &mut b, &mut c);
        rest = &rest[12..];
    }
    // The last 0–11 bytes: a takes bytes 0–3, b 4–7, c 8–10 shifted up by one byte.
    a = a.wrapping_add(word(&rest[..rest.len().min(4)]));
    if rest.len() > 4 {
        b = b.wrapping_add(word(&rest[4..rest.len().min(8)]));
    }
    if rest.len() > 8 {
        c = c.wrapping_add(word(&rest[8..]) << 8);
    }
    finish(&mut a, &mut b, &mut c);
    (u64::from(b) << 32) | u64::from(c)
}

fn parse_uuid(text: &str) -> Option<[u8; 16]> {
    // PostgreSQL accepts braces and hyphens between any groups of four digits.
    let digits: Vec<u8> = text
        .trim_start_matches('{')
        .trim_end_matches('}')
        .bytes()
        .filter(|b| *b != b'-')
        .collect();
    if digits.len() != 32 {
        return None;
    }
    let mut out = [0u8; 16];
    for (i, pair) in digits.chunks(2).enumerate() {
        let hex = std::str::from_utf8(pair).ok()?;
        out[i] = u8::from_str_radix(hex, 16).ok()?;
    }
    Some(out)
}

/// A SQL expression computing, inside PostgreSQL, the virtual shard of `column` (an SQL
/// expression of type `key_type`): the row hash hash partitioning uses, modulo `shard_count`.
/// `herd shards verify` checks every stored row with it, so placement is checked by PostgreSQL's
/// own hash functions, not by Herd's copy of them.
pub fn shard_sql(column: &str, key_type: KeyType, shard_count: u32) -> String {
    let function = match key_type {
        KeyType::Int2 => "hashint2extended",
        KeyType::Int4 => "hashint4extended",
        KeyType::Int8 => "hashint8extended",
        KeyType::Text => "hashtextextended",
        KeyType::Uuid => "uuid_hash_extended",
    };
    // The signed 64-bit hash as unsigned, plus hash_combine64's constant, modulo 2^64; a NULL
    // key hashes to 0.
    let seed = PARTITION_SEED as i64;
    let combine = 0x49a0_f4dd_15e5_a8e3u64;
    format!(
        "(coalesce((({function}({column}, {seed})::numeric + 18446744073709551616 + {combine}) % 18446744073709551616), 0) % {shard_count})::int"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_by_type() {
        assert_eq!(KeyType::Int4.parse(" 42"), Ok(KeyValue::Int4(42)));
        assert!(KeyType::Int4.parse("4.2").is_err());
        assert!(KeyType::Int2.parse("70000").is_err());
        assert_eq!(
            KeyType::Int8.decode_binary(&7i64.to_be_bytes()),
            Ok(KeyValue::Int8(7))
        );
        assert!(KeyType::Int8.decode_binary(&[1, 2, 3]).is_err());
        // Another integer width than the column's hashes as the same value.
        let narrow = KeyType::Int4
            .decode_binary(&4242i16.to_be_bytes())
            .expect("int2");
        assert_eq!(
            partition_hash(Some(&narrow)),
            partition_hash(Some(&KeyValue::Int4(4242)))
        );
        let u = KeyType::Uuid
            .parse("{a0eebc99-9c0b-4ef8-bb6d-6bb9bd380a11}")
            .expect("uuid");
        assert_eq!(
            u,
            KeyType::Uuid
                .parse("a0eebc999c0b4ef8bb6d6bb9bd380a11")
                .expect("uuid")
        );
        assert!(KeyType::Uuid.parse("a0ee").is_err());
        assert_eq!(
            KeyType::from_pg("character varying(20)"),
            Some(KeyType::Text)
        );
        assert_eq!(KeyType::from_pg("numeric"), None);
    }

    #[test]
    fn equal_integers_hash_alike_across_widths() {
        for v in [-5i64, 0, 1, 12_345] {
            let h8 = partition_hash(Some(&KeyValue::Int8(v)));
            let h4 = partition_hash(Some(&KeyValue::Int4(v as i32)));
            let h2 = partition_hash(Some(&KeyValue::Int2(v as i16)));
            assert_eq!(h8, h4, "{v}");
            assert_eq!(h4, h2, "{v}");
        }
        assert_eq!(partition_hash(None), 0);
    }

    #[test]
    fn shards_spread() {
        let mut seen = [0u32; 32];
        for v in 0..3200 {
            seen[virtual_shard(partition_hash(Some(&KeyValue::Int4(v))), 32) as usize] += 1;
        }
        assert!(seen.iter().all(|n| (50..150).contains(n)), "{seen:?}");
    }
}
